/* Token accuracy of evaluation passes (whale_session_train_step with
 * loss_scale 0, as whale sft's validation runs them): the session's hits
 * equal the targets where the argmax of an inference forward's logits is
 * the next id, for nanowhale and Qwen2. */
#include "testutil.h"

#include "models/model.h"
#include "whale.h"

#include <stdlib.h>

static void check(const char *name) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", WHALE_TEST_DATA, name);
    whale_err err;
    whale_model *m = NULL;
    if (whale_model_load(dir, &m, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    enum { B = 2, S = 24 };
    int V = whale_model_vocab_size(m);
    int32_t ids[B * S];
    uint64_t x = 12345;
    float *logits = malloc(sizeof(float) * (size_t)B * S * V);
    whale_session *s = NULL, *ts = NULL;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    if (!s) return;
    /* every other next id is the model's own greedy choice, the others random */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            int32_t pick = (int32_t)((x >> 33) % (uint64_t)V);
            if (t % 2 == 1) {
                whale_session_reset(s);
                CHECK(whale_session_forward(s, ids + b * S, 1, t, logits, 0, &err) == WHALE_OK, "%s", err.msg);
                pick = 0;
                for (int v = 1; v < V; v++)
                    if (logits[v] > logits[pick]) pick = v;
            }
            ids[b * S + t] = pick;
        }
    whale_session_reset(s);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    int64_t want = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t + 1 < S; t++) {
            const float *row = logits + ((size_t)b * S + t) * V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            want += best == ids[b * S + t + 1];
        }
    double loss;
    int64_t count;
    CHECK(whale_train_session_new(m, B, S, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    CHECK(ts && whale_session_train_step(ts, ids, NULL, NULL, NULL, B, S, 0.0, &loss, &count, &err) == WHALE_OK, "%s",
          err.msg);
    printf("%s: %lld of %lld targets predicted (argmax of the logits: %lld)\n", name, ts ? (long long)ts->eval_hits : -1,
           (long long)count, (long long)want);
    CHECK(ts && ts->eval_hits == want && want >= B * (S / 2 - 1) && count == B * (S - 1), "%s: hits %lld, want %lld", name,
          ts ? (long long)ts->eval_hits : -1, (long long)want);
    whale_session_free(s);
    whale_session_free(ts);
    free(logits);
    whale_model_free(m);
}

int main(void) {
    check("tiny");
    check("qwen2-gqa2");
    return test_finish("test_eval_acc");
}
