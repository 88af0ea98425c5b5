/* Loops and regions that run on the OpenMP team only when they are worth it.
 *
 * `#pragma omp parallel if (0)` is not free: libgomp still builds a team of
 * one for the region and frees it afterwards (a malloc, a free and a futex
 * call), about 1.3 µs a region on a 2-core virtual machine, against nothing
 * for a plain loop. Decoding one token of nanowhale-100m runs some 550
 * regions too small to share (norms, rope, the hyper-connection ops, the
 * quantisation of each product's input), so that cost was 40 % of a step.
 * These macros test the condition themselves and run a small loop inline;
 * likewise when there is one thread to run on, or when they are reached
 * inside a parallel region (nested regions are inactive: a team of one).
 *
 * WHALE_FOR_IF(cond, (init; test; step), { body });
 *     for (init; test; step) body, split statically over the team when
 *     cond holds and there is more than one thread, else on the calling
 *     thread. The body must not depend on the thread running it (it may not
 *     call omp_get_thread_num).
 * WHALE_PARALLEL_IF(cond, t, nt, { body });
 *     body once per thread of a team under the same test, with t the
 *     thread's index and nt the team's size (const int); else once here
 *     with t = 0 and nt = 1 (even inside an enclosing parallel region).
 * Neither body may hold a preprocessor directive (they are macro
 * arguments). */
#ifndef WHALE_CORE_PAR_H
#define WHALE_CORE_PAR_H

#include "whale_bench.h"

#include <omp.h>

/* Whether a region would have more than one thread. */
#define WHALE_PAR_WORTH(cond) ((cond) && omp_get_max_threads() > 1 && !omp_in_parallel())

#define WHALE_FOR_IF(cond, header, ...)                                                                        \
    do {                                                                                                       \
        if (WHALE_PAR_WORTH(cond)) {                                                                           \
            _Pragma("omp parallel for schedule(static)") for header __VA_ARGS__                               \
        } else {                                                                                               \
            for header __VA_ARGS__                                                                             \
        }                                                                                                      \
    } while (0)

#define WHALE_PARALLEL_IF(cond, t, nt, ...)                                                                    \
    do {                                                                                                       \
        if (WHALE_PAR_WORTH(cond)) {                                                                           \
            _Pragma("omp parallel") {                                                                          \
                const int t = omp_get_thread_num(), nt = omp_get_num_threads();                                \
                (void)t, (void)nt;                                                                             \
                __VA_ARGS__                                                                                    \
            }                                                                                                  \
        } else {                                                                                               \
            const int t = 0, nt = 1;                                                                           \
            (void)t, (void)nt;                                                                                 \
            __VA_ARGS__                                                                                        \
        }                                                                                                      \
    } while (0)

/* whale_par_sync_us() (whale_bench.h): microseconds a parallel region of
 * the current team size costs, one barrier inside included (fork,
 * barrier, join), measured the first time it is asked for each team size
 * (some 100 regions, well under a millisecond), then remembered. On bare
 * metal it is about a microsecond; under a hypervisor whose system calls
 * are dear (libgomp wakes its team with futex calls even when they spin)
 * it was 5 on a 2-core virtual machine. Kernels weigh it against their
 * work to decide whether to split it (gemm_a8.c, gemm_rows.c, the decode
 * attention of ops.c). WHALE_PAR_US (microseconds, > 0) fixes it instead,
 * for splits that do not change from run to run, and WHALE_PAR_MOVE_US
 * (microseconds for 64 KiB, >= 0) what handing data between cores costs
 * (whale_par_move_us). Thread-safe. */

/* One core streams about this many bytes of weights a microsecond from
 * memory: the kernels' estimate of a memory-bound run's time. */
#define WHALE_CORE_BYTES_PER_US 28000.0

/* whale_par_move_us() (whale_bench.h): a split hands its input to the
 * other cores and their outputs back. On a 2-core virtual machine
 * nanowhale-100m's 8 x 24 x 1280 fp32 hyper-connection product (40 KB of
 * input) was twice as slow split (11 us against 5.4), and the serial op
 * that next wrote its input four times as slow (8.5 us against 1.9). */

/* Whether work that one thread would do in one_thread_us microseconds is
 * worth splitting over the team: it takes at least twice what `regions`
 * regions cost (whale_par_sync_us; a barrier counts about half a region)
 * and handing moved_bytes between the cores (whale_par_move_us). 0 with
 * one thread or inside a region. */
int whale_par_worth(double one_thread_us, double regions, double moved_bytes);

#endif
