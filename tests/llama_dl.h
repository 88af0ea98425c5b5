/* llama.cpp's C API as tests/gguf_llama.c and bench/bench_llama.c use it:
 * the prebuilt libllama / libggml of npm's @node-llama-cpp/linux-x64,
 * opened with dlopen (no llama.cpp build, no llama.h). Only by-value structs
 * whose layout has been stable for long are spelled out (llama_batch); the
 * parameter structs are filled by llama.cpp's own default functions and
 * passed back untouched, through a buffer larger than them (the x86-64
 * System V ABI passes and returns such structs in memory, starting at the
 * same place whatever their size). Header-only: one program includes it. */
#ifndef WHALE_LLAMA_DL_H
#define WHALE_LLAMA_DL_H

#include <dlfcn.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    unsigned char bytes[2048];
} opaque_params; /* llama_model_params / llama_context_params, held not read */

typedef struct {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} llama_batch;

static struct {
    void (*backend_init)(void);
    void (*log_set)(void (*)(int, const char *, void *), void *);
    opaque_params (*model_default_params)(void);
    void *(*model_load)(const char *, opaque_params);
    opaque_params (*context_default_params)(void);
    void *(*init_from_model)(void *, opaque_params);
    void (*set_n_threads)(void *, int32_t, int32_t);
    const void *(*model_get_vocab)(const void *);
    int32_t (*vocab_n_tokens)(const void *);
    int32_t (*tokenize)(const void *, const char *, int32_t, int32_t *, int32_t, _Bool, _Bool);
    llama_batch (*batch_init)(int32_t, int32_t, int32_t);
    void (*batch_free)(llama_batch);
    int32_t (*decode)(void *, llama_batch);
    void (*synchronize)(void *);
    float *(*get_logits_ith)(void *, int32_t);
    void *(*get_memory)(const void *);
    void (*memory_clear)(void *, _Bool);
    void (*free_ctx)(void *);
    void (*model_free)(void *);
    void (*load_all_from_path)(const char *);
} L;

/* The first file matching dir/pattern, opened; NULL (said on stderr under
 * prog's name) when there is none or it does not load. */
static void *llama_dl_open_one(const char *prog, const char *dir, const char *pattern) {
    char pat[4200];
    glob_t g;
    snprintf(pat, sizeof pat, "%s/%s", dir, pattern);
    void *h = NULL;
    if (glob(pat, 0, NULL, &g) == 0 && g.gl_pathc > 0 && !(h = dlopen(g.gl_pathv[0], RTLD_NOW | RTLD_GLOBAL)))
        fprintf(stderr, "%s: %s\n", prog, dlerror());
    if (!h && g.gl_pathc == 0) fprintf(stderr, "%s: no %s\n", prog, pat);
    globfree(&g);
    return h;
}

#define LLAMA_DL_SYM(h, field, name)                                                                          \
    if (!(*(void **)&L.field = dlsym(h, name))) {                                                            \
        fprintf(stderr, "%s: %s has no %s\n", prog, #h, name);                                               \
        return -1;                                                                                           \
    }

/* Every function of L from libggml*.so and libllama*.so in bins: 0, or -1
 * after saying what is missing. */
static int llama_dl_load(const char *prog, const char *bins) {
    void *ggml = llama_dl_open_one(prog, bins, "libggml.*so"), *llama = llama_dl_open_one(prog, bins, "libllama.*so");
    if (!ggml || !llama) return -1;
    LLAMA_DL_SYM(ggml, load_all_from_path, "ggml_backend_load_all_from_path")
    LLAMA_DL_SYM(llama, backend_init, "llama_backend_init")
    LLAMA_DL_SYM(llama, log_set, "llama_log_set")
    LLAMA_DL_SYM(llama, model_default_params, "llama_model_default_params")
    LLAMA_DL_SYM(llama, model_load, "llama_model_load_from_file")
    LLAMA_DL_SYM(llama, context_default_params, "llama_context_default_params")
    LLAMA_DL_SYM(llama, init_from_model, "llama_init_from_model")
    LLAMA_DL_SYM(llama, set_n_threads, "llama_set_n_threads")
    LLAMA_DL_SYM(llama, model_get_vocab, "llama_model_get_vocab")
    LLAMA_DL_SYM(llama, vocab_n_tokens, "llama_vocab_n_tokens")
    LLAMA_DL_SYM(llama, tokenize, "llama_tokenize")
    LLAMA_DL_SYM(llama, batch_init, "llama_batch_init")
    LLAMA_DL_SYM(llama, batch_free, "llama_batch_free")
    LLAMA_DL_SYM(llama, decode, "llama_decode")
    LLAMA_DL_SYM(llama, synchronize, "llama_synchronize")
    LLAMA_DL_SYM(llama, get_logits_ith, "llama_get_logits_ith")
    LLAMA_DL_SYM(llama, get_memory, "llama_get_memory")
    LLAMA_DL_SYM(llama, memory_clear, "llama_memory_clear")
    LLAMA_DL_SYM(llama, free_ctx, "llama_free")
    LLAMA_DL_SYM(llama, model_free, "llama_model_free")
    return 0;
}
#undef LLAMA_DL_SYM

#endif
