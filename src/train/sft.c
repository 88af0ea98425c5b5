/*
 * Supervised fine-tuning runs (whale_train.h): chat data → rows → the
 * shared optimiser step, with LoRA adapters on a frozen base or full
 * fine-tuning, written out the way ms-swift lays out its runs.
 */
#include "whale_train.h"

#include "core/core.h"
#include "dist/dist.h"
#include "models/model.h"
#include "whale_plot.h"
#include "train/sft_select.h"
#include "train/step.h"
#include "whale_diag.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

whale_sft_run_opts whale_sft_run_defaults(void) {
    whale_sft_run_opts o = {0};
    o.tuner = WHALE_TUNE_LORA;
    o.lora = whale_lora_defaults();
    o.data_opts = whale_sft_defaults();
    o.dtype = WHALE_F32;
    o.warmup_ratio = 0.0;
    o.weight_decay = 0.1;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.adam_eps = 1e-8;
    o.max_grad_norm = 1.0;
    o.schedule = WHALE_LR_COSINE;
    o.epochs = 3;
    o.batch_size = 1;
    o.save_steps = 500;
    o.logging_steps = 5;
    o.seed = 42;
    o.bucket_mb = WHALE_BUCKET_MB;
    return o;
}

/* ms-swift's add_version_to_work_dir: vN-YYYYMMDD-HHMMSS with N one past
 * the highest version already in out. */
static void version_dir(const char *out, char *buf, size_t cap) {
    int next = 0;
    DIR *d = opendir(out);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            if (e->d_name[0] != 'v') continue;
            long v = strtol(e->d_name + 1, &end, 10);
            if (end != e->d_name + 1 && *end == '-' && v >= next) next = (int)v + 1;
        }
        closedir(d);
    }
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(buf, cap, "%s/v%d-%s", out, next, stamp);
}

static cJSON *string_pair(const char *const v[2]) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < 2; i++)
        if (v[i] && *v[i]) cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
    return a;
}

/* args.json: the run's settings under ms-swift's argument names. */
static cJSON *make_args(const whale_sft_run_opts *o, const char *model, const char *run_dir, const char *tmpl,
                        int grad_accum, double lr, int64_t max_steps, int S) {
    cJSON *j = cJSON_CreateObject();
    const whale_sft_opts *d = &o->data_opts;
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddStringToObject(j, "tuner_type", o->tuner == WHALE_TUNE_LORA ? "lora" : "full");
    cJSON_AddStringToObject(j, "train_type", o->tuner == WHALE_TUNE_LORA ? "lora" : "full");
    cJSON *ds = cJSON_AddArrayToObject(j, "dataset");
    for (int i = 0; i < o->n_data; i++) cJSON_AddItemToArray(ds, cJSON_CreateString(o->data[i]));
    cJSON_AddStringToObject(j, "template", tmpl);
    if (d->system) cJSON_AddStringToObject(j, "system", d->system);
    else cJSON_AddNullToObject(j, "system");
    cJSON_AddStringToObject(j, "torch_dtype", whale_dtype_torch_name(o->dtype));
    if (o->tuner == WHALE_TUNE_LORA) {
        cJSON_AddNumberToObject(j, "lora_rank", o->lora.rank);
        cJSON_AddNumberToObject(j, "lora_alpha", o->lora.alpha);
        cJSON_AddNumberToObject(j, "lora_dropout", o->lora.dropout);
        cJSON_AddBoolToObject(j, "use_rslora", o->lora.use_rslora);
        cJSON *tm = cJSON_AddArrayToObject(j, "target_modules");
        const char *t = o->lora.target_modules ? o->lora.target_modules : "all-linear";
        while (*t) { /* the comma list as a JSON list, as ms-swift records it */
            const char *e = strchr(t, ',');
            size_t n = e ? (size_t)(e - t) : strlen(t);
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), t);
            if (*name) cJSON_AddItemToArray(tm, cJSON_CreateString(name));
            t += n + (e != NULL);
        }
    }
    cJSON_AddNumberToObject(j, "learning_rate", lr);
    cJSON_AddNumberToObject(j, "num_train_epochs", o->epochs);
    cJSON_AddNumberToObject(j, "max_steps", (double)max_steps);
    cJSON_AddNumberToObject(j, "per_device_train_batch_size", o->batch_size);
    cJSON_AddNumberToObject(j, "gradient_accumulation_steps", grad_accum);
    if (d->max_length > 0) cJSON_AddNumberToObject(j, "max_length", d->max_length);
    else cJSON_AddNullToObject(j, "max_length");
    cJSON_AddNumberToObject(j, "row_length", S);
    cJSON_AddStringToObject(j, "truncation_strategy",
                            d->truncation == WHALE_SFT_TRUNC_LEFT    ? "left"
                            : d->truncation == WHALE_SFT_TRUNC_RIGHT ? "right"
                                                                     : "delete");
    cJSON_AddBoolToObject(j, "packing", d->packing);
    cJSON_AddStringToObject(j, "loss_scale", d->loss_scope == WHALE_SFT_LOSS_ALL ? "all" : "default");
    cJSON_AddItemToObject(j, "model_name", string_pair(d->model_name));
    cJSON_AddItemToObject(j, "model_author", string_pair(d->model_author));
    cJSON_AddNumberToObject(j, "warmup_ratio", o->warmup_ratio);
    cJSON_AddNumberToObject(j, "weight_decay", o->weight_decay);
    cJSON_AddNumberToObject(j, "adam_beta1", o->beta1);
    cJSON_AddNumberToObject(j, "adam_beta2", o->beta2);
    cJSON_AddNumberToObject(j, "adam_epsilon", o->adam_eps);
    cJSON_AddNumberToObject(j, "max_grad_norm", o->max_grad_norm);
    cJSON_AddStringToObject(j, "lr_scheduler_type",
                            o->schedule == WHALE_LR_CONSTANT ? "constant" : o->schedule == WHALE_LR_LINEAR ? "linear" : "cosine");
    cJSON_AddBoolToObject(j, "gradient_checkpointing", o->recompute);
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddNumberToObject(j, "save_steps", (double)o->save_steps);
    cJSON_AddNumberToObject(j, "logging_steps", (double)o->logging_steps);
    if (o->save_total_limit > 0) cJSON_AddNumberToObject(j, "save_total_limit", o->save_total_limit);
    else cJSON_AddNullToObject(j, "save_total_limit");
    cJSON *vd = cJSON_AddArrayToObject(j, "val_dataset");
    for (int i = 0; i < o->n_val_data; i++) cJSON_AddItemToArray(vd, cJSON_CreateString(o->val_data[i]));
    cJSON_AddNumberToObject(j, "split_dataset_ratio", o->split_ratio);
    cJSON_AddNumberToObject(j, "eval_steps", (double)(o->eval_steps > 0 ? o->eval_steps : o->save_steps));
    cJSON_AddStringToObject(j, "metric_for_best_model", "loss");
    cJSON_AddFalseToObject(j, "greater_is_better");
    cJSON_AddBoolToObject(j, "save_only_model", o->save_only_model);
    cJSON_AddStringToObject(j, "output_dir", run_dir);
    if (o->command_line) cJSON_AddStringToObject(j, "command_line", o->command_line);
    if (o->resume) cJSON_AddStringToObject(j, "resume_from_checkpoint", o->resume);
    return j;
}

static whale_code write_json(const char *dir, const char *name, const cJSON *j, whale_err *err) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = cJSON_Print(j);
    if (!text) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    size_t n = strlen(text);
    char *withnl = realloc(text, n + 2);
    if (!withnl) {
        free(text);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    }
    withnl[n] = '\n';
    withnl[n + 1] = 0;
    whale_code c = whale_write_file_atomic(path, withnl, n + 1, err);
    free(withnl);
    return c;
}

static double physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0;
}

typedef struct {
    const whale_sft_run_opts *o;
    whale_model *m;
    whale_session *s;
    whale_optimizer *opt;
    cJSON *args;
    const char *model_dir;
    char run_dir[4096];
    whale_data_cursor cur;
    whale_loss_scaler scaler;
    whale_grad_sum *sum;   /* several micro-batches or ranks */
    whale_zero *zero;      /* --zero 1 on several ranks: this rank's shard of the optimizer state */
    int leader;            /* rank 0: prints, writes the run folder */
    char fingerprint[128]; /* what must not change when resuming */
    whale_sft_dataset *val; /* validation samples, or NULL */
    cJSON *history;         /* trainer_state.json's log_history: every logged step and evaluation */
    int64_t max_steps, eval_step; /* the step of the last evaluation (0: none yet) */
    double eval_loss, eval_acc;
    double best_metric; /* the lowest eval_loss at a saved checkpoint, NaN before one */
    int64_t best_step;
    char best_ckpt[4200];
    /* whale_sft_run's phases: what they open (freed by sft_free) */
    whale_tokenizer *tok;
    whale_chat_template *tpl;
    whale_sft_dataset *ds;
    whale_model *skel; /* the model's sizes, before it is loaded */
    whale_batch *micro; /* [grad_accum] */
    whale_diag *nan;    /* --nan-check */
    FILE *log;          /* logging.jsonl (rank 0) */
    /* and what they decide */
    char model_dir_buf[PATH_MAX], ckpt[4200];
    whale_sft_stats st, vst; /* training and validation data */
    int B, S, grad_accum, lora;
    int64_t rows, steps_per_epoch, start;
    double lr;
    /* the meters of the training loop */
    int64_t tokens, rank_tokens, loss_n;
    double t_start, t_train, int_loss, int_norm, last_loss, loss_sum;
    int int_n, int_steps;
} sft_run;

/* Hugging Face's trainer_state.json fields: the step, the best checkpoint
 * by eval_loss and the log history. */
static void add_hf_state(const sft_run *r, cJSON *j, int64_t step) {
    const whale_sft_run_opts *o = r->o;
    cJSON_AddNumberToObject(j, "global_step", (double)step);
    cJSON_AddNumberToObject(j, "max_steps", (double)r->max_steps);
    cJSON_AddNumberToObject(j, "epoch", (double)r->cur.epoch + (double)r->cur.index / (double)(r->cur.windows ? r->cur.windows : 1));
    cJSON_AddNumberToObject(j, "num_train_epochs", o->epochs);
    cJSON_AddNumberToObject(j, "logging_steps", (double)o->logging_steps);
    cJSON_AddNumberToObject(j, "eval_steps", (double)(o->eval_steps > 0 ? o->eval_steps : o->save_steps));
    cJSON_AddNumberToObject(j, "save_steps", (double)o->save_steps);
    cJSON_AddNumberToObject(j, "train_batch_size", o->batch_size);
    if (isnan(r->best_metric)) {
        cJSON_AddNullToObject(j, "best_metric");
        cJSON_AddNullToObject(j, "best_model_checkpoint");
        cJSON_AddNullToObject(j, "best_global_step");
    } else {
        cJSON_AddNumberToObject(j, "best_metric", r->best_metric);
        cJSON_AddStringToObject(j, "best_model_checkpoint", r->best_ckpt);
        cJSON_AddNumberToObject(j, "best_global_step", (double)r->best_step);
    }
    cJSON *h = r->history ? cJSON_Duplicate(r->history, 1) : NULL;
    cJSON_AddItemToObject(j, "log_history", h ? h : cJSON_CreateArray());
}

/* The loop's state: with it and the moments a resumed run continues
 * exactly where the checkpoint was taken. */
static whale_code write_trainer_state(sft_run *r, const char *dir, int64_t step, whale_err *err) {
    whale_code c;
    cJSON *j = cJSON_CreateObject();
    char num[32];
    add_hf_state(r, j, step);
    snprintf(num, sizeof num, "%llu", (unsigned long long)r->cur.seed);
    cJSON_AddStringToObject(j, "data_seed", num); /* 64-bit: not exact as a JSON number */
    cJSON_AddNumberToObject(j, "data_epoch", (double)r->cur.epoch);
    cJSON_AddNumberToObject(j, "data_index", (double)r->cur.index);
    cJSON_AddNumberToObject(j, "data_rows", (double)r->cur.windows);
    snprintf(num, sizeof num, "%llu", (unsigned long long)r->s->lora_calls);
    cJSON_AddStringToObject(j, "dropout_counter", num);
    cJSON_AddNumberToObject(j, "loss_scale", r->scaler.scale);
    cJSON_AddNumberToObject(j, "loss_scale_clean_steps", r->scaler.clean_steps);
    cJSON_AddNumberToObject(j, "loss_scale_skipped", (double)r->scaler.skipped);
    cJSON_AddStringToObject(j, "run", r->fingerprint);
    c = write_json(dir, "trainer_state.json", j, err);
    cJSON_Delete(j);
    return c;
}

static double num_field(const cJSON *j, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Restore what write_trainer_state saved; refuse a checkpoint of another run. */
static whale_code read_trainer_state(sft_run *r, const char *dir, int64_t *step, whale_err *err) {
    char path[4400];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    cJSON *j;
    whale_code c = whale_read_json_object(path, &j, err);
    if (c) return c;
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(j, "run"), *seed = cJSON_GetObjectItemCaseSensitive(j, "data_seed"),
                *drop = cJSON_GetObjectItemCaseSensitive(j, "dropout_counter");
    if (!cJSON_IsString(run) || !cJSON_IsString(seed) || !cJSON_IsString(drop) || num_field(j, "global_step") < 0) {
        cJSON_Delete(j);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: not a whale sft trainer state", path);
    }
    if (strcmp(run->valuestring, r->fingerprint)) {
        c = whale_errf(err, WHALE_ERR_ARG, "%s: the checkpoint was trained with other settings (%s; now %s); resume with "
                       "the same data, --train-type, --dtype, --batch-size, --grad-accum and --max-length",
                       dir, run->valuestring, r->fingerprint);
        cJSON_Delete(j);
        return c;
    }
    *step = (int64_t)num_field(j, "global_step");
    r->cur.seed = strtoull(seed->valuestring, NULL, 10);
    r->cur.epoch = (int64_t)num_field(j, "data_epoch");
    r->cur.index = (int64_t)num_field(j, "data_index");
    r->cur.windows = (int64_t)num_field(j, "data_rows");
    r->s->lora_calls = strtoull(drop->valuestring, NULL, 10);
    if (num_field(j, "loss_scale") > 0) r->scaler.scale = num_field(j, "loss_scale");
    r->scaler.clean_steps = (int)num_field(j, "loss_scale_clean_steps");
    r->scaler.skipped = (int64_t)num_field(j, "loss_scale_skipped");
    const cJSON *bm = cJSON_GetObjectItemCaseSensitive(j, "best_metric"),
                *bc = cJSON_GetObjectItemCaseSensitive(j, "best_model_checkpoint"),
                *lh = cJSON_GetObjectItemCaseSensitive(j, "log_history");
    if (cJSON_IsNumber(bm) && cJSON_IsString(bc)) {
        r->best_metric = bm->valuedouble;
        r->best_step = (int64_t)num_field(j, "best_global_step");
        snprintf(r->best_ckpt, sizeof r->best_ckpt, "%s", bc->valuestring);
    }
    if (cJSON_IsArray(lh) && r->history) { /* the logs up to the checkpoint */
        cJSON_Delete(r->history);
        r->history = cJSON_Duplicate(lh, 1);
    }
    cJSON_Delete(j);

    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (access(path, R_OK) != 0)
        return whale_errf(err, WHALE_ERR_IO, "%s: no optimizer state (saved with --save_only_model?): cannot resume from it",
                          dir);
    c = whale_step_load_moments(path, r->m, r->opt, err);
    whale_optimizer_set_steps(r->opt, *step);
    return c;
}

/* save_total_limit as Hugging Face applies it (_rotate_checkpoints): the
 * best checkpoint is never removed; when it is not the newest, the newest
 * limit - 1 (at least 1) are kept beside it. */
static void prune_checkpoints(const sft_run *r) {
    int limit = r->o->save_total_limit;
    if (limit <= 0) return;
    int64_t *steps;
    int n = whale_list_checkpoints(r->run_dir, &steps), keep = limit;
    int best = !isnan(r->best_metric) && n && steps[n - 1] != r->best_step; /* the newest counts as itself */
    if (best) keep = limit > 1 ? limit - 1 : 1;
    for (int i = n - 1, kept = 0; i >= 0; i--) {
        if (best && steps[i] == r->best_step) continue;
        if (kept++ < keep) continue;
        char old[4200];
        snprintf(old, sizeof old, "%s/checkpoint-%lld", r->run_dir, (long long)steps[i]);
        whale_remove_flat_dir(old);
    }
    free(steps);
}

/* Every rank calls it: with --zero 1 the moments (and in mixed precision
 * the masters) are gathered from the ranks first; rank 0 writes the files. */
static whale_code save_checkpoint(sft_run *r, int64_t step, char *out_path, size_t cap, whale_err *err) {
    char dir[4200], tmp[4300], path[4400];
    snprintf(dir, sizeof dir, "%s/checkpoint-%lld", r->run_dir, (long long)step);
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    snprintf(out_path, cap, "%s", dir);
    /* the evaluation at this step makes it the best checkpoint (HF's _save_checkpoint) */
    if (r->eval_step == step && !isnan(r->eval_loss) && (isnan(r->best_metric) || r->eval_loss < r->best_metric)) {
        r->best_metric = r->eval_loss;
        r->best_step = step;
        snprintf(r->best_ckpt, sizeof r->best_ckpt, "%s", dir);
    }
    whale_code c = WHALE_OK;
    if (r->leader) {
        whale_remove_flat_dir(tmp);
        c = whale_mkdir(tmp, err);
    }
    if (!c && !r->o->save_only_model) /* the moments of the trainable parameters */
        c = whale_step_save_moments(r->leader ? path : NULL, r->m, r->opt, r->sum, r->zero, step, err);
    int lora = r->o->tuner == WHALE_TUNE_LORA;
    if (!c && !lora) /* with --zero 1 in mixed precision the ranks hold parts of the masters */
        c = whale_step_save_model(r->leader ? tmp : NULL, r->m, r->sum, r->zero, step, err);
    if (!r->leader) return c;
    if (!c) c = lora ? whale_lora_save(r->m, tmp, r->model_dir, err) : whale_tokenizer_copy_files(r->model_dir, tmp, err);
    if (!c) c = write_json(tmp, "args.json", r->args, err);
    if (!c) c = write_trainer_state(r, tmp, step, err);
    if (c) {
        whale_remove_flat_dir(tmp);
        return c;
    }
    if ((c = whale_publish_dir(tmp, dir, r->run_dir, err))) return c;
    prune_checkpoints(r);
    return WHALE_OK;
}

static whale_code check_opts(const whale_sft_run_opts *o, whale_err *err) {
    if (!o->model || !o->out || o->n_data < 1)
        return whale_errf(err, WHALE_ERR_ARG, "a base model, at least one data file and an output folder are required");
    if (o->batch_size < 1 || o->grad_accum < 0)
        return whale_errf(err, WHALE_ERR_ARG, "--batch-size must be >= 1 and --grad-accum >= 1");
    if (o->max_steps <= 0 && !(o->epochs > 0))
        return whale_errf(err, WHALE_ERR_ARG, "--num-train-epochs must be > 0 (or give --max-steps)");
    if (o->lr < 0) return whale_errf(err, WHALE_ERR_ARG, "--lr must be > 0");
    if (o->dtype == WHALE_I8 && o->tuner != WHALE_TUNE_LORA)
        return whale_errf(err, WHALE_ERR_ARG,
                          "int8 is an inference format: full fine-tuning runs in fp32, bf16 or fp16; int8 takes LoRA "
                          "(adapters on a frozen int8 base)");
    if (o->dtype != WHALE_F32 && o->dtype != WHALE_BF16 && o->dtype != WHALE_F16 && o->dtype != WHALE_I8)
        return whale_errf(err, WHALE_ERR_ARG, "fine-tuning runs in fp32, bf16, fp16 or int8 (LoRA), not %s",
                          whale_dtype_name(o->dtype));
    if (!(o->split_ratio >= 0 && o->split_ratio < 1))
        return whale_errf(err, WHALE_ERR_ARG, "--split_dataset_ratio must be in [0, 1), got %g", o->split_ratio);
    if (o->eval_steps < 0) return whale_errf(err, WHALE_ERR_ARG, "--eval_steps must be >= 1");
    if (o->data_opts.packing && o->data_opts.max_length < 2)
        return whale_errf(err, WHALE_ERR_ARG, "--packing needs --max-length (the length of a packed row)");
    return WHALE_OK;
}

/* Mean loss and token accuracy over the validation rows (in order, b's
 * rows at a time, no dropout; the dropout counter is left as it was so the
 * training steps draw the masks they would without evaluation). On several
 * ranks batch j runs on rank j % N and the sums are added in batch order:
 * the result of one process. */
static whale_code evaluate(sft_run *r, whale_batch *b, int B, int S, double *seconds, whale_err *err) {
    int64_t rows = 0;
    uint64_t calls = r->s->lora_calls;
    double t0 = whale_now(), sum[3] = {0, 0, 0}, *mine = NULL; /* loss × tokens, tokens, hits */
    int N = whale_dist_size();
    whale_code c = whale_sft_dataset_num_rows(r->val, S, &rows, err);
    int64_t n_batches = (rows + B - 1) / B;
    if (!c && n_batches > INT_MAX / 3) c = whale_errf(err, WHALE_ERR_RANGE, "%lld validation batches: too many", (long long)n_batches);
    if (!c && !(mine = calloc((size_t)(n_batches / N + 1) * 3, sizeof(double))))
        c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    for (int64_t j = whale_dist_rank(); j < n_batches && !c; j += N) {
        int64_t r0 = j * B, hits0 = r->s->eval_hits;
        int nb = (int)(rows - r0 < B ? rows - r0 : B);
        for (int i = 0; i < nb && !c; i++) {
            size_t o = (size_t)i * (size_t)S;
            c = whale_sft_dataset_row(r->val, r0 + i, S, b->ids + o, b->labels + o, b->pos + o, b->seg + o, err);
        }
        b->B = nb, b->S = S;
        whale_batch_trim(b);
        double l, *at = mine + 3 * (j / N);
        int64_t cn;
        if (!c) c = whale_session_train_step(r->s, b->ids, b->labels, b->pos, b->seg, nb, b->S, 0.0, &l, &cn, err);
        if (!c && cn) at[0] = l * (double)cn, at[1] = (double)cn, at[2] = (double)(r->s->eval_hits - hits0);
    }
    if (!c) c = whale_step_sum_dealt(mine, (int)n_batches, 3, sum, err);
    free(mine);
    r->s->lora_calls = calls;
    r->eval_loss = sum[1] > 0 ? sum[0] / sum[1] : NAN;
    r->eval_acc = sum[1] > 0 ? sum[2] / sum[1] : NAN;
    *seconds = whale_now() - t0;
    return c;
}

/* An evaluation in logging.jsonl (ms-swift's keys), the log history and
 * the progress line. */
static void log_eval(sft_run *r, FILE *log, int64_t step, double epoch, double seconds, int B) {
    int64_t rows = whale_sft_dataset_num_samples(r->val);
    char jl[32], ja[32];
    whale_json_double(jl, sizeof jl, "%.6f", r->eval_loss);
    whale_json_double(ja, sizeof ja, "%.6f", r->eval_acc);
    fprintf(log,
            "{\"eval_loss\": %s, \"eval_token_acc\": %s, \"eval_runtime\": %.4f, \"eval_samples_per_second\": %.3f, "
            "\"eval_steps_per_second\": %.3f, \"epoch\": %.4f, \"global_step/max_steps\": \"%lld/%lld\", "
            "\"memory(GiB)\": %.2f}\n",
            jl, ja, seconds, (double)rows / seconds, ceil((double)rows / B) / seconds, epoch, (long long)step,
            (long long)r->max_steps, whale_peak_rss() / 1073741824.0);
    fflush(log);
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "epoch", epoch);
    if (!isnan(r->eval_loss)) cJSON_AddNumberToObject(h, "eval_loss", r->eval_loss);
    if (!isnan(r->eval_acc)) cJSON_AddNumberToObject(h, "eval_token_acc", r->eval_acc);
    cJSON_AddNumberToObject(h, "eval_runtime", seconds);
    cJSON_AddNumberToObject(h, "step", (double)step);
    cJSON_AddItemToArray(r->history, h);
    if (!r->o->quiet)
        fprintf(stderr, "eval %5lld/%lld  eval_loss %.4f  eval_token_acc %.4f  (%lld samples, %.1f s)\n", (long long)step,
                (long long)r->max_steps, r->eval_loss, r->eval_acc, (long long)rows, seconds);
}

/* A training log entry for trainer_state.json's log_history (HF's keys). */
static void history_train(sft_run *r, int64_t step, double epoch, double loss, double norm, double lr) {
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "epoch", epoch);
    if (!isnan(norm)) cJSON_AddNumberToObject(h, "grad_norm", norm);
    cJSON_AddNumberToObject(h, "learning_rate", lr);
    if (!isnan(loss)) cJSON_AddNumberToObject(h, "loss", loss);
    cJSON_AddNumberToObject(h, "step", (double)step);
    cJSON_AddItemToArray(r->history, h);
}

/* ms-swift's images/: the run's curves (SVG here) from logging.jsonl. A
 * curve that cannot be drawn is a note, not a failed run. */
static void write_images(const sft_run *r) {
    static const char *const metrics[][2] = {{"loss", "train_loss"}, {"learning_rate", "train_learning_rate"},
                                             {"grad_norm", "train_grad_norm"}, {"eval_loss", "eval_loss"},
                                             {"eval_token_acc", "eval_token_acc"}};
    char dir[4200], path[4300];
    whale_err err;
    snprintf(dir, sizeof dir, "%s/images", r->run_dir);
    if (whale_mkdir(dir, &err)) return;
    const char *in[1] = {r->run_dir};
    for (int i = 0; i < (r->val ? 5 : 3); i++) {
        whale_plot_opts po = {.title = metrics[i][1], .metric = metrics[i][0]};
        snprintf(path, sizeof path, "%s/%s.svg", dir, metrics[i][1]);
        if (whale_plot_svg(in, 1, &po, path, &err) && !r->o->quiet)
            fprintf(stderr, "sft: note: %s not drawn: %s\n", path, err.msg);
    }
}

/* The training data (FILE#N sampled; split when split_ratio is set without
 * val_data) and the validation data (r->val, NULL without any). */
static whale_code open_data(sft_run *r, whale_tokenizer *tok, const whale_chat_template *tpl, whale_sft_dataset **ds,
                            whale_err *err) {
    const whale_sft_run_opts *o = r->o;
    whale_sft_dataset *none = NULL;
    double ratio = o->n_val_data ? 0 : o->split_ratio;
    whale_code c = whale_sft_open_data(o->data, o->n_data, tok, tpl, &o->data_opts, ratio, o->seed, ds, &r->val, err);
    if (!c && o->n_val_data)
        c = whale_sft_open_data(o->val_data, o->n_val_data, tok, tpl, &o->data_opts, 1.0, o->seed, &none, &r->val, err);
    whale_sft_dataset_free(none);
    if (!c && r->val && whale_sft_dataset_num_samples(r->val) == 0) {
        whale_sft_dataset_free(r->val);
        r->val = NULL;
    }
    return c;
}

/* Before loading anything: the model folder, the checkpoint to resume
 * and the output folder (an unwritable one fails now, not after loading). */
static whale_code sft_check_paths(sft_run *r, whale_err *err) {
    const whale_sft_run_opts *o = r->o;
    if (!realpath(o->model, r->model_dir_buf) || !whale_is_dir(r->model_dir_buf))
        return whale_errf(err, WHALE_ERR_IO, "%s: not a model directory", o->model);
    r->model_dir = r->model_dir_buf;
    if (o->resume) {
        char state[4200];
        snprintf(state, sizeof state, "%s/trainer_state.json", o->resume);
        if (access(state, R_OK) != 0)
            return whale_errf(err, WHALE_ERR_IO, "%s: not a whale sft checkpoint (no readable trainer_state.json)",
                              o->resume);
    }
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.write-test", o->out);
    if (r->leader) {
        whale_code c;
        if ((c = whale_mkdir(o->out, err)) || (c = whale_write_file_atomic(probe, "", 0, err))) return c;
        unlink(probe);
    }
    return WHALE_OK;
}

/* What the data says of the run: its longest row sizes it (S), its rows
 * count the steps. */
static void sft_print_data(const sft_run *r) {
    const whale_sft_run_opts *o = r->o;
    const whale_sft_stats *st = &r->st, *vst = &r->vst;
    if (o->quiet) return;
    fprintf(stderr, "sft: %lld records → %lld samples (%lld tokens, %lld trained; longest %d)%s%s; %lld rows of %d tokens%s\n",
            (long long)st->records, (long long)st->samples, (long long)st->tokens, (long long)st->trained_tokens,
            st->max_sample_tokens, st->skipped ? "; skipped malformed: " : "", st->skipped ? st->first_bad : "",
            (long long)r->rows, r->S, o->data_opts.packing ? " (packed)" : "");
    if (r->val)
        fprintf(stderr, "sft: validation: %lld samples (%lld tokens, %lld trained)%s\n", (long long)vst->samples,
                (long long)vst->tokens, (long long)vst->trained_tokens, o->n_val_data ? "" : " held out of the training data");
    if (st->deleted || st->truncated || st->untrained)
        fprintf(stderr, "sft: longer than --max-length %d: %lld deleted, %lld truncated; %lld left with nothing to train\n",
                o->data_opts.max_length, (long long)st->deleted, (long long)st->truncated, (long long)st->untrained);
}

static whale_code sft_open_data(sft_run *r, whale_err *err) {
    const whale_sft_run_opts *o = r->o;
    whale_code c;
    if ((c = whale_tokenizer_load(r->model_dir, &r->tok, err)) ||
        (c = whale_chat_template_load(r->model_dir, o->chat_template, &r->tpl, err)) ||
        (c = open_data(r, r->tok, r->tpl, &r->ds, err)) || (c = whale_model_skeleton(r->model_dir, &r->skel, err)))
        return c;
    if (!o->quiet && whale_chat_template_notice(r->tpl)) fprintf(stderr, "sft: %s\n", whale_chat_template_notice(r->tpl));
    whale_sft_dataset_stats(r->ds, &r->st);
    whale_sft_dataset_stats(r->val, &r->vst);
    r->S = o->data_opts.packing                                ? o->data_opts.max_length
           : r->vst.max_sample_tokens > r->st.max_sample_tokens ? r->vst.max_sample_tokens
                                                                : r->st.max_sample_tokens;
    if (r->S > r->skel->max_positions)
        return whale_errf(err, WHALE_ERR_RANGE,
                          "%s: rows of %d tokens exceed the model's %d positions; set --max-length %d or less",
                          o->data[0], r->S, r->skel->max_positions, r->skel->max_positions);
    if (whale_tokenizer_vocab_size(r->tok) > r->skel->vocab_size)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: the tokenizer has %d tokens but the model's vocabulary %d",
                          r->model_dir, whale_tokenizer_vocab_size(r->tok), r->skel->vocab_size);
    if ((c = whale_sft_dataset_num_rows(r->ds, r->S, &r->rows, err))) return c;
    int B = r->B = o->batch_size;
    r->grad_accum = o->grad_accum > 0 ? o->grad_accum : (16 + B - 1) / B; /* ms-swift: a total batch >= 16 */
    /* Hugging Face's count: an epoch's last micro-batch and its last step may be partial */
    r->steps_per_epoch = ((r->rows + B - 1) / B + r->grad_accum - 1) / r->grad_accum;
    r->max_steps = o->max_steps > 0 ? o->max_steps : (int64_t)ceil(o->epochs * (double)r->steps_per_epoch);
    if (r->max_steps < 1) r->max_steps = 1;
    r->lora = o->tuner == WHALE_TUNE_LORA;
    r->lr = o->lr > 0 ? o->lr : r->lora ? 1e-4 : 1e-5;
    sft_print_data(r);
    return WHALE_OK;
}

/* Refuse up front what cannot fit. */
static whale_code sft_check_memory(const sft_run *r, whale_err *err) {
    const whale_sft_run_opts *o = r->o;
    whale_memory_plan plan = {.dtype = o->dtype, .train = r->lora ? WHALE_TRAIN_LORA : WHALE_TRAIN_FULL,
                              .lora_rank = o->lora.rank, .lora_targets = o->lora.target_modules, .batch = r->B,
                              .seq_len = r->S, .recompute = o->recompute, .grad_accum = r->grad_accum,
                              .ranks = whale_dist_size(), .zero = o->zero,
                              .bucket_mb = o->bucket_mb};
    whale_memory est;
    whale_code c = whale_memory_estimate(r->model_dir, &plan, &est, err);
    if (c) return c;
    double limit = o->memory_limit > 0 ? o->memory_limit : physical_memory();
    if (limit <= 0 || (double)est.total <= limit) return WHALE_OK;
    if (!o->quiet) {
        fprintf(stderr, "sft: estimated ");
        whale_memory_print(&est, stderr);
    }
    double gib = 1073741824.0;
    return whale_errf(err, WHALE_ERR_NOMEM,
                      "%s: this run needs an estimated %.2f GiB (weights %.2f, gradients %.2f, AdamW moments %.2f, "
                      "activations %.2f) but %s is %.2f GiB; try %s%sa smaller --batch-size or --max-length",
                      o->model, est.total / gib, (est.weights_f32 + est.weights_lowp + est.weights_mapped) / gib,
                      est.grads / gib, est.moments / gib, est.activations / gib,
                      o->memory_limit > 0 ? "--memory-limit" : "the machine's memory", limit / gib,
                      o->dtype == WHALE_F32 ? "--dtype bf16, " : "", o->recompute ? "" : "--gradient-checkpointing true, ");
}

/* The model: a LoRA base is held in the run's precision only; resuming,
 * the adapters (or the fully trained weights) come from the checkpoint.
 * Then its session, optimizer, gradient sum and micro-batches. */
static whale_code sft_build(sft_run *r, whale_err *err) {
    const whale_sft_run_opts *o = r->o;
    whale_code c;
    if (r->lora) {
        if ((c = whale_model_load_as(r->model_dir, o->dtype, &r->m, err))) return c;
        whale_lora_config lc = o->lora;
        if ((c = o->resume ? whale_lora_load(r->m, o->resume, err) : whale_lora_attach(r->m, &lc, err))) return c;
        ((whale_lora_config *)r->m->lora_cfg)->seed = o->lora.seed; /* the dropout masks' seed */
    } else if ((c = whale_model_load(o->resume ? o->resume : r->model_dir, &r->m, err)) ||
               (c = whale_model_set_dtype(r->m, o->dtype, err))) {
        return c;
    }
    whale_adamw_config ac = {.beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps, .weight_decay = o->weight_decay,
                             .seed = o->seed};
    if ((c = whale_train_session_new(r->m, r->B, r->S, o->recompute, &r->s, err)) ||
        (c = whale_adamw_new(r->m, &ac, &r->opt, err)))
        return c;
    r->cur.seed = o->seed;
    whale_loss_scaler_init(&r->scaler);
    if (!(r->history = cJSON_CreateArray())) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if ((c = o->zero ? whale_zero_new(r->s, r->opt, r->grad_accum, &r->sum, &r->zero, err)
                     : whale_step_sum_new(r->s, r->grad_accum, &r->sum, err)) ||
        (c = whale_step_sum_buckets(r->sum, o->bucket_mb, err)))
        return c;
    snprintf(r->fingerprint, sizeof r->fingerprint, "%s %s, %lld rows of %d tokens (%lld trained), batch %d x %d",
             r->lora ? "lora" : "full", whale_dtype_torch_name(o->dtype), (long long)r->rows, r->S,
             (long long)r->st.trained_tokens, r->B, r->grad_accum);
    if (o->resume) { /* before creating the run folder: a refused resume leaves nothing behind */
        if ((c = read_trainer_state(r, o->resume, &r->start, err))) return c;
        if (r->start >= r->max_steps)
            return whale_errf(err, WHALE_ERR_ARG, "%s: the checkpoint is at step %lld of %lld: nothing left to train",
                              o->resume, (long long)r->start, (long long)r->max_steps);
        if (!o->quiet) fprintf(stderr, "sft: resuming from %s at step %lld\n", o->resume, (long long)r->start);
    }
    if ((c = whale_step_check_start(r->s, r->opt, &r->cur, r->start, err))) return c;
    whale_zero_drop_masters(r->zero, r->s);
    if (o->nan_check) {
        if (!(r->nan = whale_diag_new(1))) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        if ((c = whale_diag_set_model(r->nan, r->m, err))) return c;
        whale_session_set_trace(r->s, whale_diag_trace, r->nan);
    }
    if (!(r->micro = calloc((size_t)r->grad_accum, sizeof *r->micro)))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < r->grad_accum; i++)
        if ((c = whale_batch_alloc(r->B, r->S, &r->micro[i], err))) return c;
    return WHALE_OK;
}

/* The run folder: args.json and logging.jsonl; the memory the run holds. */
static whale_code sft_open_run_dir(sft_run *r, whale_err *err) {
    const whale_sft_run_opts *o = r->o;
    whale_code c;
    version_dir(o->out, r->run_dir, sizeof r->run_dir);
    if (r->leader && (c = whale_mkdir(r->run_dir, err))) return c;
    r->args = make_args(o, r->model_dir, r->run_dir, whale_chat_template_name(r->tpl), r->grad_accum, r->lr,
                        r->max_steps, r->S);
    if (!r->args) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if (r->leader && (c = write_json(r->run_dir, "args.json", r->args, err))) return c;
    char path[4400];
    snprintf(path, sizeof path, "%s/logging.jsonl", r->run_dir);
    if (r->leader && !(r->log = fopen(path, "w")))
        return whale_errf(err, WHALE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (o->quiet) return WHALE_OK;
    whale_memory mm;
    whale_step_memory(r->m, r->s, r->opt, r->sum, r->zero, &mm);
    fprintf(stderr, "sft: ");
    whale_memory_print(&mm, stderr);
    fprintf(stderr, "sft: %s, %s; %lld steps of %d × %d rows (%.3g epochs), lr %.3g; run folder %s\n",
            r->lora ? "LoRA" : "full fine-tuning", whale_dtype_torch_name(o->dtype), (long long)r->max_steps, r->B,
            r->grad_accum, (double)r->max_steps / (double)r->steps_per_epoch, r->lr, r->run_dir);
    return WHALE_OK;
}

static double sft_epoch(const sft_run *r) {
    const whale_data_cursor *cur = &r->cur;
    return (double)cur->epoch + (double)cur->index / (double)(cur->windows ? cur->windows : 1);
}

/* The micro-batches of one step into r->micro; *n_micro how many. */
static whale_code sft_next_micro(sft_run *r, int *n_micro, whale_err *err) {
    whale_data_cursor *cur = &r->cur;
    int B = r->B;
    *n_micro = 0;
    for (int i = 0; i < r->grad_accum; i++, ++*n_micro) {
        int64_t left = cur->windows ? cur->windows - cur->index : r->rows;
        /* the epoch's last step ends with it, as Hugging Face counts; on N
         * ranks only where its micro-batches divide among them (else the
         * step goes on into the next epoch) */
        if (left == 0 && i > 0 && i % whale_dist_size() == 0) break;
        int nb = left > 0 && left < B ? (int)left : B;
        whale_code c = whale_sft_next_batch(r->ds, cur, nb, r->S, &r->micro[i], err);
        if (c) return c;
        whale_batch_trim(&r->micro[i]);
        r->tokens += (int64_t)r->micro[i].B * r->micro[i].S;
        if (i % whale_dist_size() == whale_dist_rank()) r->rank_tokens += (int64_t)r->micro[i].B * r->micro[i].S;
    }
    return WHALE_OK;
}

/* The logged step: one line of logging.jsonl (ms-swift's keys), the
 * history, the progress line; the interval's meters start again. */
static whale_code sft_log_step(sft_run *r, int64_t step, double lr_now, whale_err *err) {
    const whale_sft_run_opts *o = r->o;
    double elapsed = whale_now() - r->t_start, spi = r->t_train / (double)(step - r->start), epoch = sft_epoch(r);
    char e1[32], e2[32], jl[32], jn[32];
    whale_fmt_duration(e1, sizeof e1, elapsed);
    whale_fmt_duration(e2, sizeof e2, spi * (double)(r->max_steps - step));
    double mean_loss = r->int_loss / r->int_n, mean_norm = r->int_steps ? r->int_norm / r->int_steps : NAN;
    FILE *log = r->log;
    if (log)
        fprintf(log,
                "{\"loss\": %s, \"grad_norm\": %s, \"learning_rate\": %.6g, \"epoch\": %.4f, "
                "\"global_step/max_steps\": \"%lld/%lld\", \"percentage\": \"%.2f%%\", \"elapsed_time\": \"%s\", "
                "\"remaining_time\": \"%s\", \"memory(GiB)\": %.2f, \"train_speed(s/it)\": %.4f, "
                "\"tokens_per_s\": %.1f",
                whale_json_double(jl, sizeof jl, "%.6f", mean_loss), whale_json_double(jn, sizeof jn, "%.6g", mean_norm),
                lr_now, epoch, (long long)step, (long long)r->max_steps, 100.0 * (double)step / (double)r->max_steps,
                e1, e2, whale_peak_rss() / 1073741824.0, spi, (double)r->tokens / r->t_train);
    if (o->dtype == WHALE_F16 && log)
        fprintf(log, ", \"loss_scale\": %.0f, \"skipped_steps\": %lld", r->scaler.scale, (long long)r->scaler.skipped);
    whale_code c = whale_step_dist_metrics(log, r->sum, (double)r->rank_tokens, r->t_train, err);
    if (c) return c;
    if (log) {
        fprintf(log, "}\n");
        fflush(log);
    }
    history_train(r, step, epoch, mean_loss, mean_norm, lr_now);
    if (!o->quiet)
        fprintf(stderr, "step %5lld/%lld  loss %.4f  lr %.2e  grad-norm %.3f  %.0f tok/s  %.2f s/it  elapsed %s  ETA %s\n",
                (long long)step, (long long)r->max_steps, mean_loss, lr_now, mean_norm, (double)r->tokens / r->t_train,
                spi, e1, e2);
    r->int_loss = r->int_norm = 0;
    r->int_n = r->int_steps = 0;
    return WHALE_OK;
}

/* The steps from r->start to r->max_steps: log, evaluate and save as asked. */
static whale_code sft_train(sft_run *r, whale_err *err) {
    const whale_sft_run_opts *o = r->o;
    int64_t warmup = (int64_t)ceil(o->warmup_ratio * (double)r->max_steps), max_steps = r->max_steps;
    int64_t log_every = o->logging_steps > 0 ? o->logging_steps : 1;
    int64_t eval_every = o->eval_steps > 0 ? o->eval_steps : o->save_steps > 0 ? o->save_steps : max_steps;
    whale_code c;
    r->t_start = whale_now();
    r->last_loss = NAN;
    for (int64_t step = r->start; step < max_steps;) {
        double t0 = whale_now();
        double lr_now = r->lr * whale_lr_multiplier(o->schedule, step, warmup, max_steps);
        int n_micro;
        whale_step_result sr;
        if ((c = sft_next_micro(r, &n_micro, err)) ||
            (c = whale_train_one_step(r->s, r->opt, o->dtype == WHALE_F16 ? &r->scaler : NULL, r->nan, r->sum, r->zero,
                                      r->micro, n_micro, 0, o->max_grad_norm, lr_now, step + 1, &sr, err)))
            return c;
        step++;
        r->t_train += whale_now() - t0;
        r->last_loss = sr.loss;
        r->int_loss += sr.loss, r->int_n++, r->loss_sum += sr.loss, r->loss_n++;
        if (sr.taken) r->int_norm += sr.grad_norm, r->int_steps++;
        int last = step == max_steps;
        if ((step % log_every == 0 || last || step == r->start + 1) && (c = sft_log_step(r, step, lr_now, err)))
            return c;
        if (r->val && (step % eval_every == 0 || last)) {
            double secs, epoch = sft_epoch(r);
            if ((c = evaluate(r, &r->micro[0], r->B, r->S, &secs, err))) return c;
            r->eval_step = step;
            if (r->log) log_eval(r, r->log, step, epoch, secs, r->B);
        }
        if ((o->save_steps > 0 && step % o->save_steps == 0) || last) {
            if ((c = save_checkpoint(r, step, r->ckpt, sizeof r->ckpt, err)) ||
                (c = whale_dist_wait_leader("end of the checkpoint", step, err)))
                return c;
            if (!o->quiet) fprintf(stderr, "sft: saved %s\n", r->ckpt);
        }
    }
    return WHALE_OK;
}

/* The run's last line of logging.jsonl, its images and its result. */
static void sft_finish(sft_run *r, whale_sft_result *res) {
    const whale_sft_run_opts *o = r->o;
    double seconds = whale_now() - r->t_start;
    int64_t max_steps = r->max_steps, done = max_steps - r->start;
    char jl[32], jb[32];
    if (r->log)
        fprintf(r->log,
                "{\"train_runtime\": %.2f, \"train_samples_per_second\": %.3f, \"train_steps_per_second\": %.3f, "
                "\"train_loss\": %s, \"epoch\": %.4f, \"global_step/max_steps\": \"%lld/%lld\", "
                "\"last_model_checkpoint\": \"%s\", \"best_model_checkpoint\": %s%s%s, \"best_metric\": %s, "
                "\"memory(GiB)\": %.2f}\n",
                seconds, (double)done * (double)r->B * r->grad_accum / seconds, (double)done / seconds,
                whale_json_double(jl, sizeof jl, "%.6f", r->loss_sum / (double)r->loss_n), sft_epoch(r),
                (long long)max_steps, (long long)max_steps, r->ckpt, r->best_ckpt[0] ? "\"" : "",
                r->best_ckpt[0] ? r->best_ckpt : "null", r->best_ckpt[0] ? "\"" : "",
                whale_json_double(jb, sizeof jb, "%.6f", r->best_metric), whale_peak_rss() / 1073741824.0);
    if (r->log) fflush(r->log);
    write_images(r);
    if (!o->quiet) fprintf(stderr, "sft: peak resident memory %.1f MiB\n", whale_peak_rss() / 1048576.0);
    if (!res) return;
    res->steps = max_steps;
    res->last_loss = r->last_loss;
    res->seconds = seconds;
    res->tokens_per_s = r->t_train > 0 ? (double)r->tokens / r->t_train : 0;
    res->trainable_params = r->lora ? whale_lora_num_params(r->m) : whale_model_param_count(r->m);
    snprintf(res->run_dir, sizeof res->run_dir, "%s", r->run_dir);
    snprintf(res->last_checkpoint, sizeof res->last_checkpoint, "%s", r->ckpt);
    res->eval_loss = r->eval_loss;
    res->eval_token_acc = r->eval_acc;
    res->best_metric = r->best_metric;
    snprintf(res->best_checkpoint, sizeof res->best_checkpoint, "%s", r->best_ckpt);
    res->skipped_records = r->st.skipped;
    snprintf(res->first_bad, sizeof res->first_bad, "%s", r->st.first_bad);
}

/* Close logging.jsonl (c, or a write error) and free what the phases opened. */
static whale_code sft_free(sft_run *r, whale_code c, whale_err *err) {
    if (r->log && fclose(r->log) != 0 && !c)
        c = whale_errf(err, WHALE_ERR_IO, "%s/logging.jsonl: write failed", r->run_dir);
    if (r->micro)
        for (int i = 0; i < r->grad_accum; i++) whale_batch_free(&r->micro[i]);
    free(r->micro);
    whale_grad_sum_free(r->sum);
    whale_zero_free(r->zero);
    cJSON_Delete(r->args);
    cJSON_Delete(r->history);
    whale_sft_dataset_free(r->val);
    whale_optimizer_free(r->opt);
    whale_session_free(r->s);
    whale_diag_free(r->nan);
    whale_model_free(r->m);
    whale_model_free(r->skel);
    whale_sft_dataset_free(r->ds);
    whale_chat_template_free(r->tpl);
    whale_tokenizer_free(r->tok);
    return c;
}

whale_code whale_sft_run(const whale_sft_run_opts *o, whale_sft_result *res, whale_err *err) {
    whale_sft_run_opts quiet_opts;
    if (whale_dist_rank() != 0) { /* only rank 0 speaks */
        quiet_opts = *o;
        quiet_opts.quiet = 1;
        o = &quiet_opts;
    }
    whale_code c = check_opts(o, err);
    if (c) return c;
    sft_run *r = calloc(1, sizeof *r);
    if (!r) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    r->o = o, r->leader = whale_dist_rank() == 0;
    r->best_metric = r->eval_loss = r->eval_acc = NAN;
    if (!(c = sft_check_paths(r, err)) && !(c = sft_open_data(r, err)) && !(c = sft_check_memory(r, err)) &&
        !(c = sft_build(r, err)) && !(c = sft_open_run_dir(r, err)) && !(c = sft_train(r, err)))
        sft_finish(r, res);
    c = sft_free(r, c, err);
    free(r);
    return c;
}

whale_code whale_sft_checkpoint_base(const char *checkpoint, char **model, char **chat_template, char **system,
                                     whale_err *err) {
    char path[4400];
    *model = NULL;
    if (chat_template) *chat_template = NULL;
    if (system) *system = NULL;
    snprintf(path, sizeof path, "%s/args.json", checkpoint);
    if (access(path, R_OK) != 0)
        return whale_errf(err, WHALE_ERR_IO, "%s: no args.json to find the base model in (give -m BASE)", checkpoint);
    cJSON *j;
    whale_code c = whale_read_json_object(path, &j, err);
    if (c) return c;
    const cJSON *mv = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (!cJSON_IsString(mv) || !*mv->valuestring) {
        cJSON_Delete(j);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: no \"model\" string", path);
    }
    *model = strdup(mv->valuestring);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "template"), *s = cJSON_GetObjectItemCaseSensitive(j, "system");
    if (chat_template && cJSON_IsString(t)) *chat_template = strdup(t->valuestring);
    if (system && cJSON_IsString(s)) *system = strdup(s->valuestring);
    cJSON_Delete(j);
    if (!*model) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    return WHALE_OK;
}
