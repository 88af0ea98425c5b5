/* Matrix products (src/kernels/gemm.c) against a double-precision loop.
 *
 * Every case runs through each implementation (automatic choice, our own
 * kernels, exact-shape and runtime-size oneDNN primitives) with operands that
 * are sub-blocks of larger buffers (row padding, column offsets). Padding of
 * A and B holds NaN, so reading outside the block shows up in the result;
 * padding of C holds a sentinel that must survive.
 *
 * Tolerances. Two kinds of data:
 *  - dyadic: entries are multiples of 1/16 in [-1/2, 1/2]; every product is
 *    a multiple of 2^-8 and every partial sum stays far below 2^16, so it
 *    is exact in fp32 whatever the summation order: results must be equal.
 *  - random reals: any order of summing K fp32 products (with or without
 *    FMA) errs by at most gamma_K * sum_k |a_k b_k| (Higham, Accuracy and
 *    Stability, 3.1), gamma_K ~ K u, u = 2^-24; the accumulate adds one more
 *    rounding of the result. We allow (K + 2) u sum|a b| + 2 u |c|.
 */
#include "core/core.h"
#include "core/cpu.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "whale_bench.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NT, NN, TN };
static const char *const kind_names[] = {"nt", "nn", "tn"};
static const char *const path_names[] = {"auto", "own", "exact", "runtime"};
static const float C_SENTINEL = 12345.0f;

typedef struct {
    int kind, M, N, K;
    int pad_a, pad_b, pad_c; /* extra elements per row beyond the block */
    int off_a, off_b, off_c; /* column where the block starts (<= pad) */
    int acc;
} gcase;

/* A matrix block inside a bigger buffer: one guard row above and below. */
typedef struct {
    float *buf;
    size_t n;
    int rows, cols, ld, off;
} block;

static float *block_ptr(const block *b) { return b->buf + (size_t)b->ld + b->off; }

static int block_make(block *b, int rows, int cols, int pad, int off, float fill) {
    b->rows = rows;
    b->cols = cols;
    b->ld = cols + pad;
    b->off = off;
    b->n = (size_t)(rows + 2) * b->ld;
    b->buf = malloc((b->n ? b->n : 1) * sizeof(float));
    if (!b->buf) return 0;
    for (size_t i = 0; i < b->n; i++) b->buf[i] = fill;
    return 1;
}

static int in_block(const block *b, size_t i) {
    size_t r = i / b->ld, c = i % b->ld;
    return r >= 1 && r <= (size_t)b->rows && c >= (size_t)b->off &&
           c < (size_t)(b->off + b->cols);
}

static float draw(whale_rng *r, int dyadic) {
    if (dyadic) return (float)((int)(whale_rng_u64(r) % 17) - 8) / 16.0f;
    return 2.0f * whale_rng_uniform(r) - 1.0f;
}

static void block_fill(block *b, whale_rng *r, int dyadic) {
    float *p = block_ptr(b);
    for (int i = 0; i < b->rows; i++)
        for (int j = 0; j < b->cols; j++) p[(size_t)i * b->ld + j] = draw(r, dyadic);
}

static whale_code call(whale_gemm *g, const gcase *t, const block *a, const block *b, block *c,
                       whale_err *err) {
    const float *A = block_ptr(a), *B = block_ptr(b);
    float *C = block_ptr(c);
    switch (t->kind) {
    case NT: return whale_gemm_nt(g, t->M, t->N, t->K, A, a->ld, B, b->ld, C, c->ld, t->acc, err);
    case NN: return whale_gemm_nn(g, t->M, t->N, t->K, A, a->ld, B, b->ld, C, c->ld, t->acc, err);
    default: return whale_gemm_tn(g, t->M, t->N, t->K, A, a->ld, B, b->ld, C, c->ld, t->acc, err);
    }
}

/* Runs one case through the given paths (bit p = path p); returns 1 if
 * every one passed. The reference is computed once, in double. */
static int run_case(whale_gemm *g, const gcase *t, unsigned paths, int dyadic, uint64_t seed) {
    whale_rng r;
    whale_rng_seed(&r, seed);
    const int M = t->M, N = t->N, K = t->K;
    block a, b, c;
    int a_rows = t->kind == TN ? K : M, a_cols = t->kind == TN ? M : K;
    int b_rows = t->kind == NT ? N : K, b_cols = t->kind == NT ? K : N;
    if (!block_make(&a, a_rows, a_cols, t->pad_a, t->off_a, NAN) ||
        !block_make(&b, b_rows, b_cols, t->pad_b, t->off_b, NAN) ||
        !block_make(&c, M, N, t->pad_c, t->off_c, C_SENTINEL)) {
        fprintf(stderr, "test_gemm: out of memory\n");
        exit(1);
    }
    block_fill(&a, &r, dyadic);
    block_fill(&b, &r, dyadic);
    block_fill(&c, &r, dyadic);
    float *c0 = malloc((c.n ? c.n : 1) * sizeof(float));
    double *want = malloc(((size_t)M * N + 1) * sizeof(double));
    double *tol = malloc(((size_t)M * N + 1) * sizeof(double));
    if (!c0 || !want || !tol) {
        fprintf(stderr, "test_gemm: out of memory\n");
        exit(1);
    }
    memcpy(c0, c.buf, c.n * sizeof(float));

    const float *A = block_ptr(&a), *B = block_ptr(&b), *C = block_ptr(&c);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, s_abs = 0;
            for (int k = 0; k < K; k++) {
                double x = t->kind == TN ? A[(size_t)k * a.ld + m] : A[(size_t)m * a.ld + k];
                double y = t->kind == NT ? B[(size_t)n * b.ld + k] : B[(size_t)k * b.ld + n];
                s += x * y;
                s_abs += fabs(x * y);
            }
            if (t->acc) s += C[(size_t)m * c.ld + n];
            want[(size_t)m * N + n] = s;
            tol[(size_t)m * N + n] = dyadic ? 0 : (K + 2) * 0x1p-24 * s_abs + 2 * 0x1p-24 * fabs(s);
        }

    int all_ok = 1;
    for (int p = WHALE_GEMM_AUTO; p <= WHALE_GEMM_DNNL_RUNTIME; p++) {
        if (!(paths >> p & 1)) continue;
        memcpy(c.buf, c0, c.n * sizeof(float));
        whale_err err = {0};
        whale_gemm_set_path(g, (whale_gemm_path)p);
        whale_code rc = call(g, t, &a, &b, &c, &err);
        whale_gemm_set_path(g, WHALE_GEMM_AUTO);
        int ok = rc == WHALE_OK;
        double worst = 0; /* largest error / tolerance */
        size_t bad_guard = 0;
        for (int m = 0; ok && m < M; m++)
            for (int n = 0; n < N; n++) {
                double e = fabs(C[(size_t)m * c.ld + n] - want[(size_t)m * N + n]);
                double tl = tol[(size_t)m * N + n];
                if (!(e <= tl)) ok = 0; /* NaN fails too */
                if (tl > 0 && e / tl > worst) worst = e / tl;
            }
        for (size_t i = 0; i < c.n; i++)
            if (!in_block(&c, i) && memcmp(&c.buf[i], &c0[i], sizeof(float))) bad_guard++;
        CHECK(ok && !bad_guard,
              "%s M=%d N=%d K=%d pads=%d,%d,%d offs=%d,%d,%d acc=%d path=%s impl=%s %s: rc=%d "
              "(%s) worst err/tol=%.3g, %zu padding elements of C changed",
              kind_names[t->kind], M, N, K, t->pad_a, t->pad_b, t->pad_c, t->off_a, t->off_b,
              t->off_c, t->acc, path_names[p], whale_gemm_last_impl(g),
              dyadic ? "dyadic" : "random", (int)rc, rc ? err.msg : "", worst, bad_guard);
        all_ok &= ok && !bad_guard;
    }
    free(a.buf);
    free(b.buf);
    free(c.buf);
    free(c0);
    free(want);
    free(tol);
    return all_ok;
}

#define ALL_PATHS 0xFu
#define ONLY(path) (1u << (path))

/* Runs a case through every path, with dyadic and random data. */
static int run_all_paths(whale_gemm *g, const gcase *t, uint64_t seed) {
    int ok = run_case(g, t, ALL_PATHS, 1, seed);
    ok &= run_case(g, t, ALL_PATHS, 0, seed + 1);
    return ok;
}

static void test_shapes(whale_gemm *g) {
    /* Hand-picked: kernel block edges (4 rows, 16-wide K vectors, 64-wide
     * column blocks, 4 quarters of W rows per thread), the small-M range of
     * our kernels and a few larger M. Every path is forced in turn, so the
     * shape rules need no particular sizes here (test_rules checks them). */
    static const int ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17, 33, 100, 127, 128, 129};
    static const int ns[] = {1, 3, 4, 5, 17, 64, 65, 130};
    static const int ks[] = {1, 5, 15, 16, 17, 33, 100, 320};
    whale_rng r;
    whale_rng_seed(&r, 42);
    int failed = 0, cases = 0;
    for (int kind = 0; kind < 3; kind++)
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
                for (size_t l = 0; l < sizeof ks / sizeof ks[0]; l++) {
                    /* a random part of the grid is plenty; more of M <= 5 (GEMV) */
                    if (whale_rng_u64(&r) % (ms[i] <= 5 ? 2 : 6)) continue;
                    gcase t = {kind, ms[i], ns[j], ks[l], 0, 0, 0, 0, 0, 0, 0};
                    switch (whale_rng_u64(&r) % 4) {
                    case 0: break; /* dense */
                    case 1: t.pad_a = 1; t.pad_b = 3; t.pad_c = 16; break;
                    default:
                        t.pad_a = 1 + (int)(whale_rng_u64(&r) % 20);
                        t.pad_b = 1 + (int)(whale_rng_u64(&r) % 20);
                        t.pad_c = 1 + (int)(whale_rng_u64(&r) % 20);
                        t.off_a = (int)(whale_rng_u64(&r) % (t.pad_a + 1));
                        t.off_b = (int)(whale_rng_u64(&r) % (t.pad_b + 1));
                        t.off_c = (int)(whale_rng_u64(&r) % (t.pad_c + 1));
                    }
                    t.acc = (int)(whale_rng_u64(&r) % 2);
                    failed += !run_all_paths(g, &t, whale_rng_u64(&r));
                    cases++;
                }
    printf("test_gemm: %d shape cases x 4 paths x 2 kinds of data, %d failed\n", cases, failed);
}

/* A few real model shapes (larger K: the fp32 bound matters). */
static void test_model_shapes(whale_gemm *g) {
    static const gcase cases[] = {
        {NT, 130, 256, 320, 0, 0, 0, 0, 0, 0, 0}, {NN, 130, 256, 640, 0, 0, 0, 0, 0, 0, 1},
        {TN, 320, 256, 130, 0, 0, 0, 0, 0, 0, 1}, {NT, 1, 4000, 320, 0, 0, 0, 0, 0, 0, 0},
        {NT, 3, 1000, 1280, 7, 0, 5, 2, 0, 5, 1},  {NN, 1, 64, 1000, 0, 64, 0, 0, 32, 0, 0},
        {NT, 2, 700, 64, 128, 128, 0, 64, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_all_paths(g, &cases[i], 1000 + i);
}

/* Zero sizes: nothing happens (K = 0: C = 0, or unchanged with accumulate),
 * and unused pointers may be NULL. */
static void test_empty(whale_gemm *g) {
    for (int kind = 0; kind < 3; kind++)
        for (int acc = 0; acc < 2; acc++) {
            gcase t = {kind, 5, 7, 0, 2, 0, 3, 1, 0, 2, acc};
            run_all_paths(g, &t, 7);
            gcase z[] = {{kind, 0, 7, 9, 0, 0, 0, 0, 0, 0, acc},
                         {kind, 4, 0, 9, 0, 0, 0, 0, 0, 0, acc},
                         {kind, 0, 0, 0, 0, 0, 0, 0, 0, 0, acc}};
            for (int i = 0; i < 3; i++) run_all_paths(g, &z[i], 8);
        }
    whale_err err;
    float c = 3;
    CHECK(whale_gemm_nt(g, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, 0, &err) == WHALE_OK, "%s",
          err.msg);
    CHECK(whale_gemm_nn(g, 1, 1, 0, NULL, 0, NULL, 1, &c, 1, 1, &err) == WHALE_OK && c == 3,
          "K=0 accumulate changed C to %g", c);
    CHECK(whale_gemm_tn(g, 1, 1, 0, NULL, 1, NULL, 1, &c, 1, 0, &err) == WHALE_OK && c == 0,
          "K=0 left C at %g", c);
}

/* Mixture-of-experts pattern: the tokens per expert change every call (M
 * of nt and nn, K of tn). Shapes that go to the runtime primitive must
 * share one per kind; a repeated exact shape must hit the cache; the cache
 * stays bounded and evicted shapes still work. */
static void test_cache(void) {
    const whale_gemm_rules *R = whale_gemm_rules_for(whale_isa_active());
    whale_err err;
    whale_gemm *g;
    if (whale_gemm_new(&g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    whale_gemm_stats st;
    whale_rng r;
    whale_rng_seed(&r, 5);
    int failed = 0;
    for (int i = 0; i < 60; i++) {
        int tokens = R->exact_below_m_nt + (int)(whale_rng_u64(&r) % 300);
        gcase t = {i % 3, tokens, 40, 24, 0, 0, 0, 0, 0, 0, 0};
        if (t.kind == TN) { /* dW[out, in] = dY^T X: tokens are the sum */
            t.M = 40;
            t.N = 24;
            t.K = tokens;
        }
        if (t.kind == NN) t.M = R->own_max_m_nn + 1 + (int)(whale_rng_u64(&r) % 300);
        failed += !run_case(g, &t, ONLY(WHALE_GEMM_AUTO), i & 1, whale_rng_u64(&r));
    }
    whale_gemm_get_stats(g, &st);
    CHECK(failed == 0, "%d varying-shape products failed", failed);
    CHECK(st.created == 3, "varying shapes created %lld primitives, want 3 (one per kind)",
          (long long)st.created);
    CHECK(st.hits == 57, "varying shapes: %lld cache hits, want 57", (long long)st.hits);

    /* the same small shape again and again: one primitive */
    int64_t created0 = st.created;
    for (int i = 0; i < 10; i++) {
        gcase t = {NT, 50, 30, 20, 0, 0, 0, 0, 0, 0, 1};
        run_case(g, &t, ONLY(WHALE_GEMM_AUTO), 1, 77 + i);
    }
    whale_gemm_get_stats(g, &st);
    CHECK(st.created == created0 + 1, "repeating one shape created %lld primitives",
          (long long)(st.created - created0));

    /* more distinct exact shapes than the cache holds: bounded, and old
     * shapes still compute correctly after being evicted */
    failed = 0;
    for (int round = 0; round < 2; round++)
        for (int M = 5; M < 5 + WHALE_GEMM_CACHE_CAP + 10; M++) {
            gcase t = {NN, M, 8, 8, 0, 0, 0, 0, 0, 0, 0};
            failed += !run_case(g, &t, ONLY(WHALE_GEMM_DNNL_EXACT), 1, (uint64_t)M);
        }
    whale_gemm_get_stats(g, &st);
    CHECK(failed == 0, "%d products failed around eviction", failed);
    CHECK(st.cached <= WHALE_GEMM_CACHE_CAP, "cache holds %d > %d", st.cached,
          WHALE_GEMM_CACHE_CAP);
    CHECK(st.evicted > 0, "no eviction after %d distinct shapes", WHALE_GEMM_CACHE_CAP + 10);
    whale_gemm_free(g);
}

/* The automatic choice follows the documented shape rules. */
static void test_rules(whale_gemm *g) {
    const whale_gemm_rules *R = whale_gemm_rules_for(whale_isa_active());
    const struct {
        int kind, M;
        int own; /* 1: our kernel, 0: oneDNN */
    } rules[] = {
        {NT, 1, 1},  {NT, R->own_max_m_nt, 1},     {NT, R->own_max_m_nt + 1, 0},
        {NN, 1, R->own_max_m_nn >= 1},     {NN, R->own_max_m_nn > 1 ? R->own_max_m_nn : 1, R->own_max_m_nn >= 1},
        {NN, R->own_max_m_nn + 1, 0},      {TN, 2, R->own_max_m_nn >= 2},
        {TN, R->own_max_m_nn + 1, 0},      {NT, R->exact_below_m_nt, 0},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        gcase t = {rules[i].kind, rules[i].M, 8, 8, 0, 0, 0, 0, 0, 0, 0};
        run_case(g, &t, ONLY(WHALE_GEMM_AUTO), 1, 300 + i);
        int own = !strncmp(whale_gemm_last_impl(g), "whale:", 6);
        CHECK(own == rules[i].own, "%s M=%d ran %s", kind_names[t.kind], t.M,
              whale_gemm_last_impl(g));
    }
    /* exact primitives for mid-size nt, one shared runtime primitive above */
    whale_gemm_stats a, b;
    whale_gemm_get_stats(g, &a);
    for (int M = R->own_max_m_nt + 1; M < R->own_max_m_nt + 4; M++) {
        gcase t = {NT, M, 9, 8, 0, 0, 0, 0, 0, 0, 0}; /* N = 9: shapes not seen yet */
        run_case(g, &t, ONLY(WHALE_GEMM_AUTO), 1, (uint64_t)M);
    }
    whale_gemm_get_stats(g, &b);
    CHECK(b.created - a.created == 3, "3 mid-size nt shapes created %lld primitives",
          (long long)(b.created - a.created));
    for (int M = R->exact_below_m_nt; M < R->exact_below_m_nt + 3; M++) {
        gcase t = {NT, M, 9, 8, 0, 0, 0, 0, 0, 0, 0};
        run_case(g, &t, ONLY(WHALE_GEMM_AUTO), 1, (uint64_t)M);
    }
    whale_gemm_get_stats(g, &a);
    CHECK(a.created - b.created <= 1, "3 large nt shapes created %lld primitives",
          (long long)(a.created - b.created));
}

/* Same call twice: bit-identical (no history-dependent choice). */
static void test_deterministic(whale_gemm *g) {
    whale_rng r;
    whale_rng_seed(&r, 9);
    static const int ms[] = {1, 3, 16, 200};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        int M = ms[i], N = 96, K = 200;
        float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * N * K);
        float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
        for (int j = 0; j < M * K; j++) A[j] = draw(&r, 0);
        for (int j = 0; j < N * K; j++) W[j] = draw(&r, 0);
        whale_err err;
        whale_code rc1 = whale_gemm_nt(g, M, N, K, A, K, W, K, C1, N, 0, &err);
        whale_code rc2 = whale_gemm_nt(g, M, N, K, A, K, W, K, C2, N, 0, &err);
        CHECK(!rc1 && !rc2 && !memcmp(C1, C2, sizeof(float) * M * N),
              "M=%d: repeated product differs", M);
        free(A);
        free(W);
        free(C1);
        free(C2);
    }
}

static void test_errors(whale_gemm *g) {
    float x[64] = {0};
    whale_err err;
    whale_code rc = whale_gemm_nt(g, 2, 2, 8, x, 4, x, 8, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "lda=4"), "lda < K: rc=%d %s", (int)rc, err.msg);
    rc = whale_gemm_nt(g, 2, 2, 8, x, 8, x, 7, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "ldw=7"), "ldw < K: rc=%d %s", (int)rc, err.msg);
    rc = whale_gemm_tn(g, 3, 2, 2, x, 2, x, 2, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "lda=2"), "tn lda < M: rc=%d %s", (int)rc,
          err.msg);
    rc = whale_gemm_nn(g, 2, 3, 2, x, 2, x, 2, x, 3, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "ldb=2"), "ldb < N: rc=%d %s", (int)rc, err.msg);
    rc = whale_gemm_nn(g, 2, 3, 2, x, 2, x, 3, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "ldc=2"), "ldc < N: rc=%d %s", (int)rc, err.msg);
    rc = whale_gemm_nt(g, -1, 2, 2, x, 2, x, 2, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG, "negative M accepted");
    rc = whale_gemm_nt(g, 2, 2, 2, NULL, 2, x, 2, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "NULL"), "NULL A: rc=%d %s", (int)rc, err.msg);
    rc = whale_gemm_nt(NULL, 2, 2, 2, x, 2, x, 2, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG, "NULL context accepted");
}

static void test_measure(whale_gemm *g) {
    double gf = whale_gemm_measure_gflops(g, 64, 96, 80, 3);
    CHECK(gf > 0, "measure_gflops returned %g", gf);
    CHECK(whale_gemm_measure_gflops(g, 0, 8, 8, 3) == 0, "measure_gflops on M=0");
    double bw = whale_measure_read_bandwidth((size_t)4 << 20, 2);
    CHECK(bw > 0, "read bandwidth %g", bw);
    CHECK(whale_measure_read_bandwidth(16, 2) == 0, "bandwidth of a 16-byte buffer");
}

/* ------------------------------------------------------------ bf16 weights
 *
 * whale_gemm_nt_bf16 against a double sum of the bf16-rounded operands:
 * products of two bf16 values are exact in fp32, so the only error is the
 * fp32 summation, bounded as above ((K + 2) u sum|a w| + 2 u |c|); dyadic
 * data (multiples of 1/16 are exact bf16) must come out exact. Padding of
 * W holds bf16 NaN, of A fp32 NaN. */

#define BF16_PATHS 0x1Fu /* auto, own, exact, runtime, own_portable */
static const char *const bf16_path_names[] = {"auto", "own", "exact", "runtime", "portable"};
static const uint16_t BF16_NAN = 0x7FC0;

static float bf16_round(float x) { return whale_bf16_to_float(whale_float_to_bf16(x)); }

typedef struct {
    int M, N, K, pad_a, pad_w, pad_c, acc;
} bcase;

/* Runs one bf16 case through the given paths. Also checks that our vdpbf16ps kernel
 * and the plain C one agree within twice the summation bound. */
static int run_bf16(whale_gemm *g, const bcase *t, unsigned paths, int dyadic, uint64_t seed) {
    whale_rng r;
    whale_rng_seed(&r, seed);
    const int M = t->M, N = t->N, K = t->K;
    const int lda = K + t->pad_a, ldw = K + t->pad_w, ldc = N + t->pad_c;
    float *A = malloc(((size_t)M * lda + 1) * sizeof(float));
    uint16_t *W = malloc(((size_t)N * ldw + 1) * sizeof(uint16_t));
    float *C = malloc(((size_t)M * ldc + 1) * sizeof(float));
    float *C0 = malloc(((size_t)M * ldc + 1) * sizeof(float));
    float *Cown = malloc(((size_t)M * ldc + 1) * sizeof(float));
    double *want = malloc(((size_t)M * N + 1) * sizeof(double));
    double *tol = malloc(((size_t)M * N + 1) * sizeof(double));
    if (!A || !W || !C || !C0 || !Cown || !want || !tol) {
        fprintf(stderr, "test_gemm: out of memory\n");
        exit(1);
    }
    for (int m = 0; m < M; m++)
        for (int k = 0; k < lda; k++)
            A[(size_t)m * lda + k] = k >= K ? NAN : draw(&r, dyadic);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < ldw; k++)
            W[(size_t)n * ldw + k] = k >= K ? BF16_NAN : whale_float_to_bf16(draw(&r, dyadic));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < ldc; n++)
            C0[(size_t)m * ldc + n] = n >= N ? C_SENTINEL : draw(&r, dyadic);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, s_abs = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)bf16_round(A[(size_t)m * lda + k]) *
                           whale_bf16_to_float(W[(size_t)n * ldw + k]);
                s += p;
                s_abs += fabs(p);
            }
            if (t->acc) s += C0[(size_t)m * ldc + n];
            want[(size_t)m * N + n] = s;
            tol[(size_t)m * N + n] = dyadic ? 0 : (K + 2) * 0x1p-24 * s_abs + 2 * 0x1p-24 * fabs(s);
        }
    int all_ok = 1, have_own = 0;
    for (int p = 0; p <= WHALE_GEMM_OWN_PORTABLE; p++) {
        if (!(paths >> p & 1)) continue;
        memcpy(C, C0, (size_t)M * ldc * sizeof(float));
        whale_err err = {0};
        whale_gemm_set_path(g, (whale_gemm_path)p);
        whale_code rc = whale_gemm_nt_bf16(g, M, N, K, A, lda, W, ldw, C, ldc, t->acc, &err);
        whale_gemm_set_path(g, WHALE_GEMM_AUTO);
        int ok = rc == WHALE_OK, guard_ok = 1, agree = 1;
        double worst = 0;
        for (int m = 0; ok && m < M; m++)
            for (int n = 0; n < ldc; n++) {
                const float got = C[(size_t)m * ldc + n];
                if (n >= N) {
                    guard_ok &= got == C_SENTINEL;
                    continue;
                }
                const double w = want[(size_t)m * N + n], tl = tol[(size_t)m * N + n];
                const double e = fabs(got - w);
                if (isnan(w) ? !isnan(got) : !(e <= tl)) ok = 0; /* NaN where none is due fails */
                if (tl > 0 && e / tl > worst) worst = e / tl;
                if (have_own && !isnan(w) &&
                    !(fabs(got - Cown[(size_t)m * ldc + n]) <= 2 * tl))
                    agree = 0;
            }
        CHECK(ok && guard_ok, "nt_bf16 M=%d N=%d K=%d pads=%d,%d,%d acc=%d path=%s impl=%s %s: "
              "rc=%d (%s) worst err/tol=%.3g, padding of C %s",
              M, N, K, t->pad_a, t->pad_w, t->pad_c, t->acc, bf16_path_names[p],
              whale_gemm_last_impl(g), dyadic ? "dyadic" : "random", (int)rc, rc ? err.msg : "",
              worst, guard_ok ? "intact" : "changed");
        if (p == WHALE_GEMM_OWN_PORTABLE && have_own)
            CHECK(agree, "nt_bf16 M=%d N=%d K=%d: own and portable kernels differ beyond 2x the "
                  "summation bound", M, N, K);
        if (p == WHALE_GEMM_OWN && rc == WHALE_OK) {
            memcpy(Cown, C, (size_t)M * ldc * sizeof(float));
            have_own = 1;
        }
        all_ok &= ok && guard_ok && agree;
    }
    free(A);
    free(W);
    free(C);
    free(C0);
    free(Cown);
    free(want);
    free(tol);
    return all_ok;
}

static void test_bf16_shapes(whale_gemm *g) {
    static const int ms[] = {1, 2, 3, 4, 5, 16, 17, 100, 255, 256, 600};
    static const int nk[][2] = {{1, 1},  {7, 33},   {64, 320}, {65, 31}, {130, 100},
                                {5, 64}, {33, 129}, {17, 1}};
    whale_rng r;
    whale_rng_seed(&r, 4242);
    int failed = 0, cases = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof nk / sizeof nk[0]; j++) {
            if (ms[i] > 100 && whale_rng_u64(&r) % 3) continue; /* big M: a sample */
            bcase t = {ms[i], nk[j][0], nk[j][1], 0, 0, 0, (int)(whale_rng_u64(&r) % 2)};
            if (whale_rng_u64(&r) % 2) {
                t.pad_a = 1 + (int)(whale_rng_u64(&r) % 40);
                t.pad_w = 1 + (int)(whale_rng_u64(&r) % 40);
                t.pad_c = 1 + (int)(whale_rng_u64(&r) % 20);
            }
            failed += !run_bf16(g, &t, BF16_PATHS, 1, whale_rng_u64(&r));
            failed += !run_bf16(g, &t, BF16_PATHS, 0, whale_rng_u64(&r));
            cases++;
        }
    /* model shapes: a Linear and a slice of the lm_head, decode and prefill */
    static const bcase model[] = {{1, 1280, 320, 0, 0, 0, 0},   {3, 1000, 1280, 7, 5, 2, 1},
                                  {1, 4000, 320, 0, 0, 0, 1},   {130, 256, 320, 0, 0, 0, 0},
                                  {300, 320, 1280, 0, 0, 0, 1}, {16, 700, 64, 64, 0, 0, 0}};
    for (size_t i = 0; i < sizeof model / sizeof model[0]; i++, cases++)
        failed += !run_bf16(g, &model[i], BF16_PATHS, 0, 900 + i);
    printf("test_gemm: %d bf16 cases x 5 paths, %d failed\n", cases, failed);
}

/* A is rounded to nearest even, not truncated: with W = 1 the product is
 * the rounded A itself, exactly (bf16 spacing in [1, 2) is 2^-7). */
static void test_bf16_rounding(whale_gemm *g) {
    static const struct {
        float a, want;
    } v[] = {
        {1 + 0x1p-8f, 1},                     /* tie, even below */
        {1 + 0x1p-7f + 0x1p-8f, 1 + 0x1p-6f}, /* tie, even above (truncation: 1 + 2^-7) */
        {1 + 0x1p-8f + 0x1p-20f, 1 + 0x1p-7f}, /* just over half: up (truncation: 1) */
        {-(1 + 0x1p-7f + 0x1p-8f), -(1 + 0x1p-6f)},
        {3.0f - 0x1p-9f, 3.0f},
    };
    const int M = (int)(sizeof v / sizeof v[0]);
    float A[sizeof v / sizeof v[0]], C[sizeof v / sizeof v[0]][2];
    const uint16_t W[2] = {whale_float_to_bf16(1.0f), whale_float_to_bf16(-2.0f)};
    for (int m = 0; m < M; m++) A[m] = v[m].a;
    for (int p = 0; p <= WHALE_GEMM_OWN_PORTABLE; p++) {
        whale_err err;
        whale_gemm_set_path(g, (whale_gemm_path)p);
        whale_code rc = whale_gemm_nt_bf16(g, M, 2, 1, A, 1, W, 1, &C[0][0], 2, 0, &err);
        whale_gemm_set_path(g, WHALE_GEMM_AUTO);
        CHECK(rc == WHALE_OK, "rounding path=%s: %s", bf16_path_names[p], err.msg);
        for (int m = 0; rc == WHALE_OK && m < M; m++)
            CHECK(C[m][0] == v[m].want && C[m][1] == -2 * v[m].want,
                  "path=%s impl=%s: A=%.9g gave %.9g, %.9g; want %.9g (round to nearest even)",
                  bf16_path_names[p], whale_gemm_last_impl(g), v[m].a, C[m][0], C[m][1],
                  v[m].want);
    }
}

/* NaN in A poisons its row of C, NaN in W its column; nothing else. */
static void test_bf16_nan(whale_gemm *g) {
    static const int ms[] = {3, 40, 300};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const int M = ms[i], N = 37, K = 45;
        float *A = malloc(sizeof(float) * M * K);
        uint16_t *W = malloc(sizeof(uint16_t) * N * K);
        float *C = malloc(sizeof(float) * M * N);
        whale_rng r;
        whale_rng_seed(&r, 31 + i);
        for (int j = 0; j < M * K; j++) A[j] = draw(&r, 0);
        for (int j = 0; j < N * K; j++) W[j] = whale_float_to_bf16(draw(&r, 0));
        A[1 * K + 44] = NAN;      /* row 1, last k (the masked tail) */
        W[5 * K + 0] = BF16_NAN; /* column 5 */
        for (int p = 0; p <= WHALE_GEMM_OWN_PORTABLE; p++) {
            whale_err err;
            whale_gemm_set_path(g, (whale_gemm_path)p);
            whale_code rc = whale_gemm_nt_bf16(g, M, N, K, A, K, W, K, C, N, 0, &err);
            whale_gemm_set_path(g, WHALE_GEMM_AUTO);
            int bad = rc != WHALE_OK;
            for (int m = 0; !bad && m < M; m++)
                for (int n = 0; n < N; n++)
                    bad += !isnan(C[m * N + n]) != !(m == 1 || n == 5);
            CHECK(!bad, "NaN propagation M=%d path=%s impl=%s: rc=%d, %d wrong entries", M,
                  bf16_path_names[p], whale_gemm_last_impl(g), (int)rc, bad);
        }
        free(A);
        free(W);
        free(C);
    }
}

/* The vectorised conversion is bit-identical to the scalar one, including
 * ties, subnormals, infinities, overflow to inf and NaN; any length. */
static void test_bf16_convert(void) {
    enum { N = 1003 };
    float *src = malloc(sizeof(float) * N);
    uint16_t *dst = malloc(sizeof(uint16_t) * (N + 1));
    whale_rng r;
    whale_rng_seed(&r, 77);
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                       0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x00000001u,
                                       0x00018000u, 0x7f7f8000u, 0x7f7fffffu, 0x3f808000u,
                                       0x3f818000u, 0x3f808001u, 0x807fffffu};
    for (int i = 0; i < N; i++) {
        uint32_t u = i < (int)(sizeof special / sizeof special[0])
                         ? special[i]
                         : (uint32_t)whale_rng_u64(&r);
        if (i % 3 == 0 && i > 20) u = (u & 0xffff0000u) | 0x8000u; /* ties */
        memcpy(&src[i], &u, 4);
    }
    int bad = 0;
    for (int n = 0; n <= N; n += (n < 40 ? 1 : 97)) {
        dst[n] = 0xBEEF;
        whale_f32_to_bf16_rows(dst, src, (size_t)n);
        for (int i = 0; i < n; i++) {
            uint16_t want = whale_float_to_bf16(src[i]);
            bad += dst[i] != want;
            if (isnan(src[i])) bad += !isnan(whale_bf16_to_float(dst[i]));
        }
        bad += dst[n] != 0xBEEF; /* nothing written past n */
    }
    CHECK(bad == 0, "whale_f32_to_bf16_rows: %d values differ from whale_float_to_bf16", bad);
    free(src);
    free(dst);
}

/* Shape rules, primitive caching and the implementation oneDNN picks. */
static void test_bf16_rules(void) {
    const whale_gemm_rules *R = whale_gemm_rules_for(whale_isa_active());
    whale_err err;
    whale_gemm *g;
    if (whale_gemm_new(&g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    bcase t = {R->own_max_m_nt, 64, 40, 0, 0, 0, 0};
    run_bf16(g, &t, 1, 1, 1);
    CHECK(!strncmp(whale_gemm_last_impl(g), "whale:", 6), "bf16 M=%d ran %s", t.M,
          whale_gemm_last_impl(g));
    whale_gemm_stats st;
    for (int i = 0; i < 3; i++) { /* the same exact shape: one primitive */
        t.M = R->own_max_m_nt + 1;
        run_bf16(g, &t, 1, 1, 2 + i);
    }
    whale_gemm_get_stats(g, &st);
    CHECK(st.created == 1 && st.hits == 2, "bf16 exact shape thrice: created %lld, hits %lld",
          (long long)st.created, (long long)st.hits);
    /* what runs it follows the tier and the processor: oneDNN's brgemm on
     * the bf16 or AMX instructions where they are fast, else f32 products
     * of the widened operands (on AVX-512 instructions from that tier up) */
    const char *impl = whale_gemm_last_impl(g);
    const whale_isa tier = whale_isa_active();
    const int native = whale_gemm_bf16_native();
    CHECK(native == (tier == WHALE_ISA_AMX || (tier == WHALE_ISA_AVX512_BF16 && whale_cpu_bf16_dot_fast())),
          "bf16 products native %d at tier %s", native, whale_isa_name(tier));
    if (native)
        CHECK(!strncmp(impl, "brg:", 4) && strstr(impl, "bf16") && !strstr(impl, "amx") == (tier != WHALE_ISA_AMX),
              "bf16 M=%d ran %s at tier %s", t.M, impl, whale_isa_name(tier));
    else
        CHECK(!strncmp(impl, "cvt_bf16+", 9) && !strstr(impl + 9, "bf16") && !strstr(impl, "amx") &&
                  (tier >= WHALE_ISA_AVX512 || !strstr(impl, "avx512")),
              "bf16 M=%d ran %s at tier %s", t.M, impl, whale_isa_name(tier));
    /* varying large M: one runtime primitive, separate from the f32 ones */
    for (int M = R->bf16_exact_below_m_nt; M < R->bf16_exact_below_m_nt + 30;
         M += 7) {
        t.M = M;
        run_bf16(g, &t, 1, 1, (uint64_t)M);
    }
    gcase f = {NT, 300, 64, 40, 0, 0, 0, 0, 0, 0, 0};
    run_case(g, &f, ONLY(WHALE_GEMM_AUTO), 1, 5);
    whale_gemm_get_stats(g, &st);
    /* where the bf16 products are f32 ones, the f32 call finds their
     * runtime primitive */
    const int want = native ? 3 : 2;
    CHECK(st.created == want, "bf16 varying M then f32: created %lld primitives, want %d",
          (long long)st.created, want);
    /* errors are reported like the f32 ones */
    float x[64] = {0};
    uint16_t w[64] = {0};
    whale_code rc = whale_gemm_nt_bf16(g, 2, 2, 8, x, 8, w, 7, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "ldw=7"), "bf16 ldw < K: rc=%d %s", (int)rc,
          err.msg);
    rc = whale_gemm_nt_bf16(g, 2, 2, 8, x, 8, NULL, 8, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "W is NULL"), "bf16 NULL W: rc=%d %s", (int)rc,
          err.msg);
    x[0] = 5;
    CHECK(whale_gemm_nt_bf16(g, 1, 1, 0, NULL, 0, NULL, 0, x, 1, 1, &err) == WHALE_OK && x[0] == 5,
          "bf16 K=0 accumulate changed C");
    CHECK(whale_gemm_measure_gflops_bf16(g, 64, 96, 80, 2) > 0, "measure_gflops_bf16 failed");
    whale_gemm_free(g);
}

/* ------------------------------------------------------------ fp16, int8, bf16 backward
 *
 * nt_f16, nt_q8, nn_bf16, tn_bf16, nn_f16, tn_f16, nn_b16, tn_b16 against a
 * double sum of the rounded operands (A to fp16, or to bf16 for q8 and the
 * bf16 kinds; f32 B of tn likewise; fp16 / bf16 / int8 B decoded exactly;
 * the b16 kinds get A already rounded, as bf16 patterns). Every
 * product of two rounded values is exact in fp32, so the same summation
 * bound applies ((K + 2) u sum|a b| + 2 u |c|, one more u for the scale of
 * q8), and dyadic data (exact in every format; q8 with power-of-two
 * scales) must come out exact. Each case runs through every path; our
 * kernel and the oneDNN paths must also agree within twice the bound.
 * Padding of A and B holds NaN (int8: 127), of C a sentinel. */

enum {
    MX_NT_F16, MX_NT_Q8, MX_NN_BF16, MX_TN_BF16, MX_NN_F16, MX_TN_F16, MX_NN_B16, MX_TN_B16, MX_COUNT
};
static const char *const mx_names[] = {"nt_f16", "nt_q8",  "nn_bf16", "tn_bf16",
                                       "nn_f16", "tn_f16", "nn_b16",  "tn_b16"};
static const int mx_layout[] = {NT, NT, NN, TN, NN, TN, NN, TN};
static const uint16_t F16_NAN = 0x7e00;

static int mx_f16(int kind) { return kind == MX_NT_F16 || kind == MX_NN_F16 || kind == MX_TN_F16; }

/* B stored as bf16 patterns */
static int mx_b_bf16(int kind) { return kind == MX_NN_BF16 || kind == MX_NN_B16 || kind == MX_TN_B16; }

/* bytes per stored B element */
static size_t mx_bsize(int kind) {
    return kind == MX_NT_Q8 ? 1 : kind == MX_TN_BF16 || kind == MX_TN_F16 ? 4 : 2;
}

static float f16_round(float x) { return whale_f16_to_float(whale_float_to_f16(x)); }

/* A (or an f32 B) value as the product sees it */
static double mx_round(int kind, float x) { return mx_f16(kind) ? f16_round(x) : bf16_round(x); }

typedef struct {
    int kind, M, N, K, pad_a, pad_b, pad_c, acc;
} mcase;

typedef struct {
    float *A, *C0;
    uint16_t *A16; /* A rounded to bf16 (the b16 kinds' A) */
    void *B;
    float *scale;
    int lda, ldb, ldc, a_rows, b_rows;
} mdata;

/* B element (k, n) as stored, decoded. */
static double mx_b(const mcase *t, const mdata *d, int k, int n) {
    const size_t i = mx_layout[t->kind] == NT ? (size_t)n * d->ldb + k : (size_t)k * d->ldb + n;
    if (mx_b_bf16(t->kind)) return whale_bf16_to_float(((const uint16_t *)d->B)[i]);
    switch (t->kind) {
    case MX_NT_Q8: return ((const int8_t *)d->B)[i];
    case MX_NT_F16:
    case MX_NN_F16: return whale_f16_to_float(((const uint16_t *)d->B)[i]);
    default: return mx_round(t->kind, ((const float *)d->B)[i]);
    }
}

static double mx_a(const mcase *t, const mdata *d, int m, int k) {
    const size_t i = mx_layout[t->kind] == TN ? (size_t)k * d->lda + m : (size_t)m * d->lda + k;
    return mx_round(t->kind, d->A[i]);
}

static whale_code mx_call(whale_gemm *g, const mcase *t, const mdata *d, float *C, whale_err *err) {
    const int M = t->M, N = t->N, K = t->K;
    switch (t->kind) {
    case MX_NT_F16:
        return whale_gemm_nt_f16(g, M, N, K, d->A, d->lda, d->B, d->ldb, C, d->ldc, t->acc, err);
    case MX_NT_Q8:
        return whale_gemm_nt_q8(g, M, N, K, d->A, d->lda, d->B, d->ldb, d->scale, C, d->ldc, t->acc,
                                err);
    case MX_NN_BF16:
        return whale_gemm_nn_bf16(g, M, N, K, d->A, d->lda, d->B, d->ldb, C, d->ldc, t->acc, err);
    case MX_TN_BF16:
        return whale_gemm_tn_bf16(g, M, N, K, d->A, d->lda, d->B, d->ldb, C, d->ldc, t->acc, err);
    case MX_NN_B16:
        return whale_gemm_nn_b16(g, M, N, K, d->A16, d->lda, d->B, d->ldb, C, d->ldc, t->acc, err);
    case MX_TN_B16:
        return whale_gemm_tn_b16(g, M, N, K, d->A16, d->lda, d->B, d->ldb, C, d->ldc, t->acc, err);
    case MX_NN_F16:
        return whale_gemm_nn_f16(g, M, N, K, d->A, d->lda, d->B, d->ldb, C, d->ldc, t->acc, err);
    default:
        return whale_gemm_tn_f16(g, M, N, K, d->A, d->lda, d->B, d->ldb, C, d->ldc, t->acc, err);
    }
}

/* Operands for a case; dyadic: multiples of 1/16 in [-1/2, 1/2] (int8:
 * any value, scales powers of two). */
static void mx_make(const mcase *t, mdata *d, int dyadic, uint64_t seed) {
    whale_rng r;
    whale_rng_seed(&r, seed);
    const int L = mx_layout[t->kind];
    const int a_cols = L == TN ? t->M : t->K, b_cols = L == NT ? t->K : t->N;
    d->a_rows = L == TN ? t->K : t->M;
    d->b_rows = L == NT ? t->N : t->K;
    d->lda = a_cols + t->pad_a;
    d->ldb = b_cols + t->pad_b;
    d->ldc = t->N + t->pad_c;
    const size_t bs = mx_bsize(t->kind);
    d->A = malloc(((size_t)d->a_rows * d->lda + 1) * sizeof(float));
    d->A16 = malloc(((size_t)d->a_rows * d->lda + 1) * sizeof(uint16_t));
    d->B = malloc(((size_t)d->b_rows * d->ldb + 1) * bs);
    d->C0 = malloc(((size_t)t->M * d->ldc + 1) * sizeof(float));
    d->scale = malloc(((size_t)t->N + 1) * sizeof(float));
    if (!d->A || !d->A16 || !d->B || !d->C0 || !d->scale) {
        fprintf(stderr, "test_gemm: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < d->a_rows; i++)
        for (int j = 0; j < d->lda; j++) {
            d->A[(size_t)i * d->lda + j] = j >= a_cols ? NAN : draw(&r, dyadic);
            d->A16[(size_t)i * d->lda + j] = whale_float_to_bf16(d->A[(size_t)i * d->lda + j]);
        }
    for (int i = 0; i < d->b_rows; i++)
        for (int j = 0; j < d->ldb; j++) {
            const size_t at = (size_t)i * d->ldb + j;
            const int pad = j >= b_cols;
            const float v = draw(&r, dyadic);
            switch (t->kind) {
            case MX_NT_Q8:
                ((int8_t *)d->B)[at] = pad ? 127 : (int8_t)((int)(whale_rng_u64(&r) % 255) - 127);
                break;
            case MX_NN_BF16:
            case MX_NN_B16:
            case MX_TN_B16: ((uint16_t *)d->B)[at] = pad ? BF16_NAN : whale_float_to_bf16(v); break;
            case MX_NT_F16:
            case MX_NN_F16: ((uint16_t *)d->B)[at] = pad ? F16_NAN : whale_float_to_f16(v); break;
            default: ((float *)d->B)[at] = pad ? NAN : v; break;
            }
        }
    for (int n = 0; n < t->N; n++)
        d->scale[n] = dyadic ? ldexpf(1.0f, -6 - (int)(whale_rng_u64(&r) % 3))
                             : 0.001f + 0.02f * whale_rng_uniform(&r);
    for (int m = 0; m < t->M; m++)
        for (int n = 0; n < d->ldc; n++)
            d->C0[(size_t)m * d->ldc + n] = n >= t->N ? C_SENTINEL : draw(&r, dyadic);
}

static void mx_free(mdata *d) {
    free(d->A);
    free(d->A16);
    free(d->B);
    free(d->C0);
    free(d->scale);
}

#define MX_PATHS 0x1Fu /* auto, own, exact, runtime, own_portable */

/* Sanitized builds (-O0, slow) run one in MX_SAMPLE grid cases. */
#if defined(__SANITIZE_ADDRESS__)
#define MX_SAMPLE 4
#else
#define MX_SAMPLE 1
#endif

/* One case through the given paths; returns 1 if all passed. */
static int run_mixed(whale_gemm *g, const mcase *t, unsigned paths, int dyadic, uint64_t seed) {
    const int M = t->M, N = t->N, K = t->K;
    mdata d;
    mx_make(t, &d, dyadic, seed);
    double *want = malloc(((size_t)M * N + 1) * sizeof(double));
    double *tol = malloc(((size_t)M * N + 1) * sizeof(double));
    float *C = malloc(((size_t)M * d.ldc + 1) * sizeof(float));
    float *Cown = malloc(((size_t)M * d.ldc + 1) * sizeof(float));
    double *bcol = malloc(((size_t)K + 1) * sizeof(double));
    double *arow = malloc(((size_t)M * K + 1) * sizeof(double)); /* A rounded, [M, K] */
    if (!want || !tol || !C || !Cown || !bcol || !arow) {
        fprintf(stderr, "test_gemm: out of memory\n");
        exit(1);
    }
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) arow[(size_t)m * K + k] = mx_a(t, &d, m, k);
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++) bcol[k] = mx_b(t, &d, k, n);
        const double sc = t->kind == MX_NT_Q8 ? d.scale[n] : 1;
        for (int m = 0; m < M; m++) {
            double s = 0, s_abs = 0;
            for (int k = 0; k < K; k++) {
                const double p = arow[(size_t)m * K + k] * bcol[k];
                s += p;
                s_abs += fabs(p);
            }
            s *= sc;
            s_abs *= sc;
            if (t->acc) s += d.C0[(size_t)m * d.ldc + n];
            want[(size_t)m * N + n] = s;
            tol[(size_t)m * N + n] = dyadic ? 0 : (K + 3) * 0x1p-24 * s_abs + 2 * 0x1p-24 * fabs(s);
        }
    }
    int all_ok = 1, have_own = 0;
    for (int p = 0; p <= WHALE_GEMM_OWN_PORTABLE; p++) {
        if (!(paths >> p & 1)) continue;
        memcpy(C, d.C0, (size_t)M * d.ldc * sizeof(float));
        whale_err err = {0};
        whale_gemm_set_path(g, (whale_gemm_path)p);
        whale_code rc = mx_call(g, t, &d, C, &err);
        whale_gemm_set_path(g, WHALE_GEMM_AUTO);
        int ok = rc == WHALE_OK, guard_ok = 1, agree = 1;
        double worst = 0;
        for (int m = 0; ok && m < M; m++)
            for (int n = 0; n < d.ldc; n++) {
                const float got = C[(size_t)m * d.ldc + n];
                if (n >= N) {
                    guard_ok &= got == C_SENTINEL;
                    continue;
                }
                const double w = want[(size_t)m * N + n], tl = tol[(size_t)m * N + n];
                const double e = fabs(got - w);
                if (!(e <= tl)) ok = 0;
                if (tl > 0 && e / tl > worst) worst = e / tl;
                if (have_own && !(fabs(got - Cown[(size_t)m * d.ldc + n]) <= 2 * tl)) agree = 0;
            }
        CHECK(ok && guard_ok && agree,
              "%s M=%d N=%d K=%d pads=%d,%d,%d acc=%d path=%s impl=%s %s: rc=%d (%s) worst "
              "err/tol=%.3g, padding of C %s, %s",
              mx_names[t->kind], M, N, K, t->pad_a, t->pad_b, t->pad_c, t->acc,
              bf16_path_names[p], whale_gemm_last_impl(g), dyadic ? "dyadic" : "random", (int)rc,
              rc ? err.msg : "", worst, guard_ok ? "intact" : "changed",
              agree ? "agrees with own" : "differs from own beyond 2x the bound");
        if (p == WHALE_GEMM_OWN && rc == WHALE_OK) {
            memcpy(Cown, C, (size_t)M * d.ldc * sizeof(float));
            have_own = 1;
        }
        all_ok &= ok && guard_ok && agree;
    }
    mx_free(&d);
    free(want);
    free(tol);
    free(C);
    free(Cown);
    free(bcol);
    free(arow);
    return all_ok;
}

static void test_mixed_shapes(whale_gemm *g) {
    static const int ms[] = {1, 3, 16, 17, 100, 300};
    static const int nk[][2] = {{1, 1},    {7, 33},  {65, 31}, {130, 100},
                                {33, 129}, {17, 320}, {5, 64},  {64, 17}};
    whale_rng r;
    whale_rng_seed(&r, 777);
    int failed = 0, cases = 0;
    for (int kind = 0; kind < MX_COUNT; kind++)
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            for (size_t j = 0; j < sizeof nk / sizeof nk[0]; j++) {
                if (ms[i] >= 100 && whale_rng_u64(&r) % 3) continue; /* big M: a sample */
                if (whale_rng_u64(&r) % MX_SAMPLE) continue;
                mcase t = {kind, ms[i], nk[j][0], nk[j][1], 0, 0, 0, (int)(whale_rng_u64(&r) % 2)};
                if (whale_rng_u64(&r) % 3) {
                    t.pad_a = 1 + (int)(whale_rng_u64(&r) % 40);
                    t.pad_b = 1 + (int)(whale_rng_u64(&r) % 40);
                    t.pad_c = 1 + (int)(whale_rng_u64(&r) % 20);
                }
                failed += !run_mixed(g, &t, MX_PATHS, 1, whale_rng_u64(&r));
                failed += !run_mixed(g, &t, MX_PATHS, 0, whale_rng_u64(&r));
                cases++;
            }
    /* model shapes: decode through a Linear, prefill, backward of a Linear */
    static const mcase model[] = {
        {MX_NT_F16, 1, 1280, 320, 0, 0, 0, 0},   {MX_NT_Q8, 1, 1280, 320, 0, 0, 0, 0},
        {MX_NT_F16, 4, 640, 320, 3, 5, 7, 1},    {MX_NT_Q8, 16, 640, 320, 3, 5, 7, 1},
        {MX_NT_F16, 130, 256, 320, 0, 0, 0, 1},  {MX_NT_Q8, 130, 256, 320, 0, 0, 0, 0},
        {MX_NN_BF16, 130, 320, 640, 0, 0, 0, 0}, {MX_TN_BF16, 640, 320, 130, 0, 0, 0, 1},
        {MX_NN_F16, 130, 320, 640, 0, 0, 0, 1},  {MX_TN_F16, 640, 320, 130, 0, 0, 0, 0},
        /* the lm_head's backward on a chunk of its logit gradient, rows of
         * bf16 in the first half of each fp32 row (lda twice the row) */
        {MX_NN_B16, 70, 64, 3000, 3000, 0, 0, 0}, {MX_TN_B16, 3000, 64, 70, 3000, 0, 0, 1},
        {MX_NN_B16, 130, 320, 640, 0, 0, 0, 1},  {MX_TN_B16, 640, 320, 130, 0, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof model / sizeof model[0]; i++, cases++)
        failed += !run_mixed(g, &model[i], MX_PATHS, 0, 5000 + i);
    printf("test_gemm: %d fp16/int8/bf16-backward cases x 5 paths, %d failed\n", cases, failed);
}

/* Several blocks of every kind of gemm_converted (rows, columns, K split;
 * the q8 scale with accumulate), forced through tiny block limits. */
static void test_mixed_blocks(void) {
    whale_err err;
    whale_gemm *g;
    if (whale_gemm_new(&g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    whale_gemm_set_block_limits(g, 16, 4096); /* 16 x 16 blocks, K in 32..64 */
    int failed = 0;
    for (int kind = 0; kind < MX_COUNT; kind++)
        for (int acc = 0; acc < 2; acc++) {
            mcase t = {kind, 40, 50, 150, 3, 2, 1, acc};
            failed += !run_mixed(g, &t, MX_PATHS, 1, 60 + kind);
            failed += !run_mixed(g, &t, MX_PATHS, 0, 70 + kind);
            mcase u = {kind, 17, 33, 70, 0, 0, 0, acc};
            failed += !run_mixed(g, &u, MX_PATHS, 0, 80 + kind);
        }
    CHECK(failed == 0, "%d products on many blocks failed", failed);
    /* nt_q8 in chunks of W's rows handed to the threads: 3 blocks of rows,
     * 4 or more chunks (uneven with 3 threads), scales applied by oneDNN,
     * with and without accumulate, at 1, 2 and 3 threads */
    whale_gemm_set_block_limits(g, 16, 1 << 15);
    const int threads = whale_get_threads();
    for (int nthr = 1; nthr <= 3; nthr++) {
        whale_set_threads(nthr);
        for (int acc = 0; acc < 2; acc++) {
            mcase t = {MX_NT_Q8, 40, 50, 150, 3, 2, 1, acc};
            failed += !run_mixed(g, &t, MX_PATHS, 1, 90 + nthr);
            failed += !run_mixed(g, &t, MX_PATHS, 0, 95 + nthr);
        }
    }
    whale_set_threads(threads);
    CHECK(failed == 0, "%d products in chunks failed", failed);
    whale_gemm_set_block_limits(g, 0, 0);
    whale_gemm_free(g);
}

/* Rounding of A: ties to even, fp16 subnormals and overflow, against W = 1
 * (and -2): the product is the rounded A itself. */
static void test_mixed_rounding(whale_gemm *g) {
    static const struct {
        float a, f16, bf16;
    } v[] = {
        {1 + 0x1p-11f, 1, 1},                         /* fp16 tie, even below */
        {1 + 0x3p-11f, 1 + 0x1p-9f, 1},               /* fp16 tie, even above */
        {1 + 0x1p-8f, 1 + 0x1p-8f, 1},                /* bf16 tie, even below */
        {1 + 0x3p-8f, 1 + 0x3p-8f, 1 + 0x1p-6f},      /* bf16 tie, even above */
        {0x1.8p-24f, 0x1p-23f, 0x1.8p-24f},           /* fp16 subnormal tie */
        {0x1p-25f, 0, 0x1p-25f},                      /* half the smallest: 0 */
        {65519.99f, 65504, 65536},                    /* below the fp16 midpoint */
        {-65520.0f, -INFINITY, -65536},               /* fp16 overflow */
        {3.0f - 0x1p-9f, 3.0f - 0x1p-9f, 3.0f},
    };
    const int M = (int)(sizeof v / sizeof v[0]);
    float A[sizeof v / sizeof v[0]], C[sizeof v / sizeof v[0]][2];
    for (int m = 0; m < M; m++) A[m] = v[m].a;
    const uint16_t wf16[2] = {whale_float_to_f16(1.0f), whale_float_to_f16(-2.0f)};
    const uint16_t wbf16[2] = {whale_float_to_bf16(1.0f), whale_float_to_bf16(-2.0f)};
    const int8_t w8[2] = {1, -2};
    const float scale[2] = {1, 1};
    const float Bt[2] = {1, -2}; /* tn: B [K=1, N=2] */
    uint16_t A16[sizeof v / sizeof v[0]];
    for (int m = 0; m < M; m++) A16[m] = whale_float_to_bf16(v[m].a); /* the b16 kinds' rounded A */
    for (int kind = 0; kind < MX_COUNT; kind++)
        for (int p = 0; p <= WHALE_GEMM_OWN_PORTABLE; p++) {
            whale_err err;
            whale_code rc;
            whale_gemm_set_path(g, (whale_gemm_path)p);
            switch (kind) {
            case MX_NT_F16: rc = whale_gemm_nt_f16(g, M, 2, 1, A, 1, wf16, 1, &C[0][0], 2, 0, &err); break;
            case MX_NT_Q8:
                rc = whale_gemm_nt_q8(g, M, 2, 1, A, 1, w8, 1, scale, &C[0][0], 2, 0, &err);
                break;
            case MX_NN_BF16: rc = whale_gemm_nn_bf16(g, M, 2, 1, A, 1, wbf16, 2, &C[0][0], 2, 0, &err); break;
            case MX_NN_F16: rc = whale_gemm_nn_f16(g, M, 2, 1, A, 1, wf16, 2, &C[0][0], 2, 0, &err); break;
            case MX_TN_BF16: rc = whale_gemm_tn_bf16(g, M, 2, 1, A, M, Bt, 2, &C[0][0], 2, 0, &err); break;
            case MX_NN_B16: rc = whale_gemm_nn_b16(g, M, 2, 1, A16, 1, wbf16, 2, &C[0][0], 2, 0, &err); break;
            case MX_TN_B16: rc = whale_gemm_tn_b16(g, M, 2, 1, A16, M, wbf16, 2, &C[0][0], 2, 0, &err); break;
            default: rc = whale_gemm_tn_f16(g, M, 2, 1, A, M, Bt, 2, &C[0][0], 2, 0, &err); break;
            }
            whale_gemm_set_path(g, WHALE_GEMM_AUTO);
            CHECK(rc == WHALE_OK, "%s rounding path=%s: %s", mx_names[kind], bf16_path_names[p], err.msg);
            for (int m = 0; rc == WHALE_OK && m < M; m++) {
                const float want = mx_f16(kind) ? v[m].f16 : v[m].bf16;
                /* the bf16 instructions flush subnormals: allow 0 there */
                const int flush = !mx_f16(kind) && fabsf(want) < 0x1p-126f && C[m][0] == 0;
                CHECK((C[m][0] == want && C[m][1] == -2 * want) || flush,
                      "%s path=%s impl=%s: A=%a gave %a, %a; want %a", mx_names[kind],
                      bf16_path_names[p], whale_gemm_last_impl(g), v[m].a, C[m][0], C[m][1], want);
            }
        }
}

/* NaN in A poisons its row of C, in B (int8: a NaN scale) its column;
 * nothing else. */
static void test_mixed_nan(whale_gemm *g) {
    static const int ms[] = {3, 40, 300};
    for (int kind = 0; kind < MX_COUNT; kind++)
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            mcase t = {kind, ms[i], 37, 45, 0, 0, 0, 0};
            mdata d;
            mx_make(&t, &d, 0, 31 + i);
            const int L = mx_layout[kind];
            const size_t a1 = L == TN ? (size_t)44 * d.lda + 1 : (size_t)1 * d.lda + 44; /* row 1, last k */
            d.A[a1] = NAN;
            d.A16[a1] = BF16_NAN;
            const size_t b5 = L == NT ? (size_t)5 * d.ldb : 5;                    /* column 5, k = 0 */
            switch (kind) {
            case MX_NT_Q8: d.scale[5] = NAN; break;
            case MX_NN_BF16:
            case MX_NN_B16:
            case MX_TN_B16: ((uint16_t *)d.B)[b5] = BF16_NAN; break;
            case MX_NT_F16:
            case MX_NN_F16: ((uint16_t *)d.B)[b5] = F16_NAN; break;
            default: ((float *)d.B)[b5] = NAN; break;
            }
            float *C = malloc(sizeof(float) * t.M * d.ldc);
            for (int p = 0; p <= WHALE_GEMM_OWN_PORTABLE; p++) {
                whale_err err;
                whale_gemm_set_path(g, (whale_gemm_path)p);
                whale_code rc = mx_call(g, &t, &d, C, &err);
                whale_gemm_set_path(g, WHALE_GEMM_AUTO);
                int bad = rc != WHALE_OK;
                for (int m = 0; !bad && m < t.M; m++)
                    for (int n = 0; n < t.N; n++)
                        bad += !isnan(C[m * d.ldc + n]) != !(m == 1 || n == 5);
                CHECK(!bad, "%s NaN propagation M=%d path=%s impl=%s: rc=%d, %d wrong entries",
                      mx_names[kind], t.M, bf16_path_names[p], whale_gemm_last_impl(g), (int)rc, bad);
            }
            free(C);
            mx_free(&d);
        }
}

/* Zero sizes, errors, repeatability, the dtype measurement. */
static void test_mixed_misc(whale_gemm *g) {
    whale_err err;
    float c[4] = {3, 3, 3, 3}, x[64] = {0};
    uint16_t h[64] = {0};
    int8_t q[64] = {0};
    CHECK(whale_gemm_nt_f16(g, 1, 1, 0, NULL, 0, NULL, 0, c, 1, 1, &err) == WHALE_OK && c[0] == 3,
          "nt_f16 K=0 accumulate changed C");
    CHECK(whale_gemm_nt_q8(g, 1, 1, 0, NULL, 0, NULL, 0, NULL, c, 1, 0, &err) == WHALE_OK && c[0] == 0,
          "nt_q8 K=0 left C at %g", c[0]);
    CHECK(whale_gemm_nn_bf16(g, 0, 3, 2, NULL, 2, NULL, 3, NULL, 3, 0, &err) == WHALE_OK, "nn_bf16 M=0");
    CHECK(whale_gemm_tn_bf16(g, 2, 0, 2, NULL, 2, NULL, 0, NULL, 0, 0, &err) == WHALE_OK, "tn_bf16 N=0");
    CHECK(whale_gemm_nn_f16(g, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, 1, &err) == WHALE_OK, "nn_f16 0x0x0");
    CHECK(whale_gemm_nn_b16(g, 0, 3, 2, NULL, 2, NULL, 3, NULL, 3, 0, &err) == WHALE_OK, "nn_b16 M=0");
    c[0] = 3;
    CHECK(whale_gemm_tn_b16(g, 1, 1, 0, NULL, 1, NULL, 1, c, 1, 1, &err) == WHALE_OK && c[0] == 3,
          "tn_b16 K=0 accumulate changed C");
    c[1] = 5;
    CHECK(whale_gemm_tn_f16(g, 1, 2, 0, NULL, 1, NULL, 2, c, 2, 0, &err) == WHALE_OK && c[0] == 0 &&
              c[1] == 0,
          "tn_f16 K=0");
    whale_code rc = whale_gemm_nt_q8(g, 2, 2, 8, x, 8, q, 8, NULL, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "scale is NULL"), "q8 NULL scale: rc=%d %s", (int)rc,
          err.msg);
    rc = whale_gemm_nt_f16(g, 2, 2, 8, x, 8, h, 7, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "nt_f16") && strstr(err.msg, "ldw=7"),
          "f16 ldw < K: rc=%d %s", (int)rc, err.msg);
    rc = whale_gemm_nn_bf16(g, 2, 3, 2, x, 2, h, 2, x, 3, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "ldb=2"), "nn_bf16 ldb < N: rc=%d %s", (int)rc,
          err.msg);
    rc = whale_gemm_tn_f16(g, 3, 2, 2, x, 2, x, 2, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "lda=2"), "tn_f16 lda < M: rc=%d %s", (int)rc,
          err.msg);
    rc = whale_gemm_tn_bf16(g, 2, 2, 2, NULL, 2, x, 2, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "A is NULL"), "tn_bf16 NULL A: rc=%d %s", (int)rc,
          err.msg);
    rc = whale_gemm_tn_b16(g, 3, 2, 2, h, 2, h, 2, x, 2, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "tn_b16") && strstr(err.msg, "lda=2"),
          "tn_b16 lda < M: rc=%d %s", (int)rc, err.msg);
    rc = whale_gemm_nn_b16(g, 2, 3, 2, h, 2, NULL, 3, x, 3, 0, &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "B is NULL"), "nn_b16 NULL B: rc=%d %s", (int)rc,
          err.msg);

    /* the same call twice: the same bits */
    static const int ms[] = {1, 17, 300};
    for (int kind = 0; kind < MX_COUNT; kind++)
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            mcase t = {kind, ms[i], 96, 200, 0, 0, 0, 0};
            mdata d;
            mx_make(&t, &d, 0, 9 + i);
            float *C1 = malloc(sizeof(float) * t.M * d.ldc), *C2 = malloc(sizeof(float) * t.M * d.ldc);
            whale_code r1 = mx_call(g, &t, &d, C1, &err), r2 = mx_call(g, &t, &d, C2, &err);
            CHECK(!r1 && !r2 && !memcmp(C1, C2, sizeof(float) * t.M * d.ldc),
                  "%s M=%d: repeated product differs", mx_names[kind], t.M);
            free(C1);
            free(C2);
            mx_free(&d);
        }

    static const whale_dtype dts[] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
    for (size_t i = 0; i < 4; i++) {
        CHECK(whale_gemm_measure_gflops_dtype(g, dts[i], 3, 96, 80, 2) > 0, "measure %d, M=3", (int)dts[i]);
        CHECK(whale_gemm_measure_gflops_dtype(g, dts[i], 40, 96, 80, 2) > 0, "measure %d, M=40", (int)dts[i]);
    }
    CHECK(whale_gemm_measure_gflops_dtype(g, WHALE_I32, 4, 4, 4, 1) == 0, "measure of int32 weights");
}

/* Automatic choice: our kernels for few rows, converted blocks above. */
static void test_mixed_rules(void) {
    whale_err err;
    whale_gemm *g;
    if (whale_gemm_new(&g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const int own_nt = whale_gemm_rules_for(whale_isa_active())->own_max_m_nt;
    for (int kind = MX_NT_F16; kind <= MX_NT_Q8; kind++) {
        mcase t = {kind, own_nt, 40, 24, 0, 0, 0, 0};
        run_mixed(g, &t, 1, 1, 3);
        CHECK(!strncmp(whale_gemm_last_impl(g), "whale:", 6), "%s M=%d ran %s",
              mx_names[kind], t.M, whale_gemm_last_impl(g));
        t.M++;
        run_mixed(g, &t, 1, 1, 4);
        CHECK(!strncmp(whale_gemm_last_impl(g), kind == MX_NT_F16 ? "cvt_f16+" : "cvt_q8+", 7),
              "%s M=%d ran %s", mx_names[kind], t.M, whale_gemm_last_impl(g));
    }
    /* oneDNN's bf16 products where they are fast; elsewhere f32 ones on the
     * widened operands stand in */
    const int dnnl_bf16 = whale_gemm_bf16_native();
    mcase t = {MX_NN_BF16, 300, 40, 24, 0, 0, 0, 0};
    run_mixed(g, &t, 1, 1, 5);
    if (dnnl_bf16)
        CHECK(strncmp(whale_gemm_last_impl(g), "whale:", 6) && !strstr(whale_gemm_last_impl(g), "cvt"),
              "nn_bf16 M=300 ran %s", whale_gemm_last_impl(g));
    else
        CHECK(!strncmp(whale_gemm_last_impl(g), "cvt_bf16+", 9), "nn_bf16 M=300 ran %s", whale_gemm_last_impl(g));
    if (whale_isa_active() >= WHALE_ISA_AVX512_BF16)
        CHECK(strstr(whale_gemm_last_impl(g), "bf16") || !strcmp(whale_gemm_last_impl(g), "gemm:jit"),
              "nn_bf16 ran %s", whale_gemm_last_impl(g));
    for (int kind = MX_NN_B16; kind <= MX_TN_B16; kind++) { /* no conversion: oneDNN alone */
        mcase u = {kind, 300, 40, 24, 0, 0, 0, 0};
        run_mixed(g, &u, 1, 1, 7);
        if (dnnl_bf16)
            CHECK(strncmp(whale_gemm_last_impl(g), "whale:", 6) && !strstr(whale_gemm_last_impl(g), "cvt"),
                  "%s M=300 ran %s", mx_names[kind], whale_gemm_last_impl(g));
        else
            CHECK(!strncmp(whale_gemm_last_impl(g), "cvt_bf16+", 9), "%s M=300 ran %s", mx_names[kind],
                  whale_gemm_last_impl(g));
        run_mixed(g, &u, 1 << WHALE_GEMM_OWN, 1, 8);
        CHECK(!strncmp(whale_gemm_last_impl(g), "cvt_bf16+whale:skinny_", 22), "%s own ran %s", mx_names[kind],
              whale_gemm_last_impl(g));
    }
    t.kind = MX_TN_F16;
    run_mixed(g, &t, 1 << WHALE_GEMM_OWN, 1, 6);
    CHECK(!strcmp(whale_gemm_last_impl(g), "cvt_f16+whale:skinny_tn"), "tn_f16 own ran %s",
          whale_gemm_last_impl(g));
    whale_gemm_free(g);
}

/* int8 quantisation: round trip within half a step, ties to even, the
 * largest magnitude on +-127, zero and non-finite rows. */
static void test_quantize(void) {
    enum { ROWS = 7, COLS = 301 };
    float *W = malloc(sizeof(float) * ROWS * COLS), scale[ROWS];
    int8_t *q = malloc(ROWS * COLS);
    whale_rng r;
    whale_rng_seed(&r, 17);
    for (int i = 0; i < ROWS * COLS; i++) W[i] = (float)whale_rng_normal(&r) * (1 + i / COLS);
    for (int j = 0; j < COLS; j++) W[2 * COLS + j] = 0;                /* zero row */
    W[3 * COLS + 10] = 1e4f;                                          /* one outlier */
    for (int j = 0; j < COLS; j++) W[4 * COLS + j] = (float)(j % 9) - 4.5f; /* ties... */
    W[4 * COLS] = 127;                                                /* ...with scale 1 */
    W[5 * COLS + 7] = NAN;
    W[6 * COLS + 8] = -INFINITY;
    whale_quantize_q8_rows(q, scale, W, ROWS, COLS);
    int bad = 0, at_max = 0;
    for (int i = 0; i < ROWS; i++) {
        if (i >= 5) {
            CHECK(isnan(scale[i]), "row %d with a non-finite value: scale %g", i, scale[i]);
            continue;
        }
        for (int j = 0; j < COLS; j++) {
            const double w = W[i * COLS + j], back = (double)q[i * COLS + j] * scale[i];
            bad += !(fabs(back - w) <= scale[i] * (0.5 + 0x1p-16)) || abs(q[i * COLS + j]) > 127;
            at_max += abs(q[i * COLS + j]) == 127;
        }
    }
    CHECK(bad == 0, "quantize: %d values off by more than half a step", bad);
    CHECK(at_max >= 4, "quantize: only %d values at +-127 (one per non-zero row)", at_max);
    CHECK(scale[2] == 0 && q[2 * COLS + 5] == 0, "zero row: scale %g", scale[2]);
    CHECK(scale[4] == 1, "tie row scale %g", scale[4]);
    int ties = 0;
    for (int j = 1; j < COLS; j++) {
        const float w = W[4 * COLS + j];
        /* w = k + 0.5: the even neighbour */
        const int lo = (int)floorf(w), even = lo % 2 == 0 ? lo : lo + 1;
        ties += q[4 * COLS + j] != even;
    }
    CHECK(ties == 0, "quantize: %d ties not rounded to even", ties);
    free(W);
    free(q);
}

/* whale_alloc: buffers of 2 MiB and more start on a 2 MiB boundary (so they
 * can be backed by huge pages, which the streaming kernels depend on);
 * smaller ones on 64 bytes; both writable to their last byte. */
static void test_alloc_alignment(void) {
    size_t sizes[] = {1, 100, (2u << 20) - 1, 2u << 20, (3u << 20) + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = whale_alloc(sizes[i]);
        size_t want = sizes[i] >= (2u << 20) ? 2u << 20 : 64;
        CHECK(p && (uintptr_t)p % want == 0, "whale_alloc(%zu) = %p, not aligned to %zu", sizes[i], (void *)p, want);
        if (p) p[0] = 1, p[sizes[i] - 1] = 2;
        free(p);
    }
}

/* whale_gemm_nt_parts: each part bit-identical to its own call, whatever
 * the thread count (rows split in chunks taken dynamically, singles summed
 * in the quads' order); checked before anything is computed. */
static void parts_weights(whale_dtype dt, whale_rng *r, int n, int K, void **W, float **scale) {
    float *w = malloc(sizeof(float) * (size_t)n * K);
    for (size_t i = 0; i < (size_t)n * K; i++) w[i] = draw(r, 0);
    *scale = NULL;
    if (dt == WHALE_F32) {
        *W = w;
        return;
    }
    if (dt == WHALE_I8) {
        *W = malloc((size_t)n * K);
        *scale = malloc(sizeof(float) * n);
        whale_quantize_q8_rows(*W, *scale, w, n, K);
    } else {
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n * K);
        for (size_t i = 0; i < (size_t)n * K; i++) h[i] = dt == WHALE_BF16 ? whale_float_to_bf16(w[i]) : whale_float_to_f16(w[i]);
        *W = h;
    }
    free(w);
}

static whale_code parts_single(whale_gemm *g, whale_dtype dt, int K, const whale_nt_part *p, float *C,
                               whale_err *err) {
    switch (dt) {
    case WHALE_BF16: return whale_gemm_nt_bf16(g, p->M, p->N, K, p->A, p->lda, p->W, p->ldw, C, p->ldc, 0, err);
    case WHALE_F16: return whale_gemm_nt_f16(g, p->M, p->N, K, p->A, p->lda, p->W, p->ldw, C, p->ldc, 0, err);
    case WHALE_I8: return whale_gemm_nt_q8(g, p->M, p->N, K, p->A, p->lda, p->W, p->ldw, p->scale, C, p->ldc, 0, err);
    default: return whale_gemm_nt(g, p->M, p->N, K, p->A, p->lda, p->W, p->ldw, C, p->ldc, 0, err);
    }
}

/* Part p (weights of type dt) against a double product of the operands
 * as the kernels see them: A rounded to bf16 (bf16, int8 weights) or fp16,
 * the weights widened, int8 times its row scale; the fp32 summation bound. */
static double parts_excess(whale_dtype dt, int K, const whale_nt_part *p) {
    double worst = 0;
    for (int m = 0; m < p->M; m++)
        for (int n = 0; n < p->N; n++) {
            double sum = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                float a = p->A[(size_t)m * p->lda + k], w;
                size_t wi = (size_t)n * p->ldw + k;
                if (dt == WHALE_F16) {
                    a = whale_f16_to_float(whale_float_to_f16(a));
                    w = whale_f16_to_float(((const uint16_t *)p->W)[wi]);
                } else if (dt == WHALE_F32) {
                    w = ((const float *)p->W)[wi];
                } else {
                    a = whale_bf16_to_float(whale_float_to_bf16(a));
                    w = dt == WHALE_BF16 ? whale_bf16_to_float(((const uint16_t *)p->W)[wi])
                                         : (float)((const int8_t *)p->W)[wi];
                }
                sum += (double)a * w;
                mag += fabs((double)a * w);
            }
            double sc = dt == WHALE_I8 ? p->scale[n] : 1.0;
            double err = fabs(p->C[(size_t)m * p->ldc + n] - sum * sc) - ((K + 2) * 0x1p-24 * mag * fabs(sc));
            if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
        }
    return worst;
}

static void test_parts(whale_gemm *g) {
    enum { NP = 6, K = 200 };
    const int own_nt = whale_gemm_rules_for(whale_isa_active())->own_max_m_nt;
    /* decode-like parts sharing A, a large one (several chunks per
     * thread), more rows than our kernel takes, an empty one */
    static const int ms[NP] = {1, 1, 3, 40, 1, 2}, ns[NP] = {640, 97, 300, 50, 30001, 0}, a_of[NP] = {0, 0, 1, 2, 3, 0};
    static const whale_dtype dts[] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
    static const whale_gemm_path paths[] = {WHALE_GEMM_AUTO, WHALE_GEMM_OWN, WHALE_GEMM_OWN_PORTABLE};
    static const char *const part_path_names[] = {"auto", "own", "portable"};
    whale_rng r;
    whale_rng_seed(&r, 21);
    float *A[4];
    for (int i = 0; i < 4; i++) {
        A[i] = malloc(sizeof(float) * 40 * (K + 3));
        for (int j = 0; j < 40 * (K + 3); j++) A[i][j] = draw(&r, 0);
    }
    whale_err err;
    omp_set_num_threads(2);
    for (size_t d = 0; d < 4; d++) {
        whale_dtype dt = dts[d];
        whale_nt_part p[NP];
        float *C[NP], *ref[NP];
        for (int i = 0; i < NP; i++) {
            void *W;
            float *scale;
            parts_weights(dt, &r, ns[i] ? ns[i] : 1, K, &W, &scale);
            size_t nc = (size_t)ms[i] * (ns[i] + 5);
            C[i] = malloc(sizeof(float) * (nc ? nc : 1));
            ref[i] = malloc(sizeof(float) * (nc ? nc : 1));
            p[i] = (whale_nt_part){ms[i], ns[i], A[a_of[i]], K + 3, W, K, scale, C[i], ns[i] + 5};
        }
        for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++)
            for (int threads = 2; threads >= 1; threads--) {
                whale_gemm_set_path(g, paths[pi]);
                /* references: each alone, with two threads where our kernels
                 * compute it (their results never depend on the thread count);
                 * oneDNN's may (its AVX2 kernels split sums over threads), so
                 * its parts are compared at the same count */
                for (int i = 0; i < NP; i++) {
                    size_t nc = (size_t)ms[i] * (ns[i] + 5);
                    for (size_t j = 0; j < nc; j++) C[i][j] = ref[i][j] = C_SENTINEL;
                    const int dnnl_part = paths[pi] == WHALE_GEMM_AUTO && ms[i] > own_nt;
                    omp_set_num_threads(dnnl_part ? threads : 2);
                    CHECK(!parts_single(g, dt, K, &p[i], ref[i], &err), "%s part %d alone: %s",
                          whale_dtype_name(dt), i, err.msg);
                }
                omp_set_num_threads(threads);
                CHECK(!whale_gemm_nt_parts(g, dt, K, NP, p, 0, &err), "%s parts: %s", whale_dtype_name(dt), err.msg);
                omp_set_num_threads(2);
                for (int i = 0; i < NP; i++)
                    CHECK(parts_excess(dt, K, &p[i]) <= 0, "%s path %s, %d thread(s): part %d (M=%d N=%d) off the "
                          "reference by %g beyond the fp32 bound", whale_dtype_name(dt), part_path_names[pi], threads, i,
                          ms[i], ns[i], parts_excess(dt, K, &p[i]));
                for (int i = 0; i < NP; i++)
                    CHECK(!memcmp(C[i], ref[i], sizeof(float) * (size_t)ms[i] * (ns[i] + 5)),
                          "%s path %s, %d thread(s): part %d (M=%d N=%d) differs from its own call",
                          whale_dtype_name(dt), part_path_names[pi], threads, i, ms[i], ns[i]);
            }
        whale_gemm_set_path(g, WHALE_GEMM_AUTO);
        /* a bad part: an error naming it, and no part computed */
        p[2].lda = K - 1;
        for (int i = 0; i < NP; i++) C[i][0] = C_SENTINEL;
        whale_code rc = whale_gemm_nt_parts(g, dt, K, NP, p, 0, &err);
        CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "lda=199"), "%s bad part: rc=%d %s", whale_dtype_name(dt),
              (int)rc, err.msg);
        CHECK(C[0][0] == C_SENTINEL && C[1][0] == C_SENTINEL, "%s: parts computed before the bad one",
              whale_dtype_name(dt));
        for (int i = 0; i < NP; i++) {
            free((void *)p[i].W);
            free((void *)p[i].scale);
            free(C[i]);
            free(ref[i]);
        }
    }
    CHECK(whale_gemm_nt_parts(g, WHALE_I32, K, 0, NULL, 0, &err) == WHALE_ERR_ARG, "int32 weights accepted");
    CHECK(whale_gemm_nt_parts(g, WHALE_F32, K, 0, NULL, 0, &err) == WHALE_OK, "no parts");
    CHECK(whale_gemm_nt_parts(g, WHALE_F32, K, -1, NULL, 0, &err) == WHALE_ERR_ARG && strstr(err.msg, "-1 parts"),
          "negative part count: %s", err.msg);
    CHECK(whale_gemm_nt_parts(g, WHALE_F32, K, 2, NULL, 0, &err) == WHALE_ERR_ARG && strstr(err.msg, "at NULL"),
          "parts at NULL: %s", err.msg);
    for (int i = 0; i < 4; i++) free(A[i]);
}

/* Our decode kernels compute every row of a product with M = 1 to the
 * active tier's own_max_m_nt rows (a batched decode step's streams; 16 to
 * 32 by tier) as the same sequence of fp32 operations as that row alone,
 * whatever the weight format, the path (quads, 4 rows per pass, up to 4
 * rows and above 8; 5 to 8 rows in one pass over pairs or single weight
 * rows), the tier (WHALE_ISA) and the thread count: a stream's greedy
 * continuation never depends on what is batched with it. Odd K and N leave
 * partial vectors and rows outside the quads and pairs. */
static void test_rows_alone(whale_gemm *g) {
    enum { MMAX = 32, K = 203, LDA = K + 3 };
    const int mmax = whale_gemm_rules_for(whale_isa_active())->own_max_m_nt;
    CHECK(mmax <= MMAX, "own_max_m_nt %d above the %d rows this test holds", mmax, MMAX);
    static const int ns[] = {37, 3001};
    static const whale_dtype dts[] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
    static const whale_gemm_path paths[] = {WHALE_GEMM_AUTO, WHALE_GEMM_OWN, WHALE_GEMM_OWN_PORTABLE};
    static const char *const names[] = {"auto", "own", "portable"};
    whale_rng r;
    whale_rng_seed(&r, 23);
    float *A = malloc(sizeof(float) * MMAX * LDA);
    for (int i = 0; i < MMAX * LDA; i++) A[i] = draw(&r, 0);
    whale_err err;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const whale_dtype dt = dts[d];
            const int N = ns[ni];
            void *W;
            float *scale;
            parts_weights(dt, &r, N, K, &W, &scale);
            /* one: each row alone, computed once per path and thread count */
            float *C = malloc(sizeof(float) * MMAX * N), *one = malloc(sizeof(float) * MMAX * N);
            for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++)
                for (int threads = 1; threads <= 2; threads++) {
                    whale_gemm_set_path(g, paths[pi]);
                    omp_set_num_threads(threads);
                    for (int m = 0; m < mmax && m < MMAX; m++) {
                        const whale_nt_part p1 = {1, N, A + (size_t)m * LDA, LDA, W, K, scale, one + (size_t)m * N, N};
                        CHECK(!parts_single(g, dt, K, &p1, p1.C, &err), "%s row %d: %s", whale_dtype_name(dt), m,
                              err.msg);
                    }
                    for (int M = 1; M <= mmax && M <= MMAX; M++) {
                        const whale_nt_part p = {M, N, A, LDA, W, K, scale, C, N};
                        CHECK(!parts_single(g, dt, K, &p, C, &err), "%s M=%d: %s", whale_dtype_name(dt), M, err.msg);
                        CHECK(!strncmp(whale_gemm_last_impl(g), "whale:", 6), "%s M=%d path %s ran %s",
                              whale_dtype_name(dt), M, names[pi], whale_gemm_last_impl(g));
                        for (int m = 0; m < M; m++)
                            CHECK(!memcmp(C + (size_t)m * N, one + (size_t)m * N, sizeof(float) * N),
                                  "%s N=%d path %s, %d thread(s), tier %s: row %d of an M=%d product differs from "
                                  "the row alone", whale_dtype_name(dt), N, names[pi], threads,
                                  whale_isa_name(whale_isa_active()), m, M);
                    }
                }
            whale_gemm_set_path(g, WHALE_GEMM_AUTO);
            omp_set_num_threads(2);
            free(W);
            free(scale);
            free(C);
            free(one);
        }
    free(A);
}

/* Which of our kernels a decode product runs follows the active tier
 * (whale_isa_active: what the processor offers, capped by WHALE_ISA), never
 * a fixed processor: the vdpbf16ps kernels from avx512_bf16, fp32 FMAs on
 * the widened weights at avx512 and avx2, plain C below. */
static void test_tier_dispatch(whale_gemm *g) {
    enum { N = 24, K = 40 };
    static float A[K], C[N];
    static uint16_t W16[N * K];
    static int8_t W8[N * K];
    static float scale[N];
    const whale_isa t = whale_isa_active();
    const char *bf16 = t >= WHALE_ISA_AVX512_BF16 ? "whale:skinny_nt_bf16"
                       : t >= WHALE_ISA_AVX2      ? "whale:skinny_nt_bf16_fma"
                                                  : "whale:nt_bf16_c";
    const char *f16 = t >= WHALE_ISA_AVX2 ? "whale:skinny_nt_f16" : "whale:nt_f16_c";
    const char *q8 = t >= WHALE_ISA_AVX512_BF16 && __builtin_cpu_supports("avx512vbmi") ? "whale:skinny_nt_q8"
                     : t >= WHALE_ISA_AVX2      ? "whale:skinny_nt_q8_fma"
                                                : "whale:nt_q8_c";
    whale_err err;
    CHECK(t <= whale_isa_detected(), "active tier %s above the detected %s", whale_isa_name(t),
          whale_isa_name(whale_isa_detected()));
    /* the detection against the compiler's own (which checks the OS's
     * register state for AVX and AVX-512 too); AMX needs the OS's grant,
     * which it does not know of */
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                     __builtin_cpu_supports("bmi2");
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                       __builtin_cpu_supports("avx512cd");
    const int bf16t = avx512 && __builtin_cpu_supports("avx512bf16");
    const whale_isa want = bf16t ? WHALE_ISA_AVX512_BF16 : avx512 ? WHALE_ISA_AVX512 : avx2 ? WHALE_ISA_AVX2 : WHALE_ISA_BASE;
    const whale_isa got = whale_isa_detected() == WHALE_ISA_AMX ? WHALE_ISA_AVX512_BF16 : whale_isa_detected();
    CHECK(got == want, "detected tier %s, the compiler's feature checks say %s", whale_isa_name(whale_isa_detected()),
          whale_isa_name(want));
    /* the bf16 dot product counts as fast on AMD's processors with AVX512_BF16 alone */
    const int amd_bf16 = __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512bf16");
    CHECK(whale_cpu_bf16_dot_fast() == amd_bf16, "bf16 dot product fast %d, AMD with AVX512_BF16 %d",
          whale_cpu_bf16_dot_fast(), amd_bf16);
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    CHECK(llc <= 0 || whale_cpu_llc_bytes() == (size_t)llc, "last-level cache %zu bytes, sysconf says %ld",
          whale_cpu_llc_bytes(), llc);
    CHECK(!whale_gemm_nt_bf16(g, 1, N, K, A, K, W16, K, C, N, 0, &err) && !strcmp(whale_gemm_last_impl(g), bf16),
          "bf16 decode at tier %s ran %s, want %s", whale_isa_name(t), whale_gemm_last_impl(g), bf16);
    CHECK(!whale_gemm_nt_f16(g, 1, N, K, A, K, W16, K, C, N, 0, &err) && !strcmp(whale_gemm_last_impl(g), f16),
          "fp16 decode at tier %s ran %s, want %s", whale_isa_name(t), whale_gemm_last_impl(g), f16);
    CHECK(!whale_gemm_nt_q8(g, 1, N, K, A, K, W8, K, scale, C, N, 0, &err) && !strcmp(whale_gemm_last_impl(g), q8),
          "int8 decode at tier %s ran %s, want %s", whale_isa_name(t), whale_gemm_last_impl(g), q8);
}

int main(void) {
    /* a region and moving data between cores assumed all but free
     * (core/par.h): the skinny kernels split even these small products at
     * two threads, so the thread-count comparisons below run the split
     * path whatever those cost here */
    setenv("WHALE_PAR_US", "0.001", 0);
    setenv("WHALE_PAR_MOVE_US", "0", 0);
    whale_err err;
    whale_gemm *g;
    if (whale_gemm_new(&g, &err)) {
        fprintf(stderr, "test_gemm: %s\n", err.msg);
        return 1;
    }
    test_alloc_alignment();
    test_shapes(g);
    test_model_shapes(g);
    test_empty(g);
    test_rules(g);
    test_deterministic(g);
    test_errors(g);
    test_measure(g);
    whale_gemm_free(g);
    whale_gemm_free(NULL);
    test_cache();
    if (whale_gemm_new(&g, &err)) {
        fprintf(stderr, "test_gemm: %s\n", err.msg);
        return 1;
    }
    test_bf16_shapes(g);
    test_bf16_rounding(g);
    test_bf16_nan(g);
    whale_gemm_free(g);
    test_bf16_convert();
    test_bf16_rules();
    if (whale_gemm_new(&g, &err)) {
        fprintf(stderr, "test_gemm: %s\n", err.msg);
        return 1;
    }
    test_mixed_shapes(g);
    test_mixed_rounding(g);
    test_mixed_nan(g);
    test_mixed_misc(g);
    test_parts(g);
    test_rows_alone(g);
    test_tier_dispatch(g);
    whale_gemm_free(g);
    test_mixed_blocks();
    test_mixed_rules();
    test_quantize();
    return test_finish("test_gemm");
}
