/* A split pays for the data it hands between cores (core/par.h).
 *
 * With a region priced at 2 us and moves at their default (what one core
 * takes to stream the bytes from memory, 2.34 us for 64 KiB), at two
 * threads:
 *   whale_par_move_us and whale_par_worth follow that arithmetic;
 *   the 8 x 24 x 1280 fp32 product of nanowhale-100m's hyper-connections
 *   (40 KB of input, 8.2 us of work by the kernels' estimate, twice the
 *   region's 2 us) stays on the calling thread: handing its input there
 *   and back costs more than it would save;
 *   the same input against 2,048 weight rows (10 MB) still splits.
 * This program is linked with -Wl,--wrap=GOMP_parallel, so the regions our
 * kernels enter are counted; the products are forced onto our kernels
 * (WHALE_GEMM_OWN), whose split is the one decided here. */
#include "testutil.h"
#include "region_count.h"

#include "core/par.h"
#include "kernels/gemm.h"
#include "whale.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { M = 8, K = 1280, N_SMALL = 24, N_LARGE = 2048 };

static void check_arithmetic(void) {
    const double per_64k = 65536.0 / WHALE_CORE_BYTES_PER_US;
    CHECK(fabs(whale_par_sync_us() - 2.0) < 1e-9, "region %.3f us, want 2 (WHALE_PAR_US)", whale_par_sync_us());
    CHECK(fabs(whale_par_move_us(65536) - per_64k) < 1e-3, "64 KiB move %.4f us, want %.4f", whale_par_move_us(65536),
          per_64k);
    CHECK(whale_par_move_us(0) == 0, "no bytes, %.4f us", whale_par_move_us(0));
    CHECK(fabs(whale_par_move_us(3 * 65536) - 3 * whale_par_move_us(65536)) < 1e-3, "moves grow with the bytes");
    CHECK(whale_par_worth(8, 1, 0), "8 us of work against a 2 us region: split");
    CHECK(!whale_par_worth(8, 1, 65536), "the same with 64 KiB to hand over (2 x (2 + 2.34) > 8): not split");
}

/* Regions one nt product of N weight rows enters, on our kernels. */
static long product_regions(whale_gemm *g, int N, const float *A, const float *W, float *C) {
    whale_err err;
    const long before = regions;
    whale_code e = whale_gemm_nt(g, M, N, K, A, K, W, K, C, N, 0, &err);
    CHECK(!e, "%d x %d x %d: %s", M, N, K, e ? err.msg : "");
    CHECK(!strncmp(whale_gemm_last_impl(g), "whale:", 6), "%d x %d x %d ran %s, not our kernels", M, N, K,
          whale_gemm_last_impl(g));
    return regions - before;
}

int main(void) {
    setenv("WHALE_PAR_US", "2", 1);
    unsetenv("WHALE_PAR_MOVE_US");
    whale_set_threads(2);
    check_arithmetic();
    whale_err err;
    whale_gemm *g = NULL;
    float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * (size_t)N_LARGE * K),
          *C = malloc(sizeof(float) * (size_t)M * N_LARGE);
    if (!A || !W || !C || whale_gemm_new(&g, &err)) {
        fprintf(stderr, "test_par_move: out of memory or no gemm\n");
        return 1;
    }
    for (int i = 0; i < M * K; i++) A[i] = (float)(i % 13) - 6.0f;
    for (size_t i = 0; i < (size_t)N_LARGE * K; i++) W[i] = (float)(i % 7) * 0.01f;
    whale_gemm_set_path(g, WHALE_GEMM_OWN);
    const long small = product_regions(g, N_SMALL, A, W, C), large = product_regions(g, N_LARGE, A, W, C);
    CHECK(small == 0, "%d x %d x %d (40 KB of input) entered %ld regions, want none", M, N_SMALL, K, small);
    CHECK(large >= 1, "%d x %d x %d (10 MB of weights) entered no region", M, N_LARGE, K);
    whale_gemm_free(g);
    free(A), free(W), free(C);
    return test_finish("test_par_move");
}
