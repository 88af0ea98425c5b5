/* The exporter both output formats share (export.c): the base checkpoint
 * memory-mapped, each tensor matched with its LoRA adapters, and each
 * output tensor computed row by row from the stored values (merged in fp32,
 * rounded once). export_gguf.c writes the same tensors as GGUF. */
#ifndef WHALE_TRAIN_EXPORT_H
#define WHALE_TRAIN_EXPORT_H

#include "whale_lora.h"

#include "whale_safetensors.h"

#define EXPORT_RUNTIME_BYTES ((size_t)16 << 20) /* code, libraries, headers, thread pools */

typedef struct {
    const whale_st_entry *e;     /* the base tensor */
    const whale_st_entry *a, *b; /* its adapters (lora_A [r, in], lora_B [out, r]) or NULL */
    whale_dtype out;             /* dtype written (F32, BF16, F16) unless q8 */
    int q8;                      /* written as ggml Q8_0 blocks (rows of a multiple of 32 values) */
    int perm_heads;              /* > 0: rows reordered for llama.cpp's RoPE layout, heads of rows / perm_heads */
    size_t out_bytes;
    int buffered; /* computed into a buffer (merged or converted); else written from the mapping */
} ex_tensor;

typedef struct {
    const whale_export_opts *o;
    whale_st *base, *ad;
    whale_lora_config cfg;
    char *targets;
    float scale;
    ex_tensor *t;
    int n, nthreads;
    void *buf; /* the current tensor's output */
    int64_t values, overflow;
} exporter;

/* Open the base (and adapters) and match every tensor with its adapters;
 * each tensor's output is its stored dtype, or o->dtype when converting. */
whale_code export_open(const whale_export_opts *o, exporter *x, whale_err *err);
void export_close(exporter *x);
/* The memory plan of the tensors' out_bytes (the largest one in flight). */
void export_plan(const exporter *x, whale_export_stats *st);
/* Tensor t's output (t->out or Q8_0, rows reordered when perm_heads) into
 * buf (t->out_bytes), row by row. */
whale_code export_fill(exporter *x, const ex_tensor *t, void *buf, whale_err *err);
/* The limit an export is checked against: o->memory_limit, or the machine's
 * memory (0: none). */
double export_memory_limit(const whale_export_opts *o);

/* whale_export_checkpoint for format GGUF (export_gguf.c). */
whale_code whale_export_gguf(const whale_export_opts *o, whale_export_stats *st, whale_err *err);

#endif
