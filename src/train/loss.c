/* Mean shifted cross-entropy (the model's own loss): logits[:, :-1] against
 * ids[:, 1:], targets equal to -100 ignored. Accumulated in double. Below it,
 * the training variants that also produce the gradient (train/loss.h). */
#include "train/loss.h"

#include "kernels/vmath.h"

#include <math.h>
#include <omp.h>
#include <string.h>

double whale_cross_entropy(const float *logits, const int32_t *ids, int B, int S, int V, int64_t *count) {
    double total = 0;
    int64_t n = 0;
#pragma omp parallel for reduction(+ : total, n) schedule(static)
    for (long r = 0; r < (long)B * S; r++) {
        int s = (int)(r % S);
        if (s == S - 1) continue;
        int32_t target = ids[r + 1];
        if (target == -100 || target < 0 || target >= V) continue;
        const float *row = logits + r * (long)V;
        float mx = -INFINITY;
        for (int v = 0; v < V; v++)
            if (row[v] > mx) mx = row[v];
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        total += log(sum) + mx - row[target];
        n++;
    }
    if (count) *count = n;
    return n ? total / (double)n : NAN;
}

/* ------------------------------------------------------------ training */

/* Target of row r: ids[r+1] in shifted mode (none for a sequence's last
 * position), labels[r] otherwise; -1 when the row is not scored. */
static int32_t row_target(const int32_t *t, int shifted, long r, int S, int V) {
    int32_t y;
    if (shifted) {
        if ((int)(r % S) == S - 1) return -1;
        y = t[r + 1];
    } else {
        y = t[r];
    }
    return y >= 0 && y < V ? y : -1;
}

/* Loss of every scored row, summed per thread over a contiguous slice of
 * rows and the thread sums added in thread order (fixed for a given thread
 * count). With dl, also writes the gradient in place:
 * grad_scale·(softmax − onehot), grad_scale = 1/count when NULL.
 * A row takes three passes: its max (read from memory), exp and sum into
 * dl (the row, 0.5 MB at V = 129,280, then stays in L2), and the scaling.
 * The sum is fp32 per lane within 256-element blocks and double across them
 * (kernels/vmath.h: relative error ≤ 9e-7 + 1 ulp of exp), and log-sum-exp
 * is taken in double from it, so a row's loss is off by ≤ ~1e-6 absolute. */
static double ce_common(float *dl, const float *logits, const int32_t *t, int shifted, int B, int S, int V,
                        const double *grad_scale, int64_t *count) {
    long rows = (long)B * S;
    int64_t n = 0;
    for (long r = 0; r < rows; r++) n += row_target(t, shifted, r, S, V) >= 0;
    if (count) *count = n;
    double g = grad_scale ? *grad_scale : n ? 1.0 / (double)n : 0.0;
    double total = 0;
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        long r0 = rows * id / nt, r1 = rows * (id + 1) / nt;
        double part = 0;
        for (long r = r0; r < r1; r++) {
            const float *row = logits + r * (long)V;
            float *drow = dl ? dl + r * (long)V : NULL;
            int32_t y = row_target(t, shifted, r, S, V);
            if (y < 0) {
                if (drow) memset(drow, 0, sizeof(float) * (size_t)V);
                continue;
            }
            float mx = k_max(row, V), ly = row[y]; /* read before drow may overwrite it */
            double sum = k_exp_sum(drow, row, mx, 1.0f, V);
            if (drow) {
                k_scale(drow, (float)(g / sum), V);
                drow[y] -= (float)g;
            }
            part += log(sum) + mx - ly;
        }
#pragma omp for ordered schedule(static, 1)
        for (int i = 0; i < nt; i++) {
#pragma omp ordered
            total += part;
        }
    }
    return n ? total / (double)n : NAN;
}

double whale_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *ids, int B, int S, int V,
                                    int64_t *count) {
    return ce_common(dlogits, logits, ids, 1, B, S, V, NULL, count);
}

double whale_cross_entropy_backward_scaled(float *dlogits, const float *logits, const int32_t *ids, int B, int S,
                                           int V, double grad_scale, int64_t *count) {
    return ce_common(dlogits, logits, ids, 1, B, S, V, &grad_scale, count);
}

double whale_cross_entropy_labels(const float *logits, const int32_t *labels, int B, int S, int V, int64_t *count) {
    return ce_common(NULL, logits, labels, 0, B, S, V, NULL, count);
}

double whale_cross_entropy_labels_backward(float *dlogits, const float *logits, const int32_t *labels, int B, int S,
                                           int V, int64_t *count) {
    return ce_common(dlogits, logits, labels, 0, B, S, V, NULL, count);
}

double whale_cross_entropy_labels_backward_scaled(float *dlogits, const float *logits, const int32_t *labels, int B,
                                                  int S, int V, double grad_scale, int64_t *count) {
    return ce_common(dlogits, logits, labels, 0, B, S, V, &grad_scale, count);
}
