/* The whale program's processor check (src/cli/isa_check.c): the first
 * extension a build needs and a processor lacks is named, in the table's
 * order; what this build uses matches the compiler's own feature macros;
 * and this processor has all of it (else this very test would have ended
 * in the check's message, status 6). */
#include "testutil.h"

#include "cli/isa_check.h"

#include <string.h>

#define BIT(b) (1u << (b))

static void test_missing(void) {
    CHECK(whale_isa_missing(0, 0) == NULL, "nothing needed, nothing missing");
    CHECK(whale_isa_missing(BIT(ISA_AVX2), ~0u) == NULL, "all there");
    const char *m = whale_isa_missing(BIT(ISA_AVX2) | BIT(ISA_AVX512BF16), BIT(ISA_AVX2));
    CHECK(m && !strcmp(m, "avx512bf16"), "missing %s, want avx512bf16", m ? m : "(none)");
    m = whale_isa_missing(BIT(ISA_SSE42) | BIT(ISA_POPCNT), BIT(ISA_POPCNT));
    CHECK(m && !strcmp(m, "sse4.2"), "an x86-64-v1 processor under the portable build lacks %s", m ? m : "(none)");
    m = whale_isa_missing(~0u >> (32 - ISA_COUNT), 0);
    CHECK(m && !strcmp(m, "sse4.2"), "the first in the table's order: %s", m ? m : "(none)");
    m = whale_isa_missing(BIT(ISA_AVX512FP16), BIT(ISA_AVX512FP16) - 1);
    CHECK(m && !strcmp(m, "avx512fp16"), "the last name: %s", m ? m : "(none)");
}

/* Each bit the build claims, against the macro of the flags this file is
 * compiled with (the same as the program's). */
static void test_build(void) {
    const unsigned b = whale_build_isa();
    static const struct {
        int bit, macro;
    } want[] = {
#ifdef __SSE4_2__
        {ISA_SSE42, 1},
#else
        {ISA_SSE42, 0},
#endif
#ifdef __AVX2__
        {ISA_AVX2, 1},
#else
        {ISA_AVX2, 0},
#endif
#ifdef __AVX512F__
        {ISA_AVX512F, 1},
#else
        {ISA_AVX512F, 0},
#endif
#ifdef __AVX512BF16__
        {ISA_AVX512BF16, 1},
#else
        {ISA_AVX512BF16, 0},
#endif
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(!!(b & BIT(want[i].bit)) == want[i].macro, "bit %d of the build's mask is %d, the macro says %d",
              want[i].bit, !!(b & BIT(want[i].bit)), want[i].macro);
    const char *m = whale_isa_missing(b, whale_cpu_isa());
    CHECK(m == NULL, "this processor lacks %s, which this build uses", m ? m : "");
}

int main(void) {
    test_missing();
    test_build();
    return test_finish("test_isa_check");
}
