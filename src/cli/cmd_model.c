/* whale info / init / score / generate */
#include "cli.h"

#include "whale_lora.h"
#include "whale_train.h"

#include "whale_util.h"
#include "whale_safetensors.h"
#include "whale_diag.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ info */

/* The checkpoint as stored: tensors and bytes by dtype, and the config's
 * dtype field (loading converts to the run's precision). */
static void print_stored(const char *dir) {
    whale_st *st;
    whale_err err;
    if (whale_st_open_dir(dir, &st, &err)) return;
    int count[WHALE_DTYPE_COUNT] = {0};
    double bytes[WHALE_DTYPE_COUNT] = {0};
    for (int i = 0; i < whale_st_count(st); i++) {
        const whale_st_entry *e = whale_st_at(st, i);
        count[e->dtype]++;
        bytes[e->dtype] += (double)e->nbytes;
    }
    whale_st_close(st);
    printf("stored            ");
    for (int d = 0, first = 1; d < WHALE_DTYPE_COUNT; d++)
        if (count[d]) printf("%s%s: %d tensors, %.1f MiB", first ? "" : "; ", whale_dtype_name((whale_dtype)d), count[d],
                             bytes[d] / 1048576.0), first = 0;
    char path[4200];
    cJSON *cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!whale_read_json_object(path, &cfg, &err)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "torch_dtype");
        if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(cfg, "dtype");
        if (cJSON_IsString(t)) printf(" (config: %s)", t->valuestring);
        cJSON_Delete(cfg);
    }
    printf("\n");
}

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    const cli_opt table[] = {{"-m|--model", CLI_STR, &dir, 0, 0, NULL}, {NULL, 0, NULL, 0, 0, NULL}};
    int st = cli_parse("info", "usage: whale info -m DIR\n  architecture, parameter counts by group, memory by dtype, unused tensors",
                       argc, argv, table, NULL, NULL);
    if (st) return st < 0 ? 0 : st;
    if (!dir) return cli_usage("info", "-m DIR is required");
    whale_err err;
    whale_model *m;
    if (whale_model_load(dir, &m, &err)) return cli_fail(&err);
    printf("model             %s\n", dir);
    whale_model_print_info(m, stdout);
    whale_model_free(m);
    print_stored(dir);
    return 0;
}

/* ------------------------------------------------------------------ init */

/* A line updated in place while a model of over 10M parameters is written
 * (0.5B takes tens of seconds); the final figure always. */
static void init_progress(void *user, int64_t done, int64_t total) {
    static double last = -1;
    (void)user;
    if (total < 10000000) return;
    double pct = 100.0 * (double)done / (double)total, now = whale_now();
    if (done < total && now - last < 0.5) return;
    last = now;
    fprintf(stderr, "\rinit: %5.1f%% of %.1fM parameters", pct, (double)total / 1e6);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static const char init_help[] =
    "usage: whale init --preset NAME|FILE.json --out DIR [--seed N] [--dtype fp32|bf16|fp16] [--tokenizer DIR]\n"
    "  presets: nanowhale-100m, small, debug, tiny (nanowhale); qwen2.5-0.5b, qwen2.5-7b, qwen2-tiny (Qwen2);\n"
    "  smollm2-135m, llama-3.2-1b, llama-tiny (Llama); qwen3-0.6b, qwen3-tiny (Qwen3)\n"
    "  writes config.json + model.safetensors with the family's reference initialisation, one tensor at\n"
    "  a time (a 7B model in bf16 needs no more memory than its largest tensor);\n"
    "  --tokenizer copies tokenizer.json (+ tokenizer_config.json, chat_template.jinja) into DIR";

int cmd_init(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *tokenizer = NULL;
    long seed = 0;
    whale_dtype dt = WHALE_F32;
    const cli_opt table[] = {
        {"--preset", CLI_STR, &preset, 0, 0, NULL},
        {"--out", CLI_STR, &out, 0, 0, NULL},
        {"--tokenizer", CLI_STR, &tokenizer, 0, 0, NULL},
        {"--dtype", CLI_DTYPE, &dt, 0, 0, NULL},
        {"--seed", CLI_LONG, &seed, 0, 9.2e18, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int st = cli_parse("init", init_help, argc, argv, table, NULL, NULL);
    if (st) return st < 0 ? 0 : st;
    if (dt == WHALE_I8) return cli_usage("init", "checkpoints are fp32, bf16 or fp16 (int8 is made at load time)");
    if (!preset || !out) return cli_usage("init", "--preset and --out are required");
    whale_err err;
    int64_t n_params = 0;
    whale_code c = WHALE_OK;
    if (tokenizer) { /* refuse a tokenizer that does not fit before writing gigabytes */
        whale_model *skel;
        whale_tokenizer *tok = NULL;
        if (!(c = whale_model_skeleton(preset, &skel, &err))) {
            c = cli_load_tokenizer(tokenizer, skel, &tok, &err);
            whale_tokenizer_free(tok);
            whale_model_free(skel);
        }
    }
    if (!c) c = whale_model_init_to_dir_progress(preset, NULL, (uint64_t)seed, dt, out, &n_params, init_progress, NULL, &err);
    if (!c && tokenizer) c = whale_tokenizer_copy_files(tokenizer, out, &err);
    if (!c)
        fprintf(stderr, "init: wrote %s (%lld parameters in %s, seed %ld)\n", out, (long long)n_params,
                cli_dtype_name(dt), seed);
    return c ? cli_fail(&err) : 0;
}

/* ------------------------------------------------------------------ score */

static const char score_help[] =
    "usage: whale score -m DIR --ids FILE [--logits-out FILE.safetensors] [--dtype fp32|bf16] [--threads N]\n"
    "                   [--nan-check]\n"
    "  --nan-check: fail at the first NaN or inf, naming the tensor it appeared in\n"
    "  FILE: JSON array of equal-length arrays of token ids.\n"
    "  prints {\"loss\": mean shifted cross-entropy, \"tokens\": scored targets, \"ppl\": exp(loss)}";

int cmd_score(int argc, char **argv) {
    const char *dir = NULL, *ids_path = NULL, *logits_out = NULL;
    long threads = 0;
    int nan_check = 0;
    whale_dtype dtype = WHALE_F32;
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &dir, 0, 0, NULL},
        {"--ids", CLI_STR, &ids_path, 0, 0, NULL},
        {"--logits-out", CLI_STR, &logits_out, 0, 0, NULL},
        {"--dtype", CLI_DTYPE, &dtype, 0, 0, NULL},
        {"--threads", CLI_LONG, &threads, 1, 1024, NULL},
        {"--nan-check", CLI_FLAG, &nan_check, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int parsed = cli_parse("score", score_help, argc, argv, table, NULL, NULL);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!dir || !ids_path) return cli_usage("score", "-m DIR and --ids FILE are required");
    whale_set_threads((int)threads);
    whale_err err;
    whale_model *m = NULL;
    if (whale_model_load_as(dir, dtype, &m, &err) || whale_model_own_weights(m, &err)) {
        whale_model_free(m);
        return cli_fail(&err);
    }
    int32_t *ids = NULL;
    int B = 0, S = 0, status = 0;
    float *logits = NULL;
    whale_session *s = NULL;
    whale_diag *nan = NULL;
    int V = whale_model_vocab_size(m);
    if (whale_read_ids_file(ids_path, V, &ids, &B, &S, &err)) {
        status = cli_fail(&err);
        goto out;
    }
    /* Rows go through in chunks whose logits take at most SCORE_CHUNK_BYTES
     * (all of them at once when they are written out), so the session and
     * the logits stay bounded whatever the file's batch is. */
    enum { SCORE_CHUNK_BYTES = 256 << 20 };
    size_t row_bytes = (size_t)S * V * sizeof(float);
    int chunk = logits_out || row_bytes * B <= SCORE_CHUNK_BYTES ? B : (int)(SCORE_CHUNK_BYTES / row_bytes);
    if (chunk < 1) chunk = 1;
    if (whale_session_new(m, chunk, S, &s, &err) || (nan_check && cli_nan_check_attach(s, &nan, &err))) {
        status = cli_fail(&err);
        goto out;
    }
    size_t n = (size_t)chunk * S * V;
    logits = whale_alloc(n * sizeof(float));
    if (!logits) {
        whale_errf(&err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of logits for %d × %d tokens", n * 4 / 1048576.0,
                   chunk, S);
        status = cli_fail(&err);
        goto out;
    }
    int64_t count = 0;
    double loss_sum = 0, loss = NAN;
    for (int b0 = 0; b0 < B; b0 += chunk) {
        int nb = B - b0 < chunk ? B - b0 : chunk;
        const int32_t *cids = ids + (size_t)b0 * S;
        whale_session_reset(s);
        if (whale_session_forward(s, cids, nb, S, logits, 1, &err) || whale_diag_nan_error(nan, &err)) {
            status = cli_fail(&err);
            goto out;
        }
        int64_t cc;
        double cl = whale_cross_entropy(logits, cids, nb, S, V, &cc);
        if (cc) loss_sum += cl * (double)cc;
        count += cc;
        if (chunk == B) loss = cl; /* one chunk: exactly the mean over the batch */
    }
    if (chunk < B && count) loss = loss_sum / (double)count;
    if (logits_out) {
        int64_t shape[3] = {B, S, V};
        whale_st_item item = {"logits", WHALE_F32, 3, shape, logits};
        if (whale_st_write(logits_out, &item, 1, NULL, &err)) {
            status = cli_fail(&err);
            goto out;
        }
    }
    if (count) printf("{\"loss\": %.9g, \"tokens\": %lld, \"ppl\": %.9g}\n", loss, (long long)count, exp(loss));
    else printf("{\"loss\": null, \"tokens\": 0, \"ppl\": null}\n");
out:
    free(logits);
    free(ids);
    whale_session_free(s);
    whale_diag_free(nan);
    whale_model_free(m);
    return status;
}

/* ------------------------------------------------------------------ generate */

typedef struct {
    whale_detokenizer *detok; /* NULL: print ids */
    int count;
    whale_err *err;
    int failed;
    whale_diag *nan; /* --nan-check: stop before printing a token sampled after a NaN */
    int stream; /* flush each piece */
} gen_printer;

static int print_token(void *user, int32_t id) {
    gen_printer *p = user;
    if (whale_diag_failed(p->nan)) return 1;
    if (p->detok) {
        const char *text;
        size_t len;
        if (whale_detokenizer_push(p->detok, id, &text, &len, p->err)) {
            p->failed = 1;
            return 1;
        }
        fwrite(text, 1, len, stdout);
    } else {
        printf("%s%d", p->count ? "," : "", id);
    }
    p->count++;
    if (p->stream) fflush(stdout);
    return 0;
}

static const char generate_help[] =
    "usage: whale generate (-m DIR | --adapters CKPT | both) (-p TEXT | --ids 0,15,27) [-n N] [options]\n"
    "  --adapters CKPT      a LoRA checkpoint of whale sft (its args.json names the base)\n"
    "  -p, --prompt TEXT    text prompt (needs the model folder's tokenizer.json); streams text\n"
    "  --ids LIST           token-id prompt; prints the generated ids\n"
    "  -n N                 tokens to generate (default 32; alias --max-new-tokens)\n"
    "  --temperature T      0 = greedy (default 0.7)\n"
    "  --top-k K            0 = off (default 50)\n"
    "  --top-p P            1 = off (default 0.9)\n"
    "  --min-p P            0 = off (default 0)\n"
    "  --repeat-penalty R   1 = off (default 1; alias --repetition-penalty); HF semantics over prompt + output\n"
    "  --seed S             sampling seed (default: from the clock, printed)\n"
    "                       the model folder's generation_config.json replaces these defaults (as\n"
    "                       transformers and ms-swift do; the options given always win)\n"
    "  --ignore-eos         do not stop at the end-of-sequence id\n"
    "  --stream [true|false] (true) false prints the text when it is complete\n"
    "  --dtype fp32|bf16|fp16|int8  compute precision (bf16/fp16: weight products in that format with fp32\n"
    "                       accumulation; int8: weight-only, one scale per output channel); default: the\n"
    "                       checkpoint's torch_dtype (a BF16 checkpoint runs in bf16)\n"
    "  --memory-limit GIB   refuse up front a run estimated (as whale memory does) to need more\n"
    "  --ctx-size N         at most N positions, prompt + output (alias -c, --max-model-len)\n"
    "  --threads N          (default: all cores)\n"
    "  --nan-check          fail at the first NaN or inf, naming the tensor it appeared in\n"
    "  booleans take true|false|1|0 too; swift infer's spellings (--max_new_tokens, --top_k, ...) work,\n"
    "  --infer_backend is ignored\n"
    "output on stdout as it is produced, ending with a newline; prompt and generation speed on stderr";

/* -p TEXT as ids (with the tokenizer's BOS), and the detokenizer that
 * prints the continuation. */
static whale_code encode_prompt(const char *dir, const whale_model *m, const char *text, whale_tokenizer **tok,
                                whale_detokenizer **detok, int32_t **prompt, int *n_prompt, whale_err *err) {
    if (!*text) return whale_errf(err, WHALE_ERR_ARG, "-p: the prompt is empty");
    whale_code c;
    if ((c = cli_load_tokenizer(dir, m, tok, err)) ||
        (c = whale_tokenizer_encode(*tok, text, strlen(text), 1, prompt, n_prompt, err)) ||
        (c = whale_detokenizer_new(*tok, 1, detok, err)))
        return c;
    if (*n_prompt == 0) return whale_errf(err, WHALE_ERR_ARG, "-p: the prompt is empty (it encodes to no tokens)");
    return WHALE_OK;
}

static whale_code check_ids(const int32_t *ids, int n, int V, whale_err *err) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return whale_errf(err, WHALE_ERR_RANGE, "--ids: token id %d at position %d is outside the vocabulary [0, %d)",
                              ids[i], i, V);
    return WHALE_OK;
}

/* The timing line, the memory line and the peak on stderr. */
static void print_gen_stats(const whale_gen_stats *st, uint64_t seed, const whale_model *m, const whale_session *s) {
    fprintf(stderr,
            "generate: seed %llu; prompt %d tokens in %.1f ms (%.1f tokens/s); generated %d tokens in %.1f ms (%.1f tokens/s)\n",
            (unsigned long long)seed, st->prompt_tokens, st->prompt_seconds * 1e3,
            st->prompt_tokens / (st->prompt_seconds > 0 ? st->prompt_seconds : 1e-9), st->generated,
            st->gen_seconds * 1e3, st->generated > 1 ? (st->generated - 1) / st->gen_seconds : 0.0);
    whale_memory mm;
    whale_memory_of_model(m, &mm);
    whale_memory_add_session(&mm, s);
    fprintf(stderr, "generate: ");
    whale_memory_print_line(&mm, stderr);
    fprintf(stderr, "generate: peak resident memory %.1f MiB\n", whale_peak_rss() / 1048576.0);
}

int cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *ids_text = NULL, *prompt_text = NULL, *adapters = NULL;
    char *base = NULL;
    whale_dtype dtype = CLI_DTYPE_AUTO;
    long n_new = 32, threads = 0, ctx = 0;
    double limit_gib = 0;
    int nan_check = 0, ignore_eos = 0, stream = 1;
    whale_sampler_params sp = cli_sampling_defaults();
    unsigned given = 0;
    const cli_opt opts[] = {
        {"-m|--model", CLI_STR, &dir, 0, 0, NULL},
        {"--ids", CLI_STR, &ids_text, 0, 0, NULL},
        {"-p|--prompt", CLI_STR, &prompt_text, 0, 0, NULL},
        {"--adapters", CLI_STR, &adapters, 0, 0, NULL},
        {"--dtype|--torch-dtype", CLI_DTYPE, &dtype, 0, 0, NULL},
        {"-n|--max-new-tokens", CLI_LONG, &n_new, 0, 1 << 24, NULL},
        {"--threads", CLI_LONG, &threads, 1, 1024, NULL},
        {"--ignore-eos", CLI_FLAG, &ignore_eos, 0, 0, NULL},
        {"--nan-check", CLI_FLAG, &nan_check, 0, 0, NULL},
        {"--stream", CLI_FLAG, &stream, 0, 0, NULL},
        {"--memory-limit", CLI_DOUBLE, &limit_gib, 1e-6, 1e6, NULL},
        {"-c|--ctx-size|--max-model-len", CLI_LONG, &ctx, 2, 1 << 24, NULL},
        {"--infer-backend", CLI_NOTE, NULL, 0, 0, "whale runs its own engine; the option is ignored"},
        {NULL, 0, NULL, 0, 0, NULL}};
    int st0 = cli_parse("generate", generate_help, argc, argv, opts, &sp, &given);
    if (st0) return st0 < 0 ? 0 : st0;
    if ((!dir && !adapters) || !ids_text == !prompt_text)
        return cli_usage("generate", "-m DIR (or --adapters CKPT) and one of -p TEXT or --ids are required");
    whale_set_threads((int)threads);

    whale_err err;
    whale_model *m = NULL;
    whale_tokenizer *tok = NULL;
    whale_detokenizer *detok = NULL;
    whale_session *s = NULL;
    whale_sampler *sm = NULL;
    whale_diag *nan = NULL;
    int32_t *prompt = NULL, *ids = NULL;
    int n_prompt = 0, status = 0;
    if (ids_text && (status = cli_parse_id_list("generate", ids_text, &prompt, &n_prompt))) return status;
    /* the session: prompt + -n positions (a text prompt has at most one token per byte) */
    cli_run run = {"generate", dtype, (int)(n_new + 1 + (prompt_text ? (long)strlen(prompt_text) : n_prompt)), 0,
                   limit_gib * 1073741824.0, 0};
    if (cli_load_model(dir, adapters, &run, &m, &base, NULL, NULL, &err)) goto fail;
    dir = base;
    if (cli_generation_config(dir, &sp, given, "generate", &err)) goto fail;
    int V = whale_model_vocab_size(m), maxpos = whale_model_max_positions(m);
    const char *bound = "max_position_embeddings";
    if (ctx > 0 && ctx < maxpos) maxpos = (int)ctx, bound = "--ctx-size";
    if (prompt_text && encode_prompt(dir, m, prompt_text, &tok, &detok, &prompt, &n_prompt, &err)) goto fail;
    if (check_ids(prompt, n_prompt, V, &err)) goto fail;
    if (n_prompt + n_new > maxpos) {
        whale_errf(&err, WHALE_ERR_RANGE, "prompt (%d tokens) + -n (%ld) exceeds %s %d", n_prompt, n_new, bound, maxpos);
        goto fail;
    }
    int cap = n_prompt + (int)n_new;
    ids = malloc(sizeof(int32_t) * (size_t)(cap + 1));
    if (!ids) {
        whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
        goto fail;
    }
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)n_prompt);
    if (whale_sampler_new(&sp, V, &sm, &err) || whale_session_new(m, 1, cap, &s, &err) ||
        (nan_check && cli_nan_check_attach(s, &nan, &err)))
        goto fail;
    int32_t stop[9];
    int n_stop = ignore_eos ? 0 : whale_model_eos_ids(m, stop, 8);
    if (!ignore_eos && tok && whale_tokenizer_role_id(tok, WHALE_TOKEN_EOS) >= 0)
        stop[n_stop++] = whale_tokenizer_role_id(tok, WHALE_TOKEN_EOS);

    gen_printer pr = {detok, 0, &err, 0, nan, stream};
    if (!stream) setvbuf(stdout, NULL, _IOFBF, 1 << 20); /* the whole text at the end */
    whale_gen_stats st;
    int n_ids = n_prompt;
    whale_code gc = whale_generate(s, sm, ids, &n_ids, cap, (int)n_new, stop, n_stop, print_token, &pr, &st, &err);
    if (whale_diag_nan_error(nan, &err) || gc || pr.failed) goto fail; /* the NaN's origin explains a later error */
    if (detok) {
        const char *text;
        size_t len;
        if (whale_detokenizer_flush(detok, &text, &len, &err)) goto fail;
        fwrite(text, 1, len, stdout);
    }
    printf("\n"); /* the text ends its line before the timing line */
    fflush(stdout);
    print_gen_stats(&st, sp.seed, m, s);
    goto out;
fail:
    status = cli_fail(&err);
out:
    free(prompt);
    free(ids);
    whale_sampler_free(sm);
    whale_session_free(s);
    whale_diag_free(nan);
    whale_detokenizer_free(detok);
    whale_tokenizer_free(tok);
    whale_model_free(m);
    free(base);
    return status;
}
