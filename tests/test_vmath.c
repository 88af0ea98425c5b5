/* kernels/vmath: exp accuracy against double exp (max ulp over a dense sample
 * of every binade, or over every float with WHALE_VMATH_EXHAUSTIVE=1), special
 * values, the AVX-512 and scalar paths giving the same bits, the fused sum
 * against a double sum, k_max, and k_dot_f64's lane order and error. (Its
 * speed against libm's expf: bench/bench_vmath.c.) */
#include "testutil.h"

#include "core/core.h"
#include "kernels/vmath.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* |y − e| in units of the float ulp at e (e normal, taken from double exp). */
static double ulp_err(float y, double e) {
    int ex;
    frexp(e, &ex); /* e = m·2^ex, m in [0.5, 1): float ulp is 2^(ex−24) */
    return fabs((double)y - e) / ldexp(1.0, ex - 24);
}

/* Result classes over the input range: normal results are measured in ulp,
 * subnormal ones in absolute steps of 2^-149, the rest must be 0 or inf. */
struct acc_stats {
    double max_ulp, max_ulp_x, max_sub_steps;
    long n_normal, n_sub, bad_zero, bad_inf, path_diff;
};

static void check_chunk(struct acc_stats *st, const float *x, float *y, long n) {
    k_exp(y, x, n);
    for (long i = 0; i < n; i++) {
        if (to_bits(y[i]) != to_bits(k_exp1(x[i]))) st->path_diff++;
        double e = exp((double)x[i]);
        if (e > FLT_MAX) {
            st->bad_inf += !(isinf(y[i]) && y[i] > 0);
        } else if (e >= FLT_MIN) {
            double u = ulp_err(y[i], e);
            if (!(u <= st->max_ulp)) st->max_ulp = u, st->max_ulp_x = x[i];
            st->n_normal++;
        } else if (e >= 0x1p-151) { /* subnormal, or rounds to 0 or to 2^-149 */
            double s = fabs((double)y[i] - e) / 0x1p-149;
            if (!(s <= st->max_sub_steps)) st->max_sub_steps = s;
            st->n_sub += y[i] != 0;
            st->bad_zero += signbit(y[i]) != 0;
        } else {
            st->bad_zero += !(y[i] == 0 && !signbit(y[i]));
        }
    }
}

/* Every float in [−110, 90] whose bit pattern is a multiple of stride (plus
 * one offset so the sample does not favour round values), both signs. */
static void test_accuracy(void) {
    const char *ex = getenv("WHALE_VMATH_EXHAUSTIVE");
    uint32_t stride = ex && *ex == '1' ? 1 : 211;
    enum { CHUNK = 1 << 16 };
    float *x = malloc(sizeof(float) * CHUNK), *y = malloc(sizeof(float) * CHUNK);
    struct acc_stats st = {0};
    double t0 = whale_now();
    for (int sign = 0; sign < 2; sign++) {
        uint32_t top = to_bits(sign ? 110.0f : 90.0f), s = sign ? 0x80000000u : 0;
        long n = 0;
        for (uint32_t b = stride > 1 ? 7 : 0; b <= top; b += stride) {
            x[n++] = from_bits(b | s);
            if (n == CHUNK) check_chunk(&st, x, y, n), n = 0;
        }
        check_chunk(&st, x, y, n);
    }
    printf("exp accuracy (%s, %ld normal + %ld subnormal results, %.1f s): max %.3f ulp at x = %.9g, "
           "subnormal max %.3f steps of 2^-149\n",
           stride == 1 ? "every float" : "every 211th float", st.n_normal, st.n_sub, whale_now() - t0, st.max_ulp,
           st.max_ulp_x, st.max_sub_steps);
    /* over every float the max is 1.014 ulp; the target is 2 */
    CHECK(st.max_ulp <= 1.1, "normal results: max %.3f ulp", st.max_ulp);
    CHECK(st.max_sub_steps <= 1.0, "subnormal results: max %.3f steps", st.max_sub_steps);
    CHECK(st.bad_zero == 0 && st.bad_inf == 0, "%ld results should be +0, %ld should be +inf", st.bad_zero,
          st.bad_inf);
    CHECK(st.path_diff == 0, "%ld results differ between k_exp and k_exp1", st.path_diff);
    free(x);
    free(y);
}

static void test_special(void) {
    /* each value at every lane position of a full vector and of a tail */
    static const float v[] = {-INFINITY, -100.0f, -87.5f, 0.0f, -0.0f, 88.7f, 89.0f, INFINITY, NAN, -103.0f,
                              -150.0f,   -1e30f,  1e30f,  1.0f, 88.72283f, -87.33654f};
    enum { NV = sizeof v / sizeof v[0] };
    for (int k = 0; k < NV; k++) {
        float x[37], y[37];
        for (int i = 0; i < 37; i++) x[i] = v[k];
        k_exp(y, x, 37);
        k_exp(x, x, 37); /* in place */
        double e = exp((double)v[k]);
        for (int i = 0; i < 37; i++) {
            CHECK(to_bits(y[i]) == to_bits(x[i]) || (isnan(x[i]) && isnan(y[i])), "in place, x=%g", v[k]);
            float s = k_exp1(v[k]);
            CHECK(to_bits(y[i]) == to_bits(s) || (isnan(s) && isnan(y[i])), "paths differ at x=%g", v[k]);
            if (isnan(v[k]))
                CHECK(isnan(y[i]), "exp(NaN) = %g", y[i]);
            else if (e > FLT_MAX)
                CHECK(isinf(y[i]) && y[i] > 0, "exp(%g) = %g, want inf", v[k], y[i]);
            else if (e >= FLT_MIN)
                CHECK(ulp_err(y[i], e) <= 1.1, "exp(%g) = %.9g, want %.9g", v[k], y[i], e);
            else if (e >= 0x1p-151)
                CHECK(!signbit(y[i]) && fabs(y[i] - e) <= 0x1p-149, "exp(%g) = %g, want subnormal %g", v[k], y[i], e);
            else
                CHECK(y[i] == 0 && !signbit(y[i]), "exp(%g) = %g, want +0", v[k], y[i]);
        }
    }
    CHECK(k_exp1(0.0f) == 1.0f && k_exp1(-INFINITY) == 0.0f, "exact values");
    CHECK(k_exp1(-100.0f) > 0 && k_exp1(-100.0f) < FLT_MIN, "exp(-100) is subnormal");
}

/* k_exp_sum against a double sum of double exps of the same float arguments,
 * the two paths bit for bit, and dst = NULL / dst = x. */
static void test_sum(whale_rng *rng) {
    static const long lens[] = {1, 15, 16, 17, 255, 256, 257, 4099, 129280};
    static const float subs[] = {0.0f, 3.0f}, scales[] = {1.0f, 0.5f};
    long nmax = 129280;
    float *x = malloc(sizeof(float) * nmax), *y = malloc(sizeof(float) * nmax), *z = malloc(sizeof(float) * nmax),
          *w = malloc(sizeof(float) * nmax);
    double worst = 0;
    for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++)
        for (int si = 0; si < 2; si++) {
            long n = lens[li];
            float sub = subs[si], scale = scales[si];
            for (long i = 0; i < n; i++) x[i] = (float)(whale_rng_normal(rng) * 3.0);
            if (si == 0) x[n / 2] = 0; /* sum ≥ 1, as for softmax (x − max) */
            double ref = 0;
            for (long i = 0; i < n; i++) ref += exp((double)((x[i] - sub) * scale));
            double s = k_exp_sum(y, x, sub, scale, n);
            double s_null = k_exp_sum(NULL, x, sub, scale, n);
            double s_ref = k_exp_sum_scalar(z, x, sub, scale, n);
            memcpy(w, x, sizeof(float) * n);
            double s_alias = k_exp_sum(w, w, sub, scale, n);
            double rel = fabs(s - ref) / ref;
            if (rel > worst) worst = rel;
            /* 15u from the fp32 lanes + 1 ulp per exp, plus slack */
            CHECK(rel <= 1.1e-6, "n=%ld sub=%g: sum %.17g vs %.17g (rel %.3g)", n, sub, s, ref, rel);
            CHECK(s == s_null && s == s_ref && s == s_alias, "n=%ld: sums differ %.17g %.17g %.17g %.17g", n, s,
                  s_null, s_ref, s_alias);
            CHECK(memcmp(y, z, sizeof(float) * n) == 0 && memcmp(y, w, sizeof(float) * n) == 0,
                  "n=%ld: exps differ between paths / in place", n);
        }
    printf("exp sum: max relative error %.3g vs double (bound 9.0e-7 + exp error)\n", worst);
    CHECK(k_exp_sum(y, x, 0, 1, 0) == 0, "empty sum");
    free(x);
    free(y);
    free(z);
    free(w);
}

static void test_max(whale_rng *rng) {
    float x[200];
    for (int n = 0; n <= 200; n++) {
        for (int i = 0; i < n; i++) x[i] = (float)whale_rng_normal(rng);
        if (n > 3) x[n / 3] = NAN;
        float m = -INFINITY;
        for (int i = 0; i < n; i++)
            if (x[i] > m) m = x[i];
        CHECK(k_max(x, n) == m, "k_max n=%d: %g vs %g", n, k_max(x, n), m);
    }
    x[5] = INFINITY;
    CHECK(k_max(x, 100) == INFINITY, "k_max with +inf");
    for (int i = 0; i < 40; i++) x[i] = NAN;
    CHECK(k_max(x, 40) == -INFINITY, "all NaN: -inf");
}

/* k_dot_f64: exactly the documented lane order (a scalar model of it), and
 * within its bound of a long double sum, for every length up to 200 and
 * one long row with cancellation. */
static double dot_lanes_model(const float *a, const float *b, long n) {
    double lane[32] = {0};
    for (long i = 0; i < n; i++) lane[i % 32] += (double)a[i] * b[i];
    double s = 0;
    for (int l = 0; l < 32; l++) s += lane[l];
    return s;
}

static void test_dot(whale_rng *rng) {
    enum { N = 5000 };
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    for (long i = 0; i < N; i++) a[i] = (float)whale_rng_normal(rng), b[i] = (float)whale_rng_normal(rng);
    for (long n = 0; n <= N; n = n < 200 ? n + 1 : n < N ? N : N + 1) { /* 0..200, then N */
        long double exact = 0, mag = 0;
        for (long i = 0; i < n; i++) exact += (long double)a[i] * b[i], mag += fabsl((long double)a[i] * b[i]);
        double d = k_dot_f64(a, b, n), bound = ((double)n / 32 + 32) * 0x1p-53 * (double)mag;
        CHECK(d == dot_lanes_model(a, b, n), "k_dot_f64 n=%ld: lane order", n);
        CHECK(fabsl((long double)d - exact) <= bound, "k_dot_f64 n=%ld: error %Lg > bound %g", n,
              fabsl((long double)d - exact), bound);
    }
    CHECK(k_dot_f64(a, a + 1, 0) == 0, "empty dot");
    a[7] = NAN;
    CHECK(isnan(k_dot_f64(a, b, 40)), "NaN propagates");
    free(a);
    free(b);
}

/* 1024 rows of a 129,280-entry vocabulary: one training step's logits. */
int main(void) {
    whale_rng rng;
    whale_rng_seed(&rng, 1234);
    test_special();
    test_max(&rng);
    test_sum(&rng);
    test_dot(&rng);
    test_accuracy();
    return test_finish("test_vmath");
}
