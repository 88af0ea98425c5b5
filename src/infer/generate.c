/* The generation loop shared by `whale generate` and `whale chat`, on the
 * batch API (sequence 0 of the session): feed what the KV cache lacks, then
 * sample, feed, sample … one token at a time. */
#include "whale.h"

#include "core/core.h"
#include "models/model.h"

#include <string.h>

/* Feed ids[from .. to) to sequence 0, the last token's logits into logits. */
static whale_code feed(whale_session *s, whale_dbatch *b, const int32_t *ids, int from, int to, float *logits,
                       whale_err *err) {
    whale_session_params p = whale_session_get_params(s);
    for (int at = from; at < to; at += p.n_batch) { /* a long prompt in micro-batches */
        int end = to - at < p.n_batch ? to : at + p.n_batch;
        whale_dbatch_clear(b);
        for (int i = at; i < end; i++) whale_dbatch_add(b, ids[i], i, 0, i == to - 1, err);
        whale_code c = whale_session_decode(s, b, logits, err);
        if (c) return c;
    }
    return WHALE_OK;
}

whale_code whale_generate(whale_session *s, whale_sampler *sm, int32_t *ids, int *n_ids, int cap, int max_new,
                          const int32_t *stop_ids, int n_stop, whale_token_fn on_token, void *user,
                          whale_gen_stats *stats, whale_err *err) {
    whale_gen_stats st = {0};
    int n = *n_ids, V = whale_model_vocab_size(s->model);
    if (n < 1) return whale_errf(err, WHALE_ERR_ARG, "generation needs at least one context token");
    if (whale_kv_seq_len(s, 0) >= n) whale_kv_seq_keep(s, 0, 0); /* nothing new to feed: start over */
    int cached = whale_kv_seq_len(s, 0);
    if (max_new > cap - n) max_new = cap - n;
    whale_session_params p = whale_session_get_params(s);
    whale_dbatch b;
    whale_code c = whale_dbatch_init(&b, p.n_batch, err);
    if (c) return c;
    float *logits = whale_alloc(sizeof(float) * (size_t)V);
    if (!logits) {
        whale_dbatch_free(&b);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for logits");
    }

    double t0 = whale_now();
    c = max_new > 0 ? feed(s, &b, ids, cached, n, logits, err) : WHALE_OK;
    st.prompt_tokens = n - cached;
    st.prompt_seconds = whale_now() - t0;
    t0 = whale_now();
    for (int k = 0; c == WHALE_OK && k < max_new; k++) {
        int32_t tok = whale_sample(sm, logits, ids, n);
        if (tok < 0) {
            c = whale_errf(err, WHALE_ERR_RANGE, "every logit is NaN or -inf at generated token %d", k);
            break;
        }
        ids[n++] = tok;
        st.generated++;
        int stop = on_token ? on_token(user, tok) : 0;
        for (int i = 0; i < n_stop; i++) stop |= tok == stop_ids[i];
        if (stop) {
            st.stopped = 1;
            break;
        }
        if (k + 1 < max_new) c = feed(s, &b, ids, n - 1, n, logits, err);
    }
    st.gen_seconds = whale_now() - t0;
    free(logits);
    whale_dbatch_free(&b);
    *n_ids = n;
    if (stats) *stats = st;
    return c;
}
