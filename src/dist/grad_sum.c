/* The ordered sum of every rank's gradients (dist/dist.h): an all-to-all of
 * shards per round, each shard summed in rank order by its owner, then an
 * all-gather of the shards. */
#include "dist/dist.h"

#include "core/core.h"

#include <assert.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct whale_grad_sum {
    size_t n;           /* elements of the vector */
    int size, rank;
    size_t *off;        /* [size + 1]: rank r owns [off[r], off[r+1]) */
    size_t chunk;       /* elements per rank and exchange */
    float *acc;         /* the owned shard's running sum */
    float *send, *recv; /* [size × chunk] each, with more than one rank (send: above 2^31 elements) */
    float *piece;       /* [chunk]: this rank's piece of a vector gathered from spans (shards given) */
};

static size_t max_shard(const whale_grad_sum *g);

/* MPI counts and displacements are ints: below 2^31 elements the vector
 * itself is sent from and received into, above it the pieces go through
 * the exchange buffers. */
static int direct(const whale_grad_sum *g) { return g->n + g->chunk <= (size_t)INT_MAX; }

/* Elements per rank and exchange: 16 MiB of floats in flight per buffer,
 * or less when the largest shard is smaller. */
static size_t chunk_for(int size, size_t largest) {
    size_t chunk = ((size_t)1 << 22) / (size_t)size;
    return largest < chunk ? (largest ? largest : 1) : chunk;
}

/* Floats of the exchange buffers (recv, send, piece) for n elements on size ranks. */
static size_t buffer_floats(size_t n, int size, int sharded) {
    size_t chunk = chunk_for(size, (n + (size_t)size - 1) / (size_t)size);
    if (size == 1) return 0;
    return chunk * (size_t)size * (1 + (n + chunk > (size_t)INT_MAX)) + (sharded ? chunk : 0);
}

size_t whale_grad_sum_bytes_for(size_t n, int size, int sharded) {
    size_t own = (n + (size_t)size - 1) / (size_t)size;
    return sizeof(float) * (own + buffer_floats(n, size, sharded));
}

void whale_grad_sum_free(whale_grad_sum *g) {
    if (!g) return;
    free(g->off);
    free(g->acc);
    free(g->send);
    free(g->recv);
    free(g->piece);
    free(g);
}

whale_code whale_grad_sum_new(size_t n, const size_t *shards, whale_grad_sum **out, whale_err *err) {
    whale_grad_sum *g = calloc(1, sizeof *g);
    *out = NULL;
    if (!g) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    g->n = n, g->size = whale_dist_size(), g->rank = whale_dist_rank();
    g->off = malloc(sizeof(size_t) * (size_t)(g->size + 1));
    for (int r = 0; g->off && r <= g->size; r++)
        g->off[r] = shards ? shards[r] : (size_t)((unsigned __int128)n * r / g->size);
    for (int r = 0; g->off && shards && r < g->size; r++) assert(g->off[r] <= g->off[r + 1]);
    assert(!g->off || (g->off[0] == 0 && g->off[g->size] == n));
    size_t own = g->off ? g->off[g->rank + 1] - g->off[g->rank] : 0;
    g->chunk = g->off ? chunk_for(g->size, max_shard(g)) : 1;
    g->acc = whale_alloc(sizeof(float) * (own ? own : 1));
    if (g->size > 1) {
        if (!direct(g)) g->send = whale_alloc(sizeof(float) * g->chunk * (size_t)g->size);
        g->recv = whale_alloc(sizeof(float) * g->chunk * (size_t)g->size);
        if (shards) g->piece = whale_alloc(sizeof(float) * g->chunk);
    }
    if (!g->off || !g->acc ||
        (g->size > 1 && ((!direct(g) && !g->send) || !g->recv || (shards && !g->piece)))) {
        whale_grad_sum_free(g);
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB to sum gradients", own * 4.0 / 1048576.0);
    }
    *out = g;
    return WHALE_OK;
}

size_t whale_grad_sum_bytes(const whale_grad_sum *g) {
    size_t own = g->off[g->rank + 1] - g->off[g->rank];
    size_t buffers = g->size == 1 ? 0 : g->chunk * (size_t)g->size * (1 + !direct(g)) + (g->piece ? g->chunk : 0);
    return sizeof(float) * (own + buffers);
}

void whale_grad_sum_range(const whale_grad_sum *g, size_t *lo, size_t *hi) {
    *lo = g->off[g->rank];
    *hi = g->off[g->rank + 1];
}

/* acc[k] = (((first ? 0 : acc[k]) + piece[0][k]) + piece[1][k]) + …, the
 * first term taken as is (no 0 + x), so one process adding its
 * micro-batches one at a time gets exactly these bits. */
static void add_pieces(float *acc, const float *const *piece, int n_pieces, size_t cnt, int first) {
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < cnt; k++) {
        float v = first ? piece[0][k] : acc[k] + piece[0][k];
        for (int q = 1; q < n_pieces; q++) v += piece[q][k];
        acc[k] = v;
    }
}

/* Elements of rank r's shard in the exchange starting at `at` within it. */
static int piece_len(const whale_grad_sum *g, int r, size_t at) {
    size_t len = g->off[r + 1] - g->off[r];
    return at >= len ? 0 : (int)(len - at < g->chunk ? len - at : g->chunk);
}

static size_t max_shard(const whale_grad_sum *g) {
    size_t m = 0;
    for (int r = 0; r < g->size; r++)
        if (g->off[r + 1] - g->off[r] > m) m = g->off[r + 1] - g->off[r];
    return m;
}

/* One all-to-all of the pieces at offset `at` of every shard: rank r's
 * piece of this gradient goes to r; this rank's shard comes back from all. */
static whale_code scatter_round(whale_grad_sum *g, const float *grad, size_t at, int first, int64_t step,
                                whale_err *err) {
    int P = g->size, sc[P], sd[P], rc[P], rd[P], mine = piece_len(g, g->rank, at);
    const float *piece[P];
    for (int r = 0; r < P; r++) {
        sc[r] = piece_len(g, r, at), rd[r] = r * (int)g->chunk, rc[r] = mine;
        sd[r] = direct(g) ? (int)(g->off[r] + at) : rd[r];
        if (!direct(g)) memcpy(g->send + (size_t)sd[r], grad + g->off[r] + at, sizeof(float) * (size_t)sc[r]);
        piece[r] = g->recv + (size_t)rd[r];
    }
    whale_code c = whale_dist_alltoallv_f32(direct(g) ? grad : g->send, sc, sd, g->recv, rc, rd, "gradient exchange",
                                            step, err);
    if (!c) add_pieces(g->acc + at, piece, P, (size_t)mine, first);
    return c;
}

whale_code whale_grad_sum_add(whale_grad_sum *g, const float *grad, int first, int64_t step, whale_err *err) {
    if (g->size == 1) {
        add_pieces(g->acc, &grad, 1, g->n, first);
        return WHALE_OK;
    }
    whale_code c = whale_dist_barrier("gradient exchange", step, err);
    for (size_t at = 0, m = max_shard(g); !c && at < m; at += g->chunk) c = scatter_round(g, grad, at, first, step, err);
    return c;
}

whale_code whale_grad_sum_finish(whale_grad_sum *g, float *grad, int64_t step, whale_err *err) {
    if (g->size == 1) {
        memcpy(grad, g->acc, sizeof(float) * g->n);
        return WHALE_OK;
    }
    int P = g->size, cnt[P], dsp[P];
    for (size_t at = 0, m = max_shard(g); at < m; at += g->chunk) {
        int mine = piece_len(g, g->rank, at);
        for (int r = 0; r < P; r++)
            cnt[r] = piece_len(g, r, at), dsp[r] = direct(g) ? (int)(g->off[r] + at) : r * (int)g->chunk;
        whale_code c = whale_dist_allgatherv_f32(g->acc + at, mine, direct(g) ? grad : g->recv, cnt, dsp,
                                                 "gradient all-gather", step, err);
        if (c) return c;
        for (int r = 0; r < P && !direct(g); r++)
            memcpy(grad + g->off[r] + at, g->recv + (size_t)dsp[r], sizeof(float) * (size_t)cnt[r]);
    }
    return WHALE_OK;
}

whale_code whale_grad_sum_shard(whale_grad_sum *g, float *grad) {
    size_t lo = g->off[g->rank], own = g->off[g->rank + 1] - lo;
    memcpy(grad + lo, g->acc, sizeof(float) * own);
    return WHALE_OK;
}

/* Elements of the spans' vector (sp[0..ns), their elements one after the
 * other) that come before element x of the whole vector. */
static size_t spans_before(const whale_wspan *sp, int ns, size_t x) {
    size_t k = 0;
    for (int i = 0; i < ns && sp[i].at < x; i++) k += x - sp[i].at < sp[i].n ? x - sp[i].at : sp[i].n;
    return k;
}

/* Copy len elements (size bytes each) at position pos of the spans' vector
 * into buf (to_spans 0) or from buf into the spans (to_spans 1). */
static void spans_copy(const whale_wspan *sp, int ns, size_t size, size_t pos, char *buf, size_t len, int to_spans) {
    size_t base = 0;
    int i = 0;
    while (i < ns && base + sp[i].n <= pos) base += sp[i++].n;
    for (size_t done = 0; done < len; i++) {
        assert(i < ns);
        size_t from = pos + done - base, k = sp[i].n - from < len - done ? sp[i].n - from : len - done;
        char *d = (char *)sp[i].data + from * size;
        if (to_spans) memcpy(d, buf + done * size, size * k);
        else memcpy(buf + done * size, d, size * k);
        done += k, base += sp[i].n;
    }
}

whale_code whale_grad_sum_gather_spans(whale_grad_sum *g, const whale_wspan *sp, int ns, size_t size, int64_t step,
                                       whale_err *err) {
    if (g->size == 1) return WHALE_OK;
    assert(g->piece && (size == 2 || size == 4));
    int P = g->size, cnt[P], dsp[P];
    size_t lo[P], len[P], most = 0, per = g->chunk * sizeof(float) / size; /* elements per rank and round */
    for (int r = 0; r < P; r++) {
        lo[r] = spans_before(sp, ns, g->off[r]), len[r] = spans_before(sp, ns, g->off[r + 1]) - lo[r];
        most = len[r] > most ? len[r] : most;
    }
    char *piece = (char *)g->piece, *recv = (char *)g->recv;
    for (size_t at = 0; at < most; at += per) {
        for (int r = 0; r < P; r++)
            cnt[r] = (int)(size * (at < len[r] ? (len[r] - at < per ? len[r] - at : per) : 0)),
            dsp[r] = r * (int)(g->chunk * sizeof(float));
        spans_copy(sp, ns, size, lo[g->rank] + at, piece, (size_t)cnt[g->rank] / size, 0);
        whale_code c = whale_dist_allgatherv_bytes(piece, cnt[g->rank], recv, cnt, dsp, "weight all-gather", step, err);
        if (c) return c;
        for (int r = 0; r < P; r++)
            if (r != g->rank) spans_copy(sp, ns, size, lo[r] + at, recv + dsp[r], (size_t)cnt[r] / size, 1);
    }
    return WHALE_OK;
}

/* Rank 0 gathers elements [a, a + len) of a vector of which each rank
 * sends its shard's part; mine is element mine_at of the vector. */
static whale_code collect(whale_grad_sum *g, const float *mine, size_t mine_at, size_t a, size_t len, float *out,
                          int64_t step, whale_err *err) {
    int P = g->size, cnt[P], dsp[P];
    if (!len) return WHALE_OK; /* the file has no bytes to write for it either */
    if (len > (size_t)INT_MAX)
        return whale_errf(err, WHALE_ERR_RANGE, "a tensor of %zu elements is too large to gather (at most 2^31 - 1)", len);
    for (int r = 0; r < P; r++) {
        size_t lo = a > g->off[r] ? a : g->off[r], hi = a + len < g->off[r + 1] ? a + len : g->off[r + 1];
        cnt[r] = hi > lo ? (int)(hi - lo) : 0, dsp[r] = hi > lo ? (int)(lo - a) : 0;
    }
    const float *send = mine + (cnt[g->rank] ? a + (size_t)dsp[g->rank] - mine_at : 0);
    return whale_dist_gatherv_f32(send, cnt[g->rank], out, cnt, dsp, "gather of a checkpoint", step, err);
}

whale_code whale_grad_sum_collect(whale_grad_sum *g, const float *mine, size_t a, size_t len, float *out, int64_t step,
                                  whale_err *err) {
    return collect(g, mine, g->off[g->rank], a, len, out, step, err);
}

whale_code whale_grad_sum_collect_at(whale_grad_sum *g, const float *data, size_t a, size_t len, float *out,
                                     int64_t step, whale_err *err) {
    return collect(g, data, a, a, len, out, step, err);
}
