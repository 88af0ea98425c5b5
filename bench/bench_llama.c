/* bench_llama: llama.cpp's speed on a GGUF file, measured the way
 * `whale bench` measures whale, so that bench/llama.sh can put the two side
 * by side on the same weights (`whale export --format gguf`).
 *
 * llama.cpp is the prebuilt libllama / libggml of npm's
 * @node-llama-cpp/linux-x64 (a test dependency, installed by
 * scripts/setup.sh), opened with dlopen as tests/gguf_llama.c does; ggml
 * picks its CPU variant for the processor it finds. The context keeps
 * llama.cpp's own defaults (n_ctx 512, an f16 KV cache, flash attention
 * chosen by llama.cpp): the library as a user of it runs it.
 *
 *   prefill: SEQ random tokens in one llama_decode, logits of the last only
 *            (whale bench --what prefill: 1 × 512);
 *   decode:  CONTEXT random tokens in one call, then TOKENS calls of one
 *            token each, only those timed (whale bench --what decode).
 * Each repetition starts from an empty cache; one untimed run first warms
 * the caches, then the best of REPS is reported as one JSON line.
 *
 * usage: bench_llama BINS_DIR FILE.gguf prefill|decode THREADS REPS [SEQ|CONTEXT TOKENS]
 * Exit 0 on success, 1 when the run fails, 2 when llama.cpp cannot be loaded.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama_dl.h"

/* llama.cpp's log, kept for an error message and for the CPU variant it loaded */
static char log_all[1 << 16];
static void keep_log(int level, const char *text, void *user) {
    (void)level, (void)user;
    size_t n = strlen(log_all), k = strlen(text);
    if (n + k < sizeof log_all) memcpy(log_all + n, text, k + 1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n tokens at positions p0.., logits of the last one only */
static int run(void *ctx, const int32_t *ids, int n, int p0) {
    llama_batch b = L.batch_init(n, 0, 1);
    if (!b.token) return -1;
    for (int i = 0; i < n; i++)
        b.token[i] = ids[i], b.pos[i] = p0 + i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0, b.logits[i] = i == n - 1;
    b.n_tokens = n;
    int rc = L.decode(ctx, b);
    L.synchronize(ctx);
    L.batch_free(b);
    return rc;
}

/* the line of llama.cpp's log that names the CPU variant it loaded, or "" */
static void cpu_variant(char *out, size_t cap) {
    const char *p = strstr(log_all, "libggml-cpu-");
    size_t n = 0;
    if (p) {
        p += strlen("libggml-cpu-");
        while (p[n] && p[n] != '.' && p[n] != '\n' && n + 1 < cap) n++;
    }
    memcpy(out, p ? p : "", n);
    out[n] = 0;
}

int main(int argc, char **argv) {
    int prefill = argc >= 6 && !strcmp(argv[3], "prefill"), decode = argc >= 6 && !strcmp(argv[3], "decode");
    if ((!prefill && !decode) || (prefill && argc > 7) || (decode && argc != 6 && argc != 8)) {
        fprintf(stderr, "usage: bench_llama BINS_DIR FILE.gguf prefill|decode THREADS REPS [SEQ|CONTEXT TOKENS]\n");
        return 2;
    }
    const char *bins = argv[1], *file = argv[2];
    int threads = atoi(argv[4]), reps = atoi(argv[5]);
    int seq = prefill && argc == 7 ? atoi(argv[6]) : 512;
    int context = decode && argc == 8 ? atoi(argv[6]) : 128, tokens = decode && argc == 8 ? atoi(argv[7]) : 64;
    int total = prefill ? seq : context + tokens;
    if (threads < 1 || reps < 1 || reps > 1000 || seq < 1 || context < 1 || tokens < 1 || total > 512) {
        fprintf(stderr, "bench_llama: THREADS and REPS must be positive, the tokens at most 512 (llama.cpp's default context)\n");
        return 2;
    }
    if (llama_dl_load("bench_llama", bins)) return 2;
    L.log_set(keep_log, NULL);
    L.load_all_from_path(bins);
    L.backend_init();
    void *model = L.model_load(file, L.model_default_params());
    void *ctx = model ? L.init_from_model(model, L.context_default_params()) : NULL;
    if (!ctx) {
        size_t n = strlen(log_all);
        fprintf(stderr, "bench_llama: llama.cpp could not load %s:\n%s", file, log_all + (n > 2000 ? n - 2000 : 0));
        return 1;
    }
    L.set_n_threads(ctx, threads, threads);
    int V = L.vocab_n_tokens(L.model_get_vocab(model));
    int32_t *ids = malloc(sizeof *ids * (size_t)total);
    if (!ids || V < 1) return 1;
    uint64_t x = 1;
    for (int i = 0; i < total; i++) { /* the same kind of random ids as whale bench: uniform over the vocabulary */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    double best = 1e30;
    for (int r = 0; r <= reps; r++) { /* run 0 warms caches and is not timed */
        L.memory_clear(L.get_memory(ctx), 1);
        double t0 = now();
        if (prefill ? run(ctx, ids, seq, 0) : run(ctx, ids, context, 0)) goto fail;
        if (decode) {
            t0 = now();
            for (int k = 0; k < tokens; k++)
                if (run(ctx, ids + context + k, 1, context + k)) goto fail;
        }
        double dt = now() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    char variant[64];
    cpu_variant(variant, sizeof variant);
    printf("{\"engine\": \"llama.cpp\", \"cpu_variant\": \"%s\", \"what\": \"%s\", \"file\": \"%s\", \"threads\": %d, ",
           variant, argv[3], file, threads);
    if (prefill)
        printf("\"seq_len\": %d, \"tokens_per_s\": %.1f, \"seconds\": %.4f}\n", seq, seq / best, best);
    else
        printf("\"context\": %d, \"tokens\": %d, \"tokens_per_s\": %.2f}\n", context, tokens, tokens / best);
    free(ids);
    L.free_ctx(ctx);
    L.model_free(model);
    return 0;
fail:
    fprintf(stderr, "bench_llama: llama_decode failed on %s\n", file);
    return 1;
}
