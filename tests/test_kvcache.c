/* Incremental decoding with the KV cache gives the logits of a full
 * recompute at every step (64 steps), with prefill chunks of several sizes
 * so both attention paths (direct and blocked GEMM) read the cache. */
#include "testutil.h"

#include "whale.h"

#include <stdlib.h>
#include <string.h>

int main(void) {
    whale_err err;
    whale_model *m;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tiny", WHALE_TEST_DATA);
    if (whale_model_load(dir, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int V = whale_model_vocab_size(m);
    enum { PROMPT = 4, STEPS = 64, CHUNKED = 41 };
    int total = PROMPT + STEPS;
    int32_t ids[PROMPT + STEPS];
    for (int i = 0; i < total; i++) ids[i] = (int32_t)((i * 7919 + 13) % V);

    whale_session *inc, *full;
    CHECK(whale_session_new(m, 1, total, &inc, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_new(m, 1, total, &full, &err) == WHALE_OK, "%s", err.msg);
    float *last = malloc(sizeof(float) * V), *all = malloc(sizeof(float) * (size_t)total * V);
    double worst = 0;
    CHECK(whale_session_forward(inc, ids, 1, PROMPT, last, 0, &err) == WHALE_OK, "%s", err.msg);
    for (int n = PROMPT; n <= total; n++) {
        whale_session_reset(full);
        CHECK(whale_session_forward(full, ids, 1, n, all, 1, &err) == WHALE_OK, "%s", err.msg);
        const float *ref = all + (size_t)(n - 1) * V;
        double d = test_max_abs_diff(last, ref, V), mx = test_max_abs(ref, V);
        if (d / mx > worst) worst = d / mx;
        CHECK(d <= 1e-5 * mx, "step %d: cached vs full max |diff| %g (max %g)", n, d, mx);
        if (n < total) CHECK(whale_session_forward(inc, ids + n, 1, 1, last, 0, &err) == WHALE_OK, "%s", err.msg);
    }
    printf("kv cache: worst relative logit difference over %d steps: %.3g\n", STEPS, worst);

    /* chunked prefill: 3 + 20 + 18 tokens against one forward of 41 */
    whale_session_reset(inc);
    int chunks[] = {3, 20, 18}, at = 0;
    for (int c = 0; c < 3; c++) {
        CHECK(whale_session_forward(inc, ids + at, 1, chunks[c], last, 0, &err) == WHALE_OK, "%s", err.msg);
        at += chunks[c];
    }
    whale_session_reset(full);
    CHECK(whale_session_forward(full, ids, 1, CHUNKED, all, 1, &err) == WHALE_OK, "%s", err.msg);
    double d = test_max_abs_diff(last, all + (size_t)(CHUNKED - 1) * V, V);
    CHECK(d <= 1e-5 * test_max_abs(all + (size_t)(CHUNKED - 1) * V, V), "chunked prefill differs by %g", d);

    /* the cache is full: one more position is a clear error, not an overflow */
    whale_session_reset(inc);
    CHECK(whale_session_forward(inc, ids, 1, total, NULL, 0, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(inc, ids, 1, 1, last, 0, &err) == WHALE_ERR_RANGE, "overflow not reported");
    CHECK(strstr(err.msg, "exceeds") != NULL, "message: %s", err.msg);
    /* token ids outside the vocabulary are rejected before any work */
    whale_session_reset(inc);
    int32_t bad[2] = {0, V};
    CHECK(whale_session_forward(inc, bad, 1, 2, last, 0, &err) == WHALE_ERR_RANGE, "bad id accepted");
    CHECK(whale_session_cached(inc) == 0, "failed forward must not advance the cache");

    free(last);
    free(all);
    whale_session_free(inc);
    whale_session_free(full);
    whale_model_free(m);
    return test_finish("test_kvcache");
}
