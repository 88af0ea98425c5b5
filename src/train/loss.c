/* Mean shifted cross-entropy (the model's own loss): logits[:, :-1] against
 * ids[:, 1:], targets equal to -100 ignored. Accumulated in double. */
#include "whale.h"

#include <math.h>

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
