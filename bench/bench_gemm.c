/* Matrix-product benchmark: one JSON line per measurement.
 *
 *   OMP_NUM_THREADS=2 bench_gemm            standard shapes, decode, MoE,
 *                                           read bandwidth
 *   OMP_NUM_THREADS=2 bench_gemm --sweep-bf16   only the bf16 products over
 *                                           M = 17..2048, every path
 *   OMP_NUM_THREADS=2 bench_gemm --moe      only the mixture-of-experts pattern
 *   OMP_NUM_THREADS=2 bench_gemm --sweep    also every path over small and
 *                                           medium M (how the shape rules
 *                                           in gemm.h were chosen)
 *   OMP_NUM_THREADS=2 bench_gemm --shape KIND M N K [cold]
 *                                           one product, every path (e.g.
 *                                           nt_q8 512 4864 896: a Qwen2.5-0.5B
 *                                           prefill's gate projection)
 *
 * Fields: kind, M, N, K, path (auto = the normal choice; own / exact /
 * runtime forced), impl (what ran), ms and gflops (best of repeated calls),
 * weights: "hot" (the same operand every call, so it sits in cache) or
 * "cold" (calls rotate over copies filling 165 MB, or twice the last-level
 * cache where that is more, so every call streams the weights from DRAM,
 * as decode does with a model much larger than L3), and
 * for M <= 16 gbs: weight bytes read per second. Kind "nt_bf16" is
 * whale_gemm_nt_bf16 (weights in bf16: half the bytes; A rounded per call),
 * "nt_f16" whale_gemm_nt_f16 (fp16 weights), "nt_q8" whale_gemm_nt_q8
 * (int8 weights + per-row scales: a quarter of the bytes), "nn_bf16" /
 * "tn_bf16" / "nn_f16" / "tn_f16" the mixed-precision backward products
 * (B in bf16 / fp16 for nn, operands rounded per call for tn), "nn_b16" /
 * "tn_b16" the bf16 ones on operands rounded beforehand (the training
 * step rounds a gradient once for both products), "nt_a8" whale_gemm_nt_a8
 * (the int8 weights of nt_q8 packed, activations rounded to int8 per
 * block of 32; its one path is ours). Lines with
 * "ceiling" are whale_gemm_measure_gflops_dtype (hot weights, auto path).
 *
 * The machine may be shared: run it when idle (other processes show up as
 * calls ~8-12 ms slower than they should be, one scheduler time slice).
 */
#include "core/core.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "whale_bench.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NT, NN, TN, NT_BF16, NT_F16, NT_Q8, NN_BF16, TN_BF16, NN_F16, TN_F16, NN_B16, TN_B16, NT_A8 };
static const char *const kinds[] = {"nt",     "nn",      "tn",      "nt_bf16", "nt_f16", "nt_q8",  "nn_bf16",
                                    "tn_bf16", "nn_f16", "tn_f16",  "nn_b16", "tn_b16", "nt_a8"};
static const char *const paths[] = {"auto", "own", "exact", "runtime"};

/* B holds 129280 x 320 floats (165 MB): the lm_head, or copies of smaller
 * weights for the cold runs. */
#define B_FLOATS ((size_t)129280 * 320)

/* Values each weight buffer holds (B_FLOATS at least): the cold runs' copies
 * fill twice the last-level cache in the weights' format, so every call
 * reads them from DRAM also where that cache is large (a Xeon's host may
 * report 260 MB). Set once in main. */
static size_t cap_f32, cap_16, cap_8;

typedef struct {
    float *A, *B, *C;
    uint16_t *A16; /* A rounded to bf16 (265 MB) */
    uint16_t *B16; /* B rounded to bf16 (83 MB) */
    uint16_t *F16; /* B rounded to fp16 (83 MB) */
    int8_t *B8;    /* B quantised in rows of 320 (41 MB) ... */
    float *scale;  /* ... and their scales (one per 64 values: room for any K >= 64) */
    uint8_t *P8;   /* copies of B8 packed for nt_a8 at the current shape (a8_pack) */
    size_t p8_bytes, p8_cap;
} bufs;

/* Weight bytes per element for a kind (GB/s of the decode rows). */
static size_t weight_bytes(int kind) {
    return kind == NT_Q8 || kind == NT_A8 ? 1 : kind == NT || kind == NN || kind == TN ? 4 : 2;
}

/* Values of the buffer a kind reads its weights from. */
static size_t weight_cap(int kind) {
    switch (kind) {
    case NT_Q8:
    case NT_A8: return cap_8;
    case NT_BF16:
    case NT_F16:
    case NN_BF16:
    case NN_F16:
    case NN_B16:
    case TN_B16: return cap_16;
    default: return cap_f32; /* f32, and tn_bf16 / tn_f16, which round B per call */
    }
}

/* The narrow-weight kinds read their copy of B at the same element offset. */
static whale_code run(whale_gemm *g, int kind, int M, int N, int K, const bufs *b,
                      const float *B, whale_err *err) {
    const size_t off = (size_t)(B - b->B);
    switch (kind) {
    case NT_BF16:
        return whale_gemm_nt_bf16(g, M, N, K, b->A, K, b->B16 + off, K, b->C, N, 0, err);
    case NT_F16: return whale_gemm_nt_f16(g, M, N, K, b->A, K, b->F16 + off, K, b->C, N, 0, err);
    case NT_A8:
        return whale_gemm_nt_a8(g, M, N, K, b->A, K, b->P8 + off / ((size_t)N * K) * b->p8_bytes, 0,
                                b->scale + off / (size_t)K, b->C, N, 0, err);
    case NT_Q8:
        return whale_gemm_nt_q8(g, M, N, K, b->A, K, b->B8 + off, K, b->scale + off / (size_t)K,
                                b->C, N, 0, err);
    case NN_BF16: return whale_gemm_nn_bf16(g, M, N, K, b->A, K, b->B16 + off, N, b->C, N, 0, err);
    case TN_BF16: return whale_gemm_tn_bf16(g, M, N, K, b->A, M, B, N, b->C, N, 0, err);
    case NN_F16: return whale_gemm_nn_f16(g, M, N, K, b->A, K, b->F16 + off, N, b->C, N, 0, err);
    case TN_F16: return whale_gemm_tn_f16(g, M, N, K, b->A, M, B, N, b->C, N, 0, err);
    case NN_B16: return whale_gemm_nn_b16(g, M, N, K, b->A16, K, b->B16 + off, N, b->C, N, 0, err);
    case TN_B16: return whale_gemm_tn_b16(g, M, N, K, b->A16, M, b->B16 + off, N, b->C, N, 0, err);
    case NT: return whale_gemm_nt(g, M, N, K, b->A, K, B, K, b->C, N, 0, err);
    case NN: return whale_gemm_nn(g, M, N, K, b->A, K, B, N, b->C, N, 0, err);
    default: return whale_gemm_tn(g, M, N, K, b->A, M, B, N, b->C, N, 0, err);
    }
}

/* The copies of B8 that the calls on N x K weights read, packed for nt_a8
 * (0 when out of memory). */
static int a8_pack(bufs *b, int N, int K, int copies) {
    const size_t one = whale_q8p_bytes(N, K), need = one * (size_t)copies;
    if (need > b->p8_cap) {
        free(b->P8);
        b->P8 = whale_alloc(need);
        b->p8_cap = b->P8 ? need : 0;
        if (!b->P8) return 0;
    }
    b->p8_bytes = one;
    for (int c = 0; c < copies; c++) whale_q8p_pack(b->P8 + c * one, b->B8 + (size_t)c * N * K, K, N, K);
    return 1;
}

/* Best seconds per call after an untimed warm-up, within ~0.3 s. Cold: each
 * timed sample is a pass over all copies of B, divided by their number. */
static double time_call(whale_gemm *g, int kind, int M, int N, int K, bufs *b, int cold) {
    const size_t size = (size_t)N * K;
    int copies = cold ? (int)(weight_cap(kind) / size) : 1;
    if (copies > 4096) copies = 4096;
    whale_err err;
    if (kind == NT_A8 && !a8_pack(b, N, K, copies)) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        return -1;
    }
    if (run(g, kind, M, N, K, b, b->B, &err)) {
        fprintf(stderr, "bench_gemm: %s\n", err.msg);
        return -1;
    }
    double best = 0, start = whale_now();
    for (int r = 0; r < 300 && (r < 3 || whale_now() - start < 0.3); r++) {
        double t0 = whale_now();
        for (int c = 0; c < copies; c++) run(g, kind, M, N, K, b, b->B + c * size, &err);
        double t = (whale_now() - t0) / copies;
        if (r == 0 || t < best) best = t;
    }
    return best;
}

static void bench_shape(whale_gemm *g, int kind, int M, int N, int K, whale_gemm_path path,
                        int cold, bufs *b) {
    whale_gemm_set_path(g, path);
    double t = time_call(g, kind, M, N, K, b, cold);
    whale_gemm_set_path(g, WHALE_GEMM_AUTO);
    if (t <= 0) return;
    printf("{\"kind\":\"%s\",\"M\":%d,\"N\":%d,\"K\":%d,\"path\":\"%s\",\"impl\":\"%s\","
           "\"weights\":\"%s\",\"ms\":%.4f,\"gflops\":%.1f",
           kinds[kind], M, N, K, paths[path], whale_gemm_last_impl(g), cold ? "cold" : "hot",
           t * 1e3, 2.0 * M * N * (double)K / t * 1e-9);
    if (M <= 16) printf(",\"gbs\":%.1f", (double)N * K * weight_bytes(kind) / t * 1e-9);
    printf("}\n");
    fflush(stdout);
}

/* The normal choice plus every forced path, for comparison. */
static void bench_paths(whale_gemm *g, int kind, int M, int N, int K, int cold, bufs *b) {
    for (int p = WHALE_GEMM_AUTO; p <= (kind == NT_A8 ? WHALE_GEMM_AUTO : WHALE_GEMM_DNNL_RUNTIME); p++) {
        if (p == WHALE_GEMM_OWN && M > 32) continue; /* our kernels are for few rows */
        bench_shape(g, kind, M, N, K, (whale_gemm_path)p, cold, b);
    }
}

/* Mixture-of-experts pattern: an expert Linear (in = 320, out = 640) sees a
 * different number of tokens T every call: forward nt [T,320]x[640,320]^T,
 * input gradient nn [T,640]x[640,320], weight gradient tn [T,640]^T x [T,320]
 * (there T is the summed dimension K). Strategies: "exact" (a primitive per
 * shape), "runtime" (one primitive with runtime sizes), "blocks" (T split
 * into power-of-two blocks with exact primitives, a bounded set of shapes;
 * for tn the blocks accumulate), "auto" (what whale_gemm picks). A fresh
 * context per round so our cache starts empty; oneDNN's own process-wide
 * primitive cache does not, so the first round ("gflops_cold") pays for
 * creating each new shape and later ones mostly re-create from it cheaply
 * ("gflops" is the best round). Kinds nt_bf16, nn_b16 and tn_b16 are the
 * same products on bf16 operands (a bf16 training step). */
static void bench_moe(int kind, const char *strategy, const bufs *b) {
    enum { CALLS = 200, TMIN = 200, TMAX = 600, IN = 320, OUT = 640, ROUNDS = 3 };
    const int blocks = !strcmp(strategy, "blocks");
    const whale_gemm_path path = !strcmp(strategy, "runtime") ? WHALE_GEMM_DNNL_RUNTIME
                                 : !strcmp(strategy, "auto")  ? WHALE_GEMM_AUTO
                                                              : WHALE_GEMM_DNNL_EXACT;
    double best = 0, cold = 0;
    whale_gemm_stats st = {0};
    char impl[64] = "";
    for (int round = 0; round < ROUNDS; round++) {
        whale_err err;
        whale_gemm *g;
        if (whale_gemm_new(&g, &err)) {
            fprintf(stderr, "bench_gemm: %s\n", err.msg);
            return;
        }
        whale_gemm_set_path(g, path);
        whale_rng rng;
        whale_rng_seed(&rng, 7);
        double flops = 0, t0 = whale_now();
        for (int i = 0; i < CALLS; i++) {
            const int T = TMIN + (int)(whale_rng_u64(&rng) % (TMAX - TMIN + 1));
            int done = 0;
            while (done < T) {
                int rows = T - done;
                if (blocks) {
                    int p = 1;
                    while (p * 2 <= rows) p *= 2;
                    rows = p;
                }
                whale_code rc;
                if (kind == NT_BF16)
                    rc = whale_gemm_nt_bf16(g, rows, OUT, IN, b->A + (size_t)done * IN, IN, b->B16, IN,
                                            b->C + (size_t)done * OUT, OUT, 0, &err);
                else if (kind == NN_B16)
                    rc = whale_gemm_nn_b16(g, rows, IN, OUT, b->A16 + (size_t)done * OUT, OUT, b->B16, IN,
                                           b->C + (size_t)done * IN, IN, 0, &err);
                else if (kind == TN_B16)
                    rc = whale_gemm_tn_b16(g, OUT, IN, rows, b->A16 + (size_t)done * OUT, OUT,
                                           b->B16 + (size_t)done * IN, IN, b->C, IN, done > 0, &err);
                else if (kind == NT) /* Y[T,OUT] = X[T,IN] W[OUT,IN]^T */
                    rc = whale_gemm_nt(g, rows, OUT, IN, b->A + (size_t)done * IN, IN, b->B, IN,
                                       b->C + (size_t)done * OUT, OUT, 0, &err);
                else if (kind == NN) /* dX[T,IN] = dY[T,OUT] W[OUT,IN] */
                    rc = whale_gemm_nn(g, rows, IN, OUT, b->A + (size_t)done * OUT, OUT, b->B, IN,
                                       b->C + (size_t)done * IN, IN, 0, &err);
                else /* dW[OUT,IN] (+)= dY[T,OUT]^T X[T,IN] */
                    rc = whale_gemm_tn(g, OUT, IN, rows, b->A + (size_t)done * OUT, OUT,
                                       b->B + (size_t)done * IN, IN, b->C, IN, done > 0, &err);
                if (rc) {
                    fprintf(stderr, "bench_gemm: %s\n", err.msg);
                    whale_gemm_free(g);
                    return;
                }
                done += rows;
            }
            flops += 2.0 * T * IN * (double)OUT;
        }
        double gf = flops / (whale_now() - t0) * 1e-9;
        if (round == 0) cold = gf;
        if (gf > best) {
            best = gf;
            whale_gemm_get_stats(g, &st);
            snprintf(impl, sizeof impl, "%s", whale_gemm_last_impl(g));
        }
        whale_gemm_free(g);
    }
    printf("{\"kind\":\"%s\",\"moe\":true,\"tokens\":\"%d..%d\",\"in\":%d,\"out\":%d,"
           "\"calls\":%d,\"strategy\":\"%s\",\"impl\":\"%s\",\"gflops\":%.1f,\"gflops_cold\":%.1f,"
           "\"created\":%lld,"
           "\"onednn_calls\":%lld,\"own_calls\":%lld}\n",
           kinds[kind], TMIN, TMAX, IN, OUT, CALLS, strategy, impl, best, cold, (long long)st.created,
           (long long)st.calls, (long long)st.own_calls);
    fflush(stdout);
}

static float *filled(size_t n, uint64_t seed) {
    float *p = whale_alloc(n * sizeof(float));
    if (!p) return NULL;
    whale_rng r;
    whale_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) p[i] = whale_rng_uniform(&r) - 0.5f;
    return p;
}

/* The expert pattern in f32 and with bf16 operands (training in bf16). */
static void bench_moe_all(const bufs *b) {
    for (int kind = 0; kind < 3; kind++) {
        bench_moe(kind, "exact", b);
        bench_moe(kind, "runtime", b);
        bench_moe(kind, "blocks", b);
        bench_moe(kind, "auto", b);
    }
    /* the same with bf16 operands (training in bf16) */
    static const int moe_bf16[] = {NT_BF16, NN_B16, TN_B16};
    for (int i = 0; i < 3; i++) {
        bench_moe(moe_bf16[i], "exact", b);
        bench_moe(moe_bf16[i], "runtime", b);
        bench_moe(moe_bf16[i], "auto", b);
    }
}

/* The standard shapes: training products in every format, the lm_head,
 * decode, decode attention and the mixture-of-experts pattern. */
static void bench_standard(whale_gemm *g, bufs *b) {
    /* training-size products (a 320-wide model with 1280-wide MLP) */
    static const int shapes[][3] = {{1024, 1280, 320}, {1024, 320, 1280}, {1024, 640, 320}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int kind = 0; kind < 3; kind++)
            bench_paths(g, kind, shapes[i][0], shapes[i][1], shapes[i][2], 0, b);
    /* the forward products again with bf16 weights (the f32 nt lines above
     * are the comparison) */
    for (size_t i = 0; i < 2; i++)
        bench_paths(g, NT_BF16, shapes[i][0], shapes[i][1], shapes[i][2], 0, b);
    /* ... and with fp16 and int8 weights (prefill) */
    for (size_t i = 0; i < 2; i++) {
        bench_paths(g, NT_F16, shapes[i][0], shapes[i][1], shapes[i][2], 0, b);
        bench_paths(g, NT_Q8, shapes[i][0], shapes[i][1], shapes[i][2], 0, b);
        bench_paths(g, NT_A8, shapes[i][0], shapes[i][1], shapes[i][2], 0, b);
    }
    /* the mixed-precision backward products at the same shapes (the f32 nn
     * and tn lines above are the comparison) */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int kind = NN_BF16; kind <= TN_B16; kind++)
            bench_paths(g, kind, shapes[i][0], shapes[i][1], shapes[i][2], 0, b);
    /* lm_head forward (f32 and bf16 weights), and its input gradient (dX = dY·W) */
    bench_paths(g, NT, 1024, 129280, 320, 0, b);
    bench_paths(g, NT_BF16, 1024, 129280, 320, 0, b);
    bench_shape(g, NN, 1024, 320, 129280, WHALE_GEMM_AUTO, 0, b);
    /* the training step's lm_head backward on a chunk of 256 rows: dX and
     * dW from the fp32 logit gradient (rounded per product) or from its
     * bf16 rounding made once (what nw_train_step does) */
    for (int kind = NN_BF16; kind <= TN_B16; kind++) {
        if (kind == NN_F16 || kind == TN_F16) continue;
        const int nn = kind == NN_BF16 || kind == NN_B16;
        bench_shape(g, kind, nn ? 256 : 129280, 320, nn ? 129280 : 256, WHALE_GEMM_AUTO, 0, b);
    }

    /* decode: one token (or a few) through the lm_head and a Linear */
    bench_paths(g, NT, 1, 129280, 320, 0, b);
    bench_paths(g, NT_BF16, 1, 129280, 320, 0, b);
    bench_paths(g, NT, 4, 129280, 320, 0, b);
    bench_paths(g, NT_BF16, 4, 129280, 320, 0, b);
    for (int cold = 0; cold < 2; cold++) bench_paths(g, NT_BF16, 1, 1280, 320, cold, b);
    /* fp16 and int8 weights: the lm_head and a Linear at decode, a prefill
     * chunk through a Linear */
    static const int narrow[] = {NT_F16, NT_Q8, NT_A8};
    for (int i = 0; i < 3; i++) {
        const int kind = narrow[i];
        bench_paths(g, kind, 1, 129280, 320, 0, b);
        bench_paths(g, kind, 4, 129280, 320, 0, b);
        bench_paths(g, kind, 16, 129280, 320, 0, b);
        for (int cold = 0; cold < 2; cold++) bench_paths(g, kind, 1, 640, 320, cold, b);
        bench_paths(g, kind, 256, 640, 320, 0, b);
    }
    static const int dec[][3] = {{1, 1280, 320}, {1, 320, 1280}, {4, 1280, 320}, {16, 1280, 320}};
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++)
        for (int cold = 0; cold < 2; cold++)
            bench_paths(g, NT, dec[i][0], dec[i][1], dec[i][2], cold, b);
    /* decode attention for one head: scores q·K^T over 1024 keys, then P·V */
    bench_paths(g, NT, 1, 1024, 64, 0, b);
    bench_paths(g, NN, 1, 64, 1024, 0, b);

    bench_moe_all(b);
}

/* Every path over small and medium M (how the shape rules were chosen). */
static void bench_sweep(whale_gemm *g, bufs *b) {
    static const int ms[] = {1,  2,  3,  4,  5,   6,   8,   12,  16, 24,
                             32, 48, 64, 96, 128, 192, 256, 384, 512};
    static const int nk[][2] = {{1280, 320}, {320, 1280}, {640, 320}};
    for (size_t s = 0; s < sizeof nk / sizeof nk[0]; s++)
        for (int kind = 0; kind < 3; kind++)
            for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
                bench_paths(g, kind, ms[i], nk[s][0], nk[s][1], 0, b);
                if (kind == NT && ms[i] <= 32)
                    bench_paths(g, kind, ms[i], nk[s][0], nk[s][1], 1, b);
            }
    for (size_t i = 0; i < sizeof ms / sizeof ms[0] && ms[i] <= 32; i++)
        bench_paths(g, NT, ms[i], 129280, 320, 0, b);
}

static void bench_sweep_bf16(whale_gemm *g, bufs *b) {
    /* the bf16 products from a few rows to a training batch: where exact
     * primitives stop paying against the runtime one depends on the
     * tier (AVX512_BF16 brgemm, AMX tiles) */
    static const int nk[][2] = {{1280, 320}, {320, 1280}, {640, 320}};
    static const int mb[] = {17, 32, 64, 128, 256, 512, 1024, 2048};
    static const int bkinds[] = {NT_BF16, NN_B16, TN_B16};
    for (size_t s = 0; s < sizeof nk / sizeof nk[0]; s++)
        for (size_t k = 0; k < sizeof bkinds / sizeof bkinds[0]; k++)
            for (size_t i = 0; i < sizeof mb / sizeof mb[0]; i++)
                bench_paths(g, bkinds[k], mb[i], nk[s][0], nk[s][1], 0, b);
}

/* Per-dtype ceilings as the library measures them. */
static void bench_ceilings(whale_gemm *g) {
    static const whale_dtype dts[] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
    static const int ceil_shapes[][3] = {{1024, 1280, 320}, {1, 129280, 320}};
    for (size_t s = 0; s < 2; s++)
        for (size_t i = 0; i < 4; i++) {
            const int M = ceil_shapes[s][0], N = ceil_shapes[s][1], K = ceil_shapes[s][2];
            printf("{\"ceiling\":\"%s\",\"M\":%d,\"N\":%d,\"K\":%d,\"gflops\":%.1f}\n",
                   whale_dtype_name(dts[i]), M, N, K,
                   whale_gemm_measure_gflops_dtype(g, dts[i], M, N, K, 5));
            fflush(stdout);
        }
}

int main(int argc, char **argv) {
    /* --sweep: everything, then every path over many shapes; --sweep-bf16:
     * the bf16 part of the sweep alone */
    const int sweep = argc > 1 && !strcmp(argv[1], "--sweep");
    const int bf16_only = argc > 1 && !strcmp(argv[1], "--sweep-bf16");
    const int moe_only = argc > 1 && !strcmp(argv[1], "--moe"); /* the expert pattern alone */
    const int shape = argc > 1 && !strcmp(argv[1], "--shape");
    if (argc > 1 && !sweep && !bf16_only && !moe_only && !shape) {
        fprintf(stderr, "usage: bench_gemm [--sweep | --sweep-bf16 | --moe | --shape KIND M N K [cold]]\n"
                        "(the top of bench/bench_gemm.c says what each measures)\n");
        return strcmp(argv[1], "--help") && strcmp(argv[1], "-h") ? 2 : 0;
    }
    int kind = -1, sM = 0, sN = 0, sK = 0;
    if (shape) {
        for (int k = 0; argc > 2 && k < (int)(sizeof kinds / sizeof *kinds); k++)
            if (!strcmp(argv[2], kinds[k])) kind = k;
        if (argc < 6 || kind < 0 || (sM = atoi(argv[3])) < 1 || (sN = atoi(argv[4])) < 1 || (sK = atoi(argv[5])) < 1 ||
            (size_t)sN * sK > B_FLOATS || (size_t)sM * (sK > sN ? sK : sN) > (size_t)1024 * 129280 ||
            (sK < 64 && (kind == NT_Q8 || kind == NT_A8))) {
            fprintf(stderr, "bench_gemm: --shape KIND M N K [cold]: a kind of this file's list, B at most %zu values, "
                            "A and C at most 1024 x 129280\n", (size_t)B_FLOATS);
            return 1;
        }
    }
    whale_err err;
    whale_gemm *g;
    if (whale_gemm_new(&g, &err)) {
        fprintf(stderr, "bench_gemm: %s\n", err.msg);
        return 1;
    }
    /* big enough for every shape below (lm_head: 1024 x 129280 outputs) */
    bufs b = {0};
    const size_t llc = whale_cpu_llc_bytes(), cold = 2 * llc;
    cap_f32 = cold / 4 > B_FLOATS ? cold / 4 / 320 * 320 : B_FLOATS;
    cap_16 = cold / 2 > B_FLOATS ? cold / 2 / 320 * 320 : B_FLOATS;
    cap_8 = cold > B_FLOATS ? cold / 320 * 320 : B_FLOATS;
    b.A = filled((size_t)1024 * 129280, 1);
    b.B = filled(cap_f32, 2);
    b.C = filled((size_t)1024 * 129280, 3);
    b.A16 = whale_alloc((size_t)1024 * 129280 * sizeof(uint16_t));
    b.B16 = whale_alloc(cap_16 * sizeof(uint16_t));
    b.F16 = whale_alloc(cap_16 * sizeof(uint16_t));
    b.B8 = whale_alloc(cap_8);
    b.scale = whale_alloc(cap_8 / 64 * sizeof(float));
    if (!b.A || !b.A16 || !b.B || !b.C || !b.B16 || !b.F16 || !b.B8 || !b.scale) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        return 1;
    }
    whale_f32_to_bf16_rows(b.A16, b.A, (size_t)1024 * 129280);
    for (size_t i = 0; i < cap_16; i += cap_f32) { /* the narrow copies repeat B's values */
        const size_t n = cap_16 - i < cap_f32 ? cap_16 - i : cap_f32;
        whale_f32_to_bf16_rows(b.B16 + i, b.B, n);
        whale_f32_to_f16_rows(b.F16 + i, b.B, n);
    }
    memset(b.scale, 0, cap_8 / 64 * sizeof(float));
    for (size_t i = 0; i < cap_8; i += cap_f32) {
        const size_t n = cap_8 - i < cap_f32 ? cap_8 - i : cap_f32;
        whale_quantize_q8_rows(b.B8 + i, b.scale + i / 320, b.B, (int)(n / 320), 320);
    }
    printf("{\"threads\":%d,\"cpu\":\"%s\",\"isa\":\"%s\",\"isa_detected\":\"%s\",\"extras\":\"%s\","
           "\"region_us\":%.2f,\"move_64k_us\":%.2f}\n",
           omp_get_max_threads(), whale_cpu_model(), whale_isa_name(whale_isa_active()),
           whale_isa_name(whale_isa_detected()), whale_cpu_extras(), whale_par_sync_us(), whale_par_move_us(65536));

    const size_t probe = cold > ((size_t)256 << 20) ? cold : (size_t)256 << 20;
    double bw = whale_measure_read_bandwidth(probe, 5);
    printf("{\"read_bandwidth_gbs\":%.1f,\"bytes\":%zu,\"llc_mb\":%zu}\n", bw, probe, llc >> 20);

    if (shape) bench_paths(g, kind, sM, sN, sK, argc > 6 && !strcmp(argv[6], "cold"), &b);
    else if (moe_only) bench_moe_all(&b);
    else if (!bf16_only) bench_standard(g, &b);
    if (sweep) bench_sweep(g, &b);
    if (sweep || bf16_only) bench_sweep_bf16(g, &b);
    if (!bf16_only && !moe_only && !shape) bench_ceilings(g);

    whale_gemm_free(g);
    free(b.A);
    free(b.A16);
    free(b.B);
    free(b.C);
    free(b.B16);
    free(b.F16);
    free(b.B8);
    free(b.scale);
    free(b.P8);
    return 0;
}
