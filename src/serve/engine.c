/*
 * The serving engine: one batched session, one thread, continuous batching.
 *
 * Slots are the session's sequences. A slot holds at most one job; its
 * cells stay in the cache after the job ends, so a later prompt that
 * starts with the same tokens (a system prompt, a continued conversation)
 * reuses them: the queued job goes to the free slot whose cached tokens
 * share the longest prefix with its prompt, and when another slot (busy or
 * not) shares a longer one, that slot's cells are copied over. Cells are
 * made with an adapter (or none): a slot is bound to its job's adapter,
 * and only slots of the same adapter share cells.
 *
 * One step of the loop: every decoding slot's last sampled token (one
 * logits row each), then chunks of prompts still being prefilled up to the
 * batch's token budget, all in one whale_session_decode; then each slot
 * that got a logits row samples its next token. A prompt's last token
 * carries the logits flag, so its first token is sampled in the step that
 * finishes its prefill. Decoding slots go in adapter by adapter, so each
 * adapter's rows form one run of the batch. Jobs cancelled by their client
 * release their slot at the next step, with its cells emptied.
 */
#include "serve/serve_impl.h"

#include "core/core.h"
#include "core/par.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Tokens of the warm-up prompt (engine_warm_up). */
#define WARM_UP_TOKENS 32

typedef struct {
    serve_job *job;
    int32_t *toks; /* prompt + generated; toks[0..n_cells) have cells */
    int n_toks, n_cells;
    int model;     /* the adapter the cells were made with (serve_job.model) */
    whale_sampler *sm;
    whale_detokenizer *detok;
    int32_t *counts;   /* [V] generated-token counts (frequency/presence penalties) */
    int32_t *distinct; /* ids with a nonzero count */
    int n_distinct;
} slot_t;

struct serve_engine {
    whale_model *m;
    const whale_tokenizer *tok;
    whale_session *s;
    whale_adapter **ad; /* [n_models]: ad[0] NULL (the base), ad[k] the job model k's */
    int n_models;
    int n_seq, n_ctx, n_batch, V, qmax;
    int interval; /* --stream-interval: a waiter is woken at every interval-th token (and its first) */
    int32_t stop_ids[32];
    int n_stop_ids;
    slot_t *slots;
    whale_dbatch batch;
    int *out_slot; /* [n_seq] slot of each logits row */
    const char **out_fin; /* [n_seq] its finish reason this step, or NULL */
    float *logits; /* [n_seq, V] */
    int32_t *out_tok;     /* [n_seq] its drawn token */
    float *raw;           /* [n_seq, V] the rows as the model gave them, for logprobs (penalties write to them) */
    int prefill_next; /* round robin over prefilling slots */
    serve_metrics *metrics;
    pthread_mutex_t mu;
    pthread_cond_t work;
    serve_job *qhead, *qtail;
    int qlen, busy, draining, stopping;
    pthread_t thread;
    int started;
};

/* ------------------------------------------------------------ jobs */

serve_job *serve_job_new(void) {
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    if (pthread_cond_init(&j->cv, NULL)) {
        free(j);
        return NULL;
    }
    j->refs = 1;
    j->sp = whale_sampler_defaults();
    return j;
}

static void job_free(serve_job *j) {
    free(j->prompt);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->text);
    free(j->lp);
    free(j->top);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Under e->mu (or before the job is shared: e NULL). */
static void job_unref(serve_job *j) {
    if (--j->refs == 0) job_free(j);
}

void serve_job_release(serve_engine *e, serve_job *j) {
    if (!j) return;
    if (!e) {
        job_unref(j);
        return;
    }
    pthread_mutex_lock(&e->mu);
    job_unref(j);
    pthread_mutex_unlock(&e->mu);
}

/* Append generated text (under e->mu). */
static whale_code job_append(serve_job *j, const char *p, size_t n, whale_err *err) {
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 256;
        while (cap < j->len + n + 1) cap *= 2;
        char *grown = realloc(j->text, cap);
        if (!grown) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for generated text");
        j->text = grown;
        j->cap = cap;
    }
    memcpy(j->text + j->len, p, n);
    j->len += n;
    j->text[j->len] = 0;
    return WHALE_OK;
}

/* After text was appended from byte `from`: cut it at the first stop
 * string (returns 1) or hold back a tail that may begin one. */
static int job_check_stop(serve_job *j, size_t from) {
    size_t longest = 0;
    for (int i = 0; i < j->n_stop; i++) longest = strlen(j->stop[i]) > longest ? strlen(j->stop[i]) : longest;
    size_t start = from >= longest ? from - longest + 1 : 0, cut = j->len;
    for (int i = 0; i < j->n_stop; i++) {
        const char *hit = memmem(j->text + start, j->len - start, j->stop[i], strlen(j->stop[i]));
        if (hit && (size_t)(hit - j->text) < cut) cut = (size_t)(hit - j->text);
    }
    if (cut < j->len) {
        j->len = j->ready = cut;
        j->text[cut] = 0;
        return 1;
    }
    size_t hold = 0; /* the longest tail that is a proper prefix of a stop string */
    for (int i = 0; i < j->n_stop; i++) {
        size_t sl = strlen(j->stop[i]);
        for (size_t k = sl ? sl - 1 : 0; k > hold; k--)
            if (k <= j->len && !memcmp(j->text + j->len - k, j->stop[i], k)) {
                hold = k;
                break;
            }
    }
    j->ready = j->len - hold;
    return 0;
}

/* ------------------------------------------------------------ slots */

static void slot_penalty_reset(slot_t *sl) {
    for (int i = 0; i < sl->n_distinct; i++) sl->counts[sl->distinct[i]] = 0;
    sl->n_distinct = 0;
}

/* The job is over (done, failed or cancelled): publish, free the slot. A
 * finished job's cells stay as a prefix cache (without the last sampled
 * token, which was never fed); a cancelled or failed job's are emptied. */
static void slot_finish(serve_engine *e, int i, const char *finish) {
    slot_t *sl = &e->slots[i];
    serve_job *j = sl->job;
    const char *tail;
    size_t tl;
    whale_err err;
    pthread_mutex_lock(&e->mu);
    int dropped = j->cancelled || j->err.code;
    pthread_mutex_unlock(&e->mu);
    if (sl->detok && !dropped && strcmp(finish, "stop_string") && !whale_detokenizer_flush(sl->detok, &tail, &tl, &err) &&
        tl) {
        pthread_mutex_lock(&e->mu);
        size_t from = j->len;
        if (!job_append(j, tail, tl, &j->err)) job_check_stop(j, from);
        pthread_mutex_unlock(&e->mu);
    }
    whale_sampler_free(sl->sm);
    whale_detokenizer_free(sl->detok);
    sl->sm = NULL;
    sl->detok = NULL;
    slot_penalty_reset(sl);
    int keep = dropped ? 0 : sl->n_cells;
    whale_kv_seq_keep(e->s, i, keep);
    sl->n_cells = sl->n_toks = keep;
    pthread_mutex_lock(&e->mu);
    e->busy--;
    pthread_mutex_lock(&e->metrics->mu); /* before the job is seen done: /metrics agrees with its client */
    e->metrics->slots_busy = e->busy;
    double now = whale_now();
    if (dropped) e->metrics->cancelled++;
    else if (j->t_first) serve_hist_add(&e->metrics->ttft, j->t_first - j->t_submit);
    if (!dropped) serve_hist_add(&e->metrics->latency, now - j->t_submit);
    if (j->model < e->metrics->n_models) {
        e->metrics->model_requests[j->model]++;
        e->metrics->model_generated[j->model] += (uint64_t)j->n_gen;
    }
    pthread_mutex_unlock(&e->metrics->mu);
    j->finish = !strcmp(finish, "stop_string") ? "stop" : finish;
    j->ready = j->len;
    j->done = 1;
    j->t_done = now;
    pthread_cond_broadcast(&j->cv);
    sl->job = NULL;
    job_unref(j);
    pthread_mutex_unlock(&e->mu);
    sl->job = NULL;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* Slot i for a job of model: its cells emptied when they were made with
 * another adapter, and the sequence bound to this one. */
static whale_code slot_bind(serve_engine *e, int i, int model, whale_err *err) {
    slot_t *sl = &e->slots[i];
    if (sl->model == model) return WHALE_OK;
    whale_kv_seq_keep(e->s, i, 0);
    sl->n_cells = sl->n_toks = 0;
    whale_code c = whale_kv_seq_set_adapter(e->s, i, e->ad[model], err);
    if (!c) sl->model = model;
    return c;
}

/* Put job j on a free slot (*slot; there is one), reusing the longest
 * cached prefix among the slots of its adapter; a free slot holding another
 * adapter's cells is taken only when no empty one or one of its own is
 * free, and bound to it. */
static whale_code slot_pick(serve_engine *e, const serve_job *j, int *slot, int *reuse, whale_err *err) {
    int best = -1, best_n = -2, src = -1, src_n = 0;
    for (int i = 0; i < e->n_seq; i++) {
        const slot_t *sl = &e->slots[i];
        int n = sl->model == j->model ? common_prefix(sl->toks, sl->n_cells, j->prompt, j->n_prompt)
                : sl->n_cells ? -1 /* another adapter's cache, taken last */
                              : 0;
        if (!sl->job && n > best_n) best = i, best_n = n;
        if (n > src_n) src = i, src_n = n;
    }
    assert(best >= 0);
    *slot = best;
    int limit = j->n_prompt - 1; /* the last prompt token is always fed: its logits */
    *reuse = best_n < 0 ? 0 : best_n < limit ? best_n : limit;
    whale_code c = slot_bind(e, best, j->model, err);
    if (c) return c;
    if (src != best && src_n > best_n) {
        int n = src_n < limit ? src_n : limit;
        whale_err cerr;
        if (!whale_kv_seq_copy(e->s, src, best, n, &cerr)) {
            memcpy(e->slots[best].toks, j->prompt, sizeof(int32_t) * (size_t)n);
            e->slots[best].n_cells = n;
            *reuse = n;
        }
    }
    return WHALE_OK;
}

static whale_code slot_start(serve_engine *e, serve_job *j, whale_err *err) {
    int reuse = 0, i = -1;
    whale_code c = slot_pick(e, j, &i, &reuse, err);
    slot_t *sl = &e->slots[i];
    sl->job = j;
    if (c) return c;
    c = whale_sampler_new(&j->sp, e->V, &sl->sm, err);
    if (!c) c = whale_detokenizer_new(e->tok, j->skip_special, &sl->detok, err);
    if (c) return c;
    whale_kv_seq_keep(e->s, i, reuse);
    memcpy(sl->toks, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt);
    sl->n_toks = j->n_prompt;
    sl->n_cells = reuse;
    j->n_reused = reuse;
    pthread_mutex_lock(&e->metrics->mu);
    e->metrics->prompt_tokens += (uint64_t)j->n_prompt;
    e->metrics->reused_tokens += (uint64_t)reuse;
    e->metrics->slots_busy = e->busy;
    pthread_mutex_unlock(&e->metrics->mu);
    return WHALE_OK;
}

/* ------------------------------------------------------------ one step */

/* The batch: each decoding slot's last token, then prompt chunks. */
static whale_code step_build(serve_engine *e, int *n_out, int *n_prefill, whale_err *err) {
    whale_dbatch_clear(&e->batch);
    *n_out = *n_prefill = 0;
    for (int a = 0; a < e->n_models; a++) /* adapter by adapter: one run of rows each */
        for (int i = 0; i < e->n_seq; i++) {
            slot_t *sl = &e->slots[i];
            if (!sl->job || sl->model != a || sl->n_toks <= sl->job->n_prompt) continue;
            whale_code c = whale_dbatch_add(&e->batch, sl->toks[sl->n_toks - 1], sl->n_cells, i, 1, err);
            if (c) return c;
            e->out_slot[(*n_out)++] = i;
        }
    int budget = e->n_batch - e->batch.n_tokens, first = e->prefill_next;
    for (int k = 0; k < e->n_seq && budget > 0; k++) {
        int i = (first + k) % e->n_seq;
        slot_t *sl = &e->slots[i];
        if (!sl->job || sl->n_toks > sl->job->n_prompt) continue;
        int left = sl->n_toks - sl->n_cells, take = left < budget ? left : budget;
        for (int t = 0; t < take; t++) {
            int last = t == left - 1;
            whale_code c = whale_dbatch_add(&e->batch, sl->toks[sl->n_cells + t], sl->n_cells + t, i, last, err);
            if (c) return c;
            if (last) e->out_slot[(*n_out)++] = i;
        }
        budget -= take;
        *n_prefill += take;
        e->prefill_next = (i + 1) % e->n_seq;
    }
    return WHALE_OK;
}

/* OpenAI's penalties: logit -= frequency · count + presence · (count > 0). */
static void apply_penalties(const slot_t *sl, float *row) {
    const serve_job *j = sl->job;
    if (j->frequency_penalty == 0 && j->presence_penalty == 0) return;
    for (int k = 0; k < sl->n_distinct; k++) {
        int32_t id = sl->distinct[k];
        row[id] -= j->frequency_penalty * (float)sl->counts[id] + j->presence_penalty;
    }
}

/* Whether tok ends slot i's text (an end id, unless the job ignores them). */
static int slot_is_stop(const serve_engine *e, const serve_job *j, int32_t tok) {
    int is_stop = 0;
    for (int k = 0; k < e->n_stop_ids && !j->ignore_eos; k++) is_stop |= tok == e->stop_ids[k];
    return is_stop;
}

/* Draw slot i's next token from its logits row (raw: [V] room for the row
 * as the model gave it), and its log-probabilities when asked: the part of
 * sampling that reads a whole row. It writes only slot i's own state and
 * the job's next logprobs entry (published by slot_publish), so the rows of
 * one step are drawn in parallel. */
static int32_t slot_draw(serve_engine *e, int i, float *row, float *raw) {
    slot_t *sl = &e->slots[i];
    serve_job *j = sl->job;
    if (j->logprobs) memcpy(raw, row, sizeof(float) * (size_t)e->V);
    apply_penalties(sl, row);
    int32_t tok = whale_sample(sl->sm, row, sl->toks, sl->n_toks);
    if (tok >= 0 && j->logprobs && !slot_is_stop(e, j, tok)) { /* a stop id is not part of the text */
        assert(j->n_lp < j->max_tokens);
        serve_logprobs_row(raw, e->V, tok, j->top_logprobs, &j->lp[j->n_lp],
                           j->top + (size_t)j->n_lp * (size_t)j->top_logprobs);
    }
    return tok;
}

/* Append slot i's drawn token and publish its text; returns the finish
 * reason when the job ends, else NULL. */
static const char *slot_publish(serve_engine *e, int i, int32_t tok, whale_err *err) {
    slot_t *sl = &e->slots[i];
    serve_job *j = sl->job;
    if (tok < 0) {
        whale_errf(err, WHALE_ERR_RANGE, "every logit is NaN or -inf at generated token %d", j->n_gen);
        return "error";
    }
    sl->toks[sl->n_toks++] = tok;
    if (sl->counts[tok]++ == 0) sl->distinct[sl->n_distinct++] = tok;
    int is_stop = slot_is_stop(e, j, tok), record = j->logprobs && !is_stop;
    const char *piece = "";
    size_t pl = 0;
    if (!is_stop && whale_detokenizer_push(sl->detok, tok, &piece, &pl, err)) return "error";
    pthread_mutex_lock(&e->mu);
    j->n_gen++;
    if (!j->t_first) j->t_first = whale_now();
    size_t from = j->len;
    int cut = 0;
    if (pl && job_append(j, piece, pl, err)) cut = -1;
    if (record && cut == 0) j->lp[j->n_lp++].end = j->len; /* published with the text */
    if (pl && cut == 0) cut = job_check_stop(j, from);
    int wake = j->ready >= j->wake_at && (j->n_gen == 1 || j->n_gen % e->interval == 0);
    pthread_mutex_unlock(&e->mu);
    /* after the unlock: a reader woken under it would block at once on
     * the mutex the engine still holds (two switches a token, not one);
     * the slot's reference keeps j alive */
    if (wake) pthread_cond_broadcast(&j->cv);
    if (cut < 0) return "error";
    if (is_stop) return "stop";
    if (cut) return "stop_string";
    if (j->n_gen >= j->max_tokens || sl->n_toks > e->n_ctx) return "length";
    return NULL;
}

/* t: the step's start, the end of its forward, of its draws, of publishing. */
static void step_metrics(serve_engine *e, int n_seqs, int n_gen, const double t[4]) {
    serve_metrics *m = e->metrics;
    const double dt = t[3] - t[0];
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < 3; i++) m->phase_seconds[i] += t[i + 1] - t[i];
    m->decode_steps++;
    m->generated_tokens += (uint64_t)n_gen;
    m->batch_seqs_last = n_seqs;
    if (n_seqs > m->batch_seqs_max) m->batch_seqs_max = n_seqs;
    serve_hist_add(&m->batch_seqs, n_seqs);
    serve_hist_add(&m->step, dt);
    pthread_mutex_unlock(&m->mu);
}

/* Decode one batch and sample every slot that got logits. A failed decode
 * fails the jobs in it (their cells are emptied); the server goes on. */
static void step_run(serve_engine *e) {
    whale_err err = {0};
    int n_out, n_prefill;
    whale_code c = step_build(e, &n_out, &n_prefill, &err);
    if (!c && e->batch.n_tokens == 0) return;
    double t[4] = {whale_now()};
    if (!c) c = whale_session_decode(e->s, &e->batch, e->logits, &err);
    t[1] = whale_now();
    if (c) {
        for (int i = 0; i < e->n_seq; i++)
            if (e->slots[i].job) {
                pthread_mutex_lock(&e->mu);
                e->slots[i].job->err = err;
                pthread_mutex_unlock(&e->mu);
                slot_finish(e, i, "error");
            }
        return;
    }
    for (int k = 0; k < e->batch.n_tokens; k++) e->slots[e->batch.seq_id[k]].n_cells++;
    int n_seqs = 0; /* sequences in the batch: their tokens are consecutive */
    for (int k = 0; k < e->batch.n_tokens; k++) n_seqs += k == 0 || e->batch.seq_id[k] != e->batch.seq_id[k - 1];
    /* each row on its own thread: a greedy draw reads the row once (a
     * 129,280-word row of nanowhale-100m, 0.5 MB, ~27 us on one core) */
    WHALE_FOR_IF(n_out > 1, (int k = 0; k < n_out; k++), {
        e->out_tok[k] = slot_draw(e, e->out_slot[k], e->logits + (size_t)k * e->V, e->raw + (size_t)k * e->V);
    });
    t[2] = whale_now();
    for (int k = 0; k < n_out; k++) {
        int i = e->out_slot[k];
        whale_err serr = {0};
        e->out_fin[k] = slot_publish(e, i, e->out_tok[k], &serr);
        if (e->out_fin[k] && !strcmp(e->out_fin[k], "error")) {
            pthread_mutex_lock(&e->mu);
            e->slots[i].job->err = serr;
            pthread_mutex_unlock(&e->mu);
        }
    }
    /* counted before any job of this step is answered: a client that has
     * its reply finds the step in /metrics */
    t[3] = whale_now();
    step_metrics(e, n_seqs, n_out, t);
    for (int k = 0; k < n_out; k++)
        if (e->out_fin[k]) slot_finish(e, e->out_slot[k], e->out_fin[k]);
}

/* ------------------------------------------------------------ the thread */

/* Under e->mu: end the queued jobs whose clients went away, at once (not
 * when a slot frees): they give their places in the queue back. */
static void queue_drop_cancelled(serve_engine *e) {
    serve_job **p = &e->qhead, *last = NULL;
    while (*p) {
        serve_job *j = *p;
        if (!j->cancelled) {
            last = j;
            p = &j->next;
            continue;
        }
        *p = j->next;
        e->qlen--;
        j->done = 1;
        j->finish = "cancelled";
        pthread_mutex_lock(&e->metrics->mu);
        e->metrics->cancelled++;
        pthread_mutex_unlock(&e->metrics->mu);
        pthread_cond_broadcast(&j->cv);
        job_unref(j);
    }
    e->qtail = last;
}

/* Under e->mu: release slots whose jobs were cancelled, drop cancelled
 * queued jobs, take queued jobs into free slots (outside the lock they are
 * set up). A job cancelled while it is set up ends at the next step. */
static void admit(serve_engine *e) {
    for (int i = 0; i < e->n_seq; i++)
        if (e->slots[i].job && e->slots[i].job->cancelled) {
            pthread_mutex_unlock(&e->mu);
            slot_finish(e, i, "cancelled");
            pthread_mutex_lock(&e->mu);
        }
    queue_drop_cancelled(e);
    while (e->qhead && e->busy < e->n_seq) {
        serve_job *j = e->qhead;
        e->qhead = j->next;
        if (!e->qhead) e->qtail = NULL;
        e->qlen--;
        e->busy++;
        pthread_mutex_unlock(&e->mu);
        whale_err err = {0};
        if (slot_start(e, j, &err)) {
            j->err = err;
            for (int i = 0; i < e->n_seq; i++)
                if (e->slots[i].job == j) slot_finish(e, i, "error");
        }
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_lock(&e->metrics->mu);
    e->metrics->queue_depth = e->qlen;
    pthread_mutex_unlock(&e->metrics->mu);
}

static void *engine_main(void *arg) {
    serve_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stopping && !e->qhead && e->busy == 0) pthread_cond_wait(&e->work, &e->mu);
        if (e->stopping) {
            for (int i = 0; i < e->n_seq; i++)
                if (e->slots[i].job) e->slots[i].job->cancelled = 1;
            for (serve_job *j = e->qhead; j; j = j->next) j->cancelled = 1;
            admit(e);
            if (!e->qhead && e->busy == 0) break;
        }
        admit(e);
        pthread_mutex_unlock(&e->mu);
        step_run(e);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ------------------------------------------------------------ public */

static whale_code engine_alloc(serve_engine *e, whale_err *err) {
    e->slots = calloc((size_t)e->n_seq, sizeof *e->slots);
    e->out_slot = calloc((size_t)e->n_seq, sizeof(int));
    e->out_fin = calloc((size_t)e->n_seq, sizeof(char *));
    e->logits = whale_alloc(sizeof(float) * (size_t)e->n_seq * (size_t)e->V);
    e->out_tok = calloc((size_t)e->n_seq, sizeof(int32_t));
    e->raw = whale_alloc(sizeof(float) * (size_t)e->n_seq * (size_t)e->V);
    if (!e->slots || !e->out_slot || !e->out_fin || !e->out_tok || !e->logits || !e->raw) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the slots");
    for (int i = 0; i < e->n_seq; i++) {
        slot_t *sl = &e->slots[i];
        sl->toks = malloc(sizeof(int32_t) * (size_t)(e->n_ctx + 1));
        sl->counts = calloc((size_t)e->V, sizeof(int32_t));
        sl->distinct = malloc(sizeof(int32_t) * (size_t)(e->n_ctx + 1));
        if (!sl->toks || !sl->counts || !sl->distinct)
            return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the slots");
    }
    return whale_dbatch_init(&e->batch, e->n_batch, err);
}

/* Before the first request: one forward of a short prompt (past the rows
 * our own kernels take, so oneDNN makes its primitives and the scratch
 * grows) and one of a token per slot. Without it the first reply of a
 * nanowhale-100m int8 server took 93 ms instead of 37 (2 threads). The
 * cells are emptied again. */
static whale_code engine_warm_up(serve_engine *e, whale_err *err) {
    int n = WARM_UP_TOKENS < e->n_batch ? WARM_UP_TOKENS : e->n_batch;
    if (n > e->n_ctx) n = e->n_ctx;
    whale_dbatch_clear(&e->batch);
    whale_code c = WHALE_OK;
    for (int t = 0; t < n && !c; t++) c = whale_dbatch_add(&e->batch, 0, t, 0, t == n - 1, err);
    if (!c) c = whale_session_decode(e->s, &e->batch, e->logits, err);
    whale_kv_seq_keep(e->s, 0, 0);
    whale_dbatch_clear(&e->batch);
    for (int i = 0; i < e->n_seq && !c; i++) c = whale_dbatch_add(&e->batch, 0, 0, i, 1, err);
    if (!c) c = whale_session_decode(e->s, &e->batch, e->logits, err);
    for (int i = 0; i < e->n_seq; i++) whale_kv_seq_keep(e->s, i, 0);
    whale_dbatch_clear(&e->batch);
    return c;
}

whale_code serve_engine_new(whale_model *m, const whale_tokenizer *tok, const int32_t *stop_ids, int n_stop,
                            whale_adapter *const *adapters, int n_adapters, const serve_config *cfg,
                            serve_metrics *metrics, serve_engine **out, whale_err *err) {
    *out = NULL;
    serve_engine *e = calloc(1, sizeof *e);
    if (!e || !(e->ad = calloc((size_t)n_adapters + 1, sizeof *e->ad))) {
        free(e);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    e->n_models = n_adapters + 1;
    for (int k = 0; k < n_adapters; k++) e->ad[k + 1] = adapters[k];
    e->m = m;
    e->tok = tok;
    e->metrics = metrics;
    e->n_seq = cfg->parallel;
    e->n_ctx = cfg->ctx_size;
    e->n_batch = cfg->batch > cfg->parallel ? cfg->batch : cfg->parallel;
    e->V = whale_model_vocab_size(m);
    e->qmax = cfg->queue;
    e->interval = cfg->stream_interval > 1 ? cfg->stream_interval : 1;
    e->n_stop_ids = n_stop < 32 ? n_stop : 32;
    memcpy(e->stop_ids, stop_ids, sizeof(int32_t) * (size_t)e->n_stop_ids);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    whale_session_params p = {e->n_seq, e->n_ctx, e->n_batch};
    whale_code c = whale_session_new_batched(m, &p, &e->s, err);
    if (!c) c = engine_alloc(e, err);
    if (!c) whale_kv_commit(e->s); /* every slot's cells resident from the start */
    if (!c) c = engine_warm_up(e, err);
    if (!c) whale_threads_release(); /* the engine thread's team is then the process's only one */
    if (!c && pthread_create(&e->thread, NULL, engine_main, e))
        c = whale_errf(err, WHALE_ERR_INTERNAL, "cannot start the engine thread");
    if (c) {
        serve_engine_free(e);
        return c;
    }
    e->started = 1;
    *out = e;
    return WHALE_OK;
}

void serve_engine_stop(serve_engine *e) {
    if (!e || !e->started) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->started = 0;
}

void serve_engine_free(serve_engine *e) {
    if (!e) return;
    serve_engine_stop(e);
    for (int i = 0; e->slots && i < e->n_seq; i++) {
        free(e->slots[i].toks);
        free(e->slots[i].counts);
        free(e->slots[i].distinct);
        whale_sampler_free(e->slots[i].sm);
        whale_detokenizer_free(e->slots[i].detok);
    }
    free(e->slots);
    free(e->ad);
    free(e->out_slot);
    free(e->out_fin);
    free(e->out_tok);
    free(e->logits);
    free(e->raw);
    whale_dbatch_free(&e->batch);
    whale_session_free(e->s);
    pthread_cond_destroy(&e->work);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int serve_engine_ctx(const serve_engine *e) { return e->n_ctx; }
size_t serve_engine_kv_bytes(const serve_engine *e) { return whale_kv_bytes(e->s); }

whale_code serve_engine_submit(serve_engine *e, serve_job *j, whale_err *err) {
    pthread_mutex_lock(&e->mu);
    whale_code c = WHALE_OK;
    if (e->draining || e->stopping) c = whale_errf(err, WHALE_ERR_UNSUPPORTED, "the server is shutting down");
    else if (e->qlen >= e->qmax && e->busy >= e->n_seq)
        c = whale_errf(err, WHALE_ERR_RANGE, "all %d slots are busy and %d requests are waiting", e->n_seq, e->qlen);
    if (!c) {
        j->refs++;
        j->t_submit = whale_now();
        j->next = NULL;
        if (e->qtail) e->qtail->next = j;
        else e->qhead = j;
        e->qtail = j;
        e->qlen++;
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->mu);
    if (!c) {
        pthread_mutex_lock(&e->metrics->mu);
        if (e->qlen > e->metrics->queue_depth) e->metrics->queue_depth = e->qlen;
        pthread_mutex_unlock(&e->metrics->mu);
    }
    return c;
}

int serve_engine_wait(serve_engine *e, serve_job *j, size_t seen, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    ts.tv_sec += timeout_ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&e->mu);
    j->wake_at = seen == (size_t)-1 ? seen : seen + 1;
    while (!j->done && j->ready <= seen)
        if (pthread_cond_timedwait(&j->cv, &e->mu, &ts) == ETIMEDOUT) break;
    int r = j->done ? 1 : j->ready > seen ? 0 : -1;
    pthread_mutex_unlock(&e->mu);
    return r;
}

void serve_engine_cancel(serve_engine *e, serve_job *j) {
    pthread_mutex_lock(&e->mu);
    if (!j->done) {
        j->cancelled = 1;
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->mu);
}

serve_job_view serve_engine_view(serve_engine *e, serve_job *j) {
    pthread_mutex_lock(&e->mu);
    serve_job_view v = {j->ready, j->n_gen, j->n_reused, j->done, j->n_lp, j->finish, j->err.code};
    pthread_mutex_unlock(&e->mu);
    return v;
}

char *serve_engine_take(serve_engine *e, serve_job *j, size_t from, size_t *len, serve_job_view *v) {
    pthread_mutex_lock(&e->mu);
    *v = (serve_job_view){j->ready, j->n_gen, j->n_reused, j->done, j->n_lp, j->finish, j->err.code};
    size_t n = j->ready > from ? j->ready - from : 0;
    char *out = n ? malloc(n + 1) : NULL;
    if (out) {
        memcpy(out, j->text + from, n);
        out[n] = 0;
    }
    pthread_mutex_unlock(&e->mu);
    *len = out ? n : 0;
    return out;
}

int serve_engine_drain(serve_engine *e, double timeout) {
    double t0 = whale_now();
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    pthread_mutex_unlock(&e->mu);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int idle = !e->qhead && e->busy == 0;
        pthread_mutex_unlock(&e->mu);
        if (idle) return 1;
        if (whale_now() - t0 >= timeout) return 0;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int serve_engine_draining(serve_engine *e) {
    pthread_mutex_lock(&e->mu);
    int d = e->draining;
    pthread_mutex_unlock(&e->mu);
    return d;
}
