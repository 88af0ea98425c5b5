/* The instruction-set extensions this build's code may use: the compiler's
 * feature macros for the build's -march, as a mask of cli/isa_check.h's
 * bits. Compiled with the build's flags (the function is one constant, so
 * it runs on any x86-64). */
#include "isa_check.h"

unsigned whale_build_isa(void) {
    unsigned m = 0;
#define WHALE_BUILD_FEATURE(bit, macro) (void)(m |= macro ? 1u << (bit) : 0u)
#ifdef __SSE4_2__
    WHALE_BUILD_FEATURE(ISA_SSE42, 1);
#endif
#ifdef __POPCNT__
    WHALE_BUILD_FEATURE(ISA_POPCNT, 1);
#endif
#ifdef __AVX__
    WHALE_BUILD_FEATURE(ISA_AVX, 1);
#endif
#ifdef __AVX2__
    WHALE_BUILD_FEATURE(ISA_AVX2, 1);
#endif
#ifdef __FMA__
    WHALE_BUILD_FEATURE(ISA_FMA, 1);
#endif
#ifdef __F16C__
    WHALE_BUILD_FEATURE(ISA_F16C, 1);
#endif
#ifdef __BMI2__
    WHALE_BUILD_FEATURE(ISA_BMI2, 1);
#endif
#ifdef __AVX512F__
    WHALE_BUILD_FEATURE(ISA_AVX512F, 1);
#endif
#ifdef __AVX512BW__
    WHALE_BUILD_FEATURE(ISA_AVX512BW, 1);
#endif
#ifdef __AVX512VL__
    WHALE_BUILD_FEATURE(ISA_AVX512VL, 1);
#endif
#ifdef __AVX512DQ__
    WHALE_BUILD_FEATURE(ISA_AVX512DQ, 1);
#endif
#ifdef __AVX512CD__
    WHALE_BUILD_FEATURE(ISA_AVX512CD, 1);
#endif
#ifdef __AVX512VBMI__
    WHALE_BUILD_FEATURE(ISA_AVX512VBMI, 1);
#endif
#ifdef __AVX512VNNI__
    WHALE_BUILD_FEATURE(ISA_AVX512VNNI, 1);
#endif
#ifdef __AVX512BF16__
    WHALE_BUILD_FEATURE(ISA_AVX512BF16, 1);
#endif
#ifdef __AVX512FP16__
    WHALE_BUILD_FEATURE(ISA_AVX512FP16, 1);
#endif
#undef WHALE_BUILD_FEATURE
    return m;
}
