/* What pretraining (trainer.c) and fine-tuning (sft.c) runs share: one
 * optimiser step over accumulated micro-batches, and the housekeeping of a
 * run folder (crash-safe checkpoint folders, pruning, progress text). */
#ifndef WHALE_TRAIN_STEP_H
#define WHALE_TRAIN_STEP_H

#include "whale.h"
#include "whale_data.h"

#include <stddef.h>

#include <stdio.h>

struct whale_diag;
typedef struct whale_grad_sum whale_grad_sum;
typedef struct whale_zero whale_zero;

typedef struct {
    double loss;      /* mean loss over the step's scored tokens (before scaling) */
    double grad_norm; /* after unscaling, before clipping; NaN for a skipped step */
    int64_t targets;  /* scored tokens */
    int taken;        /* 0: fp16 step skipped by the loss scaler */
} whale_step_result;

/* Gradients of the mean loss over every scored token of micro[0..n) (each
 * micro-batch weighted by its share of the targets, or, with hf_compat, the
 * sum of the micro-batch means), then — unless scaler (fp16, NULL
 * otherwise) skips the step on inf/NaN — clipping to max_grad_norm (0 =
 * none) and AdamW at rate lr. A non-finite loss or gradient is an error
 * naming the first non-finite gradient; with nan (--nan-check) the first
 * non-finite traced tensor. step is the 1-based number for messages.
 * Micro-batches may have different lengths (b->S); those with no scored
 * token are passed over.
 *
 * sum (whale_grad_sum, dist/dist.h) is needed for more than one
 * micro-batch or rank, and NULL otherwise: each micro-batch's gradient is
 * then computed on its own and the gradients are added in micro-batch
 * order, with N ranks each running every N-th micro-batch (n must be a
 * multiple of N). Every rank passes the same n micro-batches and ends with
 * the same gradients, weights and result: those of one process.
 *
 * With zero (--zero 1 on several ranks, whale_zero_new) each rank keeps
 * only its shard of the summed gradient, computes the norm from every
 * rank's partial sums, clips and updates its shard alone (its shard of the
 * moments), then the weights are all-gathered: the weights and result are
 * still those of one process; the gradients outside the shard are not. */
whale_code whale_train_one_step(whale_session *s, whale_optimizer *opt, whale_loss_scaler *scaler,
                                struct whale_diag *nan, whale_grad_sum *sum, whale_zero *zero, whale_batch *micro,
                                int n, int hf_compat, double max_grad_norm, double lr, int64_t step,
                                whale_step_result *out, whale_err *err);

/* The gradient sum a run over n_micro micro-batches per step needs on this
 * many ranks (NULL for one micro-batch in one process); n_micro must be a
 * multiple of the number of ranks (else WHALE_ERR_ARG saying so). */
whale_code whale_step_sum_new(whale_session *s, int n_micro, whale_grad_sum **out, whale_err *err);
/* Send the gradient in buckets of mb MiB during each micro-batch's
 * backward pass (whale_grad_sum_set_buckets; --bucket-mb); 0, no sum or
 * one rank: one exchange after it. */
whale_code whale_step_sum_buckets(whale_grad_sum *sum, double mb, whale_err *err);
/* With several ranks: every rank must start from the same trainable
 * weights, moments (each rank its own shard with --zero 1: not compared),
 * step and data cursor (else an error naming a rank). */
whale_code whale_step_check_start(whale_session *s, whale_optimizer *opt, const whale_data_cursor *cur, int64_t step,
                                  whale_err *err);

/* --zero 1 on several ranks (ZeRO stage 1): the gradient sum whose shards
 * fall on the gradient norm's chunk boundaries (so that the norm, summed
 * from every rank's partial sums in chunk order, has the bits of one
 * process), and opt sharded to this rank's shard of the trainable
 * parameters (whale_optimizer_shard). Made before the moments are loaded
 * from a checkpoint. On one rank, *sum as whale_step_sum_new and no zero. */
whale_code whale_zero_new(whale_session *s, whale_optimizer *opt, int n_micro, whale_grad_sum **sum, whale_zero **out,
                          whale_err *err);
void whale_zero_free(whale_zero *z);
/* In mixed precision (bf16/fp16 products), once every rank checked that
 * it starts from the same weights: give back the fp32 masters of the
 * product weights outside this rank's shard (their pages, made
 * inaccessible). Each step then converts the shard's masters into the
 * compute copies and all-gathers the copies; whale_step_save_model
 * gathers the masters for a checkpoint. Nothing to do in an fp32 run. */
void whale_zero_drop_masters(whale_zero *z, whale_session *s);
/* Bytes of fp32 masters given back (for the memory line). */
size_t whale_zero_dropped_bytes(const whale_zero *z);

/* What a training run holds, as its start line prints it: the model, the
 * session, the optimizer's moments, the gradient sum's buffers, less the
 * masters that --zero 1 gave back; with the world size. */
void whale_step_memory(const whale_model *m, const whale_session *s, const whale_optimizer *opt,
                       const whale_grad_sum *sum, const whale_zero *zero, whale_memory *mm);
/* whale_model_save into dir by rank 0 (dir NULL on the other ranks); with
 * zero every rank must call it, and rank 0 gathers the masters the ranks
 * hold, one tensor at a time. */
whale_code whale_step_save_model(const char *dir, const whale_model *m, whale_grad_sum *sum, const whale_zero *zero,
                                 int64_t step, whale_err *err);

/* The AdamW moments of a checkpoint, optimizer.safetensors: exp_avg.NAME
 * and exp_avg_sq.NAME for every trainable parameter, whatever the number
 * of ranks and sharding. Saving: rank 0 writes path (NULL on the other
 * ranks); with zero every rank must call it, and rank 0 gathers the
 * shards one tensor at a time. Loading: each rank reads its shard's part
 * of every tensor (re-sharding for any number of ranks). */
whale_code whale_step_save_moments(const char *path, const whale_model *m, whale_optimizer *opt, whale_grad_sum *sum,
                                   whale_zero *zero, int64_t step, whale_err *err);
whale_code whale_step_load_moments(const char *path, const whale_model *m, whale_optimizer *opt, whale_err *err);

/* Work dealt out to the ranks: item j of n (k doubles each) was computed
 * by rank j % N and is mine[k·(j / N) …] there. sum[q] = Σ_j item_j[q],
 * added in item order: on every rank, the sum one process makes running
 * every item itself (an evaluation spread over the ranks). */
whale_code whale_step_sum_dealt(const double *mine, int n, int k, double *sum, whale_err *err);

/* With several ranks, the metrics' fields ", \"world_size\": N, …" into f
 * (NULL but on rank 0): each rank's tokens per second of its own compute
 * (rank_tokens over t_train less its time in and waiting for exchanges),
 * rank 0's seconds moving data, waiting for the others, and bytes sent in
 * exchanges. A collective: every rank calls it at the same steps. */
whale_code whale_step_dist_metrics(FILE *f, const whale_grad_sum *sum, double rank_tokens, double t_train,
                                   whale_err *err);

/* ---------------------------------------------------------------- optimizer internals (optim.c) */

/* The gradient norm's chunks: WHALE_GRAD_CHUNK floats of one trainable
 * parameter each (its last one shorter), in parameter order; start in
 * s->grads. Returns their number; start and len (when not NULL) get them. */
#define WHALE_GRAD_CHUNK ((size_t)1 << 16)
size_t whale_grad_chunks(const whale_session *s, size_t *start, size_t *len);
/* part[c] = Σ grads[start[c] + k]² over chunk c, in double, in order. */
void whale_grad_chunk_sums(const float *grads, const size_t *start, const size_t *len, size_t n, double *part);
/* Keep the moments of elements [lo, hi) of the trainable vector only
 * (ZeRO stage 1), before any step: whale_adamw_step then updates those
 * elements alone and leaves the compute copies to the caller (who gathers
 * the weights first); whale_optimizer_moment then gives NULL. */
whale_code whale_optimizer_shard(whale_optimizer *o, size_t lo, size_t hi, whale_err *err);
/* The moments held (which 0: m, 1: v): elements [*lo, *hi) of the
 * trainable vector, all of it unless sharded. */
float *whale_optimizer_held(whale_optimizer *o, int which, size_t *lo, size_t *hi);
/* Where parameter i starts in the trainable vector (SIZE_MAX: frozen). */
size_t whale_optimizer_offset(const whale_optimizer *o, int i);

/* Cut b's rows (B × S, with labels, pos and seg) to the batch's longest
 * trained prefix, in place; b->S becomes that length (at least 2). */
void whale_batch_trim(whale_batch *b);

/* ---------------------------------------------------------------- folders */

int whale_is_dir(const char *path);
void whale_fsync_dir(const char *dir);
/* Remove a directory holding only files (checkpoints are flat). */
void whale_remove_flat_dir(const char *dir);
/* The steps of dir/checkpoint-N folders, ascending (malloc'd; a
 * checkpoint-N.tmp left by an interrupted save is not one). */
int whale_list_checkpoints(const char *dir, int64_t **steps);
/* Keep the newest `limit` checkpoints of dir (limit ≤ 0: keep all). */
void whale_prune_checkpoints(const char *dir, int limit);
/* Publish tmp as dir: fsync tmp, replace dir, fsync parent. */
whale_code whale_publish_dir(const char *tmp, const char *dir, const char *parent, whale_err *err);

/* "12s", "3m05s", "2h10m"; "?" when unknown. */
void whale_fmt_duration(char *buf, size_t cap, double seconds);
/* A number for JSON: non-finite values become null. */
const char *whale_json_double(char *buf, size_t cap, const char *fmt, double v);

#endif
