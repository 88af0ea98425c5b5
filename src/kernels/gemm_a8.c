/* W8A8 products: int8 weights, packed in panels of 16 rows
 * (whale_q8p_pack), times activations rounded to int8 in blocks of 32
 * (whale_quantize_a8_rows). gemm.h says what is computed; this file how.
 *
 * Why a second weight layout. vpdpbusd multiplies 64 unsigned bytes by 64
 * signed ones and adds each group of 4 products to one of 16 int32 lanes:
 * 64 multiply-adds per instruction, against vdpbf16ps's 32, and no
 * conversion of the weights. On row-major weights the 16 lanes would hold
 * 16 partial sums of one output, to be added across lanes and scaled per
 * block of 32, which costs more than the products. Packed, one 64-byte load
 * holds 4 consecutive k of 16 outputs, so the lanes are 16 outputs: a block
 * of 32 k is 8 vpdpbusd per (panel, activation row) into int32 sums that
 * are exact, then one conversion and one fused multiply-add by the block's
 * activation scale. The weights are stored as q + 128 (vpdpbusd wants the
 * unsigned operand there: the activations keep their sign), and the sums
 * start at -128 times the block's activation sum, which takes the 128 out
 * again, exactly.
 *
 * Register blocks: a tile is np panels (16 outputs each) by mr activation
 * rows, each with an int32 and an fp32 accumulator: np x mr <= 12, one to
 * four streams of weights (a8_np says which when). Every output is the same
 * sequence of operations whatever the tile, path or thread split. */
#include "kernels/gemm_impl.h"

#include "core/par.h"

#include <assert.h>
#include <math.h>

#define A8_PANEL 16 /* outputs per panel */
#define A8_BLOCK WHALE_A8_BLOCK
#define A8_MR 8 /* activation rows per pass over a chunk of panels */
/* From this many activation rows a run's quantisation is shared by the
 * threads of its region (a8_run); below, the calling thread does it first. */
#define A8_SHARED_PREP_ROWS 4

/* How far ahead (bytes) the VNNI kernel asks for each weight stream: as
 * NT_PREFETCH in gemm_rows.c (one load covers 64 bytes here) for tiles of
 * two or four panels side by side, four times that for a tile of one panel
 * (5 to 8 rows), whose single stream would otherwise have a quarter of the
 * reads in flight while eight rows' vpdpbusd run on each load. Xeon
 * (Sapphire Rapids class, no AMX), 2 threads, 1 KB against 4 KB
 * alternated: `bench_gemm --shape nt_a8 8 129280 320 cold` 2.43-2.45 ms
 * against 2.11-2.15, 8 x 640 x 320 cold 0.017 against 0.013-0.015; whale
 * bench nanowhale-100m int8 decode at 8 streams 1,541-2,008 tokens/s against
 * 1,949-2,156, one stream (four panels) unchanged. At 4 rows (two panels)
 * 2 KB gained nothing. */
#define A8_PREFETCH 1024
#define A8_PREFETCH_ONE_PANEL 4096

/* The kernels: plain C, AVX2, vpdpbusd (AVX512_VNNI). */
enum { A8_C = 0, A8_AVX2, A8_VNNI };

static int a8_kp(int K) { return (K + A8_BLOCK - 1) / A8_BLOCK * A8_BLOCK; }

/* The team's barrier, outside a WHALE_PARALLEL_IF body (which may not hold
 * a directive). */
static void a8_barrier(void) {
#pragma omp barrier
}

size_t whale_q8p_bytes(int N, int K) {
    if (N <= 0 || K <= 0) return 0;
    return (size_t)((N + A8_PANEL - 1) / A8_PANEL) * A8_PANEL * (size_t)a8_kp(K);
}

void whale_q8p_pack(uint8_t *dst, const int8_t *q, int ldq, int N, int K) {
    if (N <= 0 || K <= 0) return;
    const int Kp = a8_kp(K), panels = (N + A8_PANEL - 1) / A8_PANEL;
    const int par = (double)N * K >= OWN_PARALLEL_MIN_WORK * 16.0;
    WHALE_FOR_IF(par, (int p = 0; p < panels; p++), {
        uint8_t *o = dst + (size_t)p * A8_PANEL * Kp;
        for (int j = 0; j < Kp / 4; j++)
            for (int r = 0; r < A8_PANEL; r++) {
                const int n = p * A8_PANEL + r;
                for (int i = 0; i < 4; i++) {
                    const int k = 4 * j + i;
                    const int v = n < N && k < K ? q[(size_t)n * ldq + k] : 0;
                    *o++ = (uint8_t)(v + 128);
                }
            }
    });
}

/* One block of up to 32 values of a row (padded with zeros): the rule of
 * whale_quantize_q8_rows. */
static void a8_block(const float *a, int n, int8_t *o, float *d, int32_t *corr) {
    const float s = q8_row_scale(a, n);
    int sum = 0;
    memset(o, 0, A8_BLOCK);
    for (int i = 0; i < n && s > 0; i++) {
        o[i] = q8_value(a[i], s);
        sum += o[i];
    }
    *d = s;
    *corr = -128 * sum;
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* a8_block on a whole block of 32 with AVX-512: the same operations
 * (|a| max, one division per value, round to nearest even, clamp), so
 * the same values. */
static void a8_block32_avx512(const float *a, int8_t *o, float *d, int32_t *corr) {
    const __m512 x0 = _mm512_loadu_ps(a), x1 = _mm512_loadu_ps(a + 16);
    const __m512 m0 = _mm512_abs_ps(x0), m1 = _mm512_abs_ps(x1);
    /* inf or NaN anywhere: the scalar rule (it gives NaN) */
    if (_mm512_cmp_ps_mask(m0, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ) ||
        _mm512_cmp_ps_mask(m1, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ)) {
        a8_block(a, A8_BLOCK, o, d, corr);
        return;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    const float s = amax / 127.0f;
    if (s == 0) {
        a8_block(a, A8_BLOCK, o, d, corr);
        return;
    }
    const __m512 sv = _mm512_set1_ps(s), lim = _mm512_set1_ps(127.0f), nlim = _mm512_set1_ps(-127.0f);
#define A8_RND (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) /* an immediate for every compiler */
    __m512 q0 = _mm512_roundscale_ps(_mm512_div_ps(x0, sv), A8_RND);
    __m512 q1 = _mm512_roundscale_ps(_mm512_div_ps(x1, sv), A8_RND);
#undef A8_RND
    q0 = _mm512_max_ps(_mm512_min_ps(q0, lim), nlim);
    q1 = _mm512_max_ps(_mm512_min_ps(q1, lim), nlim);
    const __m512i i0 = _mm512_cvtps_epi32(q0), i1 = _mm512_cvtps_epi32(q1);
    _mm_storeu_si128((__m128i *)o, _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)(o + 16), _mm512_cvtepi32_epi8(i1));
    *d = s;
    *corr = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
}
WHALE_TARGET_END
#endif

/* Row m's nb blocks. */
static void a8_quantize_row(int K, int nb, const float *A, int8_t *aq, float *d, int32_t *corr, int wide) {
    (void)wide;
    for (int b = 0; b < nb; b++) {
        const int k0 = b * A8_BLOCK, n = K - k0 < A8_BLOCK ? K - k0 : A8_BLOCK;
#if WHALE_X86
        if (wide && n == A8_BLOCK) {
            a8_block32_avx512(A + k0, aq + k0, d + b, corr + b);
            continue;
        }
#endif
        a8_block(A + k0, n, aq + k0, d + b, corr + b);
    }
}

void whale_quantize_a8_rows(int M, int K, const float *A, int lda, int8_t *aq, int ldq, float *d,
                            int32_t *corr, int ldd) {
    if (M <= 0 || K <= 0) return;
    const int nb = a8_kp(K) / A8_BLOCK;
    const int par = (double)M * K >= OWN_PARALLEL_MIN_WORK;
    const int wide = WHALE_X86 && whale_isa_at_least(WHALE_ISA_AVX512);
    WHALE_FOR_IF(par, (int m = 0; m < M; m++), {
        a8_quantize_row(K, nb, A + (size_t)m * lda, aq + (size_t)m * ldq, d + (size_t)m * ldd,
                        corr + (size_t)m * ldd, wide);
    });
}

/* What a tile works on: the quantised rows (row after row, and for the
 * VNNI kernel also by passes: a8_prepare_row) and their block scales, the
 * panels (pstride bytes apart; output n is lane row0 + n of them), the
 * scales and C. */
typedef struct {
    int M, N, nb, row0, panels;
    const int8_t *aq, *ag;
    size_t ldq;
    const float *d;
    const int32_t *corr;
    size_t ldd;
    const uint8_t *W;
    size_t pstride;
    const float *scale;
    float *C;
    size_t ldc;
    int acc;
} a8_job;

/* The lanes [*lo, *hi) of panel p that hold outputs, the first being
 * output n0 = 16p + lo - row0. */
static void a8_lanes(const a8_job *J, int p, int *lo, int *hi) {
    const int end = J->row0 + J->N - p * A8_PANEL;
    *lo = p ? 0 : J->row0;
    *hi = end < A8_PANEL ? end : A8_PANEL;
}

/* plain C: np panels from p, mr rows from m0; the VNNI kernel's operations
 * one output at a time (exact int32 block sums, fmaf). */
static void a8_tile_c(const a8_job *J, int np, int mr, int p, int m0) {
    for (int pp = p; pp < p + np; pp++) {
        const uint8_t *w = J->W + (size_t)pp * J->pstride;
        int lo, hi;
        a8_lanes(J, pp, &lo, &hi);
        for (int m = m0; m < m0 + mr; m++) {
            const int8_t *a = J->aq + (size_t)m * J->ldq;
            const float *d = J->d + (size_t)m * J->ldd;
            const int32_t *corr = J->corr + (size_t)m * J->ldd;
            for (int r = lo; r < hi; r++) {
                float f = 0;
                for (int b = 0; b < J->nb; b++) {
                    int32_t s = corr[b];
                    const uint8_t *wb = w + (size_t)b * A8_BLOCK * A8_PANEL + (size_t)r * 4;
                    const int8_t *ab = a + b * A8_BLOCK;
                    for (int j = 0; j < A8_BLOCK / 4; j++)
                        for (int i = 0; i < 4; i++) s += (int32_t)wb[j * 64 + i] * ab[4 * j + i];
                    f = fmaf((float)s, d[b], f);
                }
                const int n = pp * A8_PANEL + r - J->row0;
                float *c = J->C + (size_t)m * J->ldc + n;
                *c = J->acc ? fmaf(f, J->scale[n], *c) : f * J->scale[n];
            }
        }
    }
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512_VNNI)
/* The results of one panel for one row: F times the scales (plus C), into
 * C. A first panel that starts inside (row0 > 0) moves its lanes down. */
static inline __attribute__((always_inline)) void a8_store(const a8_job *J, int p, int m, __m512 F) {
    int lo, hi;
    a8_lanes(J, p, &lo, &hi);
    if (!lo) {
        const int n0 = p * A8_PANEL - J->row0;
        const __mmask16 mask = (__mmask16)((1u << hi) - 1u);
        const __m512 s = _mm512_maskz_loadu_ps(mask, J->scale + n0);
        float *c = J->C + (size_t)m * J->ldc + n0;
        const __m512 out = J->acc ? _mm512_fmadd_ps(F, s, _mm512_maskz_loadu_ps(mask, c)) : _mm512_mul_ps(F, s);
        _mm512_mask_storeu_ps(c, mask, out);
        return;
    }
    const __mmask16 lanes = (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
    const __m512 s = _mm512_maskz_expandloadu_ps(lanes, J->scale);
    float *c = J->C + (size_t)m * J->ldc;
    const __m512 out = J->acc ? _mm512_fmadd_ps(F, s, _mm512_maskz_expandloadu_ps(lanes, c)) : _mm512_mul_ps(F, s);
    _mm512_mask_storeu_ps(c, (__mmask16)((1u << (hi - lo)) - 1u), _mm512_maskz_compress_ps(lanes, out));
}

/* acc + the products of w's unsigned bytes and the 4 signed bytes at x,
 * broadcast: vpdpbusd with its embedded broadcast, one micro-fused load
 * and multiply-add. gcc 12 keeps _mm512_set1_epi32 a separate
 * vpbroadcastd, and at 8 rows a tile then issues two instructions per
 * vpdpbusd, which the front end cannot feed at two vpdpbusd a cycle.
 * Xeon (Sapphire Rapids class, no AMX), alternated, best of five: one
 * thread, `bench_gemm --shape nt_a8 8 4096 320` (weights in L2) 0.056 ->
 * 0.046 ms; two threads, 8 x 129,280 x 320 from the last-level cache
 * 0.92-1.32 -> 0.99-1.12, from memory 2.28-2.70 -> 2.05-2.11; 512 x 4864
 * x 896 unchanged (9.7 against 9.9). */
static inline __attribute__((always_inline)) __m512i a8_dpbusd_bcast(__m512i acc, __m512i w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x));
    return acc;
}

static inline __attribute__((always_inline)) void a8_tile_vnni(const a8_job *J, const int np, const int mr,
                                                               int p, int m0) {
    __m512 F[4][A8_MR];
    __m512i I[4][A8_MR];
    const uint8_t *w[4];
    const int8_t *g = J->ag + (size_t)m0 * J->ldq; /* this pass's rows, by groups of 4 k */
    for (int q = 0; q < np; q++) {
        w[q] = J->W + (size_t)(p + q) * J->pstride;
        for (int m = 0; m < mr; m++) F[q][m] = _mm512_setzero_ps();
    }
    for (int b = 0; b < J->nb; b++) {
        for (int m = 0; m < mr; m++) {
            const __m512i c0 = _mm512_set1_epi32(J->corr[(size_t)(m0 + m) * J->ldd + b]);
            for (int q = 0; q < np; q++) I[q][m] = c0;
        }
        for (int j = 0; j < A8_BLOCK / 4; j++) {
            __m512i wv[4];
            for (int q = 0; q < np; q++) {
                const uint8_t *at = w[q] + (size_t)b * A8_BLOCK * A8_PANEL + j * 64;
                wv[q] = _mm512_loadu_si512(at);
                _mm_prefetch((const char *)at + (np == 1 ? A8_PREFETCH_ONE_PANEL : A8_PREFETCH), _MM_HINT_T0);
            }
            const int8_t *x = g + (size_t)(b * A8_BLOCK / 4 + j) * mr * 4; /* row m's 4 k at x + 4m */
            for (int m = 0; m < mr; m++)
                for (int q = 0; q < np; q++) I[q][m] = a8_dpbusd_bcast(I[q][m], wv[q], x + 4 * m);
        }
        for (int m = 0; m < mr; m++) {
            const __m512 dm = _mm512_set1_ps(J->d[(size_t)(m0 + m) * J->ldd + b]);
            for (int q = 0; q < np; q++) F[q][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[q][m]), dm, F[q][m]);
        }
    }
    for (int q = 0; q < np; q++)
        for (int m = 0; m < mr; m++) a8_store(J, p + q, m0 + m, F[q][m]);
}

/* The copies the passes use: np = 4, 2 or 1 panels side by side. */
static void a8_tile_vnni_rows(const a8_job *J, int np, int mr, int p, int m0) {
    assert(np == 4 ? mr <= 2 : np == 2 ? mr >= 3 && mr <= 6 : np == 1 && mr >= 1 && mr <= A8_MR);
#define A8_T(NP, MR) a8_tile_vnni(J, NP, MR, p, m0)
    if (np == 4) {
        if (mr == 1) A8_T(4, 1);
        else A8_T(4, 2);
    } else if (np == 2) switch (mr) {
        case 3: A8_T(2, 3); break;
        case 4: A8_T(2, 4); break;
        case 5: A8_T(2, 5); break;
        default: A8_T(2, 6); break;
        }
    else switch (mr) {
        case 1: A8_T(1, 1); break;
        case 2: A8_T(1, 2); break;
        case 3: A8_T(1, 3); break;
        case 4: A8_T(1, 4); break;
        case 5: A8_T(1, 5); break;
        case 6: A8_T(1, 6); break;
        case 7: A8_T(1, 7); break;
        default: A8_T(1, 8); break;
        }
#undef A8_T
}
WHALE_TARGET_END
#endif

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX2)
/* AVX2 (and AVX-512 without VNNI): a half panel (8 outputs x 4 k) per
 * 32-byte load, the weights back to signed (xor 128), and each group of 4
 * products summed exactly as llama.cpp's q8_0 kernels do: |a| (unsigned)
 * times w with a's sign moved onto it (vpsignb) in vpmaddubsw, whose pair
 * sums (at most 2 x 127 x 127) cannot saturate, then vpmaddwd by ones to
 * int32. The same exact block sums as vpdpbusd's (less the 128 offset, so
 * they start at 0), then the same fused steps: the same bits. */
static inline __attribute__((always_inline)) void a8_tile_avx2(const a8_job *J, const int mr, int p, int m0) {
    __m256 F[2][3];
    __m256i I[2][3];
    const uint8_t *w = J->W + (size_t)p * J->pstride;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int m = 0; m < mr; m++) F[0][m] = F[1][m] = _mm256_setzero_ps();
    for (int b = 0; b < J->nb; b++) {
        for (int m = 0; m < mr; m++) I[0][m] = I[1][m] = _mm256_setzero_si256();
        for (int j = 0; j < A8_BLOCK / 4; j++) {
            const uint8_t *at = w + (size_t)b * A8_BLOCK * A8_PANEL + j * 64;
            const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)at), flip);
            const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(at + 32)), flip);
            for (int m = 0; m < mr; m++) {
                int32_t four;
                memcpy(&four, J->aq + (size_t)(m0 + m) * J->ldq + b * A8_BLOCK + 4 * j, 4);
                const __m256i a = _mm256_set1_epi32(four), ua = _mm256_sign_epi8(a, a);
                const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(w0, a)), ones);
                const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(w1, a)), ones);
                I[0][m] = _mm256_add_epi32(I[0][m], p0);
                I[1][m] = _mm256_add_epi32(I[1][m], p1);
            }
        }
        for (int m = 0; m < mr; m++) {
            const __m256 dm = _mm256_set1_ps(J->d[(size_t)(m0 + m) * J->ldd + b]);
            F[0][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[0][m]), dm, F[0][m]);
            F[1][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[1][m]), dm, F[1][m]);
        }
    }
    int lo, hi;
    a8_lanes(J, p, &lo, &hi);
    const int n0 = p * A8_PANEL - J->row0; /* output of lane 0 (negative in a first panel that starts inside) */
    for (int m = 0; m < mr; m++) {
        float *c = J->C + (size_t)(m0 + m) * J->ldc;
        if (lo == 0 && hi == A8_PANEL) {
            for (int h = 0; h < 2; h++) {
                const __m256 sc = _mm256_loadu_ps(J->scale + n0 + 8 * h);
                float *ch = c + n0 + 8 * h;
                _mm256_storeu_ps(ch, J->acc ? _mm256_fmadd_ps(F[h][m], sc, _mm256_loadu_ps(ch)) : _mm256_mul_ps(F[h][m], sc));
            }
            continue;
        }
        float f[16];
        _mm256_storeu_ps(f, F[0][m]);
        _mm256_storeu_ps(f + 8, F[1][m]);
        for (int l = lo; l < hi; l++) {
            const int n = n0 + l;
            c[n] = J->acc ? fmaf(f[l], J->scale[n], c[n]) : f[l] * J->scale[n];
        }
    }
}

static void a8_tile_avx2_rows(const a8_job *J, int mr, int p, int m0) {
    switch (mr) {
    case 1: a8_tile_avx2(J, 1, p, m0); break;
    case 2: a8_tile_avx2(J, 2, p, m0); break;
    default: a8_tile_avx2(J, 3, p, m0); break;
    }
}
WHALE_TARGET_END
#endif

/* Panels side by side for a pass of mr rows: as many as 8 accumulator
 * pairs allow when one pass reads the weights (M <= A8_MR: decoding, the
 * weights coming from memory, where more streams at once keep more reads
 * in flight), as many as 12 when the rows pass over them several times
 * (M > A8_MR, the later passes reading them from L2: 6 rows over two
 * panels, each activation broadcast serving both). Two threads, weights
 * from memory (bench_gemm --shape nt_a8 M N K cold), a single panel at a
 * time for 1-4 rows was 10-20% slower on 896 x 4864 and faster on
 * 129,280 x 320 at 1 row, slower at 2: no one choice for every shape. The
 * passes of 6 over two panels, one thread, 4864 x 896: 512 rows 6.3-6.9 ms
 * instead of 7.8-8.2 with passes of 8 over one panel, 16 rows 0.20
 * instead of 0.24. */
static int a8_np(int mr, int one_pass) { return mr <= 2 ? 4 : mr <= (one_pass ? 4 : 6) ? 2 : 1; }

/* Rows in the pass from row m0: 6 (two panels side by side), or all that
 * are left when at most A8_MR (one pass over the weights rather than 6 and
 * a pass of 1 or 2). */
static int a8_pass_rows(int M, int m0) { return M - m0 <= A8_MR ? M - m0 : 6; }

/* The pass (a8_pass_rows) that holds row m of M: its first row and rows. */
static void a8_pass_of(int M, int m, int *m0, int *mr) {
    const int six = M <= A8_MR ? 0 : (M - A8_MR + 5) / 6 * 6; /* rows in passes of 6 */
    *m0 = m < six ? m / 6 * 6 : six;
    *mr = m < six ? 6 : M - six;
    assert(*mr == a8_pass_rows(M, *m0) && m < *m0 + *mr);
}

/* Row m of a job's activations: quantised into aq, d and corr, and for the
 * VNNI kernel copied into ag by passes (a8_pass_rows): a pass of mr rows
 * from m0 at ag + m0 * Kp holding, for each group of 4 k, its mr rows' 4
 * bytes side by side. A tile then reads every row's broadcast from one
 * pointer at fixed offsets: with a pointer per row, 8 rows and 4 weight
 * streams outgrew the general registers. */
static void a8_prepare_row(const a8_job *J, const float *A, size_t lda, int K, int m, int wide) {
    int8_t *q = (int8_t *)J->aq + (size_t)m * J->ldq;
    a8_quantize_row(K, J->nb, A + (size_t)m * lda, q, (float *)J->d + (size_t)m * J->ldd,
                    (int32_t *)J->corr + (size_t)m * J->ldd, wide);
    if (!J->ag) return;
    int m0, mr;
    a8_pass_of(J->M, m, &m0, &mr);
    int8_t *o = (int8_t *)J->ag + (size_t)m0 * J->ldq + (size_t)(m - m0) * 4;
    for (int k = 0; k < J->nb * A8_BLOCK; k += 4, o += 4 * mr) memcpy(o, q + k, 4);
}

/* Panels [p0, p1) of a job for every row: chunks of panels that stay in L2
 * while the rows pass over them (a8_pass_rows). */
static void a8_range(const a8_job *J, int kernel, int p0, int p1) {
    int chunk = (int)(whale_cpu_l2_bytes() / 2 / J->pstride);
    chunk = chunk < 4 ? 4 : chunk / 4 * 4;
    for (int c0 = p0; c0 < p1; c0 += chunk) {
        const int c1 = p1 - c0 < chunk ? p1 : c0 + chunk;
        for (int m0 = 0, mr; m0 < J->M; m0 += mr) {
            mr = a8_pass_rows(J->M, m0);
            int p = c0;
#if WHALE_X86
            if (kernel == A8_VNNI) {
                const int np = a8_np(mr, J->M <= A8_MR);
                for (; p + np <= c1; p += np) a8_tile_vnni_rows(J, np, mr, p, m0);
                for (; p < c1; p++) a8_tile_vnni_rows(J, 1, mr, p, m0);
            } else if (kernel == A8_AVX2) {
                for (; p < c1; p++)
                    for (int m = m0; m < m0 + mr; m += 3) a8_tile_avx2_rows(J, m0 + mr - m < 3 ? m0 + mr - m : 3, p, m);
            }
#endif
            if (p < c1) a8_tile_c(J, c1 - p, mr, p, m0);
        }
    }
}

static int a8_kernel(whale_gemm_path path) {
    if (!WHALE_X86 || path == WHALE_GEMM_OWN_PORTABLE || !whale_isa_at_least(WHALE_ISA_AVX2)) return A8_C;
    return whale_isa_at_least(WHALE_ISA_AVX512) && whale_cpu_has_vnni() ? A8_VNNI : A8_AVX2;
}

/* The activations of a run: the parts that bring their own (the others
 * reuse the previous part's), and where each one's rows start among all. */
typedef struct {
    int n, part[SK_PARTS_MAX];
    int row[SK_PARTS_MAX + 1];
} a8_inputs;

/* Rows [lo, hi) of all the run's activations through a8_prepare_row. */
static void a8_prepare(const a8_job *J, const gemm_call *c, const a8_inputs *in, int lo, int hi, int wide) {
    for (int x = 0; x < in->n; x++)
        for (int r = lo > in->row[x] ? lo : in->row[x]; r < hi && r < in->row[x + 1]; r++) {
            const int i = in->part[x];
            a8_prepare_row(&J[i], c[i].A, (size_t)c[i].s.lda, c[i].s.K, r - in->row[x], wide);
        }
}

/* This thread's panels of the run: cost[] the parts' cumulative cost
 * (rows + 1 per panel), split evenly over the nt threads. */
static void a8_panels(const a8_job *J, const int64_t *cost, int n, int kernel, int t, int nt) {
    const int64_t lo = cost[n] * t / nt, hi = cost[n] * (t + 1) / nt;
    for (int i = 0; i < n; i++) {
        const int64_t per = J[i].M + 1;
        int64_t a = lo > cost[i] ? lo : cost[i], b = hi < cost[i + 1] ? hi : cost[i + 1];
        if (a >= b) continue;
        const int p0 = (int)((a - cost[i] + per - 1) / per), p1 = (int)((b - cost[i] + per - 1) / per);
        if (p0 < p1) a8_range(&J[i], kernel, p0, p1);
    }
}

/* Whether a run is worth splitting over the team: when one thread would
 * take at least twice what a region costs (whale_par_sync_us), from its
 * weights' bytes (one core streams some 28 KB a microsecond from memory)
 * or its products (one core's vpdpbusd tile some 250,000 a microsecond, a
 * third of that without VNNI). A work threshold of a constant 65,536
 * products had split nanowhale-100m's attention products at eight rows
 * (0.4 to 1 M products, 50 to 120 KB of weights), each then slower on two
 * threads than on one where a region costs 5 us (a 2-core virtual
 * machine, bench_gemm --shape nt_a8, one thread against two, weights from
 * memory): 8 x 768 x 160 6.1 us against 11.1, 8 x 320 x 640 9.6 against
 * 17.5, 1 x 768 x 160 6.2 against 9.7; 1 x 1280 x 320 (410 KB) 14.8
 * against 12.0 gains from two. */
static int a8_worth_team(int kernel, double bytes, double macs, double moved) {
    const double macs_per_us = kernel == A8_VNNI ? 250000.0 : 80000.0;
    return whale_par_worth(fmax(bytes / WHALE_CORE_BYTES_PER_US, macs / macs_per_us), 1, moved);
}

/* The products c[0..n) (validated, M, N, K > 0, one K): A quantised into
 * scratch (once for consecutive parts with the same A), then the panels
 * of all parts split over the threads by their cost (rows x panels). With
 * a few rows or more the quantisation runs in the products' region, the
 * rows shared by the threads, a barrier before the panels: at eight
 * decoding streams of nanowhale-100m it had been about a tenth of the
 * step's time on the calling thread while the other waited (the experts'
 * down products: 14 us of preparation to 39 of products, timed per call). */
static whale_code a8_run(whale_gemm *g, const gemm_call *c, const int *row0, int n, whale_err *err) {
    const int K = c[0].s.K, Kp = a8_kp(K), nb = Kp / A8_BLOCK;
    const size_t ldq = (size_t)Kp;
    const int kernel = a8_kernel(g->path), copies = kernel == A8_VNNI ? 2 : 1; /* aq (+ ag) */
    const int wide = WHALE_X86 && whale_isa_at_least(WHALE_ISA_AVX512);
    size_t need = 0;
    for (int i = 0; i < n; i++)
        if (!i || c[i].A != c[i - 1].A || c[i].s.lda != c[i - 1].s.lda || c[i].s.M != c[i - 1].s.M)
            need += copies * (((size_t)c[i].s.M * ldq + 63) / 64 * 64) + (size_t)c[i].s.M * nb * 8;
    whale_code rc = gemm_scratch_reserve(&g->sa, need, 1, c, err);
    if (rc) return rc;
    a8_job J[SK_PARTS_MAX];
    a8_inputs in = {.n = 0};
    int64_t cost[SK_PARTS_MAX + 1] = {0};
    char *at = g->sa.p;
    double work = 0, bytes = 0, moved = 0;
    for (int i = 0; i < n; i++) {
        const gemm_key *s = &c[i].s;
        a8_job *j = &J[i];
        *j = (a8_job){s->M, s->N, nb, row0[i], (row0[i] + s->N + A8_PANEL - 1) / A8_PANEL,
                      NULL, NULL, ldq, NULL, NULL, (size_t)nb, c[i].B, (size_t)A8_PANEL * Kp, c[i].scale, c[i].C,
                      (size_t)s->ldc, s->acc};
        if (i && c[i].A == c[i - 1].A && s->lda == c[i - 1].s.lda && s->M == c[i - 1].s.M) {
            j->aq = J[i - 1].aq, j->ag = J[i - 1].ag, j->d = J[i - 1].d, j->corr = J[i - 1].corr;
        } else {
            j->aq = (int8_t *)at;
            at += ((size_t)s->M * ldq + 63) / 64 * 64;
            if (copies == 2) {
                j->ag = (int8_t *)at;
                at += ((size_t)s->M * ldq + 63) / 64 * 64;
            }
            j->d = (float *)at;
            j->corr = (int32_t *)(at + (size_t)s->M * nb * 4);
            at += (size_t)s->M * nb * 8;
            in.part[in.n] = i;
            in.row[in.n + 1] = in.row[in.n] + s->M;
            in.n++;
            moved += 2.0 * s->M * ((double)Kp + 8.0 * nb); /* the quantised rows and scales, there and back */
        }
        cost[i + 1] = cost[i] + (int64_t)j->panels * (s->M + 1); /* +1: a panel's fixed work */
        work += (double)s->M * s->N * K;
        bytes += (double)s->N * Kp;
        moved += 4.0 * s->M * s->N; /* C, read here next (its input: above) */
    }
    const int rows = in.row[in.n], team = a8_worth_team(kernel, bytes, work, moved);
    const int shared = WHALE_PAR_WORTH(team) && rows >= A8_SHARED_PREP_ROWS;
    if (!shared) a8_prepare(J, c, &in, 0, rows, wide); /* one row or a few: not worth a barrier */
    WHALE_PARALLEL_IF(team, t, nt, {
        if (shared) {
            a8_prepare(J, c, &in, rows * t / nt, rows * (t + 1) / nt, wide);
            a8_barrier();
        }
        a8_panels(J, cost, n, kernel, t, nt);
    });
    snprintf(g->last_impl, sizeof g->last_impl, "%s",
             kernel == A8_VNNI ? "whale:nt_a8_vnni" : kernel == A8_AVX2 ? "whale:nt_a8_avx2" : "whale:nt_a8_c");
    g->stats.own_calls += n;
    return WHALE_OK;
}

whale_code gemm_nt_a8(whale_gemm *g, const gemm_call *c, int row0, whale_err *err) {
    return a8_run(g, c, &row0, 1, err);
}

whale_code gemm_nt_a8_parts(whale_gemm *g, const gemm_call *c, const int *row0, int n, whale_err *err) {
    return a8_run(g, c, row0, n, err);
}

/* ------------------------------------------------------------ reading packed rows */

void whale_q8p_row(float *dst, const uint8_t *Wp, int row, int K, float scale) {
    const int Kp = a8_kp(K);
    const uint8_t *w = Wp + (size_t)(row / A8_PANEL) * A8_PANEL * Kp + (size_t)(row % A8_PANEL) * 4;
    for (int k = 0; k < K; k++) dst[k] = (float)((int)w[(size_t)(k / 4) * 64 + k % 4] - 128) * scale;
}

void whale_q8p_unpack(int8_t *dst, int ldd, const uint8_t *Wp, int row0, int rows, int K) {
    const int Kp = a8_kp(K);
    const int par = (double)rows * K >= OWN_PARALLEL_MIN_WORK * 16.0;
    WHALE_FOR_IF(par, (int r = 0; r < rows; r++), {
        const int g = row0 + r;
        const uint8_t *w = Wp + (size_t)(g / A8_PANEL) * A8_PANEL * Kp + (size_t)(g % A8_PANEL) * 4;
        int8_t *o = dst + (size_t)r * ldd;
        for (int k = 0; k < K; k++) o[k] = (int8_t)((int)w[(size_t)(k / 4) * 64 + k % 4] - 128);
    });
}
