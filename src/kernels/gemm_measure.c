/* Probes for the benchmarks: the GFLOP/s of a product and the rate at
 * which one thread or all read memory. */
#include "kernels/gemm_impl.h"
#include "whale_bench.h"

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
    uint8_t *W8 = dt == WHALE_I8 ? whale_alloc(whale_q8p_bytes(N, K)) : NULL; /* packed, as the models hold int8 */
    float *scale = dt == WHALE_I8 ? whale_alloc((size_t)N * sizeof(float)) : NULL;
    double best = 0;
    const int have = dt == WHALE_F32 ? 1 : dt == WHALE_I8 ? W8 && scale : W16 != NULL;
    if (A && W && C && have) {
        /* small exact values: no denormals or overflow to skew timing */
        for (size_t i = 0; i < na; i++) A[i] = (float)((int)(i % 17) - 8) * 0.0625f;
        for (size_t i = 0; i < nw; i++) W[i] = (float)((int)(i % 13) - 6) * 0.0625f;
        if (dt == WHALE_BF16) whale_f32_to_bf16_rows(W16, W, nw);
        if (dt == WHALE_F16) whale_f32_to_f16_rows(W16, W, nw);
        if (dt == WHALE_I8) whale_q8p_quantize(W8, scale, W, N, K);
        whale_err err;
        double t_best = 0;
        for (int r = -1; r < reps; r++) { /* r = -1: untimed warm-up */
            double t0 = whale_now();
            whale_code rc;
            switch (dt) {
            case WHALE_BF16: rc = whale_gemm_nt_bf16(g, M, N, K, A, K, W16, K, C, N, 0, &err); break;
            case WHALE_F16: rc = whale_gemm_nt_f16(g, M, N, K, A, K, W16, K, C, N, 0, &err); break;
            case WHALE_I8:
                rc = whale_gemm_nt_a8(g, M, N, K, A, K, W8, 0, scale, C, N, 0, &err);
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

/* Best GFLOP/s of the oneDNN bf16 nt product on A and W already in bf16
 * (the auto path's primitive for M rows); 0 when it cannot run. */
static double measure_bf16_ready(whale_gemm *g, int M, int N, int K, int reps) {
    size_t na, nw, nc;
    if (!whale_mul_size((size_t)M, (size_t)K, &na) || !whale_mul_size((size_t)N, (size_t)K, &nw) ||
        !whale_mul_size((size_t)M, (size_t)N, &nc) || nc > SIZE_MAX / 4)
        return 0;
    uint16_t *A = whale_alloc(na * sizeof(uint16_t)), *W = whale_alloc(nw * sizeof(uint16_t));
    float *C = whale_alloc(nc * sizeof(float));
    double best = 0;
    if (A && W && C) {
        for (size_t i = 0; i < na; i++) A[i] = whale_float_to_bf16((float)((int)(i % 17) - 8) * 0.0625f);
        for (size_t i = 0; i < nw; i++) W[i] = whale_float_to_bf16((float)((int)(i % 13) - 6) * 0.0625f);
        const gemm_call c = {{KIND_NT_BF16, 0, M, N, K, K, K, N}, A, W, C, NULL};
        const int runtime = gemm_bf16_auto(KIND_NT_BF16, M) == WHALE_GEMM_DNNL_RUNTIME;
        whale_err err;
        for (int r = -1; r < reps; r++) { /* r = -1: untimed warm-up */
            const double t0 = whale_now();
            if (gemm_dnnl_run(g, &c, runtime, &err)) {
                best = 0;
                break;
            }
            const double gf = 2.0 * M * N * (double)K / (whale_now() - t0) * 1e-9;
            if (r >= 0 && gf > best) best = gf;
        }
    }
    free(A);
    free(W);
    free(C);
    return best;
}

double whale_measure_gemm_ceiling(whale_dtype w, int M, int N, int K, int reps, whale_err *err) {
    whale_gemm *g;
    if (M <= 0 || N <= 0 || K <= 0 || whale_gemm_new(&g, err)) return 0;
    if (reps < 1) reps = 1;
    /* bf16 and int8 layers run oneDNN bf16 products, when the tier has
     * them; fp16 layers and the rest f32 ones */
    const int bf16 = (w == WHALE_BF16 || w == WHALE_I8) && gemm_dnnl_has_bf16();
    double r = bf16 ? measure_bf16_ready(g, M, N, K, reps) : whale_gemm_measure_gflops_dtype(g, WHALE_F32, M, N, K, reps);
    whale_gemm_free(g);
    if (!r) whale_errf(err, WHALE_ERR_ARG, "cannot measure the %s ceiling at %d x %d x %d", whale_dtype_name(w), M, N, K);
    return r;
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
            if (gemm_have_avx512())
                total += read_pass_avx512(buf, lo, hi);
            else if (gemm_have_avx2())
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

