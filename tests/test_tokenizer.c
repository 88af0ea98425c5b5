/* Tokenizer tests: encodings and decodings identical to Hugging Face's
 * tokenizers (goldens in tests/data/tokenizer, made by
 * tests/reference/tokenizer/gen_goldens.mjs) for the DeepSeek-V3, Qwen,
 * Llama 3 and Gemma 3 tokenizers (Llama 3's decode with transformers' clean-up of
 * spaces, as its tokenizer_config.json asks), streaming decode, invalid UTF-8, special tokens, speed on a
 * 100 KB word, and load errors on small synthetic files.
 *
 * The real tokenizer files are fetched by scripts/fetch-tokenizers.sh into
 * .cache/tokenizers (or $WHALE_TOKENIZERS); without them this test fails. */
#include "whale_tokenizer.h"

#include "core/core.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ helpers */

/* CPU time of the calling thread, in seconds. */
static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        int more;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c >= 0xE0 && c <= 0xEF) more = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) more = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else return 0;
        if (n - i <= (size_t)more || s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += (size_t)more + 1;
    }
    return 1;
}


static int ids_equal(const int32_t *a, int na, const cJSON *golden) {
    if (cJSON_GetArraySize(golden) != na) return 0;
    int i = 0;
    for (const cJSON *c = golden->child; c; c = c->next, i++)
        if ((int32_t)c->valuedouble != a[i]) return 0;
    return 1;
}

static void show_diff(const char *what, const int32_t *a, int na, const cJSON *golden) {
    int i = 0;
    const cJSON *c = golden->child;
    while (c && i < na && (int32_t)c->valuedouble == a[i]) c = c->next, i++;
    fprintf(stderr, "  %s: %d ids vs golden %d; first difference at %d: got %d, want %d\n", what, na,
            cJSON_GetArraySize(golden), i, i < na ? (int)a[i] : -1, c ? (int)c->valuedouble : -1);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* The long inputs of tests/reference/tokenizer/generated.mjs, same rules. */
static char *generated_text(const char *name, size_t *len) {
    size_t cap = 200000, n = 0;
    char *s = malloc(cap);
    if (!s) exit(1);
    if (!strcmp(name, "long_word")) {
        uint32_t st = 1;
        for (int i = 0; i < 100000; i++) {
            st = (st * 1103515245u + 12345u) & 0x7fffffffu;
            s[n++] = (char)('a' + (st >> 16) % 26);
        }
    } else if (!strcmp(name, "long_cjk")) {
        for (int i = 0; i < 30000; i++) {
            uint32_t cp = 0x4E00 + (uint32_t)((i * 7919) % 20902);
            s[n++] = (char)(0xE0 | (cp >> 12));
            s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            s[n++] = (char)(0x80 | (cp & 0x3F));
        }
    } else if (!strcmp(name, "long_digits")) {
        for (int i = 0; i < 3000; i++) memcpy(s + n, "0123456789", 10), n += 10;
    } else if (!strcmp(name, "long_spaces")) {
        memset(s, ' ', 20000);
        n = 20000;
        s[n++] = 'x';
        memset(s + n, '\n', 5000);
        n += 5000;
    } else {
        free(s);
        return NULL;
    }
    s[n] = 0;
    *len = n;
    return s;
}

/* ------------------------------------------------------------ golden checks */

/* Decode ids one at a time; every piece must be valid UTF-8 and the pieces
 * must add up to the full decode. */
static void check_stream(whale_tokenizer *t, const char *name, const int32_t *ids, int n, int skip,
                         const char *full, size_t full_len) {
    whale_err err;
    whale_detokenizer *d;
    CHECK(whale_detokenizer_new(t, skip, &d, &err) == WHALE_OK, "%s", err.msg);
    char *acc = malloc(full_len + 64);
    size_t an = 0;
    int ok = 1;
    for (int i = 0; i <= n && ok; i++) {
        const char *piece;
        size_t pn;
        whale_code rc = i < n ? whale_detokenizer_push(d, ids[i], &piece, &pn, &err)
                              : whale_detokenizer_flush(d, &piece, &pn, &err);
        if (rc != WHALE_OK || !valid_utf8((const unsigned char *)piece, pn) || an + pn > full_len) {
            ok = 0;
            break;
        }
        memcpy(acc + an, piece, pn);
        an += pn;
    }
    CHECK(ok && an == full_len && !memcmp(acc, full, an), "%s: streaming decode differs from decode", name);
    free(acc);
    whale_detokenizer_free(d);
}

static void check_golden(const char *tokdir, const char *name, int has_normalizer) {
    char path[1024];
    whale_err err;
    whale_tokenizer *t = NULL;
    snprintf(path, sizeof path, "%s/%s", tokdir, name);
    whale_code rc = whale_tokenizer_load(path, &t, &err);
    CHECK(rc == WHALE_OK, "%s: load: %s", name, err.msg);
    if (rc) return;
    snprintf(path, sizeof path, "%s/tokenizer/golden-%s.json", WHALE_TEST_DATA, name);
    cJSON *golden = test_read_json(path);
    snprintf(path, sizeof path, "%s/tokenizer/corpus.jsonl", WHALE_TEST_DATA);
    char *corpus;
    size_t corpus_len;
    CHECK(golden != NULL, "cannot read golden for %s", name);
    CHECK(whale_read_file(path, &corpus, &corpus_len, &err) == WHALE_OK, "%s", err.msg);
    if (!golden) {
        whale_tokenizer_free(t);
        return;
    }
    CHECK(whale_tokenizer_vocab_size(t) == (int)cJSON_GetObjectItem(golden, "vocab_size_with_added")->valuedouble,
          "%s: vocab size %d", name, whale_tokenizer_vocab_size(t));

    const cJSON *entries = cJSON_GetObjectItem(golden, "entries");
    const cJSON *e = entries->child;
    int count = 0, same = 0;
    for (char *line = corpus, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        cJSON *item = cJSON_Parse(line);
        const char *ename = cJSON_GetObjectItem(item, "name")->valuestring;
        const char *text = cJSON_GetObjectItem(item, "text")->valuestring;
        CHECK(e && !strcmp(cJSON_GetObjectItem(e, "name")->valuestring, ename), "%s: corpus and golden out of step at %s",
              name, ename);
        if (!e) {
            cJSON_Delete(item);
            break;
        }
        int32_t *ids;
        int n;
        size_t tl = strlen(text);
        rc = whale_tokenizer_encode(t, text, tl, 0, &ids, &n, &err);
        CHECK(rc == WHALE_OK, "%s/%s: encode: %s", name, ename, err.msg);
        const cJSON *gids = cJSON_GetObjectItem(e, "ids");
        int eq = rc == WHALE_OK && ids_equal(ids, n, gids);
        CHECK(eq, "%s/%s: ids differ from Hugging Face", name, ename);
        if (!eq && rc == WHALE_OK) show_diff(ename, ids, n, gids);
        same += eq;
        count++;
        const cJSON *gsp = cJSON_GetObjectItem(e, "ids_with_special"); /* add_special_tokens=true */
        if (gsp) {
            int32_t *sids;
            int sn;
            CHECK(whale_tokenizer_encode(t, text, tl, 1, &sids, &sn, &err) == WHALE_OK && ids_equal(sids, sn, gsp),
                  "%s/%s: ids with special tokens differ from Hugging Face", name, ename);
            free(sids);
        }
        /* decode, with and without special tokens, against the golden */
        const char *want[2] = {cJSON_GetObjectItem(e, "decoded")->valuestring,
                               cJSON_GetObjectItem(e, "decoded_skip_special")->valuestring};
        const cJSON *g = gids;
        int gn = cJSON_GetArraySize(g), i = 0;
        int32_t *gv = malloc(sizeof(int32_t) * (size_t)(gn + 1));
        for (const cJSON *c = g->child; c; c = c->next) gv[i++] = (int32_t)c->valuedouble;
        for (int skip = 0; skip < 2; skip++) {
            char *out;
            size_t on;
            rc = whale_tokenizer_decode(t, gv, gn, skip, &out, &on, &err);
            CHECK(rc == WHALE_OK && on == strlen(want[skip]) && !memcmp(out, want[skip], on),
                  "%s/%s: decode(skip_special=%d) differs from Hugging Face", name, ename, skip);
            if (rc == WHALE_OK) check_stream(t, ename, gv, gn, skip, out, on);
            free(out);
        }
        /* without a normalizer, decoding gives back the input exactly */
        if (!has_normalizer) CHECK(!strcmp(want[0], text), "%s/%s: decode(encode(s)) != s", name, ename);
        free(gv);
        free(ids);
        cJSON_Delete(item);
        e = e->next;
    }
    CHECK(count == cJSON_GetArraySize(entries), "%s: %d corpus lines for %d goldens", name, count,
          cJSON_GetArraySize(entries));
    printf("%s: %d of %d corpus entries identical to Hugging Face\n", name, same, count);

    /* long inputs made by rule: identical ids, and no quadratic blow-up */
    for (const cJSON *g = cJSON_GetObjectItem(golden, "generated")->child; g; g = g->next) {
        const char *gname = cJSON_GetObjectItem(g, "name")->valuestring;
        size_t len;
        char *text = generated_text(gname, &len);
        CHECK(text != NULL, "unknown generated text %s", gname);
        if (!text) continue;
        CHECK((double)len == cJSON_GetObjectItem(g, "bytes")->valuedouble, "%s: generated %zu bytes", gname, len);
        int32_t *ids;
        int n;
        double t0 = thread_seconds();
        rc = whale_tokenizer_encode(t, text, len, 0, &ids, &n, &err);
        double dt = thread_seconds() - t0;
        CHECK(rc == WHALE_OK, "%s/%s: %s", name, gname, err.msg);
        int eq = rc == WHALE_OK && ids_equal(ids, n, cJSON_GetObjectItem(g, "ids"));
        CHECK(eq, "%s/%s: ids differ from Hugging Face", name, gname);
        if (!eq && rc == WHALE_OK) show_diff(gname, ids, n, cJSON_GetObjectItem(g, "ids"));
        /* generous bound on this thread's CPU time (other processes on a
         * loaded machine do not count): linear-time BPE needs a few ms,
         * tens under the sanitizers; quadratic needs minutes */
        CHECK(dt < 2.0, "%s/%s: %zu bytes took %.3f s", name, gname, len, dt);
        printf("%s: %s (%zu bytes, %d ids) %.1f ms\n", name, gname, len, n, dt * 1e3);
        char *out;
        size_t on;
        if (rc == WHALE_OK && whale_tokenizer_decode(t, ids, n, 0, &out, &on, &err) == WHALE_OK) {
            CHECK(on == len && !memcmp(out, text, len), "%s/%s: decode(encode(s)) != s", name, gname);
            free(out);
        }
        if (rc == WHALE_OK) free(ids);
        free(text);
    }
    /* ByteFallback: runs of <0xNN> tokens that are not valid UTF-8 */
    const cJSON *runs = cJSON_GetObjectItem(golden, "byte_runs");
    for (const cJSON *r = runs ? runs->child : NULL; r; r = r->next) {
        const cJSON *rids = cJSON_GetObjectItem(r, "ids");
        const char *want = cJSON_GetObjectItem(r, "decoded")->valuestring;
        int32_t rv[16];
        int rn = 0;
        for (const cJSON *c = rids->child; c && rn < 16; c = c->next) rv[rn++] = (int32_t)c->valuedouble;
        char *out;
        size_t on;
        rc = whale_tokenizer_decode(t, rv, rn, 0, &out, &on, &err);
        CHECK(rc == WHALE_OK && on == strlen(want) && !memcmp(out, want, on),
              "%s: byte run %d ids: decode differs from Hugging Face", name, rn);
        if (rc == WHALE_OK) check_stream(t, "byte_runs", rv, rn, 0, out, on);
        if (rc == WHALE_OK) free(out);
    }
    if (!strcmp(name, "gemma3")) CHECK(cJSON_GetArraySize(runs) == 6, "gemma3: %d byte runs in the golden", cJSON_GetArraySize(runs));
    cJSON_Delete(golden);
    free(corpus);
    whale_tokenizer_free(t);
}

static void encode_str(whale_tokenizer *t, const char *s, size_t n, int add_special, int32_t **ids, int *cnt);

/* Small tokenizers built by tests/reference/tokenizer/synthetic.mjs for the
 * features the real files do not use; each is written to a temporary
 * directory and checked against Hugging Face's encodings. */
static void check_synthetic(void) {
    char path[1024], tmp[512];
    snprintf(path, sizeof path, "%s/tokenizer/golden-synthetic.json", WHALE_TEST_DATA);
    cJSON *golden = test_read_json(path);
    CHECK(golden != NULL, "cannot read %s", path);
    if (!golden) return;
    test_tmpdir("toksyn", tmp, sizeof tmp);
    for (const cJSON *v = cJSON_GetObjectItem(golden, "variants")->child; v; v = v->next) {
        const char *name = cJSON_GetObjectItem(v, "name")->valuestring;
        char dir[1024], file[1100];
        snprintf(dir, sizeof dir, "%s/%s", tmp, name);
        mkdir(dir, 0755);
        snprintf(file, sizeof file, "%s/tokenizer.json", dir);
        char *json = cJSON_PrintUnformatted(cJSON_GetObjectItem(v, "tokenizer"));
        write_text(file, json);
        free(json);
        whale_tokenizer *t;
        whale_err err;
        if (whale_tokenizer_load(dir, &t, &err) != WHALE_OK) {
            CHECK(0, "synthetic %s: load: %s", name, err.msg);
            continue;
        }
        int same = 0, count = 0;
        for (const cJSON *c = cJSON_GetObjectItem(v, "cases")->child; c; c = c->next, count++) {
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            int add = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_special"));
            const cJSON *gids = cJSON_GetObjectItem(c, "ids");
            int32_t *ids;
            int n;
            encode_str(t, text, strlen(text), add, &ids, &n);
            int eq = n >= 0 && ids_equal(ids, n, gids);
            CHECK(eq, "synthetic %s: \"%s\" (add_special=%d): ids differ from Hugging Face", name, text, add);
            if (!eq && n >= 0) show_diff(name, ids, n, gids);
            same += eq;
            const char *want[2] = {cJSON_GetObjectItem(c, "decoded")->valuestring,
                                   cJSON_GetObjectItem(c, "decoded_skip_special")->valuestring};
            for (int skip = 0; skip < 2 && eq; skip++) {
                char *out;
                size_t on;
                CHECK(whale_tokenizer_decode(t, ids, n, skip, &out, &on, &err) == WHALE_OK && !strcmp(out, want[skip]),
                      "synthetic %s: \"%s\": decode(skip_special=%d) differs", name, text, skip);
                free(out);
            }
            free(ids);
        }
        printf("synthetic %s: %d of %d cases identical to Hugging Face\n", name, same, count);
        whale_tokenizer_free(t);
    }
    cJSON_Delete(golden);
}

/* ------------------------------------------------------------ special tokens */

static void encode_str(whale_tokenizer *t, const char *s, size_t n, int add_special, int32_t **ids, int *cnt) {
    whale_err err;
    if (whale_tokenizer_encode(t, s, n, add_special, ids, cnt, &err) != WHALE_OK) {
        fprintf(stderr, "encode failed: %s\n", err.msg);
        *ids = NULL;
        *cnt = -1;
    }
}

static int same_encoding(whale_tokenizer *t, const char *a, size_t an, const char *b, size_t bn) {
    int32_t *x, *y;
    int nx, ny;
    encode_str(t, a, an, 0, &x, &nx);
    encode_str(t, b, bn, 0, &y, &ny);
    int eq = nx >= 0 && nx == ny && !memcmp(x, y, sizeof(int32_t) * (size_t)nx);
    free(x);
    free(y);
    return eq;
}

static void check_deepseek_specials(const char *tokdir) {
    char path[1200];
    whale_err err;
    whale_tokenizer *t;
    snprintf(path, sizeof path, "%s/deepseek_v3", tokdir);
    if (whale_tokenizer_load(path, &t, &err) != WHALE_OK) return; /* reported by check_golden */
    CHECK(whale_tokenizer_token_to_id(t, "<｜begin▁of▁sentence｜>") == 0, "BOS id");
    CHECK(whale_tokenizer_token_to_id(t, "<｜User｜>") == 128803, "User id");
    CHECK(whale_tokenizer_token_to_id(t, "<｜Assistant｜>") == 128804, "Assistant id");
    CHECK(whale_tokenizer_token_to_id(t, "Ġthe") >= 0, "model vocab lookup");
    CHECK(whale_tokenizer_token_to_id(t, "no such token") == -1, "unknown token");
    CHECK(!strcmp(whale_tokenizer_id_to_token(t, 1), "<｜end▁of▁sentence｜>"), "id_to_token(1)");
    CHECK(whale_tokenizer_id_to_token(t, 200000) == NULL && whale_tokenizer_id_to_token(t, -1) == NULL, "bad ids");
    CHECK(whale_tokenizer_is_special(t, 0) && whale_tokenizer_is_special(t, 1), "BOS/EOS special");
    CHECK(!whale_tokenizer_is_special(t, 128803), "<｜User｜> is not special");
    CHECK(whale_tokenizer_role_id(t, WHALE_TOKEN_BOS) == 0 && whale_tokenizer_role_id(t, WHALE_TOKEN_EOS) == 1 &&
              whale_tokenizer_role_id(t, WHALE_TOKEN_PAD) == 1,
          "bos/eos/pad ids from tokenizer_config.json");
    CHECK(!strcmp(whale_tokenizer_role_token(t, WHALE_TOKEN_EOS), "<｜end▁of▁sentence｜>"), "eos string");
    size_t bl;
    const char *b = whale_tokenizer_token_bytes(t, whale_tokenizer_token_to_id(t, "Ġthe"), &bl);
    CHECK(bl == 4 && !memcmp(b, " the", 4), "token bytes of Ġthe");
    /* add_bos_token is true in this tokenizer_config.json */
    int32_t *ids;
    int n;
    encode_str(t, "hi", 2, 1, &ids, &n);
    CHECK(n == 2 && ids[0] == 0, "add_special puts BOS first");
    free(ids);
    /* skip_special keeps the non-special chat markers */
    int32_t chat[] = {0, 128803, 6366, 128804, 1};
    char *out;
    size_t on;
    CHECK(whale_tokenizer_decode(t, chat, 5, 1, &out, &on, &err) == WHALE_OK && !strcmp(out, "<｜User｜>hi<｜Assistant｜>"),
          "skip_special on a chat turn");
    free(out);
    /* ids past the vocabulary decode to nothing; negative ids are errors */
    int32_t odd[] = {6366, 129000, 6366};
    CHECK(whale_tokenizer_decode(t, odd, 3, 0, &out, &on, &err) == WHALE_OK && !strcmp(out, "hihi"), "hole ids");
    free(out);
    int32_t neg[] = {-5};
    CHECK(whale_tokenizer_decode(t, neg, 1, 0, &out, &on, &err) == WHALE_ERR_RANGE, "negative id");
    CHECK(whale_tokenizer_decode(t, NULL, 0, 0, &out, &on, &err) == WHALE_OK && on == 0 && out[0] == 0, "empty decode");
    free(out);

    /* invalid UTF-8 is encoded as if each maximal bad subsequence were U+FFFD */
    static const struct {
        const char *bad, *fixed;
    } cases[] = {
        {"a\xff" "b", "a\xef\xbf\xbd" "b"},
        {"\xe4\xbd", "\xef\xbf\xbd"},                                       /* truncated at the end */
        {"\xe4\xbd" "x", "\xef\xbf\xbd" "x"},                               /* truncated in the middle */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                           /* overlong */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},           /* surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF */
        {"\xf0\x9f\x90" " whale", "\xef\xbf\xbd whale"},                    /* 3 of 4 bytes */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(same_encoding(t, cases[i].bad, strlen(cases[i].bad), cases[i].fixed, strlen(cases[i].fixed)),
              "invalid UTF-8 case %zu", i);
    /* NUL is an ordinary character */
    encode_str(t, "a\0b", 3, 0, &ids, &n);
    CHECK(n > 0 && whale_tokenizer_decode(t, ids, n, 0, &out, &on, &err) == WHALE_OK && on == 3 &&
              !memcmp(out, "a\0b", 3),
          "NUL round trip");
    free(ids);
    free(out);

    /* a character split over byte tokens: decode replaces the unfinished
     * sequence, streaming holds it until complete */
    encode_str(t, "🐳", strlen("🐳"), 0, &ids, &n);
    CHECK(n >= 2, "the whale emoji takes several byte tokens (%d)", n);
    if (n >= 2) {
        CHECK(whale_tokenizer_decode(t, ids, n - 1, 0, &out, &on, &err) == WHALE_OK && valid_utf8((unsigned char *)out, on) &&
                  strstr(out, "\xef\xbf\xbd"),
              "partial character decodes to U+FFFD");
        free(out);
        whale_detokenizer *d;
        const char *piece;
        size_t pn;
        whale_detokenizer_new(t, 0, &d, &err);
        for (int i = 0; i + 1 < n; i++) {
            whale_detokenizer_push(d, ids[i], &piece, &pn, &err);
            CHECK(pn == 0, "streaming holds back a partial character");
        }
        whale_detokenizer_push(d, ids[n - 1], &piece, &pn, &err);
        CHECK(pn == 4 && !memcmp(piece, "🐳", 4), "streaming emits the character once complete");
        /* an unfinished character at the end is flushed as U+FFFD */
        whale_detokenizer_push(d, ids[0], &piece, &pn, &err);
        whale_detokenizer_flush(d, &piece, &pn, &err);
        CHECK(pn == 3 && !memcmp(piece, "\xef\xbf\xbd", 3), "flush of a partial character");
        whale_detokenizer_flush(d, &piece, &pn, &err);
        CHECK(pn == 0, "second flush is empty");
        CHECK(whale_detokenizer_push(d, -1, &piece, &pn, &err) == WHALE_ERR_RANGE, "stream negative id");
        whale_detokenizer_free(d);
    }
    free(ids);
    whale_tokenizer_free(t);
}

static void check_qwen_specials(const char *tokdir) {
    char path[1200];
    whale_err err;
    whale_tokenizer *t;
    snprintf(path, sizeof path, "%s/qwen3", tokdir);
    if (whale_tokenizer_load(path, &t, &err) != WHALE_OK) return;
    CHECK(whale_tokenizer_token_to_id(t, "<|im_start|>") == 151644 && whale_tokenizer_token_to_id(t, "<|im_end|>") == 151645,
          "ChatML ids");
    CHECK(whale_tokenizer_role_id(t, WHALE_TOKEN_BOS) == -1 && whale_tokenizer_role_token(t, WHALE_TOKEN_BOS) == NULL,
          "Qwen has no BOS");
    CHECK(whale_tokenizer_role_id(t, WHALE_TOKEN_EOS) == 151645 && whale_tokenizer_role_id(t, WHALE_TOKEN_PAD) == 151643,
          "Qwen eos/pad");
    int32_t *ids;
    int n;
    encode_str(t, "Hello world", 11, 1, &ids, &n);
    CHECK(n == 2 && ids[0] == 9707 && ids[1] == 1879, "Qwen adds no special tokens");
    free(ids);
    /* NFC: decomposed and composed input encode alike */
    CHECK(same_encoding(t, "cafe\xcc\x81", 6, "caf\xc3\xa9", 5), "NFC of e + U+0301");
    /* invalid UTF-8 goes through NFC as U+FFFD */
    CHECK(same_encoding(t, "x\x80y", 3, "x\xef\xbf\xbdy", 5), "invalid byte in Qwen");
    whale_tokenizer_free(t);
}

/* ------------------------------------------------------------ load errors */

/* A tiny byte-level tokenizer: vocabulary "a", "b", "ab", merge "a b". */
static const char *tiny_json(const char *normalizer, const char *pretok, const char *merges, const char *model_extra) {
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"
             "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,"
             "\"decoder\":{\"type\":\"ByteLevel\"},"
             "\"model\":{\"type\":\"BPE\",\"unk_token\":null%s,"
             "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"c\":3},\"merges\":%s}}",
             normalizer, pretok, model_extra, merges);
    return buf;
}

static void expect_error(const char *tmp, const char *tag, const char *json, whale_code code, const char *needle1,
                         const char *needle2) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/%s", tmp, tag);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_text(path, json);
    whale_tokenizer *t = NULL;
    whale_err err = {0};
    whale_code rc = whale_tokenizer_load(dir, &t, &err);
    CHECK(rc == code, "%s: got code %d (%s), want %d", tag, rc, err.msg, code);
    CHECK(t == NULL || rc == WHALE_OK, "%s: tokenizer returned on failure", tag);
    if (rc != WHALE_OK) {
        CHECK(strstr(err.msg, "tokenizer.json") != NULL, "%s: message does not name the file: %s", tag, err.msg);
        CHECK(!needle1 || strstr(err.msg, needle1), "%s: message lacks \"%s\": %s", tag, needle1, err.msg);
        CHECK(!needle2 || strstr(err.msg, needle2), "%s: message lacks \"%s\": %s", tag, needle2, err.msg);
        CHECK(!strchr(err.msg, '\n'), "%s: message is not one line", tag);
    }
    whale_tokenizer_free(t);
}

static void check_errors(void) {
    char tmp[512];
    test_tmpdir("tok", tmp, sizeof tmp);
    whale_tokenizer *t = NULL;
    whale_err err;
    char path[1024];
    snprintf(path, sizeof path, "%s/missing", tmp);
    CHECK(whale_tokenizer_load(path, &t, &err) == WHALE_ERR_IO && strstr(err.msg, "tokenizer.json"),
          "missing tokenizer.json: %s", err.msg);

    const char *ok = tiny_json("null", "null", "[\"a b\"]", "");
    expect_error(tmp, "ok", ok, WHALE_OK, NULL, NULL);
    expect_error(tmp, "pairs", tiny_json("null", "null", "[[\"a\",\"b\"]]", ""), WHALE_OK, NULL, NULL);
    expect_error(tmp, "corrupt", "{\"model\": {\"vocab\": {\"a\": 0,}}", WHALE_ERR_FORMAT, "invalid JSON", "line 1");
    expect_error(tmp, "not_utf8", "{\"model\": \"\xff\"}", WHALE_ERR_FORMAT, "invalid UTF-8", NULL);
    expect_error(tmp, "merge_unknown", tiny_json("null", "null", "[\"a b\", \"a x\"]", ""), WHALE_ERR_FORMAT,
                 "model.merges[1]", "\"x\"");
    expect_error(tmp, "merge_result_unknown", tiny_json("null", "null", "[\"a c\"]", ""), WHALE_ERR_FORMAT,
                 "model.merges[0]", "\"ac\"");
    expect_error(tmp, "merge_malformed", tiny_json("null", "null", "[\"ab\"]", ""), WHALE_ERR_FORMAT,
                 "model.merges[0]", NULL);
    expect_error(tmp, "normalizer", tiny_json("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Lowercase\"}]}",
                                            "null", "[]", ""),
                 WHALE_ERR_UNSUPPORTED, "normalizer.normalizers[1]", "Lowercase");
    expect_error(tmp, "pretok", tiny_json("null", "{\"type\":\"Whitespace\"}", "[]", ""), WHALE_ERR_UNSUPPORTED,
                 "pre_tokenizer", "Whitespace");
    expect_error(tmp, "regex_b",
                 tiny_json("null", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\bx\"},\"behavior\":\"Isolated\",\"invert\":false}",
                           "[]", ""),
                 WHALE_ERR_UNSUPPORTED, "pre_tokenizer.pattern.Regex", NULL);
    expect_error(tmp, "regex_bad",
                 tiny_json("null", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(x\"},\"behavior\":\"Isolated\",\"invert\":false}",
                           "[]", ""),
                 WHALE_ERR_FORMAT, "pre_tokenizer.pattern.Regex", "bad regex");
    expect_error(tmp, "behavior",
                 tiny_json("null", "{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},\"behavior\":\"Sideways\",\"invert\":false}",
                           "[]", ""),
                 WHALE_ERR_UNSUPPORTED, "pre_tokenizer.behavior", NULL);
    expect_error(tmp, "after_bytelevel",
                 tiny_json("null",
                           "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},{\"type\":\"Split\","
                           "\"pattern\":{\"String\":\"x\"},\"behavior\":\"Isolated\",\"invert\":false}]}",
                           "[]", ""),
                 WHALE_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1]", "ByteLevel");
    expect_error(tmp, "dropout", tiny_json("null", "null", "[]", ",\"dropout\":0.1"), WHALE_ERR_UNSUPPORTED,
                 "model.dropout", NULL);
    expect_error(tmp, "unk_missing", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"unk_token\":\"<unk>\"},"
                                     "\"decoder\":{\"type\":\"ByteLevel\"}}",
                 WHALE_ERR_FORMAT, "model.unk_token", "<unk>");
    expect_error(tmp, "replace_regex", "{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" +\"},\"content\":\"_\"},"
                                       "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"Fuse\"}}",
                 WHALE_ERR_UNSUPPORTED, "normalizer.pattern", "Regex");
    expect_error(tmp, "decoder_strip", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                                       "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},"
                                       "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}}",
                 WHALE_ERR_UNSUPPORTED, "decoder.decoders[1]", "Strip");
    expect_error(tmp, "decoder_order", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                                       "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},"
                                       "{\"type\":\"Replace\",\"pattern\":{\"String\":\"_\"},\"content\":\" \"}]}}",
                 WHALE_ERR_UNSUPPORTED, "decoder.decoders[1]", "Replace");
    expect_error(tmp, "wordpiece", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}},\"decoder\":{\"type\":\"ByteLevel\"}}",
                 WHALE_ERR_UNSUPPORTED, "model.type", "WordPiece");
    expect_error(tmp, "bad_id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"}}",
                 WHALE_ERR_FORMAT, "model.vocab[\"a\"]", NULL);
    expect_error(tmp, "dup_id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"}}",
                 WHALE_ERR_FORMAT, "model.vocab", "id 0");
    expect_error(tmp, "decoder", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"WordPiece\"}}",
                 WHALE_ERR_UNSUPPORTED, "decoder", "WordPiece");
    expect_error(tmp, "post", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"},"
                              "\"post_processor\":{\"type\":\"BertProcessing\"}}",
                 WHALE_ERR_UNSUPPORTED, "post_processor", "BertProcessing");
    expect_error(tmp, "truncation", "{\"truncation\":{\"max_length\":5},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                 WHALE_ERR_UNSUPPORTED, "truncation", NULL);
    expect_error(tmp, "added_bad", "{\"added_tokens\":[{\"id\":5}],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                                   "\"decoder\":{\"type\":\"ByteLevel\"}}",
                 WHALE_ERR_FORMAT, "added_tokens[0].content", NULL);

    /* a bad tokenizer_config.json is reported under its own name */
    snprintf(path, sizeof path, "%s/ok/tokenizer_config.json", tmp);
    write_text(path, "{\"eos_token\": \"<nope>\"}");
    snprintf(path, sizeof path, "%s/ok", tmp);
    CHECK(whale_tokenizer_load(path, &t, &err) == WHALE_ERR_FORMAT && strstr(err.msg, "tokenizer_config.json") &&
              strstr(err.msg, "eos_token"),
          "config error: %s", err.msg);
    snprintf(path, sizeof path, "%s/ok/tokenizer_config.json", tmp);
    write_text(path, "{\"eos_token\": {\"content\": \"ab\"}, \"add_eos_token\": true}");
    snprintf(path, sizeof path, "%s/ok", tmp);
    t = NULL;
    CHECK(whale_tokenizer_load(path, &t, &err) == WHALE_OK, "config with object eos: %s", err.msg);
    if (t) {
        int32_t *ids;
        int n;
        encode_str(t, "aab", 3, 1, &ids, &n);
        CHECK(n == 3 && ids[0] == 0 && ids[1] == 2 && ids[2] == 2, "tiny encode + add_eos_token");
        free(ids);
        whale_tokenizer_free(t);
    }
}

/* ------------------------------------------------------------ regex searches */

static whale_tokenizer *split_tokenizer(const char *tmp, const char *tag, const char *regex, const char *behavior) {
    char pretok[512], dir[1024], path[1100];
    snprintf(pretok, sizeof pretok, "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"%s\"},\"behavior\":\"%s\",\"invert\":false}",
             regex, behavior);
    snprintf(dir, sizeof dir, "%s/%s", tmp, tag);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_text(path, tiny_json("null", pretok, "[\"a b\"]", ""));
    whale_tokenizer *t = NULL;
    whale_err err;
    CHECK(whale_tokenizer_load(dir, &t, &err) == WHALE_OK, "%s: %s", tag, err.msg);
    return t;
}

static char *runs(const char *pre, char c, int n, const char *post) {
    size_t a = strlen(pre), b = strlen(post);
    char *s = malloc(a + (size_t)n + b + 1);
    memcpy(s, pre, a);
    memset(s + a, c, (size_t)n);
    memcpy(s + a + (size_t)n, post, b + 1);
    return s;
}

/* A search first looks at a window of the text and widens it whenever the
 * result could depend on what lies beyond: matches that need more than the
 * window (a long run, a lookahead to far away, $ at the window's edge, a
 * lookbehind) are found as over the whole text. "Removed" drops the
 * matches, so the ids show exactly what matched. */
static void check_windows(const char *tmp) {
    static const struct {
        const char *regex, *pre;
        char run;
        int n;
        const char *post;
        int want[4], nwant; /* nwant < 0: the run of 'a' is kept, then want */
    } cases[] = {
        {"a{40}b", "", 'a', 40, "bc", {3}, 1},
        {"ca+$", "c", 'a', 50, "", {0}, 0},
        {"b", "", 'a', 50, "b", {0}, -1},
        {"(?<=c)a+(?!a)", "c", 'a', 50, "b", {3, 1}, 2},
        {"b(?=a{0,60}c)", "b", 'a', 50, "c", {3}, -1},
        {"a{100}|b", "b", 'a', 99, "", {0}, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "window%zu", i);
        whale_tokenizer *t = split_tokenizer(tmp, tag, cases[i].regex, "Removed");
        if (!t) continue;
        char *text = runs(cases[i].pre, cases[i].run, cases[i].n, cases[i].post);
        int32_t *ids;
        int n;
        encode_str(t, text, strlen(text), 0, &ids, &n);
        int ok;
        if (cases[i].nwant >= 0) {
            ok = n == cases[i].nwant;
            for (int k = 0; ok && k < n; k++) ok = ids[k] == cases[i].want[k];
        } else { /* the run of a's is kept: ids 0 ... then the last want */
            ok = n == cases[i].n + (cases[i].want[0] != 0);
            for (int k = 0; ok && k < cases[i].n; k++) ok = ids[k] == 0;
            if (ok && cases[i].want[0] != 0) ok = ids[n - 1] == cases[i].want[0];
        }
        CHECK(ok, "%s on a %zu-byte text: %d ids, not as over the whole text", cases[i].regex, strlen(text), n);
        if (n >= 0) free(ids);
        free(text);
        whale_tokenizer_free(t);
    }
}

/* The encode's work budget counts the bytes its searches are given, not
 * time: a pattern that looks to the end of the text and consumes one
 * character fails at the same point on any machine, under the sanitizers
 * as in a release build, and a short text with it passes. */
static void check_work_budget(const char *tmp) {
    whale_tokenizer *t = split_tokenizer(tmp, "quadratic", "a(?=a*b)|a", "Isolated");
    if (!t) return;
    char *shorter = runs("", 'a', 500, ""), *longer = runs("", 'a', 4000, "");
    int32_t *ids;
    int n;
    whale_err err;
    CHECK(whale_tokenizer_encode(t, shorter, 500, 0, &ids, &n, &err) == WHALE_OK && n == 500, "500 a: %s", err.msg);
    if (n == 500) free(ids);
    char want[1024];
    snprintf(want, sizeof want,
             "%s/quadratic/tokenizer.json: a pre-tokenizer regex costs more than linear time on this text (over the "
             "encode's work budget of %zu bytes searched; see docs/security.md)",
             tmp, WHALE_ENCODE_WORK_BASE + WHALE_ENCODE_WORK_PER_BYTE * 4000);
    for (int k = 0; k < 3; k++) {
        ids = NULL;
        whale_code rc = whale_tokenizer_encode(t, longer, 4000, 0, &ids, &n, &err);
        CHECK(rc == WHALE_ERR_FORMAT && !strcmp(err.msg, want), "4000 a, run %d: code %d: %s", k, (int)rc, err.msg);
        if (rc == WHALE_OK) free(ids);
    }
    free(shorter);
    free(longer);
    whale_tokenizer_free(t);
}

int main(void) {
    const char *env = getenv("WHALE_TOKENIZERS");
    char tokdir[1024];
    if (env && *env) snprintf(tokdir, sizeof tokdir, "%s", env);
    else snprintf(tokdir, sizeof tokdir, "%s/../../.cache/tokenizers", WHALE_TEST_DATA);
    check_errors();
    char tmp[512];
    test_tmpdir("tokre", tmp, sizeof tmp);
    check_windows(tmp);
    check_work_budget(tmp);
    check_synthetic();
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/deepseek_v3/tokenizer.json", tokdir);
    struct stat st;
    int have = stat(probe, &st) == 0;
    snprintf(probe, sizeof probe, "%s/qwen3/tokenizer.json", tokdir);
    have = have && stat(probe, &st) == 0;
    snprintf(probe, sizeof probe, "%s/llama3/tokenizer.json", tokdir);
    have = have && stat(probe, &st) == 0;
    snprintf(probe, sizeof probe, "%s/gemma3/tokenizer.json", tokdir);
    have = have && stat(probe, &st) == 0;
    CHECK(have, "the real tokenizer files are missing from %s: run scripts/fetch-tokenizers.sh "
                "(or set WHALE_TOKENIZERS to where they are)", tokdir);
    if (have) {
        check_golden(tokdir, "deepseek_v3", 0);
        check_golden(tokdir, "qwen3", 1);
        check_golden(tokdir, "llama3", 1); /* decode cleans up spaces (clean_up_tokenization_spaces): not the input */
        check_golden(tokdir, "gemma3", 1); /* decode turns a U+2581 of the input into a space */
        check_deepseek_specials(tokdir);
        check_qwen_specials(tokdir);
    }
    return test_finish("test_tokenizer");
}
