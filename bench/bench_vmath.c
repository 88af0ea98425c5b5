/* Speed of the vectorised exp (k_exp, and k_exp_sum as softmax uses it)
 * against a libm expf loop, one thread, in place on 132M floats, best of
 * three, at the active instruction tier (cap it with WHALE_ISA to compare
 * tiers on one machine).
 *   build/bench_vmath [ELEMENTS] */
#include "core/core.h"
#include "kernels/vmath.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static void fill(float *x, long n) {
    for (long i = 0; i < n; i++) x[i] = -(float)(i % 4093) * (20.0f / 4093);
}

int main(int argc, char **argv) {
    const long n = argc > 1 ? atol(argv[1]) : 1024L * 129280;
    whale_err err;
    if (n <= 0 || whale_isa_init(&err)) {
        fprintf(stderr, "bench_vmath: %s\n", n <= 0 ? "ELEMENTS must be positive" : err.msg);
        return 2;
    }
    float *x = malloc(sizeof(float) * (size_t)n);
    if (!x) return 7;
    double t_lib = 1e30, t_vec = 1e30, t_sum = 1e30;
    volatile double sink = 0; /* keeps the timed results live */
    for (int rep = 0; rep < 3; rep++) {
        fill(x, n);
        double t0 = whale_now();
        for (long i = 0; i < n; i++) x[i] = expf(x[i]);
        double t1 = whale_now();
        sink += x[n / 2];
        fill(x, n);
        double t2 = whale_now();
        k_exp(x, x, n);
        double t3 = whale_now();
        sink += x[n / 2];
        fill(x, n);
        double t4 = whale_now();
        sink += k_exp_sum(x, x, 0.0f, 1.0f, n);
        double t5 = whale_now();
        t_lib = fmin(t_lib, t1 - t0), t_vec = fmin(t_vec, t3 - t2), t_sum = fmin(t_sum, t5 - t4);
    }
    printf("{\"cpu\": \"%s\", \"isa\": \"%s\", \"elements\": %ld, \"expf_s\": %.4f, \"k_exp_s\": %.4f, "
           "\"k_exp_speedup\": %.2f, \"k_exp_sum_s\": %.4f, \"k_exp_sum_speedup\": %.2f}\n",
           whale_cpu_model(), whale_isa_name(whale_isa_active()), n, t_lib, t_vec, t_lib / t_vec, t_sum,
           t_lib / t_sum);
    free(x);
    return 0;
}
