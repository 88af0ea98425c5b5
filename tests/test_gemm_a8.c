/* W8A8 products (whale_gemm_nt_a8): the activation rule, the packing, the
 * product against a double-precision sum of the same quantised operands,
 * bit-identity across paths, thread counts and row counts, and what NaN
 * and inf do. */
#include "kernels/gemm.h"
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

static int kp_of(int K) { return (K + WHALE_A8_BLOCK - 1) / WHALE_A8_BLOCK * WHALE_A8_BLOCK; }

/* The quantiser's promises on random rows with a few outliers. */
static void check_quantiser(void) {
    const int M = 3, K = 77, Kp = kp_of(K), nb = Kp / 32;
    float A[3 * 77];
    for (int i = 0; i < M * K; i++) A[i] = frand() * (i % 13 == 0 ? 40.0f : 1.0f);
    for (int k = 0; k < K; k++) A[2 * K + k] = k < 40 ? 0.0f : A[2 * K + k]; /* a zero block */
    int8_t q[3 * 96];
    float d[3 * 3];
    int32_t corr[3 * 3];
    memset(q, 0x55, sizeof q);
    whale_quantize_a8_rows(M, K, A, K, q, Kp, d, corr, nb);
    for (int m = 0; m < M; m++)
        for (int b = 0; b < nb; b++) {
            const float s = d[m * nb + b];
            int sum = 0, top = 0;
            for (int i = 0; i < 32; i++) {
                const int k = b * 32 + i, v = q[m * Kp + k];
                sum += v;
                top = abs(v) > top ? abs(v) : top;
                if (k >= K) {
                    CHECK(v == 0, "padding value %d at row %d k %d", v, m, k);
                    continue;
                }
                const float a = A[m * K + k];
                CHECK(v >= -127 && v <= 127, "q %d out of range", v);
                CHECK(fabsf(v * s - a) <= s * 0.5f * (1 + 1e-5f) + 1e-30f,
                      "row %d k %d: %g*%g vs %g", m, k, (double)v, (double)s, (double)a);
            }
            CHECK(corr[m * nb + b] == -128 * sum, "corr %d vs %d", corr[m * nb + b], -128 * sum);
            CHECK(s == 0 ? top == 0 : top == 127, "row %d block %d: largest |q| %d with d %g", m, b, top, (double)s);
        }
    CHECK(d[2 * nb] == 0, "a zero block has d %g", (double)d[2 * nb]);
    /* every kernel of the quantiser (whole blocks are vectorised) against
     * the rule written out here, value for value */
    enum { RM = 5, RK = 200 };
    static float R[RM * RK];
    static int8_t rq[RM * 224];
    float rd[RM * 7];
    int32_t rc[RM * 7];
    for (int i = 0; i < RM * RK; i++) R[i] = frand() * (i % 17 == 0 ? 100.0f : 1.0f);
    R[3 * RK + 70] = NAN;
    for (int k = 96; k < 128; k++) R[4 * RK + k] = 0;
    whale_quantize_a8_rows(RM, RK, R, RK, rq, 224, rd, rc, 7);
    int same = 1;
    for (int m = 0; m < RM; m++)
        for (int b = 0; b < 7; b++) {
            float amax = 0;
            int finite = 1, sum = 0;
            for (int k = b * 32; k < RK && k < b * 32 + 32; k++) {
                finite &= isfinite(R[m * RK + k]);
                amax = fabsf(R[m * RK + k]) > amax ? fabsf(R[m * RK + k]) : amax;
            }
            const float s = amax / 127.0f;
            const int zero = !finite || s == 0;
            for (int k = b * 32; k < RK && k < b * 32 + 32; k++) {
                float v = zero ? 0.0f : nearbyintf(R[m * RK + k] / s);
                v = v > 127 ? 127 : v < -127 ? -127 : v;
                same &= rq[m * 224 + k] == (int8_t)v;
                sum += (int)v;
            }
            const float want = finite ? (zero ? 0.0f : s) : NAN;
            same &= (isnan(want) ? isnan(rd[m * 7 + b]) : rd[m * 7 + b] == want) && rc[m * 7 + b] == -128 * sum;
        }
    CHECK(same, "the quantiser differs from its rule");
}

/* A double-precision sum of the quantised operands, block scales applied
 * per block: what the product computes up to fp32 rounding of the block
 * terms and their sum. */
static void reference(int M, int N, int K, const float *A, const int8_t *W, const float *scale, double *R,
                      double *mag) {
    const int Kp = kp_of(K), nb = Kp / 32;
    int8_t *q = calloc((size_t)M * Kp, 1);
    float *d = calloc((size_t)M * nb, sizeof *d);
    int32_t *corr = calloc((size_t)M * nb, sizeof *corr);
    whale_quantize_a8_rows(M, K, A, K, q, Kp, d, corr, nb);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double r = 0, g = 0;
            for (int b = 0; b < nb; b++) {
                long s = 0, sa = 0;
                for (int k = b * 32; k < K && k < b * 32 + 32; k++) {
                    s += (long)W[(size_t)n * K + k] * q[(size_t)m * Kp + k];
                    sa += labs((long)W[(size_t)n * K + k] * q[(size_t)m * Kp + k]);
                }
                r += (double)d[m * nb + b] * s;
                g += (double)d[m * nb + b] * sa;
            }
            R[(size_t)m * N + n] = r * scale[n];
            mag[(size_t)m * N + n] = g * fabs(scale[n]);
        }
    free(q), free(d), free(corr);
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* One shape: every path against the reference and each other, with and
 * without accumulate, 1 and 2 threads; each row alone equals its row in
 * the whole product. */
static void check_shape(whale_gemm *g, int M, int N, int K) {
    float *A = malloc((size_t)M * K * sizeof *A), *Wf = malloc((size_t)N * K * sizeof *Wf);
    int8_t *W = malloc((size_t)N * K);
    float *scale = malloc((size_t)N * sizeof *scale);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = frand() * (i % 29 == 0 ? 8.0f : 1.0f);
    for (size_t i = 0; i < (size_t)N * K; i++) Wf[i] = frand() * 0.1f;
    whale_quantize_q8_rows(W, scale, Wf, N, K);
    uint8_t *P = malloc(whale_q8p_bytes(N, K));
    whale_q8p_pack(P, W, K, N, K);
    double *R = malloc((size_t)M * N * sizeof *R), *mag = malloc((size_t)M * N * sizeof *mag);
    reference(M, N, K, A, W, scale, R, mag);

    const size_t nc = (size_t)M * N;
    float *C[4], *C0 = malloc(nc * sizeof *C0);
    for (size_t i = 0; i < nc; i++) C0[i] = frand();
    whale_err err;
    const whale_gemm_path paths[2] = {WHALE_GEMM_AUTO, WHALE_GEMM_OWN_PORTABLE};
    const int threads = omp_get_max_threads();
    for (int acc = 0; acc < 2; acc++) {
        for (int v = 0; v < 4; v++) { /* path x thread count */
            C[v] = malloc(nc * sizeof *C[v]);
            memcpy(C[v], C0, nc * sizeof *C0);
            whale_gemm_set_path(g, paths[v & 1]);
            omp_set_num_threads(v >> 1 ? 1 : threads);
            whale_code rc = whale_gemm_nt_a8(g, M, N, K, A, K, P, 0, scale, C[v], N, acc, &err);
            CHECK(!rc, "nt_a8 %dx%dx%d: %s", M, N, K, err.msg);
            if (v == 0 && M == 1 && N == 16) printf("nt_a8 auto path ran %s\n", whale_gemm_last_impl(g));
        }
        omp_set_num_threads(threads);
        whale_gemm_set_path(g, WHALE_GEMM_AUTO);
        double worst = 0;
        for (size_t i = 0; i < nc; i++) {
            const double want = R[i] + (acc ? C0[i] : 0);
            const double e = fabs(C[0][i] - want) / (mag[i] + (acc ? fabs(C0[i]) : 0) + 1e-30);
            worst = e > worst ? e : worst;
        }
        /* fp32 sums of nb block terms: a few ulps of the terms' magnitudes */
        CHECK(worst < 4e-7 * (kp_of(K) / 32 + 2), "nt_a8 %dx%dx%d acc %d: relative error %g", M, N, K, acc, worst);
        for (int v = 1; v < 4; v++)
            CHECK(same_bits(C[v], C[0], nc), "nt_a8 %dx%dx%d acc %d: variant %d differs from the first", M, N, K,
                  acc, v);
        /* each row alone gives its bits in the batch */
        for (int m = 0; m < M; m += M > 3 ? M / 3 : 1) {
            float *row = malloc((size_t)N * sizeof *row);
            memcpy(row, C0 + (size_t)m * N, (size_t)N * sizeof *row);
            whale_gemm_nt_a8(g, 1, N, K, A + (size_t)m * K, K, P, 0, scale, row, N, acc, &err);
            CHECK(same_bits(row, C[0] + (size_t)m * N, (size_t)N), "nt_a8 %dx%dx%d: row %d alone differs", M, N,
                  K, m);
            free(row);
        }
        for (int v = 0; v < 4; v++) free(C[v]);
    }
    free(A), free(Wf), free(W), free(scale), free(P), free(R), free(mag), free(C0);
}

/* Views (rows r .. r+n of a packed matrix, at any r), parts in one call,
 * packed rows read back, and the input gradient through packed weights. */
static void check_views(whale_gemm *g) {
    const int M = 3, N = 75, K = 90, Kp = kp_of(K);
    float A[3 * 90], Wf[75 * 90], scale[75], full[3 * 75];
    int8_t W[75 * 90], back[75 * 90];
    for (int i = 0; i < M * K; i++) A[i] = frand();
    for (int i = 0; i < N * K; i++) Wf[i] = frand();
    whale_quantize_q8_rows(W, scale, Wf, N, K);
    uint8_t *P = malloc(whale_q8p_bytes(N, K));
    whale_q8p_pack(P, W, K, N, K);
    whale_q8p_unpack(back, K, P, 0, N, K);
    CHECK(!memcmp(back, W, sizeof W), "packed rows do not read back");
    float row[90];
    whale_q8p_row(row, P, 37, K, scale[37]);
    int same = 1;
    for (int k = 0; k < K; k++) same &= row[k] == W[37 * K + k] * scale[37];
    CHECK(same, "row 37 reads back wrong");
    whale_err err;
    for (int path = 0; path < 2; path++) {
        whale_gemm_set_path(g, path ? WHALE_GEMM_OWN_PORTABLE : WHALE_GEMM_AUTO);
        CHECK(!whale_gemm_nt_a8(g, M, N, K, A, K, P, 0, scale, full, N, 0, &err), "%s", err.msg);
        /* views at rows 0, 5, 16, 21, 50 of lengths 5, 11, 5, 29, 25; as parts, then one by one */
        const int r0[] = {0, 5, 16, 21, 50}, len[] = {5, 11, 5, 29, 25};
        float out[3 * 75], one[3 * 75];
        whale_a8_part parts[5];
        int at = 0;
        for (int i = 0; i < 5; i++) {
            const uint8_t *Wv = P + whale_q8p_bytes(r0[i] - r0[i] % 16, K) * (r0[i] >= 16);
            parts[i] = (whale_a8_part){M, len[i], A, K, Wv, r0[i] % 16, scale + r0[i], out + at, N};
            at += len[i];
        }
        CHECK(!whale_gemm_nt_a8_parts(g, K, 5, parts, 0, &err), "%s", err.msg);
        CHECK(same_bits(out, full, (size_t)M * N), "path %d: views as parts differ from the whole product", path);
        for (int i = 0; i < 5; i++) {
            const whale_a8_part *p = &parts[i];
            CHECK(!whale_gemm_nt_a8(g, M, p->N, K, A, K, p->W, p->row0, p->scale, one + (p->C - out), N, 0, &err),
                  "%s", err.msg);
        }
        CHECK(same_bits(one, full, (size_t)M * N), "path %d: views one by one differ from the whole product", path);
    }
    whale_gemm_set_path(g, WHALE_GEMM_AUTO);
    (void)Kp;
    /* dX = dY · W through the packed rows 21 .. 70 against the row-major int8 product */
    float dY[3 * 50], dx1[3 * 90], dx2[3 * 90];
    for (int i = 0; i < 3 * 50; i++) dY[i] = frand();
    CHECK(!whale_gemm_nn_q8(g, 3, K, 50, dY, 50, W + 21 * K, K, scale + 21, dx1, K, 0, &err), "%s", err.msg);
    CHECK(!whale_gemm_nn_q8p(g, 3, K, 50, dY, 50, P + whale_q8p_bytes(16, K), 5, scale + 21, dx2, K, 0, &err),
          "%s", err.msg);
    CHECK(same_bits(dx1, dx2, 3 * 90), "nn_q8p differs from nn_q8 on the same rows");
    free(P);
}

/* Parts with activations of their own, as a decode step's experts bring
 * (their routed rows, a pair of up products sharing them), from 1 to 20
 * rows: in one call, on every thread count, each part the same bits as
 * its own call (the run's quantisation shared by the threads from a few
 * rows on). */
static void check_parts_inputs(whale_gemm *g) {
    enum { NP = 9, N = 100, K = 96 };
    const int M[NP] = {8, 8, 4, 5, 5, 3, 12, 1, 20}, same_as_prev[NP] = {0, 1, 0, 0, 1, 0, 0, 0, 0};
    float Wf[N * K], scale[N], *A[NP], *C[NP], *one[NP];
    int8_t W[N * K];
    for (int i = 0; i < N * K; i++) Wf[i] = frand();
    whale_quantize_q8_rows(W, scale, Wf, N, K);
    uint8_t *P = malloc(whale_q8p_bytes(N, K));
    whale_q8p_pack(P, W, K, N, K);
    whale_a8_part parts[NP];
    for (int i = 0; i < NP; i++) {
        A[i] = same_as_prev[i] ? A[i - 1] : malloc(sizeof(float) * (size_t)M[i] * K);
        for (int k = 0; k < M[i] * K && !same_as_prev[i]; k++) A[i][k] = frand();
        C[i] = malloc(sizeof(float) * (size_t)M[i] * N), one[i] = malloc(sizeof(float) * (size_t)M[i] * N);
        parts[i] = (whale_a8_part){M[i], N, A[i], K, P, 0, scale, C[i], N};
    }
    whale_err err;
    const int threads = omp_get_max_threads();
    for (int t = 1; t <= threads; t++) {
        omp_set_num_threads(t);
        CHECK(!whale_gemm_nt_a8_parts(g, K, NP, parts, 0, &err), "%s", err.msg);
        for (int i = 0; i < NP; i++) {
            CHECK(!whale_gemm_nt_a8(g, M[i], N, K, A[i], K, P, 0, scale, one[i], N, 0, &err), "%s", err.msg);
            CHECK(same_bits(C[i], one[i], (size_t)M[i] * N), "%d threads: part %d (%d rows, own input) differs", t, i,
                  M[i]);
        }
    }
    omp_set_num_threads(threads);
    for (int i = 0; i < NP; i++) {
        if (!same_as_prev[i]) free(A[i]);
        free(C[i]), free(one[i]);
    }
    free(P);
}

/* NaN and inf: a block of A poisons its row, a scale its column; a
 * finite row next to them is untouched. */
static void check_specials(whale_gemm *g) {
    const int M = 3, N = 20, K = 70;
    float A[3 * 70], Wf[20 * 70], scale[20], C[3 * 20];
    int8_t W[20 * 70];
    for (int i = 0; i < M * K; i++) A[i] = frand();
    for (int i = 0; i < N * K; i++) Wf[i] = frand();
    whale_quantize_q8_rows(W, scale, Wf, N, K);
    A[0 * K + 45] = NAN;
    A[1 * K + 3] = INFINITY;
    scale[17] = NAN;
    uint8_t P[32 * 96];
    whale_q8p_pack(P, W, K, N, K);
    for (int path = 0; path < 2; path++) {
        whale_gemm_set_path(g, path ? WHALE_GEMM_OWN_PORTABLE : WHALE_GEMM_AUTO);
        whale_err err;
        CHECK(!whale_gemm_nt_a8(g, M, N, K, A, K, P, 0, scale, C, N, 0, &err), "%s", err.msg);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                CHECK(isnan(C[m * N + n]) == (m < 2 || n == 17), "path %d: C[%d,%d] = %g", path, m, n,
                      (double)C[m * N + n]);
    }
    whale_gemm_set_path(g, WHALE_GEMM_AUTO);
}

/* How close W8A8 stays to the fp32 product on smooth data: the activation
 * rounding adds ~d/sqrt(12) per term, so a few tenths of a percent. */
static void check_accuracy(whale_gemm *g) {
    const int M = 4, N = 64, K = 896;
    float *A = malloc(sizeof(float) * M * K), *Wf = malloc(sizeof(float) * N * K);
    float *C = malloc(sizeof(float) * M * N), *F = malloc(sizeof(float) * M * N), scale[64];
    int8_t *W = malloc((size_t)N * K);
    for (int i = 0; i < M * K; i++) A[i] = frand();
    for (int i = 0; i < N * K; i++) Wf[i] = frand();
    whale_quantize_q8_rows(W, scale, Wf, N, K);
    uint8_t *P = malloc(whale_q8p_bytes(N, K));
    whale_q8p_pack(P, W, K, N, K);
    whale_err err;
    CHECK(!whale_gemm_nt_a8(g, M, N, K, A, K, P, 0, scale, C, N, 0, &err), "%s", err.msg);
    CHECK(!whale_gemm_nt(g, M, N, K, A, K, Wf, K, F, N, 0, &err), "%s", err.msg);
    const double rel = test_rel_norm(C, F, (long)M * N);
    printf("W8A8 vs fp32, %dx%dx%d uniform: relative error %.3g\n", M, N, K, rel);
    CHECK(rel < 1e-2, "W8A8 relative error %g against fp32", rel);
    free(A), free(Wf), free(C), free(F), free(W), free(P);
}

int main(void) {
    /* a region assumed all but free (core/par.h): every product here, small
     * as it is, splits over the threads when there are several, so the
     * thread-count variants below run the split and the shared
     * quantisation, whatever a region costs on this machine */
    setenv("WHALE_PAR_US", "0.001", 0);
    setenv("WHALE_PAR_MOVE_US", "0", 0); /* nor moving data between cores */
    whale_err err;
    whale_gemm *g = NULL;
    if (whale_gemm_new(&g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    check_quantiser();
    const int shapes[][3] = {{1, 16, 32}, {1, 37, 70}, {2, 64, 896},  {3, 50, 31},  {5, 100, 200},
                             {8, 129, 320}, {9, 48, 64}, {11, 40, 96}, {13, 70, 100}, {14, 50, 64},
                             {17, 33, 100}, {40, 260, 130}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(g, shapes[i][0], shapes[i][1], shapes[i][2]);
    check_views(g);
    check_parts_inputs(g);
    check_specials(g);
    check_accuracy(g);
    whale_err e2;
    float c1;
    CHECK(whale_gemm_nt_a8(g, 1, 1, 4, &c1, 4, NULL, 0, &c1, &c1, 1, 0, &e2) == WHALE_ERR_ARG, "NULL W accepted");
    CHECK(whale_gemm_nt_a8(g, 1, 1, 4, &c1, 4, (const uint8_t *)&c1, 0, NULL, &c1, 1, 0, &e2) == WHALE_ERR_ARG,
          "NULL scale accepted");
    CHECK(whale_gemm_nt_a8(g, 1, 1, 4, &c1, 4, (const uint8_t *)&c1, 16, &c1, &c1, 1, 0, &e2) == WHALE_ERR_ARG,
          "row0 16 accepted");
    whale_gemm_free(g);
    return test_finish("test_gemm_a8");
}
