/*
 * gguf_llama: run a GGUF file written by `whale export --format gguf` in
 * llama.cpp itself — the prebuilt libllama / libggml of npm's
 * @node-llama-cpp/linux-x64, opened with dlopen, no llama.cpp build — and
 * compare it with whale on the Hugging Face folder it came from:
 *
 *   1. TEXT tokenized by llama.cpp from the GGUF's tokenizer metadata
 *      (add_special, parse_special) against whale's tokenizer on
 *      tokenizer.json: the same ids;
 *   2. the logits of every prompt position: max |llama − whale| over the
 *      largest |whale logit| within TOL;
 *   3. N greedy tokens after the prompt, each side decoding its own
 *      choices with its KV cache: the same ids (with --greedy).
 *
 * llama.cpp keeps its KV cache in f16 by default and its CPU flash
 * attention rounds to f16 (2e-4 of the largest logit on an f32 file); this
 * program asks for an f32 cache and no flash attention (type_k, type_v and
 * flash_attn_type of llama_context_params, at the offsets the pinned
 * release puts them, after checking that they hold their defaults there —
 * auto, two GGML_TYPE_F16 after two NULL pointers — else it stops), so an
 * f32 GGUF is compared with whale's fp32 forward with nothing rounded on
 * either side.
 *
 * usage: gguf_llama BINS_DIR MODEL_DIR FILE.gguf TEXT N TOL [--greedy]
 * Exit 0 when everything agrees, 1 otherwise, 2 when llama.cpp cannot be
 * loaded (llama_dl.h).
 */
#include "whale.h"
#include "whale_tokenizer.h"
#include "llama_dl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char log_tail[4096];
static void quiet_log(int level, const char *text, void *user) {
    (void)level, (void)user;
    size_t n = strlen(log_tail), k = strlen(text);
    if (n + k >= sizeof log_tail) n = 0;
    memcpy(log_tail + n, text, k + 1 < sizeof log_tail ? k + 1 : 1);
}

/* llama_context_params with an f32 KV cache and no flash attention (see
 * the top of the file). */
enum { OFF_FLASH_ATTN = 52, OFF_CB_EVAL = 88, OFF_TYPE_K = 104, OFF_TYPE_V = 108, GGML_F32 = 0, GGML_F16 = 1 };
static int f32_cache(opaque_params *p) {
    int32_t k, v, fa;
    static const unsigned char null_ptrs[16];
    memcpy(&k, p->bytes + OFF_TYPE_K, 4);
    memcpy(&v, p->bytes + OFF_TYPE_V, 4);
    memcpy(&fa, p->bytes + OFF_FLASH_ATTN, 4);
    if (k != GGML_F16 || v != GGML_F16 || fa != -1 || memcmp(p->bytes + OFF_CB_EVAL, null_ptrs, 16)) return -1;
    fa = 0; /* LLAMA_FLASH_ATTN_TYPE_DISABLED: the CPU kernel rounds Q·K to f16 */
    memcpy(p->bytes + OFF_FLASH_ATTN, &fa, 4);
    k = v = GGML_F32;
    memcpy(p->bytes + OFF_TYPE_K, &k, 4);
    memcpy(p->bytes + OFF_TYPE_V, &v, 4);
    return 0;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Run n tokens at positions p0.. through llama.cpp (logits of every one). */
static int llama_run(void *ctx, const int32_t *ids, int n, int p0) {
    llama_batch b = L.batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i], b.pos[i] = p0 + i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0, b.logits[i] = 1;
    }
    b.n_tokens = n;
    int rc = L.decode(ctx, b);
    L.batch_free(b);
    return rc;
}

static void print_ids(const char *who, const int32_t *ids, int n) {
    fprintf(stderr, "  %s:", who);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: gguf_llama BINS_DIR MODEL_DIR FILE.gguf TEXT N TOL [--greedy]\n");
        return 2;
    }
    const char *bins = argv[1], *dir = argv[2], *file = argv[3], *text = argv[4];
    int n_gen = atoi(argv[5]), greedy = argc > 7 && !strcmp(argv[7], "--greedy"), fails = 0;
    double tol = atof(argv[6]);
    if (llama_dl_load("gguf_llama", bins)) return 2;
    L.log_set(quiet_log, NULL);
    L.load_all_from_path(bins);
    L.backend_init();
    void *model = L.model_load(file, L.model_default_params());
    opaque_params cp = L.context_default_params();
    if (f32_cache(&cp)) {
        fprintf(stderr, "gguf_llama: llama_context_params does not have the layout of the pinned release\n");
        return 2;
    }
    void *ctx = model ? L.init_from_model(model, cp) : NULL;
    if (!ctx) {
        fprintf(stderr, "gguf_llama: llama.cpp could not load %s:\n%s", file, log_tail);
        return 1;
    }
    L.set_n_threads(ctx, 2, 2);
    const void *vocab = L.model_get_vocab(model);
    int V = L.vocab_n_tokens(vocab);

    whale_err err;
    whale_tokenizer *tok;
    whale_model *m;
    whale_session *s;
    int32_t *wids, lids[512];
    int n;
    if (whale_tokenizer_load(dir, &tok, &err) || whale_tokenizer_encode(tok, text, strlen(text), 1, &wids, &n, &err) ||
        whale_model_load(dir, &m, &err) || whale_session_new(m, 1, n + n_gen + 1, &s, &err)) {
        fprintf(stderr, "gguf_llama: whale: %s\n", err.msg);
        return 1;
    }
    int ln = L.tokenize(vocab, text, (int32_t)strlen(text), lids, 512, 1, 1);
    if (V != whale_model_vocab_size(m) || ln != n || memcmp(lids, wids, sizeof *wids * (size_t)n)) {
        fprintf(stderr, "FAIL: tokenization (vocab %d / %d)\n", V, whale_model_vocab_size(m));
        print_ids("llama.cpp", lids, ln > 0 ? ln : 0);
        print_ids("whale", wids, n);
        fails++;
    }
    float *wl = malloc(sizeof(float) * (size_t)n * (size_t)V);
    if (!wl || whale_session_forward(s, wids, 1, n, wl, 1, &err) || llama_run(ctx, wids, n, 0)) {
        fprintf(stderr, "gguf_llama: forward failed: %s\n", err.msg);
        return 1;
    }
    double worst = 0, top = 0;
    int top1 = 0;
    for (int i = 0; i < n; i++) {
        const float *ll = L.get_logits_ith(ctx, i), *w = wl + (size_t)i * V;
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)ll[v] - w[v])), top = fmax(top, fabs(w[v]));
        top1 += argmax(ll, V) == argmax(w, V);

    }
    printf("logits: %d positions, max |llama.cpp - whale| / max |logit| = %.3g (tolerance %g), top-1 agrees at %d/%d\n",
           n, worst / top, tol, top1, n);
    if (!(worst <= tol * top)) fails++;

    int32_t gw[256], gl[256], same = 0;
    gw[0] = gl[0] = argmax(wl + (size_t)(n - 1) * V, V);
    int32_t first_llama = argmax(L.get_logits_ith(ctx, n - 1), V);
    gl[0] = first_llama;
    for (int k = 1; k < n_gen && k < 256; k++) {
        if (whale_session_forward(s, &gw[k - 1], 1, 1, wl, 0, &err) || llama_run(ctx, &gl[k - 1], 1, n + k - 1)) {
            fprintf(stderr, "gguf_llama: decode failed: %s\n", err.msg);
            return 1;
        }
        gw[k] = argmax(wl, V);
        gl[k] = argmax(L.get_logits_ith(ctx, 0), V);
    }
    while (same < n_gen && gw[same] == gl[same]) same++;
    printf("greedy: %d of %d tokens the same\n", same, n_gen);
    if (greedy && same < n_gen) {
        print_ids("llama.cpp", gl, n_gen);
        print_ids("whale", gw, n_gen);
        fails++;
    }
    free(wl), free(wids);
    whale_session_free(s);
    whale_model_free(m);
    whale_tokenizer_free(tok);
    L.free_ctx(ctx);
    L.model_free(model);
    return fails ? 1 : 0;
}
