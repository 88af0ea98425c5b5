/* Matrix products: oneDNN matmul primitives (cached) for real matrices, our
 * own AVX-512 kernels for products with few rows. The shape rules and the
 * measurements behind them are in gemm.h. In short:
 *  - oneDNN reaches ~200-230 GFLOP/s f32 from a few dozen rows up, but a
 *    product with a handful of rows costs it microseconds of overhead and,
 *    worse, it streams weights from DRAM at a third of the bandwidth our
 *    kernel gets, so decode uses our kernels.
 *  - oneDNN 2.6 only offers "gemm:jit" for primitives whose sizes are given
 *    at run time (brgemm refuses runtime dimensions). It is as fast as
 *    brgemm for large products and lets one primitive serve every shape,
 *    which is what a mixture-of-experts layer needs: its rows per expert
 *    change every call, and creating an exact primitive costs 0.1-0.3 ms.
 *  - bf16 weights (whale_gemm_nt_bf16) follow the same rules: oneDNN 2.6
 *    does offer runtime sizes for bf16 ("gemm:jit", as fast as brgemm).
 *  - fp16 and int8 weights: oneDNN 2.6 has no f16 matmul without
 *    AVX512-FP16 (primitive creation fails as unimplemented), and its int8
 *    matmul wants int8 activations. So few rows use our kernels (fp16 or int8
 *    weights widened to fp32 in registers), and more rows convert blocks of
 *    the operands into scratch buffers and run the f32 (fp16) or bf16 (int8
 *    weights, backward bf16) primitives on them (gemm_converted).
 *  The path depends on the shape only, never on call history, so a given
 *  call always produces the same bits.
 * The files: gemm_impl.h. */
#include "kernels/gemm_impl.h"
#include "core/par.h"
#include "whale_bench.h"

const char *const gemm_kind_names[KIND_COUNT] = {
    "nt",     "nn",     "tn",     "nt_bf16", "nn_bf16", "tn_bf16", "nt_f16",
    "nn_f16", "tn_f16", "nt_q8",  "nn_b16",  "tn_b16",  "nn_q8",   "nt_a8"};

/* ------------------------------------------------------------ scratch */

/* Room for n elements of `size` bytes in a scratch buffer: the only
 * allocations of the products, made once per new maximum size. */
whale_code gemm_scratch_reserve(scratch *sc, size_t n, size_t size, const gemm_call *c, whale_err *err) {
    size_t bytes;
    if (!whale_mul_size(n, size, &bytes)) bytes = SIZE_MAX;
    if (bytes <= sc->bytes) return WHALE_OK;
    void *p = whale_alloc(bytes);
    if (!p)
        return whale_errf(err, WHALE_ERR_NOMEM,
                          "gemm %s M=%d N=%d K=%d: cannot allocate %zu bytes of scratch",
                          gemm_kind_names[c->s.kind], c->s.M, c->s.N, c->s.K, bytes);
    free(sc->p);
    sc->p = p;
    sc->bytes = bytes;
    return WHALE_OK;
}
/* Does oneDNN compute the bf16 products at the active tier? Where its bf16
 * products are fast: on AMX tiles, or with AVX512_BF16 on a processor whose
 * vdpbf16ps outpaces its fp32 FMAs (whale_cpu_bf16_dot_fast). Elsewhere
 * every bf16 product is an f32 one on blocks of its operands widened
 * exactly (rounded first where they come in fp32): the same products,
 * summed in another order, and bf16 subnormals kept. oneDNN 2.6 has bf16
 * matmul from avx512_core up, but below AVX512_BF16 it emulates the dot
 * products, and Intel's vdpbf16ps without AMX is slow: on a Sapphire
 * Rapids class Xeon without AMX, 2 threads, `bench_gemm --shape nt_bf16
 * 512 4864 896` took 102 ms emulated (WHALE_ISA=avx512) and 31-54 ms on
 * vdpbf16ps, against 19-21 ms as f32 products of the widened blocks;
 * Qwen2.5-0.5B's bf16 prefill of 512 tokens 175-180 -> 231-257 tokens/s
 * and nanowhale-100m's bf16 training step 334-346 -> 396-530 tokens/s. */
int whale_gemm_bf16_native(void) {
    return whale_isa_at_least(WHALE_ISA_AMX) || (whale_isa_at_least(WHALE_ISA_AVX512_BF16) && whale_cpu_bf16_dot_fast());
}
static int dnnl_bf16_ok; /* set with oneDNN's cap (whale_gemm_new): it runs at avx512_core or above */
static int dnnl_has_bf16(void) { return dnnl_bf16_ok && whale_gemm_bf16_native(); }
int gemm_dnnl_has_bf16(void) { return dnnl_has_bf16(); }

/* The path of the f32 products standing in for bf16 ones: forced own
 * kernels stay forced, the rest follows the caller's choice. */
static whale_gemm_path f32_standin(whale_gemm_path p) { return own_path(p) ? WHALE_GEMM_OWN : p; }

/* Where exact-shape primitives stop paying, by tier (bench_gemm --sweep,
 * --sweep-bf16 and --moe; the figures are in docs/architecture.md: Zen 4
 * for avx512_bf16 and the tiers below, an AMX Xeon for amx, a Zen 5-class
 * EPYC for the nt limits of avx512 (capped there) and avx512_bf16 and for
 * avx2's nn/tn limit).
 * Where the bf16 products are f32 ones (dnnl_has_bf16), only the f32
 * rule applies. */
static const whale_gemm_rules tier_rules[WHALE_ISA_COUNT] = {
    [WHALE_ISA_BASE] = {16, 4, 256, 256, 64},
    [WHALE_ISA_AVX2] = {16, 1, 256, 256, 64},
    [WHALE_ISA_AVX512] = {32, 4, 256, 256, 64},
    [WHALE_ISA_AVX512_BF16] = {24, 4, 256, 256, 64},
    [WHALE_ISA_AMX] = {16, 4, 256, 4096, 64},
};

const whale_gemm_rules *whale_gemm_rules_for(whale_isa t) {
    return &tier_rules[(unsigned)t < WHALE_ISA_COUNT ? t : WHALE_ISA_BASE];
}

static const whale_gemm_rules *rules(void) { return whale_gemm_rules_for(whale_isa_active()); }

/* The oneDNN choice for bf16 operands under WHALE_GEMM_AUTO. */
whale_gemm_path gemm_bf16_auto(int kind, int M) {
    if (kind == KIND_NT_BF16)
        return M < rules()->bf16_exact_below_m_nt ? WHALE_GEMM_DNNL_EXACT : WHALE_GEMM_DNNL_RUNTIME;
    return M < rules()->bf16_exact_below_m_nn ? WHALE_GEMM_DNNL_EXACT : WHALE_GEMM_DNNL_RUNTIME;
}

/* ------------------------------------------------------------ per-kind routing */


/* A bf16 nt product, already validated (M, N, K > 0). */
static whale_code gemm_bf16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const gemm_key *s = &c->s;
    whale_gemm_path path = g->path;
    if (path == WHALE_GEMM_AUTO)
        path = s->M <= rules()->own_max_m_nt ? WHALE_GEMM_OWN : gemm_bf16_auto(KIND_NT_BF16, s->M);
    if (own_path(path)) {
        sk_kind k;
        int portable;
        gemm_sk_choose(g, KIND_NT_BF16, s->M, &k, &portable);
        return gemm_own_nt(g, c, 1, k, portable, err);
    }
    if (!dnnl_has_bf16())
        return gemm_converted(g, c, KIND_NT, g->path, CV_F32_BF16R, CV_BF16_F32, "cvt_bf16", err);
    /* oneDNN takes A in bf16: round it into the dense scratch first */
    const size_t K = (size_t)s->K;
    whale_code rc = gemm_scratch_reserve(&g->sa, (size_t)s->M * K, sizeof(uint16_t), c, err);
    if (rc) return rc;
    uint16_t *A16 = g->sa.p;
    const float *A = c->A;
    const int M = s->M;
    const size_t lda = (size_t)s->lda;
    const int par = (double)M * K >= OWN_PARALLEL_MIN_WORK;
    WHALE_FOR_IF(par, (int m = 0; m < M; m++), { whale_f32_to_bf16_rows(A16 + m * K, A + m * lda, K); });
    gemm_call d = *c;
    d.s.lda = s->K;
    d.A = A16;
    return gemm_dnnl_run(g, &d, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* nt with fp16 weights: our kernel for few rows, else f32 oneDNN on blocks
 * of W widened to f32 and A rounded to fp16 (values kept as f32). */
static whale_code gemm_nt_f16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    sk_kind k;
    int portable;
    if (gemm_sk_choose(g, KIND_NT_F16, c->s.M, &k, &portable)) return gemm_own_nt(g, c, 1, k, portable, err);
    return gemm_converted(g, c, KIND_NT, g->path, CV_F32_F16R, CV_F16_F32, "cvt_f16", err);
}

/* nt with int8 weights: our kernel for few rows (the vdpbf16ps one with
 * AVX512_BF16 + VBMI, else fp32 FMAs), else bf16 oneDNN on chunks of W
 * converted exactly to bf16 by the threads (gemm_nt_q8_chunks), or on
 * blocks of W, then the scales, when K is too deep or the path forced. */
static whale_code gemm_nt_q8(whale_gemm *g, const gemm_call *c, whale_err *err) {
    sk_kind k;
    int portable;
    if (gemm_sk_choose(g, KIND_NT_Q8, c->s.M, &k, &portable)) return gemm_own_nt(g, c, 1, k, portable, err);
    if (!dnnl_has_bf16())
        return gemm_converted(g, c, KIND_NT, g->path, CV_F32_BF16R, CV_I8_F32, "cvt_q8", err);
    int done = 0;
    whale_code rc = g->path == WHALE_GEMM_AUTO ? gemm_nt_q8_chunks(g, c, &done, err) : WHALE_OK;
    if (rc || done) return rc;
    return gemm_converted(g, c, KIND_NT_BF16, g->path, CV_F32_BF16, CV_I8_BF16, "cvt_q8", err);
}

/* nn with int8 B and B's row scales: oneDNN bf16 on blocks of A times the
 * scales rounded to bf16 and of B converted exactly to bf16; forced OWN:
 * our f32 kernels on the same values kept as f32. */
static whale_code gemm_nn_q8(whale_gemm *g, const gemm_call *c, whale_err *err) {
    if (own_path(g->path) || !dnnl_has_bf16())
        return gemm_converted(g, c, KIND_NN, f32_standin(g->path), CV_F32S_BF16R, CV_I8_F32,
                              "cvt_q8", err);
    return gemm_converted(g, c, KIND_NN_BF16, g->path, CV_F32S_BF16, CV_I8_BF16, "cvt_q8", err);
}

/* nn / tn with bf16 operands: oneDNN bf16 on A (and B for tn) rounded to
 * bf16 in blocks; forced OWN: our f32 kernels on the operands rounded to
 * bf16 and kept as f32 (the same products, summed in another order). */
static whale_code gemm_nn_tn_bf16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const int L = layout(c->s.kind);
    if (own_path(g->path) || !dnnl_has_bf16())
        return gemm_converted(g, c, L, f32_standin(g->path), CV_F32_BF16R,
                              L == KIND_NN ? CV_BF16_F32 : CV_F32_BF16R, "cvt_bf16", err);
    return gemm_converted(g, c, c->s.kind, g->path, CV_F32_BF16,
                          L == KIND_NN ? CV_NONE : CV_F32_BF16, NULL, err);
}

/* nn / tn with both operands already bf16: oneDNN on them as they are (no
 * conversion, no blocks; the shape rules of nn_bf16 / tn_bf16). Forced OWN:
 * our f32 kernels on blocks widened to f32 (exactly). */
static whale_code gemm_b16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const int L = layout(c->s.kind);
    if (own_path(g->path) || !dnnl_has_bf16())
        return gemm_converted(g, c, L, f32_standin(g->path), CV_BF16_F32, CV_BF16_F32, "cvt_bf16",
                              err);
    gemm_call d = *c;
    d.s.kind = L == KIND_NN ? KIND_NN_BF16 : KIND_TN_BF16;
    const whale_gemm_path path = g->path == WHALE_GEMM_AUTO ? gemm_bf16_auto(d.s.kind, c->s.M) : g->path;
    return gemm_dnnl_run(g, &d, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* nn / tn with fp16 operands: the f32 products (with their own routing) on
 * blocks rounded to fp16 or widened from fp16. */
static whale_code gemm_nn_tn_f16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const int L = layout(c->s.kind);
    const whale_gemm_path path = own_path(g->path) ? WHALE_GEMM_OWN : g->path;
    return gemm_converted(g, c, L, path, CV_F32_F16R, L == KIND_NN ? CV_F16_F32 : CV_F32_F16R,
                          "cvt_f16", err);
}

/* ------------------------------------------------------------ dispatch */

/* An f32 product, already validated (M, N, K > 0). */
whale_code gemm_f32(whale_gemm *g, const gemm_call *c, whale_gemm_path path, whale_err *err) {
    const gemm_key *s = &c->s;
    if (path == WHALE_GEMM_OWN_PORTABLE) path = WHALE_GEMM_OWN;
    if (path == WHALE_GEMM_AUTO) {
        if (s->kind == KIND_NT)
            path = s->M <= rules()->own_max_m_nt  ? WHALE_GEMM_OWN
                   : s->M < rules()->exact_below_m_nt ? WHALE_GEMM_DNNL_EXACT
                                                        : WHALE_GEMM_DNNL_RUNTIME;
        else
            path = s->M <= rules()->own_max_m_nn ? WHALE_GEMM_OWN : WHALE_GEMM_DNNL_RUNTIME;
    }
    if (path == WHALE_GEMM_OWN) {
        if (s->kind == KIND_NT) return gemm_own_nt(g, c, 1, SK_F32, 0, err);
        gemm_own_nn_tn(c);
        snprintf(g->last_impl, sizeof g->last_impl, "whale:skinny_%s", gemm_kind_names[s->kind]);
        g->stats.own_calls++;
        return WHALE_OK;
    }
    return gemm_dnnl_run(g, c, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* Are c's sizes, strides and pointers consistent? */
static whale_code gemm_check(const whale_gemm *g, const gemm_call *c, whale_err *err) {
    const gemm_key *s = &c->s;
    const char *kn = gemm_kind_names[s->kind];
    if (!g) return whale_errf(err, WHALE_ERR_ARG, "gemm %s: no whale_gemm object", kn);
    if (s->M < 0 || s->N < 0 || s->K < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: negative size M=%d N=%d K=%d", kn, s->M,
                          s->N, s->K);
    /* Row lengths the leading dimensions must cover. */
    const int L = layout(s->kind);
    const int a_row = L == KIND_TN ? s->M : s->K;
    const int is_nt = L == KIND_NT;
    const int b_row = is_nt ? s->K : s->N;
    const char *b_name = is_nt ? "ldw" : "ldb";
    if (s->lda < a_row || s->lda < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: lda=%d smaller than the row of A (%d)",
                          kn, s->lda, a_row);
    if (s->ldb < b_row || s->ldb < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: %s=%d smaller than the row of %s (%d)",
                          kn, b_name, s->ldb, is_nt ? "W" : "B", b_row);
    if (s->ldc < s->N)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: ldc=%d smaller than N=%d", kn, s->ldc,
                          s->N);
    if (s->M == 0 || s->N == 0) return WHALE_OK;
    if (!c->C) return whale_errf(err, WHALE_ERR_ARG, "gemm %s: C is NULL", kn);
    if (s->K == 0) return WHALE_OK;
    if (!c->A || !c->B)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: %s is NULL", kn,
                          !c->A ? "A" : is_nt ? "W" : "B");
    if ((s->kind == KIND_NT_Q8 || s->kind == KIND_NN_Q8 || s->kind == KIND_NT_A8) && !c->scale)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: scale is NULL", kn);
    return WHALE_OK;
}

/* A checked product with nothing to multiply (M, N or K zero) is done here:
 * K = 0 is an empty sum. */
static int gemm_trivial(whale_gemm *g, const gemm_call *c) {
    const gemm_key *s = &c->s;
    if (s->M == 0 || s->N == 0) return 1;
    if (s->K) return 0;
    if (!s->acc)
        for (int m = 0; m < s->M; m++) memset(c->C + (size_t)m * s->ldc, 0, (size_t)s->N * sizeof(float));
    snprintf(g->last_impl, sizeof g->last_impl, "whale:empty");
    return 1;
}

static whale_code gemm(whale_gemm *g, const gemm_call *c, whale_err *err) {
    whale_code rc = gemm_check(g, c, err);
    if (rc || gemm_trivial(g, c)) return rc;
    switch (c->s.kind) {
    case KIND_NT_BF16: return gemm_bf16(g, c, err);
    case KIND_NN_BF16:
    case KIND_TN_BF16: return gemm_nn_tn_bf16(g, c, err);
    case KIND_NT_F16: return gemm_nt_f16(g, c, err);
    case KIND_NN_F16:
    case KIND_TN_F16: return gemm_nn_tn_f16(g, c, err);
    case KIND_NT_Q8: return gemm_nt_q8(g, c, err);
    case KIND_NN_Q8: return gemm_nn_q8(g, c, err);
    case KIND_NN_B16:
    case KIND_TN_B16: return gemm_b16(g, c, err);
    default: return gemm_f32(g, c, g->path, err);
    }
}

static whale_code gemm_kind(whale_gemm *g, int kind, int M, int N, int K, const void *A, int lda,
                            const void *B, int ldb, float *C, int ldc, int accumulate,
                            whale_err *err) {
    gemm_call c = {{kind, accumulate ? 1 : 0, M, N, K, lda, ldb, ldc}, A, B, C, NULL};
    return gemm(g, &c, err);
}

whale_code whale_gemm_nt(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *W, int ldw, float *C, int ldc, int accumulate,
                         whale_err *err) {
    return gemm_kind(g, KIND_NT, M, N, K, A, lda, W, ldw, C, ldc, accumulate, err);
}

whale_code whale_gemm_nn(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, int accumulate,
                         whale_err *err) {
    return gemm_kind(g, KIND_NN, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_tn(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, int accumulate,
                         whale_err *err) {
    return gemm_kind(g, KIND_TN, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_nt_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const uint16_t *W, int ldw, float *C, int ldc, int accumulate,
                              whale_err *err) {
    return gemm_kind(g, KIND_NT_BF16, M, N, K, A, lda, W, ldw, C, ldc, accumulate, err);
}

whale_code whale_gemm_nn_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                              whale_err *err) {
    return gemm_kind(g, KIND_NN_BF16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_tn_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const float *B, int ldb, float *C, int ldc, int accumulate,
                              whale_err *err) {
    return gemm_kind(g, KIND_TN_BF16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_nn_b16(whale_gemm *g, int M, int N, int K, const uint16_t *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_NN_B16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_tn_b16(whale_gemm *g, int M, int N, int K, const uint16_t *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_TN_B16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_nt_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const uint16_t *W, int ldw, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_NT_F16, M, N, K, A, lda, W, ldw, C, ldc, accumulate, err);
}

whale_code whale_gemm_nn_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_NN_F16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_tn_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const float *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_TN_F16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_nt_q8(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                            const int8_t *W, int ldw, const float *scale, float *C, int ldc,
                            int accumulate, whale_err *err) {
    gemm_call c = {{KIND_NT_Q8, accumulate ? 1 : 0, M, N, K, lda, ldw, ldc}, A, W, C, scale};
    return gemm(g, &c, err);
}

/* ---- W8A8 (gemm_a8.c) ---- */

static gemm_call a8_call(int M, int N, int K, const float *A, int lda, const uint8_t *Wp, const float *scale,
                         float *C, int ldc, int accumulate) {
    /* the packed W has no row stride: ldw = K passes the check */
    return (gemm_call){{KIND_NT_A8, accumulate ? 1 : 0, M, N, K, lda, K, ldc}, A, Wp, C, scale};
}

static whale_code a8_row0_check(int row0, whale_err *err) {
    if (row0 < 0 || row0 > 15)
        return whale_errf(err, WHALE_ERR_ARG, "gemm nt_a8: row0=%d outside its panel (0..15)", row0);
    return WHALE_OK;
}

whale_code whale_gemm_nt_a8(whale_gemm *g, int M, int N, int K, const float *A, int lda, const uint8_t *Wp,
                            int row0, const float *scale, float *C, int ldc, int accumulate, whale_err *err) {
    const gemm_call c = a8_call(M, N, K, A, lda, Wp, scale, C, ldc, accumulate);
    whale_code rc = gemm_check(g, &c, err);
    if (!rc) rc = a8_row0_check(row0, err);
    if (rc || gemm_trivial(g, &c)) return rc;
    return gemm_nt_a8(g, &c, row0, err);
}

whale_code whale_gemm_nt_a8_parts(whale_gemm *g, int K, int n, const whale_a8_part *parts, int accumulate,
                                  whale_err *err) {
    if (n < 0 || n > SK_PARTS_MAX || (n && !parts))
        return whale_errf(err, WHALE_ERR_ARG, "gemm nt_a8_parts: %d parts (at most %d)%s", n, SK_PARTS_MAX,
                          n > 0 && !parts ? " at NULL" : "");
    gemm_call c[SK_PARTS_MAX];
    int row0[SK_PARTS_MAX], m = 0;
    for (int i = 0; i < n; i++) { /* all checked before any is computed */
        const whale_a8_part *p = &parts[i];
        const gemm_call ci = a8_call(p->M, p->N, K, p->A, p->lda, p->W, p->scale, p->C, p->ldc, accumulate);
        whale_code rc = gemm_check(g, &ci, err);
        if (!rc) rc = a8_row0_check(p->row0, err);
        if (rc) return rc;
        if (gemm_trivial(g, &ci)) continue; /* nothing to multiply (K = 0: C zeroed or kept) */
        c[m] = ci;
        row0[m++] = p->row0;
    }
    return m ? gemm_nt_a8_parts(g, c, row0, m, err) : WHALE_OK;
}

/* Part p of a whale_gemm_nt_parts call as a gemm_call. */
static gemm_call part_call(int kind, int K, int accumulate, const whale_nt_part *p) {
    return (gemm_call){{kind, accumulate ? 1 : 0, p->M, p->N, K, p->lda, p->ldw, p->ldc}, p->A, p->W, p->C, p->scale};
}

whale_code whale_gemm_nt_parts(whale_gemm *g, whale_dtype wtype, int K, int n, const whale_nt_part *parts,
                               int accumulate, whale_err *err) {
    const int kind = wtype == WHALE_F32    ? KIND_NT
                     : wtype == WHALE_BF16 ? KIND_NT_BF16
                     : wtype == WHALE_F16  ? KIND_NT_F16
                     : wtype == WHALE_I8   ? KIND_NT_Q8
                                           : -1;
    if (kind < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm nt_parts: no product for %s weights", whale_dtype_name(wtype));
    if (n < 0 || (n && !parts))
        return whale_errf(err, WHALE_ERR_ARG, "gemm nt_parts: %d parts%s", n, n > 0 ? " at NULL" : "");
    for (int i = 0; i < n; i++) { /* all checked before any is computed */
        const gemm_call c = part_call(kind, K, accumulate, &parts[i]);
        whale_code rc = gemm_check(g, &c, err);
        if (rc) return rc;
    }
    gemm_call own[SK_PARTS_MAX];
    int n_own = 0, portable = 0;
    sk_kind k = SK_F32;
    for (int i = 0; i < n; i++) {
        const gemm_call c = part_call(kind, K, accumulate, &parts[i]);
        whale_code rc = WHALE_OK;
        if (gemm_trivial(g, &c)) continue;
        if (n_own < SK_PARTS_MAX && gemm_sk_choose(g, kind, c.s.M, &k, &portable)) own[n_own++] = c;
        else if ((rc = gemm(g, &c, err))) return rc;
    }
    return n_own ? gemm_own_nt(g, own, n_own, k, portable, err) : WHALE_OK;
}

whale_code whale_gemm_nn_q8(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                            const int8_t *B, int ldb, const float *scale, float *C, int ldc,
                            int accumulate, whale_err *err) {
    gemm_call c = {{KIND_NN_Q8, accumulate ? 1 : 0, M, N, K, lda, ldb, ldc}, A, B, C, scale};
    return gemm(g, &c, err);
}

/* ------------------------------------------------------------ int8 weights */

whale_code whale_gemm_nn_q8p(whale_gemm *g, int M, int N, int K, const float *A, int lda, const uint8_t *Bp,
                             int row0, const float *scale, float *C, int ldc, int accumulate, whale_err *err) {
    enum { ROWS = 1024 }; /* rows of B unpacked at a time */
    const gemm_call c = {{KIND_NN_Q8, accumulate ? 1 : 0, M, N, K, lda, N, ldc}, A, Bp, C, scale};
    whale_code rc = gemm_check(g, &c, err);
    if (!rc && (row0 < 0 || row0 > 15))
        rc = whale_errf(err, WHALE_ERR_ARG, "gemm nn_q8p: row0=%d outside its panel (0..15)", row0);
    if (rc || gemm_trivial(g, &c)) return rc;
    const int rows = K < ROWS ? K : ROWS;
    if ((rc = gemm_scratch_reserve(&g->sd, (size_t)rows * N, 1, &c, err))) return rc;
    for (int k0 = 0; k0 < K && !rc; k0 += ROWS) {
        const int kk = K - k0 < ROWS ? K - k0 : ROWS;
        whale_q8p_unpack(g->sd.p, N, Bp, row0 + k0, kk, N);
        rc = whale_gemm_nn_q8(g, M, N, kk, A + k0, lda, g->sd.p, N, scale + k0, C, ldc, accumulate || k0, err);
    }
    return rc;
}

void whale_quantize_q8_rows(int8_t *q, float *scale, const float *W, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    const int par = (double)rows * cols >= OWN_PARALLEL_MIN_WORK;
    WHALE_FOR_IF(par, (int r = 0; r < rows; r++), {
        const float *w = W + (size_t)r * cols;
        const float s = q8_row_scale(w, cols);
        scale[r] = s;
        for (int i = 0; i < cols; i++) q[(size_t)r * cols + i] = q8_value(w[i], s);
    });
}

void whale_q8p_quantize(uint8_t *dst, float *scale, const float *W, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    const size_t kp = ((size_t)cols + WHALE_A8_BLOCK - 1) / WHALE_A8_BLOCK * WHALE_A8_BLOCK;
    const int panels = (rows + 15) / 16;
    const int par = (double)rows * cols >= OWN_PARALLEL_MIN_WORK;
    WHALE_FOR_IF(par, (int p = 0; p < panels; p++), {
        uint8_t *o = dst + (size_t)p * 16 * kp;
        memset(o, 128, 16 * kp); /* padding: zeros */
        for (int r = 0; r < 16 && p * 16 + r < rows; r++) {
            const float *w = W + (size_t)(p * 16 + r) * cols;
            const float s = q8_row_scale(w, cols);
            scale[p * 16 + r] = s;
            for (int k = 0; k < cols; k++) o[(size_t)k / 4 * 64 + (size_t)r * 4 + k % 4] = (uint8_t)(q8_value(w[k], s) + 128);
        }
    });
}

/* ------------------------------------------------------------ object */

/* oneDNN's instruction cap, set once before its first primitive: the
 * active tier's instructions, when WHALE_ISA caps them below what the
 * processor has. oneDNN's own DNNL_MAX_CPU_ISA, when set, is left as the
 * user set it. Either way what oneDNN then really uses decides whether it
 * has bf16 products (dnnl_bf16_ok). */
static pthread_once_t dnnl_isa_once = PTHREAD_ONCE_INIT;
static int dnnl_isa_refused; /* oneDNN runs above the cap */

/* Is oneDNN ISA a at most b? (The enum values are nested bit sets.) */
static int dnnl_isa_within(dnnl_cpu_isa_t a, dnnl_cpu_isa_t b) { return ((unsigned)a & ~(unsigned)b) == 0; }

static void dnnl_isa_cap(void) {
    static const dnnl_cpu_isa_t cap[WHALE_ISA_COUNT] = {
        dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core,
        dnnl_cpu_isa_avx512_core_bf16, dnnl_cpu_isa_avx512_core_amx};
    const whale_isa t = whale_isa_active();
    const char *env = getenv("DNNL_MAX_CPU_ISA");
    if (t < whale_isa_detected() && !(env && *env)) (void)dnnl_set_max_cpu_isa(cap[t]);
    const dnnl_cpu_isa_t eff = dnnl_get_effective_cpu_isa();
    dnnl_isa_refused = t < whale_isa_detected() && !dnnl_isa_within(eff, cap[t]);
    dnnl_bf16_ok = dnnl_isa_within(dnnl_cpu_isa_avx512_core, eff);
}

whale_code whale_gemm_new(whale_gemm **out, whale_err *err) {
    *out = NULL;
    whale_code rc = whale_isa_init(err);
    if (rc) return rc;
    pthread_once(&dnnl_isa_once, dnnl_isa_cap);
    if (dnnl_isa_refused)
        return whale_errf(err, WHALE_ERR_INTERNAL,
                          "gemm: oneDNN runs above the instruction cap WHALE_ISA=%s (it was used before this "
                          "library, or DNNL_MAX_CPU_ISA asks for more)",
                          whale_isa_name(whale_isa_active()));
    whale_gemm *g = calloc(1, sizeof *g);
    if (!g) return whale_errf(err, WHALE_ERR_NOMEM, "gemm: cannot allocate the context");
    dnnl_status_t st = dnnl_engine_create(&g->engine, dnnl_cpu, 0);
    if (st != dnnl_success) {
        free(g);
        return whale_errf(err, WHALE_ERR_INTERNAL, "gemm: oneDNN engine_create failed: %s",
                          dnnl_status2str(st));
    }
    st = dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        dnnl_engine_destroy(g->engine);
        free(g);
        return whale_errf(err, WHALE_ERR_INTERNAL, "gemm: oneDNN stream_create failed: %s",
                          dnnl_status2str(st));
    }
    snprintf(g->last_impl, sizeof g->last_impl, "none");
    *out = g;
    return WHALE_OK;
}

void whale_gemm_free(whale_gemm *g) {
    if (!g) return;
    for (int i = 0; i < WHALE_GEMM_CACHE_CAP; i++)
        if (g->cache[i].used) gemm_entry_clear(&g->cache[i]);
    free(g->sa.p);
    free(g->sb.p);
    free(g->sc.p);
    free(g->sd.p);
    for (int i = 0; i < g->n_thread_stream; i++) dnnl_stream_destroy(g->thread_stream[i]);
    free(g->thread_stream);
    dnnl_stream_destroy(g->stream);
    dnnl_engine_destroy(g->engine);
    free(g);
}

void whale_gemm_set_path(whale_gemm *g, whale_gemm_path path) { g->path = path; }

void whale_gemm_set_block_limits(whale_gemm *g, int max_mn, size_t scratch_bytes) {
    g->block_mn = max_mn > 0 ? max_mn : 0;
    g->block_bytes = scratch_bytes;
}

const char *whale_gemm_last_impl(const whale_gemm *g) { return g->last_impl; }

void whale_gemm_get_stats(const whale_gemm *g, whale_gemm_stats *st) {
    *st = g->stats;
    st->cached = 0;
    for (int i = 0; i < WHALE_GEMM_CACHE_CAP; i++) st->cached += g->cache[i].used;
}

