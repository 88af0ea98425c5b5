/* whale grad: the gradient of the mean loss for every parameter. */
#include "cli.h"

#include "whale_util.h"
#include "whale_safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char grad_help[] =
    "usage: whale grad -m DIR --ids FILE --out GRADS.safetensors [--threads N]\n"
    "  FILE: JSON array of equal-length arrays of token ids (labels = the ids, shifted).\n"
    "  writes the gradient of the mean loss for every parameter, F32, under its\n"
    "  Hugging Face name (zeros where no gradient flows: attn_sink, gate.bias);\n"
    "  prints {\"loss\": …, \"tokens\": …, \"grad_norm\": …}";

int cmd_grad(int argc, char **argv) {
    const char *dir = NULL, *ids_path = NULL, *out = NULL;
    long threads = 0;
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &dir, 0, 0, NULL},
        {"--ids", CLI_STR, &ids_path, 0, 0, NULL},
        {"--out", CLI_STR, &out, 0, 0, NULL},
        {"--threads", CLI_LONG, &threads, 1, 1024, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int parsed = cli_parse("grad", grad_help, argc, argv, table, NULL, NULL);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!dir || !ids_path || !out) return cli_usage("grad", "-m DIR, --ids FILE and --out FILE are required");
    whale_set_threads((int)threads);
    whale_err err;
    whale_model *m = NULL;
    whale_session *s = NULL;
    int32_t *ids = NULL;
    whale_st_item *items = NULL;
    int B, S, status = 0;
    if (whale_model_load(dir, &m, &err) || whale_read_ids_file(ids_path, whale_model_vocab_size(m), &ids, &B, &S, &err))
        goto fail;
    if (S < 2) {
        whale_errf(&err, WHALE_ERR_ARG, "%s: sequences need at least 2 ids to have a target", ids_path);
        goto fail;
    }
    double loss;
    int64_t count;
    if (whale_train_session_new(m, B, S, 0, &s, &err) ||
        whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &count, &err))
        goto fail;
    int n = whale_model_num_params(m);
    items = calloc((size_t)n, sizeof *items);
    whale_tensor *shapes = calloc((size_t)n, sizeof *shapes);
    if (!items || !shapes) {
        free(shapes);
        whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        shapes[i] = whale_model_param(m, i);
        items[i] = (whale_st_item){whale_model_param_name(m, i), WHALE_F32, shapes[i].ndim, shapes[i].shape,
                                   whale_session_grad(s, i)};
    }
    whale_code c = whale_st_write(out, items, n, NULL, &err);
    free(shapes);
    if (c) goto fail;
    printf("{\"loss\": %.9g, \"tokens\": %lld, \"grad_norm\": %.9g}\n", loss, (long long)count, whale_grad_norm(s));
    goto out;
fail:
    status = cli_fail(&err);
out:
    free(items);
    free(ids);
    whale_session_free(s);
    whale_model_free(m);
    return status;
}

/* ------------------------------------------------------------------ train */

#include "whale_train.h"

static const char train_help[] =
    "usage: whale train --init PRESET|CONFIG.json|MODEL_DIR --data DATA_DIR --out RUN_DIR [options]\n"
    "  --max-steps N (1000)        --batch-size B (8)     --grad-accum N (1)    --seq-len T (256)\n"
    "  --lr LR (3e-4)              --lr-scheduler constant|linear|cosine (cosine)\n"
    "  --warmup-ratio R (0.03)     --warmup-steps N       --weight-decay W (0.1)\n"
    "  --adam-beta1 B (0.9)        --adam-beta2 B (0.95)  --adam-epsilon E (1e-8)\n"
    "  --max-grad-norm G (1.0; 0 = no clipping)\n"
    "  --eval-every N (0 = at the end)   --eval-batches N (0 = the whole validation split)\n"
    "  --save-every N (0 = at the end)   --save-total-limit N (0 = keep all)   --log-every N (10)\n"
    "  --seed S (42)   --tokenizer DIR   --resume latest|CHECKPOINT_DIR   --threads N\n"
    "  --cross-doc-attention   attend across packed documents (the original run's packing)\n"
    "  --hf-accum-compat       sum micro-batch mean losses like HF Trainer did for this model\n"
    "  --recompute             recompute each layer's activations in the backward pass (less memory)\n"
    "  --dtype fp32|bf16|fp16  precision of the weight products (fp32 master weights, gradients, moments)\n"
    "  --pure-bf16 nearest|stochastic  store the weights themselves in bf16 (no fp32 master)\n"
    "  --loss-scale S (65536)  --loss-scale-interval N (2000)   fp16 dynamic loss scaling\n"
    "  --nan-check             stop at the first NaN/inf in any forward or backward tensor, naming it\n"
    "  --zero 0|1 (0)          on several ranks (mpirun): 1 shards the AdamW moments over them, and\n"
    "                          in bf16/fp16 the fp32 master weights (ZeRO-1)\n"
    "  --bucket-mb M (0)       on several ranks: send the gradients in buckets of M MiB while the\n"
    "                          backward pass runs; 0 = in one exchange after it (same results)\n"
    "  --quiet\n"
    "writes RUN_DIR/metrics.jsonl, RUN_DIR/checkpoint-STEP/ and the final model into RUN_DIR";

/* --pure-bf16 and --lr-scheduler, by name; 0 or a usage status */
static int train_names(const char *pure, const char *sched, whale_train_opts *o) {
    if (pure && !strcmp(pure, "nearest")) o->weights = WHALE_WEIGHTS_BF16_NEAREST;
    else if (pure && !strcmp(pure, "stochastic")) o->weights = WHALE_WEIGHTS_BF16_STOCHASTIC;
    else if (pure) return cli_usage("train", "--pure-bf16 must be nearest or stochastic, got \"%s\"", pure);
    if (sched && !strcmp(sched, "constant")) o->schedule = WHALE_LR_CONSTANT;
    else if (sched && !strcmp(sched, "linear")) o->schedule = WHALE_LR_LINEAR;
    else if (sched && !strcmp(sched, "cosine")) o->schedule = WHALE_LR_COSINE;
    else if (sched) return cli_usage("train", "--lr-scheduler must be constant, linear or cosine, got \"%s\"", sched);
    if (o->dtype == WHALE_I8) return cli_usage("train", "int8 is an inference format; train in fp32, bf16 or fp16");
    return 0;
}

int cmd_train_model(int argc, char **argv) {
    whale_train_opts o = whale_train_defaults();
    const char *pure = NULL, *sched = NULL;
    long threads = 0, max_steps = o.max_steps, batch = o.batch_size, accum = o.grad_accum, seq = o.seq_len;
    long warmup = o.warmup_steps, eval_every = o.eval_every, eval_batches = o.eval_batches;
    long save_every = o.save_every, save_limit = o.save_total_limit, log_every = o.log_every, seed = (long)o.seed;
    long zero = o.zero, ls_interval = o.loss_scale_interval;
    const cli_opt table[] = {
        {"--init", CLI_STR, &o.init, 0, 0, NULL},
        {"--data", CLI_STR, &o.data, 0, 0, NULL},
        {"--out|--output-dir", CLI_STR, &o.out, 0, 0, NULL},
        {"--tokenizer", CLI_STR, &o.tokenizer, 0, 0, NULL},
        {"--resume", CLI_STR, &o.resume, 0, 0, NULL},
        {"--dtype", CLI_DTYPE, &o.dtype, 0, 0, NULL},
        {"--pure-bf16", CLI_STR, &pure, 0, 0, NULL},
        {"--lr-scheduler", CLI_STR, &sched, 0, 0, NULL},
        {"--max-steps", CLI_LONG, &max_steps, 1, (double)(1L << 40), NULL},
        {"--batch-size", CLI_LONG, &batch, 1, 65536, NULL},
        {"--grad-accum", CLI_LONG, &accum, 1, 65536, NULL},
        {"--seq-len", CLI_LONG, &seq, 2, 1 << 20, NULL},
        {"--warmup-steps", CLI_LONG, &warmup, 0, (double)(1L << 40), NULL},
        {"--eval-every", CLI_LONG, &eval_every, 0, (double)(1L << 40), NULL},
        {"--eval-batches", CLI_LONG, &eval_batches, 0, (double)(1L << 40), NULL},
        {"--save-every", CLI_LONG, &save_every, 0, (double)(1L << 40), NULL},
        {"--save-total-limit", CLI_LONG, &save_limit, 0, 1 << 20, NULL},
        {"--log-every", CLI_LONG, &log_every, 1, (double)(1L << 40), NULL},
        {"--seed", CLI_LONG, &seed, 0, 9.2e18, NULL},
        {"--threads", CLI_LONG, &threads, 1, 1024, NULL},
        {"--zero", CLI_LONG, &zero, 0, 1, NULL},
        {"--bucket-mb", CLI_DOUBLE, &o.bucket_mb, 0, 4096, NULL},
        {"--lr", CLI_DOUBLE, &o.lr, 1e-12, 10, NULL},
        {"--warmup-ratio", CLI_DOUBLE, &o.warmup_ratio, 0, 1, NULL},
        {"--weight-decay", CLI_DOUBLE, &o.weight_decay, 0, 10, NULL},
        {"--adam-beta1", CLI_DOUBLE, &o.beta1, 0, 0.999999, NULL},
        {"--adam-beta2", CLI_DOUBLE, &o.beta2, 0, 0.999999, NULL},
        {"--adam-epsilon", CLI_DOUBLE, &o.adam_eps, 1e-30, 1, NULL},
        {"--max-grad-norm", CLI_DOUBLE, &o.max_grad_norm, 0, 1e9, NULL},
        {"--loss-scale", CLI_DOUBLE, &o.loss_scale, 1e-30, 1e30, NULL},
        {"--loss-scale-interval", CLI_LONG, &ls_interval, 1, 1 << 30, NULL},
        {"--cross-doc-attention", CLI_FLAG, &o.cross_doc_attention, 0, 0, NULL},
        {"--hf-accum-compat", CLI_FLAG, &o.hf_accum_compat, 0, 0, NULL},
        {"--recompute", CLI_FLAG, &o.recompute, 0, 0, NULL},
        {"--nan-check", CLI_FLAG, &o.nan_check, 0, 0, NULL},
        {"--quiet", CLI_FLAG, &o.quiet, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int status = cli_parse("train", train_help, argc, argv, table, NULL, NULL);
    if (!status) status = train_names(pure, sched, &o);
    if (status) return status < 0 ? 0 : status;
    o.max_steps = max_steps, o.batch_size = (int)batch, o.grad_accum = (int)accum, o.seq_len = (int)seq;
    o.warmup_steps = warmup, o.eval_every = eval_every, o.eval_batches = eval_batches, o.save_every = save_every;
    o.save_total_limit = (int)save_limit, o.log_every = log_every, o.seed = (uint64_t)seed, o.zero = (int)zero;
    o.loss_scale_interval = (int)ls_interval;
    if (!o.init || !o.data || !o.out) return cli_usage("train", "--init, --data and --out are required");
    whale_set_threads((int)threads);
    whale_err err;
    whale_train_result res;
    if (whale_train_run(&o, &res, &err)) return cli_fail(&err);
    printf("{\"steps\": %lld, \"loss\": %.6f, \"val_loss\": %.6f, \"val_ppl\": %.4f, \"tokens_per_s\": %.1f, "
           "\"seconds\": %.1f}\n",
           (long long)res.steps, res.last_loss, res.val_loss, exp(res.val_loss), res.tokens_per_s, res.seconds);
    return 0;
}

/* Perplexity of a text file: tokenized with the model folder's tokenizer,
 * cut into consecutive windows of seq_len tokens (the last one shorter). */
static whale_code eval_text(whale_model *m, const char *dir, const char *path, int seq, double *loss,
                            int64_t *tokens, whale_err *err) {
    char *text = NULL;
    size_t n;
    whale_tokenizer *tok = NULL;
    whale_session *s = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int n_ids = 0, V = whale_model_vocab_size(m);
    whale_code c;
    if ((c = whale_read_file(path, &text, &n, err)) || (c = cli_load_tokenizer(dir, m, &tok, err)) ||
        (c = whale_tokenizer_encode(tok, text, n, 1, &ids, &n_ids, err)))
        goto done;
    if (n_ids < 2) {
        c = whale_errf(err, WHALE_ERR_ARG, "%s: the text has fewer than 2 tokens", path);
        goto done;
    }
    if (seq > whale_model_max_positions(m)) seq = whale_model_max_positions(m);
    logits = whale_alloc(sizeof(float) * (size_t)seq * V);
    if (!logits) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory for %d × %d logits", seq, V);
        goto done;
    }
    if ((c = whale_session_new(m, 1, seq, &s, err))) goto done;
    double total = 0;
    int64_t count = 0;
    for (int at = 0; at + 1 < n_ids; at += seq) {
        int len = n_ids - at < seq ? n_ids - at : seq;
        whale_session_reset(s);
        if ((c = whale_session_forward(s, ids + at, 1, len, logits, 1, err))) goto done;
        int64_t cn;
        double l = whale_cross_entropy(logits, ids + at, 1, len, V, &cn);
        if (cn) total += l * (double)cn, count += cn;
    }
    *loss = total / (double)count;
    *tokens = count;
done:
    free(text);
    free(ids);
    free(logits);
    whale_session_free(s);
    whale_tokenizer_free(tok);
    return c;
}

static const char eval_help[] =
    "usage: whale eval -m DIR (--data DATA_DIR [--split val|train] | --text FILE) [--seq-len T]\n"
    "                  [--batch-size B] [--max-windows N] [--cross-doc-attention] [--threads N]\n"
    "  prints {\"loss\": …, \"tokens\": …, \"ppl\": …} over the split's windows, or over a text\n"
    "  file tokenized with the model folder's tokenizer in consecutive windows of T tokens";

int cmd_eval(int argc, char **argv) {
    const char *dir = NULL, *data = NULL, *split = "val", *text = NULL;
    long seq = 256, threads = 0, batch = 4, max_windows = 0;
    int cross = 0;
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &dir, 0, 0, NULL},
        {"--data", CLI_STR, &data, 0, 0, NULL},
        {"--text", CLI_STR, &text, 0, 0, NULL},
        {"--split", CLI_STR, &split, 0, 0, NULL},
        {"--seq-len", CLI_LONG, &seq, 2, 1 << 20, NULL},
        {"--batch-size", CLI_LONG, &batch, 1, 4096, NULL},
        {"--max-windows", CLI_LONG, &max_windows, 0, (double)(1L << 40), NULL},
        {"--threads", CLI_LONG, &threads, 1, 1024, NULL},
        {"--cross-doc-attention", CLI_FLAG, &cross, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int parsed = cli_parse("eval", eval_help, argc, argv, table, NULL, NULL);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!dir || !data == !text) return cli_usage("eval", "-m DIR and one of --data DIR or --text FILE are required");
    if (strcmp(split, "val") && strcmp(split, "train")) return cli_usage("eval", "--split must be val or train");
    whale_set_threads((int)threads);
    whale_err err;
    whale_model *m;
    if (whale_model_load(dir, &m, &err) || whale_model_own_weights(m, &err)) {
        whale_model_free(m);
        return cli_fail(&err);
    }
    double loss;
    int64_t tokens;
    whale_code c = text ? eval_text(m, dir, text, (int)seq, &loss, &tokens, &err)
                        : whale_eval_dataset(m, data, split, (int)seq, max_windows, (int)batch, cross, &loss,
                                             &tokens, &err);
    whale_model_free(m);
    if (c) return cli_fail(&err);
    printf("{\"loss\": %.6f, \"tokens\": %lld, \"ppl\": %.4f}\n", loss, (long long)tokens, exp(loss));
    return 0;
}
