/*
 * nanowhale: the DeepSeek-V4-style architecture of nanowhale-100m.
 *
 *   X0 = [E[tok]] × M streams                      (hyper-connection state)
 *   per block:  y,post,comb = HC_pre(X; attn)      X = HC_post(Attn(norm(y)), X, post, comb)
 *               y,post,comb = HC_pre(X; ffn)       X = HC_post(MoE(norm(y)),  X, post, comb)
 *   head:       h = HC_head(X); logits = lm_head(norm(h))
 *
 * Attention: low-rank q (wq_a → q_norm → wq_b → per-head RMS), one shared
 * key/value head (wkv → kv_norm, used as both K and V), half-split RoPE on
 * the last R dims rotated by −angle, output de-rotated at the query position,
 * block-diagonal grouped wo_a, then wo_b.
 * MoE: sqrt(softplus) gate, bias for selection only, top-K normalised and
 * scaled, SwiGLU experts accumulated in ascending expert order, plus one
 * shared expert, in the order docs/architecture.md ("Forward pass of
 * nanowhale") describes.
 */
#include "models/nanowhale.h"

#include "backend/backend.h"
#include "core/core.h"
#include "kernels/loss.h"





#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ config */

static whale_code parse_config(const cJSON *j, const char *file, nw_config *c, whale_err *err) {
    long long v;
    double d;
    whale_code e;
#define INT_FIELD(key, req, def, lo, hi, dst)                                              \
    if ((e = whale_json_int(j, key, req, def, lo, hi, &v, file, err))) return e;            \
    dst = (int)v;
#define FLOAT_FIELD(key, req, def, lo, hi, dst)                                            \
    if ((e = whale_json_float(j, key, req, def, lo, hi, &d, file, err))) return e;          \
    dst = (float)d;
    const int BIG = 1 << 24;
    INT_FIELD("vocab_size", 1, 0, 1, BIG, c->vocab)
    INT_FIELD("hidden_size", 1, 0, 1, 65536, c->D)
    INT_FIELD("num_hidden_layers", 1, 0, 1, 1024, c->L)
    INT_FIELD("num_attention_heads", 1, 0, 1, 1024, c->H)
    INT_FIELD("head_dim", 1, 0, 1, 4096, c->Dh)
    INT_FIELD("qk_rope_head_dim", 1, 0, 0, 4096, c->R)
    INT_FIELD("q_lora_rank", 1, 0, 1, 65536, c->Q)
    INT_FIELD("o_groups", 1, 0, 1, 1024, c->G)
    INT_FIELD("o_lora_rank", 1, 0, 1, 65536, c->Ro)
    INT_FIELD("moe_intermediate_size", 1, 0, 1, 1 << 20, c->F)
    INT_FIELD("n_routed_experts", 1, 0, 1, 256, c->E)
    INT_FIELD("num_experts_per_tok", 1, 0, 1, 4096, c->K)
    INT_FIELD("hc_mult", 1, 0, 1, 64, c->M)
    INT_FIELD("hc_sinkhorn_iters", 0, 20, 1, 1000, c->sinkhorn_iters)
    INT_FIELD("num_hash_layers", 0, 0, 0, 1024, c->num_hash_layers)
    INT_FIELD("max_position_embeddings", 1, 0, 1, 1 << 20, c->max_pos)
    FLOAT_FIELD("hc_eps", 0, 1e-6, 0, 1, c->hc_eps)
    FLOAT_FIELD("rms_norm_eps", 0, 1e-6, 0, 1, c->norm_eps)
    FLOAT_FIELD("rope_theta", 0, 10000.0, 1e-6, 1e30, c->rope_theta)
    FLOAT_FIELD("routed_scaling_factor", 0, 1.0, 0, 1e6, c->route_scale)
    FLOAT_FIELD("swiglu_limit", 0, 0.0, 0, 1e30, c->swiglu_limit)
    FLOAT_FIELD("initializer_range", 0, 0.02, 0, 10, c->init_range)
#undef INT_FIELD
#undef FLOAT_FIELD
    if ((e = whale_json_bool(j, "tie_word_embeddings", 0, &c->tie_embeddings, file, err))) return e;

    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(j, "scoring_func");
    c->scoring = NW_SCORE_SQRTSOFTPLUS;
    if (sf && !cJSON_IsNull(sf)) {
        if (!cJSON_IsString(sf)) return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"scoring_func\" must be a string", file);
        if (strcmp(sf->valuestring, "sqrtsoftplus") == 0) c->scoring = NW_SCORE_SQRTSOFTPLUS;
        else if (strcmp(sf->valuestring, "softmax") == 0) c->scoring = NW_SCORE_SOFTMAX;
        else if (strcmp(sf->valuestring, "sigmoid") == 0) c->scoring = NW_SCORE_SIGMOID;
        else
            return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                              "%s: field \"scoring_func\" = \"%s\" is not supported (sqrtsoftplus, softmax, sigmoid)",
                              file, sf->valuestring);
    }
    /* Cross-field consistency: each message names the fields involved. */
    if (c->R > c->Dh || c->R % 2)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: qk_rope_head_dim (%d) must be even and at most head_dim (%d)",
                          file, c->R, c->Dh);
    if ((c->H * c->Dh) % c->G || c->H % c->G)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: num_attention_heads (%d) must be divisible by o_groups (%d)",
                          file, c->H, c->G);
    if (c->K > c->E)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: num_experts_per_tok (%d) exceeds n_routed_experts (%d)", file,
                          c->K, c->E);
    if (c->num_hash_layers > c->L)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: num_hash_layers (%d) exceeds num_hidden_layers (%d)", file,
                          c->num_hash_layers, c->L);
    if ((int64_t)c->vocab * c->D > ((int64_t)1 << 34))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: vocab_size × hidden_size is implausibly large", file);
    c->mix = (2 + c->M) * c->M;
    return WHALE_OK;
}

/* Presets: the 100m model and the debug model of the original project, a
 * tiny model for fast tests and a small one for the training demo. */
static const struct preset {
    const char *name;
    int vocab, D, L, H, Dh, R, Q, G, Ro, F, E, K, M, sinkhorn, max_pos;
} presets[] = {
    {"nanowhale-100m", 129280, 320, 8, 8, 96, 32, 160, 2, 80, 640, 4, 2, 4, 2, 2048},
    {"debug", 129280, 64, 2, 4, 32, 16, 32, 2, 16, 128, 4, 2, 4, 5, 512},
    {"tiny", 512, 64, 2, 4, 32, 16, 32, 2, 16, 96, 4, 2, 4, 3, 128},
    /* the README's training demo: ~3M parameters, learns on 2 cores in minutes */
    {"small", 4096, 128, 4, 4, 32, 16, 64, 2, 32, 256, 4, 2, 4, 2, 512},
};

static whale_code nanowhale_preset_config(const char *name, cJSON **out, whale_err *err) {
    const struct preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) p = &presets[i];
    if (!p)
        return whale_errf(err, WHALE_ERR_ARG,
                          "unknown preset \"%s\" (nanowhale-100m, debug, small, tiny, or a config .json file)", name);
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("DeepseekV4ForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", "deepseek_v4");
    cJSON_AddNumberToObject(j, "vocab_size", p->vocab);
    cJSON_AddNumberToObject(j, "hidden_size", p->D);
    cJSON_AddNumberToObject(j, "num_hidden_layers", p->L);
    cJSON_AddNumberToObject(j, "num_attention_heads", p->H);
    cJSON_AddNumberToObject(j, "num_key_value_heads", 1);
    cJSON_AddNumberToObject(j, "head_dim", p->Dh);
    cJSON_AddNumberToObject(j, "qk_rope_head_dim", p->R);
    cJSON_AddNumberToObject(j, "nope_head_dim", p->Dh - p->R);
    cJSON_AddNumberToObject(j, "q_lora_rank", p->Q);
    cJSON_AddNumberToObject(j, "o_groups", p->G);
    cJSON_AddNumberToObject(j, "o_lora_rank", p->Ro);
    cJSON_AddNumberToObject(j, "moe_intermediate_size", p->F);
    cJSON_AddNumberToObject(j, "n_routed_experts", p->E);
    cJSON_AddNumberToObject(j, "n_shared_experts", 1);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", p->K);
    cJSON_AddNumberToObject(j, "hc_mult", p->M);
    cJSON_AddNumberToObject(j, "hc_sinkhorn_iters", p->sinkhorn);
    cJSON_AddNumberToObject(j, "hc_eps", 1e-6);
    cJSON_AddNumberToObject(j, "num_hash_layers", 0);
    cJSON_AddNumberToObject(j, "swiglu_limit", 0.0);
    cJSON_AddStringToObject(j, "scoring_func", "sqrtsoftplus");
    cJSON_AddNumberToObject(j, "routed_scaling_factor", 1.5);
    cJSON_AddStringToObject(j, "topk_method", "noaux_tc");
    cJSON_AddTrueToObject(j, "norm_topk_prob");
    cJSON_AddNumberToObject(j, "max_position_embeddings", p->max_pos);
    cJSON_AddNumberToObject(j, "rms_norm_eps", 1e-6);
    cJSON_AddNumberToObject(j, "rope_theta", 10000.0);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddFalseToObject(j, "tie_word_embeddings");
    cJSON_AddFalseToObject(j, "attention_bias");
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON *cr = cJSON_AddArrayToObject(j, "compress_ratios");
    for (int i = 0; i <= p->L; i++) cJSON_AddItemToArray(cr, cJSON_CreateNumber(0));
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "bos_token_id", 0);
    cJSON_AddNumberToObject(j, "eos_token_id", 1);
    cJSON_AddStringToObject(j, "dtype", "float32");
    *out = j;
    return WHALE_OK;
}

/* ------------------------------------------------------------------ params */

static whale_code register_params(whale_model *m, nw_model *nw, whale_err *err) {
    const nw_config *c = &nw->c;
    int cap = 6 + c->L * (16 + 3 * c->E + 5) + 4;
    m->params = calloc((size_t)cap, sizeof *m->params);
    nw->layers = calloc((size_t)c->L, sizeof *nw->layers);
    nw->expert_ptrs = calloc((size_t)c->L * 3 * c->E, sizeof(float *));
    if (!m->params || !nw->layers || !nw->expert_ptrs)
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory building the parameter table");
    int64_t D = c->D, MD = (int64_t)c->M * c->D, mix = c->mix;
#define P(slot, role, decay, used, ...) whale_model_add_param(m, cap, slot, WHALE_ROLE_##role, decay, used, __VA_ARGS__)
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
    P(&nw->hc_head_fn, MIX, 1, 1, 2, SHAPE(c->M, MD), "model.hc_head_fn");
    P(&nw->hc_head_base, SCALAR, 1, 1, 1, SHAPE(c->M), "model.hc_head_base");
    P(&nw->hc_head_scale, SCALAR, 1, 1, 1, SHAPE(1), "model.hc_head_scale");
    P(&nw->embed, EMBED, 1, 1, 2, SHAPE(c->vocab, D), "model.embed_tokens.weight");
    for (int l = 0; l < c->L; l++) {
        nw_layer *ly = &nw->layers[l];
        ly->w1 = nw->expert_ptrs + (size_t)l * 3 * c->E;
        ly->w2 = ly->w1 + c->E;
        ly->w3 = ly->w2 + c->E;
        const char *pre = "model.layers";
        P(&ly->hc_attn_fn, MIX, 1, 1, 2, SHAPE(mix, MD), "%s.%d.hc_attn_fn", pre, l);
        P(&ly->hc_ffn_fn, MIX, 1, 1, 2, SHAPE(mix, MD), "%s.%d.hc_ffn_fn", pre, l);
        P(&ly->hc_attn_base, SCALAR, 1, 1, 1, SHAPE(mix), "%s.%d.hc_attn_base", pre, l);
        P(&ly->hc_ffn_base, SCALAR, 1, 1, 1, SHAPE(mix), "%s.%d.hc_ffn_base", pre, l);
        P(&ly->hc_attn_scale, SCALAR, 1, 1, 1, SHAPE(3), "%s.%d.hc_attn_scale", pre, l);
        P(&ly->hc_ffn_scale, SCALAR, 1, 1, 1, SHAPE(3), "%s.%d.hc_ffn_scale", pre, l);
        whale_param *sink = P(&ly->attn_sink, SCALAR, 1, 0, 1, SHAPE(c->H), "%s.%d.attn.attn_sink", pre, l);
        if (sink) sink->no_grad = 1; /* never read by the forward pass */
        P(&ly->wq_a, LINEAR, 1, 1, 2, SHAPE(c->Q, D), "%s.%d.attn.wq_a.weight", pre, l);
        P(&ly->q_norm, NORM, 0, 1, 1, SHAPE(c->Q), "%s.%d.attn.q_norm.weight", pre, l);
        P(&ly->wq_b, LINEAR, 1, 1, 2, SHAPE((int64_t)c->H * c->Dh, c->Q), "%s.%d.attn.wq_b.weight", pre, l);
        P(&ly->wkv, LINEAR, 1, 1, 2, SHAPE(c->Dh, D), "%s.%d.attn.wkv.weight", pre, l);
        P(&ly->kv_norm, NORM, 0, 1, 1, SHAPE(c->Dh), "%s.%d.attn.kv_norm.weight", pre, l);
        whale_param *wo_a = P(&ly->wo_a, LINEAR, 1, 1, 2, SHAPE((int64_t)c->G * c->Ro, (int64_t)c->H * c->Dh / c->G),
                              "%s.%d.attn.wo_a.weight", pre, l);
        if (wo_a) wo_a->peft_inert = whale_lora_peft_inert("deepseek_v4", wo_a->name); /* read in an einsum */
        P(&ly->wo_b, LINEAR, 1, 1, 2, SHAPE(D, (int64_t)c->G * c->Ro), "%s.%d.attn.wo_b.weight", pre, l);
        P(&ly->gate_w, ROUTER, 1, 1, 2, SHAPE(c->E, D), "%s.%d.ffn.gate.weight", pre, l);
        if (l >= c->num_hash_layers) {
            whale_param *gb = P(&ly->gate_b, SCALAR, 0, 1, 1, SHAPE(c->E), "%s.%d.ffn.gate.bias", pre, l);
            if (gb) gb->no_grad = 1; /* only selects experts */
        }
        for (int e = 0; e < c->E; e++) {
            P(&ly->w1[e], LINEAR, 1, 1, 2, SHAPE(c->F, D), "%s.%d.ffn.experts.%d.w1.weight", pre, l, e);
            P(&ly->w2[e], LINEAR, 1, 1, 2, SHAPE(D, c->F), "%s.%d.ffn.experts.%d.w2.weight", pre, l, e);
            P(&ly->w3[e], LINEAR, 1, 1, 2, SHAPE(c->F, D), "%s.%d.ffn.experts.%d.w3.weight", pre, l, e);
        }
        P(&ly->sw1, LINEAR, 1, 1, 2, SHAPE(c->F, D), "%s.%d.ffn.shared_expert.w1.weight", pre, l);
        P(&ly->sw2, LINEAR, 1, 1, 2, SHAPE(D, c->F), "%s.%d.ffn.shared_expert.w2.weight", pre, l);
        P(&ly->sw3, LINEAR, 1, 1, 2, SHAPE(c->F, D), "%s.%d.ffn.shared_expert.w3.weight", pre, l);
        P(&ly->attn_norm, NORM, 0, 1, 1, SHAPE(D), "%s.%d.attn_norm.weight", pre, l);
        P(&ly->ffn_norm, NORM, 0, 1, 1, SHAPE(D), "%s.%d.ffn_norm.weight", pre, l);
    }
    P(&nw->norm, NORM, 0, 1, 1, SHAPE(D), "model.norm.weight");
    if (!c->tie_embeddings) P(&nw->lm_head, HEAD, 1, 1, 2, SHAPE(c->vocab, D), "lm_head.weight");
#undef P
#undef SHAPE
    return WHALE_OK;
}

static void nw_free_impl(whale_model *m) {
    nw_model *nw = m->impl;
    if (!nw) return;
    cJSON_Delete(nw->config_json);
    free(nw->layers);
    free(nw->expert_ptrs);
    free(nw->rope_cos);
    free(nw->rope_sin);
    free(nw);
}

static whale_code nw_config_to_json(const whale_model *m, cJSON **out, whale_err *err) {
    const nw_model *nw = m->impl;
    *out = cJSON_Duplicate(nw->config_json, 1);
    return *out ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "out of memory copying config");
}

/* The reference's initial distributions: Normal(0, initializer_range) for linears, embeddings
 * and the gate; Normal(0, 0.01) for HC fn matrices; ones for norm weights and
 * HC scales; zeros for HC bases, gate bias and attn_sink. */
static void nanowhale_init_param(const whale_model *m, int i, whale_rng *rng, float *out) {
    const nw_model *nw = m->impl;
    const whale_param *p = &m->params[i];
    int64_t n = whale_shape_numel(p->ndim, p->shape);
    const char *name = p->name;
    size_t len = strlen(name);
    float fill = NAN, std = nw->c.init_range;
    if (strstr(name, "norm.weight") || strstr(name, "_scale")) fill = 1.0f;
    else if (strstr(name, "_base") || strstr(name, "gate.bias") || strstr(name, "attn_sink")) fill = 0.0f;
    else if (len >= 3 && strcmp(name + len - 3, "_fn") == 0) std = 0.01f;
    if (!isnan(fill))
        for (int64_t k = 0; k < n; k++) out[k] = fill;
    else
        for (int64_t k = 0; k < n; k++) out[k] = (float)(whale_rng_normal(rng) * std);
}


/* ------------------------------------------------------------------ info */

static void nw_print_info(const whale_model *m, FILE *f) {
    const nw_model *nw = m->impl;
    const nw_config *c = &nw->c;
    int64_t g_embed = 0, g_attn = 0, g_gate = 0, g_routed = 0, g_shared = 0, g_norm = 0, g_hc = 0, g_head = 0;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        int64_t n = whale_shape_numel(p->ndim, p->shape);
        const char *s = p->name;
        if (strstr(s, "embed_tokens")) g_embed += n;
        else if (strcmp(s, "lm_head.weight") == 0) g_head += n;
        else if (strstr(s, "hc_")) g_hc += n;
        else if (strstr(s, ".experts.")) g_routed += n;
        else if (strstr(s, "shared_expert")) g_shared += n;
        else if (strstr(s, "ffn.gate")) g_gate += n;
        else if (strstr(s, "attn_norm") || strstr(s, "ffn_norm") || strcmp(s, "model.norm.weight") == 0) g_norm += n;
        else g_attn += n; /* attention projections, q/kv norms, attn_sink */
    }
    int64_t total = whale_model_param_count(m);
    int64_t active = total - g_embed - g_routed + g_routed / c->E * c->K;
    fprintf(f, "architecture      nanowhale (DeepSeek-V4 style, model_type deepseek_v4)\n");
    fprintf(f, "layers            %d, hidden %d, heads %d × %d (rope %d, nope %d), one shared K=V head\n", c->L,
            c->D, c->H, c->Dh, c->R, c->Dh - c->R);
    fprintf(f, "low-rank q / out  q_lora_rank %d; o_groups %d × o_lora_rank %d\n", c->Q, c->G, c->Ro);
    fprintf(f, "moe               %d routed experts, top-%d, + 1 shared; intermediate %d; scoring %s; scale %g\n",
            c->E, c->K, c->F,
            c->scoring == NW_SCORE_SQRTSOFTPLUS ? "sqrtsoftplus" : c->scoring == NW_SCORE_SOFTMAX ? "softmax" : "sigmoid",
            (double)c->route_scale);
    fprintf(f, "hyper-connections %d streams, %d Sinkhorn iterations, eps %g\n", c->M, c->sinkhorn_iters,
            (double)c->hc_eps);
    fprintf(f, "vocab             %d; max positions %d; rope theta %g; rms eps %g; lm_head %s\n", c->vocab,
            c->max_pos, (double)c->rope_theta, (double)c->norm_eps, c->tie_embeddings ? "tied" : "untied");
    char nb[32];
    fprintf(f, "parameters        %s total\n", whale_fmt_count(nb, total));
    fprintf(f, "  embeddings      %s\n", whale_fmt_count(nb, g_embed));
    fprintf(f, "  attention       %s\n", whale_fmt_count(nb, g_attn));
    fprintf(f, "  gate            %s\n", whale_fmt_count(nb, g_gate));
    fprintf(f, "  routed experts  %s\n", whale_fmt_count(nb, g_routed));
    fprintf(f, "  shared experts  %s\n", whale_fmt_count(nb, g_shared));
    fprintf(f, "  norms           %s\n", whale_fmt_count(nb, g_norm));
    fprintf(f, "  hyper-conn.     %s\n", whale_fmt_count(nb, g_hc));
    fprintf(f, "  lm_head         %s\n", whale_fmt_count(nb, g_head));
    fprintf(f, "  used per token  %s (all but the embedding table and unselected experts)\n", whale_fmt_count(nb, active));
    fprintf(f, "weights memory    fp32 %.1f MiB, bf16/fp16 %.1f MiB, int8 %.1f MiB\n", total * 4 / 1048576.0,
            total * 2 / 1048576.0, total / 1048576.0);
    fprintf(f, "unused tensors    attn.attn_sink (%d layers): loaded, never read by the forward pass\n", c->L);
    fprintf(f, "no gradient       ffn.gate.bias: used only to select experts\n");
    fprintf(f, "inert config      num_key_value_heads, n_shared_experts, sliding_window, compress_ratios,\n"
               "                  index_*, num_nextn_predict_layers, rope_scaling, hidden_act: accepted, ignored\n");
}

/* ------------------------------------------------------------------ activations */

/* What HC_pre and the sub-layer norm produce (saved for the backward pass). */
typedef struct {
    float *rstd;      /* [T] 1/rms of the flattened streams */
    float *mix;       /* [T, mix] rstd · (X · fnᵀ) */
    float *pre, *post; /* [T, M] */
    float *comb;      /* [T, M, M] */
    float *y;         /* [T, D] Σ_m pre_m X_m */
    float *norm_rstd; /* [T] */
    float *yn;        /* [T, D] normalised sub-layer input */
} nw_hc_acts;

/* Everything one layer's forward produces that its backward needs. An
 * inference session has one set shared by all layers; a training session
 * has one per layer. The same forward code fills either. */
typedef struct {
    nw_hc_acts hca, hcf;
    float *qlat_raw, *qlat_rstd, *qlat; /* [T, Q], [T], [T, Q] */
    float *q_raw, *q_rstd, *q;          /* [T, H·Dh], [T·H], [T, H·Dh] (normed, rotated) */
    float *kv_raw, *kv_rstd, *kv;       /* [T, Dh], [T], [T, Dh] (normed, rotated) */
    float *att, *att_d;                 /* [T, H·Dh] attention output, then de-rotated */
    float *z;                           /* [T, G·Ro] */
    float *a;                           /* [T, D] attention sub-layer output */
    float *glog;                        /* [T, E] gate logits */
    int32_t *topk;                      /* [T, K] */
    float *topw;                        /* [T, K] */
    int32_t *ex_off;                    /* [E+1] rows of each expert in the ex_* buffers */
    int32_t *ex_tok;                    /* [K·T] token of each routed row */
    int32_t *ex_row;                    /* [T, K] routed row of each (token, slot) */
    float *ex_w;                        /* [K·T] its routing weight */
    float *ex_g, *ex_u, *ex_h;          /* [K·T, F] w1 and w3 outputs, SwiGLU */
    float *ex_out;                      /* [K·T, D] expert outputs before weighting */
    float *sh_g, *sh_u, *sh_h;          /* [T, F] shared expert */
    float *f;                           /* [T, D] MoE sub-layer output */
} nw_layer_acts;

typedef struct {
    whale_session base;
    int T;              /* max tokens per forward (the header's n_batch) */
    int n_act_sets;     /* 1 (inference) or L (training) */
    int32_t *pos;       /* [T] RoPE positions */
    const int32_t *seg; /* [T] first key each token may see (packed documents), or NULL */
    float **X;          /* [2L+1] HC states [T, M, D]: X[2l] enters layer l, X[2l+1] after its attention */
    float *xbuf;        /* storage behind X */
    nw_layer_acts *acts;
    float *head_rstd, *head_mix, *head_pre, *h, *hn_rstd, *hn; /* HC head and final norm */
    float *ex_in;       /* [T, D] rows gathered for one expert */
    float *last;        /* [max_batch, D]: rows whose logits are wanted, gathered max_batch at a time */
    float *att_work;    /* the KV cache (rotated kv, K = V) is the header's kv: inference only */
    whale_bufs bufs;    /* every buffer, or only their sizes (whale memory) */
    struct nw_backward *bw; /* training sessions only */
} nw_session;

/* Op groups timed by --profile. */
enum {
    P_EMBED, P_HC_PRE, P_ATTN, P_HC_POST, P_MOE, P_HEAD, P_LOGITS,
    P_B_LOGITS, P_B_HEAD, P_B_HC_POST, P_B_MOE, P_B_HC_PRE, P_B_ATTN, P_B_EMBED, P_RECOMPUTE, P_COUNT
};
static const char *const prof_names[P_COUNT] = {
    "embedding", "hc_pre + norm", "attention", "hc_post", "moe", "hc_head + final norm", "lm_head (+ loss)",
    "lm_head + loss backward", "hc_head backward", "hc_post backward", "moe backward", "hc_pre backward",
    "attention backward", "embedding backward", "recompute (forward again)",
};
/* Time a statement into group id when profiling (one branch when not). */
#define PROF(s, id, stmt) WHALE_PROF(&(s)->base, id, stmt)
/* an op of the session's backend (backend/backend.h); an fp32 weight operand */
#define OP(op, ...) WHALE_OP(&s->base, op, __VA_ARGS__)
#define F32W(W, ld) ((whale_wref){WHALE_F32, (W), (ld), NULL, 0})

static whale_code nw_forward(whale_session *base, const whale_ubatch *ub, float *logits, whale_err *err);

static void nw_backward_free(struct nw_backward *bw);

static void nw_session_free(whale_session *base) {
    nw_session *s = (nw_session *)base;
    whale_backend_close(base->be);
    nw_backward_free(s->bw);
    free(base->grads);
    free(base->grad_offsets);
    whale_bufs_free(&s->bufs);
    free(s->acts);
    free(s->X);
    free(s);
}

/* n elements of size sz, freed with the session (counted only, when sizing). */
static void *sess_alloc(nw_session *s, size_t n, size_t sz, size_t *total) {
    return whale_bufs_alloc(&s->bufs, n, sz, total);
}

static int alloc_hc_acts(nw_session *s, nw_hc_acts *h, const nw_config *c, size_t T, size_t *tot) {
    return (h->rstd = sess_alloc(s, T, 4, tot)) && (h->mix = sess_alloc(s, T * c->mix, 4, tot)) &&
           (h->pre = sess_alloc(s, T * c->M, 4, tot)) && (h->post = sess_alloc(s, T * c->M, 4, tot)) &&
           (h->comb = sess_alloc(s, T * c->M * c->M, 4, tot)) && (h->y = sess_alloc(s, T * c->D, 4, tot)) &&
           (h->norm_rstd = sess_alloc(s, T, 4, tot)) && (h->yn = sess_alloc(s, T * c->D, 4, tot));
}

static int alloc_layer_acts(nw_session *s, nw_layer_acts *a, const nw_config *c, size_t T, size_t *tot) {
    size_t HD = (size_t)c->H * c->Dh, KT = (size_t)c->K * T;
    return alloc_hc_acts(s, &a->hca, c, T, tot) && alloc_hc_acts(s, &a->hcf, c, T, tot) &&
           (a->qlat_raw = sess_alloc(s, T * c->Q, 4, tot)) && (a->qlat_rstd = sess_alloc(s, T, 4, tot)) &&
           (a->qlat = sess_alloc(s, T * c->Q, 4, tot)) && (a->q_raw = sess_alloc(s, T * HD, 4, tot)) &&
           (a->q_rstd = sess_alloc(s, T * c->H, 4, tot)) && (a->q = sess_alloc(s, T * HD, 4, tot)) &&
           (a->kv_raw = sess_alloc(s, T * c->Dh, 4, tot)) && (a->kv_rstd = sess_alloc(s, T, 4, tot)) &&
           (a->kv = sess_alloc(s, T * c->Dh, 4, tot)) && (a->att = sess_alloc(s, T * HD, 4, tot)) &&
           (a->att_d = sess_alloc(s, T * HD, 4, tot)) && (a->z = sess_alloc(s, T * c->G * c->Ro, 4, tot)) &&
           (a->a = sess_alloc(s, T * c->D, 4, tot)) && (a->glog = sess_alloc(s, T * c->E, 4, tot)) &&
           (a->topk = sess_alloc(s, T * c->K, 4, tot)) && (a->topw = sess_alloc(s, T * c->K, 4, tot)) &&
           (a->ex_off = sess_alloc(s, (size_t)c->E + 1, 4, tot)) && (a->ex_tok = sess_alloc(s, KT, 4, tot)) &&
           (a->ex_row = sess_alloc(s, KT, 4, tot)) &&
           (a->ex_w = sess_alloc(s, KT, 4, tot)) && (a->ex_g = sess_alloc(s, KT * c->F, 4, tot)) &&
           (a->ex_u = sess_alloc(s, KT * c->F, 4, tot)) && (a->ex_h = sess_alloc(s, KT * c->F, 4, tot)) &&
           (a->ex_out = sess_alloc(s, KT * c->D, 4, tot)) && (a->sh_g = sess_alloc(s, T * c->F, 4, tot)) &&
           (a->sh_u = sess_alloc(s, T * c->F, 4, tot)) && (a->sh_h = sess_alloc(s, T * c->F, 4, tot)) &&
           (a->f = sess_alloc(s, T * c->D, 4, tot));
}

/* Forwards of n_tokens tokens and, for inference, a KV cache of max_batch
 * sequences × max_seq cells (training: max_batch × max_seq = n_tokens).
 * training=1 keeps every layer's input state and, unless recompute, every
 * layer's activations (and no KV cache). */
static whale_code nw_session_create(whale_model *m, int max_batch, int max_seq, int n_tokens, int training,
                                    int recompute, int count_only, nw_session **out, whale_err *err) {
    nw_model *nw = m->impl;
    const nw_config *c = &nw->c;
    if (!count_only) {
        whale_code e = whale_rope_reserve(&nw->rope_cos, &nw->rope_sin, &nw->rope_len, max_seq, c->R, c->rope_theta, err);
        if (e) return e;
    }
    nw_session *s = calloc(1, sizeof *s);
    if (!s) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory creating a session");
    s->base.model = m;
    s->base.max_batch = max_batch;
    s->base.max_seq = max_seq;
    s->base.n_batch = n_tokens;
    s->base.free_fn = nw_session_free;
    s->base.forward_fn = nw_forward;
    s->base.prof_names = prof_names;
    s->base.n_prof = P_COUNT;
    s->bufs.count_only = count_only;
    size_t T = (size_t)n_tokens, MD = (size_t)c->M * c->D, tot = 0;
    s->T = (int)T;
    s->n_act_sets = training && !recompute ? c->L : 1;
    whale_code e = whale_session_open_backend(&s->base, err);
    if (e) {
        free(s);
        return e;
    }
    int n_states = training ? 2 * c->L + 1 : 2, ok = 1;
    s->X = calloc((size_t)2 * c->L + 1, sizeof(float *));
    s->acts = calloc((size_t)s->n_act_sets, sizeof *s->acts);
    ok = s->X && s->acts && (s->xbuf = sess_alloc(s, (size_t)n_states * T * MD, 4, &tot));
    for (int i = 0; ok && !count_only && i <= 2 * c->L; i++)
        s->X[i] = s->xbuf + (size_t)(training ? i : i % 2) * T * MD;
    size_t before_acts = tot;
    for (int l = 0; ok && l < s->n_act_sets; l++) ok = alloc_layer_acts(s, &s->acts[l], c, T, &tot);
    size_t per_set = (tot - before_acts) / (size_t)s->n_act_sets;
    ok = ok && (s->pos = sess_alloc(s, T, 4, &tot)) && (s->head_rstd = sess_alloc(s, T, 4, &tot)) &&
         (s->head_mix = sess_alloc(s, T * c->M, 4, &tot)) && (s->head_pre = sess_alloc(s, T * c->M, 4, &tot)) &&
         (s->h = sess_alloc(s, T * c->D, 4, &tot)) && (s->hn_rstd = sess_alloc(s, T, 4, &tot)) &&
         (s->hn = sess_alloc(s, T * c->D, 4, &tot)) && (s->ex_in = sess_alloc(s, T * c->D, 4, &tot)) &&
         (s->last = sess_alloc(s, (size_t)max_batch * c->D, 4, &tot));
    size_t work = 0, kv = 0, none = 0, lora_floats = whale_lora_work_floats(m);
    s->base.lora_work_floats = lora_floats;
    ok = ok && (!lora_floats || (s->base.lora_work = sess_alloc(s, T * lora_floats, 4, &work))) &&
         (s->att_work = sess_alloc(s, OP(attention_work_floats, max_seq, c->H, 1, c->Dh), 4, &work)) &&
         (training ? (s->base.train_spans = sess_alloc(s, (size_t)max_batch, sizeof(whale_span), &none)) != NULL
                   : whale_kv_alloc(&s->base.kv, &s->bufs, c->L, max_batch, max_seq, c->Dh, 1, &kv));
    if (!ok) {
        nw_session_free(&s->base);
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of activations for batch %d × %d",
                          (tot + work + kv) / 1048576.0, max_batch, max_seq);
    }
    s->base.activation_bytes = tot;
    s->base.kv_bytes = kv;
    s->base.work_bytes = work;
    s->base.recompute_saves = training ? per_set * (size_t)(c->L - 1) : 0;
    *out = s;
    return WHALE_OK;
}

/* ------------------------------------------------------------------ forward */

#define TRACE(dt, data, ndim, shape, ...) \
    do {                                 \
        if (s->base.trace) whale_trace_emit(&s->base, dt, data, ndim, (const int64_t[])shape, __VA_ARGS__); \
    } while (0)
#define DIMS(...) {__VA_ARGS__}

/* Weight products in the run's precision (models/weights.c):
 *   linear:    C[M,N]  = A[M,K]·W[N,K]ᵀ
 *   linear_dx: dA[M,K] (+)= dC[M,N]·W[N,K]
 *   linear_dw: gW[N,K] += dC[M,N]ᵀ·A[M,K]  (gW NULL: W is frozen; LoRA
 *              adapters on W get their gradients either way) */
static whale_code linear(nw_session *s, int M, int N, int K, const float *A, int lda, const float *W, int ldw,
                         float *C, int ldc, whale_err *err) {
    return whale_linear(&s->base, M, N, K, A, lda, W, ldw, C, ldc, err);
}
static whale_code linear_dx(nw_session *s, int M, int N, int K, const float *dC, int lddc, const float *W, int ldw,
                            float *dA, int ldda, int accumulate, whale_err *err) {
    return whale_linear_dx(&s->base, M, N, K, dC, lddc, W, ldw, dA, ldda, accumulate, err);
}
static whale_code linear_dw(nw_session *s, int M, int N, int K, const float *dC, int lddc, const float *A, int lda,
                            const float *W, float *gW, int ldgw, whale_err *err) {
    return whale_linear_dw(&s->base, M, N, K, dC, lddc, A, lda, W, gW, ldgw, err);
}

/* HC_pre of state X, then the sub-layer's RMSNorm. */
static whale_code hc_pre(nw_session *s, const nw_config *c, int T, const float *X, const float *fn,
                         const float *scale, const float *base, const float *norm_w, nw_hc_acts *h,
                         whale_err *err) {
    int MD = c->M * c->D;
    OP(hc_rstd, h->rstd, X, T, MD, c->norm_eps);
    whale_code e = OP(matmul_nt, T, c->mix, MD, X, MD, F32W(fn, MD), h->mix, c->mix, 0, err);
    if (e) return e;
    OP(hc_coeffs, T, h->mix, h->rstd, scale, base, c->M, c->sinkhorn_iters, c->hc_eps, h->pre, h->post, h->comb);
    OP(hc_reduce, h->y, X, h->pre, T, c->M, c->D);
    OP(rmsnorm, h->yn, h->y, norm_w, T, c->D, c->norm_eps, h->norm_rstd);
    return WHALE_OK;
}

static void trace_hc(nw_session *s, const nw_config *c, const nw_hc_acts *h, int T, int l, const char *which) {
    TRACE(WHALE_F32, h->pre, 2, DIMS(T, c->M), "layers.%d.%s.pre", l, which);
    TRACE(WHALE_F32, h->post, 2, DIMS(T, c->M), "layers.%d.%s.post", l, which);
    TRACE(WHALE_F32, h->comb, 3, DIMS(T, c->M, c->M), "layers.%d.%s.comb", l, which);
    TRACE(WHALE_F32, h->mix, 2, DIMS(T, c->mix), "layers.%d.%s.mix", l, which);
    TRACE(WHALE_F32, h->y, 2, DIMS(T, c->D), "layers.%d.%s.y", l, which);
    TRACE(WHALE_F32, h->yn, 2, DIMS(T, c->D), "layers.%d.%s.normed", l, which);
}

/* Attention of yn [T, D] into a->a [T, D], each span of the
 * micro-batch over its own sequence. Keys/values come from the KV cache
 * (inference: the span's kv appended to its sequence's cells) or from
 * a->kv (training). */
static whale_code attention(nw_session *s, const nw_model *nw, const nw_layer *ly, nw_layer_acts *a,
                            const float *yn, int l, whale_err *err) {
    const nw_config *c = &nw->c;
    const whale_ubatch *ub = s->base.ub;
    int T = ub->T, HD = c->H * c->Dh, gin = HD / c->G; /* wo_a input per group */
    whale_code e;
    const whale_linear_part inputs[2] = {{T, c->Q, yn, c->D, ly->wq_a, c->D, a->qlat_raw, c->Q}, /* both from yn */
                                         {T, c->Dh, yn, c->D, ly->wkv, c->D, a->kv_raw, c->Dh}};
    if ((e = whale_linear_parts(&s->base, c->D, 2, inputs, err))) return e;
    OP(rmsnorm, a->qlat, a->qlat_raw, ly->q_norm, T, c->Q, c->norm_eps, a->qlat_rstd);
    if ((e = linear(s, T, HD, c->Q, a->qlat, c->Q, ly->wq_b, c->Q, a->q_raw, HD, err))) return e;
    OP(rmsnorm, a->q, a->q_raw, NULL, (long)T * c->H, c->Dh, c->norm_eps, a->q_rstd); /* per head, no weight */
    OP(rmsnorm, a->kv, a->kv_raw, ly->kv_norm, T, c->Dh, c->norm_eps, a->kv_rstd);
    OP(rope, a->q, T, HD, c->H, c->Dh, c->R, s->pos, nw->rope_cos, nw->rope_sin, 0);
    OP(rope, a->kv, T, c->Dh, 1, c->Dh, c->R, s->pos, nw->rope_cos, nw->rope_sin, 0);

    float scale = 1.0f / sqrtf((float)c->Dh);
    if ((e = whale_attention_ubatch(&s->base, l, a->att, a->q, a->kv, a->kv, c->Dh, s->seg, c->H, 1, c->Dh, scale,
                                    s->att_work, err)))
        return e;
    TRACE(WHALE_F32, a->qlat, 2, DIMS(T, c->Q), "layers.%d.attn.q_latent", l);
    TRACE(WHALE_F32, a->q, 2, DIMS(T, HD), "layers.%d.attn.q", l);
    TRACE(WHALE_F32, a->kv, 2, DIMS(T, c->Dh), "layers.%d.attn.kv", l);
    TRACE(WHALE_F32, a->att, 2, DIMS(T, HD), "layers.%d.attn.context", l);
    OP(buf_copy, a->att_d, a->att, sizeof(float) * (size_t)T * HD);
    OP(rope, a->att_d, T, HD, c->H, c->Dh, c->R, s->pos, nw->rope_cos, nw->rope_sin, 1); /* de-rotate */
    /* grouped low-rank output: wo_a is block-diagonal, one product per group */
    for (int g0 = 0; g0 < c->G; g0 += 16) { /* 16 groups per call */
        whale_linear_part groups[16];
        int ng = c->G - g0 < 16 ? c->G - g0 : 16;
        for (int i = 0; i < ng; i++) {
            size_t gi = (size_t)(g0 + i);
            groups[i] = (whale_linear_part){T,   c->Ro, a->att_d + gi * gin, HD, ly->wo_a + gi * c->Ro * gin,
                                            gin, a->z + gi * c->Ro, c->G * c->Ro};
        }
        if ((e = whale_linear_parts(&s->base, gin, ng, groups, err))) return e;
    }
    return linear(s, T, c->D, c->G * c->Ro, a->z, c->G * c->Ro, ly->wo_b, c->G * c->Ro, a->a, c->D, err);
}

/* SwiGLU expert on n rows of x: g = x·w1ᵀ, u = x·w3ᵀ, h = silu(g)·u, out = h·w2ᵀ. */
static whale_code swiglu_expert(nw_session *s, const nw_config *c, int n, const float *x, const float *w1,
                                const float *w2, const float *w3, float limit, float *g, float *u, float *h,
                                float *out, whale_err *err) {
    whale_code e;
    if ((e = linear(s, n, c->F, c->D, x, c->D, w1, c->D, g, c->F, err))) return e;
    if ((e = linear(s, n, c->F, c->D, x, c->D, w3, c->D, u, c->F, err))) return e;
    OP(buf_copy, h, g, sizeof(float) * (size_t)n * c->F);
    OP(swiglu, h, u, (long)n * c->F, limit);
    return linear(s, n, c->D, c->F, h, c->F, w2, c->F, out, c->D, err);
}

/* Up to MOE_FEW_TOKENS tokens, the experts run in groups (moe_few_tokens):
 * each product has at most that many rows, which the cpu backend's skinny
 * kernels take (whale_gemm_nt_parts, one parallel region per call); above,
 * one product at a time (oneDNN's beyond own_max_m_nt rows). A group holds
 * two up products per expert (w1, w3) and one down product, on its rows of
 * the micro-batch. */
enum { MOE_FEW_TOKENS = 16, MOE_GROUP = WHALE_MM_MAX_PARTS / 2 };
typedef struct {
    whale_linear_part up[2 * MOE_GROUP], down[MOE_GROUP];
    const int32_t *up_rows[2 * MOE_GROUP], *rows[MOE_GROUP]; /* NULL: all the micro-batch's rows */
    float *h[MOE_GROUP], limit[MOE_GROUP];
    int n;
} moe_group;

/* Add an expert on the n rows x (rows: which of the micro-batch's, NULL
 * all) to the group: up products into g, u, SwiGLU into h, down into out. */
static void moe_group_add(moe_group *gr, const nw_config *c, int n, const float *x, const int32_t *rows,
                          const float *w1, const float *w2, const float *w3, float limit, float *g, float *u,
                          float *h, float *out) {
    int i = gr->n++;
    gr->up[2 * i] = (whale_linear_part){n, c->F, x, c->D, w1, c->D, g, c->F};
    gr->up[2 * i + 1] = (whale_linear_part){n, c->F, x, c->D, w3, c->D, u, c->F};
    gr->down[i] = (whale_linear_part){n, c->D, h, c->F, w2, c->F, out, c->D};
    gr->up_rows[2 * i] = gr->up_rows[2 * i + 1] = gr->rows[i] = rows;
    gr->h[i] = h, gr->limit[i] = limit;
}

/* The group's experts: every up product in one call, the SwiGLUs, every
 * down product in another (swiglu_expert's arithmetic); then empty. */
static whale_code moe_group_run(nw_session *s, const nw_config *c, moe_group *gr, whale_err *err) {
    int n = gr->n;
    gr->n = 0;
    whale_code e = whale_linear_parts_rows(&s->base, c->D, 2 * n, gr->up, gr->up_rows, err);
    if (e) return e;
    for (int i = 0; i < n; i++) {
        size_t len = (size_t)gr->up[2 * i].M * c->F;
        OP(buf_copy, gr->h[i], gr->up[2 * i].C, sizeof(float) * len);
        OP(swiglu, gr->h[i], gr->up[2 * i + 1].C, (long)len, gr->limit[i]);
    }
    return whale_linear_parts_rows(&s->base, c->F, n, gr->down, gr->rows, err);
}

/* The experts of a few tokens (decoding one stream or several): the same
 * products and sums as the loop in moe below, but each group of up to
 * MOE_GROUP experts (those with rows, then the shared one on all of yn)
 * runs in two calls (two parallel regions) instead of three product calls
 * per expert: nanowhale-100m's four routed experts and the shared one at 2
 * to 16 tokens, 2 regions per layer instead of 15. One thread, the moe
 * group for 64 decode steps (whale bench --preset nanowhale-100m --what
 * decode --threads 1 --tokens 64 --profile, medians of 2-4 alternated runs
 * on a loaded machine): int8 at 4 / 8 / 16 streams 284 → 189, 321 → 231,
 * 499 → 379 ms; bf16 310 → 259, 261 → 229, 428 → 442 (noise).
 * An expert's gathered input rows go where its down product will write
 * (a->ex_out): its up products read them before. */
static whale_code moe_few_tokens(nw_session *s, const nw_config *c, const nw_layer *ly, nw_layer_acts *a,
                                 const float *yn, int T, int l, whale_err *err) {
    moe_group gr = {.n = 0};
    whale_code e = WHALE_OK;
    for (int ex = 0; ex < c->E && !e; ex++) {
        int r0 = a->ex_off[ex], ne = a->ex_off[ex + 1] - r0;
        if (!ne) continue;
        size_t fo = (size_t)r0 * c->F;
        float *out = a->ex_out + (size_t)r0 * c->D;
        const int32_t *rows = ne < T ? a->ex_tok + r0 : NULL; /* all T tokens: yn as it is */
        if (rows) OP(gather_rows, out, yn, c->D, rows, NULL, ne, c->D);
        moe_group_add(&gr, c, ne, rows ? out : yn, rows, ly->w1[ex], ly->w2[ex], ly->w3[ex], c->swiglu_limit,
                      a->ex_g + fo, a->ex_u + fo, a->ex_h + fo, out);
        if (gr.n == MOE_GROUP) e = moe_group_run(s, c, &gr, err);
    }
    if (e) return e;
    moe_group_add(&gr, c, T, yn, NULL, ly->sw1, ly->sw2, ly->sw3, 0.0f, a->sh_g, a->sh_u, a->sh_h, s->ex_in);
    if ((e = moe_group_run(s, c, &gr, err))) return e;
    for (int ex = 0; ex < c->E; ex++) { /* ascending expert index, then the shared expert */
        int r0 = a->ex_off[ex], ne = a->ex_off[ex + 1] - r0;
        if (ne)
            OP(scatter_add_rows, a->f, c->D, a->ex_out + (size_t)r0 * c->D, c->D, a->ex_tok + r0, a->ex_w + r0, ne,
               c->D);
    }
    TRACE(WHALE_F32, a->ex_h, 2, DIMS(a->ex_off[c->E], c->F), "layers.%d.ffn.expert_hidden", l);
    OP(add, a->f, a->f, s->ex_in, (size_t)T * c->D);
    return WHALE_OK;
}

/* MoE of yn [T, D] into a->f [T, D]. */
static whale_code moe(nw_session *s, const nw_config *c, const nw_layer *ly, nw_layer_acts *a, const float *yn,
                      int l, int T, whale_err *err) {
    whale_code e;
    if ((e = OP(matmul_nt, T, c->E, c->D, yn, c->D, F32W(ly->gate_w, c->D), a->glog, c->E, 0, err))) return e;
    OP(gate_route, T, c->scoring, c->E, c->K, c->route_scale, a->glog, ly->gate_b, a->topk, a->topw);
    TRACE(WHALE_F32, a->glog, 2, DIMS(T, c->E), "layers.%d.ffn.gate_logits", l);
    TRACE(WHALE_I32, a->topk, 2, DIMS(T, c->K), "layers.%d.ffn.topk_idx", l);
    TRACE(WHALE_F32, a->topw, 2, DIMS(T, c->K), "layers.%d.ffn.topk_weight", l);

    /* rows of each expert, in token order */
    int n = 0;
    for (int ex = 0; ex < c->E; ex++) {
        a->ex_off[ex] = n;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < c->K; k++)
                if (a->topk[(size_t)t * c->K + k] == ex) {
                    a->ex_row[(size_t)t * c->K + k] = n;
                    a->ex_tok[n] = t;
                    a->ex_w[n++] = a->topw[(size_t)t * c->K + k];
                }
    }
    a->ex_off[c->E] = n;

    OP(buf_zero, a->f, sizeof(float) * (size_t)T * c->D);
    const nw_model *nw = s->base.model->impl;
    if (T <= nw->moe_few_tokens) return moe_few_tokens(s, c, ly, a, yn, T, l, err);
    for (int ex = 0; ex < c->E; ex++) { /* ascending expert index: the reference's summation order */
        int r0 = a->ex_off[ex], ne = a->ex_off[ex + 1] - r0;
        if (!ne) continue;
        OP(gather_rows, s->ex_in, yn, c->D, a->ex_tok + r0, NULL, ne, c->D);
        size_t fo = (size_t)r0 * c->F;
        float *out = a->ex_out + (size_t)r0 * c->D;
        whale_lora_rows_gather(&s->base, ne, a->ex_tok + r0); /* the expert's rows: its tokens' adapters */
        e = swiglu_expert(s, c, ne, s->ex_in, ly->w1[ex], ly->w2[ex], ly->w3[ex], c->swiglu_limit, a->ex_g + fo,
                          a->ex_u + fo, a->ex_h + fo, out, err);
        whale_lora_rows_reset(&s->base);
        if (e) return e;
        OP(scatter_add_rows, a->f, c->D, out, c->D, a->ex_tok + r0, a->ex_w + r0, ne, c->D);
    }
    TRACE(WHALE_F32, a->ex_h, 2, DIMS(a->ex_off[c->E], c->F), "layers.%d.ffn.expert_hidden", l);
    if ((e = swiglu_expert(s, c, T, yn, ly->sw1, ly->sw2, ly->sw3, 0.0f, a->sh_g, a->sh_u, a->sh_h, s->ex_in, err)))
        return e;
    OP(add, a->f, a->f, s->ex_in, (size_t)T * c->D);
    return WHALE_OK;
}

/* One block: X[2l] → HC_pre → attention → HC_post → X[2l+1] → HC_pre
 * → MoE → HC_post → X[2l+2], saving what the backward needs into a. */
static whale_code layer_forward(nw_session *s, int l, nw_layer_acts *a, whale_err *err) {
    const nw_model *nw = s->base.model->impl;
    const nw_config *c = &nw->c;
    const nw_layer *ly = &nw->layers[l];
    int T = s->base.ub->T, D = c->D, M = c->M;
    whale_code e;
    const float *Xin = s->X[2 * l];
    float *Xmid = s->X[2 * l + 1], *Xout = s->X[2 * l + 2];
    PROF(s, P_HC_PRE, e = hc_pre(s, c, T, Xin, ly->hc_attn_fn, ly->hc_attn_scale, ly->hc_attn_base, ly->attn_norm,
                                 &a->hca, err));
    if (e) return e;
    trace_hc(s, c, &a->hca, T, l, "hc_attn");
    PROF(s, P_ATTN, e = attention(s, nw, ly, a, a->hca.yn, l, err));
    if (e) return e;
    TRACE(WHALE_F32, a->z, 2, DIMS(T, c->G * c->Ro), "layers.%d.attn.z", l);
    TRACE(WHALE_F32, a->a, 2, DIMS(T, D), "layers.%d.attn.out", l);
    PROF(s, P_HC_POST, OP(hc_expand, Xmid, a->a, Xin, a->hca.post, a->hca.comb, T, M, D)); /* HC_post */
    TRACE(WHALE_F32, Xmid, 3, DIMS(T, M, D), "layers.%d.hc_attn.state", l);

    PROF(s, P_HC_PRE, e = hc_pre(s, c, T, Xmid, ly->hc_ffn_fn, ly->hc_ffn_scale, ly->hc_ffn_base, ly->ffn_norm,
                                 &a->hcf, err));
    if (e) return e;
    trace_hc(s, c, &a->hcf, T, l, "hc_ffn");
    PROF(s, P_MOE, e = moe(s, c, ly, a, a->hcf.yn, l, T, err));
    if (e) return e;
    TRACE(WHALE_F32, a->sh_h, 2, DIMS(T, c->F), "layers.%d.ffn.shared_hidden", l);
    TRACE(WHALE_F32, a->f, 2, DIMS(T, D), "layers.%d.ffn.out", l);
    PROF(s, P_HC_POST, OP(hc_expand, Xout, a->f, Xmid, a->hcf.post, a->hcf.comb, T, M, D));
    TRACE(WHALE_F32, Xout, 3, DIMS(T, M, D), "layers.%d.hc_ffn.state", l);
    return WHALE_OK;
}

/* All layers and the HC head: the micro-batch's ids → hn [T, D] (final-norm output). */
static whale_code forward_hidden(nw_session *s, const whale_ubatch *ub, whale_err *err) {
    const nw_model *nw = s->base.model->impl;
    const nw_config *c = &nw->c;
    int T = ub->T, D = c->D, M = c->M, MD = M * D;
    whale_code e;

    s->base.ub = ub;
    whale_ubatch_positions(ub, s->pos);
    PROF(s, P_EMBED, { /* every stream of X0 starts as the token's row */
        OP(get_rows, s->X[0], M * D, whale_model_wref(s->base.model, nw->embed, D), ub->ids, T, D);
        OP(repeat_rows, s->X[0], T, M, D);
    });
    for (int l = 0; l < c->L; l++)
        if ((e = whale_session_check_abort(&s->base, err)) ||
            (e = layer_forward(s, l, &s->acts[s->n_act_sets > 1 ? l : 0], err)))
            return e;

    /* HC head: sigmoid reduction of the streams, then the final norm. */
    const float *X = s->X[2 * c->L];
    double t_head = s->base.profiling ? whale_now() : 0;
    OP(hc_rstd, s->head_rstd, X, T, MD, c->norm_eps);
    if ((e = OP(matmul_nt, T, M, MD, X, MD, F32W(nw->hc_head_fn, MD), s->head_mix, M, 0, err))) return e;
    OP(hc_head_coeffs, T, s->head_mix, s->head_rstd, nw->hc_head_scale, nw->hc_head_base, M, c->hc_eps, s->head_pre);
    OP(hc_reduce, s->h, X, s->head_pre, T, M, D);
    OP(rmsnorm, s->hn, s->h, nw->norm, T, D, c->norm_eps, s->hn_rstd);
    if (s->base.profiling) s->base.prof[P_HEAD] += whale_now() - t_head;
    TRACE(WHALE_F32, s->head_pre, 2, DIMS(T, M), "hc_head.pre");
    TRACE(WHALE_F32, s->hn, 2, DIMS(T, D), "final_hidden");
    return WHALE_OK;
}

static whale_code nw_forward(whale_session *base, const whale_ubatch *ub, float *logits, whale_err *err) {
    nw_session *s = (nw_session *)base;
    const nw_model *nw = base->model->impl;
    const nw_config *c = &nw->c;
    s->seg = NULL;
    whale_code e = forward_hidden(s, ub, err);
    if (e || !logits) return e;
    const float *head = c->tie_embeddings ? nw->embed : nw->lm_head;
    PROF(s, P_LOGITS, e = whale_output_logits(base, ub, s->hn, s->last, c->D, c->vocab, head, logits, err));
    if (!e) TRACE(WHALE_F32, logits, 2, DIMS(ub->n_out, c->vocab), "logits");
    return e;
}

/* ------------------------------------------------------------------ backward */

/* Gradient buffers (one set, reused by every layer) and the gradient
 * pointers: gw has the model's structure with every weight pointer aimed at
 * that weight's gradient. */
struct nw_backward {
    nw_model gw;
    float *dXa, *dXb;                    /* [T, M, D] gradient of an HC state */
    float *dsub, *dyn, *dy;              /* [T, D] sub-layer output / normed input / pre-norm input */
    float *dmix, *drstd, *dpre, *dpost, *dcomb;
    float *dz, *datt, *dq, *dqlat, *dkv; /* attention */
    float *dtopw, *dglog;                /* gate */
    float *de_out, *de_x, *dh, *dg, *du; /* one expert at a time: [T, D] ×2, [T, F] ×3 */
    int32_t *tgt;                        /* [T] shifted targets */
    int32_t *tok_of;                     /* [T·K]: the token of each routing slot, i / K */
    int32_t *emb_rows;                   /* [T·M]: the embedding row of each stream, ids[i / M] */
    float *logits;                       /* [WHALE_CE_CHUNK, V] logits, then their gradient */
    float *dhn;                          /* [T, D] */
    float *att_work;
};

static void nw_backward_free(struct nw_backward *bw) {
    if (!bw) return;
    free(bw->gw.layers);
    free(bw->gw.expert_ptrs);
    free(bw); /* the buffers belong to the session's allocation list */
}

/* mix = rstd · (X·fnᵀ): gradients of fn and X (through the product and rstd)
 * from dmix, which is consumed (scaled in place). */
static whale_code mix_backward(nw_session *s, int T, int nmix, int MD, const float *X, const float *fn,
                               const float *mix, const float *rstd, float *dmix, float *dX, float *gfn,
                               whale_err *err) {
    float *drstd = s->bw->drstd;
    /* mix = rstd · (fn·x): drstd = Σ dmix·(fn·x) = Σ dmix·mix / rstd, and the
     * gradient of fn·x is rstd·dmix */
    OP(scale_rows_backward, dmix, drstd, mix, rstd, T, nmix);
    whale_code e;
    if ((e = OP(matmul_tn, WHALE_F32, nmix, MD, T, dmix, nmix, X, MD, gfn, MD, 1, err))) return e;
    if ((e = OP(matmul_nn, T, MD, nmix, dmix, nmix, F32W(fn, MD), dX, MD, 1, err))) return e;
    OP(rstd_backward, dX, X, rstd, drstd, T, MD);
    return WHALE_OK;
}

/* Backward of hc_pre: dyn (gradient of the normed sub-layer input) and
 * dpost/dcomb (from HC_post's backward) into dX (accumulated) and the
 * HC parameters' and norm weight's gradients. */
static whale_code hc_pre_backward(nw_session *s, const nw_config *c, int T, const float *X, const float *fn,
                                  const float *scale, const float *base, const float *norm_w, const nw_hc_acts *h,
                                  float *dX, float *gfn, float *gscale, float *gbase, float *gnorm,
                                  whale_err *err) {
    struct nw_backward *b = s->bw;
    OP(rmsnorm_backward, b->dy, gnorm, b->dyn, h->y, norm_w, h->norm_rstd, T, c->D);
    OP(hc_reduce_backward, dX, b->dpre, b->dy, X, h->pre, T, c->M, c->D);
    OP(hc_coeffs_backward, T, h->mix, scale, base, c->M, c->sinkhorn_iters, c->hc_eps, b->dpre, b->dpost, b->dcomb,
       b->dmix, gscale, gbase);
    return mix_backward(s, T, c->mix, c->M * c->D, X, fn, h->mix, h->rstd, b->dmix, dX, gfn, err);
}

/* Backward of attention(): b->dsub (gradient of a->a) into b->dyn (written). */
static whale_code attention_backward(nw_session *s, const nw_model *nw, const nw_layer *ly, nw_layer *gl,
                                     const nw_layer_acts *a, int B, int S, whale_err *err) {
    const nw_config *c = &nw->c;
    struct nw_backward *b = s->bw;
    int T = B * S, HD = c->H * c->Dh, GR = c->G * c->Ro, gin = HD / c->G;
    float scale = 1.0f / sqrtf((float)c->Dh);
    whale_code e;
    if ((e = linear_dx(s, T, c->D, GR, b->dsub, c->D, ly->wo_b, GR, b->dz, GR, 0, err)) ||
        (e = linear_dw(s, T, c->D, GR, b->dsub, c->D, a->z, GR, ly->wo_b, gl->wo_b, GR, err)))
        return e;
    for (int gi = 0; gi < c->G; gi++) { /* block-diagonal wo_a, one group at a time */
        size_t wo = (size_t)gi * c->Ro * gin;
        if ((e = linear_dx(s, T, c->Ro, gin, b->dz + (size_t)gi * c->Ro, GR, ly->wo_a + wo, gin,
                           b->datt + (size_t)gi * gin, HD, 0, err)) ||
            (e = linear_dw(s, T, c->Ro, gin, b->dz + (size_t)gi * c->Ro, GR, a->att_d + (size_t)gi * gin, HD,
                           ly->wo_a + wo, gl->wo_a ? gl->wo_a + wo : NULL, gin, err)))
            return e;
    }
    OP(rope_backward, b->datt, T, HD, c->H, c->Dh, c->R, s->pos, nw->rope_cos, nw->rope_sin, 1);
    OP(buf_zero, b->dkv, sizeof(float) * (size_t)T * c->Dh);
    for (int bi = 0; bi < B; bi++) {
        const float *kv = a->kv + (size_t)bi * S * c->Dh;
        float *dkv = b->dkv + (size_t)bi * S * c->Dh;
        if ((e = OP(attention_backward, b->dq + (size_t)bi * S * HD, dkv, dkv, b->datt + (size_t)bi * S * HD,
                                      a->q + (size_t)bi * S * HD, kv, kv, c->Dh, s->seg ? s->seg + (size_t)bi * S : NULL,
                                      S, 0, c->H, 1, c->Dh, scale, whale_attention_products(s->base.model),
                                      b->att_work, err)))
            return e;
    }
    OP(rope_backward, b->dq, T, HD, c->H, c->Dh, c->R, s->pos, nw->rope_cos, nw->rope_sin, 0);
    OP(rope_backward, b->dkv, T, c->Dh, 1, c->Dh, c->R, s->pos, nw->rope_cos, nw->rope_sin, 0);
    OP(rmsnorm_backward, b->dq, NULL, b->dq, a->q_raw, NULL, a->q_rstd, (long)T * c->H, c->Dh);
    if ((e = linear_dx(s, T, HD, c->Q, b->dq, HD, ly->wq_b, c->Q, b->dqlat, c->Q, 0, err)) ||
        (e = linear_dw(s, T, HD, c->Q, b->dq, HD, a->qlat, c->Q, ly->wq_b, gl->wq_b, c->Q, err)))
        return e;
    OP(rmsnorm_backward, b->dqlat, gl->q_norm, b->dqlat, a->qlat_raw, ly->q_norm, a->qlat_rstd, T, c->Q);
    const float *yn = a->hca.yn;
    if ((e = linear_dx(s, T, c->Q, c->D, b->dqlat, c->Q, ly->wq_a, c->D, b->dyn, c->D, 0, err)) ||
        (e = linear_dw(s, T, c->Q, c->D, b->dqlat, c->Q, yn, c->D, ly->wq_a, gl->wq_a, c->D, err)))
        return e;
    OP(rmsnorm_backward, b->dkv, gl->kv_norm, b->dkv, a->kv_raw, ly->kv_norm, a->kv_rstd, T, c->Dh);
    if ((e = linear_dx(s, T, c->Dh, c->D, b->dkv, c->Dh, ly->wkv, c->D, b->dyn, c->D, 1, err))) return e;
    return linear_dw(s, T, c->Dh, c->D, b->dkv, c->Dh, yn, c->D, ly->wkv, gl->wkv, c->D, err);
}

/* Backward of one SwiGLU expert on n rows: dout [n, D] → dx [n, D] (written)
 * and the expert's weight gradients. */
static whale_code expert_backward(nw_session *s, const nw_config *c, int n, const float *x, const float *dout,
                                  const float *gg, const float *uu, const float *hh, const float *w1,
                                  const float *w2, const float *w3, float *g1, float *g2, float *g3, float limit,
                                  float *dx, whale_err *err) {
    struct nw_backward *b = s->bw;
    whale_code e;
    if ((e = linear_dx(s, n, c->D, c->F, dout, c->D, w2, c->F, b->dh, c->F, 0, err)) ||
        (e = linear_dw(s, n, c->D, c->F, dout, c->D, hh, c->F, w2, g2, c->F, err)))
        return e;
    OP(swiglu_backward, b->dg, b->du, b->dh, gg, uu, (long)n * c->F, limit);
    if ((e = linear_dx(s, n, c->F, c->D, b->dg, c->F, w1, c->D, dx, c->D, 0, err)) ||
        (e = linear_dx(s, n, c->F, c->D, b->du, c->F, w3, c->D, dx, c->D, 1, err)) ||
        (e = linear_dw(s, n, c->F, c->D, b->dg, c->F, x, c->D, w1, g1, c->D, err)))
        return e;
    return linear_dw(s, n, c->F, c->D, b->du, c->F, x, c->D, w3, g3, c->D, err);
}

/* ---- bf16 products (whale_linear* with bf16 weights): the same backward
 * on operands rounded to bf16 once, where they are made, instead of inside
 * every product that reads them (a gradient feeds both dX and dW). */

/* Does this run multiply W in bf16 (as whale_linear_dx / _dw would)? The
 * paths below then call the products themselves: anything whale_linear_dx
 * / _dw add beyond the product (adapters, say) must turn them off here. */
static int bf16_products(const nw_session *s, const float *W) {
    const whale_model *m = s->base.model;
    return m->compute_dtype == WHALE_BF16 && whale_model_weight(m, W).dtype == WHALE_BF16 && !m->n_lora;
}

/* W's bf16 copy as a product operand ([rows, ld]) */
#define W16(s, W, ld) whale_model_wref((s)->base.model, (W), (ld))

/* expert_backward with bf16 products, from x and dout already rounded
 * (x16, dout16 [n, D]). The bf16 operands live in fp32 buffers free at
 * this point: hh and then dg in b->dg, du in b->du. */
static whale_code expert_backward_bf16(nw_session *s, const nw_config *c, int n, const uint16_t *x16,
                                       const uint16_t *dout16, const float *gg, const float *uu, const float *hh,
                                       const float *w1, const float *w2, const float *w3, float *g1, float *g2,
                                       float *g3, float limit, float *dx, whale_err *err) {
    struct nw_backward *b = s->bw;
    int D = c->D, F = c->F;
    uint16_t *h16 = (uint16_t *)b->dg, *dg16 = (uint16_t *)b->dg, *du16 = (uint16_t *)b->du;
    whale_code e;
    OP(to_bf16, h16, hh, (size_t)n * F);
    if ((e = OP(matmul_tn_b16, D, F, n, dout16, D, h16, F, g2, F, 1, err)) ||
        (e = OP(matmul_nn_b16, n, F, D, dout16, D, W16(s, w2, F), b->dh, F, 0, err)))
        return e;
    OP(swiglu_backward_bf16, dg16, du16, b->dh, gg, uu, (long)n * F, limit);
    if ((e = OP(matmul_nn_b16, n, D, F, dg16, F, W16(s, w1, D), dx, D, 0, err)) ||
        (e = OP(matmul_nn_b16, n, D, F, du16, F, W16(s, w3, D), dx, D, 1, err)) ||
        (e = OP(matmul_tn_b16, F, D, n, dg16, F, x16, D, g1, D, 1, err)))
        return e;
    return OP(matmul_tn_b16, F, D, n, du16, F, x16, D, g3, D, 1, err);
}

/* Backward of moe(): b->dsub (gradient of a->f) into b->dyn (written). */
static whale_code moe_backward(nw_session *s, const nw_config *c, const nw_layer *ly, nw_layer *gl,
                               const nw_layer_acts *a, int T, whale_err *err) {
    struct nw_backward *b = s->bw;
    const float *yn = a->hcf.yn, *df = b->dsub;
    /* bf16: x and dout of each expert rounded once, into buffers the fp32
     * path uses for them (s->ex_in, b->de_out) */
    int lowp = bf16_products(s, ly->sw1);
    uint16_t *x16 = (uint16_t *)s->ex_in, *dout16 = (uint16_t *)b->de_out;
    whale_code e;
    if (lowp) {
        OP(to_bf16, x16, yn, (size_t)T * c->D);
        OP(to_bf16, dout16, df, (size_t)T * c->D);
        e = expert_backward_bf16(s, c, T, x16, dout16, a->sh_g, a->sh_u, a->sh_h, ly->sw1, ly->sw2, ly->sw3, gl->sw1,
                                 gl->sw2, gl->sw3, 0.0f, b->dyn, err);
    } else {
        e = expert_backward(s, c, T, yn, df, a->sh_g, a->sh_u, a->sh_h, ly->sw1, ly->sw2, ly->sw3, gl->sw1, gl->sw2,
                            gl->sw3, 0.0f, b->dyn, err);
    }
    if (e) return e;
    /* gradient of each routing weight: ⟨df, expert output⟩ */
    OP(dot_rows, b->dtopw, df, c->D, b->tok_of, a->ex_out, c->D, a->ex_row, (long)T * c->K, c->D);
    for (int ex = 0; ex < c->E; ex++) {
        int r0 = a->ex_off[ex], ne = a->ex_off[ex + 1] - r0;
        if (!ne) continue;
        /* gather the expert's rows: its tokens' inputs and weighted output gradients */
        const int32_t *tok = a->ex_tok + r0;
        if (lowp) {
            OP(gather_rows_bf16, x16, yn, c->D, tok, NULL, ne, c->D);
            OP(gather_rows_bf16, dout16, df, c->D, tok, a->ex_w + r0, ne, c->D);
        } else {
            OP(gather_rows, s->ex_in, yn, c->D, tok, NULL, ne, c->D);
            OP(gather_rows, b->de_out, df, c->D, tok, a->ex_w + r0, ne, c->D);
        }
        size_t fo = (size_t)r0 * c->F;
        if (lowp)
            e = expert_backward_bf16(s, c, ne, x16, dout16, a->ex_g + fo, a->ex_u + fo, a->ex_h + fo, ly->w1[ex],
                                     ly->w2[ex], ly->w3[ex], gl->w1[ex], gl->w2[ex], gl->w3[ex], c->swiglu_limit,
                                     b->de_x, err);
        else
            e = expert_backward(s, c, ne, s->ex_in, b->de_out, a->ex_g + fo, a->ex_u + fo, a->ex_h + fo, ly->w1[ex],
                                ly->w2[ex], ly->w3[ex], gl->w1[ex], gl->w2[ex], gl->w3[ex], c->swiglu_limit, b->de_x,
                                err);
        if (e) return e;
        /* scatter-add: an expert never sees a token twice, so rows can go in
         * parallel; experts in order keep the sums deterministic */
        OP(scatter_add_rows, b->dyn, c->D, b->de_x, c->D, tok, NULL, ne, c->D);
    }
    OP(gate_route_backward, T, c->scoring, c->E, c->K, c->route_scale, a->glog, a->topk, b->dtopw, b->dglog);
    if ((e = OP(matmul_tn, WHALE_F32, c->E, c->D, T, b->dglog, c->E, yn, c->D, gl->gate_w, c->D, 1, err))) return e;
    return OP(matmul_nn, T, c->D, c->E, b->dglog, c->E, F32W(ly->gate_w, c->D), b->dyn, c->D, 1, err);
}

static whale_code nw_train_step(whale_session *base, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                                const int32_t *seg, int B, int S, double loss_scale, double *loss_out,
                                int64_t *count_out, whale_err *err) {
    nw_session *s = (nw_session *)base;
    const nw_model *nw = base->model->impl;
    const nw_config *c = &nw->c;
    struct nw_backward *b = s->bw;
    nw_model *gw = &b->gw;
    int T = B * S, D = c->D, M = c->M, MD = M * D, V = c->vocab;
    s->seg = seg;
    const whale_ubatch ub = whale_ubatch_training(base->train_spans, ids, pos, B, S);
    whale_code e = forward_hidden(s, &ub, err);
    if (e) return e;

    /* lm_head and cross-entropy in row chunks */
    int64_t count = whale_shift_targets(ids, labels, B, S, b->tgt);
    const float *head = c->tie_embeddings ? nw->embed : nw->lm_head;
    float *ghead = c->tie_embeddings ? gw->embed : gw->lm_head;
    double total = 0, t_ce = s->base.profiling ? whale_now() : 0;
    for (int r0 = 0; r0 < T; r0 += WHALE_CE_CHUNK) {
        int n = T - r0 < WHALE_CE_CHUNK ? T - r0 : WHALE_CE_CHUNK;
        int64_t cn;
        /* gradient of loss_scale × the batch mean: each row's share is 1/count */
        double gs = loss_scale == 0 ? 0 : loss_scale / (double)count, l;
        float *hn = s->hn + (size_t)r0 * D, *dhn = b->dhn + (size_t)r0 * D;
        if (loss_scale == 0 || !bf16_products(s, head)) {
            if ((e = whale_head_loss_chunk(&s->base, n, D, V, hn, head, ghead, b->tgt + r0, gs, b->logits, dhn, &l,
                                           &cn, err)))
                return e;
        } else {
            if ((e = linear(s, n, V, D, hn, D, head, D, b->logits, V, err))) return e;
            /* Both products read the gradient rounded to bf16: round it
             * once, in place (row stride 2V), instead of once per product
             * (a 132 MB fp32 read and a 66 MB write each). */
            if (s->base.trace) { /* the fp32 gradient first, for the trace */
                l = whale_cross_entropy_labels_backward_scaled(b->logits, b->logits, b->tgt + r0, 1, n, V, gs, &cn);
                TRACE(WHALE_F32, b->logits, 2, DIMS(n, V), "grad.logits");
                whale_narrow_rows_bf16(b->logits, n, V);
            } else {
                l = whale_cross_entropy_labels_backward_bf16(b->logits, b->logits, b->tgt + r0, 1, n, V, gs, &cn);
            }
            const uint16_t *dl = (const uint16_t *)b->logits;
            uint16_t *hn16 = (uint16_t *)b->de_out; /* free until the MoE backward */
            OP(to_bf16, hn16, hn, (size_t)n * D);
            if ((e = OP(matmul_nn_b16, n, D, V, dl, 2 * V, W16(s, head, D), dhn, D, 0, err)) ||
                (ghead && (e = OP(matmul_tn_b16, V, D, n, dl, 2 * V, hn16, D, ghead, D, 1, err))))
                return e;
        }
        if (cn) total += l * (double)cn;
    }
    if (s->base.profiling) s->base.prof[loss_scale == 0 ? P_LOGITS : P_B_LOGITS] += whale_now() - t_ce;
    *loss_out = count ? total / (double)count : NAN;
    *count_out = count;
    if (loss_scale == 0) return WHALE_OK;

    /* final norm and HC head */
    const float *Xf = s->X[2 * c->L];
    float *dX = b->dXa, *dXo = b->dXb;
    PROF(s, P_B_HEAD, {
        OP(rmsnorm_backward, b->dy, gw->norm, b->dhn, s->h, nw->norm, s->hn_rstd, T, D);
        OP(buf_zero, dX, sizeof(float) * (size_t)T * MD);
        OP(hc_reduce_backward, dX, b->dpre, b->dy, Xf, s->head_pre, T, M, D);
        OP(hc_head_coeffs_backward, T, s->head_mix, nw->hc_head_scale, nw->hc_head_base, M, c->hc_eps, b->dpre, b->dmix, gw->hc_head_scale, gw->hc_head_base);
        e = mix_backward(s, T, M, MD, Xf, nw->hc_head_fn, s->head_mix, s->head_rstd, b->dmix, dX, gw->hc_head_fn, err);
    });
    if (e) return e;
    /* the norm and an untied lm_head (the HC head's parameters lead the table: at the end) */
    if ((e = whale_session_grads_final(base, nw->norm, err))) return e;
    TRACE(WHALE_F32, b->dhn, 2, DIMS(T, D), "grad.final_hidden");
    TRACE(WHALE_F32, dX, 3, DIMS(T, M, D), "grad.layers.%d.hc_ffn.state", c->L - 1);

    for (int l = c->L - 1; l >= 0; l--) {
        if ((e = whale_session_check_abort(&s->base, err))) return e;
        const nw_layer *ly = &nw->layers[l];
        nw_layer *gl = &gw->layers[l];
        const nw_layer_acts *a = &s->acts[s->n_act_sets > 1 ? l : 0];
        if (s->n_act_sets == 1) { /* recompute: this layer's activations again, from its saved input */
            PROF(s, P_RECOMPUTE, e = layer_forward(s, l, &s->acts[0], err));
            if (e) return e;
        }
        const float *Xin = s->X[2 * l], *Xmid = s->X[2 * l + 1];
        /* MoE sub-layer: dX holds the gradient of the layer's output state */
        PROF(s, P_B_HC_POST, {
            OP(buf_zero, dXo, sizeof(float) * (size_t)T * MD);
            OP(hc_expand_backward, b->dsub, dXo, b->dpost, b->dcomb, dX, a->f, Xmid, a->hcf.post, a->hcf.comb, T, M, D);
        });
        TRACE(WHALE_F32, b->dsub, 2, DIMS(T, D), "grad.layers.%d.ffn.out", l);
        PROF(s, P_B_MOE, e = moe_backward(s, c, ly, gl, a, T, err));
        if (e) return e;
        TRACE(WHALE_F32, b->dglog, 2, DIMS(T, c->E), "grad.layers.%d.ffn.gate_logits", l);
        TRACE(WHALE_F32, b->dyn, 2, DIMS(T, D), "grad.layers.%d.hc_ffn.normed", l);
        PROF(s, P_B_HC_PRE, e = hc_pre_backward(s, c, T, Xmid, ly->hc_ffn_fn, ly->hc_ffn_scale, ly->hc_ffn_base,
                                                ly->ffn_norm, &a->hcf, dXo, gl->hc_ffn_fn, gl->hc_ffn_scale,
                                                gl->hc_ffn_base, gl->ffn_norm, err));
        if (e) return e;
        TRACE(WHALE_F32, dXo, 3, DIMS(T, M, D), "grad.layers.%d.hc_attn.state", l);
        /* attention sub-layer: dXo now holds the gradient of the middle state */
        PROF(s, P_B_HC_POST, {
            OP(buf_zero, dX, sizeof(float) * (size_t)T * MD);
            OP(hc_expand_backward, b->dsub, dX, b->dpost, b->dcomb, dXo, a->a, Xin, a->hca.post, a->hca.comb, T, M, D);
        });
        TRACE(WHALE_F32, b->dsub, 2, DIMS(T, D), "grad.layers.%d.attn.out", l);
        PROF(s, P_B_ATTN, e = attention_backward(s, nw, ly, gl, a, B, S, err));
        if (e) return e;
        TRACE(WHALE_F32, b->dq, 2, DIMS(T, c->H * c->Dh), "grad.layers.%d.attn.q_raw", l);
        TRACE(WHALE_F32, b->dkv, 2, DIMS(T, c->Dh), "grad.layers.%d.attn.kv_raw", l);
        TRACE(WHALE_F32, b->dyn, 2, DIMS(T, D), "grad.layers.%d.hc_attn.normed", l);
        PROF(s, P_B_HC_PRE, e = hc_pre_backward(s, c, T, Xin, ly->hc_attn_fn, ly->hc_attn_scale, ly->hc_attn_base,
                                                ly->attn_norm, &a->hca, dX, gl->hc_attn_fn, gl->hc_attn_scale,
                                                gl->hc_attn_base, gl->attn_norm, err));
        if (e) return e;
        if ((e = whale_session_grads_final(base, ly->hc_attn_fn, err))) return e; /* layer l's first parameter on */
        if (l > 0) TRACE(WHALE_F32, dX, 3, DIMS(T, M, D), "grad.layers.%d.hc_ffn.state", l - 1);
        else TRACE(WHALE_F32, dX, 3, DIMS(T, M, D), "grad.embedding");
    }
    /* embedding: every stream of X0 is a copy of the token's row */
    if (!gw->embed) return WHALE_OK; /* frozen */
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)T * M);
    if (!rows) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the embedding's gradient");
    for (int i = 0; i < T * M; i++) rows[i] = ids[i / M];
    OP(buf_from_host, b->emb_rows, rows, sizeof(int32_t) * (size_t)T * M);
    free(rows);
    /* tokens in order, each token's streams in order: the sums of one row
     * (a token seen twice) are taken in that order */
    PROF(s, P_B_EMBED, OP(scatter_add_rows, gw->embed, D, dX, D, b->emb_rows, NULL, (long)T * M, D));
    return WHALE_OK;
}

static whale_code register_grads(whale_model *scratch, void *gw, whale_err *err) {
    return register_params(scratch, gw, err);
}

static whale_code train_session_create(whale_model *m, int max_batch, int seq, int recompute, int count_only,
                                       nw_session **out, whale_err *err) {
    const nw_model *nw = m->impl;
    const nw_config *c = &nw->c;
    nw_session *s = NULL;
    whale_code e = nw_session_create(m, max_batch, seq, max_batch * seq, 1, recompute, count_only, &s, err);
    if (e) return e;
    whale_session *base = &s->base;
    base->train_fn = nw_train_step;
    size_t T = (size_t)max_batch * seq, MD = (size_t)c->M * c->D, HD = (size_t)c->H * c->Dh, tot = 0;
    struct nw_backward *b = s->bw = calloc(1, sizeof *b);
    if (!b) goto nomem;
    if ((e = whale_session_alloc_grads(base, count_only, err))) { /* frozen weights (LoRA's base): no buffer */
        nw_session_free(base);
        return e;
    }
    b->gw.c = *c; /* the model's structure, its weight pointers aimed at the gradients */
    if ((e = whale_session_bind_grads(base, register_grads, &b->gw, count_only, err))) {
        nw_session_free(base);
        return e;
    }

    size_t V = (size_t)c->vocab, ch = T < WHALE_CE_CHUNK ? T : WHALE_CE_CHUNK;
#define A(ptr, n) ((ptr = sess_alloc(s, (n), 4, &tot)) != NULL)
    if (!(A(b->dXa, T * MD) && A(b->dXb, T * MD) && A(b->dsub, T * c->D) && A(b->dyn, T * c->D) &&
          A(b->dy, T * c->D) && A(b->dmix, T * c->mix) && A(b->drstd, T) && A(b->dpre, T * c->M) &&
          A(b->dpost, T * c->M) && A(b->dcomb, T * c->M * c->M) && A(b->dz, T * c->G * c->Ro) && A(b->datt, T * HD) &&
          A(b->dq, T * HD) && A(b->dqlat, T * c->Q) && A(b->dkv, T * c->Dh) && A(b->dtopw, T * c->K) &&
          A(b->dglog, T * c->E) && A(b->de_out, T * c->D) && A(b->de_x, T * c->D) && A(b->dh, T * c->F) &&
          A(b->dg, T * c->F) && A(b->du, T * c->F) && A(b->tgt, T) && A(b->logits, ch * V) && A(b->dhn, T * c->D) &&
          A(b->att_work, OP(attention_backward_work_floats, seq, c->H, 1, c->Dh))))
        goto nomem;
#undef A
    size_t none = 0; /* index arrays: bookkeeping, not counted */
    if (!(b->tok_of = sess_alloc(s, T * c->K, sizeof(int32_t), &none)) ||
        !(b->emb_rows = sess_alloc(s, T * c->M, sizeof(int32_t), &none)))
        goto nomem;
    if (!count_only) {
        int32_t *tok = malloc(sizeof(int32_t) * T * c->K);
        if (!tok) goto nomem;
        for (size_t i = 0; i < T * c->K; i++) tok[i] = (int32_t)(i / (size_t)c->K);
        OP(buf_from_host, b->tok_of, tok, sizeof(int32_t) * T * c->K);
        free(tok);
    }
    base->work_bytes += tot;
    *out = s;
    return WHALE_OK;
nomem:
    nw_session_free(base);
    return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate training buffers for batch %d × %d", max_batch, seq);
}

static whale_code nw_session_new(whale_model *m, const whale_session_spec *sp, whale_session **out,
                                 whale_err *err) {
    nw_session *s = NULL;
    whale_code e = sp->training
                       ? train_session_create(m, sp->n_seq, sp->n_ctx, sp->recompute, sp->count_only, &s, err)
                       : nw_session_create(m, sp->n_seq, sp->n_ctx, sp->n_batch, 0, 0, sp->count_only, &s, err);
    *out = e ? NULL : &s->base;
    return e;
}

/* ------------------------------------------------------------------ costs */

/* Weights every token multiplies with (per layer): HC mixes, attention
 * projections, gate, K routed experts and the shared expert. */
static double layer_macs_per_token(const nw_config *c) {
    double HD = (double)c->H * c->Dh;
    double hc = 2.0 * c->mix * c->M * c->D;
    double attn = (double)c->D * c->Q + (double)c->Q * HD + (double)c->D * c->Dh + HD * c->Ro + (double)c->G * c->Ro * c->D;
    double moe = (double)c->E * c->D + (c->K + 1) * 3.0 * c->D * c->F;
    return hc + attn + moe;
}

static double nw_forward_flops(const whale_model *m, int B, int S, int p0, int logit_rows) {
    const nw_config *c = &((const nw_model *)m->impl)->c;
    double T = (double)B * S;
    /* causal attention: query s sees p0+s+1 keys; QK^T and PV both 2·Dh per key per head */
    double keys = (double)B * ((double)S * p0 + (double)S * (S + 1) / 2.0);
    double attn = 4.0 * keys * c->H * c->Dh * c->L;
    double head = 2.0 * c->M * c->M * c->D * T + 2.0 * (double)logit_rows * c->vocab * c->D;
    return 2.0 * T * layer_macs_per_token(c) * c->L + attn + head;
}

static double nw_decode_weight_bytes(const whale_model *m) {
    const nw_config *c = &((const nw_model *)m->impl)->c;
    return 4.0 * (layer_macs_per_token(c) * c->L + (double)c->M * c->M * c->D + (double)c->vocab * c->D);
}

/* ------------------------------------------------------------------ entry */

static const whale_model_ops nw_ops = {
    .family_name = "nanowhale",
    .free_impl = nw_free_impl,
    .config_to_json = nw_config_to_json,
    .print_info = nw_print_info,
    .session_create = nw_session_new,
    .forward_flops = nw_forward_flops,
    .decode_weight_bytes = nw_decode_weight_bytes,
};

whale_code nanowhale_from_config(const cJSON *cfg, const char *file, whale_model **out, whale_err *err) {
    whale_model *m;
    whale_code e = whale_model_new_impl(&whale_family_nanowhale, &nw_ops, "deepseek_v4", sizeof(nw_model), &m, err);
    if (e) return e;
    nw_model *nw = m->impl;
    nw->moe_few_tokens = MOE_FEW_TOKENS;
    e = parse_config(cfg, file, &nw->c, err);
    if (!e) e = register_params(m, nw, err); /* RoPE tables are built by the first session, for its context */
    if (!e) e = whale_model_config_done(m, cfg, file, &nw->config_json, nw->c.vocab, nw->c.max_pos, err);
    if (e) {
        whale_model_free(m);
        return e;
    }
    *out = m;
    return WHALE_OK;
}

static const char *const nanowhale_types[] = {"deepseek_v4", NULL};
const whale_family_desc whale_family_nanowhale = {
    .name = "nanowhale",
    .model_types = nanowhale_types,
    .presets = "nanowhale-100m, debug, small, tiny",
    .from_config = nanowhale_from_config,
    .preset_config = nanowhale_preset_config,
    .init_param = nanowhale_init_param,
};
