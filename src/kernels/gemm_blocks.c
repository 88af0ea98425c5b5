/* Products whose operands oneDNN does not take as they are (fp16 and int8
 * weights, bf16 below AVX-512, nn / tn in bf16): blocks of the operands
 * converted into scratch, then f32 or bf16 oneDNN products on the blocks. */
#include "kernels/gemm_impl.h"

#include "core/par.h"

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
/* The whole vectors of i8_to_bf16_rows; returns how many values it did.
 * |q| <= 128 is exact in fp32, so the top half of each fp32 pattern is
 * the bf16: one vpermt2w gathers those halves of 32 values in order. */
static size_t i8_to_bf16_avx512(uint16_t *dst, const int8_t *src, size_t n) {
    const __m512i top = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                         27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m128i *s = (const __m128i *)(src + i);
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(s)));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(s + 1)));
        _mm512_storeu_si512(dst + i, _mm512_permutex2var_epi16(_mm512_castps_si512(lo), top, _mm512_castps_si512(hi)));
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
    WHALE_FOR_IF(par, (int r = 0; r < rows; r++), {
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
    });
}

/* Row m of scale_cols. */
static void scale_row(float *C, size_t ldc, const float *T, size_t ldt, int m, int cols, const float *scale,
                      int acc) {
    float *c = C + (size_t)m * ldc;
    const float *t = T + (size_t)m * ldt;
    if (acc)
        for (int n = 0; n < cols; n++) c[n] += scale[n] * t[n];
    else
        for (int n = 0; n < cols; n++) c[n] *= scale[n];
}

/* C[m, n] = scale[n] * C[m, n], or C[m, n] += scale[n] * T[m, n]. */
static void scale_cols(float *C, size_t ldc, const float *T, size_t ldt, int rows, int cols,
                       const float *scale, int acc) {
    const int par = (double)rows * cols >= OWN_PARALLEL_MIN_WORK;
    WHALE_FOR_IF(par, (int m = 0; m < rows; m++), { scale_row(C, ldc, T, ldt, m, cols, scale, acc); });
}

/* One block product of gemm_converted. */
static whale_code inner_run(whale_gemm *g, const gemm_call *d, whale_gemm_path path,
                            whale_err *err) {
    if (!is_bf16_kind(d->s.kind)) return gemm_f32(g, d, path, err);
    if (path != WHALE_GEMM_DNNL_EXACT && path != WHALE_GEMM_DNNL_RUNTIME)
        path = gemm_bf16_auto(d->s.kind, d->s.M);
    return gemm_dnnl_run(g, d, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* Blocks of gemm_converted: at most WHALE_CONV_BLOCK_MN rows of C and
 * columns of C per block (inner products this size run at full speed), and
 * as much of K as fits WHALE_CONV_SCRATCH_BYTES with them (K itself in
 * every product of the models: >= 1024 deep blocks even at the largest
 * rows and columns). */

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
    const int blk = g->block_mn > 0 ? g->block_mn : WHALE_CONV_BLOCK_MN;
    const size_t budget = g->block_bytes ? g->block_bytes : WHALE_CONV_SCRATCH_BYTES;
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


/* ------------------------------------------------------------ nt_q8 in chunks */

/* One stream per thread for oneDNN calls made inside a parallel region. */
static whale_code thread_streams(whale_gemm *g, int n, const gemm_call *c, whale_err *err) {
    if (n <= g->n_thread_stream) return WHALE_OK;
    dnnl_stream_t *s = realloc(g->thread_stream, (size_t)n * sizeof *s);
    if (!s) return whale_errf(err, WHALE_ERR_NOMEM, "gemm %s: cannot allocate %d streams", gemm_kind_names[c->s.kind], n);
    g->thread_stream = s;
    for (; g->n_thread_stream < n; g->n_thread_stream++) {
        dnnl_status_t st = dnnl_stream_create(&s[g->n_thread_stream], g->engine, dnnl_stream_default_flags);
        if (st != dnnl_success) return gemm_dnnl_fail(err, c, "stream_create", st);
    }
    return WHALE_OK;
}

/* How gemm_nt_q8_chunks cuts a product: rows of A per block (mb), columns
 * per chunk (nb, a multiple of 16 unless N is smaller) and chunks per
 * block, and the scratch: A's block and each thread's W chunk. */
typedef struct {
    int mb, nb, chunks;
    size_t a_bytes, w_bytes;
} q8_plan;

static size_t round64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Columns per chunk at least: oneDNN packs the rows of A anew for each
 * chunk's product, once per this many multiply-adds per element of A
 * (narrower chunks made the K = 4864 products of Qwen2.5-0.5B 20 % slower). */
#define Q8_CHUNK_MIN_N 256

/* A chunk of W in bf16 takes half of L2 (the product then reads it from
 * there) or Q8_CHUNK_MIN_N rows; the chunks are evened out and their count
 * made a multiple of the threads, so they share the work equally. */
static int q8_plan_make(const whale_gemm *g, const gemm_key *s, int nthr, q8_plan *p) {
    const int blk = g->block_mn > 0 ? g->block_mn : WHALE_CONV_BLOCK_MN;
    const size_t budget = g->block_bytes ? g->block_bytes : WHALE_CONV_SCRATCH_BYTES;
    const size_t row = (size_t)s->K * sizeof(uint16_t); /* one converted row of A or W */
    size_t nb = whale_cpu_l2_bytes() / 2 / row;
    if (nb < Q8_CHUNK_MIN_N) nb = Q8_CHUNK_MIN_N;
    if (nb > (size_t)blk) nb = (size_t)blk;
    size_t chunks = ((size_t)s->N + nb - 1) / nb;
    chunks = (chunks + (size_t)nthr - 1) / (size_t)nthr * (size_t)nthr;
    nb = ((size_t)s->N + chunks - 1) / chunks;
    if (nb > 16) nb = (nb + 15) / 16 * 16;
    size_t mb = budget / 2 / row;
    if (mb > (size_t)blk) mb = (size_t)blk;
    if (mb > (size_t)s->M) mb = (size_t)s->M;
    p->mb = (int)mb;
    p->nb = (int)nb;
    p->chunks = (int)(((size_t)s->N + nb - 1) / nb);
    p->a_bytes = round64(mb * row);
    p->w_bytes = round64(nb * row);
    return mb > 0 && p->a_bytes + (size_t)nthr * p->w_bytes <= budget;
}

/* What the threads share in a block: the product, the plan, the rows of A
 * in bf16 (from row m0, mm rows), the primitive, and the first failure. */
typedef struct {
    const gemm_call *c;
    const q8_plan *p;
    const uint16_t *A16;
    int m0, mm;
    const gemm_entry *e;
    dnnl_engine_t engine;
    dnnl_status_t bad;
    const char *bad_what;
    gemm_call bad_call;
} q8_job;

/* Chunk j of a block: W's rows n0.. converted into Wc, then the oneDNN
 * product of the block's rows with them, scaled per column as written. */
static void q8_chunk(q8_job *q, int j, uint16_t *Wc, dnnl_stream_t stream) {
    const gemm_key *s = &q->c->s;
    const size_t K = (size_t)s->K;
    const int n0 = j * q->p->nb, nn = s->N - n0 < q->p->nb ? s->N - n0 : q->p->nb;
    const int8_t *W = q->c->B;
    for (int r = 0; r < nn; r++) i8_to_bf16_rows(Wc + r * K, W + (size_t)(n0 + r) * s->ldb, K);
    const gemm_call d = {{KIND_NT_Q8, s->acc, q->mm, nn, s->K, s->K, s->K, s->ldc},
                         q->A16, Wc, q->c->C + (size_t)q->m0 * s->ldc + n0, q->c->scale + n0};
    const char *what;
    const dnnl_status_t st = gemm_dnnl_exec_runtime(q->e, q->engine, stream, &d, &what);
    if (st != dnnl_success) {
#pragma omp critical(whale_gemm_q8_chunks)
        if (q->bad == dnnl_success) q->bad = st, q->bad_what = what, q->bad_call = d;
    }
}

/* nt_q8 when oneDNN has bf16 products: for each block of rows, one
 * parallel region rounds the rows of A to bf16, then hands out chunks of
 * W's rows; a thread converts its chunk exactly to bf16 in its own scratch
 * (sized to stay in its L2) and runs the single-threaded oneDNN product
 * of the rows with it: bf16 × bf16 summed in fp32 over the whole K, times
 * the column's scale as oneDNN writes C (one fp32 product; with
 * accumulate, added to C). One fork and join per block of rows instead of
 * three per block of columns, no pass over C, no W block beyond L2. */
whale_code gemm_nt_q8_chunks(whale_gemm *g, const gemm_call *c, int *done, whale_err *err) {
    const gemm_key *s = &c->s;
    const int nthr = omp_get_max_threads();
    q8_plan p;
    *done = 0;
    if (!q8_plan_make(g, s, nthr, &p)) return WHALE_OK;
    const gemm_call first = {{KIND_NT_Q8, s->acc, p.mb, p.nb, s->K, s->K, s->K, s->ldc}, NULL, NULL, NULL, NULL};
    gemm_entry *e;
    whale_code rc = gemm_scratch_reserve(&g->sa, p.a_bytes, 1, c, err);
    if (!rc) rc = gemm_scratch_reserve(&g->sb, (size_t)nthr * p.w_bytes, 1, c, err);
    if (!rc) rc = thread_streams(g, nthr, c, err);
    if (!rc) rc = gemm_dnnl_entry(g, &first, 1, &e, err);
    if (rc) return rc;
    const size_t K = (size_t)s->K;
    q8_job q = {c, &p, g->sa.p, 0, 0, e, g->engine, dnnl_success, NULL, *c};
    for (q.m0 = 0; q.m0 < s->M && q.bad == dnnl_success; q.m0 += p.mb) {
        q.mm = s->M - q.m0 < p.mb ? s->M - q.m0 : p.mb;
        uint16_t *A16 = g->sa.p;
        const float *A = (const float *)c->A + (size_t)q.m0 * s->lda;
#pragma omp parallel num_threads(nthr)
        {
            const int t = omp_get_thread_num();
            uint16_t *Wc = (uint16_t *)((char *)g->sb.p + (size_t)t * p.w_bytes);
#pragma omp for schedule(static)
            for (int m = 0; m < q.mm; m++) whale_f32_to_bf16_rows(A16 + m * K, A + (size_t)m * s->lda, K);
#pragma omp for schedule(dynamic, 1)
            for (int j = 0; j < p.chunks; j++)
                if (q.bad == dnnl_success) q8_chunk(&q, j, Wc, g->thread_stream[t]);
        }
        g->stats.calls += p.chunks;
    }
    if (q.bad != dnnl_success) return gemm_dnnl_fail(err, &q.bad_call, q.bad_what, q.bad);
    snprintf(g->last_impl, sizeof g->last_impl, "cvt_q8+%.48s", e->impl);
    *done = 1;
    return WHALE_OK;
}
