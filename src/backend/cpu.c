/* The "cpu" backend: the optimised kernels of src/kernels behind the
 * backend table. Buffers are host memory, ops run at once (sync has
 * nothing to wait for); ctx is the GEMM primitive cache. */
#include "backend/backend.h"

#include "core/core.h"
#include "core/par.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/hc.h"
#include "kernels/ops.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define GEMM(be) ((whale_gemm *)(be)->ctx)

static void cpu_close(whale_backend *be) {
    whale_gemm_free(GEMM(be));
    free(be);
}

static void *cpu_alloc(whale_backend *be, size_t bytes) {
    (void)be;
    return whale_alloc(bytes ? bytes : 64);
}
static void cpu_free(whale_backend *be, void *buf) { (void)be, free(buf); }
static void cpu_zero(whale_backend *be, void *buf, size_t bytes) { (void)be, memset(buf, 0, bytes); }
static void cpu_copy(whale_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}
static whale_code cpu_sync(whale_backend *be, whale_err *err) { return (void)be, (void)err, WHALE_OK; }

static whale_code cpu_matmul_nt(whale_backend *be, int M, int N, int K, const float *A, int lda, whale_wref W,
                                float *C, int ldc, int acc, whale_err *err) {
    assert(M >= 0 && N >= 0 && K >= 0 && (M <= 1 || ldc >= N)); /* C[M,N] = A[M,K] · W[N,K]ᵀ */
    switch (W.format) {
    case WHALE_F32: return whale_gemm_nt(GEMM(be), M, N, K, A, lda, W.data, W.ld, C, ldc, acc, err);
    case WHALE_BF16: return whale_gemm_nt_bf16(GEMM(be), M, N, K, A, lda, W.data, W.ld, C, ldc, acc, err);
    case WHALE_F16: return whale_gemm_nt_f16(GEMM(be), M, N, K, A, lda, W.data, W.ld, C, ldc, acc, err);
    case WHALE_I8: return whale_gemm_nt_a8(GEMM(be), M, N, K, A, lda, W.data, W.row0, W.scale, C, ldc, acc, err);
    default: return whale_errf(err, WHALE_ERR_ARG, "no product with %s weights", whale_dtype_name(W.format));
    }
}

static whale_code cpu_matmul_nn(whale_backend *be, int M, int N, int K, const float *A, int lda, whale_wref B,
                                float *C, int ldc, int acc, whale_err *err) {
    assert(M >= 0 && N >= 0 && K >= 0 && (M <= 1 || ldc >= N)); /* C[M,N] = A[M,K] · B[K,N] */
    switch (B.format) {
    case WHALE_F32: return whale_gemm_nn(GEMM(be), M, N, K, A, lda, B.data, B.ld, C, ldc, acc, err);
    case WHALE_BF16: return whale_gemm_nn_bf16(GEMM(be), M, N, K, A, lda, B.data, B.ld, C, ldc, acc, err);
    case WHALE_F16: return whale_gemm_nn_f16(GEMM(be), M, N, K, A, lda, B.data, B.ld, C, ldc, acc, err);
    case WHALE_I8: return whale_gemm_nn_q8p(GEMM(be), M, N, K, A, lda, B.data, B.row0, B.scale, C, ldc, acc, err);
    default: return whale_errf(err, WHALE_ERR_ARG, "no product with %s weights", whale_dtype_name(B.format));
    }
}

static whale_code cpu_matmul_tn(whale_backend *be, whale_dtype products, int M, int N, int K, const float *A,
                                int lda, const float *B, int ldb, float *C, int ldc, int acc, whale_err *err) {
    assert(M >= 0 && N >= 0 && K >= 0);
    switch (products) {
    case WHALE_F32: return whale_gemm_tn(GEMM(be), M, N, K, A, lda, B, ldb, C, ldc, acc, err);
    case WHALE_BF16: return whale_gemm_tn_bf16(GEMM(be), M, N, K, A, lda, B, ldb, C, ldc, acc, err);
    case WHALE_F16: return whale_gemm_tn_f16(GEMM(be), M, N, K, A, lda, B, ldb, C, ldc, acc, err);
    default: return whale_errf(err, WHALE_ERR_ARG, "no %s weight-gradient product", whale_dtype_name(products));
    }
}

static whale_code cpu_matmul_nt_parts(whale_backend *be, whale_dtype format, int K, int n, const whale_mm_part *parts,
                                      int acc, whale_err *err) {
    if (n > WHALE_MM_MAX_PARTS) return whale_errf(err, WHALE_ERR_ARG, "%d products in one call (at most %d)", n, WHALE_MM_MAX_PARTS);
    if (format == WHALE_I8) {
        whale_a8_part ap[WHALE_MM_MAX_PARTS];
        for (int i = 0; i < n; i++) {
            const whale_mm_part *p = &parts[i];
            ap[i] = (whale_a8_part){p->M, p->N, p->A, p->lda, p->W, p->row0, p->scale, p->C, p->ldc};
        }
        return whale_gemm_nt_a8_parts(GEMM(be), K, n, ap, acc, err);
    }
    whale_nt_part np[WHALE_MM_MAX_PARTS];
    for (int i = 0; i < n; i++) {
        const whale_mm_part *p = &parts[i];
        np[i] = (whale_nt_part){p->M, p->N, p->A, p->lda, p->W, p->ldw, p->scale, p->C, p->ldc};
    }
    return whale_gemm_nt_parts(GEMM(be), format, K, n, np, acc, err);
}

static void cpu_to_bf16(whale_backend *be, uint16_t *dst, const float *src, size_t n) {
    enum { BLOCK = 1 << 16 };
    (void)be;
    WHALE_FOR_IF(n > BLOCK, (size_t i = 0; i < n; i += BLOCK), {
        whale_f32_to_bf16_rows(dst + i, src + i, n - i < BLOCK ? n - i : BLOCK);
    });
}
static void cpu_from_bf16(whale_backend *be, float *dst, const uint16_t *src, size_t n) {
    (void)be, whale_bf16_to_f32(dst, src, n);
}

static whale_code cpu_matmul_nn_b16(whale_backend *be, int M, int N, int K, const uint16_t *A, int lda, whale_wref B,
                                    float *C, int ldc, int acc, whale_err *err) {
    if (B.format != WHALE_BF16) return whale_errf(err, WHALE_ERR_ARG, "a bf16 product with %s weights", whale_dtype_name(B.format));
    return whale_gemm_nn_b16(GEMM(be), M, N, K, A, lda, B.data, B.ld, C, ldc, acc, err);
}
static whale_code cpu_matmul_tn_b16(whale_backend *be, int M, int N, int K, const uint16_t *A, int lda,
                                    const uint16_t *B, int ldb, float *C, int ldc, int acc, whale_err *err) {
    return whale_gemm_tn_b16(GEMM(be), M, N, K, A, lda, B, ldb, C, ldc, acc, err);
}

/* row r of W as fp32 (the embedding lookup) */
static void row_to_f32(whale_wref W, int32_t r, int cols, float *out) {
    size_t at = (size_t)r * W.ld;
    switch (W.format) {
    case WHALE_BF16: whale_bf16_to_f32(out, (const uint16_t *)W.data + at, (size_t)cols); break;
    case WHALE_F16: whale_f16_to_f32(out, (const uint16_t *)W.data + at, (size_t)cols); break;
    case WHALE_I8: whale_q8p_row(out, W.data, W.row0 + r, cols, W.scale[r]); break;
    default: memcpy(out, (const float *)W.data + at, sizeof(float) * (size_t)cols);
    }
}
static void cpu_get_rows(whale_backend *be, float *dst, int ldd, whale_wref W, const int32_t *ids, long n, int cols) {
    (void)be;
    for (long i = 0; i < n; i++) {
        assert(ids[i] >= 0); /* the session checked every token against the vocabulary */
        row_to_f32(W, ids[i], cols, dst + (size_t)i * ldd);
    }
}
static void cpu_gather_rows(whale_backend *be, float *dst, const float *src, int ld, const int32_t *idx,
                            const float *w, long n, int cols) {
    (void)be, k_gather_rows(dst, src, ld, idx, w, n, cols);
}
static void cpu_gather_rows_bf16(whale_backend *be, uint16_t *dst, const float *src, int ld, const int32_t *idx,
                                 const float *w, long n, int cols) {
    (void)be;
    WHALE_FOR_IF(n > 64, (long i = 0; i < n; i++), {
        const float *x = src + (size_t)(idx ? idx[i] : i) * ld;
        uint16_t *y = dst + (size_t)i * cols;
        if (!w) {
            whale_f32_to_bf16_rows(y, x, (size_t)cols);
            continue;
        }
        float o[64]; /* w·x in fp32, then rounded */
        for (int d0 = 0; d0 < cols; d0 += 64) {
            int m = cols - d0 < 64 ? cols - d0 : 64;
            for (int j = 0; j < m; j++) o[j] = w[i] * x[d0 + j];
            whale_f32_to_bf16_rows(y + d0, o, (size_t)m);
        }
    });
}
static void cpu_scatter_add_rows(whale_backend *be, float *dst, int ldd, const float *src, int lds, const int32_t *idx,
                                 const float *w, long n, int cols) {
    (void)be, k_scatter_add_rows(dst, ldd, src, lds, idx, w, n, cols);
}
static void cpu_dot_rows(whale_backend *be, float *out, const float *A, int lda, const int32_t *ia, const float *B,
                         int ldb, const int32_t *ib, long n, int cols) {
    (void)be, k_dot_rows(out, A, lda, ia, B, ldb, ib, n, cols);
}
static void cpu_repeat_rows(whale_backend *be, float *dst, long rows, int times, int n) {
    (void)be;
    for (long r = 0; r < rows; r++)
        for (int j = 1; j < times; j++)
            memcpy(dst + ((size_t)r * times + j) * n, dst + (size_t)r * times * n, sizeof(float) * (size_t)n);
}
static void cpu_scale_rows_backward(whale_backend *be, float *dy, float *ds, const float *y, const float *sc, long rows,
                                    int n) {
    (void)be;
    WHALE_FOR_IF(rows > 64, (long r = 0; r < rows; r++), {
        float *d = dy + (size_t)r * n;
        const float *yr = y + (size_t)r * n;
        double acc = 0;
        for (int k = 0; k < n; k++) acc += (double)d[k] * yr[k];
        ds[r] = (float)(acc / sc[r]);
        for (int k = 0; k < n; k++) d[k] *= sc[r];
    });
}
static void cpu_swiglu_backward_bf16(whale_backend *be, uint16_t *dg16, uint16_t *du16, const float *dh, const float *g,
                                     const float *u, long n, float limit) {
    enum { BLK = 256 };
    (void)be;
    WHALE_FOR_IF(n > 65536, (long b0 = 0; b0 < n; b0 += BLK), {
        float tg[BLK], tu[BLK];
        int m = n - b0 < BLK ? (int)(n - b0) : BLK;
        k_swiglu_backward_block(tg, tu, dh + b0, g + b0, u + b0, m, limit);
        whale_f32_to_bf16_rows(dg16 + b0, tg, (size_t)m);
        whale_f32_to_bf16_rows(du16 + b0, tu, (size_t)m);
    });
}

static void cpu_rmsnorm(whale_backend *be, float *y, const float *x, const float *w, long rows, int n, float eps,
                        float *rstd) {
    (void)be, k_rmsnorm(y, x, w, rows, n, eps, rstd);
}
static void cpu_rmsnorm_backward(whale_backend *be, float *dx, float *dw, const float *dy, const float *x,
                                 const float *w, const float *rstd, long rows, int n) {
    (void)be, k_rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, n);
}
static void cpu_rope(whale_backend *be, float *x, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
                     const float *cos_t, const float *sin_t, int inverse) {
    (void)be, k_rope(x, rows, ld, nh, hd, R, pos, cos_t, sin_t, inverse);
}
static void cpu_rope_backward(whale_backend *be, float *dx, long rows, int ld, int nh, int hd, int R,
                              const int32_t *pos, const float *cos_t, const float *sin_t, int inverse) {
    (void)be, k_rope_backward(dx, rows, ld, nh, hd, R, pos, cos_t, sin_t, inverse);
}
static void cpu_swiglu(whale_backend *be, float *g, const float *u, long n, float limit) {
    (void)be, k_swiglu(g, u, n, limit);
}
static void cpu_swiglu_backward(whale_backend *be, float *dg, float *du, const float *dh, const float *g,
                                const float *u, long n, float limit) {
    (void)be, k_swiglu_backward(dg, du, dh, g, u, n, limit);
}
static void cpu_add(whale_backend *be, float *y, const float *a, const float *b, size_t n) {
    (void)be, k_add(y, a, b, n);
}
static void cpu_add_rows(whale_backend *be, float *y, const float *b, long rows, int n) {
    (void)be, k_add_rows(y, b, rows, n);
}
static void cpu_add_rows_backward(whale_backend *be, float *db, const float *dy, long rows, int n) {
    (void)be, k_add_rows_backward(db, dy, rows, n);
}

static size_t cpu_att_work(whale_backend *be, int max_ctx, int Hq, int Hkv, int Dh) {
    return (void)be, k_attention_work_floats(max_ctx, Hq, Hkv, Dh);
}
static size_t cpu_att_bwork(whale_backend *be, int max_ctx, int Hq, int Hkv, int Dh) {
    return (void)be, k_attention_backward_work_floats(max_ctx, Hq, Hkv, Dh);
}
static whale_code cpu_attention(whale_backend *be, float *out, const float *q, const float *k, const float *v,
                                int ldkv, const int32_t *seg, int S, int p0, int Hq, int Hkv, int Dh, float scale,
                                whale_dtype products, float *work, whale_err *err) {
    assert(S >= 0 && p0 >= 0 && Hkv > 0 && Hq % Hkv == 0 && ldkv >= Hkv * Dh);
    return k_attention(GEMM(be), out, q, k, v, ldkv, seg, S, p0, Hq, Hkv, Dh, scale, products, work, err);
}
static whale_code cpu_attention_backward(whale_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v, int ldkv, const int32_t *seg,
                                         int S, int p0, int Hq, int Hkv, int Dh, float scale, whale_dtype products,
                                         float *work, whale_err *err) {
    assert(S >= 0 && p0 >= 0 && Hkv > 0 && Hq % Hkv == 0 && ldkv >= Hkv * Dh);
    return k_attention_backward(GEMM(be), dq, dk, dv, dout, q, k, v, ldkv, seg, S, p0, Hq, Hkv, Dh, scale, products,
                                work, err);
}
/* the spans in runs of 64, k_attention_spans' region at most */
static whale_code cpu_attention_spans(whale_backend *be, const whale_att_span *spans, int n, int Hq, int Hkv, int Dh,
                                      float scale, whale_dtype products, float *work, whale_err *err) {
    assert(n >= 0 && Hkv > 0 && Hq % Hkv == 0);
    k_att_span ks[64];
    for (int i0 = 0; i0 < n; i0 += 64) {
        int m = n - i0 < 64 ? n - i0 : 64;
        for (int i = 0; i < m; i++) {
            const whale_att_span *sp = &spans[i0 + i];
            assert(sp->S >= 0 && sp->p0 >= 0 && sp->ldkv >= Hkv * Dh);
            ks[i] = (k_att_span){sp->out, sp->q, sp->k, sp->v, sp->ldkv, sp->seg, sp->S, sp->p0};
        }
        whale_code c = k_attention_spans(GEMM(be), ks, m, Hq, Hkv, Dh, scale, products, work, err);
        if (c) return c;
    }
    return WHALE_OK;
}

static void cpu_hc_coeffs(whale_backend *be, long T, float *mix, const float *rstd, const float *scale,
                          const float *base, int M, int iters, float eps, float *pre, float *post, float *comb) {
    (void)be;
    int nmix = (2 + M) * M;
    WHALE_FOR_IF(T > 64, (long t = 0; t < T; t++), {
        float *mx = mix + (size_t)t * nmix;
        for (int i = 0; i < nmix; i++) mx[i] *= rstd[t];
        k_hc_coeffs(mx, scale, base, M, iters, eps, pre + (size_t)t * M, post + (size_t)t * M,
                    comb + (size_t)t * M * M);
    });
}
static void cpu_hc_coeffs_backward(whale_backend *be, long T, const float *mix, const float *scale,
                                   const float *base, int M, int iters, float eps, const float *dpre,
                                   const float *dpost, const float *dcomb, float *dmix, float *dscale, float *dbase) {
    (void)be, k_hc_coeffs_backward_rows(mix, scale, base, M, iters, eps, dpre, dpost, dcomb, dmix, dscale, dbase, T);
}
static void cpu_hc_head_coeffs(whale_backend *be, long T, float *mix, const float *rstd, const float *scale,
                               const float *base, int M, float eps, float *pre) {
    (void)be;
    for (long t = 0; t < T; t++) {
        float *mx = mix + (size_t)t * M;
        for (int m = 0; m < M; m++) mx[m] *= rstd[t];
        k_hc_head_coeffs(mx, scale, base, M, eps, pre + (size_t)t * M);
    }
}
static void cpu_hc_head_coeffs_backward(whale_backend *be, long T, const float *mix, const float *scale,
                                        const float *base, int M, float eps, const float *dpre, float *dmix,
                                        float *dscale, float *dbase) {
    (void)be, k_hc_head_coeffs_backward_rows(mix, scale, base, M, eps, dpre, dmix, dscale, dbase, T);
}
static void cpu_hc_reduce(whale_backend *be, float *y, const float *X, const float *pre, long rows, int M, int D) {
    (void)be, k_hc_reduce(y, X, pre, rows, M, D);
}
static void cpu_hc_reduce_backward(whale_backend *be, float *dX, float *dpre, const float *dy, const float *X,
                                   const float *pre, long rows, int M, int D) {
    (void)be, k_hc_reduce_backward(dX, dpre, dy, X, pre, rows, M, D);
}
static void cpu_hc_expand(whale_backend *be, float *Xout, const float *o, const float *X, const float *post,
                          const float *comb, long rows, int M, int D) {
    (void)be, k_hc_expand(Xout, o, X, post, comb, rows, M, D);
}
static void cpu_hc_expand_backward(whale_backend *be, float *dout, float *dX, float *dpost, float *dcomb,
                                   const float *dXout, const float *o, const float *X, const float *post,
                                   const float *comb, long rows, int M, int D) {
    (void)be, k_hc_expand_backward(dout, dX, dpost, dcomb, dXout, o, X, post, comb, rows, M, D);
}
static void cpu_hc_rstd(whale_backend *be, float *rstd, const float *X, long rows, int MD, float eps) {
    (void)be, k_hc_rstd(rstd, X, rows, MD, eps);
}
static void cpu_rstd_backward(whale_backend *be, float *dx, const float *x, const float *rstd, const float *drstd,
                              long rows, int n) {
    (void)be, k_rstd_backward(dx, x, rstd, drstd, rows, n);
}

static void cpu_gate_route(whale_backend *be, long T, int scoring, int E, int K, float scale, const float *logit,
                           const float *bias, int32_t *idx, float *w) {
    (void)be;
    for (long t = 0; t < T; t++)
        k_gate_route(scoring, E, K, scale, logit + (size_t)t * E, bias, idx + (size_t)t * K, w + (size_t)t * K);
}
static void cpu_gate_route_backward(whale_backend *be, long T, int scoring, int E, int K, float scale,
                                    const float *logit, const int32_t *idx, const float *dw, float *dlogit) {
    (void)be;
    WHALE_FOR_IF(T > 64, (long t = 0; t < T; t++), {
        k_gate_route_backward(scoring, E, K, scale, logit + (size_t)t * E, idx + (size_t)t * K, dw + (size_t)t * K,
                              dlogit + (size_t)t * E);
    });
}

static const whale_backend cpu_table = {
    .version = WHALE_BACKEND_VERSION,
    .name = "cpu",
    .close = cpu_close,
    .buf_alloc = cpu_alloc,
    .buf_free = cpu_free,
    .buf_zero = cpu_zero,
    .buf_copy = cpu_copy,
    .buf_to_host = cpu_copy,
    .buf_from_host = cpu_copy,
    .sync = cpu_sync,
    .matmul_nt = cpu_matmul_nt,
    .matmul_nn = cpu_matmul_nn,
    .matmul_tn = cpu_matmul_tn,
    .matmul_nt_parts = cpu_matmul_nt_parts,
    .matmul_nn_b16 = cpu_matmul_nn_b16,
    .matmul_tn_b16 = cpu_matmul_tn_b16,
    .get_rows = cpu_get_rows,
    .gather_rows = cpu_gather_rows,
    .gather_rows_bf16 = cpu_gather_rows_bf16,
    .scatter_add_rows = cpu_scatter_add_rows,
    .dot_rows = cpu_dot_rows,
    .repeat_rows = cpu_repeat_rows,
    .scale_rows_backward = cpu_scale_rows_backward,
    .swiglu_backward_bf16 = cpu_swiglu_backward_bf16,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .rmsnorm = cpu_rmsnorm,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope = cpu_rope,
    .rope_backward = cpu_rope_backward,
    .swiglu = cpu_swiglu,
    .swiglu_backward = cpu_swiglu_backward,
    .add = cpu_add,
    .add_rows = cpu_add_rows,
    .add_rows_backward = cpu_add_rows_backward,
    .attention_work_floats = cpu_att_work,
    .attention_backward_work_floats = cpu_att_bwork,
    .attention = cpu_attention,
    .attention_backward = cpu_attention_backward,
    .hc_coeffs = cpu_hc_coeffs,
    .hc_coeffs_backward = cpu_hc_coeffs_backward,
    .hc_head_coeffs = cpu_hc_head_coeffs,
    .hc_head_coeffs_backward = cpu_hc_head_coeffs_backward,
    .hc_reduce = cpu_hc_reduce,
    .hc_reduce_backward = cpu_hc_reduce_backward,
    .hc_expand = cpu_hc_expand,
    .hc_expand_backward = cpu_hc_expand_backward,
    .hc_rstd = cpu_hc_rstd,
    .rstd_backward = cpu_rstd_backward,
    .gate_route = cpu_gate_route,
    .gate_route_backward = cpu_gate_route_backward,
    .attention_spans = cpu_attention_spans,
};

whale_code whale_backend_cpu_open(whale_backend **out, whale_err *err) {
    *out = NULL;
    whale_backend *be = malloc(sizeof *be);
    if (!be) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the cpu backend");
    *be = cpu_table;
    whale_gemm *g;
    whale_code e = whale_gemm_new(&g, err);
    if (e) {
        free(be);
        return e;
    }
    be->ctx = g;
    *out = be;
    return WHALE_OK;
}

struct whale_gemm *whale_backend_cpu_gemm(whale_backend *be) {
    return be && be->close == cpu_close ? GEMM(be) : NULL;
}
