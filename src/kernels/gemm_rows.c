/* Products with few rows (decode, small batches): our kernels, which
 * stream the weights once for all rows. f32, fp16 and int8 weights widened to
 * fp32 in registers; bf16 weights (and int8 through bf16) with vdpbf16ps;
 * nn / tn with few rows; then the split of the weight rows over threads. */
#include "kernels/gemm_impl.h"
#include "whale_bench.h"

#include "core/par.h"

#include <assert.h>
#include <math.h>

/* ------------------------------------------------------------ own kernels: nt */

/* C[m, n] = sum_k A[m, k] * W[n, k] for a few rows of A: every W vector
 * loaded serves all (up to NT_MR) A rows, which stay in L1, so W is read
 * from memory once. Each thread takes a contiguous range of W rows, cuts it
 * into four quarters and walks them side by side: four W rows per step
 * share the A loads (as good as a 4x4 register block when W is in cache),
 * while each quarter stays one sequential stream. Measured on this machine,
 * interleaving 2 or 4 *adjacent* rows halves the DRAM streaming rate
 * (hardware prefetch loses track; software prefetch did not help), whereas
 * four distant sequential streams run as fast as reading rows one by one. */
#define NT_MR 4

/* Products with NT_MR + 1 to NT_MR_WIDE rows take them all in one pass over
 * the weights: against two W streams at a time in the AVX-512 kernels
 * (2 x 8 accumulators of the 32 zmm registers), one in the AVX2 and plain C
 * ones (8 of 16 ymm), so 5 to 8 rows read each weight once, as one row
 * does (more: quads again, or passes of 8 for int8; see sk_range). Every row is
 * the same sequence of fp32 operations whatever the kernel (quad, pair or
 * single, any mr): a stream's result never depends on what is batched
 * with it. */
#define NT_MR_WIDE 8

/* How far ahead (bytes) the AVX-512 kernels ask for each of their weight
 * streams. The loads in flight in the out-of-order window span too few
 * cache lines to hide the memory latency (the widening kernel's fp16 and
 * int8 loads cover 32 and 16 bytes each), and the hardware prefetcher does
 * not make up for it. On one thread, bench_gemm
 * --shape nt_q8 1 45000 896 cold (40 MB) streamed 5-10 GB/s without and
 * 39-41 GB/s with it, nt_bf16 1 22000 896 cold 8-20 and 30-35 GB/s; at
 * WHALE_ISA=avx512 (the fp32-FMA kernel on widened weights), 45000 x 896
 * cold, best of 4: nt 7.5 -> 4.1 ms, nt_f16 6.2 -> 2.2, nt_bf16 6.6 -> 2.1,
 * nt_q8 5.3 -> 2.1. The AVX2 kernels (32-byte loads) gained nothing
 * measurable (nt 4.0-5.0 ms, nt_f16 2.1, nt_q8 1.7 either way) and have
 * none. 1 KB is about what one stream consumes in a DRAM latency (~100 ns
 * at ~10 GB/s); 512 B to 2 KB gave the same rate. A prefetch past a row's
 * end lands in the row that stream takes next (or nowhere: it never
 * faults). */
#define NT_PREFETCH 1024

/* Weight types of the skinny kernels nt_multi / nt_single: they widen f32,
 * fp16 and int8 weights to fp32 in registers (vcvtph2ps, vpmovsxbd +
 * vcvtdq2ps) for fp32 FMAs, with A already rounded to the product's format;
 * WT_I8 rows are multiplied by their scale. (bf16 weights, and int8 ones
 * where AVX512_BF16 and VBMI exist, have vdpbf16ps kernels below.) */
enum { WT_F32 = 0, WT_F16, WT_I8, WT_BF16 };

static size_t wt_size(int wt) { return wt == WT_F32 ? 4 : wt == WT_I8 ? 1 : 2; }

/* Copies specialised for the weight type and the number of A rows: up to
 * NT_MR (quads), up to NT_MR_WIDE (pairs and singles). */
#define BY_MR(call_with_mr)                                                                        \
    switch (mr) {                                                                                  \
    case 1: call_with_mr(1); break;                                                                \
    case 2: call_with_mr(2); break;                                                                \
    case 3: call_with_mr(3); break;                                                                \
    default: call_with_mr(4); break;                                                               \
    }
#define BY_MR_WIDE(call_with_mr)                                                                   \
    switch (mr) {                                                                                  \
    case 1: call_with_mr(1); break;                                                                \
    case 2: call_with_mr(2); break;                                                                \
    case 3: call_with_mr(3); break;                                                                \
    case 4: call_with_mr(4); break;                                                                \
    case 5: call_with_mr(5); break;                                                                \
    case 6: call_with_mr(6); break;                                                                \
    case 7: call_with_mr(7); break;                                                                \
    default: call_with_mr(8); break;                                                               \
    }

/* plain C, f32 weights */
static void nt_single_rows_c(int wt, int mr, int K, const float *A, size_t lda, const void *w,
                           float sc, float *C, size_t ldc, int acc) {
    (void)wt; /* f32 only: fp16 and int8 weights use ntx_single_c */
    (void)sc;
    const float *wf = w;
    for (int m = 0; m < mr; m++) {
        const float *a = A + m * lda;
        float s = 0;
        for (int k = 0; k < K; k++) s += a[k] * wf[k];
        C[m * ldc] = acc ? C[m * ldc] + s : s;
    }
}

static void nt_quad_rows_c(int wt, int mr, int K, const float *A, size_t lda, const void *W,
                         size_t ldw, size_t n, size_t q, const float *scale, float *C, size_t ldc,
                         int acc) {
    (void)scale;
    for (int r = 0; r < 4; r++)
        nt_single_rows_c(wt, mr, K, A, lda, (const float *)W + (n + r * q) * ldw, 0,
                       C + n + r * q, ldc, acc);
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* Sums of four vectors, as lanes 0..3 of the result. */
static inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 b4 = _mm_add_ps(_mm256_castps256_ps128(b8), _mm256_extractf128_ps(b8, 1));
    __m128 c4 = _mm_add_ps(_mm256_castps256_ps128(c8), _mm256_extractf128_ps(c8, 1));
    __m128 d4 = _mm_add_ps(_mm256_castps256_ps128(d8), _mm256_extractf128_ps(d8, 1));
    return _mm_hadd_ps(_mm_hadd_ps(a4, b4), _mm_hadd_ps(c4, d4));
}

/* The sum of one vector in the order hsum4 gives each of its four: a row
 * then sums alike whether it falls in a quad or is a single, so results
 * never depend on how rows are split over threads. */
static inline float hsum1(__m512 a) { return _mm_cvtss_f32(hsum4(a, a, a, a)); }

/* 16 weights of row w from column k (lanes outside mask 0) as fp32. */
static inline __attribute__((always_inline)) __m512 load_w(const int wt, __mmask16 mask,
                                                          const void *w, int k) {
    if (wt == WT_F16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)w + k));
    if (wt == WT_I8)
        return _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, (const int8_t *)w + k)));
    if (wt == WT_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)w + k)), 16));
    return _mm512_maskz_loadu_ps(mask, (const float *)w + k);
}

/* The sums of s[m][r] (m < mr, r < nw) into sum[m·nw + r], each in the
 * order hsum4 gives it (lanes i + 8, then i + 4, then adjacent pairs, then
 * pairs of pairs), with the shuffles shared by 16 vectors at a time: each
 * step adds two vectors' halves in one 512-bit add: about 45 instructions
 * for 16 sums, against ~12 per row of a pair apart. The 8-row int8 loop at
 * K = 320 (weights in cache, one thread) went from 125 to 135 G
 * multiply-adds/s with it (see q8_multi). */
static inline __attribute__((always_inline)) void hsum_rows(const int mr, const int nw,
                                                            __m512 s[][4], float *sum) {
    if (mr * nw <= 4) { /* one row of a quad, or one or two of a pair: hsum4 alone */
        const __m512 *a = s[0], *b = mr > 1 ? s[1] : s[0] + (nw == 4 ? 2 : 0);
        _mm_storeu_ps(sum, hsum4(a[0], a[1], b[0], b[1]));
        return;
    }
    __m512 v[16], h[8], p[4], r[2];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) v[i] = i / nw < mr ? s[i / nw][i % nw] : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* [v2i lanes 0..7, v2i+1 lanes 0..7] + the lanes 8..15 */
        h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* 128-bit lane j: v4i+j's lanes 0..3 + 4..7 */
        p[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xDD));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* lane j: pairs of v8i+j, then of v8i+4+j */
        r[i] = _mm512_add_ps(_mm512_shuffle_ps(p[2 * i], p[2 * i + 1], 0x88),
                             _mm512_shuffle_ps(p[2 * i], p[2 * i + 1], 0xDD));
    /* lane 4j + e: the sum of v4e+j */
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], 0x88), _mm512_shuffle_ps(r[0], r[1], 0xDD));
    const __m512i to_rows = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_storeu_ps(sum, _mm512_permutexvar_ps(to_rows, f));
}

/* W rows n + r·q (r < nw: 4 streams a quarter of the range apart, or 2 half
 * of it apart when mr > NT_MR) against mr A rows; results go to the same
 * columns of C. */
static inline __attribute__((always_inline)) void
nt_multi(const int wt, const int nw, const int mr, int K, const float *A, size_t lda, const void *W,
         size_t ldw, size_t n, size_t q, const float *scale, float *C, size_t ldc, int acc) {
    const size_t row = ldw * wt_size(wt);
    const char *w[4];
#pragma GCC unroll 4
    for (int r = 0; r < nw; r++) w[r] = (const char *)W + (n + r * q) * row;
    __m512 s[NT_MR_WIDE][4];
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) s[m][r] = _mm512_setzero_ps();
    __mmask16 mask = 0xFFFF;
    for (int k = 0; k < K; k += 16) {
        if (K - k < 16) mask = (__mmask16)((1u << (K - k)) - 1); /* last, partial vector */
        if ((size_t)k * wt_size(wt) % 64 == 0) { /* once per cache line */
#pragma GCC unroll 4
            for (int r = 0; r < nw; r++) _mm_prefetch(w[r] + (size_t)k * wt_size(wt) + NT_PREFETCH, _MM_HINT_T0);
        }
        __m512 v[4];
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) v[r] = load_w(wt, mask, w[r], k);
#pragma GCC unroll 8
        for (int m = 0; m < mr; m++) {
            const __m512 a = _mm512_maskz_loadu_ps(mask, A + m * lda + k);
#pragma GCC unroll 4
            for (int r = 0; r < nw; r++) s[m][r] = _mm512_fmadd_ps(a, v[r], s[m][r]);
        }
    }
    float sum[16];
    hsum_rows(mr, nw, s, sum);
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
        float *c = C + m * ldc + n;
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) {
            const float v = wt == WT_I8 ? scale[n + r * q] * sum[m * nw + r] : sum[m * nw + r];
            c[r * q] = acc ? c[r * q] + v : v;
        }
    }
}

/* One W row (the few left over after the quarters) against mr A rows;
 * sc: its scale (WT_I8). */
static inline __attribute__((always_inline)) void
nt_single(const int wt, const int mr, int K, const float *A, size_t lda, const void *w, float sc,
          float *C, size_t ldc, int acc) {
    __m512 s[NT_MR_WIDE];
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) s[m] = _mm512_setzero_ps();
    __mmask16 mask = 0xFFFF;
    for (int k = 0; k < K; k += 16) {
        if (K - k < 16) mask = (__mmask16)((1u << (K - k)) - 1);
        const __m512 v = load_w(wt, mask, w, k);
#pragma GCC unroll 8
        for (int m = 0; m < mr; m++)
            s[m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, A + m * lda + k), v, s[m]);
    }
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
        float v = hsum1(s[m]);
        if (wt == WT_I8) v *= sc;
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

static void nt_multi_rows_avx512(int wt, int nw, int mr, int K, const float *A, size_t lda, const void *W,
                                 size_t ldw, size_t n, size_t q, const float *scale, float *C, size_t ldc,
                                 int acc) {
#define QUAD(WT, MR) nt_multi(WT, 4, MR, K, A, lda, W, ldw, n, q, scale, C, ldc, acc)
#define PAIR(WT, MR) nt_multi(WT, 2, MR, K, A, lda, W, ldw, n, q, scale, C, ldc, acc)
#define QUAD_F32(MR) QUAD(WT_F32, MR)
#define QUAD_F16(MR) QUAD(WT_F16, MR)
#define QUAD_I8(MR) QUAD(WT_I8, MR)
#define QUAD_BF(MR) QUAD(WT_BF16, MR)
#define PAIR_F32(MR) PAIR(WT_F32, MR)
#define PAIR_F16(MR) PAIR(WT_F16, MR)
#define PAIR_I8(MR) PAIR(WT_I8, MR)
#define PAIR_BF(MR) PAIR(WT_BF16, MR)
    if (nw == 4) {
        switch (wt) {
        case WT_F16: BY_MR(QUAD_F16); break;
        case WT_I8: BY_MR(QUAD_I8); break;
        case WT_BF16: BY_MR(QUAD_BF); break;
        default: BY_MR(QUAD_F32); break;
        }
        return;
    }
    switch (wt) {
    case WT_F16: BY_MR_WIDE(PAIR_F16); break;
    case WT_I8: BY_MR_WIDE(PAIR_I8); break;
    case WT_BF16: BY_MR_WIDE(PAIR_BF); break;
    default: BY_MR_WIDE(PAIR_F32); break;
    }
#undef QUAD
#undef PAIR
#undef QUAD_F32
#undef QUAD_F16
#undef QUAD_I8
#undef QUAD_BF
#undef PAIR_F32
#undef PAIR_F16
#undef PAIR_I8
#undef PAIR_BF
}

static void nt_single_rows_avx512(int wt, int mr, int K, const float *A, size_t lda, const void *w,
                           float sc, float *C, size_t ldc, int acc) {
#define SINGLE(WT, MR) nt_single(WT, MR, K, A, lda, w, sc, C, ldc, acc)
#define SINGLE_F32(MR) SINGLE(WT_F32, MR)
#define SINGLE_F16(MR) SINGLE(WT_F16, MR)
#define SINGLE_I8(MR) SINGLE(WT_I8, MR)
#define SINGLE_BF(MR) SINGLE(WT_BF16, MR)
    if (wt == WT_BF16) {
        BY_MR_WIDE(SINGLE_BF);
        return;
    }
    if (wt == WT_F16) {
        BY_MR_WIDE(SINGLE_F16);
        return;
    }
    if (wt == WT_I8) {
        BY_MR_WIDE(SINGLE_I8);
        return;
    }
    BY_MR_WIDE(SINGLE_F32);
#undef SINGLE
#undef SINGLE_F32
#undef SINGLE_F16
#undef SINGLE_I8
#undef SINGLE_BF
}
WHALE_TARGET_END
#endif

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX2)
/* The same kernels on 8 lanes (AVX2 has no masked loads of 8- and 16-bit
 * values): whole vectors of K, then the last K % 8 columns once from
 * zero-padded copies of the W and A tails. */
#define NT8 8

static inline __m128 hsum4_8(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 b4 = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 c4 = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    __m128 d4 = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
    return _mm_hadd_ps(_mm_hadd_ps(a4, b4), _mm_hadd_ps(c4, d4));
}

/* As hsum1: a single row sums as it would in a quad. */
static inline float hsum1_8(__m256 a) { return _mm_cvtss_f32(hsum4_8(a, a, a, a)); }

/* 8 weights of row w from column k as fp32. */
static inline __attribute__((always_inline)) __m256 load8_w(const int wt, const void *w, int k) {
    if (wt == WT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k)));
    if (wt == WT_I8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)w + k))));
    if (wt == WT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k))), 16));
    return _mm256_loadu_ps((const float *)w + k);
}

/* Columns k0..K−1 (fewer than 8) of a W row, zero-padded, as fp32. */
static inline __attribute__((always_inline)) __m256 tail8_w(const int wt, const void *w, int k0, int K) {
    unsigned char buf[NT8 * 4] = {0};
    const size_t es = wt_size(wt);
    memcpy(buf, (const char *)w + (size_t)k0 * es, (size_t)(K - k0) * es);
    return load8_w(wt, buf, 0);
}

static inline __attribute__((always_inline)) __m256 tail8_a(const float *a, int k0, int K) {
    float buf[NT8] = {0};
    memcpy(buf, a + k0, (size_t)(K - k0) * sizeof(float));
    return _mm256_loadu_ps(buf);
}

static inline __attribute__((always_inline)) void
nt_quad8(const int wt, const int mr, int K, const float *A, size_t lda, const void *W, size_t ldw, size_t n,
         size_t q, const float *scale, float *C, size_t ldc, int acc) {
    const size_t row = ldw * wt_size(wt), step = q * row;
    const char *w0 = (const char *)W + n * row, *w1 = w0 + step, *w2 = w1 + step, *w3 = w2 + step;
    const int K8 = K / NT8 * NT8;
    __m256 s[NT_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) s[m][r] = _mm256_setzero_ps();
    for (int k = 0; k <= K8; k += NT8) {
        if (k == K8 && k == K) break;
        const int tail = k == K8;
        const __m256 v0 = tail ? tail8_w(wt, w0, k, K) : load8_w(wt, w0, k);
        const __m256 v1 = tail ? tail8_w(wt, w1, k, K) : load8_w(wt, w1, k);
        const __m256 v2 = tail ? tail8_w(wt, w2, k, K) : load8_w(wt, w2, k);
        const __m256 v3 = tail ? tail8_w(wt, w3, k, K) : load8_w(wt, w3, k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m256 a = tail ? tail8_a(A + m * lda, k, K) : _mm256_loadu_ps(A + m * lda + k);
            s[m][0] = _mm256_fmadd_ps(a, v0, s[m][0]);
            s[m][1] = _mm256_fmadd_ps(a, v1, s[m][1]);
            s[m][2] = _mm256_fmadd_ps(a, v2, s[m][2]);
            s[m][3] = _mm256_fmadd_ps(a, v3, s[m][3]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float sum[4];
        _mm_storeu_ps(sum, hsum4_8(s[m][0], s[m][1], s[m][2], s[m][3]));
        float *c = C + m * ldc + n;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const float v = wt == WT_I8 ? scale[n + r * q] * sum[r] : sum[r];
            c[r * q] = acc ? c[r * q] + v : v;
        }
    }
}

static inline __attribute__((always_inline)) void
nt_single8(const int wt, const int mr, int K, const float *A, size_t lda, const void *w, float sc, float *C,
           size_t ldc, int acc) {
    const int K8 = K / NT8 * NT8;
    __m256 s[NT_MR_WIDE];
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) s[m] = _mm256_setzero_ps();
    for (int k = 0; k <= K8; k += NT8) {
        if (k == K8 && k == K) break;
        const int tail = k == K8;
        const __m256 v = tail ? tail8_w(wt, w, k, K) : load8_w(wt, w, k);
#pragma GCC unroll 8
        for (int m = 0; m < mr; m++)
            s[m] = _mm256_fmadd_ps(tail ? tail8_a(A + m * lda, k, K) : _mm256_loadu_ps(A + m * lda + k), v, s[m]);
    }
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
        float v = hsum1_8(s[m]);
        if (wt == WT_I8) v *= sc;
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

static void nt_quad_rows_avx2(int wt, int mr, int K, const float *A, size_t lda, const void *W, size_t ldw,
                              size_t n, size_t q, const float *scale, float *C, size_t ldc, int acc) {
#define QUAD8(WT, MR) nt_quad8(WT, MR, K, A, lda, W, ldw, n, q, scale, C, ldc, acc)
#define QUAD8_F32(MR) QUAD8(WT_F32, MR)
#define QUAD8_F16(MR) QUAD8(WT_F16, MR)
#define QUAD8_I8(MR) QUAD8(WT_I8, MR)
#define QUAD8_BF(MR) QUAD8(WT_BF16, MR)
    switch (wt) {
    case WT_F16: BY_MR(QUAD8_F16); break;
    case WT_I8: BY_MR(QUAD8_I8); break;
    case WT_BF16: BY_MR(QUAD8_BF); break;
    default: BY_MR(QUAD8_F32); break;
    }
#undef QUAD8
#undef QUAD8_F32
#undef QUAD8_F16
#undef QUAD8_I8
#undef QUAD8_BF
}

static void nt_single_rows_avx2(int wt, int mr, int K, const float *A, size_t lda, const void *w, float sc,
                                float *C, size_t ldc, int acc) {
#define SINGLE8(WT, MR) nt_single8(WT, MR, K, A, lda, w, sc, C, ldc, acc)
#define SINGLE8_F32(MR) SINGLE8(WT_F32, MR)
#define SINGLE8_F16(MR) SINGLE8(WT_F16, MR)
#define SINGLE8_I8(MR) SINGLE8(WT_I8, MR)
#define SINGLE8_BF(MR) SINGLE8(WT_BF16, MR)
    switch (wt) {
    case WT_F16: BY_MR_WIDE(SINGLE8_F16); break;
    case WT_I8: BY_MR_WIDE(SINGLE8_I8); break;
    case WT_BF16: BY_MR_WIDE(SINGLE8_BF); break;
    default: BY_MR_WIDE(SINGLE8_F32); break;
    }
#undef SINGLE8
#undef SINGLE8_F32
#undef SINGLE8_F16
#undef SINGLE8_I8
#undef SINGLE8_BF
}
WHALE_TARGET_END
#endif

/* nw W rows n + r·q against mr A rows: 4 (quads, mr <= NT_MR) in every
 * tier, 2 (pairs, mr <= NT_MR_WIDE) only where nt_pairs() says so. */
static void nt_multi_rows(int wt, int nw, int mr, int K, const float *A, size_t lda, const void *W,
                          size_t ldw, size_t n, size_t q, const float *scale, float *C, size_t ldc,
                          int acc) {
#if WHALE_X86
    if (gemm_have_avx512()) {
        nt_multi_rows_avx512(wt, nw, mr, K, A, lda, W, ldw, n, q, scale, C, ldc, acc);
        return;
    }
    assert(nw == 4);
    if (gemm_have_avx2()) {
        nt_quad_rows_avx2(wt, mr, K, A, lda, W, ldw, n, q, scale, C, ldc, acc);
        return;
    }
#endif
    assert(nw == 4);
    nt_quad_rows_c(wt, mr, K, A, lda, W, ldw, n, q, scale, C, ldc, acc);
}

static void nt_single_rows(int wt, int mr, int K, const float *A, size_t lda, const void *w,
                           float sc, float *C, size_t ldc, int acc) {
#if WHALE_X86
    if (gemm_have_avx512()) {
        nt_single_rows_avx512(wt, mr, K, A, lda, w, sc, C, ldc, acc);
        return;
    }
    if (gemm_have_avx2()) {
        nt_single_rows_avx2(wt, mr, K, A, lda, w, sc, C, ldc, acc);
        return;
    }
#endif
    nt_single_rows_c(wt, mr, K, A, lda, w, sc, C, ldc, acc);
}

/* One fp16 or int8 W row against mr A rows (already rounded, fp32), plain C:
 * the kernel without AVX512BW, and WHALE_GEMM_OWN_PORTABLE. Products of two
 * fp16 values, or of a bf16 value and an int8 one, are exact in fp32, so it
 * differs from the vector kernel only in summation order. */
static void ntx_single_c(int wt, int mr, int K, const float *A, size_t lda, const void *w,
                         float sc, float *C, size_t ldc, int acc) {
    float s[NT_MR_WIDE] = {0};
    for (int k = 0; k < K; k++) {
        const float v = wt == WT_F16    ? whale_f16_to_float(((const uint16_t *)w)[k])
                        : wt == WT_BF16 ? whale_bf16_to_float(((const uint16_t *)w)[k])
                                        : (float)((const int8_t *)w)[k];
        for (int m = 0; m < mr; m++) s[m] += A[m * lda + k] * v;
    }
    for (int m = 0; m < mr; m++) {
        const float v = wt == WT_I8 ? sc * s[m] : s[m];
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

/* ------------------------------------------------------------ own kernels: nn / tn */

/* C[m, n] = sum_k A(m, k) * B[k, n] with A(m, k) = A[m*sam + k*sak], which
 * covers nn (sam = lda, sak = 1) and tn (sam = 1, sak = lda). A block of
 * NN_COLS columns of C for up to NN_MR rows stays in registers while k runs;
 * each B row segment is loaded once per block. */
#define NN_MR 4
#define NN_COLS 64

/* Plain C, compiled for the baseline and (inlined below) for AVX2 + FMA:
 * the loop over a row of C vectorises, with the same bits either way. */
static inline __attribute__((always_inline)) void
nn_rows_c(int mr, int width, int K, const float *A, size_t sam, size_t sak, const float *B, size_t ldb,
          float *C, size_t ldc, int acc) {
    for (int m = 0; m < mr; m++) {
        float s[NN_COLS] = {0};
        for (int k = 0; k < K; k++) {
            const float a = A[m * sam + k * sak], *b = B + k * ldb;
            for (int n = 0; n < width; n++) s[n] += a * b[n];
        }
        float *c = C + m * ldc;
        for (int n = 0; n < width; n++) c[n] = acc ? c[n] + s[n] : s[n];
    }
}

static void nn_rows_base(int mr, int width, int K, const float *A, size_t sam, size_t sak, const float *B,
                         size_t ldb, float *C, size_t ldc, int acc) {
    nn_rows_c(mr, width, K, A, sam, sak, B, ldb, C, ldc, acc);
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX2)
static void nn_rows_avx2(int mr, int width, int K, const float *A, size_t sam, size_t sak, const float *B,
                         size_t ldb, float *C, size_t ldc, int acc) {
    nn_rows_c(mr, width, K, A, sam, sak, B, ldb, C, ldc, acc);
}
WHALE_TARGET_END
#endif

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
static inline __attribute__((always_inline)) void
nn_block(const int mr, int width, int K, const float *A, size_t sam, size_t sak,
         const float *B, size_t ldb, float *C, size_t ldc, int acc) {
    __mmask16 mask[4];
    for (int j = 0; j < 4; j++) {
        int w = width - 16 * j;
        mask[j] = w >= 16 ? (__mmask16)0xFFFF : w <= 0 ? 0 : (__mmask16)((1u << w) - 1);
    }
    __m512 s[NN_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) s[m][j] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) bv[j] = _mm512_maskz_loadu_ps(mask[j], b + 16 * j);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            __m512 a = _mm512_set1_ps(A[m * sam + k * sak]);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) s[m][j] = _mm512_fmadd_ps(a, bv[j], s[m][j]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float *c = C + m * ldc;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512 v = s[m][j];
            if (acc) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[j], c + 16 * j));
            _mm512_mask_storeu_ps(c + 16 * j, mask[j], v);
        }
    }
}

static void nn_rows_avx512(int mr, int width, int K, const float *A, size_t sam, size_t sak,
                    const float *B, size_t ldb, float *C, size_t ldc, int acc) {
    switch (mr) {
    case 1: nn_block(1, width, K, A, sam, sak, B, ldb, C, ldc, acc); break;
    case 2: nn_block(2, width, K, A, sam, sak, B, ldb, C, ldc, acc); break;
    case 3: nn_block(3, width, K, A, sam, sak, B, ldb, C, ldc, acc); break;
    default: nn_block(4, width, K, A, sam, sak, B, ldb, C, ldc, acc); break;
    }
}
WHALE_TARGET_END
#endif

static void nn_rows(int mr, int width, int K, const float *A, size_t sam, size_t sak,
                    const float *B, size_t ldb, float *C, size_t ldc, int acc) {
#if WHALE_X86
    if (gemm_have_avx512()) {
        nn_rows_avx512(mr, width, K, A, sam, sak, B, ldb, C, ldc, acc);
        return;
    }
    if (gemm_have_avx2()) {
        nn_rows_avx2(mr, width, K, A, sam, sak, B, ldb, C, ldc, acc);
        return;
    }
#endif
    nn_rows_base(mr, width, K, A, sam, sak, B, ldb, C, ldc, acc);
}

void gemm_own_nn_tn(const gemm_call *c) {
    const int M = c->s.M, N = c->s.N, K = c->s.K, acc = c->s.acc;
    const size_t lda = (size_t)c->s.lda, ldb = (size_t)c->s.ldb, ldc = (size_t)c->s.ldc;
    const size_t sam = c->s.kind == KIND_NN ? lda : 1, sak = c->s.kind == KIND_NN ? 1 : lda;
    const float *A = c->A, *B = c->B;
    float *C = c->C;
    const int nblocks = (N + NN_COLS - 1) / NN_COLS;
    const int par = (double)M * N * K >= OWN_PARALLEL_MIN_WORK;
    WHALE_FOR_IF(par, (int b = 0; b < nblocks; b++), {
        const int n0 = b * NN_COLS;
        const int width = N - n0 < NN_COLS ? N - n0 : NN_COLS;
        for (int m0 = 0; m0 < M; m0 += NN_MR) {
            const int mr = M - m0 < NN_MR ? M - m0 : NN_MR;
            nn_rows(mr, width, K, A + m0 * sam, sam, sak, B + n0, ldb, C + m0 * ldc + n0, ldc,
                    acc);
        }
    });
}


/* Our bf16 kernel mirrors the fp32 one: the same split of W rows over threads
 * and the same four distant streams per thread (adjacent rows halve the
 * DRAM rate), with A converted once into rows of KB_STEP-multiple length,
 * zero-padded so only the W loads need a mask at the end of K. */
#define KB_STEP 32 /* bf16 values per zmm */

static size_t bf16_row_len(int K) { return ((size_t)K + KB_STEP - 1) / KB_STEP * KB_STEP; }

/* One W row (bf16) against mr A rows (bf16, zero-padded), plain C: the
 * fallback without AVX512_BF16. Products of two bf16 values are exact in
 * fp32, so this differs from the vdpbf16ps kernel only in summation order. */
static void ntb_single_c(int mr, int K, const uint16_t *A, size_t lda, const uint16_t *w,
                         float *C, size_t ldc, int acc) {
    for (int m = 0; m < mr; m++) {
        const uint16_t *a = A + m * lda;
        float s = 0;
        for (int k = 0; k < K; k++) s += whale_bf16_to_float(a[k]) * whale_bf16_to_float(w[k]);
        C[m * ldc] = acc ? C[m * ldc] + s : s;
    }
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512_BF16)

/* W rows n + r·q (r < nw, as nt_multi) against mr A rows: vdpbf16ps adds
 * the products of adjacent k pairs into fp32 lanes. */
static inline __attribute__((always_inline)) void
ntb_multi(const int nw, const int mr, int K, const uint16_t *A, size_t lda, const uint16_t *W, size_t ldw,
          size_t n, size_t q, float *C, size_t ldc, int acc) {
    const uint16_t *w[4];
#pragma GCC unroll 4
    for (int r = 0; r < nw; r++) w[r] = W + (n + r * q) * ldw;
    __m512 s[NT_MR_WIDE][4];
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) s[m][r] = _mm512_setzero_ps();
    __mmask32 mask = 0xFFFFFFFFu;
    for (int k = 0; k < K; k += KB_STEP) {
        if (K - k < KB_STEP) mask = (__mmask32)((1u << (K - k)) - 1); /* W beyond K may be NaN */
        __m512bh v[4];
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) {
            _mm_prefetch((const char *)(w[r] + k) + NT_PREFETCH, _MM_HINT_T0);
            v[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[r] + k);
        }
#pragma GCC unroll 8
        for (int m = 0; m < mr; m++) {
            const __m512bh a = (__m512bh)_mm512_load_si512(A + m * lda + k);
#pragma GCC unroll 4
            for (int r = 0; r < nw; r++) s[m][r] = _mm512_dpbf16_ps(s[m][r], a, v[r]);
        }
    }
    float sum[16];
    hsum_rows(mr, nw, s, sum);
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
        float *c = C + m * ldc + n;
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) c[r * q] = acc ? c[r * q] + sum[m * nw + r] : sum[m * nw + r];
    }
}

static inline __attribute__((always_inline)) void
ntb_single(const int mr, int K, const uint16_t *A, size_t lda, const uint16_t *w, float *C,
           size_t ldc, int acc) {
    __m512 s[NT_MR_WIDE];
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) s[m] = _mm512_setzero_ps();
    __mmask32 mask = 0xFFFFFFFFu;
    for (int k = 0; k < K; k += KB_STEP) {
        if (K - k < KB_STEP) mask = (__mmask32)((1u << (K - k)) - 1);
        const __m512bh v = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + k);
#pragma GCC unroll 8
        for (int m = 0; m < mr; m++)
            s[m] = _mm512_dpbf16_ps(s[m], (__m512bh)_mm512_load_si512(A + m * lda + k), v);
    }
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
        const float v = hsum1(s[m]);
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

static void ntb_multi_rows(int nw, int mr, int K, const uint16_t *A, size_t lda, const uint16_t *W,
                           size_t ldw, size_t n, size_t q, float *C, size_t ldc, int acc) {
#define QUAD_BF16(MR) ntb_multi(4, MR, K, A, lda, W, ldw, n, q, C, ldc, acc)
#define PAIR_BF16(MR) ntb_multi(2, MR, K, A, lda, W, ldw, n, q, C, ldc, acc)
    if (nw == 4) {
        BY_MR(QUAD_BF16)
    } else {
        BY_MR_WIDE(PAIR_BF16)
    }
#undef QUAD_BF16
#undef PAIR_BF16
}

static void ntb_single_rows(int mr, int K, const uint16_t *A, size_t lda, const uint16_t *w,
                            float *C, size_t ldc, int acc) {
#define SINGLE_BF16(MR) ntb_single(MR, K, A, lda, w, C, ldc, acc)
    BY_MR_WIDE(SINGLE_BF16)
#undef SINGLE_BF16
}

/* A rows to bf16 with vcvtne2ps2bf16 (RNE; it flushes subnormals, which
 * vdpbf16ps would treat as zero anyway), zero-padded to the row length. */
static void a_to_bf16_hw(int M, int K, const float *A, size_t lda, uint16_t *dst, size_t ld16) {
    for (int m = 0; m < M; m++)
        for (size_t k = 0; k < ld16; k += KB_STEP) {
            const int left = K - (int)k;
            const __mmask16 lo = left >= 16  ? 0xFFFF
                                 : left <= 0 ? 0
                                             : (__mmask16)((1u << left) - 1);
            const __mmask16 hi = left >= 32   ? 0xFFFF
                                 : left <= 16 ? 0
                                              : (__mmask16)((1u << (left - 16)) - 1);
            const float *a = A + m * lda + k;
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, a + 16),
                                                   _mm512_maskz_loadu_ps(lo, a));
            _mm512_store_si512(dst + m * ld16 + k, (__m512i)v);
        }
}
WHALE_TARGET_END

WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512_BF16_VBMI)
/* int8 weights into vdpbf16ps, 64 at a time, without widening to fp32: the
 * bf16 pattern of |q| (exact) is looked up byte plane by byte plane with
 * vpermi2b over 128-entry tables, the sign put back, and the planes
 * interleaved into words. vpunpck{l,h}bw work within 128-bit lanes, so the
 * 64 words come out in the order q8_order(); A is stored in that order
 * (a_to_bf16_q8), which leaves every dot product the same. About half the
 * instructions of vpmovsxbd + vcvtdq2ps + vcvtne2ps2bf16. */
#define Q8_STEP 64

typedef struct {
    __m512i hi0, hi1, lo0, lo1;
} q8_tables;

static void q8_tables_init(q8_tables *tab) {
    uint8_t hi[128], lo[128];
    for (int i = 0; i < 128; i++) {
        const uint16_t b = whale_float_to_bf16((float)i);
        hi[i] = (uint8_t)(b >> 8);
        lo[i] = (uint8_t)b;
    }
    tab->hi0 = _mm512_loadu_si512(hi);
    tab->hi1 = _mm512_loadu_si512(hi + 64);
    tab->lo0 = _mm512_loadu_si512(lo);
    tab->lo1 = _mm512_loadu_si512(lo + 64);
}

/* Element (of a 64 block) held by word j of the two bf16 vectors. */
static int q8_order(int j) {
    const int half = j / 32, lane = (j % 32) / 8, pos = j % 8;
    return 16 * lane + 8 * half + pos;
}

static inline __attribute__((always_inline)) void
q8_load(const q8_tables *t, __mmask64 mask, const int8_t *w, __m512bh *wlo, __m512bh *whi) {
    const __m512i v = _mm512_maskz_loadu_epi8(mask, w);
    const __m512i a = _mm512_abs_epi8(v);
    __m512i hi = _mm512_permutex2var_epi8(t->hi0, a, t->hi1);
    __m512i lo = _mm512_permutex2var_epi8(t->lo0, a, t->lo1);
    hi = _mm512_ternarylogic_epi32(v, _mm512_set1_epi8((char)0x80), hi, 0xEA); /* (v & 0x80) | hi */
    const __mmask64 m128 = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(-128));
    /* |-128| does not fit the tables. The engine's quantiser never makes
     * -128 (|q| <= 127), but the test costs nothing measurable: without
     * it the 8-row kernel ran no faster (nt_q8 8 4864 896 hot, one thread,
     * 0.27 ms against 0.21 with it, three alternating runs). */
    if (m128) {
        hi = _mm512_mask_mov_epi8(hi, m128, _mm512_set1_epi8((char)0xC3));
        lo = _mm512_mask_mov_epi8(lo, m128, _mm512_setzero_si512());
    }
    *wlo = (__m512bh)_mm512_unpacklo_epi8(lo, hi);
    *whi = (__m512bh)_mm512_unpackhi_epi8(lo, hi);
}

static inline __mmask64 q8_mask(int left) {
    return left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
}

/* W rows n + r·q (r < nw, as nt_multi) against mr A rows. Per 64 weights
 * with 8 rows (two streams): 32 vdpbf16ps, 16 A loads (22 as compiled:
 * with 16 accumulators, the tables and the constants, some are loaded
 * twice) and 2 x 9 instructions of conversion. Timed alone on weights in
 * cache (one thread), the loop runs at the rate of vdpbf16ps itself at
 * K = 2048 (~195 G multiply-adds/s; a loop of independent vdpbf16ps
 * gives ~193): the conversion hides behind them. At K = 320 the same loop
 * reached 125 and the row sums after it were the difference (135 with
 * hsum_rows). From memory it runs at ~100 (the lm_head, 3.0-3.3 ms):
 * neither compute- nor bandwidth-bound. Not better there: the 8 rows as
 * two passes of quads (3.7-3.9 ms), an extra prefetch 4-8 KB ahead into
 * L2, 512 B to 4 KB instead of 1 KB ahead (within the noise). */
static inline __attribute__((always_inline)) void
q8_multi(const int nw, const int mr, int K, const uint16_t *A, size_t lda, const int8_t *W, size_t ldw,
         size_t n, size_t q, const float *scale, float *C, size_t ldc, int acc, const q8_tables *t) {
    const int8_t *w[4];
#pragma GCC unroll 4
    for (int r = 0; r < nw; r++) w[r] = W + (n + r * q) * ldw;
    __m512 s[NT_MR_WIDE][4];
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) s[m][r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += Q8_STEP) {
        const __mmask64 mask = q8_mask(K - k);
        __m512bh l[4], h[4];
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) _mm_prefetch((const char *)(w[r] + k + NT_PREFETCH), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) q8_load(t, mask, w[r] + k, &l[r], &h[r]);
#pragma GCC unroll 8
        for (int m = 0; m < mr; m++) {
            const __m512bh alo = (__m512bh)_mm512_load_si512(A + m * lda + k);
            const __m512bh ahi = (__m512bh)_mm512_load_si512(A + m * lda + k + 32);
#pragma GCC unroll 4
            for (int r = 0; r < nw; r++)
                s[m][r] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(s[m][r], alo, l[r]), ahi, h[r]);
        }
    }
    float sum[16];
    hsum_rows(mr, nw, s, sum);
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
        float *c = C + m * ldc + n;
#pragma GCC unroll 4
        for (int r = 0; r < nw; r++) {
            const float v = scale[n + r * q] * sum[m * nw + r];
            c[r * q] = acc ? c[r * q] + v : v;
        }
    }
}

static inline __attribute__((always_inline)) void
q8_single(const int mr, int K, const uint16_t *A, size_t lda, const int8_t *w, float sc, float *C,
          size_t ldc, int acc, const q8_tables *t) {
    __m512 s[NT_MR_WIDE];
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) s[m] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += Q8_STEP) {
        __m512bh l, h;
        q8_load(t, q8_mask(K - k), w + k, &l, &h);
#pragma GCC unroll 8
        for (int m = 0; m < mr; m++) {
            s[m] = _mm512_dpbf16_ps(s[m], (__m512bh)_mm512_load_si512(A + m * lda + k), l);
            s[m] = _mm512_dpbf16_ps(s[m], (__m512bh)_mm512_load_si512(A + m * lda + k + 32), h);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
        const float v = sc * hsum1(s[m]);
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

/* A rows to bf16 (vcvtne2ps2bf16, as a_to_bf16_hw) in q8_order within each
 * 64 block, zero-padded to the row length ld (a multiple of 64). */
static void a_to_bf16_q8(int M, int K, const float *A, size_t lda, uint16_t *dst, size_t ld) {
    uint16_t ilo[32], ihi[32];
    for (int j = 0; j < 32; j++) {
        ilo[j] = (uint16_t)q8_order(j);
        ihi[j] = (uint16_t)q8_order(32 + j);
    }
    const __m512i plo = _mm512_loadu_si512(ilo), phi = _mm512_loadu_si512(ihi);
    for (int m = 0; m < M; m++)
        for (size_t k = 0; k < ld; k += Q8_STEP) {
            const float *a = A + m * lda + k;
            __m512 f[4];
            for (int i = 0; i < 4; i++) {
                const int left = K - (int)k - 16 * i;
                const __mmask16 mk = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
                f[i] = _mm512_maskz_loadu_ps(mk, a + 16 * i);
            }
            const __m512i n0 = (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]);
            const __m512i n1 = (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2]);
            _mm512_store_si512(dst + m * ld + k, _mm512_permutex2var_epi16(n0, plo, n1));
            _mm512_store_si512(dst + m * ld + k + 32, _mm512_permutex2var_epi16(n0, phi, n1));
        }
}

static void q8_multi_rows(int nw, int mr, int K, const uint16_t *A, size_t lda, const int8_t *W, size_t ldw,
                          size_t n, size_t q, const float *scale, float *C, size_t ldc, int acc,
                          const q8_tables *t) {
#define QUAD_Q8(MR) q8_multi(4, MR, K, A, lda, W, ldw, n, q, scale, C, ldc, acc, t)
#define PAIR_Q8(MR) q8_multi(2, MR, K, A, lda, W, ldw, n, q, scale, C, ldc, acc, t)
    if (nw == 4) {
        BY_MR(QUAD_Q8)
    } else {
        BY_MR_WIDE(PAIR_Q8)
    }
#undef QUAD_Q8
#undef PAIR_Q8
}

static void q8_single_rows(int mr, int K, const uint16_t *A, size_t lda, const int8_t *w, float sc,
                           float *C, size_t ldc, int acc, const q8_tables *t) {
#define SINGLE_Q8(MR) q8_single(MR, K, A, lda, w, sc, C, ldc, acc, t)
    BY_MR_WIDE(SINGLE_Q8)
#undef SINGLE_Q8
}

WHALE_TARGET_END
#endif /* WHALE_X86 */


/* ------------------------------------------------------------ the skinny split */


/* One product of a skinny run, A already in the kind's form (sk_convert). */
typedef struct {
    int M, N, K, acc;
    const void *A;
    size_t lda;
    const void *W;
    size_t ldw;
    const float *scale;
    float *C;
    size_t ldc;
} sk_part;

static int sk_wt(sk_kind k) {
    return k == SK_F16 ? WT_F16 : k == SK_I8 ? WT_I8 : k == SK_BF16_FMA ? WT_BF16 : WT_F32;
}
static size_t sk_wsize(sk_kind k) { return k == SK_F32 ? 4 : k == SK_I8 || k == SK_Q8 ? 1 : 2; }

/* Row length (elements) and element size of A in the kernel's form; 0: A
 * is used in place. */
static size_t sk_a_len(sk_kind k, int K) {
    switch (k) {
    case SK_F16:
    case SK_I8:
    case SK_BF16_FMA: return (size_t)K;
    case SK_BF16: return bf16_row_len(K);
#if WHALE_X86
    case SK_Q8: return ((size_t)K + Q8_STEP - 1) / Q8_STEP * Q8_STEP;
#endif
    default: return 0;
    }
}
static size_t sk_a_size(sk_kind k) { return k == SK_F16 || k == SK_I8 || k == SK_BF16_FMA ? 4 : 2; }

static void sk_convert(sk_kind k, int portable, int M, int K, const float *A, size_t lda,
                       void *dst, size_t ld) {
    (void)portable;
    if (k == SK_F16 || k == SK_I8 || k == SK_BF16_FMA) {
        for (int m = 0; m < M; m++) {
            float *d = (float *)dst + m * ld;
            if (k == SK_F16) whale_round_f16_rows(d, A + m * lda, (size_t)K);
            else whale_round_bf16_rows(d, A + m * lda, (size_t)K);
        }
        return;
    }
#if WHALE_X86
    if (k == SK_Q8) {
        a_to_bf16_q8(M, K, A, lda, dst, ld);
        return;
    }
#endif
#if WHALE_X86
    if (!portable) {
        a_to_bf16_hw(M, K, A, lda, dst, ld);
        return;
    }
#endif
    for (int m = 0; m < M; m++) {
        uint16_t *d = (uint16_t *)dst + m * ld;
        whale_f32_to_bf16_rows(d, A + m * lda, (size_t)K);
        memset(d + K, 0, (ld - (size_t)K) * sizeof(uint16_t));
    }
}

/* Does kernel k read two W streams at a time for more than NT_MR rows (the
 * AVX-512 ones), or one (AVX2, plain C)? */
static int sk_pairs(sk_kind k, int portable) {
    if (k == SK_Q8) return 1;
    if (k == SK_BF16) return !portable;
    return gemm_have_avx512() && !(portable && k != SK_F32);
}

/* W rows n + r·q (r < nw: 4, a quad; 2, a pair) or row n alone (q = 0) of
 * part p against its A rows m0..m0+mr−1. */
static void sk_rows(sk_kind k, int portable, const sk_part *p, int m0, int mr, size_t n, int nw, size_t q,
                    const void *tables) {
    const int K = p->K, acc = p->acc;
    const size_t lda = p->lda, ldw = p->ldw, ldc = p->ldc;
    float *C = p->C + m0 * ldc;
    const float sc = p->scale && !q ? p->scale[n] : 0;
    (void)tables;
    if (k == SK_BF16 || k == SK_Q8) {
        const uint16_t *A = (const uint16_t *)p->A + m0 * lda;
#if WHALE_X86
        if (k == SK_Q8) {
            const int8_t *W = p->W;
            if (q) q8_multi_rows(nw, mr, K, A, lda, W, ldw, n, q, p->scale, C, ldc, acc, tables);
            else q8_single_rows(mr, K, A, lda, W + n * ldw, sc, C + n, ldc, acc, tables);
            return;
        }
#endif
        const uint16_t *W = p->W;
#if WHALE_X86
        if (!portable) {
            if (q) ntb_multi_rows(nw, mr, K, A, lda, W, ldw, n, q, C, ldc, acc);
            else ntb_single_rows(mr, K, A, lda, W + n * ldw, C + n, ldc, acc);
            return;
        }
#endif
        for (int r = 0; r < (q ? nw : 1); r++)
            ntb_single_c(mr, K, A, lda, W + (n + r * q) * ldw, C + n + r * q, ldc, acc);
        return;
    }
    const int wt = sk_wt(k);
    const float *A = (const float *)p->A + m0 * lda;
    const char *W = p->W;
    const size_t row = ldw * wt_size(wt);
    if (portable && k != SK_F32) {
        for (int r = 0; r < (q ? nw : 1); r++) {
            const size_t i = n + r * q;
            ntx_single_c(wt, mr, K, A, lda, W + i * row, p->scale ? p->scale[i] : 0, C + i, ldc, acc);
        }
        return;
    }
    if (q) nt_multi_rows(wt, nw, mr, K, A, lda, W, ldw, n, q, p->scale, C, ldc, acc);
    else nt_single_rows(wt, mr, K, A, lda, W + n * row, sc, C + n, ldc, acc);
}

/* Rows lo..hi−1 of part p. Up to NT_MR A rows, and more than NT_MR_WIDE:
 * the range cut into four quarters walked side by side (four distant
 * sequential streams, see NT_MR), NT_MR A rows per pass. NT_MR + 1 to
 * NT_MR_WIDE: all rows in one pass, over two halves side by side or the
 * rows one by one (sk_pairs). The few left over one by one. (At 9 to 16
 * rows the passes after the first find the weights in L1, and quads were
 * as fast or faster: one thread, bench_gemm --shape nt_bf16 16 4864 896
 * cold 0.74 ms against 0.83 in two passes of 8, 12 rows 0.61 against 0.63,
 * nt_bf16 16 129280 320 6.65 against 6.59.) The int8 kernel converts its
 * weights again in every pass, so it takes more than NT_MR rows in passes
 * of NT_MR_WIDE over pairs: half the conversions of quads. One thread,
 * nt_q8 16 4864 896 hot 0.44-0.46 ms against 0.51-0.53 in quads, cold
 * 0.51-0.53 against 0.59-0.64, 16 129280 320 cold 6.2-7.1 against 6.9-7.7
 * (three alternating runs each, on a shared machine). */
static void sk_range(sk_kind k, int portable, const sk_part *p, size_t lo, size_t hi,
                     const void *tables) {
    const int wide = p->M > NT_MR && (p->M <= NT_MR_WIDE || k == SK_Q8);
    const int mr_max = wide ? NT_MR_WIDE : NT_MR;
    const int nw = !wide ? 4 : sk_pairs(k, portable) ? 2 : 1;
    const size_t q = nw > 1 ? (hi - lo) / (size_t)nw : 0;
    for (size_t i = 0; i < q; i++)
        for (int m0 = 0; m0 < p->M; m0 += mr_max)
            sk_rows(k, portable, p, m0, p->M - m0 < mr_max ? p->M - m0 : mr_max, lo + i, nw, q, tables);
    for (size_t n = lo + (size_t)nw * q; n < hi; n++)
        for (int m0 = 0; m0 < p->M; m0 += mr_max)
            sk_rows(k, portable, p, m0, p->M - m0 < mr_max ? p->M - m0 : mr_max, n, 1, 0, tables);
}

/* How the W rows of all parts (one row space, part after part) are dealt
 * to threads. Up to SK_DYNAMIC_BYTES of weights: one contiguous share per
 * thread, crossing part boundaries, so each thread walks few long streams
 * (a decode step's six 200 KB expert matrices run ~15 % faster than when
 * each is halved). Above: chunks of about SK_CHUNK_BYTES that threads take
 * as they finish; dealing out fixed halves of the lm_head left one thread
 * waiting up to a quarter of the product (the two cores do not stream at
 * the same rate). */
#define SK_DYNAMIC_BYTES ((size_t)4 << 20)
#define SK_CHUNK_BYTES ((size_t)1 << 20)
#define SK_CHUNKS_MAX 64

/* Whether a run is worth splitting over the team: when one thread would
 * take at least twice what a region costs (whale_par_sync_us), from its
 * weights' bytes (one core streams some 28 KB a microsecond from memory)
 * or its products (some 30,000 fp32 multiply-adds a microsecond at a few
 * rows). 2-core virtual machine (a region 5 us), bench_gemm --shape KIND
 * M N K cold, one thread against two: nt_bf16 1 x 768 x 160 (246 KB) 11.3
 * us against 13.2, 1 x 1280 x 320 45.7 against 28.8; nt 1 x 768 x 160
 * (492 KB) 33 against 19; nt_bf16 8 x 768 x 160 29 against 26. A constant
 * threshold of 16,384 products had split them all. */
static int sk_worth_team(double bytes, double macs, double moved) {
    return whale_par_worth(fmax(bytes / WHALE_CORE_BYTES_PER_US, macs / 30000.0), 1, moved);
}

/* The bytes a split of the run hands between cores (whale_par_move_us):
 * each distinct A twice (converted or not: written here, read by the
 * other threads, its lines taken back when it is next written here) and
 * every C once (written there, read here next). */
static double sk_moved(sk_kind k, const sk_part *parts, int n) {
    const size_t a_len = sk_a_len(k, parts[0].K), a_size = a_len ? sk_a_size(k) : 4;
    double moved = 0;
    for (int i = 0; i < n; i++) {
        if (!i || parts[i].A != parts[i - 1].A || parts[i].M != parts[i - 1].M)
            moved += 2.0 * parts[i].M * (double)(a_len ? a_len : (size_t)parts[i].K) * (double)a_size;
        moved += 4.0 * parts[i].M * parts[i].N;
    }
    return moved;
}

/* What a W row of a part with M rows of A costs, in A rows: SK_ROW_COST +
 * M. One thread, nt_q8 6400 × 320 from DRAM: 0.062 ms at M = 1, 0.10 at 4,
 * 0.17 at 8 (a row's stream ~3 A rows' arithmetic). The shares are cut by
 * that cost, so a group of an MoE's products (a routed expert's ~4
 * gathered rows, the shared expert's 8) does not leave the thread with
 * the shared expert's rows last to finish. nanowhale-100m's up products
 * at 8 tokens (int8, ten 640 × 320 parts, two threads, best of 2000 calls,
 * median of 6 alternated runs): experts of 4, 4, 4, 4 rows and the shared
 * 8, 68 µs against 74 cut by rows; of 2, 6, 3, 5 and 8, 73 against 93. */
#define SK_ROW_COST 3.0

/* The global row where share ch of `shares` starts (on a whole quad):
 * parts' rows cost SK_ROW_COST + M each. */
static size_t sk_cut(const sk_part *parts, int n, const size_t *first, double total, size_t ch, size_t shares) {
    double want = total * (double)ch / (double)shares;
    for (int i = 0; i < n; i++) {
        const double w = SK_ROW_COST + parts[i].M, c = w * (double)parts[i].N;
        if (want < c) return (first[i] + (size_t)(want / w)) / 4 * 4;
        want -= c;
    }
    return first[n] / 4 * 4;
}

/* const void *name: the tables a thread's kernels read (the q8 ones, built
 * on its stack, or none). */
#if WHALE_X86
#define SK_TABLES(name)                                                                                        \
    q8_tables name##_;                                                                                         \
    if (k == SK_Q8) q8_tables_init(&name##_);                                                                  \
    const void *name = &name##_
#else
#define SK_TABLES(name) const void *name = NULL
#endif

static void sk_run(sk_kind k, int portable, const sk_part *parts, int n) {
    double work = 0, cost = 0;
    size_t rows = 0, first[SK_PARTS_MAX + 1];
    for (int i = 0; i < n; i++) {
        work += (double)parts[i].M * parts[i].N * parts[i].K;
        cost += (SK_ROW_COST + parts[i].M) * parts[i].N;
        first[i] = rows;
        rows += (size_t)parts[i].N;
    }
    first[n] = rows;
    const size_t bytes = rows * (size_t)parts[0].K * sk_wsize(k); /* one K for all parts */
    const int par = sk_worth_team((double)bytes, work, sk_moved(k, parts, n));
    const int nt = par ? omp_get_max_threads() : 1;
    size_t chunks = (size_t)nt;
    if (par && bytes > SK_DYNAMIC_BYTES) {
        chunks = bytes / SK_CHUNK_BYTES;
        chunks = chunks > (size_t)SK_CHUNKS_MAX * nt ? (size_t)SK_CHUNKS_MAX * nt : chunks;
        chunks = (chunks + nt - 1) / nt * nt;
    }
    if (!par) { /* on this thread, without entering OpenMP (core/par.h) */
        SK_TABLES(tables);
        for (int i = 0; i < n; i++) sk_range(k, portable, &parts[i], 0, (size_t)parts[i].N, tables);
        return;
    }
#pragma omp parallel
    {
        SK_TABLES(tables);
#pragma omp for schedule(dynamic, 1)
        for (size_t ch = 0; ch < chunks; ch++) {
            /* global rows [lo, hi), starts on whole quads */
            const size_t lo = sk_cut(parts, n, first, cost, ch, chunks);
            const size_t hi = ch + 1 == chunks ? rows : sk_cut(parts, n, first, cost, ch + 1, chunks);
            for (int i = 0; i < n; i++) {
                const size_t a = lo > first[i] ? lo : first[i], b = hi < first[i + 1] ? hi : first[i + 1];
                if (a < b) sk_range(k, portable, &parts[i], a - first[i], b - first[i], tables);
            }
        }
    }
}


void whale_gemm_nt_serial(int M, int N, int K, const float *A, int lda, const float *W, int ldw, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    const sk_part p = {M, N, K, 0, A, (size_t)lda, W, (size_t)ldw, NULL, C, (size_t)ldc};
    sk_range(SK_F32, 0, &p, 0, (size_t)N, NULL);
}

/* Does our kernel compute an nt product of this kind with M rows, and
 * which one? (Else oneDNN, directly or on converted blocks.) */
int gemm_sk_choose(const whale_gemm *g, int kind, int M, sk_kind *k, int *portable) {
    const whale_gemm_path path = g->path;
    const int auto_own = path == WHALE_GEMM_AUTO && M <= whale_gemm_rules_for(whale_isa_active())->own_max_m_nt;
    *portable = path == WHALE_GEMM_OWN_PORTABLE;
    switch (kind) {
    case KIND_NT: *k = SK_F32; *portable = 0; return auto_own || own_path(path);
    case KIND_NT_BF16: *k = gemm_have_bf16() || *portable || !gemm_have_avx2() ? SK_BF16 : SK_BF16_FMA; break;
    case KIND_NT_F16: *k = SK_F16; break;
    case KIND_NT_Q8: *k = gemm_have_bf16() && whale_cpu_has_vbmi() && !*portable ? SK_Q8 : SK_I8; break;
    default: return 0;
    }
    if ((*k == SK_F16 || *k == SK_I8)) *portable |= !gemm_have_avx2();
    if (*k == SK_BF16) *portable |= !gemm_have_bf16();
    return auto_own || own_path(path);
}

static const char *sk_name(sk_kind k, int portable) {
    switch (k) {
    case SK_F32: return "whale:skinny_nt";
    case SK_F16: return portable ? "whale:nt_f16_c" : "whale:skinny_nt_f16";
    case SK_I8: return portable ? "whale:nt_q8_c" : "whale:skinny_nt_q8_fma";
    case SK_BF16: return portable ? "whale:nt_bf16_c" : "whale:skinny_nt_bf16";
    case SK_BF16_FMA: return "whale:skinny_nt_bf16_fma";
    default: return "whale:skinny_nt_q8";
    }
}

/* The products c[0..n) (validated, M, N, K > 0) with our kernel k: A
 * converted into scratch (once for consecutive parts with the same A),
 * then one split over all their rows. */
whale_code gemm_own_nt(whale_gemm *g, const gemm_call *c, int n, sk_kind k, int portable, whale_err *err) {
    sk_part parts[SK_PARTS_MAX];
    size_t need = 0;
    for (int i = 0; i < n; i++)
        if (!i || c[i].A != c[i - 1].A || c[i].s.lda != c[i - 1].s.lda || c[i].s.M != c[i - 1].s.M)
            need += (size_t)c[i].s.M * sk_a_len(k, c[i].s.K);
    whale_code rc = need ? gemm_scratch_reserve(&g->sa, need, sk_a_size(k), c, err) : WHALE_OK;
    if (rc) return rc;
    char *at = g->sa.p;
    for (int i = 0; i < n; i++) {
        const gemm_key *s = &c[i].s;
        const size_t ld = sk_a_len(k, s->K);
        sk_part *p = &parts[i];
        *p = (sk_part){s->M, s->N, s->K, s->acc, c[i].A, (size_t)s->lda, c[i].B, (size_t)s->ldb,
                       c[i].scale, c[i].C, (size_t)s->ldc};
        if (!ld) continue;
        if (i && c[i].A == c[i - 1].A && s->lda == c[i - 1].s.lda && s->M == c[i - 1].s.M) {
            p->A = parts[i - 1].A, p->lda = ld;
            continue;
        }
        sk_convert(k, portable, s->M, s->K, c[i].A, (size_t)s->lda, at, ld);
        p->A = at, p->lda = ld;
        at += (size_t)s->M * ld * sk_a_size(k);
    }
    sk_run(k, portable, parts, n);
    snprintf(g->last_impl, sizeof g->last_impl, "%s", sk_name(k, portable));
    g->stats.own_calls += (unsigned long)n;
    return WHALE_OK;
}
