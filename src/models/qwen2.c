/*
 * qwen2: the dense decoder family — Qwen2 / Qwen2.5 (Qwen2ForCausalLM,
 * model_type "qwen2"), Llama (LlamaForCausalLM, "llama": Llama 2/3/3.1/3.2,
 * SmolLM2) and Qwen3 (Qwen3ForCausalLM, "qwen3") — in the order of
 * transformers' modeling_qwen2.py:
 *
 *   h = embed_tokens[ids]
 *   per layer:  n = input_layernorm(h)
 *               q, k, v = q_proj(n), k_proj(n), v_proj(n)          (Linear with bias)
 *               h = h + o_proj(softmax(RoPE(q)·RoPE(k)ᵀ/√Dh, causal)·v)  (o_proj: no bias)
 *               n = post_attention_layernorm(h)
 *               h = h + down_proj(silu(gate_proj(n)) ⊙ up_proj(n))
 *   logits = lm_head(norm(h))          (lm_head = embed_tokens with tie_word_embeddings)
 *
 * Grouped-query attention: H query heads share Hkv key/value heads, query
 * head i reading K/V head i / (H/Hkv) (transformers' repeat_kv). RoPE
 * covers the whole head, half-split (rotate_half: dim j pairs with
 * j + Dh/2) and rotates by +angle, with inv_freq_j = rope_theta^(−2j/Dh).
 * Every Linear goes through whale_linear* (precision modes, LoRA); biases
 * are added after the product.
 *
 * The variants differ only by a row of `variants`: Llama has no q/k/v bias
 * (attention_bias adds one to q/k/v/o, mlp_bias to gate/up/down); Qwen3
 * has none either and normalises every head of q and k (q_norm, k_norm:
 * RMSNorm over head_dim) before RoPE. RoPE scaling (linear, dynamic, yarn,
 * llama3) is rope.c's, for every variant.
 */
#include "models/model.h"
#include "models/rope.h"

#include "core/core.h"
#include "backend/backend.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ config */

/* What distinguishes the variants of the family. */
typedef enum { QW_QWEN2 = 0, QW_LLAMA, QW_QWEN3, QW_VARIANTS } qw_variant;
static const struct qw_variant_row {
    const char *model_type, *architecture, *title;
    int qkv_bias;     /* q/k/v biases always (Qwen2); else attention_bias decides q/k/v/o */
    int reads_mlp_bias; /* mlp_bias is a field of the config class */
    int qk_norm;      /* q_norm / k_norm per head before RoPE */
    int sliding;      /* the config class has use_sliding_window (written back as false) */
    int tie_required; /* tie_word_embeddings must be given (else false, the class default) */
} variants[QW_VARIANTS] = {
    {"qwen2", "Qwen2ForCausalLM", "Qwen2", 1, 0, 0, 1, 1},
    {"llama", "LlamaForCausalLM", "Llama", 0, 1, 0, 0, 0},
    {"qwen3", "Qwen3ForCausalLM", "Qwen3", 0, 0, 1, 1, 0},
};

typedef struct {
    int vocab, D, L, H, Hkv, Dh, F, max_pos, tie;
    float norm_eps, init_range;
    qw_variant variant;
    int bias_qkv, bias_o, bias_mlp, qk_norm;
    whale_rope rope;
} qw_config;

typedef struct {
    float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo; /* self_attn (bo: attention_bias only) */
    float *q_norm, *k_norm;                       /* Qwen3: [head_dim] each */
    float *wg, *bg, *wu, *bu, *wd, *bd;           /* mlp: gate_proj, up_proj, down_proj (biases: mlp_bias) */
    float *in_norm, *post_norm;                   /* input_layernorm, post_attention_layernorm */
} qw_layer;

typedef struct {
    qw_config c;
    cJSON *config_json; /* the config as given (fields we do not read are kept for saving) */
    float *embed, *norm, *lm_head; /* lm_head is NULL when tied */
    qw_layer *layers;
    float *rope_cos, *rope_sin; /* [rope_len, Dh/2], recomputed, never loaded */
    int rope_len;               /* positions the tables cover: the longest session so far */
} qw_model;

/* A field that must be present (the helpers take a default otherwise). */
static whale_code need_field(const cJSON *j, const char *key, const char *file, whale_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return v && !cJSON_IsNull(v) ? WHALE_OK
                                 : whale_errf(err, WHALE_ERR_FORMAT, "%s: missing required field \"%s\"", file, key);
}

/* attention_bias / mlp_bias (Llama, Qwen3), or Qwen2's fixed q/k/v biases. */
static whale_code parse_biases(const cJSON *j, const char *file, qw_config *c, whale_err *err) {
    const struct qw_variant_row *vr = &variants[c->variant];
    int ab = 0, mb = 0;
    whale_code e;
    if (!vr->qkv_bias && (e = whale_json_bool(j, "attention_bias", 0, &ab, file, err))) return e;
    if (vr->reads_mlp_bias && (e = whale_json_bool(j, "mlp_bias", 0, &mb, file, err))) return e;
    c->bias_qkv = vr->qkv_bias || ab;
    c->bias_o = ab;
    c->bias_mlp = mb;
    c->qk_norm = vr->qk_norm;
    return WHALE_OK;
}

static whale_code parse_config(const cJSON *j, const char *file, qw_config *c, whale_err *err) {
    long long v;
    double d;
    whale_code e;
#define INT_FIELD(key, req, def, lo, hi, dst)                                    \
    if ((e = whale_json_int(j, key, req, def, lo, hi, &v, file, err))) return e; \
    dst = (int)v;
#define FLOAT_FIELD(key, req, def, lo, hi, dst)                                    \
    if ((e = whale_json_float(j, key, req, def, lo, hi, &d, file, err))) return e; \
    dst = (float)d;
    INT_FIELD("vocab_size", 1, 0, 1, 1 << 24, c->vocab)
    INT_FIELD("hidden_size", 1, 0, 1, 65536, c->D)
    INT_FIELD("intermediate_size", 1, 0, 1, 1 << 20, c->F)
    INT_FIELD("num_hidden_layers", 1, 0, 1, 1024, c->L)
    INT_FIELD("num_attention_heads", 1, 0, 1, 1024, c->H)
    INT_FIELD("num_key_value_heads", 0, c->H, 1, 1024, c->Hkv) /* absent: one K/V head per query head */
    INT_FIELD("max_position_embeddings", 1, 0, 1, 1 << 20, c->max_pos)
    FLOAT_FIELD("rms_norm_eps", 1, 0, 0, 1, c->norm_eps)
    FLOAT_FIELD("initializer_range", 0, 0.02, 0, 10, c->init_range)
    if ((variants[c->variant].tie_required && (e = need_field(j, "tie_word_embeddings", file, err))) ||
        (e = whale_json_bool(j, "tie_word_embeddings", 0, &c->tie, file, err)) || (e = parse_biases(j, file, c, err)))
        return e;
    /* head_dim is hidden_size / heads unless the config says otherwise
     * (transformers reads an explicit head_dim the same way) */
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
    if (hd && !cJSON_IsNull(hd)) {
        INT_FIELD("head_dim", 1, 0, 1, 4096, c->Dh)
    } else {
        if (c->D % c->H)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: hidden_size (%d) must be divisible by num_attention_heads (%d)",
                              file, c->D, c->H);
        c->Dh = c->D / c->H;
    }
#undef INT_FIELD
#undef FLOAT_FIELD
    if ((e = whale_json_float(j, "attention_dropout", 0, 0.0, 0, 1, &d, file, err))) return e;
    if (d != 0)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: attention_dropout = %g is not supported (only 0)", file, d);
    if (c->H % c->Hkv)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: num_key_value_heads (%d) must divide num_attention_heads (%d)", file, c->Hkv, c->H);
    if (c->Dh % 2)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: head_dim (%d) must be even: RoPE rotates half-split pairs", file,
                          c->Dh);
    if ((int64_t)c->vocab * c->D > ((int64_t)1 << 34) || (int64_t)c->H * c->Dh > (1 << 20))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: vocab_size × hidden_size or heads × head_dim is implausibly large",
                          file);

    /* Features this engine does not implement are refused, not ignored. */
    int sliding;
    if ((e = whale_json_bool(j, "use_sliding_window", 0, &sliding, file, err))) return e;
    if (sliding)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                          "%s: use_sliding_window is true: sliding-window attention is not supported", file);
    /* newer transformers also spell it per layer */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    for (const cJSON *it = cJSON_IsArray(lt) ? lt->child : NULL; it; it = it->next)
        if (cJSON_IsString(it) && strcmp(it->valuestring, "full_attention") != 0)
            return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                              "%s: layer_types lists \"%s\": sliding-window attention is not supported", file,
                              it->valuestring);
    /* rope_theta + rope_scaling, or transformers 5's rope_parameters */
    if ((e = whale_rope_from_config(j, file, c->Dh, c->max_pos, &c->rope, err))) return e;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (act && !cJSON_IsNull(act) && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (only silu)", file,
                          cJSON_IsString(act) ? act->valuestring : "?");
    return WHALE_OK;
}

whale_code whale_dense_hparams_of(const whale_model *m, whale_dense_hparams *out, whale_err *err) {
    if (m->family != &whale_family_dense)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "model_type %s is not a dense decoder (qwen2, llama, qwen3)",
                          m->model_type);
    const qw_config *c = &((const qw_model *)m->impl)->c;
    *out = (whale_dense_hparams){variants[c->variant].model_type, c->vocab, c->D, c->L, c->H, c->Hkv, c->Dh, c->F,
                                 c->max_pos, c->tie, c->bias_qkv, c->bias_o, c->bias_mlp, c->qk_norm, c->norm_eps,
                                 c->rope};
    return WHALE_OK;
}

/* Presets: the shapes of released models (their config.json) and a tiny
 * model of each variant for tests. Dh 0: hidden_size / heads. */
#define LLAMA3_ROPE(f, orig)                                                                              \
    "{\"rope_type\": \"llama3\", \"factor\": " #f ", \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, " \
    "\"original_max_position_embeddings\": " #orig "}"
static const struct qw_preset {
    const char *name;
    qw_variant variant;
    int vocab, D, F, L, H, Hkv, Dh, max_pos, tie, bos, eos;
    double theta, eps;
    const char *rope_scaling; /* JSON, or NULL */
} presets[] = {
    {"qwen2.5-0.5b", QW_QWEN2, 151936, 896, 4864, 24, 14, 2, 0, 32768, 1, 151643, 151645, 1e6, 1e-6, NULL},
    {"qwen2.5-7b", QW_QWEN2, 152064, 3584, 18944, 28, 28, 4, 0, 32768, 0, 151643, 151645, 1e6, 1e-6, NULL},
    {"qwen2-tiny", QW_QWEN2, 512, 64, 128, 2, 4, 2, 0, 256, 1, 0, 1, 1e6, 1e-6, NULL},
    {"smollm2-135m", QW_LLAMA, 49152, 576, 1536, 30, 9, 3, 64, 8192, 1, 1, 2, 1e5, 1e-5, NULL},
    {"llama-3.2-1b", QW_LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, 131072, 1, 128000, 128001, 5e5, 1e-5,
     LLAMA3_ROPE(32.0, 8192)},
    {"llama-tiny", QW_LLAMA, 512, 64, 128, 2, 4, 2, 16, 256, 0, 0, 1, 5e5, 1e-5, LLAMA3_ROPE(8.0, 32)},
    {"qwen3-0.6b", QW_QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1, 151643, 151645, 1e6, 1e-6, NULL},
    {"qwen3-tiny", QW_QWEN3, 512, 64, 128, 2, 4, 2, 32, 256, 1, 0, 1, 1e6, 1e-6, NULL},
};
#define PRESET_NAMES \
    "qwen2.5-0.5b, qwen2.5-7b, qwen2-tiny, smollm2-135m, llama-3.2-1b, llama-tiny, qwen3-0.6b, qwen3-tiny"

/* The fields only some variants' config classes have, as their files write them. */
static void add_variant_fields(cJSON *j, const struct qw_preset *p) {
    cJSON_AddFalseToObject(j, "attention_bias");
    cJSON_AddNumberToObject(j, "head_dim", p->Dh);
    if (p->variant == QW_LLAMA) {
        cJSON_AddFalseToObject(j, "mlp_bias");
        cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    } else { /* Qwen3 */
        cJSON_AddNumberToObject(j, "max_window_layers", p->L);
        cJSON_AddNullToObject(j, "sliding_window");
        cJSON_AddFalseToObject(j, "use_sliding_window");
    }
}

static whale_code qwen2_preset_config(const char *name, cJSON **out, whale_err *err) {
    const struct qw_preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) p = &presets[i];
    if (!p) return whale_errf(err, WHALE_ERR_ARG, "unknown preset \"%s\" (" PRESET_NAMES ")", name);
    const struct qw_variant_row *vr = &variants[p->variant];
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(vr->architecture));
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(j, "bos_token_id", p->bos);
    cJSON_AddNumberToObject(j, "eos_token_id", p->eos);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "hidden_size", p->D);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddNumberToObject(j, "intermediate_size", p->F);
    cJSON_AddNumberToObject(j, "max_position_embeddings", p->max_pos);
    cJSON_AddStringToObject(j, "model_type", vr->model_type);
    cJSON_AddNumberToObject(j, "num_attention_heads", p->H);
    cJSON_AddNumberToObject(j, "num_hidden_layers", p->L);
    cJSON_AddNumberToObject(j, "num_key_value_heads", p->Hkv);
    cJSON_AddNumberToObject(j, "rms_norm_eps", p->eps);
    if (p->rope_scaling) cJSON_AddItemToObject(j, "rope_scaling", cJSON_Parse(p->rope_scaling));
    else cJSON_AddNullToObject(j, "rope_scaling");
    cJSON_AddNumberToObject(j, "rope_theta", p->theta);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", p->tie);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    cJSON_AddTrueToObject(j, "use_cache");
    cJSON_AddNumberToObject(j, "vocab_size", p->vocab);
    if (p->variant == QW_QWEN2) { /* as before, in the order Qwen2's files have */
        cJSON_AddNumberToObject(j, "max_window_layers", p->L);
        cJSON_AddNumberToObject(j, "sliding_window", p->max_pos);
        cJSON_AddFalseToObject(j, "use_sliding_window");
    } else add_variant_fields(j, p);
    *out = j;
    return WHALE_OK;
}

/* ------------------------------------------------------------------ params */

/* The parameter table in state_dict order (module registration order of
 * Qwen2DecoderLayer: self_attn, mlp, input_layernorm, post_attention_layernorm;
 * Qwen3Attention registers q_norm, k_norm after o_proj). Norm weights and
 * biases are not decayed. */
static whale_code register_params(whale_model *m, qw_model *qw, whale_err *err) {
    const qw_config *c = &qw->c;
    int cap = 3 + 18 * c->L;
    m->params = calloc((size_t)cap, sizeof *m->params);
    qw->layers = calloc((size_t)c->L, sizeof *qw->layers);
    if (!m->params || !qw->layers) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory building the parameter table");
    int64_t D = c->D, F = c->F, HD = (int64_t)c->H * c->Dh, KVD = (int64_t)c->Hkv * c->Dh;
#define P(slot, role, decay, ...) whale_model_add_param(m, cap, slot, WHALE_ROLE_##role, decay, 1, __VA_ARGS__)
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
    P(&qw->embed, EMBED, 1, 2, SHAPE(c->vocab, D), "model.embed_tokens.weight");
    for (int l = 0; l < c->L; l++) {
        qw_layer *ly = &qw->layers[l];
        const char *pre = "model.layers";
#define LIN(w, b, has_bias, rows, cols, mod)                                   \
    P(w, LINEAR, 1, 2, SHAPE(rows, cols), "%s.%d.%s.weight", pre, l, mod);         \
    if (has_bias) P(b, BIAS, 0, 1, SHAPE(rows), "%s.%d.%s.bias", pre, l, mod);
        LIN(&ly->wq, &ly->bq, c->bias_qkv, HD, D, "self_attn.q_proj")
        LIN(&ly->wk, &ly->bk, c->bias_qkv, KVD, D, "self_attn.k_proj")
        LIN(&ly->wv, &ly->bv, c->bias_qkv, KVD, D, "self_attn.v_proj")
        LIN(&ly->wo, &ly->bo, c->bias_o, D, HD, "self_attn.o_proj")
        if (c->qk_norm) {
            P(&ly->q_norm, NORM, 0, 1, SHAPE(c->Dh), "%s.%d.self_attn.q_norm.weight", pre, l);
            P(&ly->k_norm, NORM, 0, 1, SHAPE(c->Dh), "%s.%d.self_attn.k_norm.weight", pre, l);
        }
        LIN(&ly->wg, &ly->bg, c->bias_mlp, F, D, "mlp.gate_proj")
        LIN(&ly->wu, &ly->bu, c->bias_mlp, F, D, "mlp.up_proj")
        LIN(&ly->wd, &ly->bd, c->bias_mlp, D, F, "mlp.down_proj")
#undef LIN
        P(&ly->in_norm, NORM, 0, 1, SHAPE(D), "%s.%d.input_layernorm.weight", pre, l);
        P(&ly->post_norm, NORM, 0, 1, SHAPE(D), "%s.%d.post_attention_layernorm.weight", pre, l);
    }
    P(&qw->norm, NORM, 0, 1, SHAPE(D), "model.norm.weight");
    if (!c->tie) P(&qw->lm_head, HEAD, 1, 2, SHAPE(c->vocab, D), "lm_head.weight");
#undef P
#undef SHAPE
    return WHALE_OK;
}

static void qw_free_impl(whale_model *m) {
    qw_model *qw = m->impl;
    if (!qw) return;
    cJSON_Delete(qw->config_json);
    free(qw->layers);
    free(qw->rope_cos);
    free(qw->rope_sin);
    free(qw);
}

/* Replace or add key; takes item (deleted on failure, which is only out of
 * memory, as is a NULL item). */
static int put(cJSON *j, const char *key, cJSON *item) {
    if (!item) return 0;
    int ok = cJSON_GetObjectItemCaseSensitive(j, key) ? cJSON_ReplaceItemInObjectCaseSensitive(j, key, item)
                                                     : cJSON_AddItemToObject(j, key, item);
    if (!ok) cJSON_Delete(item);
    return ok;
}

/* The config as transformers loads it: the fields given, kept as they were
 * (rms_norm_eps, rope_theta, bos_token_id, max_window_layers, ...), plus the
 * ones that identify the architecture and those a config may leave to their
 * defaults, written from what the model is. */
static whale_code qw_config_to_json(const whale_model *m, cJSON **out, whale_err *err) {
    const qw_model *qw = m->impl;
    const qw_config *c = &qw->c;
    const struct qw_variant_row *vr = &variants[c->variant];
    cJSON *j = cJSON_Duplicate(qw->config_json, 1), *arch = cJSON_CreateArray();
    if (arch) cJSON_AddItemToArray(arch, cJSON_CreateString(vr->architecture));
    /* the dtype whale_model_save writes the weights in, under the keys the
     * config has (transformers 5 writes "dtype" only) */
    whale_dtype dt = whale_model_has_master(m) ? WHALE_F32 : m->compute_dtype;
    const char *dtn = whale_dtype_torch_name(dt);
    int has = !!cJSON_GetObjectItemCaseSensitive(j, "dtype"), has_torch = !!cJSON_GetObjectItemCaseSensitive(j, "torch_dtype");
    /* RoPE settings stay as read (rope_scaling or rope_parameters) */
    int rope_given = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling") || cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    int ok = j && put(j, "architectures", arch) && put(j, "model_type", cJSON_CreateString(vr->model_type)) &&
             put(j, "num_key_value_heads", cJSON_CreateNumber(c->Hkv)) &&
             put(j, "hidden_act", cJSON_CreateString("silu")) &&
             (!vr->sliding || put(j, "use_sliding_window", cJSON_CreateFalse())) &&
             (rope_given || put(j, "rope_scaling", cJSON_CreateNull())) &&
             put(j, "attention_dropout", cJSON_CreateNumber(0.0)) &&
             (cJSON_GetObjectItemCaseSensitive(j, "initializer_range") ||
              put(j, "initializer_range", cJSON_CreateNumber(0.02))) &&
             ((has && !has_torch) || put(j, "torch_dtype", cJSON_CreateString(dtn))) &&
             (!has || put(j, "dtype", cJSON_CreateString(dtn)));
    if (ok && c->Dh * c->H != c->D) ok = put(j, "head_dim", cJSON_CreateNumber(c->Dh));
    if (!ok) {
        cJSON_Delete(j);
        if (!j) cJSON_Delete(arch);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory writing the config");
    }
    *out = j;
    return WHALE_OK;
}

/* Normal(0, initializer_range) for every Linear weight and the embedding,
 * zeros for biases, ones for norm weights (Qwen2PreTrainedModel._init_weights),
 * drawn in parameter order from one generator. */
static void qwen2_init_param(const whale_model *m, int i, whale_rng *rng, float *out) {
    const qw_model *qw = m->impl;
    const whale_param *p = &m->params[i];
    int64_t n = whale_shape_numel(p->ndim, p->shape);
    if (p->role == WHALE_ROLE_BIAS)
        for (int64_t k = 0; k < n; k++) out[k] = 0.0f;
    else if (p->role == WHALE_ROLE_NORM)
        for (int64_t k = 0; k < n; k++) out[k] = 1.0f;
    else
        for (int64_t k = 0; k < n; k++) out[k] = (float)(whale_rng_normal(rng) * qw->c.init_range);
}


/* ------------------------------------------------------------------ info */

static void qw_print_info(const whale_model *m, FILE *f) {
    const qw_model *qw = m->impl;
    const qw_config *c = &qw->c;
    int64_t g_embed = 0, g_attn = 0, g_mlp = 0, g_norm = 0, g_head = 0;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        int64_t n = whale_shape_numel(p->ndim, p->shape);
        if (strstr(p->name, "embed_tokens")) g_embed += n;
        else if (strcmp(p->name, "lm_head.weight") == 0) g_head += n;
        else if (strstr(p->name, ".self_attn.")) g_attn += n;
        else if (strstr(p->name, ".mlp.")) g_mlp += n;
        else g_norm += n;
    }
    int64_t total = whale_model_param_count(m);
    char nb[32];
    const struct qw_variant_row *vr = &variants[c->variant];
    fprintf(f, "architecture      %s (model_type %s, %s)\n", vr->title, vr->model_type, vr->architecture);
    fprintf(f, "layers            %d, hidden %d, heads %d × %d, %d key/value heads (GQA %d:1)\n", c->L, c->D, c->H,
            c->Dh, c->Hkv, c->H / c->Hkv);
    fprintf(f, "mlp               SwiGLU, intermediate %d\n", c->F);
    fprintf(f, "vocab             %d; max positions %d; rope theta %g; rms eps %g; lm_head %s\n", c->vocab,
            m->max_positions, c->rope.theta, (double)c->norm_eps, c->tie ? "tied to embed_tokens" : "untied");
    if (c->rope.type != WHALE_ROPE_DEFAULT)
        fprintf(f, "rope scaling      %s, factor %g%s\n", whale_rope_type_name(c->rope.type), c->rope.factor,
                c->rope.type == WHALE_ROPE_DYNAMIC ? " (frequencies follow each forward's longest position)" : "");
    fprintf(f, "parameters        %s total\n", whale_fmt_count(nb, total));
    fprintf(f, "  embeddings      %s\n", whale_fmt_count(nb, g_embed));
    fprintf(f, "  attention       %s (%s%s)\n", whale_fmt_count(nb, g_attn),
            c->bias_o ? "q/k/v/o with bias" : c->bias_qkv ? "q/k/v with bias, o without" : "no biases",
            c->qk_norm ? "; q/k RMSNorm per head" : "");
    fprintf(f, "  mlp             %s\n", whale_fmt_count(nb, g_mlp));
    fprintf(f, "  norms           %s\n", whale_fmt_count(nb, g_norm));
    if (c->tie) fprintf(f, "  lm_head         tied: reads embed_tokens\n");
    else fprintf(f, "  lm_head         %s\n", whale_fmt_count(nb, g_head));
    fprintf(f, "weights memory    fp32 %.1f MiB, bf16/fp16 %.1f MiB, int8 %.1f MiB\n", total * 4 / 1048576.0,
            total * 2 / 1048576.0, total / 1048576.0);
    fprintf(f, "inert config      %suse_cache, initializer_range (init only): accepted, ignored\n",
            variants[c->variant].sliding ? "sliding_window, max_window_layers (read only with use_sliding_window, "
                                           "which must be false),\n                  "
                                         : "pretraining_tp (sliced products of the same values), ");
}

/* ------------------------------------------------------------------ sessions */

/* What one layer's forward produces that its backward reads. An inference
 * session has one set for all layers; a training session one per layer
 * (or one, recomputed, with --recompute). */
typedef struct {
    float *rstd1, *xn1; /* [T], [T, D]: input_layernorm */
    float *q, *k, *v;   /* [T, H·Dh], [T, Hkv·Dh] ×2: projections with bias, q and k rotated */
    float *att;         /* [T, H·Dh]: attention output, o_proj's input */
    float *xmid;        /* [T, D]: residual stream after attention */
    float *rstd2, *xn2; /* post_attention_layernorm */
    float *g, *u;       /* [T, F]: gate_proj, up_proj outputs */
    float *h;           /* [T, F]: silu(g)·u, down_proj's input (training; inference computes it in g) */
    float *qraw, *kraw; /* Qwen3: q, k before q_norm / k_norm (NULL without) */
    float *qrstd, *krstd; /* [T·H], [T·Hkv]: their rstd per head */
} qw_layer_acts;

/* A layer's activations kept in bf16 between its forward and its backward
 * (training in bf16, as autocast keeps them): the product inputs and
 * outputs in bf16, the residual state and the norms' statistics in fp32. */
typedef struct {
    uint16_t *xn1, *q, *k, *v, *att, *xn2, *g, *u, *h, *qraw, *kraw;
    float *rstd1, *xmid, *rstd2, *qrstd, *krstd;
} qw_stash;

typedef struct {
    whale_session base;
    int n_act_sets;     /* 1 (inference, recompute, bf16 training) or L (training) */
    qw_stash *stash;    /* [L] bf16 training: each layer's activations; acts[0] is the fp32 working set */
    int32_t *pos;       /* [T] RoPE positions */
    /* the RoPE rows this forward reads: the model's tables at pos, or, for
     * dynamic scaling past the original window, rows of its own */
    const float *rcos, *rsin;
    const int32_t *rpos;
    float *dyn_cos, *dyn_sin; /* [T, Dh/2] (dynamic scaling only) */
    int32_t *dyn_idx;         /* [T] 0, 1, …: row t of dyn_cos */
    const int32_t *seg; /* [T] first key each token may see (packed documents), or NULL */
    float **X;          /* [L+1] residual stream [T, D]: X[l] enters layer l */
    float *xbuf;        /* storage behind X: L+1 states (training) or 2, alternating */
    qw_layer_acts *acts;
    float *proj;        /* [T, D] o_proj / down_proj output before the residual add */
    float *hn_rstd, *hn; /* final norm */
    float *last;        /* [max_batch, D]: rows whose logits are wanted, gathered max_batch at a time */
    float *att_work;    /* the KV cache (rotated K, V) is the header's kv: inference only */
    whale_bufs bufs;
    struct qw_backward *bw; /* training sessions only */
} qw_session;

/* Op groups timed by --profile. */
enum {
    P_EMBED, P_NORM, P_ATTN, P_MLP, P_LOGITS, P_B_LOGITS, P_B_NORM, P_B_ATTN, P_B_MLP, P_B_EMBED, P_RECOMPUTE,
    P_STASH, P_COUNT
};
static const char *const prof_names[P_COUNT] = {
    "embedding", "rmsnorm + residual", "attention (q/k/v/o, RoPE, softmax)", "mlp", "lm_head (+ loss)",
    "lm_head + loss backward", "rmsnorm + residual backward", "attention backward", "mlp backward",
    "embedding backward", "recompute (forward again)", "bf16 activations (store, load)",
};
#define PROF(s, id, stmt) WHALE_PROF(&(s)->base, id, stmt)
/* an op of the session's backend (backend/backend.h) */
#define OP(op, ...) WHALE_OP(&s->base, op, __VA_ARGS__)
#define TRACE(dt, data, ndim, shape, ...)                                                                      \
    do {                                                                                                       \
        if (s->base.trace) whale_trace_emit(&s->base, dt, data, ndim, (const int64_t[])shape, __VA_ARGS__); \
    } while (0)
#define DIMS(...) {__VA_ARGS__}


/* Gradient buffers (one set, reused by every layer) and gw, the model's
 * structure with every parameter pointer aimed at its gradient (NULL for a
 * frozen weight). */
struct qw_backward {
    qw_model gw;
    float *dx;               /* [T, D] gradient of the residual stream */
    float *dxn;              /* [T, D] gradient of a norm's output, then of its input */
    float *datt, *dq;        /* [T, H·Dh] */
    float *dk, *dv;          /* [T, Hkv·Dh] */
    float *dh, *du;          /* [T, F]: of h, then of g (in place); of u */
    int32_t *tgt;            /* [T] shifted targets */
    float *logits;           /* [WHALE_CE_CHUNK, V] logits, then their gradient */
    float *att_work;
};

static whale_code qw_forward(whale_session *base, const whale_ubatch *ub, float *logits, whale_err *err);

static void qw_session_free(whale_session *base) {
    qw_session *s = (qw_session *)base;
    whale_backend_close(base->be);
    if (s->bw) free(s->bw->gw.layers);
    free(s->bw); /* its buffers are in s->bufs */
    free(base->grads);
    free(base->grad_offsets);
    whale_bufs_free(&s->bufs);
    free(s->acts);
    free(s->stash);
    free(s->X);
    free(s);
}

static void *sess_alloc(qw_session *s, size_t n, size_t sz, size_t *total) {
    return whale_bufs_alloc(&s->bufs, n, sz, total);
}

static int alloc_layer_acts(qw_session *s, qw_layer_acts *a, const qw_config *c, size_t T, int training,
                            size_t *tot) {
    size_t D = (size_t)c->D, F = (size_t)c->F, HD = (size_t)c->H * c->Dh, KVD = (size_t)c->Hkv * c->Dh;
    if (c->qk_norm && !((a->qraw = sess_alloc(s, T * HD, 4, tot)) && (a->kraw = sess_alloc(s, T * KVD, 4, tot)) &&
                        (a->qrstd = sess_alloc(s, T * c->H, 4, tot)) && (a->krstd = sess_alloc(s, T * c->Hkv, 4, tot))))
        return 0;
    return (a->rstd1 = sess_alloc(s, T, 4, tot)) && (a->xn1 = sess_alloc(s, T * D, 4, tot)) &&
           (a->q = sess_alloc(s, T * HD, 4, tot)) && (a->k = sess_alloc(s, T * KVD, 4, tot)) &&
           (a->v = sess_alloc(s, T * KVD, 4, tot)) && (a->att = sess_alloc(s, T * HD, 4, tot)) &&
           (a->xmid = sess_alloc(s, T * D, 4, tot)) && (a->rstd2 = sess_alloc(s, T, 4, tot)) &&
           (a->xn2 = sess_alloc(s, T * D, 4, tot)) && (a->g = sess_alloc(s, T * F, 4, tot)) &&
           (a->u = sess_alloc(s, T * F, 4, tot)) && (!training || (a->h = sess_alloc(s, T * F, 4, tot)));
}

static int alloc_stash(qw_session *s, qw_stash *st, const qw_config *c, size_t T, size_t *tot) {
    size_t D = (size_t)c->D, F = (size_t)c->F, HD = (size_t)c->H * c->Dh, KVD = (size_t)c->Hkv * c->Dh;
    if (c->qk_norm && !((st->qraw = sess_alloc(s, T * HD, 2, tot)) && (st->kraw = sess_alloc(s, T * KVD, 2, tot)) &&
                        (st->qrstd = sess_alloc(s, T * c->H, 4, tot)) && (st->krstd = sess_alloc(s, T * c->Hkv, 4, tot))))
        return 0;
    return (st->xn1 = sess_alloc(s, T * D, 2, tot)) && (st->q = sess_alloc(s, T * HD, 2, tot)) &&
           (st->k = sess_alloc(s, T * KVD, 2, tot)) && (st->v = sess_alloc(s, T * KVD, 2, tot)) &&
           (st->att = sess_alloc(s, T * HD, 2, tot)) && (st->xn2 = sess_alloc(s, T * D, 2, tot)) &&
           (st->g = sess_alloc(s, T * F, 2, tot)) && (st->u = sess_alloc(s, T * F, 2, tot)) &&
           (st->h = sess_alloc(s, T * F, 2, tot)) && (st->rstd1 = sess_alloc(s, T, 4, tot)) &&
           (st->xmid = sess_alloc(s, T * D, 4, tot)) && (st->rstd2 = sess_alloc(s, T, 4, tot));
}

/* Layer l's activations (in the working set a) into its bf16 stash, and back. */
static void stash_put(qw_session *s, const qw_layer_acts *a, int l, size_t T) {
    const qw_config *c = &((const qw_model *)s->base.model->impl)->c;
    qw_stash *st = &s->stash[l];
    size_t D = (size_t)c->D, F = (size_t)c->F, HD = (size_t)c->H * c->Dh, KVD = (size_t)c->Hkv * c->Dh;
    OP(to_bf16, st->xn1, a->xn1, T * D), OP(to_bf16, st->q, a->q, T * HD), OP(to_bf16, st->k, a->k, T * KVD);
    OP(to_bf16, st->v, a->v, T * KVD), OP(to_bf16, st->att, a->att, T * HD), OP(to_bf16, st->xn2, a->xn2, T * D);
    OP(to_bf16, st->g, a->g, T * F), OP(to_bf16, st->u, a->u, T * F), OP(to_bf16, st->h, a->h, T * F);
    OP(buf_copy, st->rstd1, a->rstd1, 4 * T), OP(buf_copy, st->xmid, a->xmid, 4 * T * D);
    OP(buf_copy, st->rstd2, a->rstd2, 4 * T);
    if (a->qraw) {
        OP(to_bf16, st->qraw, a->qraw, T * HD), OP(to_bf16, st->kraw, a->kraw, T * KVD);
        OP(buf_copy, st->qrstd, a->qrstd, 4 * T * c->H), OP(buf_copy, st->krstd, a->krstd, 4 * T * c->Hkv);
    }
}

static void stash_get(qw_session *s, qw_layer_acts *a, int l, size_t T) {
    const qw_config *c = &((const qw_model *)s->base.model->impl)->c;
    const qw_stash *st = &s->stash[l];
    size_t D = (size_t)c->D, F = (size_t)c->F, HD = (size_t)c->H * c->Dh, KVD = (size_t)c->Hkv * c->Dh;
    OP(from_bf16, a->xn1, st->xn1, T * D), OP(from_bf16, a->q, st->q, T * HD);
    OP(from_bf16, a->k, st->k, T * KVD), OP(from_bf16, a->v, st->v, T * KVD);
    OP(from_bf16, a->att, st->att, T * HD), OP(from_bf16, a->xn2, st->xn2, T * D);
    OP(from_bf16, a->g, st->g, T * F), OP(from_bf16, a->u, st->u, T * F), OP(from_bf16, a->h, st->h, T * F);
    OP(buf_copy, a->rstd1, st->rstd1, 4 * T), OP(buf_copy, a->xmid, st->xmid, 4 * T * D);
    OP(buf_copy, a->rstd2, st->rstd2, 4 * T);
    if (a->qraw) {
        OP(from_bf16, a->qraw, st->qraw, T * HD), OP(from_bf16, a->kraw, st->kraw, T * KVD);
        OP(buf_copy, a->qrstd, st->qrstd, 4 * T * c->H), OP(buf_copy, a->krstd, st->krstd, 4 * T * c->Hkv);
    }
}

/* Every buffer a session needs: forwards of n_tokens tokens and, for
 * inference, a KV cache of max_batch sequences × max_seq cells (training:
 * max_batch × max_seq = n_tokens); with count_only, their sizes only (the
 * same code, so whale memory cannot drift from what is allocated).
 * training keeps every layer's input state and, unless recompute, every
 * layer's activations (and no KV cache). */
static whale_code session_create(whale_model *m, int max_batch, int max_seq, int n_tokens, int training,
                                 int recompute, int count_only, qw_session **out, whale_err *err) {
    qw_model *qw = m->impl;
    const qw_config *c = &qw->c;
    if (!count_only) {
        whale_code e = whale_rope_reserve_scaled(&c->rope, &qw->rope_cos, &qw->rope_sin, &qw->rope_len, max_seq, err);
        if (e) return e;
    }
    qw_session *s = calloc(1, sizeof *s);
    if (!s) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory creating a session");
    s->base.model = m;
    s->base.max_batch = max_batch;
    s->base.max_seq = max_seq;
    s->base.n_batch = n_tokens;
    s->base.free_fn = qw_session_free;
    s->base.forward_fn = qw_forward;
    s->base.prof_names = prof_names;
    s->base.n_prof = P_COUNT;
    s->bufs.count_only = count_only;
    size_t T = (size_t)n_tokens, D = (size_t)c->D, KVD = (size_t)c->Hkv * c->Dh, tot = 0;
    whale_code e = whale_session_open_backend(&s->base, err);
    if (e) {
        free(s);
        return e;
    }
    /* bf16 training (and LoRA on an int8 base, whose products take bf16
     * inputs) keeps the activations between forward and backward in bf16;
     * one fp32 working set computes each layer */
    int bf16_acts = training && !recompute && (m->compute_dtype == WHALE_BF16 || m->compute_dtype == WHALE_I8);
    s->n_act_sets = training && !recompute && !bf16_acts ? c->L : 1;
    int n_states = training ? c->L + 1 : 2, ok;
    s->X = calloc((size_t)c->L + 1, sizeof(float *));
    s->acts = calloc((size_t)s->n_act_sets, sizeof *s->acts);
    s->stash = bf16_acts ? calloc((size_t)c->L, sizeof *s->stash) : NULL;
    ok = s->X && s->acts && (!bf16_acts || s->stash) && (s->xbuf = sess_alloc(s, (size_t)n_states * T * D, 4, &tot));
    for (int i = 0; ok && !count_only && i <= c->L; i++) s->X[i] = s->xbuf + (size_t)(training ? i : i % 2) * T * D;
    size_t before_acts = tot;
    for (int l = 0; ok && l < s->n_act_sets; l++) ok = alloc_layer_acts(s, &s->acts[l], c, T, training, &tot);
    size_t per_set = (tot - before_acts) / (size_t)s->n_act_sets, before_stash = tot;
    for (int l = 0; ok && bf16_acts && l < c->L; l++) ok = alloc_stash(s, &s->stash[l], c, T, &tot);
    size_t stash_bytes = tot - before_stash;
    ok = ok && (s->pos = sess_alloc(s, T, 4, &tot)) && (s->proj = sess_alloc(s, T * D, 4, &tot)) &&
         (s->hn_rstd = sess_alloc(s, T, 4, &tot)) && (s->hn = sess_alloc(s, T * D, 4, &tot)) &&
         (s->last = sess_alloc(s, (size_t)max_batch * D, 4, &tot));
    size_t work = 0, kv = 0, none = 0, lora_floats = whale_lora_work_floats(m), half = (size_t)c->Dh / 2;
    if (ok && whale_rope_needs_rows(&c->rope, max_seq)) { /* dynamic scaling past the original window */
        ok = (s->dyn_cos = sess_alloc(s, T * half, 4, &work)) && (s->dyn_sin = sess_alloc(s, T * half, 4, &work)) &&
             (s->dyn_idx = sess_alloc(s, T, 4, &work));
        for (size_t t = 0; ok && !count_only && t < T; t++) s->dyn_idx[t] = (int32_t)t;
    }
    s->base.lora_work_floats = lora_floats;
    ok = ok && (!lora_floats || (s->base.lora_work = sess_alloc(s, T * lora_floats, 4, &work))) &&
         (s->att_work = sess_alloc(s, OP(attention_work_floats, max_seq, c->H, c->Hkv, c->Dh), 4, &work)) &&
         (training ? (s->base.train_spans = sess_alloc(s, (size_t)max_batch, sizeof(whale_span), &none)) != NULL
                   : whale_kv_alloc(&s->base.kv, &s->bufs, c->L, max_batch, max_seq, (int)KVD, 0, &kv));
    if (!ok) {
        qw_session_free(&s->base);
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of activations for batch %d × %d",
                          (tot + work + kv) / 1048576.0, max_batch, max_seq);
    }
    s->base.activation_bytes = tot;
    s->base.kv_bytes = kv;
    s->base.work_bytes = work;
    s->base.recompute_saves = !training ? 0 : bf16_acts ? stash_bytes : per_set * (size_t)(c->L - 1);
    *out = s;
    return WHALE_OK;
}

/* ------------------------------------------------------------------ forward */

static whale_code linear(qw_session *s, int M, int N, int K, const float *A, const float *W, float *C,
                         whale_err *err) {
    return whale_linear(&s->base, M, N, K, A, K, W, K, C, N, err);
}

/* Qwen2Attention on a->xn1 into s->proj (o_proj's output), each span of
 * the micro-batch over its own sequence. Keys and values come from the KV
 * cache (inference: the span's appended to its sequence's cells) or from
 * a->k, a->v (training). */
static whale_code attention(qw_session *s, const qw_model *qw, const qw_layer *ly, qw_layer_acts *a, int l,
                            whale_err *err) {
    const qw_config *c = &qw->c;
    const whale_ubatch *ub = s->base.ub;
    int T = ub->T, D = c->D, HD = c->H * c->Dh, KVD = c->Hkv * c->Dh;
    float *q = a->qraw ? a->qraw : a->q, *k = a->kraw ? a->kraw : a->k; /* Qwen3: normed into a->q, a->k */
    const whale_linear_part qkv[3] = {{T, HD, a->xn1, D, ly->wq, D, q, HD}, /* one input: one region when decoding */
                                      {T, KVD, a->xn1, D, ly->wk, D, k, KVD},
                                      {T, KVD, a->xn1, D, ly->wv, D, a->v, KVD}};
    whale_code e = whale_linear_parts(&s->base, D, 3, qkv, err);
    if (e) return e;
    if (ly->bq) OP(add_rows, q, ly->bq, T, HD);
    if (ly->bk) OP(add_rows, k, ly->bk, T, KVD);
    if (ly->bv) OP(add_rows, a->v, ly->bv, T, KVD);
    if (ly->q_norm) { /* Qwen3: RMSNorm over each head of q and k */
        OP(rmsnorm, a->q, q, ly->q_norm, (long)T * c->H, c->Dh, c->norm_eps, a->qrstd);
        OP(rmsnorm, a->k, k, ly->k_norm, (long)T * c->Hkv, c->Dh, c->norm_eps, a->krstd);
    }
    /* rotate_half: x' = x·cos + rotate_half(x)·sin, k_rope's inverse (+angle) direction */
    OP(rope, a->q, T, HD, c->H, c->Dh, c->Dh, s->rpos, s->rcos, s->rsin, 1);
    OP(rope, a->k, T, KVD, c->Hkv, c->Dh, c->Dh, s->rpos, s->rcos, s->rsin, 1);

    float scale = 1.0f / sqrtf((float)c->Dh);
    if ((e = whale_attention_ubatch(&s->base, l, a->att, a->q, a->k, a->v, KVD, s->seg, c->H, c->Hkv, c->Dh, scale,
                                    s->att_work, err)))
        return e;
    TRACE(WHALE_F32, a->q, 2, DIMS(T, HD), "layers.%d.attn.q", l);
    TRACE(WHALE_F32, a->k, 2, DIMS(T, KVD), "layers.%d.attn.k", l);
    TRACE(WHALE_F32, a->v, 2, DIMS(T, KVD), "layers.%d.attn.v", l);
    TRACE(WHALE_F32, a->att, 2, DIMS(T, HD), "layers.%d.attn.context", l);
    return linear(s, T, D, HD, a->att, ly->wo, s->proj, err);
}

/* Qwen2MLP on a->xn2 into s->proj: down_proj(silu(gate_proj(x)) ⊙ up_proj(x)). */
static whale_code mlp(qw_session *s, const qw_config *c, const qw_layer *ly, qw_layer_acts *a, int l, int T,
                      whale_err *err) {
    const whale_linear_part gate_up[2] = {{T, c->F, a->xn2, c->D, ly->wg, c->D, a->g, c->F},
                                          {T, c->F, a->xn2, c->D, ly->wu, c->D, a->u, c->F}};
    whale_code e = whale_linear_parts(&s->base, c->D, 2, gate_up, err);
    if (e) return e;
    if (ly->bg) OP(add_rows, a->g, ly->bg, T, c->F), OP(add_rows, a->u, ly->bu, T, c->F); /* mlp_bias */
    float *h = a->g; /* in place, unless the backward needs g */
    if (a->h) {
        h = a->h;
        OP(buf_copy, h, a->g, sizeof(float) * (size_t)T * c->F);
    }
    OP(swiglu, h, a->u, (long)T * c->F, 0.0f);
    TRACE(WHALE_F32, h, 2, DIMS(T, c->F), "layers.%d.mlp.hidden", l);
    if ((e = linear(s, T, c->D, c->F, h, ly->wd, s->proj, err))) return e;
    if (ly->bd) OP(add_rows, s->proj, ly->bd, T, c->D);
    return WHALE_OK;
}

/* Qwen2DecoderLayer: X[l] → X[l+1], saving what the backward needs into a. */
static whale_code layer_forward(qw_session *s, int l, qw_layer_acts *a, whale_err *err) {
    const qw_model *qw = s->base.model->impl;
    const qw_config *c = &qw->c;
    const qw_layer *ly = &qw->layers[l];
    int T = s->base.ub->T, D = c->D;
    size_t TD = (size_t)T * D;
    const float *x = s->X[l];
    float *out = s->X[l + 1];
    whale_code e;
    PROF(s, P_NORM, OP(rmsnorm, a->xn1, x, ly->in_norm, T, D, c->norm_eps, a->rstd1));
    TRACE(WHALE_F32, a->xn1, 2, DIMS(T, D), "layers.%d.input_layernorm", l);
    PROF(s, P_ATTN, e = attention(s, qw, ly, a, l, err));
    if (e) return e;
    if (ly->bo) OP(add_rows, s->proj, ly->bo, T, D); /* attention_bias: o_proj's too */
    TRACE(WHALE_F32, s->proj, 2, DIMS(T, D), "layers.%d.attn.out", l);
    PROF(s, P_NORM, {
        OP(add, a->xmid, x, s->proj, TD);
        OP(rmsnorm, a->xn2, a->xmid, ly->post_norm, T, D, c->norm_eps, a->rstd2);
    });
    TRACE(WHALE_F32, a->xmid, 2, DIMS(T, D), "layers.%d.attn.state", l);
    TRACE(WHALE_F32, a->xn2, 2, DIMS(T, D), "layers.%d.post_attention_layernorm", l);
    PROF(s, P_MLP, e = mlp(s, c, ly, a, l, T, err));
    if (e) return e;
    TRACE(WHALE_F32, s->proj, 2, DIMS(T, D), "layers.%d.mlp.out", l);
    PROF(s, P_NORM, OP(add, out, a->xmid, s->proj, TD));
    TRACE(WHALE_F32, out, 2, DIMS(T, D), "layers.%d.state", l);
    return WHALE_OK;
}

/* Embedding, all layers and the final norm: the micro-batch's ids → hn [T, D]. */
static whale_code forward_hidden(qw_session *s, const whale_ubatch *ub, whale_err *err) {
    const qw_model *qw = s->base.model->impl;
    const qw_config *c = &qw->c;
    int T = ub->T, D = c->D;
    whale_code e;
    s->base.ub = ub;
    whale_ubatch_positions(ub, s->pos);
    PROF(s, P_EMBED, OP(get_rows, s->X[0], D, whale_model_wref(s->base.model, qw->embed, D), ub->ids, T, D));
    /* RoPE rows: the model's tables at the positions, or for dynamic scaling
     * past the window, this forward's own (the frequencies of its longest position) */
    int longest = 0;
    for (int t = 0; t < T; t++) longest = s->pos[t] >= longest ? s->pos[t] + 1 : longest;
    s->rcos = qw->rope_cos, s->rsin = qw->rope_sin, s->rpos = s->pos;
    if (s->dyn_cos && whale_rope_needs_rows(&c->rope, longest)) {
        whale_rope_rows(&c->rope, longest, s->pos, T, s->dyn_cos, s->dyn_sin);
        s->rcos = s->dyn_cos, s->rsin = s->dyn_sin, s->rpos = s->dyn_idx;
    }
    for (int l = 0; l < c->L; l++) {
        if ((e = whale_session_check_abort(&s->base, err)) ||
            (e = layer_forward(s, l, &s->acts[s->n_act_sets > 1 ? l : 0], err)))
            return e;
        if (s->stash && s->base.training) PROF(s, P_STASH, stash_put(s, &s->acts[0], l, (size_t)T));
    }
    PROF(s, P_NORM, OP(rmsnorm, s->hn, s->X[c->L], qw->norm, T, D, c->norm_eps, s->hn_rstd));
    TRACE(WHALE_F32, s->hn, 2, DIMS(T, D), "final_hidden");
    return WHALE_OK;
}

static whale_code qw_forward(whale_session *base, const whale_ubatch *ub, float *logits, whale_err *err) {
    qw_session *s = (qw_session *)base;
    const qw_model *qw = base->model->impl;
    const qw_config *c = &qw->c;
    s->seg = NULL;
    whale_code e = forward_hidden(s, ub, err);
    if (e || !logits) return e;
    const float *head = c->tie ? qw->embed : qw->lm_head;
    PROF(s, P_LOGITS, e = whale_output_logits(base, ub, s->hn, s->last, c->D, c->vocab, head, logits, err));
    if (!e) TRACE(WHALE_F32, logits, 2, DIMS(ub->n_out, c->vocab), "logits");
    return e;
}

/* ------------------------------------------------------------------ backward */

static whale_code linear_dx(qw_session *s, int M, int N, int K, const float *dC, const float *W, float *dA,
                            int accumulate, whale_err *err) {
    return whale_linear_dx(&s->base, M, N, K, dC, N, W, K, dA, K, accumulate, err);
}
/* gW NULL: W is frozen (LoRA adapters on W get their gradients either way) */
static whale_code linear_dw(qw_session *s, int M, int N, int K, const float *dC, const float *A, const float *W,
                            float *gW, whale_err *err) {
    return whale_linear_dw(&s->base, M, N, K, dC, N, A, K, W, gW, K, err);
}

/* Backward of mlp(): b->dx (gradient of its output) into b->dxn (gradient
 * of a->xn2, written). */
static whale_code mlp_backward(qw_session *s, const qw_config *c, const qw_layer *ly, qw_layer *gl,
                               const qw_layer_acts *a, int l, int T, whale_err *err) {
    struct qw_backward *b = s->bw;
    int D = c->D, F = c->F;
    whale_code e;
    if (gl->bd) OP(add_rows_backward, gl->bd, b->dx, T, D);
    if ((e = linear_dx(s, T, D, F, b->dx, ly->wd, b->dh, 0, err)) ||
        (e = linear_dw(s, T, D, F, b->dx, a->h, ly->wd, gl->wd, err)))
        return e;
    TRACE(WHALE_F32, b->dh, 2, DIMS(T, F), "grad.layers.%d.mlp.hidden", l);
    OP(swiglu_backward, b->dh, b->du, b->dh, a->g, a->u, (long)T * F, 0.0f); /* dh becomes dg */
    if (gl->bg) OP(add_rows_backward, gl->bg, b->dh, T, F), OP(add_rows_backward, gl->bu, b->du, T, F);
    if ((e = linear_dx(s, T, F, D, b->dh, ly->wg, b->dxn, 0, err)) ||
        (e = linear_dx(s, T, F, D, b->du, ly->wu, b->dxn, 1, err)) ||
        (e = linear_dw(s, T, F, D, b->dh, a->xn2, ly->wg, gl->wg, err)))
        return e;
    return linear_dw(s, T, F, D, b->du, a->xn2, ly->wu, gl->wu, err);
}

/* Backward of attention(): b->dx (gradient of its output) into b->dxn
 * (gradient of a->xn1, written). */
static whale_code attention_backward(qw_session *s, const qw_model *qw, const qw_layer *ly, qw_layer *gl,
                                     const qw_layer_acts *a, int l, int B, int S, whale_err *err) {
    const qw_config *c = &qw->c;
    struct qw_backward *b = s->bw;
    int T = B * S, D = c->D, HD = c->H * c->Dh, KVD = c->Hkv * c->Dh;
    float scale = 1.0f / sqrtf((float)c->Dh);
    whale_code e;
    if (gl->bo) OP(add_rows_backward, gl->bo, b->dx, T, D);
    if ((e = linear_dx(s, T, D, HD, b->dx, ly->wo, b->datt, 0, err)) ||
        (e = linear_dw(s, T, D, HD, b->dx, a->att, ly->wo, gl->wo, err)))
        return e;
    TRACE(WHALE_F32, b->datt, 2, DIMS(T, HD), "grad.layers.%d.attn.context", l);
    OP(buf_zero, b->dk, sizeof(float) * (size_t)T * KVD);
    OP(buf_zero, b->dv, sizeof(float) * (size_t)T * KVD);
    for (int bi = 0; bi < B; bi++) {
        size_t qo = (size_t)bi * S * HD, ko = (size_t)bi * S * KVD;
        if ((e = OP(attention_backward, b->dq + qo, b->dk + ko, b->dv + ko, b->datt + qo, a->q + qo, a->k + ko,
                                      a->v + ko, KVD, s->seg ? s->seg + (size_t)bi * S : NULL, S, 0, c->H, c->Hkv,
                                      c->Dh, scale, whale_attention_products(s->base.model), b->att_work, err)))
            return e;
    }
    OP(rope_backward, b->dq, T, HD, c->H, c->Dh, c->Dh, s->rpos, s->rcos, s->rsin, 1);
    OP(rope_backward, b->dk, T, KVD, c->Hkv, c->Dh, c->Dh, s->rpos, s->rcos, s->rsin, 1);
    if (a->qraw) { /* Qwen3: through q_norm and k_norm, to the projections' outputs */
        OP(rmsnorm_backward, b->dq, gl->q_norm, b->dq, a->qraw, ly->q_norm, a->qrstd, (long)T * c->H, c->Dh);
        OP(rmsnorm_backward, b->dk, gl->k_norm, b->dk, a->kraw, ly->k_norm, a->krstd, (long)T * c->Hkv, c->Dh);
    }
    TRACE(WHALE_F32, b->dq, 2, DIMS(T, HD), "grad.layers.%d.attn.q", l);
    TRACE(WHALE_F32, b->dk, 2, DIMS(T, KVD), "grad.layers.%d.attn.k", l);
    TRACE(WHALE_F32, b->dv, 2, DIMS(T, KVD), "grad.layers.%d.attn.v", l);
    if (gl->bq) OP(add_rows_backward, gl->bq, b->dq, T, HD);
    if (gl->bk) OP(add_rows_backward, gl->bk, b->dk, T, KVD);
    if (gl->bv) OP(add_rows_backward, gl->bv, b->dv, T, KVD);
    if ((e = linear_dx(s, T, HD, D, b->dq, ly->wq, b->dxn, 0, err)) ||
        (e = linear_dx(s, T, KVD, D, b->dk, ly->wk, b->dxn, 1, err)) ||
        (e = linear_dx(s, T, KVD, D, b->dv, ly->wv, b->dxn, 1, err)) ||
        (e = linear_dw(s, T, HD, D, b->dq, a->xn1, ly->wq, gl->wq, err)) ||
        (e = linear_dw(s, T, KVD, D, b->dk, a->xn1, ly->wk, gl->wk, err)))
        return e;
    return linear_dw(s, T, KVD, D, b->dv, a->xn1, ly->wv, gl->wv, err);
}

/* dx += RMSNorm backward of dxn (the norm's output gradient, consumed):
 * the residual branch and the normalised branch of one sub-layer meet. */
static void norm_backward(qw_session *s, const float *x, const float *w, float *gw, const float *rstd, int T, int D) {
    struct qw_backward *b = s->bw;
    OP(rmsnorm_backward, b->dxn, gw, b->dxn, x, w, rstd, T, D);
    OP(add, b->dx, b->dx, b->dxn, (size_t)T * D);
}

static whale_code qw_train_step(whale_session *base, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                                const int32_t *seg, int B, int S, double loss_scale, double *loss_out,
                                int64_t *count_out, whale_err *err) {
    qw_session *s = (qw_session *)base;
    const qw_model *qw = base->model->impl;
    const qw_config *c = &qw->c;
    struct qw_backward *b = s->bw;
    qw_model *gw = &b->gw;
    int T = B * S, D = c->D, V = c->vocab;
    s->seg = seg;
    const whale_ubatch ub = whale_ubatch_training(base->train_spans, ids, pos, B, S);
    whale_code e = forward_hidden(s, &ub, err);
    if (e) return e;

    /* lm_head and cross-entropy in row chunks; row t predicts token t+1 */
    int64_t count = whale_shift_targets(ids, labels, B, S, b->tgt);
    /* tied: both uses of embed_tokens accumulate into its one gradient */
    const float *head = c->tie ? qw->embed : qw->lm_head;
    float *ghead = c->tie ? gw->embed : gw->lm_head;
    double total = 0, t_ce = s->base.profiling ? whale_now() : 0;
    for (int r0 = 0; r0 < T; r0 += WHALE_CE_CHUNK) {
        int n = T - r0 < WHALE_CE_CHUNK ? T - r0 : WHALE_CE_CHUNK;
        int64_t cn;
        double l; /* gradient of loss_scale × the batch mean: each row's share is 1/count */
        if ((e = whale_head_loss_chunk(base, n, D, V, s->hn + (size_t)r0 * D, head, ghead, b->tgt + r0,
                                       loss_scale / (double)count, b->logits, b->dx + (size_t)r0 * D, &l, &cn, err)))
            return e;
        if (cn) total += l * (double)cn;
    }
    if (s->base.profiling) s->base.prof[loss_scale == 0 ? P_LOGITS : P_B_LOGITS] += whale_now() - t_ce;
    *loss_out = count ? total / (double)count : NAN;
    *count_out = count;
    if (loss_scale == 0) return WHALE_OK;

    TRACE(WHALE_F32, b->dx, 2, DIMS(T, D), "grad.final_hidden");
    PROF(s, P_B_NORM, OP(rmsnorm_backward, b->dx, gw->norm, b->dx, s->X[c->L], qw->norm, s->hn_rstd, T, D));
    if ((e = whale_session_grads_final(base, qw->norm, err))) return e; /* the norm and an untied lm_head */
    for (int l = c->L - 1; l >= 0; l--) {
        if ((e = whale_session_check_abort(&s->base, err))) return e;
        const qw_layer *ly = &qw->layers[l];
        qw_layer *gl = &gw->layers[l];
        const qw_layer_acts *a = &s->acts[s->n_act_sets > 1 ? l : 0];
        if (s->stash) { /* bf16 training: this layer's activations from their bf16 copies */
            PROF(s, P_STASH, stash_get(s, &s->acts[0], l, (size_t)T));
        } else if (s->n_act_sets == 1) { /* recompute: this layer's activations again, from its saved input */
            PROF(s, P_RECOMPUTE, e = layer_forward(s, l, &s->acts[0], err));
            if (e) return e;
        }
        /* b->dx: gradient of the layer's output, then of the state after
         * attention, then of its input */
        TRACE(WHALE_F32, b->dx, 2, DIMS(T, D), "grad.layers.%d.state", l);
        PROF(s, P_B_MLP, e = mlp_backward(s, c, ly, gl, a, l, T, err));
        if (e) return e;
        PROF(s, P_B_NORM, norm_backward(s, a->xmid, ly->post_norm, gl->post_norm, a->rstd2, T, D));
        TRACE(WHALE_F32, b->dx, 2, DIMS(T, D), "grad.layers.%d.attn.state", l);
        PROF(s, P_B_ATTN, e = attention_backward(s, qw, ly, gl, a, l, B, S, err));
        if (e) return e;
        PROF(s, P_B_NORM, norm_backward(s, s->X[l], ly->in_norm, gl->in_norm, a->rstd1, T, D));
        if ((e = whale_session_grads_final(base, ly->wq, err))) return e; /* layer l's first parameter on */
    }
    TRACE(WHALE_F32, b->dx, 2, DIMS(T, D), "grad.embedding");
    /* embedding: each token's row gets its gradient, in token order (deterministic) */
    if (gw->embed) /* NULL: frozen */
        PROF(s, P_B_EMBED, OP(scatter_add_rows, gw->embed, D, b->dx, D, ids, NULL, T, D));
    return WHALE_OK;
}

static whale_code register_grads(whale_model *scratch, void *gw, whale_err *err) {
    return register_params(scratch, gw, err);
}

static whale_code train_session_create(whale_model *m, int max_batch, int seq, int recompute, int count_only,
                                       qw_session **out, whale_err *err) {
    const qw_config *c = &((const qw_model *)m->impl)->c;
    qw_session *s = NULL;
    whale_code e = session_create(m, max_batch, seq, max_batch * seq, 1, recompute, count_only, &s, err);
    if (e) return e;
    whale_session *base = &s->base;
    base->train_fn = qw_train_step;
    struct qw_backward *b = s->bw = calloc(1, sizeof *b);
    if (!b) {
        qw_session_free(base);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory creating a training session");
    }
    if ((e = whale_session_alloc_grads(base, count_only, err))) { /* frozen weights (LoRA's base): no buffer */
        qw_session_free(base);
        return e;
    }
    b->gw.c = *c; /* the model's structure, its weight pointers aimed at the gradients */
    if ((e = whale_session_bind_grads(base, register_grads, &b->gw, count_only, err))) {
        qw_session_free(base);
        return e;
    }

    size_t T = (size_t)max_batch * seq, D = (size_t)c->D, F = (size_t)c->F, HD = (size_t)c->H * c->Dh,
           KVD = (size_t)c->Hkv * c->Dh, V = (size_t)c->vocab, ch = T < WHALE_CE_CHUNK ? T : WHALE_CE_CHUNK, tot = 0;
#define A(ptr, n) ((ptr = sess_alloc(s, (n), 4, &tot)) != NULL)
    if (!(A(b->dx, T * D) && A(b->dxn, T * D) && A(b->datt, T * HD) && A(b->dq, T * HD) && A(b->dk, T * KVD) &&
          A(b->dv, T * KVD) && A(b->dh, T * F) && A(b->du, T * F) && A(b->tgt, T) && A(b->logits, ch * V) &&
          A(b->att_work, OP(attention_backward_work_floats, seq, c->H, c->Hkv, c->Dh)))) {
        qw_session_free(base);
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate training buffers for batch %d × %d", max_batch, seq);
    }
#undef A
    base->work_bytes += tot;
    *out = s;
    return WHALE_OK;
}

static whale_code qw_session_create(whale_model *m, const whale_session_spec *sp, whale_session **out,
                                    whale_err *err) {
    qw_session *s = NULL;
    whale_code e = sp->training ? train_session_create(m, sp->n_seq, sp->n_ctx, sp->recompute, sp->count_only, &s, err)
                                : session_create(m, sp->n_seq, sp->n_ctx, sp->n_batch, 0, 0, sp->count_only, &s, err);
    *out = e ? NULL : &s->base;
    return e;
}

/* ------------------------------------------------------------------ costs */

/* Weights every token multiplies with, per layer: q, k, v, o and the MLP. */
static double layer_macs_per_token(const qw_config *c) {
    double HD = (double)c->H * c->Dh, KVD = (double)c->Hkv * c->Dh;
    return (double)c->D * (2 * HD + 2 * KVD) + 3.0 * c->D * c->F;
}

static double qw_forward_flops(const whale_model *m, int B, int S, int p0, int logit_rows) {
    const qw_config *c = &((const qw_model *)m->impl)->c;
    double T = (double)B * S;
    /* causal attention: query s sees p0+s+1 keys; QKᵀ and PV both 2·Dh per key per head */
    double keys = (double)B * ((double)S * p0 + (double)S * (S + 1) / 2.0);
    double attn = 4.0 * keys * c->H * c->Dh * c->L;
    return 2.0 * T * layer_macs_per_token(c) * c->L + attn + 2.0 * (double)logit_rows * c->vocab * c->D;
}

static double qw_decode_weight_bytes(const whale_model *m) {
    const qw_config *c = &((const qw_model *)m->impl)->c;
    return 4.0 * (layer_macs_per_token(c) * c->L + (double)c->vocab * c->D);
}

/* ------------------------------------------------------------------ entry */

static const whale_model_ops qw_ops = {
    .family_name = "qwen2",
    .free_impl = qw_free_impl,
    .config_to_json = qw_config_to_json,
    .print_info = qw_print_info,
    .session_create = qw_session_create,
    .forward_flops = qw_forward_flops,
    .decode_weight_bytes = qw_decode_weight_bytes,
};

whale_code qwen2_from_config(const cJSON *cfg, const char *file, whale_model **out, whale_err *err) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    qw_variant variant = QW_QWEN2;
    for (int k = 0; k < QW_VARIANTS; k++)
        if (cJSON_IsString(mt) && !strcmp(mt->valuestring, variants[k].model_type)) variant = (qw_variant)k;
    whale_model *m;
    whale_code e = whale_model_new_impl(&whale_family_dense, &qw_ops, variants[variant].model_type, sizeof(qw_model),
                                        &m, err);
    if (e) return e;
    qw_model *qw = m->impl;
    qw->c.variant = variant;
    e = parse_config(cfg, file, &qw->c, err);
    if (!e) e = register_params(m, qw, err); /* RoPE tables are built by the first session, for its context */
    /* linear, dynamic, yarn: the positions are the window they extend to */
    if (!e) e = whale_model_config_done(m, cfg, file, &qw->config_json, qw->c.vocab, whale_rope_window(&qw->c.rope), err);
    if (e) {
        whale_model_free(m);
        return e;
    }
    *out = m;
    return WHALE_OK;
}

static const char *const dense_types[] = {"qwen2", "llama", "qwen3", NULL};
const whale_family_desc whale_family_dense = {
    .name = "dense",
    .model_types = dense_types,
    .presets = PRESET_NAMES,
    .from_config = qwen2_from_config,
    .preset_config = qwen2_preset_config,
    .init_param = qwen2_init_param,
};
