/* Vectorised exp, scaling and max (kernels/vmath.h). Single-threaded: the callers
 * already split their rows over threads. */
#include "kernels/vmath.h"

#include "core/cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* 2^e for a normal exponent e (−126 ≤ e ≤ 127). */
INLINE float pow2(int e) {
    const uint32_t bits = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

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
    const int ki = (int)k, k1 = ki >> 1; /* p·2^k with one rounding, as in exp8 below */
    return p * pow2(k1) * pow2(ki - k1);
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
static double k_dot_f64_avx2(const float *a, const float *b, long n) { return k_dot_f64_c(a, b, n); }
static void k_scale_avx2(float *x, float a, long n) { k_scale_c(x, a, n); }

/* k_exp1 on 8 lanes, operation for operation. AVX2 has no scalef: p·2^k is
 * p·2^(k>>1)·2^(k−(k>>1)), two powers of two that are normal floats for
 * every k the clamp allows (−150..128). The first product is exact (p is
 * in [0.7, 1.42]), so the second rounds once, as ldexpf and scalef do,
 * into the subnormals and to +inf alike. max(lo, x) and min(hi, x) return
 * x when it is NaN, which then passes through. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), _mm256_max_ps(_mm256_set1_ps(EXP_LO), x));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), r);
    __m256 r2 = _mm256_mul_ps(r, r);
    __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(C6), r, _mm256_set1_ps(C5));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(C4));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(C3));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(C2));
    __m256 p = _mm256_add_ps(_mm256_fmadd_ps(q, r2, r), _mm256_set1_ps(1.0f));
    const __m256i ki = _mm256_cvtps_epi32(k), k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* Lanes 0..m−1 set (m ≤ 8), for maskload/maskstore. */
static inline __m256i mask8(long m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static void k_exp_avx2(float *dst, const float *x, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        const __m256i m = mask8(n - i);
        _mm256_maskstore_ps(dst + i, m, exp8(_mm256_maskload_ps(x + i, m)));
    }
}

/* Eight of exp_sum_c's 16 lanes: exps of x[i..i+7] (the first `left` of
 * them; the others count 0) added to acc, stored to dst when it is set. */
static inline __m256 exp_sum8(__m256 acc, float *dst, const float *x, long left, __m256 vsub, __m256 vscale) {
    if (left <= 0) return acc;
    const __m256i m = mask8(left < 8 ? left : 8);
    __m256 y = exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x, m), vsub), vscale));
    y = _mm256_and_ps(y, _mm256_castsi256_ps(m));
    if (dst) _mm256_maskstore_ps(dst, m, y);
    return _mm256_add_ps(acc, y);
}

/* exp_sum_c's sums in its order: lane l of the 16 adds the elements
 * i ≡ l (mod 16) of each block in fp32, then goes into its double total. */
static double k_exp_sum_avx2(float *dst, const float *x, float sub, float scale, long n) {
    const __m256 vsub = _mm256_set1_ps(sub), vscale = _mm256_set1_ps(scale);
    __m256d t[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    for (long b = 0; b < n; b += SUM_BLOCK) {
        const long e = n - b < SUM_BLOCK ? n : b + SUM_BLOCK;
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (long i = b; i < e; i += LANES) {
            lo = exp_sum8(lo, dst ? dst + i : NULL, x + i, e - i, vsub, vscale);
            hi = exp_sum8(hi, dst ? dst + i + 8 : NULL, x + i + 8, e - i - 8, vsub, vscale);
        }
        t[0] = _mm256_add_pd(t[0], _mm256_cvtps_pd(_mm256_castps256_ps128(lo)));
        t[1] = _mm256_add_pd(t[1], _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)));
        t[2] = _mm256_add_pd(t[2], _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
        t[3] = _mm256_add_pd(t[3], _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)));
    }
    double total[LANES];
    for (int j = 0; j < 4; j++) _mm256_storeu_pd(total + 4 * j, t[j]);
    double s = 0;
    for (int l = 0; l < LANES; l++) s += total[l];
    return s;
}

/* max(v, acc) returns acc when v is NaN: NaNs are skipped, as in k_max_c. */
static float k_max_avx2(const float *x, long n) {
    __m256 a0 = _mm256_set1_ps(-INFINITY), a1 = a0;
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_max_ps(_mm256_loadu_ps(x + i), a0);
        a1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), a1);
    }
    float m[8];
    _mm256_storeu_ps(m, _mm256_max_ps(a0, a1));
    float best = k_max_c(m, 8), rest = k_max_c(x + i, n - i);
    return rest > best ? rest : best;
}
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

