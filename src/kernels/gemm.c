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
 *    does offer runtime sizes for bf16 ("gemm:jit"), as fast as brgemm.
 *  The path depends on the shape only, never on call history, so a given
 *  call always produces the same bits.
 */
#include "kernels/gemm.h"

#include "core/core.h"
#include "kernels/convert.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <omp.h>
#include <string.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* KIND_NT_BF16: nt with A (already converted) and W in bf16, C in f32. */
enum { KIND_NT = 0, KIND_NN = 1, KIND_TN = 2, KIND_NT_BF16 = 3 };
static const char *const kind_names[] = {"nt", "nn", "tn", "nt_bf16"};

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

struct whale_gemm {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    gemm_entry cache[WHALE_GEMM_CACHE_CAP];
    uint64_t tick;
    whale_gemm_path path;
    whale_gemm_stats stats;
    char last_impl[64];
    /* A rounded to bf16 for the bf16 products; grows, freed with the object */
    uint16_t *a16;
    size_t a16_cap; /* elements */
};

/* One product as requested by the caller. */
typedef struct {
    gemm_key s; /* the actual shape (no -1) */
    const void *A, *B; /* float, or uint16_t (bf16) for KIND_NT_BF16 */
    float *C;
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

#ifdef __AVX512F__

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

/* W rows n, n+q, n+2q, n+3q against mr A rows; results go to the same
 * columns of C. */
static inline __attribute__((always_inline)) void
nt_quad(const int mr, int K, const float *A, size_t lda, const float *W, size_t ldw, size_t n,
        size_t q, float *C, size_t ldc, int acc) {
    const float *w0 = W + n * ldw, *w1 = w0 + q * ldw, *w2 = w1 + q * ldw, *w3 = w2 + q * ldw;
    __m512 s[NT_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) s[m][r] = _mm512_setzero_ps();
    __mmask16 mask = 0xFFFF;
    for (int k = 0; k < K; k += 16) {
        if (K - k < 16) mask = (__mmask16)((1u << (K - k)) - 1); /* last, partial vector */
        const __m512 v0 = _mm512_maskz_loadu_ps(mask, w0 + k);
        const __m512 v1 = _mm512_maskz_loadu_ps(mask, w1 + k);
        const __m512 v2 = _mm512_maskz_loadu_ps(mask, w2 + k);
        const __m512 v3 = _mm512_maskz_loadu_ps(mask, w3 + k);
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
        for (int r = 0; r < 4; r++) c[r * q] = acc ? c[r * q] + sum[r] : sum[r];
    }
}

/* One W row (the few left over after the quarters) against mr A rows. */
static inline __attribute__((always_inline)) void
nt_single(const int mr, int K, const float *A, size_t lda, const float *w, float *C, size_t ldc,
          int acc) {
    __m512 s[NT_MR];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) s[m] = _mm512_setzero_ps();
    __mmask16 mask = 0xFFFF;
    for (int k = 0; k < K; k += 16) {
        if (K - k < 16) mask = (__mmask16)((1u << (K - k)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(mask, w + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++)
            s[m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, A + m * lda + k), v, s[m]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        const float v = _mm512_reduce_add_ps(s[m]);
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

/* Copies specialised for the number of A rows. */
static void nt_quad_rows(int mr, int K, const float *A, size_t lda, const float *W, size_t ldw,
                         size_t n, size_t q, float *C, size_t ldc, int acc) {
    switch (mr) {
    case 1: nt_quad(1, K, A, lda, W, ldw, n, q, C, ldc, acc); break;
    case 2: nt_quad(2, K, A, lda, W, ldw, n, q, C, ldc, acc); break;
    case 3: nt_quad(3, K, A, lda, W, ldw, n, q, C, ldc, acc); break;
    default: nt_quad(4, K, A, lda, W, ldw, n, q, C, ldc, acc); break;
    }
}

static void nt_single_rows(int mr, int K, const float *A, size_t lda, const float *w, float *C,
                           size_t ldc, int acc) {
    switch (mr) {
    case 1: nt_single(1, K, A, lda, w, C, ldc, acc); break;
    case 2: nt_single(2, K, A, lda, w, C, ldc, acc); break;
    case 3: nt_single(3, K, A, lda, w, C, ldc, acc); break;
    default: nt_single(4, K, A, lda, w, C, ldc, acc); break;
    }
}

#else /* plain C */

static void nt_single_rows(int mr, int K, const float *A, size_t lda, const float *w, float *C,
                           size_t ldc, int acc) {
    for (int m = 0; m < mr; m++) {
        const float *a = A + m * lda;
        float s = 0;
        for (int k = 0; k < K; k++) s += a[k] * w[k];
        C[m * ldc] = acc ? C[m * ldc] + s : s;
    }
}

static void nt_quad_rows(int mr, int K, const float *A, size_t lda, const float *W, size_t ldw,
                         size_t n, size_t q, float *C, size_t ldc, int acc) {
    for (int r = 0; r < 4; r++)
        nt_single_rows(mr, K, A, lda, W + (n + r * q) * ldw, C + n + r * q, ldc, acc);
}

#endif

static void own_nt(const gemm_call *c) {
    const int M = c->s.M, N = c->s.N, K = c->s.K, acc = c->s.acc;
    const size_t lda = (size_t)c->s.lda, ldw = (size_t)c->s.ldb, ldc = (size_t)c->s.ldc;
    const float *A = c->A, *W = c->B;
    float *C = c->C;
    const int par = (double)M * N * K >= OWN_PARALLEL_MIN_WORK;
#pragma omp parallel if (par)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const size_t lo = (size_t)((int64_t)N * id / nt), hi = (size_t)((int64_t)N * (id + 1) / nt);
        const size_t q = (hi - lo) / 4;
        for (size_t i = 0; i < q; i++)
            for (int m0 = 0; m0 < M; m0 += NT_MR) {
                const int mr = M - m0 < NT_MR ? M - m0 : NT_MR;
                nt_quad_rows(mr, K, A + m0 * lda, lda, W, ldw, lo + i, q, C + m0 * ldc, ldc, acc);
            }
        for (size_t n = lo + 4 * q; n < hi; n++)
            for (int m0 = 0; m0 < M; m0 += NT_MR) {
                const int mr = M - m0 < NT_MR ? M - m0 : NT_MR;
                nt_single_rows(mr, K, A + m0 * lda, lda, W + n * ldw, C + m0 * ldc + n, ldc, acc);
            }
    }
}

/* ------------------------------------------------------------ own kernels: nn / tn */

/* C[m, n] = sum_k A(m, k) * B[k, n] with A(m, k) = A[m*sam + k*sak], which
 * covers nn (sam = lda, sak = 1) and tn (sam = 1, sak = lda). A block of
 * NN_COLS columns of C for up to NN_MR rows stays in registers while k runs;
 * each B row segment is loaded once per block. */
#define NN_MR 4
#define NN_COLS 64

#ifdef __AVX512F__

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

static void nn_rows(int mr, int width, int K, const float *A, size_t sam, size_t sak,
                    const float *B, size_t ldb, float *C, size_t ldc, int acc) {
    switch (mr) {
    case 1: nn_block(1, width, K, A, sam, sak, B, ldb, C, ldc, acc); break;
    case 2: nn_block(2, width, K, A, sam, sak, B, ldb, C, ldc, acc); break;
    case 3: nn_block(3, width, K, A, sam, sak, B, ldb, C, ldc, acc); break;
    default: nn_block(4, width, K, A, sam, sak, B, ldb, C, ldc, acc); break;
    }
}

#else /* plain C */

static void nn_rows(int mr, int width, int K, const float *A, size_t sam, size_t sak,
                    const float *B, size_t ldb, float *C, size_t ldc, int acc) {
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

#endif

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
    const dnnl_data_type_t in_type = k->kind == KIND_NT_BF16 ? dnnl_bf16 : dnnl_f32;
    if (k->kind == KIND_TN) { /* A is stored [K, M] */
        a_str[0] = 1;
        a_str[1] = lda;
    }
    if (k->kind == KIND_NT || k->kind == KIND_NT_BF16) { /* W is stored [N, K] */
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
void whale_f32_to_bf16_rows(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
#ifdef __AVX512F__
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512i u = _mm512_maskz_loadu_epi32(m, src + i);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one)));
        r = _mm512_srli_epi32(r, 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, r);
    }
#else
    for (; i < n; i++) dst[i] = whale_float_to_bf16(src[i]);
#endif
}

/* Room for `elems` bf16 values in g->a16. The only allocation of the bf16
 * products, made once per new maximum size. */
static whale_code a16_reserve(whale_gemm *g, size_t elems, whale_err *err) {
    if (elems <= g->a16_cap) return WHALE_OK;
    size_t bytes;
    uint16_t *p = NULL;
    if (whale_mul_size(elems, sizeof(uint16_t), &bytes)) p = whale_alloc(bytes);
    if (!p)
        return whale_errf(err, WHALE_ERR_NOMEM, "gemm nt_bf16: cannot allocate %zu bf16 values",
                          elems);
    free(g->a16);
    g->a16 = p;
    g->a16_cap = elems;
    return WHALE_OK;
}

/* Our bf16 kernel mirrors own_nt: the same split of W rows over threads
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

#if defined(__AVX512BF16__) && defined(__AVX512BW__)

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
        const float v = _mm512_reduce_add_ps(s[m]);
        C[m * ldc] = acc ? C[m * ldc] + v : v;
    }
}

static void ntb_quad_rows(int mr, int K, const uint16_t *A, size_t lda, const uint16_t *W,
                          size_t ldw, size_t n, size_t q, float *C, size_t ldc, int acc) {
    switch (mr) {
    case 1: ntb_quad(1, K, A, lda, W, ldw, n, q, C, ldc, acc); break;
    case 2: ntb_quad(2, K, A, lda, W, ldw, n, q, C, ldc, acc); break;
    case 3: ntb_quad(3, K, A, lda, W, ldw, n, q, C, ldc, acc); break;
    default: ntb_quad(4, K, A, lda, W, ldw, n, q, C, ldc, acc); break;
    }
}

static void ntb_single_rows(int mr, int K, const uint16_t *A, size_t lda, const uint16_t *w,
                            float *C, size_t ldc, int acc) {
    switch (mr) {
    case 1: ntb_single(1, K, A, lda, w, C, ldc, acc); break;
    case 2: ntb_single(2, K, A, lda, w, C, ldc, acc); break;
    case 3: ntb_single(3, K, A, lda, w, C, ldc, acc); break;
    default: ntb_single(4, K, A, lda, w, C, ldc, acc); break;
    }
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
#define WHALE_HAVE_BF16_KERNEL 1

#else /* no AVX512_BF16: only the plain C kernel */

#define WHALE_HAVE_BF16_KERNEL 0

#endif

static void ntb_quad_rows_c(int mr, int K, const uint16_t *A, size_t lda, const uint16_t *W,
                            size_t ldw, size_t n, size_t q, float *C, size_t ldc, int acc) {
    for (int r = 0; r < 4; r++)
        ntb_single_c(mr, K, A, lda, W + (n + r * q) * ldw, C + n + r * q, ldc, acc);
}

/* Our kernel for a bf16 nt product; portable: the plain C kernel even when
 * the vdpbf16ps one is available (to compare them). */
static whale_code own_nt_bf16(whale_gemm *g, const gemm_call *c, int portable, whale_err *err) {
    const int M = c->s.M, N = c->s.N, K = c->s.K, acc = c->s.acc;
    const size_t lda = (size_t)c->s.lda, ldw = (size_t)c->s.ldb, ldc = (size_t)c->s.ldc;
    const size_t ld16 = bf16_row_len(K);
    whale_code rc = a16_reserve(g, (size_t)M * ld16, err);
    if (rc) return rc;
    const float *A = c->A;
    const uint16_t *W = c->B, *A16 = g->a16;
    float *C = c->C;
#if WHALE_HAVE_BF16_KERNEL
    const int fast = !portable;
#else
    const int fast = 0;
#endif
    if (fast) {
#if WHALE_HAVE_BF16_KERNEL
        a_to_bf16_hw(M, K, A, lda, g->a16, ld16);
#endif
    } else {
        for (int m = 0; m < M; m++) {
            whale_f32_to_bf16_rows(g->a16 + m * ld16, A + m * lda, (size_t)K);
            memset(g->a16 + m * ld16 + K, 0, (ld16 - (size_t)K) * sizeof(uint16_t));
        }
    }
    const int par = (double)M * N * K >= OWN_PARALLEL_MIN_WORK;
#pragma omp parallel if (par)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const size_t lo = (size_t)((int64_t)N * id / nt), hi = (size_t)((int64_t)N * (id + 1) / nt);
        const size_t q = (hi - lo) / 4;
        for (size_t i = 0; i < q; i++)
            for (int m0 = 0; m0 < M; m0 += NT_MR) {
                const int mr = M - m0 < NT_MR ? M - m0 : NT_MR;
#if WHALE_HAVE_BF16_KERNEL
                if (fast)
                    ntb_quad_rows(mr, K, A16 + m0 * ld16, ld16, W, ldw, lo + i, q, C + m0 * ldc,
                                  ldc, acc);
                else
#endif
                    ntb_quad_rows_c(mr, K, A16 + m0 * ld16, ld16, W, ldw, lo + i, q, C + m0 * ldc,
                                    ldc, acc);
            }
        for (size_t n = lo + 4 * q; n < hi; n++)
            for (int m0 = 0; m0 < M; m0 += NT_MR) {
                const int mr = M - m0 < NT_MR ? M - m0 : NT_MR;
#if WHALE_HAVE_BF16_KERNEL
                if (fast)
                    ntb_single_rows(mr, K, A16 + m0 * ld16, ld16, W + n * ldw, C + m0 * ldc + n,
                                    ldc, acc);
                else
#endif
                    ntb_single_c(mr, K, A16 + m0 * ld16, ld16, W + n * ldw, C + m0 * ldc + n,
                                 ldc, acc);
            }
    }
    snprintf(g->last_impl, sizeof g->last_impl, fast ? "whale:skinny_nt_bf16" : "whale:nt_bf16_c");
    g->stats.own_calls++;
    return WHALE_OK;
}

/* A bf16 nt product, already validated (M, N, K > 0). */
static whale_code gemm_bf16(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const gemm_key *s = &c->s;
    whale_gemm_path path = g->path;
    if (path == WHALE_GEMM_AUTO)
        path = s->M <= WHALE_GEMM_OWN_MAX_M_NT             ? WHALE_GEMM_OWN
               : s->M < WHALE_GEMM_BF16_EXACT_BELOW_M_NT ? WHALE_GEMM_DNNL_EXACT
                                                         : WHALE_GEMM_DNNL_RUNTIME;
    if (path == WHALE_GEMM_OWN || path == WHALE_GEMM_OWN_PORTABLE)
        return own_nt_bf16(g, c, path == WHALE_GEMM_OWN_PORTABLE, err);
    /* oneDNN takes A in bf16: round it into the dense scratch first */
    const size_t K = (size_t)s->K;
    whale_code rc = a16_reserve(g, (size_t)s->M * K, err);
    if (rc) return rc;
    const float *A = c->A;
    const int M = s->M;
    const size_t lda = (size_t)s->lda;
    const int par = (double)M * K >= OWN_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int m = 0; m < M; m++) whale_f32_to_bf16_rows(g->a16 + m * K, A + m * lda, K);
    gemm_call d = *c;
    d.s.lda = s->K;
    d.A = g->a16;
    return dnnl_run(g, &d, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

/* ------------------------------------------------------------ dispatch */

static whale_code gemm(whale_gemm *g, const gemm_call *c, whale_err *err) {
    const gemm_key *s = &c->s;
    const char *kn = kind_names[s->kind];
    if (!g) return whale_errf(err, WHALE_ERR_ARG, "gemm %s: no whale_gemm object", kn);
    if (s->M < 0 || s->N < 0 || s->K < 0)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: negative size M=%d N=%d K=%d", kn, s->M,
                          s->N, s->K);
    /* Row lengths the leading dimensions must cover. */
    const int a_row = s->kind == KIND_TN ? s->M : s->K;
    const int is_nt = s->kind == KIND_NT || s->kind == KIND_NT_BF16;
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
    if (s->K == 0) { /* empty sum */
        if (!s->acc)
            for (int m = 0; m < s->M; m++)
                memset(c->C + (size_t)m * s->ldc, 0, (size_t)s->N * sizeof(float));
        snprintf(g->last_impl, sizeof g->last_impl, "whale:empty");
        return WHALE_OK;
    }
    if (!c->A || !c->B)
        return whale_errf(err, WHALE_ERR_ARG, "gemm %s: %s is NULL", kn,
                          !c->A ? "A" : is_nt ? "W" : "B");

    whale_gemm_path path = g->path;
    if (s->kind == KIND_NT_BF16) return gemm_bf16(g, c, err);
    if (path == WHALE_GEMM_OWN_PORTABLE) path = WHALE_GEMM_OWN;
    if (path == WHALE_GEMM_AUTO) {
        if (s->kind == KIND_NT)
            path = s->M <= WHALE_GEMM_OWN_MAX_M_NT        ? WHALE_GEMM_OWN
                   : s->M < WHALE_GEMM_EXACT_BELOW_M_NT ? WHALE_GEMM_DNNL_EXACT
                                                        : WHALE_GEMM_DNNL_RUNTIME;
        else
            path = s->M <= WHALE_GEMM_OWN_MAX_M_NN ? WHALE_GEMM_OWN : WHALE_GEMM_DNNL_RUNTIME;
    }
    if (path == WHALE_GEMM_OWN) {
        if (s->kind == KIND_NT) {
            own_nt(c);
            snprintf(g->last_impl, sizeof g->last_impl, "whale:skinny_nt");
        } else {
            own_nn_tn(c);
            snprintf(g->last_impl, sizeof g->last_impl, "whale:skinny_%s", kn);
        }
        g->stats.own_calls++;
        return WHALE_OK;
    }
    return dnnl_run(g, c, path == WHALE_GEMM_DNNL_RUNTIME, err);
}

static whale_code gemm_kind(whale_gemm *g, int kind, int M, int N, int K, const float *A, int lda,
                            const float *B, int ldb, float *C, int ldc, int accumulate,
                            whale_err *err) {
    gemm_call c = {{kind, accumulate ? 1 : 0, M, N, K, lda, ldb, ldc}, A, B, C};
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
    gemm_call c = {{KIND_NT_BF16, accumulate ? 1 : 0, M, N, K, lda, ldw, ldc}, A, W, C};
    return gemm(g, &c, err);
}

/* ------------------------------------------------------------ object */

whale_code whale_gemm_new(whale_gemm **out, whale_err *err) {
    *out = NULL;
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
    free(g->a16);
    dnnl_stream_destroy(g->stream);
    dnnl_engine_destroy(g->engine);
    free(g);
}

void whale_gemm_set_path(whale_gemm *g, whale_gemm_path path) { g->path = path; }

const char *whale_gemm_last_impl(const whale_gemm *g) { return g->last_impl; }

void whale_gemm_get_stats(const whale_gemm *g, whale_gemm_stats *st) {
    *st = g->stats;
    st->cached = 0;
    for (int i = 0; i < WHALE_GEMM_CACHE_CAP; i++) st->cached += g->cache[i].used;
}

/* ------------------------------------------------------------ measurements */

/* Best GFLOP/s of an nt product, with f32 or bf16 weights. */
static double measure_nt(whale_gemm *g, int M, int N, int K, int reps, int bf16) {
    if (!g || M <= 0 || N <= 0 || K <= 0) return 0;
    if (reps < 1) reps = 1;
    size_t na, nw, nc;
    if (!whale_mul_size((size_t)M, (size_t)K, &na) || !whale_mul_size((size_t)N, (size_t)K, &nw) ||
        !whale_mul_size((size_t)M, (size_t)N, &nc) || na > SIZE_MAX / 4 || nw > SIZE_MAX / 4 ||
        nc > SIZE_MAX / 4)
        return 0;
    float *A = whale_alloc(na * sizeof(float));
    float *W = whale_alloc(nw * sizeof(float));
    float *C = whale_alloc(nc * sizeof(float));
    uint16_t *W16 = bf16 ? whale_alloc(nw * sizeof(uint16_t)) : NULL;
    double best = 0;
    if (A && W && C && (W16 || !bf16)) {
        /* small exact values: no denormals or overflow to skew timing */
        for (size_t i = 0; i < na; i++) A[i] = (float)((int)(i % 17) - 8) * 0.0625f;
        for (size_t i = 0; i < nw; i++) W[i] = (float)((int)(i % 13) - 6) * 0.0625f;
        if (bf16) whale_f32_to_bf16_rows(W16, W, nw);
        whale_err err;
        double t_best = 0;
        for (int r = -1; r < reps; r++) { /* r = -1: untimed warm-up */
            double t0 = whale_now();
            whale_code rc = bf16 ? whale_gemm_nt_bf16(g, M, N, K, A, K, W16, K, C, N, 0, &err)
                                 : whale_gemm_nt(g, M, N, K, A, K, W, K, C, N, 0, &err);
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
    return best;
}

double whale_gemm_measure_gflops(whale_gemm *g, int M, int N, int K, int reps) {
    return measure_nt(g, M, N, K, reps, 0);
}

double whale_gemm_measure_gflops_bf16(whale_gemm *g, int M, int N, int K, int reps) {
    return measure_nt(g, M, N, K, reps, 1);
}

double whale_measure_read_bandwidth(size_t bytes, int reps) {
    const size_t per_block = 64; /* floats per inner step: four 64-byte vectors */
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
#ifdef __AVX512F__
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            for (long b = lo; b < hi; b++) {
                const float *p = buf + b * per_block;
                s0 = _mm512_add_ps(s0, _mm512_load_ps(p));
                s1 = _mm512_add_ps(s1, _mm512_load_ps(p + 16));
                s2 = _mm512_add_ps(s2, _mm512_load_ps(p + 32));
                s3 = _mm512_add_ps(s3, _mm512_load_ps(p + 48));
            }
            total += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
#else
            float s = 0;
            for (long b = lo; b < hi; b++)
                for (size_t i = 0; i < per_block; i++) s += buf[b * per_block + i];
            total += s;
#endif
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
