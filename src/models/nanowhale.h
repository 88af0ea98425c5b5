/* nanowhale (DeepSeek-V4-style) configuration and weights. */
#ifndef WHALE_NANOWHALE_H
#define WHALE_NANOWHALE_H

#include "models/model.h"

#include "kernels/ops.h"

typedef struct {
    int vocab, D, L, H, Dh, R, Q, G, Ro, F, E, K, M;
    int sinkhorn_iters, num_hash_layers, max_pos, scoring, tie_embeddings;
    float hc_eps, norm_eps, rope_theta, route_scale, swiglu_limit, init_range;
    int mix; /* (2+M)·M, the HC mixes per token */
} nw_config;

typedef struct {
    float *hc_attn_fn, *hc_ffn_fn, *hc_attn_base, *hc_ffn_base, *hc_attn_scale, *hc_ffn_scale;
    float *attn_sink, *wq_a, *q_norm, *wq_b, *wkv, *kv_norm, *wo_a, *wo_b;
    float *gate_w, *gate_b; /* gate_b is NULL for hash layers (index < num_hash_layers) */
    float **w1, **w2, **w3; /* [E] routed experts */
    float *sw1, *sw2, *sw3; /* shared expert */
    float *attn_norm, *ffn_norm;
} nw_layer;

typedef struct {
    nw_config c;
    cJSON *config_json; /* the config as given (inert fields kept for saving) */
    float *hc_head_fn, *hc_head_base, *hc_head_scale, *embed, *norm, *lm_head;
    nw_layer *layers;
    float **expert_ptrs; /* storage behind the layers' w1/w2/w3 arrays */
    float *rope_cos, *rope_sin; /* [rope_len, R/2], recomputed, never loaded */
    int rope_len;               /* positions the tables cover: the longest session so far */
    int moe_few_tokens;         /* micro-batches of up to this many tokens run their experts grouped
                                   (moe_few_tokens in nanowhale.c); tests set 0 for the per-expert loop */
} nw_model;

#endif
