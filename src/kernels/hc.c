#include "kernels/hc.h"

#include <math.h>

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

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

void k_hc_head_coeffs(const float *mix, const float *scale, const float *base, int M, float eps,
                      float *pre) {
    for (int m = 0; m < M; m++) {
        float a = mix[m] * scale[0];
        pre[m] = sigmoidf(a + base[m]) + eps;
    }
}

void k_hc_reduce(float *y, const float *X, const float *pre, long rows, int M, int D) {
#pragma omp parallel for schedule(static) if (rows * M * D > 65536)
    for (long r = 0; r < rows; r++) {
        float *yr = y + r * D;
        const float *Xr = X + r * M * D, *p = pre + r * M;
        for (int d = 0; d < D; d++) yr[d] = p[0] * Xr[d];
        for (int m = 1; m < M; m++)
            for (int d = 0; d < D; d++) yr[d] += p[m] * Xr[(long)m * D + d];
    }
}

void k_hc_expand(float *Xout, const float *o, const float *X, const float *post, const float *comb,
                 long rows, int M, int D) {
#pragma omp parallel for schedule(static) if (rows * M * D > 65536)
    for (long r = 0; r < rows; r++) {
        const float *orow = o + r * D, *Xr = X + r * M * D, *pr = post + r * M, *cr = comb + r * M * M;
        for (int i = 0; i < M; i++) {
            float *out = Xout + (r * M + i) * D;
            for (int d = 0; d < D; d++) out[d] = pr[i] * orow[d];
            for (int j = 0; j < M; j++) {
                float c = cr[i * M + j];
                const float *xj = Xr + (long)j * D;
                for (int d = 0; d < D; d++) out[d] += c * xj[d];
            }
        }
    }
}

void k_hc_rstd(float *rstd, const float *X, long rows, int MD, float eps) {
#pragma omp parallel for schedule(static) if (rows * MD > 65536)
    for (long r = 0; r < rows; r++) {
        const float *x = X + r * MD;
        double ss = 0;
        for (int i = 0; i < MD; i++) ss += (double)x[i] * x[i];
        rstd[r] = (float)(1.0 / sqrt(ss / MD + (double)eps));
    }
}
