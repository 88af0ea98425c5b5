/* Matrix products (f32, and f32 x bf16 weights) for the whole engine.
 *
 * Everything is row-major with leading dimensions (strides in elements), so
 * sub-blocks of larger buffers can be passed directly. Weights are stored
 * PyTorch-style as W[out, in]; activations as X[tokens, features].
 *
 * Large products go through oneDNN matmul primitives cached in the
 * whale_gemm object; products with few rows (decode) use our own AVX-512
 * kernels, which stream the weights at close to memory bandwidth where
 * oneDNN reaches a third of it. How a product is computed depends only on
 * its shape, never on call history, so with a given thread count the same
 * call always gives bit-identical results.
 */
#ifndef WHALE_KERNELS_GEMM_H
#define WHALE_KERNELS_GEMM_H

#include "whale.h"

#include <stddef.h>
#include <stdint.h>

/* oneDNN engine + stream + primitive cache; one per session, not
 * thread-shared (calls on one object must not overlap). */
typedef struct whale_gemm whale_gemm;

whale_code whale_gemm_new(whale_gemm **out, whale_err *err);
void whale_gemm_free(whale_gemm *g);

/* accumulate=0: C = product; accumulate=1: C += product.
 * M, N or K may be 0 (K=0: C = 0, or C unchanged with accumulate). */

/* C[M,N] = A[M,K] · W[N,K]^T   (forward of a Linear; attention scores Q·K^T) */
whale_code whale_gemm_nt(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *W, int ldw, float *C, int ldc, int accumulate,
                         whale_err *err);
/* C[M,N] = A[M,K] · B[K,N]     (input gradient dX = dY·W; attention P·V) */
whale_code whale_gemm_nn(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, int accumulate,
                         whale_err *err);
/* C[M,N] = A[K,M]^T · B[K,N]   (weight gradient dW = dY^T·X) */
whale_code whale_gemm_tn(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, int accumulate,
                         whale_err *err);

/* C[M,N] = A[M,K] · W[N,K]^T with W in bf16 (uint16_t bit patterns, row
 * stride ldw elements); A and C fp32; accumulate as above. A is first rounded
 * to bf16 (round to nearest even), then the bf16 products are summed in fp32:
 * what PyTorch's bf16 autocast Linear computes, up to summation order. Each
 * product of two bf16 values is exact in fp32, so the result differs from an
 * exact sum of the rounded operands by at most the fp32 summation error,
 * ~K·2^-24·sum|a·w|. The AVX512_BF16 instructions (our kernel, oneDNN) treat
 * subnormal inputs and results as zero; the plain C fallback (builds without
 * AVX512_BF16) does not, so the two may differ there. A NaN in a row of A or
 * W gives NaN in its row/column of C.
 * Routing as for whale_gemm_nt: our vdpbf16ps kernel up to
 * WHALE_GEMM_OWN_MAX_M_NT rows, oneDNN bf16 matmul (src bf16, weights bf16,
 * dst f32: "brg:avx512_core_bf16") above, with A rounded into a scratch
 * buffer of the whale_gemm that grows to the largest M·K seen and is kept
 * until whale_gemm_free. */
whale_code whale_gemm_nt_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const uint16_t *W, int ldw, float *C, int ldc, int accumulate,
                              whale_err *err);

/* dst[i] = src[i] rounded to bf16 (nearest even), NaN stays a (quiet) NaN,
 * subnormals are rounded like everything else; bit-identical to
 * whale_float_to_bf16 (kernels/convert.h), vectorised. For converting
 * weights to bf16. */
void whale_f32_to_bf16_rows(uint16_t *dst, const float *src, size_t n);

/* Best GFLOP/s of whale_gemm_nt over reps repetitions at the given shape
 * (own buffers; one untimed warm-up call). Returns 0 on failure. */
double whale_gemm_measure_gflops(whale_gemm *g, int M, int N, int K, int reps);
/* The same for whale_gemm_nt_bf16 (weights converted from the same values). */
double whale_gemm_measure_gflops_bf16(whale_gemm *g, int M, int N, int K, int reps);
/* Streaming read bandwidth in GB/s over a buffer of `bytes`, read by the
 * current OpenMP threads; best of reps. Returns 0 on failure. */
double whale_measure_read_bandwidth(size_t bytes, int reps);

/* ---- introspection and tuning (benchmarks and tests) ---- */

/* Which implementation handles a call. AUTO is the normal shape-based
 * choice; the others force one path, to compare or test them. */
typedef enum {
    WHALE_GEMM_AUTO = 0,
    WHALE_GEMM_OWN,        /* our kernels (any M; fast only for few rows) */
    WHALE_GEMM_DNNL_EXACT, /* oneDNN primitive specialised to the exact shape */
    WHALE_GEMM_DNNL_RUNTIME, /* oneDNN primitive with runtime sizes and strides */
    WHALE_GEMM_OWN_PORTABLE  /* bf16: our plain C kernel, as in builds without
                                AVX512_BF16; other products: same as OWN */
} whale_gemm_path;
void whale_gemm_set_path(whale_gemm *g, whale_gemm_path path);

/* Implementation name used by the last successful call: a oneDNN impl
 * string such as "brg:avx512_core" / "gemm:jit", or "whale:..." for ours. */
const char *whale_gemm_last_impl(const whale_gemm *g);

typedef struct {
    int64_t calls;        /* products computed through oneDNN */
    int64_t hits;         /* ... of which found their primitive in the cache */
    int64_t created;      /* oneDNN primitives created */
    int64_t evicted;      /* ... and dropped again because the cache was full */
    int64_t own_calls;    /* products computed by our kernels */
    int cached;           /* primitives currently held */
} whale_gemm_stats;
void whale_gemm_get_stats(const whale_gemm *g, whale_gemm_stats *st);

/* Shape rules for WHALE_GEMM_AUTO, from bench/bench_gemm.c and the numbers
 * measured on the 2-core Zen 4 machine (2 threads):
 *  - nt with M <= WHALE_GEMM_OWN_MAX_M_NT rows: our kernel. With weights
 *    coming from DRAM (decode: the model is far larger than L3) it beats
 *    oneDNN by 1.3-3x up to ~24 rows; only with weights already in cache
 *    is oneDNN ahead (by up to ~30% for 2..16 rows).
 *  - nn/tn with M <= WHALE_GEMM_OWN_MAX_M_NN rows: our kernel (5-30% faster
 *    than oneDNN there, about even beyond).
 *  - nt with M < WHALE_GEMM_EXACT_BELOW_M_NT rows: a oneDNN primitive for
 *    the exact shape ("brg:avx512_core", 10-75% faster than the runtime
 *    primitive at 16..192 rows).
 *  - everything else: one oneDNN primitive per (kind, accumulate) with all
 *    sizes and strides given at run time ("gemm:jit"; within ~5% of the
 *    exact ones, sometimes faster), so shapes that change every call, such
 *    as tokens per expert in a mixture of experts, create nothing new. */
#define WHALE_GEMM_OWN_MAX_M_NT 16
#define WHALE_GEMM_OWN_MAX_M_NN 4
#define WHALE_GEMM_EXACT_BELOW_M_NT 256
/* Primitives kept per whale_gemm; the least recently used one is dropped
 * when a new shape needs room. Exact shapes whose N or K change every call
 * (attention over a growing context) each create a primitive once: ~0.1-0.3
 * ms, ~3 us when oneDNN's own process-wide cache (1024 entries) still holds
 * it. */
#define WHALE_GEMM_CACHE_CAP 128
/* bf16 nt (whale_gemm_nt_bf16), same rules and measured the same way:
 * our vdpbf16ps kernel up to WHALE_GEMM_OWN_MAX_M_NT rows (lm_head decode,
 * 1x129280x320: 2.5-2.7 ms, ~30-33 GB/s of bf16 weights, half the time of
 * f32; oneDNN 5-7 ms); exact "brg:avx512_core_bf16" primitives below this
 * many rows (380-390 GFLOP/s at 100-300 rows, runtime "gemm:jit" 305-375);
 * one runtime-size primitive above, which oneDNN 2.6 also offers for bf16
 * ("gemm:jit", 390-440 GFLOP/s at 1024 rows, vs 340-420 for brgemm; f32:
 * 170-215). */
#define WHALE_GEMM_BF16_EXACT_BELOW_M_NT 256

#endif
