/* Vectorised exp, scaling and max (kernels/vmath.h). Single-threaded: the callers
 * already split their rows over threads. */
#include "kernels/vmath.h"

#include "core/cpu.h"

#include <math.h>

#if WHALE_X86
#include <immintrin.h>
#endif

/* The argument is clamped to [EXP_LO, EXP_HI] first: exp(-104) is below half
 * the smallest subnormal and exp(89) above FLT_MAX, so the clamp changes no
 * result, and it keeps k small enough that −inf and +inf need no special case
 * (−inf would otherwise give r = −inf + inf = NaN). */
#define EXP_LO -104.0f
#define EXP_HI 89.0f
#define LOG2E 1.442695022e+00f
/* ln2 = LN2_HI + LN2_LO: LN2_HI is ln2 rounded to float. When k ≠ 0,
 * |x| > 0.34, so x and k·LN2_HI are multiples of 2^-25 and their difference,
 * below 0.5 in magnitude, fits in 24 bits: the first FMA is exact, the
 * second adds the tail with one rounding. */
#define LN2_HI 6.931471825e-01f
#define LN2_LO -1.904654212e-09f
/* q(r) ≈ (exp(r) − 1 − r)/r², Remez fit of the relative error of
 * 1 + r + r²·q(r) on |r| ≤ 0.3473 (a little wider than ln2/2, since k comes
 * from the rounded product x·LOG2E). */
#define C2 4.999999404e-01f
#define C3 1.666651964e-01f
#define C4 4.166840017e-02f
#define C5 8.368850686e-03f
#define C6 1.381432055e-03f

/* Block of the fp32 partial sums in k_exp_sum: 16 elements per lane. */
enum { SUM_BLOCK = 256, LANES = 16 };

/* Inlined into the portable kernels below, so their AVX2 copies get
 * hardware FMAs (an fmaf call without them is a slow exact emulation). */
#define INLINE static inline __attribute__((always_inline))

INLINE float exp1(float x) {
    if (x != x) return x + x;
    x = fminf(fmaxf(x, EXP_LO), EXP_HI);
    float k = rintf(x * LOG2E);
    float r = fmaf(-k, LN2_HI, x);
    r = fmaf(-k, LN2_LO, r);
    float r2 = r * r;
    float q = fmaf(C6, r, C5);
    q = fmaf(q, r, C4);
    q = fmaf(q, r, C3);
    q = fmaf(q, r, C2);
    float p = fmaf(q, r2, r) + 1.0f;
    return ldexpf(p, (int)k); /* one rounding, also into the subnormals */
}

float k_exp1(float x) { return exp1(x); }

INLINE double exp_sum_c(float *dst, const float *x, float sub, float scale, long n) {
    double total[LANES] = {0};
    for (long b = 0; b < n; b += SUM_BLOCK) {
        long e = n - b < SUM_BLOCK ? n : b + SUM_BLOCK;
        float acc[LANES] = {0};
        for (long i = b; i < e; i++) {
            float y = exp1((x[i] - sub) * scale);
            if (dst) dst[i] = y;
            acc[i % LANES] += y;
        }
        for (int l = 0; l < LANES; l++) total[l] += acc[l];
    }
    double s = 0;
    for (int l = 0; l < LANES; l++) s += total[l];
    return s;
}

double k_exp_sum_scalar(float *dst, const float *x, float sub, float scale, long n) {
    return exp_sum_c(dst, x, sub, scale, n);
}

/* portable path */

INLINE void k_exp_c(float *dst, const float *x, long n) {
    for (long i = 0; i < n; i++) dst[i] = exp1(x[i]);
}

INLINE double k_exp_sum_c(float *dst, const float *x, float sub, float scale, long n) {
    return exp_sum_c(dst, x, sub, scale, n);
}

INLINE double k_dot_f64_c(const float *a, const float *b, long n) {
    double lane[32] = {0};
    for (long i = 0; i < n; i++) lane[i % 32] += (double)a[i] * b[i]; /* exact product: fma or not, same sum */
    double s = 0;
    for (int l = 0; l < 32; l++) s += lane[l];
    return s;
}

INLINE void k_scale_c(float *x, float a, long n) {
    for (long i = 0; i < n; i++) x[i] *= a;
}

INLINE float k_max_c(const float *x, long n) {
    float m = -INFINITY;
    for (long i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

/* The portable kernels compiled twice: for the build's baseline and for
 * AVX2 + FMA (the same operations, so the same bits). */
#define PORTABLE_COPIES(SUFFIX)                                                                    \
    static void k_exp_##SUFFIX(float *dst, const float *x, long n) { k_exp_c(dst, x, n); }        \
    static double k_exp_sum_##SUFFIX(float *dst, const float *x, float sub, float scale, long n) { \
        return k_exp_sum_c(dst, x, sub, scale, n);                                                 \
    }                                                                                              \
    static double k_dot_f64_##SUFFIX(const float *a, const float *b, long n) { return k_dot_f64_c(a, b, n); } \
    static void k_scale_##SUFFIX(float *x, float a, long n) { k_scale_c(x, a, n); }              \
    static float k_max_##SUFFIX(const float *x, long n) { return k_max_c(x, n); }
PORTABLE_COPIES(base)
#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX2)
PORTABLE_COPIES(avx2)
WHALE_TARGET_END
#endif

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* k_exp1 on 16 lanes, operation for operation. max(lo, x) returns x when x
 * is NaN (the second operand), so NaN passes the clamp; scalef computes
 * p·2^k with one rounding, like ldexpf. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(EXP_HI), _mm512_max_ps(_mm512_set1_ps(EXP_LO), x));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_LO), r);
    __m512 r2 = _mm512_mul_ps(r, r);
    __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(C6), r, _mm512_set1_ps(C5));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(C4));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(C3));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(C2));
    __m512 p = _mm512_add_ps(_mm512_fmadd_ps(q, r2, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

static inline __mmask16 tail_mask(long m) { return (__mmask16)((1u << m) - 1); }

static void k_exp_avx512(float *dst, const float *x, long n) {
    long i = 0;
    for (; i + LANES <= n; i += LANES) _mm512_storeu_ps(dst + i, exp16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static double k_exp_sum_avx512(float *dst, const float *x, float sub, float scale, long n) {
    const __m512 vsub = _mm512_set1_ps(sub), vscale = _mm512_set1_ps(scale);
    __m512d tlo = _mm512_setzero_pd(), thi = _mm512_setzero_pd(); /* lanes 0-7, 8-15 */
    for (long b = 0; b < n; b += SUM_BLOCK) {
        long e = n - b < SUM_BLOCK ? n : b + SUM_BLOCK, i = b;
        __m512 acc = _mm512_setzero_ps();
        for (; i + LANES <= e; i += LANES) {
            __m512 y = exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vsub), vscale));
            if (dst) _mm512_storeu_ps(dst + i, y);
            acc = _mm512_add_ps(acc, y);
        }
        if (i < e) {
            __mmask16 m = tail_mask(e - i);
            __m512 y = exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vsub), vscale));
            if (dst) _mm512_mask_storeu_ps(dst + i, m, y);
            acc = _mm512_mask_add_ps(acc, m, acc, y);
        }
        tlo = _mm512_add_pd(tlo, _mm512_cvtps_pd(_mm512_castps512_ps256(acc)));
        thi = _mm512_add_pd(thi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))));
    }
    double total[LANES];
    _mm512_storeu_pd(total, tlo);
    _mm512_storeu_pd(total + 8, thi);
    double s = 0;
    for (int l = 0; l < LANES; l++) s += total[l];
    return s;
}

static double k_dot_f64_avx512(const float *a, const float *b, long n) {
    __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
    long i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; j++) {
            __m512d x = _mm512_cvtps_pd(_mm256_loadu_ps(a + i + 8 * j));
            __m512d y = _mm512_cvtps_pd(_mm256_loadu_ps(b + i + 8 * j));
            acc[j] = _mm512_fmadd_pd(x, y, acc[j]);
        }
    for (int j = 0; i < n; i += 8, j++) { /* the tail, lanes in the same order */
        __mmask8 m = n - i >= 8 ? 0xFF : (__mmask8)((1u << (n - i)) - 1);
        __m512d x = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, a + i));
        __m512d y = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, b + i));
        acc[j] = _mm512_fmadd_pd(x, y, acc[j]);
    }
    double lane[32];
    for (int j = 0; j < 4; j++) _mm512_storeu_pd(lane + 8 * j, acc[j]);
    double s = 0;
    for (int l = 0; l < 32; l++) s += lane[l];
    return s;
}

static void k_scale_avx512(float *x, float a, long n) {
    const __m512 va = _mm512_set1_ps(a);
    long i = 0;
    for (; i + LANES <= n; i += LANES) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), va));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), va));
    }
}

static float k_max_avx512(const float *x, long n) {
    /* max(v, acc) returns acc when v is NaN: NaNs are skipped, as in the
     * scalar loop. Four accumulators hide the max latency. */
    __m512 a0 = _mm512_set1_ps(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
    long i = 0;
    for (; i + 4 * LANES <= n; i += 4 * LANES) {
        a0 = _mm512_max_ps(_mm512_loadu_ps(x + i), a0);
        a1 = _mm512_max_ps(_mm512_loadu_ps(x + i + LANES), a1);
        a2 = _mm512_max_ps(_mm512_loadu_ps(x + i + 2 * LANES), a2);
        a3 = _mm512_max_ps(_mm512_loadu_ps(x + i + 3 * LANES), a3);
    }
    for (; i + LANES <= n; i += LANES) a0 = _mm512_max_ps(_mm512_loadu_ps(x + i), a0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        a0 = _mm512_mask_max_ps(a0, m, _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0, a1), _mm512_max_ps(a2, a3)));
}
WHALE_TARGET_END
#endif

/* Every form gives the same bits (tests/test_vmath.c checks the AVX-512
 * ones against the portable ones). */
void k_exp(float *dst, const float *x, long n) {
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) {
        k_exp_avx512(dst, x, n);
        return;
    }
    if (whale_isa_at_least(WHALE_ISA_AVX2)) {
        k_exp_avx2(dst, x, n);
        return;
    }
#endif
    k_exp_base(dst, x, n);
}

double k_exp_sum(float *dst, const float *x, float sub, float scale, long n) {
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) return k_exp_sum_avx512(dst, x, sub, scale, n);
    if (whale_isa_at_least(WHALE_ISA_AVX2)) return k_exp_sum_avx2(dst, x, sub, scale, n);
#endif
    return k_exp_sum_base(dst, x, sub, scale, n);
}

double k_dot_f64(const float *a, const float *b, long n) {
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) return k_dot_f64_avx512(a, b, n);
    if (whale_isa_at_least(WHALE_ISA_AVX2)) return k_dot_f64_avx2(a, b, n);
#endif
    return k_dot_f64_base(a, b, n);
}

void k_scale(float *x, float a, long n) {
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) {
        k_scale_avx512(x, a, n);
        return;
    }
    if (whale_isa_at_least(WHALE_ISA_AVX2)) {
        k_scale_avx2(x, a, n);
        return;
    }
#endif
    k_scale_base(x, a, n);
}

float k_max(const float *x, long n) {
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) return k_max_avx512(x, n);
    if (whale_isa_at_least(WHALE_ISA_AVX2)) return k_max_avx2(x, n);
#endif
    return k_max_base(x, n);
}

