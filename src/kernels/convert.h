/* Conversions between fp32 and the 16-bit float formats (round to nearest
 * even; NaN stays NaN, infinities and subnormals are exact where representable). */
#ifndef WHALE_CONVERT_H
#define WHALE_CONVERT_H

#include <stddef.h>
#include <stdint.h>

float whale_bf16_to_float(uint16_t h);
uint16_t whale_float_to_bf16(float f);
float whale_f16_to_float(uint16_t h);
uint16_t whale_float_to_f16(float f);

void whale_bf16_to_f32(float *dst, const void *src, size_t n);
void whale_f16_to_f32(float *dst, const void *src, size_t n);

#endif
