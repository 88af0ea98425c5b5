/* Hyper-connection coefficient math (per token, fp32): the stream-reduction
 * weights `pre`, the output weights `post` and the Sinkhorn-normalised mixing
 * matrix `comb` from the mixes r·(fn·x); each forward is followed by its
 * backward ("write" = overwrite, "accumulate" = +=). */
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

/* Backward of k_hc_coeffs for one token. Recomputes the forward's internals
 * from mix/scale/base and backpropagates through the sigmoids, the row
 * softmax and every Sinkhorn normalisation in order (z = a/(Σa + eps) ⇒
 * ∂a_m = (∂z_m − Σ_i ∂z_i·z_i)/(Σa + eps); the added eps have no gradient).
 * dpre, dpost [M] and dcomb [M·M] are the output gradients (dpost or dcomb
 * may be NULL for zero). dmix [(2+M)·M] is overwritten (it must not alias
 * mix); dscale [3] and dbase [(2+M)·M] are accumulated. M ≤ 64. */
void k_hc_coeffs_backward(const float *mix, const float *scale, const float *base, int M, int iters, float eps,
                          const float *dpre, const float *dpost, const float *dcomb, float *dmix, float *dscale,
                          float *dbase);
/* The same for T tokens: mix/dmix [T, (2+M)·M], dpre/dpost [T, M], dcomb
 * [T, M, M]. Tokens run in parallel; dscale/dbase get the sum over tokens,
 * taken in token order in double (bit-identical for any thread count). */
void k_hc_coeffs_backward_rows(const float *mix, const float *scale, const float *base, int M, int iters, float eps,
                               const float *dpre, const float *dpost, const float *dcomb, float *dmix, float *dscale,
                               float *dbase, long T);

/* HC head: pre_m = sigmoid(mix_m·s0 + base_m) + eps (no Sinkhorn). */
void k_hc_head_coeffs(const float *mix, const float *scale, const float *base, int M, float eps,
                      float *pre);

/* Backward of k_hc_head_coeffs: dmix [M] overwritten, dscale [1] and
 * dbase [M] accumulated; the _rows form handles T tokens (mix/dpre/dmix
 * [T, M]) with the same deterministic sums as k_hc_coeffs_backward_rows. */
void k_hc_head_coeffs_backward(const float *mix, const float *scale, const float *base, int M, float eps,
                               const float *dpre, float *dmix, float *dscale, float *dbase);
void k_hc_head_coeffs_backward_rows(const float *mix, const float *scale, const float *base, int M, float eps,
                                    const float *dpre, float *dmix, float *dscale, float *dbase, long T);

/* y[d] = Σ_m pre_m · X[m][d] for rows tokens; X [rows, M, D]. */
void k_hc_reduce(float *y, const float *X, const float *pre, long rows, int M, int D);

/* Backward of k_hc_reduce: dX[m][d] += pre_m·dy[d] (accumulate),
 * dpre[m] = Σ_d dy[d]·X[m][d] (write, [rows, M]). */
void k_hc_reduce_backward(float *dX, float *dpre, const float *dy, const float *X, const float *pre, long rows,
                          int M, int D);

/* Xout[i] = post_i · o + Σ_j comb[i][j] · X[j] (nanowhale orientation: row i
 * of comb produces stream i). Xout must not alias X. */
void k_hc_expand(float *Xout, const float *o, const float *X, const float *post, const float *comb,
                 long rows, int M, int D);

/* Backward of k_hc_expand, dXout [rows, M, D] being the gradient of Xout:
 *   dout[d]       = Σ_i post_i·dXout[i][d]        (write [rows, D])
 *   dpost[i]      = ⟨dXout[i], o⟩                  (write [rows, M])
 *   dcomb[i][j]   = ⟨dXout[i], X[j]⟩               (write [rows, M, M])
 *   dX[j][d]     += Σ_i comb[i][j]·dXout[i][d]     (accumulate [rows, M, D])
 * dX must not alias dXout. */
void k_hc_expand_backward(float *dout, float *dX, float *dpost, float *dcomb, const float *dXout, const float *o,
                          const float *X, const float *post, const float *comb, long rows, int M, int D);

/* rstd of each token's flattened stream state: 1/sqrt(mean(X²) + eps) over M·D. */
void k_hc_rstd(float *rstd, const float *X, long rows, int MD, float eps);

/* Backward of an rstd = 1/sqrt(mean(x²) + eps) over rows of n values (k_hc_rstd,
 * or the statistic of k_rmsnorm): dx[r,:] += drstd_r·(−rstd_r³/n)·x[r,:].
 * For the HC mixes mix = rstd·(fn·x), drstd_r = Σ_k dmix_k·(fn·x)_k. */
void k_rstd_backward(float *dx, const float *x, const float *rstd, const float *drstd, long rows, int n);

#endif
