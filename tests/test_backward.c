/* Every backward kernel against central finite differences of a double-
 * precision re-implementation of its forward, written here from the
 * definitions. Each test draws a fixed random r, defines L = Σ r·y, feeds r
 * as the output gradient and compares the fp32 analytic input gradients with
 * dL/dx by central differences (relative error of the gradient vector
 * ‖g − g_fd‖/‖g_fd‖). The double forward is also checked against the fp32
 * forward, so both describe the same function. Parallel backwards are run
 * repeatedly with 1 and 2 threads: equal thread counts must give identical
 * bits. */
#include "testutil.h"

#include "core/core.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/hc.h"
#include "kernels/ops.h"
#include "kernels/loss.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-4     /* relative gradient error allowed for fp32 analytic gradients */
#define FWD_TOL 1e-5 /* double forward vs fp32 forward, relative to Σ|r·y| */
#define ACC0 0.25f   /* accumulated outputs start here, to test +=  */

/* ------------------------------------------------------------ helpers */

static void fill(whale_rng *r, float *x, long n, double std) {
    for (long i = 0; i < n; i++) x[i] = (float)(whale_rng_normal(r) * std);
}

static double *to_d(const float *x, long n) {
    double *d = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (long i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static float *falloc(long n) { return malloc(sizeof(float) * (size_t)(n ? n : 1)); }

static void set(float *x, long n, float v) {
    for (long i = 0; i < n; i++) x[i] = v;
}

/* accumulated gradient minus the starting value */
static void unacc(float *g, long n) {
    for (long i = 0; i < n; i++) g[i] -= ACC0;
}

static int all_finite(const float *x, long n) {
    for (long i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Worst measured error per function, printed at the end. */
static struct {
    const char *name;
    double err;
} worst[64];
static int n_worst;

static void record(const char *name, double err) {
    for (int i = 0; i < n_worst; i++)
        if (!strcmp(worst[i].name, name)) {
            if (!(err <= worst[i].err)) worst[i].err = err;
            return;
        }
    if (n_worst < 64) worst[n_worst].name = name, worst[n_worst++].err = err;
}

typedef double (*loss_fn)(void *ctx);

/* Compare the analytic gradient g [n] of L with respect to p [n] with central
 * differences of f (which reads p); at most max_samples random coordinates
 * are checked for large tensors. */
static double grad_check(const char *name, const char *what, loss_fn f, void *ctx, double *p, long n, const float *g,
                         int max_samples, whale_rng *r) {
    double num = 0, den = 0;
    int k_n = n <= max_samples ? (int)n : max_samples;
    for (int k = 0; k < k_n; k++) {
        long i = n <= max_samples ? k : (long)(whale_rng_u64(r) % (uint64_t)n);
        double x = p[i], h = 1e-6 * fmax(1.0, fabs(x)), xp = x + h, xm = x - h;
        p[i] = xp;
        double lp = f(ctx);
        p[i] = xm;
        double lm = f(ctx);
        p[i] = x;
        double d = (lp - lm) / (xp - xm);
        num += (g[i] - d) * (g[i] - d);
        den += d * d;
    }
    double err = sqrt(num / den);
    if (!(den >= 1e-10)) {
        /* an (almost) zero gradient: the differences are then mostly their
         * own round-off (about 1e-10·|L|, L = Σ r·y of order 1), so compare
         * absolutely */
        err = sqrt(num);
        CHECK(err <= 1e-8, "%s: d/d%s of a vanishing gradient: absolute error %.3g", name, what, err);
        return err;
    }
    record(name, err);
    CHECK(err <= TOL, "%s: d/d%s relative error %.3g", name, what, err);
    return err;
}

static void check_fwd(const char *name, double lf, double ld, double mag) {
    CHECK(fabs(lf - ld) <= FWD_TOL * (mag > 0 ? mag : 1), "%s: double forward %.12g vs fp32 forward %.12g", name, ld,
          lf);
}

static double fdot(const float *a, const float *b, long n, double *mag) {
    double s = 0, m = 0;
    for (long i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        m += fabs((double)a[i] * b[i]);
    }
    if (mag) *mag = m;
    return s;
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ------------------------------------------------------------ RMSNorm */

typedef struct {
    int rows, n;
    double *x, *w, *r, eps;
} norm_ctx;

static double norm_loss(void *vc) {
    norm_ctx *c = vc;
    double L = 0;
    for (int i = 0; i < c->rows; i++) {
        const double *x = c->x + (long)i * c->n;
        double ss = 0;
        for (int j = 0; j < c->n; j++) ss += x[j] * x[j];
        double rs = 1.0 / sqrt(ss / c->n + c->eps);
        for (int j = 0; j < c->n; j++) L += c->r[(long)i * c->n + j] * (c->w ? c->w[j] : 1.0) * x[j] * rs;
    }
    return L;
}

static void test_rmsnorm(whale_rng *r, int weighted) {
    enum { ROWS = 6, N = 40 };
    float x[ROWS * N], w[N], y[ROWS * N], rs[ROWS], dy[ROWS * N], dx[ROWS * N], dw[N], dx2[ROWS * N];
    fill(r, x, ROWS * N, 2.0);
    fill(r, w, N, 1.0);
    fill(r, dy, ROWS * N, 1.0);
    const float *wp = weighted ? w : NULL;
    k_rmsnorm(y, x, wp, ROWS, N, 1e-6f, rs);
    set(dx, ROWS * N, NAN);
    set(dw, N, ACC0);
    k_rmsnorm_backward(dx, weighted ? dw : NULL, dy, x, wp, rs, ROWS, N);
    unacc(dw, N);
    norm_ctx c = {ROWS, N, to_d(x, ROWS * N), weighted ? to_d(w, N) : NULL, to_d(dy, ROWS * N), 1e-6};
    double mag, lf = fdot(dy, y, ROWS * N, &mag);
    check_fwd("k_rmsnorm_backward", lf, norm_loss(&c), mag);
    grad_check("k_rmsnorm_backward", "x", norm_loss, &c, c.x, ROWS * N, dx, 1000, r);
    if (weighted) grad_check("k_rmsnorm_backward", "w", norm_loss, &c, c.w, N, dw, 1000, r);
    /* dx may alias dy */
    memcpy(dx2, dy, sizeof dy);
    k_rmsnorm_backward(dx2, NULL, dx2, x, wp, rs, ROWS, N);
    CHECK(!memcmp(dx, dx2, sizeof dx), "rmsnorm backward in place differs");
    free(c.x);
    free(c.w);
    free(c.r);
}

/* dw summed over many rows (the parallel path): same bits for 1 and 2 threads */
static void test_rmsnorm_determinism(whale_rng *r) {
    enum { ROWS = 300, N = 320 };
    float *x = falloc(ROWS * N), *dy = falloc(ROWS * N), *w = falloc(N), *rs = falloc(ROWS), *y = falloc(ROWS * N);
    float *dx[4], *dw[4];
    fill(r, x, ROWS * N, 1.0);
    fill(r, dy, ROWS * N, 1.0);
    fill(r, w, N, 1.0);
    k_rmsnorm(y, x, w, ROWS, N, 1e-6f, rs);
    for (int k = 0; k < 4; k++) {
        omp_set_num_threads(k < 2 ? 1 : 2);
        dx[k] = falloc(ROWS * N);
        dw[k] = falloc(N);
        set(dw[k], N, 0);
        k_rmsnorm_backward(dx[k], dw[k], dy, x, w, rs, ROWS, N);
    }
    omp_set_num_threads(2);
    for (int k = 1; k < 4; k++) {
        CHECK(!memcmp(dx[0], dx[k], sizeof(float) * ROWS * N), "rmsnorm dx run %d differs", k);
        CHECK(!memcmp(dw[0], dw[k], sizeof(float) * N), "rmsnorm dw run %d (threads %d) differs", k, k < 2 ? 1 : 2);
    }
    for (int k = 0; k < 4; k++) free(dx[k]), free(dw[k]);
    free(x), free(dy), free(w), free(rs), free(y);
}

/* ------------------------------------------------------------ RoPE */

typedef struct {
    int rows, nh, hd, R, inverse;
    const int32_t *pos;
    const float *cos_t, *sin_t;
    double *x, *r;
} rope_ctx;

static double rope_loss(void *vc) {
    rope_ctx *c = vc;
    int half = c->R / 2, ld = c->nh * c->hd;
    double L = 0, sg = c->inverse ? -1 : 1;
    for (int i = 0; i < c->rows; i++)
        for (int h = 0; h < c->nh; h++) {
            const double *x = c->x + (long)i * ld + h * c->hd, *rr = c->r + (long)i * ld + h * c->hd;
            for (int d = 0; d < c->hd - c->R; d++) L += rr[d] * x[d];
            for (int j = 0; j < half; j++) {
                double co = c->cos_t[c->pos[i] * half + j], si = sg * c->sin_t[c->pos[i] * half + j];
                double a = x[c->hd - c->R + j], b = x[c->hd - c->R + half + j];
                L += rr[c->hd - c->R + j] * (a * co + b * si) + rr[c->hd - c->R + half + j] * (b * co - a * si);
            }
        }
    return L;
}

static void test_rope(whale_rng *r) {
    enum { ROWS = 5, NH = 3, HD = 12, R = 8, MAXPOS = 64, N = ROWS * NH * HD };
    float cos_t[MAXPOS * R / 2], sin_t[MAXPOS * R / 2], x[N], y[N], dy[N];
    int32_t pos[ROWS] = {0, 1, 7, 33, 63};
    k_rope_table(cos_t, sin_t, MAXPOS, R, 10000.0f);
    for (int inverse = 0; inverse < 2; inverse++) {
        fill(r, x, N, 1.0);
        fill(r, dy, N, 1.0);
        memcpy(y, x, sizeof x);
        k_rope(y, ROWS, NH * HD, NH, HD, R, pos, cos_t, sin_t, inverse);
        rope_ctx c = {ROWS, NH, HD, R, inverse, pos, cos_t, sin_t, to_d(x, N), to_d(dy, N)};
        double mag, lf = fdot(dy, y, N, &mag);
        check_fwd("k_rope_backward", lf, rope_loss(&c), mag);
        float dx[N];
        memcpy(dx, dy, sizeof dy);
        k_rope_backward(dx, ROWS, NH * HD, NH, HD, R, pos, cos_t, sin_t, inverse);
        grad_check("k_rope_backward", "x", rope_loss, &c, c.x, N, dx, 1000, r);
        free(c.x);
        free(c.r);
    }
}

/* ------------------------------------------------------------ SwiGLU */

typedef struct {
    long n;
    double limit, *g, *u, *r;
} swiglu_ctx;

static double swiglu_loss(void *vc) {
    swiglu_ctx *c = vc;
    double L = 0;
    for (long i = 0; i < c->n; i++) {
        double g = c->g[i], u = c->u[i];
        if (c->limit > 0) {
            u = fmin(fmax(u, -c->limit), c->limit);
            g = fmin(g, c->limit);
        }
        L += c->r[i] * g * sigm(g) * u;
    }
    return L;
}

static void test_swiglu(whale_rng *r, float limit) {
    enum { N = 96 };
    float g[N], u[N], h[N], dh[N], dg[N], du[N], dg2[N], du2[N];
    fill(r, g, N, 2.5);
    fill(r, u, N, 2.5);
    fill(r, dh, N, 1.0);
    g[3] = -30.0f; /* sigmoid(g) ~ 1e-13: silu' must stay finite and tiny */
    if (limit > 0) { /* exactly on the bounds: the gradient passes (PyTorch clamp) */
        g[0] = limit;
        u[1] = limit;
        u[2] = -limit;
    }
    memcpy(h, g, sizeof g);
    k_swiglu(h, u, N, limit);
    set(dg, N, NAN);
    set(du, N, NAN);
    k_swiglu_backward(dg, du, dh, g, u, N, limit);
    CHECK(all_finite(dg, N) && all_finite(du, N), "swiglu gradient not finite");
    swiglu_ctx c = {N, limit, to_d(g, N), to_d(u, N), to_d(dh, N)};
    double mag, lf = fdot(dh, h, N, &mag);
    check_fwd("k_swiglu_backward", lf, swiglu_loss(&c), mag);
    /* central differences only away from the kinks of the clamps */
    float *ag = falloc(N), *au = falloc(N);
    double *pg = malloc(sizeof(double) * N), *pu = malloc(sizeof(double) * N), *rsub = malloc(sizeof(double) * N);
    long m = 0;
    for (long i = 0; i < N; i++) {
        if (limit > 0 && (fabsf(g[i] - limit) < 1e-3f || fabsf(fabsf(u[i]) - limit) < 1e-3f)) continue;
        ag[m] = dg[i], au[m] = du[i], pg[m] = c.g[i], pu[m] = c.u[i], rsub[m] = c.r[i], m++;
    }
    swiglu_ctx cs = {m, limit, pg, pu, rsub};
    grad_check("k_swiglu_backward", "g", swiglu_loss, &cs, pg, m, ag, 1000, r);
    grad_check("k_swiglu_backward", "u", swiglu_loss, &cs, pu, m, au, 1000, r);
    if (limit > 0) {
        double L = limit, s = sigm(L);
        double want_dg0 = dh[0] * fmin(fmax(u[0], -L), L) * s * (1 + L * (1 - s));
        CHECK(fabs(dg[0] - want_dg0) <= 1e-5 * fabs(want_dg0) + 1e-12, "dg at g == limit: %g want %g", dg[0],
              want_dg0);
        for (int i = 1; i <= 2; i++) {
            double gg = fmin(g[i], L), want = dh[i] * gg * sigm(gg);
            CHECK(fabs(du[i] - want) <= 1e-5 * fabs(want) + 1e-12, "du at u == ±limit: %g want %g", du[i], want);
        }
        int beyond = 0, zero = 1;
        for (int i = 0; i < N; i++) {
            if (g[i] > limit) beyond++, zero &= dg[i] == 0.0f;
            if (fabsf(u[i]) > limit) beyond++, zero &= du[i] == 0.0f;
        }
        CHECK(beyond > 4 && zero, "beyond the clamp the gradient is 0 (%d values beyond)", beyond);
    }
    /* in place: gradients over the inputs' own storage */
    memcpy(dg2, dh, sizeof dh);
    memcpy(du2, u, sizeof u);
    k_swiglu_backward(dg2, du2, dg2, g, du2, N, limit);
    CHECK(!memcmp(dg, dg2, sizeof dg) && !memcmp(du, du2, sizeof du), "swiglu backward in place differs");
    free(ag), free(au), free(pg), free(pu), free(rsub);
    free(c.g), free(c.u), free(c.r);
}

/* ------------------------------------------------------------ gate */

typedef struct {
    int scoring, E, K;
    double scale, *l, *r;
    const int32_t *idx;
} gate_ctx;

static double gate_loss(void *vc) {
    gate_ctx *c = vc;
    double s[256], sum = 0, L = 0;
    if (c->scoring == NW_SCORE_SOFTMAX) {
        double mx = -INFINITY, z = 0;
        for (int e = 0; e < c->E; e++) mx = fmax(mx, c->l[e]);
        for (int e = 0; e < c->E; e++) z += (s[e] = exp(c->l[e] - mx));
        for (int e = 0; e < c->E; e++) s[e] /= z;
    } else {
        for (int e = 0; e < c->E; e++) {
            double x = c->l[e];
            s[e] = c->scoring == NW_SCORE_SIGMOID ? sigm(x) : sqrt(x > 20 ? x : log1p(exp(x)));
        }
    }
    for (int k = 0; k < c->K; k++) sum += s[c->idx[k]];
    for (int k = 0; k < c->K; k++) {
        double w = s[c->idx[k]];
        if (c->scoring != NW_SCORE_SOFTMAX) w /= sum + 1e-20;
        L += c->r[k] * w * c->scale;
    }
    return L;
}

static void gate_case(whale_rng *r, int scoring, int E, int K, const float *logit, const float *bias, int fd) {
    int32_t idx[16];
    float w[16], dw[16], dl[256];
    k_gate_route(scoring, E, K, 1.5f, logit, bias, idx, w);
    fill(r, dw, K, 1.0);
    set(dl, E, NAN);
    k_gate_route_backward(scoring, E, K, 1.5f, logit, idx, dw, dl);
    CHECK(all_finite(dl, E), "gate scoring %d: non-finite logit gradient", scoring);
    if (scoring != NW_SCORE_SOFTMAX)
        for (int e = 0; e < E; e++) {
            int chosen = 0;
            for (int k = 0; k < K; k++) chosen |= idx[k] == e;
            CHECK(chosen || dl[e] == 0.0f, "gate: unchosen expert %d has gradient %g", e, dl[e]);
        }
    if (!fd) return;
    gate_ctx c = {scoring, E, K, 1.5, to_d(logit, E), to_d(dw, K), idx};
    double mag, lf = fdot(dw, w, K, &mag);
    check_fwd("k_gate_route_backward", lf, gate_loss(&c), mag);
    grad_check("k_gate_route_backward", "logit", gate_loss, &c, c.l, E, dl, 1000, r);
    free(c.l);
    free(c.r);
}

static void test_gate(whale_rng *r) {
    float l[8], bias[8];
    for (int scoring = 0; scoring < 3; scoring++)
        for (int rep = 0; rep < 6; rep++) {
            fill(r, l, 8, 2.0);
            fill(r, bias, 8, 0.3);
            gate_case(r, scoring, 4, 2, l, rep % 2 ? bias : NULL, 1);
            gate_case(r, scoring, 8, 3, l, bias, 1);
        }
    /* above softplus' threshold 20 (softplus(l) = l there) */
    const float big[4] = {25.0f, 21.5f, -3.0f, 20.5f};
    for (int scoring = 0; scoring < 3; scoring++) gate_case(r, scoring, 4, 2, big, NULL, 1);
    /* softplus underflows to exactly 0 (below about -103) for a chosen expert
     * and for unchosen ones; -95 gives a denormal score whose sigmoid
     * underflows. The gradient must stay finite. */
    const float under[4] = {-110.0f, 3.0f, -120.0f, -95.0f};
    const float under2[4] = {-110.0f, 3.0f, -120.0f, 0.5f};
    gate_case(r, NW_SCORE_SQRTSOFTPLUS, 4, 2, under, NULL, 1);
    gate_case(r, NW_SCORE_SQRTSOFTPLUS, 4, 3, under, NULL, 1);
    gate_case(r, NW_SCORE_SQRTSOFTPLUS, 4, 3, under2, NULL, 1); /* expert 0 chosen with score 0 */
    /* every score 0: the fp32 forward is flat (weights 0/1e-20 = 0), so the
     * documented derivative 0 is checked directly, not by differences */
    const float all_under[4] = {-110.0f, -120.0f, -130.0f, -105.0f};
    int32_t idx[2];
    float w[2], dw[2] = {0.7f, -1.3f}, dl[4];
    k_gate_route(NW_SCORE_SQRTSOFTPLUS, 4, 2, 1.5f, all_under, NULL, idx, w);
    k_gate_route_backward(NW_SCORE_SQRTSOFTPLUS, 4, 2, 1.5f, all_under, idx, dw, dl);
    CHECK(w[0] == 0 && w[1] == 0 && dl[0] == 0 && dl[1] == 0 && dl[2] == 0 && dl[3] == 0,
          "all-underflow gate: w %g %g, dlogit %g %g %g %g", w[0], w[1], dl[0], dl[1], dl[2], dl[3]);
    /* sigmoid / softmax with extreme logits stay finite */
    const float ext[4] = {-200.0f, 90.0f, 0.0f, -90.0f};
    gate_case(r, NW_SCORE_SIGMOID, 4, 2, ext, NULL, 0);
    gate_case(r, NW_SCORE_SOFTMAX, 4, 2, ext, NULL, 0);
}

/* ------------------------------------------------------------ HC coefficients */

typedef struct {
    int M, iters, T, head;
    double eps, *mix, *scale, *base, *rpre, *rpost, *rcomb;
} hcc_ctx;

static double hcc_loss(void *vc) {
    hcc_ctx *c = vc;
    int M = c->M, nm = c->head ? M : (2 + M) * M;
    double L = 0, C[64 * 64];
    for (int t = 0; t < c->T; t++) {
        const double *mix = c->mix + (long)t * nm, *b = c->base, *s = c->scale;
        for (int m = 0; m < M; m++) L += c->rpre[t * M + m] * (sigm(mix[m] * s[0] + b[m]) + c->eps);
        if (c->head) continue;
        for (int m = 0; m < M; m++) L += c->rpost[t * M + m] * 2 * sigm(mix[M + m] * s[1] + b[M + m]);
        for (int i = 0; i < M; i++) {
            double mx = -INFINITY, z = 0;
            for (int j = 0; j < M; j++) {
                C[i * M + j] = mix[2 * M + i * M + j] * s[2] + b[2 * M + i * M + j];
                mx = fmax(mx, C[i * M + j]);
            }
            for (int j = 0; j < M; j++) z += (C[i * M + j] = exp(C[i * M + j] - mx));
            for (int j = 0; j < M; j++) C[i * M + j] = C[i * M + j] / z + c->eps;
        }
        for (int it = 0; it < c->iters; it++) {
            if (it > 0)
                for (int i = 0; i < M; i++) {
                    double z = c->eps;
                    for (int j = 0; j < M; j++) z += C[i * M + j];
                    for (int j = 0; j < M; j++) C[i * M + j] /= z;
                }
            for (int j = 0; j < M; j++) {
                double z = c->eps;
                for (int i = 0; i < M; i++) z += C[i * M + j];
                for (int i = 0; i < M; i++) C[i * M + j] /= z;
            }
        }
        for (int i = 0; i < M * M; i++) L += c->rcomb[(long)t * M * M + i] * C[i];
    }
    return L;
}

static void test_hc_coeffs(whale_rng *r, int M, int iters, int T, int head) {
    int nm = head ? M : (2 + M) * M, ns = head ? 1 : 3;
    float eps = 1e-6f;
    float *mix = falloc((long)T * nm), *scale = falloc(3), *base = falloc(nm);
    float *pre = falloc((long)T * M), *post = falloc((long)T * M), *comb = falloc((long)T * M * M);
    float *rpre = falloc((long)T * M), *rpost = falloc((long)T * M), *rcomb = falloc((long)T * M * M);
    float *dmix = falloc((long)T * nm), *dscale = falloc(3), *dbase = falloc(nm);
    fill(r, mix, (long)T * nm, 1.0);
    for (int k = 0; k < 3; k++) scale[k] = 0.5f + whale_rng_uniform(r);
    fill(r, base, nm, 0.5);
    fill(r, rpre, (long)T * M, 1.0);
    fill(r, rpost, (long)T * M, 1.0);
    fill(r, rcomb, (long)T * M * M, 1.0);
    double lf = 0, mag = 0, m1;
    for (int t = 0; t < T; t++) {
        if (head) {
            k_hc_head_coeffs(mix + (long)t * nm, scale, base, M, eps, pre + (long)t * M);
        } else {
            k_hc_coeffs(mix + (long)t * nm, scale, base, M, iters, eps, pre + (long)t * M, post + (long)t * M,
                        comb + (long)t * M * M);
            lf += fdot(rpost + (long)t * M, post + (long)t * M, M, &m1), mag += m1;
            lf += fdot(rcomb + (long)t * M * M, comb + (long)t * M * M, M * M, &m1), mag += m1;
        }
        lf += fdot(rpre + (long)t * M, pre + (long)t * M, M, &m1), mag += m1;
    }
    set(dmix, (long)T * nm, NAN);
    set(dscale, 3, ACC0);
    set(dbase, nm, ACC0);
    if (head) k_hc_head_coeffs_backward_rows(mix, scale, base, M, eps, rpre, dmix, dscale, dbase, T);
    else k_hc_coeffs_backward_rows(mix, scale, base, M, iters, eps, rpre, rpost, rcomb, dmix, dscale, dbase, T);
    unacc(dscale, ns);
    unacc(dbase, nm);
    const char *name = head ? "k_hc_head_coeffs_backward" : "k_hc_coeffs_backward";
    hcc_ctx c = {M,
                 iters,
                 T,
                 head,
                 eps,
                 to_d(mix, (long)T * nm),
                 to_d(scale, 3),
                 to_d(base, nm),
                 to_d(rpre, (long)T * M),
                 to_d(rpost, (long)T * M),
                 to_d(rcomb, (long)T * M * M)};
    check_fwd(name, lf, hcc_loss(&c), mag);
    grad_check(name, "mix", hcc_loss, &c, c.mix, (long)T * nm, dmix, 400, r);
    grad_check(name, "scale", hcc_loss, &c, c.scale, ns, dscale, 400, r);
    grad_check(name, "base", hcc_loss, &c, c.base, nm, dbase, 400, r);

    /* the single-token form equals the first row of the batched one */
    float *dmix1 = falloc(nm), ds1[3] = {0, 0, 0}, *db1 = falloc(nm), ds0[3] = {0, 0, 0}, *db0 = falloc(nm);
    float *dmix0 = falloc(nm);
    set(db1, nm, 0);
    set(db0, nm, 0);
    if (head) {
        k_hc_head_coeffs_backward(mix, scale, base, M, eps, rpre, dmix1, ds1, db1);
        k_hc_head_coeffs_backward_rows(mix, scale, base, M, eps, rpre, dmix0, ds0, db0, 1);
    } else {
        k_hc_coeffs_backward(mix, scale, base, M, iters, eps, rpre, rpost, rcomb, dmix1, ds1, db1);
        k_hc_coeffs_backward_rows(mix, scale, base, M, iters, eps, rpre, rpost, rcomb, dmix0, ds0, db0, 1);
    }
    CHECK(!memcmp(dmix1, dmix0, sizeof(float) * nm) && !memcmp(ds1, ds0, sizeof ds0) &&
              !memcmp(db1, db0, sizeof(float) * nm),
          "%s: single-token form differs from the batched one", name);
    if (!head) { /* NULL dpost / dcomb mean zero gradients */
        float *zero = falloc(M * M);
        set(zero, M * M, 0);
        set(db0, nm, 0), set(db1, nm, 0), memset(ds0, 0, sizeof ds0), memset(ds1, 0, sizeof ds1);
        k_hc_coeffs_backward(mix, scale, base, M, iters, eps, rpre, NULL, NULL, dmix1, ds1, db1);
        k_hc_coeffs_backward(mix, scale, base, M, iters, eps, rpre, zero, zero, dmix0, ds0, db0);
        CHECK(!memcmp(dmix1, dmix0, sizeof(float) * nm) && !memcmp(ds1, ds0, sizeof ds0) &&
                  !memcmp(db1, db0, sizeof(float) * nm),
              "hc coeffs: NULL dpost/dcomb differ from zeros");
        free(zero);
    }
    free(dmix1), free(db1), free(db0), free(dmix0);
    free(c.mix), free(c.scale), free(c.base), free(c.rpre), free(c.rpost), free(c.rcomb);
    free(mix), free(scale), free(base), free(pre), free(post), free(comb), free(rpre), free(rpost), free(rcomb);
    free(dmix), free(dscale), free(dbase);
}

/* many tokens: the parallel path; dscale/dbase independent of thread count */
static void test_hc_coeffs_determinism(whale_rng *r) {
    enum { M = 4, T = 700, NM = (2 + M) * M };
    float *mix = falloc(T * NM), scale[3] = {0.9f, 1.1f, 1.3f}, base[NM];
    float *dpre = falloc(T * M), *dpost = falloc(T * M), *dcomb = falloc(T * M * M);
    fill(r, mix, T * NM, 1.0);
    fill(r, base, NM, 0.5);
    fill(r, dpre, T * M, 1.0);
    fill(r, dpost, T * M, 1.0);
    fill(r, dcomb, T * M * M, 1.0);
    float *dmix[4], ds[4][3], db[4][NM], *hmix[4], hs[4][1], hb[4][M];
    for (int k = 0; k < 4; k++) {
        omp_set_num_threads(k < 2 ? 1 : 2);
        dmix[k] = falloc(T * NM);
        hmix[k] = falloc(T * M);
        memset(ds[k], 0, sizeof ds[k]), memset(db[k], 0, sizeof db[k]);
        memset(hs[k], 0, sizeof hs[k]), memset(hb[k], 0, sizeof hb[k]);
        k_hc_coeffs_backward_rows(mix, scale, base, M, 2, 1e-6f, dpre, dpost, dcomb, dmix[k], ds[k], db[k], T);
        k_hc_head_coeffs_backward_rows(mix, scale, base, M, 1e-6f, dpre, hmix[k], hs[k], hb[k], T);
    }
    omp_set_num_threads(2);
    for (int k = 1; k < 4; k++) {
        CHECK(!memcmp(dmix[0], dmix[k], sizeof(float) * T * NM) && !memcmp(ds[0], ds[k], sizeof ds[0]) &&
                  !memcmp(db[0], db[k], sizeof db[0]),
              "hc coeffs backward run %d differs", k);
        CHECK(!memcmp(hmix[0], hmix[k], sizeof(float) * T * M) && !memcmp(hs[0], hs[k], sizeof hs[0]) &&
                  !memcmp(hb[0], hb[k], sizeof hb[0]),
              "hc head coeffs backward run %d differs", k);
    }
    for (int k = 0; k < 4; k++) free(dmix[k]), free(hmix[k]);
    free(mix), free(dpre), free(dpost), free(dcomb);
}

/* ------------------------------------------------------------ HC reduce / expand / rstd */

typedef struct {
    int rows, M, D;
    double *X, *pre, *o, *post, *comb, *r;
} hcx_ctx;

static double reduce_loss(void *vc) {
    hcx_ctx *c = vc;
    double L = 0;
    for (int t = 0; t < c->rows; t++)
        for (int d = 0; d < c->D; d++) {
            double y = 0;
            for (int m = 0; m < c->M; m++) y += c->pre[t * c->M + m] * c->X[((long)t * c->M + m) * c->D + d];
            L += c->r[(long)t * c->D + d] * y;
        }
    return L;
}

static double expand_loss(void *vc) {
    hcx_ctx *c = vc;
    int M = c->M, D = c->D;
    double L = 0;
    for (int t = 0; t < c->rows; t++)
        for (int i = 0; i < M; i++)
            for (int d = 0; d < D; d++) {
                double y = c->post[t * M + i] * c->o[(long)t * D + d];
                for (int j = 0; j < M; j++) y += c->comb[(t * M + i) * M + j] * c->X[((long)t * M + j) * D + d];
                L += c->r[((long)t * M + i) * D + d] * y;
            }
    return L;
}

static void test_hc_reduce_expand(whale_rng *r) {
    enum { T = 3, M = 4, D = 37 };
    float X[T * M * D], pre[T * M], post[T * M], comb[T * M * M], o[T * D];
    float y[T * D], Xo[T * M * D], dy[T * D], dXo[T * M * D];
    float dX[T * M * D], dpre[T * M], dout[T * D], dpost[T * M], dcomb[T * M * M];
    fill(r, X, T * M * D, 1.0);
    fill(r, pre, T * M, 0.5);
    fill(r, post, T * M, 1.0);
    fill(r, comb, T * M * M, 0.5);
    fill(r, o, T * D, 1.0);
    fill(r, dy, T * D, 1.0);
    fill(r, dXo, T * M * D, 1.0);

    k_hc_reduce(y, X, pre, T, M, D);
    set(dX, T * M * D, ACC0);
    set(dpre, T * M, NAN);
    k_hc_reduce_backward(dX, dpre, dy, X, pre, T, M, D);
    unacc(dX, T * M * D);
    hcx_ctx c = {T, M, D, to_d(X, T * M * D), to_d(pre, T * M), to_d(o, T * D), to_d(post, T * M),
                 to_d(comb, T * M * M), to_d(dy, T * D)};
    double mag, lf = fdot(dy, y, T * D, &mag);
    check_fwd("k_hc_reduce_backward", lf, reduce_loss(&c), mag);
    grad_check("k_hc_reduce_backward", "X", reduce_loss, &c, c.X, T * M * D, dX, 1000, r);
    grad_check("k_hc_reduce_backward", "pre", reduce_loss, &c, c.pre, T * M, dpre, 1000, r);

    k_hc_expand(Xo, o, X, post, comb, T, M, D);
    free(c.r);
    c.r = to_d(dXo, T * M * D);
    set(dX, T * M * D, ACC0);
    set(dout, T * D, NAN);
    set(dpost, T * M, NAN);
    set(dcomb, T * M * M, NAN);
    k_hc_expand_backward(dout, dX, dpost, dcomb, dXo, o, X, post, comb, T, M, D);
    unacc(dX, T * M * D);
    lf = fdot(dXo, Xo, T * M * D, &mag);
    check_fwd("k_hc_expand_backward", lf, expand_loss(&c), mag);
    grad_check("k_hc_expand_backward", "o", expand_loss, &c, c.o, T * D, dout, 1000, r);
    grad_check("k_hc_expand_backward", "X", expand_loss, &c, c.X, T * M * D, dX, 1000, r);
    grad_check("k_hc_expand_backward", "post", expand_loss, &c, c.post, T * M, dpost, 1000, r);
    grad_check("k_hc_expand_backward", "comb", expand_loss, &c, c.comb, T * M * M, dcomb, 1000, r);
    free(c.X), free(c.pre), free(c.o), free(c.post), free(c.comb), free(c.r);
}

typedef struct {
    int rows, n;
    double eps, *x, *r;
} rstd_ctx;

static double rstd_loss(void *vc) {
    rstd_ctx *c = vc;
    double L = 0;
    for (int t = 0; t < c->rows; t++) {
        double ss = 0;
        for (int i = 0; i < c->n; i++) ss += c->x[(long)t * c->n + i] * c->x[(long)t * c->n + i];
        L += c->r[t] / sqrt(ss / c->n + c->eps);
    }
    return L;
}

static void test_rstd(whale_rng *r) {
    enum { T = 4, N = 50 };
    float x[T * N], rs[T], dr[T], dx[T * N];
    fill(r, x, T * N, 1.5);
    fill(r, dr, T, 1.0);
    x[0] = 0.0f; /* rows with tiny values: eps matters */
    for (int i = 0; i < N; i++) x[N + i] *= 1e-3f;
    k_hc_rstd(rs, x, T, N, 1e-6f);
    set(dx, T * N, ACC0);
    k_rstd_backward(dx, x, rs, dr, T, N);
    unacc(dx, T * N);
    rstd_ctx c = {T, N, 1e-6, to_d(x, T * N), to_d(dr, T)};
    double mag, lf = fdot(dr, rs, T, &mag);
    check_fwd("k_rstd_backward", lf, rstd_loss(&c), mag);
    grad_check("k_rstd_backward", "x", rstd_loss, &c, c.x, T * N, dx, 1000, r);
    free(c.x), free(c.r);
}

/* ------------------------------------------------------------ attention */

typedef struct {
    int S, p0, Hq, Hkv, Dh, ldkv;
    double scale, *q, *k, *v, *r, *sc;
    const int32_t *seg; /* first key of each query (NULL: 0) */
} att_ctx;

static double att_loss(void *vc) {
    att_ctx *c = vc;
    int rep = c->Hq / c->Hkv, Dh = c->Dh;
    double L = 0;
    for (int s = 0; s < c->S; s++)
        for (int h = 0; h < c->Hq; h++) {
            int j = h / rep, valid = c->p0 + s + 1, lo = c->seg ? c->seg[s] : 0;
            const double *q = c->q + ((long)s * c->Hq + h) * Dh, *rr = c->r + ((long)s * c->Hq + h) * Dh;
            double mx = -INFINITY, z = 0;
            for (int t = lo; t < valid; t++) {
                const double *k = c->k + (long)t * c->ldkv + j * Dh;
                double d = 0;
                for (int i = 0; i < Dh; i++) d += q[i] * k[i];
                c->sc[t] = d * c->scale;
                mx = fmax(mx, c->sc[t]);
            }
            for (int t = lo; t < valid; t++) z += (c->sc[t] = exp(c->sc[t] - mx));
            for (int t = lo; t < valid; t++) {
                const double *v = c->v + (long)t * c->ldkv + j * Dh;
                double w = c->sc[t] / z, a = 0;
                for (int i = 0; i < Dh; i++) a += rr[i] * v[i];
                L += w * a;
            }
        }
    return L;
}

/* shared: one tensor is both K and V (nanowhale), so dk and dv are one buffer */
/* segmented: packed documents, each query sees keys from its document's start */
static void test_attention(whale_gemm *g, whale_rng *r, int S, int p0, int Hq, int Hkv, int shared, int segmented) {
    enum { DH = 16 };
    int ctx = p0 + S, ldkv = Hkv * DH;
    int32_t *seg = NULL;
    if (segmented) {
        seg = malloc(sizeof(int32_t) * (size_t)S);
        int start = 0;
        for (int t = 0; t < ctx; t++) {
            if (t > 0 && whale_rng_u64(r) % 13 == 0) start = t; /* a new document */
            if (t >= p0) seg[t - p0] = start;
        }
    }
    long nq = (long)S * Hq * DH, nkv = (long)ctx * ldkv;
    float *q = falloc(nq), *k = falloc(nkv), *v = shared ? k : falloc(nkv), *out = falloc(nq), *dout = falloc(nq);
    float *dq = falloc(nq), *dk = falloc(nkv), *dv = shared ? dk : falloc(nkv);
    size_t wf = k_attention_backward_work_floats(ctx, Hq, Hkv, DH);
    CHECK(wf >= k_attention_work_floats(ctx, Hq, Hkv, DH), "backward work smaller than the forward's");
    float *work = falloc((long)wf);
    whale_err err;
    float scale = 1.0f / sqrtf(DH);
    fill(r, q, nq, 1.5);
    fill(r, k, nkv, 1.0);
    if (!shared) fill(r, v, nkv, 1.0);
    fill(r, dout, nq, 1.0);
    CHECK(k_attention(g, out, q, k, v, ldkv, seg, S, p0, Hq, Hkv, DH, scale, WHALE_F32, work, &err) == WHALE_OK, "%s", err.msg);
    set(dq, nq, NAN);
    set(dk, nkv, ACC0);
    if (!shared) set(dv, nkv, ACC0);
    CHECK(k_attention_backward(g, dq, dk, dv, dout, q, k, v, ldkv, seg, S, p0, Hq, Hkv, DH, scale, WHALE_F32, work, &err) ==
              WHALE_OK,
          "%s", err.msg);
    unacc(dk, nkv);
    if (!shared) unacc(dv, nkv);
    att_ctx c = {S, p0, Hq, Hkv, DH, ldkv, scale, to_d(q, nq), to_d(k, nkv), NULL, to_d(dout, nq),
                 malloc(sizeof(double) * ctx), seg};
    c.v = shared ? c.k : to_d(v, nkv);
    double mag, lf = fdot(dout, out, nq, &mag);
    check_fwd("k_attention_backward", lf, att_loss(&c), mag);
    grad_check("k_attention_backward", "q", att_loss, &c, c.q, nq, dq, 60, r);
    if (shared) {
        grad_check("k_attention_backward", "kv", att_loss, &c, c.k, nkv, dk, 60, r);
    } else {
        grad_check("k_attention_backward", "k", att_loss, &c, c.k, nkv, dk, 60, r);
        grad_check("k_attention_backward", "v", att_loss, &c, c.v, nkv, dv, 60, r);
    }
    /* repeated runs with the same thread count give identical bits */
    float *dq2 = falloc(nq), *dk2 = falloc(nkv), *dv2 = shared ? dk2 : falloc(nkv);
    float *dq3 = falloc(nq), *dk3 = falloc(nkv), *dv3 = shared ? dk3 : falloc(nkv);
    float *dq1 = falloc(nq), *dk1 = falloc(nkv);
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        set(dk2, nkv, 0), set(dv2, nkv, 0), set(dk3, nkv, 0), set(dv3, nkv, 0);
        k_attention_backward(g, dq2, dk2, dv2, dout, q, k, v, ldkv, seg, S, p0, Hq, Hkv, DH, scale, WHALE_F32, work,
                             &err);
        k_attention_backward(g, dq3, dk3, dv3, dout, q, k, v, ldkv, seg, S, p0, Hq, Hkv, DH, scale, WHALE_F32, work,
                             &err);
        CHECK(!memcmp(dq2, dq3, sizeof(float) * nq) && !memcmp(dk2, dk3, sizeof(float) * nkv) &&
                  !memcmp(dv2, dv3, sizeof(float) * nkv),
              "attention backward S=%d threads=%d not repeatable", S, th);
        if (th == 1) memcpy(dq1, dq2, sizeof(float) * nq), memcpy(dk1, dk2, sizeof(float) * nkv);
    }
    omp_set_num_threads(2);
    /* across thread counts only the GEMM library decides; informational */
    printf("attention backward S=%d p0=%d Hq=%d Hkv=%d%s: 1 vs 2 threads %s\n", S, p0, Hq, Hkv,
           shared ? " (dk == dv)" : "",
           !memcmp(dq1, dq2, sizeof(float) * nq) && !memcmp(dk1, dk2, sizeof(float) * nkv) ? "bit-identical"
                                                                                          : "differ in rounding");
    /* bf16 products: all five round their operands, so the gradients move
     * by about the bf16 precision (2^-9) from the fp32 ones, and no more;
     * over a cache (p0 > 0) and on the few-row path they stay fp32, bit for
     * bit. */
    set(dk3, nkv, 0), set(dv3, nkv, 0);
    CHECK(k_attention_backward(g, dq3, dk3, dv3, dout, q, k, v, ldkv, seg, S, p0, Hq, Hkv, DH, scale, WHALE_BF16, work,
                               &err) == WHALE_OK,
          "%s", err.msg);
    double rq = test_rel_norm(dq3, dq2, nq), rk = test_rel_norm(dk3, dk2, nkv), rv = test_rel_norm(dv3, dv2, nkv);
    if (p0 == 0 && S * Hq > 4)
        CHECK(rq < 2e-2 && rk < 2e-2 && rv < 2e-2 && fmax(rq, fmax(rk, rv)) > 1e-4,
              "attention backward (bf16) S=%d: relative distance to fp32 dq %g dk %g dv %g", S, rq, rk, rv);
    else
        CHECK(!memcmp(dq3, dq2, sizeof(float) * nq) && !memcmp(dk3, dk2, sizeof(float) * nkv) &&
                  !memcmp(dv3, dv2, sizeof(float) * nkv),
              "attention backward (bf16) S=%d p0=%d: not fp32", S, p0);
    free(dq1), free(dk1);
    free(dq2), free(dk2), free(dq3), free(dk3);
    if (!shared) free(dv2), free(dv3), free(c.v), free(v), free(dv);
    free(c.q), free(c.k), free(c.r), free(c.sc);
    free(q), free(k), free(out), free(dout), free(dq), free(dk), free(work), free(seg);
}

/* ------------------------------------------------------------ cross-entropy */

typedef struct {
    int B, S, V, shifted;
    const int32_t *t;
    double *logits;
} ce_ctx;

static double ce_loss(void *vc) {
    ce_ctx *c = vc;
    double total = 0;
    long n = 0;
    for (long r = 0; r < (long)c->B * c->S; r++) {
        int32_t y = c->shifted ? ((int)(r % c->S) == c->S - 1 ? -100 : c->t[r + 1]) : c->t[r];
        if (y < 0 || y >= c->V) continue;
        const double *row = c->logits + r * c->V;
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < c->V; v++) mx = fmax(mx, row[v]);
        for (int v = 0; v < c->V; v++) z += exp(row[v] - mx);
        total += log(z) + mx - row[y];
        n++;
    }
    return total / n;
}

static void test_cross_entropy(whale_rng *r) {
    enum { B = 2, S = 6, V = 13, N = B * S * V };
    float logits[N], dl[N], dl2[N];
    int32_t ids[B * S], labels[B * S];
    fill(r, logits, N, 2.0);
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)(whale_rng_u64(r) % V);
    ids[3] = -100;
    ids[S + 2] = -100;
    int64_t n_ref, n1, n2;
    double ref = whale_cross_entropy(logits, ids, B, S, V, &n_ref);
    set(dl, N, NAN);
    double l1 = whale_cross_entropy_backward(dl, logits, ids, B, S, V, &n1);
    CHECK(n1 == n_ref && n1 == B * (S - 1) - 2, "CE count %lld vs %lld", (long long)n1, (long long)n_ref);
    CHECK(fabs(l1 - ref) <= 1e-6 * fabs(ref), "CE loss %.9g vs whale_cross_entropy %.9g", l1, ref);
    ce_ctx c = {B, S, V, 1, ids, to_d(logits, N)};
    CHECK(fabs(ce_loss(&c) - ref) <= 1e-6 * fabs(ref), "double CE differs");
    grad_check("whale_cross_entropy_backward", "logits", ce_loss, &c, c.logits, N, dl, 2000, r);
    int zero_rows = 1; /* each sequence's last row, and row 2 whose target ids[3] is -100 */
    for (int b = 0; b < B; b++)
        for (int v = 0; v < V; v++) zero_rows &= dl[((long)b * S + S - 1) * V + v] == 0.0f && dl[2L * V + v] == 0.0f;
    CHECK(zero_rows, "unscored rows must have zero gradient");
    /* in place over the logits */
    memcpy(dl2, logits, sizeof logits);
    double l2 = whale_cross_entropy_backward(dl2, dl2, ids, B, S, V, NULL);
    CHECK(l2 == l1 && !memcmp(dl, dl2, sizeof dl), "CE backward in place differs");

    /* explicit labels: the shifted ids give the same loss and gradient */
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) labels[b * S + s] = s == S - 1 ? -100 : ids[b * S + s + 1];
    double l3 = whale_cross_entropy_labels(logits, labels, B, S, V, &n2);
    double l4 = whale_cross_entropy_labels_backward(dl2, logits, labels, B, S, V, NULL);
    CHECK(l3 == l1 && l4 == l1 && n2 == n1 && !memcmp(dl, dl2, sizeof dl), "labels variant differs from ids variant");
    /* labels with their own pattern, incl. a last position that is scored */
    for (int i = 0; i < B * S; i++) labels[i] = (int32_t)(whale_rng_u64(r) % V);
    labels[0] = -100;
    labels[7] = -100;
    set(dl2, N, NAN);
    l4 = whale_cross_entropy_labels_backward(dl2, logits, labels, B, S, V, &n2);
    CHECK(n2 == B * S - 2, "labels count %lld", (long long)n2);
    ce_ctx cl = {B, S, V, 0, labels, c.logits};
    CHECK(fabs(ce_loss(&cl) - l4) <= 1e-6 * fabs(l4), "labels loss %.9g vs double %.9g", l4, ce_loss(&cl));
    grad_check("whale_cross_entropy_labels_backward", "logits", ce_loss, &cl, c.logits, N, dl2, 2000, r);
    /* nothing scored: NaN loss, zero gradient */
    for (int i = 0; i < B * S; i++) labels[i] = -100;
    l4 = whale_cross_entropy_labels_backward(dl2, logits, labels, B, S, V, &n2);
    int zero = 1;
    for (int i = 0; i < N; i++) zero &= dl2[i] == 0.0f;
    CHECK(isnan(l4) && n2 == 0 && zero, "all ignored: loss %g count %lld", l4, (long long)n2);
    free(c.logits);
}

static void test_cross_entropy_determinism(whale_rng *r) {
    enum { B = 3, S = 50, V = 3000 };
    long n = (long)B * S * V;
    float *logits = falloc(n), *dl[4];
    int32_t ids[B * S];
    double loss[4];
    fill(r, logits, n, 3.0);
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)(whale_rng_u64(r) % V);
    for (int k = 0; k < 4; k++) {
        omp_set_num_threads(k < 2 ? 1 : 2);
        dl[k] = falloc(n);
        loss[k] = whale_cross_entropy_backward(dl[k], logits, ids, B, S, V, NULL);
    }
    omp_set_num_threads(2);
    CHECK(loss[0] == loss[1] && loss[2] == loss[3] && !memcmp(dl[0], dl[1], sizeof(float) * n) &&
              !memcmp(dl[2], dl[3], sizeof(float) * n),
          "CE backward not repeatable");
    CHECK(!memcmp(dl[0], dl[2], sizeof(float) * n), "CE gradient depends on the thread count");
    double ref = whale_cross_entropy(logits, ids, B, S, V, NULL);
    CHECK(fabs(loss[2] - ref) <= 1e-6 * ref, "CE loss %.9g vs %.9g", loss[2], ref);
    for (int k = 0; k < 4; k++) free(dl[k]);
    free(logits);
}

/* The bf16 variant: the same loss, and each row's gradient rounded to bf16
 * (bit for bit whale_float_to_bf16 of the fp32 gradient) in the first half
 * of its row, in place or not, with 1 or 2 threads; whale_narrow_rows_bf16
 * of the fp32 gradient gives the same bits. V odd: the vector tail. */
static void test_cross_entropy_bf16(whale_rng *r) {
    enum { B = 3, S = 40, V = 3001 };
    long rows = (long)B * S, n = rows * V;
    float *logits = falloc(n), *ref = falloc(n), *dl = falloc(n), *in = falloc(n);
    int32_t labels[B * S];
    fill(r, logits, n, 3.0);
    logits[5L * V + 7] = 1e-40f; /* subnormal logits and gradients round like the rest */
    for (int i = 0; i < B * S; i++) labels[i] = (int32_t)(whale_rng_u64(r) % V);
    labels[0] = -100;
    labels[9] = V + 5; /* out of range: not scored */
    labels[B * S - 1] = V - 1;
    const double gs = 0.37;
    int64_t n_ref, n1;
    for (int k = 0; k < 4; k++) {
        omp_set_num_threads(k % 2 ? 1 : 2); /* the loss's summation order depends on it */
        double l, l_ref = whale_cross_entropy_labels_backward_scaled(ref, logits, labels, B, S, V, gs, &n_ref);
        float *out = dl;
        set(dl, n, NAN);
        if (k < 2) {
            l = whale_cross_entropy_labels_backward_bf16(dl, logits, labels, B, S, V, gs, &n1);
        } else { /* in place over the logits */
            memcpy(in, logits, sizeof(float) * (size_t)n);
            l = whale_cross_entropy_labels_backward_bf16(in, in, labels, B, S, V, gs, &n1);
            out = in;
        }
        long bad = 0;
        for (long row = 0; row < rows; row++) {
            const uint16_t *h = (const uint16_t *)(out + row * V);
            for (long v = 0; v < V; v++) bad += h[v] != whale_float_to_bf16(ref[row * V + v]);
        }
        CHECK(l == l_ref && n1 == n_ref, "bf16 CE loss %.17g vs %.17g, count %lld vs %lld (case %d)", l, l_ref,
              (long long)n1, (long long)n_ref, k);
        CHECK(bad == 0, "bf16 CE gradient: %ld entries differ from the rounded fp32 gradient (case %d)", bad, k);
    }
    omp_set_num_threads(2);
    memcpy(in, ref, sizeof(float) * (size_t)n);
    whale_narrow_rows_bf16(in, rows, V);
    long bad = 0;
    for (long row = 0; row < rows; row++) {
        const uint16_t *h = (const uint16_t *)(in + row * V);
        for (long v = 0; v < V; v++) bad += h[v] != whale_float_to_bf16(ref[row * V + v]);
    }
    CHECK(bad == 0, "whale_narrow_rows_bf16: %ld entries differ from the rounded fp32 gradient", bad);
    free(logits);
    free(ref);
    free(dl);
    free(in);
}

/* ------------------------------------------------------------ main */

int main(void) {
    whale_rng r;
    whale_rng_seed(&r, 20240611);
    whale_err err;
    whale_gemm *g;
    if (whale_gemm_new(&g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    omp_set_num_threads(2);
    double t0 = whale_now();
    test_rmsnorm(&r, 1);
    test_rmsnorm(&r, 0);
    test_rmsnorm_determinism(&r);
    test_rope(&r);
    test_swiglu(&r, 0.0f);
    test_swiglu(&r, 2.5f);
    test_gate(&r);
    /* Sinkhorn with 1, 2 and 5 iterations; M = 16 with 10 iterations exceeds
     * the tape and recomputes each step's input */
    test_hc_coeffs(&r, 4, 1, 3, 0);
    test_hc_coeffs(&r, 4, 2, 3, 0);
    test_hc_coeffs(&r, 4, 5, 3, 0);
    test_hc_coeffs(&r, 3, 2, 2, 0);
    test_hc_coeffs(&r, 16, 10, 1, 0);
    test_hc_coeffs(&r, 4, 0, 3, 1);
    test_hc_coeffs_determinism(&r);
    test_hc_reduce_expand(&r);
    test_rstd(&r);
    /* direct path (few rows) and the blocked GEMM path; MQA with dk == dv,
     * GQA, a cache prefix p0 > 0 */
    test_attention(g, &r, 1, 0, 8, 1, 1, 0);
    test_attention(g, &r, 1, 20, 4, 1, 1, 0);
    test_attention(g, &r, 3, 10, 4, 2, 0, 0);
    test_attention(g, &r, 5, 3, 2, 2, 0, 0);
    test_attention(g, &r, 130, 0, 4, 1, 1, 0);
    test_attention(g, &r, 100, 0, 4, 1, 0, 0);
    test_attention(g, &r, 70, 33, 4, 2, 0, 0);
    test_attention(g, &r, 70, 9, 4, 2, 1, 0);
    /* packed documents: block-diagonal causal masks */
    test_attention(g, &r, 3, 20, 4, 2, 0, 1);
    test_attention(g, &r, 130, 0, 4, 1, 1, 1);
    test_attention(g, &r, 90, 7, 14, 2, 0, 1); /* GQA 7:1, packed documents, two query blocks */
    test_attention(g, &r, 90, 0, 14, 2, 0, 1);
    test_attention(g, &r, 70, 9, 4, 2, 0, 1);
    test_cross_entropy(&r);
    test_cross_entropy_determinism(&r);
    test_cross_entropy_bf16(&r);
    whale_gemm_free(g);
    printf("worst relative gradient error vs central differences (tolerance %g):\n", TOL);
    for (int i = 0; i < n_worst; i++) printf("  %-38s %.3e\n", worst[i].name, worst[i].err);
    printf("time %.2f s\n", whale_now() - t0);
    return test_finish("test_backward");
}
