/* Loading: save/load round trip, dtype conversion, sharded checkpoints, and
 * a precise error for every kind of config or checkpoint mismatch. */
#include "testutil.h"

#include "core/core.h"
#include "whale_safetensors.h"
#include "kernels/convert.h"
#include "whale.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tiny_dir[512];

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void copy_file(const char *from, const char *to) {
    char *data;
    size_t n;
    whale_err err;
    if (whale_read_file(from, &data, &n, &err)) return;
    FILE *f = fopen(to, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
    free(data);
}

/* Load tiny's config, apply one edit, write it with tiny's weights into dir,
 * try to load, and check the error code and that the message names `word`. */
static void expect_config_error(const char *tag, void (*edit)(cJSON *), whale_code want, const char *word) {
    char dir[512], path[1024], src[1024];
    test_tmpdir(tag, dir, sizeof dir);
    snprintf(src, sizeof src, "%s/config.json", tiny_dir);
    char *text;
    whale_err err;
    whale_read_file(src, &text, NULL, &err);
    cJSON *j = cJSON_Parse(text);
    free(text);
    edit(j);
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, out);
    free(out);
    snprintf(src, sizeof src, "%s/model.safetensors", tiny_dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    copy_file(src, path);
    whale_model *m = NULL;
    whale_code c = whale_model_load(dir, &m, &err);
    CHECK(c == want, "%s: code %d, want %d (%s)", tag, c, want, c ? err.msg : "loaded");
    if (c) {
        CHECK(strstr(err.msg, word) != NULL, "%s: message lacks \"%s\": %s", tag, word, err.msg);
        CHECK(strstr(err.msg, dir) != NULL, "%s: message lacks the file: %s", tag, err.msg);
    }
    whale_model_free(m);
}

static void set_num(cJSON *j, const char *key, double v) { cJSON_ReplaceItemInObject(j, key, cJSON_CreateNumber(v)); }
static void edit_no_hidden(cJSON *j) { cJSON_DeleteItemFromObject(j, "hidden_size"); }
static void edit_zero_heads(cJSON *j) { set_num(j, "num_attention_heads", 0); }
static void edit_odd_rope(cJSON *j) { set_num(j, "qk_rope_head_dim", 15); }
static void edit_rope_gt_head(cJSON *j) { set_num(j, "qk_rope_head_dim", 64); }
static void edit_hc_zero(cJSON *j) { set_num(j, "hc_mult", 0); }
static void edit_groups(cJSON *j) { set_num(j, "o_groups", 3); }
static void edit_topk(cJSON *j) { set_num(j, "num_experts_per_tok", 5); }
static void edit_frac(cJSON *j) { set_num(j, "hidden_size", 64.5); }
static void edit_string(cJSON *j) { cJSON_ReplaceItemInObject(j, "vocab_size", cJSON_CreateString("512")); }
static void edit_type(cJSON *j) { cJSON_ReplaceItemInObject(j, "model_type", cJSON_CreateString("mistral")); }
static void edit_scoring(cJSON *j) { cJSON_ReplaceItemInObject(j, "scoring_func", cJSON_CreateString("relu")); }
static void edit_eos(cJSON *j) { set_num(j, "eos_token_id", 100000); }
static void edit_hidden(cJSON *j) { set_num(j, "hidden_size", 32); } /* valid config, wrong weights */

static void test_config_errors(void) {
    expect_config_error("nohidden", edit_no_hidden, WHALE_ERR_FORMAT, "hidden_size");
    expect_config_error("zeroheads", edit_zero_heads, WHALE_ERR_FORMAT, "num_attention_heads");
    expect_config_error("oddrope", edit_odd_rope, WHALE_ERR_FORMAT, "qk_rope_head_dim");
    expect_config_error("bigrope", edit_rope_gt_head, WHALE_ERR_FORMAT, "head_dim");
    expect_config_error("hczero", edit_hc_zero, WHALE_ERR_FORMAT, "hc_mult");
    expect_config_error("groups", edit_groups, WHALE_ERR_FORMAT, "o_groups");
    expect_config_error("topk", edit_topk, WHALE_ERR_FORMAT, "num_experts_per_tok");
    expect_config_error("frac", edit_frac, WHALE_ERR_FORMAT, "integer");
    expect_config_error("string", edit_string, WHALE_ERR_FORMAT, "vocab_size");
    expect_config_error("type", edit_type, WHALE_ERR_UNSUPPORTED, "mistral");
    expect_config_error("scoring", edit_scoring, WHALE_ERR_UNSUPPORTED, "scoring_func");
    expect_config_error("eos", edit_eos, WHALE_ERR_FORMAT, "eos_token_id");
    /* shapes follow the config: every tensor touching hidden_size is wrong */
    expect_config_error("hidden", edit_hidden, WHALE_ERR_FORMAT, "wrong shape");

    char dir[512], path[1024];
    whale_err err;
    whale_model *m = NULL;
    test_tmpdir("badjson", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, "{\"model_type\": \"deepseek_v4\", ");
    CHECK(whale_model_load(dir, &m, &err) == WHALE_ERR_FORMAT && strstr(err.msg, "invalid JSON"), "%s", err.msg);
    unlink(path);
    CHECK(whale_model_load(dir, &m, &err) == WHALE_ERR_IO && strstr(err.msg, "config.json"), "%s", err.msg);
    CHECK(whale_model_load("/nonexistent/model", &m, &err) == WHALE_ERR_IO, "missing dir");
}

/* Write tiny's tensors with edits: drop one, add one, reshape one, rename all. */
static void test_tensor_errors(void) {
    whale_err err;
    whale_st *st;
    char src[1024];
    snprintf(src, sizeof src, "%s/model.safetensors", tiny_dir);
    if (whale_st_open(src, &st, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int n = whale_st_count(st);
    whale_st_item *items = calloc((size_t)n + 1, sizeof *items);
    char (*names)[128] = calloc((size_t)n + 1, 128);
    int64_t bad_shape[2] = {3, 3};
    float extra[9] = {0};
    for (int variant = 0; variant < 2; variant++) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            const whale_st_entry *e = whale_st_at(st, i);
            if (variant == 0 && strcmp(e->name, "model.layers.1.attn.wkv.weight") == 0) continue; /* missing */
            snprintf(names[k], 128, "%s%s", variant == 1 ? "_orig_mod." : "", e->name);
            items[k] = (whale_st_item){names[k], e->dtype, e->ndim, e->shape, e->data};
            if (variant == 0 && strcmp(e->name, "model.norm.weight") == 0) items[k].shape = bad_shape, items[k].ndim = 2,
                                                                             items[k].data = extra;
            k++;
        }
        if (variant == 0) items[k++] = (whale_st_item){"model.layers.9.bogus", WHALE_F32, 2, bad_shape, extra};
        char dir[512], path[1024], cfg[1024];
        test_tmpdir("tensors", dir, sizeof dir);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(whale_st_write(path, items, k, NULL, &err) == WHALE_OK, "%s", err.msg);
        snprintf(cfg, sizeof cfg, "%s/config.json", tiny_dir);
        snprintf(path, sizeof path, "%s/config.json", dir);
        copy_file(cfg, path);
        whale_model *m = NULL;
        whale_code c = whale_model_load(dir, &m, &err);
        if (variant == 0) {
            CHECK(c == WHALE_ERR_FORMAT, "mismatched checkpoint loaded");
            CHECK(strstr(err.msg, "1 missing (model.layers.1.attn.wkv.weight)") != NULL, "missing: %s", err.msg);
            CHECK(strstr(err.msg, "1 unexpected (model.layers.9.bogus)") != NULL, "unexpected: %s", err.msg);
            CHECK(strstr(err.msg, "model.norm.weight is [3,3], expected [64]") != NULL, "shape: %s", err.msg);
            CHECK(strstr(err.msg, "model.safetensors") != NULL, "file: %s", err.msg);
        } else {
            CHECK(c == WHALE_OK, "_orig_mod. prefix not stripped: %s", err.msg);
        }
        whale_model_free(m);
    }
    free(items);
    free(names);
    whale_st_close(st);
}

/* Save → load keeps every value; BF16/F16 checkpoints are converted on load;
 * a sharded checkpoint loads like a single file. */
static void test_round_trip(void) {
    whale_err err;
    whale_model *a, *b;
    CHECK(whale_model_load(tiny_dir, &a, &err) == WHALE_OK, "%s", err.msg);
    char dir[512];
    test_tmpdir("save", dir, sizeof dir);
    CHECK(whale_model_save(a, dir, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_model_load(dir, &b, &err) == WHALE_OK, "%s", err.msg);
    int same = whale_model_num_params(a) == whale_model_num_params(b);
    for (int i = 0; same && i < whale_model_num_params(a); i++) {
        whale_tensor ta = whale_model_param(a, i), tb = whale_model_param(b, i);
        same = !strcmp(whale_model_param_name(a, i), whale_model_param_name(b, i)) &&
               !memcmp(ta.data, tb.data, sizeof(float) * (size_t)whale_shape_numel(ta.ndim, ta.shape));
    }
    CHECK(same, "save/load round trip changed the weights");

    /* bf16 copy (as two shards with an index) */
    int n = whale_model_num_params(a);
    whale_st_item *items = calloc((size_t)n, sizeof *items);
    uint16_t **bufs = calloc((size_t)n, sizeof *bufs);
    whale_tensor *ts = calloc((size_t)n, sizeof *ts); /* shapes must outlive the items */
    for (int i = 0; i < n; i++) {
        whale_tensor t = ts[i] = whale_model_param(a, i);
        size_t cnt = (size_t)whale_shape_numel(t.ndim, t.shape);
        bufs[i] = malloc(2 * cnt + 2);
        for (size_t k = 0; k < cnt; k++) bufs[i][k] = whale_float_to_bf16(((float *)t.data)[k]);
        items[i] = (whale_st_item){whale_model_param_name(a, i), WHALE_BF16, t.ndim, ts[i].shape, bufs[i]};
    }
    char sdir[512], path[1024], cfg[1024];
    test_tmpdir("shards", sdir, sizeof sdir);
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", sdir);
    CHECK(whale_st_write(path, items, n / 2, NULL, &err) == WHALE_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", sdir);
    CHECK(whale_st_write(path, items + n / 2, n - n / 2, NULL, &err) == WHALE_OK, "%s", err.msg);
    cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (int i = 0; i < n; i++)
        cJSON_AddStringToObject(wm, items[i].name, i < n / 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    char *text = cJSON_Print(idx);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", sdir);
    write_text(path, text);
    free(text);
    cJSON_Delete(idx);
    snprintf(cfg, sizeof cfg, "%s/config.json", tiny_dir);
    snprintf(path, sizeof path, "%s/config.json", sdir);
    copy_file(cfg, path);
    whale_model *c;
    CHECK(whale_model_load(sdir, &c, &err) == WHALE_OK, "%s", err.msg);
    if (c) {
        double worst = 0;
        for (int i = 0; i < n; i++) {
            whale_tensor ta = whale_model_param(a, i), tc = whale_model_param(c, i);
            size_t cnt = (size_t)whale_shape_numel(ta.ndim, ta.shape);
            for (size_t k = 0; k < cnt; k++) {
                float x = ((float *)ta.data)[k], y = ((float *)tc.data)[k];
                if (x != 0) worst = fmax(worst, fabs(x - y) / fabs(x));
            }
        }
        CHECK(worst <= 1.0 / 256, "bf16 load: worst relative change %g (> half an ulp)", worst);
        whale_model_free(c);
    }
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    free(items);
    whale_model_free(a);
    whale_model_free(b);
}

/* A truncated checkpoint names the file. */
static void test_truncated(void) {
    char dir[512], path[1024], src[1024];
    test_tmpdir("trunc", dir, sizeof dir);
    snprintf(src, sizeof src, "%s/config.json", tiny_dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(src, path);
    snprintf(src, sizeof src, "%s/model.safetensors", tiny_dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    copy_file(src, path);
    CHECK(truncate(path, 5000) == 0, "truncate");
    whale_err err;
    whale_model *m = NULL;
    CHECK(whale_model_load(dir, &m, &err) == WHALE_ERR_FORMAT, "truncated file loaded");
    CHECK(strstr(err.msg, "model.safetensors") != NULL, "message: %s", err.msg);
    whale_model_free(m);
}

/* init presets: parameter counts of the spec */
static void test_presets(void) {
    whale_err err;
    whale_model *m;
    CHECK(whale_model_init("debug", 3, &m, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_model_param_count(m) == 16844865, "debug preset has %lld params", (long long)whale_model_param_count(m));
    whale_model_free(m);
    CHECK(whale_model_init("nanowhale-100m", 3, &m, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_model_param_count(m) == 110369621, "100m preset has %lld params", (long long)whale_model_param_count(m));
    CHECK(whale_model_num_params(m) == 270, "100m preset has %d tensors", whale_model_num_params(m));
    /* spec init: norm weights 1, gate bias 0, linear std 0.02, HC fn std 0.01 */
    for (int i = 0; i < whale_model_num_params(m); i++) {
        const char *name = whale_model_param_name(m, i);
        whale_tensor t = whale_model_param(m, i);
        long cnt = (long)whale_shape_numel(t.ndim, t.shape);
        double s1 = 0, s2 = 0;
        for (long k = 0; k < cnt; k++) s1 += ((float *)t.data)[k], s2 += (double)((float *)t.data)[k] * ((float *)t.data)[k];
        double mean = s1 / cnt, sd = sqrt(s2 / cnt - mean * mean);
        if (strstr(name, "norm.weight")) CHECK(mean == 1 && sd == 0, "%s not ones", name);
        else if (strstr(name, "gate.bias") || strstr(name, "attn_sink")) CHECK(s2 == 0, "%s not zeros", name);
        else if (!strcmp(name, "lm_head.weight") || strstr(name, "experts.0.w1"))
            CHECK(fabs(sd - 0.02) < 0.001, "%s std %g", name, sd);
        else if (strstr(name, "hc_attn_fn")) CHECK(fabs(sd - 0.01) < 0.001, "%s std %g", name, sd);
    }
    whale_model_free(m);
    CHECK(whale_model_init("nanowhale-7b", 0, &m, &err) == WHALE_ERR_ARG && strstr(err.msg, "nanowhale-7b"), "%s", err.msg);
}

/* whale_model_init_to_dir streams the same weights whale_model_init makes
 * (bit for bit in fp32, rounded to nearest even in bf16), for both families */
static void test_init_to_dir(void) {
    const char *presets[] = {"tiny", "qwen2-tiny"};
    char tmp[512], dir[600];
    test_tmpdir("init-stream", tmp, sizeof tmp);
    for (int k = 0; k < 2; k++)
        for (int bf = 0; bf < 2; bf++) {
            whale_err err;
            whale_model *ref = NULL, *got = NULL;
            int64_t n = 0;
            snprintf(dir, sizeof dir, "%s/%s-%s", tmp, presets[k], bf ? "bf16" : "fp32");
            CHECK(whale_model_init(presets[k], 11, &ref, &err) == WHALE_OK, "%s", err.msg);
            CHECK(whale_model_init_to_dir(presets[k], NULL, 11, bf ? WHALE_BF16 : WHALE_F32, dir, &n, &err) == WHALE_OK,
                  "%s", err.msg);
            CHECK(whale_model_load(dir, &got, &err) == WHALE_OK, "%s", err.msg);
            if (!ref || !got) continue;
            CHECK(n == whale_model_param_count(ref), "%s: %lld parameters streamed, %lld made", presets[k], (long long)n,
                  (long long)whale_model_param_count(ref));
            long bad = 0;
            for (int i = 0; i < whale_model_num_params(ref); i++) {
                whale_tensor a = whale_model_param(ref, i), b = whale_model_param(got, i);
                long cnt = (long)whale_shape_numel(a.ndim, a.shape);
                for (long j = 0; j < cnt; j++) {
                    float want = ((float *)a.data)[j];
                    if (bf) whale_round_bf16_inplace(&want, 1);
                    bad += memcmp(&want, (float *)b.data + j, sizeof want) != 0;
                }
            }
            CHECK(bad == 0, "%s %s: %ld values differ from whale_model_init", presets[k], bf ? "bf16" : "fp32", bad);
            whale_model_free(ref);
            whale_model_free(got);
        }
}

int main(void) {
    snprintf(tiny_dir, sizeof tiny_dir, "%s/tiny", WHALE_TEST_DATA);
    test_config_errors();
    test_tensor_errors();
    test_round_trip();
    test_truncated();
    test_presets();
    test_init_to_dir();
    return test_finish("test_load");
}
