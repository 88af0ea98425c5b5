/* Conversions between fp32 and the 16-bit float formats (round to nearest
 * even; NaN stays NaN, infinities and subnormals are exact where representable).
 *
 * The scalar functions define the results; every array function below is
 * bit-identical to them (AVX-512 where available, a plain C loop otherwise).
 * Rounding to fp16 overflows to +-inf from |x| >= 65520 (the midpoint past
 * the largest fp16, 65504), keeps fp16 subnormals (down to 2^-24) and turns
 * a NaN into a quiet NaN with the sign and top 9 payload bits kept: what
 * F16C's vcvtps2ph and a PyTorch cast to float16 give. Rounding to bf16
 * overflows to +-inf from the midpoint past 3.3895e38 and does not flush
 * subnormals (unlike the AVX512_BF16 instructions). */
#ifndef WHALE_CONVERT_H
#define WHALE_CONVERT_H

#include <stddef.h>
#include <stdint.h>

float whale_bf16_to_float(uint16_t h);
uint16_t whale_float_to_bf16(float f);
float whale_f16_to_float(uint16_t h);
uint16_t whale_float_to_f16(float f);

/* n 16-bit values (any alignment) to fp32; exact. */
void whale_bf16_to_f32(float *dst, const void *src, size_t n);
void whale_f16_to_f32(float *dst, const void *src, size_t n);

/* dst[i] = whale_float_to_f16(src[i]). */
void whale_f32_to_f16_rows(uint16_t *dst, const float *src, size_t n);

/* x[i] := x[i] rounded to bf16 / fp16, kept as fp32 (the value a cast to
 * the format and back gives, e.g. to simulate bf16 or fp16 storage).
 * The _rows forms write dst instead (dst may equal src). */
void whale_round_bf16_inplace(float *x, size_t n);
void whale_round_f16_inplace(float *x, size_t n);
void whale_round_bf16_rows(float *dst, const float *src, size_t n);
void whale_round_f16_rows(float *dst, const float *src, size_t n);

/* Stochastic rounding to bf16: the low 16 bits of r are added to the low 16
 * bits of f's fp32 pattern, then those are dropped. So f becomes one of its
 * two bf16 neighbours, the one above (in magnitude) with probability
 * (distance to the one below) / (their spacing): unbiased, E[result] = f,
 * for uniformly random r. Zeros, bf16 values (including +-inf) and
 * subnormals work the same way (the pattern is linear there too); NaN gives
 * the quiet NaN of whale_float_to_bf16. A finite f with |f| <= 3.3895e38
 * (the largest bf16) never becomes inf; above it, up to FLT_MAX, f becomes
 * +-3.3895e38 or +-inf with probabilities as if inf were the next value,
 * 2^128 (the rare values there are beyond bf16's range anyway). */
uint16_t whale_float_to_bf16_sr(float f, uint32_t r);

/* x[i] := whale_float_to_bf16_sr(x[i], r_i) as fp32, where r_i depends only
 * on (seed, counter + i): 16 bits of output j / 4 of a splitmix64 sequence
 * started at seed (output t = mix(seed + (t + 1)·0x9e3779b97f4a7c15), each
 * 64-bit output serving four consecutive j). So a tensor rounded in pieces
 * with matching counters, or with any number of OpenMP threads (used from
 * 2^16 elements), gives the same bits; advance counter by n between calls
 * that must be independent. */
void whale_round_bf16_sr_inplace(float *x, size_t n, uint64_t seed, uint64_t counter);

#endif
