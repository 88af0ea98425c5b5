/* The model object every family fills in: a parameter table (names as in
 * the Hugging Face state dict, fp32 data) plus a table of family operations.
 * Sessions (buffers for running) are created through the family ops. */
#ifndef WHALE_MODEL_H
#define WHALE_MODEL_H

#include "whale.h"

#include "backend/backend.h"
#include "core/core.h"
#include "whale_safetensors.h"

#include <cjson/cJSON.h>

#include <assert.h>

/* What a parameter is, declared by its family (never guessed from its
 * name): which precision it is kept in, which LoRA "all-linear" selects,
 * how init fills it. */
typedef enum {
    WHALE_ROLE_LINEAR,  /* a Linear's weight [out, in]: compute copy in the run's precision; all-linear target */
    WHALE_ROLE_EMBED,   /* the token embedding [vocab, D]: compute copy (rows read in its format); no LoRA */
    WHALE_ROLE_HEAD,    /* an untied lm_head [vocab, D]: compute copy; not an all-linear target */
    WHALE_ROLE_ROUTER,  /* an MoE gate's weight: fp32 (selection is sensitive), no copy, no LoRA */
    WHALE_ROLE_MIX,     /* a matrix read by fp32 products (hyper-connection mixes): no copy, no LoRA */
    WHALE_ROLE_NORM,    /* a norm's weight */
    WHALE_ROLE_BIAS,    /* a Linear's bias */
    WHALE_ROLE_SCALAR,  /* other fp32 values: scales, bases, the gate's selection bias, attention sinks */
    WHALE_ROLE_ADAPTER  /* a LoRA adapter's A or B */
} whale_role;

typedef struct {
    char name[96];
    whale_role role;
    int ndim;
    int64_t shape[4];
    float **slot;     /* where the family keeps its pointer to this tensor */
    float *data;      /* fp32 values: into the mmap (zero-copy) or owned memory */
    int decay;        /* 1 if weight decay applies (HF no-decay rule for norms/biases) */
    int used;         /* 0 for tensors the forward pass never reads (attn_sink) */
    int no_grad;      /* 1 where no gradient can flow (unused, or selection-only like gate.bias) */
    int frozen;       /* 1 for base parameters under LoRA: no gradient buffer, never updated */
    int peft_inert;   /* 1 for a Linear whose weight the reference reads without calling the module
                         (nanowhale's wo_a): PEFT's LoRA never acts on it, so neither does whale's */
} whale_param;

/* Bytes of a session's buffers by kind. */
typedef struct {
    size_t activations;     /* forward states kept (all layers' when training) */
    size_t recompute_saves; /* training: what --recompute saves / would save */
    size_t kv_cache;
    size_t work;            /* scratch: attention work, backward buffers, lm_head chunk */
    size_t grads;           /* fp32 gradient buffer (training) */
} whale_session_sizes;

/* What a session is made for. */
typedef struct {
    int n_seq, n_ctx; /* inference: sequences × cells; training: B rows of S tokens */
    int n_batch;      /* tokens one forward carries (training: B·S) */
    int training, recompute;
    int count_only;   /* sizes only, nothing allocated (whale memory) */
} whale_session_spec;

typedef struct whale_model_ops {
    const char *family_name;
    void (*free_impl)(whale_model *m);
    whale_code (*config_to_json)(const whale_model *m, cJSON **out, whale_err *err);
    void (*print_info)(const whale_model *m, FILE *f);
    /* every session: inference or training, or only its sizes */
    whale_code (*session_create)(whale_model *m, const whale_session_spec *sp, whale_session **out, whale_err *err);
    /* multiply-add FLOPs (×2) of a forward of B×S new tokens after p0 cached
     * positions, with logits for logit_rows rows */
    double (*forward_flops)(const whale_model *m, int B, int S, int p0, int logit_rows);
    /* bytes of weights one decoding step reads (fp32) */
    double (*decode_weight_bytes)(const whale_model *m);
} whale_model_ops;

/* The compute copy of a weight: the values products read when the model
 * runs in a lower precision. Found by the address range of the weight's
 * fp32 pointer, so family code keeps one pointer per weight whatever the
 * precision (the "handle"). */
typedef struct {
    const float *start, *end; /* the weight's fp32 address range */
    whale_dtype dtype;        /* BF16, F16 or I8 */
    const void *data;         /* [rows, cols]: owned, or mapped from a checkpoint */
    const float *scale;       /* I8: [rows] per-output-channel scales */
    int64_t cols;
    int param;                /* index in the parameter table */
} whale_wcopy;

/* What a product reads for W (which may point inside a weight, at the start
 * of a row): its copy in the compute precision, or the fp32 values. */
typedef struct {
    whale_dtype dtype;   /* F32, BF16, F16 or I8 */
    const void *data;    /* at W's row/column; I8: the panel holding W's row */
    const float *scale;  /* I8: scale of W's row */
    int row0;            /* I8: W's row within that panel (whale_wref) */
} whale_wview;

/* A LoRA adapter on one weight (whale_lora.h). */
typedef struct {
    int base;                 /* parameter index of the adapted weight */
    int a, b;                 /* parameter indices of lora_A [r, cols] and lora_B [rows, r] */
    const float *start, *end; /* the base weight's fp32 address range (lookup) */
    int64_t rows, cols;
    int rank;
    float scale;              /* alpha / r, or alpha / sqrt(r) */
    float *A, *B;             /* the adapter parameters' slots */
} whale_lora_target;

/* A LoRA adapter loaded beside the model instead of into it
 * (whale_adapter_load): the base stays as it is, any number of them share
 * it, and each sequence of a batched session is bound to one or none
 * (whale_kv_seq_set_adapter). Its targets are not parameters (a, b are
 * −1) and are sorted by the base weight's address like the model's own;
 * A and B live in mem. */
struct whale_adapter {
    const whale_model *model; /* the base it was loaded for */
    int index;                /* in model->adapters */
    whale_lora_target *t;
    int n;
    int rank;
    float *mem;
    size_t bytes;             /* of A and B */
};

/* A run of consecutive rows of a product that belong to sequences bound
 * to one adapter (whale_lora_rows_*). */
typedef struct {
    const struct whale_adapter *ad;
    int row0, n;
} whale_lora_run;

/* The rows of the products being run, grouped by adapter: runs sorted by
 * adapter, then row; rows is the products' row count. */
typedef struct {
    whale_lora_run *runs;
    int n_runs, rows;
} whale_lora_rows;

typedef struct whale_family_desc whale_family_desc;

struct whale_model {
    const whale_family_desc *family;
    const char *model_type;    /* config.json's model_type (static storage) */
    whale_dtype compute_dtype; /* F32, BF16, F16 or I8: the precision of weight products */
    whale_wcopy *copies;       /* sorted by start */
    int n_copies;
    void *copy_mem;            /* owned copies (mapped ones live in source) */
    size_t copy_bytes, mapped_copy_bytes;
    /* Weights held only as a copy (no fp32 master) get an fp32 "pointer"
     * into this reserved, inaccessible address range: lookups work, and a
     * read that forgot to go through the copy faults at once. */
    void *handles;
    size_t handle_bytes;
    const whale_model_ops *ops;
    void *impl;             /* family config + weight pointers */
    int n_params;
    whale_param *params;
    float *owned;           /* one allocation for all params not served zero-copy */
    struct whale_st *source; /* safetensors kept mapped while params point into it */
    int n_base_params;      /* the family's parameters; LoRA adapters come after them */
    whale_lora_target *lora; /* sorted by start */
    int n_lora;
    float *lora_mem;
    void *lora_cfg;         /* whale_lora_config + its strings (lora.c) */
    struct whale_adapter **adapters; /* loaded beside the model (whale_adapter_load), in load order */
    int n_adapters;
    int vocab_size, max_positions;
    int n_eos;
    int32_t eos_ids[8];
};

/* Precision of the attention products (Q·Kᵀ, P·V and their backward): bf16
 * in bf16 runs, as autocast computes them; fp32 otherwise (fp16 has no
 * faster product on this class of CPU, and int8 covers weights only). */
static inline whale_dtype whale_attention_products(const whale_model *m) {
    return m->compute_dtype == WHALE_BF16 ? WHALE_BF16 : WHALE_F32;
}

/* The KV cache of an inference session (the batch API's cells): for each
 * layer and each of n_seq sequences, n_ctx cells of width floats of K and
 * of V (v == k when the family keeps one tensor for both); sequence q
 * holds positions 0 .. len[q] − 1. Training sessions have none (k NULL). */
typedef struct {
    int n_layer, n_seq, n_ctx, width;
    float *k, *v;
    int *len; /* [n_seq] */
} whale_kv;

/* The cells of sequence seq in layer l: n_ctx rows of kv->width floats. */
static inline float *whale_kv_k(const whale_kv *kv, int l, int seq) {
    assert(kv->k && l >= 0 && l < kv->n_layer && seq >= 0 && seq < kv->n_seq);
    return kv->k + ((size_t)l * kv->n_seq + (size_t)seq) * kv->n_ctx * kv->width;
}
static inline float *whale_kv_v(const whale_kv *kv, int l, int seq) {
    assert(kv->v && l >= 0 && l < kv->n_layer && seq >= 0 && seq < kv->n_seq);
    return kv->v + ((size_t)l * kv->n_seq + (size_t)seq) * kv->n_ctx * kv->width;
}

/* A run of consecutive rows of a micro-batch that belong to one sequence:
 * rows row0 .. row0 + n − 1 are positions p0 .. p0 + n − 1 of sequence
 * seq, which holds p0 cached cells before them. */
typedef struct {
    int row0, n, seq, p0;
} whale_span;

/* What a family's forward runs: T tokens (ids, RoPE positions pos) in
 * n_spans spans covering rows 0 .. T − 1 in order, and the rows whose
 * logits are wanted: out[0 .. n_out − 1] ascending, or every row when out
 * is NULL (n_out = T). Built by the runtime (model.c) from a whale_batch,
 * or from B sequences of S tokens. */
typedef struct {
    int T;
    const int32_t *ids, *pos;
    int n_spans;
    const whale_span *spans;
    int n_out;
    const int32_t *out;
} whale_ubatch;

/* The micro-batch of a training step: B sequences of S tokens from
 * position 0 (pos NULL: 0 .. S − 1), every row's output; spans holds B. */
whale_ubatch whale_ubatch_training(whale_span *spans, const int32_t *ids, const int32_t *pos, int B, int S);
/* Row t's RoPE position: ub->pos[t], or its place in its span. */
void whale_ubatch_positions(const whale_ubatch *ub, int32_t *pos);

/* Causal attention of every span of the session's micro-batch in layer l:
 * q, out [T, Hq·Dh]; k, v [T, ldkv] the micro-batch's own keys and values
 * (k == v: one tensor); seg [T] (packed documents) or NULL. With a KV cache
 * each span's rows are first appended to its sequence's cells (of width
 * ldkv), which it then attends over; else it attends over its own rows.
 * One attention_spans call for all spans: a decode step's share one
 * parallel region. */
whale_code whale_attention_ubatch(whale_session *s, int l, float *out, const float *q, const float *k, const float *v,
                                  int ldkv, const int32_t *seg, int Hq, int Hkv, int Dh, float scale, float *work,
                                  whale_err *err);

/* The lm_head on the rows of hn [T, D] whose logits ub wants, into logits
 * [n_out, V]: all rows in one product, or the chosen rows gathered into
 * rows [max_batch, D] and multiplied max_batch at a time. */
whale_code whale_output_logits(whale_session *s, const whale_ubatch *ub, const float *hn, float *rows, int D, int V,
                               const float *head, float *logits, whale_err *err);

/* The session's backend (src/backend/backend.h): the one $WHALE_BACKEND
 * names ("cpu" when unset, or "ref"), also for a count-only session (it
 * sizes the ops' work buffers). A family's free_fn closes it
 * (whale_backend_close). */
whale_code whale_session_open_backend(whale_session *s, whale_err *err);
/* Call op of the session's backend: WHALE_OP(s, rmsnorm, y, x, w, rows, n, eps, rstd). */
#define WHALE_OP(sess, op, ...) ((sess)->be->op((sess)->be, __VA_ARGS__))

/* WHALE_ERR_ABORTED when the session's abort callback asks to stop (a
 * family calls it before each layer). */
whale_code whale_session_check_abort(whale_session *s, whale_err *err);

/* A training session's gradient-ready hook: told, during the backward pass
 * of whale_session_train_step, that elements [lo, hi) of the gradient
 * buffer (within the trainable ones, [0, n_grad_train)) are final for this
 * micro-batch — the backward pass writes them no more — so a caller can
 * send them while the earlier layers' backward runs. Every trainable
 * element is reported exactly once per training step (an evaluation pass,
 * loss_scale 0, reports nothing); an error from fn stops the step. fn
 * NULL removes the hook; with none, nothing is reported. */
typedef whale_code (*whale_grad_ready_fn)(void *user, size_t lo, size_t hi, whale_err *err);
whale_code whale_session_set_grad_ready(whale_session *s, whale_grad_ready_fn fn, void *user, whale_err *err);
/* Families, during the backward pass: the gradients of the base parameters
 * from the one whose values are at w (in table order) to the last, and
 * those of their LoRA adapters, are final (w NULL: every parameter's).
 * Those not reported before go to the hook. A family calls it where that
 * holds: after its output head, after each layer from the last back (a
 * parameter written in several places — a tied embedding — comes before
 * the layers in the table, so it waits for the end). */
whale_code whale_session_grads_final(whale_session *s, const float *w, whale_err *err);

/* Common session header; families embed it first in their session struct. */
struct whale_session {
    whale_model *model;
    int max_batch, max_seq; /* training: B × S; inference: n_seq sequences of n_ctx cells */
    int n_batch;            /* tokens one forward may carry (the work buffers' rows) */
    whale_kv kv;            /* inference sessions only */
    const whale_ubatch *ub; /* the micro-batch being run (set by the family's forward / train step) */
    whale_abort_fn abort_fn; /* whale_session_set_abort */
    void *abort_user;
    whale_span *train_spans; /* [max_batch]: a training step's spans (training sessions) */
    whale_trace_fn trace;
    void *trace_user;
    void (*free_fn)(whale_session *s);
    /* logits: [ub->n_out, V] (may be NULL); the runtime has checked ub and
     * advances the cells' lengths after a success */
    whale_code (*forward_fn)(whale_session *s, const whale_ubatch *ub, float *logits, whale_err *err);
    /* time per op group when profiling (names set by the family) */
    int profiling;
    int n_prof;
    const char *const *prof_names;
    double prof[32];
    size_t activation_bytes, recompute_saves, kv_bytes, work_bytes, n_grad_bytes;
    struct whale_backend *be; /* what computes on the session's buffers (whale_session_open_backend) */
    int training;            /* a training session: LoRA dropout applies */
    uint64_t lora_calls;     /* training steps so far: the dropout masks' counter */
    int64_t eval_hits;       /* evaluation passes (loss_scale 0): scored targets whose logit was the largest */
    float *lora_work;        /* [T, lora_work_floats]: LoRA's low-rank intermediates */
    size_t lora_work_floats; /* per token (whale_lora_work_floats when the session was made) */
    /* adapters per sequence (inference sessions; NULL until one is bound) */
    const struct whale_adapter **seq_adapter; /* [n_seq] */
    int n_bound;                              /* sequences bound to an adapter */
    whale_lora_run *run_mem;                  /* [2 · n_seq]: the micro-batch's runs, then gathered rows' */
    whale_lora_rows ub_rows;                  /* the micro-batch's rows */
    whale_lora_rows lora_rows;                /* the rows of the products being run: ub_rows or gathered */
    /* training sessions only */
    float *grads;          /* one buffer laid out like the parameters */
    size_t *grad_offsets;  /* [n_params] */
    size_t n_grad;         /* floats in grads */
    size_t n_grad_train;   /* the first floats of grads: the trainable (not frozen) parameters', in order */
    whale_grad_ready_fn grad_ready; /* whale_session_set_grad_ready */
    void *grad_ready_user;
    int grad_final_from;   /* base parameters [grad_final_from, n_base) reported final in this backward */
    size_t (*grad_runs)[2]; /* [n_params]: scratch for one report's ranges (offset, floats) */
    whale_code (*train_fn)(whale_session *s, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                           const int32_t *seg, int B, int S, double loss_scale, double *loss, int64_t *count,
                           whale_err *err);
};

/* Helpers shared by families. */

/* RoPE tables [positions, R/2] for at least need positions: grown when a
 * session needs more than the tables hold (never built from the config's
 * max_position_embeddings, which a file may set to anything up to its cap,
 * and never before the checkpoint has been checked against the config). */
whale_code whale_rope_reserve(float **cos_t, float **sin_t, int *len, int need, int R, float theta, whale_err *err);

/* Record the weights' dtype in a config: under the keys it already has
 * ("torch_dtype" and/or the newer "dtype"), else "torch_dtype". */
void whale_config_set_dtype(cJSON *cfg, whale_dtype dt);

/* A session's buffers: every allocation remembered for freeing. With
 * count_only set nothing is allocated, only the sizes are added up (what a
 * session would hold: whale memory), and a non-NULL pointer that must
 * never be dereferenced is returned. */
typedef struct {
    void **ptrs;
    int n, cap;
    int count_only;
} whale_bufs;
/* n elements of size sz (64-byte aligned, uninitialised), added to *total;
 * NULL when out of memory. */
void *whale_bufs_alloc(whale_bufs *b, size_t n, size_t sz, size_t *total);
void whale_bufs_free(whale_bufs *b);

/* Append n rows of K and V (n × width floats each; v ignored when the
 * cache keeps one tensor) at position p0 of sequence seq in layer l. The
 * caller has checked p0 + n <= n_ctx. */
void whale_kv_append(whale_kv *kv, int l, int seq, int p0, int n, const float *k, const float *v);
/* Allocate a cache from a session's buffers, lengths zero (count_only:
 * sizes only); shared: v = k. Returns 0 when out of memory. */
int whale_kv_alloc(whale_kv *kv, whale_bufs *b, int n_layer, int n_seq, int n_ctx, int width, int shared,
                   size_t *total);


/* The gradient buffer of a training session, laid out like the parameter
 * table: grad_offsets, n_grad, n_grad_bytes and (unless count_only) grads,
 * zero-filled. The trainable parameters come first, in table order
 * (n_grad_train floats: what the ranks exchange); frozen product weights
 * (LoRA's base) get no space and the offset SIZE_MAX; frozen norms and
 * biases keep a buffer after the trainable ones that the optimiser never
 * reads (it skips frozen parameters). */
whale_code whale_session_alloc_grads(whale_session *s, int count_only, whale_err *err);
/* Floats per token of the LoRA scratch (s->lora_work): x·Aᵀ and dC·B
 * [r] each plus the dropped-out input [in], for the widest adapter; 0
 * without adapters. */
size_t whale_lora_work_floats(const whale_model *m);

/* The sizes of a session's buffers (from a count-only session: whale memory). */
void whale_session_sizes_of(const whale_session *s, whale_session_sizes *out);
/* The buffers a session of B × S tokens would have (training with
 * recompute, or inference), from a count-only session. */
whale_code whale_session_sizes_for(whale_model *m, int B, int S, int training, int recompute, whale_session_sizes *out,
                               whale_err *err);
/* A training session's gradient pointers: reg registers the family's
 * parameter table against gw (its structure of weight pointers) into a
 * scratch model, and each of those slots is aimed at its parameter's
 * gradient (NULL when frozen); with count_only, only the registration. */
whale_code whale_session_bind_grads(whale_session *s, whale_code (*reg)(whale_model *scratch, void *gw, whale_err *err),
                                    void *gw, int count_only, whale_err *err);

/* The lm_head and the loss of a training step, shared by the families.
 * Rows go through in chunks of WHALE_CE_CHUNK, which bounds the logits
 * buffer to WHALE_CE_CHUNK × V instead of T × V; each chunk's weight-
 * gradient product reads and writes all of dlm_head (165 MB at
 * nanowhale-100m), so 512 rows rather than 256 halve that traffic, for a
 * larger logits buffer (docs/architecture.md gives the measured gain). */
enum { WHALE_CE_CHUNK = 512 };
/* tgt[t]: the target position t is scored on (labels[t + 1], or ids[t + 1]
 * without labels; −100 at each sequence's last position); returns how many
 * are scored. */
int64_t whale_shift_targets(const int32_t *ids, const int32_t *labels, int B, int S, int32_t *tgt);
/* One chunk of n rows: logits [n, V] = hn · headᵀ through the model's
 * products; with gs == 0 (evaluation) only the loss, else the gradient of
 * gs × the chunk's summed loss into dhn [n, D] (written) and ghead
 * (accumulated; NULL when frozen). *loss is the chunk's mean over *count
 * scored rows. logits is the [WHALE_CE_CHUNK, V] buffer. */
whale_code whale_head_loss_chunk(whale_session *s, int n, int D, int V, const float *hn, const float *head,
                                 float *ghead, const int32_t *tgt, double gs, float *logits, float *dhn, double *loss,
                                 int64_t *count, whale_err *err);

/* Call the session's trace hook (set: the caller checks s->trace) with a
 * tensor and a printf-style name. */
void whale_trace_emit(whale_session *s, whale_dtype dt, void *data, int ndim, const int64_t *shape, const char *fmt,
                      ...) __attribute__((format(printf, 6, 7)));
/* Time a statement into the session's profile group id when profiling (one
 * branch when not). */
#define WHALE_PROF(sess, id, stmt)                                               \
    do {                                                                         \
        double t0_ = (sess)->profiling ? whale_now() : 0;                        \
        stmt;                                                                    \
        if ((sess)->profiling) (sess)->prof[id] += whale_now() - t0_;            \
    } while (0)

/* 110369621 -> "110,369,621" into buf (at least 32 bytes); returns buf. */
const char *whale_fmt_count(char *buf, int64_t v);

/* eos_token_id of a config (absent or null, a number, or a list of
 * numbers) into m->eos_ids, each checked against the vocabulary. */
whale_code whale_config_eos(whale_model *m, const cJSON *cfg, const char *file, whale_err *err);

whale_param *whale_model_add_param(whale_model *m, int cap, float **slot, whale_role role, int decay, int used,
                                   int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
/* Bind every parameter to data from a safetensors set (strict; collects all
 * problems into one message). path names the checkpoint in messages. */
whale_code whale_model_bind(whale_model *m, struct whale_st *st, const char *path, whale_dtype dt, whale_err *err);
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

/* Weights kept in the compute precision: the roles LINEAR, EMBED and HEAD
 * (the gate and the hyper-connection matrices stay fp32, as in the
 * reference). */
int whale_param_is_product_weight(const whale_param *p);
/* 1 when parameter p has fp32 values (a master copy or an fp32 run). */
int whale_param_has_f32(const whale_model *m, const whale_param *p);

whale_wview whale_model_weight(const whale_model *m, const float *W);
/* The operand a backend product reads for weight W [rows, ldw]: its compute
 * copy in its format, or the fp32 values. */
whale_wref whale_model_wref(const whale_model *m, const float *W, int ldw);
/* Row r of embedding-like weight W [rows, cols] as fp32: from its copy in
 * the compute precision when it has one, like every product. */
void whale_model_row(const whale_model *m, const float *W, int64_t r, int64_t cols, float *out);

/* Products with weights in the model's compute precision (forward, input
 * gradient, weight gradient), every Linear of every family goes through:
 *   whale_linear     C[M,N]   = A[M,K] · W[N,K]ᵀ
 *   whale_linear_dx  dA[M,K] (+)= dC[M,N] · W[N,K]
 *   whale_linear_dw  dW[N,K] += dC[M,N]ᵀ · A[M,K]   (fp32 gradient)
 * fp32: exact fp32 products. bf16: inputs rounded to bf16, fp32 sums and
 * outputs. fp16: inputs rounded to fp16, fp32 sums, outputs of whale_linear
 * and whale_linear_dx rounded to fp16 (values past 65504 become inf, as in
 * an fp16 autocast run). int8: weight-only int8 — forward bf16(A)·qᵀ then the
 * rows' scales, input gradient bf16(dC ⊙ scale)·q, no weight gradient (an
 * int8 base is frozen: LoRA). */
struct whale_gemm;
/* With LoRA adapters, each adds its low-rank term (whale_lora.h): the
 * forward s·B·(A·drop(x)), the input gradient through it, and in
 * whale_linear_dw the adapters' gradients (into the session's buffers);
 * dW may then be NULL (a frozen base weight has no gradient). */
whale_code whale_linear(whale_session *s, int M, int N, int K, const float *A, int lda, const float *W, int ldw,
                        float *C, int ldc, whale_err *err);
/* Several whale_linear products of one depth K (same results, bit for
 * bit): one parallel region for the base products of those with few rows
 * (whale_gemm_nt_parts) when their weights share a precision, then the
 * adapters' terms: an attached adapter's part after part, the adapters
 * bound to sequences as one call for all their x·Aᵀ and one per rank for
 * the B products. */
typedef struct {
    int M, N;
    const float *A;
    int lda;
    const float *W;
    int ldw;
    float *C;
    int ldc;
} whale_linear_part;
whale_code whale_linear_parts(whale_session *s, int K, int n, const whale_linear_part *parts, whale_err *err);
/* The same with parts on rows gathered from the micro-batch (an MoE
 * expert's tokens): rows[i] NULL, part i runs on the micro-batch's rows;
 * else its M ascending rows of the micro-batch, whose sequences' adapters
 * apply to it (whale_lora_rows_gather). rows NULL: all the micro-batch's. */
whale_code whale_linear_parts_rows(whale_session *s, int K, int n, const whale_linear_part *parts,
                                   const int32_t *const *rows, whale_err *err);
whale_code whale_linear_dx(whale_session *s, int M, int N, int K, const float *dC, int lddc, const float *W, int ldw,
                           float *dA, int ldda, int accumulate, whale_err *err);
whale_code whale_linear_dw(whale_session *s, int M, int N, int K, const float *dC, int lddc, const float *A, int lda,
                           const float *W, float *dW, int lddw, whale_err *err);
/* Whether LoRA's target_modules ("all-linear" or a comma list of module
 * names) select p: all-linear is every product weight but the embedding
 * and lm_head. A PEFT-inert weight is never a target. */
int whale_lora_is_target(const whale_param *p, const char *targets);
/* Whether the weight `name` of a model_type family is PEFT-inert: the
 * reference modeling code reads it without calling its nn.Linear, so a
 * PEFT adapter on it changes nothing until merged (deepseek_v4's
 * attn.wo_a, used inside an einsum). */
int whale_lora_peft_inert(const char *model_type, const char *name);
/* The first PEFT-inert base weight whose module a comma list names, or NULL. */
const whale_param *whale_lora_inert_named(const whale_model *m, const char *targets);
/* Sort adapters by their base weight's address, as whale_lora_find
 * expects. */
void whale_lora_sort_targets(whale_lora_target *t, int n);
/* Drop the adapters and unfreeze the base. */
void whale_lora_free(whale_model *m);
/* The base weights moved (made writable, masters dropped): find the
 * adapters by the new addresses. */
void whale_lora_rekey(whale_model *m);
/* The adapter on W (W may point at a row inside the weight), or NULL. */
const whale_lora_target *whale_lora_find(const whale_model *m, const float *W);
/* The same among n targets sorted by address. */
const whale_lora_target *whale_lora_find_in(const whale_lora_target *t, int n, const float *W);
/* Free the adapters loaded beside the model. */
void whale_adapters_free(whale_model *m);

/* Adapters per sequence in a forward (runtime.c). The runtime groups the
 * micro-batch's rows by their sequences' adapters before the family's
 * forward runs (whale_lora_rows_of_ubatch), and whale_linear applies each
 * adapter's term to its runs of rows only. A family whose product runs on
 * rows gathered from the micro-batch (an MoE expert's tokens) names them
 * first: whale_lora_rows_gather(s, n, tok) with tok[0 .. n − 1] ascending
 * rows of the micro-batch, then whale_lora_rows_reset(s) back to the
 * micro-batch's rows. Both cost one test when no sequence is bound. */
void whale_lora_rows_of_ubatch(whale_session *s, const whale_ubatch *ub);
void whale_lora_rows_gather(whale_session *s, int n, const int32_t *tok);
void whale_lora_rows_reset(whale_session *s);

/* Make the compute copies of every product weight in dt (BF16, F16, I8):
 * from the checkpoint entries src[i] (indexed like the parameters; an entry
 * already in dt is used in place, zero-copy) or, with src NULL, from the
 * fp32 values. Sets the model's compute dtype. */
whale_code whale_model_build_copies(whale_model *m, whale_dtype dt, const whale_st_entry *const *src,
                                    whale_err *err);
void whale_model_clear_copies(whale_model *m);
/* A weight format (formats.c): one row per dtype a run's product weights
 * may be kept in. */
typedef struct {
    whale_dtype dtype;
    const char *name; /* the CLI's spelling: fp32, bf16, fp16, int8 */
    int row_scale;    /* one fp32 scale per row, stored after the values (int8, whose
                         values are packed in panels of 16 rows: whale_q8p_pack) */
    int trainable;    /* weight gradients exist (int8: an inference format, or a frozen LoRA base) */
    int saveable;     /* a Hugging Face checkpoint holds it as it is */
    /* rows × cols fp32 values into the format (scale [rows] when row_scale) */
    void (*from_f32)(void *dst, float *scale, const float *src, int64_t rows, int64_t cols);
    /* one row back to fp32 */
    void (*row_to_f32)(float *dst, const void *src, float scale, int64_t cols);
} whale_format;
/* NULL when dt is no weight format. */
const whale_format *whale_format_of(whale_dtype dt);

/* Bytes the compute copy of a rows × cols weight takes in dt (int8: with
 * its scales), as allocated. */
size_t whale_copy_bytes(whale_dtype dt, int64_t rows, int64_t cols);
/* Bytes of the first rows × cols values of a copy (int8: the packed panels
 * holding them, so rows a multiple of 16 for an offset into a copy). */
size_t whale_copy_values_bytes(whale_dtype dt, int64_t rows, int64_t cols);
/* whale_model_save with tensor i's bytes from produce(user, i, err)
 * (whale_st_write_stream) instead of the parameter's own (NULL: those). */
whale_code whale_model_save_stream(const whale_model *m, const char *dir, whale_st_producer produce, void *user,
                                   whale_err *err);
/* Rebuild the compute copies from the fp32 master weights (after an
 * optimiser step). */
void whale_model_refresh_copies(whale_model *m);
/* dst (rows × cols, fp32/bf16/fp16) from checkpoint data src of dtype sdt
 * in a read-only mapping, dropping the source pages as it goes, so a load
 * never holds a large tensor in both forms. src may have any alignment. */
whale_code whale_convert_checkpoint(void *dst, whale_dtype dt, const void *src, whale_dtype sdt, int64_t rows,
                                    int64_t cols, whale_err *err);
whale_code whale_model_reserve_handles(whale_model *m, size_t bytes, whale_err *err);
void whale_model_release_handles(whale_model *m);


/* The dense decoder's hyperparameters as its config sets them, defaults
 * applied (qwen2.c): what a GGUF file records. WHALE_ERR_UNSUPPORTED when m
 * is not of the dense family. */
#include "models/rope.h"
typedef struct {
    const char *model_type; /* "qwen2", "llama", "qwen3" */
    int vocab, D, L, H, Hkv, Dh, F, max_pos, tie;
    int bias_qkv, bias_o, bias_mlp, qk_norm;
    double norm_eps; /* as the engine uses it (float) */
    whale_rope rope;
} whale_dense_hparams;
whale_code whale_dense_hparams_of(const whale_model *m, whale_dense_hparams *out, whale_err *err);

/* The frame of every family's from_config: a model with its family, ops,
 * model_type and impl_size zeroed bytes of impl (freed by ops->free_impl);
 * then, once the family has read its config and registered its parameters,
 * the config kept (a copy into *config_json) with the vocabulary, the
 * positions and the end-of-sequence ids. The caller frees m on an error. */
whale_code whale_model_new_impl(const whale_family_desc *fam, const whale_model_ops *ops, const char *model_type,
                                size_t impl_size, whale_model **out, whale_err *err);
whale_code whale_model_config_done(whale_model *m, const cJSON *cfg, const char *file, cJSON **config_json, int vocab,
                                   int max_positions, whale_err *err);

/* Family entry points behind whale_family_desc.from_config. */
whale_code nanowhale_from_config(const cJSON *cfg, const char *file, whale_model **out, whale_err *err);
whale_code qwen2_from_config(const cJSON *cfg, const char *file, whale_model **out, whale_err *err);

/* A model family: what model.c needs to find, build and initialise one.
 * Each family file defines one; model.c loops over the table of them. */
struct whale_family_desc {
    const char *name;               /* "nanowhale", "dense" (whale_model_family) */
    const char *const *model_types; /* the config.json model_type values it reads, NULL-terminated */
    const char *presets;            /* its preset names, for messages */
    whale_code (*from_config)(const cJSON *cfg, const char *file, whale_model **out, whale_err *err);
    /* WHALE_ERR_ARG exactly when name is none of its presets */
    whale_code (*preset_config)(const char *name, cJSON **out, whale_err *err);
    /* parameter i's initial values into out (its numel floats), drawn from
     * rng: called for every parameter in order, so streaming the
     * parameters through it gives the same weights as initialising them
     * in place */
    void (*init_param)(const whale_model *m, int i, whale_rng *rng, float *out);
};
extern const whale_family_desc whale_family_nanowhale, whale_family_dense;

#endif
