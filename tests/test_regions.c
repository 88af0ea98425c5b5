/* Parallel regions are entered only when they can share work (core/par.h).
 *
 * libgomp builds and frees a team even for a region that runs on one
 * thread (`#pragma omp parallel if (0)`, one OpenMP thread, a region nested
 * in another), about 1.3 µs each; a decode step of nanowhale-100m reaches
 * some 660 region sites, most of them too small to share. This program is
 * linked with -Wl,--wrap=GOMP_parallel, so every region the library enters
 * (libgomp's entry for `omp parallel`, with or without `for`) is counted:
 *   one thread    loading the tiny models' compute copies (bf16, fp16,
 *                 int8), making sessions, a prefill of four sequences and
 *                 decode steps of 1 to 4 of them, for nanowhale (tests/data/tiny)
 *                 and qwen2-tiny, enter no region at all;
 *   two threads   that prefill enters some (the counter counts, and work
 *                 large enough is still shared);
 *                 the element-wise kernels at one token of nanowhale-100m's
 *                 sizes (a norm over 320, the 4 × 320 hyper-connection state,
 *                 RoPE over 8 heads, SwiGLU over 2 × 640) enter none, and the
 *                 same kernels over 4,096 tokens enter at least one each.
 * oneDNN's own regions (from libdnnl) are not counted. */
#include "testutil.h"
#include "region_count.h"

#include "kernels/hc.h"
#include "kernels/ops.h"
#include "whale.h"

#include <stdlib.h>

enum { NSEQ = 4, PROMPT = 8, CTX = 32 };

/* Regions entered by making a session, prefilling NSEQ prompts and decoding
 * 1..NSEQ rows from them (each step cut back afterwards). */
static long infer_regions(whale_model *m, const char *what) {
    whale_err err;
    whale_session *s = NULL;
    whale_dbatch b = {0};
    const long before = regions;
    const whale_session_params p = {NSEQ, CTX, NSEQ * PROMPT};
    float *logits = malloc(sizeof(float) * (size_t)whale_model_vocab_size(m) * NSEQ);
    CHECK(logits && whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s: session: %s", what, err.msg);
    CHECK(whale_dbatch_init(&b, NSEQ * PROMPT, &err) == WHALE_OK, "%s", err.msg);
    if (!s || !logits || !b.cap) goto out;
    for (int q = 0; q < NSEQ; q++)
        for (int i = 0; i < PROMPT; i++) whale_dbatch_add(&b, 3 + i + q, i, q, i == PROMPT - 1, &err);
    CHECK(whale_session_decode(s, &b, logits, &err) == WHALE_OK, "%s: prefill: %s", what, err.msg);
    for (int n = 1; n <= NSEQ; n++) {
        whale_dbatch_clear(&b);
        for (int q = 0; q < n; q++) whale_dbatch_add(&b, 5 + q, PROMPT, q, 1, &err);
        CHECK(whale_session_decode(s, &b, logits, &err) == WHALE_OK, "%s: %d rows: %s", what, n, err.msg);
        for (int q = 0; q < n; q++) whale_kv_seq_keep(s, q, PROMPT);
    }
out:
    whale_dbatch_free(&b);
    whale_session_free(s);
    free(logits);
    return regions - before;
}

static void check_model(whale_model *m, const char *name) {
    static const whale_dtype dts[] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
    static const char *names[] = {"fp32", "bf16", "fp16", "int8"};
    whale_err err;
    char what[96];
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "%s %s", name, names[i]);
        whale_set_threads(1);
        const long before = regions;
        CHECK(whale_model_set_dtype(m, dts[i], &err) == WHALE_OK, "%s: %s", what, err.msg);
        CHECK(regions == before, "%s: one thread: its compute copies entered %ld regions", what, regions - before);
        const long one = infer_regions(m, what);
        CHECK(one == 0, "%s: one thread: prefill and decode entered %ld regions", what, one);
        whale_set_threads(2);
        const long two = infer_regions(m, what);
        CHECK(two > 0, "%s: two threads: prefill and decode entered no region", what);
    }
}

/* Regions entered by each element-wise kernel over rows tokens of
 * nanowhale-100m's sizes; fails when one differs from want (0), or when
 * one enters none (want < 0). */
static void check_kernels(long rows, int want) {
    enum { D = 320, M = 4, NH = 8, HD = 96, R = 32, FF = 640 };
    float *x = calloc((size_t)rows * M * D, sizeof(float)), *y = calloc((size_t)rows * M * D, sizeof(float));
    float *o = calloc((size_t)rows * D, sizeof(float)), *w = calloc(D, sizeof(float));
    float *c = calloc((size_t)rows * (M + M * M + 1), sizeof(float)), *rs = calloc((size_t)rows, sizeof(float));
    float *cs = calloc((size_t)CTX * R / 2, sizeof(float)), *sn = calloc((size_t)CTX * R / 2, sizeof(float));
    int32_t *pos = calloc((size_t)rows, sizeof(int32_t));
    CHECK(x && y && o && w && c && rs && cs && sn && pos, "out of memory");
    if (!(x && y && o && w && c && rs && cs && sn && pos)) goto out;
    k_rope_table(cs, sn, CTX, R, 10000.0f);
    static const char *names[] = {"k_rmsnorm", "k_hc_rstd", "k_hc_reduce", "k_hc_expand", "k_rope", "k_swiglu"};
    long got[6], before = regions;
    for (int i = 0; i < 6; i++) {
        switch (i) {
        case 0: k_rmsnorm(o, x, w, rows, D, 1e-6f, rs); break;
        case 1: k_hc_rstd(rs, x, rows, M * D, 1e-6f); break;
        case 2: k_hc_reduce(o, x, c, rows, M, D); break;
        case 3: k_hc_expand(y, o, x, c, c + M, rows, M, D); break;
        case 4: k_rope(x, rows, NH * HD, NH, HD, R, pos, cs, sn, 0); break;
        default: k_swiglu(x, y, rows * 2 * FF, 0.0f); break;
        }
        got[i] = regions - before, before = regions;
        CHECK(want < 0 ? got[i] > 0 : got[i] == want, "%s over %ld tokens, two threads: %ld regions", names[i], rows,
              got[i]);
    }
out:
    free(x), free(y), free(o), free(w), free(c), free(rs), free(cs), free(sn), free(pos);
}

int main(void) {
    /* a region and moving data between cores assumed all but free
     * (core/par.h), so that the tiny models' int8 products still split at
     * two threads whatever they cost here; the element-wise kernels'
     * thresholds do not depend on them */
    setenv("WHALE_PAR_US", "0.001", 0);
    setenv("WHALE_PAR_MOVE_US", "0", 0);
    static const char *const dense[] = {"qwen2-tiny"};
    test_tiny_models(dense, 1, 5, check_model);
    whale_set_threads(2);
    check_kernels(1, 0);
    check_kernels(4096, -1);
    return test_finish("test_regions");
}
