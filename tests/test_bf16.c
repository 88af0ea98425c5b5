/* Running a model with bf16 weight products: close to fp32 (the error of
 * rounding each product's inputs to bf16), the KV cache still equals a
 * full recompute, switching back to fp32 restores the exact fp32 logits,
 * and training refuses a bf16 model. */
#include "testutil.h"

#include "whale.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void forward(whale_model *m, const int32_t *ids, int B, int S, float *logits) {
    whale_err err;
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
}

int main(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny", WHALE_TEST_DATA);
    whale_err err;
    whale_model *m;
    if (whale_model_load(dir, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    enum { B = 2, S = 40 };
    int V = whale_model_vocab_size(m);
    int32_t ids[B * S];
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)((i * 7919 + 3) % V);
    size_t n = (size_t)B * S * V;
    float *f32 = malloc(n * sizeof(float)), *b16 = malloc(n * sizeof(float)), *again = malloc(n * sizeof(float));

    forward(m, ids, B, S, f32);
    CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_model_dtype(m) == WHALE_BF16, "dtype not set");
    forward(m, ids, B, S, b16);

    /* bf16 keeps 8 significant bits: products of rounded inputs drift by
     * about 2^-9 relative per layer; the logits stay within a few percent */
    double d = test_max_abs_diff(f32, b16, (long)n), mx = test_max_abs(f32, (long)n);
    int64_t c1, c2;
    double l1 = whale_cross_entropy(f32, ids, B, S, V, &c1), l2 = whale_cross_entropy(b16, ids, B, S, V, &c2);
    int agree = 0;
    for (int r = 0; r < B * S; r++) {
        int a = 0, b = 0;
        for (int v = 1; v < V; v++) {
            if (f32[(size_t)r * V + v] > f32[(size_t)r * V + a]) a = v;
            if (b16[(size_t)r * V + v] > b16[(size_t)r * V + b]) b = v;
        }
        agree += a == b;
    }
    printf("bf16 vs fp32: max |Δlogit| %.4g of max |logit| %.4g; loss %.6f vs %.6f; top-1 agreement %d/%d\n", d, mx,
           l2, l1, agree, B * S);
    CHECK(d > 0, "bf16 products must differ from fp32 somewhere");
    CHECK(d <= 0.05 * mx, "bf16 logits too far from fp32: %g", d);
    CHECK(fabs(l1 - l2) <= 0.01 * l1, "loss %g vs %g", l2, l1);
    CHECK(agree >= B * S * 9 / 10, "top-1 agreement %d of %d", agree, B * S);

    /* incremental decoding in bf16 equals a full bf16 forward (up to summation order) */
    whale_session *inc;
    float *last = malloc(sizeof(float) * V);
    CHECK(whale_session_new(m, 1, S, &inc, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(inc, ids, 1, S - 3, last, 0, &err) == WHALE_OK, "%s", err.msg);
    for (int k = S - 3; k < S; k++) {
        const float *ref = b16 + (size_t)(k - 1) * V;
        double dd = test_max_abs_diff(last, ref, V);
        CHECK(dd <= 1e-4 * test_max_abs(ref, V), "bf16 decode at %d differs from the full forward by %g", k, dd);
        CHECK(whale_session_forward(inc, ids + k, 1, 1, last, 0, &err) == WHALE_OK, "%s", err.msg);
    }
    whale_session_free(inc);

    /* training refuses a bf16 model for now */
    whale_session *ts;
    double loss;
    int64_t cnt;
    CHECK(whale_train_session_new(m, 1, 8, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(ts, ids, NULL, NULL, NULL, 1, 8, 1.0, &loss, &cnt, &err) == WHALE_ERR_UNSUPPORTED,
          "training a bf16 model must be refused");
    whale_session_free(ts);

    /* back to fp32: exactly the fp32 logits again */
    CHECK(whale_model_set_dtype(m, WHALE_F32, &err) == WHALE_OK, "%s", err.msg);
    forward(m, ids, B, S, again);
    CHECK(memcmp(again, f32, n * sizeof(float)) == 0, "fp32 after bf16 differs");
    CHECK(whale_model_set_dtype(m, WHALE_F16, &err) == WHALE_ERR_UNSUPPORTED, "fp16 execution does not exist yet");

    free(f32);
    free(b16);
    free(again);
    free(last);
    whale_model_free(m);
    return test_finish("test_bf16");
}
