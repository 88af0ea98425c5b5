/* The model object every family fills in: a parameter table (names as in
 * the Hugging Face state dict, fp32 data) plus a table of family operations.
 * Sessions (buffers for running) are created through the family ops. */
#ifndef WHALE_MODEL_H
#define WHALE_MODEL_H

#include "whale.h"

#include <cjson/cJSON.h>

struct whale_st;

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[4];
    float **slot;     /* where the family keeps its pointer to this tensor */
    float *data;      /* fp32 values: into the mmap (zero-copy) or owned memory */
    int decay;        /* 1 if weight decay applies (HF no-decay rule for norms/biases) */
    int used;         /* 0 for tensors the forward pass never reads (attn_sink) */
    int no_grad;      /* 1 where no gradient can flow (unused, or selection-only like gate.bias) */
} whale_param;

typedef struct whale_model_ops {
    const char *family_name;
    void (*free_impl)(whale_model *m);
    whale_code (*config_to_json)(const whale_model *m, cJSON **out, whale_err *err);
    void (*print_info)(const whale_model *m, FILE *f);
    whale_code (*session_new)(whale_model *m, int max_batch, int max_seq, whale_session **out,
                              whale_err *err);
    whale_code (*train_session_new)(whale_model *m, int max_batch, int seq, int recompute, whale_session **out,
                                    whale_err *err);
    /* multiply-add FLOPs (×2) of a forward of B×S new tokens after p0 cached
     * positions, with logits for logit_rows rows */
    double (*forward_flops)(const whale_model *m, int B, int S, int p0, int logit_rows);
    /* bytes of weights one decoding step reads (fp32) */
    double (*decode_weight_bytes)(const whale_model *m);
} whale_model_ops;

/* A weight's bf16 copy, found by the address range of its fp32 data. */
typedef struct {
    const float *start, *end;
    uint16_t *bf16;
} whale_weight16;

struct whale_model {
    whale_family family;
    whale_dtype compute_dtype; /* F32, or BF16: weight products in bf16 */
    whale_weight16 *w16;       /* sorted by start */
    int n_w16;
    uint16_t *w16_mem;
    const whale_model_ops *ops;
    void *impl;             /* family config + weight pointers */
    int n_params;
    whale_param *params;
    float *owned;           /* one allocation for all params not served zero-copy */
    struct whale_st *source; /* safetensors kept mapped while params point into it */
    int vocab_size, max_positions;
    int n_eos;
    int32_t eos_ids[8];
};

/* Common session header; families embed it first in their session struct. */
struct whale_session {
    whale_model *model;
    int max_batch, max_seq, cached;
    whale_trace_fn trace;
    void *trace_user;
    void (*free_fn)(whale_session *s);
    whale_code (*forward_fn)(whale_session *s, const int32_t *ids, int B, int S, float *logits,
                             int all_logits, whale_err *err);
    /* time per op group when profiling (names set by the family) */
    int profiling;
    int n_prof;
    const char *const *prof_names;
    double prof[32];
    size_t activation_bytes, recompute_saves;
    /* training sessions only */
    float *grads;          /* one buffer laid out like the parameters */
    size_t *grad_offsets;  /* [n_params] */
    size_t n_grad;         /* floats in grads */
    whale_code (*train_fn)(whale_session *s, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                           const int32_t *seg, int B, int S, double loss_scale, double *loss, int64_t *count,
                           whale_err *err);
};

/* Helpers shared by families. */
whale_param *whale_model_add_param(whale_model *m, int cap, float **slot, int decay, int used,
                                   int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
/* Bind every parameter to data from a safetensors set (strict; collects all
 * problems into one message). path names the checkpoint in messages. */
whale_code whale_model_bind(whale_model *m, struct whale_st *st, const char *path, whale_err *err);
/* Give every parameter owned zero-filled storage (for init). */
whale_code whale_model_alloc_params(whale_model *m, whale_err *err);

/* JSON helpers for configs: read a number/bool/string field with checks. */
whale_code whale_json_int(const cJSON *obj, const char *key, int required, long long def,
                          long long lo, long long hi, long long *out, const char *file,
                          whale_err *err);
whale_code whale_json_float(const cJSON *obj, const char *key, int required, double def, double lo,
                            double hi, double *out, const char *file, whale_err *err);
whale_code whale_json_bool(const cJSON *obj, const char *key, int def, int *out, const char *file,
                           whale_err *err);

/* The bf16 copy of the weight holding W (W may point inside it), or NULL
 * when the model computes in fp32 or W has no copy (fp32 islands). */
const uint16_t *whale_model_bf16_for(const whale_model *m, const float *W);

/* Family entry points. */
whale_code nanowhale_from_config(const cJSON *cfg, const char *file, whale_model **out,
                                 whale_err *err);
whale_code nanowhale_preset_config(const char *name, cJSON **out, whale_err *err);
whale_code nanowhale_init_weights(whale_model *m, uint64_t seed, whale_err *err);

#endif
