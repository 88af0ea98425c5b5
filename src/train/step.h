/* What pretraining (trainer.c) and fine-tuning (sft.c) runs share: one
 * optimiser step over accumulated micro-batches, and the housekeeping of a
 * run folder (crash-safe checkpoint folders, pruning, progress text). */
#ifndef WHALE_TRAIN_STEP_H
#define WHALE_TRAIN_STEP_H

#include "whale.h"
#include "whale_data.h"

#include <stdio.h>

struct whale_diag;
typedef struct whale_grad_sum whale_grad_sum;

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
 * the same gradients, weights and result: those of one process. */
whale_code whale_train_one_step(whale_session *s, whale_optimizer *opt, whale_loss_scaler *scaler,
                                struct whale_diag *nan, whale_grad_sum *sum, whale_batch *micro, int n, int hf_compat,
                                double max_grad_norm, double lr, int64_t step, whale_step_result *out,
                                whale_err *err);

/* The gradient sum a run over n_micro micro-batches per step needs on this
 * many ranks (NULL for one micro-batch in one process); n_micro must be a
 * multiple of the number of ranks (else WHALE_ERR_ARG saying so). */
whale_code whale_step_sum_new(whale_session *s, int n_micro, whale_grad_sum **out, whale_err *err);
/* With several ranks: every rank must start from the same trainable
 * weights, moments, step and data cursor (else an error naming a rank). */
whale_code whale_step_check_start(whale_session *s, whale_optimizer *opt, const whale_data_cursor *cur, int64_t step,
                                  whale_err *err);

/* With several ranks, the metrics' fields ", \"world_size\": N, …" into f
 * (NULL but on rank 0): each rank's tokens per second of its own compute
 * (rank_tokens over t_train less its time in and waiting for exchanges),
 * rank 0's seconds moving data, waiting for the others, and bytes sent in
 * exchanges. A collective: every rank calls it at the same steps. */
whale_code whale_step_dist_metrics(FILE *f, double rank_tokens, double t_train, whale_err *err);

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
