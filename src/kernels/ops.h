/* Element-wise and row-wise operations of the forward pass, each followed by
 * its backward. All take plain row-major fp32 buffers; rows are processed in
 * parallel with OpenMP. Backward functions "write" (overwrite) input
 * gradients of per-row inputs and "accumulate" (+=) gradients that sum over
 * rows (weights, shared K/V), as each one states. */
#ifndef WHALE_OPS_H
#define WHALE_OPS_H

#include "whale.h"
#include "kernels/gemm.h"

/* y[r,:] = w ⊙ (x[r,:] · rstd_r), rstd_r = 1/sqrt(mean(x[r,:]²) + eps).
 * w may be NULL (weightless norm). y may alias x. rstd (optional) receives
 * rstd_r for the backward pass. Rows are n wide and contiguous. */
void k_rmsnorm(float *y, const float *x, const float *w, long rows, int n, float eps, float *rstd);

/* Backward of k_rmsnorm, given the forward input x and its saved rstd:
 *   dx[r,i] = rstd_r·g_i − (rstd_r³/n)·(Σ_j g_j·x[r,j])·x[r,i],  g = dy ⊙ w (dy if w is NULL)
 *   dw[i]  += Σ_r dy[r,i]·(x[r,i]·rstd_r)
 * dx is overwritten and may alias dy. dw is accumulated (NULL skips it; must
 * be NULL when w is). The dw sum over rows is split by columns, so every dw
 * element is summed by one thread in row order: bit-identical results for
 * any thread count. */
void k_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                        long rows, int n);

/* y = a + b over n floats (the residual connections); y may alias a or b. */
void k_add(float *y, const float *a, const float *b, size_t n);
/* y[r, :] += b[:] over rows of n (a bias added after a product), and its
 * backward db[i] += Σ_r dy[r, i]: columns in blocks, each summed by one
 * thread in row order in double, so bit-identical for any thread count. */
void k_add_rows(float *y, const float *b, long rows, int n);
void k_add_rows_backward(float *db, const float *dy, long rows, int n);

/* Rows by index (the MoE dispatch and combine, embeddings' gradient):
 *   k_gather_rows:      dst[i, :] = w[i] · src[idx[i], :]   (w NULL: copy; idx NULL: row i)
 *   k_scatter_add_rows: dst[idx[i], :] += w[i] · src[i, :]  (w NULL: 1; idx NULL: row i)
 * src rows ld (lds) apart, gathered rows dense, scattered rows ldd apart.
 * The scatter splits columns between threads and takes i in ascending
 * order, so repeated indices (a token twice in a batch) sum in order:
 * bit-identical for any thread count. k_dot_rows: out[i] = Σ_d A[ia[i]] ·
 * B[ib[i]] by k_dot_f64, rounded to float (ia, ib NULL: row i). */
void k_gather_rows(float *dst, const float *src, int ld, const int32_t *idx, const float *w, long n, int cols);
void k_scatter_add_rows(float *dst, int ldd, const float *src, int lds, const int32_t *idx, const float *w, long n,
                        int cols);
void k_dot_rows(float *out, const float *A, int lda, const int32_t *ia, const float *B, int ldb, const int32_t *ib,
                long n, int cols);

/* RoPE table: cos/sin [max_pos, R/2], inv_freq_j = 1/theta^(2j/R), angle = p·inv_freq_j,
 * all in fp32 as the reference computes it. */
void k_rope_table(float *cos_t, float *sin_t, int max_pos, int R, float theta);

/* Half-split rotation of the last R dims of every head of every row.
 * x: rows of nh heads × hd values, row stride ld; pos[r] is row r's position.
 * inverse=0 rotates by −angle (a' = a·c + b·s, b' = −a·s + b·c);
 * inverse=1 undoes it (a' = a·c − b·s, b' = a·s + b·c). */
void k_rope(float *x, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
            const float *cos_t, const float *sin_t, int inverse);

/* Backward of k_rope(..., inverse): the rotation is orthogonal, so the input
 * gradient is the output gradient rotated back, i.e. k_rope(..., !inverse)
 * applied in place to dx (same rows, layout and positions). */
void k_rope_backward(float *dx, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
                     const float *cos_t, const float *sin_t, int inverse);

/* SwiGLU in place: g[i] = silu(g[i]) · u[i]; with limit > 0, u is clamped to
 * [−limit, limit] and g to at most limit first. */
void k_swiglu(float *g, const float *u, long n, float limit);

/* Backward of k_swiglu from its inputs g, u (before the in-place forward):
 * h = silu(g')·u' with g' = min(g, limit), u' = clamp(u, −limit, limit) when
 * limit > 0 (else g' = g, u' = u).
 *   du = dh·silu(g') where −limit ≤ u ≤ limit, else 0
 *   dg = dh·u'·silu'(g') where g ≤ limit, else 0
 * Values exactly on a bound pass the gradient (PyTorch clamp convention).
 * dg and du are overwritten; each element is read before it is written, so
 * any of the buffers may alias one another element-for-element. */
void k_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, long n, float limit);
/* The same on m elements, in the calling thread (for callers that already
 * split the work, and round the result themselves). */
void k_swiglu_backward_block(float *dg, float *du, const float *dh, const float *g, const float *u, int m,
                             float limit);

/* Mixture-of-experts routing for one token. scores s_e = f(logit_e) with f
 * sqrt(softplus) (PyTorch softplus: x itself above 20), softmax or sigmoid;
 * the K experts with the largest s_e + bias_e (bias may be NULL; ties go to
 * the lower index) are chosen, in descending order; their weights are the
 * unbiased s, normalised by (Σ s + 1e-20) except for softmax, times scale. */
enum { NW_SCORE_SQRTSOFTPLUS = 0, NW_SCORE_SOFTMAX = 1, NW_SCORE_SIGMOID = 2 };
/* The unbiased scores s_e = f(logit_e) of E experts (the part of the
 * routing the forward, the backward and the diagnostics share). */
void k_gate_scores(int scoring, int E, const float *logit, float *sc);
void k_gate_route(int scoring, int E, int K, float scale, const float *logit, const float *bias, int32_t *idx,
                  float *w);

/* Backward of k_gate_route for one token: dw [K] is the gradient with respect
 * to the routing weights w, idx [K] the experts the forward chose; dlogit [E]
 * is overwritten. The selection itself (and the bias) has no gradient, so
 * only the chosen experts' unbiased scores carry it:
 *  - sqrtsoftplus / sigmoid: w_k = scale·a_k/T, a_k = s[idx_k], T = Σ a + 1e-20
 *    ⇒ ∂L/∂a_k = (scale/T)·(dw_k − Σ_j dw_j·a_j/T); unchosen experts get 0.
 *    sqrt(softplus(l))' = sigmoid(l)/(2s) (1/(2s) above the threshold 20);
 *    sigmoid' = s(1−s).
 *  - softmax: w_k = scale·s[idx_k] (no normalisation); the gradient passes
 *    through the softmax over all E logits, so unchosen logits get some too.
 * Where softplus underflowed to s = 0 (l below about −103) the derivative is
 * taken as 0: the exact value e^(l/2)/2 is below 1e-22 there, whereas the
 * formula would give 0/0 = NaN. */
void k_gate_route_backward(int scoring, int E, int K, float scale, const float *logit, const int32_t *idx,
                           const float *dw, float *dlogit);

/* Causal attention of S new query tokens (positions p0..p0+S−1) over keys
 * 0..p0+S−1, for Hq query heads sharing Hkv key/value heads.
 * q [S, Hq·Dh], out [S, Hq·Dh] (contiguous rows); k, v [p0+S rows, stride ldkv],
 * head j at column j·Dh. seg (may be NULL) gives for each query s the first
 * key it may see (block-diagonal masks for packed documents); keys seg[s]..p0+s
 * are attended. products WHALE_F32: fp32 products; WHALE_BF16: Q·Kᵀ and P·V
 * with both operands rounded to bf16 and fp32 sums (bf16 autocast) when
 * p0 = 0 (over a cache, p0 > 0, they stay fp32); softmax in fp32 either way.
 * The few-row path (S·Hq <= 4, or S <= 4 with Hkv > 1) is fp32 always.
 * work must hold k_attention_work_floats() floats. */
size_t k_attention_work_floats(int max_ctx, int Hq, int Hkv, int Dh);
whale_code k_attention(whale_gemm *g, float *out, const float *q, const float *k, const float *v,
                       int ldkv, const int32_t *seg, int S, int p0, int Hq, int Hkv, int Dh, float scale,
                       whale_dtype products, float *work, whale_err *err);

/* One sequence's part of a micro-batch for k_attention_spans: S query
 * tokens at positions p0 .. p0+S−1 (q, out [S, Hq·Dh]) over keys k, v
 * [p0+S rows, stride ldkv]; seg as for k_attention (NULL: none). */
typedef struct {
    float *out;
    const float *q, *k, *v;
    int ldkv;
    const int32_t *seg;
    int S, p0;
} k_att_span;
/* k_attention of each of n spans (one Hq, Hkv, Dh, scale, products), each
 * output the same bits as its own k_attention call gives, for any thread
 * count: the spans that take the few-row path (decoding) share parallel
 * regions (up to 64 spans, as many as work holds), the others run one by
 * one. Outputs do not overlap. work holds k_attention_work_floats(c, Hq,
 * Hkv, Dh) floats for a c at least every span's p0 + S. */
whale_code k_attention_spans(whale_gemm *g, const k_att_span *spans, int n, int Hq, int Hkv, int Dh, float scale,
                             whale_dtype products, float *work, whale_err *err);

/* Backward of k_attention (same arguments), recomputing the probabilities
 * from q and k. dout [S, Hq·Dh] is the output gradient; dq [S, Hq·Dh] is
 * overwritten; dk and dv [p0+S rows, stride ldkv] are accumulated, including
 * the p0 cached rows. dk and dv may be the same buffer (K = V: both
 * contributions are then summed into it). products as for k_attention:
 * with bf16 all five products round their operands. work must hold
 * k_attention_backward_work_floats() floats. Deterministic for a given
 * thread count. */
size_t k_attention_backward_work_floats(int max_ctx, int Hq, int Hkv, int Dh);
whale_code k_attention_backward(whale_gemm *g, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                const float *k, const float *v, int ldkv, const int32_t *seg, int S, int p0, int Hq,
                                int Hkv, int Dh, float scale, whale_dtype products, float *work,
                                whale_err *err);

#endif
