/*
 * whale_train.h — training runs: data, optimiser, schedule, evaluation,
 * crash-safe checkpoints, resume, progress and metrics.
 */
#ifndef WHALE_TRAIN_H
#define WHALE_TRAIN_H

#include "whale.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *init;          /* preset name, config .json, or a model directory to continue from */
    const char *data;          /* prepared data directory (whale data prepare) */
    const char *out;           /* run directory */
    const char *tokenizer;     /* folder with tokenizer files copied into checkpoints (default: the init folder's) */
    const char *resume;        /* NULL, "latest", or a checkpoint directory */
    double lr, warmup_ratio, weight_decay, beta1, beta2, adam_eps, max_grad_norm;
    int64_t warmup_steps;      /* ≥ 0 overrides warmup_ratio */
    whale_lr_schedule schedule;
    int64_t max_steps;
    int batch_size, grad_accum, seq_len;
    int64_t eval_every, eval_batches, save_every, log_every;
    int save_total_limit;      /* 0 = keep all */
    uint64_t seed;
    int cross_doc_attention;   /* attend across packed documents (the original run's packing) */
    int recompute;             /* keep only each layer's input; recompute its activations in the backward pass */
    int hf_accum_compat;       /* gradient = sum of micro-batch means (HF Trainer's behaviour for this model) */
    int quiet;                 /* no progress lines */
    whale_dtype dtype;         /* F32, BF16 or F16 products (fp32 master weights, gradients and moments) */
    whale_weight_rounding weights; /* pure bf16: weights rounded to bf16 after each update */
    double loss_scale;         /* fp16: initial dynamic loss scale (GradScaler: 65536); 0 = default */
    int loss_scale_interval;   /* fp16: clean steps before the scale doubles (2000); 0 = default */
    int nan_check;             /* trace every forward and backward tensor; stop at the first non-finite one */
} whale_train_opts;

whale_train_opts whale_train_defaults(void);

typedef struct {
    int64_t steps;             /* optimiser steps done (including before a resume) */
    double last_loss, val_loss;
    double tokens_per_s;
    double seconds;
} whale_train_result;

/* Run (or resume) a training run. Writes OUT/metrics.jsonl, checkpoints
 * OUT/checkpoint-STEP/ (written to a temporary name, fsynced, renamed) and
 * the final model into OUT/ (config.json, model.safetensors, tokenizer files). */
whale_code whale_train_run(const whale_train_opts *opts, whale_train_result *result, whale_err *err);

/* Mean loss and perplexity of a model over a data split's windows of seq_len
 * (all of them when max_windows ≤ 0). */
whale_code whale_eval_dataset(whale_model *m, const char *data_dir, const char *split, int seq_len,
                              int64_t max_windows, int batch, int cross_doc, double *loss, int64_t *tokens,
                              whale_err *err);

#ifdef __cplusplus
}
#endif
#endif
