/* The generation loop shared by `whale generate` and `whale chat`: feed what
 * the KV cache lacks, then sample, feed, sample … one token at a time. */
#include "whale.h"

#include "core/core.h"
#include "models/model.h"

#include <string.h>

whale_code whale_generate(whale_session *s, whale_sampler *sm, int32_t *ids, int *n_ids, int cap, int max_new,
                          const int32_t *stop_ids, int n_stop, whale_token_fn on_token, void *user,
                          whale_gen_stats *stats, whale_err *err) {
    whale_gen_stats st = {0};
    int n = *n_ids, V = whale_model_vocab_size(s->model);
    if (n < 1) return whale_errf(err, WHALE_ERR_ARG, "generation needs at least one context token");
    if (whale_session_cached(s) >= n) whale_session_reset(s); /* nothing new to feed: start over */
    int cached = whale_session_cached(s);
    if (max_new > cap - n) max_new = cap - n;
    float *logits = whale_alloc(sizeof(float) * (size_t)V);
    if (!logits) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for logits");

    double t0 = whale_now();
    whale_code c = max_new > 0 ? whale_session_forward(s, ids + cached, 1, n - cached, logits, 0, err) : WHALE_OK;
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
        if (k + 1 < max_new) c = whale_session_forward(s, &tok, 1, 1, logits, 0, err);
    }
    st.gen_seconds = whale_now() - t0;
    free(logits);
    *n_ids = n;
    if (stats) *stats = st;
    return c;
}
