/* The weight formats a run keeps its product weights in: one row each.
 * A new format is a row here (storage, conversion, what it allows) and its
 * products in the backends (matmul_nt / matmul_nn, get_rows). */
#include "models/model.h"

#include "kernels/convert.h"
#include "kernels/gemm.h"

#include <string.h>

static void f32_from(void *dst, float *scale, const float *src, int64_t rows, int64_t cols) {
    (void)scale, memcpy(dst, src, sizeof(float) * (size_t)(rows * cols));
}
static void f32_row(float *dst, const void *src, float scale, int64_t cols) {
    (void)scale, memcpy(dst, src, sizeof(float) * (size_t)cols);
}
static void bf16_from(void *dst, float *scale, const float *src, int64_t rows, int64_t cols) {
    (void)scale, whale_f32_to_bf16_rows(dst, src, (size_t)(rows * cols));
}
static void bf16_row(float *dst, const void *src, float scale, int64_t cols) {
    (void)scale, whale_bf16_to_f32(dst, src, (size_t)cols);
}
static void f16_from(void *dst, float *scale, const float *src, int64_t rows, int64_t cols) {
    (void)scale, whale_f32_to_f16_rows(dst, src, (size_t)(rows * cols));
}
static void f16_row(float *dst, const void *src, float scale, int64_t cols) {
    (void)scale, whale_f16_to_f32(dst, src, (size_t)cols);
}
/* per output row: scale = max |w| / 127, q = round(w / scale) (whale_quantize_q8_rows),
 * stored packed for the W8A8 products (whale_q8p_quantize): dst is the
 * panel of the first row, which starts a panel */
static void i8_from(void *dst, float *scale, const float *src, int64_t rows, int64_t cols) {
    whale_q8p_quantize(dst, scale, src, (int)rows, (int)cols);
}
static void i8_row(float *dst, const void *src, float scale, int64_t cols) {
    whale_q8p_row(dst, src, 0, (int)cols, scale); /* the first row of a panel (whale_model_row reads any) */
}

static const whale_format formats[] = {
    /* dtype, name, row_scale, trainable, saveable, from_f32, row_to_f32 */
    {WHALE_F32, "fp32", 0, 1, 1, f32_from, f32_row},
    {WHALE_BF16, "bf16", 0, 1, 1, bf16_from, bf16_row},
    {WHALE_F16, "fp16", 0, 1, 1, f16_from, f16_row},
    {WHALE_I8, "int8", 1, 0, 0, i8_from, i8_row},
};

const whale_format *whale_format_of(whale_dtype dt) {
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].dtype == dt) return &formats[i];
    return NULL;
}

size_t whale_copy_values_bytes(whale_dtype dt, int64_t rows, int64_t cols) {
    if (dt == WHALE_I8) return whale_q8p_bytes((int)rows, (int)cols);
    return (size_t)(rows * cols) * whale_dtype_size(dt);
}

size_t whale_copy_bytes(whale_dtype dt, int64_t rows, int64_t cols) {
    const whale_format *f = whale_format_of(dt);
    size_t b = whale_copy_values_bytes(dt, rows, cols);
    if (f && f->row_scale) b += sizeof(float) * (size_t)rows;
    return (b + 63) & ~(size_t)63;
}
