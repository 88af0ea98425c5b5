/* whale sft: supervised fine-tuning (LoRA or full) on chat data, with
 * ms-swift's option names (dashes or underscores) and run layout. */
#include "cli.h"

#include "whale_sft.h"
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
    "  --gradient-checkpointing true|false (true, as ms-swift; alias --recompute): recompute each layer in the\n"
    "      backward pass instead of keeping its activations   --nan-check  --memory-limit GIB  --threads N  --quiet\n"
    "  --zero 0|1 (0): on several ranks (mpirun), 1 shards the AdamW moments over them, and\n"
    "      in bf16/fp16 the fp32 master weights (ZeRO stage 1)\n"
    "  --bucket-mb M (0): on several ranks, send the gradients in buckets of M MiB while the backward\n"
    "      pass runs; 0 = in one exchange after it (same results)\n"
    "  booleans are flags or take true|false|1|0; FILE#N draws N samples of FILE (seeded, as ms-swift)\n"
    "  --out DIR (output; alias --output-dir)   --dry-run [N]: show N samples (3) with the trained text in [[ ]]\n"
    "  --resume CKPT (alias --resume-from-checkpoint): continue a run from its checkpoint, same settings,\n"
    "      into a new run folder (the steps after it are those the run would have taken)\n"
    "writes DIR/vN-YYYYMMDD-HHMMSS/{args.json,logging.jsonl,checkpoint-STEP/}; prints a JSON summary";

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

/* The options as cli_parse leaves them; sft_options turns them into the run's. */
typedef struct {
    const char *tuner, *schedule, *loss_scope, *truncation, *bad_records;
    const char *names[2], *authors[2];
    cli_list data, val, targets;
    long lora_rank, max_steps, batch_size, grad_accum, max_length, seed, save_steps, eval_steps, save_total_limit;
    long logging_steps, threads, zero, eval_batch, workers, n_show;
    int strict;
    char target_list[2048];
} sft_cli;

/* Parse argv into c and o (0, -1 after --help, or the usage status). */
static int sft_parse(int argc, char **argv, sft_cli *c, whale_sft_run_opts *o) {
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &o->model, 0, 0, NULL},
        {"--data|--dataset", CLI_LIST, &c->data, 0, 0, NULL},
        {"--val-dataset", CLI_LIST, &c->val, 0, 0, NULL},
        {"--out|--output-dir", CLI_STR, &o->out, 0, 0, NULL},
        {"--train-type|--tuner-type", CLI_STR, &c->tuner, 0, 0, NULL},
        {"--dtype|--torch-dtype", CLI_DTYPE, &o->dtype, 0, 0, NULL},
        {"--chat-template|--template", CLI_STR, &o->chat_template, 0, 0, NULL},
        {"--system", CLI_STR, &o->data_opts.system, 0, 0, NULL},
        {"--resume|--resume-from-checkpoint", CLI_STR, &o->resume, 0, 0, NULL},
        {"--loss-scope", CLI_STR, &c->loss_scope, 0, 0, NULL},
        {"--truncation-strategy", CLI_STR, &c->truncation, 0, 0, NULL},
        {"--bad-records|--on-bad-record", CLI_STR, &c->bad_records, 0, 0, NULL},
        {"--strict", CLI_FLAG, &c->strict, 0, 0, NULL},
        {"--lr-scheduler|--lr-scheduler-type", CLI_STR, &c->schedule, 0, 0, NULL},
        {"--model-name", CLI_PAIR, c->names, 0, 0, NULL},
        {"--model-author", CLI_PAIR, c->authors, 0, 0, NULL},
        {"--target-modules", CLI_LIST, &c->targets, 0, 0, NULL},
        {"--packing", CLI_FLAG, &o->data_opts.packing, 0, 0, NULL},
        {"--gradient-checkpointing|--recompute", CLI_FLAG, &o->recompute, 0, 0, NULL},
        {"--nan-check", CLI_FLAG, &o->nan_check, 0, 0, NULL},
        {"--quiet", CLI_FLAG, &o->quiet, 0, 0, NULL},
        {"--use-rslora", CLI_FLAG, &o->lora.use_rslora, 0, 0, NULL},
        {"--save-only-model", CLI_FLAG, &o->save_only_model, 0, 0, NULL},
        {"--dry-run", CLI_COUNT, &c->n_show, 0, 1L << 30, "3"},
        {"--lora-rank", CLI_LONG, &c->lora_rank, 1, 1 << 16, NULL},
        {"--lora-alpha", CLI_DOUBLE, &o->lora.alpha, 1e-6, 1e6, NULL},
        {"--lora-dropout", CLI_DOUBLE, &o->lora.dropout, 0, 0.99, NULL},
        {"--lr|--learning-rate", CLI_DOUBLE, &o->lr, 1e-12, 10, NULL},
        {"--epochs|--num-train-epochs", CLI_DOUBLE, &o->epochs, 1e-6, 1e6, NULL},
        {"--max-steps", CLI_LONG, &c->max_steps, 1, 1L << 40, NULL},
        {"--batch-size|--per-device-train-batch-size", CLI_LONG, &c->batch_size, 1, 65536, NULL},
        {"--grad-accum|--gradient-accumulation-steps", CLI_LONG, &c->grad_accum, 1, 65536, NULL},
        {"--max-length", CLI_LONG, &c->max_length, 2, 1 << 24, NULL},
        {"--warmup-ratio", CLI_DOUBLE, &o->warmup_ratio, 0, 1, NULL},
        {"--weight-decay", CLI_DOUBLE, &o->weight_decay, 0, 10, NULL},
        {"--max-grad-norm", CLI_DOUBLE, &o->max_grad_norm, 0, 1e9, NULL},
        {"--seed", CLI_LONG, &c->seed, 0, 0x7fffffffffffffffL, NULL},
        {"--save-steps", CLI_LONG, &c->save_steps, 1, 1L << 40, NULL},
        {"--eval-steps", CLI_LONG, &c->eval_steps, 1, 1L << 40, NULL},
        {"--split-dataset-ratio", CLI_DOUBLE, &o->split_ratio, 0, 0.999999, NULL},
        {"--save-total-limit", CLI_LONG, &c->save_total_limit, 0, 1 << 20, NULL},
        {"--logging-steps", CLI_LONG, &c->logging_steps, 1, 1L << 40, NULL},
        {"--threads", CLI_LONG, &c->threads, 1, 1024, NULL},
        {"--zero", CLI_LONG, &c->zero, 0, 1, NULL},
        {"--bucket-mb", CLI_DOUBLE, &o->bucket_mb, 0, 4096, NULL},
        {"--per-device-eval-batch-size", CLI_LONG, &c->eval_batch, 1, 65536, NULL},
        {"--dataloader-num-workers", CLI_LONG, &c->workers, 0, 1024, NULL},
        {"--memory-limit", CLI_DOUBLE, &o->memory_limit, 1e-3, 1e6, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    return cli_parse("sft", sft_usage, argc, argv, table, NULL, NULL);
}

/* The named values and the integers of c into o; 0 or the usage status. */
static int sft_options(sft_cli *c, whale_sft_run_opts *o) {
    whale_err err;
    if (c->tuner && !strcmp(c->tuner, "lora")) o->tuner = WHALE_TUNE_LORA;
    else if (c->tuner && !strcmp(c->tuner, "full")) o->tuner = WHALE_TUNE_FULL;
    else if (c->tuner) return cli_usage("sft", "--train-type must be lora or full, got \"%s\"", c->tuner);
    if (c->schedule && !strcmp(c->schedule, "constant")) o->schedule = WHALE_LR_CONSTANT;
    else if (c->schedule && !strcmp(c->schedule, "linear")) o->schedule = WHALE_LR_LINEAR;
    else if (c->schedule && !strcmp(c->schedule, "cosine")) o->schedule = WHALE_LR_COSINE;
    else if (c->schedule)
        return cli_usage("sft", "--lr-scheduler must be constant, linear or cosine, got \"%s\"", c->schedule);
    if ((c->loss_scope && whale_sft_loss_scope_from_name(c->loss_scope, &o->data_opts.loss_scope, &err)) ||
        (c->truncation && whale_sft_truncation_from_name(c->truncation, &o->data_opts.truncation, &err)) ||
        (c->bad_records && whale_sft_bad_policy_from_name(c->bad_records, &o->data_opts.bad_records, &err)))
        return cli_usage("sft", "%s", err.msg);
    if (c->strict >= 0) o->data_opts.bad_records = c->strict ? WHALE_SFT_BAD_FAIL : WHALE_SFT_BAD_SKIP;
    for (int t = 0; t < c->targets.n; t++) { /* all-linear, or module names joined by commas */
        if (strlen(c->target_list) + strlen(c->targets.v[t]) + 2 > sizeof c->target_list)
            return cli_usage("sft", "--target-modules: too many names");
        if (t) strcat(c->target_list, ",");
        strcat(c->target_list, c->targets.v[t]);
    }
    if (c->targets.n) o->lora.target_modules = c->target_list;
    o->lora.rank = (int)c->lora_rank, o->max_steps = c->max_steps, o->batch_size = (int)c->batch_size;
    o->grad_accum = (int)c->grad_accum, o->data_opts.max_length = (int)c->max_length, o->seed = (uint64_t)c->seed;
    o->save_steps = c->save_steps, o->eval_steps = c->eval_steps, o->save_total_limit = (int)c->save_total_limit;
    o->logging_steps = c->logging_steps, o->zero = (int)c->zero;
    o->data = c->data.v, o->n_data = c->data.n, o->val_data = c->val.v, o->n_val_data = c->val.n;
    o->data_opts.model_name[0] = c->names[0], o->data_opts.model_name[1] = c->names[1];
    o->data_opts.model_author[0] = c->authors[0], o->data_opts.model_author[1] = c->authors[1];
    o->memory_limit *= 1073741824.0; /* GiB */
    return 0;
}

/* The run's summary, one JSON line (and the records it passed over). */
static void print_result(const whale_sft_result *res) {
    if (res->skipped_records)
        fprintf(stderr, "sft: skipped %lld bad record%s (--bad-records error to stop at the first); the first: %s\n",
                (long long)res->skipped_records, res->skipped_records == 1 ? "" : "s", res->first_bad);
    printf("{\"steps\": %lld, \"loss\": %.6f, \"seconds\": %.1f, \"tokens_per_s\": %.1f, \"trainable_params\": %lld, "
           "\"run_dir\": \"%s\", \"last_checkpoint\": \"%s\"",
           (long long)res->steps, res->last_loss, res->seconds, res->tokens_per_s, (long long)res->trainable_params,
           res->run_dir, res->last_checkpoint);
    if (res->best_checkpoint[0])
        printf(", \"eval_loss\": %.6f, \"eval_token_acc\": %.6f, \"best_model_checkpoint\": \"%s\", \"best_metric\": %.6f",
               res->eval_loss, res->eval_token_acc, res->best_checkpoint, res->best_metric);
    printf("}\n");
}

int cmd_sft(int argc, char **argv) {
    whale_sft_run_opts o = whale_sft_run_defaults();
    o.data_opts.bad_records = WHALE_SFT_BAD_SKIP; /* ms-swift drops malformed rows unless --strict */
    o.dtype = CLI_DTYPE_AUTO;                     /* the checkpoint's, as ms-swift's torch_dtype */
    o.recompute = 1; /* gradient checkpointing on, as ms-swift's default */
    o.out = "output";
    sft_cli c = {.lora_rank = o.lora.rank, .max_steps = o.max_steps, .batch_size = o.batch_size,
                 .grad_accum = o.grad_accum, .max_length = o.data_opts.max_length, .seed = (long)o.seed,
                 .save_steps = o.save_steps, .eval_steps = o.eval_steps, .save_total_limit = o.save_total_limit,
                 .logging_steps = o.logging_steps, .zero = o.zero, .workers = -1, .n_show = -1, .strict = -1};
    char cmdline[8192];
    cli_command_line(argc, argv, cmdline, sizeof cmdline); /* recorded in args.json */
    o.command_line = cmdline;
    int st = sft_parse(argc, argv, &c, &o);
    if (st) return st < 0 ? 0 : st;
    if ((st = sft_options(&c, &o))) return st;
    if (!o.model || !o.n_data) return cli_usage("sft", "-m BASE_DIR and --data FILE.jsonl are required");
    if (o.dtype == CLI_DTYPE_AUTO && (o.dtype = cli_checkpoint_dtype(o.model)) != WHALE_F32 && !o.quiet && c.n_show < 0)
        fprintf(stderr, "sft: %s, the checkpoint's dtype (--torch_dtype to change)\n", whale_dtype_torch_name(o.dtype));
    if (o.dtype == WHALE_I8 && o.tuner != WHALE_TUNE_LORA)
        return cli_usage("sft", "int8 is an inference format: full fine-tuning runs in fp32, bf16 or fp16; "
                                "--dtype int8 takes --train-type lora (adapters on a frozen int8 base)");
    if (c.n_show >= 0) return dry_run(&o, c.n_show);
    if (!o.quiet && c.workers >= 0)
        fprintf(stderr, "sft: note: --dataloader_num_workers has no effect (the data is tokenized once, up front)\n");
    if (!o.quiet && c.eval_batch && c.eval_batch != o.batch_size)
        fprintf(stderr, "sft: note: evaluation runs --per_device_train_batch_size (%d) rows at a time, not %ld\n",
                o.batch_size, c.eval_batch);
    whale_set_threads((int)c.threads);
    whale_err err;
    whale_sft_result res;
    if (whale_sft_run(&o, &res, &err)) return cli_fail(&err);
    print_result(&res);
    return 0;
}
