#include "kernels/ops.h"

#include <math.h>
#include <string.h>

void k_rmsnorm(float *y, const float *x, const float *w, long rows, int n, float eps, float *rstd) {
#pragma omp parallel for schedule(static) if (rows * n > 16384)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double ss = 0; /* double sum: the mean is then exact to fp32 rounding */
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float rs = (float)(1.0 / sqrt(ss / n + (double)eps));
        if (rstd) rstd[r] = rs;
        if (w)
            for (int i = 0; i < n; i++) yr[i] = w[i] * (xr[i] * rs);
        else
            for (int i = 0; i < n; i++) yr[i] = xr[i] * rs;
    }
}

void k_rope_table(float *cos_t, float *sin_t, int max_pos, int R, float theta) {
    int half = R / 2;
    for (int j = 0; j < half; j++) {
        float inv = 1.0f / powf(theta, (float)(2 * j) / (float)R);
        for (int p = 0; p < max_pos; p++) {
            float a = (float)p * inv;
            cos_t[(long)p * half + j] = cosf(a);
            sin_t[(long)p * half + j] = sinf(a);
        }
    }
}

void k_rope(float *x, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
            const float *cos_t, const float *sin_t, int inverse) {
    int half = R / 2;
    float sgn = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) if (rows * nh > 256)
    for (long r = 0; r < rows; r++) {
        const float *c = cos_t + (long)pos[r] * half, *s = sin_t + (long)pos[r] * half;
        for (int h = 0; h < nh; h++) {
            float *a = x + r * ld + (long)h * hd + (hd - R), *b = a + half;
            for (int j = 0; j < half; j++) {
                float aj = a[j], bj = b[j], sj = sgn * s[j];
                a[j] = aj * c[j] + bj * sj;
                b[j] = bj * c[j] - aj * sj;
            }
        }
    }
}

void k_swiglu(float *g, const float *u, long n, float limit) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (long i = 0; i < n; i++) {
        float gi = g[i], ui = u[i];
        if (limit > 0) {
            ui = fminf(fmaxf(ui, -limit), limit);
            gi = fminf(gi, limit);
        }
        g[i] = gi / (1.0f + expf(-gi)) * ui;
    }
}

void k_gate_route(int scoring, int E, int K, float scale, const float *logit, const float *bias, int32_t *idx,
                  float *w) {
    float sc[256], sel[256];
    if (E > 256) E = 256; /* configs are validated to at most 256 experts */
    if (scoring == NW_SCORE_SOFTMAX) {
        float mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, logit[e]);
        for (int e = 0; e < E; e++) sum += (sc[e] = expf(logit[e] - mx));
        for (int e = 0; e < E; e++) sc[e] /= sum;
    } else {
        for (int e = 0; e < E; e++) {
            float x = logit[e];
            if (scoring == NW_SCORE_SIGMOID) sc[e] = 1.0f / (1.0f + expf(-x));
            else sc[e] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
        }
    }
    for (int e = 0; e < E; e++) sel[e] = bias ? sc[e] + bias[e] : sc[e];
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (sel[e] > -INFINITY && (best < 0 || sel[e] > sel[best])) best = e;
        if (best < 0) /* NaN scores: keep going deterministically, the NaN shows up downstream */
            for (int e = 0; e < E && best < 0; e++) {
                int taken = 0;
                for (int k2 = 0; k2 < k; k2++) taken |= idx[k2] == e;
                if (!taken) best = e;
            }
        idx[k] = best;
        sel[best] = -INFINITY;
    }
    float sum = 0;
    for (int k = 0; k < K; k++) sum += (w[k] = sc[idx[k]]);
    for (int k = 0; k < K; k++) {
        if (scoring != NW_SCORE_SOFTMAX) w[k] = w[k] / (sum + 1e-20f);
        w[k] = w[k] * scale;
    }
}

whale_code k_grouped_linear(whale_gemm *g, float *out, const float *in, const float *W, int T, int G, int n_in,
                            int n_out, whale_err *err) {
    for (int gi = 0; gi < G; gi++) {
        whale_code e = whale_gemm_nt(g, T, n_out, n_in, in + (size_t)gi * n_in, G * n_in, W + (size_t)gi * n_out * n_in,
                                     n_in, out + (size_t)gi * n_out, G * n_out, 0, err);
        if (e) return e;
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ attention */

enum { ATT_QBLOCK = 64, ATT_DIRECT_ROWS = 32 };

size_t k_attention_work_floats(int max_ctx, int Hq) {
    size_t rows = (size_t)ATT_QBLOCK * Hq;
    if (rows < ATT_DIRECT_ROWS) rows = ATT_DIRECT_ROWS;
    return rows * (size_t)max_ctx;
}

/* softmax of row[0..valid) scaled by `scale`; entries valid..n set to 0 */
static void masked_softmax(float *row, int valid, int n, float scale) {
    float mx = -INFINITY;
    for (int t = 0; t < valid; t++) {
        row[t] *= scale;
        if (row[t] > mx) mx = row[t];
    }
    float sum = 0;
    for (int t = 0; t < valid; t++) {
        row[t] = expf(row[t] - mx);
        sum += row[t];
    }
    float inv = 1.0f / sum;
    for (int t = 0; t < valid; t++) row[t] *= inv;
    for (int t = valid; t < n; t++) row[t] = 0;
}

/* Few query rows (decoding): dot products directly, one row per iteration. */
static void attention_direct(float *out, const float *q, const float *k, const float *v, int ldkv,
                             int S, int p0, int Hq, int Hkv, int Dh, float scale, float *work) {
    int ctx = p0 + S, rep = Hq / Hkv;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < S * Hq; r++) {
        int s = r / Hq, h = r % Hq, j = h / rep;
        const float *qr = q + (long)r * Dh;
        float *sc = work + (long)r * ctx;
        int valid = p0 + s + 1;
        for (int t = 0; t < valid; t++) {
            const float *kt = k + (long)t * ldkv + (long)j * Dh;
            float d = 0;
            for (int i = 0; i < Dh; i++) d += qr[i] * kt[i];
            sc[t] = d;
        }
        masked_softmax(sc, valid, valid, scale);
        float *o = out + (long)r * Dh;
        memset(o, 0, sizeof(float) * (size_t)Dh);
        for (int t = 0; t < valid; t++) {
            const float *vt = v + (long)t * ldkv + (long)j * Dh;
            float p = sc[t];
            for (int i = 0; i < Dh; i++) o[i] += p * vt[i];
        }
    }
}

whale_code k_attention(whale_gemm *g, float *out, const float *q, const float *k, const float *v,
                       int ldkv, int S, int p0, int Hq, int Hkv, int Dh, float scale, float *work,
                       whale_err *err) {
    if (S * Hq <= ATT_DIRECT_ROWS) {
        attention_direct(out, q, k, v, ldkv, S, p0, Hq, Hkv, Dh, scale, work);
        return WHALE_OK;
    }
    int rep = Hq / Hkv;
    /* Query blocks: keys beyond the block's last position are never needed,
     * so causal attention costs about half of the full square. */
    for (int s0 = 0; s0 < S; s0 += ATT_QBLOCK) {
        int s1 = s0 + ATT_QBLOCK < S ? s0 + ATT_QBLOCK : S, nq = s1 - s0, ctx = p0 + s1;
        whale_code c;
        if (Hkv == 1) {
            /* one shared head: all query heads of the block form one matrix */
            int rows = nq * Hq;
            c = whale_gemm_nt(g, rows, ctx, Dh, q + (long)s0 * Hq * Dh, Dh, k, ldkv, work, ctx, 0, err);
            if (c) return c;
#pragma omp parallel for schedule(static)
            for (int r = 0; r < rows; r++) masked_softmax(work + (long)r * ctx, p0 + s0 + r / Hq + 1, ctx, scale);
            c = whale_gemm_nn(g, rows, Dh, ctx, work, ctx, v, ldkv, out + (long)s0 * Hq * Dh, Dh, 0, err);
            if (c) return c;
        } else {
            for (int h = 0; h < Hq; h++) {
                int j = h / rep;
                c = whale_gemm_nt(g, nq, ctx, Dh, q + (long)s0 * Hq * Dh + (long)h * Dh, Hq * Dh,
                                  k + (long)j * Dh, ldkv, work, ctx, 0, err);
                if (c) return c;
#pragma omp parallel for schedule(static)
                for (int r = 0; r < nq; r++) masked_softmax(work + (long)r * ctx, p0 + s0 + r + 1, ctx, scale);
                c = whale_gemm_nn(g, nq, Dh, ctx, work, ctx, v + (long)j * Dh, ldkv,
                                  out + (long)s0 * Hq * Dh + (long)h * Dh, Hq * Dh, 0, err);
                if (c) return c;
            }
        }
    }
    return WHALE_OK;
}
