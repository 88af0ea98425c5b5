/* whale diagnose, and the --nan-check helper of score and generate */
#include "cli.h"

#include "whale_util.h"
#include "whale_diag.h"

#include <cjson/cJSON.h>
#include <math.h>
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
    "usage: whale diagnose -m DIR (--ids FILE | --text TEXT | --text-file F) [--dtype D] [--backward]\n"
    "                      [--loss-scale S] [--json OUT.json] [--threads N]\n"
    "  runs one forward pass and measures every intermediate tensor: max|x|, RMS,\n"
    "  non-finite values, zeros, the share that is subnormal or rounds to zero in\n"
    "  bf16 / fp16, fp16 overflow, headroom in bits below each format's maximum,\n"
    "  and per layer the routing margins of the MoE gate (docs/numerics.md).\n"
    "  --ids FILE        JSON array of equal-length arrays of token ids\n"
    "  --text TEXT       text, encoded with the model folder's tokenizer\n"
    "  --text-file F     the same from a file\n"
    "  --dtype D         fp32 (default), bf16, fp16 or int8: precision of the weight products.\n"
    "                    Other than fp32, the same input also runs in fp32 and every tensor\n"
    "                    gets its deviation from it (max|dx|, relative RMS, values lost to\n"
    "                    zero) and every MoE layer the share of tokens routed differently\n"
    "  --backward        also run a training step (labels = the ids) and measure the\n"
    "                    gradients grad.X of every traced tensor X (not with int8)\n"
    "  --loss-scale S    the training step's gradients are of S × loss (default 1: the\n"
    "                    raw gradients, whose fp16 underflow is what loss scaling fixes)\n"
    "  --json OUT.json   also write everything as JSON ('-' = stdout instead of the table)\n"
    "  --threads N       (default: all cores)";

/* Copies of the fp32 run kept for the comparison: far more than a
 * diagnosis input needs (tiny: ~1 MiB; 100m × 162 tokens: ~150 MiB), and
 * a bound that a very long input cannot pass silently (the summary counts
 * what was not compared). */
#define REF_MAX_BYTES ((size_t)1 << 30)

/* The run's description stored under "run" in the JSON report. */
static char *run_json(const char *dir, int B, int S, whale_dtype dt, int ref, int backward, double loss_scale,
                      double loss, double ref_loss) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", dir);
    cJSON_AddStringToObject(j, "dtype", cli_dtype_name(dt));
    cJSON_AddNumberToObject(j, "batch", B);
    cJSON_AddNumberToObject(j, "seq_len", S);
    if (ref) cJSON_AddStringToObject(j, "reference", "fp32");
    else cJSON_AddNullToObject(j, "reference");
    cJSON_AddBoolToObject(j, "backward", backward);
    if (backward) cJSON_AddNumberToObject(j, "loss_scale", loss_scale);
    if (isfinite(loss)) cJSON_AddNumberToObject(j, "loss", loss);
    else cJSON_AddNullToObject(j, "loss");
    if (ref && isfinite(ref_loss)) cJSON_AddNumberToObject(j, "reference_loss", ref_loss);
    else if (ref) cJSON_AddNullToObject(j, "reference_loss");
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

/* The training step repeats the forward pass the inference session already
 * traced; only its gradients go to the collector. */
static void trace_grads(void *user, const char *name, const whale_tensor *t) {
    if (!strncmp(name, "grad.", 5)) whale_diag_trace(user, name, t);
}

/* One traced run of the input in the model's current precision: a forward
 * pass with all logits, then (backward) a training step on the same ids. */
static whale_code run_pass(whale_model *m, whale_diag *d, const int32_t *ids, int B, int S, float *logits,
                           int backward, double loss_scale, double *loss, whale_err *err) {
    whale_session *s = NULL;
    whale_code c = whale_session_new(m, B, S, &s, err);
    if (c) return c;
    whale_diag_set_phase(d, "forward");
    whale_session_set_trace(s, whale_diag_trace, d);
    c = whale_session_forward(s, ids, B, S, logits, 1, err);
    whale_session_free(s);
    if (c) return c;
    int64_t count;
    *loss = whale_cross_entropy(logits, ids, B, S, whale_model_vocab_size(m), &count);
    if (!backward) return WHALE_OK;
    if ((c = whale_train_session_new(m, B, S, 0, &s, err))) return c;
    double train_loss;
    whale_diag_set_phase(d, "backward");
    whale_session_set_trace(s, trace_grads, d);
    c = whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, loss_scale, &train_loss, &count, err);
    whale_session_free(s);
    return c;
}

/* A diagnosis: its options, the model and input, the collectors and losses. */
typedef struct {
    const char *dir, *ids_path, *text, *text_file, *json;
    whale_dtype dtype;
    long threads;
    int backward;
    double loss_scale; /* 0: not given (the option's range excludes it) */
    whale_model *m;
    whale_tokenizer *tok;
    whale_diag *d, *ref;
    int32_t *ids;
    char *file_text, *run;
    float *logits;
    int B, S;
    double loss, ref_loss;
} diag_t;

/* 0, -1 after --help, or the usage status. */
static int diag_parse(int argc, char **argv, diag_t *g) {
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &g->dir, 0, 0, NULL},
        {"--ids", CLI_STR, &g->ids_path, 0, 0, NULL},
        {"--text", CLI_STR, &g->text, 0, 0, NULL},
        {"--text-file", CLI_STR, &g->text_file, 0, 0, NULL},
        {"--json", CLI_STR, &g->json, 0, 0, NULL},
        {"--threads", CLI_LONG, &g->threads, 1, 1024, NULL},
        {"--dtype", CLI_DTYPE, &g->dtype, 0, 0, NULL},
        {"--loss-scale", CLI_DOUBLE, &g->loss_scale, 1e-30, 1e30, NULL},
        {"--backward", CLI_FLAG, &g->backward, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int st = cli_parse("diagnose", help_text, argc, argv, table, NULL, NULL);
    if (st) return st;
    const int scale_given = g->loss_scale != 0;
    if (!scale_given) g->loss_scale = 1;
    if (!g->dir || (!!g->ids_path + !!g->text + !!g->text_file) != 1)
        return cli_usage("diagnose", "-m DIR and exactly one of --ids FILE, --text TEXT or --text-file F are required");
    if (g->backward && g->dtype == WHALE_I8)
        return cli_usage("diagnose", "--backward needs --dtype fp32, bf16 or fp16 (int8 runs inference only)");
    if (scale_given && !g->backward) return cli_usage("diagnose", "--loss-scale applies to --backward only");
    return 0;
}

/* The model (fp32 master weights stay loaded: the reference run needs
 * them) and the input as ids. */
static whale_code diag_load(diag_t *g, whale_err *err) {
    whale_code c = whale_model_load(g->dir, &g->m, err);
    if (c) return c;
    if (g->ids_path) return whale_read_ids_file(g->ids_path, whale_model_vocab_size(g->m), &g->ids, &g->B, &g->S, err);
    size_t len = 0;
    const char *what = g->text ? "--text" : g->text_file;
    if (g->text_file) {
        if ((c = whale_read_file(g->text_file, &g->file_text, &len, err))) return c;
        g->text = g->file_text;
    } else len = strlen(g->text);
    if ((c = cli_load_tokenizer(g->dir, g->m, &g->tok, err)) ||
        (c = whale_tokenizer_encode(g->tok, g->text, len, 1, &g->ids, &g->S, err)))
        return c;
    if (g->S == 0) return whale_errf(err, WHALE_ERR_ARG, "%s: the text encodes to no tokens", what);
    return WHALE_OK;
}

/* The input fits one forward pass (and a training step); the logits. */
static whale_code diag_check(diag_t *g, whale_err *err) {
    const char *src = g->ids_path ? g->ids_path : g->text_file ? g->text_file : "--text";
    int maxpos = whale_model_max_positions(g->m);
    if (g->S > maxpos) /* one forward pass: the whole input must fit */
        return whale_errf(err, WHALE_ERR_RANGE, "%s: %d tokens exceed max_position_embeddings %d (use a shorter input)",
                          src, g->S, maxpos);
    if (g->backward && g->S < 2)
        return whale_errf(err, WHALE_ERR_ARG, "--backward: %s has %d token per sequence; a training step needs 2 or more",
                          src, g->S);
    size_t n = (size_t)g->B * g->S * whale_model_vocab_size(g->m);
    if (!(g->logits = whale_alloc(n * sizeof(float))))
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of logits for %d × %d tokens",
                          n * 4 / 1048576.0, g->B, g->S);
    return WHALE_OK;
}

/* The traced runs: in fp32 first when --dtype is another (its copies are
 * what the run in dtype is measured against), then in dtype. */
static whale_code diag_measure(diag_t *g, whale_err *err) {
    whale_code c;
    if (g->dtype != WHALE_F32) {
        if (!(g->ref = whale_diag_new(0))) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        whale_diag_keep_values(g->ref, REF_MAX_BYTES);
        if ((c = whale_diag_set_model(g->ref, g->m, err)) ||
            (c = run_pass(g->m, g->ref, g->ids, g->B, g->S, g->logits, g->backward, g->loss_scale, &g->ref_loss, err)) ||
            (c = whale_model_set_dtype(g->m, g->dtype, err)))
            return c;
    }
    if (!(g->d = whale_diag_new(0))) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if (g->ref) whale_diag_set_reference(g->d, g->ref, "fp32");
    if ((c = whale_diag_set_model(g->d, g->m, err))) return c;
    return run_pass(g->m, g->d, g->ids, g->B, g->S, g->logits, g->backward, g->loss_scale, &g->loss, err);
}

/* The summary lines and the table of every tensor. */
static void diag_print(const diag_t *g) {
    printf("model %s: %d × %d tokens, %s products; loss %.6f", g->dir, g->B, g->S, cli_dtype_name(g->dtype), g->loss);
    if (g->ref) printf(" (fp32 %.6f)", g->ref_loss);
    printf("\n");
    if (g->ref) {
        int64_t dropped;
        size_t kept = whale_diag_kept_bytes(g->ref, &dropped);
        printf("compared with an fp32 run of the same tokens (%.1f MiB of fp32 copies%s)\n", kept / 1048576.0,
               dropped ? "; some tensors over the 1 GiB limit are not compared" : "");
    }
    if (g->backward) printf("with a training step: gradients of %g × the mean loss, labels = the ids\n", g->loss_scale);
    printf("\n");
    whale_diag_print_table(g->d, stdout);
    fflush(stdout);
}

/* --json: the run's description and the measurements. */
static whale_code diag_report(diag_t *g, whale_err *err) {
    if (!(g->run = run_json(g->dir, g->B, g->S, g->dtype, g->ref != NULL, g->backward, g->loss_scale, g->loss,
                            g->ref_loss)))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    return write_report(g->d, g->json, g->run, err);
}

int cmd_diagnose(int argc, char **argv) {
    diag_t g = {.dtype = WHALE_F32, .B = 1, .loss = NAN, .ref_loss = NAN};
    int status = diag_parse(argc, argv, &g);
    if (status) return status < 0 ? 0 : status;
    whale_set_threads((int)g.threads);
    whale_err err;
    if (diag_load(&g, &err) || diag_check(&g, &err) || diag_measure(&g, &err)) status = cli_fail(&err);
    else {
        if (!g.json || strcmp(g.json, "-")) diag_print(&g);
        if (g.json && diag_report(&g, &err)) status = cli_fail(&err);
    }
    free(g.run);
    free(g.logits);
    free(g.ids);
    free(g.file_text);
    whale_diag_free(g.d);
    whale_diag_free(g.ref);
    whale_tokenizer_free(g.tok);
    whale_model_free(g.m);
    return status;
}
