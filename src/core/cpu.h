/* Instruction tiers: what the processor offers, what the kernels may use,
 * and how a kernel is compiled for a tier above the build's baseline.
 *
 * A kernel written for a tier sits between WHALE_TARGET_BEGIN(tier's
 * features) and WHALE_TARGET_END: the compiler adds those features to the
 * functions of that region (GCC's target pragma, clang's attribute
 * pragma), so a binary built for the baseline carries every tier's
 * kernels. The code that calls one checks whale_isa_at_least first and
 * never calls a region above the active tier. The rest of the code is
 * compiled for the build's -march: a native build's plain C may use the
 * build machine's instructions whatever the tier (the portable build,
 * -DWHALE_NATIVE=OFF, is the one that runs on a lesser processor). */
#ifndef WHALE_CORE_CPU_H
#define WHALE_CORE_CPU_H

#include "whale.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define WHALE_X86 1
#else
#define WHALE_X86 0
#endif

/* The features of the tiers' regions (GCC target strings). */
#define WHALE_FEATURES_AVX2 "avx2,fma,f16c,bmi,bmi2,popcnt"
#define WHALE_FEATURES_AVX512 WHALE_FEATURES_AVX2 ",avx512f,avx512bw,avx512vl,avx512dq,avx512cd"
#define WHALE_FEATURES_AVX512_BF16 WHALE_FEATURES_AVX512 ",avx512bf16"
/* VBMI (vpermi2b) is not part of a tier: Cooper Lake has AVX512_BF16
 * without it. The one kernel that needs it checks whale_cpu_has_vbmi(). */
#define WHALE_FEATURES_AVX512_BF16_VBMI WHALE_FEATURES_AVX512_BF16 ",avx512vbmi"
/* AVX512_VNNI (vpdpbusd) is not part of a tier either: Skylake-X has
 * AVX-512 without it. The int8-activation kernel checks whale_cpu_has_vnni(). */
#define WHALE_FEATURES_AVX512_VNNI WHALE_FEATURES_AVX512 ",avx512vnni"

#define WHALE_PRAGMA_(x) _Pragma(#x)
#if WHALE_X86 && defined(__clang__)
#define WHALE_TARGET_BEGIN(features)                                                               \
    WHALE_PRAGMA_(clang attribute push(__attribute__((target(features))), apply_to = function))
#define WHALE_TARGET_END _Pragma("clang attribute pop")
#elif WHALE_X86
#define WHALE_TARGET_BEGIN(features) _Pragma("GCC push_options") WHALE_PRAGMA_(GCC target(features))
#define WHALE_TARGET_END _Pragma("GCC pop_options")
#else
#define WHALE_TARGET_BEGIN(features)
#define WHALE_TARGET_END
#endif

/* Is the active tier at least t? One load and compare: cheap enough for
 * the entry of every kernel. */
extern int whale_isa_level_;
static inline int whale_isa_at_least(whale_isa t) {
    int level = __atomic_load_n(&whale_isa_level_, __ATOMIC_ACQUIRE);
    if (level < 0) level = (int)whale_isa_active();
    return level >= (int)t;
}

/* Does the processor have AVX512_VBMI (with AVX-512 usable)? Detected
 * with the tier; not capped by WHALE_ISA, so callers also check the tier. */
int whale_cpu_has_vbmi(void);
/* The same for AVX512_VNNI. */
int whale_cpu_has_vnni(void);
/* Does the processor's vdpbf16ps (AVX512_BF16) do more multiply-adds a
 * cycle than its fp32 FMAs? AMD's Zen 4 and 5 issue it at the FMA's rate,
 * twice the multiply-adds; Intel's cores without AMX at under half the
 * FMA's multiply-adds (Sapphire Rapids class, a loop of independent ones:
 * 1.1 G vdpbf16ps a second against 5.2 G vfmadd231ps, 35 against 83 G
 * multiply-adds). Yes on AMD processors with AVX512_BF16, no elsewhere
 * (a vendor rule, not a timing, so a machine always computes the same
 * sums). Not capped by WHALE_ISA, so callers also check the tier. */
int whale_cpu_bf16_dot_fast(void);

/* Bytes of one core's L2 cache (sysconf, else sysfs, else 256 KiB): what
 * blocks meant to stay in cache are sized by. */
size_t whale_cpu_l2_bytes(void);

#endif
