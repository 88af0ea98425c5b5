/*
 * Training runs. One optimiser step = grad_accum micro-batches of
 * batch_size windows of seq_len tokens; the gradient is that of the mean
 * loss over every scored token of the step (each micro-batch weighted by its
 * share of the targets), clipped, then AdamW with the scheduled rate.
 *
 * Everything that decides the next step is saved in a checkpoint (weights,
 * moments, step, data cursor), so a resumed run reproduces the loss curve of
 * an uninterrupted one bit for bit (same thread count).
 */
#include "whale_train.h"

#include "core/core.h"
#include "dist/dist.h"
#include "whale_safetensors.h"
#include "kernels/convert.h"
#include "models/model.h"
#include "train/step.h"
#include "whale_data.h"
#include "whale_diag.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

whale_train_opts whale_train_defaults(void) {
    whale_train_opts o = {0};
    o.lr = 3e-4;
    o.warmup_ratio = 0.03;
    o.warmup_steps = -1;
    o.weight_decay = 0.1;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.adam_eps = 1e-8;
    o.max_grad_norm = 1.0;
    o.schedule = WHALE_LR_COSINE;
    o.max_steps = 1000;
    o.batch_size = 8;
    o.grad_accum = 1;
    o.seq_len = 256;
    o.eval_every = 0;
    o.eval_batches = 0;
    o.save_every = 0;
    o.log_every = 10;
    o.seed = 42;
    o.bucket_mb = WHALE_BUCKET_MB;
    return o;
}

/* ------------------------------------------------------------ files */

/* Checkpoints and the final model carry the tokenizer when the run has one. */
static whale_code copy_tokenizer_files(const char *src, const char *dst, whale_err *err) {
    return src ? whale_tokenizer_copy_files(src, dst, err) : WHALE_OK;
}

/* ------------------------------------------------------------ run state */

typedef struct {
    const whale_train_opts *o;
    whale_model *m;
    whale_session *s;
    whale_optimizer *opt;
    whale_dataset *train, *val;
    whale_data_cursor cursor;
    whale_batch *micro; /* [grad_accum] */
    whale_grad_sum *sum; /* several micro-batches or ranks */
    whale_zero *zero;    /* --zero 1 on several ranks: this rank's shard of the optimizer state */
    int leader;          /* rank 0: prints, writes metrics and checkpoints */
    FILE *metrics;
    char *tokenizer_dir;
    int64_t step;
    whale_loss_scaler scaler; /* fp16 only */
    whale_diag *nan;          /* --nan-check */
    char resume_dir[4096];    /* the checkpoint resumed ("" for none) */
    int64_t start, warmup, tokens_per_step;
    /* the meters of the training loop */
    double t_start, t_train, interval_loss, interval_norm, last_loss, val_loss;
    int interval_n, interval_steps;
} run_t;

/* trainer_state.json: the step, the data cursor, the loss scaler and what
 * must not change when resuming (the moments are written beside it). */
static whale_code write_trainer_state(run_t *r, const char *dir, whale_err *err) {
    char path[4400];
    whale_code c;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", (double)r->step);
    cJSON *cur = cJSON_AddObjectToObject(j, "data_cursor");
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)r->cursor.seed);
    cJSON_AddStringToObject(cur, "seed", seed); /* 64-bit: not exact as a JSON number */
    cJSON_AddNumberToObject(cur, "epoch", (double)r->cursor.epoch);
    cJSON_AddNumberToObject(cur, "index", (double)r->cursor.index);
    cJSON_AddNumberToObject(cur, "windows", (double)r->cursor.windows);
    if (r->o->dtype == WHALE_F16) {
        cJSON *sc = cJSON_AddObjectToObject(j, "loss_scaler");
        cJSON_AddNumberToObject(sc, "scale", r->scaler.scale);
        cJSON_AddNumberToObject(sc, "clean_steps", r->scaler.clean_steps);
        cJSON_AddNumberToObject(sc, "skipped", (double)r->scaler.skipped);
    }
    /* what must not change when resuming */
    const whale_train_opts *o = r->o;
    cJSON *run = cJSON_AddObjectToObject(j, "run");
    cJSON_AddStringToObject(run, "init", o->init);
    snprintf(seed, sizeof seed, "%016llx", (unsigned long long)whale_dataset_fingerprint(r->train));
    cJSON_AddStringToObject(run, "data_fingerprint", seed);
    cJSON_AddNumberToObject(run, "data_tokens", (double)whale_dataset_tokens(r->train));
    cJSON_AddNumberToObject(run, "seq_len", o->seq_len);
    cJSON_AddNumberToObject(run, "batch_size", o->batch_size);
    cJSON_AddNumberToObject(run, "grad_accum", o->grad_accum);
    cJSON_AddBoolToObject(run, "cross_doc_attention", o->cross_doc_attention);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    c = text ? whale_write_file_atomic(path, text, strlen(text), err) : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    free(text);
    return c;
}

/* checkpoint-STEP: written as checkpoint-STEP.tmp, every file fsynced, then
 * renamed; an interrupted save leaves the previous checkpoints intact. Every
 * rank calls it: with --zero 1 the moments (and in mixed precision the
 * masters) are gathered from the ranks first; rank 0 writes the files. */
static whale_code save_checkpoint(run_t *r, whale_err *err) {
    char dir[4096], tmp[4200], path[4400];
    snprintf(dir, sizeof dir, "%s/checkpoint-%lld", r->o->out, (long long)r->step);
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    whale_code c = WHALE_OK;
    if (r->leader) {
        whale_remove_flat_dir(tmp);
        c = whale_mkdir(tmp, err);
    }
    if (!c) c = whale_step_save_moments(r->leader ? path : NULL, r->m, r->opt, r->sum, r->zero, r->step, err);
    if (!c) c = whale_step_save_model(r->leader ? tmp : NULL, r->m, r->sum, r->zero, r->step, err);
    if (!r->leader) return c;
    if (c || (c = write_trainer_state(r, tmp, err)) ||
        (c = copy_tokenizer_files(r->tokenizer_dir, tmp, err))) {
        whale_remove_flat_dir(tmp);
        return c;
    }
    if ((c = whale_publish_dir(tmp, dir, r->o->out, err))) return c;
    if (r->metrics) fprintf(r->metrics, "{\"event\": \"checkpoint\", \"step\": %lld}\n", (long long)r->step);
    whale_prune_checkpoints(r->o->out, r->o->save_total_limit);
    return WHALE_OK;
}

static const char *json_str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double json_num(const cJSON *o, const char *k, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* Restore moments, step and data cursor; refuse a checkpoint of another run. */
static whale_code load_trainer_state(run_t *r, const char *dir, whale_err *err) {
    char path[4096];
    cJSON *j;
    whale_code c = whale_path_join(path, sizeof path, dir, "trainer_state.json", err);
    if (!c) c = whale_read_json_object(path, &j, err);
    if (c) return c;
    const cJSON *cur = cJSON_GetObjectItemCaseSensitive(j, "data_cursor"), *run = cJSON_GetObjectItemCaseSensitive(j, "run");
    if (!cJSON_IsObject(cur) || !cJSON_IsObject(run) || !json_str(cur, "seed")) {
        cJSON_Delete(j);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: not a trainer state (missing data_cursor/run)", path);
    }
    const whale_train_opts *o = r->o;
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)whale_dataset_fingerprint(r->train));
    const char *init = json_str(run, "init"), *dfp = json_str(run, "data_fingerprint");
    const char *what = NULL;
    char detail[256] = "";
    if (!init || strcmp(init, o->init)) what = "--init", snprintf(detail, sizeof detail, "%s", init ? init : "?");
    else if (!dfp || strcmp(dfp, fp) || json_num(run, "data_tokens", -1) != (double)whale_dataset_tokens(r->train))
        what = "--data", snprintf(detail, sizeof detail, "other data (tokenizer fingerprint %s)", dfp ? dfp : "?");
    else if (json_num(run, "seq_len", -1) != o->seq_len)
        what = "--seq-len", snprintf(detail, sizeof detail, "%g", json_num(run, "seq_len", -1));
    else if (json_num(run, "batch_size", -1) != o->batch_size)
        what = "--batch-size", snprintf(detail, sizeof detail, "%g", json_num(run, "batch_size", -1));
    else if (json_num(run, "grad_accum", -1) != o->grad_accum)
        what = "--grad-accum", snprintf(detail, sizeof detail, "%g", json_num(run, "grad_accum", -1));
    else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(run, "cross_doc_attention")) != !!o->cross_doc_attention)
        what = "--cross-doc-attention", snprintf(detail, sizeof detail, "the other setting");
    if (what) {
        cJSON_Delete(j);
        return whale_errf(err, WHALE_ERR_ARG, "%s: the checkpoint was trained with %s %s; resume with the same settings",
                          dir, what, detail);
    }
    r->step = (int64_t)json_num(j, "step", 0);
    r->cursor.seed = strtoull(json_str(cur, "seed"), NULL, 10);
    r->cursor.epoch = (int64_t)json_num(cur, "epoch", 0);
    r->cursor.index = (int64_t)json_num(cur, "index", 0);
    r->cursor.windows = (int64_t)json_num(cur, "windows", 0);
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(j, "loss_scaler");
    if (cJSON_IsObject(sc)) {
        r->scaler.scale = json_num(sc, "scale", r->scaler.scale);
        r->scaler.clean_steps = (int)json_num(sc, "clean_steps", 0);
        r->scaler.skipped = (int64_t)json_num(sc, "skipped", 0);
    }
    cJSON_Delete(j);

    if (!(c = whale_path_join(path, sizeof path, dir, "optimizer.safetensors", err)))
        c = whale_step_load_moments(path, r->m, r->opt, err);
    whale_optimizer_set_steps(r->opt, r->step);
    return c;
}

/* Keep the metrics of steps up to `step` (a resumed run rewrites the rest). */
static whale_code trim_metrics(const char *path, int64_t step, whale_err *err) {
    char *text;
    size_t n;
    if (access(path, F_OK) != 0) return WHALE_OK;
    whale_code c = whale_read_file(path, &text, &n, err);
    if (c) return c;
    char *out = malloc(n + 1), *line = text;
    size_t o = 0;
    while (out && line < text + n) {
        char *nl = memchr(line, '\n', (size_t)(text + n - line));
        size_t len = nl ? (size_t)(nl - line + 1) : (size_t)(text + n - line);
        cJSON *j = cJSON_ParseWithLength(line, len);
        double s = json_num(j, "step", -1);
        cJSON_Delete(j);
        if (s <= (double)step) {
            memcpy(out + o, line, len);
            o += len;
        }
        line += len;
    }
    c = out ? whale_write_file_atomic(path, out, o, err) : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    free(out);
    free(text);
    return c;
}

/* ------------------------------------------------------------ evaluation */

/* The mean loss over the first max_windows windows of d (all when ≤ 0), B
 * at a time: on several ranks batch j runs on rank j % N and the losses are
 * added in batch order, the sum of one process. */
static whale_code eval_loss(whale_session *s, whale_dataset *d, int B, int S, int64_t max_windows, double *loss,
                            int64_t *tokens, whale_err *err) {
    int64_t nw = whale_dataset_num_windows(d, S);
    if (max_windows > 0 && max_windows < nw) nw = max_windows;
    int N = whale_dist_size();
    int64_t n_batches = (nw + B - 1) / B;
    if (n_batches > INT_MAX / 2) return whale_errf(err, WHALE_ERR_RANGE, "%lld evaluation batches: too many", (long long)n_batches);
    whale_batch b;
    double *mine = calloc((size_t)(n_batches / N + 1) * 2, sizeof(double)), sum[2];
    whale_code c = mine ? whale_batch_alloc(B, S, &b, err) : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if (c) {
        free(mine);
        return c;
    }
    for (int64_t j = whale_dist_rank(); j < n_batches && !c; j += N) {
        int64_t w0 = j * B;
        int nb = (int)(nw - w0 < B ? nw - w0 : B);
        for (int i = 0; i < nb && !c; i++)
            c = whale_dataset_window(d, w0 + i, S, b.ids + (size_t)i * S, b.labels + (size_t)i * S,
                                     b.pos + (size_t)i * S, b.seg + (size_t)i * S, err);
        double l;
        int64_t cn;
        if (!c) c = whale_session_train_step(s, b.ids, b.labels, b.pos, b.seg, nb, S, 0.0, &l, &cn, err);
        if (!c && cn) mine[2 * (j / N)] = l * (double)cn, mine[2 * (j / N) + 1] = (double)cn;
    }
    whale_batch_free(&b);
    if (!c) c = whale_step_sum_dealt(mine, (int)n_batches, 2, sum, err);
    free(mine);
    if (c) return c;
    *loss = sum[1] > 0 ? sum[0] / sum[1] : NAN;
    *tokens = (int64_t)sum[1];
    return WHALE_OK;
}

whale_code whale_eval_dataset(whale_model *m, const char *data_dir, const char *split, int seq_len,
                              int64_t max_windows, int batch, int cross_doc, double *loss, int64_t *tokens,
                              whale_err *err) {
    whale_dataset *d;
    whale_code c = whale_dataset_open(data_dir, split, &d, err);
    if (c) return c;
    whale_session *s = NULL;
    whale_dataset_set_cross_doc(d, cross_doc);
    if (!(c = whale_dataset_check(d, whale_model_vocab_size(m), NULL, err))) {
        if (whale_dataset_num_windows(d, seq_len) < 1)
            c = whale_errf(err, WHALE_ERR_ARG, "%s: the %s split has fewer than %d tokens", data_dir, split, seq_len);
        else if (!(c = whale_train_session_new(m, batch, seq_len, 0, &s, err)))
            c = eval_loss(s, d, batch, seq_len, max_windows, loss, tokens, err);
    }
    whale_session_free(s);
    whale_dataset_free(d);
    return c;
}

/* ------------------------------------------------------------ the loop */

/* "; 2 ranks × 1 micro-batch" for the start line of a run on several ranks. */
static const char *dist_note(int grad_accum, int zero) {
    static char note[128];
    int N = whale_dist_size();
    if (N == 1) return "";
    snprintf(note, sizeof note, "; %d ranks × %d micro-batch%s%s", N, grad_accum / N, grad_accum / N > 1 ? "es" : "",
             zero ? ", optimizer state sharded (--zero 1)" : "");
    return note;
}

/* Validation loss (every rank takes a share) into the metrics (and on
 * stderr) on rank 0. */
static whale_code log_eval(run_t *r, double *val, whale_err *err) {
    const whale_train_opts *o = r->o;
    int64_t n;
    whale_code c = eval_loss(r->s, r->val, o->batch_size, o->seq_len, o->eval_batches * o->batch_size, val, &n, err);
    if (c || !r->metrics) return c;
    fprintf(r->metrics, "{\"step\": %lld, \"val_loss\": %.6f, \"val_ppl\": %.4f, \"val_tokens\": %lld}\n",
            (long long)r->step, *val, exp(*val), (long long)n);
    fflush(r->metrics);
    if (!o->quiet)
        fprintf(stderr, "step %6lld/%lld  validation loss %.4f  perplexity %.2f  (%lld tokens)\n", (long long)r->step,
                (long long)o->max_steps, *val, exp(*val), (long long)n);
    return WHALE_OK;
}

static whale_code setup_model(run_t *r, const char *resume_dir, whale_err *err) {
    const whale_train_opts *o = r->o;
    if (resume_dir) return whale_model_load(resume_dir, &r->m, err);
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", o->init);
    if (whale_is_dir(o->init) && access(cfg, R_OK) == 0) return whale_model_load(o->init, &r->m, err);
    /* a preset or config file: the vocabulary comes from the data */
    char overrides[128];
    snprintf(overrides, sizeof overrides, "{\"vocab_size\": %d, \"eos_token_id\": %d}", whale_dataset_vocab(r->train),
             whale_dataset_eos(r->train) >= 0 ? whale_dataset_eos(r->train) : 1);
    return whale_model_init_config(o->init, overrides, o->seed, &r->m, err);
}

/* The options that cannot run, and an output folder that cannot be
 * written (now, not after loading). */
static whale_code check_run(const run_t *r, whale_err *err) {
    const whale_train_opts *o = r->o;
    if (o->batch_size < 1 || o->grad_accum < 1 || o->seq_len < 2 || o->max_steps < 1)
        return whale_errf(err, WHALE_ERR_ARG, "--batch-size, --grad-accum, --max-steps must be >= 1 and --seq-len >= 2");
    if (!(o->lr > 0)) return whale_errf(err, WHALE_ERR_ARG, "--lr must be > 0");
    if (o->grad_accum % whale_dist_size())
        return whale_errf(err, WHALE_ERR_ARG,
                          "--grad-accum %d is not a multiple of the %d ranks: each rank takes grad-accum / ranks of "
                          "every step's micro-batches",
                          o->grad_accum, whale_dist_size());
    if (!r->leader) return WHALE_OK;
    char path[4200];
    whale_code c = whale_mkdir(o->out, err);
    if (c) return c;
    snprintf(path, sizeof path, "%s/.write-test", o->out);
    if ((c = whale_write_file_atomic(path, "", 0, err))) return c;
    unlink(path);
    return WHALE_OK;
}

/* The train split, the val split when it holds a window, and the
 * checkpoint to resume ("latest": the last in the output folder). */
static whale_code open_data(run_t *r, whale_err *err) {
    const whale_train_opts *o = r->o;
    whale_code c = whale_dataset_open(o->data, "train", &r->train, err);
    if (c) return c;
    whale_dataset_set_cross_doc(r->train, o->cross_doc_attention);
    if (whale_dataset_num_windows(r->train, o->seq_len) < o->batch_size)
        return whale_errf(err, WHALE_ERR_ARG, "%s: %lld training tokens make fewer than --batch-size %d windows of %d",
                          o->data, (long long)whale_dataset_tokens(r->train), o->batch_size, o->seq_len);
    if (whale_dataset_open(o->data, "val", &r->val, err) == WHALE_OK) {
        whale_dataset_set_cross_doc(r->val, o->cross_doc_attention);
        if (whale_dataset_num_windows(r->val, o->seq_len) < 1) { /* too small to evaluate */
            whale_dataset_free(r->val);
            r->val = NULL;
        }
    }
    if (!o->resume) return WHALE_OK;
    if (strcmp(o->resume, "latest")) {
        snprintf(r->resume_dir, sizeof r->resume_dir, "%s", o->resume);
        return WHALE_OK;
    }
    int64_t *steps;
    int n = whale_list_checkpoints(o->out, &steps);
    if (n) snprintf(r->resume_dir, sizeof r->resume_dir, "%s/checkpoint-%lld", o->out, (long long)steps[n - 1]);
    free(steps);
    return n ? WHALE_OK
             : whale_errf(err, WHALE_ERR_IO, "%s: --resume latest: no checkpoint-N folder to resume from", o->out);
}

/* The model (from the checkpoint resumed, a model folder, or a preset sized
 * by the data) in the run's precision, and the tokenizer it carries along. */
static whale_code load_model(run_t *r, whale_err *err) {
    const whale_train_opts *o = r->o;
    const char *resume_dir = r->resume_dir[0] ? r->resume_dir : NULL;
    whale_code c = setup_model(r, resume_dir, err);
    if (c) return c;
    const char *tok = o->tokenizer ? o->tokenizer : resume_dir ? resume_dir : whale_is_dir(o->init) ? o->init : NULL;
    char tok_json[4200];
    snprintf(tok_json, sizeof tok_json, "%s/tokenizer.json", tok ? tok : "");
    r->tokenizer_dir = tok && access(tok_json, R_OK) == 0 ? strdup(tok) : NULL;
    if ((c = whale_dataset_check(r->train, whale_model_vocab_size(r->m), r->tokenizer_dir, err))) return c;
    if (o->seq_len > whale_model_max_positions(r->m))
        return whale_errf(err, WHALE_ERR_RANGE, "--seq-len %d exceeds the model's max_position_embeddings %d",
                          o->seq_len, whale_model_max_positions(r->m));
    if (o->weights != WHALE_WEIGHTS_F32 && o->dtype != WHALE_BF16)
        return whale_errf(err, WHALE_ERR_ARG, "pure bf16 weights need --dtype bf16");
    return whale_model_set_dtype(r->m, o->dtype, err);
}

/* The session, the optimizer (pure bf16 starts from bf16 weights), the
 * gradient sum, the state resumed and the micro-batches. */
static whale_code build_training(run_t *r, whale_err *err) {
    const whale_train_opts *o = r->o;
    whale_adamw_config ac = {.beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps, .weight_decay = o->weight_decay,
                             .weight_rounding = o->weights, .seed = o->seed};
    whale_loss_scaler_init(&r->scaler);
    if (o->loss_scale > 0) r->scaler.scale = o->loss_scale;
    if (o->loss_scale_interval > 0) r->scaler.growth_interval = o->loss_scale_interval;
    whale_code c;
    if ((c = whale_train_session_new(r->m, o->batch_size, o->seq_len, o->recompute, &r->s, err)) ||
        (c = whale_adamw_new(r->m, &ac, &r->opt, err)))
        return c;
    if (o->weights != WHALE_WEIGHTS_F32) {
        for (int i = 0; i < whale_model_num_params(r->m); i++) {
            whale_tensor t = whale_model_param(r->m, i);
            if (t.dtype == WHALE_F32) whale_round_bf16_inplace(t.data, (size_t)whale_shape_numel(t.ndim, t.shape));
        }
        whale_model_refresh_copies(r->m);
    }
    if (o->nan_check) {
        if (!(r->nan = whale_diag_new(1))) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        if ((c = whale_diag_set_model(r->nan, r->m, err))) return c;
        whale_session_set_trace(r->s, whale_diag_trace, r->nan);
    }
    r->cursor.seed = o->seed;
    if ((c = o->zero ? whale_zero_new(r->s, r->opt, o->grad_accum, &r->sum, &r->zero, err)
                     : whale_step_sum_new(r->s, o->grad_accum, &r->sum, err)) ||
        (c = whale_step_sum_buckets(r->sum, o->bucket_mb, err)) ||
        (r->resume_dir[0] && (c = load_trainer_state(r, r->resume_dir, err))) ||
        (c = whale_step_check_start(r->s, r->opt, &r->cursor, r->step, err)))
        return c;
    whale_zero_drop_masters(r->zero, r->s);
    if (!(r->micro = calloc((size_t)o->grad_accum, sizeof *r->micro)))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < o->grad_accum; i++)
        if ((c = whale_batch_alloc(o->batch_size, o->seq_len, &r->micro[i], err))) return c;
    return WHALE_OK;
}

/* metrics.jsonl (cut back to the step resumed), and the run's start lines. */
static whale_code open_metrics(run_t *r, whale_err *err) {
    const whale_train_opts *o = r->o;
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->out);
    whale_code c;
    if (r->leader && (c = trim_metrics(path, r->resume_dir[0] ? r->step : -1, err))) return c;
    if (r->leader && !(r->metrics = fopen(path, "a")))
        return whale_errf(err, WHALE_ERR_IO, "%s: cannot open for appending: %s", path, strerror(errno));
    r->warmup = o->warmup_steps >= 0 ? o->warmup_steps : (int64_t)ceil(o->warmup_ratio * (double)o->max_steps);
    r->tokens_per_step = (int64_t)o->batch_size * o->seq_len * o->grad_accum, r->start = r->step;
    if (o->quiet) return WHALE_OK;
    whale_memory mm;
    whale_step_memory(r->m, r->s, r->opt, r->sum, r->zero, &mm);
    fprintf(stderr, "train: ");
    whale_memory_print(&mm, stderr);
    fprintf(stderr,
            "train: %lld parameters; %lld tokens per step (%d × %d × %d); %lld steps from %lld; "
            "data %lld train tokens (%lld windows)%s%s\n",
            (long long)whale_model_param_count(r->m), (long long)r->tokens_per_step, o->batch_size, o->seq_len,
            o->grad_accum, (long long)o->max_steps, (long long)r->start, (long long)whale_dataset_tokens(r->train),
            (long long)whale_dataset_num_windows(r->train, o->seq_len), r->resume_dir[0] ? "; resumed" : "",
            dist_note(o->grad_accum, r->zero != NULL));
    return WHALE_OK;
}

/* A logged step: one line of metrics.jsonl and the progress line; the
 * interval's meters start again. */
static whale_code log_step(run_t *r, double lr, double loss_scale, int take_step, whale_err *err) {
    const whale_train_opts *o = r->o;
    int fp16 = o->dtype == WHALE_F16;
    int64_t done = r->step - r->start;
    double tps = (double)done * r->tokens_per_step / r->t_train;
    char jl[32], jn[32];
    double eta = r->t_train / (double)done * (double)(o->max_steps - r->step);
    double mean_loss = r->interval_n ? r->interval_loss / r->interval_n : NAN;
    double mean_norm = r->interval_steps ? r->interval_norm / r->interval_steps : NAN;
    FILE *mf = r->metrics; /* NULL but on rank 0 */
    if (mf)
        fprintf(mf,
                "{\"step\": %lld, \"loss\": %s, \"lr\": %.6g, \"grad_norm\": %s, \"tokens\": %lld, "
                "\"tokens_per_s\": %.1f, \"elapsed_s\": %.2f, \"epoch\": %.4f",
                (long long)r->step, whale_json_double(jl, sizeof jl, "%.6f", mean_loss), lr,
                whale_json_double(jn, sizeof jn, "%.6g", mean_norm), (long long)(r->step * r->tokens_per_step), tps,
                whale_now() - r->t_start,
                r->cursor.epoch + (double)r->cursor.index / (double)(r->cursor.windows ? r->cursor.windows : 1));
    if (fp16 && mf)
        fprintf(mf, ", \"loss_scale\": %.0f, \"skipped_steps\": %lld, \"step_skipped\": %s", loss_scale,
                (long long)r->scaler.skipped, take_step ? "false" : "true");
    double rank_tokens = (double)done * r->tokens_per_step / whale_dist_size();
    whale_code c = whale_step_dist_metrics(mf, r->sum, rank_tokens, r->t_train, err);
    if (c) return c;
    if (mf) {
        fprintf(mf, "}\n");
        fflush(mf);
    }
    if (!o->quiet) {
        char e1[32], e2[32];
        whale_fmt_duration(e1, sizeof e1, whale_now() - r->t_start);
        whale_fmt_duration(e2, sizeof e2, eta);
        char sc[64] = "";
        if (fp16) snprintf(sc, sizeof sc, "  scale %.0f%s", r->scaler.scale, take_step ? "" : " (skipped)");
        fprintf(stderr, "step %6lld/%lld  loss %.4f  lr %.2e  grad-norm %.3f%s  %.0f tok/s  elapsed %s  ETA %s\n",
                (long long)r->step, (long long)o->max_steps, mean_loss, lr, mean_norm, sc, tps, e1, e2);
    }
    r->interval_loss = r->interval_norm = 0;
    r->interval_n = r->interval_steps = 0;
    return WHALE_OK;
}

/* The steps up to --max-steps: log, evaluate and save as asked. */
static whale_code train_steps(run_t *r, whale_err *err) {
    const whale_train_opts *o = r->o;
    int fp16 = o->dtype == WHALE_F16;
    whale_code c = WHALE_OK;
    r->t_start = whale_now();
    r->last_loss = r->val_loss = NAN;
    while (r->step < o->max_steps) {
        double t0 = whale_now();
        double lr = o->lr * whale_lr_multiplier(o->schedule, r->step, r->warmup, o->max_steps);
        for (int i = 0; i < o->grad_accum && !c; i++)
            c = whale_dataset_next_batch(r->train, &r->cursor, o->batch_size, o->seq_len, &r->micro[i], err);
        if (c) return c;
        double loss_scale = fp16 ? r->scaler.scale : 1.0;
        whale_step_result sr;
        if ((c = whale_train_one_step(r->s, r->opt, fp16 ? &r->scaler : NULL, r->nan, r->sum, r->zero, r->micro,
                                      o->grad_accum, o->hf_accum_compat, o->max_grad_norm, lr, r->step + 1, &sr, err)))
            return c;
        r->step++;
        r->t_train += whale_now() - t0;
        r->last_loss = sr.loss;
        if (isfinite(sr.loss)) r->interval_loss += sr.loss, r->interval_n++;
        if (sr.taken) r->interval_norm += sr.grad_norm, r->interval_steps++;
        int last = r->step == o->max_steps;
        if ((r->step % (o->log_every > 0 ? o->log_every : 1) == 0 || last || r->step == r->start + 1) &&
            (c = log_step(r, lr, loss_scale, sr.taken, err)))
            return c;
        if (r->val && ((o->eval_every > 0 && r->step % o->eval_every == 0) || last) && (c = log_eval(r, &r->val_loss, err)))
            return c;
        if ((o->save_every > 0 && r->step % o->save_every == 0) || last) {
            if ((c = save_checkpoint(r, err))) return c;
            if (r->metrics) fflush(r->metrics);
            if ((c = whale_dist_wait_leader("end of the checkpoint", r->step, err))) return c;
        }
    }
    return WHALE_OK;
}

static void free_run(run_t *r) {
    if (r->metrics) fclose(r->metrics);
    if (r->micro)
        for (int i = 0; i < r->o->grad_accum; i++) whale_batch_free(&r->micro[i]);
    free(r->micro);
    whale_grad_sum_free(r->sum);
    whale_zero_free(r->zero);
    free(r->tokenizer_dir);
    whale_optimizer_free(r->opt);
    whale_session_free(r->s);
    whale_diag_free(r->nan);
    whale_model_free(r->m);
    whale_dataset_free(r->train);
    whale_dataset_free(r->val);
}

whale_code whale_train_run(const whale_train_opts *o, whale_train_result *res, whale_err *err) {
    whale_train_opts quiet_opts;
    if (whale_dist_rank() != 0) { /* only rank 0 speaks */
        quiet_opts = *o;
        quiet_opts.quiet = 1;
        o = &quiet_opts;
    }
    run_t *r = calloc(1, sizeof *r);
    if (!r) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    r->o = o;
    r->leader = whale_dist_rank() == 0;
    whale_code c = check_run(r, err);
    if (c) {
        free(r);
        return c;
    }
    /* the final model in the run folder, like save_model(output_dir); with
     * --zero 1 in mixed precision every rank holds part of the masters */
    if (!(c = open_data(r, err)) && !(c = load_model(r, err)) && !(c = build_training(r, err)) &&
        !(c = open_metrics(r, err)) && !(c = train_steps(r, err)) &&
        !(c = whale_step_save_model(r->leader ? o->out : NULL, r->m, r->sum, r->zero, r->step, err)) && r->leader)
        c = copy_tokenizer_files(r->tokenizer_dir, o->out, err);
    if (!c && !o->quiet) fprintf(stderr, "train: peak resident memory %.1f MiB\n", whale_peak_rss() / 1048576.0);
    if (!c && res) {
        res->steps = r->step;
        res->last_loss = r->last_loss;
        res->val_loss = r->val_loss;
        res->seconds = whale_now() - r->t_start;
        res->tokens_per_s = r->t_train > 0 ? (double)(r->step - r->start) * r->tokens_per_step / r->t_train : 0;
    }
    free_run(r);
    free(r);
    return c;
}
