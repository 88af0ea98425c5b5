/*
 * whale.h — public interface of libwhale, the nanowhale.c engine.
 *
 * Conventions (SQLite style):
 *   - every function that can fail returns a whale_code (0 = WHALE_OK) and,
 *     on failure, fills the caller's whale_err with a one-line message that
 *     names the file / tensor / field / argument and the problem;
 *   - the library never calls exit() and keeps no global mutable state;
 *   - objects are opaque and freed with their *_free function (NULL is fine).
 */
#ifndef WHALE_H
#define WHALE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- errors */

typedef enum {
    WHALE_OK = 0,
    WHALE_ERR_ARG = 1,         /* bad argument or option value */
    WHALE_ERR_IO = 2,          /* cannot open / read / write a file */
    WHALE_ERR_FORMAT = 3,      /* a file's content is malformed or lies */
    WHALE_ERR_NOMEM = 4,       /* allocation failed */
    WHALE_ERR_RANGE = 5,       /* value outside what the model supports (token id, position) */
    WHALE_ERR_UNSUPPORTED = 6, /* valid input using a feature we do not implement */
    WHALE_ERR_INTERNAL = 7,    /* a bug or a failing backend (oneDNN) */
    WHALE_ERR_ABORTED = 8      /* the caller's abort callback stopped the work */
} whale_code;

#define WHALE_ERR_MSG_MAX 1024
typedef struct {
    whale_code code;
    char msg[WHALE_ERR_MSG_MAX];
} whale_err;

/* Set err (if non-NULL) and return code. printf-style message, no newline;
 * control characters in the result (from file names or strings a file
 * holds) are written as escapes (\n, \x1b), so a message is one line. */
whale_code whale_errf(whale_err *err, whale_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *whale_code_name(whale_code code);
/* Process exit status the CLI uses for an error code (see docs/cli.md). */
int whale_exit_status(whale_code code);

/* ---------------------------------------------------------------- limits
 * Caps on what a file may make the engine allocate or compute, for sizes
 * that nothing else in the data bounds (docs/security.md). Every size read
 * from a file is checked against the data itself where the data determines
 * it (a LoRA rank against lora_A's shape, token ids against the number of
 * vocabulary entries) and against one of these where it does not. A file
 * over a cap is refused with a one-line error naming the file and the cap.
 * To change one, edit it here and rebuild. */
#define WHALE_MAX_FILE_READ ((size_t)256 << 20) /* a file read whole: ids, text to tokenize or diagnose */
/* JSON read whole (cJSON holds it ~10-30 times over): config.json,
 * tokenizer.json, model.safetensors.index.json, adapter_config.json, meta.json */
#define WHALE_MAX_JSON_FILE ((size_t)64 << 20)
/* an ids file (score, grad, diagnose, precision-report): sequences and tokens */
#define WHALE_MAX_BATCH 4096
#define WHALE_MAX_BATCH_TOKENS (1 << 22)
/* one SFT record (a JSONL line), read a line at a time */
#define WHALE_MAX_RECORD_BYTES ((size_t)16 << 20)
/* the loss mask of a conversation through a Jinja template: the renders of
 * the conversation up to each reply, together: template steps (loop
 * iterations, calls and the messages given) and text (one render alone may
 * take WHALE_JINJA_MAX_STEPS steps and 16 MiB of text) */
#define WHALE_MAX_MASK_STEPS 500000L
#define WHALE_MAX_MASK_BYTES ((size_t)16 << 20)
/* LoRA rank (adapter_config.json's r must also equal the tensors' rank) */
#define WHALE_MAX_LORA_RANK 65536
/* tokenizer.json: every id below 2 × (vocabulary + added tokens) + this */
#define WHALE_TOKENIZER_ID_SLACK 1024
/* Tokenizer regexes (PCRE2): one call's match and depth limit and its
 * backtracking memory; and one encode's work: the bytes of text its
 * searches may be given in all, base + per byte of text (the real
 * tokenizers' searches are given at most 32 per byte). A count, not a
 * clock: an input fails or passes the same on every machine. */
#define WHALE_REGEX_MATCH_LIMIT 10000000u
#define WHALE_REGEX_STACK_BYTES ((size_t)8 << 20)
#define WHALE_ENCODE_WORK_BASE ((size_t)1 << 20)
#define WHALE_ENCODE_WORK_PER_BYTE ((size_t)256)

/* ---------------------------------------------------------------- dtypes */

typedef enum {
    WHALE_F32 = 0,
    WHALE_F16,
    WHALE_BF16,
    WHALE_I8,
    WHALE_U8,
    WHALE_I32,
    WHALE_I64,
    WHALE_DTYPE_COUNT
} whale_dtype;

size_t whale_dtype_size(whale_dtype dt);
/* safetensors spelling: "F32", "F16", "BF16", "I8", "U8", "I32", "I64" */
const char *whale_dtype_name(whale_dtype dt);
/* PyTorch spelling, as configs record it: "float32", "bfloat16", "float16", "int8", … */
const char *whale_dtype_torch_name(whale_dtype dt);
/* returns 0 and sets *dt, or -1 if the name is unknown */
int whale_dtype_from_name(const char *name, whale_dtype *dt);

/* ---------------------------------------------------------------- tensors */

#define WHALE_MAX_DIMS 8
typedef struct {
    whale_dtype dtype;
    int ndim;
    int64_t shape[WHALE_MAX_DIMS];
    void *data;
} whale_tensor;

int64_t whale_shape_numel(int ndim, const int64_t *shape);

/* ---------------------------------------------------------------- threads */

/* Number of threads for OpenMP regions and oneDNN (0 = all cores). */
void whale_set_threads(int n);
int whale_get_threads(void);
/* Let go of the calling thread's idle OpenMP workers, before its work moves
 * to another thread (a server that loads on the main thread and runs on an
 * engine thread). Idle workers still count as running threads: with more
 * of them than cores, OpenMP's workers stop spinning between regions and
 * sleep and wake at every one. The next region started here makes new ones. */
void whale_threads_release(void);

/* ---------------------------------------------------------------- processor */

/* Instruction tiers, each including the ones before it:
 *   base         x86-64 with SSE4.2: plain C kernels
 *   avx2         AVX2, FMA, F16C (x86-64-v3)
 *   avx512       AVX-512 F/BW/VL/DQ/CD (x86-64-v4): the vector kernels
 *   avx512_bf16  + AVX512_BF16 and VBMI: the bf16 and int8 dot kernels
 *   amx          + AMX tiles (BF16, INT8) that the OS lets this process
 *                use: oneDNN's AMX products
 * The active tier is the best the processor and OS offer, capped by the
 * environment variable WHALE_ISA (one of the names above), read once. */
typedef enum {
    WHALE_ISA_BASE = 0,
    WHALE_ISA_AVX2,
    WHALE_ISA_AVX512,
    WHALE_ISA_AVX512_BF16,
    WHALE_ISA_AMX,
    WHALE_ISA_COUNT
} whale_isa;

/* Detects the processor and applies WHALE_ISA (also to oneDNN, whose
 * products then use no instruction above the tier). Idempotent and
 * thread-safe; called by whale_isa_active and by every session, so calling
 * it is needed only to report a bad WHALE_ISA early (WHALE_ERR_ARG, naming
 * the value; the detected tier is used meanwhile). */
whale_code whale_isa_init(whale_err *err);
whale_isa whale_isa_active(void);
whale_isa whale_isa_detected(void);
const char *whale_isa_name(whale_isa t);
/* The processor's brand string ("AMD EPYC 9R14", ...) and features beside
 * the tier's name: "avx512_fp16" (present, unused) and "amx_int8" (AMX
 * granted), space-separated, empty when none. */
const char *whale_cpu_model(void);
const char *whale_cpu_extras(void);
/* Bytes of the last-level (L3) cache the C library or sysfs reports, 0
 * when neither does: what a read meant to come from memory must exceed. */
size_t whale_cpu_llc_bytes(void);

/* ---------------------------------------------------------------- models */

typedef struct whale_model whale_model;

/* Model families, named by string (whale_model_family): "nanowhale"
 * (DeepSeek-V4 style, model_type deepseek_v4) and "dense", the dense
 * decoder: model_type qwen2 (Qwen2 / Qwen2.5), llama (Llama 2/3/3.1/3.2,
 * SmolLM2) and qwen3. whale_model_type gives the config's model_type. */

/* Load a Hugging Face model directory (config.json + model.safetensors or
 * model.safetensors.index.json). Loading is strict: every missing,
 * unexpected or wrong-shape tensor is reported. */
whale_code whale_model_load(const char *dir, whale_model **out, whale_err *err);

/* Random initialisation. preset: "nanowhale-100m", "debug", "small", "tiny",
 * "qwen2.5-0.5b", "qwen2.5-7b", "qwen2-tiny", "smollm2-135m", "llama-3.2-1b",
 * "llama-tiny", "qwen3-0.6b", "qwen3-tiny", or a path to a config.json.
 * Weights follow the family's reference init. */
whale_code whale_model_init(const char *preset, uint64_t seed, whale_model **out, whale_err *err);
/* Random initialisation written straight to dir (config.json +
 * model.safetensors in dt: fp32, bf16 or fp16), one parameter at a time:
 * the same weights as whale_model_init_config (rounded to dt) without ever
 * holding the model, so a 7B model can be made in bf16 on a machine that
 * could not hold it in fp32. *n_params (may be NULL) gets the count. */
whale_code whale_model_init_to_dir(const char *preset, const char *overrides, uint64_t seed, whale_dtype dt,
                                   const char *dir, int64_t *n_params, whale_err *err);
/* The same, calling progress(user, values written, total) before each
 * parameter and once at the end (progress may be NULL). */
typedef void (*whale_progress_fn)(void *user, int64_t done, int64_t total);
whale_code whale_model_init_to_dir_progress(const char *preset, const char *overrides, uint64_t seed, whale_dtype dt,
                                            const char *dir, int64_t *n_params, whale_progress_fn progress, void *user,
                                            whale_err *err);
/* The same with a JSON object of config fields that replace the preset's
 * (e.g. {"vocab_size": 8192}); overrides may be NULL. */
whale_code whale_model_init_config(const char *preset, const char *overrides, uint64_t seed, whale_model **out,
                                   whale_err *err);
/* The model's config.json text (malloc'd, compact). */
whale_code whale_model_config_json(const whale_model *m, char **json, whale_err *err);

/* Write config.json + model.safetensors into dir (created if missing); files
 * are written to a temporary name, fsynced and renamed. */
whale_code whale_model_save(const whale_model *m, const char *dir, whale_err *err);

/* The parameter table and config of a preset, config .json or model
 * directory, with no parameter storage (sizes only: whale memory). */
whale_code whale_model_skeleton(const char *src, whale_model **out, whale_err *err);
void whale_model_free(whale_model *m);

const char *whale_model_family(const whale_model *m);
const char *whale_model_type(const whale_model *m);
int whale_model_vocab_size(const whale_model *m);
int whale_model_max_positions(const whale_model *m);
int64_t whale_model_param_count(const whale_model *m);
/* End-of-sequence ids from the config (at most cap written); returns count. */
int whale_model_eos_ids(const whale_model *m, int32_t *ids, int cap);
/* FLOPs of a forward pass of B×S new tokens after p0 cached positions with
 * logits for logit_rows rows (2 per multiply-add; matrix products and attention). */
double whale_model_forward_flops(const whale_model *m, int B, int S, int p0, int logit_rows);
/* Weight bytes one decoding step must read (the bandwidth bound of decode). */
double whale_model_decode_weight_bytes(const whale_model *m);
/* Human-readable architecture summary (whale info). */
void whale_model_print_info(const whale_model *m, FILE *f);

/* Precision of the model's weight products (docs/precision.md):
 * WHALE_F32 (default); WHALE_BF16 / WHALE_F16: every product (projections,
 * experts, lm_head) rounds its input to the format and multiplies a copy of
 * the weights in that format with fp32 sums (fp16 outputs are rounded to
 * fp16 as well, so overflow shows as inf); WHALE_I8: weight-only int8 with
 * one scale per output channel, bf16 activations (inference only). Norms,
 * hyper-connection coefficients, the gate, attention and softmax stay fp32.
 * The fp32 weights are kept as master weights (for training) unless the
 * model was loaded with whale_model_load_as or whale_model_drop_master was
 * called. */
whale_code whale_model_set_dtype(whale_model *m, whale_dtype dt, whale_err *err);
/* Load for running in dt without fp32 master weights: the product weights
 * are held only in dt (a checkpoint already in BF16/F16 is used in place,
 * memory-mapped), about half (bf16/fp16) or a quarter (int8) of the fp32
 * memory. Such a model can run and be a frozen LoRA base, not be trained. */
whale_code whale_model_load_as(const char *dir, whale_dtype dt, whale_model **out, whale_err *err);
/* Free the fp32 values of every weight that has a low-precision copy. */
whale_code whale_model_drop_master(whale_model *m, whale_err *err);
/* Give the weights read in place from the checkpoint (its fp32 tensors, or
 * BF16/F16 copies already in the run's dtype) owned memory in 2 MiB pages,
 * dropping the mapping's pages behind the copy, then unmap the checkpoint.
 * For inference: decode streams every weight per token, and through the
 * mapping's 4 KiB pages it ran at about 60 % of the speed in fp32 and 90 %
 * in bf16. A frozen LoRA base in training stays mapped instead: its clean
 * pages can be reclaimed under memory pressure, owned memory cannot. */
whale_code whale_model_own_weights(whale_model *m, whale_err *err);
int whale_model_has_master(const whale_model *m);
whale_dtype whale_model_dtype(const whale_model *m);

/* Parameters by Hugging Face name, in state_dict order. A parameter held
 * only in a low-precision copy is returned in that dtype (BF16, F16, or I8
 * with one fp32 scale per row that this view does not show; I8 values are
 * stored in the packed layout of the W8A8 products, panels of 16 rows,
 * not row after row: docs/precision.md). */
int whale_model_num_params(const whale_model *m);
const char *whale_model_param_name(const whale_model *m, int i);
whale_tensor whale_model_param(const whale_model *m, int i);

/* ---------------------------------------------------------------- running */

/* A session owns every buffer a forward pass needs, sized once for at most
 * max_batch sequences of max_seq positions, plus the KV cache. Positions
 * continue from the cache: forward() appends S positions to each sequence. */
typedef struct whale_session whale_session;

whale_code whale_session_new(whale_model *m, int max_batch, int max_seq,
                             whale_session **out, whale_err *err);
void whale_session_free(whale_session *s);
/* Forget the KV cache (next forward starts at position 0). */
void whale_session_reset(whale_session *s);
/* Per-op-group wall time: turn on, run, read. Returns the number of groups
 * (names and accumulated seconds written up to cap). */
void whale_session_set_profile(whale_session *s, int on);
int whale_session_profile(const whale_session *s, const char **names, double *seconds, int cap);
/* Keep only the first n cached positions (a chat whose history changed
 * after position n re-feeds from there). */
void whale_session_truncate(whale_session *s, int n);
int whale_session_cached(const whale_session *s);

/* Run B sequences of S new tokens (ids [B*S], row-major). logits, if not
 * NULL, receives [B, S, V] when all_logits, else [B, V] for the last
 * position. Token ids are checked against the vocabulary. */
whale_code whale_session_forward(whale_session *s, const int32_t *ids, int B, int S,
                                 float *logits, int all_logits, whale_err *err);

/* Mean shifted cross-entropy of logits [B,S,V] against ids [B,S] (targets
 * are ids[:,1:]; an id of -100 is ignored). Returns the number of scored
 * tokens in *count (loss is NaN when count is 0). */
double whale_cross_entropy(const float *logits, const int32_t *ids, int B, int S, int V,
                           int64_t *count);

/* Intermediate-tensor tracing: when set, the model calls fn after each
 * traced op with a name such as "layers.0.hc_attn.comb". Zero cost when
 * unset. Used by tests against the reference and by numerics tools. */
typedef void (*whale_trace_fn)(void *user, const char *name, const whale_tensor *t);
void whale_session_set_trace(whale_session *s, whale_trace_fn fn, void *user);

/* ---------------------------------------------------------------- batches
 * Serving many sequences from one session (as llama.cpp's llama_batch and
 * llama_decode): a session made with whale_session_new_batched holds a KV
 * cache of n_seq sequences × n_ctx cells and work buffers for one micro-
 * batch of up to n_batch tokens, shared by all sequences. Each token of a
 * batch carries its own position and sequence id, so sequences at
 * different positions (a prompt being prefilled next to streams being
 * decoded) share one forward, and memory grows with KV cells, not with
 * sessions.
 *
 * Sequence seq holds cells for positions 0 .. whale_kv_seq_len(s, seq) − 1.
 * A batch appends to its sequences: the tokens of one sequence are
 * consecutive in the batch and their positions continue that sequence
 * (whale_kv_seq_len, +1, …); anything else is a WHALE_ERR_ARG naming the
 * token. whale_session_new(m, B, S) is whale_session_new_batched with
 * n_seq = B, n_ctx = S, n_batch = B·S, and whale_session_forward(ids, B, S)
 * is the batch of B sequences of S tokens, sequence b at position
 * whale_kv_seq_len(s, b).
 *
 * Thread contract: a session is used by one thread at a time (its calls
 * parallelise internally); distinct sessions of one model may run on
 * different threads once the model is no longer modified. */
typedef struct {
    int n_seq;   /* sequences the KV cache holds (seq ids 0 .. n_seq − 1) */
    int n_ctx;   /* cells (positions) per sequence */
    int n_batch; /* tokens one whale_session_decode may carry */
} whale_session_params;

whale_code whale_session_new_batched(whale_model *m, const whale_session_params *p, whale_session **out,
                                     whale_err *err);
/* The parameters a session was made with. */
whale_session_params whale_session_get_params(const whale_session *s);

/* A decode batch (whale_batch, in whale_data.h, is a training batch of
 * windows). */
typedef struct {
    int n_tokens;
    int32_t *token;  /* [n_tokens] ids */
    int32_t *pos;    /* [n_tokens] positions */
    int32_t *seq_id; /* [n_tokens] sequence of each token */
    int8_t *logits;  /* [n_tokens] 1: return this token's logits */
    int cap;         /* tokens allocated (whale_dbatch_init) */
} whale_dbatch;

whale_code whale_dbatch_init(whale_dbatch *b, int cap, whale_err *err);
void whale_dbatch_free(whale_dbatch *b);
void whale_dbatch_clear(whale_dbatch *b);
/* Append one token; WHALE_ERR_RANGE when the batch is full. */
whale_code whale_dbatch_add(whale_dbatch *b, int32_t token, int32_t pos, int32_t seq_id, int logits, whale_err *err);

/* Run a batch: its tokens' K/V are appended to their sequences' cells, and
 * logits (if not NULL) receives [n_out, V] for the tokens whose logits flag
 * is set, in batch order. Nothing changes on failure. */
whale_code whale_session_decode(whale_session *s, const whale_dbatch *b, float *logits, whale_err *err);

/* Stopping long work: fn is called before every layer of a forward or a
 * training step; when it returns non-zero the call stops with
 * WHALE_ERR_ABORTED (a decode then changes no cell). fn NULL: never. It
 * runs on the thread that called the session, and may be called from
 * another thread's signal (it only reads a flag). */
typedef int (*whale_abort_fn)(void *user);
void whale_session_set_abort(whale_session *s, whale_abort_fn fn, void *user);

/* Cells: how many sequence seq holds; keep only its first n (n = 0: empty
 * it); make dst hold a copy of src's first n cells (a shared prompt
 * prefix), replacing what dst held. */
int whale_kv_seq_len(const whale_session *s, int seq);
void whale_kv_seq_keep(whale_session *s, int seq, int n);
whale_code whale_kv_seq_copy(whale_session *s, int src, int dst, int n, whale_err *err);
/* Bytes of the KV cache (all sequences' cells). */
size_t whale_kv_bytes(const whale_session *s);
/* Write every cell no sequence holds (zeros; held cells and lengths are
 * unchanged), so the cache's memory
 * is the process's from now on instead of arriving page by page as the
 * sequences grow: a server's memory is then fixed at start, and the first
 * requests to reach each slot do not pay its page faults. */
void whale_kv_commit(whale_session *s);

/* Adapters per sequence (multi-LoRA serving, as vLLM's and SGLang's
 * per-request LoRA): a whale_adapter is a LoRA adapter loaded beside a
 * model (whale_adapter_load in whale_lora.h) — the base stays frozen and
 * unchanged, and every adapter is held once, shared by all sessions and
 * sequences. Each sequence of a batched session is bound to one adapter
 * or to none (the base), and a decode applies each adapter's term s·B·A·x
 * only to the rows of the sequences bound to it, in every product it
 * adapts, so sequences of different adapters share one forward. Where
 * llama.cpp's llama_set_adapter_lora applies adapters to a whole context,
 * this binds them per sequence.
 *
 * A sequence's cells are made with its adapter, so they do not mix:
 * binding another adapter to a sequence that holds cells is refused (empty
 * it first with whale_kv_seq_keep(s, seq, 0)), and so is whale_kv_seq_copy
 * between sequences bound to different adapters. Binding is refused on a
 * model that has adapters attached into its parameters (whale_lora_attach
 * or whale_lora_load, which apply to every row), on a training session,
 * and for an adapter loaded after the session was made with a larger rank
 * than any before (the session's scratch is sized at creation: load the
 * adapters first). a NULL binds the base. New sequences are bound to none.
 *
 * Thread contract: binding is a call on the session (one thread at a
 * time, like decode). Loading an adapter modifies the model: do it before
 * the model's sessions run on other threads; loaded adapters are then
 * read-only and may be used by sessions on any thread. */
typedef struct whale_adapter whale_adapter;
whale_code whale_kv_seq_set_adapter(whale_session *s, int seq, const whale_adapter *a, whale_err *err);
/* The adapter sequence seq is bound to (NULL: none). */
const whale_adapter *whale_kv_seq_adapter(const whale_session *s, int seq);

/* ---------------------------------------------------------------- training */

/* A training session keeps every layer's activations for the backward pass
 * (no KV cache) and one fp32 gradient buffer laid out like the parameters.
 * With recompute, only each layer's input state is kept and the layer's
 * forward is run again just before its backward (less memory, ~1/3 more
 * compute); the gradients are bit-identical either way. */
whale_code whale_train_session_new(whale_model *m, int max_batch, int seq, int recompute, whale_session **out,
                                   whale_err *err);
/* Bytes of activations the session holds, and (for a training session) the
 * bytes recomputation saves or would save. */
size_t whale_session_activation_bytes(const whale_session *s, size_t *recompute_saves);
/* Gradient of parameter i (same shape as whale_model_param(m, i)); NULL for
 * an inference session. */
float *whale_session_grad(whale_session *s, int param_index);
/* The model a session runs. */
whale_model *whale_session_model(const whale_session *s);
void whale_session_zero_grad(whale_session *s);
/* Number of scored targets in ids/labels [B,S]: labels follow Hugging Face
 * (labels[b][s] is what position s−1 should predict, −100 = ignored; NULL
 * means labels = ids). */
int64_t whale_count_targets(const int32_t *labels, int B, int S);
/* Forward and backward on ids [B,S]: *loss receives the mean cross-entropy
 * over the *count scored targets, and the gradient of loss_scale × that mean
 * is ADDED to the session's gradients (loss_scale = count / total count
 * averages correctly over accumulated micro-batches; 0 = evaluate only,
 * no backward pass).
 * pos [B,S] (RoPE positions) and seg [B,S] (for packed documents: the index
 * within its sequence of the first token each position may attend to) may
 * be NULL: positions 0..S−1 and plain causal attention. */
whale_code whale_session_train_step(whale_session *s, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                                    const int32_t *seg, int B, int S, double loss_scale, double *loss,
                                    int64_t *count, whale_err *err);

/* Give every parameter its own writable fp32 memory (a loaded checkpoint is
 * mapped read-only); needed before updating weights. */
whale_code whale_model_make_writable(whale_model *m, whale_err *err);

/* ---- optimiser: AdamW with decoupled weight decay (PyTorch semantics) ---- */
/* How updated weights are stored: fp32 (mixed precision keeps fp32 master
 * weights), or rounded to bf16 after every update ("pure bf16": the weights
 * are bf16 values, to nearest or stochastically). */
typedef enum {
    WHALE_WEIGHTS_F32 = 0,
    WHALE_WEIGHTS_BF16_NEAREST,
    WHALE_WEIGHTS_BF16_STOCHASTIC
} whale_weight_rounding;

typedef struct {
    double beta1, beta2, eps, weight_decay;
    whale_weight_rounding weight_rounding;
    uint64_t seed; /* stochastic rounding's random stream */
} whale_adamw_config;

typedef struct whale_optimizer whale_optimizer;
/* Moments are fp32, one pair per parameter element. Parameters with no
 * gradient (attn_sink, gate.bias) are left untouched, as PyTorch skips them;
 * norm weights and biases are not decayed (Hugging Face Trainer's rule). */
whale_code whale_adamw_new(whale_model *m, const whale_adamw_config *cfg, whale_optimizer **out, whale_err *err);
void whale_optimizer_free(whale_optimizer *o);
/* Bytes of the moments (m and v). */
size_t whale_optimizer_bytes(const whale_optimizer *o);
/* One update of m's parameters from s's gradients with learning rate lr. */
void whale_adamw_step(whale_optimizer *o, whale_session *s, double lr);
int64_t whale_optimizer_steps(const whale_optimizer *o);
/* Moments for checkpoints: m and v of parameter i. */
float *whale_optimizer_moment(whale_optimizer *o, int which, int param_index);
void whale_optimizer_set_steps(whale_optimizer *o, int64_t steps);

/* Global L2 norm of the session's gradients (summed in double, fixed order). */
double whale_grad_norm(whale_session *s);
/* Clip to max_norm like torch.nn.utils.clip_grad_norm_: scale by
 * max_norm / (norm + 1e-6) when that is below 1. Returns the norm before. */
double whale_clip_grad_norm(whale_session *s, double max_norm);
/* Multiply every gradient by f (unscaling after loss scaling). */
void whale_scale_grads(whale_session *s, double f);

/* Dynamic loss scaling for fp16 training (PyTorch GradScaler semantics):
 * scale the loss by `scale`; after the backward pass, report whether any
 * gradient is inf/NaN. update() returns 1 if the optimiser step should be
 * taken (with the gradients divided by the scale used), 0 if it must be
 * skipped; the scale halves on a skip and doubles after growth_interval
 * clean steps in a row. */
typedef struct {
    double scale;           /* 65536 at start */
    double growth_factor;   /* 2 */
    double backoff_factor;  /* 0.5 */
    int growth_interval;    /* 2000 */
    int clean_steps;        /* clean steps since the last change */
    int64_t skipped;        /* steps skipped so far */
} whale_loss_scaler;
void whale_loss_scaler_init(whale_loss_scaler *s);
int whale_loss_scaler_update(whale_loss_scaler *s, int found_nonfinite);

/* Learning-rate multiplier at optimiser step k (0-based) as Hugging Face's
 * schedulers compute it: linear warmup over `warmup` steps from 0, then
 * constant, linear decay to 0, or cosine decay to 0 at `total` steps. */
typedef enum { WHALE_LR_CONSTANT = 0, WHALE_LR_LINEAR, WHALE_LR_COSINE } whale_lr_schedule;
double whale_lr_multiplier(whale_lr_schedule sched, int64_t k, int64_t warmup, int64_t total);

/* ---------------------------------------------------------------- memory */

/* Bytes a run holds, by category (docs/precision.md, "Memory"). */
typedef struct {
    whale_dtype dtype;        /* precision of the products */
    int64_t params, trainable;
    size_t weights_f32;       /* fp32 values: all weights of an fp32 run, master weights, small tensors */
    size_t weights_lowp;      /* bf16/fp16/int8 copies of the product weights */
    size_t weights_mapped;    /* copies used in place from a checkpoint already in that dtype */
    size_t adapters;          /* LoRA A and B (fp32) */
    size_t grads, moments;    /* training: fp32 gradients, AdamW m and v */
    size_t activations;       /* kept for the backward pass (training) or one layer's (inference) */
    size_t recompute_saves;   /* training: what --recompute saves (or would save) of activations */
    size_t kv_cache, workspace;
    size_t runtime;           /* the process without a model: code, libraries, thread pools */
    size_t total;
    int ranks, zero;          /* per rank of that many (0 or 1: one process); zero: moments sharded (--zero 1) */
} whale_memory;

typedef enum { WHALE_TRAIN_NONE = 0, WHALE_TRAIN_FULL, WHALE_TRAIN_LORA } whale_train_kind;
/* MiB per gradient bucket sent during the backward pass on several ranks
 * by default (--bucket-mb; PyTorch DDP's bucket_cap_mb is 25): 0, one
 * exchange after the backward pass: buckets were 1-2.5 s slower per step at
 * 1 Gb/s and within the noise at 10 Gb/s where measured (docs/distributed.md). */
#define WHALE_BUCKET_MB 0.0
typedef struct {
    whale_dtype dtype;
    whale_train_kind train;
    int lora_rank;
    const char *lora_targets; /* LoRA target_modules; NULL = "all-linear" */
    int batch, seq_len; /* inference: the session's batch and context (KV cache) */
    int recompute;
    int grad_accum;     /* training: micro-batches per step (0 or 1: one) */
    int ranks;          /* training on that many ranks (0 or 1: one process): per rank */
    int zero;           /* 1: the AdamW moments sharded over the ranks (--zero 1) */
    double bucket_mb;   /* on ranks: MiB per gradient bucket sent during the backward pass (--bucket-mb); 0: none */
} whale_memory_plan;

/* Estimate for a preset, config .json or model directory, without
 * allocating anything. */
whale_code whale_memory_estimate(const char *config, const whale_memory_plan *plan, whale_memory *out,
                                 whale_err *err);
/* What live objects hold: the model, then add a session and the optimizer. */
void whale_memory_of_model(const whale_model *m, whale_memory *out);
void whale_memory_add_session(whale_memory *mm, const whale_session *s);
void whale_memory_add_optimizer(whale_memory *mm, size_t moment_bytes);
void whale_memory_print(const whale_memory *mm, FILE *f);
/* The same in one line (inference commands). */
void whale_memory_print_line(const whale_memory *mm, FILE *f);
/* Peak resident set size of the process so far, in bytes. */
size_t whale_peak_rss(void);

/* ---------------------------------------------------------------- sampling */

typedef struct {
    float temperature;    /* 0 = greedy */
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off */
    float min_p;          /* 0 = off */
    float repeat_penalty; /* 1 = off; HF semantics (divide positive, multiply negative) */
    int repeat_last_n;    /* window of previous tokens penalised; -1 = all */
    uint64_t seed;
} whale_sampler_params;

whale_sampler_params whale_sampler_defaults(void);

typedef struct whale_sampler whale_sampler;
whale_code whale_sampler_new(const whale_sampler_params *p, int vocab, whale_sampler **out,
                             whale_err *err);
void whale_sampler_free(whale_sampler *s);
/* Pick the next token from logits [vocab] (modified in place). history holds
 * the ids seen so far (prompt + generated) for the repetition penalty.
 * Returns -1 when no logit is finite (all NaN / -inf): the caller reports it. */
int32_t whale_sample(whale_sampler *s, float *logits, const int32_t *history, int n_history);

/* ---------------------------------------------------------------- generation */

typedef struct {
    int prompt_tokens;    /* tokens fed before the first sample */
    int generated;        /* tokens sampled (including a stop token) */
    int stopped;          /* 1 if a stop id ended generation */
    double prompt_seconds, gen_seconds;
} whale_gen_stats;

/* Called with each sampled id; return non-zero to stop after it. */
typedef int (*whale_token_fn)(void *user, int32_t id);

/* Generate into ids: ids[0..*n_ids) is the whole context; positions the
 * session has not cached yet are fed first (a prompt, or a new chat turn; if
 * the cache holds more than *n_ids it is reset). Then up to max_new tokens
 * are sampled and appended (cap bounds *n_ids), stopping after any id in
 * stop_ids. A sampled token is fed to the model only when another one
 * follows, so the cache ends one token short of *n_ids. */
whale_code whale_generate(whale_session *s, whale_sampler *sm, int32_t *ids, int *n_ids, int cap, int max_new,
                          const int32_t *stop_ids, int n_stop, whale_token_fn on_token, void *user,
                          whale_gen_stats *stats, whale_err *err);

#ifdef __cplusplus
}
#endif

#include "whale_tokenizer.h"
#endif
