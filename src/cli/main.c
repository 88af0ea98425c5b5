/* whale: the nanowhale.c command-line program. */
#include "cli/cli.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: whale COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  info      -m DIR                        architecture, parameter counts, memory\n"
    "  init      --preset NAME|FILE.json --out DIR [--seed N]   random weights, HF layout\n"
    "  score     -m DIR --ids FILE [--logits-out FILE]          loss / perplexity of token ids\n"
    "  generate  -m DIR --ids 0,15,27 [-n N] [sampling options] generate token ids\n"
    "  bench     (-m DIR | --preset NAME) --what forward|prefill|decode   speed\n"
    "  chat      -m DIR [--system TEXT]                            interactive chat (or from a pipe)\n"
    "  chat-eval (-m DIR | --adapters CKPT) --data EVAL.jsonl ...   score identity answers (self-cognition)\n"
    "  chat-template -m DIR --messages FILE.json [--ids]          render a conversation (apply_chat_template)\n"
    "  grad      -m DIR --ids FILE --out GRADS.safetensors         gradient of the mean loss\n"
    "  tokenizer train --vocab-size N --out DIR FILES...           train a byte-level BPE tokenizer\n"
    "  data prepare --tokenizer DIR --out DIR FILES...             text to token shards\n"
    "  train     --init PRESET|DIR --data DIR --out DIR            train (or resume) a model\n"
    "  sft       -m DIR --data F.jsonl [--train-type lora|full]    fine-tune on chat data (LoRA or full)\n"
    "  eval      -m DIR --data DIR                                 validation loss and perplexity\n"
    "  export    -m DIR --dtype bf16|fp16|fp32 --out DIR           checkpoint in another dtype\n"
    "  precision-report -m DIR (--ids FILE | --data DIR) [--steps N]  fp32, bf16, fp16, int8 side by side\n"
    "  plot      RUN... --out loss.svg                             loss curves as SVG\n"
    "  tokenize  -m DIR \"text\" | --file F [--show]                text to token ids\n"
    "  detokenize -m DIR --ids 1,2,3 [--skip-special]                token ids to text\n"
    "  diagnose  -m DIR (--ids FILE | --text TEXT) [--json OUT]     numerics: ranges, underflow, routing margins\n"
    "  memory    --config PRESET|DIR --dtype D [--train full|lora]  memory a run needs, by category\n"
    "  serve     -m DIR [--port 8080] [--parallel N] [--api-key KEY]   OpenAI-compatible HTTP server\n"
    "\n"
    "Run 'whale COMMAND --help' for a command's options. Exit status: 0 ok, 2 usage,\n"
    "3 i/o, 4 malformed input, 5 out of range, 6 unsupported, 7 out of memory, 1 other.\n";

int cli_fail(const whale_err *err) {
    fprintf(stderr, "whale: %s\n", err->msg);
    return whale_exit_status(err->code);
}

int cli_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "whale %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'whale %s --help')\n", cmd);
    return 2;
}

int cli_int(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi)
        return cli_usage(cmd, "%s expects an integer in [%ld, %ld], got \"%s\"", opt, lo, hi, val);
    *out = v;
    return 0;
}

int cli_float(const char *cmd, const char *opt, const char *val, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !(v >= lo && v <= hi))
        return cli_usage(cmd, "%s expects a number in [%g, %g], got \"%s\"", opt, lo, hi, val);
    *out = v;
    return 0;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) return NULL;
    return argv[++*i];
}

int cli_parse_id_list(const char *cmd, const char *text, int32_t **ids, int *n) {
    int cap = 16, count = 0;
    int32_t *out = malloc(sizeof(int32_t) * cap);
    const char *p = text;
    while (out) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
            free(out);
            return cli_usage(cmd, "--ids expects comma-separated integers, got \"%s\"", text);
        }
        if (count == cap) {
            int32_t *grown = realloc(out, sizeof(int32_t) * (cap *= 2));
            if (!grown) break;
            out = grown;
        }
        out[count++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == 0) {
            *ids = out;
            *n = count;
            return 0;
        }
        if (*p != ',') {
            free(out);
            return cli_usage(cmd, "--ids expects comma-separated integers, got \"%s\"", text);
        }
        p++;
    }
    free(out);
    fprintf(stderr, "whale: out of memory\n");
    return 7;
}

int cli_dtype(const char *cmd, const char *v, whale_dtype *dt) {
    if (!strcmp(v, "fp32") || !strcmp(v, "f32") || !strcmp(v, "float32")) *dt = WHALE_F32;
    else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) *dt = WHALE_BF16;
    else if (!strcmp(v, "fp16") || !strcmp(v, "f16") || !strcmp(v, "float16")) *dt = WHALE_F16;
    else if (!strcmp(v, "int8") || !strcmp(v, "i8")) *dt = WHALE_I8;
    else return cli_usage(cmd, "--dtype must be fp32, bf16, fp16 or int8, got \"%s\"", v);
    return 0;
}

const char *cli_dtype_name(whale_dtype dt) {
    switch (dt) {
    case WHALE_BF16: return "bf16";
    case WHALE_F16: return "fp16";
    case WHALE_I8: return "int8";
    default: return "fp32";
    }
}

whale_sampler_params cli_sampling_defaults(void) {
    whale_sampler_params sp = whale_sampler_defaults();
    sp.temperature = 0.7f;
    sp.top_k = 50;
    sp.top_p = 0.9f;
    sp.seed = (uint64_t)time(NULL);
    return sp;
}

int cli_sampling_option(const char *cmd, const char *a, const char *v, whale_sampler_params *sp, unsigned *given,
                        int *bad) {
    long n = 0;
    double d = 0;
    unsigned bit = 0;
    *bad = 0;
    if (!strcmp(a, "--temperature")) {
        if (!(*bad = cli_float(cmd, a, v, 0, 1e6, &d))) sp->temperature = (float)d;
        bit = CLI_GIVEN_TEMPERATURE;
    } else if (!strcmp(a, "--top-k")) {
        if (!(*bad = cli_int(cmd, a, v, 0, 1 << 30, &n))) sp->top_k = (int)n;
        bit = CLI_GIVEN_TOP_K;
    } else if (!strcmp(a, "--top-p")) {
        if (!(*bad = cli_float(cmd, a, v, 1e-9, 1, &d))) sp->top_p = (float)d;
        bit = CLI_GIVEN_TOP_P;
    } else if (!strcmp(a, "--min-p")) {
        if (!(*bad = cli_float(cmd, a, v, 0, 0.999999, &d))) sp->min_p = (float)d;
    } else if (!strcmp(a, "--repeat-penalty") || !strcmp(a, "--repetition-penalty")) {
        if (!(*bad = cli_float(cmd, a, v, 1e-6, 1e6, &d))) sp->repeat_penalty = (float)d;
        bit = CLI_GIVEN_REPEAT_PENALTY;
    } else if (!strcmp(a, "--seed")) {
        if (!(*bad = cli_int(cmd, a, v, 0, 0x7fffffffffffffffL, &n))) sp->seed = (uint64_t)n;
    } else {
        return 0;
    }
    *given |= bit;
    return 1;
}

/* generation_config.json's sampling fields (as transformers reads them):
 * do_sample false means greedy; temperature, top_k, top_p,
 * repetition_penalty fill what the command line did not give. */
whale_code cli_generation_config(const char *dir, whale_sampler_params *sp, unsigned given, int verbose,
                                 whale_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (access(path, R_OK) != 0) return WHALE_OK;
    cJSON *j;
    whale_code c = whale_read_json_object(path, &j, err);
    if (c) return c;
    const cJSON *v;
    char used[256] = "";
    size_t u = 0;
#define FIELD(key, bit, lo, hi, assign)                                                                          \
    if ((v = cJSON_GetObjectItemCaseSensitive(j, key)) && !cJSON_IsNull(v) && !(given & (bit))) {                \
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= (lo) && v->valuedouble <= (hi))) {                          \
            cJSON_Delete(j);                                                                                      \
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: \"%s\" must be a number in [%g, %g]", path, key,        \
                              (double)(lo), (double)(hi));                                                       \
        }                                                                                                         \
        assign;                                                                                                   \
        u += (size_t)snprintf(used + u, sizeof used - u, "%s%s %g", u ? ", " : "", key, v->valuedouble);          \
    }
    FIELD("temperature", CLI_GIVEN_TEMPERATURE, 0, 1e6, sp->temperature = (float)v->valuedouble)
    FIELD("top_k", CLI_GIVEN_TOP_K, 0, 1 << 30, sp->top_k = (int)v->valuedouble)
    FIELD("top_p", CLI_GIVEN_TOP_P, 1e-9, 1, sp->top_p = (float)v->valuedouble)
    FIELD("repetition_penalty", CLI_GIVEN_REPEAT_PENALTY, 1e-6, 1e6, sp->repeat_penalty = (float)v->valuedouble)
#undef FIELD
    v = cJSON_GetObjectItemCaseSensitive(j, "do_sample");
    if (cJSON_IsFalse(v) && !(given & CLI_GIVEN_TEMPERATURE)) { /* transformers: greedy */
        sp->temperature = 0;
        u += (size_t)snprintf(used + u, sizeof used - u, "%sdo_sample false (greedy)", u ? ", " : "");
    }
    cJSON_Delete(j);
    if (verbose && u) fprintf(stderr, "whale: sampling defaults from %s: %s\n", path, used);
    return WHALE_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: whale COMMAND [options] (commands: info init score generate chat chat-template grad train eval export precision-report data plot tokenizer bench tokenize detokenize diagnose memory serve; see 'whale --help')\n");
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    const char *cmd = argv[1];
    whale_err err;
    if (whale_isa_init(&err)) return cli_fail(&err); /* a WHALE_ISA that names no tier */
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"info", cmd_info}, {"init", cmd_init}, {"score", cmd_score}, {"generate", cmd_generate}, {"chat", cmd_chat}, {"bench", cmd_bench},
                  {"tokenize", cmd_tokenize}, {"grad", cmd_grad}, {"train", cmd_train_model}, {"sft", cmd_sft}, {"chat-eval", cmd_chat_eval}, {"chat-template", cmd_chat_template}, {"eval", cmd_eval}, {"export", cmd_export},
                  {"precision-report", cmd_precision_report},
                  {"data", cmd_data}, {"plot", cmd_plot}, {"tokenizer", cmd_tokenizer}, {"detokenize", cmd_detokenize}, {"diagnose", cmd_diagnose}, {"memory", cmd_memory}, {"serve", cmd_serve}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "whale: unknown command \"%s\" (see 'whale --help')\n", cmd);
    return 2;
}
