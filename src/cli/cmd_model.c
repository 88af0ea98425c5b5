/* whale info / init / score / generate */
#include "cli/cli.h"

#include "core/core.h"
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

/* ------------------------------------------------------------------ info */

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    if (wants_help(argc, argv)) {
        puts("usage: whale info -m DIR\n  architecture, parameter counts by group, memory by dtype, unused tensors");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return cli_usage("info", "%s needs a value", argv[i]);
        } else return cli_usage("info", "unknown option \"%s\"", argv[i]);
    }
    if (!dir) return cli_usage("info", "-m DIR is required");
    whale_err err;
    whale_model *m;
    if (whale_model_load(dir, &m, &err)) return cli_fail(&err);
    printf("model             %s\n", dir);
    whale_model_print_info(m, stdout);
    whale_model_free(m);
    return 0;
}

/* ------------------------------------------------------------------ init */

int cmd_init(int argc, char **argv) {
    const char *preset = NULL, *out = NULL;
    long seed = 0;
    if (wants_help(argc, argv)) {
        puts("usage: whale init --preset nanowhale-100m|debug|tiny|FILE.json --out DIR [--seed N]\n"
             "  writes config.json + model.safetensors with the reference initialisation");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--preset") || !strcmp(a, "--out") || !strcmp(a, "--seed")) {
            if (!(v = cli_value(argc, argv, &i))) return cli_usage("init", "%s needs a value", a);
            if (!strcmp(a, "--preset")) preset = v;
            else if (!strcmp(a, "--out")) out = v;
            else if (cli_int("init", a, v, 0, 0x7fffffffffffffffL, &seed)) return 2;
        } else return cli_usage("init", "unknown option \"%s\"", a);
    }
    if (!preset || !out) return cli_usage("init", "--preset and --out are required");
    whale_err err;
    whale_model *m;
    if (whale_model_init(preset, (uint64_t)seed, &m, &err)) return cli_fail(&err);
    whale_code c = whale_model_save(m, out, &err);
    if (!c) fprintf(stderr, "whale: wrote %s (%lld parameters, seed %ld)\n", out, (long long)whale_model_param_count(m), seed);
    whale_model_free(m);
    return c ? cli_fail(&err) : 0;
}

/* ------------------------------------------------------------------ score */

/* JSON array of equal-length arrays of token ids -> ids [B*S] */
static whale_code read_ids_file(const char *path, int vocab, int32_t **ids, int *B, int *S, whale_err *err) {
    char *text;
    size_t n;
    whale_code c = whale_read_file(path, &text, &n, err);
    if (c) return c;
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!j) return whale_errf(err, WHALE_ERR_FORMAT, "%s: not valid JSON", path);
    c = WHALE_OK;
    int rows = cJSON_GetArraySize(j), cols = -1;
    if (!cJSON_IsArray(j) || rows == 0) {
        c = whale_errf(err, WHALE_ERR_FORMAT, "%s: expected a non-empty JSON array of arrays of token ids", path);
        goto done;
    }
    const cJSON *row;
    int r = 0;
    cJSON_ArrayForEach(row, j) {
        int len = cJSON_GetArraySize(row);
        if (!cJSON_IsArray(row) || len == 0) {
            c = whale_errf(err, WHALE_ERR_FORMAT, "%s: row %d is not a non-empty array of token ids", path, r);
            goto done;
        }
        if (cols >= 0 && len != cols) {
            c = whale_errf(err, WHALE_ERR_FORMAT, "%s: row %d has %d ids but row 0 has %d (rows must be equal length)",
                           path, r, len, cols);
            goto done;
        }
        cols = len;
        r++;
    }
    *ids = malloc(sizeof(int32_t) * (size_t)rows * cols);
    if (!*ids) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    r = 0;
    cJSON_ArrayForEach(row, j) {
        const cJSON *v;
        int col = 0;
        cJSON_ArrayForEach(v, row) {
            double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
            if (!(d == floor(d))) {
                c = whale_errf(err, WHALE_ERR_FORMAT, "%s: row %d, column %d is not an integer token id", path, r, col);
            } else if (d < 0 || d >= vocab) {
                c = whale_errf(err, WHALE_ERR_RANGE, "%s: row %d, column %d: token id %.0f is outside the vocabulary [0, %d)",
                               path, r, col, d, vocab);
            }
            if (c) {
                free(*ids);
                *ids = NULL;
                goto done;
            }
            (*ids)[(size_t)r * cols + col++] = (int32_t)d;
        }
        r++;
    }
    *B = rows;
    *S = cols;
done:
    cJSON_Delete(j);
    return c;
}

int cmd_score(int argc, char **argv) {
    const char *dir = NULL, *ids_path = NULL, *logits_out = NULL;
    long threads = 0;
    if (wants_help(argc, argv)) {
        puts("usage: whale score -m DIR --ids FILE [--logits-out FILE.safetensors] [--threads N]\n"
             "  FILE: JSON array of equal-length arrays of token ids.\n"
             "  prints {\"loss\": mean shifted cross-entropy, \"tokens\": scored targets, \"ppl\": exp(loss)}");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--ids") || !strcmp(a, "--logits-out") ||
            !strcmp(a, "--threads")) {
            if (!(v = cli_value(argc, argv, &i))) return cli_usage("score", "%s needs a value", a);
            if (!strcmp(a, "--ids")) ids_path = v;
            else if (!strcmp(a, "--logits-out")) logits_out = v;
            else if (!strcmp(a, "--threads")) {
                if (cli_int("score", a, v, 1, 1024, &threads)) return 2;
            } else dir = v;
        } else return cli_usage("score", "unknown option \"%s\"", a);
    }
    if (!dir || !ids_path) return cli_usage("score", "-m DIR and --ids FILE are required");
    whale_set_threads((int)threads);
    whale_err err;
    whale_model *m;
    if (whale_model_load(dir, &m, &err)) return cli_fail(&err);
    int32_t *ids = NULL;
    int B = 0, S = 0, status = 0;
    float *logits = NULL;
    whale_session *s = NULL;
    int V = whale_model_vocab_size(m);
    if (read_ids_file(ids_path, V, &ids, &B, &S, &err) || whale_session_new(m, B, S, &s, &err)) {
        status = cli_fail(&err);
        goto out;
    }
    size_t n = (size_t)B * S * V;
    logits = whale_alloc(n * sizeof(float));
    if (!logits) {
        whale_errf(&err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of logits for %d × %d tokens", n * 4 / 1048576.0, B, S);
        status = cli_fail(&err);
        goto out;
    }
    if (whale_session_forward(s, ids, B, S, logits, 1, &err)) {
        status = cli_fail(&err);
        goto out;
    }
    int64_t count;
    double loss = whale_cross_entropy(logits, ids, B, S, V, &count);
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
    whale_model_free(m);
    return status;
}

/* ------------------------------------------------------------------ generate */

int cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *ids_text = NULL;
    long n_new = 32, threads = 0, seed = -1, top_k = 50, ignore_eos = 0;
    double temperature = 0.7, top_p = 0.9, min_p = 0.0, rep = 1.0;
    if (wants_help(argc, argv)) {
        puts("usage: whale generate -m DIR --ids 0,15,27 [-n N] [options]\n"
             "  -n N                 tokens to generate (default 32)\n"
             "  --temperature T      0 = greedy (default 0.7)\n"
             "  --top-k K            0 = off (default 50)\n"
             "  --top-p P            1 = off (default 0.9)\n"
             "  --min-p P            0 = off (default 0)\n"
             "  --repeat-penalty R   1 = off (default 1); HF semantics over prompt + output\n"
             "  --seed S             sampling seed (default: from the clock, printed)\n"
             "  --ignore-eos         do not stop at the end-of-sequence id\n"
             "  --threads N          (default: all cores)\n"
             "prints the generated ids on stdout as they are produced; speed on stderr");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = 1;
            continue;
        }
        if (a[0] != '-' || !(v = cli_value(argc, argv, &i))) {
            if (a[0] == '-') return cli_usage("generate", "%s needs a value", a);
            return cli_usage("generate", "unexpected argument \"%s\"", a);
        }
        int bad = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--ids")) ids_text = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) bad = cli_int("generate", a, v, 0, 1 << 24, &n_new);
        else if (!strcmp(a, "--temperature")) bad = cli_float("generate", a, v, 0, 1e6, &temperature);
        else if (!strcmp(a, "--top-k")) bad = cli_int("generate", a, v, 0, 1 << 30, &top_k);
        else if (!strcmp(a, "--top-p")) bad = cli_float("generate", a, v, 1e-9, 1, &top_p);
        else if (!strcmp(a, "--min-p")) bad = cli_float("generate", a, v, 0, 0.999999, &min_p);
        else if (!strcmp(a, "--repeat-penalty")) bad = cli_float("generate", a, v, 1e-6, 1e6, &rep);
        else if (!strcmp(a, "--seed")) bad = cli_int("generate", a, v, 0, 0x7fffffffffffffffL, &seed);
        else if (!strcmp(a, "--threads")) bad = cli_int("generate", a, v, 1, 1024, &threads);
        else return cli_usage("generate", "unknown option \"%s\"", a);
        if (bad) return bad;
    }
    if (!dir || !ids_text) return cli_usage("generate", "-m DIR and --ids are required");
    int32_t *prompt;
    int n_prompt;
    int st = cli_parse_id_list("generate", ids_text, &prompt, &n_prompt);
    if (st) return st;
    whale_set_threads((int)threads);
    if (seed < 0) seed = (long)time(NULL); /* reported with the timings */

    whale_err err;
    whale_model *m = NULL;
    whale_session *s = NULL;
    whale_sampler *sm = NULL;
    int32_t *hist = NULL;
    float *logits = NULL;
    int status = 0;
    if (whale_model_load(dir, &m, &err)) {
        status = cli_fail(&err);
        goto out;
    }
    int V = whale_model_vocab_size(m), maxpos = whale_model_max_positions(m);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V) {
            whale_errf(&err, WHALE_ERR_RANGE, "--ids: token id %d at position %d is outside the vocabulary [0, %d)",
                       prompt[i], i, V);
            status = cli_fail(&err);
            goto out;
        }
    if (n_prompt + n_new > maxpos) {
        whale_errf(&err, WHALE_ERR_RANGE, "prompt (%d) + -n (%ld) exceeds max_position_embeddings %d", n_prompt,
                   n_new, maxpos);
        status = cli_fail(&err);
        goto out;
    }
    whale_sampler_params sp = whale_sampler_defaults();
    sp.temperature = (float)temperature;
    sp.top_k = (int)top_k;
    sp.top_p = (float)top_p;
    sp.min_p = (float)min_p;
    sp.repeat_penalty = (float)rep;
    sp.seed = (uint64_t)seed;
    hist = malloc(sizeof(int32_t) * (size_t)(n_prompt + n_new + 1));
    logits = whale_alloc(sizeof(float) * (size_t)V);
    if (!hist || !logits) {
        whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
        status = cli_fail(&err);
        goto out;
    }
    if (whale_sampler_new(&sp, V, &sm, &err) || whale_session_new(m, 1, n_prompt + (int)n_new, &s, &err)) {
        status = cli_fail(&err);
        goto out;
    }
    memcpy(hist, prompt, sizeof(int32_t) * n_prompt);
    int32_t eos[8];
    int n_eos = ignore_eos ? 0 : whale_model_eos_ids(m, eos, 8);

    double t0 = whale_now();
    if (n_new > 0 && whale_session_forward(s, prompt, 1, n_prompt, logits, 0, &err)) {
        status = cli_fail(&err);
        goto out;
    }
    double t_prompt = whale_now() - t0, t1 = whale_now();
    int produced = 0;
    for (; produced < n_new; produced++) {
        int32_t tok = whale_sample(sm, logits, hist, n_prompt + produced);
        if (tok < 0) {
            whale_errf(&err, WHALE_ERR_INTERNAL, "every logit is NaN or -inf at generated token %d", produced);
            status = cli_fail(&err);
            goto out;
        }
        hist[n_prompt + produced] = tok;
        printf("%s%d", produced ? "," : "", tok);
        fflush(stdout);
        int stop = 0;
        for (int k = 0; k < n_eos; k++) stop |= tok == eos[k];
        if (stop) {
            produced++;
            break;
        }
        if (produced + 1 < n_new && whale_session_forward(s, &tok, 1, 1, logits, 0, &err)) {
            status = cli_fail(&err);
            goto out;
        }
    }
    printf("\n");
    double t_gen = whale_now() - t1;
    fprintf(stderr, "whale: seed %ld; prompt %d tokens in %.1f ms (%.1f tokens/s); generated %d tokens in %.1f ms (%.1f tokens/s)\n",
            seed, n_prompt, t_prompt * 1e3, n_prompt / (t_prompt > 0 ? t_prompt : 1e-9), produced, t_gen * 1e3,
            produced > 1 ? (produced - 1) / t_gen : 0.0);
out:
    free(prompt);
    free(hist);
    free(logits);
    whale_sampler_free(sm);
    whale_session_free(s);
    whale_model_free(m);
    return status;
}
