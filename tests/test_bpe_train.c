/* BPE trainer tests: trains on text this test writes (English, code,
 * digits, CJK, emoji, special tokens, invalid UTF-8; plain and .jsonl),
 * checks the vocabulary layout and merges, loads the result with the
 * tokenizer, round-trips text, checks the chat template is recognised and
 * renders, compares the merges with a naive trainer written here from the
 * definition (counts recomputed from scratch every step), and the error
 * cases. */
#include "whale_bpe.h"
#include "whale_chat.h"
#include "whale_tokenizer.h"

#include "core/core.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define USER_TOK WHALE_BPE_USER
#define ASSISTANT_TOK WHALE_BPE_ASSISTANT

/* ------------------------------------------------------------ helpers */

typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

static void sadd(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = 2 * (b->len + n + 1);
        b->p = realloc(b->p, b->cap);
        if (!b->p) exit(1);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void sadds(sbuf *b, const char *s) { sadd(b, s, strlen(s)); }

static void write_bytes(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(s, 1, n, f) != n || fclose(f)) {
        perror(path);
        exit(1);
    }
}

static char *slurp(const char *path, size_t *n) {
    char *buf;
    whale_err err;
    if (whale_read_file(path, &buf, n, &err)) return NULL;
    return buf;
}

static cJSON *read_json(const char *path) {
    size_t n;
    char *buf = slurp(path, &n);
    cJSON *j = buf ? cJSON_ParseWithLength(buf, n) : NULL;
    free(buf);
    return j;
}

static const char *path_in(char *buf, size_t cap, const char *dir, const char *name) {
    if ((size_t)snprintf(buf, cap, "%s/%s", dir, name) >= cap) {
        fprintf(stderr, "path too long: %s/%s\n", dir, name);
        exit(1);
    }
    return buf;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int encode(whale_tokenizer *t, const char *s, int32_t **ids) {
    int n;
    whale_err err;
    if (whale_tokenizer_encode(t, s, strlen(s), 0, ids, &n, &err)) {
        fprintf(stderr, "encode: %s\n", err.msg);
        return -1;
    }
    return n;
}

static int roundtrips(whale_tokenizer *t, const char *s, size_t n, const char *want, size_t want_n) {
    int32_t *ids;
    int k;
    char *text;
    size_t len;
    whale_err err;
    if (whale_tokenizer_encode(t, s, n, 0, &ids, &k, &err)) return 0;
    int ok = !whale_tokenizer_decode(t, ids, k, 0, &text, &len, &err) && len == want_n && !memcmp(text, want, len);
    free(ids);
    if (ok) free(text);
    return ok;
}

/* ------------------------------------------------------------ corpus */

static const char *const common[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
    "tokenizer", "model", "training", "whale", "data", "merge", "pair", "vocabulary", "people", "time"};
static const char *const rare[] = {"quixotic", "zephyr", "obfuscate", "labyrinthine", "sesquipedalian",
                                   "mnemonic", "xylophone", "juxtapose", "kerfuffle", "onomatopoeia"};

static int pick(whale_rng *r, int n) { return (int)(whale_rng_u64(r) % (uint64_t)n); }

/* Rank-weighted: word k with probability about 1/(k+1). */
static const char *word(whale_rng *r) {
    int n = (int)(sizeof common / sizeof common[0]);
    for (;;) {
        int k = pick(r, n);
        if (pick(r, k + 1) == 0) return common[k];
    }
}

static void add_cp(sbuf *b, unsigned cp) {
    char u[4];
    int n;
    if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 63)), u[2] = (char)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 63)), u[2] = (char)(0x80 | (cp >> 6 & 63)),
        u[3] = (char)(0x80 | (cp & 63)), n = 4;
    sadd(b, u, (size_t)n);
}

/* One document of mixed text (no newline inside when line is set). */
static void document(whale_rng *r, sbuf *b, int line) {
    int kind = pick(r, 10);
    char tmp[64];
    if (kind < 6) { /* prose with numbers */
        int n = 8 + pick(r, 30);
        for (int i = 0; i < n; i++) {
            if (i) sadds(b, pick(r, 12) ? " " : ", ");
            if (pick(r, 15) == 0) {
                snprintf(tmp, sizeof tmp, "%d", pick(r, 100000));
                sadds(b, tmp);
            } else {
                sadds(b, pick(r, 200) ? word(r) : rare[pick(r, 10)]);
            }
        }
        sadds(b, ". ");
    } else if (kind < 8) { /* code */
        int n = 2 + pick(r, 5);
        for (int i = 0; i < n; i++) {
            snprintf(tmp, sizeof tmp, "    int %s_%d = %s(%d);", word(r), pick(r, 10), word(r), pick(r, 1000));
            sadds(b, tmp);
            sadds(b, line ? " " : "\n");
        }
    } else if (kind < 9) { /* CJK with kana and an emoji */
        int n = 5 + pick(r, 30);
        for (int i = 0; i < n; i++) add_cp(b, pick(r, 4) ? 0x4E00 + (unsigned)pick(r, 60) : 0x3041 + (unsigned)pick(r, 20));
        add_cp(b, 0x3002);
        add_cp(b, 0x1F600 + (unsigned)pick(r, 8));
        sadds(b, " ");
    } else { /* a chat turn with the markers */
        sadds(b, USER_TOK);
        sadds(b, word(r));
        sadds(b, " ");
        sadds(b, word(r));
        sadds(b, ASSISTANT_TOK);
        sadds(b, word(r));
        sadds(b, WHALE_BPE_EOS);
    }
    if (!line) sadds(b, "\n");
}

/* corpus.txt (one document per file), docs.jsonl, bad.txt (invalid UTF-8). */
static void write_corpus(const char *dir, size_t bytes, sbuf *all_text, sbuf *docs) {
    whale_rng r;
    whale_rng_seed(&r, 7);
    sbuf txt = {0}, jl = {0};
    char path[512];
    while (txt.len < bytes) document(&r, &txt, 0);
    while (jl.len < bytes / 2) {
        sbuf d = {0};
        document(&r, &d, 1);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "text", d.p);
        char *line = cJSON_PrintUnformatted(o);
        sadds(&jl, line);
        sadds(&jl, pick(&r, 20) ? "\n" : "\n\n"); /* blank lines are skipped */
        sadd(docs, d.p, d.len + 1); /* NUL-separated */
        free(line);
        cJSON_Delete(o);
        free(d.p);
    }
    write_bytes(path_in(path, sizeof path, dir, "corpus.txt"), txt.p, txt.len);
    write_bytes(path_in(path, sizeof path, dir, "docs.jsonl"), jl.p, jl.len);
    static const char bad[] = "bad bytes \xFF here, a cut character \xE4\xB8 and \xC0\xAF overlong the end";
    write_bytes(path_in(path, sizeof path, dir, "bad.txt"), bad, sizeof bad - 1);
    sadd(all_text, txt.p, txt.len);
    free(txt.p);
    free(jl.p);
}

/* ------------------------------------------------------------ naive trainer */

/* BPE from the definition over space-separated ASCII words: every step
 * recounts all pairs, takes the most frequent (ties: the older left token,
 * then the older right one; the bytes come in the order of their
 * byte-level characters), merges it left to right in every word. Returns
 * the merges as "left right" strings in bytes. */
enum { NAIVE_TOK = 2048 };
typedef struct {
    char *tok[NAIVE_TOK];
    int ntok;
} naive_vocab;

static int naive_id(naive_vocab *v, const char *s, size_t n, int add) {
    for (int i = 0; i < v->ntok; i++)
        if (strlen(v->tok[i]) == n && !memcmp(v->tok[i], s, n)) return i;
    if (!add) return -1;
    v->tok[v->ntok] = strndup(s, n);
    return v->ntok++;
}

static int naive_train(const char *text, int want, int min_freq, char ***merges_out) {
    naive_vocab v = {{0}, 0};
    int byte_id[256];
    for (int pass = 0; pass < 2; pass++) /* printable bytes, then the 68 that map above U+00FF */
        for (int b = 0; b < 256; b++) {
            int kept = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            char c = (char)b;
            if (kept == !pass) byte_id[b] = naive_id(&v, &c, 1, 1);
        }
    /* distinct words and counts */
    enum { MAXW = 4096, MAXL = 64 };
    static int sym[MAXW][MAXL], len[MAXW], cnt[MAXW];
    int nw = 0;
    for (const char *p = text; *p;) {
        const char *e = strchr(p + 1, ' ');
        if (!e) e = p + strlen(p);
        int w;
        for (w = 0; w < nw; w++) {
            int same = len[w] == (int)(e - p);
            for (int i = 0; same && i < len[w]; i++) same = sym[w][i] == byte_id[(unsigned char)p[i]];
            if (same) break;
        }
        if (w == nw) {
            len[nw] = (int)(e - p);
            for (int i = 0; i < len[nw]; i++) sym[nw][i] = byte_id[(unsigned char)p[i]];
            cnt[nw++] = 0;
        }
        cnt[w]++;
        p = e;
    }
    static int pc[NAIVE_TOK][NAIVE_TOK];
    static unsigned char done_pair[NAIVE_TOK][NAIVE_TOK];
    memset(done_pair, 0, sizeof done_pair);
    char **merges = calloc(4096, sizeof *merges);
    int nm = 0, made = 0;
    while (made < want && v.ntok < NAIVE_TOK) {
        for (int w = 0; w < nw; w++)
            for (int i = 0; i + 1 < len[w]; i++) pc[sym[w][i]][sym[w][i + 1]] += cnt[w];
        int ba = -1, bb = -1;
        for (int w = 0; w < nw; w++)
            for (int i = 0; i + 1 < len[w]; i++) {
                int a = sym[w][i], b = sym[w][i + 1];
                if (ba >= 0 && pc[a][b] < pc[ba][bb]) continue;
                if (ba >= 0 && pc[a][b] == pc[ba][bb] && (a > ba || (a == ba && b >= bb))) continue;
                ba = a, bb = b;
            }
        int best = ba >= 0 ? pc[ba][bb] : 0;
        for (int w = 0; w < nw; w++)
            for (int i = 0; i + 1 < len[w]; i++) pc[sym[w][i]][sym[w][i + 1]] = 0;
        if (ba < 0 || best < min_freq) break;
        char joined[256];
        snprintf(joined, sizeof joined, "%s%s", v.tok[ba], v.tok[bb]);
        int had = naive_id(&v, joined, strlen(joined), 0) >= 0;
        int c = naive_id(&v, joined, strlen(joined), 1);
        if (!done_pair[ba][bb]) {
            char m[512];
            snprintf(m, sizeof m, "%s %s", v.tok[ba], v.tok[bb]);
            merges[nm++] = strdup(m);
            done_pair[ba][bb] = 1;
            made += !had;
        }
        for (int w = 0; w < nw; w++) {
            int k = 0;
            for (int i = 0; i < len[w];) {
                if (i + 1 < len[w] && sym[w][i] == ba && sym[w][i + 1] == bb) sym[w][k++] = c, i += 2;
                else sym[w][k++] = sym[w][i++];
            }
            len[w] = k;
        }
    }
    for (int i = 0; i < v.ntok; i++) free(v.tok[i]);
    *merges_out = merges;
    return nm;
}

/* The merges of a tokenizer.json as "left right" byte strings. */
static int json_merges(const cJSON *tj, char ***out) {
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "model"), "merges");
    int n = cJSON_GetArraySize(m), i = 0;
    char **list = calloc((size_t)n + 1, sizeof *list);
    /* invert the byte map for ASCII letters and space */
    for (const cJSON *c = m ? m->child : NULL; c; c = c->next, i++) {
        sbuf s = {0};
        for (int side = 0; side < 2; side++) {
            const char *t = cJSON_GetArrayItem(c, side)->valuestring;
            if (side) sadds(&s, " ");
            for (; *t; t++) {
                if (!strncmp(t, "\xC4\xA0", 2)) { /* Ġ */
                    sadds(&s, " ");
                    t++;
                } else {
                    sadd(&s, t, 1);
                }
            }
        }
        list[i] = s.p;
    }
    *out = list;
    return n;
}

static void free_list(char **l, int n) {
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

/* ------------------------------------------------------------ tests */

static whale_code train_files(const char *const *files, int n, const char *out, int vocab, int min_freq,
                              const char *const *special, int n_special, whale_bpe_train_stats *st, whale_err *err) {
    whale_bpe_train_opts o;
    whale_bpe_train_defaults(&o);
    o.vocab_size = vocab;
    o.min_frequency = min_freq;
    o.extra_special = special;
    o.n_extra_special = n_special;
    return whale_bpe_train(&o, files, n, out, st, err);
}

static void test_naive(const char *dir) {
    /* words over {a, b, c}: many ties, overlapping pairs ("aaa"), and the
     * same bytes reached through different splits */
    whale_rng r;
    whale_rng_seed(&r, 99);
    sbuf text = {0};
    for (int i = 0; i < 4000; i++) {
        if (i) sadds(&text, " ");
        int n = 1 + pick(&r, 6);
        for (int k = 0; k < n; k++) sadd(&text, &"aabc"[pick(&r, 4)], 1);
    }
    char file[512], out[512];
    path_in(file, sizeof file, dir, "abc.txt");
    path_in(out, sizeof out, dir, "abc");
    write_bytes(file, text.p, text.len);
    const char *files[] = {file};
    for (int pass = 0; pass < 2; pass++) {
        int want = pass ? 100000 : 150, min_freq = pass ? 1 : 2;
        whale_bpe_train_stats st;
        whale_err err;
        whale_code rc = train_files(files, 1, out, WHALE_BPE_FIXED_TOKENS + want, min_freq, NULL, 0, &st, &err);
        CHECK(rc == WHALE_OK, "train abc: %s", err.msg);
        if (rc) break;
        char p[600];
        cJSON *tj = read_json(path_in(p, sizeof p, out, "tokenizer.json"));
        char **got, **ref;
        int ng = json_merges(tj, &got), nr = naive_train(text.p, want, min_freq, &ref);
        int same = ng == nr, first = -1;
        for (int i = 0; i < ng && i < nr && first < 0; i++)
            if (strcmp(got[i], ref[i])) first = i;
        CHECK(same && first < 0, "pass %d: %d merges vs naive %d, first difference at %d: \"%s\" vs \"%s\"", pass, ng,
              nr, first, first >= 0 ? got[first] : "", first >= 0 ? ref[first] : "");
        if (pass == 0) {
            CHECK(st.vocab_size == WHALE_BPE_FIXED_TOKENS + want, "vocab %d", st.vocab_size);
        } else {
            /* trained until no pair is left: every word is one token */
            CHECK(st.vocab_size < WHALE_BPE_FIXED_TOKENS + want, "vocab %d", st.vocab_size);
            whale_tokenizer *t;
            CHECK(whale_tokenizer_load(out, &t, &err) == WHALE_OK, "load: %s", err.msg);
            int multi = 0;
            for (const char *s = text.p; *s && t;) {
                const char *e = strchr(s + 1, ' ');
                if (!e) e = s + strlen(s);
                int32_t *ids;
                int n;
                whale_tokenizer_encode(t, s, (size_t)(e - s), 0, &ids, &n, &err);
                multi += n != 1;
                free(ids);
                s = e;
            }
            CHECK(multi == 0, "%d words are not single tokens", multi);
            whale_tokenizer_free(t);
        }
        free_list(got, ng);
        free_list(ref, nr);
        cJSON_Delete(tj);
    }
    free(text.p);
}

static void test_ties(const char *dir) {
    /* pre-tokens "ab" x1, " ab" x2, " cd" x3: pairs "ab" 3, " c" 3, "cd" 3,
     * " a" 2. Ids: a < b < c < d < " " (U+0120), so "ab" (oldest left),
     * then "cd" (3, left c before " "), then " cd" (3), then " ab" (2). */
    char file[512], out[512], p[600];
    write_bytes(path_in(file, sizeof file, dir, "ties.txt"), "ab cd ab cd ab cd", 17);
    path_in(out, sizeof out, dir, "ties");
    const char *files[] = {file};
    whale_err err;
    CHECK(train_files(files, 1, out, WHALE_BPE_FIXED_TOKENS + 4, 2, NULL, 0, NULL, &err) == WHALE_OK, "%s", err.msg);
    cJSON *tj = read_json(path_in(p, sizeof p, out, "tokenizer.json"));
    char **m;
    int n = json_merges(tj, &m);
    static const char *const want[] = {"a b", "c d", "  cd", "  ab"};
    CHECK(n == 4, "%d merges", n);
    for (int i = 0; i < n && i < 4; i++) CHECK(!strcmp(m[i], want[i]), "merge %d: \"%s\", want \"%s\"", i, m[i], want[i]);
    free_list(m, n);
    cJSON_Delete(tj);
}

/* Layout, merges, loading, round trips on the mixed corpus. */
static void test_mixed(const char *dir) {
    enum { VOCAB = 1500 };
    sbuf text = {0}, docs = {0};
    write_corpus(dir, 300000, &text, &docs);
    char f1[512], f2[512], f3[512], outa[512], outb[512], p[600], q[600];
    path_in(f1, sizeof f1, dir, "corpus.txt");
    path_in(f2, sizeof f2, dir, "docs.jsonl");
    path_in(f3, sizeof f3, dir, "bad.txt");
    path_in(outa, sizeof outa, dir, "a");
    path_in(outb, sizeof outb, dir, "b/"); /* a trailing slash is fine */
    const char *files[] = {f1, f2, f3}, *reversed[] = {f3, f2, f1};
    whale_bpe_train_stats st;
    whale_err err;
    double t0 = whale_now();
    whale_code rc = train_files(files, 3, outa, VOCAB, 2, NULL, 0, &st, &err);
    CHECK(rc == WHALE_OK, "train: %s", err.msg);
    if (rc) return;
    printf("trained vocab %d on %.2f MB (%lld pre-tokens, %lld distinct) in %.3f s\n", st.vocab_size,
           (double)st.n_bytes / 1e6, (long long)st.n_words, (long long)st.n_unique_words, whale_now() - t0);
    CHECK(st.vocab_size == VOCAB, "vocab %d", st.vocab_size);

    /* deterministic, and independent of the order of the input */
    CHECK(train_files(reversed, 3, outb, VOCAB, 2, NULL, 0, NULL, &err) == WHALE_OK, "train b: %s", err.msg);
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int k = 0; k < 2; k++) {
        size_t na, nb;
        char *a = slurp(path_in(p, sizeof p, outa, names[k]), &na), *b = slurp(path_in(q, sizeof q, outb, names[k]), &nb);
        CHECK(a && b && na == nb && !memcmp(a, b, na), "%s differs between runs", names[k]);
        free(a);
        free(b);
        snprintf(p, sizeof p, "%s/%s.tmp", outa, names[k]);
        CHECK(!exists(p), "%s left behind", p);
    }

    /* the JSON: ids 0-2 specials, bytes from 3, merges in order, markers last */
    cJSON *tj = read_json(path_in(p, sizeof p, outa, "tokenizer.json"));
    cJSON *cfg = read_json(path_in(p, sizeof p, outa, "tokenizer_config.json"));
    CHECK(tj && cfg, "output is not JSON");
    if (!tj || !cfg) return;
    const cJSON *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "model"), "vocab");
    const cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "model"), "merges");
    const cJSON *added = cJSON_GetObjectItem(tj, "added_tokens");
    int nv = cJSON_GetArraySize(vocab), na = cJSON_GetArraySize(added);
    CHECK(nv == VOCAB - 2 && na == 5, "%d vocab entries, %d added tokens", nv, na);
    char *seen = calloc(VOCAB, 1);
    int bad_id = 0;
    for (const cJSON *c = vocab->child; c; c = c->next) {
        int id = c->valueint;
        if (id < 0 || id >= VOCAB || seen[id]++) bad_id++;
    }
    CHECK(bad_id == 0, "%d vocab ids out of range or repeated", bad_id);
    CHECK(cJSON_GetObjectItem(vocab, WHALE_BPE_BOS)->valueint == 0 && cJSON_GetObjectItem(vocab, WHALE_BPE_PAD)->valueint == 2,
          "specials not at 0-2");
    CHECK(cJSON_GetObjectItem(vocab, "!")->valueint == 3, "\"!\" is not 3");
    const char *tail[] = {USER_TOK, ASSISTANT_TOK};
    for (int k = 0; k < 2; k++) {
        const cJSON *a = cJSON_GetArrayItem(added, 3 + k);
        CHECK(!strcmp(cJSON_GetObjectItem(a, "content")->valuestring, tail[k]) &&
                  cJSON_GetObjectItem(a, "id")->valueint == VOCAB - 2 + k && cJSON_IsFalse(cJSON_GetObjectItem(a, "special")),
              "added token %d", 3 + k);
    }
    /* every merge joins known tokens; a new token gets the next id */
    int next = 3 + 256, bad = 0, rank = 0;
    char *seen_tok = calloc(VOCAB, 1);
    memset(seen_tok, 1, 3 + 256);
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *l = cJSON_GetArrayItem(m, 0)->valuestring, *r = cJSON_GetArrayItem(m, 1)->valuestring;
        const cJSON *il = cJSON_GetObjectItem(vocab, l), *ir = cJSON_GetObjectItem(vocab, r);
        char joined[1024];
        snprintf(joined, sizeof joined, "%s%s", l, r);
        const cJSON *ij = cJSON_GetObjectItem(vocab, joined);
        if (!il || !ir || !ij || !seen_tok[il->valueint] || !seen_tok[ir->valueint]) {
            if (bad++ < 3) fprintf(stderr, "  merge %d [\"%s\", \"%s\"] uses an unknown token\n", rank, l, r);
            continue;
        }
        if (!seen_tok[ij->valueint]) {
            if (ij->valueint != next && bad++ < 3) fprintf(stderr, "  merge %d makes id %d, want %d\n", rank, ij->valueint, next);
            seen_tok[ij->valueint] = 1;
            next++;
        }
    }
    CHECK(bad == 0, "%d inconsistent merges", bad);
    CHECK(next == VOCAB - 2, "merges make %d tokens, want %d", next - 259, VOCAB - 2 - 259);
    free(seen_tok);
    free(seen);
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(cfg, "add_bos_token")), "add_bos_token");
    CHECK(!strcmp(cJSON_GetObjectItem(cfg, "pad_token")->valuestring, WHALE_BPE_PAD), "pad_token");

    /* the same pre-tokenizer and chat template as the real DeepSeek-V3 files */
    const char *rd = getenv("WHALE_TOKENIZERS");
    snprintf(p, sizeof p, "%s/deepseek_v3/tokenizer.json", rd ? rd : WHALE_TEST_DATA "/../../.cache/tokenizers");
    snprintf(q, sizeof q, "%s/deepseek_v3/tokenizer_config.json", rd ? rd : WHALE_TEST_DATA "/../../.cache/tokenizers");
    cJSON *real = exists(p) ? read_json(p) : NULL, *real_cfg = exists(q) ? read_json(q) : NULL;
    if (real && real_cfg) {
        static const char *const same[] = {"normalizer", "pre_tokenizer", "post_processor", "decoder"};
        for (int k = 0; k < 4; k++)
            CHECK(cJSON_Compare(cJSON_GetObjectItem(real, same[k]), cJSON_GetObjectItem(tj, same[k]), 1),
                  "%s differs from DeepSeek-V3's", same[k]);
        CHECK(!strcmp(cJSON_GetObjectItem(real_cfg, "chat_template")->valuestring,
                      cJSON_GetObjectItem(cfg, "chat_template")->valuestring),
              "chat_template differs from DeepSeek-V3's");
        const cJSON *ra = cJSON_GetObjectItem(real, "added_tokens");
        for (const cJSON *x = ra->child; x; x = x->next) { /* same flags as the real tokens */
            const char *content = cJSON_GetObjectItem(x, "content")->valuestring;
            for (const cJSON *y = added->child; y; y = y->next)
                if (!strcmp(content, cJSON_GetObjectItem(y, "content")->valuestring))
                    CHECK(cJSON_Compare(cJSON_GetObjectItem(x, "special"), cJSON_GetObjectItem(y, "special"), 1) &&
                              cJSON_Compare(cJSON_GetObjectItem(x, "normalized"), cJSON_GetObjectItem(y, "normalized"), 1),
                          "flags of %s differ from DeepSeek-V3's", content);
        }
    } else {
        printf("(DeepSeek-V3 files not found at %s: run scripts/fetch-tokenizers.sh; comparison skipped)\n", p);
    }
    cJSON_Delete(real);
    cJSON_Delete(real_cfg);

    /* the tokenizer loads it and round-trips everything */
    whale_tokenizer *t;
    rc = whale_tokenizer_load(outa, &t, &err);
    CHECK(rc == WHALE_OK, "load: %s", err.msg);
    if (!rc) {
        CHECK(whale_tokenizer_vocab_size(t) == VOCAB, "loaded vocab %d", whale_tokenizer_vocab_size(t));
        CHECK(whale_tokenizer_role_id(t, WHALE_TOKEN_BOS) == 0 && whale_tokenizer_role_id(t, WHALE_TOKEN_EOS) == 1 &&
                  whale_tokenizer_role_id(t, WHALE_TOKEN_PAD) == 2,
              "role ids");
        CHECK(whale_tokenizer_is_special(t, 0) && whale_tokenizer_is_special(t, 2) && !whale_tokenizer_is_special(t, VOCAB - 1),
              "special flags");
        CHECK(roundtrips(t, text.p, text.len, text.p, text.len), "corpus.txt does not round-trip");
        int bad_docs = 0;
        for (const char *d = docs.p; d < docs.p + docs.len; d += strlen(d) + 1)
            bad_docs += !roundtrips(t, d, strlen(d), d, strlen(d));
        CHECK(bad_docs == 0, "%d documents do not round-trip", bad_docs);
        static const char bad_in[] = "bad bytes \xFF here, a cut character \xE4\xB8 and \xC0\xAF overlong";
        static const char bad_out[] = "bad bytes \xEF\xBF\xBD here, a cut character \xEF\xBF\xBD and "
                                      "\xEF\xBF\xBD\xEF\xBF\xBD overlong";
        CHECK(roundtrips(t, bad_in, sizeof bad_in - 1, bad_out, sizeof bad_out - 1), "invalid UTF-8 round trip");
        /* specials are one id each, also inside text; no BOS is added */
        int32_t *ids;
        int n = encode(t, "x" USER_TOK "hi" ASSISTANT_TOK "yo" WHALE_BPE_EOS, &ids);
        int assistant = 0;
        for (int i = 0; i < n; i++) assistant += ids[i] == VOCAB - 1;
        CHECK(n >= 6 && ids[1] == VOCAB - 2 && assistant == 1 && ids[n - 1] == 1, "chat markers: %d ids", n);
        free(ids);
        const char *one[] = {WHALE_BPE_BOS, WHALE_BPE_EOS, WHALE_BPE_PAD, USER_TOK, ASSISTANT_TOK};
        const int32_t one_id[] = {0, 1, 2, VOCAB - 2, VOCAB - 1};
        for (int k = 0; k < 5; k++) {
            n = encode(t, one[k], &ids);
            CHECK(n == 1 && ids[0] == one_id[k], "%s: %d ids", one[k], n);
            free(ids);
        }
        /* frequent words are single tokens; a rare one is not */
        const char *freq[] = {" the", "the", " of", " and", " tokenizer", " model"};
        for (int k = 0; k < 6; k++) {
            n = encode(t, freq[k], &ids);
            CHECK(n == 1, "\"%s\" is %d tokens", freq[k], n);
            free(ids);
        }
        n = encode(t, " zygomorphic", &ids); /* not in the corpus */
        CHECK(n > 1, "an unseen word is one token");
        free(ids);
        /* never more tokens than bytes; digits in groups of at most three */
        n = encode(t, "1234567", &ids);
        CHECK(n >= 3, "\"1234567\" is %d tokens (digits are split in threes)", n);
        free(ids);
        /* every token stays inside one pre-token: none has a letter and a
         * CJK character, or a digit next to a letter */
        int crossing = 0;
        for (int32_t id = 3; id < VOCAB - 2; id++) {
            size_t len;
            const char *s = whale_tokenizer_token_bytes(t, id, &len);
            int letter = 0, digit = 0, cjk = 0;
            for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)s[i];
                letter |= (c | 32) >= 'a' && (c | 32) <= 'z';
                digit |= c >= '0' && c <= '9';
                cjk |= c == 0xE4; /* the lead byte of U+4E00.. in this corpus */
            }
            crossing += (letter && cjk) || (letter && digit);
        }
        CHECK(crossing == 0, "%d tokens cross a pre-token boundary", crossing);
        /* the chat template is recognised and renders with single-id markers */
        whale_chat_format fmt = WHALE_CHAT_RAW;
        CHECK(whale_chat_detect(outa, &fmt, &err) == WHALE_OK && fmt == WHALE_CHAT_DEEPSEEK, "chat template: %s",
              err.msg);
        const whale_chat_message chat[] = {{"system", "Be brief."}, {"user", "the model"}, {"assistant", "of the data"}};
        uint8_t *mask;
        if (whale_chat_encode(t, WHALE_CHAT_DEEPSEEK, chat, 3, 1, &ids, &mask, &n, &err) == WHALE_OK) {
            int user = 0, asst = 0, eos = 0, masked = 0;
            for (int i = 0; i < n; i++) {
                user += ids[i] == VOCAB - 2, asst += ids[i] == VOCAB - 1, eos += ids[i] == 1;
                masked += mask[i];
            }
            CHECK(ids[0] == 0 && user == 1 && asst == 2 && eos == 1 && ids[n - 1] == VOCAB - 1 && masked >= 2,
                  "chat encoding: %d ids, BOS %d, %d user, %d assistant, %d EOS, %d masked", n, (int)ids[0], user, asst,
                  eos, masked);
            free(ids);
            free(mask);
        } else {
            CHECK(0, "chat encode: %s", err.msg);
        }
        int32_t stop[4];
        CHECK(whale_chat_stop_ids(t, WHALE_CHAT_DEEPSEEK, stop, 4) == 1 && stop[0] == 1, "stop ids");
        whale_tokenizer_free(t);
    }
    cJSON_Delete(tj);
    cJSON_Delete(cfg);
    free(text.p);
    free(docs.p);
}

static void test_extra_special(const char *dir) {
    char file[512], out[512];
    write_bytes(path_in(file, sizeof file, dir, "small.txt"), "hello <tool> world hello", 24);
    path_in(out, sizeof out, dir, "extra");
    const char *files[] = {file}, *special[] = {"<tool>", "<|im_end|>"};
    whale_bpe_train_stats st;
    whale_err err;
    /* exactly the fixed tokens: no merges */
    whale_code rc = train_files(files, 1, out, WHALE_BPE_FIXED_TOKENS + 2, 2, special, 2, &st, &err);
    CHECK(rc == WHALE_OK && st.vocab_size == WHALE_BPE_FIXED_TOKENS + 2 && st.n_merges == 0, "extra specials: %s",
          rc ? err.msg : "wrong size");
    whale_tokenizer *t;
    if (!rc && whale_tokenizer_load(out, &t, &err) == WHALE_OK) {
        int32_t *ids;
        int n = encode(t, "a<tool>b<|im_end|>", &ids);
        CHECK(n == 4 && ids[1] == WHALE_BPE_FIXED_TOKENS && ids[3] == WHALE_BPE_FIXED_TOKENS + 1 &&
                  whale_tokenizer_is_special(t, ids[1]),
              "extra specials encode: %d ids", n);
        free(ids);
        whale_tokenizer_free(t);
    } else {
        CHECK(0, "load: %s", err.msg);
    }
}

static void test_errors(const char *dir) {
    char empty[512], only[512], good[512], badj[512], nojson[512], out[512], file_as_dir[512], under_file[512], p[600];
    write_bytes(path_in(empty, sizeof empty, dir, "empty.txt"), "", 0);
    write_bytes(path_in(only, sizeof only, dir, "only.txt"), WHALE_BPE_EOS WHALE_BPE_BOS, strlen(WHALE_BPE_EOS WHALE_BPE_BOS));
    write_bytes(path_in(good, sizeof good, dir, "good.txt"), "some text some text", 19);
    write_bytes(path_in(badj, sizeof badj, dir, "bad.jsonl"), "{\"text\": \"a\"}\n\n{\"text\": \"b\"\n", 28);
    write_bytes(path_in(nojson, sizeof nojson, dir, "notext.jsonl"), "{\"text\": \"a\"}\n{\"body\": \"b\"}\n", 28);
    path_in(out, sizeof out, dir, "err-out");
    path_in(file_as_dir, sizeof file_as_dir, dir, "good.txt");
    path_in(under_file, sizeof under_file, dir, "good.txt/out");
    struct {
        const char *what, *file, *out, *msg;
        int vocab;
        whale_code code;
    } cases[] = {
        {"empty corpus", empty, out, "no text", 1000, WHALE_ERR_FORMAT},
        {"only special tokens", only, out, "no text", 1000, WHALE_ERR_FORMAT},
        {"vocab too small", good, out, "smaller than the 261", 260, WHALE_ERR_ARG},
        {"malformed jsonl", badj, out, "bad.jsonl:3: invalid JSON", 1000, WHALE_ERR_FORMAT},
        {"jsonl without text", nojson, out, "notext.jsonl:2: expected an object", 1000, WHALE_ERR_FORMAT},
        {"missing file", "/nonexistent/x.txt", out, "/nonexistent/x.txt: cannot open", 1000, WHALE_ERR_IO},
        {"out is a file", good, file_as_dir, "not a directory", 1000, WHALE_ERR_IO},
        {"out under a file", good, under_file, "Not a directory", 1000, WHALE_ERR_IO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *files[] = {cases[i].file};
        whale_err err = {0};
        whale_code rc = train_files(files, 1, cases[i].out, cases[i].vocab, 2, NULL, 0, NULL, &err);
        CHECK(rc == cases[i].code && strstr(err.msg, cases[i].msg) && !strchr(err.msg, '\n'),
              "%s: code %d, message \"%s\"", cases[i].what, (int)rc, err.msg);
    }
    CHECK(!exists(path_in(p, sizeof p, out, "tokenizer.json")), "a failed run wrote output");
    const char *files[] = {good};
    const char *dup[] = {WHALE_BPE_USER}, *empty_tok[] = {""};
    whale_err err;
    CHECK(train_files(files, 1, out, 1000, 2, dup, 1, NULL, &err) == WHALE_ERR_ARG, "a repeated special is accepted");
    CHECK(train_files(files, 1, out, 1000, 2, empty_tok, 1, NULL, &err) == WHALE_ERR_ARG, "an empty special is accepted");
    CHECK(train_files(files, 1, out, 1000, 0, NULL, 0, NULL, &err) == WHALE_ERR_ARG, "min frequency 0 is accepted");
    CHECK(train_files(files, 0, out, 1000, 2, NULL, 0, NULL, &err) == WHALE_ERR_ARG, "no files is accepted");
    /* the text runs out of pairs: a smaller vocabulary, not an error */
    whale_bpe_train_stats st;
    CHECK(train_files(files, 1, out, 1000, 2, NULL, 0, &st, &err) == WHALE_OK && st.vocab_size < 1000 &&
              st.vocab_size > WHALE_BPE_FIXED_TOKENS,
          "small text: vocab %d", st.vocab_size);
}

int main(void) {
    char dir[512];
    test_tmpdir("bpe-train", dir, sizeof dir);
    double t0 = whale_now();
    test_ties(dir);
    test_naive(dir);
    test_mixed(dir);
    test_extra_special(dir);
    test_errors(dir);
    printf("test_bpe_train: %.2f s\n", whale_now() - t0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!test_failures && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_finish("test_bpe_train");
}
