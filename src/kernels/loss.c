/* Mean shifted cross-entropy (the model's own loss): logits[:, :-1] against
 * ids[:, 1:], targets equal to -100 ignored. Accumulated in double. Below it,
 * the training variants that also produce the gradient (kernels/loss.h). */
#include "kernels/loss.h"

#include "core/cpu.h"
#include "core/par.h"
#include "kernels/convert.h"
#include "kernels/vmath.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if WHALE_X86
#include <immintrin.h>
#endif

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

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* The vector loop of scale_narrow_bf16 (every element, the last vector
 * masked): the bytes of dst as d. */
static void scale_narrow_bf16_avx512(char *d, const float *src, float a, long n) {
    long i = 0;
    const __m512 va = _mm512_set1_ps(a);
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), va));
        const __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
        _mm512_mask_cvtepi32_storeu_epi16(d + 2 * i, m, r);
    }
}
WHALE_TARGET_END
#endif

/* dst (bf16 bit patterns over the first 2n bytes of the fp32 row at dst) =
 * src[0, n) · a rounded to bf16 (nearest even, as whale_f32_to_bf16_rows),
 * with g subtracted at index y (none when y < 0) before the rounding: the
 * fp32 gradient's scaling pass (k_scale, then −g at the target) and its
 * rounding in one pass. src may be dst: value i lands on bytes [2i, 2i+2),
 * which belong to elements already read; the vector loop reads each group
 * of 16 before writing it, and the scalar one goes through memcpy, which
 * keeps the reuse of the row's bytes for another type well defined. */
static void scale_narrow_bf16(float *dst, const float *src, float a, long y, float g, long n) {
    char *d = (char *)dst;
    float sy = y >= 0 ? src[y] : 0.0f; /* src[y] may be overwritten below */
    long i = 0;
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) {
        scale_narrow_bf16_avx512(d, src, a, n);
        i = n;
    }
#endif
    for (; i < n; i++) {
        uint16_t h = whale_float_to_bf16(src[i] * a);
        memcpy(d + 2 * i, &h, sizeof h);
    }
    if (y >= 0) { /* as the fp32 path: the product rounded, then g subtracted */
        k_scale(&sy, a, 1);
        uint16_t h = whale_float_to_bf16(sy - g);
        memcpy(d + 2 * y, &h, sizeof h);
    }
}

void whale_narrow_rows_bf16(float *x, long rows, long V) {
    WHALE_FOR_IF(rows * V >= (1 << 16), (long r = 0; r < rows; r++), {
        scale_narrow_bf16(x + r * V, x + r * V, 1.0f, -1, 0.0f, V);
    });
}

/* Loss of every scored row, summed per thread over a contiguous slice of
 * rows and the thread sums added in thread order (fixed for a given thread
 * count). With dl, also writes the gradient in place:
 * grad_scale·(softmax − onehot), grad_scale = 1/count when NULL.
 * A row takes three passes: its max (read from memory), exp and sum into
 * dl (the row, 0.5 MB at V = 129,280, then stays in L2), and the scaling.
 * With narrow (bf16), the exps go to a scratch row and the scaling pass
 * writes the gradient rounded to bf16 (scale_narrow_bf16).
 * The sum is fp32 per lane within 256-element blocks and double across them
 * (kernels/vmath.h: relative error ≤ 9e-7 + 1 ulp of exp), and log-sum-exp
 * is taken in double from it, so a row's loss is off by ≤ ~1e-6 absolute. */
static double ce_common(float *dl, int narrow, const float *logits, const int32_t *t, int shifted, int B, int S,
                        int V, const double *grad_scale, int64_t *count) {
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
        /* bf16: the exps go to a scratch row (in L2) rather than into the
         * row, whose second half then is never written (nor written back) */
        float *ex = narrow && dl ? malloc(sizeof(float) * (size_t)V) : NULL;
        for (long r = r0; r < r1; r++) {
            const float *row = logits + r * (long)V;
            float *drow = dl ? dl + r * (long)V : NULL;
            int32_t y = row_target(t, shifted, r, S, V);
            if (y < 0) {
                if (drow) memset(drow, 0, sizeof(float) * (size_t)(narrow ? (V + 1) / 2 : V));
                continue;
            }
            float mx = k_max(row, V), ly = row[y]; /* read before drow may overwrite it */
            float *e = ex ? ex : drow;
            double sum = k_exp_sum(e, row, mx, 1.0f, V);
            if (drow && narrow) {
                scale_narrow_bf16(drow, e, (float)(g / sum), y, (float)g, V);
            } else if (drow) {
                k_scale(drow, (float)(g / sum), V);
                drow[y] -= (float)g;
            }
            part += log(sum) + mx - ly;
        }
        free(ex);
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
    return ce_common(dlogits, 0, logits, ids, 1, B, S, V, NULL, count);
}

double whale_cross_entropy_backward_scaled(float *dlogits, const float *logits, const int32_t *ids, int B, int S,
                                           int V, double grad_scale, int64_t *count) {
    return ce_common(dlogits, 0, logits, ids, 1, B, S, V, &grad_scale, count);
}

double whale_cross_entropy_labels(const float *logits, const int32_t *labels, int B, int S, int V, int64_t *count) {
    return ce_common(NULL, 0, logits, labels, 0, B, S, V, NULL, count);
}

double whale_cross_entropy_labels_backward(float *dlogits, const float *logits, const int32_t *labels, int B, int S,
                                           int V, int64_t *count) {
    return ce_common(dlogits, 0, logits, labels, 0, B, S, V, NULL, count);
}

double whale_cross_entropy_labels_backward_scaled(float *dlogits, const float *logits, const int32_t *labels, int B,
                                                  int S, int V, double grad_scale, int64_t *count) {
    return ce_common(dlogits, 0, logits, labels, 0, B, S, V, &grad_scale, count);
}

double whale_cross_entropy_labels_backward_bf16(float *dlogits, const float *logits, const int32_t *labels, int B,
                                                int S, int V, double grad_scale, int64_t *count) {
    return ce_common(dlogits, 1, logits, labels, 0, B, S, V, &grad_scale, count);
}
