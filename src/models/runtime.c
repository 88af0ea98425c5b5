/*
 * Sessions and the batch API: the KV cache's cells, batches of tokens that
 * each carry a position and a sequence id, their translation into the
 * micro-batch (whale_ubatch: spans of rows per sequence) a family's
 * forward runs, and the adapter each sequence is bound to, turned into
 * runs of rows per adapter for the products. Everything here is
 * family-independent; a family only appends its K/V rows (whale_kv_append),
 * reads a sequence's cells and names the rows an expert gathers.
 */
#include "models/model.h"

#include "backend/backend.h"
#include "core/core.h"
#include "core/par.h"

#include <stdlib.h>

#include <string.h>

/* ------------------------------------------------------------------ cells */

int whale_kv_alloc(whale_kv *kv, whale_bufs *b, int n_layer, int n_seq, int n_ctx, int width, int shared,
                   size_t *total) {
    size_t cells = (size_t)n_layer * n_seq * n_ctx * width;
    *kv = (whale_kv){n_layer, n_seq, n_ctx, width, NULL, NULL, NULL};
    size_t none = 0; /* the lengths are bookkeeping, not cache bytes */
    if (!(kv->k = whale_bufs_alloc(b, cells, sizeof(float), total))) return 0;
    if (!(kv->v = shared ? kv->k : whale_bufs_alloc(b, cells, sizeof(float), total))) return 0;
    if (!(kv->len = whale_bufs_alloc(b, (size_t)n_seq, sizeof(int), &none))) return 0;
    if (!b->count_only) memset(kv->len, 0, sizeof(int) * (size_t)n_seq);
    return 1;
}

void whale_kv_append(whale_kv *kv, int l, int seq, int p0, int n, const float *k, const float *v) {
    assert(p0 >= 0 && n >= 0 && p0 + n <= kv->n_ctx);
    size_t w = (size_t)kv->width;
    memcpy(whale_kv_k(kv, l, seq) + (size_t)p0 * w, k, sizeof(float) * n * w);
    if (kv->v != kv->k) memcpy(whale_kv_v(kv, l, seq) + (size_t)p0 * w, v, sizeof(float) * n * w);
}

int whale_kv_seq_len(const whale_session *s, int seq) {
    return s->kv.k && seq >= 0 && seq < s->kv.n_seq ? s->kv.len[seq] : 0;
}

void whale_kv_seq_keep(whale_session *s, int seq, int n) {
    if (s->kv.k && seq >= 0 && seq < s->kv.n_seq && n >= 0 && n < s->kv.len[seq]) s->kv.len[seq] = n;
}

whale_code whale_kv_seq_copy(whale_session *s, int src, int dst, int n, whale_err *err) {
    whale_kv *kv = &s->kv;
    if (!kv->k) return whale_errf(err, WHALE_ERR_ARG, "a training session has no KV cache");
    if (src < 0 || src >= kv->n_seq || dst < 0 || dst >= kv->n_seq)
        return whale_errf(err, WHALE_ERR_ARG, "sequence %d or %d outside the session's 0..%d", src, dst,
                          kv->n_seq - 1);
    if (n < 0 || n > kv->len[src])
        return whale_errf(err, WHALE_ERR_RANGE, "cannot copy %d cells of sequence %d, which holds %d", n, src,
                          kv->len[src]);
    if (n > 0 && whale_kv_seq_adapter(s, src) != whale_kv_seq_adapter(s, dst))
        return whale_errf(err, WHALE_ERR_ARG,
                          "sequences %d and %d are bound to different adapters: cells made with one do not serve "
                          "the other", src, dst);
    if (src != dst)
        for (int l = 0; l < kv->n_layer; l++) {
            size_t bytes = sizeof(float) * (size_t)n * kv->width;
            memcpy(whale_kv_k(kv, l, dst), whale_kv_k(kv, l, src), bytes);
            if (kv->v != kv->k) memcpy(whale_kv_v(kv, l, dst), whale_kv_v(kv, l, src), bytes);
        }
    kv->len[dst] = n;
    return WHALE_OK;
}

size_t whale_kv_bytes(const whale_session *s) { return s->kv_bytes; }

void whale_kv_commit(whale_session *s) {
    whale_kv *kv = &s->kv;
    if (!kv->k) return;
    const size_t w = (size_t)kv->width, n = (size_t)kv->n_layer * kv->n_seq;
    const int both = kv->v != kv->k;
    /* layer i / n_seq, sequence i % n_seq: the cells it does not hold */
    WHALE_FOR_IF(n * kv->n_ctx * w >= (1u << 20), (size_t i = 0; i < n; i++), {
        const int l = (int)(i / (size_t)kv->n_seq), q = (int)(i % (size_t)kv->n_seq), held = kv->len[q];
        const size_t bytes = sizeof(float) * (size_t)(kv->n_ctx - held) * w;
        memset(whale_kv_k(kv, l, q) + (size_t)held * w, 0, bytes);
        if (both) memset(whale_kv_v(kv, l, q) + (size_t)held * w, 0, bytes);
    });
}

/* ------------------------------------------------------------------ adapters per sequence */

const whale_adapter *whale_kv_seq_adapter(const whale_session *s, int seq) {
    return s->seq_adapter && seq >= 0 && seq < s->kv.n_seq ? s->seq_adapter[seq] : NULL;
}

whale_code whale_kv_seq_set_adapter(whale_session *s, int seq, const whale_adapter *a, whale_err *err) {
    whale_kv *kv = &s->kv;
    if (!kv->k) return whale_errf(err, WHALE_ERR_ARG, "a training session has no sequences to bind adapters to");
    if (seq < 0 || seq >= kv->n_seq)
        return whale_errf(err, WHALE_ERR_ARG, "sequence %d outside the session's 0..%d", seq, kv->n_seq - 1);
    if (a == whale_kv_seq_adapter(s, seq)) return WHALE_OK;
    if (a && a->model != s->model)
        return whale_errf(err, WHALE_ERR_ARG, "sequence %d: the adapter was loaded for another model", seq);
    if (a && s->model->n_lora)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                          "the model has LoRA adapters attached to every row (whale_lora_load): bind adapters per "
                          "sequence over a base without them");
    if (a && (size_t)2 * a->rank > s->lora_work_floats)
        return whale_errf(err, WHALE_ERR_ARG,
                          "an adapter of rank %d was loaded after the session was made (its scratch holds rank %zu): "
                          "load the adapters before creating sessions", a->rank, s->lora_work_floats / 2);
    if (kv->len[seq])
        return whale_errf(err, WHALE_ERR_ARG,
                          "sequence %d holds %d cells made with another adapter: empty it first (keep 0 cells)", seq,
                          kv->len[seq]);
    if (!s->seq_adapter) {
        s->seq_adapter = calloc((size_t)kv->n_seq, sizeof *s->seq_adapter);
        s->run_mem = calloc((size_t)2 * kv->n_seq, sizeof *s->run_mem);
        if (!s->seq_adapter || !s->run_mem) {
            free(s->seq_adapter), free(s->run_mem);
            s->seq_adapter = NULL, s->run_mem = NULL;
            return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the adapters of %d sequences", kv->n_seq);
        }
    }
    s->n_bound += (a != NULL) - (s->seq_adapter[seq] != NULL);
    s->seq_adapter[seq] = a;
    return WHALE_OK;
}

/* Runs by adapter (its load order), then row. */
static int run_cmp(const void *x, const void *y) {
    const whale_lora_run *a = x, *b = y;
    if (a->ad->index != b->ad->index) return a->ad->index < b->ad->index ? -1 : 1;
    return a->row0 < b->row0 ? -1 : a->row0 > b->row0;
}

/* Append rows row0 .. row0 + n − 1 of adapter ad (NULL: the base, no run). */
static void add_run(whale_lora_rows *rw, const whale_adapter *ad, int row0, int n) {
    if (!ad || !n) return;
    whale_lora_run *last = rw->n_runs ? &rw->runs[rw->n_runs - 1] : NULL;
    if (last && last->ad == ad && last->row0 + last->n == row0) last->n += n;
    else rw->runs[rw->n_runs++] = (whale_lora_run){ad, row0, n};
}

void whale_lora_rows_of_ubatch(whale_session *s, const whale_ubatch *ub) {
    s->ub_rows = (whale_lora_rows){s->run_mem, 0, ub->T};
    if (s->n_bound)
        for (int i = 0; i < ub->n_spans; i++) {
            assert(s->ub_rows.n_runs < s->kv.n_seq);
            add_run(&s->ub_rows, s->seq_adapter[ub->spans[i].seq], ub->spans[i].row0, ub->spans[i].n);
        }
    if (s->ub_rows.n_runs > 1) qsort(s->ub_rows.runs, (size_t)s->ub_rows.n_runs, sizeof *s->ub_rows.runs, run_cmp);
    s->lora_rows = s->ub_rows;
}

void whale_lora_rows_gather(whale_session *s, int n, const int32_t *tok) {
    if (!s->ub_rows.n_runs) return;
    const whale_ubatch *ub = s->ub;
    assert(ub && n <= ub->T);
    whale_lora_rows rw = {s->run_mem + s->kv.n_seq, 0, n};
    int sp = 0; /* the span of tok[i]: tok ascending, so each span is passed once */
    for (int i = 0; i < n; i++) {
        assert(tok[i] >= 0 && tok[i] < ub->T && (i == 0 || tok[i] > tok[i - 1]));
        while (tok[i] >= ub->spans[sp].row0 + ub->spans[sp].n) sp++;
        add_run(&rw, s->seq_adapter[ub->spans[sp].seq], i, 1);
        assert(rw.n_runs <= s->kv.n_seq); /* a run changes adapter only where a span ends */
    }
    if (rw.n_runs > 1) qsort(rw.runs, (size_t)rw.n_runs, sizeof *rw.runs, run_cmp);
    s->lora_rows = rw;
}

void whale_lora_rows_reset(whale_session *s) { s->lora_rows = s->ub_rows; }

/* ------------------------------------------------------------------ micro-batches */

whale_ubatch whale_ubatch_training(whale_span *spans, const int32_t *ids, const int32_t *pos, int B, int S) {
    for (int b = 0; b < B; b++) spans[b] = (whale_span){b * S, S, b, 0};
    return (whale_ubatch){B * S, ids, pos, B, spans, B * S, NULL};
}

void whale_ubatch_positions(const whale_ubatch *ub, int32_t *pos) {
    if (ub->pos) {
        memcpy(pos, ub->pos, sizeof(int32_t) * (size_t)ub->T);
        return;
    }
    for (int i = 0; i < ub->n_spans; i++)
        for (int r = 0; r < ub->spans[i].n; r++) pos[ub->spans[i].row0 + r] = ub->spans[i].p0 + r;
}

whale_code whale_attention_ubatch(whale_session *s, int l, float *out, const float *q, const float *k, const float *v,
                                  int ldkv, const int32_t *seg, int Hq, int Hkv, int Dh, float scale, float *work,
                                  whale_err *err) {
    const whale_ubatch *ub = s->ub;
    whale_kv *kv = &s->kv;
    const whale_dtype products = whale_attention_products(s->model);
    assert(!kv->k || kv->width == ldkv);
    whale_att_span sp[64]; /* 64 spans a call: the cpu backend's region at most */
    for (int i0 = 0; i0 < ub->n_spans; i0 += 64) {
        int n = ub->n_spans - i0 < 64 ? ub->n_spans - i0 : 64;
        for (int i = 0; i < n; i++) {
            const whale_span *u = &ub->spans[i0 + i];
            const float *ku = k + (size_t)u->row0 * ldkv, *vu = v + (size_t)u->row0 * ldkv;
            if (kv->k) {
                whale_kv_append(kv, l, u->seq, u->p0, u->n, ku, vu);
                ku = whale_kv_k(kv, l, u->seq);
                vu = whale_kv_v(kv, l, u->seq);
            }
            sp[i] = (whale_att_span){out + (size_t)u->row0 * Hq * Dh, q + (size_t)u->row0 * Hq * Dh, ku, vu, ldkv,
                                     seg ? seg + u->row0 : NULL, u->n, u->p0};
        }
        whale_code c = WHALE_OK;
        if (s->be->version >= 2) c = WHALE_OP(s, attention_spans, sp, n, Hq, Hkv, Dh, scale, products, work, err);
        for (int i = 0; s->be->version < 2 && c == WHALE_OK && i < n; i++) /* a backend before attention_spans */
            c = WHALE_OP(s, attention, sp[i].out, sp[i].q, sp[i].k, sp[i].v, ldkv, sp[i].seg, sp[i].S, sp[i].p0, Hq,
                         Hkv, Dh, scale, products, work, err);
        if (c) return c;
    }
    return WHALE_OK;
}

whale_code whale_output_logits(whale_session *s, const whale_ubatch *ub, const float *hn, float *rows, int D, int V,
                               const float *head, float *logits, whale_err *err) {
    if (!ub->out) return whale_linear(s, ub->T, V, D, hn, D, head, D, logits, V, err);
    for (int i0 = 0; i0 < ub->n_out; i0 += s->max_batch) {
        int n = ub->n_out - i0 < s->max_batch ? ub->n_out - i0 : s->max_batch;
        for (int i = 0; i < n; i++) {
            assert(ub->out[i0 + i] >= 0 && ub->out[i0 + i] < ub->T);
            memcpy(rows + (size_t)i * D, hn + (size_t)ub->out[i0 + i] * D, sizeof(float) * D);
        }
        whale_code e = whale_linear(s, n, V, D, rows, D, head, D, logits + (size_t)i0 * V, V, err);
        if (e) return e;
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------------ sessions */

whale_code whale_session_new_batched(whale_model *m, const whale_session_params *p, whale_session **out,
                                     whale_err *err) {
    *out = NULL;
    if (p->n_seq < 1 || p->n_seq > WHALE_MAX_BATCH)
        return whale_errf(err, WHALE_ERR_ARG, "sequences must be 1..%d, got %d", WHALE_MAX_BATCH, p->n_seq);
    if (p->n_ctx < 1) return whale_errf(err, WHALE_ERR_ARG, "context must be >= 1 position, got %d", p->n_ctx);
    if (p->n_ctx > m->max_positions)
        return whale_errf(err, WHALE_ERR_RANGE, "context %d exceeds the model's max_position_embeddings %d", p->n_ctx,
                          m->max_positions);
    if (p->n_batch < 1 || p->n_batch > WHALE_MAX_BATCH_TOKENS)
        return whale_errf(err, WHALE_ERR_ARG, "micro-batch must be 1..%d tokens, got %d", WHALE_MAX_BATCH_TOKENS,
                          p->n_batch);
    const whale_session_spec sp = {p->n_seq, p->n_ctx, p->n_batch, 0, 0, 0};
    return m->ops->session_create(m, &sp, out, err);
}

whale_code whale_session_new(whale_model *m, int max_batch, int max_seq, whale_session **out, whale_err *err) {
    *out = NULL;
    if (max_batch < 1) return whale_errf(err, WHALE_ERR_ARG, "batch size must be >= 1, got %d", max_batch);
    if (max_seq < 1) return whale_errf(err, WHALE_ERR_ARG, "sequence length must be >= 1, got %d", max_seq);
    if (max_seq > m->max_positions)
        return whale_errf(err, WHALE_ERR_RANGE, "sequence length %d exceeds the model's max_position_embeddings %d",
                          max_seq, m->max_positions);
    if ((int64_t)max_batch * max_seq > WHALE_MAX_BATCH_TOKENS)
        return whale_errf(err, WHALE_ERR_ARG, "batch %d × %d exceeds %d tokens", max_batch, max_seq,
                          WHALE_MAX_BATCH_TOKENS);
    const whale_session_spec sp = {max_batch, max_seq, max_batch * max_seq, 0, 0, 0};
    return m->ops->session_create(m, &sp, out, err);
}

whale_code whale_session_sizes_for(whale_model *m, int B, int S, int training, int recompute, whale_session_sizes *out,
                               whale_err *err) {
    const whale_session_spec sp = {B, S, B * S, training, recompute, 1};
    whale_session *s;
    whale_code e = m->ops->session_create(m, &sp, &s, err);
    if (e) return e;
    whale_session_sizes_of(s, out);
    whale_session_free(s);
    return WHALE_OK;
}

whale_code whale_session_bind_grads(whale_session *s, whale_code (*reg)(whale_model *scratch, void *gw, whale_err *err),
                                    void *gw, int count_only, whale_err *err) {
    whale_model scratch = {0};
    whale_code e = reg(&scratch, gw, err);
    for (int i = 0; !e && !count_only && i < scratch.n_params; i++)
        *scratch.params[i].slot = s->grad_offsets[i] == SIZE_MAX ? NULL : s->grads + s->grad_offsets[i];
    free(scratch.params);
    return e;
}

whale_code whale_session_open_backend(whale_session *s, whale_err *err) {
    const char *name = getenv("WHALE_BACKEND");
    return whale_backend_open(name && *name ? name : "cpu", &s->be, err);
}

void whale_session_set_abort(whale_session *s, whale_abort_fn fn, void *user) {
    s->abort_fn = fn;
    s->abort_user = user;
}

whale_code whale_session_check_abort(whale_session *s, whale_err *err) {
    return s->abort_fn && s->abort_fn(s->abort_user) ? whale_errf(err, WHALE_ERR_ABORTED, "stopped on request")
                                                     : WHALE_OK;
}

whale_code whale_session_set_grad_ready(whale_session *s, whale_grad_ready_fn fn, void *user, whale_err *err) {
    if (fn && !s->grads) return whale_errf(err, WHALE_ERR_ARG, "only a training session has gradients to report");
    if (fn && !s->grad_runs && !(s->grad_runs = malloc(sizeof *s->grad_runs * (size_t)(s->model->n_params + 1))))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the gradient-ready hook");
    s->grad_ready = fn;
    s->grad_ready_user = user;
    return WHALE_OK;
}

/* Parameter i's gradient range as a run (offset, floats), if it is trainable. */
static int add_run_of(const whale_session *s, int i, int n) {
    const whale_param *p = &s->model->params[i];
    if (p->frozen) return n; /* no buffer, or one that stays out of the exchange */
    assert(s->grad_offsets[i] + (size_t)whale_shape_numel(p->ndim, p->shape) <= s->n_grad_train);
    s->grad_runs[n][0] = s->grad_offsets[i];
    s->grad_runs[n][1] = (size_t)whale_shape_numel(p->ndim, p->shape);
    return n + 1;
}

static int run_cmp_offset(const void *x, const void *y) {
    const size_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

whale_code whale_session_grads_final(whale_session *s, const float *w, whale_err *err) {
    const whale_model *m = s->model;
    if (!s->grad_ready) return WHALE_OK;
    int p = 0, n = 0, nb = m->n_lora ? m->n_base_params : m->n_params;
    if (w) {
        while (p < nb && m->params[p].data != w) p++;
        assert(p < nb); /* w is a base parameter's values */
    }
    if (p >= s->grad_final_from) return WHALE_OK;
    for (int i = p; i < s->grad_final_from; i++) n = add_run_of(s, i, n);
    for (int k = 0; k < m->n_lora; k++)
        if (m->lora[k].base >= p && m->lora[k].base < s->grad_final_from)
            n = add_run_of(s, m->lora[k].b, add_run_of(s, m->lora[k].a, n));
    s->grad_final_from = p;
    qsort(s->grad_runs, (size_t)n, sizeof *s->grad_runs, run_cmp_offset);
    /* adjacent runs as one range, the last first: the order the backward
     * pass finishes them in */
    for (int hi = n; hi > 0;) {
        int lo = hi - 1;
        while (lo > 0 && s->grad_runs[lo - 1][0] + s->grad_runs[lo - 1][1] == s->grad_runs[lo][0]) lo--;
        size_t a = s->grad_runs[lo][0], b = s->grad_runs[hi - 1][0] + s->grad_runs[hi - 1][1];
        whale_code c = a < b ? s->grad_ready(s->grad_ready_user, a, b, err) : WHALE_OK;
        if (c) return c;
        hi = lo;
    }
    return WHALE_OK;
}

whale_session_params whale_session_get_params(const whale_session *s) {
    return (whale_session_params){s->max_batch, s->max_seq, s->n_batch};
}

void whale_session_reset(whale_session *s) {
    for (int q = 0; s->kv.k && q < s->kv.n_seq; q++) s->kv.len[q] = 0;
}

void whale_session_truncate(whale_session *s, int n) {
    for (int q = 0; q < s->kv.n_seq; q++) whale_kv_seq_keep(s, q, n);
}

int whale_session_cached(const whale_session *s) { return whale_kv_seq_len(s, 0); }

/* ------------------------------------------------------------------ batches */

whale_code whale_dbatch_init(whale_dbatch *b, int cap, whale_err *err) {
    memset(b, 0, sizeof *b);
    if (cap < 1 || cap > WHALE_MAX_BATCH_TOKENS)
        return whale_errf(err, WHALE_ERR_ARG, "a batch holds 1..%d tokens, not %d", WHALE_MAX_BATCH_TOKENS, cap);
    b->token = malloc(sizeof(int32_t) * (size_t)cap);
    b->pos = malloc(sizeof(int32_t) * (size_t)cap);
    b->seq_id = malloc(sizeof(int32_t) * (size_t)cap);
    b->logits = malloc((size_t)cap);
    if (!b->token || !b->pos || !b->seq_id || !b->logits) {
        whale_dbatch_free(b);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for a batch of %d tokens", cap);
    }
    b->cap = cap;
    return WHALE_OK;
}

void whale_dbatch_free(whale_dbatch *b) {
    free(b->token);
    free(b->pos);
    free(b->seq_id);
    free(b->logits);
    memset(b, 0, sizeof *b);
}

void whale_dbatch_clear(whale_dbatch *b) { b->n_tokens = 0; }

whale_code whale_dbatch_add(whale_dbatch *b, int32_t token, int32_t pos, int32_t seq_id, int logits, whale_err *err) {
    if (b->n_tokens >= b->cap) return whale_errf(err, WHALE_ERR_RANGE, "the batch is full (%d tokens)", b->cap);
    int i = b->n_tokens++;
    b->token[i] = token, b->pos[i] = pos, b->seq_id[i] = seq_id, b->logits[i] = logits != 0;
    return WHALE_OK;
}

/* Token t's id and position, for the checks both entry points share. */
static whale_code check_token(const whale_session *s, int t, int32_t id, int32_t pos, whale_err *err) {
    if (id < 0 || id >= s->model->vocab_size)
        return whale_errf(err, WHALE_ERR_RANGE, "token id %d at index %d is outside the vocabulary [0, %d)", id, t,
                          s->model->vocab_size);
    if (pos >= s->max_seq)
        return whale_errf(err, WHALE_ERR_RANGE,
                          "position %d exceeds the session's context of %d (max_position_embeddings %d)", pos,
                          s->max_seq, s->model->max_positions);
    return WHALE_OK;
}

/* The spans of a batch, checked: each sequence's tokens consecutive and
 * continuing its cells. spans holds n_tokens entries; seen [n_seq] is
 * scratch. */
static whale_code batch_spans(const whale_session *s, const whale_dbatch *b, whale_span *spans, int *n_spans,
                              char *seen, whale_err *err) {
    int n = 0;
    memset(seen, 0, (size_t)s->max_batch);
    for (int t = 0; t < b->n_tokens; t++) {
        int q = b->seq_id[t];
        if (q < 0 || q >= s->max_batch)
            return whale_errf(err, WHALE_ERR_ARG, "token %d: sequence id %d outside the session's 0..%d", t, q,
                              s->max_batch - 1);
        if (n == 0 || spans[n - 1].seq != q) {
            if (seen[q])
                return whale_errf(err, WHALE_ERR_ARG,
                                  "token %d: the tokens of sequence %d are not consecutive in the batch", t, q);
            seen[q] = 1;
            spans[n++] = (whale_span){t, 0, q, whale_kv_seq_len(s, q)};
        }
        whale_span *sp = &spans[n - 1];
        if (b->pos[t] != sp->p0 + sp->n)
            return whale_errf(err, WHALE_ERR_ARG, "token %d: position %d does not continue sequence %d (next is %d)",
                              t, b->pos[t], q, sp->p0 + sp->n);
        whale_code e = check_token(s, t, b->token[t], b->pos[t], err);
        if (e) return e;
        sp->n++;
    }
    *n_spans = n;
    return WHALE_OK;
}

/* Run ub and, on success, record the appended cells. */
static whale_code run(whale_session *s, const whale_ubatch *ub, float *logits, whale_err *err) {
    assert(ub->T >= 1 && ub->T <= s->n_batch && ub->n_spans >= 1 && ub->n_spans <= s->max_batch);
    assert(ub->n_out >= 0 && ub->n_out <= ub->T && (ub->out || ub->n_out == ub->T));
    whale_lora_rows_of_ubatch(s, ub);
    whale_code c = s->forward_fn(s, ub, logits, err);
    s->ub_rows.n_runs = s->lora_rows.n_runs = 0; /* no stale rows for products outside a forward */
    for (int i = 0; c == WHALE_OK && s->kv.k && i < ub->n_spans; i++) {
        assert(ub->spans[i].p0 + ub->spans[i].n <= s->kv.n_ctx); /* checked against max_seq before */
        s->kv.len[ub->spans[i].seq] = ub->spans[i].p0 + ub->spans[i].n;
    }
    return c;
}

whale_code whale_session_decode(whale_session *s, const whale_dbatch *b, float *logits, whale_err *err) {
    if (b->n_tokens < 1 || b->n_tokens > s->n_batch)
        return whale_errf(err, WHALE_ERR_ARG, "a batch of %d tokens: the session takes 1..%d", b->n_tokens,
                          s->n_batch);
    if (!s->kv.k) return whale_errf(err, WHALE_ERR_ARG, "a training session has no KV cache to decode into");
    int T = b->n_tokens, n_spans = 0, n_out = 0;
    whale_span *spans = malloc(sizeof *spans * (size_t)T);
    int32_t *out = malloc(sizeof *out * (size_t)T);
    char *seen = malloc((size_t)s->max_batch);
    whale_code c = spans && out && seen ? batch_spans(s, b, spans, &n_spans, seen, err)
                                        : whale_errf(err, WHALE_ERR_NOMEM, "out of memory for a batch");
    for (int t = 0; t < T; t++)
        if (b->logits[t]) out[n_out++] = t;
    if (c == WHALE_OK) {
        const whale_ubatch ub = {T, b->token, b->pos, n_spans, spans, n_out, out};
        c = run(s, &ub, n_out ? logits : NULL, err);
    }
    free(spans);
    free(out);
    free(seen);
    return c;
}

whale_code whale_session_forward(whale_session *s, const int32_t *ids, int B, int S, float *logits, int all_logits,
                                 whale_err *err) {
    if (B < 1 || B > s->max_batch)
        return whale_errf(err, WHALE_ERR_ARG, "batch %d outside the session's 1..%d", B, s->max_batch);
    if (S < 1) return whale_errf(err, WHALE_ERR_ARG, "need at least one token per sequence");
    if ((int64_t)B * S > s->n_batch)
        return whale_errf(err, WHALE_ERR_ARG, "batch %d × %d exceeds the session's %d tokens", B, S, s->n_batch);
    int T = B * S;
    whale_span *spans = malloc(sizeof *spans * (size_t)B);
    int32_t *pos = malloc(sizeof *pos * (size_t)T), *out = malloc(sizeof *out * (size_t)B);
    whale_code c = spans && pos && out ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "out of memory for a batch");
    for (int b = 0; c == WHALE_OK && b < B; b++) {
        int p0 = whale_kv_seq_len(s, b);
        spans[b] = (whale_span){b * S, S, b, p0};
        out[b] = b * S + S - 1;
        for (int i = 0; c == WHALE_OK && i < S; i++) {
            pos[b * S + i] = p0 + i;
            c = check_token(s, b * S + i, ids[b * S + i], p0 + i, err);
        }
    }
    if (c == WHALE_OK) {
        const whale_ubatch ub = {T, ids, pos, B, spans, all_logits ? T : B, all_logits ? NULL : out};
        c = run(s, &ub, logits, err);
    }
    free(spans);
    free(pos);
    free(out);
    return c;
}
