/* Token sampler: greedy and tie rules, reproducibility, top-k / top-p /
 * min-p sets and boundaries, repetition penalty, empirical frequencies,
 * non-finite logits, parameter validation. */
#include "core/core.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

#define MAXV 8

static whale_sampler *make(whale_sampler_params p, int vocab) {
    whale_sampler *s = NULL;
    whale_err err = {0};
    whale_code rc = whale_sampler_new(&p, vocab, &s, &err);
    CHECK(rc == WHALE_OK && s, "whale_sampler_new failed: %s", err.msg);
    return s;
}

/* One draw from a copy of logits (the sampler may modify its input). */
static int32_t sample_copy(whale_sampler *s, const float *logits, int vocab, float *scratch) {
    memcpy(scratch, logits, (size_t)vocab * sizeof *scratch);
    return whale_sample(s, scratch, NULL, 0);
}

/* Draw n tokens; counts[vocab] gets the histogram, *bad the out-of-range draws. */
static void histogram(whale_sampler *s, const float *logits, int vocab, int n, long *counts,
                      long *bad) {
    float *scratch = malloc((size_t)vocab * sizeof *scratch);
    memset(counts, 0, (size_t)vocab * sizeof *counts);
    *bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t id = sample_copy(s, logits, vocab, scratch);
        if (id < 0 || id >= vocab)
            (*bad)++;
        else
            counts[id]++;
    }
    free(scratch);
}

/* Bitmask of the ids that appear in a small-vocab histogram. */
static unsigned drawn_set(whale_sampler_params p, const float *logits, int vocab, int n) {
    whale_sampler *s = make(p, vocab);
    long counts[MAXV], bad;
    histogram(s, logits, vocab, n, counts, &bad);
    CHECK(bad == 0, "%ld invalid draws", bad);
    unsigned set = 0;
    for (int i = 0; i < vocab; i++)
        if (counts[i]) set |= 1u << i;
    whale_sampler_free(s);
    return set;
}

static void log_probs(const double *probs, float *logits, int n) {
    for (int i = 0; i < n; i++) logits[i] = (float)log(probs[i]);
}

static void test_defaults(void) {
    whale_sampler_params p = whale_sampler_defaults();
    CHECK(p.temperature == 1.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f &&
              p.repeat_penalty == 1.0f && p.repeat_last_n == -1 && p.seed == 0,
          "unexpected defaults");
    whale_sampler_free(NULL);
}

static void test_greedy(void) {
    whale_sampler_params p = whale_sampler_defaults();
    p.temperature = 0;
    whale_sampler *s = make(p, 5);
    float a[5] = {1, 3, 2, 3, -1};
    CHECK(whale_sample(s, a, NULL, 0) == 1, "greedy must pick the lowest id of a tie");
    float b[5] = {NAN, 0.5f, NAN, 0.25f, -INFINITY};
    CHECK(whale_sample(s, b, NULL, 0) == 1, "greedy must skip NaN");
    float c[5] = {-INFINITY, -INFINITY, 7, INFINITY, INFINITY};
    CHECK(whale_sample(s, c, NULL, 0) == 3, "greedy: +inf wins, lowest id of the tie");
    float d[5] = {NAN, -INFINITY, NAN, -INFINITY, NAN};
    CHECK(whale_sample(s, d, NULL, 0) == -1, "greedy with no finite logit must return -1");
    float e[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -3e38f};
    CHECK(whale_sample(s, e, NULL, 0) == 4, "greedy must see a very negative finite logit");
    whale_sampler_free(s);
}

/* Greedy over vocabularies long enough for the lanes: a plain first-maximum
 * scan decides, with values drawn from a few levels (ties within a lane and
 * across lanes), NaN and -inf sprinkled, sometimes +inf, and lengths that
 * leave a tail. */
static void test_greedy_long(void) {
    whale_sampler_params p = whale_sampler_defaults();
    p.temperature = 0;
    const float levels[6] = {-INFINITY, NAN, -1.0f, 0.5f, 2.0f, INFINITY};
    uint64_t r = 12345;
    int wrong = 0, runs = 0;
    for (int n = 1; n <= 300; n += 7)
        for (int rep = 0; rep < 40; rep++, runs++) {
            float x[300];
            int top = rep % 3 == 0 ? 6 : 5; /* +inf in a third of the runs */
            for (int i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = levels[(r >> 33) % (uint64_t)top];
            }
            int32_t want = -1;
            float best = -INFINITY;
            for (int i = 0; i < n; i++)
                if (x[i] > best) best = x[i], want = i;
            whale_sampler *s = make(p, n);
            if (whale_sample(s, x, NULL, 0) != want) wrong++;
            whale_sampler_free(s);
        }
    CHECK(wrong == 0, "greedy differed from a first-maximum scan in %d of %d vocabularies", wrong, runs);
}

static void test_seeds(void) {
    enum { V = 8, N = 500 };
    float logits[V] = {0.1f, 0.2f, 0.0f, -0.1f, 0.3f, 0.05f, -0.2f, 0.15f};
    float scratch[V];
    whale_sampler_params p = whale_sampler_defaults();
    p.seed = 1234;
    whale_sampler *a = make(p, V), *b = make(p, V);
    p.seed = 1235;
    whale_sampler *c = make(p, V);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < N; i++) {
        int32_t x = sample_copy(a, logits, V, scratch);
        int32_t y = sample_copy(b, logits, V, scratch);
        int32_t z = sample_copy(c, logits, V, scratch);
        if (x != y) same_ab = 0;
        if (x != z) same_ac = 0;
    }
    CHECK(same_ab, "same seed must give the same sequence");
    CHECK(!same_ac, "different seeds must give different sequences");
    whale_sampler_free(a);
    whale_sampler_free(b);
    whale_sampler_free(c);
}

static void test_top_k_one_is_greedy(void) {
    enum { V = 300 };
    float logits[V], scratch[V];
    whale_rng r;
    whale_rng_seed(&r, 7);
    whale_sampler_params p = whale_sampler_defaults();
    p.top_k = 1;
    p.temperature = 2.0f;
    whale_sampler *s = make(p, V);
    p.temperature = 0;
    whale_sampler *g = make(p, V);
    int mismatches = 0;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < V; i++) logits[i] = (float)whale_rng_normal(&r);
        int32_t want = sample_copy(g, logits, V, scratch);
        if (sample_copy(s, logits, V, scratch) != want) mismatches++;
    }
    CHECK(mismatches == 0, "top_k=1 differed from greedy %d times", mismatches);
    whale_sampler_free(s);
    whale_sampler_free(g);
}

static void test_top_k(void) {
    /* Random logits: only the k best ids are ever drawn, and all of them are. */
    enum { V = 1000, K = 5, N = 20000 };
    static float logits[V];
    static long counts[V];
    whale_rng r;
    whale_rng_seed(&r, 11);
    for (int i = 0; i < V; i++) logits[i] = (float)(0.3 * whale_rng_normal(&r));
    int best[K];
    for (int j = 0; j < K; j++) { /* K passes of argmax, excluding those found */
        best[j] = -1;
        for (int i = 0; i < V; i++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= best[q] == i;
            if (!taken && (best[j] < 0 || logits[i] > logits[best[j]])) best[j] = i;
        }
    }
    whale_sampler_params p = whale_sampler_defaults();
    p.top_k = K;
    p.seed = 3;
    whale_sampler *s = make(p, V);
    long bad;
    histogram(s, logits, V, N, counts, &bad);
    long inside = 0;
    int all_seen = 1;
    for (int j = 0; j < K; j++) {
        inside += counts[best[j]];
        if (!counts[best[j]]) all_seen = 0;
    }
    CHECK(bad == 0 && inside == N, "top_k=%d drew %ld of %d outside the top ids", K, N - inside, N);
    CHECK(all_seen, "every one of the top %d ids should be drawn", K);
    whale_sampler_free(s);

    /* Ties at the boundary: every logit equal to the k-th largest stays. */
    float tie[5] = {3, 2, 2, 1, 0};
    p.top_k = 2;
    CHECK(drawn_set(p, tie, 5, 4000) == 0x7, "top_k=2 with a tie at the boundary keeps {0,1,2}");
    p.top_k = 1;
    float top_tie[5] = {0, 5, 1, 5, 5};
    CHECK(drawn_set(p, top_tie, 5, 4000) == 0x1a, "top_k=1 with a tie at the top keeps all tied");
    p.top_k = 100; /* larger than the vocabulary: off */
    CHECK(drawn_set(p, tie, 5, 20000) == 0x1f, "top_k > vocab keeps everything");
}

static void test_top_p(void) {
    const double probs[4] = {0.5, 0.3, 0.15, 0.05};
    float logits[4];
    log_probs(probs, logits, 4);
    whale_sampler_params p = whale_sampler_defaults();
    struct {
        float top_p;
        unsigned want;
    } cases[] = {
        {0.8f, 0x3},            /* {0,1} has mass exactly 0.8: enough */
        {0.8f - 1e-4f, 0x3},
        {0.8f + 1e-4f, 0x7},    /* just above: the next token is needed */
        {0.5f, 0x1},            /* the top token alone reaches 0.5 */
        {0.5f + 1e-4f, 0x3},
        {0.95f, 0x7},           /* exact boundary again: 0.5+0.3+0.15 */
        {0.96f, 0xf},
        {1e-6f, 0x1},           /* tiny top_p still keeps the top token */
        {1.0f, 0xf},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p.top_p = cases[i].top_p;
        p.seed = i;
        unsigned got = drawn_set(p, logits, 4, 20000);
        CHECK(got == cases[i].want, "top_p=%.7g kept set 0x%x, want 0x%x", (double)p.top_p, got,
              cases[i].want);
    }

    /* Tied probabilities are kept or dropped together. */
    float flat[4] = {0, 0, 0, 0};
    p.top_p = 0.1f;
    CHECK(drawn_set(p, flat, 4, 4000) == 0xf, "top_p with all logits tied keeps all of them");
    /* p ~ 0.757, 0.103, 0.103, 0.038: the 0.8 boundary falls inside the tie.
     * (A stable ascending sort would drop id 1 and keep id 2.) */
    float tail_tie[4] = {2, 0, 0, -1};
    p.top_p = 0.8f;
    CHECK(drawn_set(p, tail_tie, 4, 20000) == 0x7, "top_p keeps both tokens of a boundary tie");

    /* Temperature is applied before top-p: at T=0.5 the probabilities become
     * 0.25,0.09,0.0225,0.0025 (/0.365), so 0.9 needs only the top two
     * (at T=1 it needs three). */
    p.top_p = 0.9f;
    p.temperature = 0.5f;
    CHECK(drawn_set(p, logits, 4, 20000) == 0x3, "temperature must be applied before top-p");
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Sample n tokens with top_p from logits[V] and compare with a naive
 * reference: sort, then keep each tier of equal logits while the mass
 * strictly above it is < top_p (for distinct logits this is HF's ascending
 * cumsum rule). Draws must stay inside the kept set with the renormalised
 * frequencies (Pearson chi-square), and every likely token must appear. */
static void check_top_p_reference(const char *label, const float *logits, int V, float top_p,
                                  int n, uint64_t seed) {
    float *sorted = malloc((size_t)V * sizeof *sorted);
    long *counts = malloc((size_t)V * sizeof *counts);
    memcpy(sorted, logits, (size_t)V * sizeof *sorted);
    qsort(sorted, (size_t)V, sizeof *sorted, cmp_desc);
    double top = sorted[0], total = 0;
    for (int i = 0; i < V; i++) total += exp(sorted[i] - top);
    double above = 0, min_gap = 1;
    float cut = sorted[0]; /* smallest kept logit */
    for (int i = 0; i < V;) {
        int j = i;
        double tier = 0;
        for (; j < V && sorted[j] == sorted[i]; j++) tier += exp(sorted[j] - top);
        double gap = fabs(above / total - top_p);
        if (gap < min_gap) min_gap = gap;
        if (above / total < top_p) cut = sorted[i];
        above += tier;
        i = j;
    }
    CHECK(min_gap > 1e-5, "%s: distribution too close to the top-p boundary (%g)", label, min_gap);

    double kept_mass = 0, min_expected = 1e300;
    int n_kept = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] >= cut) {
            kept_mass += exp(logits[i] - top);
            n_kept++;
        }
    whale_sampler_params p = whale_sampler_defaults();
    p.top_p = top_p;
    p.seed = seed;
    whale_sampler *s = make(p, V);
    long bad;
    histogram(s, logits, V, n, counts, &bad);
    long outside = 0;
    int missing = 0;
    double chi2 = 0;
    for (int i = 0; i < V; i++) {
        if (logits[i] < cut) {
            outside += counts[i];
            continue;
        }
        double e = n * exp(logits[i] - top) / kept_mass;
        if (e < min_expected) min_expected = e;
        if (e >= 20 && counts[i] == 0) missing++; /* P(miss) <= e^-20 each */
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    int df = n_kept - 1;
    CHECK(bad == 0 && outside == 0, "%s: %ld draws outside the reference set", label, outside + bad);
    CHECK(missing == 0, "%s: %d likely tokens never drawn", label, missing);
    /* Far in the tail of chi-square(df): mean df, sd sqrt(2 df). */
    CHECK(chi2 < df + 6 * sqrt(2.0 * df) + 10, "%s: chi2 %.1f for %d kept tokens", label, chi2,
          n_kept);
    printf("top_p %s: %d of %d ids kept, chi2 %.1f (df %d), min expected count %.0f\n", label,
           n_kept, V, chi2, df, min_expected);
    whale_sampler_free(s);
    free(sorted);
    free(counts);
}

/* Larger vocabularies, shuffled so ids do not follow the order. */
static void test_top_p_large(void) {
    enum { V = 3000 };
    static float logits[V];
    whale_rng r;
    whale_rng_seed(&r, 99);
    /* Geometric (ratio ~0.86), distinct: about 16 tokens make 0.9. */
    for (int i = 0; i < V; i++) logits[i] = (float)(-0.15 * i + 0.01 * whale_rng_normal(&r));
    for (int i = V - 1; i > 0; i--) {
        int j = (int)(whale_rng_u64(&r) % (uint64_t)(i + 1));
        float t = logits[i];
        logits[i] = logits[j];
        logits[j] = t;
    }
    check_top_p_reference("geometric", logits, V, 0.9f, 60000, 5);
    /* Dense with many ties (logits on a 0.01 grid): the crossing point falls
     * among many near-equal tokens, and ties straddle it. */
    for (int i = 0; i < V; i++) logits[i] = (float)(round(100 * 0.3 * whale_rng_normal(&r)) / 100);
    check_top_p_reference("dense ties", logits, V, 0.6f, 100000, 6);
}

static void test_min_p(void) {
    /* p / p_max = 1, 0.5, 0.2, 0.1 */
    const double probs[4] = {0.5, 0.25, 0.1, 0.05};
    float logits[4];
    log_probs(probs, logits, 4);
    whale_sampler_params p = whale_sampler_defaults();
    p.min_p = 0.2f; /* the ratio equal to min_p is kept */
    CHECK(drawn_set(p, logits, 4, 20000) == 0x7, "min_p=0.2 keeps {0,1,2}");
    p.min_p = 0.21f;
    CHECK(drawn_set(p, logits, 4, 20000) == 0x3, "min_p=0.21 keeps {0,1}");
    p.min_p = 0.05f;
    CHECK(drawn_set(p, logits, 4, 20000) == 0xf, "min_p=0.05 keeps all");
    p.min_p = 0.9f;
    CHECK(drawn_set(p, logits, 4, 4000) == 0x1, "min_p=0.9 keeps only the top");

    /* min_p acts on the tempered distribution: at T=0.5 the ratios square. */
    p.min_p = 0.2f;
    p.temperature = 0.5f;
    CHECK(drawn_set(p, logits, 4, 20000) == 0x3, "min_p must see the temperature");

    /* ...and comes after top-p: probabilities are 0.556, 0.278, 0.111, 0.056,
     * so top_p=0.85 keeps {0,1,2} and min_p=0.15 drops nothing more. Had
     * min-p run first (dropping id 3), top-p would renormalise and drop id 2. */
    p.temperature = 1;
    p.min_p = 0.15f;
    p.top_p = 0.85f;
    CHECK(drawn_set(p, logits, 4, 20000) == 0x7, "min_p must run after top_p");
}

static void test_repeat_penalty(void) {
    whale_sampler_params p = whale_sampler_defaults();
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    whale_sampler *s = make(p, 4);

    float a[4] = {2.0f, 1.5f, -1.0f, -0.8f};
    int32_t h0[] = {0, 0, 0}; /* repeated ids are penalised once */
    CHECK(whale_sample(s, a, h0, 3) == 1, "penalised token 0 should lose to token 1");
    CHECK(a[0] == 1.0f && a[1] == 1.5f, "positive logit divided once: %g", (double)a[0]);

    float b[4] = {-5.0f, -3.0f, -1.0f, -0.8f};
    int32_t h1[] = {3, 7, -1}; /* out-of-range ids are ignored */
    CHECK(whale_sample(s, b, h1, 3) == 2, "penalised negative token 3 should lose to token 2");
    CHECK(b[3] == -1.6f && b[2] == -1.0f, "negative logit multiplied: %g", (double)b[3]);

    float z[4] = {0.0f, -0.1f, -0.2f, -0.3f};
    int32_t h2[] = {0};
    CHECK(whale_sample(s, z, h2, 1) == 0 && z[0] == 0.0f, "a zero logit stays zero");
    whale_sampler_free(s);

    /* Window: only the last repeat_last_n history entries count. */
    int32_t hist[] = {0, 1};
    p.repeat_last_n = 1;
    s = make(p, 4);
    float c[4] = {2.0f, 1.9f, 0, 0};
    CHECK(whale_sample(s, c, hist, 2) == 0 && c[0] == 2.0f && c[1] == 0.95f,
          "repeat_last_n=1 penalises only the last id");
    whale_sampler_free(s);
    p.repeat_last_n = 0;
    s = make(p, 4);
    float d[4] = {2.0f, 1.9f, 0, 0};
    CHECK(whale_sample(s, d, hist, 2) == 0 && d[0] == 2.0f && d[1] == 1.9f,
          "repeat_last_n=0 penalises nothing");
    whale_sampler_free(s);
    p.repeat_last_n = -1;
    s = make(p, 4);
    float e[4] = {2.0f, 1.9f, 0, 0};
    CHECK(whale_sample(s, e, hist, 2) == 0 && e[0] == 1.0f && e[1] == 0.95f,
          "repeat_last_n=-1 penalises the whole history");
    /* Calls are independent: the same id is penalised again next time. */
    float f[4] = {2.0f, 1.9f, 0, 0};
    CHECK(whale_sample(s, f, hist, 2) == 0 && f[0] == 1.0f && f[1] == 0.95f,
          "penalty state must not leak");
    whale_sampler_free(s);

    /* Stochastic path: a strong penalty on the favourite shifts the draws. */
    p.temperature = 1;
    p.repeat_penalty = 100.0f;
    float g[2] = {5.0f, 0.0f};
    int32_t h3[] = {0};
    s = make(p, 2);
    int ones = 0;
    for (int i = 0; i < 1000; i++) {
        float x[2] = {g[0], g[1]};
        ones += whale_sample(s, x, h3, 1) == 1;
    }
    CHECK(ones > 400 && ones < 600, "penalised logits 0.05 vs 0: %d of 1000 were id 1", ones);
    whale_sampler_free(s);
}

/* Pearson chi-square of n draws against softmax(logits / T). */
static double chi2_softmax(const float *logits, int vocab, float temperature, int n, uint64_t seed) {
    whale_sampler_params p = whale_sampler_defaults();
    p.temperature = temperature;
    p.seed = seed;
    whale_sampler *s = make(p, vocab);
    long counts[MAXV], bad;
    histogram(s, logits, vocab, n, counts, &bad);
    CHECK(bad == 0, "%ld invalid draws", bad);
    double z = 0, prob[MAXV];
    for (int i = 0; i < vocab; i++) z += prob[i] = exp(logits[i] / (double)temperature);
    double chi2 = 0;
    for (int i = 0; i < vocab; i++) {
        double e = n * prob[i] / z;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    whale_sampler_free(s);
    return chi2;
}

static void test_frequencies(void) {
    const float logits[5] = {1.0f, 0.5f, 0.0f, -0.5f, -1.5f};
    /* df = 4: P(chi2 > 25) is about 5e-5. */
    double c1 = chi2_softmax(logits, 5, 1.0f, 200000, 42);
    CHECK(c1 < 25, "T=1 frequencies do not match softmax: chi2 %.2f", c1);
    double c2 = chi2_softmax(logits, 5, 0.7f, 200000, 43);
    CHECK(c2 < 25, "T=0.7 frequencies do not match softmax: chi2 %.2f", c2);
    printf("frequency chi2 (df 4): T=1 %.2f, T=0.7 %.2f\n", c1, c2);
}

static void test_non_finite(void) {
    whale_sampler_params p = whale_sampler_defaults();
    float a[6] = {NAN, 0.0f, NAN, -1.0f, -INFINITY, NAN};
    CHECK(drawn_set(p, a, 6, 20000) == 0x0a, "NaN and -inf must never be drawn");
    float b[6] = {0.0f, INFINITY, 3.0f, INFINITY, NAN, -INFINITY};
    CHECK(drawn_set(p, b, 6, 4000) == 0x0a, "+inf tokens take all the mass");
    float c[3] = {NAN, -INFINITY, NAN};
    whale_sampler *s = make(p, 3);
    CHECK(whale_sample(s, c, NULL, 0) == -1, "no usable logit must return -1");
    whale_sampler_free(s);
    /* A tiny temperature must not turn finite logits into +-inf. */
    p.temperature = 1e-30f;
    float d[3] = {-3e38f, -3.1e38f, -INFINITY};
    CHECK(drawn_set(p, d, 3, 1000) == 0x1, "tiny temperature behaves like greedy");
    p.temperature = 1e-30f;
    float e[3] = {1e-35f, 0.0f, 2e-35f}; /* differences 1e-5..2e-5 of T: near uniform */
    CHECK(drawn_set(p, e, 3, 4000) == 0x7, "tiny temperature on tiny logits keeps all");
}

static void expect_reject(whale_sampler_params p, int vocab, const char *name) {
    whale_sampler *s = NULL;
    whale_err err = {0};
    whale_code rc = whale_sampler_new(&p, vocab, &s, &err);
    CHECK(rc == WHALE_ERR_ARG && s == NULL, "%s: expected WHALE_ERR_ARG, got %d", name, rc);
    CHECK(strstr(err.msg, name) != NULL && !strchr(err.msg, '\n'),
          "message should name %s: \"%s\"", name, err.msg);
    whale_sampler_free(rc == WHALE_OK ? s : NULL);
}

static void test_validation(void) {
    const whale_sampler_params d = whale_sampler_defaults();
    whale_sampler_params p;
    p = d, p.temperature = -0.1f, expect_reject(p, 10, "--temperature");
    p = d, p.temperature = NAN, expect_reject(p, 10, "--temperature");
    p = d, p.temperature = INFINITY, expect_reject(p, 10, "--temperature");
    p = d, p.top_k = -1, expect_reject(p, 10, "--top-k");
    p = d, p.top_p = 1.5f, expect_reject(p, 10, "--top-p");
    p = d, p.top_p = 0.0f, expect_reject(p, 10, "--top-p");
    p = d, p.top_p = NAN, expect_reject(p, 10, "--top-p");
    p = d, p.min_p = 1.0f, expect_reject(p, 10, "--min-p");
    p = d, p.min_p = -0.01f, expect_reject(p, 10, "--min-p");
    p = d, p.min_p = NAN, expect_reject(p, 10, "--min-p");
    p = d, p.repeat_penalty = 0.0f, expect_reject(p, 10, "--repeat-penalty");
    p = d, p.repeat_penalty = -1.0f, expect_reject(p, 10, "--repeat-penalty");
    p = d, p.repeat_penalty = NAN, expect_reject(p, 10, "--repeat-penalty");
    p = d, p.repeat_last_n = -2, expect_reject(p, 10, "--repeat-last-n");
    p = d, expect_reject(p, 0, "vocab");
    p = d, expect_reject(p, -5, "vocab");

    whale_err err = {0};
    whale_sampler *s = NULL;
    p = d, p.top_p = 1.5f;
    whale_sampler_new(&p, 10, &s, &err);
    CHECK(strcmp(err.msg, "--top-p must be in (0, 1], got 1.5") == 0, "message: \"%s\"", err.msg);

    /* The edges of the valid ranges are accepted. */
    p = d, p.temperature = 0, p.top_p = 1.0f, p.min_p = 0, p.top_k = 0, p.repeat_last_n = -1;
    CHECK(whale_sampler_new(&p, 1, &s, &err) == WHALE_OK, "edge values rejected: %s", err.msg);
    whale_sampler_free(s);
    s = NULL;
    CHECK(whale_sampler_new(NULL, 3, &s, &err) == WHALE_OK && s, "NULL params mean defaults");
    whale_sampler_free(s);
}

/* Full-size vocabulary: every filter gives valid draws, and a rough
 * per-call time is printed (not asserted: sanitizer builds are slow). */
static void test_large_vocab(void) {
    enum { V = 129280, CALLS = 50 };
    float *logits = malloc(V * sizeof *logits), *scratch = malloc(V * sizeof *scratch);
    int32_t *hist = malloc(1000 * sizeof *hist);
    whale_rng r;
    whale_rng_seed(&r, 2024);
    for (int i = 0; i < V; i++) logits[i] = (float)(2.5 * whale_rng_normal(&r));
    for (int i = 0; i < 1000; i++) hist[i] = (int32_t)(whale_rng_u64(&r) % V);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;

    struct {
        const char *name;
        int top_k;
        float top_p, min_p;
    } cfg[] = {
        {"plain", 0, 1.0f, 0},
        {"top_k=50", 50, 1.0f, 0},
        {"top_p=0.95", 0, 0.95f, 0},
        {"top_k=50 top_p=0.9 min_p=0.05", 50, 0.9f, 0.05f},
        {"top_p=1e-6", 0, 1e-6f, 0},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        whale_sampler_params p = whale_sampler_defaults();
        p.top_k = cfg[c].top_k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.repeat_penalty = 1.1f;
        p.seed = c;
        whale_sampler *s = make(p, V);
        int bad = 0;
        double t0 = whale_now();
        for (int i = 0; i < CALLS; i++) {
            memcpy(scratch, logits, V * sizeof *scratch);
            int32_t id = whale_sample(s, scratch, hist, 1000);
            if (id < 0 || id >= V) bad++;
            else if (cfg[c].top_k && logits[id] < 0) bad++; /* the top 50 of 129k are > 0 */
        }
        double ms = (whale_now() - t0) * 1e3 / CALLS;
        CHECK(bad == 0, "%s: %d bad draws", cfg[c].name, bad);
        printf("vocab %d, %s: %.3f ms/call\n", V, cfg[c].name, ms);
        whale_sampler_free(s);
    }
    /* top_p so small that only the best token survives (it is not in hist). */
    int in_hist = 0;
    for (int i = 0; i < 1000; i++) in_hist |= hist[i] == best;
    if (!in_hist) {
        whale_sampler_params p = whale_sampler_defaults();
        p.top_p = 1e-6f;
        whale_sampler *s = make(p, V);
        int ok = 1;
        for (int i = 0; i < 20; i++) ok &= sample_copy(s, logits, V, scratch) == best;
        CHECK(ok, "top_p=1e-6 on the full vocabulary must pick the argmax");
        whale_sampler_free(s);
    }
    free(logits);
    free(scratch);
    free(hist);
}

int main(void) {
    test_defaults();
    test_greedy();
    test_greedy_long();
    test_seeds();
    test_top_k_one_is_greedy();
    test_top_k();
    test_top_p();
    test_top_p_large();
    test_min_p();
    test_repeat_penalty();
    test_frequencies();
    test_non_finite();
    test_validation();
    test_large_vocab();
    return test_finish("test_sampler");
}
