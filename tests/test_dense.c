/* The dense decoder's Llama and Qwen3 variants and its RoPE scaling against
 * the PyTorch reference (tests/reference/gen_dense.py, dense_ref.py):
 *   dense-llama       Llama, untied, attention_bias and mlp_bias on, llama3 rope scaling
 *   dense-llama-tied  Llama, tied, GQA 4:1, transformers-5 config, dynamic scaling past its window
 *   dense-qwen3       Qwen3 (q/k norms, head_dim ≠ hidden/heads), tied, transformers-5 config, yarn
 * logits and traced intermediates (≤ 1e-5 of the reference's largest
 * value), gradients of every parameter (≤ 1e-4), decode one token at a time,
 * packed rows, recompute bit-identical, bf16 / fp16 / int8 near fp32, the
 * greedy continuation exactly (full recompute and KV cache); LoRA on
 * dense-qwen3 against the reference's (gen_dense_lora.py); the RoPE tables of
 * every scaling type against transformers' formulas (rope-scaling.json);
 * configs written back as read; the real shapes' parameter counts. */
#include "testutil.h"

#include "whale_safetensors.h"
#include "models/model.h"
#include "models/rope.h"
#include "whale.h"
#include "whale_lora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void forward_all(whale_model *m, const int32_t *ids, int B, int S, float *logits) {
    whale_err err;
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    if (!s) return;
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
}

typedef struct {
    const whale_st *golden;
    const char *label;
    int compared;
    double worst;
} trace_ctx;

static void on_trace(void *user, const char *name, const whale_tensor *t) {
    trace_ctx *ctx = user;
    const whale_st_entry *g = whale_st_find(ctx->golden, name);
    if (!g || strcmp(name, "logits") == 0) return;
    long n = (long)whale_shape_numel(t->ndim, t->shape);
    CHECK(g->nbytes == (size_t)n * 4, "%s %s: %zu bytes vs %ld floats", ctx->label, name, g->nbytes, n);
    if (g->nbytes != (size_t)n * 4) return;
    double r = test_rel_max(t->data, g->data, n);
    ctx->compared++;
    if (r > ctx->worst) ctx->worst = r;
    CHECK(r <= 1e-5, "%s %s: max |diff| %.3g of max |ref|", ctx->label, name, r);
}

/* ------------------------------------------------------------ one golden case */

static void check_forward(whale_model *m, const whale_st *g, const char *label, float *logits, int decode) {
    whale_err err;
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1], V = whale_model_vocab_size(m);
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    trace_ctx ctx = {g, label, 0, 0};
    whale_session_set_trace(s, on_trace, &ctx);
    CHECK(whale_session_forward(s, ids_e->data, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
    double r = test_rel_max(logits, test_need_tensor(g, "logits")->data, (long)B * S * V);
    printf("%s: logits %.2g, %d intermediates ≤ %.2g (relative to max |ref|)\n", label, r, ctx.compared, ctx.worst);
    CHECK(r <= 1e-5 && ctx.compared >= 20, "%s logits: %.3g, %d traced tensors", label, r, ctx.compared);
    if (!decode) return; /* dynamic scaling past the window: a cached key keeps the frequencies it was rotated with */
    float *step = malloc(sizeof(float) * (size_t)B * V);
    int32_t tok[8];
    double worst = 0;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    for (int p = 0; p < S; p++) {
        for (int b = 0; b < B; b++) tok[b] = ((const int32_t *)ids_e->data)[(size_t)b * S + p];
        CHECK(whale_session_forward(s, tok, B, 1, step, 0, &err) == WHALE_OK, "%s", err.msg);
        for (int b = 0; b < B; b++)
            worst = fmax(worst, test_rel_max(step + (size_t)b * V, (const float *)test_need_tensor(g, "logits")->data +
                                                                   ((size_t)b * S + p) * V, V));
    }
    whale_session_free(s);
    printf("%s: decode one token at a time vs reference %.2g\n", label, worst);
    CHECK(worst <= 1e-5, "%s decode: %.3g", label, worst);
    free(step);
}

static void check_grads(whale_model *m, const whale_st *g, const char *label) {
    whale_err err;
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids"), *lab_e = test_need_tensor(g, "labels");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1];
    whale_session *s, *rs;
    double loss;
    int64_t count;
    CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(s, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK,
          "%s", err.msg);
    float lr = *(const float *)test_need_tensor(g, "loss")->data;
    CHECK(fabs(loss - lr) <= 1e-5 * fabs(lr), "%s loss %.9g vs %.9g", label, loss, lr);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < whale_model_num_params(m); i++) {
        char key[160];
        snprintf(key, sizeof key, "grad.%s", whale_model_param_name(m, i));
        const whale_st_entry *e = test_need_tensor(g, key);
        if (!e || e->nbytes != (size_t)test_param_numel(m, i) * 4) continue;
        double r = test_rel_max(whale_session_grad(s, i), e->data, test_param_numel(m, i));
        if (r > worst) worst = r, worst_name = whale_model_param_name(m, i);
    }
    printf("%s: loss %.7f, %d gradients ≤ %.2g of max |ref| (%s)\n", label, loss, whale_model_num_params(m), worst,
           worst_name);
    CHECK(worst <= 1e-4, "%s gradient of %s: %.3g of max |ref|", label, worst_name, worst);
    size_t n = test_total_params(m);
    CHECK(whale_train_session_new(m, B, S, 1, &rs, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(rs, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK,
          "%s", err.msg);
    CHECK(memcmp(whale_session_grad(s, 0), whale_session_grad(rs, 0), n * sizeof(float)) == 0,
          "%s: recompute changed the gradients", label);
    whale_session_free(rs);
    whale_session_free(s);
}

static void check_packed(whale_model *m, const whale_st *g, const char *label) {
    whale_err err;
    const whale_st_entry *ids_e = test_need_tensor(g, "packed.input_ids");
    int S = (int)ids_e->shape[1];
    whale_session *s;
    double loss;
    int64_t cnt;
    CHECK(whale_train_session_new(m, 1, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(s, ids_e->data, test_need_tensor(g, "packed.labels")->data, test_need_tensor(g, "packed.position_ids")->data,
                                   test_need_tensor(g, "packed.segment_start")->data, 1, S, 0.0, &loss, &cnt, &err) == WHALE_OK,
          "%s", err.msg);
    float lr = *(const float *)test_need_tensor(g, "packed.loss")->data;
    printf("%s: packed row loss %.7f (reference %.7f)\n", label, loss, lr);
    CHECK(fabs(loss - lr) <= 1e-5 * fabs(lr), "%s packed loss %.9g vs %.9g", label, loss, lr);
    whale_session_free(s);
}

/* Every precision runs: bf16, fp16 and int8 logits near fp32's, bf16
 * training gradients near fp32's. */
static void check_precisions(whale_model *m, const whale_st *g, const char *label, const float *logits32) {
    whale_err err;
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids"), *lab_e = test_need_tensor(g, "labels");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1], V = whale_model_vocab_size(m);
    long nl = (long)B * S * V;
    size_t n = test_total_params(m);
    float *lg = malloc(sizeof(float) * (size_t)nl), *g32 = malloc(n * sizeof(float));
    whale_session *s;
    double loss;
    int64_t cnt;
    CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(s, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK,
          "%s", err.msg);
    memcpy(g32, whale_session_grad(s, 0), n * sizeof(float));
    whale_session_free(s);
    static const whale_dtype dts[3] = {WHALE_BF16, WHALE_F16, WHALE_I8};
    static const double bound[3] = {3e-2, 5e-3, 6e-2}; /* weights of variance 1/in: int8 rows lose most */
    for (int k = 0; k < 3; k++) {
        CHECK(whale_model_set_dtype(m, dts[k], &err) == WHALE_OK, "%s", err.msg);
        forward_all(m, ids_e->data, B, S, lg);
        double rl = test_rel_max(lg, logits32, nl);
        printf("%s: %s logits %.2g of max |logit| from fp32\n", label, whale_dtype_name(dts[k]), rl);
        CHECK(rl <= bound[k], "%s %s logits: %.3g from fp32", label, whale_dtype_name(dts[k]), rl);
        if (dts[k] == WHALE_BF16) {
            CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
            CHECK(whale_session_train_step(s, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) ==
                      WHALE_OK,
                  "%s", err.msg);
            double rg = test_rel_norm(whale_session_grad(s, 0), g32, (long)n);
            whale_session_free(s);
            printf("%s: bf16 training gradients %.2g (norm-relative) from fp32\n", label, rg);
            CHECK(rg <= 5e-2, "%s bf16 gradients: %.3g from fp32", label, rg);
        }
    }
    CHECK(whale_model_set_dtype(m, WHALE_F32, &err) == WHALE_OK, "%s", err.msg);
    free(lg);
    free(g32);
}

/* The greedy continuation: recomputing the whole sequence each step (as the
 * reference does), and with the KV cache (whale_generate) where the RoPE
 * frequencies do not depend on the forward. */
static void check_greedy(whale_model *m, const whale_st *g, const char *label, int cached) {
    whale_err err;
    const whale_st_entry *pe = test_need_tensor(g, "greedy_prompt"), *te = test_need_tensor(g, "greedy_tokens");
    int np = (int)pe->shape[0], nt = (int)te->shape[0], V = whale_model_vocab_size(m), cap = np + nt;
    const int32_t *want = te->data;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    float *lg = malloc(sizeof(float) * (size_t)cap * V);
    memcpy(ids, pe->data, sizeof(int32_t) * (size_t)np);
    int same = 0;
    for (int k = 0; k < nt; k++) {
        forward_all(m, ids, 1, np + k, lg);
        const float *row = lg + (size_t)(np + k - 1) * V;
        int best = 0;
        for (int v = 1; v < V; v++) best = row[v] > row[best] ? v : best;
        ids[np + k] = best;
        same += best == want[k];
    }
    CHECK(same == nt, "%s greedy (recomputed): %d of %d tokens as the reference", label, same, nt);
    if (cached) {
        whale_sampler_params sp = whale_sampler_defaults();
        sp.temperature = 0;
        whale_sampler *sm;
        whale_session *s;
        int n = np;
        memcpy(ids, pe->data, sizeof(int32_t) * (size_t)np);
        CHECK(whale_sampler_new(&sp, V, &sm, &err) == WHALE_OK && whale_session_new(m, 1, cap, &s, &err) == WHALE_OK,
              "%s", err.msg);
        CHECK(whale_generate(s, sm, ids, &n, cap, nt, NULL, 0, NULL, NULL, NULL, &err) == WHALE_OK, "%s", err.msg);
        CHECK(n == cap && memcmp(ids + np, want, sizeof(int32_t) * (size_t)nt) == 0,
              "%s greedy with the KV cache differs from the reference", label);
        whale_session_free(s);
        whale_sampler_free(sm);
    }
    printf("%s: greedy continuation of %d tokens as the reference%s\n", label, nt, cached ? " (also cached)" : "");
    free(ids);
    free(lg);
}

static void check_case(const char *name, int rope_fixed) {
    char dir[512], golden[600];
    snprintf(dir, sizeof dir, "%s/%s", WHALE_TEST_DATA, name);
    snprintf(golden, sizeof golden, "%s/golden.safetensors", dir);
    whale_err err;
    whale_model *m;
    whale_st *g;
    if (whale_model_load(dir, &m, &err) || whale_st_open(golden, &g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(!strcmp(whale_model_family(m), "dense"), "%s: family", name);
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids");
    float *logits = malloc(sizeof(float) * (size_t)(ids_e->shape[0] * ids_e->shape[1]) * whale_model_vocab_size(m));
    check_forward(m, g, name, logits, rope_fixed);
    check_grads(m, g, name);
    check_packed(m, g, name);
    check_greedy(m, g, name, rope_fixed);
    check_precisions(m, g, name, logits);
    free(logits);
    whale_st_close(g);
    whale_model_free(m);
}

/* ------------------------------------------------------------ LoRA */

/* The PEFT adapter folder on dense-qwen3 against the reference's LoRA:
 * logits, loss, every adapter's gradient (base frozen), merged logits. */
static void check_lora_reference(void) {
    char base[512], adir[600], gpath[700];
    snprintf(base, sizeof base, "%s/dense-qwen3", WHALE_TEST_DATA);
    snprintf(adir, sizeof adir, "%s/dense-lora", WHALE_TEST_DATA);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", adir);
    whale_err err;
    whale_model *m;
    whale_st *g;
    if (whale_st_open(gpath, &g, &err) || whale_model_load(base, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(whale_lora_load(m, adir, &err) == WHALE_OK, "%s", err.msg);
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids"), *lab_e = test_need_tensor(g, "labels");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1], V = whale_model_vocab_size(m);
    long nl = (long)B * S * V;
    float *lg = malloc(sizeof(float) * (size_t)nl);
    forward_all(m, ids_e->data, B, S, lg);
    double rl = test_rel_max(lg, test_need_tensor(g, "logits")->data, nl);
    whale_session *ts;
    double loss;
    int64_t cnt;
    CHECK(whale_train_session_new(m, B, S, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(ts, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK,
          "%s", err.msg);
    float lref = *(const float *)test_need_tensor(g, "loss")->data;
    int n_base = whale_model_num_params(m) - 2 * whale_lora_count(m), compared = 0;
    double worst = 0;
    for (int i = n_base; i < whale_model_num_params(m); i++) {
        char key[256];
        snprintf(key, sizeof key, "grad.base_model.model.%s", whale_model_param_name(m, i));
        const whale_st_entry *e = test_need_tensor(g, key);
        if (!e || e->nbytes != (size_t)test_param_numel(m, i) * 4) continue;
        worst = fmax(worst, test_rel_norm(whale_session_grad(ts, i), e->data, test_param_numel(m, i)));
        compared++;
    }
    whale_session_free(ts);
    printf("dense-lora (qwen3): %d adapters; logits %.2g, loss |diff| %.2g, %d adapter gradients ≤ %.2g\n",
           whale_lora_count(m), rl, fabs(loss - lref), compared, worst);
    CHECK(whale_lora_count(m) == 14 && compared == 28, "%d adapters, %d gradients", whale_lora_count(m), compared);
    CHECK(rl <= 1e-5 && fabs(loss - lref) <= 1e-5 * fabs(lref) && worst <= 1e-4,
          "LoRA: logits %.3g, loss %.9g vs %.9g, gradients %.3g", rl, loss, lref, worst);
    CHECK(whale_lora_merge(m, &err) == WHALE_OK, "%s", err.msg);
    forward_all(m, ids_e->data, B, S, lg);
    double rm = test_rel_max(lg, test_need_tensor(g, "merged_logits")->data, nl);
    CHECK(rm <= 1e-5, "merged logits: %.3g", rm);
    free(lg);
    whale_model_free(m);
    whale_st_close(g);
}

/* all-linear on the tiny presets: q/k/v/o/gate/up/down of every layer, never
 * a norm (Qwen3's q_norm/k_norm included), the embedding or lm_head; the
 * adapters train on a bf16 base. */
static void check_lora_presets(void) {
    static const char *const presets[] = {"llama-tiny", "qwen3-tiny"};
    for (int k = 0; k < 2; k++) {
        whale_err err;
        whale_model *m;
        if (whale_model_init(presets[k], 5, &m, &err)) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        int n_base = whale_model_num_params(m), layers = 0, V = whale_model_vocab_size(m);
        for (int i = 0; i < n_base; i++) layers += strstr(whale_model_param_name(m, i), "input_layernorm") != NULL;
        whale_lora_config cfg = whale_lora_defaults();
        CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK && whale_lora_attach(m, &cfg, &err) == WHALE_OK,
              "%s", err.msg);
        CHECK(whale_lora_count(m) == 7 * layers, "%s: %d adapters for %d layers", presets[k], whale_lora_count(m),
              layers);
        for (int i = n_base; i < whale_model_num_params(m); i++)
            CHECK(!strstr(whale_model_param_name(m, i), "norm"), "%s: adapter on %s", presets[k],
                  whale_model_param_name(m, i));
        enum { B = 2, S = 12 };
        int32_t ids[B * S];
        for (int i = 0; i < B * S; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
        whale_session *ts = NULL;
        whale_optimizer *o = NULL;
        whale_adamw_config ac = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
        double loss = 0, first = 0;
        int64_t cnt;
        CHECK(whale_train_session_new(m, B, S, 0, &ts, &err) == WHALE_OK && whale_adamw_new(m, &ac, &o, &err) == WHALE_OK,
              "%s", err.msg);
        for (int step = 0; ts && o && step < 5; step++) {
            whale_session_zero_grad(ts);
            CHECK(whale_session_train_step(ts, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK, "%s",
                  err.msg);
            if (!step) first = loss;
            whale_adamw_step(o, ts, 1e-2);
        }
        printf("%s: %d all-linear adapters, bf16 base: loss %.4f -> %.4f\n", presets[k], whale_lora_count(m), first,
               loss);
        CHECK(loss < first, "%s LoRA: loss %.4f -> %.4f", presets[k], first, loss);
        whale_optimizer_free(o);
        whale_session_free(ts);
        whale_model_free(m);
    }
}

/* ------------------------------------------------------------ RoPE tables */

static void check_rope_tables(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/rope-scaling.json", WHALE_TEST_DATA);
    cJSON *j = test_read_json(path), *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const cJSON *cfg = cJSON_GetObjectItem(c, "config"), *want = cJSON_GetObjectItem(c, "inv_freq");
        int dim = cJSON_GetObjectItem(cfg, "hidden_size")->valueint;
        int max_pos = cJSON_GetObjectItem(cfg, "max_position_embeddings")->valueint;
        whale_rope r;
        whale_err err;
        if (whale_rope_from_config(cfg, name, dim, max_pos, &r, &err)) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        float inv[1024], af;
        whale_rope_inv_freq(&r, cJSON_GetObjectItem(c, "seq_len")->valueint, inv, &af);
        double worst = 0, aref = cJSON_GetObjectItem(c, "attention_factor")->valuedouble;
        CHECK(cJSON_GetArraySize(want) == dim / 2, "%s: %d frequencies", name, cJSON_GetArraySize(want));
        for (int k = 0; k < dim / 2 && k < cJSON_GetArraySize(want); k++) {
            double w = cJSON_GetArrayItem(want, k)->valuedouble;
            worst = fmax(worst, fabs(inv[k] - w) / w);
        }
        printf("rope %-52s %-7s inv_freq ≤ %.2g relative, attention factor %.6f (reference %.6f)\n", name,
               whale_rope_type_name(r.type), worst, af, aref);
        CHECK(worst <= 1e-6 && fabs(af - aref) <= 1e-6 * aref, "rope %s: inv_freq %.3g, attention factor %.7g vs %.7g",
              name, worst, af, aref);
        n++;
    }
    CHECK(n == 11, "%d RoPE cases", n);
    cJSON_Delete(j);
}

/* ------------------------------------------------------------ configs */

/* config_to_json writes back what it read: the transformers-5 form stays
 * (rope_parameters, dtype, layer_types; no rope_scaling or torch_dtype
 * added), the transformers-4 one too; a save and load gives the same logits. */
static void check_config_roundtrip(void) {
    static const struct {
        const char *dir, *keep, *absent;
    } cases[] = {{"dense-qwen3", "rope_parameters", "torch_dtype"},
                 {"dense-llama-tied", "layer_types", "rope_scaling"},
                 {"dense-llama", "rope_scaling", "dtype"}};
    for (int k = 0; k < 3; k++) {
        char dir[600], out[700], path[800];
        snprintf(dir, sizeof dir, "%s/%s", WHALE_TEST_DATA, cases[k].dir);
        snprintf(path, sizeof path, "%s/config.json", dir);
        whale_err err;
        whale_model *m, *m2;
        if (whale_model_load(dir, &m, &err)) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        cJSON *orig = test_read_json(path);
        char *text;
        CHECK(whale_model_config_json(m, &text, &err) == WHALE_OK, "%s", err.msg);
        cJSON *back = cJSON_Parse(text);
        free(text);
        const char *keys[] = {cases[k].keep, "model_type", "architectures", "head_dim", "tie_word_embeddings"};
        for (int i = 0; i < 5; i++) {
            cJSON *a = cJSON_GetObjectItem(orig, keys[i]), *b = cJSON_GetObjectItem(back, keys[i]);
            CHECK(!a == !b && (!a || cJSON_Compare(a, b, 1)), "%s: \"%s\" not written back as read", cases[k].dir,
                  keys[i]);
        }
        CHECK(!cJSON_GetObjectItem(back, cases[k].absent), "%s: \"%s\" added", cases[k].dir, cases[k].absent);
        cJSON_Delete(orig);
        cJSON_Delete(back);
        snprintf(out, sizeof out, "%s/%s", test_tmpdir("dense", path, sizeof path), cases[k].dir);
        int32_t ids[10];
        for (int i = 0; i < 10; i++) ids[i] = (int32_t)(i * 13 % whale_model_vocab_size(m));
        int V = whale_model_vocab_size(m);
        float *a = malloc(sizeof(float) * 10 * V), *b = malloc(sizeof(float) * 10 * V);
        forward_all(m, ids, 1, 10, a);
        CHECK(whale_model_save(m, out, &err) == WHALE_OK && whale_model_load(out, &m2, &err) == WHALE_OK, "%s",
              err.msg);
        forward_all(m2, ids, 1, 10, b);
        CHECK(memcmp(a, b, sizeof(float) * 10 * V) == 0, "%s: saved and loaded, other logits", cases[k].dir);
        free(a);
        free(b);
        whale_model_free(m2);
        whale_model_free(m);
    }
}

static void check_bad_configs(void) {
    static const struct {
        const char *preset, *overrides, *expect;
        whale_code code;
    } cases[] = {
        {"llama-tiny", "{\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 2}}",
         "llama-tiny: rope_scaling: rope_type \"longrope\" is not supported", WHALE_ERR_UNSUPPORTED},
        {"qwen3-tiny", "{\"rope_parameters\": {\"rope_theta\": 1e6, \"rope_type\": \"linear\"}}",
         "qwen3-tiny: rope_parameters: missing required field \"factor\"", WHALE_ERR_FORMAT},
        {"qwen3-tiny", "{\"rope_parameters\": {\"rope_theta\": \"big\"}}",
         "qwen3-tiny: rope_parameters: field \"rope_theta\" must be a number", WHALE_ERR_FORMAT},
        {"llama-tiny", "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
                       "\"high_freq_factor\": 1, \"original_max_position_embeddings\": 32}}",
         "high_freq_factor must exceed low_freq_factor", WHALE_ERR_FORMAT},
        {"qwen3-tiny", "{\"rope_parameters\": {\"rope_theta\": 1.0, \"rope_type\": \"yarn\", \"factor\": 4}}",
         "qwen3-tiny: rope_parameters: yarn needs rope_theta > 1", WHALE_ERR_FORMAT},
        {"llama-tiny", "{\"head_dim\": 2, \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2}}",
         "llama-tiny: rope_scaling: dynamic scaling needs head_dim > 2", WHALE_ERR_FORMAT},
        {"llama-tiny", "{\"partial_rotary_factor\": 0.5}", "llama-tiny: partial_rotary_factor 0.5 is not supported",
         WHALE_ERR_UNSUPPORTED},
        {"llama-tiny", "{\"mlp_bias\": 1}", "llama-tiny: field \"mlp_bias\" must be true or false", WHALE_ERR_FORMAT},
        {"qwen3-tiny", "{\"layer_types\": [\"sliding_attention\", \"full_attention\"]}",
         "sliding-window attention is not supported", WHALE_ERR_UNSUPPORTED},
        {"qwen3-tiny", "{\"use_sliding_window\": true}", "sliding-window attention is not supported",
         WHALE_ERR_UNSUPPORTED},
        {"llama-tiny", "{\"model_type\": \"mistral\"}", "model_type \"mistral\" is not supported",
         WHALE_ERR_UNSUPPORTED},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        whale_err err = {0};
        whale_model *m = NULL;
        whale_code c = whale_model_init_config(cases[k].preset, cases[k].overrides, 1, &m, &err);
        CHECK(c == cases[k].code && strstr(err.msg, cases[k].expect) && !strchr(err.msg, '\n') && !m,
              "%s %s: got %d \"%s\"", cases[k].preset, cases[k].overrides, (int)c, err.msg);
        whale_model_free(m);
    }
    /* a Llama config without tie_word_embeddings is untied (LlamaConfig's default) */
    whale_err err;
    whale_model *m;
    CHECK(whale_model_init_config("llama-tiny", "{\"tie_word_embeddings\": null}", 1, &m, &err) == WHALE_OK, "%s",
          err.msg);
    if (m) {
        CHECK(!strcmp(whale_model_param_name(m, whale_model_num_params(m) - 1), "lm_head.weight"), "untied by default");
        whale_model_free(m);
    }
}

/* The real models' shapes: parameter counts as released, 7 all-linear targets per layer. */
static void check_sizes(void) {
    static const struct {
        const char *preset;
        int64_t params;
        int max_pos;
    } real[] = {{"smollm2-135m", 134515008LL, 8192},
                {"llama-3.2-1b", 1235814400LL, 131072},
                {"qwen3-0.6b", 596049920LL, 40960}};
    for (int k = 0; k < 3; k++) {
        whale_err err;
        whale_model *m;
        if (whale_model_skeleton(real[k].preset, &m, &err)) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        int targets = 0, layers = 0;
        for (int i = 0; i < whale_model_num_params(m); i++) {
            targets += whale_lora_is_target(&m->params[i], "all-linear");
            layers += strstr(m->params[i].name, "input_layernorm") != NULL;
        }
        printf("%s: %lld parameters, %d layers, max positions %d\n", real[k].preset,
               (long long)whale_model_param_count(m), layers, whale_model_max_positions(m));
        CHECK(whale_model_param_count(m) == real[k].params && targets == 7 * layers &&
                  whale_model_max_positions(m) == real[k].max_pos,
              "%s: %lld parameters, %d targets, %d positions", real[k].preset, (long long)whale_model_param_count(m),
              targets, whale_model_max_positions(m));
        whale_model_free(m);
    }
}

/* The transformers-5 form of a Qwen2 config (rope_parameters, no
 * rope_theta) is the same model as the transformers-4 one, bit for bit. */
static void check_config_forms(void) {
    whale_err err;
    whale_model *a, *b;
    const char *v5 = "{\"rope_theta\": null, \"rope_scaling\": null, \"torch_dtype\": null, \"dtype\": \"float32\", "
                     "\"layer_types\": [\"full_attention\", \"full_attention\"], "
                     "\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}}";
    if (whale_model_init("qwen2-tiny", 9, &a, &err) || whale_model_init_config("qwen2-tiny", v5, 9, &b, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    enum { S = 20 };
    int V = whale_model_vocab_size(a);
    int32_t ids[S];
    for (int i = 0; i < S; i++) ids[i] = (int32_t)((i * 31 + 7) % V);
    float *la = malloc(sizeof(float) * S * V), *lb = malloc(sizeof(float) * S * V);
    forward_all(a, ids, 1, S, la);
    forward_all(b, ids, 1, S, lb);
    CHECK(memcmp(la, lb, sizeof(float) * S * V) == 0, "qwen2 in the transformers-5 form gives other logits");
    char *text;
    CHECK(whale_model_config_json(b, &text, &err) == WHALE_OK, "%s", err.msg);
    CHECK(strstr(text, "\"rope_parameters\":{\"rope_theta\":1000000,\"rope_type\":\"default\"}") &&
              strstr(text, "\"dtype\":\"float32\""),
          "transformers-5 config written back as %s", text);
    free(text);
    free(la);
    free(lb);
    whale_model_free(a);
    whale_model_free(b);
    printf("qwen2-tiny: transformers-5 config (rope_parameters, dtype, layer_types) = transformers-4 one, bit for bit\n");
}

/* whale memory sizes the variants' buffers as the sessions allocate them
 * (Qwen3's head norms, dynamic RoPE rows). */
static void check_memory(void) {
    static const struct {
        const char *preset, *overrides;
    } cases[] = {{"qwen3-tiny", NULL}, {"llama-tiny", NULL},
                 {"llama-tiny", "{\"max_position_embeddings\": 16, \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4.0}}"}};
    char path[700];
    for (int k = 0; k < 3; k++)
        for (int mode = 0; mode < 4; mode++) { /* inference, training, recompute, bf16 training */
            whale_err err;
            whale_model *m;
            whale_session *s = NULL;
            if (whale_model_init_config(cases[k].preset, cases[k].overrides, 1, &m, &err)) {
                CHECK(0, "%s", err.msg);
                continue;
            }
            snprintf(path, sizeof path, "%s/config.json", test_tmpdir("dense-mem", path, sizeof path));
            char *text;
            CHECK(whale_model_config_json(m, &text, &err) == WHALE_OK, "%s", err.msg);
            FILE *f = fopen(path, "w");
            fputs(text, f);
            fclose(f);
            free(text);
            if (mode == 3) CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK, "%s", err.msg);
            whale_code c = mode ? whale_train_session_new(m, 2, 24, mode == 2, &s, &err) : whale_session_new(m, 2, 24, &s, &err);
            CHECK(c == WHALE_OK, "%s", err.msg);
            whale_memory live, est;
            whale_memory_of_model(m, &live);
            if (s) whale_memory_add_session(&live, s);
            whale_memory_plan plan = {.dtype = mode == 3 ? WHALE_BF16 : WHALE_F32,
                                      .train = mode ? WHALE_TRAIN_FULL : WHALE_TRAIN_NONE, .batch = 2, .seq_len = 24,
                                      .recompute = mode == 2};
            CHECK(whale_memory_estimate(path, &plan, &est, &err) == WHALE_OK, "%s", err.msg);
            CHECK(est.activations == live.activations && est.kv_cache == live.kv_cache &&
                      est.workspace == live.workspace && est.grads == live.grads,
                  "%s %s mode %d: estimate %zu/%zu/%zu/%zu vs live %zu/%zu/%zu/%zu", cases[k].preset,
                  cases[k].overrides ? cases[k].overrides : "", mode, est.activations, est.kv_cache, est.workspace,
                  est.grads, live.activations, live.kv_cache, live.workspace, live.grads);
            whale_session_free(s);
            whale_model_free(m);
        }
}

int main(void) {
    check_case("dense-llama", 1);
    check_case("dense-llama-tied", 0);
    check_case("dense-qwen3", 1);
    check_lora_reference();
    check_lora_presets();
    check_rope_tables();
    check_config_roundtrip();
    check_bad_configs();
    check_sizes();
    check_config_forms();
    check_memory();
    return test_finish("test_dense");
}
