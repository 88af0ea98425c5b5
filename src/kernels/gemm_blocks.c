/* Products whose operands oneDNN does not take as they are (fp16 and int8
 * weights, bf16 below AVX-512, nn / tn in bf16): blocks of the operands
 * converted into scratch, then f32 or bf16 oneDNN products on the blocks. */
#include "kernels/gemm_impl.h"

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
    if (gemm_have_avx512()) {
        f32_to_bf16_avx512(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = whale_float_to_bf16(src[i]);
}

/* Room for n elements of `size` bytes in a scratch buffer: the only
 * allocations of the products, made once per new maximum size. */
/* ------------------------------------------------------------ converted blocks */


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
    if (gemm_have_avx512()) i = i8_to_bf16_avx512(dst, src, n);
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

/* One block product of gemm_converted. */
static whale_code inner_run(whale_gemm *g, const gemm_call *d, whale_gemm_path path,
                            whale_err *err) {
    if (!is_bf16_kind(d->s.kind)) return gemm_f32(g, d, path, err);
    if (path != WHALE_GEMM_DNNL_EXACT && path != WHALE_GEMM_DNNL_RUNTIME)
        path = gemm_bf16_auto(d->s.kind, d->s.M);
    return gemm_dnnl_run(g, d, path == WHALE_GEMM_DNNL_RUNTIME, err);
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
whale_code gemm_converted(whale_gemm *g, const gemm_call *c, int inner, whale_gemm_path path, conv ca, conv cb,
                          const char *tag, whale_err *err) {
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
    if (ca) rc = gemm_scratch_reserve(&g->sa, (size_t)mb * kb, conv_dst_size(ca), c, err);
    if (!rc && cb) rc = gemm_scratch_reserve(&g->sb, (size_t)nb * kb, conv_dst_size(cb), c, err);
    if (!rc && q8 && s->acc) rc = gemm_scratch_reserve(&g->sc, (size_t)mb * nb, sizeof(float), c, err);
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

