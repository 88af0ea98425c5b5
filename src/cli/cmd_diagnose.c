/* whale diagnose, and the --nan-check helper of score and generate */
#include "cli/cli.h"

#include "core/core.h"
#include "whale_diag.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

whale_code cli_nan_check_attach(whale_session *s, whale_diag **out, whale_err *err) {
    whale_diag *d = whale_diag_new(1);
    if (!d) return whale_errf(err, WHALE_ERR_NOMEM, "--nan-check: out of memory");
    whale_session_set_trace(s, whale_diag_trace, d);
    *out = d;
    return WHALE_OK;
}

static const char help_text[] =
    "usage: whale diagnose -m DIR (--ids FILE | --text TEXT | --text-file F) [--json OUT.json] [--threads N]\n"
    "  runs one forward pass and measures every intermediate tensor: max|x|, RMS,\n"
    "  non-finite values, zeros, the share that is subnormal or rounds to zero in\n"
    "  bf16 / fp16, fp16 overflow, headroom in bits below each format's maximum,\n"
    "  and per layer the routing margins of the MoE gate (docs/numerics.md).\n"
    "  --ids FILE        JSON array of equal-length arrays of token ids\n"
    "  --text TEXT       text, encoded with the model folder's tokenizer\n"
    "  --text-file F     the same from a file\n"
    "  --json OUT.json   also write everything as JSON ('-' = stdout instead of the table)\n"
    "  --dtype fp32|bf16 compute precision of the run (bf16: weight products in bf16)\n"
    "  --threads N       (default: all cores)";

/* The run's description stored under "run" in the JSON report. */
static char *run_json(const char *dir, int B, int S, whale_dtype dt) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", dir);
    cJSON_AddStringToObject(j, "dtype", dt == WHALE_BF16 ? "bf16" : "fp32");
    cJSON_AddNumberToObject(j, "batch", B);
    cJSON_AddNumberToObject(j, "seq_len", S);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return text;
}

static whale_code write_report(const whale_diag *d, const char *path, const char *run, whale_err *err) {
    if (!strcmp(path, "-")) return whale_diag_write_json(d, stdout, run, err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    whale_code c = whale_diag_write_json(d, f, run, err);
    if (fclose(f) && !c) c = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    if (!c) c = whale_write_file_atomic(path, buf, len, err);
    free(buf);
    return c;
}

int cmd_diagnose(int argc, char **argv) {
    const char *dir = NULL, *ids_path = NULL, *text = NULL, *text_file = NULL, *json = NULL;
    whale_dtype dtype = WHALE_F32;
    long threads = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts(help_text);
            return 0;
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        static const char *const with_value[] = {"-m", "--model", "--ids", "--text", "--text-file",
                                                 "--json", "--threads", "--dtype"};
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) known |= !strcmp(a, with_value[k]);
        if (!known) return cli_usage("diagnose", "unknown option \"%s\"", a);
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("diagnose", "%s needs a value", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--ids")) ids_path = v;
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--text-file")) text_file = v;
        else if (!strcmp(a, "--json")) json = v;
        else if (!strcmp(a, "--threads")) {
            if (cli_int("diagnose", a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--dtype")) {
            if (cli_dtype("diagnose", v, &dtype)) return 2;
        }
    }
    if (!dir || (!!ids_path + !!text + !!text_file) != 1)
        return cli_usage("diagnose", "-m DIR and exactly one of --ids FILE, --text TEXT or --text-file F are required");
    whale_set_threads((int)threads);

    whale_err err;
    whale_model *m = NULL;
    whale_tokenizer *tok = NULL;
    whale_session *s = NULL;
    whale_diag *d = NULL;
    int32_t *ids = NULL;
    char *file_text = NULL, *run = NULL;
    float *logits = NULL;
    int B = 1, S = 0, status = 0;
    if (whale_model_load(dir, &m, &err) || whale_model_set_dtype(m, dtype, &err)) goto fail;
    int V = whale_model_vocab_size(m);
    if (ids_path) {
        if (cli_read_ids_file(ids_path, V, &ids, &B, &S, &err)) goto fail;
    } else {
        size_t len = 0;
        const char *what = text ? "--text" : text_file;
        if (text_file) {
            if (whale_read_file(text_file, &file_text, &len, &err)) goto fail;
            text = file_text;
        } else len = strlen(text);
        if (cli_load_tokenizer(dir, m, &tok, &err) || whale_tokenizer_encode(tok, text, len, 1, &ids, &S, &err))
            goto fail;
        if (S == 0) {
            whale_errf(&err, WHALE_ERR_ARG, "%s: the text encodes to no tokens", what);
            goto fail;
        }
    }
    if (S > whale_model_max_positions(m)) { /* one forward pass: the whole input must fit */
        whale_errf(&err, WHALE_ERR_RANGE, "%s: %d tokens exceed max_position_embeddings %d (use a shorter input)",
                   ids_path ? ids_path : text_file ? text_file : "--text", S, whale_model_max_positions(m));
        goto fail;
    }
    size_t n = (size_t)B * S * V;
    if (!(logits = whale_alloc(n * sizeof(float)))) {
        whale_errf(&err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of logits for %d × %d tokens",
                   n * 4 / 1048576.0, B, S);
        goto fail;
    }
    if (!(d = whale_diag_new(0))) {
        whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (whale_diag_set_model(d, m, &err) || whale_session_new(m, B, S, &s, &err)) goto fail;
    whale_session_set_trace(s, whale_diag_trace, d);
    if (whale_session_forward(s, ids, B, S, logits, 1, &err)) goto fail;

    if (!json || strcmp(json, "-")) {
        printf("model %s: %d × %d tokens, %s\n\n", dir, B, S, dtype == WHALE_BF16 ? "bf16" : "fp32");
        whale_diag_print_table(d, stdout);
        fflush(stdout);
    }
    if (json) {
        if (!(run = run_json(dir, B, S, dtype))) {
            whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if (write_report(d, json, run, &err)) goto fail;
    }
    goto out;
fail:
    status = cli_fail(&err);
out:
    free(run);
    free(logits);
    free(ids);
    free(file_text);
    whale_session_free(s);
    whale_diag_free(d);
    whale_tokenizer_free(tok);
    whale_model_free(m);
    return status;
}
