/* The gradient-ready hook of training sessions (whale_session_set_grad_ready):
 * over the tiny presets of both families — tied and untied heads, with and
 * without recompute, bf16, LoRA — every trainable element of the gradient
 * is reported exactly once per training step, the values it holds when it
 * is reported are the final ones, bit for bit (nothing writes it later),
 * most of it is reported before the end of the backward pass (after the
 * head and after each layer), evaluation reports nothing, an error from the
 * hook stops the step, and a session without the hook computes the same
 * gradient bits. */
#include "models/model.h"
#include "testutil.h"
#include "whale_lora.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const whale_session *s;
    float *seen;         /* [n_grad_train]: each element's value when reported */
    unsigned char *hit;  /* [n_grad_train]: times reported */
    int calls, fail_at;  /* fail_at > 0: the hook fails at that call */
    size_t before_last;  /* elements reported before the last call */
    size_t last_lo, last_hi;
} record;

static whale_code on_ready(void *user, size_t lo, size_t hi, whale_err *err) {
    record *r = user;
    CHECK(lo < hi && hi <= r->s->n_grad_train, "range [%zu, %zu) outside [0, %zu)", lo, hi, r->s->n_grad_train);
    if (++r->calls == r->fail_at) return whale_errf(err, WHALE_ERR_IO, "the hook fails on purpose");
    for (size_t k = lo; k < hi && hi <= r->s->n_grad_train; k++) {
        r->hit[k]++;
        r->seen[k] = r->s->grads[k];
    }
    r->before_last += r->last_hi - r->last_lo;
    r->last_lo = lo, r->last_hi = hi;
    return WHALE_OK;
}

static void run_case(const char *preset, const char *overrides, int recompute, int bf16, int lora) {
    char label[160];
    snprintf(label, sizeof label, "%s%s%s%s%s", preset, overrides ? " (tied)" : "", recompute ? ", recompute" : "",
             bf16 ? ", bf16" : "", lora ? ", LoRA" : "");
    whale_err err;
    whale_model *m = NULL;
    CHECK(whale_model_init_config(preset, overrides, 7, &m, &err) == WHALE_OK, "%s: %s", label, err.msg);
    if (!m) return;
    if (bf16) CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK, "%s: %s", label, err.msg);
    if (lora) {
        whale_lora_config cfg = whale_lora_defaults();
        cfg.dropout = 0.1; /* the masks come from the session's counter: the same in both sessions */
        CHECK(whale_lora_attach(m, &cfg, &err) == WHALE_OK, "%s: %s", label, err.msg);
    }
    enum { B = 2, S = 24 };
    int32_t ids[B * S];
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)((i * 7919 + 13) % 500);
    whale_session *s = NULL, *plain = NULL;
    CHECK(whale_train_session_new(m, B, S, recompute, &s, &err) == WHALE_OK, "%s: %s", label, err.msg);
    CHECK(whale_train_session_new(m, B, S, recompute, &plain, &err) == WHALE_OK, "%s: %s", label, err.msg);
    if (!s || !plain) {
        whale_session_free(s), whale_session_free(plain), whale_model_free(m);
        return;
    }
    size_t n = s->n_grad_train;
    record r = {s, malloc(sizeof(float) * n), calloc(n, 1), 0, 0, 0, 0, 0};
    CHECK(whale_session_set_grad_ready(s, on_ready, &r, &err) == WHALE_OK, "%s: %s", label, err.msg);
    double loss, loss2;
    int64_t cnt;
    for (int step = 0; step < 2; step++) { /* the second step reports again, from the start */
        memset(r.hit, 0, n);
        r.calls = 0, r.before_last = 0, r.last_lo = r.last_hi = 0;
        whale_session_zero_grad(s), whale_session_zero_grad(plain);
        CHECK(whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK, "%s: %s",
              label, err.msg);
        CHECK(whale_session_train_step(plain, ids, NULL, NULL, NULL, B, S, 1.0, &loss2, &cnt, &err) == WHALE_OK,
              "%s: %s", label, err.msg);
        size_t once = 0, final = 0;
        for (size_t k = 0; k < n; k++) {
            once += r.hit[k] == 1;
            final += memcmp(&r.seen[k], &s->grads[k], sizeof(float)) == 0;
        }
        CHECK(once == n, "%s: %zu of %zu trainable elements reported exactly once", label, once, n);
        CHECK(final == n, "%s: %zu of %zu elements held their final value when reported", label, final, n);
        CHECK(memcmp(s->grads, plain->grads, sizeof(float) * s->n_grad) == 0 && loss == loss2,
              "%s: the hook changed the gradient", label);
        /* the tiny presets have 2 layers: the head, each layer, then what
         * leads the table (embedding, HC head); with LoRA each layer's adapters */
        CHECK(r.calls >= (lora ? 2 : 3), "%s: %d reports", label, r.calls);
        CHECK(r.before_last * 2 >= n, "%s: only %zu of %zu elements reported before the last report", label,
              r.before_last, n);
        printf("%s: %zu elements in %d reports, %zu before the last\n", label, n, r.calls, r.before_last);
    }
    /* evaluation (no gradient) reports nothing */
    r.calls = 0;
    CHECK(whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, 0.0, &loss, &cnt, &err) == WHALE_OK, "%s", err.msg);
    CHECK(r.calls == 0, "%s: evaluation made %d reports", label, r.calls);
    /* an error from the hook ends the step with it */
    r.calls = 0, r.fail_at = 2;
    whale_code c = whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &cnt, &err);
    CHECK(c == WHALE_ERR_IO && strstr(err.msg, "on purpose") && r.calls == 2, "%s: a failing hook gave %d after %d calls",
          label, (int)c, r.calls);
    CHECK(whale_session_set_grad_ready(s, NULL, NULL, &err) == WHALE_OK, "%s", err.msg);
    r.calls = 0;
    CHECK(whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK && !r.calls,
          "%s: a removed hook was called", label);
    free(r.seen);
    free(r.hit);
    whale_session_free(s);
    whale_session_free(plain);
    whale_model_free(m);
}

int main(void) {
    const char *presets[] = {"tiny", "qwen2-tiny", "llama-tiny", "qwen3-tiny"};
    for (int p = 0; p < 4; p++)
        for (int recompute = 0; recompute < 2; recompute++) run_case(presets[p], NULL, recompute, 0, 0);
    run_case("tiny", "{\"tie_word_embeddings\": true}", 0, 0, 0);
    run_case("tiny", NULL, 0, 1, 0);
    run_case("qwen2-tiny", NULL, 0, 1, 0); /* bf16 activations kept between forward and backward */
    for (int recompute = 0; recompute < 2; recompute++) {
        run_case("tiny", NULL, recompute, 0, 1);
        run_case("llama-tiny", NULL, recompute, 0, 1);
    }
    run_case("qwen2-tiny", NULL, 0, 1, 1);
    return test_finish("test_grad_ready");
}
