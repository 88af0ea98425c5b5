/* fp32 <-> bf16 / fp16 conversions (src/kernels/convert.c).
 *
 *  - the scalar conversions against an independent reference: the nearest
 *    of all finite values of the format (a sorted table, in double), ties to
 *    the even pattern, overflow past the midpoint above the largest value;
 *    every midpoint between neighbours, and one fp32 ulp either side;
 *  - exhaustive round trips over all 65536 bit patterns of both formats;
 *  - the vector forms bit-identical to the scalar ones on millions of
 *    random patterns, specials, ties, any length and alignment;
 *  - stochastic rounding: only the two neighbours, unbiased within 4 sigma
 *    over 10^6 draws, the documented hash, the same bits for any thread
 *    count or split into pieces.
 */
#include "core/core.h"
#include "kernels/convert.h"
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define RANDOM_VALUES (1 << 18) /* sanitized builds: keep it short */
#define SR_DRAWS 200000
#else
#define RANDOM_VALUES (1 << 22)
#define SR_DRAWS 1000000
#endif

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------ reference */

/* A format's finite non-negative values in pattern order (increasing):
 * fp16 0x0000..0x7bff, bf16 0x0000..0x7f7f, decoded independently of
 * convert.c; `inf` is the pattern of +inf. */
typedef struct {
    double *v;
    int count; /* finite patterns */
    uint16_t inf, sign, quiet;
    double next; /* the value where the pattern after the largest would be */
} format;

static void format_init(format *f, int is_f16) {
    const int man_bits = is_f16 ? 10 : 7, bias = is_f16 ? 15 : 127;
    f->count = is_f16 ? 0x7c00 : 0x7f80;
    f->inf = (uint16_t)f->count;
    f->sign = 0x8000;
    f->quiet = is_f16 ? 0x200 : 0x40;
    f->v = malloc(sizeof(double) * f->count);
    if (!f->v) exit(1);
    for (int h = 0; h < f->count; h++) {
        const int e = h >> man_bits, m = h & ((1 << man_bits) - 1);
        f->v[h] = e == 0 ? ldexp(m, 1 - bias - man_bits)
                         : ldexp(1.0 + ldexp(m, -man_bits), e - bias);
    }
    f->next = ldexp(1.0, (f->count >> man_bits) - bias); /* 65536, 2^128 */
}

/* Round x (not NaN) to the nearest value, ties to the even pattern. */
static uint16_t ref_round(const format *f, float x) {
    const uint16_t s = signbit(x) ? f->sign : 0;
    const double a = fabs((double)x);
    if (isinf(x)) return s | f->inf;
    int lo = 0, hi = f->count - 1; /* largest value <= a */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (f->v[mid] <= a) lo = mid;
        else hi = mid - 1;
    }
    const double below = f->v[lo], above = lo + 1 < f->count ? f->v[lo + 1] : f->next;
    const double d_lo = a - below, d_hi = above - a; /* exact: see format */
    int pick = d_lo < d_hi ? lo : d_lo > d_hi ? lo + 1 : (lo & 1 ? lo + 1 : lo);
    return s | (uint16_t)pick; /* pick == count is the inf pattern */
}

/* ------------------------------------------------------------ scalar */

static void check_scalar(const format *f, int is_f16, const char *name) {
    uint16_t (*to)(float) = is_f16 ? whale_float_to_f16 : whale_float_to_bf16;
    float (*from)(uint16_t) = is_f16 ? whale_f16_to_float : whale_bf16_to_float;
    /* all patterns: decode matches the table, round trip is the identity
     * (NaN: quieted, sign and payload kept) */
    int bad_decode = 0, bad_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float x = from((uint16_t)h);
        const uint16_t a = (uint16_t)(h & 0x7fff), back = to(x);
        if (a < f->count) bad_decode += (double)fabsf(x) != f->v[a] || !!signbit(x) != !!(h & 0x8000);
        else if (a == f->inf) bad_decode += !isinf(x) || !!signbit(x) != !!(h & 0x8000);
        else bad_decode += !isnan(x);
        const uint16_t want = a > f->inf ? (uint16_t)(h | f->quiet) : (uint16_t)h;
        bad_trip += back != want;
    }
    CHECK(bad_decode == 0, "%s: %d patterns decode wrongly", name, bad_decode);
    CHECK(bad_trip == 0, "%s: %d patterns do not survive a round trip", name, bad_trip);

    /* every midpoint between neighbours (exact in fp32) and one ulp either
     * side, both signs, against the reference */
    int bad = 0, checked = 0;
    for (int h = 0; h < f->count; h++) {
        const double above = h + 1 < f->count ? f->v[h + 1] : f->next;
        const float mid = (float)((f->v[h] + above) / 2);
        if ((double)mid != (f->v[h] + above) / 2) {
            bad++; /* cannot happen: 12 significant bits at most */
            continue;
        }
        const float xs[3] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 3; i++)
            for (int sg = 0; sg < 2; sg++) {
                const float x = sg ? -xs[i] : xs[i];
                bad += to(x) != ref_round(f, x);
                checked++;
            }
    }
    CHECK(bad == 0, "%s: %d of %d midpoints / neighbours rounded wrongly", name, bad, checked);

    /* random patterns: finite ones against the reference, NaN stays NaN */
    whale_rng r;
    whale_rng_seed(&r, is_f16 ? 11 : 12);
    bad = 0;
    for (int i = 0; i < RANDOM_VALUES / 4; i++) {
        uint32_t u = (uint32_t)whale_rng_u64(&r);
        if (is_f16 && (i & 1)) u = (u & 0x807fffffu) | ((0x66u + (u >> 24) % 0x2au) << 23); /* near range */
        const float x = from_bits(u);
        const uint16_t got = to(x);
        if (isnan(x)) bad += !isnan(from(got));
        else bad += got != ref_round(f, x);
    }
    CHECK(bad == 0, "%s: %d random values rounded wrongly", name, bad);
}

/* Hand-picked cases of the brief: overflow boundary, subnormals, ties. */
static void test_f16_cases(void) {
    static const struct {
        float x;
        uint16_t want;
    } c[] = {
        {65504.0f, 0x7bff},
        {65519.99f, 0x7bff}, /* 65519.9921875, just below the midpoint */
        {65520.0f, 0x7c00},  /* the midpoint: ties to even = inf */
        {-65520.0f, 0xfc00},
        {1e10f, 0x7c00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {0x1p-24f, 0x0001},                /* smallest subnormal */
        {0x1p-25f, 0x0000},                /* half of it: tie to even (0) */
        {0x1.000002p-25f, 0x0001},         /* just above half */
        {0x1.8p-24f, 0x0002},              /* 1.5 x smallest: tie to even (2) */
        {0x1.4p-23f, 0x0002},              /* 2.5 x smallest: tie to even (2) */
        {0x1p-14f - 0x1p-25f, 0x0400},     /* rounds up into the normals */
        {0x1.ff8p-15f, 0x03ff},            /* largest subnormal, exact */
        {-0.0f, 0x8000},
        {1.0f + 0x1p-11f, 0x3c00},         /* tie, even below */
        {1.0f + 0x3p-11f, 0x3c02},         /* tie, even above */
        {2049.0f, 0x6800},                 /* 2048 + 1: tie to 2048 */
        {2051.0f, 0x6802},                 /* tie to 2052 */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const uint16_t got = whale_float_to_f16(c[i].x);
        CHECK(got == c[i].want, "f16(%a) = 0x%04x, want 0x%04x", c[i].x, got, c[i].want);
        float y = c[i].x;
        whale_round_f16_inplace(&y, 1);
        CHECK(bits(y) == bits(whale_f16_to_float(c[i].want)), "round_f16(%a) = %a", c[i].x, y);
    }
    uint16_t h = whale_float_to_f16(NAN);
    CHECK((h & 0x7c00) == 0x7c00 && (h & 0x3ff), "f16(NaN) = 0x%04x", h);
    h = whale_float_to_f16(from_bits(0xff800001u)); /* signalling, negative */
    CHECK(h == 0xfe00, "f16(-sNaN 0xff800001) = 0x%04x, want 0xfe00 (quiet, sign kept)", h);
    /* the largest bf16 and the midpoint above it (bf16 has no subnormal
     * flush here) */
    CHECK(whale_float_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f, "bf16 just below the top midpoint");
    CHECK(whale_float_to_bf16(from_bits(0x7f7f8000u)) == 0x7f80, "bf16 top midpoint: inf");
    CHECK(whale_float_to_bf16(from_bits(0x00018000u)) == 0x0002, "bf16 subnormal tie");
}

/* ------------------------------------------------------------ vector == scalar */

/* Random fp32 patterns with the interesting ones over-represented. */
static float interesting(whale_rng *r) {
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                       0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu,
                                       0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x477fefffu,
                                       0x477ff000u, 0x477fe000u, 0x33000000u, 0x33800000u,
                                       0x38800000u, 0x387fffffu, 0x7f7f8000u, 0x3f808000u};
    const uint64_t x = whale_rng_u64(r);
    uint32_t u = (uint32_t)(x >> 32);
    switch (x % 8) {
    case 0: return from_bits(special[(x >> 8) % (sizeof special / sizeof special[0])]);
    case 1: u = (u & 0xffff0000u) | 0x8000u; break;                        /* bf16 tie */
    case 2: u = (u & 0xffffe000u) | 0x1000u; break;                        /* fp16 tie */
    case 3: u = (u & 0x807fffffu) | ((0x60u + (u >> 24) % 0x30) << 23); break; /* fp16 range */
    case 4: u &= 0x807fffffu; break;                                       /* fp32 subnormal */
    default: break;
    }
    return from_bits(u);
}

static void test_vector_equals_scalar(void) {
    const size_t n = RANDOM_VALUES;
    float *src = malloc(sizeof(float) * (n + 64)), *f = malloc(sizeof(float) * (n + 64));
    uint16_t *h = malloc(sizeof(uint16_t) * (n + 64)), *h16 = malloc(sizeof(uint16_t) * (n + 64));
    if (!src || !f || !h || !h16) exit(1);
    whale_rng r;
    whale_rng_seed(&r, 99);
    for (size_t i = 0; i < n + 64; i++) src[i] = interesting(&r);
    for (size_t i = 0; i < n + 64; i++) h16[i] = (uint16_t)whale_rng_u64(&r);

    int bad[6] = {0};
    /* whole array, then short lengths at odd offsets (tails, alignment) */
    for (int pass = 0; pass < 40; pass++) {
        const size_t off = pass == 0 ? 0 : (size_t)pass % 7, len = pass == 0 ? n : (size_t)pass * 3 - 1;
        const float *s = src + off;
        const uint16_t *hs = h16 + off;
        h[len] = 0xBEEF;
        f[len] = 777.0f;
        whale_f32_to_f16_rows(h, s, len);
        for (size_t i = 0; i < len; i++) bad[0] += h[i] != whale_float_to_f16(s[i]);
        bad[0] += h[len] != 0xBEEF;
        whale_round_f16_rows(f, s, len);
        for (size_t i = 0; i < len; i++)
            bad[1] += bits(f[i]) != bits(whale_f16_to_float(whale_float_to_f16(s[i])));
        whale_round_bf16_rows(f, s, len);
        for (size_t i = 0; i < len; i++)
            bad[2] += bits(f[i]) != bits(whale_bf16_to_float(whale_float_to_bf16(s[i])));
        bad[2] += f[len] != 777.0f;
        whale_f16_to_f32(f, hs, len);
        for (size_t i = 0; i < len; i++) bad[3] += bits(f[i]) != bits(whale_f16_to_float(hs[i]));
        whale_bf16_to_f32(f, hs, len);
        for (size_t i = 0; i < len; i++) bad[4] += bits(f[i]) != bits(whale_bf16_to_float(hs[i]));
        bad[4] += f[len] != 777.0f;
        /* in place */
        memcpy(f, s, sizeof(float) * len);
        whale_round_f16_inplace(f, len);
        for (size_t i = 0; i < len; i++)
            bad[5] += bits(f[i]) != bits(whale_f16_to_float(whale_float_to_f16(s[i])));
        memcpy(f, s, sizeof(float) * len);
        whale_round_bf16_inplace(f, len);
        for (size_t i = 0; i < len; i++)
            bad[5] += bits(f[i]) != bits(whale_bf16_to_float(whale_float_to_bf16(s[i])));
    }
    static const char *const names[] = {"f32_to_f16_rows", "round_f16_rows", "round_bf16_rows",
                                        "f16_to_f32", "bf16_to_f32", "round_*_inplace"};
    for (int i = 0; i < 6; i++)
        CHECK(bad[i] == 0, "%s: %d values differ from the scalar conversion", names[i], bad[i]);
    /* every fp16 pattern through the vector decoder (signalling NaNs keep
     * their payload, as in the scalar code) */
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    int bad_all = 0;
    float *all = malloc(sizeof(float) * 65536);
    if (!all) exit(1);
    whale_f16_to_f32(all, h, 65536);
    for (uint32_t i = 0; i < 65536; i++) bad_all += bits(all[i]) != bits(whale_f16_to_float((uint16_t)i));
    CHECK(bad_all == 0, "f16_to_f32 over all patterns: %d differ", bad_all);
    free(all);
    free(src);
    free(f);
    free(h);
    free(h16);
}

/* ------------------------------------------------------------ stochastic rounding */

/* The documented r_i: 16 bits of splitmix64 output (j / 4), j = counter + i. */
static uint32_t ref_sr_bits(uint64_t seed, uint64_t j) {
    uint64_t z = seed + (j / 4 + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (uint32_t)(z >> (16 * (j % 4))) & 0xffffu;
}

static void test_sr_scalar(void) {
    whale_rng r;
    whale_rng_seed(&r, 5);
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        const float x = interesting(&r);
        const uint32_t rnd = (uint32_t)whale_rng_u64(&r);
        const uint16_t got = whale_float_to_bf16_sr(x, rnd);
        const uint32_t u = bits(x);
        if (isnan(x)) {
            bad += !isnan(whale_bf16_to_float(got));
            continue;
        }
        const uint16_t down = (uint16_t)(u >> 16); /* truncation: toward zero */
        bad += got != down && got != (uint16_t)(down + 1);
        if ((u & 0xffffu) == 0) bad += got != down; /* exact values stay */
        if ((rnd & 0xffffu) == 0) bad += got != down;
        /* never inf from a finite value within bf16 range */
        if (isfinite(x) && fabsf(x) <= 0x1.fep127f) bad += isinf(whale_bf16_to_float(got));
    }
    CHECK(bad == 0, "whale_float_to_bf16_sr: %d wrong results", bad);
    const float bf16_max = from_bits(0x7f7f0000u);
    CHECK(whale_float_to_bf16_sr(bf16_max, 0xffff) == 0x7f7f, "bf16 max became %04x",
          whale_float_to_bf16_sr(bf16_max, 0xffff));
    CHECK(whale_float_to_bf16_sr(FLT_MAX, 0) == 0x7f7f, "FLT_MAX, r=0");
    CHECK(whale_float_to_bf16_sr(FLT_MAX, 0xffff) == 0x7f80, "FLT_MAX, r=0xffff: inf");
    CHECK(whale_float_to_bf16_sr(-INFINITY, 0xffff) == 0xff80, "-inf");
    CHECK(whale_float_to_bf16_sr(from_bits(0x7fffffffu), 0xffff) == 0x7fff, "NaN stays NaN");
    CHECK(whale_float_to_bf16_sr(-0.0f, 0xffff) == 0x8000, "-0");
}

/* Mean of SR(x) over many draws: within 4 sigma of x, only the two
 * neighbours. */
static void test_sr_unbiased(void) {
    static const float xs[] = {1.0f + 0x1p-9f, 0.1f, -3.14159265f, 1e-3f, 1e-40f, 65504.3f,
                               -7.0e30f, 1.0f + 0x1p-7f - 0x1p-20f};
    const size_t n = SR_DRAWS;
    float *v = malloc(sizeof(float) * n);
    if (!v) exit(1);
    for (size_t t = 0; t < sizeof xs / sizeof xs[0]; t++) {
        const float x = xs[t];
        for (size_t i = 0; i < n; i++) v[i] = x;
        whale_round_bf16_sr_inplace(v, n, 1234 + t, 777 * t);
        const double lo = whale_bf16_to_float((uint16_t)(bits(x) >> 16));
        const double hi = whale_bf16_to_float((uint16_t)((bits(x) >> 16) + 1));
        const double p = ((double)x - lo) / (hi - lo);
        double sum = 0;
        size_t others = 0;
        for (size_t i = 0; i < n; i++) {
            sum += v[i];
            others += (double)v[i] != lo && (double)v[i] != hi;
        }
        const double mean = sum / n, sigma = fabs(hi - lo) * sqrt(p * (1 - p) / n);
        CHECK(others == 0, "SR(%g): %zu results are neither neighbour", x, others);
        CHECK(fabs(mean - x) <= 4 * sigma, "SR(%g): mean %.10g off by %.2f sigma", x, mean,
              (mean - x) / sigma);
    }
    free(v);
}

/* The documented hash, any thread count, any split into pieces. */
static void test_sr_reproducible(void) {
    const size_t n = 300007; /* above the parallel threshold, odd */
    float *x = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n),
          *b = malloc(sizeof(float) * n);
    if (!x || !a || !b) exit(1);
    whale_rng r;
    whale_rng_seed(&r, 8);
    for (size_t i = 0; i < n; i++) x[i] = interesting(&r);
    const uint64_t seed = 0xfeedbeefull, counter = 1000003; /* not a multiple of 4 */
    const int threads = omp_get_max_threads();
    int bad = 0;
    for (int nt = 1; nt <= 4; nt++) {
        omp_set_num_threads(nt);
        memcpy(a, x, sizeof(float) * n);
        whale_round_bf16_sr_inplace(a, n, seed, counter);
        if (nt == 1) memcpy(b, a, sizeof(float) * n);
        else bad += memcmp(a, b, sizeof(float) * n) != 0;
    }
    omp_set_num_threads(threads);
    CHECK(bad == 0, "stochastic rounding depends on the thread count");
    int bad_ref = 0;
    for (size_t i = 0; i < n; i++) {
        const uint16_t want = whale_float_to_bf16_sr(x[i], ref_sr_bits(seed, counter + i));
        const float wf = whale_bf16_to_float(want);
        bad_ref += isnan(wf) ? !isnan(b[i]) : bits(b[i]) != bits(wf);
    }
    CHECK(bad_ref == 0, "stochastic rounding: %d values differ from the documented hash", bad_ref);
    /* in pieces with matching counters: the same bits */
    memcpy(a, x, sizeof(float) * n);
    const size_t cuts[] = {0, 1, 6, 37, 12345, 100001, n};
    for (size_t i = 0; i + 1 < sizeof cuts / sizeof cuts[0]; i++)
        whale_round_bf16_sr_inplace(a + cuts[i], cuts[i + 1] - cuts[i], seed, counter + cuts[i]);
    CHECK(!memcmp(a, b, sizeof(float) * n), "stochastic rounding in pieces differs");
    /* another seed or counter: different draws */
    memcpy(a, x, sizeof(float) * n);
    whale_round_bf16_sr_inplace(a, n, seed + 1, counter);
    CHECK(memcmp(a, b, sizeof(float) * n) != 0, "seed has no effect");
    whale_round_bf16_sr_inplace(a, 0, seed, counter); /* n = 0: nothing */
    free(x);
    free(a);
    free(b);
}

int main(void) {
    format f16, bf16;
    format_init(&f16, 1);
    format_init(&bf16, 0);
    check_scalar(&f16, 1, "fp16");
    check_scalar(&bf16, 0, "bf16");
    test_f16_cases();
    test_vector_equals_scalar();
    test_sr_scalar();
    test_sr_unbiased();
    test_sr_reproducible();
    free(f16.v);
    free(bf16.v);
    return test_finish("test_convert");
}
