/* What the training runs use of the world of ranks (whale_dist.h): a sum of
 * gradients in a fixed order, small exchanges, and a check that every rank
 * starts from the same state. With one rank every call works locally. */
#ifndef WHALE_DIST_INTERNAL_H
#define WHALE_DIST_INTERNAL_H

#include "whale.h"
#include "whale_dist.h"

#include <stddef.h>
#include <stdint.h>

/* The sum of one gradient vector (n floats) per rank per round, added in
 * the order one process adds its micro-batches' gradients: round 0's rank
 * 0, rank 1, …, then round 1's rank 0, … Every element is summed in that
 * order whatever the number of ranks, so N ranks × k rounds give the bits
 * of one process adding N·k gradients one after the other.
 *
 * Each rank owns one contiguous shard of the vector (n/N elements) and
 * keeps the running sum of its shard; a round sends every other rank its
 * shard of this rank's gradient (an all-to-all) and adds the N pieces
 * received, in rank order, into the owned shard. finish all-gathers the
 * shards: every rank then holds the whole sum. Traffic per round and for
 * finish: (N−1)/N of the vector each, as a ring all-reduce's two halves. */
typedef struct whale_grad_sum whale_grad_sum;

/* shards: NULL for equal shards, else [N + 1] boundaries (shards[0] = 0,
 * shards[N] = n, rank r owns [shards[r], shards[r+1])) for a sum whose
 * owners go on with their shard alone (--zero 1): whale_grad_sum_shard,
 * whale_grad_sum_gather_spans and whale_grad_sum_collect then apply. */
whale_code whale_grad_sum_new(size_t n, const size_t *shards, whale_grad_sum **out, whale_err *err);
void whale_grad_sum_free(whale_grad_sum *g);
/* Bytes held: the owned shard's running sum and the exchange buffers. */
size_t whale_grad_sum_bytes(const whale_grad_sum *g);
/* The same for n elements on `ranks` ranks, before any is made (whale
 * memory), with buckets of `floats` (whale_grad_sum_set_buckets; 0: none). */
size_t whale_grad_sum_bytes_for(size_t n, int ranks, int sharded, size_t floats);
/* This rank's shard: [*lo, *hi) of the vector. */
void whale_grad_sum_range(const whale_grad_sum *g, size_t *lo, size_t *hi);
/* Add this rank's gradient of one round (first: the first round of a sum,
 * which replaces what the shard held). step names the step in messages. */
whale_code whale_grad_sum_add(whale_grad_sum *g, const float *grad, int first, int64_t step, whale_err *err);
/* Buckets sent during the backward pass instead of one exchange after it
 * (whale_grad_sum_add), for buckets of `floats` (0: none; one rank: nothing
 * to send). A round is then begin, ready for each range of the gradient as
 * the backward pass finishes it (whale_session_set_grad_ready), and end.
 * Ready ranges are gathered into buckets of floats / (N − 1) elements (so
 * that the N − 1 pieces a rank receives of a bucket's part in its shard
 * fit in `floats`), each one's part in every rank's shard sent to that rank
 * at once (non-blocking), and every call progresses the transfers and adds
 * the buckets whose pieces have all arrived; end sends the rest and waits
 * for all (for at most the exchange timeout, naming a rank whose data did
 * not arrive). The pieces of each element are added in rank order, as in
 * whale_grad_sum_add: the same bits. Two buckets at a time receive, into
 * the exchange buffer (grown to 2 × floats if smaller); the next one's
 * receives are posted when a slot frees (the backward pass never waits for
 * them). Sends go straight from the gradient, which must not change until
 * end. */
whale_code whale_grad_sum_set_buckets(whale_grad_sum *g, size_t floats, whale_err *err);
/* Floats in mb MiB, at least one (--bucket-mb). */
size_t whale_bucket_floats(double mb);
int whale_grad_sum_buckets(const whale_grad_sum *g);
void whale_grad_sum_begin(whale_grad_sum *g, const float *grad, int first, int64_t step);
whale_code whale_grad_sum_ready(whale_grad_sum *g, size_t lo, size_t hi, whale_err *err);
whale_code whale_grad_sum_end(whale_grad_sum *g, whale_err *err);
/* Bytes this rank sent in buckets while backward passes ran, so far (the
 * rest of whale_dist_stats's went after them); 0 without buckets. */
double whale_grad_sum_bytes_early(const whale_grad_sum *g);
/* The whole sum into grad (n floats), on every rank. */
whale_code whale_grad_sum_finish(whale_grad_sum *g, float *grad, int64_t step, whale_err *err);
/* Instead of finish, with shards: only this rank's shard of the sum, into
 * grad[lo, hi) (the rest of grad is left as it was). No exchange. */
whale_code whale_grad_sum_shard(whale_grad_sum *g, float *grad);

/* Elements [at, at + n) of the vector held in memory at data, each of
 * the size a gather names (4: fp32 weights; 2: the bf16/fp16 compute copy
 * of a weight whose fp32 master is sharded). */
typedef struct {
    void *data;
    size_t at, n;
} whale_wspan;
/* With shards: the vector's elements that spans sp[0..ns) hold (sorted by
 * at, not overlapping; every rank the same spans), each rank's part of
 * them — those in its shard — sent to every other rank, so that all hold
 * every span whole: the all-gather of the weights after each rank updated
 * its shard. size: bytes per element. Through the exchange buffers, 16
 * MiB at a time. */
whale_code whale_grad_sum_gather_spans(whale_grad_sum *g, const whale_wspan *sp, int ns, size_t size, int64_t step,
                                       whale_err *err);
/* With shards: elements [a, a + len) of a vector of which each rank holds
 * its own shard (mine: hi − lo floats, element lo first) gathered into out
 * (len floats) on rank 0; out is not used on the others. Every rank calls
 * it with the same a and len (a checkpoint's moments, tensor by tensor). */
whale_code whale_grad_sum_collect(whale_grad_sum *g, const float *mine, size_t a, size_t len, float *out, int64_t step,
                                  whale_err *err);
/* The same for a vector every rank holds at the same layout, its own shard
 * valid (the fp32 master weights of --zero 1 in mixed precision): data is
 * element a of it. */
whale_code whale_grad_sum_collect_at(whale_grad_sum *g, const float *data, size_t a, size_t len, float *out,
                                     int64_t step, whale_err *err);

/* Wait for every rank (what and step name it in messages) for at most the
 * exchange timeout (WHALE_DIST_TIMEOUT seconds, 120 by default): past it,
 * an error saying a rank died or hangs. The time counts as waiting in
 * whale_dist_stats. */
whale_code whale_dist_barrier(const char *what, int64_t step, whale_err *err);
/* The same where the other ranks wait for rank 0's own work (a checkpoint,
 * the start): ten times the timeout, and not counted. */
whale_code whale_dist_wait_leader(const char *what, int64_t step, whale_err *err);
/* MPI_Alltoallv / MPI_Allgatherv of floats (counts and displacements in
 * elements, per rank) that give up after the timeout like the barrier;
 * what names the exchange in messages. */
whale_code whale_dist_alltoallv_f32(const float *send, const int *sc, const int *sd, float *recv, const int *rc,
                                    const int *rd, const char *what, int64_t step, whale_err *err);
whale_code whale_dist_allgatherv_f32(const float *send, int n, float *recv, const int *cnt, const int *dsp,
                                     const char *what, int64_t step, whale_err *err);
/* The same of bytes (counts and displacements in bytes). */
whale_code whale_dist_allgatherv_bytes(const void *send, int n, void *recv, const int *cnt, const int *dsp,
                                       const char *what, int64_t step, whale_err *err);
/* MPI_Gatherv of floats to rank 0 (recv, cnt and dsp are used there only). */
whale_code whale_dist_gatherv_f32(const float *send, int n, float *recv, const int *cnt, const int *dsp,
                                  const char *what, int64_t step, whale_err *err);
/* A set of non-blocking sends and receives of floats (point to point, on
 * the ranks' own tag space: sends to a rank with one tag arrive in the
 * order they were posted). Buffers must stay valid, and a send's unchanged,
 * until the set has completed. */
typedef struct whale_dist_reqs whale_dist_reqs;
whale_dist_reqs *whale_dist_reqs_new(void); /* NULL: out of memory */
void whale_dist_reqs_free(whale_dist_reqs *q);
/* Requests posted and not yet completed by a test or wait. */
int whale_dist_reqs_count(const whale_dist_reqs *q);
/* n floats to / from rank peer (n < 2^31); the bytes sent count in
 * whale_dist_stats. what names the exchange in messages. */
whale_code whale_dist_isend_f32(whale_dist_reqs *q, const float *buf, size_t n, int peer, int tag, const char *what,
                                whale_err *err);
whale_code whale_dist_irecv_f32(whale_dist_reqs *q, float *buf, size_t n, int peer, int tag, const char *what,
                                whale_err *err);
/* Progress the set without waiting: *done 1 when every request has
 * completed (the set is then empty again). */
whale_code whale_dist_reqs_test(whale_dist_reqs *q, int *done, const char *what, whale_err *err);
/* Wait for every request for at most the exchange timeout, polling (and
 * after the first millisecond sleeping between polls, leaving the
 * processor to a rank still computing); past it, an error naming the ranks
 * whose data has not arrived (dead or hung). The time counts as moving
 * data in whale_dist_stats (it includes waiting for a slower rank). */
whale_code whale_dist_reqs_wait(whale_dist_reqs *q, const char *what, int64_t step, whale_err *err);

/* Every rank's k doubles, rank-major: all[r·k + j] is rank r's mine[j];
 * what names the exchange in messages. */
whale_code whale_dist_allgather_f64(const double *mine, int k, double *all, const char *what, whale_err *err);
/* value must be equal on every rank: otherwise an error naming the first
 * rank that differs from rank 0 and what (e.g. "the initial weights"). */
whale_code whale_dist_check_same(uint64_t value, const char *what, whale_err *err);
/* FNV-1a over bytes, continuing from h (start with 1469598103934665603). */
uint64_t whale_hash_bytes(const void *p, size_t n, uint64_t h);

#endif
