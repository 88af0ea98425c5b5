/* Processor detection and the active instruction tier (core/cpu.h). */
#include "core/cpu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#if WHALE_X86
#include <cpuid.h>
#include <sys/syscall.h>
#endif

static const char *const isa_names[WHALE_ISA_COUNT] = {"base", "avx2", "avx512", "avx512_bf16",
                                                       "amx"};

int whale_isa_level_ = -1;

static struct {
    pthread_once_t once;
    whale_isa detected, active;
    char bad_env[64]; /* a WHALE_ISA value that names no tier, or "" */
    char model[64];
    char extras[64];
    int vbmi;
    int vnni;
    int bf16_dot_fast; /* vdpbf16ps outpaces the fp32 FMAs (whale_cpu_bf16_dot_fast) */
    size_t l2;  /* bytes of one core's L2 cache */
    size_t llc; /* bytes of the last-level (L3) cache, 0 unknown */
} cpu = {PTHREAD_ONCE_INIT, WHALE_ISA_BASE, WHALE_ISA_BASE, "", "", "", 0, 0, 0, 0, 0};

const char *whale_isa_name(whale_isa t) {
    return (unsigned)t < WHALE_ISA_COUNT ? isa_names[t] : "unknown";
}

#if WHALE_X86

typedef struct {
    uint32_t a, b, c, d;
} regs;

static regs cpuid(uint32_t leaf, uint32_t sub) {
    regs r = {0, 0, 0, 0};
    if (leaf <= (uint32_t)__get_cpuid_max(leaf & 0x80000000u, NULL)) __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
    return r;
}

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

#define BIT(x, n) (((x) >> (n)) & 1u)

/* Linux hands AMX tile state to a process only when it asks
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18). */
static int amx_permitted(void) {
#ifdef SYS_arch_prctl
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#else
    return 0;
#endif
}

static void read_model(void) {
    uint32_t words[12];
    if ((uint32_t)__get_cpuid_max(0x80000000u, NULL) < 0x80000004u) return;
    for (uint32_t i = 0; i < 3; i++) {
        regs r = cpuid(0x80000002u + i, 0);
        words[4 * i] = r.a, words[4 * i + 1] = r.b, words[4 * i + 2] = r.c, words[4 * i + 3] = r.d;
    }
    char s[49];
    memcpy(s, words, 48);
    s[48] = 0;
    const char *p = s;
    while (*p == ' ') p++;
    snprintf(cpu.model, sizeof cpu.model, "%s", p);
    for (size_t n = strlen(cpu.model); n && cpu.model[n - 1] == ' '; n--) cpu.model[n - 1] = 0;
}

static whale_isa detect(void) {
    read_model();
    const regs l1 = cpuid(1, 0), l7 = cpuid(7, 0), l71 = cpuid(7, 1);
    const int osxsave = BIT(l1.c, 27);
    const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const int ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6, tiles = (xcr0 & 0x60000) == 0x60000;
    const int sse42 = BIT(l1.c, 20) && BIT(l1.c, 23); /* SSE4.2, POPCNT */
    const int avx2 = ymm && BIT(l1.c, 28) && BIT(l1.c, 12) && BIT(l1.c, 29) && BIT(l7.b, 5) &&
                     BIT(l7.b, 3) && BIT(l7.b, 8); /* AVX FMA F16C AVX2 BMI1 BMI2 */
    const int avx512 = zmm && BIT(l7.b, 16) && BIT(l7.b, 30) && BIT(l7.b, 31) && BIT(l7.b, 17) &&
                       BIT(l7.b, 28); /* F BW VL DQ CD */
    const int bf16 = BIT(l71.a, 5); /* AVX512_BF16 */
    const regs l0 = cpuid(0, 0); /* vendor: "Auth" "enti" "cAMD" in EBX, EDX, ECX */
    cpu.bf16_dot_fast = bf16 && l0.b == 0x68747541u && l0.d == 0x69746e65u && l0.c == 0x444d4163u;
    cpu.vbmi = avx512 && BIT(l7.c, 1);
    cpu.vnni = avx512 && BIT(l7.c, 11); /* AVX512_VNNI */
    const int fp16 = zmm && BIT(l7.d, 23);
    const int amx_bf16 = BIT(l7.d, 22), amx_tile = BIT(l7.d, 24), amx_int8 = BIT(l7.d, 25);
    const int amx = tiles && amx_tile && amx_bf16 && amx_int8 && amx_permitted();
    snprintf(cpu.extras, sizeof cpu.extras, "%s%s", fp16 ? "avx512_fp16 " : "", amx ? "amx_int8 " : "");
    size_t n = strlen(cpu.extras);
    if (n) cpu.extras[n - 1] = 0;
    (void)sse42;
    if (!avx2) return WHALE_ISA_BASE;
    if (!avx512) return WHALE_ISA_AVX2;
    if (!bf16) return WHALE_ISA_AVX512;
    return amx ? WHALE_ISA_AMX : WHALE_ISA_AVX512_BF16;
}

#else

static whale_isa detect(void) { return WHALE_ISA_BASE; }

#endif

/* A cache's bytes as the C library reports them (name: its sysconf key),
 * else as Linux's sysfs does (index: cpu0's cache/indexN, "1024K"), else
 * 0. */
static size_t cache_bytes(int name, int index) {
    long v = name >= 0 ? sysconf(name) : -1;
    if (v > 0) return (size_t)v;
    char path[64];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
    FILE *f = fopen(path, "r");
    char unit = 0;
    if (f) {
        if (fscanf(f, "%ld%c", &v, &unit) < 1) v = -1;
        fclose(f);
    }
    if (v > 0 && v < (1L << 30)) return (size_t)v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
    return 0;
}

#ifndef _SC_LEVEL2_CACHE_SIZE
#define _SC_LEVEL2_CACHE_SIZE (-1)
#endif
#ifndef _SC_LEVEL3_CACHE_SIZE
#define _SC_LEVEL3_CACHE_SIZE (-1)
#endif

/* One core's L2 cache, else 256 KiB, the smallest of x86-64 processors
 * with AVX2 (a block sized to it still fits a larger cache). */
static size_t l2_bytes(void) {
    const size_t v = cache_bytes(_SC_LEVEL2_CACHE_SIZE, 2);
    return v ? v : (size_t)256 << 10;
}

static void init_once(void) {
    cpu.l2 = l2_bytes();
    cpu.llc = cache_bytes(_SC_LEVEL3_CACHE_SIZE, 3);
    cpu.detected = detect();
    cpu.active = cpu.detected;
    const char *env = getenv("WHALE_ISA");
    if (env && *env) {
        int t = 0;
        while (t < WHALE_ISA_COUNT && strcmp(env, isa_names[t])) t++;
        if (t == WHALE_ISA_COUNT) snprintf(cpu.bad_env, sizeof cpu.bad_env, "%s", env);
        else if ((whale_isa)t < cpu.detected) cpu.active = (whale_isa)t;
    }
    __atomic_store_n(&whale_isa_level_, (int)cpu.active, __ATOMIC_RELEASE);
}

whale_code whale_isa_init(whale_err *err) {
    pthread_once(&cpu.once, init_once);
    if (cpu.bad_env[0])
        return whale_errf(err, WHALE_ERR_ARG,
                          "WHALE_ISA=%.40s names no instruction tier (base, avx2, avx512, avx512_bf16, amx)",
                          cpu.bad_env);
    return WHALE_OK;
}

whale_isa whale_isa_active(void) {
    pthread_once(&cpu.once, init_once);
    return cpu.active;
}

whale_isa whale_isa_detected(void) {
    pthread_once(&cpu.once, init_once);
    return cpu.detected;
}

const char *whale_cpu_model(void) {
    pthread_once(&cpu.once, init_once);
    return cpu.model[0] ? cpu.model : "unknown processor";
}

int whale_cpu_has_vbmi(void) {
    (void)whale_isa_active();
    return cpu.vbmi;
}

int whale_cpu_bf16_dot_fast(void) {
    (void)whale_isa_active();
    return cpu.bf16_dot_fast;
}

int whale_cpu_has_vnni(void) {
    (void)whale_isa_active();
    return cpu.vnni;
}

size_t whale_cpu_l2_bytes(void) {
    pthread_once(&cpu.once, init_once);
    return cpu.l2;
}

size_t whale_cpu_llc_bytes(void) {
    pthread_once(&cpu.once, init_once);
    return cpu.llc;
}

const char *whale_cpu_extras(void) {
    pthread_once(&cpu.once, init_once);
    return cpu.extras;
}
