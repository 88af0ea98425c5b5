/* Element-wise and row-wise operations of the forward pass. Each takes plain
 * row-major fp32 buffers; rows are processed in parallel with OpenMP. */
#ifndef WHALE_OPS_H
#define WHALE_OPS_H

#include "whale.h"
#include "kernels/gemm.h"

/* y[r,:] = w ⊙ (x[r,:] · rstd_r), rstd_r = 1/sqrt(mean(x[r,:]²) + eps).
 * w may be NULL (weightless norm). y may alias x. rstd (optional) receives
 * rstd_r for the backward pass. Rows are n wide and contiguous. */
void k_rmsnorm(float *y, const float *x, const float *w, long rows, int n, float eps, float *rstd);

/* RoPE table: cos/sin [max_pos, R/2], inv_freq_j = 1/theta^(2j/R), angle = p·inv_freq_j,
 * all in fp32 as the reference computes it. */
void k_rope_table(float *cos_t, float *sin_t, int max_pos, int R, float theta);

/* Half-split rotation of the last R dims of every head of every row.
 * x: rows of nh heads × hd values, row stride ld; pos[r] is row r's position.
 * inverse=0 rotates by −angle (a' = a·c + b·s, b' = −a·s + b·c);
 * inverse=1 undoes it (a' = a·c − b·s, b' = a·s + b·c). */
void k_rope(float *x, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
            const float *cos_t, const float *sin_t, int inverse);

/* SwiGLU in place: g[i] = silu(g[i]) · u[i]; with limit > 0, u is clamped to
 * [−limit, limit] and g to at most limit first. */
void k_swiglu(float *g, const float *u, long n, float limit);

/* Mixture-of-experts routing for one token. scores s_e = f(logit_e) with f
 * sqrt(softplus) (PyTorch softplus: x itself above 20), softmax or sigmoid;
 * the K experts with the largest s_e + bias_e (bias may be NULL; ties go to
 * the lower index) are chosen, in descending order; their weights are the
 * unbiased s, normalised by (Σ s + 1e-20) except for softmax, times scale. */
enum { NW_SCORE_SQRTSOFTPLUS = 0, NW_SCORE_SOFTMAX = 1, NW_SCORE_SIGMOID = 2 };
void k_gate_route(int scoring, int E, int K, float scale, const float *logit, const float *bias, int32_t *idx,
                  float *w);

/* Block-diagonal linear: out[t, g·n_out + r] = Σ_d in[t, g·n_in + d] · W[g·n_out + r, d]
 * for G groups (W is [G·n_out, n_in], the layout of nanowhale's wo_a). */
whale_code k_grouped_linear(whale_gemm *g, float *out, const float *in, const float *W, int T, int G, int n_in,
                            int n_out, whale_err *err);

/* Causal attention of S new query tokens (positions p0..p0+S−1) over keys
 * 0..p0+S−1, for Hq query heads sharing Hkv key/value heads.
 * q [S, Hq·Dh], out [S, Hq·Dh] (contiguous rows); k, v [p0+S rows, stride ldkv],
 * head j at column j·Dh. work must hold k_attention_work_floats() floats. */
size_t k_attention_work_floats(int max_ctx, int Hq);
whale_code k_attention(whale_gemm *g, float *out, const float *q, const float *k, const float *v,
                       int ldkv, int S, int p0, int Hq, int Hkv, int Dh, float scale, float *work,
                       whale_err *err);

#endif
