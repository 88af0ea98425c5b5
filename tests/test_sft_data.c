/* SFT data (whale_sft.h): every record shape renders exactly as the chat
 * template renders the equivalent messages, placeholders are filled by tag,
 * the loss mask holds the assistant tokens (or everything), truncation,
 * packing and batches keep samples apart, bad records are reported with
 * FILE:LINE or skipped and counted, and the shipped self-cognition files
 * load with both real tokenizers.
 *
 * The real tokenizer files come from scripts/fetch-tokenizers.sh
 * (.cache/tokenizers or $WHALE_TOKENIZERS); without them this test fails. */
#include "whale_sft.h"

#include "core/core.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SFT_DIR WHALE_TEST_DATA "/sft"
#define DATA_DIR WHALE_TEST_DATA "/../../data"

static const char *NAME_ZH = "小鲸", *NAME_EN = "Little Whale", *AUTHOR = "the nanowhale.c authors";

/* ------------------------------------------------------------ helpers */

static whale_sft_opts named_opts(void) {
    whale_sft_opts o = whale_sft_defaults();
    o.model_name[0] = NAME_ZH;
    o.model_name[1] = NAME_EN;
    o.model_author[1] = AUTHOR; /* one value serves both languages */
    return o;
}

static whale_sft_dataset *open1(const char *path, whale_tokenizer *tok, whale_chat_format fmt,
                                const whale_sft_opts *o) {
    whale_sft_dataset *ds = NULL;
    whale_err err;
    whale_code rc = whale_sft_dataset_open(&path, 1, tok, fmt, o, &ds, &err);
    CHECK(rc == WHALE_OK, "open %s: %s", path, err.msg);
    return ds;
}

static int one_line(const whale_err *e) { return e->msg[0] && !strchr(e->msg, '\n'); }

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

static const char *end_token(whale_chat_format fmt) {
    return fmt == WHALE_CHAT_DEEPSEEK ? "<｜end▁of▁sentence｜>" : "<|im_end|>";
}

/* ------------------------------------------------------------ shapes */

/* The messages each record of tests/data/sft/shapes.jsonl stands for, with
 * named_opts()'s placeholders filled. */
typedef struct {
    int n;
    whale_chat_message m[6];
} conv;

static const conv shapes_want[] = {
    {5,
     {{"system", "You are a careful assistant."},
      {"user", "What is 2 + 2?"},
      {"assistant", "2 + 2 = 4."},
      {"user", "And 3 + 3?"},
      {"assistant", "3 + 3 = 6."}}},
    {3, {{"system", "Answer briefly."}, {"user", "Say hello in Chinese."}, {"assistant", "你好！"}}},
    {2, {{"user", "Name a colour."}, {"assistant", "\n\nBlue.  "}}},
    {6,
     {{"system", "You are a geography tutor."},
      {"user", "Hi!"},
      {"assistant", "Hello! How can I help?"},
      {"user", "Can you help with geography?"},
      {"assistant", "Of course."},
      {"user", "What is the capital of France?"}}}, /* + the response, below */
    {2, {{"user", "Translate 'cat' to French."}, {"assistant", "chat"}}},
    {2, {{"user", "Add the numbers.\n1 and 2"}, {"assistant", "1 + 2 = 3."}}},
    {2,
     {{"user", "Write a haiku about snow."},
      {"assistant", "White hush on the hills,\nfootprints fill before morning,\nthe quiet returns."}}},
    {2, {{"user", "你是谁？"}, {"assistant", "我是小鲸，由the nanowhale.c authors开发。"}}},
    {2, {{"user", "Is Little Whale your name?"}, {"assistant", "Yes, I am Little Whale, made by the nanowhale.c authors."}}},
    {2, {{"user", "Who made Little Whale?"}, {"assistant", "the nanowhale.c authors did."}}},
    {2, {{"user", "Print a template."}, {"assistant", "Hello {{NAME}}!"}}}, /* no tag: used as written */
};
#define N_SHAPES (int)(sizeof shapes_want / sizeof shapes_want[0])
static const int64_t shapes_line[N_SHAPES] = {1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13};

/* conv 3 has 7 messages: the query/response record's response is last */
static int want_messages(int i, whale_chat_message *m) {
    int n = shapes_want[i].n;
    memcpy(m, shapes_want[i].m, (size_t)n * sizeof *m);
    if (i == 3) m[n++] = (whale_chat_message){"assistant", "Paris."};
    return n;
}

/* Every token is trained exactly when its bytes overlap an assistant span
 * (transformers' rule), never the first; for turns that do not straddle a
 * template boundary the trained runs are exactly content + end token. */
static void check_mask(whale_tokenizer *tok, whale_chat_format fmt, const whale_sft_sample *s, const char *text,
                       size_t len, const whale_chat_span *sp, int n_sp, const whale_chat_message *m, int strict,
                       const char *what) {
    size_t at = 0;
    int ok = 1, trained = 0;
    for (int k = 0; k < s->n; k++) {
        size_t tl;
        whale_tokenizer_token_bytes(tok, s->ids[k], &tl);
        int overlap = 0;
        for (int j = 0; j < n_sp; j++) overlap |= at < sp[j].end && at + tl > sp[j].start;
        if ((k == 0 ? 0 : overlap) != s->train[k]) ok = 0;
        trained += s->train[k];
        at += tl;
    }
    CHECK(ok && at == len && trained > 0 && !s->train[0], "%s: the loss mask is not the assistant spans", what);
    if (!strict) return;
    /* runs of trained tokens, as text */
    int run = 0;
    at = 0;
    for (int k = 0; k < s->n;) {
        size_t tl;
        whale_tokenizer_token_bytes(tok, s->ids[k], &tl);
        if (!s->train[k]) {
            at += tl;
            k++;
            continue;
        }
        size_t a = at;
        while (k < s->n && s->train[k]) {
            whale_tokenizer_token_bytes(tok, s->ids[k++], &tl);
            at += tl;
        }
        if (run < n_sp) {
            const char *c = m[sp[run].message].content, *e = end_token(fmt);
            size_t cl = strlen(c), el = strlen(e);
            CHECK(at - a == cl + el && !memcmp(text + a, c, cl) && !memcmp(text + a + cl, e, el),
                  "%s: trained run %d is not assistant message %d + its end token", what, run, sp[run].message);
        }
        run++;
    }
    CHECK(run == n_sp, "%s: %d trained runs for %d assistant messages", what, run, n_sp);
}

static void check_shapes(whale_tokenizer *tok, whale_chat_format fmt) {
    const char *fname = whale_chat_format_name(fmt);
    whale_sft_opts o = named_opts();
    whale_sft_dataset *ds = open1(SFT_DIR "/shapes.jsonl", tok, fmt, &o);
    if (!ds) return;
    whale_sft_stats st;
    whale_sft_dataset_stats(ds, &st);
    CHECK(st.records == N_SHAPES && st.samples == N_SHAPES && st.skipped == 0 && st.deleted == 0,
          "%s: %ld records, %ld samples", fname, (long)st.records, (long)st.samples);
    const char *bos = whale_tokenizer_role_token(tok, WHALE_TOKEN_BOS);
    int64_t tokens = 0, trained = 0;
    for (int i = 0; i < N_SHAPES && i < whale_sft_dataset_num_samples(ds); i++) {
        char what[64];
        snprintf(what, sizeof what, "%s/shape %d", fname, i);
        whale_chat_message m[8];
        int n = want_messages(i, m);
        whale_err err;
        char *want, *got;
        size_t wl, gl;
        whale_chat_span *sp;
        int n_sp;
        uint8_t *bm;
        whale_sft_sample s;
        if (whale_chat_render(fmt, m, n, 0, bos, &want, &wl, &sp, &n_sp, &err) ||
            whale_sft_sample_text(ds, i, &got, &gl, &bm, &err) || whale_sft_dataset_sample(ds, i, &s, &err)) {
            CHECK(0, "%s: %s", what, err.msg);
            continue;
        }
        CHECK(gl == wl && !memcmp(got, want, wl), "%s: text differs from the template's\n  got  %s\n  want %s", what,
              got, want);
        CHECK(!strcmp(s.file, SFT_DIR "/shapes.jsonl") && s.line == shapes_line[i] && !s.truncated,
              "%s: from %s:%ld", what, s.file, (long)s.line);
        /* the ids are whale_chat_encode's */
        int32_t *ids;
        uint8_t *mask;
        int n_ids;
        if (!whale_chat_encode(tok, fmt, m, n, 0, &ids, &mask, &n_ids, &err)) {
            int same = n_ids == s.n && !memcmp(ids, s.ids, (size_t)n_ids * sizeof *ids);
            for (int k = 1; same && k < n_ids; k++) same = mask[k] == s.train[k];
            CHECK(same, "%s: ids or mask differ from whale_chat_encode's", what);
            free(ids);
            free(mask);
        }
        /* ChatML's "\n" before "\n\nBlue" shares a token with the content */
        int strict = !(fmt == WHALE_CHAT_CHATML && i == 2);
        check_mask(tok, fmt, &s, got, gl, sp, n_sp, m, strict, what);
        /* the byte mask follows the tokens */
        int bytes_ok = 1;
        size_t at = 0;
        for (int k = 0; k < s.n; k++) {
            size_t tl;
            whale_tokenizer_token_bytes(tok, s.ids[k], &tl);
            for (size_t b = 0; b < tl; b++) bytes_ok &= bm[at + b] == s.train[k];
            at += tl;
            trained += s.train[k];
        }
        tokens += s.n;
        CHECK(bytes_ok, "%s: byte mask differs from the token flags", what);
        CHECK((i == N_SHAPES - 1) == (strstr(got, "{{") != NULL), "%s: placeholders left or filled wrongly", what);
        free(want);
        free(got);
        free(bm);
        free(sp);
    }
    CHECK(st.tokens == tokens && st.trained_tokens == trained, "%s: token counts %ld/%ld vs %ld/%ld", fname,
          (long)st.tokens, (long)st.trained_tokens, (long)tokens, (long)trained);

    /* loss on everything: every token but the first */
    o.loss_scope = WHALE_SFT_LOSS_ALL;
    whale_sft_dataset *all = open1(SFT_DIR "/shapes.jsonl", tok, fmt, &o);
    for (int64_t i = 0; all && i < whale_sft_dataset_num_samples(all); i++) {
        whale_sft_sample s;
        whale_err err;
        whale_sft_dataset_sample(all, i, &s, &err);
        int ok = !s.train[0];
        for (int k = 1; k < s.n; k++) ok &= s.train[k] == 1;
        CHECK(ok, "%s: loss scope all: sample %ld is not trained on every token but the first", fname, (long)i);
    }
    whale_sft_stats sa;
    whale_sft_dataset_stats(all, &sa);
    CHECK(sa.trained_tokens == sa.tokens - sa.samples, "%s: loss scope all trains %ld of %ld", fname,
          (long)sa.trained_tokens, (long)sa.tokens);
    whale_sft_dataset_free(all);

    /* a default system message goes to records without one */
    o = named_opts();
    o.system = "You are {{NAME}}.";
    whale_sft_dataset *sys = open1(SFT_DIR "/shapes.jsonl", tok, fmt, &o);
    if (sys) {
        int idx[] = {0, 4, 7, 10};
        const char *want_sys[] = {"You are a careful assistant.", "You are {{NAME}}.", "You are 小鲸.",
                                  "You are {{NAME}}."};
        for (int k = 0; k < 4; k++) {
            whale_chat_message m[9];
            int n = want_messages(idx[k], m);
            if (k) {
                memmove(m + 1, m, (size_t)n * sizeof *m);
                m[0] = (whale_chat_message){"system", want_sys[k]};
                n++;
            }
            char *want, *got;
            size_t wl, gl;
            whale_err err;
            if (whale_chat_render(fmt, m, n, 0, bos, &want, &wl, NULL, NULL, &err) ||
                whale_sft_sample_text(sys, idx[k], &got, &gl, NULL, &err)) {
                CHECK(0, "%s: %s", fname, err.msg);
                continue;
            }
            CHECK(gl == wl && !memcmp(got, want, wl), "%s: default system, sample %d:\n  got  %s\n  want %s", fname,
                  idx[k], got, want);
            free(want);
            free(got);
        }
    }
    whale_sft_dataset_free(sys);
    whale_sft_dataset_free(ds);
}

/* ------------------------------------------------------------ placeholders */

static void check_placeholders(whale_tokenizer *tok) {
    whale_sft_opts o = named_opts();
    whale_err err;
    char *s;
    const char *cases[][3] = {
        {"{{NAME}} by {{AUTHOR}}", "zh", "小鲸 by the nanowhale.c authors"},
        {"{{NAME}} by {{AUTHOR}}", "en", "Little Whale by the nanowhale.c authors"},
        {"{{NAME}}{{NAME}}", NULL, "Little WhaleLittle Whale"},
        {"{{NAME}}", "ZH", "Little Whale"}, /* only "zh" is Chinese */
        {"no placeholder {{ NAME }}", "zh", "no placeholder {{ NAME }}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        whale_code rc = whale_sft_fill_placeholders(cases[i][0], cases[i][1], &o, &s, &err);
        CHECK(rc == WHALE_OK && !strcmp(s, cases[i][2]), "fill \"%s\" (%s): got \"%s\"", cases[i][0],
              cases[i][1] ? cases[i][1] : "no tag", rc ? err.msg : s);
        if (!rc) free(s);
    }
    /* one value serves both languages, whichever is given */
    o.model_name[1] = NULL;
    CHECK(!whale_sft_fill_placeholders("{{NAME}}", "en", &o, &s, &err) && !strcmp(s, NAME_ZH), "zh name for en");
    free(s);
    o.model_name[0] = NULL;
    CHECK(whale_sft_fill_placeholders("{{NAME}}", "en", &o, &s, &err) == WHALE_ERR_ARG && strstr(err.msg, "{{NAME}}"),
          "no name: %s", err.msg);

    /* a tagged record with a placeholder and no name configured: an error
     * that names the record even when bad records are skipped */
    whale_sft_opts none = whale_sft_defaults();
    for (int skip = 0; skip < 2; skip++) {
        none.bad_records = skip ? WHALE_SFT_BAD_SKIP : WHALE_SFT_BAD_FAIL;
        const char *f = SFT_DIR "/shapes.jsonl";
        whale_sft_dataset *ds = NULL;
        whale_code rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_DEEPSEEK, &none, &ds, &err);
        CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "shapes.jsonl:10: {{NAME}} needs the model's name") &&
                  one_line(&err), "no names (skip %d): %s", skip, rc ? err.msg : "opened");
        whale_sft_dataset_free(ds);
    }
}

/* ------------------------------------------------------------ truncation */

static void check_truncation(whale_tokenizer *tok, whale_chat_format fmt) {
    const char *fname = whale_chat_format_name(fmt);
    whale_sft_opts o = named_opts();
    whale_sft_dataset *full = open1(SFT_DIR "/shapes.jsonl", tok, fmt, &o);
    if (!full) return;
    int64_t n = whale_sft_dataset_num_samples(full);
    whale_sft_stats fs;
    whale_sft_dataset_stats(full, &fs);
    int lens[64], min = 1 << 30;
    for (int64_t i = 0; i < n; i++) {
        whale_sft_sample s;
        whale_err err;
        whale_sft_dataset_sample(full, i, &s, &err);
        lens[i] = s.n;
        if (s.n < min) min = s.n;
    }
    int L = (min + fs.max_sample_tokens) / 2;
    int longer = 0;
    for (int64_t i = 0; i < n; i++) longer += lens[i] > L;
    CHECK(longer > 0 && longer < n, "%s: max_length %d cuts %d of %ld", fname, L, longer, (long)n);

    for (int strat = 0; strat < 3; strat++) {
        o.max_length = L;
        o.truncation = (whale_sft_truncation)strat;
        whale_sft_dataset *ds = open1(SFT_DIR "/shapes.jsonl", tok, fmt, &o);
        if (!ds) continue;
        whale_sft_stats st;
        whale_sft_dataset_stats(ds, &st);
        CHECK(st.records == st.samples + st.skipped + st.deleted + st.untrained, "%s: counts do not add up", fname);
        if (strat == WHALE_SFT_TRUNC_DELETE)
            CHECK(st.deleted == longer && st.truncated == 0 && st.samples == n - longer,
                  "%s: delete: %ld deleted, %ld kept", fname, (long)st.deleted, (long)st.samples);
        else
            CHECK(st.deleted == 0 && st.truncated + st.untrained == longer && st.samples + st.untrained == n,
                  "%s: %s: %ld truncated, %ld untrained", fname, strat == 1 ? "left" : "right", (long)st.truncated,
                  (long)st.untrained);
        CHECK(st.max_sample_tokens <= L, "%s: a sample of %d tokens is longer than %d", fname, st.max_sample_tokens, L);
        /* kept samples, in order, against the full ones */
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++) {
            whale_sft_sample f, s;
            whale_err err;
            whale_sft_dataset_sample(full, i, &f, &err);
            if (k >= st.samples || whale_sft_dataset_sample(ds, k, &s, &err) || s.line != f.line) continue;
            k++;
            int cut = f.n > L;
            int start = cut && strat == WHALE_SFT_TRUNC_LEFT ? f.n - L : 0, len = cut ? L : f.n;
            int ok = s.n == len && s.truncated == cut && !memcmp(s.ids, f.ids + start, (size_t)len * sizeof *s.ids);
            for (int q = 1; ok && q < len; q++) ok = s.train[q] == f.train[start + q];
            CHECK(ok && !s.train[0], "%s: %s: sample from line %ld is not the %s %d tokens", fname,
                  strat == 1 ? "left" : strat == 2 ? "right" : "delete", (long)f.line,
                  strat == 1 ? "last" : "first", len);
        }
        CHECK(k == st.samples, "%s: kept samples do not match", fname);
        whale_sft_dataset_free(ds);
    }
    /* cutting to the first 4 tokens leaves no assistant token: nothing kept */
    o.max_length = 4;
    o.truncation = WHALE_SFT_TRUNC_RIGHT;
    const char *f = SFT_DIR "/shapes.jsonl";
    whale_sft_dataset *ds = NULL;
    whale_err err;
    whale_code rc = whale_sft_dataset_open(&f, 1, tok, fmt, &o, &ds, &err);
    CHECK(rc == WHALE_ERR_FORMAT && strstr(err.msg, "no usable SFT sample") && one_line(&err), "%s: right 4: %s",
          fname, rc ? err.msg : "opened");
    whale_sft_dataset_free(ds);
    whale_sft_dataset_free(full);
}

/* ------------------------------------------------------------ rows */

/* Check every row of S tokens: segments (runs of equal seg starting where
 * seg[t] == t) with positions counting from 0; each segment is a whole
 * sample with its labels (the samples of a row in file order, row r = sample
 * r without packing) or the padding at the end; every sample in one row. */
static void check_rows(whale_sft_dataset *ds, int S, int packing, const char *what) {
    int64_t rows, n = whale_sft_dataset_num_samples(ds);
    whale_err err;
    if (whale_sft_dataset_num_rows(ds, S, &rows, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    CHECK(packing ? rows < n : rows == n, "%s: %ld rows for %ld samples", what, (long)rows, (long)n);
    int32_t *ids = malloc((size_t)S * 4), *lab = malloc((size_t)S * 4), *pos = malloc((size_t)S * 4),
            *seg = malloc((size_t)S * 4);
    int *seen = calloc((size_t)n, sizeof *seen);
    int32_t pad = whale_sft_dataset_pad_id(ds);
    for (int64_t r = 0; r < rows; r++) {
        if (whale_sft_dataset_row(ds, r, S, ids, lab, pos, seg, &err)) {
            CHECK(0, "%s: %s", what, err.msg);
            break;
        }
        int ok = 1, in_row = 0, padded = 0;
        int64_t last = packing ? -1 : r - 1;
        for (int t0 = 0, end; t0 < S && ok; t0 = end) {
            ok &= seg[t0] == t0 && !padded;
            for (end = t0; end < S && seg[end] == t0; end++) ok &= pos[end] == end - t0;
            int len = end - t0;
            int64_t found = -1;
            for (int64_t i = last + 1; i < n && found < 0 && (packing || i == r); i++) {
                whale_sft_sample s;
                whale_sft_dataset_sample(ds, i, &s, &err);
                if (seen[i] || s.n != len || memcmp(s.ids, ids + t0, (size_t)len * 4)) continue;
                int lok = lab[t0] == -100;
                for (int q = 1; q < len; q++) lok &= lab[t0 + q] == (s.train[q] ? s.ids[q] : -100);
                if (lok) found = i;
            }
            if (found >= 0) {
                seen[found]++;
                in_row++;
                last = found;
            } else { /* the padding */
                for (int q = t0; q < end; q++) ok &= ids[q] == pad && lab[q] == -100;
                padded = 1;
            }
        }
        CHECK(ok && in_row >= 1 && (packing || in_row == 1), "%s: row %ld is not whole samples then padding", what,
              (long)r);
    }
    int once = 1;
    for (int64_t i = 0; i < n; i++) once &= seen[i] == 1;
    CHECK(once, "%s: not every sample is in exactly one row", what);
    free(ids);
    free(lab);
    free(pos);
    free(seg);
    free(seen);
}

static void check_packing(whale_tokenizer *tok, whale_chat_format fmt) {
    const char *fname = whale_chat_format_name(fmt);
    whale_sft_opts o = named_opts();
    whale_sft_dataset *ds = open1(SFT_DIR "/shapes.jsonl", tok, fmt, &o);
    o.packing = 1;
    whale_sft_dataset *pk = open1(SFT_DIR "/shapes.jsonl", tok, fmt, &o);
    if (!ds || !pk) return;
    whale_sft_stats st;
    whale_sft_dataset_stats(ds, &st);
    int S = st.max_sample_tokens + 40;
    char what[64];
    snprintf(what, sizeof what, "%s/padded", fname);
    check_rows(ds, S, 0, what);
    snprintf(what, sizeof what, "%s/packed", fname);
    check_rows(pk, S, 1, what);
    check_rows(pk, 2 * S, 1, what); /* another row length: another plan */

    /* a sample longer than the rows */
    int64_t rows;
    whale_err err;
    whale_code rc = whale_sft_dataset_num_rows(pk, st.max_sample_tokens - 1, &rows, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "shapes.jsonl:") && strstr(err.msg, "max_length"),
          "%s: short rows: %s", fname, rc ? err.msg : "accepted");

    /* batches: each epoch visits every row once, in a seeded order that the
     * same cursor repeats; a new epoch may start inside a batch */
    whale_sft_dataset_num_rows(pk, S, &rows, &err);
    int B = 3;
    whale_batch b, b2;
    if (whale_batch_alloc(B, S, &b, &err) || whale_batch_alloc(B, S, &b2, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    whale_data_cursor cur = {.seed = 42}, again;
    int32_t *row = malloc((size_t)S * 4);
    int *visits = calloc((size_t)rows * 2, sizeof *visits);
    int ok = 1;
    for (int step = 0; step < (int)(2 * rows + B - 1) / B && ok; step++) {
        again = cur;
        int64_t e0 = cur.epoch, i0 = cur.index;
        if (whale_sft_next_batch(pk, &cur, B, S, &b, &err) || whale_sft_next_batch(pk, &again, B, S, &b2, &err)) {
            CHECK(0, "%s: %s", fname, err.msg);
            break;
        }
        ok &= !memcmp(b.ids, b2.ids, (size_t)B * S * 4) && !memcmp(b.labels, b2.labels, (size_t)B * S * 4) &&
              cur.index == again.index && cur.epoch == again.epoch && cur.windows == rows;
        for (int k = 0; k < B; k++) {
            if (i0 == rows) e0++, i0 = 0;
            int64_t r = whale_data_shuffle(42, e0, rows, i0++);
            if (e0 < 2) visits[e0 * rows + r]++;
            whale_sft_dataset_row(pk, r, S, row, NULL, NULL, NULL, &err);
            ok &= !memcmp(row, b.ids + (size_t)k * S, (size_t)S * 4);
        }
    }
    for (int64_t i = 0; i < 2 * rows; i++) ok &= visits[i] == 1;
    CHECK(ok, "%s: batches are not each epoch's rows in the shuffled order", fname);
    whale_data_cursor wrong = {.seed = 42, .windows = rows + 1};
    rc = whale_sft_next_batch(pk, &wrong, B, S, &b, &err);
    CHECK(rc == WHALE_ERR_ARG && wrong.windows == rows + 1, "%s: a cursor for other data: %s", fname,
          rc ? err.msg : "accepted");
    free(row);
    free(visits);
    whale_batch_free(&b);
    whale_batch_free(&b2);
    whale_sft_dataset_free(ds);
    whale_sft_dataset_free(pk);
}

/* ------------------------------------------------------------ bad records */

static void check_bad(whale_tokenizer *tok, const char *tmp) {
    static const struct {
        const char *line, *want;
        whale_code code;
    } cases[] = {
        {"{\"query\": \"q\", \"response\": ", "invalid JSON", WHALE_ERR_FORMAT},
        {"{\"query\": \"q\"} x", "text after the JSON value", WHALE_ERR_FORMAT},
        {"[1, 2]", "expected a JSON object", WHALE_ERR_FORMAT},
        {"{\"text\": \"t\"}", "no \"messages\", \"conversations\", \"query\"/\"response\"", WHALE_ERR_FORMAT},
        {"{\"query\": \"q\"}", "\"response\": missing", WHALE_ERR_FORMAT},
        {"{\"query\": 7, \"response\": \"a\"}", "\"query\": not a string", WHALE_ERR_FORMAT},
        {"{\"query\": \"q\", \"response\": \" \\n\"}", "\"response\": empty", WHALE_ERR_FORMAT},
        {"{\"query\": \"q\", \"response\": \"a\", \"tag\": 1}", "\"tag\": not a string", WHALE_ERR_FORMAT},
        {"{\"query\": \"q\", \"response\": \"a\", \"history\": [[\"x\"]]}", "history[0]: not a [query, response]",
         WHALE_ERR_FORMAT},
        {"{\"query\": \"q\", \"response\": \"a\", \"history\": [[\"x\", \"\"]]}", "history[0][1]: empty response",
         WHALE_ERR_FORMAT},
        {"{\"query\": \"q\", \"response\": \"a\", \"system\": []}", "\"system\": not a string", WHALE_ERR_FORMAT},
        {"{\"instruction\": \"i\"}", "\"output\": missing", WHALE_ERR_FORMAT},
        {"{\"messages\": {}}", "\"messages\": not an array", WHALE_ERR_FORMAT},
        {"{\"messages\": []}", "\"messages\": empty", WHALE_ERR_FORMAT},
        {"{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}", "messages[0]: unknown role \"bot\"",
         WHALE_ERR_FORMAT},
        {"{\"messages\": [{\"role\": \"user\"}]}", "messages[0].content: missing", WHALE_ERR_FORMAT},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"\"}]}",
         "messages[1]: empty assistant content", WHALE_ERR_FORMAT},
        {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"u\"}]}",
         "ends with a user message", WHALE_ERR_FORMAT},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"tool\", \"content\": \"t\"}, "
         "{\"role\": \"assistant\", \"content\": \"a\"}]}",
         "tool messages are not supported by the native", WHALE_ERR_UNSUPPORTED},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"tool\", \"content\": \"t\"}]}",
         "ends with a tool message", WHALE_ERR_FORMAT},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\", "
         "\"loss\": 1}]}", "messages[1].loss: must be true, false or null", WHALE_ERR_FORMAT},
        {"{\"tools\": \"not json\", \"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": "
         "\"assistant\", \"content\": \"a\"}]}", "\"tools\": expected a list", WHALE_ERR_FORMAT},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"tool_call\", \"content\": \"x\"}]}",
         "a tool_call's content must be a JSON object", WHALE_ERR_FORMAT},
        {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\", \"tool_calls\": [{}]}]}", "tool calls",
         WHALE_ERR_UNSUPPORTED},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", "list of content parts",
         WHALE_ERR_UNSUPPORTED},
        {"{\"query\": \"q\\u0000\", \"response\": \"a\"}", "\\u0000", WHALE_ERR_FORMAT},
        {"{\"query\": \"\xff\", \"response\": \"a\"}", "invalid UTF-8 at byte 12", WHALE_ERR_FORMAT},
        {"{\"query\": \"\xed\xa0\x80\", \"response\": \"a\"}", "invalid UTF-8", WHALE_ERR_FORMAT}, /* a surrogate */
        {"{\"query\": \"\\ud800\", \"response\": \"a\"}", "invalid JSON", WHALE_ERR_FORMAT}, /* a lone escape */
    };
    char path[1200];
    snprintf(path, sizeof path, "%s/bad.jsonl", tmp);
    const char *f = path;
    whale_sft_opts skip = whale_sft_defaults();
    skip.bad_records = WHALE_SFT_BAD_SKIP;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[600];
        int n = snprintf(text, sizeof text, "{\"query\": \"good\", \"response\": \"fine\"}\n%s\n", cases[i].line);
        write_file(path, text, (size_t)n);
        whale_sft_dataset *ds = NULL;
        whale_err err;
        whale_code rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_CHATML, NULL, &ds, &err);
        char prefix[1300];
        snprintf(prefix, sizeof prefix, "%s:2: ", path);
        CHECK(rc == cases[i].code && !strncmp(err.msg, prefix, strlen(prefix)) && strstr(err.msg, cases[i].want) &&
                  one_line(&err), "bad record %zu: want \"%s\", got %s", i, cases[i].want, rc ? err.msg : "accepted");
        whale_sft_dataset_free(ds);
        ds = NULL;
        rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_CHATML, &skip, &ds, &err);
        whale_sft_stats st = {0};
        whale_sft_dataset_stats(ds, &st);
        CHECK(rc == WHALE_OK && st.skipped == 1 && st.samples == 1 && !strncmp(st.first_bad, prefix, strlen(prefix)),
              "bad record %zu skipped: %s", i, rc ? err.msg : st.first_bad);
        whale_sft_dataset_free(ds);
    }

    /* the mixed fixture: 3 good records among 8 bad ones */
    const char *mixed = SFT_DIR "/mixed.jsonl";
    whale_sft_dataset *ds = NULL;
    whale_err err;
    whale_code rc = whale_sft_dataset_open(&mixed, 1, tok, WHALE_CHAT_DEEPSEEK, NULL, &ds, &err);
    CHECK(rc == WHALE_ERR_FORMAT && strstr(err.msg, "mixed.jsonl:2: invalid JSON"), "mixed, fail: %s",
          rc ? err.msg : "accepted");
    rc = whale_sft_dataset_open(&mixed, 1, tok, WHALE_CHAT_DEEPSEEK, &skip, &ds, &err);
    whale_sft_stats st = {0};
    whale_sft_dataset_stats(ds, &st);
    CHECK(rc == WHALE_OK && st.records == 11 && st.skipped == 8 && st.samples == 3 &&
              strstr(st.first_bad, "mixed.jsonl:2: invalid JSON"),
          "mixed, skip: %s (%ld skipped, %ld samples)", rc ? err.msg : st.first_bad, (long)st.skipped,
          (long)st.samples);
    int64_t want_line[3] = {1, 5, 11};
    for (int i = 0; !rc && i < 3; i++) {
        whale_sft_sample s;
        whale_sft_dataset_sample(ds, i, &s, &err);
        CHECK(s.line == want_line[i], "mixed: sample %d from line %ld", i, (long)s.line);
    }
    whale_sft_dataset_free(ds);

    /* a BOM and CRLF line ends are not part of the records */
    const char crlf[] = "\xEF\xBB\xBF{\"query\": \"q\", \"response\": \"a\"}\r\n\r\n{\"query\": \"q2\", \"response\": \"b\"}\r\n";
    write_file(path, crlf, sizeof crlf - 1);
    ds = open1(path, tok, WHALE_CHAT_CHATML, NULL);
    if (ds) {
        char *t;
        size_t len;
        CHECK(whale_sft_dataset_num_samples(ds) == 2 && !whale_sft_sample_text(ds, 1, &t, &len, NULL, &err) &&
                  strstr(t, "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n") && !strchr(t, '\r'),
              "BOM / CRLF");
        free(t);
    }
    whale_sft_dataset_free(ds);
    remove(path);

    /* arguments */
    whale_sft_loss_scope ls;
    whale_sft_truncation tr;
    whale_sft_bad_policy bp;
    CHECK(!whale_sft_loss_scope_from_name("all", &ls, &err) && ls == WHALE_SFT_LOSS_ALL &&
              !whale_sft_truncation_from_name("left", &tr, &err) && tr == WHALE_SFT_TRUNC_LEFT &&
              !whale_sft_bad_policy_from_name("skip", &bp, &err) && bp == WHALE_SFT_BAD_SKIP,
          "option names");
    rc = whale_sft_truncation_from_name("middle", &tr, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "delete, left or right"), "bad truncation name: %s", err.msg);
    rc = whale_sft_dataset_open(&mixed, 0, tok, WHALE_CHAT_CHATML, NULL, &ds, &err);
    CHECK(rc == WHALE_ERR_ARG, "no files");
    const char *missing = SFT_DIR "/missing.jsonl";
    rc = whale_sft_dataset_open(&missing, 1, tok, WHALE_CHAT_CHATML, NULL, &ds, &err);
    CHECK(rc == WHALE_ERR_IO && strstr(err.msg, "missing.jsonl"), "missing file: %s", err.msg);
}

/* ------------------------------------------------------------ shipped data */

static void check_shipped(whale_tokenizer *tok, whale_chat_format fmt) {
    const char *fname = whale_chat_format_name(fmt);
    whale_sft_opts o = named_opts();
    whale_sft_dataset *ds = open1(DATA_DIR "/self_cognition.jsonl", tok, fmt, &o);
    if (!ds) return;
    whale_sft_stats st;
    whale_sft_dataset_stats(ds, &st);
    CHECK(st.records >= 80 && st.samples == st.records && st.skipped == 0, "%s: self_cognition: %ld of %ld records",
          fname, (long)st.samples, (long)st.records);
    int ok = 1;
    for (int64_t i = 0; i < st.samples; i++) {
        char *t;
        size_t len;
        whale_err err;
        if (whale_sft_sample_text(ds, i, &t, &len, NULL, &err)) {
            ok = 0;
            continue;
        }
        /* the text after the last user turn: the response */
        const char *resp = fmt == WHALE_CHAT_DEEPSEEK ? strstr(t, "<｜Assistant｜>") : strstr(t, "<|im_start|>assistant");
        ok &= !strstr(t, "{{") && resp &&
              (strstr(resp, NAME_ZH) || strstr(resp, NAME_EN) || strstr(resp, AUTHOR));
        free(t);
    }
    CHECK(ok, "%s: self_cognition: placeholders not filled in every response", fname);
    whale_sft_dataset_free(ds);
}

static void check_shipped_files(void) {
    /* both languages in the training set, and an evaluation set of other questions */
    char *buf;
    size_t n;
    whale_err err;
    int zh = 0, en = 0, records = 0;
    cJSON *train_q = cJSON_CreateArray();
    if (!whale_read_file(DATA_DIR "/self_cognition.jsonl", &buf, &n, &err)) {
        for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
            cJSON *j = cJSON_Parse(line);
            const cJSON *tag = cJSON_GetObjectItem(j, "tag"), *q = cJSON_GetObjectItem(j, "query"),
                        *r = cJSON_GetObjectItem(j, "response");
            CHECK(cJSON_IsString(tag) && cJSON_IsString(q) && cJSON_IsString(r), "self_cognition line %d", records + 1);
            if (cJSON_IsString(tag)) {
                zh += !strcmp(tag->valuestring, "zh");
                en += !strcmp(tag->valuestring, "en");
                CHECK(strstr(r->valuestring, "{{NAME}}") || strstr(r->valuestring, "{{AUTHOR}}"),
                      "self_cognition line %d: response without a placeholder", records + 1);
                cJSON_AddItemToArray(train_q, cJSON_CreateString(q->valuestring));
            }
            records++;
            cJSON_Delete(j);
        }
        free(buf);
    }
    CHECK(records >= 80 && zh + en == records && zh >= records / 3 && en >= records / 3,
          "self_cognition: %d records, %d zh, %d en", records, zh, en);

    whale_sft_opts o = named_opts();
    int ev = 0, ezh = 0, een = 0;
    if (!whale_read_file(DATA_DIR "/self_cognition_eval.jsonl", &buf, &n, &err)) {
        for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
            ev++;
            cJSON *j = cJSON_Parse(line);
            const cJSON *tag = cJSON_GetObjectItem(j, "tag"), *q = cJSON_GetObjectItem(j, "query"),
                        *ex = cJSON_GetObjectItem(j, "expect");
            int ok = cJSON_IsString(tag) && cJSON_IsString(q) && cJSON_IsArray(ex) && cJSON_GetArraySize(ex) >= 1;
            for (const cJSON *e = ok ? ex->child : NULL; e; e = e->next)
                ok &= cJSON_IsString(e) && (!strcmp(e->valuestring, "name") || !strcmp(e->valuestring, "author"));
            CHECK(ok, "self_cognition_eval line %d: needs query, tag and expect [\"name\"|\"author\"]", ev);
            if (ok) {
                ezh += !strcmp(tag->valuestring, "zh");
                een += !strcmp(tag->valuestring, "en");
                int held_out = 1;
                for (const cJSON *t = train_q->child; t; t = t->next) held_out &= strcmp(t->valuestring, q->valuestring) != 0;
                CHECK(held_out, "self_cognition_eval line %d: the question is in the training set", ev);
                char *filled;
                whale_code rc = whale_sft_fill_placeholders(q->valuestring, tag->valuestring, &o, &filled, &err);
                CHECK(rc == WHALE_OK && !strstr(filled, "{{"), "self_cognition_eval line %d: %s", ev,
                      rc ? err.msg : filled);
                if (!rc) free(filled);
            }
            cJSON_Delete(j);
        }
        free(buf);
    }
    CHECK(ev >= 20 && ezh + een == ev && ezh >= 5 && een >= 5, "self_cognition_eval: %d records, %d zh, %d en", ev,
          ezh, een);
    cJSON_Delete(train_q);
}

/* Two datasets give the same samples (ids and trained flags). */
static void same_samples(const whale_sft_dataset *a, const whale_sft_dataset *b, const char *what) {
    int64_t n = whale_sft_dataset_num_samples(a);
    CHECK(a && b && n == whale_sft_dataset_num_samples(b) && n > 0, "%s: sample counts", what);
    whale_err err;
    for (int64_t i = 0; a && b && i < n && i < whale_sft_dataset_num_samples(b); i++) {
        whale_sft_sample x, y;
        CHECK(!whale_sft_dataset_sample(a, i, &x, &err) && !whale_sft_dataset_sample(b, i, &y, &err), "%s", err.msg);
        CHECK(x.n == y.n && !memcmp(x.ids, y.ids, sizeof *x.ids * (size_t)x.n) && !memcmp(x.train, y.train, (size_t)x.n),
              "%s: sample %lld differs", what, (long long)i);
    }
}

/* ShareGPT records and .json arrays give the samples of the same messages
 * records; per-message "loss": false leaves a reply out. */
static void check_more_shapes(whale_tokenizer *tok, const char *tmp) {
    char p1[1200], p2[1200], p3[1200];
    snprintf(p1, sizeof p1, "%s/plain.jsonl", tmp);
    snprintf(p2, sizeof p2, "%s/sharegpt.jsonl", tmp);
    snprintf(p3, sizeof p3, "%s/array.json", tmp);
    static const char plain[] =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be kind.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
        "{\"role\": \"assistant\", \"content\": \"Hello!\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": \"assistant\", \"content\": \"4\"}, "
        "{\"role\": \"user\", \"content\": \"3+3?\"}, {\"role\": \"assistant\", \"content\": \"6\"}]}\n";
    static const char sharegpt[] =
        "{\"system\": \"Be kind.\", \"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": \"gpt\", "
        "\"value\": \"Hello!\"}]}\n"
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"2+2?\"}, {\"from\": \"gpt\", \"value\": \"4\"}, "
        "{\"from\": \"user\", \"value\": \"3+3?\"}, {\"from\": \"assistant\", \"value\": \"6\"}]}\n";
    static const char array[] =
        "\xEF\xBB\xBF [\n{\"messages\": [{\"role\": \"system\", \"content\": \"Be kind.\"}, {\"role\": \"user\", "
        "\"content\": \"Hi\"},\n {\"role\": \"assistant\", \"content\": \"Hello!\"}]},\n"
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"2+2?\"}, {\"from\": \"gpt\", \"value\": \"4\"}, "
        "{\"from\": \"human\", \"value\": \"3+3?\"}, {\"from\": \"gpt\", \"value\": \"6\"}]}]\n";
    write_file(p1, plain, sizeof plain - 1);
    write_file(p2, sharegpt, sizeof sharegpt - 1);
    write_file(p3, array, sizeof array - 1);
    whale_sft_dataset *a = open1(p1, tok, WHALE_CHAT_CHATML, NULL), *b = open1(p2, tok, WHALE_CHAT_CHATML, NULL),
                      *c = open1(p3, tok, WHALE_CHAT_CHATML, NULL);
    same_samples(a, b, "ShareGPT");
    same_samples(a, c, ".json array");
    whale_sft_dataset_free(b);
    whale_sft_dataset_free(c);
    /* "loss": false on the first reply: only the second is trained */
    static const char lossy[] =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": \"assistant\", \"content\": \"4\", "
        "\"loss\": false}, {\"role\": \"user\", \"content\": \"3+3?\"}, {\"role\": \"assistant\", \"content\": \"6\", "
        "\"loss\": null}]}\n";
    write_file(p2, lossy, sizeof lossy - 1);
    b = open1(p2, tok, WHALE_CHAT_CHATML, NULL);
    whale_sft_sample x, y;
    whale_err err;
    if (a && b && !whale_sft_dataset_sample(a, 1, &x, &err) && !whale_sft_dataset_sample(b, 0, &y, &err) &&
        x.n == y.n) {
        int tx = 0, ty = 0, kept = 1;
        for (int i = 0; i < x.n; i++) tx += x.train[i], ty += y.train[i], kept &= !y.train[i] || x.train[i];
        CHECK(x.n == y.n && !memcmp(x.ids, y.ids, sizeof *x.ids * (size_t)x.n), "loss: the ids do not change");
        CHECK(ty > 0 && ty < tx && kept, "loss false: %d of %d trained tokens left", ty, tx);
    }
    whale_sft_dataset_free(a);
    whale_sft_dataset_free(b);
    /* errors name the record of an array; a broken array is one error */
    static const char bad_array[] = "[{\"query\": \"q\", \"response\": \"a\"}, {\"conversations\": [{\"from\": \"bot\", "
                                    "\"value\": \"x\"}]}]";
    write_file(p3, bad_array, sizeof bad_array - 1);
    whale_sft_dataset *ds = NULL;
    const char *f = p3;
    whale_code rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_CHATML, NULL, &ds, &err);
    CHECK(rc == WHALE_ERR_FORMAT && strstr(err.msg, "array.json: record 2: conversations[0]: unknown \"from\"") && one_line(&err),
          "%s", err.msg);
    whale_sft_dataset_free(ds);
    write_file(p3, "[{\"query\": ", 11);
    ds = NULL;
    rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_CHATML, NULL, &ds, &err);
    CHECK(rc == WHALE_ERR_FORMAT && strstr(err.msg, "must be one JSON array") && one_line(&err), "%s", err.msg);
    whale_sft_dataset_free(ds);
    remove(p1);
    remove(p2);
    remove(p3);
}

/* .csv files with ms-swift's column names give the samples of the same
 * JSONL records: quoted cells with commas, quotes and newlines, CRLF, a
 * BOM, empty cells as missing fields, history as JSON; a bad row is named
 * by FILE:LINE and its field, and skipped under the skip policy. */
static void check_csv(whale_tokenizer *tok, const char *tmp) {
    char pj[1200], pc[1200];
    snprintf(pj, sizeof pj, "%s/same.jsonl", tmp);
    snprintf(pc, sizeof pc, "%s/data.csv", tmp);
    static const char jsonl[] =
        "{\"query\": \"Who are you?\", \"response\": \"I am Whale, a \\\"small\\\" model.\"}\n"
        "{\"system\": \"Be brief.\", \"query\": \"Line one\\nline two\", \"response\": \"Yes.\", "
        "\"history\": [[\"Hi\", \"Hello\"]]}\n"
        "{\"instruction\": \"Translate\", \"input\": \"bonjour\", \"output\": \"hello\"}\n"
        "{\"instruction\": \"Say hi\", \"output\": \"hi\"}\n";
    static const char csv[] = "\xEF\xBB\xBFsystem,query,response,history,instruction,input,output\r\n"
                              ",Who are you?,\"I am Whale, a \"\"small\"\" model.\",,,,\r\n"
                              "Be brief.,\"Line one\nline two\",Yes.,\"[[\"\"Hi\"\", \"\"Hello\"\"]]\",,,\r\n"
                              "\r\n"
                              ",,,,Translate,bonjour,hello\r\n"
                              ",,,,Say hi,,hi\r\n";
    write_file(pj, jsonl, sizeof jsonl - 1);
    write_file(pc, csv, sizeof csv - 1);
    whale_sft_dataset *a = open1(pj, tok, WHALE_CHAT_CHATML, NULL), *b = open1(pc, tok, WHALE_CHAT_CHATML, NULL);
    same_samples(a, b, ".csv");
    whale_sft_sample x;
    whale_err err;
    CHECK(b && !whale_sft_dataset_sample(b, 2, &x, &err) && x.line == 6, "a row's line is where it starts (%lld)",
          b ? (long long)x.line : -1LL);
    whale_sft_dataset_free(a);
    whale_sft_dataset_free(b);
    /* bad rows: FILE:LINE and the field; skip counts them */
    static const char bad[] = "query,response,history\nq,a,\nonly a query,,\nq,\"a\"x,\nq,a,not json\nq,a,b,c\n";
    write_file(pc, bad, sizeof bad - 1);
    static const char *const want[] = {"data.csv:3: \"response\": missing", "data.csv:4: column \"response\": text after",
                                       "data.csv:5: column \"history\": not a JSON list",
                                       "data.csv:6: 4 fields, the header has 3"};
    whale_sft_dataset *ds = NULL;
    const char *f = pc;
    whale_code rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_CHATML, NULL, &ds, &err);
    CHECK(rc == WHALE_ERR_FORMAT && strstr(err.msg, want[0]) && one_line(&err), "%s", err.msg);
    whale_sft_dataset_free(ds), ds = NULL;
    whale_sft_opts o = whale_sft_defaults();
    o.bad_records = WHALE_SFT_BAD_SKIP;
    rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_CHATML, &o, &ds, &err);
    whale_sft_stats st = {0};
    if (!rc) whale_sft_dataset_stats(ds, &st);
    CHECK(rc == WHALE_OK && st.records == 5 && st.samples == 1 && st.skipped == 4 && strstr(st.first_bad, want[0]),
          "skip: %lld records, %lld samples, %lld skipped, first %s", (long long)st.records, (long long)st.samples,
          (long long)st.skipped, st.first_bad);
    whale_sft_dataset_free(ds);
    for (int k = 1; k < 4; k++) { /* each bad row alone, as the error */
        char one[200];
        static const char *const rows[] = {NULL, "q,\"a\"x,\n", "q,a,not json\n", "q,a,b,c\n"};
        snprintf(one, sizeof one, "query,response,history\nq,a,\n%s", rows[k]);
        write_file(pc, one, strlen(one));
        ds = NULL;
        rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_CHATML, NULL, &ds, &err);
        char w[120];
        snprintf(w, sizeof w, "data.csv:3:%s", strchr(want[k] + strlen("data.csv:"), ':') + 1); /* now on line 3 */
        CHECK(rc == WHALE_ERR_FORMAT && strstr(err.msg, w) && one_line(&err), "want \"%s\": %s", w, err.msg);
        whale_sft_dataset_free(ds);
    }
    /* file-level errors: no header, a quote never closed */
    static const char *const broken[][2] = {{"", "needs a header row"},
                                            {"query,response\nq,\"never closed\n", "data.csv:2: a quoted field is never closed"}};
    for (int k = 0; k < 2; k++) {
        write_file(pc, broken[k][0], strlen(broken[k][0]));
        ds = NULL;
        o.bad_records = WHALE_SFT_BAD_SKIP;
        rc = whale_sft_dataset_open(&f, 1, tok, WHALE_CHAT_CHATML, &o, &ds, &err);
        CHECK(rc == WHALE_ERR_FORMAT && strstr(err.msg, broken[k][1]) && one_line(&err), "%s", err.msg);
        whale_sft_dataset_free(ds);
    }
    remove(pj);
    remove(pc);
}

int main(void) {
    const char *env = getenv("WHALE_TOKENIZERS");
    char tokdir[1024];
    if (env && *env) snprintf(tokdir, sizeof tokdir, "%s", env);
    else snprintf(tokdir, sizeof tokdir, "%s/../../.cache/tokenizers", WHALE_TEST_DATA);
    char probe[1100];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/deepseek_v3/tokenizer.json", tokdir);
    int have = stat(probe, &st) == 0;
    snprintf(probe, sizeof probe, "%s/qwen3/tokenizer.json", tokdir);
    have = have && stat(probe, &st) == 0;
    CHECK(have, "the real tokenizer files are missing from %s: run scripts/fetch-tokenizers.sh "
                "(or set WHALE_TOKENIZERS to where they are)", tokdir);
    check_shipped_files();
    if (!have) return test_finish("test_sft_data");

    whale_tokenizer *ds_tok = test_load_tokenizer(tokdir, "deepseek_v3");
    whale_tokenizer *qw_tok = test_load_tokenizer(tokdir, "qwen3");
    char tmp[1024];
    test_tmpdir("sft", tmp, sizeof tmp);
    if (ds_tok && qw_tok) {
        whale_tokenizer *toks[2] = {ds_tok, qw_tok};
        whale_chat_format fmts[2] = {WHALE_CHAT_DEEPSEEK, WHALE_CHAT_CHATML};
        for (int k = 0; k < 2; k++) {
            check_shapes(toks[k], fmts[k]);
            check_truncation(toks[k], fmts[k]);
            check_packing(toks[k], fmts[k]);
            check_shipped(toks[k], fmts[k]);
        }
        check_placeholders(ds_tok);
        check_bad(qw_tok, tmp);
        check_more_shapes(qw_tok, tmp);
        check_csv(qw_tok, tmp);
    }
    rmdir(tmp);
    whale_tokenizer_free(ds_tok);
    whale_tokenizer_free(qw_tok);
    return test_finish("test_sft_data");
}
