/*
 * The backend seam: everything a model's forward and backward do to its
 * buffers, as a versioned table of function pointers (the idiom of
 * SQLite's sqlite3_vfs). A backend owns the memory it computes on: model
 * code gets buffers from buf_alloc, never dereferences them, moves data
 * in and out only with buf_to_host / buf_from_host, and calls ops that
 * the backend may queue (sync waits for them). A CPU backend's buffers
 * are host memory and its ops run at once; a CUDA backend would return
 * device pointers, enqueue every op on its stream and make sync a stream
 * synchronisation (docs/architecture.md, "The backend seam").
 *
 * Two backends exist:
 *   "cpu"  the optimised kernels (src/kernels: AVX2 / AVX-512 / AMX via
 *          oneDNN, OpenMP);
 *   "ref"  plain loops, one obvious statement of each op's mathematics,
 *          double-precision sums: the reference test_backend_ops checks
 *          the "cpu" backend against, op by op, forward and backward.
 *
 * Every op's contract is the kernel's it is named after (src/kernels/
 * ops.h, hc.h, gemm.h): the same arguments, the same "write" (overwrite)
 * and "accumulate" (+=) rules, the same aliasing. What a table adds is
 * stated below. A backend is used by one thread at a time (the session's).
 *
 * A new version may only append members; a caller checks version before
 * reading a member a later version added.
 */
#ifndef WHALE_BACKEND_H
#define WHALE_BACKEND_H

#include "whale.h"

#define WHALE_BACKEND_VERSION 3 /* 2: attention_spans; 3: packed I8 weights (row0) */

/* A weight operand of a product: W [N, K] (nt) or [K, N] (nn) in its
 * format: F32 (float), BF16 / F16 (uint16_t bit patterns) or I8 (int8
 * values q with scale per row of W [N, K]: W = q · scale[row]), ld in
 * elements. I8 weights are packed (whale_q8p_pack, kernels/gemm.h): data
 * points at the panel of 16 rows holding W's first row, which is row row0
 * of that panel; scale[0] is its scale. */
typedef struct {
    whale_dtype format;
    const void *data;
    int ld;
    const float *scale;
    int row0;
} whale_wref;

/* One product of matmul_nt_parts: C[M,N] = A[M,K] · W[N,K]ᵀ, W of the
 * call's format (scale and row0 for I8, as in whale_wref), strides in
 * elements. */
typedef struct {
    int M, N;
    const float *A;
    int lda;
    const void *W;
    int ldw;
    const float *scale;
    float *C;
    int ldc;
    int row0;
} whale_mm_part;
enum { WHALE_MM_MAX_PARTS = 16 };

/* One sequence's part of a micro-batch for attention_spans: S query tokens
 * at positions p0 .. p0+S−1 (q, out [S, Hq·Dh]) over keys k, v [p0+S rows,
 * stride ldkv]; seg as for attention (NULL: none). */
typedef struct {
    float *out;
    const float *q, *k, *v;
    int ldkv;
    const int32_t *seg;
    int S, p0;
} whale_att_span;

typedef struct whale_backend whale_backend;
struct whale_backend {
    int version; /* WHALE_BACKEND_VERSION when made */
    const char *name;
    void *ctx; /* the backend's own state (the cpu backend: its GEMM primitive cache) */
    void (*close)(whale_backend *be);

    /* ---- buffers: opaque to model code ---- */
    void *(*buf_alloc)(whale_backend *be, size_t bytes); /* 64-byte aligned; NULL when out of memory */
    void (*buf_free)(whale_backend *be, void *buf);
    void (*buf_zero)(whale_backend *be, void *buf, size_t bytes);
    void (*buf_copy)(whale_backend *be, void *dst, const void *src, size_t bytes); /* buffer to buffer */
    void (*buf_to_host)(whale_backend *be, void *host, const void *buf, size_t bytes);
    void (*buf_from_host)(whale_backend *be, void *buf, const void *host, size_t bytes);
    whale_code (*sync)(whale_backend *be, whale_err *err); /* wait for every queued op */

    /* ---- products: C = A·Wᵀ (nt), A·W (nn), Aᵀ·B (tn) ----
     * accumulate 0 writes C, 1 adds to it. nt: W [N, K] in any format, A
     * rounded to the format's compute type (bf16 for BF16, fp16 for F16)
     * and the exact products summed in fp32, as whale_gemm_nt*; I8: A
     * rounded to int8 in blocks of 32 (W8A8, whale_gemm_nt_a8). nn:
     * the input gradient dA = dC · W, W [N, K] read as B [K = N, N = K]
     * (W.format as nt, I8: each dC value times its row's scale, then bf16).
     * tn: dW = Aᵀ · B with both fp32 operands rounded to products (F32 or
     * BF16 or F16). */
    whale_code (*matmul_nt)(whale_backend *be, int M, int N, int K, const float *A, int lda, whale_wref W, float *C,
                            int ldc, int accumulate, whale_err *err);
    whale_code (*matmul_nn)(whale_backend *be, int M, int N, int K, const float *A, int lda, whale_wref B, float *C,
                            int ldc, int accumulate, whale_err *err);
    whale_code (*matmul_tn)(whale_backend *be, whale_dtype products, int M, int N, int K, const float *A, int lda,
                            const float *B, int ldb, float *C, int ldc, int accumulate, whale_err *err);
    /* up to WHALE_MM_MAX_PARTS nt products of one depth K and one weight
     * format, each exactly what its own matmul_nt gives (the cpu backend
     * runs the few-row ones in one parallel region: a decode step's small
     * weights pay one fork/join) */
    whale_code (*matmul_nt_parts)(whale_backend *be, whale_dtype format, int K, int n, const whale_mm_part *parts,
                                  int accumulate, whale_err *err);

    /* products on operands already in bf16 (uint16_t bit patterns), for a
     * caller that rounds an operand once for several products:
     * nn C[M,N] = A[M,K] · B[K,N] with B a BF16 weight; tn C[M,N] = A[K,M]ᵀ
     * · B[K,N] (whale_gemm_nn_b16 / whale_gemm_tn_b16) */
    whale_code (*matmul_nn_b16)(whale_backend *be, int M, int N, int K, const uint16_t *A, int lda, whale_wref B,
                                float *C, int ldc, int accumulate, whale_err *err);
    whale_code (*matmul_tn_b16)(whale_backend *be, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                                int ldb, float *C, int ldc, int accumulate, whale_err *err);

    /* ---- rows by index ----
     * get_rows: dst[i, :] = W[ids[i], :] as fp32 (an embedding lookup; I8:
     * q · scale[row]), dst rows ldd apart.
     * gather_rows: dst[i, :] = w[i] · src[idx[i], :] (w NULL: a copy; idx
     * NULL: row i), dst dense [n, cols]; gather_rows_bf16 the same rounded
     * to bf16 (the product w·x in fp32 first).
     * scatter_add_rows: dst[idx[i], :] += w[i] · src[i, :] for i ascending
     * (w NULL: 1; idx NULL: row i), so repeated indices sum in order.
     * dot_rows: out[i] = Σ_d A[ia[i], d] · B[ib[i], d] summed in double
     * (ia or ib NULL: row i). */
    void (*get_rows)(whale_backend *be, float *dst, int ldd, whale_wref W, const int32_t *ids, long n, int cols);
    void (*gather_rows)(whale_backend *be, float *dst, const float *src, int ld, const int32_t *idx, const float *w,
                        long n, int cols);
    void (*gather_rows_bf16)(whale_backend *be, uint16_t *dst, const float *src, int ld, const int32_t *idx,
                             const float *w, long n, int cols);
    void (*scatter_add_rows)(whale_backend *be, float *dst, int ldd, const float *src, int lds, const int32_t *idx,
                             const float *w, long n, int cols);
    void (*dot_rows)(whale_backend *be, float *out, const float *A, int lda, const int32_t *ia, const float *B,
                     int ldb, const int32_t *ib, long n, int cols);
    /* dst[r, j, :] = dst[r, 0, :] for j = 1 .. times − 1: rows of times × n */
    void (*repeat_rows)(whale_backend *be, float *dst, long rows, int times, int n);
    /* the backward of y[r, :] = s[r] · x[r, :] given y and s: ds[r] = Σ dy·y
     * / s[r] (double sum, written), then dy becomes dx = s[r] · dy in place */
    void (*scale_rows_backward)(whale_backend *be, float *dy, float *ds, const float *y, const float *s, long rows,
                                int n);
    /* k_swiglu_backward with dg and du rounded to bf16 (the form the
     * products read); dg16 and du16 may not alias the fp32 inputs */
    void (*swiglu_backward_bf16)(whale_backend *be, uint16_t *dg16, uint16_t *du16, const float *dh, const float *g,
                                 const float *u, long n, float limit);

    /* ---- conversions: n values to bf16 bit patterns (nearest even, as
     * whale_float_to_bf16) and back (exact) ---- */
    void (*to_bf16)(whale_backend *be, uint16_t *dst, const float *src, size_t n);
    void (*from_bf16)(whale_backend *be, float *dst, const uint16_t *src, size_t n);

    /* ---- element-wise and row-wise ops, each with its backward ---- */
    void (*rmsnorm)(whale_backend *be, float *y, const float *x, const float *w, long rows, int n, float eps,
                    float *rstd);
    void (*rmsnorm_backward)(whale_backend *be, float *dx, float *dw, const float *dy, const float *x, const float *w,
                             const float *rstd, long rows, int n);
    /* cos_t, sin_t: the [positions, R/2] tables of k_rope_table */
    void (*rope)(whale_backend *be, float *x, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
                 const float *cos_t, const float *sin_t, int inverse);
    void (*rope_backward)(whale_backend *be, float *dx, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
                          const float *cos_t, const float *sin_t, int inverse);
    void (*swiglu)(whale_backend *be, float *g, const float *u, long n, float limit);
    void (*swiglu_backward)(whale_backend *be, float *dg, float *du, const float *dh, const float *g, const float *u,
                            long n, float limit);
    /* y = a + b over n floats (y may alias a or b); its backward is a copy */
    void (*add)(whale_backend *be, float *y, const float *a, const float *b, size_t n);
    /* y[r, :] += b (a bias), and its backward db += Σ_r dy[r, :] summed in
     * row order per column (bit-identical for any thread count) */
    void (*add_rows)(whale_backend *be, float *y, const float *b, long rows, int n);
    void (*add_rows_backward)(whale_backend *be, float *db, const float *dy, long rows, int n);

    /* causal attention of k_attention / k_attention_backward; work holds
     * attention_work_floats (attention_backward_work_floats) floats */
    size_t (*attention_work_floats)(whale_backend *be, int max_ctx, int Hq, int Hkv, int Dh);
    size_t (*attention_backward_work_floats)(whale_backend *be, int max_ctx, int Hq, int Hkv, int Dh);
    whale_code (*attention)(whale_backend *be, float *out, const float *q, const float *k, const float *v, int ldkv,
                            const int32_t *seg, int S, int p0, int Hq, int Hkv, int Dh, float scale,
                            whale_dtype products, float *work, whale_err *err);
    whale_code (*attention_backward)(whale_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                     const float *q, const float *k, const float *v, int ldkv, const int32_t *seg,
                                     int S, int p0, int Hq, int Hkv, int Dh, float scale, whale_dtype products,
                                     float *work, whale_err *err);

    /* ---- hyper-connections (hc.h), T tokens at a time ----
     * hc_coeffs: mix [T, (2+M)·M] is first scaled in place by rstd[t] (the
     * mixes r·(fn·x)), then k_hc_coeffs of each token into pre, post [T, M]
     * and comb [T, M, M]. hc_head_coeffs likewise with mix [T, M] into
     * pre [T, M]. The backward forms are k_hc_*_backward_rows. */
    void (*hc_coeffs)(whale_backend *be, long T, float *mix, const float *rstd, const float *scale, const float *base,
                      int M, int iters, float eps, float *pre, float *post, float *comb);
    void (*hc_coeffs_backward)(whale_backend *be, long T, const float *mix, const float *scale, const float *base,
                               int M, int iters, float eps, const float *dpre, const float *dpost, const float *dcomb,
                               float *dmix, float *dscale, float *dbase);
    void (*hc_head_coeffs)(whale_backend *be, long T, float *mix, const float *rstd, const float *scale,
                           const float *base, int M, float eps, float *pre);
    void (*hc_head_coeffs_backward)(whale_backend *be, long T, const float *mix, const float *scale,
                                    const float *base, int M, float eps, const float *dpre, float *dmix,
                                    float *dscale, float *dbase);
    void (*hc_reduce)(whale_backend *be, float *y, const float *X, const float *pre, long rows, int M, int D);
    void (*hc_reduce_backward)(whale_backend *be, float *dX, float *dpre, const float *dy, const float *X,
                               const float *pre, long rows, int M, int D);
    void (*hc_expand)(whale_backend *be, float *Xout, const float *o, const float *X, const float *post,
                      const float *comb, long rows, int M, int D);
    void (*hc_expand_backward)(whale_backend *be, float *dout, float *dX, float *dpost, float *dcomb,
                               const float *dXout, const float *o, const float *X, const float *post,
                               const float *comb, long rows, int M, int D);
    void (*hc_rstd)(whale_backend *be, float *rstd, const float *X, long rows, int MD, float eps);
    void (*rstd_backward)(whale_backend *be, float *dx, const float *x, const float *rstd, const float *drstd,
                          long rows, int n);

    /* ---- mixture-of-experts routing (k_gate_route), T tokens ----
     * logit [T, E] → idx, w [T, K]; the backward: dw [T, K] → dlogit [T, E]
     * (written) */
    void (*gate_route)(whale_backend *be, long T, int scoring, int E, int K, float scale, const float *logit,
                       const float *bias, int32_t *idx, float *w);
    void (*gate_route_backward)(whale_backend *be, long T, int scoring, int E, int K, float scale,
                                const float *logit, const int32_t *idx, const float *dw, float *dlogit);

    /* ---- version 2 ----
     * attention of n spans of a micro-batch (one Hq, Hkv, Dh, scale,
     * products), each output exactly what its own attention call gives;
     * outputs do not overlap. work holds attention_work_floats(c, ...)
     * floats for a c at least every span's p0 + S. The cpu backend runs the
     * decode spans (few query rows) in one parallel region
     * (k_attention_spans). */
    whale_code (*attention_spans)(whale_backend *be, const whale_att_span *spans, int n, int Hq, int Hkv, int Dh,
                                  float scale, whale_dtype products, float *work, whale_err *err);
};

/* The backend called name ("cpu" or "ref"), for one session. */
whale_code whale_backend_open(const char *name, whale_backend **out, whale_err *err);
void whale_backend_close(whale_backend *be);

/* The cpu backend's GEMM object, to steer its paths in tests and tools
 * (NULL for another backend). */
struct whale_gemm *whale_backend_cpu_gemm(whale_backend *be);

/* The backends' constructors (the table whale_backend_open reads). */
whale_code whale_backend_cpu_open(whale_backend **out, whale_err *err);
whale_code whale_backend_ref_open(whale_backend **out, whale_err *err);

#endif
