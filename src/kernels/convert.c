#include "kernels/convert.h"

#include <omp.h>
#include <string.h>

#include "core/cpu.h"
#include "core/par.h"

#if WHALE_X86
#include <immintrin.h>
#endif

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float whale_bf16_to_float(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t whale_float_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float whale_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / NaN */
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: value = man * 2^-24, exact in fp32 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t whale_float_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* result is subnormal or zero: round a * 2^24 to an integer, ties to even */
        if (a < 0x33000000u) return sign; /* below half the smallest subnormal */
        uint32_t exp = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)exp; /* 14..24 */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return sign | (uint16_t)(r >> 13);
}

/* Full 16-lane vectors in the loops below, the tail in plain C: the scalar
 * functions are the definition, and each vector form is checked against
 * them bit for bit (tests/test_convert.c). */

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* The whole vectors of whale_bf16_to_f32, from element i on; returns where it stopped. */
static size_t whale_bf16_to_f32_avx512(float *dst, const void *src, size_t n, size_t i) {
    const uint16_t *s = src;
    for (; i + 16 <= n; i += 16) {
        const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(h, 16));
    }
    return i;
}
WHALE_TARGET_END
#endif

void whale_bf16_to_f32(float *dst, const void *src, size_t n) {
    const uint16_t *s = src;
    size_t i = 0;
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) i = whale_bf16_to_f32_avx512(dst, src, n, i);
#endif
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + i, 2);
        dst[i] = whale_bf16_to_float(h);
    }
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* The whole vectors of whale_f16_to_f32, from element i on; returns where it stopped. */
static size_t whale_f16_to_f32_avx512(float *dst, const void *src, size_t n, size_t i) {
    const uint16_t *s = src;
    const __m512i abs = _mm512_set1_epi32(0x7fff), inf = _mm512_set1_epi32(0x7c00);
    const __m512i sgn = _mm512_set1_epi32(0x8000), man = _mm512_set1_epi32(0x3ff);
    const __m512i exp32 = _mm512_set1_epi32(0x7f800000);
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(s + i));
        __m512i v = _mm512_castps_si512(_mm512_cvtph_ps(h));
        /* vcvtph2ps quiets signalling NaNs; the scalar code keeps the payload */
        const __m512i e = _mm512_cvtepu16_epi32(h);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(e, abs), inf);
        if (nan) {
            const __m512i bits =
                _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(e, sgn), 16), exp32),
                                _mm512_slli_epi32(_mm512_and_si512(e, man), 13));
            v = _mm512_mask_mov_epi32(v, nan, bits);
        }
        _mm512_storeu_si512(dst + i, v);
    }
    return i;
}
WHALE_TARGET_END
#endif

void whale_f16_to_f32(float *dst, const void *src, size_t n) {
    const uint16_t *s = src;
    size_t i = 0;
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) i = whale_f16_to_f32_avx512(dst, src, n, i);
#endif
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + i, 2);
        dst[i] = whale_f16_to_float(h);
    }
}

/* vcvtps2ph with an explicit round-to-nearest-even (not MXCSR's mode):
 * overflow to inf, fp16 subnormals produced, NaN quieted keeping the top
 * payload bits: exactly whale_float_to_f16. */
#define F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* The whole vectors of whale_f32_to_f16_rows, from element i on; returns where it stopped. */
static size_t whale_f32_to_f16_rows_avx512(uint16_t *dst, const float *src, size_t n, size_t i) {

    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), F16_RNE));
    return i;
}
WHALE_TARGET_END
#endif

void whale_f32_to_f16_rows(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) i = whale_f32_to_f16_rows_avx512(dst, src, n, i);
#endif
    for (; i < n; i++) dst[i] = whale_float_to_f16(src[i]);
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* The whole vectors of whale_round_f16_rows, from element i on; returns where it stopped. */
static size_t whale_round_f16_rows_avx512(float *dst, const float *src, size_t n, size_t i) {

    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(src + i), F16_RNE)));
    return i;
}
WHALE_TARGET_END
#endif

void whale_round_f16_rows(float *dst, const float *src, size_t n) {
    size_t i = 0;
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) i = whale_round_f16_rows_avx512(dst, src, n, i);
#endif
    for (; i < n; i++) dst[i] = whale_f16_to_float(whale_float_to_f16(src[i]));
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* The whole vectors of whale_round_bf16_rows, from element i on; returns where it stopped. */
static size_t whale_round_bf16_rows_avx512(float *dst, const float *src, size_t n, size_t i) {

    /* integer rounding as in whale_float_to_bf16; the bf16 instructions
     * would flush subnormals */
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u), quiet = _mm512_set1_epi32(0x400000);
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512(src + i);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), hi_mask);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_and_si512(u, hi_mask), quiet));
        _mm512_storeu_si512(dst + i, r);
    }
    return i;
}
WHALE_TARGET_END
#endif

void whale_round_bf16_rows(float *dst, const float *src, size_t n) {
    size_t i = 0;
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) i = whale_round_bf16_rows_avx512(dst, src, n, i);
#endif
    for (; i < n; i++) dst[i] = whale_bf16_to_float(whale_float_to_bf16(src[i]));
}

void whale_round_bf16_inplace(float *x, size_t n) { whale_round_bf16_rows(x, x, n); }

void whale_round_f16_inplace(float *x, size_t n) { whale_round_f16_rows(x, x, n); }

/* ------------------------------------------------------------ stochastic rounding */

uint16_t whale_float_to_bf16_sr(float f, uint32_t r) {
    const uint32_t u = f32_bits(f);
    /* a NaN's low bits could carry into the sign; inf (low bits 0) needs no case */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

#define SM64_GAMMA 0x9e3779b97f4a7c15ull
#define SM64_M1 0xbf58476d1ce4e5b9ull
#define SM64_M2 0x94d049bb133111ebull

/* Output t of splitmix64 seeded with seed. */
static inline uint64_t sm64_at(uint64_t seed, uint64_t t) {
    uint64_t z = seed + (t + 1) * SM64_GAMMA;
    z = (z ^ (z >> 30)) * SM64_M1;
    z = (z ^ (z >> 27)) * SM64_M2;
    return z ^ (z >> 31);
}

static inline float sr_one(float x, uint64_t seed, uint64_t j) {
    const uint32_t r = (uint32_t)(sm64_at(seed, j >> 2) >> (16 * (j & 3))) & 0xffffu;
    return whale_bf16_to_float(whale_float_to_bf16_sr(x, r));
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* The whole vectors of sr_range, from element i on; returns where it stopped. */
static size_t sr_range_avx512(float *x, size_t n, uint64_t seed, uint64_t j0, size_t i) {
    /* 8 splitmix64 outputs = 32 16-bit values, in element order when the
     * zmm is read as 32 words (little endian: bits 16q.. of output t serve
     * element 4t + q) */
    const __m512i lanes = _mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1);
    const __m512i gamma = _mm512_set1_epi64((long long)SM64_GAMMA);
    const __m512i m1 = _mm512_set1_epi64((long long)SM64_M1), m2 = _mm512_set1_epi64((long long)SM64_M2);
    const __m512i vseed = _mm512_set1_epi64((long long)seed);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u), quiet = _mm512_set1_epi32(0x400000);
    for (; i + 32 <= n; i += 32) {
        const __m512i t1 = _mm512_add_epi64(_mm512_set1_epi64((long long)((j0 + i) >> 2)), lanes);
        __m512i z = _mm512_add_epi64(vseed, _mm512_mullo_epi64(t1, gamma));
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), m1);
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), m2);
        z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
        for (int h = 0; h < 2; h++) {
            const __m512i r = _mm512_cvtepu16_epi32(h ? _mm512_extracti64x4_epi64(z, 1)
                                                      : _mm512_castsi512_si256(z));
            float *p = x + i + 16 * h;
            const __m512i u = _mm512_loadu_si512(p);
            __m512i v = _mm512_and_si512(_mm512_add_epi32(u, r), hi_mask);
            const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
            v = _mm512_mask_mov_epi32(v, nan, _mm512_or_si512(_mm512_and_si512(u, hi_mask), quiet));
            _mm512_storeu_si512(p, v);
        }
    }
    return i;
}
WHALE_TARGET_END
#endif

/* x[0..n) with element indices j0, j0 + 1, ... */
static void sr_range(float *x, size_t n, uint64_t seed, uint64_t j0) {
    size_t i = 0;
    for (; i < n && ((j0 + i) & 3); i++) x[i] = sr_one(x[i], seed, j0 + i);
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) i = sr_range_avx512(x, n, seed, j0, i);
#endif
    for (; i < n; i++) x[i] = sr_one(x[i], seed, j0 + i);
}

void whale_round_bf16_sr_inplace(float *x, size_t n, uint64_t seed, uint64_t counter) {
    /* each element's result depends on its index only, so any split is fine */
    WHALE_PARALLEL_IF(n >= ((size_t)1 << 16), t, nt, {
        const size_t id = (size_t)t, m = (size_t)nt;
        const size_t lo = n / m * id + (id < n % m ? id : n % m);
        const size_t len = n / m + (id < n % m);
        sr_range(x + lo, len, seed, counter + lo);
    });
}
