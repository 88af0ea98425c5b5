/* Cross-entropy losses with their gradients (the lm_head's loss in training). The plain forward
 * loss whale_cross_entropy is declared in whale.h. */
#ifndef WHALE_KERNELS_LOSS_H
#define WHALE_KERNELS_LOSS_H

#include "whale.h"

#include <stdint.h>

/* Loss and gradient of whale_cross_entropy (the mean shifted loss: row (b,s)
 * of logits is scored against ids[b,s+1]; targets of -100 or outside
 * [0, V) and each sequence's last position are not scored).
 * dlogits [B,S,V] is overwritten: (softmax(row) − onehot(target))/count on
 * scored rows, 0 on the others. It may alias logits. Returns the loss (NaN
 * when count is 0, then dlogits is all 0) and the scored count in *count.
 * The loss equals whale_cross_entropy's up to rounding (exps are taken in
 * fp32 here, ≤ 1.02 ulp, and summed per row with relative error ≤ 1e-6; the
 * log-sum-exp is in double), i.e. within ~1e-6 absolute per row.
 * Deterministic for a given thread count. */
double whale_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *ids, int B, int S, int V,
                                    int64_t *count);

/* The same with the gradient scaled by grad_scale instead of 1/count:
 * dlogits = grad_scale·(softmax(row) − onehot(target)) on scored rows, 0 on
 * the others. Lets a caller that splits a batch into chunks apply its own
 * normalisation (e.g. loss_scale/total_count) without another pass over the
 * gradient. The returned loss is still the chunk mean. */
double whale_cross_entropy_backward_scaled(float *dlogits, const float *logits, const int32_t *ids, int B, int S,
                                           int V, double grad_scale, int64_t *count);

/* The same with explicit, already shifted labels: labels[b,s] is the target
 * of row (b,s) itself, -100 (or anything outside [0, V)) for unscored rows.
 * Mean over scored rows. */
double whale_cross_entropy_labels(const float *logits, const int32_t *labels, int B, int S, int V, int64_t *count);
double whale_cross_entropy_labels_backward(float *dlogits, const float *logits, const int32_t *labels, int B, int S,
                                           int V, int64_t *count);
double whale_cross_entropy_labels_backward_scaled(float *dlogits, const float *logits, const int32_t *labels, int B,
                                                  int S, int V, double grad_scale, int64_t *count);

/* whale_cross_entropy_labels_backward_scaled for bf16 backward products:
 * the same loss, and each row's gradient rounded to bf16 (nearest even,
 * bit-identical to whale_float_to_bf16 of the fp32 gradient) stored over
 * the first half of its own row of dlogits: read it afterwards as uint16_t
 * bf16 patterns with row stride 2·V (the first V of each row; the rest is
 * left unspecified). dlogits may alias logits. Rounding as the gradient is
 * made spares the products reading 4-byte values and rounding them each. */
double whale_cross_entropy_labels_backward_bf16(float *dlogits, const float *logits, const int32_t *labels, int B,
                                                int S, int V, double grad_scale, int64_t *count);

/* The same rounding of gradient rows already computed in fp32: x holds rows
 * of V floats (stride V); each becomes V bf16 patterns over its first half,
 * bit for bit what whale_cross_entropy_labels_backward_bf16 writes. */
void whale_narrow_rows_bf16(float *x, long rows, long V);

#endif
