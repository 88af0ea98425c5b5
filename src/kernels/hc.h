/* Hyper-connection coefficient math (per token, fp32): the stream-reduction
 * weights `pre`, the output weights `post` and the Sinkhorn-normalised mixing
 * matrix `comb` from the mixes r·(fn·x). */
#ifndef WHALE_HC_H
#define WHALE_HC_H

/* mix: [(2+M)·M] = rstd · (fn · flatten(X)) for one token.
 * pre_m  = sigmoid(mix_m·s0 + base_m) + eps
 * post_m = 2·sigmoid(mix_{M+m}·s1 + base_{M+m})
 * comb   = softmax_rows(C_raw·s2 + Cb) + eps, column-normalised, then
 *          (iters−1) × (row-normalise, column-normalise); each normalisation
 *          divides by (sum + eps). */
void k_hc_coeffs(const float *mix, const float *scale, const float *base, int M, int iters, float eps,
                 float *pre, float *post, float *comb);

/* HC head: pre_m = sigmoid(mix_m·s0 + base_m) + eps (no Sinkhorn). */
void k_hc_head_coeffs(const float *mix, const float *scale, const float *base, int M, float eps,
                      float *pre);

/* y[d] = Σ_m pre_m · X[m][d] for rows tokens; X [rows, M, D]. */
void k_hc_reduce(float *y, const float *X, const float *pre, long rows, int M, int D);

/* Xout[i] = post_i · o + Σ_j comb[i][j] · X[j] (nanowhale orientation: row i
 * of comb produces stream i). Xout must not alias X. */
void k_hc_expand(float *Xout, const float *o, const float *X, const float *post, const float *comb,
                 long rows, int M, int D);

/* rstd of each token's flattened stream state: 1/sqrt(mean(X²) + eps) over M·D. */
void k_hc_rstd(float *rstd, const float *X, long rows, int MD, float eps);

#endif
