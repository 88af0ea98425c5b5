/* cli/isa_check.h. This file is compiled for plain x86-64 (see
 * CMakeLists.txt), so the check itself runs on any x86-64 processor. */
#include "isa_check.h"

#include <string.h>
#include <unistd.h>

static const char *const isa_names[ISA_COUNT] = {
    "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw",
    "avx512vl", "avx512dq", "avx512cd", "avx512vbmi", "avx512vnni", "avx512bf16", "avx512fp16",
};

unsigned whale_cpu_isa(void) {
    unsigned m = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    /* __builtin_cpu_supports takes a literal */
#define HAS(bit, name) (void)(m |= __builtin_cpu_supports(name) ? 1u << (bit) : 0u)
    HAS(ISA_SSE42, "sse4.2");
    HAS(ISA_POPCNT, "popcnt");
    HAS(ISA_AVX, "avx");
    HAS(ISA_AVX2, "avx2");
    HAS(ISA_FMA, "fma");
    HAS(ISA_F16C, "f16c");
    HAS(ISA_BMI2, "bmi2");
    HAS(ISA_AVX512F, "avx512f");
    HAS(ISA_AVX512BW, "avx512bw");
    HAS(ISA_AVX512VL, "avx512vl");
    HAS(ISA_AVX512DQ, "avx512dq");
    HAS(ISA_AVX512CD, "avx512cd");
    HAS(ISA_AVX512VBMI, "avx512vbmi");
    HAS(ISA_AVX512VNNI, "avx512vnni");
    HAS(ISA_AVX512BF16, "avx512bf16");
    HAS(ISA_AVX512FP16, "avx512fp16");
#undef HAS
#else
    m = ~0u;
#endif
    return m;
}

const char *whale_isa_missing(unsigned need, unsigned have) {
    for (int b = 0; b < ISA_COUNT; b++)
        if ((need >> b & 1) && !(have >> b & 1)) return isa_names[b];
    return NULL;
}

static void say(const char *s) {
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

/* First of the program's own constructors. Only write(2) and _exit: the C
 * library is built for any x86-64, this program's other code is not. */
__attribute__((constructor(101))) static void isa_check(void) {
    const char *lacks = whale_isa_missing(whale_build_isa(), whale_cpu_isa());
    if (!lacks) return;
    say("whale: this build uses the processor extension ");
    say(lacks);
    say(", which this processor lacks: build whale on this machine, or build the portable binary "
        "(cmake -DWHALE_NATIVE=OFF)\n");
    _exit(6);
}
