/* The ordered sum of every rank's gradients (dist/dist.h): an all-to-all of
 * shards per round, each shard summed in rank order by its owner, then an
 * all-gather of the shards. */
#include "dist/dist.h"

#include "core/core.h"

#include <assert.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* A bucket: a range of the vector sent as soon as the backward pass has
 * finished it. Its part in each rank's shard goes to that rank. */
typedef struct {
    size_t lo, hi;         /* elements [lo, hi) of the vector */
    int slot;              /* the receive slot of the other ranks' pieces of its part in this rank's shard,
                              NO_RECV (none, or added) or RECV_LATER (waiting for a slot) */
    whale_dist_reqs *recv; /* those receives */
} bucket;

enum { SLOTS = 2, TAG_BUCKET = 7002, NO_RECV = -1, RECV_LATER = -2 };

struct whale_grad_sum {
    size_t n;           /* elements of the vector */
    int size, rank;
    size_t *off;        /* [size + 1]: rank r owns [off[r], off[r+1]) */
    size_t chunk;       /* elements per rank and exchange */
    float *acc;         /* the owned shard's running sum */
    float *send;        /* [size × chunk] with more than one rank, above 2^31 elements */
    float *recv;        /* [size × chunk], or the buckets' receive slots when larger (used in turn) */
    float *piece;       /* [chunk]: this rank's piece of a vector gathered from spans (shards given) */
    /* buckets sent during the backward pass (whale_grad_sum_set_buckets) */
    size_t bucket;          /* elements per bucket; 0: one exchange after the backward (whale_grad_sum_add) */
    size_t slot_len;        /* elements of a receive slot: (size − 1) pieces of at most min(bucket, shard) */
    float *slots;           /* [SLOTS × slot_len]: recv */
    int slot_used[SLOTS];
    bucket *b;              /* this round's buckets in the order sent: [0, done) added, [posted, nb) not received into yet */
    int nb, cap, done, posted;
    whale_dist_reqs *sends; /* this round's sends */
    const float *grad;      /* this round's gradient */
    int first;
    int64_t step;
    size_t pend_lo, pend_hi; /* final and not sent yet: one range */
    size_t sent;             /* elements of the vector sent this round */
    int ending;              /* in whale_grad_sum_end: the backward pass is over */
    double early;            /* bytes sent to other ranks during backward passes, so far */
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

/* Elements per bucket for buckets of `floats` on size ranks: the N − 1
 * pieces a rank receives of a bucket's part in its shard fit in `floats`. */
static size_t bucket_for(int size, size_t floats) {
    size_t b = floats / (size_t)(size - 1);
    return b ? b : 1;
}

/* Elements of a bucket's receive slot: the other ranks' pieces of its part
 * in a shard of at most `largest` elements. */
static size_t slot_for(int size, size_t bucket, size_t largest) {
    return (size_t)(size - 1) * (bucket < largest ? bucket : largest);
}

/* Floats of recv: the exchange's pieces, or the buckets' slots when larger. */
static size_t recv_floats(int size, size_t chunk, size_t bucket, size_t own) {
    size_t slots = bucket ? SLOTS * slot_for(size, bucket, own) : 0;
    return chunk * (size_t)size > slots ? chunk * (size_t)size : slots;
}

/* Floats of the exchange buffers (recv, send, piece) for n elements on size
 * ranks, with buckets of `floats` (0: none). */
static size_t buffer_floats(size_t n, int size, int sharded, size_t floats) {
    size_t own = (n + (size_t)size - 1) / (size_t)size, chunk = chunk_for(size, own);
    if (size == 1) return 0;
    return recv_floats(size, chunk, floats ? bucket_for(size, floats) : 0, own) +
           chunk * (size_t)size * (n + chunk > (size_t)INT_MAX) + (sharded ? chunk : 0);
}

size_t whale_grad_sum_bytes_for(size_t n, int size, int sharded, size_t bucket) {
    size_t own = (n + (size_t)size - 1) / (size_t)size;
    return sizeof(float) * (own + buffer_floats(n, size, sharded, bucket));
}

void whale_grad_sum_free(whale_grad_sum *g) {
    if (!g) return;
    free(g->off);
    free(g->acc);
    free(g->send);
    free(g->recv);
    free(g->piece);
    for (int k = 0; k < g->cap; k++) whale_dist_reqs_free(g->b[k].recv);
    free(g->b);
    whale_dist_reqs_free(g->sends);
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
    size_t buffers = g->size == 1 ? 0
                                  : recv_floats(g->size, g->chunk, g->bucket, own) +
                                        g->chunk * (size_t)g->size * !direct(g) + (g->piece ? g->chunk : 0);
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

/* ---------------------------------------------------------------- buckets during the backward pass */

size_t whale_bucket_floats(double mb) {
    double f = mb * 1048576.0 / sizeof(float);
    return f < 1 ? 1 : f > (double)INT_MAX ? (size_t)INT_MAX : (size_t)f;
}

whale_code whale_grad_sum_set_buckets(whale_grad_sum *g, size_t floats, whale_err *err) {
    if (g->size == 1 || !floats) return WHALE_OK; /* one process has nothing to send */
    size_t own = g->off[g->rank + 1] - g->off[g->rank], bucket = bucket_for(g->size, floats);
    size_t before = recv_floats(g->size, g->chunk, 0, own), need = recv_floats(g->size, g->chunk, bucket, own);
    if (need > before) { /* the slots are larger than the exchange's buffer: grow it */
        free(g->recv);
        g->recv = whale_alloc(sizeof(float) * need);
    }
    if (!g->sends) g->sends = whale_dist_reqs_new();
    if (!g->recv || !g->sends)
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB to receive gradient buckets",
                          need * 4.0 / 1048576.0);
    g->bucket = bucket;
    g->slot_len = slot_for(g->size, bucket, own);
    g->slots = g->recv; /* free between exchanges: the buckets' rounds end before any other use */
    return WHALE_OK;
}

int whale_grad_sum_buckets(const whale_grad_sum *g) { return g->bucket != 0; }

void whale_grad_sum_begin(whale_grad_sum *g, const float *grad, int first, int64_t step) {
    assert(g->bucket && g->done == g->nb && !whale_dist_reqs_count(g->sends));
    g->grad = grad, g->first = first, g->step = step;
    g->nb = g->done = g->posted = 0;
    g->pend_lo = g->pend_hi = g->sent = 0;
}

/* [*a, *e): the part of [lo, hi) in rank r's shard (empty: *a >= *e). */
static void part_of(const whale_grad_sum *g, int r, size_t lo, size_t hi, size_t *a, size_t *e) {
    *a = lo > g->off[r] ? lo : g->off[r];
    *e = hi < g->off[r + 1] ? hi : g->off[r + 1];
}

/* The bucket's part of this rank's shard, its pieces all received: added
 * in rank order (this rank's own piece from the gradient itself). */
static void add_bucket(whale_grad_sum *g, bucket *k) {
    int P = g->size;
    size_t a, e;
    part_of(g, g->rank, k->lo, k->hi, &a, &e);
    const float *in = g->slots + (size_t)k->slot * g->slot_len, *piece[P];
    for (int r = 0; r < P; r++) piece[r] = r == g->rank ? g->grad + a : in + (size_t)(r - (r > g->rank)) * (e - a);
    add_pieces(g->acc + (a - g->off[g->rank]), piece, P, e - a, g->first);
    g->slot_used[k->slot] = 0;
    k->slot = NO_RECV;
}

/* Past the buckets that have nothing more to receive. */
static void advance(whale_grad_sum *g) {
    while (g->done < g->nb && g->b[g->done].slot == NO_RECV) g->done++;
}

/* Post the receives of the buckets waiting for a slot, in the order sent
 * (the messages from one rank match its receives in that order), while
 * slots are free. */
static whale_code post_receives(whale_grad_sum *g, whale_err *err) {
    for (; g->posted < g->nb; g->posted++) {
        bucket *k = &g->b[g->posted];
        if (k->slot == NO_RECV) continue;
        int slot = -1;
        for (int q = 0; q < SLOTS && slot < 0; q++)
            if (!g->slot_used[q]) slot = q;
        if (slot < 0) return WHALE_OK;
        size_t a, e;
        part_of(g, g->rank, k->lo, k->hi, &a, &e);
        for (int r = 0; r < g->size; r++) /* the other ranks' pieces of this rank's part, in rank order */
            if (r != g->rank) {
                float *in = g->slots + (size_t)slot * g->slot_len + (size_t)(r - (r > g->rank)) * (e - a);
                whale_code c = whale_dist_irecv_f32(k->recv, in, e - a, r, TAG_BUCKET, "gradient exchange", err);
                if (c) return c;
            }
        k->slot = slot;
        g->slot_used[slot] = 1;
    }
    return WHALE_OK;
}

/* Add the buckets whose pieces have all arrived and post the receives of
 * those waiting for their slots, without waiting. */
static whale_code poll_buckets(whale_grad_sum *g, whale_err *err) {
    for (int i = g->done; i < g->posted; i++) {
        int done = 0;
        whale_code c = g->b[i].slot < 0 ? WHALE_OK : whale_dist_reqs_test(g->b[i].recv, &done, "gradient exchange", err);
        if (c) return c;
        if (done) add_bucket(g, &g->b[i]);
    }
    advance(g);
    return post_receives(g, err);
}

/* Wait for the oldest bucket still receiving (for at most the exchange
 * timeout) and add it. */
static whale_code finish_oldest(whale_grad_sum *g, whale_err *err) {
    advance(g);
    whale_code c = post_receives(g, err); /* the buckets before it are done: a slot is free */
    assert(c || (g->done < g->nb && g->b[g->done].slot >= 0));
    bucket *k = &g->b[g->done];
    if (!c) c = whale_dist_reqs_wait(k->recv, "gradient exchange", g->step, err);
    if (!c) add_bucket(g, k);
    advance(g);
    return c;
}

/* Room for one more bucket in this round's list. */
static whale_code grow_buckets(whale_grad_sum *g, whale_err *err) {
    if (g->nb < g->cap) return WHALE_OK;
    int cap = g->cap ? 2 * g->cap : 16;
    bucket *b = realloc(g->b, sizeof *b * (size_t)cap);
    if (!b) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for %d gradient buckets", cap);
    g->b = b;
    for (; g->cap < cap; g->cap++)
        if (!(g->b[g->cap].recv = whale_dist_reqs_new()))
            return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for %d gradient buckets", cap);
    return WHALE_OK;
}

/* Send bucket [lo, hi): each other rank's part of it to that rank, and
 * receive the other ranks' pieces of this rank's part into a free slot —
 * or later, when one frees: the backward pass never waits here (a sender
 * whose receiver has not posted yet keeps its data until it does). */
static whale_code send_bucket(whale_grad_sum *g, size_t lo, size_t hi, whale_err *err) {
    whale_code c = grow_buckets(g, err);
    if (c) return c;
    size_t a, e;
    part_of(g, g->rank, lo, hi, &a, &e);
    bucket *k = &g->b[g->nb++];
    *k = (bucket){lo, hi, a < e ? RECV_LATER : NO_RECV, k->recv};
    for (int r = 0; !c && r < g->size; r++) { /* this rank's pieces of the others' parts */
        size_t ra, re;
        part_of(g, r, lo, hi, &ra, &re);
        if (r != g->rank && ra < re) {
            c = whale_dist_isend_f32(g->sends, g->grad + ra, re - ra, r, TAG_BUCKET, "gradient exchange", err);
            if (!g->ending) g->early += sizeof(float) * (double)(re - ra);
        }
    }
    g->sent += hi - lo;
    return c ? c : post_receives(g, err);
}

whale_code whale_grad_sum_ready(whale_grad_sum *g, size_t lo, size_t hi, whale_err *err) {
    assert(g->bucket && lo < hi && hi <= g->n);
    whale_code c = WHALE_OK;
    int pending = g->pend_lo < g->pend_hi;
    if (pending && hi == g->pend_lo) g->pend_lo = lo;
    else if (pending && lo == g->pend_hi) g->pend_hi = hi;
    else {
        if (pending) c = send_bucket(g, g->pend_lo, g->pend_hi, err);
        g->pend_lo = lo, g->pend_hi = hi;
    }
    /* full buckets from the top: what is left is the part just finished */
    while (!c && g->pend_hi - g->pend_lo >= g->bucket) {
        c = send_bucket(g, g->pend_hi - g->bucket, g->pend_hi, err);
        g->pend_hi -= g->bucket;
    }
    return c ? c : poll_buckets(g, err);
}

double whale_grad_sum_bytes_early(const whale_grad_sum *g) { return g ? g->early : 0; }

whale_code whale_grad_sum_end(whale_grad_sum *g, whale_err *err) {
    whale_code c = WHALE_OK;
    g->ending = 1;
    if (!g->sent && g->pend_lo == g->pend_hi && g->n) /* nothing reported: a micro-batch without targets */
        c = whale_grad_sum_ready(g, 0, g->n, err);
    if (!c && g->pend_lo < g->pend_hi) c = send_bucket(g, g->pend_lo, g->pend_hi, err);
    g->pend_lo = g->pend_hi = 0;
    assert(c || g->sent == g->n); /* every element sent once */
    while (!c && (advance(g), g->done < g->nb)) c = finish_oldest(g, err);
    if (!c) c = whale_dist_reqs_wait(g->sends, "gradient exchange", g->step, err);
    g->ending = 0;
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
