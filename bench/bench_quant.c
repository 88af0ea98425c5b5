/* Weight error of int8 quantisation schemes on a model's product weights:
 * one symmetric scale per output row (what the engine uses, via
 * whale_quantize_q8_rows) against one scale per block of 32 values along
 * the row (Q8_0-style). Prints the relative RMS error of each over every
 * 2-D weight except the gate and the hyper-connection matrices.
 *
 *   bench_quant MODEL_DIR
 */
#include "whale.h"
#include "kernels/gemm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Σ (dequantised − w)² over n values quantised with the engine's rule in
 * groups of `group` values (the whole row when group = n). */
static double sq_error(const float *w, int n, int group, int8_t *q, float *scale) {
    double se = 0;
    for (int g0 = 0; g0 < n; g0 += group) {
        int len = n - g0 < group ? n - g0 : group;
        whale_quantize_q8_rows(q, scale, w + g0, 1, len);
        for (int i = 0; i < len; i++) {
            double d = (double)q[i] * scale[0] - w[g0 + i];
            se += d * d;
        }
    }
    return se;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: bench_quant MODEL_DIR\n");
        return 2;
    }
    whale_err err;
    whale_model *m;
    if (whale_model_load(argv[1], &m, &err)) {
        fprintf(stderr, "bench_quant: %s\n", err.msg);
        return 1;
    }
    double se_row = 0, se_blk = 0, ss = 0;
    int64_t values = 0;
    for (int i = 0; i < whale_model_num_params(m); i++) {
        whale_tensor t = whale_model_param(m, i);
        const char *name = whale_model_param_name(m, i);
        if (t.ndim != 2 || t.dtype != WHALE_F32 || strstr(name, "ffn.gate.") || strstr(name, "hc_")) continue;
        int rows = (int)t.shape[0], cols = (int)t.shape[1];
        int8_t *q = malloc((size_t)cols);
        float scale;
        for (int r = 0; r < rows; r++) {
            const float *w = (const float *)t.data + (size_t)r * cols;
            se_row += sq_error(w, cols, cols, q, &scale);
            se_blk += sq_error(w, cols, 32, q, &scale);
            for (int k = 0; k < cols; k++) ss += (double)w[k] * w[k];
        }
        values += (int64_t)rows * cols;
        free(q);
    }
    printf("{\"model\": \"%s\", \"values\": %lld, \"rel_rms_error_per_row\": %.6f, \"rel_rms_error_blocks_of_32\": %.6f}\n",
           argv[1], (long long)values, sqrt(se_row / ss), sqrt(se_blk / ss));
    whale_model_free(m);
    return 0;
}
