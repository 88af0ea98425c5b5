/* The world of ranks (whale_dist.h, dist/dist.h) on MPI, or a world of one
 * process in a build without it. */
#include "dist/dist.h"

#include "core/core.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if WHALE_HAVE_MPI
#include <mpi.h>
#endif

static struct {
    int rank, size, joined;
    double seconds, waited, bytes; /* moving data, waiting for other ranks, bytes sent to them */
} world = {0, 1, 0, 0, 0, 0};

int whale_dist_available(void) { return WHALE_HAVE_MPI; }

static int env_int(const char *a, const char *b, int def) {
    const char *v = getenv(a);
    if (!v || !*v) v = getenv(b);
    if (!v || !*v) return def;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    return errno || *end || n < 0 || n > 1 << 24 ? def : (int)n;
}

int whale_dist_launched_size(void) { return env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1); }
int whale_dist_launched_rank(void) { return env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0); }
int whale_dist_rank(void) { return world.rank; }
int whale_dist_size(void) { return world.size; }

void whale_dist_stats(double *seconds, double *waited, double *bytes_sent) {
    *seconds = world.seconds;
    *waited = world.waited;
    *bytes_sent = world.bytes;
}

uint64_t whale_hash_bytes(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Seconds a rank waits for the others at an exchange before it gives up. */
static double dist_timeout(void) {
    const char *v = getenv("WHALE_DIST_TIMEOUT");
    double t = v ? strtod(v, NULL) : 0;
    return t > 0 ? t : 120;
}

#if WHALE_HAVE_MPI

static whale_code mpi_fail(whale_err *err, int rc, const char *what) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return whale_errf(err, WHALE_ERR_IO, "rank %d: %s failed: %s", world.rank, what, text);
}

whale_code whale_dist_init(whale_err *err) {
    if (whale_dist_launched_size() <= 1 || world.joined) return WHALE_OK;
    int provided, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return whale_errf(err, WHALE_ERR_IO, "MPI_Init failed (code %d)", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    world.joined = 1;
    return WHALE_OK;
}

void whale_dist_finalize(void) {
    if (world.joined) MPI_Finalize();
    world.joined = 0;
}

void whale_dist_abort(int status) {
    if (world.joined) MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
}

/* How a rank waits for a request: moving data (polled flat out, counted as
 * exchange time), for the other ranks to arrive (sleeping between polls
 * after the first millisecond, leaving the processor to them; counted as
 * waiting), for buckets of gradients that other ranks may still be
 * computing (sleeping so, but counted as exchange time: the two cannot be
 * told apart), or for rank 0's own work — a checkpoint, the start —
 * (sleeping, ten times the bound, not counted). */
typedef enum { WAIT_MOVE, WAIT_PEERS, WAIT_BUCKETS, WAIT_LEADER } wait_mode;

/* The ranks behind requests rq[0..n) that have not completed, as "rank 1"
 * or "ranks 1, 3" (peer[i]: the rank of request i, -1 for none); "" when
 * all have. */
static void missing_ranks(MPI_Request *rq, const int *peer, int n, char *buf, size_t cap) {
    char names[200] = "";
    size_t at = 0;
    int k = 0;
    for (int i = 0; i < n && at + 16 < sizeof names; i++) {
        int done = 1;
        if (peer[i] >= 0) MPI_Test(&rq[i], &done, MPI_STATUS_IGNORE);
        if (!done) at += (size_t)snprintf(names + at, sizeof names - at, "%s%d", k++ ? ", " : "", peer[i]);
    }
    snprintf(buf, cap, "%s%s", k > 1 ? "ranks " : k ? "rank " : "", names);
}

/* Wait for requests rq[0..n) for at most the bound: a rank that died or
 * hangs ends the run with a message — naming it when peer gives the rank
 * behind each request — instead of a wait forever. */
static whale_code wait_for(MPI_Request *rq, int n, const int *peer, const char *what, int64_t step, wait_mode mode,
                           whale_err *err) {
    double t0 = whale_now(), limit = dist_timeout() * (mode == WAIT_LEADER ? 10 : 1);
    int done = 0, rc;
    long long at_step = step > 0 ? step : 0;
    while (!done) {
        if ((rc = MPI_Testall(n, rq, &done, MPI_STATUSES_IGNORE)) != MPI_SUCCESS) return mpi_fail(err, rc, what);
        double waited = whale_now() - t0;
        if (done) break;
        if (waited > limit) {
            char who[256] = "";
            if (peer) missing_ranks(rq, peer, n, who, sizeof who);
            if (*who)
                return whale_errf(err, WHALE_ERR_IO, "rank %d: step %lld: %s did not reach the %s within %.0f s "
                                  "(dead or hung; WHALE_DIST_TIMEOUT sets the bound)",
                                  world.rank, at_step, who, what, limit);
            return whale_errf(err, WHALE_ERR_IO, "rank %d: step %lld: not every rank of %d completed the %s within "
                              "%.0f s: a rank died or hangs (WHALE_DIST_TIMEOUT sets the bound)",
                              world.rank, at_step, world.size, what, limit);
        }
        if (mode != WAIT_MOVE && waited > 1e-3) nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    if (mode == WAIT_MOVE || mode == WAIT_BUCKETS) world.seconds += whale_now() - t0;
    if (mode == WAIT_PEERS) world.waited += whale_now() - t0;
    return WHALE_OK;
}

/* A barrier that knows who is missing: every rank sends its arrival to
 * every other and waits for theirs (2(N−1) messages of one int). */
static whale_code barrier(const char *what, int64_t step, wait_mode mode, whale_err *err) {
    static const int arrived = 1; /* a send may outlive a failed wait */
    enum { TAG_ARRIVAL = 7001 };
    int P = world.size, n = 0, rc = MPI_SUCCESS;
    if (P == 1) return WHALE_OK;
    MPI_Request *rq = malloc(sizeof *rq * 2 * (size_t)P);
    int *peer = malloc(sizeof(int) * 2 * (size_t)P), *in = malloc(sizeof(int) * (size_t)P);
    if (!rq || !peer || !in) {
        free(rq), free(peer), free(in);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    for (int p = 0; p < P && rc == MPI_SUCCESS; p++) {
        if (p == world.rank) continue;
        peer[n] = p, rc = MPI_Irecv(&in[p], 1, MPI_INT, p, TAG_ARRIVAL, MPI_COMM_WORLD, &rq[n]), n++;
        if (rc != MPI_SUCCESS) break;
        peer[n] = -1, rc = MPI_Isend(&arrived, 1, MPI_INT, p, TAG_ARRIVAL, MPI_COMM_WORLD, &rq[n]), n++;
    }
    whale_code c = rc != MPI_SUCCESS ? mpi_fail(err, rc, what) : wait_for(rq, n, peer, what, step, mode, err);
    if (!c) free(in); /* after a failure a receive may still land in it: the job is ending */
    free(rq), free(peer);
    return c;
}

whale_code whale_dist_barrier(const char *what, int64_t step, whale_err *err) {
    return barrier(what, step, WAIT_PEERS, err);
}

whale_code whale_dist_wait_leader(const char *what, int64_t step, whale_err *err) {
    return barrier(what, step, WAIT_LEADER, err);
}

whale_code whale_dist_alltoallv_f32(const float *send, const int *sc, const int *sd, float *recv, const int *rc,
                                    const int *rd, const char *what, int64_t step, whale_err *err) {
    MPI_Request rq;
    double sent = 0;
    for (int r = 0; r < world.size; r++) sent += r == world.rank ? 0 : sizeof(float) * (double)sc[r];
    int e = MPI_Ialltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, MPI_COMM_WORLD, &rq);
    world.bytes += sent;
    return e != MPI_SUCCESS ? mpi_fail(err, e, what) : wait_for(&rq, 1, NULL, what, step, WAIT_MOVE, err);
}

whale_code whale_dist_allgatherv_f32(const float *send, int n, float *recv, const int *cnt, const int *dsp,
                                     const char *what, int64_t step, whale_err *err) {
    MPI_Request rq;
    int e = MPI_Iallgatherv(send, n, MPI_FLOAT, recv, cnt, dsp, MPI_FLOAT, MPI_COMM_WORLD, &rq);
    world.bytes += sizeof(float) * (double)n * (world.size - 1);
    return e != MPI_SUCCESS ? mpi_fail(err, e, what) : wait_for(&rq, 1, NULL, what, step, WAIT_MOVE, err);
}

whale_code whale_dist_allgatherv_bytes(const void *send, int n, void *recv, const int *cnt, const int *dsp,
                                       const char *what, int64_t step, whale_err *err) {
    MPI_Request rq;
    int e = MPI_Iallgatherv(send, n, MPI_BYTE, recv, cnt, dsp, MPI_BYTE, MPI_COMM_WORLD, &rq);
    world.bytes += (double)n * (world.size - 1);
    return e != MPI_SUCCESS ? mpi_fail(err, e, what) : wait_for(&rq, 1, NULL, what, step, WAIT_MOVE, err);
}

whale_code whale_dist_gatherv_f32(const float *send, int n, float *recv, const int *cnt, const int *dsp,
                                  const char *what, int64_t step, whale_err *err) {
    if (world.size == 1) {
        if (n) memcpy(recv + dsp[0], send, sizeof(float) * (size_t)n);
        return WHALE_OK;
    }
    MPI_Request rq;
    int e = MPI_Igatherv(send, n, MPI_FLOAT, recv, cnt, dsp, MPI_FLOAT, 0, MPI_COMM_WORLD, &rq);
    if (world.rank) world.bytes += sizeof(float) * (double)n;
    return e != MPI_SUCCESS ? mpi_fail(err, e, what) : wait_for(&rq, 1, NULL, what, step, WAIT_MOVE, err);
}

whale_code whale_dist_allgather_f64(const double *mine, int k, double *all, const char *what, whale_err *err) {
    if (world.size == 1) {
        memcpy(all, mine, sizeof(double) * (size_t)k);
        return WHALE_OK;
    }
    MPI_Request rq;
    int rc = MPI_Iallgather(mine, k, MPI_DOUBLE, all, k, MPI_DOUBLE, MPI_COMM_WORLD, &rq);
    world.bytes += (double)(world.size - 1) * k * sizeof(double);
    return rc != MPI_SUCCESS ? mpi_fail(err, rc, what) : wait_for(&rq, 1, NULL, what, -1, WAIT_PEERS, err);
}

whale_code whale_dist_check_same(uint64_t value, const char *what, whale_err *err) {
    if (world.size == 1) return WHALE_OK;
    uint64_t *all = malloc(sizeof(uint64_t) * (size_t)world.size);
    if (!all) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    MPI_Request rq;
    int rc = MPI_Iallgather(&value, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD, &rq), bad = 0;
    whale_code c = rc != MPI_SUCCESS ? mpi_fail(err, rc, "MPI_Iallgather") : wait_for(&rq, 1, NULL, "start", 0, WAIT_LEADER, err);
    for (int r = 1; !c && r < world.size && !bad; r++)
        if (all[r] != all[0]) bad = r;
    free(all);
    if (c) return c;
    if (bad)
        return whale_errf(err, WHALE_ERR_ARG, "rank %d: %s differ from rank 0's: every rank must see the same files",
                          bad, what);
    return WHALE_OK;
}

struct whale_dist_reqs {
    MPI_Request *rq;
    int *peer; /* the rank a receive waits for; −1 for a send */
    int n, cap;
};

whale_dist_reqs *whale_dist_reqs_new(void) { return calloc(1, sizeof(whale_dist_reqs)); }

void whale_dist_reqs_free(whale_dist_reqs *q) {
    if (!q) return;
    free(q->rq), free(q->peer), free(q);
}

int whale_dist_reqs_count(const whale_dist_reqs *q) { return q->n; }

/* Room for one more request. */
static whale_code reqs_grow(whale_dist_reqs *q, whale_err *err) {
    if (q->n < q->cap) return WHALE_OK;
    int cap = q->cap ? 2 * q->cap : 8;
    MPI_Request *rq = realloc(q->rq, sizeof *rq * (size_t)cap);
    if (rq) q->rq = rq;
    int *peer = rq ? realloc(q->peer, sizeof *peer * (size_t)cap) : NULL;
    if (peer) q->peer = peer;
    if (!rq || !peer) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for %d exchange requests", cap);
    q->cap = cap;
    return WHALE_OK;
}

whale_code whale_dist_isend_f32(whale_dist_reqs *q, const float *buf, size_t n, int peer, int tag, const char *what,
                                whale_err *err) {
    whale_code c = reqs_grow(q, err);
    if (c) return c;
    assert(n <= (size_t)INT_MAX);
    int e = MPI_Isend(buf, (int)n, MPI_FLOAT, peer, tag, MPI_COMM_WORLD, &q->rq[q->n]);
    if (e != MPI_SUCCESS) return mpi_fail(err, e, what);
    q->peer[q->n++] = -1;
    world.bytes += sizeof(float) * (double)n;
    return WHALE_OK;
}

whale_code whale_dist_irecv_f32(whale_dist_reqs *q, float *buf, size_t n, int peer, int tag, const char *what,
                                whale_err *err) {
    whale_code c = reqs_grow(q, err);
    if (c) return c;
    assert(n <= (size_t)INT_MAX);
    int e = MPI_Irecv(buf, (int)n, MPI_FLOAT, peer, tag, MPI_COMM_WORLD, &q->rq[q->n]);
    if (e != MPI_SUCCESS) return mpi_fail(err, e, what);
    q->peer[q->n++] = peer;
    return WHALE_OK;
}

whale_code whale_dist_reqs_test(whale_dist_reqs *q, int *done, const char *what, whale_err *err) {
    int rc = MPI_Testall(q->n, q->rq, done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, what);
    if (*done) q->n = 0;
    return WHALE_OK;
}

whale_code whale_dist_reqs_wait(whale_dist_reqs *q, const char *what, int64_t step, whale_err *err) {
    whale_code c = wait_for(q->rq, q->n, q->peer, what, step, WAIT_BUCKETS, err);
    if (!c) q->n = 0;
    return c;
}

#else /* no MPI: a world of one process */

whale_code whale_dist_init(whale_err *err) {
    int n = whale_dist_launched_size();
    if (n <= 1) return WHALE_OK;
    return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                      "launched as one of %d ranks, but this build has no MPI: install libopenmpi-dev "
                      "(scripts/setup.sh) and rebuild",
                      n);
}

void whale_dist_finalize(void) {}
void whale_dist_abort(int status) { (void)status; }

whale_code whale_dist_barrier(const char *what, int64_t step, whale_err *err) {
    (void)what, (void)step, (void)err, (void)dist_timeout;
    return WHALE_OK;
}

whale_code whale_dist_wait_leader(const char *what, int64_t step, whale_err *err) {
    (void)what, (void)step, (void)err;
    return WHALE_OK;
}

whale_code whale_dist_alltoallv_f32(const float *send, const int *sc, const int *sd, float *recv, const int *rc,
                                    const int *rd, const char *what, int64_t step, whale_err *err) {
    (void)what, (void)step, (void)err;
    memcpy(recv + rd[0], send + sd[0], sizeof(float) * (size_t)(sc[0] < rc[0] ? sc[0] : rc[0]));
    return WHALE_OK;
}

whale_code whale_dist_allgatherv_f32(const float *send, int n, float *recv, const int *cnt, const int *dsp,
                                     const char *what, int64_t step, whale_err *err) {
    (void)cnt, (void)what, (void)step, (void)err;
    memcpy(recv + dsp[0], send, sizeof(float) * (size_t)n);
    return WHALE_OK;
}

whale_code whale_dist_allgatherv_bytes(const void *send, int n, void *recv, const int *cnt, const int *dsp,
                                       const char *what, int64_t step, whale_err *err) {
    (void)cnt, (void)what, (void)step, (void)err;
    memcpy((char *)recv + dsp[0], send, (size_t)n);
    return WHALE_OK;
}

whale_code whale_dist_gatherv_f32(const float *send, int n, float *recv, const int *cnt, const int *dsp,
                                  const char *what, int64_t step, whale_err *err) {
    (void)cnt, (void)what, (void)step, (void)err;
    if (n) memcpy(recv + dsp[0], send, sizeof(float) * (size_t)n);
    return WHALE_OK;
}

whale_code whale_dist_allgather_f64(const double *mine, int k, double *all, const char *what, whale_err *err) {
    (void)err, (void)what;
    memcpy(all, mine, sizeof(double) * (size_t)k);
    return WHALE_OK;
}

whale_code whale_dist_check_same(uint64_t value, const char *what, whale_err *err) {
    (void)value, (void)what, (void)err;
    return WHALE_OK;
}

/* One process has no other rank to send to or receive from. */
struct whale_dist_reqs {
    int n;
};

whale_dist_reqs *whale_dist_reqs_new(void) { return calloc(1, sizeof(whale_dist_reqs)); }
void whale_dist_reqs_free(whale_dist_reqs *q) { free(q); }
int whale_dist_reqs_count(const whale_dist_reqs *q) { return q->n; }

whale_code whale_dist_isend_f32(whale_dist_reqs *q, const float *buf, size_t n, int peer, int tag, const char *what,
                                whale_err *err) {
    (void)q, (void)buf, (void)n, (void)tag;
    return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: no rank %d in a build without MPI", what, peer);
}

whale_code whale_dist_irecv_f32(whale_dist_reqs *q, float *buf, size_t n, int peer, int tag, const char *what,
                                whale_err *err) {
    (void)q, (void)buf, (void)n, (void)tag;
    return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: no rank %d in a build without MPI", what, peer);
}

whale_code whale_dist_reqs_test(whale_dist_reqs *q, int *done, const char *what, whale_err *err) {
    (void)q, (void)what, (void)err;
    *done = 1;
    return WHALE_OK;
}

whale_code whale_dist_reqs_wait(whale_dist_reqs *q, const char *what, int64_t step, whale_err *err) {
    (void)q, (void)what, (void)step, (void)err;
    return WHALE_OK;
}

#endif
