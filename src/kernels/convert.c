#include "kernels/convert.h"

#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float whale_bf16_to_float(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t whale_float_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float whale_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / NaN */
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: value = man * 2^-24, exact in fp32 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t whale_float_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* result is subnormal or zero: round a * 2^24 to an integer, ties to even */
        if (a < 0x33000000u) return sign; /* below half the smallest subnormal */
        uint32_t exp = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)exp; /* 14..24 */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return sign | (uint16_t)(r >> 13);
}

void whale_bf16_to_f32(float *dst, const void *src, size_t n) {
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + i, 2);
        dst[i] = whale_bf16_to_float(h);
    }
}

void whale_f16_to_f32(float *dst, const void *src, size_t n) {
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + i, 2);
        dst[i] = whale_f16_to_float(h);
    }
}
