/* whale export: a checkpoint in another dtype, or with a LoRA checkpoint
 * merged in, written one tensor at a time (whale_export_checkpoint). */
#include "cli/cli.h"

#include "whale_lora.h"
#include "whale_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char export_usage[] =
    "usage: whale export -m DIR --dtype bf16|fp16|fp32 --out DIR\n"
    "       whale export --adapters CKPT --merge-lora [-m BASE] [--dtype D] [--out DIR (CKPT-merged)]\n"
    "  writes config.json + model.safetensors one tensor at a time (the base is memory-mapped: the\n"
    "  memory needed is about its largest tensor, read and written), plus generation_config.json and\n"
    "  the tokenizer files. --dtype converts every floating tensor (round to nearest even; fp16 values\n"
    "  beyond 65504 become infinity and are reported); without it each tensor keeps its stored dtype.\n"
    "  --merge-lora [true|false] (alias --merge_lora): W + s*B*A from the LoRA checkpoint, computed in\n"
    "      fp32 from the stored weights and rounded once (the base comes from the checkpoint's\n"
    "      args.json unless -m is given)\n"
    "  --memory-limit GIB   refuse up front an export estimated to need more (default: the machine's)\n"
    "  --quiet              no progress or summary on stderr";

static void progress(void *user, int done, int total) {
    (void)user;
    fprintf(stderr, "\rexport: %d / %d tensors", done, total);
    if (done == total) fputc('\n', stderr);
}

/* bf16 | fp16 | fp32 in the spellings cli_dtype takes; -1 otherwise. */
static int float_dtype(const char *v, whale_dtype *dt) {
    static const char *const names[] = {"fp32", "f32", "float32", "bf16", "bfloat16", "fp16", "f16", "float16"};
    static const whale_dtype dts[] = {WHALE_F32, WHALE_F32, WHALE_F32, WHALE_BF16, WHALE_BF16,
                                      WHALE_F16, WHALE_F16, WHALE_F16};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(v, names[i])) {
            *dt = dts[i];
            return 0;
        }
    return -1;
}

/* CKPT-merged, next to the checkpoint. */
static void merged_name(const char *adapters, char *out, size_t cap) {
    size_t n = strlen(adapters);
    while (n > 1 && adapters[n - 1] == '/') n--;
    snprintf(out, cap, "%.*s-merged", (int)n, adapters);
}

static int run_export(whale_export_opts *o, int quiet) {
    whale_err err;
    whale_export_stats st;
    if (!quiet && isatty(2)) o->progress = progress;
    if (whale_export_checkpoint(o, &st, &err)) return cli_fail(&err);
    if (quiet) return 0;
    fprintf(stderr, "export: wrote %s (%s, %d tensors%s%d merged with LoRA, %lld values; planned %.1f MiB, "
            "peak RSS %.1f MiB)\n", o->out, cli_dtype_name(st.dtype), st.tensors, ", ", st.merged,
            (long long)st.values, st.planned / 1048576.0, whale_peak_rss() / 1048576.0);
    if (st.overflow)
        fprintf(stderr, "export: %lld values exceed fp16's range (65504) and became infinity\n", (long long)st.overflow);
    return 0;
}

int cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *dtname = NULL, *adapters = NULL;
    char merged_out[4200];
    int merge = 0, quiet = 0, bad;
    double limit_gib = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts(export_usage);
            return 0;
        }
        if (cli_bool_option(argc, argv, &i, "--merge-lora", &merge) || cli_bool_option(argc, argv, &i, "--quiet", &quiet))
            continue;
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("export", "%s needs a value", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--adapters")) adapters = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "--output_dir") || !strcmp(a, "--output-dir")) out = v;
        else if (!strcmp(a, "--dtype") || !strcmp(a, "--torch_dtype") || !strcmp(a, "--torch-dtype")) dtname = v;
        else if (!strcmp(a, "--memory-limit") || !strcmp(a, "--memory_limit")) {
            if ((bad = cli_float("export", a, v, 1e-6, 1e6, &limit_gib))) return bad;
        } else return cli_usage("export", "unknown option \"%s\"", a);
    }
    if (adapters && !merge) return cli_usage("export", "--adapters needs --merge-lora (the adapter files are already PEFT's)");
    if (merge && !adapters) return cli_usage("export", "--merge-lora needs --adapters CKPT");
    if (adapters && !out) merged_name(adapters, merged_out, sizeof merged_out), out = merged_out;
    if ((!dir && !adapters) || !out || (!dtname && !adapters))
        return cli_usage("export", "-m DIR, --dtype and --out DIR are required");
    whale_export_opts o = {.base = dir, .adapters = adapters, .out = out, .convert = dtname != NULL,
                           .dtype = WHALE_F32, .memory_limit = limit_gib * 1073741824.0};
    if (dtname && float_dtype(dtname, &o.dtype))
        return cli_usage("export", "--dtype must be bf16, fp16 or fp32, got \"%s\"", dtname);
    char *base = NULL, *tmpl = NULL, *sys = NULL;
    whale_err err;
    whale_code c = adapters ? whale_sft_checkpoint_base(adapters, &base, &tmpl, &sys, &err) : WHALE_OK;
    free(tmpl), free(sys);
    if (c && (!dir || c != WHALE_ERR_IO)) return cli_fail(&err); /* with -m, no args.json is fine */
    if (!dir) o.base = base;
    int status = run_export(&o, quiet);
    free(base);
    return status;
}
