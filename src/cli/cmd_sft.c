/* whale sft: supervised fine-tuning (LoRA or full) on chat data, with
 * ms-swift's option names (dashes or underscores) and run layout. */
#include "cli/cli.h"

#include "train/sft_select.h"
#include "whale_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char sft_usage[] =
    "usage: whale sft -m BASE_DIR --data FILE.jsonl... [options]\n"
    "  --train-type lora|full (lora; alias --tuner-type)   --dtype fp32|bf16|fp16|int8 (the checkpoint's torch_dtype;\n"
    "      alias --torch-dtype;"
    " int8: LoRA on a frozen int8 base)\n"
    "  --lora-rank R (8)  --lora-alpha A (32)  --lora-dropout P (0.05)  --use-rslora [true|false]\n"
    "  --target-modules all-linear|NAME... (all-linear: every Linear but lm_head)\n"
    "  --lr LR (1e-4 LoRA, 1e-5 full; alias --learning-rate)  --lr-scheduler constant|linear|cosine (cosine)\n"
    "  --epochs N (3; alias --num-train-epochs)  --max-steps N (overrides epochs)\n"
    "  --batch-size B (1; alias --per-device-train-batch-size)  --grad-accum N (a total batch of 16 rows;\n"
    "      alias --gradient-accumulation-steps)\n"
    "  --max-length N (no limit)  --truncation-strategy delete|left|right (delete)  --packing\n"
    "  --loss-scope assistant|all (assistant)   --bad-records skip|error (skip, as ms-swift; --strict: error)\n"
    "  --model-name ZH [EN]  --model-author ZH [EN]   fill {{NAME}} / {{AUTHOR}} of self-cognition records\n"
    "  --system TEXT   system prompt for records without one (default: the chat template's)\n"
    "  --chat-template deepseek|chatml|raw|FILE.jinja (default: the model folder's own)\n"
    "  --warmup-ratio R (0)  --weight-decay W (0.1)  --max-grad-norm G (1)  --seed S (42)\n"
    "  --save-steps N (500)  --save-total-limit N (keep all; never the best)  --logging-steps N (5)\n"
    "  --val-dataset FILE...  --split-dataset-ratio R (0): validation files, or a held-out share of each file\n"
    "  --eval-steps N (--save-steps): eval_loss and eval_token_acc; the best checkpoint in trainer_state.json\n"
    "  --save-only-model: checkpoints without optimizer state (cannot be resumed)\n"
    "  --gradient-checkpointing (alias --recompute)  --nan-check  --memory-limit GIB  --threads N  --quiet\n"
    "  --zero 0|1 (0): on several ranks (mpirun), 1 shards the AdamW moments over them, and\n"
    "      in bf16/fp16 the fp32 master weights (ZeRO stage 1)\n"
    "  booleans are flags or take true|false|1|0; FILE#N draws N samples of FILE (seeded, as ms-swift)\n"
    "  --out DIR (output; alias --output-dir)   --dry-run [N]: show N samples (3) with the trained text in [[ ]]\n"
    "  --resume CKPT (alias --resume-from-checkpoint): continue a run from its checkpoint, same settings,\n"
    "      into a new run folder (the steps after it are those the run would have taken)\n"
    "writes DIR/vN-YYYYMMDD-HHMMSS/{args.json,logging.jsonl,checkpoint-STEP/}; prints a JSON summary";

/* "--lora_rank" → "--lora-rank": ms-swift's spelling is accepted too. */
static void canonical_option(const char *a, char *out, size_t cap) {
    snprintf(out, cap, "%s", a);
    for (char *p = out + 2; *p; p++)
        if (*p == '_') *p = '-';
}

/* The values after option i up to the next option (at least one). */
static int multi_values(int argc, char **argv, int *i, const char **vals, int cap) {
    int n = 0;
    while (*i + 1 < argc && (argv[*i + 1][0] != '-' || !argv[*i + 1][1]) && n < cap)
        vals[n++] = argv[++*i];
    return n;
}

/* Print a sample's text with the trained bytes inside [[ ]]. */
static whale_code show_sample(whale_sft_dataset *ds, int64_t i, whale_err *err) {
    char *text;
    size_t len;
    uint8_t *mask;
    whale_code c = whale_sft_sample_text(ds, i, &text, &len, &mask, err);
    if (c) return c;
    whale_sft_sample smp;
    if ((c = whale_sft_dataset_sample(ds, i, &smp, err))) {
        free(text);
        free(mask);
        return c;
    }
    int trained = 0;
    for (int k = 0; k < smp.n; k++) trained += smp.train[k];
    printf("--- sample %lld (%s:%lld): %d tokens, %d trained%s\n", (long long)i, smp.file, (long long)smp.line, smp.n,
           trained, smp.truncated ? ", truncated" : "");
    int in = 0;
    for (size_t k = 0; k < len; k++) {
        if (mask[k] != in) fputs((in = mask[k]) ? "[[" : "]]", stdout);
        putchar(text[k]);
    }
    if (in) fputs("]]", stdout);
    putchar('\n');
    fputs("input_ids: [", stdout); /* as ms-swift's [INPUT_IDS] */
    for (int k = 0; k < smp.n; k++) printf("%s%d", k ? ", " : "", (int)smp.ids[k]);
    puts("]");
    free(text);
    free(mask);
    return WHALE_OK;
}

static int dry_run(const whale_sft_run_opts *o, long n_show) {
    whale_err err;
    whale_tokenizer *tok = NULL;
    whale_sft_dataset *ds = NULL, *val = NULL;
    whale_chat_template *tpl = NULL;
    int status = 0;
    if (whale_tokenizer_load(o->model, &tok, &err) || whale_chat_template_load(o->model, o->chat_template, &tpl, &err))
        goto fail;
    if (whale_chat_template_notice(tpl)) fprintf(stderr, "sft: %s\n", whale_chat_template_notice(tpl));
    if (whale_sft_open_data(o->data, o->n_data, tok, tpl, &o->data_opts, o->n_val_data ? 0 : o->split_ratio, o->seed,
                            &ds, &val, &err))
        goto fail;
    whale_sft_stats st;
    whale_sft_dataset_stats(ds, &st);
    for (int64_t i = 0; i < n_show && i < st.samples; i++)
        if (show_sample(ds, i, &err)) goto fail;
    printf("{\"template\": \"%s\", \"records\": %lld, \"samples\": %lld, \"skipped\": %lld, \"deleted\": %lld, "
           "\"truncated\": %lld, \"untrained\": %lld, \"tokens\": %lld, \"trained_tokens\": %lld, \"longest\": %d",
           whale_chat_template_name(tpl), (long long)st.records, (long long)st.samples, (long long)st.skipped,
           (long long)st.deleted, (long long)st.truncated, (long long)st.untrained, (long long)st.tokens,
           (long long)st.trained_tokens, st.max_sample_tokens);
    if (val) printf(", \"validation_samples\": %lld", (long long)whale_sft_dataset_num_samples(val));
    printf("}\n");
    if (st.skipped)
        fprintf(stderr, "sft: skipped %lld bad record%s (--bad-records error to stop at the first); the first: %s\n",
                (long long)st.skipped, st.skipped == 1 ? "" : "s", st.first_bad);
    goto out;
fail:
    status = cli_fail(&err);
out:
    whale_sft_dataset_free(ds);
    whale_sft_dataset_free(val);
    whale_chat_template_free(tpl);
    whale_tokenizer_free(tok);
    return status;
}

int cmd_sft(int argc, char **argv) {
    whale_sft_run_opts o = whale_sft_run_defaults();
    o.data_opts.bad_records = WHALE_SFT_BAD_SKIP; /* ms-swift drops malformed rows unless --strict */
    int strict = -1;
    o.dtype = CLI_DTYPE_AUTO; /* the checkpoint's, as ms-swift's torch_dtype */
    o.out = "output";
    const char *data[256], *val[64], *names[2] = {0}, *authors[2] = {0}, *targets[64];
    char target_list[2048] = "";
    long threads = 0, n_show = -1, eval_batch = 0, workers = -1;
    int n_data = 0, n_val = 0;
    char cmdline[8192];
    cli_command_line(argc, argv, cmdline, sizeof cmdline); /* recorded in args.json */
    o.command_line = cmdline;
    for (int i = 1; i < argc; i++) {
        char a[64];
        const char *v;
        canonical_option(argv[i], a, sizeof a);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts(sft_usage);
            return 0;
        }
        int bad = 0;
        long n = 0;
        double d = 0;
        /* booleans (a flag, or followed by true/false/1/0) and options with several values */
        if (cli_bool_option(argc, argv, &i, "--packing", &o.data_opts.packing) ||
            cli_bool_option(argc, argv, &i, "--gradient-checkpointing", &o.recompute) ||
            cli_bool_option(argc, argv, &i, "--recompute", &o.recompute) ||
            cli_bool_option(argc, argv, &i, "--nan-check", &o.nan_check) ||
            cli_bool_option(argc, argv, &i, "--quiet", &o.quiet) ||
            cli_bool_option(argc, argv, &i, "--use-rslora", &o.lora.use_rslora) ||
            cli_bool_option(argc, argv, &i, "--save-only-model", &o.save_only_model))
            continue;
        if (cli_bool_option(argc, argv, &i, "--strict", &strict)) { /* ms-swift's spelling */
            o.data_opts.bad_records = strict ? WHALE_SFT_BAD_FAIL : WHALE_SFT_BAD_SKIP;
            continue;
        }
        if (!strcmp(a, "--dry-run")) {
            n_show = 3;
            if (i + 1 < argc && argv[i + 1][0] != '-' && cli_int("sft", a, argv[++i], 0, 1L << 30, &n_show)) return 2;
            continue;
        }
        if (!strcmp(a, "--data") || !strcmp(a, "--dataset")) {
            int k = multi_values(argc, argv, &i, data + n_data, 256 - n_data);
            if (!k) return cli_usage("sft", "%s needs one or more files", argv[i]);
            n_data += k;
            continue;
        }
        if (!strcmp(a, "--val-dataset")) {
            int k = multi_values(argc, argv, &i, val + n_val, 64 - n_val);
            if (!k) return cli_usage("sft", "%s needs one or more files", argv[i]);
            n_val += k;
            continue;
        }
        if (!strcmp(a, "--model-name") || !strcmp(a, "--model-author")) {
            const char **dst = a[8] == 'n' ? names : authors;
            int k = multi_values(argc, argv, &i, dst, 2);
            if (!k) return cli_usage("sft", "%s needs one or two values (Chinese, English)", argv[i]);
            if (i + 1 < argc && argv[i + 1][0] != '-') return cli_usage("sft", "%s takes at most two values", a);
            continue;
        }
        if (!strcmp(a, "--target-modules")) {
            int k = multi_values(argc, argv, &i, targets, 64);
            if (!k) return cli_usage("sft", "--target-modules needs all-linear or module names");
            target_list[0] = 0;
            for (int t = 0; t < k; t++) {
                if (strlen(target_list) + strlen(targets[t]) + 2 > sizeof target_list)
                    return cli_usage("sft", "--target-modules: too many names");
                if (t) strcat(target_list, ",");
                strcat(target_list, targets[t]);
            }
            o.lora.target_modules = target_list;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("sft", "%s needs a value", argv[i]);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.model = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "--output-dir")) o.out = v;
        else if (!strcmp(a, "--train-type") || !strcmp(a, "--tuner-type")) {
            if (!strcmp(v, "lora")) o.tuner = WHALE_TUNE_LORA;
            else if (!strcmp(v, "full")) o.tuner = WHALE_TUNE_FULL;
            else return cli_usage("sft", "%s must be lora or full, got \"%s\"", argv[i - 1], v);
        } else if (!strcmp(a, "--dtype") || !strcmp(a, "--torch-dtype")) {
            if ((bad = cli_dtype("sft", v, &o.dtype))) return bad;
        } else if (!strcmp(a, "--chat-template") || !strcmp(a, "--template")) o.chat_template = v;
        else if (!strcmp(a, "--system")) o.data_opts.system = v;
        else if (!strcmp(a, "--resume") || !strcmp(a, "--resume-from-checkpoint")) o.resume = v;
        else if (!strcmp(a, "--loss-scope")) {
            whale_err err;
            if (whale_sft_loss_scope_from_name(v, &o.data_opts.loss_scope, &err)) return cli_usage("sft", "%s", err.msg);
        } else if (!strcmp(a, "--truncation-strategy")) {
            whale_err err;
            if (whale_sft_truncation_from_name(v, &o.data_opts.truncation, &err)) return cli_usage("sft", "%s", err.msg);
        } else if (!strcmp(a, "--bad-records") || !strcmp(a, "--on-bad-record")) {
            whale_err err;
            if (whale_sft_bad_policy_from_name(v, &o.data_opts.bad_records, &err)) return cli_usage("sft", "%s", err.msg);
        } else if (!strcmp(a, "--lr-scheduler") || !strcmp(a, "--lr-scheduler-type")) {
            if (!strcmp(v, "constant")) o.schedule = WHALE_LR_CONSTANT;
            else if (!strcmp(v, "linear")) o.schedule = WHALE_LR_LINEAR;
            else if (!strcmp(v, "cosine")) o.schedule = WHALE_LR_COSINE;
            else return cli_usage("sft", "%s must be constant, linear or cosine, got \"%s\"", argv[i - 1], v);
        }
#define INT_OPT(name, lo, hi, dst) else if (!strcmp(a, name)) { if (!(bad = cli_int("sft", argv[i - 1], v, lo, hi, &n))) dst = n; }
#define FLT_OPT(name, lo, hi, dst) else if (!strcmp(a, name)) { if (!(bad = cli_float("sft", argv[i - 1], v, lo, hi, &d))) dst = d; }
        INT_OPT("--lora-rank", 1, 1 << 16, o.lora.rank)
        FLT_OPT("--lora-alpha", 1e-6, 1e6, o.lora.alpha)
        FLT_OPT("--lora-dropout", 0, 0.99, o.lora.dropout)
        FLT_OPT("--lr", 1e-12, 10, o.lr)
        FLT_OPT("--learning-rate", 1e-12, 10, o.lr)
        FLT_OPT("--epochs", 1e-6, 1e6, o.epochs)
        FLT_OPT("--num-train-epochs", 1e-6, 1e6, o.epochs)
        INT_OPT("--max-steps", 1, 1L << 40, o.max_steps)
        INT_OPT("--batch-size", 1, 65536, o.batch_size)
        INT_OPT("--per-device-train-batch-size", 1, 65536, o.batch_size)
        INT_OPT("--grad-accum", 1, 65536, o.grad_accum)
        INT_OPT("--gradient-accumulation-steps", 1, 65536, o.grad_accum)
        INT_OPT("--max-length", 2, 1 << 24, o.data_opts.max_length)
        FLT_OPT("--warmup-ratio", 0, 1, o.warmup_ratio)
        FLT_OPT("--weight-decay", 0, 10, o.weight_decay)
        FLT_OPT("--max-grad-norm", 0, 1e9, o.max_grad_norm)
        INT_OPT("--seed", 0, 0x7fffffffffffffffL, o.seed)
        INT_OPT("--save-steps", 1, 1L << 40, o.save_steps)
        INT_OPT("--eval-steps", 1, 1L << 40, o.eval_steps)
        FLT_OPT("--split-dataset-ratio", 0, 0.999999, o.split_ratio)
        INT_OPT("--save-total-limit", 0, 1 << 20, o.save_total_limit)
        INT_OPT("--logging-steps", 1, 1L << 40, o.logging_steps)
        INT_OPT("--threads", 1, 1024, threads)
        INT_OPT("--zero", 0, 1, o.zero)
        INT_OPT("--per-device-eval-batch-size", 1, 65536, eval_batch)
        INT_OPT("--dataloader-num-workers", 0, 1024, workers)
        FLT_OPT("--memory-limit", 1e-3, 1e6, o.memory_limit)
        else return cli_usage("sft", "unknown option \"%s\"", argv[i - 1]);
#undef INT_OPT
#undef FLT_OPT
        if (bad) return bad;
    }
    if (!o.model || !n_data) return cli_usage("sft", "-m BASE_DIR and --data FILE.jsonl are required");
    if (o.dtype == CLI_DTYPE_AUTO && (o.dtype = cli_checkpoint_dtype(o.model)) != WHALE_F32 && !o.quiet && n_show < 0)
        fprintf(stderr, "sft: %s, the checkpoint's dtype (--torch_dtype to change)\n", whale_dtype_torch_name(o.dtype));
    if (o.dtype == WHALE_I8 && o.tuner != WHALE_TUNE_LORA)
        return cli_usage("sft", "int8 is an inference format: full fine-tuning runs in fp32, bf16 or fp16; "
                                "--dtype int8 takes --train-type lora (adapters on a frozen int8 base)");
    o.memory_limit *= 1073741824.0; /* GiB */
    o.data = data;
    o.n_data = n_data;
    o.val_data = val;
    o.n_val_data = n_val;
    o.data_opts.model_name[0] = names[0], o.data_opts.model_name[1] = names[1];
    o.data_opts.model_author[0] = authors[0], o.data_opts.model_author[1] = authors[1];
    if (n_show >= 0) return dry_run(&o, n_show);
    if (!o.quiet && workers >= 0)
        fprintf(stderr, "sft: note: --dataloader_num_workers has no effect (the data is tokenized once, up front)\n");
    if (!o.quiet && eval_batch && eval_batch != o.batch_size)
        fprintf(stderr, "sft: note: evaluation runs --per_device_train_batch_size (%d) rows at a time, not %ld\n",
                o.batch_size, eval_batch);
    whale_set_threads((int)threads);
    whale_err err;
    whale_sft_result res;
    if (whale_sft_run(&o, &res, &err)) return cli_fail(&err);
    if (res.skipped_records)
        fprintf(stderr, "sft: skipped %lld bad record%s (--bad-records error to stop at the first); the first: %s\n",
                (long long)res.skipped_records, res.skipped_records == 1 ? "" : "s", res.first_bad);
    printf("{\"steps\": %lld, \"loss\": %.6f, \"seconds\": %.1f, \"tokens_per_s\": %.1f, \"trainable_params\": %lld, "
           "\"run_dir\": \"%s\", \"last_checkpoint\": \"%s\"",
           (long long)res.steps, res.last_loss, res.seconds, res.tokens_per_s, (long long)res.trainable_params,
           res.run_dir, res.last_checkpoint);
    if (res.best_checkpoint[0])
        printf(", \"eval_loss\": %.6f, \"eval_token_acc\": %.6f, \"best_model_checkpoint\": \"%s\", \"best_metric\": %.6f",
               res.eval_loss, res.eval_token_acc, res.best_checkpoint, res.best_metric);
    printf("}\n");
    return 0;
}
