/* whale grad: the gradient of the mean loss for every parameter. */
#include "cli/cli.h"

#include "core/core.h"
#include "io/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_grad(int argc, char **argv) {
    const char *dir = NULL, *ids_path = NULL, *out = NULL;
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: whale grad -m DIR --ids FILE --out GRADS.safetensors [--threads N]\n"
                 "  FILE: JSON array of equal-length arrays of token ids (labels = the ids, shifted).\n"
                 "  writes the gradient of the mean loss for every parameter, F32, under its\n"
                 "  Hugging Face name (zeros where no gradient flows: attn_sink, gate.bias);\n"
                 "  prints {\"loss\": …, \"tokens\": …, \"grad_norm\": …}");
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("grad", "%s needs a value", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--ids")) ids_path = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--threads")) {
            if (cli_int("grad", a, v, 1, 1024, &threads)) return 2;
        } else return cli_usage("grad", "unknown option \"%s\"", a);
    }
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

int cmd_train_model(int argc, char **argv) {
    whale_train_opts o = whale_train_defaults();
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: whale train --init PRESET|CONFIG.json|MODEL_DIR --data DATA_DIR --out RUN_DIR [options]\n"
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
                 "  --zero 0|1 (0)          on several ranks (mpirun): 1 shards the AdamW moments over them (ZeRO-1)\n"
                 "  --quiet\n"
                 "writes RUN_DIR/metrics.jsonl, RUN_DIR/checkpoint-STEP/ and the final model into RUN_DIR");
            return 0;
        }
        if (!strcmp(a, "--cross-doc-attention")) {
            o.cross_doc_attention = 1;
            continue;
        }
        if (!strcmp(a, "--hf-accum-compat")) {
            o.hf_accum_compat = 1;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o.quiet = 1;
            continue;
        }
        if (!strcmp(a, "--recompute")) {
            o.recompute = 1;
            continue;
        }
        if (!strcmp(a, "--nan-check")) {
            o.nan_check = 1;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("train", "%s needs a value", a);
        long n = 0;
        double d = 0;
        int bad = 0;
#define INT_OPT(name, lo, hi, dst)                                                   \
    else if (!strcmp(a, name)) {                                                     \
        bad = cli_int("train", a, v, lo, hi, &n);                                    \
        dst = n;                                                                     \
    }
#define FLT_OPT(name, lo, hi, dst)                                                   \
    else if (!strcmp(a, name)) {                                                     \
        bad = cli_float("train", a, v, lo, hi, &d);                                  \
        dst = d;                                                                     \
    }
        if (!strcmp(a, "--init")) o.init = v;
        else if (!strcmp(a, "--data")) o.data = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "--output-dir")) o.out = v;
        else if (!strcmp(a, "--tokenizer")) o.tokenizer = v;
        else if (!strcmp(a, "--resume")) o.resume = v;
        else if (!strcmp(a, "--dtype")) {
            bad = cli_dtype("train", v, &o.dtype);
            if (!bad && o.dtype == WHALE_I8) return cli_usage("train", "int8 is an inference format; train in fp32, bf16 or fp16");
        } else if (!strcmp(a, "--pure-bf16")) {
            if (!strcmp(v, "nearest")) o.weights = WHALE_WEIGHTS_BF16_NEAREST;
            else if (!strcmp(v, "stochastic")) o.weights = WHALE_WEIGHTS_BF16_STOCHASTIC;
            else return cli_usage("train", "--pure-bf16 must be nearest or stochastic, got \"%s\"", v);
        }
        else if (!strcmp(a, "--lr-scheduler")) {
            if (!strcmp(v, "constant")) o.schedule = WHALE_LR_CONSTANT;
            else if (!strcmp(v, "linear")) o.schedule = WHALE_LR_LINEAR;
            else if (!strcmp(v, "cosine")) o.schedule = WHALE_LR_COSINE;
            else return cli_usage("train", "--lr-scheduler must be constant, linear or cosine, got \"%s\"", v);
        }
        INT_OPT("--max-steps", 1, 1L << 40, o.max_steps)
        INT_OPT("--batch-size", 1, 65536, o.batch_size)
        INT_OPT("--grad-accum", 1, 65536, o.grad_accum)
        INT_OPT("--seq-len", 2, 1 << 20, o.seq_len)
        INT_OPT("--warmup-steps", 0, 1L << 40, o.warmup_steps)
        INT_OPT("--eval-every", 0, 1L << 40, o.eval_every)
        INT_OPT("--eval-batches", 0, 1L << 40, o.eval_batches)
        INT_OPT("--save-every", 0, 1L << 40, o.save_every)
        INT_OPT("--save-total-limit", 0, 1 << 20, o.save_total_limit)
        INT_OPT("--log-every", 1, 1L << 40, o.log_every)
        INT_OPT("--seed", 0, 0x7fffffffffffffffL, o.seed)
        INT_OPT("--threads", 1, 1024, threads)
        INT_OPT("--zero", 0, 1, o.zero)
        FLT_OPT("--lr", 1e-12, 10, o.lr)
        FLT_OPT("--warmup-ratio", 0, 1, o.warmup_ratio)
        FLT_OPT("--weight-decay", 0, 10, o.weight_decay)
        FLT_OPT("--adam-beta1", 0, 0.999999, o.beta1)
        FLT_OPT("--adam-beta2", 0, 0.999999, o.beta2)
        FLT_OPT("--adam-epsilon", 1e-30, 1, o.adam_eps)
        FLT_OPT("--max-grad-norm", 0, 1e9, o.max_grad_norm)
        FLT_OPT("--loss-scale", 1e-30, 1e30, o.loss_scale)
        INT_OPT("--loss-scale-interval", 1, 1 << 30, o.loss_scale_interval)
        else return cli_usage("train", "unknown option \"%s\"", a);
#undef INT_OPT
#undef FLT_OPT
        if (bad) return bad;
    }
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

int cmd_eval(int argc, char **argv) {
    const char *dir = NULL, *data = NULL, *split = "val", *text = NULL;
    long seq = 256, threads = 0, batch = 4, cross = 0, max_windows = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: whale eval -m DIR (--data DATA_DIR [--split val|train] | --text FILE) [--seq-len T]\n"
                 "                  [--batch-size B] [--max-windows N] [--cross-doc-attention] [--threads N]\n"
                 "  prints {\"loss\": …, \"tokens\": …, \"ppl\": …} over the split's windows, or over a text\n"
                 "  file tokenized with the model folder's tokenizer in consecutive windows of T tokens");
            return 0;
        }
        if (!strcmp(a, "--cross-doc-attention")) {
            cross = 1;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("eval", "%s needs a value", a);
        int bad = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--split")) split = v;
        else if (!strcmp(a, "--seq-len")) bad = cli_int("eval", a, v, 2, 1 << 20, &seq);
        else if (!strcmp(a, "--batch-size")) bad = cli_int("eval", a, v, 1, 4096, &batch);
        else if (!strcmp(a, "--max-windows")) bad = cli_int("eval", a, v, 0, 1L << 40, &max_windows);
        else if (!strcmp(a, "--threads")) bad = cli_int("eval", a, v, 1, 1024, &threads);
        else return cli_usage("eval", "unknown option \"%s\"", a);
        if (bad) return bad;
    }
    if (!dir || !data == !text) return cli_usage("eval", "-m DIR and one of --data DIR or --text FILE are required");
    if (strcmp(split, "val") && strcmp(split, "train")) return cli_usage("eval", "--split must be val or train");
    whale_set_threads((int)threads);
    whale_err err;
    whale_model *m;
    if (whale_model_load(dir, &m, &err)) return cli_fail(&err);
    double loss;
    int64_t tokens;
    whale_code c = text ? eval_text(m, dir, text, (int)seq, &loss, &tokens, &err)
                        : whale_eval_dataset(m, data, split, (int)seq, max_windows, (int)batch, (int)cross, &loss,
                                             &tokens, &err);
    whale_model_free(m);
    if (c) return cli_fail(&err);
    printf("{\"loss\": %.6f, \"tokens\": %lld, \"ppl\": %.4f}\n", loss, (long long)tokens, exp(loss));
    return 0;
}
