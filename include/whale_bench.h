/* whale_bench.h — the machine's ceilings, measured the way whale bench puts
 * them beside its speeds. */
#ifndef WHALE_BENCH_H
#define WHALE_BENCH_H

#include "whale.h"

#include <stddef.h>

/* Best GFLOP/s over reps of the product [M,K] x [N,K]^T with weights of
 * type w (fp32, bf16, fp16 or int8), on buffers of its own after one
 * untimed call; 0 with err set when it cannot run. */
double whale_measure_gemm_gflops(whale_dtype w, int M, int N, int K, int reps, whale_err *err);
/* The ceiling of a model's products with weights of type w: best GFLOP/s
 * over reps of the product kind its layers run, on operands already in
 * that kind's format (bf16 and int8: oneDNN's bf16 product on bf16 A and
 * W, as int8 products convert W to bf16 first; fp32 and fp16: the fp32
 * product), [M,K] x [N,K]^T; 0 with err set when it cannot run. */
double whale_measure_gemm_ceiling(whale_dtype w, int M, int N, int K, int reps, whale_err *err);
/* Streaming read bandwidth in GB/s over a buffer of `bytes`, read by the
 * current OpenMP threads, each walking four distant parts of its share side
 * by side (the decode kernels' pattern); best of reps. Returns 0 on
 * failure. */
double whale_measure_read_bandwidth(size_t bytes, int reps);
/* Microseconds a parallel region with one barrier costs at the current
 * thread count, as the kernels measured it (once per thread count) or
 * WHALE_PAR_US gave it: what they weigh their work against before they
 * split it over the threads. 0 with one thread or inside a region. */
double whale_par_sync_us(void);
/* Microseconds the kernels count for handing `bytes` between the calling
 * thread's core and another's: as many as streaming them from memory
 * takes one core (2.34 for 64 KiB), or as WHALE_PAR_MOVE_US gives it for
 * 64 KiB; 0 when whale_par_sync_us is. They add it for a split's inputs
 * and outputs to what the split costs. */
double whale_par_move_us(double bytes);
/* WHALE_ERR_ARG when WHALE_PAR_US is set to anything but a number of
 * microseconds in (0, 1e6) (the kernels would otherwise measure), or
 * WHALE_PAR_MOVE_US to anything but one in [0, 1e6). */
whale_code whale_par_init(whale_err *err);

#endif
