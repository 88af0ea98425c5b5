/* The streamed export (whale_export_checkpoint) against the in-memory merge
 * (whale_lora_load + whale_lora_merge on an fp32 model): bit for bit in
 * fp32, for nanowhale and for Qwen2 (plain and rsLoRA); from a BF16 base
 * the BF16 output is the fp32 merge rounded once; the side files are
 * copied; adapters that name modules the base lacks, an export over the
 * memory limit and an output folder that is the base are refused. */
#include "testutil.h"

#include "whale_safetensors.h"
#include "kernels/convert.h"
#include "whale.h"
#include "whale_lora.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The base merged in memory, in fp32. */
static whale_model *merged_in_memory(const char *base, const char *adapters) {
    whale_err err;
    whale_model *m = NULL;
    CHECK(whale_model_load_as(base, WHALE_F32, &m, &err) == WHALE_OK, "%s", err.msg);
    CHECK(m && whale_lora_load(m, adapters, &err) == WHALE_OK, "%s", err.msg);
    CHECK(m && whale_lora_merge(m, &err) == WHALE_OK, "%s", err.msg);
    return m;
}

static whale_code export(const char *base, const char *adapters, const char *out, int convert, whale_dtype dt,
                         whale_export_stats *st, whale_err *err) {
    whale_export_opts o = {.base = base, .adapters = adapters, .out = out, .convert = convert, .dtype = dt};
    return whale_export_checkpoint(&o, st, err);
}

/* Every parameter of m equals out's tensor of that name: the same bytes
 * (fp32 output) or the fp32 value rounded once (bf16 output). Returns the
 * number of tensors compared. */
static int compare(const whale_model *m, const char *out_dir, whale_dtype out, const char *what) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    whale_err err;
    whale_st *st;
    if (whale_st_open(path, &st, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return 0;
    }
    int n = whale_model_num_params(m), bad = 0;
    for (int i = 0; i < n; i++) {
        whale_tensor t = whale_model_param(m, i);
        const whale_st_entry *e = whale_st_find(st, whale_model_param_name(m, i));
        int64_t cnt = whale_shape_numel(t.ndim, t.shape);
        CHECK(e && e->dtype == out, "%s: %s missing or not %s", what, whale_model_param_name(m, i), whale_dtype_name(out));
        if (!e || e->dtype != out) continue;
        int same = 1;
        if (out == WHALE_F32) same = !memcmp(e->data, t.data, (size_t)cnt * sizeof(float));
        else
            for (int64_t k = 0; k < cnt && same; k++) {
                uint16_t got;
                memcpy(&got, (const char *)e->data + 2 * k, 2);
                same = got == whale_float_to_bf16(((const float *)t.data)[k]);
            }
        if (!same && bad++ < 3) CHECK(0, "%s: %s differs from the in-memory merge", what, whale_model_param_name(m, i));
    }
    CHECK(whale_st_count(st) == n, "%s: %d tensors written, the model has %d", what, whale_st_count(st), n);
    whale_st_close(st);
    return n;
}

/* fp32 base: the streamed merge equals the in-memory one bit for bit. */
static void check_f32(const char *base, const char *adapters, const char *tmp, const char *what) {
    char out[600];
    snprintf(out, sizeof out, "%s/%s-f32", tmp, what);
    whale_err err;
    whale_export_stats st;
    CHECK(export(base, adapters, out, 0, WHALE_F32, &st, &err) == WHALE_OK, "%s: %s", what, err.msg);
    CHECK(st.merged > 0 && st.tensors > st.merged, "%s: %d of %d tensors merged", what, st.merged, st.tensors);
    whale_model *m = merged_in_memory(base, adapters);
    if (m) printf("%s: %d tensors equal bit for bit (%d merged)\n", what, compare(m, out, WHALE_F32, what), st.merged);
    whale_model_free(m);
}

/* BF16 base: the output stays BF16 and equals the fp32 merge rounded once. */
static void check_bf16(const char *base, const char *adapters, const char *tmp, const char *what) {
    char b16[600], out[600], path[700];
    whale_err err;
    whale_export_stats st;
    snprintf(b16, sizeof b16, "%s/%s-base16", tmp, what);
    snprintf(out, sizeof out, "%s/%s-merged16", tmp, what);
    CHECK(export(base, NULL, b16, 1, WHALE_BF16, &st, &err) == WHALE_OK, "%s: %s", what, err.msg);
    CHECK(st.merged == 0 && st.dtype == WHALE_BF16, "%s: plain bf16 conversion", what);
    test_write_text(b16, "generation_config.json", "{\"temperature\": 0.7, \"top_p\": 0.8}\n");
    CHECK(export(b16, adapters, out, 0, WHALE_F32, &st, &err) == WHALE_OK, "%s: %s", what, err.msg);
    CHECK(st.dtype == WHALE_BF16, "%s: a bf16 base gives bf16 output, got %s", what, whale_dtype_name(st.dtype));
    whale_model *m = merged_in_memory(b16, adapters);
    if (m) printf("%s: bf16 merge = fp32 merge rounded once (%d tensors)\n", what, compare(m, out, WHALE_BF16, what));
    snprintf(path, sizeof path, "%s/generation_config.json", out);
    CHECK(access(path, R_OK) == 0, "%s: generation_config.json not copied", what);
    snprintf(path, sizeof path, "%s/config.json", out);
    cJSON *cfg = test_read_json(path);
    char *text = cfg ? cJSON_PrintUnformatted(cfg) : NULL;
    CHECK(text && strstr(text, "bfloat16"), "%s: the merged config keeps the base's dtype", what);
    free(text);
    cJSON_Delete(cfg);
    /* converting the bf16 base to fp32 while merging: the in-memory merge exactly */
    snprintf(out, sizeof out, "%s/%s-merged32", tmp, what);
    CHECK(export(b16, adapters, out, 1, WHALE_F32, &st, &err) == WHALE_OK, "%s: %s", what, err.msg);
    if (m) compare(m, out, WHALE_F32, what);
    whale_model_free(m);
}

/* Refusals: a module the base lacks, the memory limit, out = base. */
static void check_refusals(const char *base, const char *adapters, const char *tmp) {
    char bad[600], out[600];
    whale_err err;
    whale_export_stats st;
    snprintf(bad, sizeof bad, "%s/bad-adapters", tmp);
    mkdir(bad, 0755);
    const float a[4] = {1, 2, 3, 4};
    const int64_t sa[2] = {4, 1}, sb[2] = {1, 4};
    const whale_st_item items[2] = {{"base_model.model.model.nothing.lora_A.weight", WHALE_F32, 2, sa, a},
                                    {"base_model.model.model.nothing.lora_B.weight", WHALE_F32, 2, sb, a}};
    char path[700];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", bad);
    CHECK(whale_st_write(path, items, 2, NULL, &err) == WHALE_OK, "%s", err.msg);
    test_write_text(bad, "adapter_config.json",
                    "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"nothing\"]}");
    snprintf(out, sizeof out, "%s/never", tmp);
    whale_code c = export(base, bad, out, 0, WHALE_F32, &st, &err);
    CHECK(c == WHALE_ERR_FORMAT && strstr(err.msg, "model.nothing.weight"), "unknown module: %d %s", c, err.msg);
    whale_export_opts o = {.base = base, .adapters = adapters, .out = out, .memory_limit = 1e6};
    c = whale_export_checkpoint(&o, &st, &err);
    CHECK(c == WHALE_ERR_NOMEM && strstr(err.msg, "estimated"), "over the limit: %d %s", c, err.msg);
    CHECK(access(out, F_OK) != 0, "a refused export creates nothing");
    CHECK(whale_export_plan(&o, &st, &err) == WHALE_OK && st.planned > st.largest, "plan: %s", err.msg);
    c = export(base, adapters, base, 0, WHALE_F32, &st, &err);
    CHECK(c == WHALE_ERR_ARG && strstr(err.msg, "base's"), "out = base: %d %s", c, err.msg);
}

int main(void) {
    char tmp[512], tiny[600], lt[600], q[600], ql[600], qr[600];
    test_tmpdir("export", tmp, sizeof tmp);
    snprintf(tiny, sizeof tiny, "%s/tiny", WHALE_TEST_DATA);
    snprintf(lt, sizeof lt, "%s/lora-tiny", WHALE_TEST_DATA);
    snprintf(q, sizeof q, "%s/qwen2-gqa2", WHALE_TEST_DATA);
    snprintf(ql, sizeof ql, "%s/qwen2-lora", WHALE_TEST_DATA);
    snprintf(qr, sizeof qr, "%s/qwen2-lora/rslora", WHALE_TEST_DATA);
    check_f32(tiny, lt, tmp, "nanowhale");
    check_f32(q, ql, tmp, "qwen2");
    check_f32(q, qr, tmp, "qwen2-rslora");
    check_bf16(tiny, lt, tmp, "nanowhale");
    check_bf16(q, ql, tmp, "qwen2");
    check_refusals(tiny, lt, tmp);
    return test_finish("test_export");
}
