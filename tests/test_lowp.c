/* Running a model in bf16, fp16 and int8: each close to fp32 by the error
 * its format allows, the KV cache still equals a full recompute, loading a
 * checkpoint straight into a format equals converting a loaded fp32 model
 * (bit for bit) while holding no fp32 copy of the product weights, and
 * switching back to fp32 restores the exact fp32 logits. */
#include "testutil.h"

#include "whale.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, S = 40 };

static void forward(whale_model *m, const int32_t *ids, float *logits) {
    whale_err err;
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
}

static int top1_agreement(const float *a, const float *b, int rows, int V) {
    int agree = 0;
    for (int r = 0; r < rows; r++) {
        int x = 0, y = 0;
        for (int v = 1; v < V; v++) {
            if (a[(size_t)r * V + v] > a[(size_t)r * V + x]) x = v;
            if (b[(size_t)r * V + v] > b[(size_t)r * V + y]) y = v;
        }
        agree += x == y;
    }
    return agree;
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
    int V = whale_model_vocab_size(m);
    int32_t ids[B * S];
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)((i * 7919 + 3) % V);
    size_t n = (size_t)B * S * V;
    float *f32 = malloc(n * sizeof(float)), *low = malloc(n * sizeof(float)), *again = malloc(n * sizeof(float));
    float *last = malloc(sizeof(float) * V);
    forward(m, ids, f32);
    double mx = test_max_abs(f32, (long)n);
    int64_t cnt;
    double l32 = whale_cross_entropy(f32, ids, B, S, V, &cnt);

    /* bf16 and the int8 path (bf16 activations) keep 8 significant bits:
     * logits drift by a few percent; fp16 keeps 11 */
    const struct {
        whale_dtype dt;
        double logit_tol, loss_tol, decode_tol;
    } formats[] = {{WHALE_BF16, 0.05, 0.01, 1e-2}, {WHALE_F16, 0.01, 0.002, 1e-2}, {WHALE_I8, 0.08, 0.02, 3e-2}};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        whale_dtype dt = formats[f].dt;
        const char *name = whale_dtype_name(dt);
        CHECK(whale_model_set_dtype(m, dt, &err) == WHALE_OK, "%s", err.msg);
        CHECK(whale_model_dtype(m) == dt, "dtype not set");
        forward(m, ids, low);
        double d = test_max_abs_diff(f32, low, (long)n), se = 0, ss = 0;
        for (size_t i = 0; i < n; i++) {
            se += ((double)f32[i] - low[i]) * ((double)f32[i] - low[i]);
            ss += (double)f32[i] * f32[i];
        }
        double rel_rms = sqrt(se / ss);
        double l = whale_cross_entropy(low, ids, B, S, V, &cnt);
        int agree = top1_agreement(f32, low, B * S, V);
        printf("%s vs fp32: max |Δlogit| %.4g of max |logit| %.4g, relative RMS %.3g; loss %.6f vs %.6f; top-1 "
               "agreement %d/%d\n", name, d, mx, rel_rms, l, l32, agree, B * S);
        CHECK(d > 0, "%s products must differ from fp32 somewhere", name);
        /* RMS, not max: one token whose nearly tied gate scores pick another
         * expert after rounding moves its logits by much more (docs/precision.md) */
        CHECK(rel_rms <= formats[f].logit_tol, "%s logits too far from fp32: relative RMS %g", name, rel_rms);
        CHECK(fabs(l - l32) <= formats[f].loss_tol * l32, "%s loss %g vs %g", name, l, l32);
        CHECK(agree >= B * S * 9 / 10, "%s top-1 agreement %d of %d", name, agree, B * S);

        /* incremental decoding equals a full forward up to summation order
         * (decode attention reads the cache, the full forward does not; at
         * some tiers the other products take other kernels too); 1e-2 of
         * the largest logit leaves room for a token whose nearly tied
         * experts swap under the different order, not for a wrong cache.
         * int8 rounds each product's input to steps of 1/127 of its block's
         * largest value, so an order difference that crosses a rounding
         * boundary moves a value by a whole step: 3e-2 there. */
        whale_session *inc;
        CHECK(whale_session_new(m, 1, S, &inc, &err) == WHALE_OK, "%s", err.msg);
        CHECK(whale_session_forward(inc, ids, 1, S - 3, last, 0, &err) == WHALE_OK, "%s", err.msg);
        for (int k = S - 3; k < S; k++) {
            const float *ref = low + (size_t)(k - 1) * V;
            double dd = test_max_abs_diff(last, ref, V);
            CHECK(dd <= formats[f].decode_tol * test_max_abs(ref, V), "%s decode at %d differs from the full forward by %g",
                  name, k, dd);
            CHECK(whale_session_forward(inc, ids + k, 1, 1, last, 0, &err) == WHALE_OK, "%s", err.msg);
        }
        whale_session_free(inc);

        /* loading straight into the format: the same logits, no fp32 product weights */
        whale_model *direct;
        CHECK(whale_model_load_as(dir, dt, &direct, &err) == WHALE_OK, "%s", err.msg);
        if (!direct) continue;
        CHECK(!whale_model_has_master(direct), "%s load kept fp32 masters", name);
        forward(direct, ids, again);
        CHECK(memcmp(again, low, n * sizeof(float)) == 0, "%s: load_as differs from set_dtype", name);
        whale_memory a, b;
        whale_memory_of_model(m, &a);
        whale_memory_of_model(direct, &b);
        printf("%s weights: %.2f MiB fp32 + %.2f MiB copies with masters; %.2f + %.2f loaded directly\n", name,
               a.weights_f32 / 1048576.0, a.weights_lowp / 1048576.0, b.weights_f32 / 1048576.0,
               b.weights_lowp / 1048576.0);
        CHECK(b.weights_f32 + b.weights_lowp < a.weights_f32 * 0.6, "%s load holds too much", name);
        whale_tensor t = whale_model_param(direct, 0);
        for (int i = 0; i < whale_model_num_params(direct); i++)
            if (!strcmp(whale_model_param_name(direct, i), "model.layers.0.attn.wq_a.weight"))
                t = whale_model_param(direct, i);
        CHECK(t.dtype == dt, "%s: a product weight is reported as %s", name, whale_dtype_name(t.dtype));
        /* no fp32 weights: cannot go back to fp32 or be trained */
        CHECK(whale_model_set_dtype(direct, WHALE_F32, &err) == WHALE_ERR_ARG, "%s: fp32 without masters", name);
        whale_optimizer *o = NULL;
        whale_adamw_config ac = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
        CHECK(whale_adamw_new(direct, &ac, &o, &err) == WHALE_ERR_ARG, "%s: training a model without masters", name);
        whale_optimizer_free(o);
        whale_model_free(direct);
    }

    /* int8 is for inference */
    CHECK(whale_model_set_dtype(m, WHALE_I8, &err) == WHALE_OK, "%s", err.msg);
    whale_session *ts;
    double loss;
    CHECK(whale_train_session_new(m, 1, 8, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(ts, ids, NULL, NULL, NULL, 1, 8, 1.0, &loss, &cnt, &err) == WHALE_ERR_UNSUPPORTED,
          "training an int8 model must be refused");
    whale_session_free(ts);

    /* back to fp32: exactly the fp32 logits again */
    CHECK(whale_model_set_dtype(m, WHALE_F32, &err) == WHALE_OK, "%s", err.msg);
    forward(m, ids, again);
    CHECK(memcmp(again, f32, n * sizeof(float)) == 0, "fp32 after the other formats differs");

    free(f32);
    free(low);
    free(again);
    free(last);
    whale_model_free(m);
    return test_finish("test_lowp");
}
