/* Matrix products: oneDNN matmul primitives (cached) for real matrices, our
 * own AVX-512 kernels for products with few rows. The shape rules and the
 * measurements behind them are in gemm.h. In short:
 *  - oneDNN reaches ~200-230 GFLOP/s f32 from a few dozen rows up, but a
 *    product with a handful of rows costs it microseconds of overhead and,
 *    worse, it streams weights from DRAM at a third of the bandwidth our
 *    kernel gets, so decode uses our kernels.
 *  - oneDNN 2.6 only offers "gemm:jit" for primitives whose sizes are given
 *    at run time (brgemm refuses runtime dimensions). It is as fast as
 *    brgemm for large products and lets one primitive serve every shape,
 *    which is what a mixture-of-experts layer needs: its rows per expert
 *    change every call, and creating an exact primitive costs 0.1-0.3 ms.
 *  - bf16 weights (whale_gemm_nt_bf16) follow the same rules: oneDNN 2.6
 *    does offer runtime sizes for bf16 ("gemm:jit", as fast as brgemm).
 *  - fp16 and int8 weights: oneDNN 2.6 has no f16 matmul without
 *    AVX512-FP16 (primitive creation fails as unimplemented), and its int8
 *    matmul wants int8 activations. So few rows use our kernels (fp16 or int8
 *    weights widened to fp32 in registers), and more rows convert blocks of
 *    the operands into scratch buffers and run the f32 (fp16) or bf16 (int8
 *    weights, backward bf16) primitives on them (gemm_converted).
 *  The path depends on the shape only, never on call history, so a given
 *  call always produces the same bits.
 */
#include "kernels/gemm.h"
#include "whale_bench.h"

#include "core/core.h"
#include "core/cpu.h"
#include "kernels/convert.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

#if WHALE_X86
#include <immintrin.h>
#endif

/* The products. The first six are what oneDNN primitives are made for:
 * f32, and bf16 A and B (already converted) with f32 C. The others are
 * computed by our kernels or through those six on converted blocks. The
 * layout (nt, nn, tn) of kind k is k % 3 for the first nine; layout() gives
 * it for all (KIND_NT_Q8 is nt, KIND_NN_B16 and KIND_NN_Q8 nn, KIND_TN_B16
 * tn). */
enum {
    KIND_NT = 0, KIND_NN, KIND_TN,
    KIND_NT_BF16, KIND_NN_BF16, KIND_TN_BF16,
    KIND_NT_F16, KIND_NN_F16, KIND_TN_F16,
    KIND_NT_Q8,
    KIND_NN_B16, KIND_TN_B16, /* nn_bf16 / tn_bf16 with A (and B) given in bf16 */
    KIND_NN_Q8,               /* nn with int8 B and per-row scales of B */
    KIND_COUNT
};
static const char *const kind_names[KIND_COUNT] = {
    "nt",     "nn",     "tn",    "nt_bf16",  "nn_bf16", "tn_bf16",
    "nt_f16", "nn_f16", "tn_f16", "nt_q8",   "nn_b16",   "tn_b16", "nn_q8"};

/* KIND_NT, KIND_NN or KIND_TN */
static int layout(int kind) { return kind == KIND_NN_Q8 ? KIND_NN : kind % 3; }
static int is_bf16_kind(int kind) { return kind >= KIND_NT_BF16 && kind <= KIND_TN_BF16; }

/* Our kernels run single-threaded below this many multiply-adds, where the
 * fork/join of a parallel region (~1-2 us) eats the gain; at 2^16 two
 * threads are already ~1.6x faster than one. */
#define OWN_PARALLEL_MIN_WORK (1 << 16)

/* ------------------------------------------------------------ cache types */

/* What a primitive is specialised to. Runtime entries have every size and
 * stride -1 (given at execution), so one serves all shapes of its kind. */
typedef struct {
    int kind, acc, M, N, K, lda, ldb, ldc;
} gemm_key;

typedef struct {
    gemm_key key;
    int used;
    uint64_t last_use;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3]; /* exact entries only: A, B, C; pointers set per call */
    char impl[64];
} gemm_entry;

typedef struct {
    void *p;
    size_t bytes;
} scratch;

struct whale_gemm {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    gemm_entry cache[WHALE_GEMM_CACHE_CAP];
    uint64_t tick;
    whale_gemm_path path;
    whale_gemm_stats stats;
    char last_impl[64];
    /* Scratch: sa holds A converted (A rounded for our kernels, or an A block
     * for gemm_converted), sb a converted B block, sc a C block (nt_q8 with
     * accumulate). Each grows to the largest size used and is freed with
     * the object. */
    scratch sa, sb, sc;
    int block_mn;       /* gemm_converted block limits; 0: the defaults */
    size_t block_bytes;
};

/* One product as requested by the caller. */
typedef struct {
    gemm_key s; /* the actual shape (no -1) */
    const void *A, *B; /* float, uint16_t (bf16, fp16 bits) or int8_t, by kind */
    float *C;
    const float *scale; /* KIND_NT_Q8: per output column; KIND_NN_Q8: per row of B */
} gemm_call;

/* ------------------------------------------------------------ errors */

static whale_code dnnl_fail(whale_err *err, const gemm_call *c, const char *what,
                            dnnl_status_t st) {
    const gemm_key *s = &c->s;
    return whale_errf(err, WHALE_ERR_INTERNAL,
                      "gemm %s M=%d N=%d K=%d lda=%d ldb=%d ldc=%d accumulate=%d: "
                      "oneDNN %s failed: %s (status %d)",
                      kind_names[s->kind], s->M, s->N, s->K, s->lda, s->ldb, s->ldc, s->acc,
                      what, dnnl_status2str(st), (int)st);
}

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

/* Weight types of the skinny kernels nt_quad / nt_single: they widen f32,
 * fp16 and int8 weights to fp32 in registers (vcvtph2ps, vpmovsxbd +
 * vcvtdq2ps) for fp32 FMAs, with A already rounded to the product's format;
 * WT_I8 rows are multiplied by their scale. (bf16 weights, and int8 ones
 * where AVX512_BF16 and VBMI exist, have vdpbf16ps kernels below.) */
enum { WT_F32 = 0, WT_F16, WT_I8, WT_BF16 };

static size_t wt_size(int wt) { return wt == WT_F32 ? 4 : wt == WT_I8 ? 1 : 2; }

/* Does this tier have our AVX2 or AVX-512 kernels (fp32 FMAs on f32, fp16,
 * int8 and bf16 weights), and the vdpbf16ps ones (bf16 weights, int8
 * through bf16)? Below AVX2 the narrow weights take the plain C kernels. */
static int have_avx2(void) { return WHALE_X86 && whale_isa_at_least(WHALE_ISA_AVX2); }
static int have_narrow(void) { return WHALE_X86 && whale_isa_at_least(WHALE_ISA_AVX512); }
static int have_bf16(void) { return WHALE_X86 && whale_isa_at_least(WHALE_ISA_AVX512_BF16); }

/* Copies specialised for the weight type and the number of A rows. */
#define BY_MR(call_with_mr)                                                                        \
    switch (mr) {                                                                                  \
    case 1: call_with_mr(1); break;                                                                \
    case 2: call_with_mr(2); break;                                                                \
    case 3: call_with_mr(3); break;                                                                \
    default: call_with_mr(4); break;                                                               \
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

/* W rows n, n+q, n+2q, n+3q against mr A rows; results go to the same
 * columns of C. */
static inline __attribute__((always_inline)) void
nt_quad(const int wt, const int mr, int K, const float *A, size_t lda, const void *W, size_t ldw,
        size_t n, size_t q, const float *scale, float *C, size_t ldc, int acc) {
    const size_t row = ldw * wt_size(wt), step = q * row;
    const char *w0 = (const char *)W + n * row, *w1 = w0 + step, *w2 = w1 + step, *w3 = w2 + step;
    __m512 s[NT_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) s[m][r] = _mm512_setzero_ps();
    __mmask16 mask = 0xFFFF;
    for (int k = 0; k < K; k += 16) {
        if (K - k < 16) mask = (__mmask16)((1u << (K - k)) - 1); /* last, partial vector */
        const __m512 v0 = load_w(wt, mask, w0, k);
        const __m512 v1 = load_w(wt, mask, w1, k);
        const __m512 v2 = load_w(wt, mask, w2, k);
        const __m512 v3 = load_w(wt, mask, w3, k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512 a = _mm512_maskz_loadu_ps(mask, A + m * lda + k);
            s[m][0] = _mm512_fmadd_ps(a, v0, s[m][0]);
            s[m][1] = _mm512_fmadd_ps(a, v1, s[m][1]);
            s[m][2] = _mm512_fmadd_ps(a, v2, s[m][2]);
            s[m][3] = _mm512_fmadd_ps(a, v3, s[m][3]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float sum[4];
        _mm_storeu_ps(sum, hsum4(s[m][0], s[m][1], s[m][2], s[m][3]));
        float *c = C + m * ldc + n;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const float v = wt == WT_I8 ? scale[n + r * q] * sum[r] : sum[r];
            c[r * q] = acc ? c[r * q] + v : v;
        }
    }
}

/* One W row (the few left over after the quarters) against mr A rows;
 * sc: its scale (WT_I8). */
static inline __attribute__((always_inline)) void
nt_single(const int wt, const int mr, int K, const float *A, size_t lda, const void *w, float sc,
          float *C, size_t ldc, int acc) {
    __m512 s[NT_MR];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) s[m] = _mm512_setzero_ps();
    __mmask16 mask = 0xFFFF;
    for (int k = 0; k < K; k += 16) {
        if (K - k < 16) mask = (__mmask16)((1u << (K - k)) - 1);
        const __m512 v = load_w(wt, mask, w, k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++)
            s[m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, A + m * lda + k), v, s[m]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float v = hsum1(s[m]);
        if (wt == WT_I8) v *= sc;
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

static void nt_quad_rows_avx512(int wt, int mr, int K, const float *A, size_t lda, const void *W,
                         size_t ldw, size_t n, size_t q, const float *scale, float *C, size_t ldc,
                         int acc) {
#define QUAD(WT, MR) nt_quad(WT, MR, K, A, lda, W, ldw, n, q, scale, C, ldc, acc)
#define QUAD_F32(MR) QUAD(WT_F32, MR)
#define QUAD_F16(MR) QUAD(WT_F16, MR)
#define QUAD_I8(MR) QUAD(WT_I8, MR)
#define QUAD_BF(MR) QUAD(WT_BF16, MR)
    if (wt == WT_BF16) {
        BY_MR(QUAD_BF);
        return;
    }
    if (wt == WT_F16) {
        BY_MR(QUAD_F16);
        return;
    }
    if (wt == WT_I8) {
        BY_MR(QUAD_I8);
        return;
    }
    BY_MR(QUAD_F32);
#undef QUAD
#undef QUAD_F32
#undef QUAD_F16
#undef QUAD_I8
#undef QUAD_BF
}

static void nt_single_rows_avx512(int wt, int mr, int K, const float *A, size_t lda, const void *w,
                           float sc, float *C, size_t ldc, int acc) {
#define SINGLE(WT, MR) nt_single(WT, MR, K, A, lda, w, sc, C, ldc, acc)
#define SINGLE_F32(MR) SINGLE(WT_F32, MR)
#define SINGLE_F16(MR) SINGLE(WT_F16, MR)
#define SINGLE_I8(MR) SINGLE(WT_I8, MR)
#define SINGLE_BF(MR) SINGLE(WT_BF16, MR)
    if (wt == WT_BF16) {
        BY_MR(SINGLE_BF);
        return;
    }
    if (wt == WT_F16) {
        BY_MR(SINGLE_F16);
        return;
    }
    if (wt == WT_I8) {
        BY_MR(SINGLE_I8);
        return;
    }
    BY_MR(SINGLE_F32);
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
    __m256 s[NT_MR];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) s[m] = _mm256_setzero_ps();
    for (int k = 0; k <= K8; k += NT8) {
        if (k == K8 && k == K) break;
        const int tail = k == K8;
        const __m256 v = tail ? tail8_w(wt, w, k, K) : load8_w(wt, w, k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++)
            s[m] = _mm256_fmadd_ps(tail ? tail8_a(A + m * lda, k, K) : _mm256_loadu_ps(A + m * lda + k), v, s[m]);
    }
#pragma GCC unroll 4
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
    case WT_F16: BY_MR(SINGLE8_F16); break;
    case WT_I8: BY_MR(SINGLE8_I8); break;
    case WT_BF16: BY_MR(SINGLE8_BF); break;
    default: BY_MR(SINGLE8_F32); break;
    }
#undef SINGLE8
#undef SINGLE8_F32
#undef SINGLE8_F16
#undef SINGLE8_I8
#undef SINGLE8_BF
}
WHALE_TARGET_END
#endif

static void nt_quad_rows(int wt, int mr, int K, const float *A, size_t lda, const void *W,
                         size_t ldw, size_t n, size_t q, const float *scale, float *C, size_t ldc,
                         int acc) {
#if WHALE_X86
    if (have_narrow()) {
        nt_quad_rows_avx512(wt, mr, K, A, lda, W, ldw, n, q, scale, C, ldc, acc);
        return;
    }
    if (have_avx2()) {
        nt_quad_rows_avx2(wt, mr, K, A, lda, W, ldw, n, q, scale, C, ldc, acc);
        return;
    }
#endif
    nt_quad_rows_c(wt, mr, K, A, lda, W, ldw, n, q, scale, C, ldc, acc);
}

static void nt_single_rows(int wt, int mr, int K, const float *A, size_t lda, const void *w,
                           float sc, float *C, size_t ldc, int acc) {
#if WHALE_X86
    if (have_narrow()) {
        nt_single_rows_avx512(wt, mr, K, A, lda, w, sc, C, ldc, acc);
        return;
    }
    if (have_avx2()) {
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
    float s[NT_MR] = {0};
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
    if (have_narrow()) {
        nn_rows_avx512(mr, width, K, A, sam, sak, B, ldb, C, ldc, acc);
        return;
    }
    if (have_avx2()) {
        nn_rows_avx2(mr, width, K, A, sam, sak, B, ldb, C, ldc, acc);
        return;
    }
#endif
    nn_rows_base(mr, width, K, A, sam, sak, B, ldb, C, ldc, acc);
}

static void own_nn_tn(const gemm_call *c) {
    const int M = c->s.M, N = c->s.N, K = c->s.K, acc = c->s.acc;
    const size_t lda = (size_t)c->s.lda, ldb = (size_t)c->s.ldb, ldc = (size_t)c->s.ldc;
    const size_t sam = c->s.kind == KIND_NN ? lda : 1, sak = c->s.kind == KIND_NN ? 1 : lda;
    const float *A = c->A, *B = c->B;
    float *C = c->C;
    const int nblocks = (N + NN_COLS - 1) / NN_COLS;
    const int par = (double)M * N * K >= OWN_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int b = 0; b < nblocks; b++) {
        const int n0 = b * NN_COLS;
        const int width = N - n0 < NN_COLS ? N - n0 : NN_COLS;
        for (int m0 = 0; m0 < M; m0 += NN_MR) {
            const int mr = M - m0 < NN_MR ? M - m0 : NN_MR;
            nn_rows(mr, width, K, A + m0 * sam, sam, sak, B + n0, ldb, C + m0 * ldc + n0, ldc,
                    acc);
        }
    }
}

/* ------------------------------------------------------------ oneDNN primitives */

/* Memory descriptors of A, B (oneDNN's "weights" [K, N]) and C for a key;
 * -1 fields become runtime values. */
static dnnl_status_t make_mds(const gemm_key *k, dnnl_memory_desc_t md[3]) {
#define DIM(x) ((x) < 0 ? DNNL_RUNTIME_DIM_VAL : (dnnl_dim_t)(x))
    const dnnl_dim_t M = DIM(k->M), N = DIM(k->N), K = DIM(k->K);
    const dnnl_dim_t lda = DIM(k->lda), ldb = DIM(k->ldb), ldc = DIM(k->ldc);
#undef DIM
    dnnl_dims_t a_dims = {M, K}, b_dims = {K, N}, c_dims = {M, N};
    dnnl_dims_t a_str = {lda, 1}, b_str = {ldb, 1}, c_str = {ldc, 1};
    const dnnl_data_type_t in_type = is_bf16_kind(k->kind) ? dnnl_bf16 : dnnl_f32;
    if (layout(k->kind) == KIND_TN) { /* A is stored [K, M] */
        a_str[0] = 1;
        a_str[1] = lda;
    }
    if (layout(k->kind) == KIND_NT) { /* W is stored [N, K] */
        b_str[0] = 1;
        b_str[1] = ldb;
    }
    dnnl_status_t st = dnnl_memory_desc_init_by_strides(&md[0], 2, a_dims, in_type, a_str);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_strides(&md[1], 2, b_dims, in_type, b_str);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_strides(&md[2], 2, c_dims, dnnl_f32, c_str);
    return st;
}

static void entry_clear(gemm_entry *e) {
    for (int i = 0; i < 3; i++)
        if (e->mem[i]) dnnl_memory_destroy(e->mem[i]);
    if (e->prim) dnnl_primitive_destroy(e->prim);
    memset(e, 0, sizeof *e);
}

static whale_code entry_create(whale_gemm *g, const gemm_key *key, const gemm_call *c,
                               gemm_entry *e, whale_err *err) {
    memset(e, 0, sizeof *e);
    dnnl_memory_desc_t md[3];
    dnnl_matmul_desc_t op;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    const char *what = "memory_desc_init";
    dnnl_status_t st = make_mds(key, md);
    if (st == dnnl_success) {
        what = "matmul_desc_init";
        st = dnnl_matmul_desc_init(&op, &md[0], &md[1], NULL, &md[2]);
    }
    if (st == dnnl_success) {
        what = "primitive_attr_create";
        st = dnnl_primitive_attr_create(&attr);
    }
    if (st == dnnl_success && key->acc) { /* C += product: a sum post-op */
        what = "post_ops";
        st = dnnl_post_ops_create(&ops);
        if (st == dnnl_success) st = dnnl_post_ops_append_sum(ops, 1.0f);
        if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, ops);
    }
    if (st == dnnl_success) {
        what = "primitive_desc_create";
        st = dnnl_primitive_desc_create(&pd, &op, attr, g->engine, NULL);
    }
    if (st == dnnl_success) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl)
            snprintf(e->impl, sizeof e->impl, "%s", impl);
        else
            snprintf(e->impl, sizeof e->impl, "onednn:?");
        what = "primitive_create";
        st = dnnl_primitive_create(&e->prim, pd);
    }
    for (int i = 0; i < 3 && st == dnnl_success && key->M >= 0; i++) {
        what = "memory_create";
        st = dnnl_memory_create(&e->mem[i], &md[i], g->engine, DNNL_MEMORY_NONE);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (ops) dnnl_post_ops_destroy(ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) {
        entry_clear(e);
        return dnnl_fail(err, c, what, st);
    }
    e->key = *key;
    e->used = 1;
    g->stats.created++;
    return WHALE_OK;
}

/* Find or create the primitive for key; evicts the least recently used one
 * when the cache is full. */
static whale_code cache_get(whale_gemm *g, const gemm_key *key, const gemm_call *c,
                            gemm_entry **out, whale_err *err) {
    gemm_entry *free_slot = NULL, *oldest = NULL;
    for (int i = 0; i < WHALE_GEMM_CACHE_CAP; i++) {
        gemm_entry *e = &g->cache[i];
        if (!e->used) {
            if (!free_slot) free_slot = e;
            continue;
        }
        if (!memcmp(&e->key, key, sizeof *key)) {
            g->stats.hits++;
            e->last_use = ++g->tick;
            *out = e;
            return WHALE_OK;
        }
        if (!oldest || e->last_use < oldest->last_use) oldest = e;
    }
    gemm_entry *slot = free_slot;
    if (!slot) {
        entry_clear(oldest);
        g->stats.evicted++;
        slot = oldest;
    }
    whale_code rc = entry_create(g, key, c, slot, err);
    if (rc) return rc;
    slot->last_use = ++g->tick;
    *out = slot;
    return WHALE_OK;
}

static whale_code dnnl_run(whale_gemm *g, const gemm_call *c, int runtime, whale_err *err) {
    gemm_key key = c->s;
    if (runtime) key.M = key.N = key.K = key.lda = key.ldb = key.ldc = -1;
    gemm_entry *e;
    whale_code rc = cache_get(g, &key, c, &e, err);
    if (rc) return rc;
    g->stats.calls++;

    void *ptr[3] = {(void *)c->A, (void *)c->B, c->C};
    dnnl_memory_t mem[3] = {NULL, NULL, NULL};
    const char *what = "memory_set_data_handle";
    dnnl_status_t st = dnnl_success;
    if (runtime) { /* the shape is only known now: describe it per call */
        dnnl_memory_desc_t md[3];
        what = "memory_desc_init";
        st = make_mds(&c->s, md);
        for (int i = 0; i < 3 && st == dnnl_success; i++) {
            what = "memory_create";
            st = dnnl_memory_create(&mem[i], &md[i], g->engine, ptr[i]);
        }
    } else {
        for (int i = 0; i < 3 && st == dnnl_success; i++) {
            mem[i] = e->mem[i];
            st = dnnl_memory_set_data_handle(mem[i], ptr[i]);
        }
    }
    if (st == dnnl_success) {
        dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
        what = "primitive_execute";
        st = dnnl_primitive_execute(e->prim, g->stream, 3, args);
    }
    if (st == dnnl_success) {
        what = "stream_wait";
        st = dnnl_stream_wait(g->stream);
    }
    if (runtime)
        for (int i = 0; i < 3; i++)
            if (mem[i]) dnnl_memory_destroy(mem[i]);
    if (st != dnnl_success) return dnnl_fail(err, c, what, st);
    memcpy(g->last_impl, e->impl, sizeof g->last_impl);
    return WHALE_OK;
}

/* ------------------------------------------------------------ bf16 weights */

/* fp32 -> bf16, round to nearest even; NaN stays NaN (quiet, sign and top
 * payload kept), subnormals are rounded, not flushed: bit-identical to
 * whale_float_to_bf16. Used for A before oneDNN and for converting weights,
 * so it must not depend on the bf16 instructions, which flush subnormals. */
#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
static void f32_to_bf16_avx512(uint16_t *dst, const float *src, size_t n) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512i u = _mm512_maskz_loadu_epi32(m, src + i);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one)));
        r = _mm512_srli_epi32(r, 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, r);
    }
}
WHALE_TARGET_END
#endif

void whale_f32_to_bf16_rows(uint16_t *dst, const float *src, size_t n) {
#if WHALE_X86
    if (have_narrow()) {
        f32_to_bf16_avx512(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = whale_float_to_bf16(src[i]);
}

/* Room for n elements of `size` bytes in a scratch buffer: the only
 * allocations of the products, made once per new maximum size. */
static whale_code scratch_reserve(scratch *sc, size_t n, size_t size, const gemm_call *c,
                                  whale_err *err) {
    size_t bytes;
    if (!whale_mul_size(n, size, &bytes)) bytes = SIZE_MAX;
    if (bytes <= sc->bytes) return WHALE_OK;
    void *p = whale_alloc(bytes);
    if (!p)
        return whale_errf(err, WHALE_ERR_NOMEM,
                          "gemm %s M=%d N=%d K=%d: cannot allocate %zu bytes of scratch",
                          kind_names[c->s.kind], c->s.M, c->s.N, c->s.K, bytes);
    free(sc->p);
    sc->p = p;
    sc->bytes = bytes;
    return WHALE_OK;
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

/* W rows n, n+q, n+2q, n+3q against mr A rows: vdpbf16ps adds the products
 * of adjacent k pairs into fp32 lanes. */
static inline __attribute__((always_inline)) void
ntb_quad(const int mr, int K, const uint16_t *A, size_t lda, const uint16_t *W, size_t ldw,
         size_t n, size_t q, float *C, size_t ldc, int acc) {
    const uint16_t *w0 = W + n * ldw, *w1 = w0 + q * ldw, *w2 = w1 + q * ldw, *w3 = w2 + q * ldw;
    __m512 s[NT_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) s[m][r] = _mm512_setzero_ps();
    __mmask32 mask = 0xFFFFFFFFu;
    for (int k = 0; k < K; k += KB_STEP) {
        if (K - k < KB_STEP) mask = (__mmask32)((1u << (K - k)) - 1); /* W beyond K may be NaN */
        const __m512bh v0 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w0 + k);
        const __m512bh v1 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w1 + k);
        const __m512bh v2 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w2 + k);
        const __m512bh v3 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w3 + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512bh a = (__m512bh)_mm512_load_si512(A + m * lda + k);
            s[m][0] = _mm512_dpbf16_ps(s[m][0], a, v0);
            s[m][1] = _mm512_dpbf16_ps(s[m][1], a, v1);
            s[m][2] = _mm512_dpbf16_ps(s[m][2], a, v2);
            s[m][3] = _mm512_dpbf16_ps(s[m][3], a, v3);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float sum[4];
        _mm_storeu_ps(sum, hsum4(s[m][0], s[m][1], s[m][2], s[m][3]));
        float *c = C + m * ldc + n;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) c[r * q] = acc ? c[r * q] + sum[r] : sum[r];
    }
}

static inline __attribute__((always_inline)) void
ntb_single(const int mr, int K, const uint16_t *A, size_t lda, const uint16_t *w, float *C,
           size_t ldc, int acc) {
    __m512 s[NT_MR];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) s[m] = _mm512_setzero_ps();
    __mmask32 mask = 0xFFFFFFFFu;
    for (int k = 0; k < K; k += KB_STEP) {
        if (K - k < KB_STEP) mask = (__mmask32)((1u << (K - k)) - 1);
        const __m512bh v = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++)
            s[m] = _mm512_dpbf16_ps(s[m], (__m512bh)_mm512_load_si512(A + m * lda + k), v);
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        const float v = hsum1(s[m]);
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

static void ntb_quad_rows(int mr, int K, const uint16_t *A, size_t lda, const uint16_t *W,
                          size_t ldw, size_t n, size_t q, float *C, size_t ldc, int acc) {
#define QUAD_BF16(MR) ntb_quad(MR, K, A, lda, W, ldw, n, q, C, ldc, acc)
    BY_MR(QUAD_BF16)
#undef QUAD_BF16
}

static void ntb_single_rows(int mr, int K, const uint16_t *A, size_t lda, const uint16_t *w,
                            float *C, size_t ldc, int acc) {
#define SINGLE_BF16(MR) ntb_single(MR, K, A, lda, w, C, ldc, acc)
    BY_MR(SINGLE_BF16)
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
    if (m128) { /* |-128| does not fit the tables */
        hi = _mm512_mask_mov_epi8(hi, m128, _mm512_set1_epi8((char)0xC3));
        lo = _mm512_mask_mov_epi8(lo, m128, _mm512_setzero_si512());
    }
    *wlo = (__m512bh)_mm512_unpacklo_epi8(lo, hi);
    *whi = (__m512bh)_mm512_unpackhi_epi8(lo, hi);
}

static inline __mmask64 q8_mask(int left) {
    return left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
}

static inline __attribute__((always_inline)) void
q8_quad(const int mr, int K, const uint16_t *A, size_t lda, const int8_t *W, size_t ldw, size_t n,
        size_t q, const float *scale, float *C, size_t ldc, int acc, const q8_tables *t) {
    const int8_t *w0 = W + n * ldw, *w1 = w0 + q * ldw, *w2 = w1 + q * ldw, *w3 = w2 + q * ldw;
    __m512 s[NT_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) s[m][r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += Q8_STEP) {
        const __mmask64 mask = q8_mask(K - k);
        __m512bh l[4], h[4];
        q8_load(t, mask, w0 + k, &l[0], &h[0]);
        q8_load(t, mask, w1 + k, &l[1], &h[1]);
        q8_load(t, mask, w2 + k, &l[2], &h[2]);
        q8_load(t, mask, w3 + k, &l[3], &h[3]);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512bh alo = (__m512bh)_mm512_load_si512(A + m * lda + k);
            const __m512bh ahi = (__m512bh)_mm512_load_si512(A + m * lda + k + 32);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                s[m][r] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(s[m][r], alo, l[r]), ahi, h[r]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float sum[4];
        _mm_storeu_ps(sum, hsum4(s[m][0], s[m][1], s[m][2], s[m][3]));
        float *c = C + m * ldc + n;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const float v = scale[n + r * q] * sum[r];
            c[r * q] = acc ? c[r * q] + v : v;
        }
    }
}

static inline __attribute__((always_inline)) void
q8_single(const int mr, int K, const uint16_t *A, size_t lda, const int8_t *w, float sc, float *C,
          size_t ldc, int acc, const q8_tables *t) {
    __m512 s[NT_MR];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) s[m] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += Q8_STEP) {
        __m512bh l, h;
        q8_load(t, q8_mask(K - k), w + k, &l, &h);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            s[m] = _mm512_dpbf16_ps(s[m], (__m512bh)_mm512_load_si512(A + m * lda + k), l);
            s[m] = _mm512_dpbf16_ps(s[m], (__m512bh)_mm512_load_si512(A + m * lda + k + 32), h);
        }
    }
#pragma GCC unroll 4
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

static void q8_quad_rows(int mr, int K, const uint16_t *A, size_t lda, const int8_t *W, size_t ldw,
                         size_t n, size_t q, const float *scale, float *C, size_t ldc, int acc,
                         const q8_tables *t) {
#define QUAD_Q8(MR) q8_quad(MR, K, A, lda, W, ldw, n, q, scale, C, ldc, acc, t)
    BY_MR(QUAD_Q8)
#undef QUAD_Q8
}

static void q8_single_rows(int mr, int K, const uint16_t *A, size_t lda, const int8_t *w, float sc,
                           float *C, size_t ldc, int acc, const q8_tables *t) {
#define SINGLE_Q8(MR) q8_single(MR, K, A, lda, w, sc, C, ldc, acc, t)
    BY_MR(SINGLE_Q8)
#undef SINGLE_Q8
}

WHALE_TARGET_END
#endif /* WHALE_X86 */


/* ------------------------------------------------------------ the skinny split */

/* Our nt kernels, by weight type: fp32 FMAs on f32, fp16 or int8 weights
 * (A as is, or rounded to fp16 / bf16 and kept as f32), vdpbf16ps on bf16
 * weights or on int8 ones expanded in registers (A in bf16). */
typedef enum { SK_F32, SK_F16, SK_I8, SK_BF16, SK_Q8, SK_BF16_FMA } sk_kind;

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

/* W rows n, n+q, n+2q, n+3q (quad) or row n alone (q = 0) of part p against
 * its A rows m0..m0+mr−1. */
static void sk_rows(sk_kind k, int portable, const sk_part *p, int m0, int mr, size_t n, size_t q,
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
            if (q) q8_quad_rows(mr, K, A, lda, W, ldw, n, q, p->scale, C, ldc, acc, tables);
            else q8_single_rows(mr, K, A, lda, W + n * ldw, sc, C + n, ldc, acc, tables);
            return;
        }
#endif
        const uint16_t *W = p->W;
#if WHALE_X86
        if (!portable) {
            if (q) ntb_quad_rows(mr, K, A, lda, W, ldw, n, q, C, ldc, acc);
            else ntb_single_rows(mr, K, A, lda, W + n * ldw, C + n, ldc, acc);
            return;
        }
#endif
        for (int r = 0; r < (q ? 4 : 1); r++)
            ntb_single_c(mr, K, A, lda, W + (n + r * q) * ldw, C + n + r * q, ldc, acc);
        return;
    }
    const int wt = sk_wt(k);
    const float *A = (const float *)p->A + m0 * lda;
    const char *W = p->W;
    const size_t row = ldw * wt_size(wt);
    if (portable && k != SK_F32) {
        for (int r = 0; r < (q ? 4 : 1); r++) {
            const size_t i = n + r * q;
            ntx_single_c(wt, mr, K, A, lda, W + i * row, p->scale ? p->scale[i] : 0, C + i, ldc, acc);
        }
        return;
    }
    if (q) nt_quad_rows(wt, mr, K, A, lda, W, ldw, n, q, p->scale, C, ldc, acc);
    else nt_single_rows(wt, mr, K, A, lda, W + n * row, sc, C + n, ldc, acc);
}

/* Rows lo..hi−1 of part p: cut into four quarters walked side by side (four
 * distant sequential streams, see NT_MR), the few left over one by one. */
static void sk_range(sk_kind k, int portable, const sk_part *p, size_t lo, size_t hi,
                     const void *tables) {
    const size_t q = (hi - lo) / 4;
    for (size_t i = 0; i < q; i++)
        for (int m0 = 0; m0 < p->M; m0 += NT_MR)
            sk_rows(k, portable, p, m0, p->M - m0 < NT_MR ? p->M - m0 : NT_MR, lo + i, q, tables);
    for (size_t n = lo + 4 * q; n < hi; n++)
        for (int m0 = 0; m0 < p->M; m0 += NT_MR)
            sk_rows(k, portable, p, m0, p->M - m0 < NT_MR ? p->M - m0 : NT_MR, n, 0, tables);
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
#define SK_PARTS_MAX 16

/* The skinny kernels stream their weights from memory (decode): two
 * threads read faster than one from a quarter of the general threshold up
 * (a 16K-weight product is ~16-64 KB). */
#define SK_PARALLEL_MIN_WORK (OWN_PARALLEL_MIN_WORK / 4)

static void sk_run(sk_kind k, int portable, const sk_part *parts, int n) {
    double work = 0;
    size_t rows = 0, first[SK_PARTS_MAX + 1];
    for (int i = 0; i < n; i++) {
        work += (double)parts[i].M * parts[i].N * parts[i].K;
        first[i] = rows;
        rows += (size_t)parts[i].N;
    }
    first[n] = rows;
    const int par = work >= SK_PARALLEL_MIN_WORK;
    const int nt = par ? omp_get_max_threads() : 1;
    const size_t bytes = rows * (size_t)parts[0].K * sk_wsize(k); /* one K for all parts */
    size_t chunks = (size_t)nt;
    if (par && bytes > SK_DYNAMIC_BYTES) {
        chunks = bytes / SK_CHUNK_BYTES;
        chunks = chunks > (size_t)SK_CHUNKS_MAX * nt ? (size_t)SK_CHUNKS_MAX * nt : chunks;
        chunks = (chunks + nt - 1) / nt * nt;
    }
#pragma omp parallel if (par)
    {
#if WHALE_X86
        q8_tables tab;
        if (k == SK_Q8) q8_tables_init(&tab);
        const void *tables = &tab;
#else
        const void *tables = NULL;
#endif
#pragma omp for schedule(dynamic, 1)
        for (size_t ch = 0; ch < chunks; ch++) {
            /* global rows [lo, hi), starts on whole quads */
            const size_t lo = rows * ch / chunks / 4 * 4;
            const size_t hi = ch + 1 == chunks ? rows : rows * (ch + 1) / chunks / 4 * 4;
            for (int i = 0; i < n; i++) {
                const size_t a = lo > first[i] ? lo : first[i], b = hi < first[i + 1] ? hi : first[i + 1];
                if (a < b) sk_range(k, portable, &parts[i], a - first[i], b - first[i], tables);
            }
        }
    }
}

static int own_path(whale_gemm_path p) {
    return p == WHALE_GEMM_OWN || p == WHALE_GEMM_OWN_PORTABLE;
}

void whale_gemm_nt_serial(int M, int N, int K, const float *A, int lda, const float *W, int ldw, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    const sk_part p = {M, N, K, 0, A, (size_t)lda, W, (size_t)ldw, NULL, C, (size_t)ldc};
    sk_range(SK_F32, 0, &p, 0, (size_t)N, NULL);
}

/* Does our kernel compute an nt product of this kind with M rows, and
 * which one? (Else oneDNN, directly or on converted blocks.) */
static int sk_choose(const whale_gemm *g, int kind, int M, sk_kind *k, int *portable) {
    const whale_gemm_path path = g->path;
    const int auto_own = path == WHALE_GEMM_AUTO && M <= WHALE_GEMM_OWN_MAX_M_NT;
    *portable = path == WHALE_GEMM_OWN_PORTABLE;
    switch (kind) {
    case KIND_NT: *k = SK_F32; *portable = 0; return auto_own || own_path(path);
    case KIND_NT_BF16: *k = have_bf16() || *portable || !have_avx2() ? SK_BF16 : SK_BF16_FMA; break;
    case KIND_NT_F16: *k = SK_F16; break;
    case KIND_NT_Q8: *k = have_bf16() && whale_cpu_has_vbmi() && !*portable ? SK_Q8 : SK_I8; break;
    default: return 0;
    }
    if ((*k == SK_F16 || *k == SK_I8)) *portable |= !have_avx2();
    if (*k == SK_BF16) *portable |= !have_bf16();
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
static whale_code own_nt_run(whale_gemm *g, const gemm_call *c, int n, sk_kind k, int portable,
                             whale_err *err) {
    sk_part parts[SK_PARTS_MAX];
    size_t need = 0;
    for (int i = 0; i < n; i++)
        if (!i || c[i].A != c[i - 1].A || c[i].s.lda != c[i - 1].s.lda || c[i].s.M != c[i - 1].s.M)
            need += (size_t)c[i].s.M * sk_a_len(k, c[i].s.K);
    whale_code rc = need ? scratch_reserve(&g->sa, need, sk_a_size(k), c, err) : WHALE_OK;
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
/* ------------------------------------------------------------ converted blocks */

/* How gemm_converted brings an operand block into the inner product's type. */
typedef enum {
    CV_NONE = 0,  /* used in place: already the inner type (bf16 B of nn_bf16) */
    CV_F32_BF16,  /* f32 -> bf16, nearest even */
    CV_F32_BF16R, /* f32 -> f32 rounded to bf16 */
    CV_F32_F16R,  /* f32 -> f32 rounded to fp16 */
    CV_BF16_F32,  /* bf16 -> f32, exact */
    CV_F16_F32,   /* fp16 -> f32, exact */
    CV_I8_BF16,   /* int8 -> bf16, exact */
    CV_I8_F32,    /* int8 -> f32, exact */
    CV_F32S_BF16, /* f32 times a per-column scale (in f32) -> bf16, nearest even */
    CV_F32S_BF16R /* the same, kept as f32 */
} conv;

static size_t conv_src_size(conv cv, size_t inner_size) {
    switch (cv) {
    case CV_NONE: return inner_size;
    case CV_BF16_F32:
    case CV_F16_F32: return 2;
    case CV_I8_BF16:
    case CV_I8_F32: return 1;
    default: return 4;
    }
}

static size_t conv_dst_size(conv cv) {
    return cv == CV_NONE ? 0 : cv == CV_F32_BF16 || cv == CV_I8_BF16 || cv == CV_F32S_BF16 ? 2 : 4;
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* The whole vectors of i8_to_bf16_rows; returns how many values it did. */
static size_t i8_to_bf16_avx512(uint16_t *dst, const int8_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* exact in fp32, so the top half of the fp32 pattern is the bf16 */
        const __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        const __m512i f = _mm512_castps_si512(_mm512_cvtepi32_ps(b));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(f, 16)));
    }
    return i;
}
WHALE_TARGET_END
#endif

static void i8_to_bf16_rows(uint16_t *dst, const int8_t *src, size_t n) {
    size_t i = 0;
#if WHALE_X86
    if (have_narrow()) i = i8_to_bf16_avx512(dst, src, n);
#endif
    for (; i < n; i++) dst[i] = whale_float_to_bf16((float)src[i]);
}

static void i8_to_f32_rows(float *dst, const int8_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

/* dst[i] = src[i] * scale[i] (one fp32 product) rounded to bf16, nearest
 * even (as bf16 bits, or with keep_f32 as the f32 value). */
static void scaled_to_bf16_rows(void *dst, const float *src, const float *scale, size_t n,
                                int keep_f32) {
    enum { STEP = 256 };
    float t[STEP];
    for (size_t i = 0; i < n; i += STEP) {
        const size_t len = n - i < STEP ? n - i : STEP;
        for (size_t j = 0; j < len; j++) t[j] = src[i + j] * scale[i + j];
        if (keep_f32) whale_round_bf16_rows((float *)dst + i, t, len);
        else whale_f32_to_bf16_rows((uint16_t *)dst + i, t, len);
    }
}

/* rows x cols elements from src (row stride lds elements) into dst (row
 * stride ldd), converted; scale: the per-column factors of CV_F32S_*. */
static void convert_block(conv cv, void *dst, size_t ldd, const void *src, size_t lds, int rows,
                          int cols, const float *scale) {
    const size_t ss = conv_src_size(cv, 0), ds = conv_dst_size(cv), n = (size_t)cols;
    const int par = (double)rows * cols >= OWN_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < rows; r++) {
        const void *s = (const char *)src + (size_t)r * lds * ss;
        void *d = (char *)dst + (size_t)r * ldd * ds;
        switch (cv) {
        case CV_F32_BF16: whale_f32_to_bf16_rows(d, s, n); break;
        case CV_F32_BF16R: whale_round_bf16_rows(d, s, n); break;
        case CV_F32_F16R: whale_round_f16_rows(d, s, n); break;
        case CV_BF16_F32: whale_bf16_to_f32(d, s, n); break;
        case CV_F16_F32: whale_f16_to_f32(d, s, n); break;
        case CV_I8_BF16: i8_to_bf16_rows(d, s, n); break;
        case CV_I8_F32: i8_to_f32_rows(d, s, n); break;
        case CV_F32S_BF16: scaled_to_bf16_rows(d, s, scale, n, 0); break;
        case CV_F32S_BF16R: scaled_to_bf16_rows(d, s, scale, n, 1); break;
        case CV_NONE: break;
        }
    }
}

/* C[m, n] = scale[n] * C[m, n], or C[m, n] += scale[n] * T[m, n]. */
static void scale_cols(float *C, size_t ldc, const float *T, size_t ldt, int rows, int cols,
                       const float *scale, int acc) {
    const int par = (double)rows * cols >= OWN_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int m = 0; m < rows; m++) {
        float *c = C + (size_t)m * ldc;
        const float *t = T + (size_t)m * ldt;
        if (acc)
            for (int n = 0; n < cols; n++) c[n] += scale[n] * t[n];
        else
            for (int n = 0; n < cols; n++) c[n] *= scale[n];
    }
}

static whale_code gemm_f32(whale_gemm *g, const gemm_call *c, whale_gemm_path path,
                           whale_err *err);

/* Does oneDNN compute bf16 products at the active tier? oneDNN 2.6 has
 * bf16 matmul from AVX-512 (avx512_core) up; below, every bf16 product is
 * an f32 one on blocks of its operands widened exactly (rounded first where
 * they come in fp32): the same products, summed in another order, and bf16
 * subnormals kept. */
static int dnnl_bf16_ok; /* set with oneDNN's cap (whale_gemm_new): it runs at avx512_core or above */
static int dnnl_has_bf16(void) { return dnnl_bf16_ok && whale_isa_at_least(WHALE_ISA_AVX512); }

/* The path of the f32 products standing in for bf16 ones: forced own
 * kernels stay forced, the rest follows the caller's choice. */
static whale_gemm_path f32_standin(whale_gemm_path p) { return own_path(p) ? WHALE_GEMM_OWN : p; }

/* Where exact-shape primitives stop paying, by tier (bench_gemm --sweep,
 * --sweep-bf16 and --moe; the figures are in docs/architecture.md: Zen 4
 * for avx512_bf16 and the tiers below, an AMX Xeon for amx).
 * Below AVX-512 the bf16 products are f32 ones (dnnl_has_bf16), so only
 * the f32 rule applies there. */
static const whale_gemm_rules tier_rules[WHALE_ISA_COUNT] = {
    [WHALE_ISA_BASE] = {256, 256, 64},
    [WHALE_ISA_AVX2] = {256, 256, 64},
    [WHALE_ISA_AVX512] = {256, 256, 64},
    [WHALE_ISA_AVX512_BF16] = {256, 256, 64},
    [WHALE_ISA_AMX] = {256, 4096, 64},
};

const whale_gemm_rules *whale_gemm_rules_for(whale_isa t) {
    return &tier_rules[(unsigned)t < WHALE_ISA_COUNT ? t : WHALE_ISA_BASE];
}

static const whale_gemm_rules *rules(void) { return whale_gemm_rules_for(whale_isa_active()); }

/* The oneDNN choice for bf16 operands under WHALE_GEMM_AUTO. */
static whale_gemm_path bf16_auto(int kind, int M) {
    if (kind == KIND_NT_BF16)
        return M < rules()->bf16_exact_below_m_nt ? WHALE_GEMM_DNNL_EXACT : WHALE_GEMM_DNNL_RUNTIME;
    return M < rules()->bf16_exact_below_m_nn ? WHALE_GEMM_DNNL_EXACT : WHALE_GEMM_DNNL_RUNTIME;
}

/* One block product of gemm_converted. */
static whale_code inner_run(whale_gemm *g, const gemm_call *d, whale_gemm_path path,
                            whale_err *err) {
    if (!is_bf16_kind(d->s.kind)) return gemm_f32(g, d, path, err);
    if (path != WHALE_GEMM_DNNL_EXACT && path != WHALE_GEMM_DNNL_RUNTIME)
        path = bf16_auto(d->s.kind, d->s.M);
    return dnnl_run(g, d, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* Blocks of gemm_converted: at most this many rows of C and columns of C
 * per block (inner products this size run at full speed), and as much of
 * K as fits the scratch bound with them (K itself in every product of the
 * models: >= 1024 deep blocks even at the largest rows and columns). */
#define CONV_BLOCK_MN 2048
#define CONV_SCRATCH_BYTES ((size_t)16 << 20)

/* The product c computed as inner-kind products (f32 or bf16 operands) of
 * converted blocks: A via ca, B via cb (CV_NONE: used in place). Loops over
 * column blocks, row blocks, then K blocks accumulating into C; a converted
 * block is kept while the next block needs the same one. nt_q8: the inner
 * products give the unscaled sums (into C, or into the sc scratch with
 * accumulate), scaled per column at the end of each block. tag: prefix of
 * the implementation name (NULL: the inner one alone). */
static whale_code gemm_converted(whale_gemm *g, const gemm_call *c, int inner,
                                 whale_gemm_path path, conv ca, conv cb, const char *tag,
                                 whale_err *err) {
    const gemm_key *s = &c->s;
    const int L = layout(s->kind), M = s->M, N = s->N, K = s->K;
    const int q8 = s->kind == KIND_NT_Q8, nnq8 = s->kind == KIND_NN_Q8;
    const size_t in_size = is_bf16_kind(inner) ? 2 : 4;
    const size_t sa_src = conv_src_size(ca, in_size), sb_src = conv_src_size(cb, in_size);
    const int blk = g->block_mn > 0 ? g->block_mn : CONV_BLOCK_MN;
    const size_t budget = g->block_bytes ? g->block_bytes : CONV_SCRATCH_BYTES;
    const int mb = M < blk ? M : blk, nb = N < blk ? N : blk;
    const size_t per_k = (size_t)mb * conv_dst_size(ca) + (size_t)nb * conv_dst_size(cb);
    int kb = K;
    if (per_k && (size_t)K * per_k > budget) kb = budget / per_k ? (int)(budget / per_k) : 1;
    whale_code rc = WHALE_OK;
    if (ca) rc = scratch_reserve(&g->sa, (size_t)mb * kb, conv_dst_size(ca), c, err);
    if (!rc && cb) rc = scratch_reserve(&g->sb, (size_t)nb * kb, conv_dst_size(cb), c, err);
    if (!rc && q8 && s->acc) rc = scratch_reserve(&g->sc, (size_t)mb * nb, sizeof(float), c, err);
    if (rc) return rc;
    const char *A = c->A, *B = c->B;
    int a_m = -1, a_k = -1, b_n = -1, b_k = -1; /* blocks now in scratch */
    for (int n0 = 0; n0 < N; n0 += nb) {
        const int nn = N - n0 < nb ? N - n0 : nb;
        for (int m0 = 0; m0 < M; m0 += mb) {
            const int mm = M - m0 < mb ? M - m0 : mb;
            float *Cb = c->C + (size_t)m0 * s->ldc + n0;
            float *T = q8 && s->acc ? g->sc.p : Cb; /* where the inner sums go */
            const int ldt = q8 && s->acc ? nn : s->ldc;
            for (int k0 = 0; k0 < K; k0 += kb) {
                const int kk = K - k0 < kb ? K - k0 : kb;
                /* the A block as stored: [mm, kk], or [kk, mm] for tn */
                const int a_rows = L == KIND_TN ? kk : mm, a_cols = L == KIND_TN ? mm : kk;
                const size_t a_off = L == KIND_TN ? (size_t)k0 * s->lda + m0
                                                  : (size_t)m0 * s->lda + k0;
                const void *Ab = A + a_off * sa_src;
                int ldab = s->lda;
                if (ca) {
                    if (a_m != m0 || a_k != k0) /* nn_q8: A's columns k carry B's row scales */
                        convert_block(ca, g->sa.p, (size_t)a_cols, Ab, (size_t)s->lda, a_rows,
                                      a_cols, nnq8 ? c->scale + k0 : NULL);
                    a_m = m0;
                    a_k = k0;
                    Ab = g->sa.p;
                    ldab = a_cols;
                }
                /* the B block as stored: [nn, kk] for nt, [kk, nn] otherwise */
                const int b_rows = L == KIND_NT ? nn : kk, b_cols = L == KIND_NT ? kk : nn;
                const size_t b_off = L == KIND_NT ? (size_t)n0 * s->ldb + k0
                                                  : (size_t)k0 * s->ldb + n0;
                const void *Bb = B + b_off * sb_src;
                int ldbb = s->ldb;
                if (cb) {
                    if (b_n != n0 || b_k != k0)
                        convert_block(cb, g->sb.p, (size_t)b_cols, Bb, (size_t)s->ldb, b_rows,
                                      b_cols, NULL);
                    b_n = n0;
                    b_k = k0;
                    Bb = g->sb.p;
                    ldbb = b_cols;
                }
                const int acc = k0 > 0 || (s->acc && !q8);
                gemm_call d = {{inner, acc, mm, nn, kk, ldab, ldbb, ldt}, Ab, Bb, T, NULL};
                rc = inner_run(g, &d, path, err);
                if (rc) return rc;
            }
            if (q8) scale_cols(Cb, (size_t)s->ldc, T, (size_t)ldt, mm, nn, c->scale + n0, s->acc);
        }
    }
    if (tag) {
        /* "tag+inner", cut to the buffer */
        char inner_impl[sizeof g->last_impl], *d = g->last_impl;
        memcpy(inner_impl, g->last_impl, sizeof inner_impl);
        const char *parts[3] = {tag, "+", inner_impl};
        for (int i = 0; i < 3; i++)
            for (const char *p = parts[i]; *p && d < g->last_impl + sizeof g->last_impl - 1; p++)
                *d++ = *p;
        *d = 0;
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ per-kind routing */


/* A bf16 nt product, already validated (M, N, K > 0). */
static whale_code gemm_bf16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const gemm_key *s = &c->s;
    whale_gemm_path path = g->path;
    if (path == WHALE_GEMM_AUTO)
        path = s->M <= WHALE_GEMM_OWN_MAX_M_NT ? WHALE_GEMM_OWN : bf16_auto(KIND_NT_BF16, s->M);
    if (own_path(path)) {
        sk_kind k;
        int portable;
        sk_choose(g, KIND_NT_BF16, s->M, &k, &portable);
        return own_nt_run(g, c, 1, k, portable, err);
    }
    if (!dnnl_has_bf16())
        return gemm_converted(g, c, KIND_NT, g->path, CV_F32_BF16R, CV_BF16_F32, "cvt_bf16", err);
    /* oneDNN takes A in bf16: round it into the dense scratch first */
    const size_t K = (size_t)s->K;
    whale_code rc = scratch_reserve(&g->sa, (size_t)s->M * K, sizeof(uint16_t), c, err);
    if (rc) return rc;
    uint16_t *A16 = g->sa.p;
    const float *A = c->A;
    const int M = s->M;
    const size_t lda = (size_t)s->lda;
    const int par = (double)M * K >= OWN_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int m = 0; m < M; m++) whale_f32_to_bf16_rows(A16 + m * K, A + m * lda, K);
    gemm_call d = *c;
    d.s.lda = s->K;
    d.A = A16;
    return dnnl_run(g, &d, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* nt with fp16 weights: our kernel for few rows, else f32 oneDNN on blocks
 * of W widened to f32 and A rounded to fp16 (values kept as f32). */
static whale_code gemm_nt_f16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    sk_kind k;
    int portable;
    if (sk_choose(g, KIND_NT_F16, c->s.M, &k, &portable)) return own_nt_run(g, c, 1, k, portable, err);
    return gemm_converted(g, c, KIND_NT, g->path, CV_F32_F16R, CV_F16_F32, "cvt_f16", err);
}

/* nt with int8 weights: our kernel for few rows (the vdpbf16ps one with
 * AVX512_BF16 + VBMI, else fp32 FMAs), else bf16 oneDNN on blocks of W
 * converted exactly to bf16, then the scales. */
static whale_code gemm_nt_q8(whale_gemm *g, const gemm_call *c, whale_err *err) {
    sk_kind k;
    int portable;
    if (sk_choose(g, KIND_NT_Q8, c->s.M, &k, &portable)) return own_nt_run(g, c, 1, k, portable, err);
    if (!dnnl_has_bf16())
        return gemm_converted(g, c, KIND_NT, g->path, CV_F32_BF16R, CV_I8_F32, "cvt_q8", err);
    return gemm_converted(g, c, KIND_NT_BF16, g->path, CV_F32_BF16, CV_I8_BF16, "cvt_q8", err);
}

/* nn with int8 B and B's row scales: oneDNN bf16 on blocks of A times the
 * scales rounded to bf16 and of B converted exactly to bf16; forced OWN:
 * our f32 kernels on the same values kept as f32. */
static whale_code gemm_nn_q8(whale_gemm *g, const gemm_call *c, whale_err *err) {
    if (own_path(g->path) || !dnnl_has_bf16())
        return gemm_converted(g, c, KIND_NN, f32_standin(g->path), CV_F32S_BF16R, CV_I8_F32,
                              "cvt_q8", err);
    return gemm_converted(g, c, KIND_NN_BF16, g->path, CV_F32S_BF16, CV_I8_BF16, "cvt_q8", err);
}

/* nn / tn with bf16 operands: oneDNN bf16 on A (and B for tn) rounded to
 * bf16 in blocks; forced OWN: our f32 kernels on the operands rounded to
 * bf16 and kept as f32 (the same products, summed in another order). */
static whale_code gemm_nn_tn_bf16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const int L = layout(c->s.kind);
    if (own_path(g->path) || !dnnl_has_bf16())
        return gemm_converted(g, c, L, f32_standin(g->path), CV_F32_BF16R,
                              L == KIND_NN ? CV_BF16_F32 : CV_F32_BF16R, "cvt_bf16", err);
    return gemm_converted(g, c, c->s.kind, g->path, CV_F32_BF16,
                          L == KIND_NN ? CV_NONE : CV_F32_BF16, NULL, err);
}

/* nn / tn with both operands already bf16: oneDNN on them as they are (no
 * conversion, no blocks; the shape rules of nn_bf16 / tn_bf16). Forced OWN:
 * our f32 kernels on blocks widened to f32 (exactly). */
static whale_code gemm_b16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const int L = layout(c->s.kind);
    if (own_path(g->path) || !dnnl_has_bf16())
        return gemm_converted(g, c, L, f32_standin(g->path), CV_BF16_F32, CV_BF16_F32, "cvt_bf16",
                              err);
    gemm_call d = *c;
    d.s.kind = L == KIND_NN ? KIND_NN_BF16 : KIND_TN_BF16;
    const whale_gemm_path path = g->path == WHALE_GEMM_AUTO ? bf16_auto(d.s.kind, c->s.M) : g->path;
    return dnnl_run(g, &d, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* nn / tn with fp16 operands: the f32 products (with their own routing) on
 * blocks rounded to fp16 or widened from fp16. */
static whale_code gemm_nn_tn_f16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const int L = layout(c->s.kind);
    const whale_gemm_path path = own_path(g->path) ? WHALE_GEMM_OWN : g->path;
    return gemm_converted(g, c, L, path, CV_F32_F16R, L == KIND_NN ? CV_F16_F32 : CV_F32_F16R,
                          "cvt_f16", err);
}

/* ------------------------------------------------------------ dispatch */

/* An f32 product, already validated (M, N, K > 0). */
static whale_code gemm_f32(whale_gemm *g, const gemm_call *c, whale_gemm_path path,
                           whale_err *err) {
    const gemm_key *s = &c->s;
    if (path == WHALE_GEMM_OWN_PORTABLE) path = WHALE_GEMM_OWN;
    if (path == WHALE_GEMM_AUTO) {
        if (s->kind == KIND_NT)
            path = s->M <= WHALE_GEMM_OWN_MAX_M_NT        ? WHALE_GEMM_OWN
                   : s->M < rules()->exact_below_m_nt ? WHALE_GEMM_DNNL_EXACT
                                                        : WHALE_GEMM_DNNL_RUNTIME;
        else
            path = s->M <= WHALE_GEMM_OWN_MAX_M_NN ? WHALE_GEMM_OWN : WHALE_GEMM_DNNL_RUNTIME;
    }
    if (path == WHALE_GEMM_OWN) {
        if (s->kind == KIND_NT) return own_nt_run(g, c, 1, SK_F32, 0, err);
        own_nn_tn(c);
        snprintf(g->last_impl, sizeof g->last_impl, "whale:skinny_%s", kind_names[s->kind]);
        g->stats.own_calls++;
        return WHALE_OK;
    }
    return dnnl_run(g, c, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* Are c's sizes, strides and pointers consistent? */
static whale_code gemm_check(const whale_gemm *g, const gemm_call *c, whale_err *err) {
    const gemm_key *s = &c->s;
    const char *kn = kind_names[s->kind];
    if (!g) return whale_errf(err, WHALE_ERR_ARG, "gemm %s: no whale_gemm object", kn);
    if (s->M < 0 || s->N < 0 || s->K < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: negative size M=%d N=%d K=%d", kn, s->M,
                          s->N, s->K);
    /* Row lengths the leading dimensions must cover. */
    const int L = layout(s->kind);
    const int a_row = L == KIND_TN ? s->M : s->K;
    const int is_nt = L == KIND_NT;
    const int b_row = is_nt ? s->K : s->N;
    const char *b_name = is_nt ? "ldw" : "ldb";
    if (s->lda < a_row || s->lda < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: lda=%d smaller than the row of A (%d)",
                          kn, s->lda, a_row);
    if (s->ldb < b_row || s->ldb < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: %s=%d smaller than the row of %s (%d)",
                          kn, b_name, s->ldb, is_nt ? "W" : "B", b_row);
    if (s->ldc < s->N)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: ldc=%d smaller than N=%d", kn, s->ldc,
                          s->N);
    if (s->M == 0 || s->N == 0) return WHALE_OK;
    if (!c->C) return whale_errf(err, WHALE_ERR_ARG, "gemm %s: C is NULL", kn);
    if (s->K == 0) return WHALE_OK;
    if (!c->A || !c->B)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: %s is NULL", kn,
                          !c->A ? "A" : is_nt ? "W" : "B");
    if ((s->kind == KIND_NT_Q8 || s->kind == KIND_NN_Q8) && !c->scale)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: scale is NULL", kn);
    return WHALE_OK;
}

/* A checked product with nothing to multiply (M, N or K zero) is done here:
 * K = 0 is an empty sum. */
static int gemm_trivial(whale_gemm *g, const gemm_call *c) {
    const gemm_key *s = &c->s;
    if (s->M == 0 || s->N == 0) return 1;
    if (s->K) return 0;
    if (!s->acc)
        for (int m = 0; m < s->M; m++) memset(c->C + (size_t)m * s->ldc, 0, (size_t)s->N * sizeof(float));
    snprintf(g->last_impl, sizeof g->last_impl, "whale:empty");
    return 1;
}

static whale_code gemm(whale_gemm *g, const gemm_call *c, whale_err *err) {
    whale_code rc = gemm_check(g, c, err);
    if (rc || gemm_trivial(g, c)) return rc;
    switch (c->s.kind) {
    case KIND_NT_BF16: return gemm_bf16(g, c, err);
    case KIND_NN_BF16:
    case KIND_TN_BF16: return gemm_nn_tn_bf16(g, c, err);
    case KIND_NT_F16: return gemm_nt_f16(g, c, err);
    case KIND_NN_F16:
    case KIND_TN_F16: return gemm_nn_tn_f16(g, c, err);
    case KIND_NT_Q8: return gemm_nt_q8(g, c, err);
    case KIND_NN_Q8: return gemm_nn_q8(g, c, err);
    case KIND_NN_B16:
    case KIND_TN_B16: return gemm_b16(g, c, err);
    default: return gemm_f32(g, c, g->path, err);
    }
}

static whale_code gemm_kind(whale_gemm *g, int kind, int M, int N, int K, const void *A, int lda,
                            const void *B, int ldb, float *C, int ldc, int accumulate,
                            whale_err *err) {
    gemm_call c = {{kind, accumulate ? 1 : 0, M, N, K, lda, ldb, ldc}, A, B, C, NULL};
    return gemm(g, &c, err);
}

whale_code whale_gemm_nt(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *W, int ldw, float *C, int ldc, int accumulate,
                         whale_err *err) {
    return gemm_kind(g, KIND_NT, M, N, K, A, lda, W, ldw, C, ldc, accumulate, err);
}

whale_code whale_gemm_nn(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, int accumulate,
                         whale_err *err) {
    return gemm_kind(g, KIND_NN, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_tn(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, int accumulate,
                         whale_err *err) {
    return gemm_kind(g, KIND_TN, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_nt_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const uint16_t *W, int ldw, float *C, int ldc, int accumulate,
                              whale_err *err) {
    return gemm_kind(g, KIND_NT_BF16, M, N, K, A, lda, W, ldw, C, ldc, accumulate, err);
}

whale_code whale_gemm_nn_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                              whale_err *err) {
    return gemm_kind(g, KIND_NN_BF16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_tn_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const float *B, int ldb, float *C, int ldc, int accumulate,
                              whale_err *err) {
    return gemm_kind(g, KIND_TN_BF16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_nn_b16(whale_gemm *g, int M, int N, int K, const uint16_t *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_NN_B16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_tn_b16(whale_gemm *g, int M, int N, int K, const uint16_t *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_TN_B16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_nt_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const uint16_t *W, int ldw, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_NT_F16, M, N, K, A, lda, W, ldw, C, ldc, accumulate, err);
}

whale_code whale_gemm_nn_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_NN_F16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_tn_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const float *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err) {
    return gemm_kind(g, KIND_TN_F16, M, N, K, A, lda, B, ldb, C, ldc, accumulate, err);
}

whale_code whale_gemm_nt_q8(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                            const int8_t *W, int ldw, const float *scale, float *C, int ldc,
                            int accumulate, whale_err *err) {
    gemm_call c = {{KIND_NT_Q8, accumulate ? 1 : 0, M, N, K, lda, ldw, ldc}, A, W, C, scale};
    return gemm(g, &c, err);
}

/* Part p of a whale_gemm_nt_parts call as a gemm_call. */
static gemm_call part_call(int kind, int K, int accumulate, const whale_nt_part *p) {
    return (gemm_call){{kind, accumulate ? 1 : 0, p->M, p->N, K, p->lda, p->ldw, p->ldc}, p->A, p->W, p->C, p->scale};
}

whale_code whale_gemm_nt_parts(whale_gemm *g, whale_dtype wtype, int K, int n, const whale_nt_part *parts,
                               int accumulate, whale_err *err) {
    const int kind = wtype == WHALE_F32    ? KIND_NT
                     : wtype == WHALE_BF16 ? KIND_NT_BF16
                     : wtype == WHALE_F16  ? KIND_NT_F16
                     : wtype == WHALE_I8   ? KIND_NT_Q8
                                           : -1;
    if (kind < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm nt_parts: no product for %s weights", whale_dtype_name(wtype));
    if (n < 0 || (n && !parts))
        return whale_errf(err, WHALE_ERR_ARG, "gemm nt_parts: %d parts%s", n, n > 0 ? " at NULL" : "");
    for (int i = 0; i < n; i++) { /* all checked before any is computed */
        const gemm_call c = part_call(kind, K, accumulate, &parts[i]);
        whale_code rc = gemm_check(g, &c, err);
        if (rc) return rc;
    }
    gemm_call own[SK_PARTS_MAX];
    int n_own = 0, portable = 0;
    sk_kind k = SK_F32;
    for (int i = 0; i < n; i++) {
        const gemm_call c = part_call(kind, K, accumulate, &parts[i]);
        whale_code rc = WHALE_OK;
        if (gemm_trivial(g, &c)) continue;
        if (n_own < SK_PARTS_MAX && sk_choose(g, kind, c.s.M, &k, &portable)) own[n_own++] = c;
        else if ((rc = gemm(g, &c, err))) return rc;
    }
    return n_own ? own_nt_run(g, own, n_own, k, portable, err) : WHALE_OK;
}

whale_code whale_gemm_nn_q8(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                            const int8_t *B, int ldb, const float *scale, float *C, int ldc,
                            int accumulate, whale_err *err) {
    gemm_call c = {{KIND_NN_Q8, accumulate ? 1 : 0, M, N, K, lda, ldb, ldc}, A, B, C, scale};
    return gemm(g, &c, err);
}

/* ------------------------------------------------------------ int8 weights */

void whale_quantize_q8_rows(int8_t *q, float *scale, const float *W, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    const size_t row_bytes = (size_t)cols;
    const int par = (double)rows * cols >= OWN_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < rows; r++) {
        const float *w = W + (size_t)r * cols;
        int8_t *qr = q + (size_t)r * cols;
        float amax = 0;
        int finite = 1;
        for (int i = 0; i < cols; i++) {
            const float a = fabsf(w[i]);
            if (!(a <= FLT_MAX)) finite = 0; /* inf or NaN */
            else if (a > amax) amax = a;
        }
        const float s = amax / 127.0f;
        if (!finite || s == 0) { /* see gemm.h: NaN scale, or an (all but) zero row */
            memset(qr, 0, row_bytes);
            scale[r] = finite ? 0.0f : NAN;
            continue;
        }
        scale[r] = s;
        for (int i = 0; i < cols; i++) {
            float v = nearbyintf(w[i] / s); /* the default rounding mode: ties to even */
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            qr[i] = (int8_t)v;
        }
    }
}

/* ------------------------------------------------------------ object */

/* oneDNN's instruction cap, set once before its first primitive: the
 * active tier's instructions, when WHALE_ISA caps them below what the
 * processor has. oneDNN's own DNNL_MAX_CPU_ISA, when set, is left as the
 * user set it. Either way what oneDNN then really uses decides whether it
 * has bf16 products (dnnl_bf16_ok). */
static pthread_once_t dnnl_isa_once = PTHREAD_ONCE_INIT;
static int dnnl_isa_refused; /* oneDNN runs above the cap */

/* Is oneDNN ISA a at most b? (The enum values are nested bit sets.) */
static int dnnl_isa_within(dnnl_cpu_isa_t a, dnnl_cpu_isa_t b) { return ((unsigned)a & ~(unsigned)b) == 0; }

static void dnnl_isa_cap(void) {
    static const dnnl_cpu_isa_t cap[WHALE_ISA_COUNT] = {
        dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core,
        dnnl_cpu_isa_avx512_core_bf16, dnnl_cpu_isa_avx512_core_amx};
    const whale_isa t = whale_isa_active();
    const char *env = getenv("DNNL_MAX_CPU_ISA");
    if (t < whale_isa_detected() && !(env && *env)) (void)dnnl_set_max_cpu_isa(cap[t]);
    const dnnl_cpu_isa_t eff = dnnl_get_effective_cpu_isa();
    dnnl_isa_refused = t < whale_isa_detected() && !dnnl_isa_within(eff, cap[t]);
    dnnl_bf16_ok = dnnl_isa_within(dnnl_cpu_isa_avx512_core, eff);
}

whale_code whale_gemm_new(whale_gemm **out, whale_err *err) {
    *out = NULL;
    whale_code rc = whale_isa_init(err);
    if (rc) return rc;
    pthread_once(&dnnl_isa_once, dnnl_isa_cap);
    if (dnnl_isa_refused)
        return whale_errf(err, WHALE_ERR_INTERNAL,
                          "gemm: oneDNN runs above the instruction cap WHALE_ISA=%s (it was used before this "
                          "library, or DNNL_MAX_CPU_ISA asks for more)",
                          whale_isa_name(whale_isa_active()));
    whale_gemm *g = calloc(1, sizeof *g);
    if (!g) return whale_errf(err, WHALE_ERR_NOMEM, "gemm: cannot allocate the context");
    dnnl_status_t st = dnnl_engine_create(&g->engine, dnnl_cpu, 0);
    if (st != dnnl_success) {
        free(g);
        return whale_errf(err, WHALE_ERR_INTERNAL, "gemm: oneDNN engine_create failed: %s",
                          dnnl_status2str(st));
    }
    st = dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        dnnl_engine_destroy(g->engine);
        free(g);
        return whale_errf(err, WHALE_ERR_INTERNAL, "gemm: oneDNN stream_create failed: %s",
                          dnnl_status2str(st));
    }
    snprintf(g->last_impl, sizeof g->last_impl, "none");
    *out = g;
    return WHALE_OK;
}

void whale_gemm_free(whale_gemm *g) {
    if (!g) return;
    for (int i = 0; i < WHALE_GEMM_CACHE_CAP; i++)
        if (g->cache[i].used) entry_clear(&g->cache[i]);
    free(g->sa.p);
    free(g->sb.p);
    free(g->sc.p);
    dnnl_stream_destroy(g->stream);
    dnnl_engine_destroy(g->engine);
    free(g);
}

void whale_gemm_set_path(whale_gemm *g, whale_gemm_path path) { g->path = path; }

void whale_gemm_set_block_limits(whale_gemm *g, int max_mn, size_t scratch_bytes) {
    g->block_mn = max_mn > 0 ? max_mn : 0;
    g->block_bytes = scratch_bytes;
}

const char *whale_gemm_last_impl(const whale_gemm *g) { return g->last_impl; }

void whale_gemm_get_stats(const whale_gemm *g, whale_gemm_stats *st) {
    *st = g->stats;
    st->cached = 0;
    for (int i = 0; i < WHALE_GEMM_CACHE_CAP; i++) st->cached += g->cache[i].used;
}

/* ------------------------------------------------------------ measurements */

/* Best GFLOP/s of an nt product with weights of type dt (F32, BF16, F16,
 * I8). */
double whale_gemm_measure_gflops_dtype(whale_gemm *g, whale_dtype dt, int M, int N, int K,
                                       int reps) {
    if (!g || M <= 0 || N <= 0 || K <= 0) return 0;
    if (dt != WHALE_F32 && dt != WHALE_BF16 && dt != WHALE_F16 && dt != WHALE_I8) return 0;
    if (reps < 1) reps = 1;
    size_t na, nw, nc;
    if (!whale_mul_size((size_t)M, (size_t)K, &na) || !whale_mul_size((size_t)N, (size_t)K, &nw) ||
        !whale_mul_size((size_t)M, (size_t)N, &nc) || na > SIZE_MAX / 4 || nw > SIZE_MAX / 4 ||
        nc > SIZE_MAX / 4)
        return 0;
    float *A = whale_alloc(na * sizeof(float));
    float *W = whale_alloc(nw * sizeof(float));
    float *C = whale_alloc(nc * sizeof(float));
    uint16_t *W16 = dt == WHALE_BF16 || dt == WHALE_F16 ? whale_alloc(nw * sizeof(uint16_t)) : NULL;
    int8_t *W8 = dt == WHALE_I8 ? whale_alloc(nw) : NULL;
    float *scale = dt == WHALE_I8 ? whale_alloc((size_t)N * sizeof(float)) : NULL;
    double best = 0;
    const int have = dt == WHALE_F32 ? 1 : dt == WHALE_I8 ? W8 && scale : W16 != NULL;
    if (A && W && C && have) {
        /* small exact values: no denormals or overflow to skew timing */
        for (size_t i = 0; i < na; i++) A[i] = (float)((int)(i % 17) - 8) * 0.0625f;
        for (size_t i = 0; i < nw; i++) W[i] = (float)((int)(i % 13) - 6) * 0.0625f;
        if (dt == WHALE_BF16) whale_f32_to_bf16_rows(W16, W, nw);
        if (dt == WHALE_F16) whale_f32_to_f16_rows(W16, W, nw);
        if (dt == WHALE_I8) whale_quantize_q8_rows(W8, scale, W, N, K);
        whale_err err;
        double t_best = 0;
        for (int r = -1; r < reps; r++) { /* r = -1: untimed warm-up */
            double t0 = whale_now();
            whale_code rc;
            switch (dt) {
            case WHALE_BF16: rc = whale_gemm_nt_bf16(g, M, N, K, A, K, W16, K, C, N, 0, &err); break;
            case WHALE_F16: rc = whale_gemm_nt_f16(g, M, N, K, A, K, W16, K, C, N, 0, &err); break;
            case WHALE_I8:
                rc = whale_gemm_nt_q8(g, M, N, K, A, K, W8, K, scale, C, N, 0, &err);
                break;
            default: rc = whale_gemm_nt(g, M, N, K, A, K, W, K, C, N, 0, &err); break;
            }
            if (rc) {
                t_best = 0;
                break;
            }
            double t = whale_now() - t0;
            if (r == 0 || (r > 0 && t < t_best)) t_best = t;
        }
        if (t_best > 0) best = 2.0 * M * N * (double)K / t_best * 1e-9;
    }
    free(A);
    free(W);
    free(C);
    free(W16);
    free(W8);
    free(scale);
    return best;
}

double whale_gemm_measure_gflops(whale_gemm *g, int M, int N, int K, int reps) {
    return whale_gemm_measure_gflops_dtype(g, WHALE_F32, M, N, K, reps);
}

double whale_gemm_measure_gflops_bf16(whale_gemm *g, int M, int N, int K, int reps) {
    return whale_gemm_measure_gflops_dtype(g, WHALE_BF16, M, N, K, reps);
}

/* One read pass over blocks lo..hi of READ_BLOCK floats. The vector one
 * walks four distant streams per thread, one 64-byte line of each per
 * step: the access pattern of the decode kernels (sk_range), which one
 * sequential stream per core reaches only about half of. */
#define READ_BLOCK 64
static float read_pass_c(const float *buf, long lo, long hi) {
    float s[16] = {0}; /* independent sums: a single chain would time the adds, not the reads */
    for (long b = lo; b < hi; b++)
        for (size_t i = 0; i < READ_BLOCK; i++) s[i % 16] += buf[b * READ_BLOCK + i];
    float t = 0;
    for (int i = 0; i < 16; i++) t += s[i];
    return t;
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX2)
/* read_pass_avx512's four streams with 32-byte loads, two per line */
static float read_pass_avx2(const float *buf, long lo, long hi) {
    const size_t per_block = READ_BLOCK;
    const long q = (hi - lo) / 4;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (long b = lo; b < lo + q; b++)
        for (int l = 0; l < 8; l++) {
            const float *p = buf + b * per_block + (size_t)8 * l;
            s0 = _mm256_add_ps(s0, _mm256_load_ps(p));
            s1 = _mm256_add_ps(s1, _mm256_load_ps(p + q * per_block));
            s2 = _mm256_add_ps(s2, _mm256_load_ps(p + 2 * q * per_block));
            s3 = _mm256_add_ps(s3, _mm256_load_ps(p + 3 * q * per_block));
        }
    for (long b = lo + 4 * q; b < hi; b++)
        for (int l = 0; l < 8; l++) s0 = _mm256_add_ps(s0, _mm256_load_ps(buf + b * per_block + 8 * l));
    float lane[8];
    _mm256_storeu_ps(lane, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return lane[0] + lane[1] + lane[2] + lane[3] + lane[4] + lane[5] + lane[6] + lane[7];
}
WHALE_TARGET_END

WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
static float read_pass_avx512(const float *buf, long lo, long hi) {
    const size_t per_block = READ_BLOCK;
    const long q = (hi - lo) / 4;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (long b = lo; b < lo + q; b++)
        for (int l = 0; l < 4; l++) {
            const float *p = buf + b * per_block + (size_t)16 * l;
            s0 = _mm512_add_ps(s0, _mm512_load_ps(p));
            s1 = _mm512_add_ps(s1, _mm512_load_ps(p + q * per_block));
            s2 = _mm512_add_ps(s2, _mm512_load_ps(p + 2 * q * per_block));
            s3 = _mm512_add_ps(s3, _mm512_load_ps(p + 3 * q * per_block));
        }
    for (long b = lo + 4 * q; b < hi; b++)
        for (int l = 0; l < 4; l++) s0 = _mm512_add_ps(s0, _mm512_load_ps(buf + b * per_block + 16 * l));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
WHALE_TARGET_END
#endif

double whale_measure_gemm_gflops(whale_dtype w, int M, int N, int K, int reps, whale_err *err) {
    whale_gemm *g;
    if (whale_gemm_new(&g, err)) return 0;
    double r = whale_gemm_measure_gflops_dtype(g, w, M, N, K, reps);
    whale_gemm_free(g);
    if (!r) whale_errf(err, WHALE_ERR_ARG, "cannot measure a %s product of %d x %d x %d", whale_dtype_name(w), M, N, K);
    return r;
}

double whale_measure_read_bandwidth(size_t bytes, int reps) {
    const size_t per_block = READ_BLOCK; /* floats per inner step: four 64-byte vectors */
    size_t blocks = bytes / (per_block * sizeof(float));
    if (blocks == 0) return 0;
    if (reps < 1) reps = 1;
    float *buf = whale_alloc(blocks * per_block * sizeof(float));
    if (!buf) return 0;
    const long nb = (long)blocks;
    /* First touch by the thread that later reads the same part, so pages
     * sit where they are read. */
#pragma omp parallel
    {
        const long nt = omp_get_num_threads(), id = omp_get_thread_num();
        for (long b = nb * id / nt; b < nb * (id + 1) / nt; b++)
            for (size_t i = 0; i < per_block; i++) buf[b * per_block + i] = (float)(i & 7);
    }
    double best = 0;
    for (int r = 0; r < reps; r++) {
        float total = 0;
        double t0 = whale_now();
#pragma omp parallel reduction(+ : total)
        {
            /* the same static split as the first touch above */
            const long nt = omp_get_num_threads(), id = omp_get_thread_num();
            const long lo = nb * id / nt, hi = nb * (id + 1) / nt;
#if WHALE_X86
            if (have_narrow())
                total += read_pass_avx512(buf, lo, hi);
            else if (have_avx2())
                total += read_pass_avx2(buf, lo, hi);
            else
#endif
                total += read_pass_c(buf, lo, hi);
        }
        double t = whale_now() - t0;
        volatile float sink = total; /* keeps the reads from being optimised away */
        (void)sink;
        double gbs = (double)blocks * per_block * sizeof(float) / t * 1e-9;
        if (gbs > best) best = gbs;
    }
    free(buf);
    return best;
}
