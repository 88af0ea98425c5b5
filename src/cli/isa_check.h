/* The whale program's check, before any of its code that is compiled for
 * the build's processor runs, that this processor has every extension the
 * build may use: a binary built with -march=native on another machine, or
 * the portable one (x86-64-v2) on an older processor, says so in one line
 * (exit status 6) instead of dying of SIGILL somewhere later. */
#ifndef WHALE_CLI_ISA_CHECK_H
#define WHALE_CLI_ISA_CHECK_H

enum {
    ISA_SSE42, ISA_POPCNT, ISA_AVX, ISA_AVX2, ISA_FMA, ISA_F16C, ISA_BMI2, ISA_AVX512F, ISA_AVX512BW,
    ISA_AVX512VL, ISA_AVX512DQ, ISA_AVX512CD, ISA_AVX512VBMI, ISA_AVX512VNNI, ISA_AVX512BF16, ISA_AVX512FP16,
    ISA_COUNT
};

/* The extensions the build's code may use (bits 1 << ISA_*). */
unsigned whale_build_isa(void);

/* The extensions of this processor among them (cpuid, via the compiler's
 * __builtin_cpu_supports), as the same bits. */
unsigned whale_cpu_isa(void);

/* The name of the first extension in `need` that `have` lacks, or NULL. */
const char *whale_isa_missing(unsigned need, unsigned have);

#endif
