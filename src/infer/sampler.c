/*
 * Token sampling, in the order of Hugging Face transformers' logits
 * processors:
 *
 *   repetition penalty -> (temperature <= 0: greedy argmax) -> temperature
 *   -> top-k -> top-p -> min-p -> softmax -> one draw
 *
 * Semantics chosen here:
 *   - Repetition penalty: each distinct id among the last repeat_last_n
 *     history entries (-1 = all, 0 = none) is penalised once; ids outside
 *     the vocabulary are ignored.
 *   - NaN logits count as -inf: they are never picked. If no logit is above
 *     -inf, whale_sample returns -1 and the caller reports the error.
 *   - +inf logits win outright: the draw is uniform over the +inf tokens.
 *   - Greedy: the lowest id wins a tie. (top_k = 1 is greedy only without
 *     a tie at the top: it keeps every tied token, see below.)
 *   - The filters depend only on the values, never on token ids, so equal
 *     logits are always kept or dropped together:
 *       top-k keeps every token whose logit is >= the k-th largest (as HF);
 *       top-p keeps a token iff the probability of the tokens strictly more
 *         probable than it is < top_p (for distinct values this is exactly
 *         HF's "drop where ascending cumsum <= 1 - top_p");
 *       min-p drops a token iff p < min_p * p_max.
 *     The top token always survives.
 *   - top_p and min_p arrive as floats (0.8f is not 0.8), so their
 *     thresholds are lowered by a relative 1e-6: a prefix whose mass equals
 *     top_p up to float rounding counts as reaching it, and a ratio equal to
 *     min_p is kept.
 *   - Only the repetition penalty writes to the caller's logits; the other
 *     stages work on the sampler's own buffer.
 *   - One random number is drawn per stochastic call (none when greedy), so
 *     equal seeds and inputs give equal token sequences.
 *
 * Cost per call is a few linear passes over the vocabulary and no sort:
 * top-k uses a k-element heap, top-p a histogram of the mass plus an exact
 * selection inside the one bucket where the cumulative mass crosses top_p.
 * Every buffer is allocated once, in whale_sampler_new.
 */
#include "core/core.h"
#include "core/cpu.h"

#include <math.h>
#include <string.h>

#if WHALE_X86
#include <immintrin.h>
#endif

/* Relative loosening of the top-p / min-p thresholds; far above float
 * rounding of the parameters (~6e-8), far below any mass that matters. */
#define THRESHOLD_SLACK 1e-6

/* Top-p buckets: 16 per factor of 2 in probability, 64 factors deep; the
 * last bucket also takes everything smaller (including w = 0). */
#define BUCKET_SHIFT 19 /* 23 mantissa bits - log2(16) */
#define N_BUCKETS (16 * 64)

typedef struct {
    float logit; /* after the penalty (before temperature); orders the candidates */
    float w;     /* exp((logit - max) / T): unnormalised probability, top = 1 */
    int32_t id;
} cand;

struct whale_sampler {
    whale_sampler_params p;
    int vocab;
    whale_rng rng;   /* the draws */
    whale_rng pivot; /* selection pivots; separate so draws do not depend on it */
    cand *cands;     /* [vocab] */
    float *heap;     /* [vocab] min-heap for top-k */
    uint32_t *seen;  /* [vocab] epoch stamps: distinct ids for the penalty */
    uint32_t epoch;
    double bucket_mass[N_BUCKETS];
};

whale_sampler_params whale_sampler_defaults(void) {
    whale_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = -1;
    p.seed = 0;
    return p;
}

static whale_code check_params(const whale_sampler_params *p, int vocab, whale_err *err) {
    /* Written so that NaN fails every test. */
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return whale_errf(err, WHALE_ERR_ARG, "--temperature must be a finite number >= 0, got %g",
                          (double)p->temperature);
    if (p->top_k < 0)
        return whale_errf(err, WHALE_ERR_ARG, "--top-k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return whale_errf(err, WHALE_ERR_ARG, "--top-p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p < 1.0f))
        return whale_errf(err, WHALE_ERR_ARG, "--min-p must be in [0, 1), got %g", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty)))
        return whale_errf(err, WHALE_ERR_ARG, "--repeat-penalty must be a finite number > 0, got %g",
                          (double)p->repeat_penalty);
    if (p->repeat_last_n < -1)
        return whale_errf(err, WHALE_ERR_ARG, "--repeat-last-n must be >= -1 (-1 = all), got %d",
                          p->repeat_last_n);
    if (vocab <= 0)
        return whale_errf(err, WHALE_ERR_ARG, "sampler vocab size must be > 0, got %d", vocab);
    return WHALE_OK;
}

whale_code whale_sampler_new(const whale_sampler_params *p, int vocab, whale_sampler **out,
                             whale_err *err) {
    if (!out) return whale_errf(err, WHALE_ERR_ARG, "whale_sampler_new: out is NULL");
    *out = NULL;
    whale_sampler_params params = p ? *p : whale_sampler_defaults();
    whale_code rc = check_params(&params, vocab, err);
    if (rc) return rc;

    size_t cand_bytes, heap_bytes, seen_bytes;
    if (!whale_mul_size((size_t)vocab, sizeof(cand), &cand_bytes) ||
        !whale_mul_size((size_t)vocab, sizeof(float), &heap_bytes) ||
        !whale_mul_size((size_t)vocab, sizeof(uint32_t), &seen_bytes))
        return whale_errf(err, WHALE_ERR_NOMEM, "sampler: vocab size %d too large", vocab);

    whale_sampler *s = whale_calloc(sizeof *s);
    if (!s) return whale_errf(err, WHALE_ERR_NOMEM, "sampler: out of memory");
    s->p = params;
    s->vocab = vocab;
    s->cands = whale_alloc(cand_bytes);
    s->heap = whale_alloc(heap_bytes);
    s->seen = whale_calloc(seen_bytes);
    if (!s->cands || !s->heap || !s->seen) {
        whale_sampler_free(s);
        return whale_errf(err, WHALE_ERR_NOMEM, "sampler: out of memory for vocab %d", vocab);
    }
    whale_rng_seed(&s->rng, params.seed);
    whale_rng_seed(&s->pivot, params.seed ^ 0x5DEECE66DA3B2C1Full);
    *out = s;
    return WHALE_OK;
}

void whale_sampler_free(whale_sampler *s) {
    if (!s) return;
    free(s->cands);
    free(s->heap);
    free(s->seen);
    free(s);
}

/* HF repetition penalty: each distinct id in the window is penalised once,
 * from its original value (a positive logit is divided, a negative one
 * multiplied). Ids outside the vocabulary are ignored. */
static void apply_repeat_penalty(whale_sampler *s, float *logits, const int32_t *history,
                                 int n_history) {
    float pen = s->p.repeat_penalty;
    if (pen == 1.0f || !history || n_history <= 0) return;
    int start = 0;
    if (s->p.repeat_last_n >= 0 && s->p.repeat_last_n < n_history)
        start = n_history - s->p.repeat_last_n;

    /* A fresh epoch marks "not seen yet" for every id without clearing the
     * whole array; clear only when the counter wraps. */
    if (++s->epoch == 0) {
        memset(s->seen, 0, (size_t)s->vocab * sizeof *s->seen);
        s->epoch = 1;
    }
    for (int i = start; i < n_history; i++) {
        int32_t id = history[i];
        if (id < 0 || id >= s->vocab || s->seen[id] == s->epoch) continue;
        s->seen[id] = s->epoch;
        float x = logits[id];
        logits[id] = x < 0.0f ? x * pen : x / pen;
    }
}

/* Greedy: the first id of the largest logit; -1 when every logit is NaN or
 * -inf. ARGMAX_LANES lanes keep their own first maximum (strict >: a lane's
 * earlier id wins its ties, and NaN never wins); the lanes then give the
 * largest value's lowest id, which is the answer whatever the number of
 * lanes. gcc 12 left the plain loop over 16 lanes scalar (compares and
 * branches: 62 us for 129,280 logits on a Xeon), so the AVX-512 and AVX2
 * tiers have their own, two zmm or four ymm of lanes, a compare and two
 * masked moves per 16 or 8 logits: 7.7 and 13.8 us there. */
#define ARGMAX_LANES 32

static void argmax_lanes_c(const float *logits, int n, float *v, int32_t *id) {
    for (int i = 0; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int l = 0; l < ARGMAX_LANES; l++) {
            const int win = logits[i + l] > v[l];
            v[l] = win ? logits[i + l] : v[l];
            id[l] = win ? i + l : id[l];
        }
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
static void argmax_lanes_avx512(const float *logits, int n, float *v, int32_t *id) {
    __m512 bv[2] = {_mm512_loadu_ps(v), _mm512_loadu_ps(v + 16)};
    __m512i bi[2] = {_mm512_loadu_si512(id), _mm512_loadu_si512(id + 16)};
    __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i sixteen = _mm512_set1_epi32(16);
    for (int i = 0; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int h = 0; h < 2; h++, at = _mm512_add_epi32(at, sixteen)) {
            const __m512 x = _mm512_loadu_ps(logits + i + 16 * h);
            const __mmask16 win = _mm512_cmp_ps_mask(x, bv[h], _CMP_GT_OQ);
            bv[h] = _mm512_mask_mov_ps(bv[h], win, x);
            bi[h] = _mm512_mask_mov_epi32(bi[h], win, at);
        }
    for (int h = 0; h < 2; h++) {
        _mm512_storeu_ps(v + 16 * h, bv[h]);
        _mm512_storeu_si512(id + 16 * h, bi[h]);
    }
}
WHALE_TARGET_END

WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX2)
static void argmax_lanes_avx2(const float *logits, int n, float *v, int32_t *id) {
    __m256 bv[4], bi[4]; /* bi: the ids' bits, moved with the values' masks */
    for (int h = 0; h < 4; h++)
        bv[h] = _mm256_loadu_ps(v + 8 * h), bi[h] = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(id + 8 * h)));
    __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int i = 0; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int h = 0; h < 4; h++, at = _mm256_add_epi32(at, eight)) {
            const __m256 x = _mm256_loadu_ps(logits + i + 8 * h), win = _mm256_cmp_ps(x, bv[h], _CMP_GT_OQ);
            bv[h] = _mm256_blendv_ps(bv[h], x, win);
            bi[h] = _mm256_blendv_ps(bi[h], _mm256_castsi256_ps(at), win);
        }
    for (int h = 0; h < 4; h++) {
        _mm256_storeu_ps(v + 8 * h, bv[h]);
        _mm256_storeu_si256((__m256i *)(id + 8 * h), _mm256_castps_si256(bi[h]));
    }
}
WHALE_TARGET_END
#endif

static int32_t argmax(const float *logits, int n) {
    float v[ARGMAX_LANES];
    int32_t id[ARGMAX_LANES];
    for (int l = 0; l < ARGMAX_LANES; l++) v[l] = -INFINITY, id[l] = -1;
#if WHALE_X86
    if (whale_isa_at_least(WHALE_ISA_AVX512)) argmax_lanes_avx512(logits, n, v, id);
    else if (whale_isa_at_least(WHALE_ISA_AVX2)) argmax_lanes_avx2(logits, n, v, id);
    else
#endif
        argmax_lanes_c(logits, n, v, id);
    int32_t best = -1;
    float best_v = -INFINITY;
    for (int l = 0; l < ARGMAX_LANES; l++)
        if (id[l] >= 0 && (v[l] > best_v || (v[l] == best_v && id[l] < best))) best_v = v[l], best = id[l];
    for (int i = n / ARGMAX_LANES * ARGMAX_LANES; i < n; i++)
        if (logits[i] > best_v) best_v = logits[i], best = i;
    return best;
}

static void swap_cand(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Value of a pseudo-random element of c[0..n): random pivots keep the
 * selections below expected O(n) whatever the order of the logits. */
static float pick_pivot(whale_sampler *s, const cand *c, int n) {
    uint64_t i = ((whale_rng_u64(&s->pivot) >> 32) * (uint64_t)n) >> 32;
    return c[i].logit;
}

/* Rearrange c[0..n) into [logit > v | logit == v | logit < v] and return
 * the sizes of the first two groups. Logits are never NaN here. */
static void partition3(cand *c, int n, float v, int *n_gt, int *n_eq) {
    int lt = 0, i = 0, gt = n;
    while (i < gt) {
        if (c[i].logit > v)
            swap_cand(&c[lt++], &c[i++]);
        else if (c[i].logit < v)
            swap_cand(&c[i], &c[--gt]);
        else
            i++;
    }
    *n_gt = lt;
    *n_eq = gt - lt;
}

static double mass(const cand *c, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m += c[i].w;
    return m;
}

/* Put x at position i of the min-heap h[0..k) and sift it down. */
static void heap_sift(float *h, int k, int i, float x) {
    for (;;) {
        int child = 2 * i + 1;
        if (child >= k) break;
        if (child + 1 < k && h[child + 1] < h[child]) child++;
        if (h[child] >= x) break;
        h[i] = h[child];
        i = child;
    }
    h[i] = x;
}

/* Keep every candidate whose logit is >= the k-th largest (ties at the
 * boundary all stay, as in HF); returns the kept count. A min-heap of the k
 * largest values seen finds the k-th: O(n log k) at worst, close to O(n) for
 * small k since most logits fail the first comparison. */
static int keep_top_k(whale_sampler *s, cand *c, int n, int k) {
    if (k >= n) return n;
    float *h = s->heap;
    for (int i = 0; i < k; i++) h[i] = c[i].logit;
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift(h, k, i, h[i]);
    for (int i = k; i < n; i++)
        if (c[i].logit > h[0]) heap_sift(h, k, 0, c[i].logit);
    float kth = h[0];
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (c[i].logit >= kth) c[kept++] = c[i];
    return kept;
}

/* Bucket of a weight w in [0, 1]: the bits of a non-negative float grow
 * with its value, so counting down from the bits of 1.0 orders buckets from
 * the most probable, with no log. */
static int bucket_of(float w) {
    uint32_t bits;
    memcpy(&bits, &w, sizeof bits);
    uint32_t b = (0x3F800000u - bits) >> BUCKET_SHIFT;
    return b < N_BUCKETS ? (int)b : N_BUCKETS - 1;
}

/* Exact tier-by-tier selection on c[lo..hi), where c[0..lo) are kept and
 * have mass `above` (< target), and all of them are more probable than
 * anything in the range. Returns the kept count. */
static int select_by_mass(whale_sampler *s, cand *c, int lo, int hi, double above,
                          double target) {
    while (lo < hi) {
        int ng, ne;
        partition3(c + lo, hi - lo, pick_pivot(s, c + lo, hi - lo), &ng, &ne);
        double m_gt = mass(c + lo, ng);
        if (above + m_gt < target) { /* the pivot's tier survives, so does all above it */
            above += m_gt + mass(c + lo + ng, ne);
            lo += ng + ne;
        } else {
            hi = lo + ng; /* the pivot's tier and everything below it go */
        }
    }
    return lo;
}

/* Keep a candidate iff the mass of the candidates strictly more probable
 * than it is < top_p of the total. The kept set is a prefix by value. A
 * histogram of the mass by bucket finds the one bucket where the cumulative
 * mass crosses top_p: buckets above it are kept, below it dropped, and only
 * its own members need the exact selection. No sort. */
static int keep_top_p(whale_sampler *s, cand *c, int n, double top_p) {
    double *bm = s->bucket_mass;
    memset(bm, 0, sizeof s->bucket_mass);
    for (int i = 0; i < n; i++) bm[bucket_of(c[i].w)] += c[i].w;
    double total = 0;
    for (int b = 0; b < N_BUCKETS; b++) total += bm[b];
    double target = total * top_p * (1.0 - THRESHOLD_SLACK);

    int cross = 0;
    double above = 0;
    while (cross < N_BUCKETS - 1 && above + bm[cross] < target) above += bm[cross++];

    /* Reorder to [buckets before `cross` | bucket `cross` | the rest]. */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (bucket_of(c[i].w) < cross) swap_cand(&c[m++], &c[i]);
    int end = m;
    for (int i = m; i < n; i++)
        if (bucket_of(c[i].w) == cross) swap_cand(&c[end++], &c[i]);
    return select_by_mass(s, c, m, end, above, target);
}

/* Weights are relative to the top token (w = 1), so p / p_max is just w. */
static int keep_min_p(cand *c, int n, double min_p) {
    double cut = min_p * (1.0 - THRESHOLD_SLACK);
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (c[i].w >= cut) c[kept++] = c[i];
    return kept;
}

int32_t whale_sample(whale_sampler *s, float *logits, const int32_t *history, int n_history) {
    if (!s || !logits) return -1;
    apply_repeat_penalty(s, logits, history, n_history);
    if (s->p.temperature <= 0.0f) return argmax(logits, s->vocab);

    /* Candidates: every token above -inf (this also drops NaN). */
    cand *c = s->cands;
    int n = 0;
    float top = -INFINITY;
    for (int i = 0; i < s->vocab; i++) {
        float x = logits[i];
        if (!(x > -INFINITY)) continue;
        c[n].logit = x;
        c[n].id = i;
        if (x > top) top = x;
        n++;
    }
    if (n == 0) return -1;

    /* Top-k orders logits only, so it runs before any exp. */
    if (s->p.top_k > 0) n = keep_top_k(s, c, n, s->p.top_k);

    /* Softmax weights exp((x - max) / T), the argument formed in double so a
     * small temperature cannot overflow (order by x is order by x / T), the
     * exp in float (its ~1e-7 error is immaterial for sampling; the sums
     * below are in double). +inf tokens share all the mass. */
    double inv_t = 1.0 / s->p.temperature;
    for (int i = 0; i < n; i++) {
        if (top == INFINITY) {
            c[i].w = c[i].logit == INFINITY ? 1.0f : 0.0f;
        } else {
            double a = ((double)c[i].logit - (double)top) * inv_t;
            c[i].w = a < -200.0 ? 0.0f : expf((float)a); /* expf underflows well before */
        }
    }

    if (s->p.top_p < 1.0f) n = keep_top_p(s, c, n, s->p.top_p);
    if (s->p.min_p > 0.0f) n = keep_min_p(c, n, s->p.min_p);

    /* Inverse-CDF draw with 53 random bits; zero-weight candidates (underflow)
     * can never be chosen because the comparison is strict. */
    double u = (double)(whale_rng_u64(&s->rng) >> 11) * 0x1p-53 * mass(c, n);
    double acc = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (c[i].w <= 0) continue;
        acc += c[i].w;
        last = c[i].id;
        if (acc > u) return last;
    }
    return last; /* rounding left u at the very top of the range */
}
