/* Training data: whale data prepare on small corpora with a synthetic
 * byte-level tokenizer, the shard format read back by its specification,
 * the window / label / position / segment rules against a plain reference,
 * shuffling, resumable cursors, and every kind of bad input. */
#include "testutil.h"

#include "whale_data.h"
#include "whale_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    unsigned char *b = malloc((size_t)sz + 1);
    if (!b || fread(b, 1, (size_t)sz, f) != (size_t)sz) exit(1);
    fclose(f);
    b[sz] = 0;
    *n = (size_t)sz;
    return b;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

/* Number of entries in a directory other than . and .. (-1 if missing). */
static int dir_entries(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | wc -l", dir);
    if (!exists(dir)) return -1;
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p && fscanf(p, "%d", &n) != 1) n = -1;
    if (p) pclose(p);
    return n;
}

static void copy_dir(const char *from, const char *to) {
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    if (system(cmd) != 0) exit(1);
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* ------------------------------------------------------------ synthetic tokenizer */

/* The 256 byte characters of byte-level BPE, a few merges, "<|eos|>" and
 * "<s>" as special added tokens; eos_token set in tokenizer_config.json
 * when with_eos; with_template makes the post-processor add <s> … <|eos|>. */
static const char *const MERGES[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"Ġ", "w"}, {"Ġw", "h"}, {"a", "l"},
                                        {"Ġwh", "al"}, {"e", "s"}, {"i", "n"}, {"Ġ", "d"}};
enum { N_MERGES = sizeof MERGES / sizeof MERGES[0], EOS_ID = 256 + N_MERGES, BOS_ID = EOS_ID + 1, VOCAB = BOS_ID + 1 };

static void make_tokenizer(const char *dir, int with_eos, int with_template) {
    mkdir(dir, 0755);
    size_t cap = 1 << 16, n = 0;
    char *j = malloc(cap);
#define APPEND(...) (n += (size_t)snprintf(j + n, cap - n, __VA_ARGS__))
    APPEND("{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
           "{\"id\":%d,\"content\":\"<|eos|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
           "{\"id\":%d,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
           "\"normalizer\":null,"
           "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},",
           EOS_ID, BOS_ID);
    if (with_template)
        APPEND("\"post_processor\":{\"type\":\"TemplateProcessing\","
               "\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
               "{\"SpecialToken\":{\"id\":\"<|eos|>\",\"type_id\":0}}],"
               "\"pair\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],"
               "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[%d],\"tokens\":[\"<s>\"]},"
               "\"<|eos|>\":{\"id\":\"<|eos|>\",\"ids\":[%d],\"tokens\":[\"<|eos|>\"]}}},",
               BOS_ID, EOS_ID);
    else
        APPEND("\"post_processor\":null,");
    APPEND("\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
           "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
           "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{");
    int kept = 0;
    for (int b = 0; b < 256; b++) { /* GPT-2's bytes_to_unicode, written as \u escapes */
        int keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        APPEND("%s\"\\u%04x\":%d", b ? "," : "", keep ? b : 0x100 + kept++, b);
    }
    for (int m = 0; m < N_MERGES; m++) APPEND(",\"%s%s\":%d", MERGES[m][0], MERGES[m][1], 256 + m);
    APPEND("},\"merges\":[");
    for (int m = 0; m < N_MERGES; m++) APPEND("%s[\"%s\",\"%s\"]", m ? "," : "", MERGES[m][0], MERGES[m][1]);
    APPEND("]}}");
#undef APPEND
    char path[1100];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_text(path, j);
    free(j);
    if (with_eos) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        write_text(path, "{\"eos_token\": \"<|eos|>\", \"bos_token\": \"<s>\"}");
    }
}

/* ------------------------------------------------------------ reading shards by the spec */

typedef struct {
    uint32_t tb, vocab, eos;
    uint64_t T, D, fp;
    uint32_t *tok;
    uint64_t *off;
} raw_shard;

static int read_raw(const char *path, raw_shard *r) {
    size_t n;
    unsigned char *b = read_all(path, &n);
    memset(r, 0, sizeof *r);
    if (!b || n < 64 || memcmp(b, "WHALETOK", 8) || get32(b + 8) != 1) {
        free(b);
        return 0;
    }
    r->tb = get32(b + 12);
    r->vocab = get32(b + 16);
    r->eos = get32(b + 20);
    r->T = get64(b + 24);
    r->D = get64(b + 32);
    r->fp = get64(b + 40);
    int ok = (r->tb == 2 || r->tb == 4) && n == 64 + r->T * r->tb + (r->D + 1) * 8;
    for (int i = 48; i < 64; i++) ok = ok && b[i] == 0;
    if (ok) {
        r->tok = malloc((r->T + 1) * sizeof *r->tok);
        r->off = malloc((r->D + 1) * sizeof *r->off);
        for (uint64_t i = 0; i < r->T; i++)
            r->tok[i] = r->tb == 2 ? (uint32_t)b[64 + 2 * i] | (uint32_t)b[65 + 2 * i] << 8 : get32(b + 64 + 4 * i);
        for (uint64_t i = 0; i <= r->D; i++) r->off[i] = get64(b + 64 + r->T * r->tb + 8 * i);
    }
    free(b);
    return ok;
}

static void free_raw(raw_shard *r) {
    free(r->tok);
    free(r->off);
}

/* Documents of a split, read from the shard files in order. */
typedef struct {
    int n;
    int32_t *ids[256];
    int len[256];
    int shards;
    uint64_t shard_tokens[64];
} doc_list;

static void read_docs(const char *dir, const char *split, doc_list *dl) {
    memset(dl, 0, sizeof *dl);
    for (int s = 0;; s++) {
        char path[1200];
        if (!strcmp(split, "val")) {
            if (s) break;
            snprintf(path, sizeof path, "%s/val.bin", dir);
        } else {
            snprintf(path, sizeof path, "%s/train-%05d.bin", dir, s);
        }
        if (!exists(path)) break;
        raw_shard r;
        CHECK(read_raw(path, &r), "%s: does not follow the format", path);
        if (!r.tok) break;
        dl->shard_tokens[dl->shards++] = r.T;
        for (uint64_t d = 0; d < r.D && dl->n < 256; d++) {
            int len = (int)(r.off[d + 1] - r.off[d]);
            dl->ids[dl->n] = malloc(sizeof(int32_t) * (size_t)len);
            for (int i = 0; i < len; i++) dl->ids[dl->n][i] = (int32_t)r.tok[r.off[d] + (uint64_t)i];
            dl->len[dl->n++] = len;
        }
        free_raw(&r);
    }
}

static void free_docs(doc_list *dl) {
    for (int i = 0; i < dl->n; i++) free(dl->ids[i]);
}

/* ------------------------------------------------------------ prepare */

typedef struct {
    const char *text;
    const char *decoded; /* what decoding gives back (invalid UTF-8 replaced), if different */
} doc;

/* Train and val interleave to the input order; each document is its
 * encoding + EOS and decodes back to its text. */
static void check_round_trip(const char *tag, const char *dir, whale_tokenizer *t, const doc *docs, int n, int want_val) {
    doc_list tr, va;
    read_docs(dir, "train", &tr);
    read_docs(dir, "val", &va);
    CHECK(tr.n + va.n == n, "%s: %d + %d documents, want %d", tag, tr.n, va.n, n);
    CHECK(want_val < 0 || va.n == want_val, "%s: %d validation documents, want %d", tag, va.n, want_val);
    int ti = 0, vi = 0;
    for (int i = 0; i < n && ti + vi == i; i++) {
        int32_t *ids;
        int k;
        whale_err err;
        if (whale_tokenizer_encode(t, docs[i].text, strlen(docs[i].text), 1, &ids, &k, &err)) {
            CHECK(0, "%s: encode: %s", tag, err.msg);
            break;
        }
        doc_list *from = NULL;
        int at = 0;
        if (ti < tr.n && tr.len[ti] == k + 1 && !memcmp(tr.ids[ti], ids, sizeof(int32_t) * (size_t)k)) from = &tr, at = ti++;
        else if (vi < va.n && va.len[vi] == k + 1 && !memcmp(va.ids[vi], ids, sizeof(int32_t) * (size_t)k)) from = &va, at = vi++;
        CHECK(from != NULL, "%s: document %d (\"%.20s\") is not next in train or val", tag, i, docs[i].text);
        if (from) {
            CHECK(from->ids[at][k] == EOS_ID, "%s: document %d does not end with EOS", tag, i);
            char *back;
            size_t bl;
            CHECK(whale_tokenizer_decode(t, from->ids[at], k, 0, &back, &bl, &err) == WHALE_OK, "%s: decode", tag);
            const char *want = docs[i].decoded ? docs[i].decoded : docs[i].text;
            CHECK(bl == strlen(want) && !memcmp(back, want, bl), "%s: document %d decodes to \"%s\"", tag, i, back);
            free(back);
        }
        free(ids);
    }
    free_docs(&tr);
    free_docs(&va);
}

static whale_code prepare(const char *tok, const char *out, const char **inputs, int n, whale_doc_split split,
                          whale_data_prepare_opts *base, whale_data_prepare_stats *st, whale_err *err) {
    whale_data_prepare_opts o = base ? *base : whale_data_prepare_defaults();
    o.tokenizer = tok;
    o.out_dir = out;
    o.inputs = inputs;
    o.n_inputs = n;
    o.doc_split = split;
    return whale_data_prepare(&o, st, err);
}

static void check_prepare(const char *tmp) {
    char tok[600], tok_tmpl[600], tok_noeos[600];
    snprintf(tok, sizeof tok, "%s/tok", tmp);
    snprintf(tok_tmpl, sizeof tok_tmpl, "%s/tok-template", tmp);
    snprintf(tok_noeos, sizeof tok_noeos, "%s/tok-noeos", tmp);
    make_tokenizer(tok, 1, 0);
    make_tokenizer(tok_tmpl, 1, 1);
    make_tokenizer(tok_noeos, 0, 0);
    whale_err err;
    whale_tokenizer *t;
    if (whale_tokenizer_load(tok, &t, &err)) {
        CHECK(0, "synthetic tokenizer: %s", err.msg);
        return;
    }
    CHECK(whale_tokenizer_vocab_size(t) == VOCAB && whale_tokenizer_role_id(t, WHALE_TOKEN_EOS) == EOS_ID,
          "synthetic tokenizer vocab %d", whale_tokenizer_vocab_size(t));

    /* lines and JSONL records */
    char lines[600], recs[600], out[600], out2[600];
    snprintf(lines, sizeof lines, "%s/lines.txt", tmp);
    snprintf(recs, sizeof recs, "%s/recs.jsonl", tmp);
    write_text(lines, "the whale sings\r\n\n   \nin the deep blue\nna\xff" "ive bytes\nlast line, no newline");
    write_text(recs, "{\"text\": \"first record\"}\n\n{\"text\": \"\", \"id\": 2}\n"
                     "{\"text\": \"with \\\"quotes\\\" and\\nnewline \\u00e9\"}\n{\"text\": \"  \\t \"}\n"
                     "  {\"id\": 5, \"text\": \"the end\"}  \r\n");
    const doc docs[] = {{"the whale sings", NULL},
                        {"in the deep blue", NULL},
                        {"na\xff" "ive bytes", "na\xef\xbf\xbdive bytes"},
                        {"last line, no newline", NULL},
                        {"first record", NULL},
                        {"with \"quotes\" and\nnewline \xc3\xa9", NULL},
                        {"the end", NULL}};
    const char *in[] = {lines, recs};
    whale_data_prepare_stats st;
    snprintf(out, sizeof out, "%s/out-lines", tmp);
    whale_data_prepare_opts o = whale_data_prepare_defaults();
    o.val_docs = 2;
    o.seed = 7;
    CHECK(prepare(tok, out, in, 2, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK, "prepare lines: %s", err.msg);
    CHECK(st.documents[0] == 5 && st.documents[1] == 2 && st.empty_documents == 4 && st.bad_records == 0,
          "counts: train %lld val %lld empty %lld", (long long)st.documents[0], (long long)st.documents[1],
          (long long)st.empty_documents);
    CHECK(st.vocab_size == VOCAB && st.eos_id == EOS_ID && st.train_shards == 1, "stats: vocab %d eos %d shards %d",
          st.vocab_size, st.eos_id, st.train_shards);
    uint64_t fp;
    CHECK(whale_data_fingerprint(tok, &fp, &err) == WHALE_OK && fp == st.fingerprint, "fingerprint");
    check_round_trip("lines", out, t, docs, 7, 2);
    raw_shard r;
    char path[1200];
    snprintf(path, sizeof path, "%s/train-00000.bin", out);
    CHECK(read_raw(path, &r) && r.tb == 2 && r.vocab == VOCAB && r.eos == EOS_ID && r.fp == fp && r.D == 5,
          "train shard header");
    CHECK(r.T == (uint64_t)st.tokens[0], "token count %llu vs stats %lld", (unsigned long long)r.T, (long long)st.tokens[0]);
    free_raw(&r);
    snprintf(path, sizeof path, "%s/meta.json", out);
    size_t mn;
    char *meta = (char *)read_all(path, &mn);
    CHECK(meta && strstr(meta, "\"tokenizer_fingerprint\"") && strstr(meta, "\"eos_appended\":\ttrue") &&
              strstr(meta, "recs.jsonl") && strstr(meta, "\"val_documents\":\t2"),
          "meta.json content");
    free(meta);
    snprintf(path, sizeof path, "%s/train-00000.bin.tmp", out);
    CHECK(!exists(path), "no temporary files left");

    /* the same run again is byte-identical, also with several threads;
     * another seed picks other validation documents */
    snprintf(out2, sizeof out2, "%s/out-lines-again", tmp);
    o.threads = 3;
    CHECK(prepare(tok, out2, in, 2, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK, "prepare again: %s", err.msg);
    const char *files[] = {"train-00000.bin", "val.bin", "meta.json"};
    for (int i = 0; i < 3; i++) {
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/%s", out, files[i]);
        snprintf(b, sizeof b, "%s/%s", out2, files[i]);
        CHECK(same_file(a, b), "%s differs between identical runs (threads 1 vs 3)", files[i]);
    }

    /* validation choice: seeded, deterministic, exact counts */
    char many[600];
    snprintf(many, sizeof many, "%s/many.txt", tmp);
    {
        char text[4096];
        size_t n = 0;
        for (int i = 0; i < 60; i++) n += (size_t)snprintf(text + n, sizeof text - n, "document number %d\n", i);
        write_text(many, text);
    }
    const char *in_many[] = {many};
    doc_list v1, v2, v3;
    o = whale_data_prepare_defaults();
    o.val_docs = 6;
    o.seed = 1;
    o.overwrite = 1;
    snprintf(out2, sizeof out2, "%s/out-many", tmp);
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK, "many: %s", err.msg);
    read_docs(out2, "val", &v1);
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK, "many again: %s", err.msg);
    read_docs(out2, "val", &v2);
    o.seed = 2;
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK, "many seed 2: %s", err.msg);
    read_docs(out2, "val", &v3);
    int same12 = v1.n == 6 && v2.n == 6, same13 = v3.n == 6;
    for (int i = 0; i < v1.n && i < v2.n && i < v3.n; i++) {
        same12 = same12 && v1.len[i] == v2.len[i] && !memcmp(v1.ids[i], v2.ids[i], 4 * (size_t)v1.len[i]);
        same13 = same13 && v1.len[i] == v3.len[i] && !memcmp(v1.ids[i], v3.ids[i], 4 * (size_t)v1.len[i]);
    }
    CHECK(same12, "same seed, same validation documents");
    CHECK(!same13, "another seed, other validation documents");
    free_docs(&v1);
    free_docs(&v2);
    free_docs(&v3);
    o = whale_data_prepare_defaults(); /* 1% of 60 rounds to 1 */
    o.overwrite = 1;
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK && st.documents[1] == 1 &&
              st.documents[0] == 59,
          "1%% of 60 documents: %lld val", (long long)st.documents[1]);
    o.val_fraction = 0.25;
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK && st.documents[1] == 15,
          "25%% of 60 documents: %lld val", (long long)st.documents[1]);
    o.val_fraction = 0;
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK && st.documents[1] == 0,
          "fraction 0: no validation");
    o.val_fraction = 1;
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK && st.documents[0] == 1 &&
              st.documents[1] == 59,
          "fraction 1: train keeps one document");
    o.val_docs = 60;
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_ERR_ARG && strstr(err.msg, "60"),
          "all documents for validation: %s", err.msg);

    /* two documents: one goes to validation; one document: none */
    char two[600];
    snprintf(two, sizeof two, "%s/two.txt", tmp);
    write_text(two, "alpha\nbeta\n");
    const char *in_two[] = {two};
    o = whale_data_prepare_defaults();
    o.overwrite = 1;
    CHECK(prepare(tok, out2, in_two, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK && st.documents[0] == 1 &&
              st.documents[1] == 1,
          "two documents: 1 + 1");
    CHECK(prepare(tok, out2, in_two, 1, WHALE_DOC_FILE, &o, &st, &err) == WHALE_OK && st.documents[0] == 1 &&
              st.documents[1] == 0,
          "one document: train only");

    /* whole files and blank-line paragraphs */
    char fa[600], fb[600], fe[600];
    snprintf(fa, sizeof fa, "%s/para.txt", tmp);
    snprintf(fb, sizeof fb, "%s/b.txt", tmp);
    snprintf(fe, sizeof fe, "%s/empty.txt", tmp);
    write_text(fa, "\n\nfirst para line1\r\nline2\n\n  \nsecond para\n\n\n third para  \n");
    write_text(fb, "the whale\n");
    write_text(fe, "");
    const char *in_files[] = {fa, fe, fb};
    const doc whole[] = {{"\n\nfirst para line1\r\nline2\n\n  \nsecond para\n\n\n third para  \n", NULL},
                         {"the whale\n", NULL}};
    o = whale_data_prepare_defaults();
    o.overwrite = 1;
    CHECK(prepare(tok, out2, in_files, 3, WHALE_DOC_FILE, &o, &st, &err) == WHALE_OK && st.empty_documents == 1,
          "whole files: %s", err.msg);
    check_round_trip("files", out2, t, whole, 2, 1);
    const doc paras[] = {{"first para line1\r\nline2", NULL}, {"second para", NULL}, {" third para  ", NULL},
                         {"the whale", NULL}};
    CHECK(prepare(tok, out2, in_files, 3, WHALE_DOC_BLANK, &o, &st, &err) == WHALE_OK && st.empty_documents == 0,
          "paragraphs: %s", err.msg);
    check_round_trip("paragraphs", out2, t, paras, 4, 1);

    /* shards split between documents, never inside one (unless it alone is larger) */
    o = whale_data_prepare_defaults();
    o.overwrite = 1;
    o.val_fraction = 0;
    o.shard_tokens = 50;
    CHECK(prepare(tok, out2, in_many, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK && st.train_shards > 10,
          "small shards: %d", st.train_shards);
    {
        doc_list dl;
        read_docs(out2, "train", &dl);
        CHECK(dl.shards == st.train_shards && dl.n == 60, "%d shards, %d documents", dl.shards, dl.n);
        for (int s = 0; s < dl.shards; s++) CHECK(dl.shard_tokens[s] <= 50, "shard %d has %llu tokens", s,
                                                  (unsigned long long)dl.shard_tokens[s]);
        free_docs(&dl);
        snprintf(path, sizeof path, "%s/train-%05d.bin", out2, st.train_shards);
        CHECK(!exists(path), "no extra shard");
    }
    o.shard_tokens = 3; /* every document is larger: one per shard */
    CHECK(prepare(tok, out2, in_two, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK && st.train_shards == 2,
          "oversized documents: %d shards", st.train_shards);
    snprintf(path, sizeof path, "%s/train-00002.bin", out2);
    CHECK(!exists(path), "--overwrite removes shards of the previous, larger dataset");

    /* a template that adds BOS and EOS: no second EOS */
    o = whale_data_prepare_defaults();
    o.overwrite = 1;
    CHECK(prepare(tok_tmpl, out2, in_two, 1, WHALE_DOC_LINE, &o, &st, &err) == WHALE_OK, "template: %s", err.msg);
    {
        doc_list dl;
        read_docs(out2, "train", &dl);
        CHECK(dl.n == 1 && dl.ids[0][0] == BOS_ID && dl.ids[0][dl.len[0] - 1] == EOS_ID &&
                  dl.ids[0][dl.len[0] - 2] != EOS_ID,
              "template tokens: BOS first, one EOS last");
        free_docs(&dl);
    }

    /* malformed JSONL: an error naming file:line, or skipped and counted */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", tmp);
    write_text(bad, "{\"text\": \"ok one\"}\n{\"text\": \"broken\"\n{\"body\": \"x\"}\n{\"text\": 5}\n[1, 2]\n"
                    "{\"text\": \"ok two\"} trailing\n{\"text\": \"ok three\"}\n");
    const char *in_bad[] = {bad};
    snprintf(out, sizeof out, "%s/out-bad", tmp);
    CHECK(prepare(tok, out, in_bad, 1, WHALE_DOC_FILE, NULL, &st, &err) == WHALE_ERR_FORMAT &&
              strstr(err.msg, "bad.jsonl:2: invalid JSON"),
          "malformed line: %s", err.msg);
    CHECK(!exists(out), "no output directory after an input error");
    whale_data_prepare_opts skip = whale_data_prepare_defaults();
    skip.skip_bad_records = 1;
    CHECK(prepare(tok, out, in_bad, 1, WHALE_DOC_FILE, &skip, &st, &err) == WHALE_OK && st.bad_records == 5 &&
              st.documents[0] + st.documents[1] == 2 && strstr(st.first_bad, "bad.jsonl:2: invalid JSON"),
          "skip bad records: %lld skipped, first \"%s\"", (long long)st.bad_records, st.first_bad);
    static const struct {
        const char *line, *want;
    } bad_lines[] = {{"{\"body\": \"x\"}\n", ":1: no field \"text\""},
                     {"{\"text\": 5}\n", ":1: field \"text\" is not a string"},
                     {"[1, 2]\n", ":1: expected a JSON object"},
                     {"{\"text\": \"a\"} x\n", ":1: text after the JSON value"},
                     {"\n\n{\"text\": \"a\"\n", "bad.jsonl:3: invalid JSON"}};
    for (size_t i = 0; i < sizeof bad_lines / sizeof bad_lines[0]; i++) {
        write_text(bad, bad_lines[i].line);
        CHECK(prepare(tok, out, in_bad, 1, WHALE_DOC_FILE, NULL, &st, &err) == WHALE_ERR_FORMAT &&
                  strstr(err.msg, bad_lines[i].want) && !strchr(err.msg, '\n'),
              "bad line %zu: %s", i, err.msg);
    }
    whale_data_prepare_opts field = whale_data_prepare_defaults();
    field.text_field = "body";
    write_text(bad, "{\"body\": \"the body\"}\n");
    CHECK(prepare(tok, out2, in_bad, 1, WHALE_DOC_FILE, &field, &st, &err) == WHALE_ERR_ARG && strstr(err.msg, "already"),
          "an existing dataset is not replaced without overwrite: %s", err.msg);
    field.overwrite = 1;
    CHECK(prepare(tok, out2, in_bad, 1, WHALE_DOC_FILE, &field, &st, &err) == WHALE_OK && st.documents[0] == 1,
          "--text-field: %s", err.msg);

    /* empty and all-invalid corpora, missing input, unwritable output, no EOS */
    write_text(bad, "{\"text\": 1}\n{\"x\": 2}\n");
    snprintf(out, sizeof out, "%s/out-none", tmp);
    CHECK(prepare(tok, out, in_bad, 1, WHALE_DOC_FILE, &skip, &st, &err) == WHALE_ERR_FORMAT &&
              strstr(err.msg, "no documents") && strstr(err.msg, "2 bad records"),
          "all-invalid corpus: %s", err.msg);
    const char *in_empty[] = {fe, fe};
    CHECK(prepare(tok, out, in_empty, 2, WHALE_DOC_FILE, NULL, &st, &err) == WHALE_ERR_FORMAT &&
              strstr(err.msg, "no documents in the 2 inputs"),
          "empty corpus: %s", err.msg);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/missing.txt", tmp);
    const char *in_missing[] = {fb, missing};
    CHECK(prepare(tok, out, in_missing, 2, WHALE_DOC_FILE, NULL, &st, &err) == WHALE_ERR_IO &&
              strstr(err.msg, "missing.txt: cannot open"),
          "missing input: %s", err.msg);
    const char *in_dir[] = {tmp};
    CHECK(prepare(tok, out, in_dir, 1, WHALE_DOC_FILE, NULL, &st, &err) == WHALE_ERR_IO && strstr(err.msg, "directory"),
          "a directory as input: %s", err.msg);
    CHECK(!exists(out), "no output after failures");
    snprintf(path, sizeof path, "%s/out", fb); /* below a regular file */
    CHECK(prepare(tok, path, in_two, 1, WHALE_DOC_LINE, NULL, &st, &err) == WHALE_ERR_IO && strstr(err.msg, path),
          "unwritable output: %s", err.msg);
    CHECK(prepare(tok_noeos, out, in_two, 1, WHALE_DOC_LINE, NULL, &st, &err) == WHALE_ERR_FORMAT &&
              strstr(err.msg, "no EOS token"),
          "tokenizer without EOS: %s", err.msg);
    CHECK(!exists(out), "no output without EOS");

    /* a failure while finishing leaves nothing behind: val.bin cannot be
     * renamed over a directory of that name */
    snprintf(out, sizeof out, "%s/out-blocked", tmp);
    mkdir(out, 0755);
    snprintf(path, sizeof path, "%s/val.bin", out);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/val.bin/keep", out);
    write_text(path, "x");
    CHECK(prepare(tok, out, in_two, 1, WHALE_DOC_LINE, NULL, &st, &err) == WHALE_ERR_IO && strstr(err.msg, "val.bin"),
          "rename failure: %s", err.msg);
    CHECK(dir_entries(out) == 1, "only the blocking directory is left (%d entries)", dir_entries(out));
    whale_tokenizer_free(t);
}

/* ------------------------------------------------------------ windows on a crafted stream */

static const int DOC_LEN[] = {3, 5, 1, 7, 4, 10, 2, 6};
enum { N_DOCS = 8, STREAM = 38, CRAFT_VOCAB = 2000 };

static int32_t craft_token(int d, int i) { return (int32_t)(1 + (d * 37 + i * 11) % (CRAFT_VOCAB - 1)); }

/* Train documents of DOC_LEN (shards of at most 9 tokens: [3 5 1] [7] [4]
 * [10] [2 6]) plus two validation documents. */
static void make_crafted(const char *dir, int vocab, uint64_t fp) {
    whale_data_layout lay = {vocab, 0, fp, 9, 1};
    whale_data_writer *w;
    whale_err err;
    if (whale_data_writer_new(dir, &lay, &w, &err)) {
        CHECK(0, "writer: %s", err.msg);
        return;
    }
    for (int d = 0; d < N_DOCS; d++) {
        int32_t ids[16];
        for (int i = 0; i < DOC_LEN[d]; i++) ids[i] = vocab > 65536 ? 65536 + craft_token(d, i) : craft_token(d, i);
        CHECK(whale_data_writer_add(w, WHALE_SPLIT_TRAIN, ids, DOC_LEN[d], &err) == WHALE_OK, "add: %s", err.msg);
        if (d < 2) CHECK(whale_data_writer_add(w, WHALE_SPLIT_VAL, ids, DOC_LEN[d], &err) == WHALE_OK, "add val");
    }
    int32_t bad = vocab;
    CHECK(whale_data_writer_add(w, WHALE_SPLIT_TRAIN, &bad, 1, &err) == WHALE_ERR_RANGE, "id outside the vocabulary");
    CHECK(whale_data_writer_add(w, WHALE_SPLIT_TRAIN, &bad, 0, &err) == WHALE_ERR_ARG, "empty document");
    CHECK(whale_data_writer_finish(w, &err) == WHALE_OK, "finish: %s", err.msg);
    whale_data_writer_free(w);
}

/* The rules written out plainly over the flat stream. */
static void reference_window(int64_t w, int S, int cross, int32_t *ids, int32_t *labels, int32_t *pos, int32_t *seg,
                             int offset) {
    int32_t stream[STREAM];
    int starts[STREAM], n = 0;
    for (int d = 0; d < N_DOCS; d++)
        for (int i = 0; i < DOC_LEN[d]; i++) {
            starts[n] = i == 0;
            stream[n++] = offset + craft_token(d, i);
        }
    int ds = 0;
    for (int s = 0; s < S; s++) {
        int g = (int)w * S + s;
        if (s > 0 && starts[g]) ds = s;
        ids[s] = stream[g];
        labels[s] = s == 0 || starts[g] ? -100 : stream[g];
        pos[s] = s - ds;
        seg[s] = cross ? 0 : ds;
    }
}

static void check_windows(const char *tmp) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/crafted", tmp);
    make_crafted(dir, CRAFT_VOCAB, 0x1234);
    whale_err err;
    whale_dataset *d;
    if (whale_dataset_open(dir, "train", &d, &err)) {
        CHECK(0, "open crafted: %s", err.msg);
        return;
    }
    CHECK(whale_dataset_tokens(d) == STREAM && whale_dataset_documents(d) == N_DOCS && whale_dataset_num_shards(d) == 5 &&
              whale_dataset_vocab(d) == CRAFT_VOCAB && whale_dataset_eos(d) == 0 && whale_dataset_fingerprint(d) == 0x1234,
          "crafted: %lld tokens, %lld documents, %d shards", (long long)whale_dataset_tokens(d),
          (long long)whale_dataset_documents(d), whale_dataset_num_shards(d));
    static const int sizes[] = {1, 2, 3, 4, 5, 7, 9, 10, 16, 19, 38};
    int32_t a[4][STREAM], b[4][STREAM];
    for (int cross = 0; cross < 2; cross++) {
        whale_dataset_set_cross_doc(d, cross);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            int S = sizes[k];
            CHECK(whale_dataset_num_windows(d, S) == STREAM / S, "windows of %d", S);
            for (int64_t w = 0; w < STREAM / S; w++) {
                whale_dataset_window(d, w, S, a[0], a[1], a[2], a[3], &err);
                reference_window(w, S, cross, b[0], b[1], b[2], b[3], 0);
                int same = 1;
                for (int f = 0; f < 4; f++) same = same && !memcmp(a[f], b[f], sizeof(int32_t) * (size_t)S);
                CHECK(same, "window %lld of %d (cross_doc %d) breaks the rules", (long long)w, S, cross);
            }
        }
    }
    whale_dataset_set_cross_doc(d, 0);
    /* a concrete case: S = 10, window 0 spans documents of 3, 5 and 1 tokens + 1 of the 7 */
    whale_dataset_window(d, 0, 10, a[0], a[1], a[2], a[3], &err);
    static const int32_t pos0[] = {0, 1, 2, 0, 1, 2, 3, 4, 0, 0}, seg0[] = {0, 0, 0, 3, 3, 3, 3, 3, 8, 9};
    CHECK(!memcmp(a[2], pos0, sizeof pos0) && !memcmp(a[3], seg0, sizeof seg0), "positions and segments of window 0");
    CHECK(a[1][0] == -100 && a[1][3] == -100 && a[1][8] == -100 && a[1][9] == -100 && a[1][1] == a[0][1],
          "labels of window 0");
    CHECK(whale_dataset_window(d, 4, 10, a[0], NULL, NULL, NULL, &err) == WHALE_ERR_RANGE, "window past the end");

    /* the shuffle is a permutation, new every epoch, and the same everywhere */
    static const int64_t ns[] = {1, 2, 3, 5, 17, 100, 1000, 4097};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int64_t n = ns[k];
        unsigned char *seen = calloc((size_t)n, 1);
        int ok = 1, differs = 0, moved = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t p = whale_data_shuffle(42, 0, n, i);
            ok = ok && p >= 0 && p < n && !seen[p];
            if (p >= 0 && p < n) seen[p] = 1;
            differs += p != whale_data_shuffle(42, 1, n, i);
            moved += p != i;
        }
        CHECK(ok, "shuffle of %lld is a permutation", (long long)n);
        CHECK(n < 5 || (differs > 0 && moved > 0), "shuffle of %lld changes per epoch and moves windows", (long long)n);
        free(seen);
    }
    CHECK(whale_data_shuffle(1, 0, 10, 10) == -1 && whale_data_shuffle(1, 0, 10, -1) == -1, "shuffle index range");
    CHECK(whale_data_shuffle(5, 3, 1000, 0) != whale_data_shuffle(6, 3, 1000, 0) ||
              whale_data_shuffle(5, 3, 1000, 1) != whale_data_shuffle(6, 3, 1000, 1),
          "the seed matters");

    /* batches follow the cursor's permutation across epochs; a saved cursor
     * resumes exactly */
    enum { B = 4, S = 4, STEPS = 12 }; /* 9 windows per epoch */
    whale_batch run[STEPS], again;
    whale_data_cursor cur = {99, 0, 0, 0}, saved = cur;
    int ok = 1;
    int64_t visited[9] = {0};
    for (int step = 0; step < STEPS; step++) {
        whale_data_cursor before = cur;
        whale_batch_alloc(B, S, &run[step], &err);
        ok = ok && whale_dataset_next_batch(d, &cur, B, S, &run[step], &err) == WHALE_OK;
        if (step == 5) saved = cur;
        for (int r = 0; r < B; r++) { /* each row is the window the permutation names */
            if (before.index == 9) before.epoch++, before.index = 0;
            int64_t w = whale_data_shuffle(99, before.epoch, 9, before.index++);
            if (before.epoch == 0) visited[w]++;
            int32_t ids[S], lab[S], pos[S], seg[S];
            whale_dataset_window(d, w, S, ids, lab, pos, seg, &err);
            ok = ok && !memcmp(ids, run[step].ids + r * S, sizeof ids) && !memcmp(lab, run[step].labels + r * S, sizeof lab) &&
                 !memcmp(pos, run[step].pos + r * S, sizeof pos) && !memcmp(seg, run[step].seg + r * S, sizeof seg);
        }
    }
    CHECK(ok, "batches are the permuted windows");
    int once = 1;
    for (int w = 0; w < 9; w++) once = once && visited[w] == 1;
    CHECK(once, "epoch 0 visits every window once");
    CHECK(cur.epoch == 5 && cur.index == 3 && cur.windows == 9, "cursor after 48 windows: epoch %lld index %lld",
          (long long)cur.epoch, (long long)cur.index);
    whale_batch_alloc(B, S, &again, &err);
    for (int step = 6; step < STEPS; step++) {
        CHECK(whale_dataset_next_batch(d, &saved, B, S, &again, &err) == WHALE_OK, "resume: %s", err.msg);
        CHECK(!memcmp(again.ids, run[step].ids, sizeof(int32_t) * B * S) &&
                  !memcmp(again.labels, run[step].labels, sizeof(int32_t) * B * S),
              "resumed batch %d is identical", step);
    }
    CHECK(saved.epoch == cur.epoch && saved.index == cur.index, "resumed cursor ends where the first run did");
    for (int step = 0; step < STEPS; step++) whale_batch_free(&run[step]);
    whale_data_cursor moved = cur;
    CHECK(whale_dataset_next_batch(d, &moved, B, 5, &again, &err) == WHALE_ERR_ARG && strstr(err.msg, "cursor") &&
              moved.index == cur.index,
          "a cursor for another window count is refused and not moved: %s", err.msg);
    whale_data_cursor fresh = {1, 0, 0, 0};
    CHECK(whale_dataset_next_batch(d, &fresh, 1, 39, &again, &err) == WHALE_ERR_ARG &&
              strstr(err.msg, "fewer than one window") && fresh.windows == 0,
          "too short for one window: %s", err.msg);
    whale_batch_free(&again);

    /* compatibility with a model and a tokenizer */
    CHECK(whale_dataset_check(d, CRAFT_VOCAB, NULL, &err) == WHALE_OK, "same vocabulary");
    CHECK(whale_dataset_check(d, 4096, NULL, &err) == WHALE_OK, "larger embedding is fine");
    CHECK(whale_dataset_check(d, 512, NULL, &err) == WHALE_ERR_RANGE &&
              strstr(err.msg, "train-00000.bin: shards were made with a tokenizer of 2000 ids but the model has 512"),
          "vocab mismatch: %s", err.msg);
    char tok[600];
    snprintf(tok, sizeof tok, "%s/tok", tmp);
    CHECK(whale_dataset_check(d, CRAFT_VOCAB, tok, &err) == WHALE_ERR_FORMAT && strstr(err.msg, "another tokenizer") &&
              strstr(err.msg, "tokenizer.json"),
          "fingerprint mismatch: %s", err.msg);
    whale_dataset_free(d);

    /* validation split of the crafted data, and a uint32 dataset */
    CHECK(whale_dataset_open(dir, "val", &d, &err) == WHALE_OK && whale_dataset_documents(d) == 2 &&
              whale_dataset_tokens(d) == 8,
          "crafted val");
    whale_dataset_free(d);
    CHECK(whale_dataset_open(dir, "test", &d, &err) == WHALE_ERR_ARG, "unknown split");
    snprintf(dir, sizeof dir, "%s/crafted32", tmp);
    make_crafted(dir, 70000, 0x1234);
    char path[1200];
    snprintf(path, sizeof path, "%s/train-00000.bin", dir);
    raw_shard r;
    CHECK(read_raw(path, &r) && r.tb == 4 && r.vocab == 70000, "vocabulary above 65536 stores uint32");
    free_raw(&r);
    if (whale_dataset_open(dir, "train", &d, &err) == WHALE_OK) {
        whale_dataset_window(d, 1, 19, a[0], a[1], a[2], a[3], &err);
        reference_window(1, 19, 0, b[0], b[1], b[2], b[3], 65536);
        CHECK(!memcmp(a, b, sizeof(int32_t) * 19) && !memcmp(a[1], b[1], sizeof(int32_t) * 19), "uint32 window");
        whale_dataset_free(d);
    } else {
        CHECK(0, "open uint32: %s", err.msg);
    }
}

/* ------------------------------------------------------------ corrupt data */

typedef void (*corrupt_fn)(const char *dir);

static void patch(const char *dir, const char *file, long at, const void *bytes, size_t n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r+b");
    if (!f) exit(1);
    fseek(f, at, at < 0 ? SEEK_END : SEEK_SET);
    fwrite(bytes, 1, n, f);
    fclose(f);
}

static void c_truncate(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/train-00001.bin", dir);
    struct stat st;
    stat(path, &st);
    if (truncate(path, st.st_size - 3) != 0) exit(1);
}
static void c_magic(const char *dir) { patch(dir, "train-00000.bin", 0, "WHALETOX", 8); }
static void c_version(const char *dir) {
    unsigned char v[4];
    put32(v, 2);
    patch(dir, "train-00002.bin", 8, v, 4);
}
static void c_order(const char *dir) { /* train-00000: offsets 0 3 8 9 -> 0 8 3 9 */
    unsigned char v[16];
    put64(v, 8);
    put64(v + 8, 3);
    patch(dir, "train-00000.bin", 64 + 9 * 2 + 8, v, 16);
}
static void c_count(const char *dir) {
    unsigned char v[8];
    put64(v, 6);
    patch(dir, "train-00001.bin", 24, v, 8);
}
static void c_reserved(const char *dir) { patch(dir, "val.bin", 60, "\1", 1); }
static void c_meta(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    size_t n;
    char *m = (char *)read_all(path, &n);
    char *at = strstr(m, "\"tokens\":\t38");
    if (at) memcpy(at, "\"tokens\":\t37", 12);
    write_text(path, m);
    free(m);
}
static void c_meta_gone(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    unlink(path);
}
static void c_shard_gone(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/train-00003.bin", dir);
    unlink(path);
}
static void c_escape(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    size_t n;
    char *m = (char *)read_all(path, &n);
    char *at = strstr(m, "\"train-00004.bin\"");
    if (at) memcpy(at, "\"../../etc/passw\"", 17);
    write_text(path, m);
    free(m);
}

static void check_corrupt(const char *tmp) {
    char good[600], bad[600];
    snprintf(good, sizeof good, "%s/crafted", tmp);
    snprintf(bad, sizeof bad, "%s/corrupt", tmp);
    static const struct {
        const char *name;
        corrupt_fn fn;
        const char *split;
        whale_code code;
        const char *want1, *want2;
    } cases[] = {
        {"truncated shard", c_truncate, "train", WHALE_ERR_FORMAT, "train-00001.bin", "truncated"},
        {"bad magic", c_magic, "train", WHALE_ERR_FORMAT, "train-00000.bin", "not a token shard"},
        {"wrong version", c_version, "train", WHALE_ERR_UNSUPPORTED, "train-00002.bin", "version 2"},
        {"offsets out of order", c_order, "train", WHALE_ERR_FORMAT, "train-00000.bin", "document index entry 2"},
        {"header count", c_count, "train", WHALE_ERR_FORMAT, "train-00001.bin", "meta.json"},
        {"reserved bytes", c_reserved, "val", WHALE_ERR_FORMAT, "val.bin", "reserved"},
        {"meta totals", c_meta, "train", WHALE_ERR_FORMAT, "meta.json", "claims 37 tokens"},
        {"meta missing", c_meta_gone, "val", WHALE_ERR_IO, "meta.json", "cannot open"},
        {"shard missing", c_shard_gone, "train", WHALE_ERR_IO, "train-00003.bin", "cannot open"},
        {"file outside", c_escape, "train", WHALE_ERR_FORMAT, "shards[4].file", "not a file name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        copy_dir(good, bad);
        cases[i].fn(bad);
        whale_dataset *d = NULL;
        whale_err err = {0};
        whale_code rc = whale_dataset_open(bad, cases[i].split, &d, &err);
        CHECK(rc == cases[i].code && d == NULL, "%s: code %d (%s)", cases[i].name, rc, err.msg);
        CHECK(rc && strstr(err.msg, cases[i].want1) && strstr(err.msg, cases[i].want2) && !strchr(err.msg, '\n'),
              "%s: message \"%s\"", cases[i].name, err.msg);
        whale_dataset_free(d);
    }
    /* a token outside the vocabulary is found when its window is read */
    copy_dir(good, bad);
    patch(bad, "train-00003.bin", 64 + 2, "\xff\xff", 2);
    whale_dataset *d;
    whale_err err;
    if (whale_dataset_open(bad, "train", &d, &err) == WHALE_OK) {
        int32_t ids[38];
        CHECK(whale_dataset_window(d, 0, 38, ids, NULL, NULL, NULL, &err) == WHALE_ERR_FORMAT &&
                  strstr(err.msg, "train-00003.bin") && strstr(err.msg, "65535"),
              "token outside the vocabulary: %s", err.msg);
        whale_dataset_free(d);
    } else {
        CHECK(0, "open with a bad token: %s", err.msg);
    }

    /* a writer freed without finishing removes what it made */
    snprintf(bad, sizeof bad, "%s/abandoned", tmp);
    whale_data_layout lay = {100, 1, 0, 0, 0};
    whale_data_writer *w;
    int32_t ids[3] = {5, 6, 1};
    CHECK(whale_data_writer_new(bad, &lay, &w, &err) == WHALE_OK, "writer: %s", err.msg);
    whale_data_writer_add(w, WHALE_SPLIT_TRAIN, ids, 3, &err);
    whale_data_writer_free(w);
    CHECK(!exists(bad), "an abandoned writer leaves nothing");
}

int main(void) {
    char tmp[512];
    test_tmpdir("data", tmp, sizeof tmp);
    check_prepare(tmp);
    check_windows(tmp);
    check_corrupt(tmp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (!test_failures && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return test_finish("test_data");
}
