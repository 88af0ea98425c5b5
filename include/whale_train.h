/*
 * whale_train.h — training runs: data, optimiser, schedule, evaluation,
 * crash-safe checkpoints, resume, progress and metrics.
 */
#ifndef WHALE_TRAIN_H
#define WHALE_TRAIN_H

#include "whale.h"
#include "whale_lora.h"
#include "whale_sft.h"

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
    int zero;                  /* 1: on several ranks each holds the AdamW moments of its shard only (ZeRO stage 1) */
    double bucket_mb;          /* on several ranks: MiB of gradients per bucket sent during the backward pass (0: one exchange after it, the default) */
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

/* ---------------------------------------------------------------- SFT */

/* Supervised fine-tuning as ms-swift's `swift sft` does it: chat records
 * (whale_sft.h) rendered with the base model's chat template, loss on the
 * assistant turns, LoRA adapters on a frozen base or full fine-tuning.
 *
 * The run folder is OUT/vN-YYYYMMDD-HHMMSS (N one past the highest vN in
 * OUT) holding args.json, logging.jsonl (one JSON object per logged step
 * with ms-swift's keys) and checkpoint-STEP/ folders: for LoRA PEFT's
 * adapter_model.safetensors + adapter_config.json, for full fine-tuning a
 * Hugging Face model folder (config, weights, tokenizer); both with a copy
 * of args.json, whose "model" names the base so that adapters alone find
 * it. Each checkpoint is written to a temporary name, fsynced and renamed.
 *
 * Rows: one sample per row padded to the longest sample (packing: rows of
 * max_length holding several samples, each attending only to itself); each
 * micro-batch is cut to its longest row before it runs, which changes
 * nothing the loss sees (attention is causal and padding is untrained). */
typedef enum { WHALE_TUNE_LORA = 0, WHALE_TUNE_FULL } whale_tuner_type;

typedef struct {
    const char *model;           /* base model directory */
    const char *const *data;     /* .jsonl files */
    int n_data;
    const char *out;             /* output root ("output") */
    whale_tuner_type tuner;
    whale_lora_config lora;
    whale_sft_opts data_opts;    /* loss scope, max_length, truncation, packing, bad records, names, system */
    const char *chat_template;   /* "deepseek" | "chatml" | "raw"; NULL = the model folder's */
    whale_dtype dtype;           /* F32, BF16 or F16 products; a LoRA base is held in that precision only */
    double lr;                   /* 0 = 1e-4 for LoRA, 1e-5 for full (ms-swift's defaults) */
    double warmup_ratio, weight_decay, beta1, beta2, adam_eps, max_grad_norm;
    whale_lr_schedule schedule;
    double epochs;               /* 3 */
    int64_t max_steps;           /* > 0 overrides epochs */
    int batch_size;              /* rows per micro-batch (1) */
    int grad_accum;              /* 0 = ms-swift's choice: a total batch of at least 16 rows */
    int64_t save_steps, logging_steps;
    int save_total_limit;        /* 0 = keep all */
    uint64_t seed;
    int recompute;
    int nan_check;
    int quiet;
    double memory_limit;         /* bytes the run may take; 0 = the machine's physical memory */
    const char *command_line;    /* recorded in args.json (may be NULL) */
    const char *resume;          /* a checkpoint of an earlier run with the same settings: continue from it
                                    (into a new run folder), exactly as the run would have gone on */
    /* Validation (ms-swift's): val_data files, else with split_ratio in
     * (0, 1) that share of each training file held out (seeded). Data
     * files may be written FILE#N: N samples of FILE (ms-swift's dataset
     * sampling, seeded; more than it has repeats it). */
    const char *const *val_data;
    int n_val_data;
    double split_ratio;          /* --split_dataset_ratio (0) */
    int64_t eval_steps;          /* evaluate every N steps and at the end; 0 = save_steps (ms-swift) */
    int save_only_model;         /* checkpoints without optimizer state (cannot be resumed) */
    int zero;                    /* 1: on several ranks each holds the AdamW moments of its shard only (ZeRO stage 1) */
    double bucket_mb;            /* on several ranks: MiB of gradients per bucket sent during the backward pass (0: one exchange after it, the default) */
} whale_sft_run_opts;

whale_sft_run_opts whale_sft_run_defaults(void);

typedef struct {
    int64_t steps;
    double last_loss, seconds, tokens_per_s;
    int64_t trainable_params;
    char run_dir[4096];
    char last_checkpoint[4200];
    double eval_loss, eval_token_acc; /* the last evaluation (NaN without validation data) */
    double best_metric;               /* the lowest eval_loss at a saved checkpoint (NaN: none) */
    char best_checkpoint[4200];       /* that checkpoint ("" if none) */
    int64_t skipped_records;          /* bad records passed over (--bad-records skip) */
    char first_bad[512];              /* the first of them: "FILE:LINE: problem" */
} whale_sft_result;

/* Run a fine-tuning. Before loading the model, the memory the run needs is
 * estimated (whale_memory_estimate) and a run that would not fit in
 * memory_limit is refused (WHALE_ERR_NOMEM with the breakdown's figures). */
whale_code whale_sft_run(const whale_sft_run_opts *opts, whale_sft_result *result, whale_err *err);

/* The base model folder recorded in a checkpoint's args.json ("model"),
 * malloc'd; also its chat template and system prompt when recorded
 * (each malloc'd or NULL; pass NULL to skip). */
whale_code whale_sft_checkpoint_base(const char *checkpoint, char **model, char **chat_template, char **system,
                                     whale_err *err);

#ifdef __cplusplus
}
#endif
#endif
