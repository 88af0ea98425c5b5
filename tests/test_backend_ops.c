/* Every op of the backend table, on the "cpu" backend against the "ref"
 * backend (plain loops, double sums: src/backend/ref.c), forward and
 * backward, for every weight format and shapes that include odd and
 * degenerate sizes (1 row, widths that are not a multiple of any vector,
 * more rows than the few-row kernels take). One line per op with the
 * worst difference, relative to the largest reference value:
 *   fp32 ops and products                  ≤ 2e-5 (summation order)
 *   bf16 / fp16 / int8 products            ≤ 2e-5 (the same rounded operands,
 *                                          exact products, fp32 vs double sums)
 *   attention with bf16 products           ≤ 5e-3 (the probabilities are
 *                                          rounded after an fp32 softmax whose
 *                                          exp may differ in the last bit, so
 *                                          one may round the other way)
 *   backward ops the reference takes by
 *   central differences (Sinkhorn, routing) ≤ 1e-4 */
#include "testutil.h"

#include "backend/backend.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static whale_backend *cpu, *ref;
static double worst_of_op;

/* ------------------------------------------------------------------ data */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float *rnd_floats(size_t n, double lo, double hi) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * uniform());
    return x;
}
static float *dup(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}

/* a and b agree within tol of max |b|, or of 1e-3 when every value is
 * smaller: the inputs are of order 1, so a result near 0 is a cancellation
 * (a 1-wide RMSNorm has a zero input gradient) and its relative error
 * means nothing */
static void agree(const char *what, const float *a, const float *b, size_t n, double tol) {
    double mx = test_max_abs(b, (long)n), d = test_max_abs_diff(a, b, (long)n);
    double rel = d / (mx > 1e-3 ? mx : 1e-3);
    if (rel > worst_of_op) worst_of_op = rel;
    CHECK(rel <= tol, "%s: max |cpu − ref| %.3g of max |ref| %.3g (tol %g)", what, d, mx, tol);
}

static void report(const char *op) {
    printf("%-26s worst %.2g\n", op, worst_of_op);
    worst_of_op = 0;
}

/* ------------------------------------------------------------------ products */

/* W [N, K] in format f: bits for the backend, and q for int8 */
typedef struct {
    whale_wref w;
    void *mem;
    float *scale;
} weight;

/* int8 weights are packed in panels of 16 rows; W is a view that starts at
 * row I8_ROW0 of its matrix, inside the first panel */
enum { I8_ROW0 = 5 };

static weight make_weight(whale_dtype f, int rows, int cols) {
    weight W = {{f, NULL, cols, NULL, 0}, NULL, NULL};
    size_t n = (size_t)rows * cols;
    float *x = rnd_floats(n, -1, 1);
    if (f == WHALE_F32) {
        W.mem = x;
    } else if (f == WHALE_I8) {
        const size_t all = (size_t)(rows + I8_ROW0) * cols;
        int8_t *q = malloc(all ? all : 1);
        for (size_t i = 0; i < all; i++) q[i] = i < (size_t)I8_ROW0 * cols ? 99 : (int8_t)lrint(x[i - (size_t)I8_ROW0 * cols] * 127);
        W.mem = malloc(whale_q8p_bytes(rows + I8_ROW0, cols ? cols : 1) + 1);
        if (cols) whale_q8p_pack(W.mem, q, cols, rows + I8_ROW0, cols);
        free(q);
        W.scale = rnd_floats((size_t)rows + I8_ROW0, 0.001, 0.02);
        W.w.row0 = I8_ROW0;
        free(x);
    } else {
        uint16_t *h = malloc(2 * (n ? n : 1));
        for (size_t i = 0; i < n; i++) h[i] = f == WHALE_BF16 ? whale_float_to_bf16(x[i]) : whale_float_to_f16(x[i]);
        W.mem = h;
        free(x);
    }
    W.w.data = W.mem;
    W.w.scale = W.scale ? W.scale + W.w.row0 : NULL;
    return W;
}

static void test_products(void) {
    static const int shapes[][3] = {{1, 1, 1}, {1, 13, 7}, {3, 65, 33}, {5, 17, 100}, {37, 45, 67}, {130, 70, 40}};
    static const whale_dtype formats[] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
    whale_err err;
    char what[96];
    for (int op = 0; op < 3; op++) {
        for (size_t fi = 0; fi < 4; fi++) {
            whale_dtype f = formats[fi];
            if (op == 2 && f == WHALE_I8) continue; /* no int8 weight gradient */
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (int acc = 0; acc < 2; acc++) {
                    int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                    /* nt: W [N, K]; nn: B [K, N]; tn: A [K, M], B [K, N] */
                    weight W = make_weight(f, op == 0 ? N : K, op == 0 ? K : N);
                    if (op == 1 && f == WHALE_I8) { /* nn reads scale per row of B (K of them) */
                        free(W.scale);
                        W.w.scale = W.scale = rnd_floats((size_t)K, 0.001, 0.02);
                    }
                    float *A = rnd_floats((size_t)M * K, -2, 2), *B = rnd_floats((size_t)K * N, -1, 1);
                    float *c1 = rnd_floats((size_t)M * N, -1, 1), *c2 = dup(c1, (size_t)M * N);
                    whale_code e1, e2;
                    if (op == 0) {
                        e1 = cpu->matmul_nt(cpu, M, N, K, A, K, W.w, c1, N, acc, &err);
                        e2 = ref->matmul_nt(ref, M, N, K, A, K, W.w, c2, N, acc, &err);
                    } else if (op == 1) {
                        e1 = cpu->matmul_nn(cpu, M, N, K, A, K, W.w, c1, N, acc, &err);
                        e2 = ref->matmul_nn(ref, M, N, K, A, K, W.w, c2, N, acc, &err);
                    } else {
                        e1 = cpu->matmul_tn(cpu, f, M, N, K, A, M, B, N, c1, N, acc, &err);
                        e2 = ref->matmul_tn(ref, f, M, N, K, A, M, B, N, c2, N, acc, &err);
                    }
                    snprintf(what, sizeof what, "matmul_%s %s %dx%dx%d%s", op == 0 ? "nt" : op == 1 ? "nn" : "tn",
                             whale_dtype_name(f), M, N, K, acc ? " +=" : "");
                    CHECK(e1 == WHALE_OK && e2 == WHALE_OK, "%s: %s", what, err.msg);
                    agree(what, c1, c2, (size_t)M * N, 2e-5);
                    free(A), free(B), free(c1), free(c2), free(W.mem), free(W.scale);
                }
        }
        report(op == 0 ? "matmul_nt (4 formats)" : op == 1 ? "matmul_nn (4 formats)" : "matmul_tn (3 formats)");
    }
    /* a format no product exists for is an error, not a guess */
    weight W = make_weight(WHALE_F32, 2, 2);
    W.w.format = WHALE_I32;
    float A[4] = {0}, C[4];
    CHECK(cpu->matmul_nt(cpu, 2, 2, 2, A, 2, W.w, C, 2, 0, &err) == WHALE_ERR_ARG, "I32 weights accepted");
    CHECK(ref->matmul_nt(ref, 2, 2, 2, A, 2, W.w, C, 2, 0, &err) == WHALE_ERR_ARG, "I32 weights accepted (ref)");
    free(W.mem);
}

/* ------------------------------------------------------------------ row ops */

static void test_norm_rope_swiglu(void) {
    static const int shapes[][2] = {{1, 1}, {3, 7}, {17, 64}, {64, 100}, {300, 129}};
    char what[96];
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int hasw = 0; hasw < 2; hasw++) {
            int R = shapes[si][0], n = shapes[si][1];
            size_t N = (size_t)R * n;
            float *x = rnd_floats(N, -3, 3), *w = hasw ? rnd_floats((size_t)n, 0.5, 1.5) : NULL;
            float *y1 = rnd_floats(N, 0, 1), *y2 = rnd_floats(N, 0, 1), *r1 = rnd_floats(R, 0, 1), *r2 = rnd_floats(R, 0, 1);
            cpu->rmsnorm(cpu, y1, x, w, R, n, 1e-6f, r1);
            ref->rmsnorm(ref, y2, x, w, R, n, 1e-6f, r2);
            snprintf(what, sizeof what, "rmsnorm %dx%d%s", R, n, hasw ? "" : " (no weight)");
            agree(what, y1, y2, N, 2e-5);
            agree(what, r1, r2, (size_t)R, 2e-5);
            float *dy = rnd_floats(N, -1, 1), *dx1 = rnd_floats(N, 0, 1), *dx2 = rnd_floats(N, 0, 1);
            float *dw1 = hasw ? rnd_floats((size_t)n, -1, 1) : NULL, *dw2 = hasw ? dup(dw1, (size_t)n) : NULL;
            cpu->rmsnorm_backward(cpu, dx1, dw1, dy, x, w, r2, R, n);
            ref->rmsnorm_backward(ref, dx2, dw2, dy, x, w, r2, R, n);
            snprintf(what, sizeof what, "rmsnorm_backward %dx%d%s", R, n, hasw ? "" : " (no weight)");
            agree(what, dx1, dx2, N, 2e-5);
            if (hasw) agree(what, dw1, dw2, (size_t)n, 2e-5);
            free(x), free(w), free(y1), free(y2), free(r1), free(r2), free(dy), free(dx1), free(dx2), free(dw1),
                free(dw2);
        }
    report("rmsnorm (+ backward)");

    /* RoPE: 3 heads of 12 with the last 8 dims rotated, row stride 40 */
    enum { ROWS = 9, NH = 3, HD = 12, RD = 8, LD = 40, POS = 64 };
    float *ct = malloc(sizeof(float) * POS * RD / 2), *st = malloc(sizeof(float) * POS * RD / 2);
    k_rope_table(ct, st, POS, RD, 10000.0f);
    int32_t pos[ROWS] = {0, 1, 5, 63, 2, 2, 17, 40, 9};
    for (int inv = 0; inv < 2; inv++)
        for (int bw = 0; bw < 2; bw++) {
            float *x1 = rnd_floats(ROWS * LD, -1, 1), *x2 = dup(x1, ROWS * LD);
            if (bw) {
                cpu->rope_backward(cpu, x1, ROWS, LD, NH, HD, RD, pos, ct, st, inv);
                ref->rope_backward(ref, x2, ROWS, LD, NH, HD, RD, pos, ct, st, inv);
            } else {
                cpu->rope(cpu, x1, ROWS, LD, NH, HD, RD, pos, ct, st, inv);
                ref->rope(ref, x2, ROWS, LD, NH, HD, RD, pos, ct, st, inv);
            }
            snprintf(what, sizeof what, "rope%s inverse=%d", bw ? "_backward" : "", inv);
            agree(what, x1, x2, ROWS * LD, 2e-6);
            free(x1), free(x2);
        }
    free(ct), free(st);
    report("rope (+ backward)");

    static const long lens[] = {1, 7, 255, 257, 70001};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int lim = 0; lim < 2; lim++) {
            long n = lens[li];
            float limit = lim ? 2.5f : 0.0f;
            float *g = rnd_floats((size_t)n, -4, 4), *u = rnd_floats((size_t)n, -4, 4), *g1 = dup(g, n), *g2 = dup(g, n);
            cpu->swiglu(cpu, g1, u, n, limit);
            ref->swiglu(ref, g2, u, n, limit);
            snprintf(what, sizeof what, "swiglu n=%ld limit=%g", n, (double)limit);
            agree(what, g1, g2, (size_t)n, 2e-6);
            float *dh = rnd_floats((size_t)n, -1, 1), *dg1 = dup(dh, n), *du1 = dup(dh, n), *dg2 = dup(dh, n),
                  *du2 = dup(dh, n);
            cpu->swiglu_backward(cpu, dg1, du1, dh, g, u, n, limit);
            ref->swiglu_backward(ref, dg2, du2, dh, g, u, n, limit);
            snprintf(what, sizeof what, "swiglu_backward n=%ld limit=%g", n, (double)limit);
            agree(what, dg1, dg2, (size_t)n, 2e-6);
            agree(what, du1, du2, (size_t)n, 2e-6);
            free(g), free(u), free(g1), free(g2), free(dh), free(dg1), free(du1), free(dg2), free(du2);
        }
    report("swiglu (+ backward)");

    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int R = shapes[si][0], n = shapes[si][1];
        size_t N = (size_t)R * n;
        float *a = rnd_floats(N, -1, 1), *b = rnd_floats(N, -1, 1), *y1 = dup(a, N), *y2 = dup(a, N);
        cpu->add(cpu, y1, y1, b, N);
        ref->add(ref, y2, y2, b, N);
        agree("add (in place)", y1, y2, N, 0);
        float *bias = rnd_floats((size_t)n, -1, 1), *db1 = dup(bias, (size_t)n), *db2 = dup(bias, (size_t)n);
        cpu->add_rows(cpu, y1, bias, R, n);
        ref->add_rows(ref, y2, bias, R, n);
        agree("add_rows", y1, y2, N, 0);
        cpu->add_rows_backward(cpu, db1, a, R, n);
        ref->add_rows_backward(ref, db2, a, R, n);
        agree("add_rows_backward", db1, db2, (size_t)n, 1e-6);
        free(a), free(b), free(y1), free(y2), free(bias), free(db1), free(db2);
    }
    report("add, add_rows (+ backward)");
}

/* ------------------------------------------------------------------ attention */

static void test_attention(void) {
    /* S, p0, Hq, Hkv, Dh, packed documents */
    static const int cases[][6] = {{1, 0, 1, 1, 8, 0},   {1, 9, 4, 2, 8, 0},   {3, 5, 8, 1, 16, 0},
                                   {17, 0, 4, 2, 8, 0},  {40, 0, 8, 8, 16, 0}, {33, 0, 6, 1, 32, 1},
                                   {70, 0, 4, 1, 24, 1}, {5, 30, 14, 2, 64, 0},
                                   /* decoding over a cache, 48 columns at a time where a block of 8
                                    * query rows shares its K/V head (and the 16 left over) */
                                   {1, 40, 8, 1, 96, 0}, {2, 20, 8, 1, 112, 0}, {1, 33, 16, 2, 64, 0}};
    whale_err err;
    char what[128];
    for (int prod = 0; prod < 2; prod++) {
        whale_dtype products = prod ? WHALE_BF16 : WHALE_F32;
        double tol = prod ? 5e-3 : 2e-5;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            int S = cases[ci][0], p0 = cases[ci][1], Hq = cases[ci][2], Hkv = cases[ci][3], Dh = cases[ci][4];
            int ctx = p0 + S, ld = Hkv * Dh + 3; /* a row stride wider than the heads */
            float *q = rnd_floats((size_t)S * Hq * Dh, -1, 1), *k = rnd_floats((size_t)ctx * ld, -1, 1),
                  *v = rnd_floats((size_t)ctx * ld, -1, 1);
            int32_t *seg = NULL;
            if (cases[ci][5]) { /* three documents packed in the window */
                seg = malloc(sizeof(int32_t) * (size_t)S);
                for (int s = 0; s < S; s++) seg[s] = s < S / 3 ? 0 : s < 2 * S / 3 ? S / 3 : 2 * S / 3;
            }
            size_t wn = cpu->attention_work_floats(cpu, ctx, Hq, Hkv, Dh),
                   bn = cpu->attention_backward_work_floats(cpu, ctx, Hq, Hkv, Dh);
            float *work = malloc(sizeof(float) * (wn > bn ? wn : bn)), *o1 = rnd_floats((size_t)S * Hq * Dh, 0, 1),
                  *o2 = dup(o1, (size_t)S * Hq * Dh);
            float scale = 1.0f / sqrtf((float)Dh);
            CHECK(cpu->attention(cpu, o1, q, k, v, ld, seg, S, p0, Hq, Hkv, Dh, scale, products, work, &err) == 0,
                  "%s", err.msg);
            CHECK(ref->attention(ref, o2, q, k, v, ld, seg, S, p0, Hq, Hkv, Dh, scale, products, NULL, &err) == 0,
                  "%s", err.msg);
            snprintf(what, sizeof what, "attention %s S=%d p0=%d heads %d/%d × %d%s", whale_dtype_name(products), S,
                     p0, Hq, Hkv, Dh, seg ? " packed" : "");
            agree(what, o1, o2, (size_t)S * Hq * Dh, tol);
            if (!prod) { /* the backward, fp32 products; dk, dv accumulate over the cached rows too */
                float *dout = rnd_floats((size_t)S * Hq * Dh, -1, 1), *dq1 = dup(o1, (size_t)S * Hq * Dh),
                      *dq2 = dup(o1, (size_t)S * Hq * Dh), *dk1 = rnd_floats((size_t)ctx * ld, -1, 1),
                      *dk2 = dup(dk1, (size_t)ctx * ld), *dv1 = rnd_floats((size_t)ctx * ld, -1, 1),
                      *dv2 = dup(dv1, (size_t)ctx * ld);
                CHECK(cpu->attention_backward(cpu, dq1, dk1, dv1, dout, q, k, v, ld, seg, S, p0, Hq, Hkv, Dh, scale,
                                              products, work, &err) == 0,
                      "%s", err.msg);
                CHECK(ref->attention_backward(ref, dq2, dk2, dv2, dout, q, k, v, ld, seg, S, p0, Hq, Hkv, Dh, scale,
                                              products, NULL, &err) == 0,
                      "%s", err.msg);
                snprintf(what, sizeof what, "attention_backward S=%d p0=%d heads %d/%d × %d%s", S, p0, Hq, Hkv, Dh,
                         seg ? " packed" : "");
                agree(what, dq1, dq2, (size_t)S * Hq * Dh, 2e-5);
                agree(what, dk1, dk2, (size_t)ctx * ld, 2e-5);
                agree(what, dv1, dv2, (size_t)ctx * ld, 2e-5);
                free(dout), free(dq1), free(dq2), free(dk1), free(dk2), free(dv1), free(dv2);
            }
            free(q), free(k), free(v), free(seg), free(work), free(o1), free(o2);
        }
        report(prod ? "attention bf16 products" : "attention fp32 (+ backward)");
    }
}

/* attention_spans: spans of different lengths and p0 (decode and prefill
 * ones in one call), one and several K/V heads; each span's output equals
 * the cpu backend's own attention call for it bit for bit, and the
 * reference within the attention tolerances. */
static void test_attention_spans(void) {
    static const int spans[][2] = {{1, 0}, {1, 37}, {3, 12}, {1, 200}, {12, 0}, {2, 90}, {1, 5}}; /* S, p0 */
    enum { N = sizeof spans / sizeof spans[0], Dh = 40 };
    whale_err err;
    char what[128];
    for (int prod = 0; prod < 2; prod++)
        for (int Hkv = 1; Hkv <= 2; Hkv++) {
            const whale_dtype products = prod ? WHALE_BF16 : WHALE_F32;
            const int Hq = 6, ld = Hkv * Dh + 5;
            whale_att_span sc[N], sr[N];
            float *own[N];
            for (int i = 0; i < N; i++) {
                int S = spans[i][0], ctx = spans[i][1] + S;
                size_t no = (size_t)S * Hq * Dh;
                float *k = rnd_floats((size_t)ctx * ld, -1, 1), *v = rnd_floats((size_t)ctx * ld, -1, 1);
                sc[i] = (whale_att_span){rnd_floats(no, 0, 1), rnd_floats(no, -1, 1), k, v, ld, NULL, S, spans[i][1]};
                sr[i] = sc[i], sr[i].out = rnd_floats(no, 0, 1), own[i] = rnd_floats(no, 0, 1);
            }
            float *work = malloc(sizeof(float) * cpu->attention_work_floats(cpu, 202, Hq, Hkv, Dh));
            float scale = 1.0f / sqrtf((float)Dh);
            CHECK(cpu->attention_spans(cpu, sc, N, Hq, Hkv, Dh, scale, products, work, &err) == 0, "%s", err.msg);
            CHECK(ref->attention_spans(ref, sr, N, Hq, Hkv, Dh, scale, products, NULL, &err) == 0, "%s", err.msg);
            for (int i = 0; i < N; i++) {
                const whale_att_span *p = &sc[i];
                size_t no = (size_t)p->S * Hq * Dh;
                CHECK(cpu->attention(cpu, own[i], p->q, p->k, p->v, ld, NULL, p->S, p->p0, Hq, Hkv, Dh, scale,
                                     products, work, &err) == 0,
                      "%s", err.msg);
                CHECK(memcmp(own[i], p->out, sizeof(float) * no) == 0,
                      "attention_spans %s heads %d/%d: span %d (S=%d p0=%d) differs from its own attention call",
                      whale_dtype_name(products), Hq, Hkv, i, p->S, p->p0);
                snprintf(what, sizeof what, "attention_spans %s span %d S=%d p0=%d heads %d/%d × %d",
                         whale_dtype_name(products), i, p->S, p->p0, Hq, Hkv, Dh);
                agree(what, p->out, sr[i].out, no, prod ? 5e-3 : 2e-5);
                free(p->out), free((void *)p->q), free((void *)p->k), free((void *)p->v), free(sr[i].out), free(own[i]);
            }
            free(work);
        }
    report("attention_spans");
}

/* ------------------------------------------------------------------ hyper-connections, routing */

static void test_hc(void) {
    enum { T = 7, D = 19 };
    char what[96];
    for (int M = 1; M <= 4; M += 3)
        for (int iters = 1; iters <= 20; iters += 19) {
            int n = (2 + M) * M;
            float *mix = rnd_floats((size_t)T * n, -2, 2), *rstd = rnd_floats(T, 0.5, 2), *base = rnd_floats((size_t)n, -1, 1);
            float scale[3] = {0.7f, 1.3f, 0.9f}, eps = 1e-6f;
            float *m1 = dup(mix, (size_t)T * n), *m2 = dup(mix, (size_t)T * n);
            float *pre1 = malloc(sizeof(float) * T * M), *pre2 = malloc(sizeof(float) * T * M),
                  *post1 = malloc(sizeof(float) * T * M), *post2 = malloc(sizeof(float) * T * M),
                  *comb1 = malloc(sizeof(float) * T * M * M), *comb2 = malloc(sizeof(float) * T * M * M);
            cpu->hc_coeffs(cpu, T, m1, rstd, scale, base, M, iters, eps, pre1, post1, comb1);
            ref->hc_coeffs(ref, T, m2, rstd, scale, base, M, iters, eps, pre2, post2, comb2);
            snprintf(what, sizeof what, "hc_coeffs M=%d iters=%d", M, iters);
            agree(what, m1, m2, (size_t)T * n, 0);
            agree(what, pre1, pre2, (size_t)T * M, 2e-6);
            agree(what, post1, post2, (size_t)T * M, 2e-6);
            agree(what, comb1, comb2, (size_t)T * M * M, 2e-5);
            float *dpre = rnd_floats((size_t)T * M, -1, 1), *dpost = rnd_floats((size_t)T * M, -1, 1),
                  *dcomb = rnd_floats((size_t)T * M * M, -1, 1), *dm1 = malloc(sizeof(float) * T * n),
                  *dm2 = malloc(sizeof(float) * T * n), *db1 = rnd_floats((size_t)n, -1, 1), *db2 = dup(db1, (size_t)n);
            float ds1[3] = {0.1f, 0.2f, 0.3f}, ds2[3] = {0.1f, 0.2f, 0.3f};
            cpu->hc_coeffs_backward(cpu, T, m1, scale, base, M, iters, eps, dpre, dpost, dcomb, dm1, ds1, db1);
            ref->hc_coeffs_backward(ref, T, m1, scale, base, M, iters, eps, dpre, dpost, dcomb, dm2, ds2, db2);
            snprintf(what, sizeof what, "hc_coeffs_backward M=%d iters=%d", M, iters);
            agree(what, dm1, dm2, (size_t)T * n, 1e-4);
            agree(what, ds1, ds2, 3, 1e-4);
            agree(what, db1, db2, (size_t)n, 1e-4);
            free(mix), free(rstd), free(base), free(m1), free(m2), free(pre1), free(pre2), free(post1), free(post2),
                free(comb1), free(comb2), free(dpre), free(dpost), free(dcomb), free(dm1), free(dm2), free(db1),
                free(db2);
        }
    report("hc_coeffs (+ backward)");

    for (int M = 1; M <= 4; M += 3) {
        float *mix = rnd_floats((size_t)T * M, -2, 2), *rstd = rnd_floats(T, 0.5, 2), *base = rnd_floats((size_t)M, -1, 1);
        float scale = 0.8f, *m1 = dup(mix, (size_t)T * M), *m2 = dup(mix, (size_t)T * M);
        float *p1 = malloc(sizeof(float) * T * M), *p2 = malloc(sizeof(float) * T * M);
        cpu->hc_head_coeffs(cpu, T, m1, rstd, &scale, base, M, 1e-6f, p1);
        ref->hc_head_coeffs(ref, T, m2, rstd, &scale, base, M, 1e-6f, p2);
        agree("hc_head_coeffs", p1, p2, (size_t)T * M, 2e-6);
        float *dpre = rnd_floats((size_t)T * M, -1, 1), *dm1 = malloc(sizeof(float) * T * M),
              *dm2 = malloc(sizeof(float) * T * M), *db1 = calloc((size_t)M, 4), *db2 = calloc((size_t)M, 4);
        float ds1 = 0, ds2 = 0;
        cpu->hc_head_coeffs_backward(cpu, T, m1, &scale, base, M, 1e-6f, dpre, dm1, &ds1, db1);
        ref->hc_head_coeffs_backward(ref, T, m1, &scale, base, M, 1e-6f, dpre, dm2, &ds2, db2);
        agree("hc_head_coeffs_backward", dm1, dm2, (size_t)T * M, 2e-5);
        agree("hc_head_coeffs_backward dscale", &ds1, &ds2, 1, 2e-5);
        agree("hc_head_coeffs_backward dbase", db1, db2, (size_t)M, 2e-5);
        free(mix), free(rstd), free(base), free(m1), free(m2), free(p1), free(p2), free(dpre), free(dm1), free(dm2),
            free(db1), free(db2);
    }
    report("hc_head_coeffs (+ backward)");

    for (int M = 1; M <= 4; M += 3) {
        size_t XS = (size_t)T * M * D;
        float *X = rnd_floats(XS, -1, 1), *pre = rnd_floats((size_t)T * M, 0, 1), *y1 = malloc(4 * T * D),
              *y2 = malloc(4 * T * D);
        cpu->hc_reduce(cpu, y1, X, pre, T, M, D);
        ref->hc_reduce(ref, y2, X, pre, T, M, D);
        agree("hc_reduce", y1, y2, (size_t)T * D, 2e-6);
        float *dy = rnd_floats((size_t)T * D, -1, 1), *dX1 = rnd_floats(XS, -1, 1), *dX2 = dup(dX1, XS),
              *dp1 = malloc(4 * T * M), *dp2 = malloc(4 * T * M);
        cpu->hc_reduce_backward(cpu, dX1, dp1, dy, X, pre, T, M, D);
        ref->hc_reduce_backward(ref, dX2, dp2, dy, X, pre, T, M, D);
        agree("hc_reduce_backward dX", dX1, dX2, XS, 2e-6);
        agree("hc_reduce_backward dpre", dp1, dp2, (size_t)T * M, 2e-6);

        float *o = rnd_floats((size_t)T * D, -1, 1), *post = rnd_floats((size_t)T * M, 0, 2),
              *comb = rnd_floats((size_t)T * M * M, 0, 1), *X1 = malloc(4 * XS), *X2 = malloc(4 * XS);
        cpu->hc_expand(cpu, X1, o, X, post, comb, T, M, D);
        ref->hc_expand(ref, X2, o, X, post, comb, T, M, D);
        agree("hc_expand", X1, X2, XS, 2e-6);
        float *dXo = rnd_floats(XS, -1, 1), *do1 = malloc(4 * T * D), *do2 = malloc(4 * T * D),
              *dpo1 = malloc(4 * T * M), *dpo2 = malloc(4 * T * M), *dc1 = malloc(4 * T * M * M),
              *dc2 = malloc(4 * T * M * M);
        cpu->hc_expand_backward(cpu, do1, dX1, dpo1, dc1, dXo, o, X, post, comb, T, M, D);
        ref->hc_expand_backward(ref, do2, dX2, dpo2, dc2, dXo, o, X, post, comb, T, M, D);
        agree("hc_expand_backward dout", do1, do2, (size_t)T * D, 2e-6);
        agree("hc_expand_backward dX", dX1, dX2, XS, 2e-6);
        agree("hc_expand_backward dpost", dpo1, dpo2, (size_t)T * M, 2e-6);
        agree("hc_expand_backward dcomb", dc1, dc2, (size_t)T * M * M, 2e-6);

        float *r1 = malloc(4 * T), *r2 = malloc(4 * T), *drs = rnd_floats(T, -1, 1);
        cpu->hc_rstd(cpu, r1, X, T, M * D, 1e-6f);
        ref->hc_rstd(ref, r2, X, T, M * D, 1e-6f);
        agree("hc_rstd", r1, r2, T, 2e-6);
        cpu->rstd_backward(cpu, dX1, X, r2, drs, T, M * D);
        ref->rstd_backward(ref, dX2, X, r2, drs, T, M * D);
        agree("rstd_backward", dX1, dX2, XS, 2e-6);
        free(X), free(pre), free(y1), free(y2), free(dy), free(dX1), free(dX2), free(dp1), free(dp2), free(o),
            free(post), free(comb), free(X1), free(X2), free(dXo), free(do1), free(do2), free(dpo1), free(dpo2),
            free(dc1), free(dc2), free(r1), free(r2), free(drs);
    }
    report("hc_reduce, hc_expand, rstd");
}

static void test_routing(void) {
    enum { T = 11, E = 16, K = 4 };
    static const char *names[] = {"sqrtsoftplus", "softmax", "sigmoid"};
    char what[96];
    for (int scoring = 0; scoring < 3; scoring++)
        for (int hasb = 0; hasb < 2; hasb++) {
            float *logit = rnd_floats((size_t)T * E, -3, 3), *bias = hasb ? rnd_floats(E, -0.2, 0.2) : NULL;
            int32_t i1[T * K], i2[T * K];
            float w1[T * K], w2[T * K];
            cpu->gate_route(cpu, T, scoring, E, K, 2.5f, logit, bias, i1, w1);
            ref->gate_route(ref, T, scoring, E, K, 2.5f, logit, bias, i2, w2);
            snprintf(what, sizeof what, "gate_route %s%s", names[scoring], hasb ? " + bias" : "");
            CHECK(memcmp(i1, i2, sizeof i1) == 0, "%s: different experts chosen", what);
            agree(what, w1, w2, T * K, 2e-6);
            float *dw = rnd_floats(T * K, -1, 1), *dl1 = malloc(4 * T * E), *dl2 = malloc(4 * T * E);
            cpu->gate_route_backward(cpu, T, scoring, E, K, 2.5f, logit, i1, dw, dl1);
            ref->gate_route_backward(ref, T, scoring, E, K, 2.5f, logit, i1, dw, dl2);
            snprintf(what, sizeof what, "gate_route_backward %s", names[scoring]);
            agree(what, dl1, dl2, (size_t)T * E, 1e-4);
            free(logit), free(bias), free(dw), free(dl1), free(dl2);
        }
    report("gate_route (+ backward)");
}

/* the bf16-operand products, the parts of one depth, the conversions */
static void test_bf16_operands(void) {
    static const int shapes[][3] = {{1, 9, 5}, {7, 33, 17}, {40, 70, 65}};
    whale_err err;
    char what[96];
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *A = rnd_floats((size_t)M * K, -2, 2), *At = rnd_floats((size_t)K * M, -2, 2),
              *B = rnd_floats((size_t)K * N, -1, 1);
        uint16_t *A16 = malloc(2 * (size_t)M * K), *At16 = malloc(2 * (size_t)K * M), *B16 = malloc(2 * (size_t)K * N);
        cpu->to_bf16(cpu, A16, A, (size_t)M * K);
        ref->to_bf16(ref, (uint16_t *)B16, A, (size_t)(M * K < K * N ? M * K : K * N));
        CHECK(memcmp(A16, B16, 2 * (size_t)(M * K < K * N ? M * K : K * N)) == 0, "to_bf16 differs");
        cpu->to_bf16(cpu, At16, At, (size_t)K * M);
        cpu->to_bf16(cpu, B16, B, (size_t)K * N);
        float *back1 = malloc(4 * (size_t)K * N), *back2 = malloc(4 * (size_t)K * N);
        cpu->from_bf16(cpu, back1, B16, (size_t)K * N);
        ref->from_bf16(ref, back2, B16, (size_t)K * N);
        agree("from_bf16", back1, back2, (size_t)K * N, 0);
        whale_wref W = {WHALE_BF16, B16, N, NULL, 0};
        float *c1 = rnd_floats((size_t)M * N, -1, 1), *c2 = dup(c1, (size_t)M * N);
        CHECK(cpu->matmul_nn_b16(cpu, M, N, K, A16, K, W, c1, N, 1, &err) == 0, "%s", err.msg);
        CHECK(ref->matmul_nn_b16(ref, M, N, K, A16, K, W, c2, N, 1, &err) == 0, "%s", err.msg);
        snprintf(what, sizeof what, "matmul_nn_b16 %dx%dx%d", M, N, K);
        agree(what, c1, c2, (size_t)M * N, 2e-5);
        CHECK(cpu->matmul_tn_b16(cpu, M, N, K, At16, M, B16, N, c1, N, 0, &err) == 0, "%s", err.msg);
        CHECK(ref->matmul_tn_b16(ref, M, N, K, At16, M, B16, N, c2, N, 0, &err) == 0, "%s", err.msg);
        snprintf(what, sizeof what, "matmul_tn_b16 %dx%dx%d", M, N, K);
        agree(what, c1, c2, (size_t)M * N, 2e-5);
        /* three parts of depth K sharing A, in each format: as three matmul_nt */
        static const whale_dtype formats[] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
        for (int fi = 0; fi < 4; fi++) {
            weight w[3];
            whale_mm_part parts[3];
            float *out1[3], *out2[3];
            for (int p = 0; p < 3; p++) {
                w[p] = make_weight(formats[fi], N + p, K);
                out1[p] = malloc(4 * (size_t)M * (N + p)), out2[p] = malloc(4 * (size_t)M * (N + p));
                parts[p] = (whale_mm_part){M, N + p, A, K, w[p].w.data, K, w[p].w.scale, out1[p], N + p, w[p].w.row0};
            }
            CHECK(cpu->matmul_nt_parts(cpu, formats[fi], K, 3, parts, 0, &err) == 0, "%s", err.msg);
            for (int p = 0; p < 3; p++) {
                CHECK(ref->matmul_nt(ref, M, N + p, K, A, K, w[p].w, out2[p], N + p, 0, &err) == 0, "%s", err.msg);
                snprintf(what, sizeof what, "matmul_nt_parts %s part %d", whale_dtype_name(formats[fi]), p);
                agree(what, out1[p], out2[p], (size_t)M * (N + p), 2e-5);
                free(out1[p]), free(out2[p]), free(w[p].mem), free(w[p].scale);
            }
        }
        free(A), free(At), free(B), free(A16), free(At16), free(B16), free(back1), free(back2), free(c1), free(c2);
    }
    report("bf16 operands, parts");
}

/* rows by index: embeddings, the MoE dispatch and combine */
static void test_rows(void) {
    enum { ROWS = 23, COLS = 37, N = 41 };
    int32_t idx[N], uniq[N];
    for (int i = 0; i < N; i++) idx[i] = (int32_t)((i * 7 + 3) % ROWS), uniq[i] = i;
    static const whale_dtype formats[] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
    char what[96];
    for (int fi = 0; fi < 4; fi++) {
        weight W = make_weight(formats[fi], ROWS, COLS);
        float *d1 = rnd_floats((size_t)N * (COLS + 5), 0, 1), *d2 = dup(d1, (size_t)N * (COLS + 5));
        cpu->get_rows(cpu, d1, COLS + 5, W.w, idx, N, COLS);
        ref->get_rows(ref, d2, COLS + 5, W.w, idx, N, COLS);
        snprintf(what, sizeof what, "get_rows %s", whale_dtype_name(formats[fi]));
        agree(what, d1, d2, (size_t)N * (COLS + 5), 0);
        free(d1), free(d2), free(W.mem), free(W.scale);
    }
    float *src = rnd_floats((size_t)ROWS * (COLS + 3), -1, 1), *w = rnd_floats(N, -2, 2);
    for (int wi = 0; wi < 2; wi++) {
        const float *ww = wi ? w : NULL;
        float *g1 = malloc(4 * N * COLS), *g2 = malloc(4 * N * COLS);
        cpu->gather_rows(cpu, g1, src, COLS + 3, idx, ww, N, COLS);
        ref->gather_rows(ref, g2, src, COLS + 3, idx, ww, N, COLS);
        agree(wi ? "gather_rows weighted" : "gather_rows", g1, g2, (size_t)N * COLS, 0);
        uint16_t *h1 = malloc(2 * N * COLS), *h2 = malloc(2 * N * COLS);
        cpu->gather_rows_bf16(cpu, h1, src, COLS + 3, idx, ww, N, COLS);
        ref->gather_rows_bf16(ref, h2, src, COLS + 3, idx, ww, N, COLS);
        CHECK(memcmp(h1, h2, 2 * N * COLS) == 0, "gather_rows_bf16%s differs", wi ? " weighted" : "");
        /* repeated indices (an embedding's gradient) and distinct ones (an expert's tokens) */
        for (int rep = 0; rep < 2; rep++) {
            float *s1 = rnd_floats((size_t)N * (COLS + 1), -1, 1), *s2 = dup(s1, (size_t)N * (COLS + 1));
            cpu->scatter_add_rows(cpu, s1, COLS + 1, g1, COLS, rep ? idx : uniq, ww, rep ? N : N, COLS);
            ref->scatter_add_rows(ref, s2, COLS + 1, g1, COLS, rep ? idx : uniq, ww, rep ? N : N, COLS);
            agree(rep ? "scatter_add_rows (repeated rows)" : "scatter_add_rows", s1, s2, (size_t)N * (COLS + 1), 2e-6);
            free(s1), free(s2);
        }
        free(g1), free(g2), free(h1), free(h2);
    }
    float *o1 = malloc(4 * N), *o2 = malloc(4 * N);
    cpu->dot_rows(cpu, o1, src, COLS + 3, idx, src, COLS + 3, NULL, ROWS < N ? ROWS : N, COLS);
    ref->dot_rows(ref, o2, src, COLS + 3, idx, src, COLS + 3, NULL, ROWS < N ? ROWS : N, COLS);
    agree("dot_rows", o1, o2, ROWS < N ? ROWS : N, 1e-6);
    float *r1 = rnd_floats((size_t)N * 3 * COLS, -1, 1), *r2 = dup(r1, (size_t)N * 3 * COLS);
    cpu->repeat_rows(cpu, r1, N, 3, COLS);
    ref->repeat_rows(ref, r2, N, 3, COLS);
    agree("repeat_rows", r1, r2, (size_t)N * 3 * COLS, 0);
    float *dy1 = rnd_floats((size_t)N * COLS, -1, 1), *dy2 = dup(dy1, (size_t)N * COLS), *sc = rnd_floats(N, 0.5, 2);
    cpu->scale_rows_backward(cpu, dy1, o1, r1, sc, N, COLS);
    ref->scale_rows_backward(ref, dy2, o2, r1, sc, N, COLS);
    agree("scale_rows_backward dx", dy1, dy2, (size_t)N * COLS, 0);
    agree("scale_rows_backward ds", o1, o2, N, 1e-6);
    long n = 70001;
    float *dh = rnd_floats((size_t)n, -1, 1), *g = rnd_floats((size_t)n, -4, 4), *u = rnd_floats((size_t)n, -4, 4);
    uint16_t *a1 = malloc(2 * n), *b1 = malloc(2 * n), *a2 = malloc(2 * n), *b2 = malloc(2 * n);
    cpu->swiglu_backward_bf16(cpu, a1, b1, dh, g, u, n, 2.5f);
    ref->swiglu_backward_bf16(ref, a2, b2, dh, g, u, n, 2.5f);
    long off = 0;
    for (long i = 0; i < n; i++) /* one bf16 step apart at most: the fp32 values may round on either side */
        off += abs((int)a1[i] - (int)a2[i]) > 1 || abs((int)b1[i] - (int)b2[i]) > 1;
    CHECK(off == 0, "swiglu_backward_bf16: %ld values more than one bf16 step apart", off);
    free(src), free(w), free(o1), free(o2), free(r1), free(r2), free(dy1), free(dy2), free(sc), free(dh), free(g),
        free(u), free(a1), free(b1), free(a2), free(b2);
    report("rows by index, bf16 swiglu");
}

static void test_buffers(whale_backend *be) {
    enum { N = 1000 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i;
    float *a = be->buf_alloc(be, sizeof host), *b = be->buf_alloc(be, sizeof host);
    CHECK(a && b && ((uintptr_t)a & 63) == 0, "%s: buffers", be->name);
    be->buf_from_host(be, a, host, sizeof host);
    be->buf_copy(be, b, a, sizeof host);
    be->buf_zero(be, a, sizeof host);
    whale_err err;
    CHECK(be->sync(be, &err) == WHALE_OK, "%s", err.msg);
    be->buf_to_host(be, back, b, sizeof host);
    CHECK(memcmp(back, host, sizeof host) == 0, "%s: a copy through buffers changed values", be->name);
    be->buf_to_host(be, back, a, sizeof host);
    CHECK(back[0] == 0 && back[N - 1] == 0, "%s: buf_zero", be->name);
    be->buf_free(be, a);
    be->buf_free(be, b);
}

int main(void) {
    whale_err err;
    CHECK(whale_backend_open("cpu", &cpu, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_backend_open("ref", &ref, &err) == WHALE_OK, "%s", err.msg);
    whale_backend *none;
    CHECK(whale_backend_open("cuda", &none, &err) == WHALE_ERR_ARG && strstr(err.msg, "unknown backend"), "%s",
          err.msg);
    if (!cpu || !ref) return test_finish("test_backend_ops");
    CHECK(cpu->version == WHALE_BACKEND_VERSION && ref->version == WHALE_BACKEND_VERSION, "versions");
    test_buffers(cpu);
    test_buffers(ref);
    test_products();
    test_norm_rope_swiglu();
    test_attention();
    test_attention_spans();
    test_hc();
    test_routing();
    test_bf16_operands();
    test_rows();
    whale_backend_close(cpu);
    whale_backend_close(ref);
    return test_finish("test_backend_ops");
}
