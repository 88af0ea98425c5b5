/* whale export: a checkpoint in another dtype. */
#include "cli/cli.h"

#include "core/core.h"
#include "io/safetensors.h"
#include "kernels/convert.h"
#include "models/model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* whale export -m DIR --dtype bf16|fp16|fp32 --out DIR: the checkpoint with
 * every floating tensor converted (round to nearest even), tokenizer files
 * copied. Loading converts back to fp32 (exactly, for bf16 and fp16 values).
 * With --adapters CKPT --merge-lora: the base with the LoRA checkpoint merged
 * in fp32 (W + s·B·A), as `swift export --merge_lora` writes it. */
int cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *dtname = NULL, *adapters = NULL;
    char *base = NULL, merged_out[4200];
    int merge = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: whale export -m DIR --dtype bf16|fp16|fp32 --out DIR\n"
                 "       whale export --adapters CKPT --merge-lora [-m BASE] [--dtype D] [--out DIR (CKPT-merged)]\n"
                 "  writes config.json + model.safetensors with every tensor in that dtype (round to nearest\n"
                 "  even; fp16 values beyond 65504 become infinity and are reported), plus the tokenizer files;\n"
                 "  --merge-lora first merges the LoRA checkpoint into the base (fp32; the base comes from the\n"
                 "  checkpoint's args.json unless -m is given; default dtype fp32)");
            return 0;
        }
        if (!strcmp(a, "--merge-lora") || !strcmp(a, "--merge_lora")) {
            merge = 1;
            if (i + 1 < argc && (!strcmp(argv[i + 1], "true") || !strcmp(argv[i + 1], "false")))
                merge = !strcmp(argv[++i], "true");
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("export", "%s needs a value", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--adapters")) adapters = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--dtype")) dtname = v;
        else return cli_usage("export", "unknown option \"%s\"", a);
    }
    if (adapters && !merge) return cli_usage("export", "--adapters needs --merge-lora (the adapter files are already PEFT's)");
    if (merge && !adapters) return cli_usage("export", "--merge-lora needs --adapters CKPT");
    if (adapters) {
        if (!dtname) dtname = "fp32";
        if (!out) {
            size_t n = strlen(adapters);
            while (n > 1 && adapters[n - 1] == '/') n--;
            snprintf(merged_out, sizeof merged_out, "%.*s-merged", (int)n, adapters);
            out = merged_out;
        }
    }
    if ((!dir && !adapters) || !out || !dtname) return cli_usage("export", "-m DIR, --dtype and --out DIR are required");
    whale_dtype dt;
    if (!strcmp(dtname, "bf16") || !strcmp(dtname, "bfloat16")) dt = WHALE_BF16;
    else if (!strcmp(dtname, "fp16") || !strcmp(dtname, "f16") || !strcmp(dtname, "float16")) dt = WHALE_F16;
    else if (!strcmp(dtname, "fp32") || !strcmp(dtname, "f32") || !strcmp(dtname, "float32")) dt = WHALE_F32;
    else return cli_usage("export", "--dtype must be bf16, fp16 or fp32, got \"%s\"", dtname);

    whale_err err;
    whale_model *m = NULL;
    whale_st_item *items = NULL;
    whale_tensor *shapes = NULL;
    uint16_t *buf = NULL;
    int status = 0, n = 0;
    if (cli_load_model(dir, adapters, WHALE_F32, merge, &m, &base, NULL, NULL, &err)) goto fail;
    dir = base;
    n = whale_model_num_params(m);
    items = calloc((size_t)n, sizeof *items);
    shapes = calloc((size_t)n, sizeof *shapes);
    size_t total = 0;
    for (int i = 0; i < n && shapes; i++) {
        shapes[i] = whale_model_param(m, i);
        total += (size_t)whale_shape_numel(shapes[i].ndim, shapes[i].shape);
    }
    if (dt != WHALE_F32) buf = malloc(total * sizeof(uint16_t));
    if (!items || !shapes || (dt != WHALE_F32 && !buf)) {
        whale_errf(&err, WHALE_ERR_NOMEM, "out of memory converting %zu values", total);
        goto fail;
    }
    size_t off = 0;
    int64_t overflow = 0;
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)whale_shape_numel(shapes[i].ndim, shapes[i].shape);
        const float *src = shapes[i].data;
        const void *data = src;
        if (dt != WHALE_F32) {
            for (size_t k = 0; k < cnt; k++) {
                buf[off + k] = dt == WHALE_BF16 ? whale_float_to_bf16(src[k]) : whale_float_to_f16(src[k]);
                if (dt == WHALE_F16 && isfinite(src[k]) && (buf[off + k] & 0x7fff) == 0x7c00) overflow++;
            }
            data = buf + off;
            off += cnt;
        }
        items[i] = (whale_st_item){whale_model_param_name(m, i), dt, shapes[i].ndim, shapes[i].shape, data};
    }
    char path[4400], *config;
    if (whale_mkdir(out, &err) || whale_model_config_json(m, &config, &err)) goto fail;
    cJSON *cfg = cJSON_Parse(config);
    free(config);
    if (cfg) { /* record the stored dtype like transformers does */
        whale_config_set_dtype(cfg, dt);
        config = cJSON_Print(cfg);
        cJSON_Delete(cfg);
    }
    snprintf(path, sizeof path, "%s/config.json", out);
    whale_code c = config ? whale_write_file_atomic(path, config, strlen(config), &err)
                          : whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
    free(config);
    if (c) goto fail;
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (whale_st_write(path, items, n, NULL, &err)) goto fail;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) == 0 && whale_tokenizer_copy_files(dir, out, &err)) goto fail;
    fprintf(stderr, "whale: wrote %s (%s, %zu values%s)\n", out, whale_dtype_name(dt), total,
            overflow ? "; some fp16 values overflowed to infinity" : "");
    if (overflow) fprintf(stderr, "whale: %lld values exceed fp16's range (65504) and became infinity\n", (long long)overflow);
    goto out;
fail:
    status = cli_fail(&err);
out:
    free(items);
    free(shapes);
    free(buf);
    free(base);
    whale_model_free(m);
    return status;
}
