/*
 * gguf.h — write GGUF version 3 files (ggml's model format, read by
 * llama.cpp and Ollama).
 *
 * A file is: "GGUF", version 3, the tensor count and key/value count
 * (uint64), the key/values (key: uint64 length + bytes; uint32 value type;
 * value), one info per tensor (name, uint32 n_dims, uint64 ne[n_dims] with
 * ne[0] the contiguous dimension — PyTorch's shape reversed —, uint32 ggml
 * type, uint64 offset into the data area), zero padding to the alignment,
 * then each tensor's bytes, each padded to the alignment. Little-endian.
 *
 * The key/values and tensor infos are collected in memory first (a writer
 * remembers the first allocation failure and reports it at write time);
 * the tensors' bytes come from a producer, one tensor at a time, so a file
 * larger than memory streams through one tensor's buffer.
 */
#ifndef WHALE_IO_GGUF_H
#define WHALE_IO_GGUF_H

#include "whale.h"

#include <stddef.h>
#include <stdint.h>

#define WHALE_GGUF_ALIGNMENT 32 /* general.alignment (ggml's default) */

/* ggml_type values (ggml.h) of the formats written here. */
typedef enum { GGUF_TYPE_F32 = 0, GGUF_TYPE_F16 = 1, GGUF_TYPE_Q8_0 = 8, GGUF_TYPE_BF16 = 30 } whale_gguf_type;
/* gguf_type values of the metadata. */
enum {
    GGUF_V_UINT32 = 4,
    GGUF_V_INT32 = 5,
    GGUF_V_FLOAT32 = 6,
    GGUF_V_BOOL = 7,
    GGUF_V_STRING = 8,
    GGUF_V_ARRAY = 9
};

/* Q8_0: blocks of 32 values, each an fp16 scale d = max|x| / 127 and 32
 * int8 q = round(x · (1/d)) (halves away from zero), as ggml's reference
 * quantize_row_q8_0_ref computes them; a value comes back as q · d. */
#define WHALE_Q8_0_BLOCK 32
#define WHALE_Q8_0_BYTES 34
void whale_q8_0_quantize(void *dst, const float *src, int64_t n); /* n a multiple of 32 */
void whale_q8_0_dequantize(float *dst, const void *src, int64_t n);

/* Bytes of a tensor of type t and ne[0 .. ndim) (ne[0] a multiple of 32 for Q8_0). */
size_t whale_gguf_nbytes(whale_gguf_type t, int ndim, const int64_t *ne);
const char *whale_gguf_type_name(whale_gguf_type t); /* "F32", "F16", "Q8_0", "BF16" */

typedef struct whale_gguf whale_gguf;

whale_gguf *whale_gguf_new(void); /* NULL when out of memory */
void whale_gguf_free(whale_gguf *g);

/* Key/values, in the order added. */
void whale_gguf_u32(whale_gguf *g, const char *key, uint32_t v);
void whale_gguf_i32(whale_gguf *g, const char *key, int32_t v);
void whale_gguf_f32(whale_gguf *g, const char *key, float v);
void whale_gguf_bool(whale_gguf *g, const char *key, int v);
void whale_gguf_str(whale_gguf *g, const char *key, const char *v);
/* An array of n values of type vtype: opened by whale_gguf_array, then
 * filled by exactly n whale_gguf_elem_* calls. */
void whale_gguf_array(whale_gguf *g, const char *key, int vtype, uint64_t n);
void whale_gguf_elem_str(whale_gguf *g, const char *s, size_t len);
void whale_gguf_elem_i32(whale_gguf *g, int32_t v);

/* A tensor (ne as ggml orders it); offsets follow from the order added. */
void whale_gguf_tensor(whale_gguf *g, const char *name, whale_gguf_type type, int ndim, const int64_t *ne);
int whale_gguf_tensor_count(const whale_gguf *g);
/* Bytes the whole file will take. */
uint64_t whale_gguf_file_bytes(const whale_gguf *g);

/* Tensor i's bytes (whale_gguf_nbytes of its info), valid until the next
 * call, or NULL with err set. */
typedef const void *(*whale_gguf_producer)(void *user, int i, whale_err *err);
/* Write path via path.tmp (fsync, rename; no partial file is left on
 * failure), calling produce once per tensor in order. */
whale_code whale_gguf_write(whale_gguf *g, const char *path, whale_gguf_producer produce, void *user, whale_err *err);

#endif
