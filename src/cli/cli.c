/* Helpers shared by the commands: errors, option values, the option-table
 * parser, dtypes, sampling options and generation_config.json. */
#include "cli.h"

#include "whale_util.h"
#include "whale_lora.h"
#include "whale_train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

int cli_opt_is(const char *a, const char *opt) {
    if (strncmp(a, "--", 2) || strncmp(opt, "--", 2)) return !strcmp(a, opt);
    for (a += 2, opt += 2; *a && *opt; a++, opt++)
        if (*a != *opt && !((*a == '-' || *a == '_') && (*opt == '-' || *opt == '_'))) return 0;
    return !*a && !*opt;
}

int cli_bool_option(int argc, char **argv, int *i, const char *opt, int *flag) {
    if (!cli_opt_is(argv[*i], opt)) return 0;
    *flag = 1;
    if (*i + 1 < argc) {
        const char *v = argv[*i + 1];
        if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "True")) *flag = 1, ++*i;
        else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "False")) *flag = 0, ++*i;
    }
    return 1;
}

/* opt is one of names' '|'-separated spellings. */
static int names_match(const char *a, const char *names) {
    char one[96];
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        snprintf(one, sizeof one, "%.*s", (int)(n < sizeof one ? n : sizeof one - 1), p);
        if (cli_opt_is(a, one)) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

/* A table bound as a long; LONG_MAX's double (2^63) saturates. */
static long bound(double x) {
    return x >= 9223372036854775807.0 ? LONG_MAX : x <= -9223372036854775807.0 ? LONG_MIN : (long)x;
}

/* The value of opt o (argv[*i] is its name). */
static int take_value(const char *cmd, int argc, char **argv, int *i, const cli_opt *o) {
    const char *a = argv[*i], *v;
    long n = 0;
    double d = 0;
    int st = 0;
    if (o->kind == CLI_FLAG) {
        cli_bool_option(argc, argv, i, a, (int *)o->dst);
        return 0;
    }
    if (o->kind == CLI_SWITCH) {
        *(int *)o->dst = 1;
        return 0;
    }
    if (o->kind == CLI_COUNT) {
        *(long *)o->dst = strtol(o->note, NULL, 10);
        if (*i + 1 < argc && argv[*i + 1][0] != '-') return cli_int(cmd, a, argv[++*i], bound(o->lo), bound(o->hi), o->dst);
        return 0;
    }
    if (o->kind == CLI_PAIR) {
        const char **dst = o->dst;
        int k = 0;
        dst[0] = dst[1] = NULL;
        while (*i + 1 < argc && (argv[*i + 1][0] != '-' || !argv[*i + 1][1]) && k < 2) dst[k++] = argv[++*i];
        return k ? 0 : cli_usage(cmd, "%s needs one or two values (Chinese, English)", a);
    }
    if (o->kind == CLI_LIST) {
        cli_list *l = o->dst;
        int k = 0;
        for (; *i + 1 < argc && (argv[*i + 1][0] != '-' || !argv[*i + 1][1]); k++) {
            if (l->n == CLI_LIST_MAX) return cli_usage(cmd, "%s takes at most %d values", a, CLI_LIST_MAX);
            l->v[l->n++] = argv[++*i];
        }
        return k ? 0 : cli_usage(cmd, "%s needs at least one value", a);
    }
    if (!(v = cli_value(argc, argv, i))) return cli_usage(cmd, "%s needs a value", a);
    switch (o->kind) {
    case CLI_STR: *(const char **)o->dst = v; break;
    case CLI_EACH: {
        cli_list *l = o->dst;
        if (l->n == CLI_LIST_MAX) return cli_usage(cmd, "%s is given at most %d times", a, CLI_LIST_MAX);
        l->v[l->n++] = v;
        break;
    }
    case CLI_LONG:
        if (!(st = cli_int(cmd, a, v, bound(o->lo), bound(o->hi), &n))) *(long *)o->dst = n;
        break;
    case CLI_DOUBLE:
        if (!(st = cli_float(cmd, a, v, o->lo, o->hi, &d))) *(double *)o->dst = d;
        break;
    case CLI_DTYPE: st = cli_dtype(cmd, v, (whale_dtype *)o->dst); break;
    default: fprintf(stderr, "%s: note: %s %s: %s\n", cmd, a, v, o->note); break;
    }
    return st;
}

/* The table's CLI_ARGS entry (its array made), or NULL. */
static cli_args *positional(const cli_opt *opts, int argc, int *nomem) {
    for (const cli_opt *o = opts; o->names; o++)
        if (o->kind == CLI_ARGS) {
            cli_args *args = o->dst;
            args->n = 0;
            if (!args->v && !(args->v = calloc((size_t)(argc > 0 ? argc : 1), sizeof *args->v))) *nomem = 1;
            return args;
        }
    return NULL;
}

int cli_parse(const char *cmd, const char *help, int argc, char **argv, const cli_opt *opts,
              whale_sampler_params *sp, unsigned *given) {
    int nomem = 0;
    cli_args *args = positional(opts, argc, &nomem);
    if (nomem) {
        fprintf(stderr, "whale: out of memory\n");
        return 7;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts(help);
            return -1;
        }
        if (args && (a[0] != '-' || !a[1])) {
            args->v[args->n++] = a;
            continue;
        }
        if (args && !strcmp(a, "--")) { /* the rest are arguments, whatever they look like */
            while (++i < argc) args->v[args->n++] = argv[i];
            break;
        }
        const cli_opt *o = opts;
        while (o->names && (o->kind == CLI_ARGS || !names_match(a, o->names))) o++;
        if (o->names) {
            int st = take_value(cmd, argc, argv, &i, o);
            if (st) return st;
            continue;
        }
        int bad = 0;
        if (sp && names_match(a, "--temperature|--top-k|--top-p|--min-p|--repeat-penalty|--repetition-penalty|--seed")) {
            if (i + 1 >= argc) return cli_usage(cmd, "%s needs a value", a);
            cli_sampling_option(cmd, a, argv[++i], sp, given, &bad);
            if (bad) return bad;
            continue;
        }
        return cli_usage(cmd, a[0] == '-' ? "unknown option \"%s\"" : "unexpected argument \"%s\"", a);
    }
    return 0;
}

/* arg as a POSIX shell reads it back: as is when it is plain, else in
 * single quotes (a quote inside becomes '\''). */
static size_t shell_quote(const char *arg, char *out, size_t cap) {
    int plain = *arg != 0;
    for (const char *p = arg; *p && plain; p++)
        plain = (unsigned char)*p >= 0x80 || strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%", *p);
    size_t n = 0;
    if (plain) return (size_t)snprintf(out, cap, "%s", arg);
    if (n + 1 < cap) out[n++] = '\'';
    for (const char *p = arg; *p && n + 5 < cap; p++) {
        if (*p == '\'') memcpy(out + n, "'\\''", 4), n += 4;
        else out[n++] = *p;
    }
    if (n + 1 < cap) out[n++] = '\'';
    out[n < cap ? n : cap - 1] = 0;
    return n;
}

void cli_command_line(int argc, char **argv, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "whale");
    for (int i = 0; i < argc && n + 2 < cap; i++) {
        out[n++] = ' ';
        n += shell_quote(argv[i], out + n, cap - n);
    }
    if (n >= cap) out[cap - 1] = 0;
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
    if (cli_opt_is(a, "--temperature")) {
        if (!(*bad = cli_float(cmd, a, v, 0, 1e6, &d))) sp->temperature = (float)d;
        bit = CLI_GIVEN_TEMPERATURE;
    } else if (cli_opt_is(a, "--top-k")) {
        if (!(*bad = cli_int(cmd, a, v, 0, 1 << 30, &n))) sp->top_k = (int)n;
        bit = CLI_GIVEN_TOP_K;
    } else if (cli_opt_is(a, "--top-p")) {
        if (!(*bad = cli_float(cmd, a, v, 1e-9, 1, &d))) sp->top_p = (float)d;
        bit = CLI_GIVEN_TOP_P;
    } else if (cli_opt_is(a, "--min-p")) {
        if (!(*bad = cli_float(cmd, a, v, 0, 0.999999, &d))) sp->min_p = (float)d;
    } else if (cli_opt_is(a, "--repeat-penalty") || cli_opt_is(a, "--repetition-penalty")) {
        if (!(*bad = cli_float(cmd, a, v, 1e-6, 1e6, &d))) sp->repeat_penalty = (float)d;
        bit = CLI_GIVEN_REPEAT_PENALTY;
    } else if (cli_opt_is(a, "--seed")) {
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
whale_code cli_generation_config(const char *dir, whale_sampler_params *sp, unsigned given, const char *verbose,
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
    if (verbose && u) fprintf(stderr, "%s: sampling defaults from %s: %s\n", verbose, path, used);
    return WHALE_OK;
}


/* Text prompts need the model folder's tokenizer, whose ids must fit the
 * model's embedding. */
whale_code cli_load_tokenizer(const char *dir, const whale_model *m, whale_tokenizer **tok, whale_err *err) {
    whale_code c = whale_tokenizer_load(dir, tok, err);
    if (c) return c;
    int tv = whale_tokenizer_vocab_size(*tok), mv = whale_model_vocab_size(m);
    if (tv > mv) {
        whale_tokenizer_free(*tok);
        *tok = NULL;
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: the tokenizer has %d ids but the model's embedding only %d rows (mismatched tokenizer?)",
                          dir, tv, mv);
    }
    return WHALE_OK;
}

/* bf16 / fp16 when the checkpoint's config says so (torch_dtype, or
 * transformers 5's dtype), else fp32: the precision transformers and
 * ms-swift would run it in. */
whale_dtype cli_checkpoint_dtype(const char *dir) {
    char path[4200];
    cJSON *cfg;
    whale_err err;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (whale_read_json_object(path, &cfg, &err)) return WHALE_F32;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "torch_dtype");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(cfg, "dtype");
    whale_dtype dt = !cJSON_IsString(t)                       ? WHALE_F32
                     : !strcmp(t->valuestring, "bfloat16")   ? WHALE_BF16
                     : !strcmp(t->valuestring, "float16")    ? WHALE_F16
                                                             : WHALE_F32;
    cJSON_Delete(cfg);
    return dt;
}

static double physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0;
}

whale_code cli_check_memory(const char *dir, cli_run *run, int slots, int work_tokens, whale_err *err) {
    whale_model *skel;
    whale_code c = whale_model_skeleton(dir, &skel, err);
    if (c) return c;
    int maxpos = whale_model_max_positions(skel);
    whale_model_free(skel);
    int ctx = run->seq > 0 && run->seq < maxpos ? run->seq : maxpos;
    int work = work_tokens > 0 && work_tokens < ctx ? work_tokens : ctx;
    /* the weights and one forward's workspace, then every slot's KV cells */
    whale_memory_plan plan = {.dtype = run->dtype, .batch = 1, .seq_len = work};
    whale_memory est, kv;
    if ((c = whale_memory_estimate(dir, &plan, &est, err))) return c;
    plan.seq_len = ctx;
    if (work != ctx && (c = whale_memory_estimate(dir, &plan, &kv, err))) return c;
    size_t kv_bytes = (size_t)slots * (work != ctx ? kv.kv_cache : est.kv_cache);
    est.total += kv_bytes - est.kv_cache;
    run->estimate = est.total;
    double limit = run->memory_limit > 0 ? run->memory_limit : physical_memory(), gib = 1073741824.0;
    if (limit <= 0 || (double)est.total <= limit) return WHALE_OK;
    char slot_text[48] = "";
    if (slots > 1) snprintf(slot_text, sizeof slot_text, "%d slots of ", slots);
    return whale_errf(err, WHALE_ERR_NOMEM,
                      "%s: running it in %s with %s%d positions needs an estimated %.2f GiB (weights %.2f, KV cache %.2f) "
                      "but %s is %.2f GiB; try %s%s",
                      dir, cli_dtype_name(run->dtype), slot_text, ctx, est.total / gib,
                      (est.weights_f32 + est.weights_lowp + est.weights_mapped) / gib, kv_bytes / gib,
                      run->memory_limit > 0 ? "--memory-limit" : "the machine's memory", limit / gib,
                      run->dtype == WHALE_F32 ? "--dtype bf16 or int8" : run->dtype == WHALE_I8 ? "a smaller model" : "--dtype int8",
                      run->ctx_option ? slots > 1 ? ", a smaller --ctx-size or fewer --parallel slots" : " or a smaller --ctx-size" : "");
}

whale_code cli_load_model(const char *dir, const char *adapters, cli_run *run, whale_model **m, char **base_dir,
                          char **tmpl, char **system, whale_err *err) {
    char *base = NULL, *t = NULL, *sys = NULL;
    whale_code c;
    *m = NULL;
    *base_dir = NULL;
    if (tmpl) *tmpl = NULL;
    if (system) *system = NULL;
    if (adapters && (c = whale_sft_checkpoint_base(adapters, &base, &t, &sys, err))) {
        if (!dir || c != WHALE_ERR_IO) return c; /* with -m, a checkpoint without args.json is fine */
        base = t = sys = NULL;
    }
    const char *from = dir ? dir : base;
    if (run->dtype == CLI_DTYPE_AUTO && (run->dtype = cli_checkpoint_dtype(from)) != WHALE_F32 && run->cmd)
        fprintf(stderr, "%s: %s, the checkpoint's dtype (--dtype to change)\n", run->cmd, cli_dtype_name(run->dtype));
    if ((c = cli_check_memory(from, run, 1, 0, err)) || (c = whale_model_load_as(from, run->dtype, m, err)) ||
        (c = whale_model_own_weights(*m, err)) || (adapters && (c = whale_lora_load(*m, adapters, err)))) {
        whale_model_free(*m);
        *m = NULL;
        free(base), free(t), free(sys);
        return c;
    }
    *base_dir = strdup(from);
    free(base);
    if (tmpl) *tmpl = t;
    else free(t);
    if (system) *system = sys;
    else free(sys);
    return *base_dir ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
}
