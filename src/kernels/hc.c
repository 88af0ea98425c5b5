#include "kernels/hc.h"

#include "core/par.h"
#include "kernels/vmath.h"

#include <math.h>
#include <string.h>

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Largest hc_mult the backward handles (the config allows at most 64). */
enum { HC_MAXM = 64, HC_MAXMIX = (2 + HC_MAXM) * HC_MAXM, HC_TAPE = 4096 };

void k_hc_coeffs(const float *mix, const float *scale, const float *base, int M, int iters, float eps,
                 float *pre, float *post, float *comb) {
    for (int m = 0; m < M; m++) {
        float a = mix[m] * scale[0];
        pre[m] = sigmoidf(a + base[m]) + eps;
        float b = mix[M + m] * scale[1];
        post[m] = 2.0f * sigmoidf(b + base[M + m]);
    }
    const float *cm = mix + 2 * M, *cb = base + 2 * M;
    for (int i = 0; i < M; i++) {
        float *row = comb + i * M, mx = -INFINITY;
        for (int j = 0; j < M; j++) {
            float c = cm[i * M + j] * scale[2];
            row[j] = c + cb[i * M + j];
            if (row[j] > mx) mx = row[j];
        }
        float sum = 0;
        for (int j = 0; j < M; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        for (int j = 0; j < M; j++) row[j] = row[j] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int i = 0; i < M; i++) {
                float sum = 0;
                for (int j = 0; j < M; j++) sum += comb[i * M + j];
                sum += eps;
                for (int j = 0; j < M; j++) comb[i * M + j] /= sum;
            }
        for (int j = 0; j < M; j++) {
            float sum = 0;
            for (int i = 0; i < M; i++) sum += comb[i * M + j];
            sum += eps;
            for (int i = 0; i < M; i++) comb[i * M + j] /= sum;
        }
    }
}

/* One Sinkhorn normalisation step on C [M×M], exactly as k_hc_coeffs does
 * it: even steps normalise columns, odd steps rows (col, row, col, ...). */
static void sinkhorn_step(float *C, int M, int step, float eps) {
    int col = step % 2 == 0;
    for (int a = 0; a < M; a++) {
        /* line a: column a (stride M) or row a (stride 1) */
        float *c = col ? C + a : C + (long)a * M;
        int st = col ? M : 1;
        float sum = 0;
        for (int b = 0; b < M; b++) sum += c[b * st];
        sum += eps;
        for (int b = 0; b < M; b++) c[b * st] /= sum;
    }
}

/* Backward of one step: g (gradient wrt its output) becomes the gradient
 * wrt its input a; z = a/(Σa + eps) ⇒ ∂a = (∂z − Σ ∂z·z)/(Σa + eps). */
static void sinkhorn_step_backward(float *g, const float *a, int M, int step, float eps) {
    int col = step % 2 == 0;
    for (int l = 0; l < M; l++) {
        const float *al = col ? a + l : a + (long)l * M;
        float *gl = col ? g + l : g + (long)l * M;
        int st = col ? M : 1;
        float sum = 0;
        for (int b = 0; b < M; b++) sum += al[b * st];
        sum += eps;
        float dot = 0;
        for (int b = 0; b < M; b++) dot += gl[b * st] * (al[b * st] / sum);
        for (int b = 0; b < M; b++) gl[b * st] = (gl[b * st] - dot) / sum;
    }
}

/* Gradient of comb with respect to the softmax arguments C_raw·s2 + Cb.
 * The inputs of all Sinkhorn steps are kept on a small tape when they fit;
 * otherwise each one is recomputed from the softmax output (cost quadratic in
 * the step count, but only for unusually many iterations or streams). */
static void hc_comb_backward(const float *cm, const float *cb, float s2, int M, int iters, float eps,
                             const float *dcomb, float *dz) {
    float P[HC_MAXM * HC_MAXM], cur[HC_MAXM * HC_MAXM], g[HC_MAXM * HC_MAXM], tape[HC_TAPE];
    int MM = M * M, nsteps = iters > 0 ? 2 * iters - 1 : 0, taped = nsteps * MM <= HC_TAPE;
    for (int i = 0; i < M; i++) { /* row softmax, as the forward */
        float *row = P + i * M, mx = -INFINITY;
        for (int j = 0; j < M; j++) {
            float c = cm[i * M + j] * s2;
            row[j] = c + cb[i * M + j];
            if (row[j] > mx) mx = row[j];
        }
        float sum = 0;
        for (int j = 0; j < M; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        for (int j = 0; j < M; j++) row[j] = row[j] / sum;
    }
    if (taped) {
        for (int i = 0; i < MM; i++) cur[i] = P[i] + eps;
        for (int st = 0; st < nsteps; st++) {
            memcpy(tape + (long)st * MM, cur, sizeof(float) * MM);
            sinkhorn_step(cur, M, st, eps);
        }
    }
    memcpy(g, dcomb, sizeof(float) * MM);
    for (int st = nsteps - 1; st >= 0; st--) {
        const float *a = tape + (long)st * MM;
        if (!taped) {
            for (int i = 0; i < MM; i++) cur[i] = P[i] + eps;
            for (int s = 0; s < st; s++) sinkhorn_step(cur, M, s, eps);
            a = cur;
        }
        sinkhorn_step_backward(g, a, M, st, eps);
    }
    for (int i = 0; i < M; i++) { /* softmax rows; the +eps has no gradient */
        const float *p = P + i * M, *gi = g + i * M;
        float dot = 0;
        for (int j = 0; j < M; j++) dot += gi[j] * p[j];
        for (int j = 0; j < M; j++) dz[i * M + j] = p[j] * (gi[j] - dot);
    }
}

/* Gradient of one token's coefficients with respect to the sigmoid/softmax
 * arguments z = mix·s + base ([(2+M)·M], or [M] for the head's pre only). */
static void hc_dz(const float *mix, const float *scale, const float *base, int M, int iters, float eps,
                  const float *dpre, const float *dpost, const float *dcomb, float *dz, int pre_only) {
    for (int m = 0; m < M; m++) {
        float a = mix[m] * scale[0];
        float sg = sigmoidf(a + base[m]);
        dz[m] = dpre[m] * sg * (1.0f - sg);
    }
    if (pre_only) return;
    for (int m = 0; m < M; m++) {
        float b = mix[M + m] * scale[1];
        float sg = sigmoidf(b + base[M + m]);
        dz[M + m] = dpost ? 2.0f * dpost[m] * sg * (1.0f - sg) : 0.0f;
    }
    if (dcomb) hc_comb_backward(mix + 2 * M, base + 2 * M, scale[2], M, iters, eps, dcomb, dz + 2 * M);
    else memset(dz + 2 * M, 0, sizeof(float) * M * M);
}

/* From dz [T, nm] (in dmix) to the parameter gradients and dmix = dz·s.
 * Scale group of entry c: pre (c < M) → 0, post (c < 2M) → 1, comb → 2. */
static void hc_param_grads(const float *mix, const float *scale, int M, int nm, float *dmix, float *dscale,
                           float *dbase, long T) {
    double sb[HC_MAXMIX] = {0}, ss[3] = {0};
    for (long t = 0; t < T; t++) { /* token order: deterministic sums */
        const float *dz = dmix + t * nm, *mx = mix + t * nm;
        for (int c = 0; c < nm; c++) {
            sb[c] += dz[c];
            ss[c < M ? 0 : c < 2 * M ? 1 : 2] += (double)dz[c] * mx[c];
        }
    }
    for (int c = 0; c < nm; c++) dbase[c] += (float)sb[c];
    for (int k = 0; k < (nm > M ? 3 : 1); k++) dscale[k] += (float)ss[k];
    WHALE_FOR_IF(T * nm > 65536, (long t = 0; t < T; t++), {
        for (int c = 0; c < nm; c++) dmix[t * nm + c] *= scale[c < M ? 0 : c < 2 * M ? 1 : 2];
    });
}

void k_hc_coeffs_backward(const float *mix, const float *scale, const float *base, int M, int iters, float eps,
                          const float *dpre, const float *dpost, const float *dcomb, float *dmix, float *dscale,
                          float *dbase) {
    k_hc_coeffs_backward_rows(mix, scale, base, M, iters, eps, dpre, dpost, dcomb, dmix, dscale, dbase, 1);
}

void k_hc_coeffs_backward_rows(const float *mix, const float *scale, const float *base, int M, int iters, float eps,
                               const float *dpre, const float *dpost, const float *dcomb, float *dmix, float *dscale,
                               float *dbase, long T) {
    int nm = (2 + M) * M;
    WHALE_FOR_IF(T > 64, (long t = 0; t < T; t++), {
        hc_dz(mix + t * nm, scale, base, M, iters, eps, dpre + t * M, dpost ? dpost + t * M : NULL,
              dcomb ? dcomb + t * M * M : NULL, dmix + t * nm, 0);
    });
    hc_param_grads(mix, scale, M, nm, dmix, dscale, dbase, T);
}

void k_hc_head_coeffs(const float *mix, const float *scale, const float *base, int M, float eps,
                      float *pre) {
    for (int m = 0; m < M; m++) {
        float a = mix[m] * scale[0];
        pre[m] = sigmoidf(a + base[m]) + eps;
    }
}

void k_hc_head_coeffs_backward(const float *mix, const float *scale, const float *base, int M, float eps,
                               const float *dpre, float *dmix, float *dscale, float *dbase) {
    k_hc_head_coeffs_backward_rows(mix, scale, base, M, eps, dpre, dmix, dscale, dbase, 1);
}

void k_hc_head_coeffs_backward_rows(const float *mix, const float *scale, const float *base, int M, float eps,
                                    const float *dpre, float *dmix, float *dscale, float *dbase, long T) {
    WHALE_FOR_IF(T > 256, (long t = 0; t < T; t++), {
        hc_dz(mix + t * M, scale, base, M, 0, eps, dpre + t * M, NULL, NULL, dmix + t * M, 1);
    });
    hc_param_grads(mix, scale, M, M, dmix, dscale, dbase, T);
}

void k_hc_reduce(float *y, const float *X, const float *pre, long rows, int M, int D) {
    WHALE_FOR_IF(rows * M * D > 65536, (long r = 0; r < rows; r++), {
        float *yr = y + r * D;
        const float *Xr = X + r * M * D, *p = pre + r * M;
        for (int d = 0; d < D; d++) yr[d] = p[0] * Xr[d];
        for (int m = 1; m < M; m++)
            for (int d = 0; d < D; d++) yr[d] += p[m] * Xr[(long)m * D + d];
    });
}

void k_hc_reduce_backward(float *dX, float *dpre, const float *dy, const float *X, const float *pre, long rows,
                          int M, int D) {
    WHALE_FOR_IF(rows * M * D > 65536, (long r = 0; r < rows; r++), {
        const float *dyr = dy + r * D, *Xr = X + r * M * D, *p = pre + r * M;
        float *dXr = dX + r * M * D;
        for (int m = 0; m < M; m++) {
            dpre[r * M + m] = (float)k_dot_f64(dyr, Xr + (long)m * D, D);
            for (int d = 0; d < D; d++) dXr[(long)m * D + d] += p[m] * dyr[d];
        }
    });
}

/* out[0, n) = p·o + Σ_j c[j]·x_j (x_j = x + j·ldx), summed in acc: in
 * registers when n is the constant HC_BLOCK. */
enum { HC_BLOCK = 64 };
static inline void hc_expand_block(float *out, const float *o, const float *x, long ldx, const float *c, float p,
                                   int M, int n) {
    float acc[HC_BLOCK];
    for (int d = 0; d < n; d++) acc[d] = p * o[d];
    for (int j = 0; j < M; j++)
        for (int d = 0; d < n; d++) acc[d] += c[j] * x[j * ldx + d];
    memcpy(out, acc, sizeof(float) * (size_t)n);
}

/* Each output row in blocks of HC_BLOCK floats over the M input streams,
 * instead of reading and writing the row M + 1 times: the same operations
 * in the same order per element, so the same bits. Serial up to 51
 * tokens at M 4, D 320 (the threshold below), so the time grows with the
 * tokens; one thread, per call, median of 3 alternated: 4.7 µs instead of
 * 5.7 at 4 tokens, 7.3 instead of 10.4 at 8, 12.2 instead of 17.7 at 16,
 * 2.9 and 3.0 at 1. */
void k_hc_expand(float *Xout, const float *o, const float *X, const float *post, const float *comb,
                 long rows, int M, int D) {
    WHALE_FOR_IF(rows * M * D > 65536, (long ri = 0; ri < rows * M; ri++), { /* output stream i of token r */
        const long r = ri / M;
        const float *orow = o + r * D, *Xr = X + r * M * D, *cr = comb + ri * M;
        float *out = Xout + ri * D;
        int d0 = 0;
        for (; d0 + HC_BLOCK <= D; d0 += HC_BLOCK)
            hc_expand_block(out + d0, orow + d0, Xr + d0, D, cr, post[ri], M, HC_BLOCK);
        if (d0 < D) hc_expand_block(out + d0, orow + d0, Xr + d0, D, cr, post[ri], M, D - d0);
    });
}

void k_hc_expand_backward(float *dout, float *dX, float *dpost, float *dcomb, const float *dXout, const float *o,
                          const float *X, const float *post, const float *comb, long rows, int M, int D) {
    WHALE_FOR_IF(rows * M * D > 65536, (long r = 0; r < rows; r++), {
        const float *orow = o + r * D, *Xr = X + r * M * D, *pr = post + r * M, *cr = comb + r * M * M;
        const float *g = dXout + r * M * D;
        float *dor = dout + r * D, *dXr = dX + r * M * D;
        for (int d = 0; d < D; d++) dor[d] = pr[0] * g[d];
        for (int i = 1; i < M; i++)
            for (int d = 0; d < D; d++) dor[d] += pr[i] * g[(long)i * D + d];
        for (int i = 0; i < M; i++) {
            const float *gi = g + (long)i * D;
            dpost[r * M + i] = (float)k_dot_f64(gi, orow, D);
            for (int j = 0; j < M; j++) dcomb[(r * M + i) * M + j] = (float)k_dot_f64(gi, Xr + (long)j * D, D);
        }
        for (int j = 0; j < M; j++) {
            float *dxj = dXr + (long)j * D;
            for (int i = 0; i < M; i++) {
                float c = cr[i * M + j];
                const float *gi = g + (long)i * D;
                for (int d = 0; d < D; d++) dxj[d] += c * gi[d];
            }
        }
    });
}

void k_hc_rstd(float *rstd, const float *X, long rows, int MD, float eps) {
    WHALE_FOR_IF(rows * MD > 65536, (long r = 0; r < rows; r++), {
        const float *x = X + r * MD;
        double ss = k_dot_f64(x, x, MD);
        rstd[r] = (float)(1.0 / sqrt(ss / MD + (double)eps));
    });
}

void k_rstd_backward(float *dx, const float *x, const float *rstd, const float *drstd, long rows, int n) {
    WHALE_FOR_IF(rows * n > 65536, (long r = 0; r < rows; r++), {
        double rs = rstd[r];
        float c = (float)(-(double)drstd[r] * rs * rs * rs / n);
        const float *xr = x + r * n;
        float *dxr = dx + r * n;
        for (int i = 0; i < n; i++) dxr[i] += c * xr[i];
    });
}
