/* The "ref" backend: each op as the plain statement of its mathematics,
 * one output element at a time, sums in double, no threads, no vector
 * code. It is slow on purpose and shares no code with the kernels but the
 * scalar bf16/fp16 roundings (convert.h): test_backend_ops checks the
 * "cpu" backend against it. Backward ops whose algebra is long (the
 * Sinkhorn coefficients, the MoE routing weights) take central
 * differences of the forward in double instead of a second derivation. */
#include "backend/backend.h"

#include "core/core.h"
#include "kernels/convert.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void ref_close(whale_backend *be) { free(be); }
static void *ref_alloc(whale_backend *be, size_t bytes) { return (void)be, whale_alloc(bytes ? bytes : 64); }
static void ref_free(whale_backend *be, void *buf) { (void)be, free(buf); }
static void ref_zero(whale_backend *be, void *buf, size_t bytes) { (void)be, memset(buf, 0, bytes); }
static void ref_copy(whale_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}
static whale_code ref_sync(whale_backend *be, whale_err *err) { return (void)be, (void)err, WHALE_OK; }

/* ------------------------------------------------------------------ products */

/* x rounded as a product in format f reads it (I8 nn: the scaled gradient
 * in bf16; I8 nt rounds A in blocks: a8_row) */
static double rnd(whale_dtype f, float x) {
    if (f == WHALE_BF16 || f == WHALE_I8) return whale_bf16_to_float(whale_float_to_bf16(x));
    if (f == WHALE_F16) return whale_f16_to_float(whale_float_to_f16(x));
    return x;
}

/* element (r, c) of a weight stored [rows, ld] */
static double wval(whale_wref W, int r, int c) {
    size_t i = (size_t)r * W.ld + c;
    switch (W.format) {
    case WHALE_BF16: return whale_bf16_to_float(((const uint16_t *)W.data)[i]);
    case WHALE_F16: return whale_f16_to_float(((const uint16_t *)W.data)[i]);
    case WHALE_I8: { /* packed: 16-row panels, groups of 4 columns, q + 128 */
        const size_t kp = ((size_t)W.ld + 31) / 32 * 32, g = (size_t)W.row0 + (size_t)r;
        const uint8_t *p = (const uint8_t *)W.data + g / 16 * 16 * kp + (size_t)c / 4 * 64 + g % 16 * 4 + (size_t)c % 4;
        return (int)*p - 128;
    }
    default: return ((const float *)W.data)[i];
    }
}

/* Row a [K] of an I8 product's A as it multiplies: in blocks of 32, d =
 * max |a| / 127 and a = d · round(a / d) (ties to even, clamped to ±127);
 * a block holding inf or NaN is NaN. */
static void a8_row(double *out, const float *a, int K) {
    for (int k0 = 0; k0 < K; k0 += 32) {
        const int n = K - k0 < 32 ? K - k0 : 32;
        float amax = 0;
        int finite = 1;
        for (int i = 0; i < n; i++) {
            finite &= isfinite(a[k0 + i]);
            if (fabsf(a[k0 + i]) > amax) amax = fabsf(a[k0 + i]);
        }
        const float d = amax / 127.0f;
        for (int i = 0; i < n; i++) {
            float q = d == 0 ? 0.0f : nearbyintf(a[k0 + i] / d);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            out[k0 + i] = finite ? (double)d * q : NAN;
        }
    }
}

static void store(float *c, double v, int accumulate) { *c = accumulate ? (float)(*c + v) : (float)v; }

static int known_format(whale_dtype f) { return f == WHALE_F32 || f == WHALE_BF16 || f == WHALE_F16 || f == WHALE_I8; }

static whale_code ref_matmul_nt(whale_backend *be, int M, int N, int K, const float *A, int lda, whale_wref W,
                                float *C, int ldc, int acc, whale_err *err) {
    (void)be;
    if (!known_format(W.format)) return whale_errf(err, WHALE_ERR_ARG, "no product with %s weights", whale_dtype_name(W.format));
    double *a = malloc(sizeof(double) * (size_t)(K ? K : 1));
    if (!a) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    for (int m = 0; m < M; m++) {
        const float *am = A + (size_t)m * lda;
        if (W.format == WHALE_I8) a8_row(a, am, K);
        else
            for (int k = 0; k < K; k++) a[k] = rnd(W.format, am[k]);
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += a[k] * wval(W, n, k);
            if (W.format == WHALE_I8) s *= W.scale[n];
            store(&C[(size_t)m * ldc + n], s, acc);
        }
    }
    free(a);
    return WHALE_OK;
}

/* C[M,N] = A[M,K] · B[K,N]; I8: A[m,k] · scale[k] rounded to bf16, times q[k,n] */
static whale_code ref_matmul_nn(whale_backend *be, int M, int N, int K, const float *A, int lda, whale_wref B,
                                float *C, int ldc, int acc, whale_err *err) {
    (void)be;
    if (!known_format(B.format)) return whale_errf(err, WHALE_ERR_ARG, "no product with %s weights", whale_dtype_name(B.format));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                float a = A[(size_t)m * lda + k];
                if (B.format == WHALE_I8) a *= B.scale[k];
                s += rnd(B.format, a) * wval(B, k, n);
            }
            store(&C[(size_t)m * ldc + n], s, acc);
        }
    return WHALE_OK;
}

static whale_code ref_matmul_tn(whale_backend *be, whale_dtype products, int M, int N, int K, const float *A,
                                int lda, const float *B, int ldb, float *C, int ldc, int acc, whale_err *err) {
    (void)be;
    if (products != WHALE_F32 && products != WHALE_BF16 && products != WHALE_F16)
        return whale_errf(err, WHALE_ERR_ARG, "no %s weight-gradient product", whale_dtype_name(products));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += rnd(products, A[(size_t)k * lda + m]) * rnd(products, B[(size_t)k * ldb + n]);
            store(&C[(size_t)m * ldc + n], s, acc);
        }
    return WHALE_OK;
}

static whale_code ref_matmul_nt_parts(whale_backend *be, whale_dtype format, int K, int n, const whale_mm_part *parts,
                                      int acc, whale_err *err) {
    for (int i = 0; i < n; i++) {
        const whale_mm_part *p = &parts[i];
        whale_code e = ref_matmul_nt(be, p->M, p->N, K, p->A, p->lda, (whale_wref){format, p->W, p->ldw, p->scale, p->row0},
                                     p->C, p->ldc, acc, err);
        if (e) return e;
    }
    return WHALE_OK;
}

static void ref_to_bf16(whale_backend *be, uint16_t *dst, const float *src, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) dst[i] = whale_float_to_bf16(src[i]);
}
static void ref_from_bf16(whale_backend *be, float *dst, const uint16_t *src, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) dst[i] = whale_bf16_to_float(src[i]);
}

static double b16(uint16_t h) { return whale_bf16_to_float(h); }

static whale_code ref_matmul_nn_b16(whale_backend *be, int M, int N, int K, const uint16_t *A, int lda, whale_wref B,
                                    float *C, int ldc, int acc, whale_err *err) {
    (void)be;
    if (B.format != WHALE_BF16) return whale_errf(err, WHALE_ERR_ARG, "a bf16 product with %s weights", whale_dtype_name(B.format));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += b16(A[(size_t)m * lda + k]) * wval(B, k, n);
            store(&C[(size_t)m * ldc + n], s, acc);
        }
    return WHALE_OK;
}

static whale_code ref_matmul_tn_b16(whale_backend *be, int M, int N, int K, const uint16_t *A, int lda,
                                    const uint16_t *B, int ldb, float *C, int ldc, int acc, whale_err *err) {
    (void)be, (void)err;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += b16(A[(size_t)k * lda + m]) * b16(B[(size_t)k * ldb + n]);
            store(&C[(size_t)m * ldc + n], s, acc);
        }
    return WHALE_OK;
}

/* ------------------------------------------------------------------ rows by index */

static void ref_get_rows(whale_backend *be, float *dst, int ldd, whale_wref W, const int32_t *ids, long n, int cols) {
    (void)be;
    for (long i = 0; i < n; i++)
        for (int d = 0; d < cols; d++)
            dst[i * ldd + d] = (float)(wval(W, ids[i], d) * (W.format == WHALE_I8 ? W.scale[ids[i]] : 1.0));
}
static void ref_gather_rows(whale_backend *be, float *dst, const float *src, int ld, const int32_t *idx,
                            const float *w, long n, int cols) {
    (void)be;
    for (long i = 0; i < n; i++)
        for (int d = 0; d < cols; d++) dst[i * cols + d] = (w ? w[i] : 1.0f) * src[(size_t)(idx ? idx[i] : i) * ld + d];
}
static void ref_gather_rows_bf16(whale_backend *be, uint16_t *dst, const float *src, int ld, const int32_t *idx,
                                 const float *w, long n, int cols) {
    (void)be;
    for (long i = 0; i < n; i++)
        for (int d = 0; d < cols; d++)
            dst[i * cols + d] = whale_float_to_bf16((w ? w[i] : 1.0f) * src[(size_t)(idx ? idx[i] : i) * ld + d]);
}
static void ref_scatter_add_rows(whale_backend *be, float *dst, int ldd, const float *src, int lds, const int32_t *idx,
                                 const float *w, long n, int cols) {
    (void)be;
    for (long i = 0; i < n; i++)
        for (int d = 0; d < cols; d++) dst[(size_t)(idx ? idx[i] : i) * ldd + d] += (w ? w[i] : 1.0f) * src[i * lds + d];
}
static void ref_dot_rows(whale_backend *be, float *out, const float *A, int lda, const int32_t *ia, const float *B,
                         int ldb, const int32_t *ib, long n, int cols) {
    (void)be;
    for (long i = 0; i < n; i++) {
        double s = 0;
        for (int d = 0; d < cols; d++)
            s += (double)A[(size_t)(ia ? ia[i] : i) * lda + d] * B[(size_t)(ib ? ib[i] : i) * ldb + d];
        out[i] = (float)s;
    }
}
static void ref_repeat_rows(whale_backend *be, float *dst, long rows, int times, int n) {
    (void)be;
    for (long r = 0; r < rows; r++)
        for (int j = 1; j < times; j++)
            for (int d = 0; d < n; d++) dst[(r * times + j) * n + d] = dst[r * times * n + d];
}
static void ref_scale_rows_backward(whale_backend *be, float *dy, float *ds, const float *y, const float *sc, long rows,
                                    int n) {
    (void)be;
    for (long r = 0; r < rows; r++) {
        double acc = 0;
        for (int k = 0; k < n; k++) acc += (double)dy[r * n + k] * y[r * n + k];
        ds[r] = (float)(acc / sc[r]);
        for (int k = 0; k < n; k++) dy[r * n + k] *= sc[r];
    }
}

/* ------------------------------------------------------------------ row ops */

static double rms_of(const float *x, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return 1.0 / sqrt(ss / n + eps);
}

static void ref_rmsnorm(whale_backend *be, float *y, const float *x, const float *w, long rows, int n, float eps,
                        float *rstd) {
    (void)be;
    for (long r = 0; r < rows; r++) {
        double rs = rms_of(x + r * n, n, eps);
        if (rstd) rstd[r] = (float)rs;
        for (int i = 0; i < n; i++) y[r * n + i] = (float)((w ? w[i] : 1.0) * x[r * n + i] * rs);
    }
}

/* y = w ⊙ x·r, r = (mean x² + eps)^(−1/2): dx_i = r·g_i − r³/n · (g·x) · x_i, g = dy ⊙ w */
static void ref_rmsnorm_backward(whale_backend *be, float *dx, float *dw, const float *dy, const float *x,
                                 const float *w, const float *rstd, long rows, int n) {
    (void)be;
    for (int i = 0; dw && i < n; i++) {
        double s = 0;
        for (long r = 0; r < rows; r++) s += (double)dy[r * n + i] * x[r * n + i] * rstd[r];
        dw[i] += (float)s;
    }
    double *g = malloc(sizeof(double) * (size_t)n);
    for (long r = 0; g && r < rows; r++) {
        double rs = rstd[r], gx = 0;
        for (int i = 0; i < n; i++) gx += (g[i] = (double)dy[r * n + i] * (w ? w[i] : 1.0)) * x[r * n + i];
        for (int i = 0; i < n; i++) dx[r * n + i] = (float)(rs * g[i] - rs * rs * rs / n * gx * x[r * n + i]);
    }
    free(g);
}

/* the last R dims of each head, pairs (j, j + R/2), rotated by ∓angle */
static void ref_rope(whale_backend *be, float *x, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
                     const float *cos_t, const float *sin_t, int inverse) {
    (void)be;
    int half = R / 2;
    for (long r = 0; r < rows; r++)
        for (int h = 0; h < nh; h++)
            for (int j = 0; j < half; j++) {
                float *a = x + r * ld + (long)h * hd + (hd - R) + j, *b = a + half;
                double c = cos_t[(long)pos[r] * half + j], s = sin_t[(long)pos[r] * half + j];
                if (inverse) s = -s;
                double aj = *a, bj = *b;
                *a = (float)(aj * c + bj * s);
                *b = (float)(bj * c - aj * s);
            }
}

/* the rotation is orthogonal: its transpose is the opposite rotation */
static void ref_rope_backward(whale_backend *be, float *dx, long rows, int ld, int nh, int hd, int R,
                              const int32_t *pos, const float *cos_t, const float *sin_t, int inverse) {
    ref_rope(be, dx, rows, ld, nh, hd, R, pos, cos_t, sin_t, !inverse);
}

static double silu(double x) { return x / (1.0 + exp(-x)); }

static void ref_swiglu(whale_backend *be, float *g, const float *u, long n, float limit) {
    (void)be;
    for (long i = 0; i < n; i++) {
        double gi = g[i], ui = u[i];
        if (limit > 0) gi = fmin(gi, limit), ui = fmin(fmax(ui, -limit), limit);
        g[i] = (float)(silu(gi) * ui);
    }
}

static void ref_swiglu_backward(whale_backend *be, float *dg, float *du, const float *dh, const float *g,
                                const float *u, long n, float limit) {
    (void)be;
    for (long i = 0; i < n; i++) {
        double gi = g[i], ui = u[i], d = dh[i];
        int gpass = !(limit > 0) || gi <= limit, upass = !(limit > 0) || (ui >= -limit && ui <= limit);
        if (limit > 0) gi = fmin(gi, limit), ui = fmin(fmax(ui, -limit), limit);
        double sg = 1.0 / (1.0 + exp(-gi)), dsilu = sg * (1.0 + gi * (1.0 - sg));
        double vdg = gpass ? d * ui * dsilu : 0, vdu = upass ? d * silu(gi) : 0;
        dg[i] = (float)vdg, du[i] = (float)vdu;
    }
}

static void ref_swiglu_backward_bf16(whale_backend *be, uint16_t *dg16, uint16_t *du16, const float *dh,
                                     const float *g, const float *u, long n, float limit) {
    float dg, du;
    for (long i = 0; i < n; i++) {
        ref_swiglu_backward(be, &dg, &du, dh + i, g + i, u + i, 1, limit);
        dg16[i] = whale_float_to_bf16(dg), du16[i] = whale_float_to_bf16(du);
    }
}

static void ref_add(whale_backend *be, float *y, const float *a, const float *b, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}
static void ref_add_rows(whale_backend *be, float *y, const float *b, long rows, int n) {
    (void)be;
    for (long r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) y[r * n + i] += b[i];
}
static void ref_add_rows_backward(whale_backend *be, float *db, const float *dy, long rows, int n) {
    (void)be;
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (long r = 0; r < rows; r++) s += dy[r * n + i];
        db[i] += (float)s;
    }
}

/* ------------------------------------------------------------------ attention */

static size_t ref_att_work(whale_backend *be, int max_ctx, int Hq, int Hkv, int Dh) {
    return (void)be, (void)max_ctx, (void)Hq, (void)Hkv, (void)Dh, 1;
}

/* The products' format: bf16 only for whole sequences (p0 = 0) beyond the
 * few-row case (k_attention's contract); fp32 otherwise. */
static whale_dtype att_format(whale_dtype products, int S, int p0, int Hq, int Hkv) {
    int few = S * Hq <= 4 || (S <= 4 && Hkv > 1);
    return products == WHALE_BF16 && p0 == 0 && !few ? WHALE_BF16 : WHALE_F32;
}

/* probabilities p [ctx] of query s, head h (keys first..p0+s), as doubles */
static int att_probs(double *p, const float *q, const float *k, int ldkv, const int32_t *seg, int s, int p0, int h,
                     int rep, int Dh, float scale, whale_dtype f, int Hq) {
    int first = seg ? seg[s] : 0, last = p0 + s;
    const float *qs = q + ((size_t)s * Hq + h) * Dh;
    double mx = -INFINITY, sum = 0;
    for (int j = first; j <= last; j++) {
        const float *kj = k + (size_t)j * ldkv + (size_t)(h / rep) * Dh;
        double d = 0;
        for (int i = 0; i < Dh; i++) d += rnd(f, qs[i]) * rnd(f, kj[i]);
        p[j] = d * scale;
        mx = fmax(mx, p[j]);
    }
    for (int j = first; j <= last; j++) sum += (p[j] = exp(p[j] - mx));
    for (int j = first; j <= last; j++) p[j] /= sum;
    return first;
}

static whale_code ref_attention(whale_backend *be, float *out, const float *q, const float *k, const float *v,
                                int ldkv, const int32_t *seg, int S, int p0, int Hq, int Hkv, int Dh, float scale,
                                whale_dtype products, float *work, whale_err *err) {
    (void)be, (void)work;
    whale_dtype f = att_format(products, S, p0, Hq, Hkv);
    double *p = malloc(sizeof(double) * (size_t)(p0 + S));
    if (!p) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory in the reference attention");
    int rep = Hq / Hkv;
    for (int s = 0; s < S; s++)
        for (int h = 0; h < Hq; h++) {
            int first = att_probs(p, q, k, ldkv, seg, s, p0, h, rep, Dh, scale, f, Hq);
            for (int i = 0; i < Dh; i++) {
                double o = 0;
                for (int j = first; j <= p0 + s; j++)
                    o += rnd(f, (float)p[j]) * rnd(f, v[(size_t)j * ldkv + (size_t)(h / rep) * Dh + i]);
                out[((size_t)s * Hq + h) * Dh + i] = (float)o;
            }
        }
    free(p);
    return WHALE_OK;
}

static whale_code ref_attention_spans(whale_backend *be, const whale_att_span *spans, int n, int Hq, int Hkv, int Dh,
                                      float scale, whale_dtype products, float *work, whale_err *err) {
    for (int i = 0; i < n; i++) {
        const whale_att_span *sp = &spans[i];
        whale_code c = ref_attention(be, sp->out, sp->q, sp->k, sp->v, sp->ldkv, sp->seg, sp->S, sp->p0, Hq, Hkv, Dh,
                                     scale, products, work, err);
        if (c) return c;
    }
    return WHALE_OK;
}

/* o = Σ_j p_j v_j, p = softmax(scale·q·k): dv_j += p_j·do, dp_j = do·v_j,
 * dz_j = p_j (dp_j − Σ p·dp), dq = scale Σ dz_j k_j, dk_j += scale dz_j q
 * (fp32 products: the check of the bf16 forms is the forward's) */
static whale_code ref_attention_backward(whale_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v, int ldkv, const int32_t *seg,
                                         int S, int p0, int Hq, int Hkv, int Dh, float scale, whale_dtype products,
                                         float *work, whale_err *err) {
    (void)be, (void)work, (void)products;
    double *p = malloc(sizeof(double) * (size_t)(p0 + S)), *dp = malloc(sizeof(double) * (size_t)(p0 + S));
    if (!p || !dp) {
        free(p), free(dp);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory in the reference attention");
    }
    int rep = Hq / Hkv;
    for (int s = 0; s < S; s++)
        for (int h = 0; h < Hq; h++) {
            int first = att_probs(p, q, k, ldkv, seg, s, p0, h, rep, Dh, scale, WHALE_F32, Hq), last = p0 + s;
            const float *dos = dout + ((size_t)s * Hq + h) * Dh, *qs = q + ((size_t)s * Hq + h) * Dh;
            size_t col = (size_t)(h / rep) * Dh;
            double pdp = 0;
            for (int j = first; j <= last; j++) {
                double d = 0;
                for (int i = 0; i < Dh; i++) d += (double)dos[i] * v[(size_t)j * ldkv + col + i];
                dp[j] = d, pdp += p[j] * d;
            }
            float *dqs = dq + ((size_t)s * Hq + h) * Dh;
            for (int i = 0; i < Dh; i++) {
                double g = 0;
                for (int j = first; j <= last; j++) g += p[j] * (dp[j] - pdp) * k[(size_t)j * ldkv + col + i];
                dqs[i] = (float)(scale * g);
            }
            for (int j = first; j <= last; j++) {
                double dz = p[j] * (dp[j] - pdp);
                for (int i = 0; i < Dh; i++) {
                    dk[(size_t)j * ldkv + col + i] += (float)(scale * dz * qs[i]);
                    dv[(size_t)j * ldkv + col + i] += (float)(p[j] * dos[i]);
                }
            }
        }
    free(p), free(dp);
    return WHALE_OK;
}

/* ------------------------------------------------------------------ hyper-connections */

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* k_hc_coeffs in double: pre, post [M], comb [M·M] from mix [(2+M)·M] */
static void hc_one(const double *mix, const float *scale, const float *base, int M, int iters, double eps,
                   double *pre, double *post, double *comb) {
    for (int m = 0; m < M; m++) {
        pre[m] = sigm(mix[m] * scale[0] + base[m]) + eps;
        post[m] = 2 * sigm(mix[M + m] * scale[1] + base[M + m]);
    }
    for (int i = 0; i < M; i++) { /* row softmax + eps */
        double mx = -INFINITY, sum = 0, *row = comb + i * M;
        for (int j = 0; j < M; j++) mx = fmax(mx, row[j] = mix[2 * M + i * M + j] * scale[2] + base[2 * M + i * M + j]);
        for (int j = 0; j < M; j++) sum += (row[j] = exp(row[j] - mx));
        for (int j = 0; j < M; j++) row[j] = row[j] / sum + eps;
    }
    for (int it = 0; it < 2 * iters - 1; it++) /* column, row, column, …: 2·iters − 1 normalisations */
        for (int a = 0; a < M; a++) { /* line a: column a, or row a on odd steps */
            double sum = eps, *c = it % 2 ? comb + a * M : comb + a;
            int st = it % 2 ? 1 : M;
            for (int b = 0; b < M; b++) sum += c[b * st];
            for (int b = 0; b < M; b++) c[b * st] /= sum;
        }
}

static void ref_hc_coeffs(whale_backend *be, long T, float *mix, const float *rstd, const float *scale,
                          const float *base, int M, int iters, float eps, float *pre, float *post, float *comb) {
    (void)be;
    int n = (2 + M) * M;
    double *dm = malloc(sizeof(double) * (size_t)(n + 2 * M + M * M));
    if (!dm) return;
    double *pr = dm + n, *po = pr + M, *cb = po + M;
    for (long t = 0; t < T; t++) {
        for (int i = 0; i < n; i++) dm[i] = mix[t * n + i] = mix[t * n + i] * rstd[t];
        hc_one(dm, scale, base, M, iters, eps, pr, po, cb);
        for (int m = 0; m < M; m++) pre[t * M + m] = (float)pr[m], post[t * M + m] = (float)po[m];
        for (int i = 0; i < M * M; i++) comb[t * M * M + i] = (float)cb[i];
    }
    free(dm);
}

/* Σ dpre·pre + dpost·post + dcomb·comb at mix + δ·e_i, for central differences */
static double hc_loss(double *mix, const float *scale, const float *base, int M, int iters, double eps,
                      const float *dpre, const float *dpost, const float *dcomb, double *buf) {
    double *pr = buf, *po = pr + M, *cb = po + M, l = 0;
    hc_one(mix, scale, base, M, iters, eps, pr, po, cb);
    for (int m = 0; m < M; m++) l += dpre[m] * pr[m] + (dpost ? dpost[m] * po[m] : 0);
    for (int i = 0; dcomb && i < M * M; i++) l += dcomb[i] * cb[i];
    return l;
}

static void ref_hc_coeffs_backward(whale_backend *be, long T, const float *mix, const float *scale,
                                   const float *base, int M, int iters, float eps, const float *dpre,
                                   const float *dpost, const float *dcomb, float *dmix, float *dscale, float *dbase) {
    (void)be;
    int n = (2 + M) * M;
    double *x = malloc(sizeof(double) * (size_t)(n + 2 * M + M * M)), *buf = x + n, h = 1e-5;
    if (!x) return;
    float sc[3] = {scale[0], scale[1], scale[2]};
    double ds[3] = {0}, *db = calloc((size_t)n, sizeof(double));
    for (long t = 0; db && t < T; t++) {
        const float *dp = dpre + t * M, *dq = dpost ? dpost + t * M : NULL, *dc = dcomb ? dcomb + t * M * M : NULL;
        for (int i = 0; i < n; i++) x[i] = mix[t * n + i];
        for (int i = 0; i < n; i++) { /* d/dmix_i; dbase_i = d/dmix_i / scale: both from one difference on mix */
            double x0 = x[i];
            x[i] = x0 + h;
            double lp = hc_loss(x, sc, base, M, iters, eps, dp, dq, dc, buf);
            x[i] = x0 - h;
            double lm = hc_loss(x, sc, base, M, iters, eps, dp, dq, dc, buf);
            x[i] = x0;
            double g = (lp - lm) / (2 * h);
            int grp = i < M ? 0 : i < 2 * M ? 1 : 2;
            dmix[t * n + i] = (float)g;
            db[i] += g / sc[grp]; /* the argument is mix·scale + base */
            ds[grp] += g * x0 / sc[grp];
        }
    }
    for (int i = 0; i < 3; i++) dscale[i] += (float)ds[i];
    for (int i = 0; db && i < n; i++) dbase[i] += (float)db[i];
    free(x), free(db);
}

static void ref_hc_head_coeffs(whale_backend *be, long T, float *mix, const float *rstd, const float *scale,
                               const float *base, int M, float eps, float *pre) {
    (void)be;
    for (long t = 0; t < T; t++)
        for (int m = 0; m < M; m++) {
            mix[t * M + m] *= rstd[t];
            pre[t * M + m] = (float)(sigm((double)mix[t * M + m] * scale[0] + base[m]) + eps);
        }
}

/* pre = σ(s·mix + b) + eps: dmix = dpre σ(1 − σ) s, dbase += dpre σ(1 − σ), dscale += dpre σ(1 − σ) mix */
static void ref_hc_head_coeffs_backward(whale_backend *be, long T, const float *mix, const float *scale,
                                        const float *base, int M, float eps, const float *dpre, float *dmix,
                                        float *dscale, float *dbase) {
    (void)be, (void)eps;
    double ds = 0;
    double *db = calloc((size_t)M, sizeof(double));
    for (long t = 0; db && t < T; t++)
        for (int m = 0; m < M; m++) {
            double sg = sigm((double)mix[t * M + m] * scale[0] + base[m]), g = dpre[t * M + m] * sg * (1 - sg);
            dmix[t * M + m] = (float)(g * scale[0]);
            db[m] += g, ds += g * mix[t * M + m];
        }
    dscale[0] += (float)ds;
    for (int m = 0; db && m < M; m++) dbase[m] += (float)db[m];
    free(db);
}

static void ref_hc_reduce(whale_backend *be, float *y, const float *X, const float *pre, long rows, int M, int D) {
    (void)be;
    for (long r = 0; r < rows; r++)
        for (int d = 0; d < D; d++) {
            double s = 0;
            for (int m = 0; m < M; m++) s += (double)pre[r * M + m] * X[(r * M + m) * D + d];
            y[r * D + d] = (float)s;
        }
}

static void ref_hc_reduce_backward(whale_backend *be, float *dX, float *dpre, const float *dy, const float *X,
                                   const float *pre, long rows, int M, int D) {
    (void)be;
    for (long r = 0; r < rows; r++)
        for (int m = 0; m < M; m++) {
            double s = 0;
            for (int d = 0; d < D; d++) {
                s += (double)dy[r * D + d] * X[(r * M + m) * D + d];
                dX[(r * M + m) * D + d] += pre[r * M + m] * dy[r * D + d];
            }
            dpre[r * M + m] = (float)s;
        }
}

static void ref_hc_expand(whale_backend *be, float *Xout, const float *o, const float *X, const float *post,
                          const float *comb, long rows, int M, int D) {
    (void)be;
    for (long r = 0; r < rows; r++)
        for (int i = 0; i < M; i++)
            for (int d = 0; d < D; d++) {
                double s = (double)post[r * M + i] * o[r * D + d];
                for (int j = 0; j < M; j++) s += (double)comb[(r * M + i) * M + j] * X[(r * M + j) * D + d];
                Xout[(r * M + i) * D + d] = (float)s;
            }
}

static void ref_hc_expand_backward(whale_backend *be, float *dout, float *dX, float *dpost, float *dcomb,
                                   const float *dXout, const float *o, const float *X, const float *post,
                                   const float *comb, long rows, int M, int D) {
    (void)be;
    for (long r = 0; r < rows; r++) {
        const float *g = dXout + r * M * D;
        for (int d = 0; d < D; d++) {
            double s = 0;
            for (int i = 0; i < M; i++) s += (double)post[r * M + i] * g[i * D + d];
            dout[r * D + d] = (float)s;
        }
        for (int i = 0; i < M; i++) {
            double s = 0;
            for (int d = 0; d < D; d++) s += (double)g[i * D + d] * o[r * D + d];
            dpost[r * M + i] = (float)s;
            for (int j = 0; j < M; j++) {
                double c = 0;
                for (int d = 0; d < D; d++) c += (double)g[i * D + d] * X[(r * M + j) * D + d];
                dcomb[(r * M + i) * M + j] = (float)c;
            }
        }
        for (int j = 0; j < M; j++)
            for (int d = 0; d < D; d++) {
                double s = 0;
                for (int i = 0; i < M; i++) s += (double)comb[(r * M + i) * M + j] * g[i * D + d];
                dX[(r * M + j) * D + d] += (float)s;
            }
    }
}

static void ref_hc_rstd(whale_backend *be, float *rstd, const float *X, long rows, int MD, float eps) {
    (void)be;
    for (long r = 0; r < rows; r++) rstd[r] = (float)rms_of(X + r * MD, MD, eps);
}

/* rstd = (mean x² + eps)^(−1/2) ⇒ ∂rstd/∂x_i = −rstd³ x_i / n */
static void ref_rstd_backward(whale_backend *be, float *dx, const float *x, const float *rstd, const float *drstd,
                              long rows, int n) {
    (void)be;
    for (long r = 0; r < rows; r++) {
        double c = -(double)drstd[r] * rstd[r] * rstd[r] * rstd[r] / n;
        for (int i = 0; i < n; i++) dx[r * n + i] += (float)(c * x[r * n + i]);
    }
}

/* ------------------------------------------------------------------ routing */

/* the unbiased scores s_e of one token */
static void scores(int scoring, int E, const double *logit, double *s) {
    if (scoring == NW_SCORE_SOFTMAX) {
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, logit[e]);
        for (int e = 0; e < E; e++) sum += (s[e] = exp(logit[e] - mx));
        for (int e = 0; e < E; e++) s[e] /= sum;
    } else
        for (int e = 0; e < E; e++)
            s[e] = scoring == NW_SCORE_SIGMOID ? sigm(logit[e])
                                               : sqrt(logit[e] > 20 ? logit[e] : log1p(exp(logit[e])));
}

/* the routing weights of the chosen experts idx [K] */
static void route_weights(int scoring, int E, int K, double scale, const double *logit, const int32_t *idx,
                          double *s, double *w) {
    scores(scoring, E, logit, s);
    double sum = 0;
    for (int k = 0; k < K; k++) sum += s[idx[k]];
    for (int k = 0; k < K; k++) w[k] = scale * (scoring == NW_SCORE_SOFTMAX ? s[idx[k]] : s[idx[k]] / (sum + 1e-20));
}

static void ref_gate_route(whale_backend *be, long T, int scoring, int E, int K, float scale, const float *logit,
                           const float *bias, int32_t *idx, float *w) {
    (void)be;
    double *l = malloc(sizeof(double) * (size_t)(3 * E + K)), *s = l + E, *sel = s + E, *wk = sel + E;
    for (long t = 0; l && t < T; t++) {
        for (int e = 0; e < E; e++) l[e] = logit[t * E + e];
        scores(scoring, E, l, s);
        for (int e = 0; e < E; e++) sel[e] = s[e] + (bias ? bias[e] : 0);
        for (int k = 0; k < K; k++) { /* the largest remaining, ties to the lower index */
            int best = -1;
            for (int e = 0; e < E; e++)
                if (sel[e] > -INFINITY && (best < 0 || sel[e] > sel[best])) best = e;
            for (int e = 0; best < 0 && e < E; e++) { /* NaN scores: the lowest expert not taken */
                int taken = 0;
                for (int k2 = 0; k2 < k; k2++) taken |= idx[t * K + k2] == e;
                if (!taken) best = e;
            }
            idx[t * K + k] = best;
            sel[best] = -INFINITY;
        }
        route_weights(scoring, E, K, scale, l, idx + t * K, s, wk);
        for (int k = 0; k < K; k++) w[t * K + k] = (float)wk[k];
    }
    free(l);
}

static void ref_gate_route_backward(whale_backend *be, long T, int scoring, int E, int K, float scale,
                                    const float *logit, const int32_t *idx, const float *dw, float *dlogit) {
    (void)be;
    double *l = malloc(sizeof(double) * (size_t)(2 * E + K)), *s = l + E, *w = s + E, h = 1e-6;
    for (long t = 0; l && t < T; t++) {
        for (int e = 0; e < E; e++) l[e] = logit[t * E + e];
        for (int e = 0; e < E; e++) { /* the selection is fixed: w(logit) is smooth */
            double l0 = l[e], lp = 0, lm = 0;
            l[e] = l0 + h;
            route_weights(scoring, E, K, scale, l, idx + t * K, s, w);
            for (int k = 0; k < K; k++) lp += dw[t * K + k] * w[k];
            l[e] = l0 - h;
            route_weights(scoring, E, K, scale, l, idx + t * K, s, w);
            for (int k = 0; k < K; k++) lm += dw[t * K + k] * w[k];
            l[e] = l0;
            dlogit[t * E + e] = (float)((lp - lm) / (2 * h));
        }
    }
    free(l);
}

static const whale_backend ref_table = {
    .version = WHALE_BACKEND_VERSION,
    .name = "ref",
    .close = ref_close,
    .buf_alloc = ref_alloc,
    .buf_free = ref_free,
    .buf_zero = ref_zero,
    .buf_copy = ref_copy,
    .buf_to_host = ref_copy,
    .buf_from_host = ref_copy,
    .sync = ref_sync,
    .matmul_nt = ref_matmul_nt,
    .matmul_nn = ref_matmul_nn,
    .matmul_tn = ref_matmul_tn,
    .matmul_nt_parts = ref_matmul_nt_parts,
    .matmul_nn_b16 = ref_matmul_nn_b16,
    .matmul_tn_b16 = ref_matmul_tn_b16,
    .get_rows = ref_get_rows,
    .gather_rows = ref_gather_rows,
    .gather_rows_bf16 = ref_gather_rows_bf16,
    .scatter_add_rows = ref_scatter_add_rows,
    .dot_rows = ref_dot_rows,
    .repeat_rows = ref_repeat_rows,
    .scale_rows_backward = ref_scale_rows_backward,
    .swiglu_backward_bf16 = ref_swiglu_backward_bf16,
    .to_bf16 = ref_to_bf16,
    .from_bf16 = ref_from_bf16,
    .rmsnorm = ref_rmsnorm,
    .rmsnorm_backward = ref_rmsnorm_backward,
    .rope = ref_rope,
    .rope_backward = ref_rope_backward,
    .swiglu = ref_swiglu,
    .swiglu_backward = ref_swiglu_backward,
    .add = ref_add,
    .add_rows = ref_add_rows,
    .add_rows_backward = ref_add_rows_backward,
    .attention_work_floats = ref_att_work,
    .attention_backward_work_floats = ref_att_work,
    .attention = ref_attention,
    .attention_backward = ref_attention_backward,
    .hc_coeffs = ref_hc_coeffs,
    .hc_coeffs_backward = ref_hc_coeffs_backward,
    .hc_head_coeffs = ref_hc_head_coeffs,
    .hc_head_coeffs_backward = ref_hc_head_coeffs_backward,
    .hc_reduce = ref_hc_reduce,
    .hc_reduce_backward = ref_hc_reduce_backward,
    .hc_expand = ref_hc_expand,
    .hc_expand_backward = ref_hc_expand_backward,
    .hc_rstd = ref_hc_rstd,
    .rstd_backward = ref_rstd_backward,
    .gate_route = ref_gate_route,
    .gate_route_backward = ref_gate_route_backward,
    .attention_spans = ref_attention_spans,
};

whale_code whale_backend_ref_open(whale_backend **out, whale_err *err) {
    *out = malloc(sizeof **out);
    if (!*out) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the ref backend");
    **out = ref_table;
    return WHALE_OK;
}

static const struct {
    const char *name;
    whale_code (*open)(whale_backend **out, whale_err *err);
} backends[] = {{"cpu", whale_backend_cpu_open}, {"ref", whale_backend_ref_open}};

whale_code whale_backend_open(const char *name, whale_backend **out, whale_err *err) {
    *out = NULL;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (strcmp(backends[i].name, name) == 0) return backends[i].open(out, err);
    return whale_errf(err, WHALE_ERR_ARG, "unknown backend \"%s\" (cpu, ref)", name);
}

void whale_backend_close(whale_backend *be) {
    if (be) be->close(be);
}
