/* whale export: a checkpoint in another dtype, or with a LoRA checkpoint
 * merged in, written one tensor at a time (whale_export_checkpoint): as a
 * Hugging Face folder or as one GGUF file for llama.cpp and Ollama. */
#include "cli.h"

#include "whale_lora.h"
#include "whale_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char export_usage[] =
    "usage: whale export -m DIR --dtype bf16|fp16|fp32 --out DIR\n"
    "       whale export -m DIR --format gguf [--dtype f32|f16|bf16|q8_0] --out FILE.gguf\n"
    "       whale export --adapters CKPT --merge-lora [-m BASE] [--format gguf] [--dtype D] [--out OUT]\n"
    "  writes config.json + model.safetensors one tensor at a time (the base is memory-mapped: the\n"
    "  memory needed is about its largest tensor, read and written), plus generation_config.json and\n"
    "  the tokenizer files. --dtype converts every floating tensor (round to nearest even; fp16 values\n"
    "  beyond 65504 become infinity and are reported); without it each tensor keeps its stored dtype.\n"
    "  --format gguf        one GGUF file for llama.cpp / Ollama (qwen2, llama, qwen3): llama.cpp's tensor\n"
    "      names and hyperparameters, the tokenizer and chat template; --dtype is the type of the 2-D\n"
    "      weights (q8_0: ggml's 8-bit blocks; norms and biases stay f32; default: the checkpoint's)\n"
    "  --merge-lora [true|false] (alias --merge_lora): W + s*B*A from the LoRA checkpoint, computed in\n"
    "      fp32 from the stored weights and rounded once (the base comes from the checkpoint's\n"
    "      args.json unless -m is given); --out defaults to CKPT-merged (CKPT-merged.gguf)\n"
    "  --memory-limit GIB   refuse up front an export estimated to need more (default: the machine's)\n"
    "  --quiet              no progress or summary on stderr";

static void progress(void *user, int done, int total) {
    (void)user;
    fprintf(stderr, "\rexport: %d / %d tensors", done, total);
    if (done == total) fputc('\n', stderr);
}

/* A --dtype spelling: bf16 | fp16 | fp32 (safetensors), and q8_0 for GGUF. */
static int parse_dtype(const char *v, int gguf, whale_dtype *dt, whale_gguf_dtype *gt) {
    static const struct {
        const char *name;
        whale_dtype dt;
        whale_gguf_dtype gt;
    } names[] = {{"fp32", WHALE_F32, WHALE_GGUF_F32},   {"f32", WHALE_F32, WHALE_GGUF_F32},
                 {"float32", WHALE_F32, WHALE_GGUF_F32}, {"bf16", WHALE_BF16, WHALE_GGUF_BF16},
                 {"bfloat16", WHALE_BF16, WHALE_GGUF_BF16}, {"fp16", WHALE_F16, WHALE_GGUF_F16},
                 {"f16", WHALE_F16, WHALE_GGUF_F16},     {"float16", WHALE_F16, WHALE_GGUF_F16},
                 {"q8_0", WHALE_I8, WHALE_GGUF_Q8_0}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(v, names[i].name) && (gguf || names[i].dt != WHALE_I8)) {
            *dt = names[i].dt, *gt = names[i].gt;
            return 0;
        }
    return -1;
}

static const char *gguf_dtype_name(whale_gguf_dtype t) {
    return t == WHALE_GGUF_F32 ? "f32" : t == WHALE_GGUF_F16 ? "f16" : t == WHALE_GGUF_BF16 ? "bf16" : "q8_0";
}

/* CKPT-merged (+ suffix), next to the checkpoint. */
static void merged_name(const char *adapters, const char *suffix, char *out, size_t cap) {
    size_t n = strlen(adapters);
    while (n > 1 && adapters[n - 1] == '/') n--;
    snprintf(out, cap, "%.*s-merged%s", (int)n, adapters, suffix);
}

static int run_export(whale_export_opts *o, int quiet) {
    whale_err err;
    whale_export_stats st;
    if (!quiet && isatty(2)) o->progress = progress;
    if (whale_export_checkpoint(o, &st, &err)) return cli_fail(&err);
    if (quiet) return 0;
    fprintf(stderr, "export: wrote %s (%s%s, %d tensors, %d merged with LoRA, %lld values; planned %.1f MiB, "
            "peak RSS %.1f MiB)\n", o->out, o->format == WHALE_EXPORT_GGUF ? "GGUF " : "",
            o->format == WHALE_EXPORT_GGUF ? gguf_dtype_name(o->gguf_dtype) : cli_dtype_name(st.dtype), st.tensors,
            st.merged, (long long)st.values, st.planned / 1048576.0, whale_peak_rss() / 1048576.0);
    if (st.overflow)
        fprintf(stderr, "export: %lld values exceed fp16's range (65504) and became infinity\n", (long long)st.overflow);
    return 0;
}

int cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *dtname = NULL, *adapters = NULL, *format = "safetensors";
    char merged_out[4200];
    int merge = 0, quiet = 0;
    double limit_gib = 0;
    const cli_opt opts[] = {
        {"-m|--model", CLI_STR, &dir, 0, 0, NULL},
        {"--adapters", CLI_STR, &adapters, 0, 0, NULL},
        {"--out|--output-dir", CLI_STR, &out, 0, 0, NULL},
        {"--dtype|--torch-dtype", CLI_STR, &dtname, 0, 0, NULL},
        {"--format", CLI_STR, &format, 0, 0, NULL},
        {"--merge-lora", CLI_FLAG, &merge, 0, 0, NULL},
        {"--quiet", CLI_FLAG, &quiet, 0, 0, NULL},
        {"--memory-limit", CLI_DOUBLE, &limit_gib, 1e-6, 1e6, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int st = cli_parse("export", export_usage, argc, argv, opts, NULL, NULL);
    if (st) return st < 0 ? 0 : st;
    int gguf = !strcmp(format, "gguf");
    if (!gguf && strcmp(format, "safetensors"))
        return cli_usage("export", "--format must be safetensors or gguf, got \"%s\"", format);
    if (adapters && !merge) return cli_usage("export", "--adapters needs --merge-lora (the adapter files are already PEFT's)");
    if (merge && !adapters) return cli_usage("export", "--merge-lora needs --adapters CKPT");
    if (adapters && !out) merged_name(adapters, gguf ? ".gguf" : "", merged_out, sizeof merged_out), out = merged_out;
    if ((!dir && !adapters) || !out || (!dtname && !adapters && !gguf))
        return cli_usage("export", gguf ? "-m DIR and --out FILE.gguf are required" : "-m DIR, --dtype and --out DIR are required");
    whale_export_opts o = {.base = dir, .adapters = adapters, .out = out, .convert = dtname && !gguf,
                           .dtype = WHALE_F32, .memory_limit = limit_gib * 1073741824.0,
                           .format = gguf ? WHALE_EXPORT_GGUF : WHALE_EXPORT_SAFETENSORS};
    if (dtname && parse_dtype(dtname, gguf, &o.dtype, &o.gguf_dtype))
        return cli_usage("export", gguf ? "--dtype must be f32, f16, bf16 or q8_0, got \"%s\""
                                        : "--dtype must be bf16, fp16 or fp32, got \"%s\"", dtname);
    char *base = NULL, *tmpl = NULL, *sys = NULL;
    whale_err err;
    whale_code c = adapters ? whale_sft_checkpoint_base(adapters, &base, &tmpl, &sys, &err) : WHALE_OK;
    free(tmpl), free(sys);
    if (c && (!dir || c != WHALE_ERR_IO)) return cli_fail(&err); /* with -m, no args.json is fine */
    if (!dir) o.base = base;
    if (gguf && !dtname) { /* the checkpoint's own dtype */
        whale_dtype cd = cli_checkpoint_dtype(o.base);
        o.gguf_dtype = cd == WHALE_BF16 ? WHALE_GGUF_BF16 : cd == WHALE_F16 ? WHALE_GGUF_F16 : WHALE_GGUF_F32;
    }
    int status = run_export(&o, quiet);
    free(base);
    return status;
}
