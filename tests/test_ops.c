/* Each forward op against a double-precision evaluation of its definition. */
#include "testutil.h"

#include "core/core.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/hc.h"
#include "kernels/ops.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static void fill(whale_rng *r, float *x, long n, double std) {
    for (long i = 0; i < n; i++) x[i] = (float)(whale_rng_normal(r) * std);
}

static void test_rmsnorm(whale_rng *r) {
    enum { ROWS = 7, N = 320 };
    float x[ROWS * N], w[N], y[ROWS * N], yw[ROWS * N], rs[ROWS];
    fill(r, x, ROWS * N, 3.0);
    fill(r, w, N, 1.0);
    k_rmsnorm(y, x, NULL, ROWS, N, 1e-6f, rs);
    k_rmsnorm(yw, x, w, ROWS, N, 1e-6f, NULL);
    double maxerr = 0;
    for (int i = 0; i < ROWS; i++) {
        double ss = 0;
        for (int j = 0; j < N; j++) ss += (double)x[i * N + j] * x[i * N + j];
        double inv = 1.0 / sqrt(ss / N + 1e-6);
        CHECK(fabs(rs[i] - inv) <= 1e-6 * inv, "rstd row %d", i);
        for (int j = 0; j < N; j++) {
            maxerr = fmax(maxerr, fabs(y[i * N + j] - x[i * N + j] * inv));
            maxerr = fmax(maxerr, fabs(yw[i * N + j] - w[j] * x[i * N + j] * inv));
        }
    }
    CHECK(maxerr < 1e-5, "rmsnorm max err %g", maxerr);
    /* in place, all-zero row: eps keeps it finite */
    memset(x, 0, sizeof(float) * N);
    k_rmsnorm(x, x, w, 1, N, 1e-6f, NULL);
    int finite = 1;
    for (int j = 0; j < N; j++) finite &= x[j] == 0.0f;
    CHECK(finite, "zero row stays zero");
}

static void test_rope(whale_rng *r) {
    enum { ROWS = 5, NH = 3, HD = 12, R = 8, MAXPOS = 64 };
    float cos_t[MAXPOS * R / 2], sin_t[MAXPOS * R / 2];
    k_rope_table(cos_t, sin_t, MAXPOS, R, 10000.0f);
    /* table: angle p / theta^(2j/R) */
    double terr = 0;
    for (int p = 0; p < MAXPOS; p++)
        for (int j = 0; j < R / 2; j++) {
            double a = p / pow(10000.0, 2.0 * j / R);
            terr = fmax(terr, fabs(cos_t[p * R / 2 + j] - cos(a)) + fabs(sin_t[p * R / 2 + j] - sin(a)));
        }
    CHECK(terr < 1e-4, "rope table err %g", terr);
    float x[ROWS * NH * HD], y[ROWS * NH * HD];
    int32_t pos[ROWS] = {0, 1, 7, 33, 63};
    fill(r, x, ROWS * NH * HD, 1.0);
    memcpy(y, x, sizeof x);
    k_rope(y, ROWS, NH * HD, NH, HD, R, pos, cos_t, sin_t, 0);
    double err = 0;
    for (int i = 0; i < ROWS; i++)
        for (int h = 0; h < NH; h++) {
            const float *xin = x + i * NH * HD + h * HD;
            const float *yo = y + i * NH * HD + h * HD;
            for (int d = 0; d < HD - R; d++) err = fmax(err, fabs(yo[d] - xin[d])); /* nope dims untouched */
            for (int j = 0; j < R / 2; j++) {
                double c = cos_t[pos[i] * R / 2 + j], s = sin_t[pos[i] * R / 2 + j];
                double a = xin[HD - R + j], b = xin[HD - R + R / 2 + j];
                err = fmax(err, fabs(yo[HD - R + j] - (a * c + b * s)));          /* rotation by −angle */
                err = fmax(err, fabs(yo[HD - R + R / 2 + j] - (-a * s + b * c)));
            }
        }
    CHECK(err < 1e-6, "rope forward err %g", err);
    k_rope(y, ROWS, NH * HD, NH, HD, R, pos, cos_t, sin_t, 1);
    double back = test_max_abs_diff(x, y, ROWS * NH * HD);
    CHECK(back < 1e-6, "de-rotation undoes rotation: err %g", back);
}

/* double-precision HC coefficients, straight from the definition */
static void hc_coeffs_ref(const float *mix, const float *scale, const float *base, int M, int iters, double eps,
                          double *pre, double *post, double *comb) {
    for (int m = 0; m < M; m++) {
        pre[m] = 1 / (1 + exp(-((double)mix[m] * scale[0] + base[m]))) + eps;
        post[m] = 2 / (1 + exp(-((double)mix[M + m] * scale[1] + base[M + m])));
    }
    for (int i = 0; i < M; i++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < M; j++) {
            comb[i * M + j] = (double)mix[2 * M + i * M + j] * scale[2] + base[2 * M + i * M + j];
            mx = fmax(mx, comb[i * M + j]);
        }
        for (int j = 0; j < M; j++) sum += (comb[i * M + j] = exp(comb[i * M + j] - mx));
        for (int j = 0; j < M; j++) comb[i * M + j] = comb[i * M + j] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it)
            for (int i = 0; i < M; i++) {
                double sum = eps;
                for (int j = 0; j < M; j++) sum += comb[i * M + j];
                for (int j = 0; j < M; j++) comb[i * M + j] /= sum;
            }
        for (int j = 0; j < M; j++) {
            double sum = eps;
            for (int i = 0; i < M; i++) sum += comb[i * M + j];
            for (int i = 0; i < M; i++) comb[i * M + j] /= sum;
        }
    }
}

static void test_hc(whale_rng *r) {
    enum { M = 4, MIX = (2 + M) * M, D = 16, T = 3 };
    static const int iter_counts[] = {1, 3, 20};
    for (int ic = 0; ic < 3; ic++) {
        int iters = iter_counts[ic];
        for (int trial = 0; trial < 50; trial++) {
            float mix[MIX], base[MIX], scale[3], pre[M], post[M], comb[M * M];
            double rpre[M], rpost[M], rcomb[M * M];
            fill(r, mix, MIX, 2.0);
            fill(r, base, MIX, 1.0);
            fill(r, scale, 3, 1.0);
            k_hc_coeffs(mix, scale, base, M, iters, 1e-6f, pre, post, comb);
            hc_coeffs_ref(mix, scale, base, M, iters, 1e-6, rpre, rpost, rcomb);
            double err = 0;
            for (int m = 0; m < M; m++) err = fmax(err, fabs(pre[m] - rpre[m]) + fabs(post[m] - rpost[m]));
            for (int i = 0; i < M * M; i++) err = fmax(err, fabs(comb[i] - rcomb[i]));
            CHECK(err < 2e-6, "hc coeffs (iters %d) err %g", iters, err);
            for (int j = 0; j < M; j++) { /* the last step normalises columns: sum/(sum+eps) */
                double col = 0;
                for (int i = 0; i < M; i++) col += comb[i * M + j];
                CHECK(col <= 1 + 1e-6 && col > 1 - 1e-3, "column %d sums to %g", j, col);
            }
        }
    }
    /* reduce and expand (nanowhale orientation: row i of comb makes stream i) */
    float X[T * M * D], o[T * D], pre[T * M], post[T * M], comb[T * M * M], y[T * D], Xo[T * M * D];
    fill(r, X, T * M * D, 1.0);
    fill(r, o, T * D, 1.0);
    fill(r, pre, T * M, 1.0);
    fill(r, post, T * M, 1.0);
    fill(r, comb, T * M * M, 1.0);
    k_hc_reduce(y, X, pre, T, M, D);
    k_hc_expand(Xo, o, X, post, comb, T, M, D);
    double err = 0;
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int m = 0; m < M; m++) acc += (double)pre[t * M + m] * X[(t * M + m) * D + d];
            err = fmax(err, fabs(y[t * D + d] - acc));
            for (int i = 0; i < M; i++) {
                double v = (double)post[t * M + i] * o[t * D + d];
                for (int j = 0; j < M; j++) v += (double)comb[t * M * M + i * M + j] * X[(t * M + j) * D + d];
                err = fmax(err, fabs(Xo[(t * M + i) * D + d] - v));
            }
        }
    CHECK(err < 1e-5, "hc reduce/expand err %g", err);
}

static void test_gate(whale_rng *r) {
    enum { E = 6, K = 2 };
    for (int trial = 0; trial < 200; trial++) {
        float logit[E], bias[E], w[K];
        int32_t idx[K];
        fill(r, logit, E, trial < 100 ? 2.0 : 30.0); /* second half crosses the softplus threshold */
        fill(r, bias, E, 0.5);
        k_gate_route(NW_SCORE_SQRTSOFTPLUS, E, K, 1.5f, logit, bias, idx, w);
        double s[E], sel[E];
        for (int e = 0; e < E; e++) {
            double x = logit[e];
            s[e] = sqrt(x > 20 ? x : log1p(exp(x)));
            sel[e] = s[e] + bias[e];
        }
        /* chosen experts have the K largest biased scores, in order */
        for (int k = 0; k < K; k++)
            for (int e = 0; e < E; e++) {
                int chosen_before = 0;
                for (int k2 = 0; k2 < k; k2++) chosen_before |= idx[k2] == e;
                if (!chosen_before) CHECK(sel[e] <= sel[idx[k]] + 1e-6, "trial %d slot %d not the max", trial, k);
            }
        double sum = 0;
        for (int k = 0; k < K; k++) sum += s[idx[k]];
        for (int k = 0; k < K; k++)
            CHECK(fabs(w[k] - 1.5 * s[idx[k]] / (sum + 1e-20)) < 1e-6, "trial %d weight %d", trial, k);
    }
    /* the bias changes the choice but never the weights' values */
    float logit[4] = {1.0f, 0.5f, 0.0f, -1.0f}, bias[4] = {0, 0, 10, 0}, w[2];
    int32_t idx[2];
    k_gate_route(NW_SCORE_SQRTSOFTPLUS, 4, 2, 1.0f, logit, bias, idx, w);
    double s0 = sqrt(log1p(exp(1.0))), s2 = sqrt(log(2.0));
    CHECK(idx[0] == 2 && idx[1] == 0, "bias selects expert 2 first: %d %d", idx[0], idx[1]);
    CHECK(fabs(w[0] - s2 / (s0 + s2)) < 1e-6 && fabs(w[1] - s0 / (s0 + s2)) < 1e-6, "unbiased weights");
    /* ties go to the lower index; very negative logits give zero scores, no NaN */
    float tie[4] = {-200, -200, -200, -200};
    k_gate_route(NW_SCORE_SQRTSOFTPLUS, 4, 2, 1.5f, tie, NULL, idx, w);
    CHECK(idx[0] == 0 && idx[1] == 1, "tie order %d %d", idx[0], idx[1]);
    CHECK(w[0] == 0 && w[1] == 0, "underflowed scores give weight 0, not NaN (%g %g)", w[0], w[1]);
    /* softmax scoring skips the normalisation */
    float l2[3] = {0, 1, 2};
    k_gate_route(NW_SCORE_SOFTMAX, 3, 1, 2.0f, l2, NULL, idx, w);
    double z = 1 + exp(1) + exp(2);
    CHECK(idx[0] == 2 && fabs(w[0] - 2 * exp(2) / z) < 1e-6, "softmax gate %g", w[0]);
}

static float round_bf16(float x) { return whale_bf16_to_float(whale_float_to_bf16(x)); }

/* Causal attention against a double reference. bf16 products: q, k, v are
 * made bf16 values, so the only rounding left is that of the probabilities
 * before P·V, which the reference repeats (either way for a probability
 * within fp32 error of a rounding boundary); the result must match it to
 * fp32 accuracy and differ from the unrounded reference by the bf16 rounding.
 * Queries over a cache (decoding) keep fp32 products either way. */
static void test_attention(whale_gemm *g, whale_rng *r, int S, int p0, int Hq, int Hkv, whale_dtype products) {
    enum { DH = 24 };
    int ctx = p0 + S, ldkv = Hkv * DH;
    int direct = S * Hq <= 4 || (Hkv > 1 && S <= 4), bf16 = products == WHALE_BF16 && p0 == 0 && !direct;
    float *q = malloc(sizeof(float) * S * Hq * DH), *k = malloc(sizeof(float) * ctx * ldkv);
    float *v = malloc(sizeof(float) * ctx * ldkv), *out = malloc(sizeof(float) * S * Hq * DH);
    float *work = malloc(sizeof(float) * k_attention_work_floats(ctx, Hq, Hkv, DH));
    fill(r, q, S * Hq * DH, 1.0);
    fill(r, k, ctx * ldkv, 1.0);
    fill(r, v, ctx * ldkv, 1.0);
    if (products == WHALE_BF16) {
        for (long i = 0; i < (long)S * Hq * DH; i++) q[i] = round_bf16(q[i]);
        for (long i = 0; i < (long)ctx * ldkv; i++) k[i] = round_bf16(k[i]), v[i] = round_bf16(v[i]);
    }
    whale_err err;
    float scale = 1.0f / sqrtf(DH);
    CHECK(k_attention(g, out, q, k, v, ldkv, NULL, S, p0, Hq, Hkv, DH, scale, products, work, &err) == WHALE_OK,
          "%s", err.msg);
    double e = 0, e_unrounded = 0;
    for (int s = 0; s < S; s++)
        for (int h = 0; h < Hq; h++) {
            int j = h / (Hq / Hkv), valid = p0 + s + 1;
            double sc[1024], mx = -INFINITY, sum = 0;
            for (int t = 0; t < valid; t++) {
                double d = 0;
                for (int i = 0; i < DH; i++) d += (double)q[(s * Hq + h) * DH + i] * k[t * ldkv + j * DH + i];
                sc[t] = d * scale;
                mx = fmax(mx, sc[t]);
            }
            for (int t = 0; t < valid; t++) sum += (sc[t] = exp(sc[t] - mx));
            for (int i = 0; i < DH; i++) {
                double o = 0, o_unrounded = 0, tie = 0;
                for (int t = 0; t < valid; t++) {
                    double p = sc[t] / sum, vt = v[t * ldkv + j * DH + i];
                    o += (bf16 ? round_bf16((float)p) : p) * vt;
                    o_unrounded += p * vt;
                    /* p this close to a bf16 rounding boundary may round
                     * either way from the kernel's fp32 probability */
                    float up = round_bf16((float)(p * (1 + 0x1p-18))), dn = round_bf16((float)(p * (1 - 0x1p-18)));
                    if (bf16) tie += fabs((double)up - dn) * fabs(vt);
                }
                e = fmax(e, fabs(out[(s * Hq + h) * DH + i] - o) - tie);
                e_unrounded = fmax(e_unrounded, fabs(out[(s * Hq + h) * DH + i] - o_unrounded));
            }
        }
    const char *name = products == WHALE_BF16 ? "bf16" : "fp32";
    CHECK(e < 1e-5, "attention (%s) S=%d p0=%d Hq=%d Hkv=%d err %g", name, S, p0, Hq, Hkv, e);
    if (bf16 && ctx > 1) /* one key: p = 1, nothing to round */
        CHECK(e_unrounded > 1e-4 && e_unrounded < 1e-2, "attention (bf16) S=%d: %g from the unrounded result", S,
              e_unrounded);
    free(q);
    free(k);
    free(v);
    free(out);
    free(work);
}

/* k_attention_spans against one k_attention call per span, bit for bit,
 * at 1 and 2 threads either way (decode spans; prefill ones at one thread
 * count): spans of different contexts, query counts and row strides;
 * prefill spans (the GEMM path) among decode ones; more spans than one
 * region holds (70: over 64 spans, and about 150 rows of some 150 keys
 * where work holds 64 rows of the longest context). long_p0 > 0 gives
 * span 0 that many cached keys: one span that dominates the group, whose
 * steps the threads split (keys, rows, items), where the others' spans
 * go to the threads whole. */
static void test_attention_spans(whale_gemm *g, whale_rng *r, int n, int Hq, int Hkv, int Dh, whale_dtype products,
                                 int long_p0) {
    static const int shapes[][2] = {{1, 0}, {1, 5}, {1, 150}, {2, 40}, {4, 300}, {20, 0}, {1, 1}, {9, 30}, {3, 0}};
    k_att_span *sp = malloc(sizeof *sp * (size_t)n);
    float **ref = malloc(sizeof(float *) * (size_t)n);
    int max_ctx = 1;
    for (int i = 0; i < n; i++) { /* beyond the table: decode spans of assorted contexts */
        int S = i < 9 ? shapes[i][0] : 1 + i % 4, p0 = i < 9 ? shapes[i][1] : (int)(whale_rng_u64(r) % 300);
        if (i == 0 && long_p0 > 0) p0 = long_p0;
        int ld = Hkv * Dh + i % 3, ctx = p0 + S;
        float *q = malloc(sizeof(float) * (size_t)S * Hq * Dh), *k = malloc(sizeof(float) * (size_t)ctx * ld),
              *v = malloc(sizeof(float) * (size_t)ctx * ld);
        fill(r, q, (long)S * Hq * Dh, 1.0);
        fill(r, k, (long)ctx * ld, 1.0);
        fill(r, v, (long)ctx * ld, 1.0);
        sp[i] = (k_att_span){malloc(sizeof(float) * (size_t)S * Hq * Dh), q, k, v, ld, NULL, S, p0};
        ref[i] = malloc(sizeof(float) * (size_t)S * Hq * Dh);
        max_ctx = ctx > max_ctx ? ctx : max_ctx;
    }
    float *work = malloc(sizeof(float) * k_attention_work_floats(max_ctx, Hq, Hkv, Dh));
    whale_err err;
    float scale = 1.0f / sqrtf((float)Dh);
    const int threads = omp_get_max_threads();
    for (int t_ref = 1; t_ref <= 2; t_ref++)
        for (int t = 1; t <= 2; t++) {
            omp_set_num_threads(t_ref);
            for (int i = 0; i < n; i++)
                CHECK(k_attention(g, ref[i], sp[i].q, sp[i].k, sp[i].v, sp[i].ldkv, NULL, sp[i].S, sp[i].p0, Hq, Hkv,
                                  Dh, scale, products, work, &err) == WHALE_OK,
                      "%s", err.msg);
            omp_set_num_threads(t);
            CHECK(k_attention_spans(g, sp, n, Hq, Hkv, Dh, scale, products, work, &err) == WHALE_OK, "%s", err.msg);
            for (int i = 0; i < n; i++) {
                /* the few-row path's results never depend on the thread
                 * count; the GEMM path's products may split their sums by
                 * it (oneDNN at the AVX2 tier), so a prefill span is
                 * compared at one thread count */
                int S = sp[i].S, few = S * Hq <= 4 || (S <= 4 && (Hkv > 1 || products != WHALE_BF16 || sp[i].p0));
                if (!few && t != t_ref) continue;
                CHECK(memcmp(sp[i].out, ref[i], sizeof(float) * (size_t)S * Hq * Dh) == 0,
                      "attention_spans (%s) %d spans, heads %d/%d × %d: span %d (S=%d p0=%d) at %d threads differs "
                      "from its own call at %d",
                      whale_dtype_name(products), n, Hq, Hkv, Dh, i, S, sp[i].p0, t, t_ref);
            }
        }
    omp_set_num_threads(threads);
    for (int i = 0; i < n; i++) {
        free(sp[i].out), free((void *)sp[i].q), free((void *)sp[i].k), free((void *)sp[i].v), free(ref[i]);
    }
    free(sp), free(ref), free(work);
}

int main(void) {
    /* the cost of a region the splits assume, fixed (core/par.h): a
     * measured one would make which attention path a test takes depend on
     * the machine's load; likewise moving data between cores */
    setenv("WHALE_PAR_US", "1", 0);
    setenv("WHALE_PAR_MOVE_US", "0", 0);
    whale_rng r;
    whale_rng_seed(&r, 7);
    whale_err err;
    whale_gemm *g;
    if (whale_gemm_new(&g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_rmsnorm(&r);
    test_rope(&r);
    test_hc(&r);
    test_gate(&r);
    /* direct path (few rows), blocked GEMM path, with and without a cache prefix, MQA and GQA */
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        whale_dtype p = bf16 ? WHALE_BF16 : WHALE_F32;
        test_attention(g, &r, 1, 0, 8, 1, p);
        test_attention(g, &r, 1, 77, 8, 1, p);
        test_attention(g, &r, 3, 10, 4, 2, p);
        test_attention(g, &r, 4, 300, 8, 1, p);  /* decoding: the fused kernel, key chunks over threads */
        test_attention(g, &r, 2, 50, 14, 2, p);
        test_attention(g, &r, 150, 0, 8, 1, p);
        test_attention(g, &r, 70, 33, 8, 1, p);
        test_attention(g, &r, 130, 0, 6, 2, p);
        test_attention(g, &r, 130, 5, 6, 2, p);
        test_attention(g, &r, 90, 0, 14, 2, p); /* GQA 7:1 over two query blocks */
        test_attention(g, &r, 90, 7, 14, 2, p);
        test_attention_spans(g, &r, 9, 8, 1, 64, p, 0);
        test_attention_spans(g, &r, 8, 14, 2, 40, p, 0); /* GQA; the last 8 of 40 columns a partial block */
        test_attention_spans(g, &r, 70, 8, 1, 24, p, 0); /* more spans than a region holds */
        test_attention_spans(g, &r, 3, 8, 1, 96, p, 2500); /* one long span: its steps split */
        test_attention_spans(g, &r, 1, 8, 1, 96, p, 2500);
    }
    whale_gemm_free(g);
    return test_finish("test_ops");
}
