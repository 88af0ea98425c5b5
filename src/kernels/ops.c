#include "kernels/ops.h"

#include "core/cpu.h"
#include "core/par.h"
#include "kernels/vmath.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#if WHALE_X86
#include <immintrin.h>
#endif

void k_rmsnorm(float *y, const float *x, const float *w, long rows, int n, float eps, float *rstd) {
    WHALE_FOR_IF(rows * n > 16384, (long r = 0; r < rows; r++), {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double ss = k_dot_f64(xr, xr, n); /* double sum: the mean is exact to fp32 rounding */
        float rs = (float)(1.0 / sqrt(ss / n + (double)eps));
        if (rstd) rstd[r] = rs;
        if (w)
            for (int i = 0; i < n; i++) yr[i] = w[i] * (xr[i] * rs);
        else
            for (int i = 0; i < n; i++) yr[i] = xr[i] * rs;
    });
}

/* Columns per dw block: each block is summed by one thread over all rows. */
enum { NORM_DW_COLS = 32 };

void k_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                        long rows, int n) {
    /* dw first: dx may overwrite dy. */
    if (dw) {
        int nb = (n + NORM_DW_COLS - 1) / NORM_DW_COLS;
        WHALE_FOR_IF(rows * n > 16384, (int b = 0; b < nb; b++), {
            int c0 = b * NORM_DW_COLS, c1 = c0 + NORM_DW_COLS < n ? c0 + NORM_DW_COLS : n;
            double acc[NORM_DW_COLS] = {0};
            for (long r = 0; r < rows; r++) {
                const float *dyr = dy + r * n, *xr = x + r * n;
                float rs = rstd[r];
                for (int i = c0; i < c1; i++) acc[i - c0] += (double)dyr[i] * (xr[i] * rs);
            }
            for (int i = c0; i < c1; i++) dw[i] += (float)acc[i - c0];
        });
    }
    WHALE_FOR_IF(rows * n > 16384, (long r = 0; r < rows; r++), {
        const float *dyr = dy + r * n, *xr = x + r * n;
        float *dxr = dx + r * n;
        /* g = dy·w goes through dx (element for element, so dx may be dy) */
        const float *gr = dyr;
        if (w) {
            for (int i = 0; i < n; i++) dxr[i] = dyr[i] * w[i];
            gr = dxr;
        }
        double rs = rstd[r], dot = k_dot_f64(gr, xr, n);
        float a = (float)rs, c = (float)(rs * rs * rs * dot / n);
        for (int i = 0; i < n; i++) dxr[i] = a * gr[i] - c * xr[i];
    });
}

void k_rope_table(float *cos_t, float *sin_t, int max_pos, int R, float theta) {
    int half = R / 2;
    for (int j = 0; j < half; j++) {
        float inv = 1.0f / powf(theta, (float)(2 * j) / (float)R);
        for (int p = 0; p < max_pos; p++) {
            float a = (float)p * inv;
            cos_t[(long)p * half + j] = cosf(a);
            sin_t[(long)p * half + j] = sinf(a);
        }
    }
}

void k_rope(float *x, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
            const float *cos_t, const float *sin_t, int inverse) {
    int half = R / 2;
    float sgn = inverse ? -1.0f : 1.0f;
    WHALE_FOR_IF(rows * nh > 256, (long r = 0; r < rows; r++), {
        const float *c = cos_t + (long)pos[r] * half, *s = sin_t + (long)pos[r] * half;
        for (int h = 0; h < nh; h++) {
            float *a = x + r * ld + (long)h * hd + (hd - R), *b = a + half;
            for (int j = 0; j < half; j++) {
                float aj = a[j], bj = b[j], sj = sgn * s[j];
                a[j] = aj * c[j] + bj * sj;
                b[j] = bj * c[j] - aj * sj;
            }
        }
    });
}

void k_rope_backward(float *dx, long rows, int ld, int nh, int hd, int R, const int32_t *pos,
                     const float *cos_t, const float *sin_t, int inverse) {
    k_rope(dx, rows, ld, nh, hd, R, pos, cos_t, sin_t, !inverse);
}

/* Elements per block of the SwiGLU loops: exp(−g) of a block is computed
 * first, vectorised (vmath.h), into a buffer on the stack. */
enum { SWIGLU_BLOCK = 256 };

static void neg_exp_block(float *e, const float *g, int m, float limit) {
    for (int i = 0; i < m; i++) e[i] = -(limit > 0 ? fminf(g[i], limit) : g[i]);
    k_exp(e, e, m);
}

void k_swiglu(float *g, const float *u, long n, float limit) {
    WHALE_FOR_IF(n > 65536, (long b0 = 0; b0 < n; b0 += SWIGLU_BLOCK), {
        float e[SWIGLU_BLOCK];
        int m = n - b0 < SWIGLU_BLOCK ? (int)(n - b0) : SWIGLU_BLOCK;
        neg_exp_block(e, g + b0, m, limit);
        for (int j = 0; j < m; j++) {
            float gi = g[b0 + j], ui = u[b0 + j];
            if (limit > 0) {
                ui = fminf(fmaxf(ui, -limit), limit);
                gi = fminf(gi, limit);
            }
            g[b0 + j] = gi / (1.0f + e[j]) * ui;
        }
    });
}

void k_swiglu_backward_block(float *dg, float *du, const float *dh, const float *g, const float *u, int m,
                             float limit) {
    float e[SWIGLU_BLOCK];
    for (int b0 = 0; b0 < m; b0 += SWIGLU_BLOCK) {
        int mb = m - b0 < SWIGLU_BLOCK ? m - b0 : SWIGLU_BLOCK;
        neg_exp_block(e, g + b0, mb, limit);
        for (int j = 0; j < mb; j++) {
            int i = b0 + j;
            float gi = g[i], ui = u[i], d = dh[i];
        int gpass = 1, upass = 1;
        if (limit > 0) {
            /* torch.clamp passes the gradient for min <= x <= max */
            upass = ui >= -limit && ui <= limit;
            gpass = gi <= limit;
            ui = fminf(fmaxf(ui, -limit), limit);
            gi = fminf(gi, limit);
        }
            float sg = 1.0f / (1.0f + e[j]);
            float silu = gi * sg, dsilu = sg * (1.0f + gi * (1.0f - sg));
            dg[i] = gpass ? d * ui * dsilu : 0.0f;
            du[i] = upass ? d * silu : 0.0f;
        }
    }
}

void k_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, long n, float limit) {
    WHALE_FOR_IF(n > 65536, (long b0 = 0; b0 < n; b0 += SWIGLU_BLOCK), {
        int m = n - b0 < SWIGLU_BLOCK ? (int)(n - b0) : SWIGLU_BLOCK;
        k_swiglu_backward_block(dg + b0, du + b0, dh + b0, g + b0, u + b0, m, limit);
    });
}

void k_gate_scores(int scoring, int E, const float *logit, float *sc) {
    if (scoring == NW_SCORE_SOFTMAX) {
        float mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, logit[e]);
        for (int e = 0; e < E; e++) sum += (sc[e] = expf(logit[e] - mx));
        for (int e = 0; e < E; e++) sc[e] /= sum;
    } else {
        for (int e = 0; e < E; e++) {
            float x = logit[e];
            if (scoring == NW_SCORE_SIGMOID) sc[e] = 1.0f / (1.0f + expf(-x));
            else sc[e] = sqrtf(x > 20.0f ? x : log1pf(expf(x))); /* PyTorch's softplus threshold */
        }
    }
}

void k_gate_route(int scoring, int E, int K, float scale, const float *logit, const float *bias, int32_t *idx,
                  float *w) {
    float sc[256], sel[256];
    if (E > 256) E = 256; /* configs are validated to at most 256 experts */
    k_gate_scores(scoring, E, logit, sc);
    for (int e = 0; e < E; e++) sel[e] = bias ? sc[e] + bias[e] : sc[e];
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (sel[e] > -INFINITY && (best < 0 || sel[e] > sel[best])) best = e;
        if (best < 0) /* NaN scores: keep going deterministically, the NaN shows up downstream */
            for (int e = 0; e < E && best < 0; e++) {
                int taken = 0;
                for (int k2 = 0; k2 < k; k2++) taken |= idx[k2] == e;
                if (!taken) best = e;
            }
        idx[k] = best;
        sel[best] = -INFINITY;
    }
    float sum = 0;
    for (int k = 0; k < K; k++) sum += (w[k] = sc[idx[k]]);
    for (int k = 0; k < K; k++) {
        if (scoring != NW_SCORE_SOFTMAX) w[k] = w[k] / (sum + 1e-20f);
        w[k] = w[k] * scale;
    }
}

void k_gate_route_backward(int scoring, int E, int K, float scale, const float *logit, const int32_t *idx,
                           const float *dw, float *dlogit) {
    float sc[256], ds[256];
    if (E > 256) E = 256; /* as in the forward */
    k_gate_scores(scoring, E, logit, sc); /* exactly as the forward computes them */
    /* gradient with respect to the scores s (nonzero only where chosen) */
    for (int e = 0; e < E; e++) ds[e] = 0;
    if (scoring == NW_SCORE_SOFTMAX) {
        for (int k = 0; k < K; k++) ds[idx[k]] += scale * dw[k];
    } else {
        float sum = 0, dot = 0;
        for (int k = 0; k < K; k++) sum += sc[idx[k]];
        float T = sum + 1e-20f;
        for (int k = 0; k < K; k++) dot += dw[k] * (sc[idx[k]] / T);
        for (int k = 0; k < K; k++) ds[idx[k]] += scale / T * (dw[k] - dot);
    }
    /* through the scoring function */
    if (scoring == NW_SCORE_SOFTMAX) {
        float dot = 0;
        for (int e = 0; e < E; e++) dot += ds[e] * sc[e];
        for (int e = 0; e < E; e++) dlogit[e] = sc[e] * (ds[e] - dot);
    } else {
        for (int e = 0; e < E; e++) {
            float x = logit[e], s = sc[e], d;
            if (ds[e] == 0.0f) d = 0.0f; /* unchosen: also avoids 0·inf below */
            else if (scoring == NW_SCORE_SIGMOID) d = ds[e] * s * (1.0f - s);
            else if (s == 0.0f) d = 0.0f; /* softplus underflowed: see ops.h */
            else if (x > 20.0f) d = ds[e] * (0.5f / s);
            else d = ds[e] * (1.0f / (1.0f + expf(-x))) * (0.5f / s);
            dlogit[e] = d;
        }
    }
}

/* ------------------------------------------------------------ attention */

enum { ATT_QBLOCK = 64, ATT_DIRECT_ROWS = 4 };

/* scores (or probabilities) of one query block */
static size_t att_block_floats(int max_ctx, int Hq, int Hkv, int Dh) {
    size_t rows = (size_t)ATT_QBLOCK * Hq;
    if (rows < ATT_DIRECT_ROWS) rows = ATT_DIRECT_ROWS;
    /* several K/V heads: a group's query rows are gathered into one matrix,
     * and its output (or gradient) is gathered too, next to the scores */
    return rows * ((size_t)max_ctx + (Hkv > 1 ? 2 * (size_t)Dh : 0));
}

/* K and V rounded to bf16 for bf16 products: two [ctx, Hkv·Dh] uint16 */
static size_t att_b16_floats(int max_ctx, int Hkv, int Dh) { return (size_t)max_ctx * Hkv * Dh; }

size_t k_attention_work_floats(int max_ctx, int Hq, int Hkv, int Dh) {
    return att_block_floats(max_ctx, Hq, Hkv, Dh) + att_b16_floats(max_ctx, Hkv, Dh);
}

/* The keys and values the products read: fp32 (k, v with row stride ldkv),
 * and with bf16 products also rounded copies (k16, v16, dense rows of
 * Hkv·Dh; the same copy when k == v). Offsetting both by a head keeps them
 * in step. */
typedef struct {
    const float *k, *v;
    const uint16_t *k16, *v16; /* NULL: fp32 products */
    int ldkv, ld16;
} att_kv;

static att_kv att_kv_head(att_kv kv, int j, int Dh) {
    kv.k += (size_t)j * Dh, kv.v += (size_t)j * Dh;
    if (kv.k16) kv.k16 += (size_t)j * Dh, kv.v16 += (size_t)j * Dh;
    return kv;
}

/* Queries over a KV cache (p0 > 0: decoding, chunked prefill) keep fp32
 * products: rounding the whole cache on every call would cost more than the
 * products save for a few queries. Training and whole-sequence forwards
 * (p0 = 0) take bf16 at any length, so the precision never depends on how
 * wide a batch is. */
static att_kv att_kv_make(const float *k, const float *v, int ldkv, int ctx, int Hkv, int Dh, int p0,
                          whale_dtype products, uint16_t *b16) {
    att_kv kv = {k, v, NULL, NULL, ldkv, Hkv * Dh};
    if (products != WHALE_BF16 || p0 > 0) return kv;
    uint16_t *k16 = b16, *v16 = k == v ? k16 : b16 + (size_t)ctx * Hkv * Dh;
    WHALE_FOR_IF((long)ctx * Hkv * Dh >= 65536, (int t = 0; t < ctx; t++), {
        whale_f32_to_bf16_rows(k16 + (size_t)t * Hkv * Dh, k + (size_t)t * ldkv, (size_t)Hkv * Dh);
        if (v16 != k16) whale_f32_to_bf16_rows(v16 + (size_t)t * Hkv * Dh, v + (size_t)t * ldkv, (size_t)Hkv * Dh);
    });
    kv.k16 = k16, kv.v16 = v16;
    return kv;
}

/* The attention products in either precision. bf16: both operands rounded
 * to bf16, fp32 sums (whale_gemm_*_bf16), as PyTorch's bf16 autocast
 * computes them; scores, probabilities and gradients stay fp32 in between.
 *   scores  C[M,ctx] = A[M,Dh]·Kᵀ  (or dO·Vᵀ: att_nt with the V operand)
 *   out     C[M,Dh]  = P[M,ctx]·X  (X = V, or K for dq) */
static whale_code att_nt(whale_gemm *g, int M, int N, int K, const float *A, int lda, const float *B,
                         const uint16_t *B16, const att_kv *kv, float *C, int ldc, whale_err *err) {
    return B16 ? whale_gemm_nt_bf16(g, M, N, K, A, lda, B16, kv->ld16, C, ldc, 0, err)
               : whale_gemm_nt(g, M, N, K, A, lda, B, kv->ldkv, C, ldc, 0, err);
}
static whale_code att_nn(whale_gemm *g, int M, int N, int K, const float *A, int lda, const float *B,
                         const uint16_t *B16, const att_kv *kv, float *C, int ldc, whale_err *err) {
    return B16 ? whale_gemm_nn_bf16(g, M, N, K, A, lda, B16, kv->ld16, C, ldc, 0, err)
               : whale_gemm_nn(g, M, N, K, A, lda, B, kv->ldkv, C, ldc, 0, err);
}
/* dK or dV [ctx, Dh] (stride ldkv) += A[n,ctx]ᵀ·B[n,Dh] */
static whale_code att_tn(whale_gemm *g, const att_kv *kv, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, whale_err *err) {
    return kv->k16 ? whale_gemm_tn_bf16(g, M, N, K, A, lda, B, ldb, C, kv->ldkv, 1, err)
                   : whale_gemm_tn(g, M, N, K, A, lda, B, ldb, C, kv->ldkv, 1, err);
}

/* The query rows of K/V head j's group for positions s0..s0+nq−1, as one
 * [nq·rep, Dh] matrix (position-major, then head), and back. */
static void gather_group(float *dst, const float *src, int s0, int nq, int Hq, int rep, int j, int Dh) {
    for (int s = 0; s < nq; s++)
        memcpy(dst + (size_t)s * rep * Dh, src + ((size_t)(s0 + s) * Hq + (size_t)j * rep) * Dh,
               sizeof(float) * (size_t)rep * Dh);
}

static void scatter_group(float *dst, const float *src, int s0, int nq, int Hq, int rep, int j, int Dh) {
    for (int s = 0; s < nq; s++)
        memcpy(dst + ((size_t)(s0 + s) * Hq + (size_t)j * rep) * Dh, src + (size_t)s * rep * Dh,
               sizeof(float) * (size_t)rep * Dh);
}

/* softmax of row[lo..valid) scaled by `scale` (> 0, so the largest raw
 * score is the largest scaled one); entries outside set to 0. Vectorised
 * (vmath.h): exp((x − max)·scale), summed in fixed lanes. */
static void masked_softmax(float *row, int lo, int valid, int n, float scale) {
    float mx = k_max(row + lo, valid - lo);
    float inv = (float)(1.0 / k_exp_sum(row + lo, row + lo, mx, scale, valid - lo));
    memset(row, 0, sizeof(float) * (size_t)lo);
    k_scale(row + lo, inv, valid - lo);
    memset(row + valid, 0, sizeof(float) * (size_t)(n - valid));
}

/* first key a query may see: its segment's start, or 0 */
#define SEG_LO(seg, s) ((seg) ? (seg)[s] : 0)

/* Decoding: a few query positions per span, all spans of a micro-batch in
 * one parallel region. When no span holds more than half of the scores,
 * the threads take whole spans, each through the three steps below on its
 * own (few_span): no barrier, and a span's keys stay in one core's cache.
 * Otherwise (one span, or one long one among short ones) the three steps
 * are split over the threads with a barrier between:
 *   Scores: the keys of all spans, laid end to end, are cut into one
 *   contiguous share per thread; a thread runs the skinny nt kernel over
 *   its share's part of each span, for the rep query heads of each K/V
 *   head (every key read once for all query heads that share it). One long
 *   span splits its keys over the threads; eight short ones keep them all
 *   busy too.
 *   Softmax: row by row, over all spans' rows.
 *   Output: items of up to ATT_FEW_ROWS rows of one span × ATT_ITEM_COLS
 *   columns of the head dimension; an item walks its span's keys once per
 *   ATT_COLS columns (once for all three when its rows share one K/V
 *   head), so V is read once.
 * Each row's scores, softmax and output come from the same calls on the
 * same operands whatever the thread count and whichever spans share the
 * region (a span's row blocks start at its first row), so batching changes
 * no bit. Products in fp32. Against the GEMM path of k_attention (three
 * products, three regions) inside nanowhale-100m's decode: 9-10 us instead
 * of 12-14 per layer at context 128, 40 instead of 50-86 at context 1024.
 * All spans in one region against one region per span (main's kernel; the
 * call alone, 8 spans of context 160-209 or 512-561, medians of 5
 * alternated runs), nanowhale-100m's heads (8 on one K/V head, 96 wide) and
 * Qwen2.5-0.5B's (14 on 2, 64 wide):
 *   1 thread, processor time: 61 us instead of 127 and 179 instead of 330;
 *     109 instead of 172 and 348 instead of 489 (one span: 12 instead of
 *     16.5, 16 instead of 20, at context 160);
 *   2 threads on 2 cores shared with other work (load average 9, where a
 *     barrier waits for a descheduled thread): 2.1 ms instead of 17 and 9
 *     instead of 24; 7.6 instead of 17 and 16 instead of 45.
 * The whole decode step, 2 threads, 8 streams (docs/architecture.md): the
 * attention group 129 → 58 ms for 64 steps (nanowhale-100m bf16, context
 * 128), 192 → 104 (int8, context 512), 487 → 326 (Qwen2.5-0.5B bf16). */
enum {
    ATT_COLS = 16,      /* one zmm of fp32 */
    ATT_ITEM_COLS = 48, /* columns of an output item: three of those */
    ATT_FEW_ROWS = 8,
    ATT_GROUP = 64 /* spans per region at most */
};
/* A group runs on the team when one thread's time for it, at
 * ATT_PRODUCTS_PER_US score × head-dimension products a microsecond, is
 * worth one region (spans shared out whole) or ATT_STEPS_REGIONS (the
 * steps split: a region and three barriers) by whale_par_worth; below, on
 * the calling thread. One thread does some 27,000 a microsecond with its
 * operands in cache, a third of that in the decode step; 40,000 puts the
 * thresholds where they were measured best here (80,000 and 200,000
 * products a microsecond of region cost). On a 2-core virtual machine
 * (a region 3.5 us, a barrier 1.7; whale_par_sync_us 5), nanowhale-100m's
 * heads (8 on one K/V head, 96 wide), the call alone, one thread against
 * two: one span of context 144 4.1 us against 13 (split steps), 1,024
 * keys 26 against 29, 2,048 keys 66 against 45; eight spans of context
 * 16 6.9 against 8.8 (whole spans), 64 16.5 against 16.2, 144 33 against
 * 25-31 (split steps: 38). In the decode step (whale bench, int8, 256
 * tokens from context 16), the attention call per layer: one stream 21 us
 * -> 12, eight 41-49 -> 33-38, against a single constant of 32,768. */
#define ATT_PRODUCTS_PER_US 40000.0
#define ATT_STEPS_REGIONS 2.5

/* The spans of one region, and where each one's keys, score rows, output
 * items and scores start (offsets of span i at [i], totals at [n]). */
typedef struct {
    int n, Hq, Hkv, Dh;
    k_att_span sp[ATT_GROUP];
    long keys[ATT_GROUP + 1], rows[ATT_GROUP + 1], items[ATT_GROUP + 1];
    size_t sc[ATT_GROUP + 1]; /* floats into work: [S·Hq, p0 + S] each */
} att_group;

static void group_init(att_group *G, int Hq, int Hkv, int Dh) {
    G->n = 0, G->Hq = Hq, G->Hkv = Hkv, G->Dh = Dh;
    G->keys[0] = G->rows[0] = G->items[0] = 0, G->sc[0] = 0;
}

static void group_add(att_group *G, const k_att_span *sp) {
    const int i = G->n++, ctx = sp->p0 + sp->S, rows = sp->S * G->Hq;
    G->sp[i] = *sp;
    G->keys[i + 1] = G->keys[i] + ctx;
    G->rows[i + 1] = G->rows[i] + rows;
    G->items[i + 1] = G->items[i] + (long)((rows + ATT_FEW_ROWS - 1) / ATT_FEW_ROWS) *
                                        ((G->Dh + ATT_ITEM_COLS - 1) / ATT_ITEM_COLS);
    G->sc[i + 1] = G->sc[i] + (size_t)rows * ctx;
}

/* the span whose range [off[i], off[i+1]) holds x (0 <= x < off[n]) */
static int group_find(const long *off, int n, long x) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (off[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Scores of keys [lo, hi) of the spans laid end to end. */
static void few_scores(const att_group *G, float *work, long lo, long hi) {
    const int rep = G->Hq / G->Hkv, Dh = G->Dh;
    for (int i = lo < hi ? group_find(G->keys, G->n, lo) : G->n; i < G->n && G->keys[i] < hi; i++) {
        const k_att_span *sp = &G->sp[i];
        const int ctx = sp->p0 + sp->S;
        const int t0 = (int)((lo > G->keys[i] ? lo : G->keys[i]) - G->keys[i]);
        const int t1 = (int)((hi < G->keys[i + 1] ? hi : G->keys[i + 1]) - G->keys[i]);
        float *sc = work + G->sc[i];
        for (int s = 0; s < sp->S; s++)
            for (int j = 0; j < G->Hkv; j++) { /* the rep query heads of K/V head j: consecutive rows */
                const long r0 = (long)s * G->Hq + (long)j * rep;
                whale_gemm_nt_serial(rep, t1 - t0, Dh, sp->q + r0 * Dh, Dh, sp->k + (long)t0 * sp->ldkv + (long)j * Dh,
                                     sp->ldkv, sc + r0 * ctx + t0, ctx);
            }
    }
}

#if WHALE_X86
WHALE_TARGET_BEGIN(WHALE_FEATURES_AVX512)
/* acc[i][0..16) = sum_t p_i[t] · v_i[t][0..16) for a block of
 * ATT_FEW_ROWS rows (rows from nr on get weight 0): the full-width column
 * block of few_pv_item, kept in registers. When the rows share one K/V
 * head (all of them with one K/V head) each key's V vector is loaded once
 * for all of them: the same products and sums, 9 loads per 8 FMAs instead
 * of 16; nanowhale-100m's decode attention of 8 spans (context 160-210)
 * took 15-25% less processor time with it at 1 thread. */
static void pv_block_avx512(float acc[][ATT_COLS], const float *const *pr, const float *const *vr, int nr,
                            int ctx, int ldkv) {
    __m512 a[ATT_FEW_ROWS];
    int shared = 1;
#pragma GCC unroll 8
    for (int i = 0; i < ATT_FEW_ROWS; i++) a[i] = _mm512_setzero_ps(), shared &= vr[i] == vr[0];
    if (shared)
        for (int t = 0; t < ctx; t++) {
            const __m512 v = _mm512_loadu_ps(vr[0] + (long)t * ldkv);
#pragma GCC unroll 8
            for (int i = 0; i < ATT_FEW_ROWS; i++)
                a[i] = _mm512_fmadd_ps(_mm512_set1_ps(i < nr ? pr[i][t] : 0.0f), v, a[i]);
        }
    else
        for (int t = 0; t < ctx; t++)
#pragma GCC unroll 8
            for (int i = 0; i < ATT_FEW_ROWS; i++)
                a[i] = _mm512_fmadd_ps(_mm512_set1_ps(i < nr ? pr[i][t] : 0.0f),
                                       _mm512_loadu_ps(vr[i] + (long)t * ldkv), a[i]);
#pragma GCC unroll 8
    for (int i = 0; i < ATT_FEW_ROWS; i++) _mm512_storeu_ps(acc[i], a[i]);
}

/* out[i][0..48) = sum_t p[i·st + t] · v[t·ldkv + 0..48) for a whole block
 * of ATT_FEW_ROWS rows on one V head: per key three V loads and eight
 * broadcasts for 24 FMAs (pv_block_avx512: one load and eight broadcasts
 * for 8), each lane the same fused sums in key order, so the same bits.
 * nanowhale-100m's decode attention of 8 spans (context 150), one thread,
 * processor time of a call (best of 2000), six runs alternated: 62-77 us
 * against 75-96 with 16 columns an item. */
static void pv_wide_avx512(float *out, long ldo, const float *p, long st, const float *v, int ctx, int ldkv) {
    __m512 a[ATT_FEW_ROWS][3];
#pragma GCC unroll 8
    for (int i = 0; i < ATT_FEW_ROWS; i++) a[i][0] = a[i][1] = a[i][2] = _mm512_setzero_ps();
    for (int t = 0; t < ctx; t++) {
        const float *vt = v + (long)t * ldkv;
        const __m512 v0 = _mm512_loadu_ps(vt), v1 = _mm512_loadu_ps(vt + 16), v2 = _mm512_loadu_ps(vt + 32);
#pragma GCC unroll 8
        for (int i = 0; i < ATT_FEW_ROWS; i++) {
            const __m512 b = _mm512_set1_ps(p[i * st + t]);
            a[i][0] = _mm512_fmadd_ps(b, v0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(b, v1, a[i][1]);
            a[i][2] = _mm512_fmadd_ps(b, v2, a[i][2]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < ATT_FEW_ROWS; i++)
        for (int j = 0; j < 3; j++) _mm512_storeu_ps(out + i * ldo + 16 * j, a[i][j]);
}
WHALE_TARGET_END
#endif

/* Rows rb .. rb + ATT_FEW_ROWS − 1 (those that exist) × columns c0 .. c0 +
 * ATT_COLS − 1 of span i's P·V. */
static void few_pv_cols(const att_group *G, int i, int rb, int c0, const float *work) {
    const k_att_span *sp = &G->sp[i];
    const int Dh = G->Dh, rep = G->Hq / G->Hkv;
    const int ctx = sp->p0 + sp->S, rows = sp->S * G->Hq;
    const int w = Dh - c0 < ATT_COLS ? Dh - c0 : ATT_COLS, nr = rows - rb < ATT_FEW_ROWS ? rows - rb : ATT_FEW_ROWS;
    const float *sc = work + G->sc[i];
    /* a full block of rows (missing ones repeat the last with weight 0) and
     * whole vectors, so the accumulators stay in registers; probabilities
     * are 0 outside a row's keys, so every row walks all of them */
    float acc[ATT_FEW_ROWS][ATT_COLS] = {{0}}, vbuf[ATT_COLS] = {0};
    const float *vr[ATT_FEW_ROWS], *pr[ATT_FEW_ROWS];
    for (int x = 0; x < ATT_FEW_ROWS; x++) {
        int r = rb + (x < nr ? x : nr - 1);
        vr[x] = sp->v + (long)((r % G->Hq) / rep) * Dh + c0;
        pr[x] = sc + (long)r * ctx;
    }
#if WHALE_X86
    if (w == ATT_COLS && whale_isa_at_least(WHALE_ISA_AVX512))
        pv_block_avx512(acc, pr, vr, nr, ctx, sp->ldkv);
    else
#endif
        for (int t = 0; t < ctx; t++)
            for (int x = 0; x < ATT_FEW_ROWS; x++) {
                const float p = x < nr ? pr[x][t] : 0.0f, *vt = vr[x] + (long)t * sp->ldkv;
                if (w < ATT_COLS) { /* the last, partial columns */
                    memcpy(vbuf, vt, sizeof(float) * (size_t)w);
                    vt = vbuf;
                }
                for (int c = 0; c < ATT_COLS; c++) acc[x][c] += p * vt[c];
            }
    for (int x = 0; x < nr; x++) memcpy(sp->out + (long)(rb + x) * Dh + c0, acc[x], sizeof(float) * (size_t)w);
}

/* Output item `it` of span i: rows rb .. rb + ATT_FEW_ROWS − 1 (those that
 * exist) × columns c0 .. c0 + ATT_ITEM_COLS − 1 (those that exist) of P·V:
 * a whole block of rows on one K/V head and all 48 columns in one walk over
 * the keys (pv_wide_avx512), else 16 columns at a time. */
static void few_pv_item(const att_group *G, int i, long it, const float *work) {
    const k_att_span *sp = &G->sp[i];
    const int Dh = G->Dh, rep = G->Hq / G->Hkv, chunks = (Dh + ATT_ITEM_COLS - 1) / ATT_ITEM_COLS;
    const int rows = sp->S * G->Hq, rb = (int)(it / chunks) * ATT_FEW_ROWS, c0 = (int)(it % chunks) * ATT_ITEM_COLS;
#if WHALE_X86
    const int last = rb + ATT_FEW_ROWS - 1; /* one K/V head: within one position, heads only grow */
    const int one_head = G->Hkv == 1 || (rb / G->Hq == last / G->Hq && (rb % G->Hq) / rep == (last % G->Hq) / rep);
    const int whole = rows - rb >= ATT_FEW_ROWS && Dh - c0 >= ATT_ITEM_COLS && one_head;
    if (whole && whale_isa_at_least(WHALE_ISA_AVX512)) {
        const int ctx = sp->p0 + sp->S;
        pv_wide_avx512(sp->out + (long)rb * Dh + c0, Dh, work + G->sc[i] + (size_t)rb * ctx, ctx,
                       sp->v + (long)((rb % G->Hq) / rep) * Dh + c0, ctx, sp->ldkv);
        return;
    }
#endif
    for (int c = c0; c < Dh && c < c0 + ATT_ITEM_COLS; c += ATT_COLS) few_pv_cols(G, i, rb, c, work);
}

/* The three steps over a group; scores in work [G->sc[n]]. */
/* Row r of the group's scores (its span's row rr) through the masked softmax. */
static void few_softmax_row(const att_group *G, float scale, float *work, long r) {
    const int i = group_find(G->rows, G->n, r), rr = (int)(r - G->rows[i]), s = rr / G->Hq;
    const k_att_span *sp = &G->sp[i];
    masked_softmax(work + G->sc[i] + (size_t)rr * (size_t)(sp->p0 + sp->S), SEG_LO(sp->seg, s), sp->p0 + s + 1,
                   sp->p0 + sp->S, scale);
}

/* Item it of the group through P·V. */
static void few_pv(const att_group *G, float *work, long it) {
    const int i = group_find(G->items, G->n, it);
    few_pv_item(G, i, it - G->items[i], work);
}

/* Span i through the three steps on this thread: the calls the serial path
 * makes for it, so the same bits. */
static void few_span(const att_group *G, float scale, float *work, int i) {
    few_scores(G, work, G->keys[i], G->keys[i + 1]);
    for (long r = G->rows[i]; r < G->rows[i + 1]; r++) few_softmax_row(G, scale, work, r);
    for (long it = G->items[i]; it < G->items[i + 1]; it++) few_pv(G, work, it);
}

/* Whether the group's spans can be shared out whole: two or more, none
 * holding more than half of the scores. */
static int few_by_spans(const att_group *G) {
    size_t most = 0;
    for (int i = 0; i < G->n; i++)
        if (G->sc[i + 1] - G->sc[i] > most) most = G->sc[i + 1] - G->sc[i];
    return G->n >= 2 && 2 * most <= G->sc[G->n];
}

/* The three steps over a group; scores in work [G->sc[n]]. Spans that can
 * be shared out whole go to the threads in contiguous shares, each span
 * through all three steps (few_span): one region and no barrier.
 * Otherwise (one span or one that dominates) the three steps split keys,
 * rows and items with a barrier between. On this thread without entering
 * OpenMP when the group is small for what a region costs. */
static void attention_few(const att_group *G, float scale, float *work) {
    const long nkeys = G->keys[G->n], nrows = G->rows[G->n], nitems = G->items[G->n];
    const double one_thread_us = (double)G->sc[G->n] * G->Dh / ATT_PRODUCTS_PER_US;
    /* handed between cores (whale_par_move_us): the queries and outputs,
     * and when the steps split, the scores between them */
    const double qo = 8.0 * (double)nrows * G->Dh, scores = 8.0 * (double)G->sc[G->n];
    if (few_by_spans(G) && whale_par_worth(one_thread_us, 1, qo)) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < G->n; i++) few_span(G, scale, work, i);
        return;
    }
    if (!whale_par_worth(one_thread_us, ATT_STEPS_REGIONS, qo + scores)) {
        few_scores(G, work, 0, nkeys);
        for (long r = 0; r < nrows; r++) few_softmax_row(G, scale, work, r);
        for (long it = 0; it < nitems; it++) few_pv(G, work, it);
        return;
    }
#pragma omp parallel
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        few_scores(G, work, nkeys * id / nt, nkeys * (id + 1) / nt);
#pragma omp barrier
#pragma omp for schedule(static)
        for (long r = 0; r < nrows; r++) few_softmax_row(G, scale, work, r);
#pragma omp for schedule(static)
        for (long it = 0; it < nitems; it++) few_pv(G, work, it);
    }
}

/* Whether k_attention takes the few-row path: a few query positions
 * (decoding) in one region in fp32, where the GEMM path costs three
 * regions per K/V head; a bf16 forward of a whole (short) sequence with
 * one K/V head keeps its bf16 products, as at any other length. */
static int att_few(int S, int p0, int Hq, int Hkv, whale_dtype products) {
    const int bf16_whole = products == WHALE_BF16 && p0 == 0;
    return S * Hq <= ATT_DIRECT_ROWS || (S <= ATT_DIRECT_ROWS && (Hkv > 1 || !bf16_whole));
}

whale_code k_attention(whale_gemm *g, float *out, const float *q, const float *k, const float *v,
                       int ldkv, const int32_t *seg, int S, int p0, int Hq, int Hkv, int Dh, float scale,
                       whale_dtype products, float *work, whale_err *err) {
    if (att_few(S, p0, Hq, Hkv, products)) {
        att_group G;
        group_init(&G, Hq, Hkv, Dh);
        group_add(&G, &(k_att_span){out, q, k, v, ldkv, seg, S, p0});
        attention_few(&G, scale, work);
        return WHALE_OK;
    }
    int rep = Hq / Hkv;
    att_kv kv = att_kv_make(k, v, ldkv, p0 + S, Hkv, Dh, p0, products,
                            (uint16_t *)(work + att_block_floats(p0 + S, Hq, Hkv, Dh)));
    /* Query blocks: keys beyond the block's last position are never needed,
     * so causal attention costs about half of the full square. */
    for (int s0 = 0; s0 < S; s0 += ATT_QBLOCK) {
        int s1 = s0 + ATT_QBLOCK < S ? s0 + ATT_QBLOCK : S, nq = s1 - s0, ctx = p0 + s1;
        /* one shared head: all query heads of the block form one matrix;
         * GQA: the rep query heads sharing K/V head j, gathered into one
         * matrix (rows position-major, as above), take one product each way
         * instead of one per head */
        int rows = nq * rep;
        float *Qg = work + (size_t)rows * ctx, *Og = Qg + (size_t)rows * Dh;
        for (int j = 0; j < Hkv; j++) {
            att_kv h = att_kv_head(kv, j, Dh);
            const float *Q = q + (long)s0 * Hq * Dh;
            float *O = out + (long)s0 * Hq * Dh;
            if (Hkv > 1) {
                gather_group(Qg, q, s0, nq, Hq, rep, j, Dh);
                Q = Qg, O = Og;
            }
            whale_code c = att_nt(g, rows, ctx, Dh, Q, Dh, h.k, h.k16, &h, work, ctx, err);
            if (c) return c;
            WHALE_FOR_IF((long)rows * ctx > 16384, (int r = 0; r < rows; r++), {
                masked_softmax(work + (long)r * ctx, SEG_LO(seg, s0 + r / rep), p0 + s0 + r / rep + 1, ctx, scale);
            });
            if ((c = att_nn(g, rows, Dh, ctx, work, ctx, h.v, h.v16, &h, O, Dh, err))) return c;
            if (Hkv > 1) scatter_group(out, Og, s0, nq, Hq, rep, j, Dh);
        }
    }
    return WHALE_OK;
}

whale_code k_attention_spans(whale_gemm *g, const k_att_span *spans, int n, int Hq, int Hkv, int Dh, float scale,
                             whale_dtype products, float *work, whale_err *err) {
    int max_ctx = 1;
    for (int i = 0; i < n; i++)
        if (spans[i].p0 + spans[i].S > max_ctx) max_ctx = spans[i].p0 + spans[i].S;
    /* what the caller's work holds at least; one span's scores always fit */
    const size_t cap = k_attention_work_floats(max_ctx, Hq, Hkv, Dh);
    att_group G;
    group_init(&G, Hq, Hkv, Dh);
    for (int i = 0; i < n; i++) {
        const k_att_span *sp = &spans[i];
        if (!att_few(sp->S, sp->p0, Hq, Hkv, products)) { /* prefill: its own products */
            whale_code c = k_attention(g, sp->out, sp->q, sp->k, sp->v, sp->ldkv, sp->seg, sp->S, sp->p0, Hq, Hkv,
                                       Dh, scale, products, work, err);
            if (c) return c;
            continue;
        }
        if (G.n == ATT_GROUP || G.sc[G.n] + (size_t)sp->S * Hq * (size_t)(sp->p0 + sp->S) > cap) {
            attention_few(&G, scale, work);
            group_init(&G, Hq, Hkv, Dh);
        }
        group_add(&G, sp);
    }
    if (G.n) attention_few(&G, scale, work);
    return WHALE_OK;
}

size_t k_attention_backward_work_floats(int max_ctx, int Hq, int Hkv, int Dh) {
    /* probabilities and their gradient, then the bf16 copies of K and V */
    return 2 * att_block_floats(max_ctx, Hq, Hkv, Dh) + att_b16_floats(max_ctx, Hkv, Dh);
}

/* One row's score gradient from its probabilities p and dp = dO·vᵀ (in place):
 * ds_t = p_t·(dp_t − Σ_u p_u·dp_u)·scale, where the scale folds in the
 * forward's multiplication of the raw dot products. Masked entries become 0. */
static void softmax_row_backward(float *dp, const float *p, int lo, int valid, int n, float scale) {
    float d = (float)k_dot_f64(p + lo, dp + lo, valid - lo);
    for (int t = 0; t < lo; t++) dp[t] = 0;
    for (int t = lo; t < valid; t++) dp[t] = p[t] * (dp[t] - d) * scale;
    for (int t = valid; t < n; t++) dp[t] = 0;
}

/* Few query rows: per-row dot products; the sums over query rows into dk/dv
 * run per key position, each by one thread in row order (deterministic). */
static void attention_backward_direct(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                      const float *k, const float *v, int ldkv, const int32_t *seg, int S, int p0,
                                      int Hq, int Hkv, int Dh, float scale, float *work) {
    int ctx = p0 + S, rep = Hq / Hkv, rows = S * Hq;
    float *P = work, *dS = work + (size_t)rows * ctx;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        int s = r / Hq, j = (r % Hq) / rep, valid = p0 + s + 1, lo = SEG_LO(seg, s);
        const float *qr = q + (long)r * Dh, *dor = dout + (long)r * Dh;
        float *pr = P + (long)r * ctx, *dsr = dS + (long)r * ctx;
        for (int t = lo; t < valid; t++) {
            const float *kt = k + (long)t * ldkv + (long)j * Dh, *vt = v + (long)t * ldkv + (long)j * Dh;
            float a = 0, b = 0;
            for (int i = 0; i < Dh; i++) {
                a += qr[i] * kt[i];
                b += dor[i] * vt[i];
            }
            pr[t] = a;
            dsr[t] = b;
        }
        masked_softmax(pr, lo, valid, ctx, scale);
        softmax_row_backward(dsr, pr, lo, valid, ctx, scale);
        float *dqr = dq + (long)r * Dh;
        memset(dqr, 0, sizeof(float) * (size_t)Dh);
        for (int t = lo; t < valid; t++) {
            const float *kt = k + (long)t * ldkv + (long)j * Dh;
            for (int i = 0; i < Dh; i++) dqr[i] += dsr[t] * kt[i];
        }
    }
    /* dk then dv for each key row: correct also when dk == dv */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < ctx; t++)
        for (int j = 0; j < Hkv; j++) {
            float *dkt = dk + (long)t * ldkv + (long)j * Dh, *dvt = dv + (long)t * ldkv + (long)j * Dh;
            int s_first = t > p0 ? t - p0 : 0; /* first query row that sees key t */
            for (int s = s_first; s < S; s++)
                for (int h = j * rep; h < (j + 1) * rep; h++) {
                    long r = (long)s * Hq + h;
                    float w = dS[r * ctx + t];
                    const float *qr = q + r * Dh;
                    for (int i = 0; i < Dh; i++) dkt[i] += w * qr[i];
                }
            for (int s = s_first; s < S; s++)
                for (int h = j * rep; h < (j + 1) * rep; h++) {
                    long r = (long)s * Hq + h;
                    float w = P[r * ctx + t];
                    const float *dor = dout + r * Dh;
                    for (int i = 0; i < Dh; i++) dvt[i] += w * dor[i];
                }
        }
}

/* GEMM path for one block of query rows (all heads sharing one K/V head):
 * n rows of q/dout/dq with stride ldq, row r at query position p0+s0+r/per. */
static whale_code attention_backward_block(whale_gemm *g, float *dq, float *dk, float *dv, const float *dout,
                                           const float *q, const att_kv *kv, int ldq, int n, int per,
                                           const int32_t *seg, int first_valid, int ctx, int Dh, float scale,
                                           float *P, float *dS, whale_err *err) {
    whale_code c;
    if ((c = att_nt(g, n, ctx, Dh, q, ldq, kv->k, kv->k16, kv, P, ctx, err))) return c;
    if ((c = att_nt(g, n, ctx, Dh, dout, ldq, kv->v, kv->v16, kv, dS, ctx, err))) return c;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
        float *pr = P + (long)r * ctx;
        int lo = SEG_LO(seg, r / per);
        masked_softmax(pr, lo, first_valid + r / per, ctx, scale);
        softmax_row_backward(dS + (long)r * ctx, pr, lo, first_valid + r / per, ctx, scale);
    }
    if ((c = att_nn(g, n, Dh, ctx, dS, ctx, kv->k, kv->k16, kv, dq, ldq, err))) return c;
    if ((c = att_tn(g, kv, ctx, Dh, n, dS, ctx, q, ldq, dk, err))) return c;
    return att_tn(g, kv, ctx, Dh, n, P, ctx, dout, ldq, dv, err);
}

whale_code k_attention_backward(whale_gemm *g, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                const float *k, const float *v, int ldkv, const int32_t *seg, int S, int p0, int Hq,
                                int Hkv, int Dh, float scale, whale_dtype products, float *work, whale_err *err) {
    if (S * Hq <= ATT_DIRECT_ROWS) {
        attention_backward_direct(dq, dk, dv, dout, q, k, v, ldkv, seg, S, p0, Hq, Hkv, Dh, scale, work);
        return WHALE_OK;
    }
    int rep = Hq / Hkv;
    size_t block = att_block_floats(p0 + S, Hq, Hkv, Dh);
    float *P = work, *dS = work + block;
    att_kv kv = att_kv_make(k, v, ldkv, p0 + S, Hkv, Dh, p0, products, (uint16_t *)(work + 2 * block));
    /* Same query blocks as the forward, so the recomputed probabilities are
     * the forward's; dk/dv accumulate block after block in a fixed order.
     * GQA: each K/V head's group of query heads in one block (the forward's
     * gathering), the gathered dq scattered back. */
    for (int s0 = 0; s0 < S; s0 += ATT_QBLOCK) {
        int s1 = s0 + ATT_QBLOCK < S ? s0 + ATT_QBLOCK : S, nq = s1 - s0, ctx = p0 + s1, rows = nq * rep;
        long off = (long)s0 * Hq * Dh;
        float *Qg = P + (size_t)rows * ctx, *Dg = Qg + (size_t)rows * Dh, *dQg = dS + (size_t)rows * ctx;
        for (int j = 0; j < Hkv; j++) {
            att_kv h = att_kv_head(kv, j, Dh);
            long koff = (long)j * Dh;
            whale_code c;
            if (Hkv == 1)
                c = attention_backward_block(g, dq + off, dk, dv, dout + off, q + off, &h, Dh, rows, rep,
                                             seg ? seg + s0 : NULL, p0 + s0 + 1, ctx, Dh, scale, P, dS, err);
            else {
                gather_group(Qg, q, s0, nq, Hq, rep, j, Dh);
                gather_group(Dg, dout, s0, nq, Hq, rep, j, Dh);
                c = attention_backward_block(g, dQg, dk + koff, dv + koff, Dg, Qg, &h, Dh, rows, rep,
                                             seg ? seg + s0 : NULL, p0 + s0 + 1, ctx, Dh, scale, P, dS, err);
                if (!c) scatter_group(dq, dQg, s0, nq, Hq, rep, j, Dh);
            }
            if (c) return c;
        }
    }
    return WHALE_OK;
}

void k_add(float *y, const float *a, const float *b, size_t n) {
    WHALE_FOR_IF(n > 65536, (size_t i = 0; i < n; i++), { y[i] = a[i] + b[i]; });
}

void k_add_rows(float *y, const float *b, long rows, int n) {
    WHALE_FOR_IF(rows * n > 65536, (long r = 0; r < rows; r++), {
        float *yr = y + (size_t)r * n;
        for (int i = 0; i < n; i++) yr[i] += b[i];
    });
}

void k_add_rows_backward(float *db, const float *dy, long rows, int n) {
    enum { COLS = 32 };
    int nb = (n + COLS - 1) / COLS;
    WHALE_FOR_IF(rows * n > 16384, (int b = 0; b < nb; b++), {
        int c0 = b * COLS, c1 = c0 + COLS < n ? c0 + COLS : n;
        double acc[COLS] = {0};
        for (long r = 0; r < rows; r++)
            for (int i = c0; i < c1; i++) acc[i - c0] += dy[(size_t)r * n + i];
        for (int i = c0; i < c1; i++) db[i] += (float)acc[i - c0];
    });
}

void k_gather_rows(float *dst, const float *src, int ld, const int32_t *idx, const float *w, long n, int cols) {
    WHALE_FOR_IF(n * cols > 65536, (long i = 0; i < n; i++), {
        const float *x = src + (size_t)(idx ? idx[i] : i) * ld;
        float *y = dst + (size_t)i * cols;
        if (w)
            for (int d = 0; d < cols; d++) y[d] = w[i] * x[d];
        else
            memcpy(y, x, sizeof(float) * (size_t)cols);
    });
}

void k_scatter_add_rows(float *dst, int ldd, const float *src, int lds, const int32_t *idx, const float *w, long n,
                        int cols) {
    enum { COLS = 64 };
    int nb = (cols + COLS - 1) / COLS;
    WHALE_FOR_IF(n * cols > 65536, (int b = 0; b < nb; b++), {
        int c0 = b * COLS, c1 = c0 + COLS < cols ? c0 + COLS : cols;
        for (long i = 0; i < n; i++) {
            float *o = dst + (size_t)(idx ? idx[i] : i) * ldd;
            const float *r = src + (size_t)i * lds;
            if (w)
                for (int d = c0; d < c1; d++) o[d] += w[i] * r[d];
            else
                for (int d = c0; d < c1; d++) o[d] += r[d];
        }
    });
}

void k_dot_rows(float *out, const float *A, int lda, const int32_t *ia, const float *B, int ldb, const int32_t *ib,
                long n, int cols) {
    WHALE_FOR_IF(n > 64, (long i = 0; i < n; i++), {
        out[i] = (float)k_dot_f64(A + (size_t)(ia ? ia[i] : i) * lda, B + (size_t)(ib ? ib[i] : i) * ldb, cols);
    });
}
