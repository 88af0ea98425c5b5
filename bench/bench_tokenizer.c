/* Tokenizer encode speed on one core: one JSON line per tokenizer.
 *
 *   bench_tokenizer [TOKENIZERS_DIR] [MB]
 *
 * TOKENIZERS_DIR holds deepseek_v3/ and qwen3/ (default .cache/tokenizers,
 * filled by scripts/fetch-tokenizers.sh); MB is the text size (default 10).
 * The text is the entries of tests/data/tokenizer/corpus.jsonl, each
 * followed by a newline, repeated until MB megabytes: English, code, CJK,
 * other scripts, emoji and special tokens. tests/reference/tokenizer/
 * bench.mjs builds the same text and times Hugging Face's tokenizers on it.
 *
 * Build (from the repository root, after building libwhale into build/):
 *   cc -O2 -march=native -D_GNU_SOURCE -Iinclude -Isrc bench/bench_tokenizer.c \
 *      build/libwhale.a -lpcre2-8 -lcjson -ldnnl -fopenmp -lm -o build/bench_tokenizer
 */
#include "core/core.h"
#include "whale_tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CORPUS
#define CORPUS "tests/data/tokenizer/corpus.jsonl"
#endif

static char *build_text(size_t want, size_t *len) {
    char *corpus;
    size_t n;
    whale_err err;
    if (whale_read_file(CORPUS, &corpus, &n, &err)) {
        fprintf(stderr, "bench_tokenizer: %s (run from the repository root)\n", err.msg);
        return NULL;
    }
    char *text = NULL;
    size_t used = 0, cap = 0;
    while (used < want) {
        for (char *line = corpus; *line && used < want;) {
            char *end = strchr(line, '\n');
            size_t ll = end ? (size_t)(end - line) : strlen(line);
            cJSON *j = cJSON_ParseWithLength(line, ll);
            const cJSON *t = cJSON_GetObjectItem(j, "text");
            const char *s = cJSON_IsString(t) ? t->valuestring : "";
            size_t tl = strlen(s);
            if (used + tl + 1 > cap) {
                cap = 2 * (used + tl + 1);
                char *p = realloc(text, cap);
                if (!p) exit(1);
                text = p;
            }
            memcpy(text + used, s, tl);
            used += tl;
            text[used++] = '\n';
            cJSON_Delete(j);
            line = end ? end + 1 : line + ll;
        }
    }
    free(corpus);
    *len = used;
    return text;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".cache/tokenizers";
    double mb = argc > 2 ? atof(argv[2]) : 10;
    if (!(mb > 0)) mb = 10;
    size_t len;
    char *text = build_text((size_t)(mb * 1e6), &len);
    if (!text) return 1;
    static const char *const names[] = {"deepseek_v3", "qwen3"};
    for (int k = 0; k < 2; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        whale_err err;
        whale_tokenizer *t;
        double t0 = whale_now();
        if (whale_tokenizer_load(path, &t, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        double load = whale_now() - t0;
        double best = 1e30;
        int n = 0;
        for (int rep = 0; rep < 3; rep++) { /* the first run also fills the piece cache */
            int32_t *ids;
            t0 = whale_now();
            if (whale_tokenizer_encode(t, text, len, 0, &ids, &n, &err)) {
                fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                return 1;
            }
            double dt = whale_now() - t0;
            if (dt < best) best = dt;
            free(ids);
        }
        char *out;
        size_t on;
        int32_t *ids;
        whale_tokenizer_encode(t, text, len, 0, &ids, &n, &err);
        uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the ids, as bench.mjs prints */
        for (int i = 0; i < n; i++)
            for (int b = 0; b < 4; b++) h = (h ^ (((uint32_t)ids[i] >> (8 * b)) & 255)) * 0x100000001b3ull;
        t0 = whale_now();
        whale_tokenizer_decode(t, ids, n, 0, &out, &on, &err);
        double dec = whale_now() - t0;
        printf("{\"tokenizer\":\"%s\",\"bytes\":%zu,\"ids\":%d,\"ids_fnv\":\"%016llx\",\"load_s\":%.3f,"
               "\"encode_s\":%.3f,\"encode_mb_s\":%.1f,\"decode_mb_s\":%.1f}\n",
               names[k], len, n, (unsigned long long)h, load, best, len / best / 1e6, on / dec / 1e6);
        free(out);
        free(ids);
        whale_tokenizer_free(t);
    }
    free(text);
    return 0;
}
