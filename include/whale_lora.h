/*
 * whale_lora.h — LoRA adapters (PEFT-compatible) on a model's Linear layers.
 *
 * An adapter on a weight W [out, in] adds s · B·A with A [r, in], B [out, r]
 * and s = alpha / r (alpha / sqrt(r) with rsLoRA): y = W·x + s·B·(A·drop(x)).
 * Initialisation as PEFT: A uniform in ±1/sqrt(in), B zero, so an attached
 * adapter changes nothing until trained. With adapters attached, every base
 * parameter is frozen (no gradient buffer, no optimiser state: PEFT's
 * default) and the adapters are the model's trainable parameters, named
 * "<module>.lora_A.weight" / "<module>.lora_B.weight" in the parameter table.
 *
 * Qwen2's all-linear targets are q_proj, k_proj, v_proj, o_proj, gate_proj,
 * up_proj and down_proj (every Linear but lm_head). nanowhale's are wq_a, wq_b, wkv, wo_b and the
 * routed and shared experts' w1, w2, w3 (not lm_head, not the gate, whose
 * weight is a raw parameter): the Linears the reference modeling code
 * calls. Not wo_a: the reference reads its weight inside an einsum, so a
 * PEFT adapter on it never acts (PeftModel unmerged). Attaching one is
 * refused; loading skips a wo_a pair in the file, as PeftModel does.
 *
 * Attach adapters before creating sessions.
 */
#ifndef WHALE_LORA_H
#define WHALE_LORA_H

#include "whale.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int rank;                   /* r (8) */
    double alpha;               /* lora_alpha (32) */
    double dropout;             /* lora_dropout on the adapter's input, training only (0.05) */
    int use_rslora;             /* scale alpha / sqrt(r) instead of alpha / r */
    const char *target_modules; /* "all-linear" or comma-separated module names ("wq_a,wkv,w1") */
    uint64_t seed;              /* A's initialisation and the dropout masks */
} whale_lora_config;

whale_lora_config whale_lora_defaults(void);

/* Add adapters to every targeted Linear of m (initialised as PEFT does) and
 * freeze the base. Fails if m already has adapters or no module matches. */
whale_code whale_lora_attach(whale_model *m, const whale_lora_config *cfg, whale_err *err);
/* Load a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)
 * onto m: shapes, names and config are checked (errors name the file). */
whale_code whale_lora_load(whale_model *m, const char *dir, whale_err *err);
/* Write dir/adapter_model.safetensors (keys base_model.model.<module>.lora_A
 * .weight [r, in] and .lora_B.weight [out, r], fp32) and dir/adapter_config.json
 * (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
 * target_modules, base_model_name_or_path, use_rslora, bias "none"). Files
 * are written to temporary names, fsynced and renamed. */
whale_code whale_lora_save(const whale_model *m, const char *dir, const char *base_model_name_or_path,
                           whale_err *err);
/* W += s·B·A for every adapter, into the fp32 weights (or the bf16/fp16
 * copy of a model loaded without fp32 weights), then drop the adapters and
 * unfreeze the base: the model computes what the adapted model computed. */
whale_code whale_lora_merge(whale_model *m, whale_err *err);
/* Number of adapters (0 when none) and their parameter count. */
int whale_lora_count(const whale_model *m);
int64_t whale_lora_num_params(const whale_model *m);
/* The config the adapters were attached or loaded with (NULL if none). */
const whale_lora_config *whale_lora_get_config(const whale_model *m);

/* An adapter beside the model, for binding per sequence (whale.h,
 * whale_kv_seq_set_adapter): the PEFT folder dir (as whale_lora_load
 * reads it, with the same checks) into memory of its own, leaving m's
 * parameters as they are. The model owns it: it is freed with the model.
 * Dropout does not apply (inference only). Several adapters of any ranks
 * and target modules may be loaded onto one model. */
whale_code whale_adapter_load(whale_model *m, const char *dir, whale_adapter **out, whale_err *err);
/* Its rank, number of adapted weights and parameter count. */
int whale_adapter_rank(const whale_adapter *a);
int whale_adapter_count(const whale_adapter *a);
int64_t whale_adapter_num_params(const whale_adapter *a);

/* A checkpoint written tensor by tensor (whale export): the base folder's
 * tensors, each with its LoRA delta added when adapters is set (W + s·B·A,
 * computed in fp32/double from the stored values and rounded once to the
 * output dtype), into out/model.safetensors, with the base's config.json
 * (its dtype field updated when converting), generation_config.json and
 * tokenizer files. Only one tensor is held in memory at a time (the base is
 * memory-mapped and its pages dropped after each tensor). */
typedef enum { WHALE_EXPORT_SAFETENSORS = 0, WHALE_EXPORT_GGUF } whale_export_format;
/* GGUF tensor types (ggml_type values). */
typedef enum { WHALE_GGUF_F32 = 0, WHALE_GGUF_F16 = 1, WHALE_GGUF_Q8_0 = 8, WHALE_GGUF_BF16 = 30 } whale_gguf_dtype;

typedef struct {
    const char *base;     /* base checkpoint folder */
    const char *adapters; /* a PEFT LoRA folder, or NULL: convert only */
    const char *out;      /* output folder (created; not the base), or the .gguf file */
    int convert;          /* 0: every tensor keeps its stored dtype; 1: floating tensors become dtype */
    whale_dtype dtype;    /* WHALE_F32, WHALE_BF16 or WHALE_F16 when convert */
    double memory_limit;  /* bytes the export may take; 0 = physical memory, < 0 = no check */
    whale_export_format format;
    whale_gguf_dtype gguf_dtype; /* GGUF: the type of the 2-D weights (norms, biases: F32) */
    /* called after each tensor (may be NULL) */
    void (*progress)(void *user, int done, int total);
    void *user;
} whale_export_opts;

typedef struct {
    int tensors, merged;      /* tensors written, of which with a LoRA delta */
    int64_t values, overflow; /* floating values written; finite values that became fp16 infinity */
    size_t largest;           /* bytes of the largest tensor read */
    size_t planned;           /* the up-front estimate of the memory needed */
    whale_dtype dtype;        /* the dtype of the largest floating tensor written (the config's) */
} whale_export_stats;

/* GGUF (format WHALE_EXPORT_GGUF): one file in llama.cpp's layout for the
 * dense families (qwen2, llama, qwen3; nanowhale is refused): its
 * architecture's hyperparameters, llama.cpp's tensor names and dimension
 * order (Llama's q/k rows reordered as llama.cpp's converter does),
 * gguf_dtype for the 2-D weights (F32 for norms and biases; F16 for a
 * Q8_0 weight whose rows are not a multiple of 32), and the tokenizer as
 * llama.cpp reads a GPT-2-style BPE: tokens, types, merges, the
 * pre-tokenizer's name, special ids, add_bos/add_eos, chat template. */
whale_code whale_export_gguf_plan(const whale_export_opts *o, whale_export_stats *st, whale_err *err);

/* The memory an export needs (without writing anything) and the checks of
 * the adapters against the base: every lora_A / lora_B pair must adapt a
 * 2-D base tensor of matching shape. */
whale_code whale_export_plan(const whale_export_opts *o, whale_export_stats *st, whale_err *err);
/* The export; refused up front (WHALE_ERR_NOMEM) when the plan exceeds the limit. */
whale_code whale_export_checkpoint(const whale_export_opts *o, whale_export_stats *st, whale_err *err);

#ifdef __cplusplus
}
#endif
#endif
