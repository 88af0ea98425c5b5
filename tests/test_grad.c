/* Gradients of the mean loss for every parameter against the PyTorch
 * reference (tests/reference/gen_grads.py): per-tensor relative error
 * ‖g − g_ref‖ / ‖g_ref‖ ≤ 1e-4, exact zeros where no gradient flows, and
 * bit-identical results when the step is repeated. */
#include "testutil.h"

#include "io/safetensors.h"
#include "whale.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void check_grads(const char *model_name, const char *golden_name) {
    char dir[512], golden[512];
    snprintf(dir, sizeof dir, "%s/%s", WHALE_TEST_DATA, model_name);
    snprintf(golden, sizeof golden, "%s/%s", WHALE_TEST_DATA, golden_name);
    whale_err err;
    whale_model *m;
    whale_st *g;
    if (whale_model_load(dir, &m, &err) || whale_st_open(golden, &g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const whale_st_entry *ids = whale_st_find(g, "input_ids"), *labels = whale_st_find(g, "labels");
    const whale_st_entry *loss_ref = whale_st_find(g, "loss");
    int B = (int)ids->shape[0], S = (int)ids->shape[1];
    whale_session *s;
    CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    double loss;
    int64_t count;
    CHECK(whale_session_train_step(s, ids->data, labels->data, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK, "%s",
          err.msg);
    CHECK(count == whale_count_targets(labels->data, B, S), "count %lld", (long long)count);
    float lr = *(const float *)loss_ref->data;
    CHECK(fabs(loss - lr) <= 1e-5 * fabs(lr), "%s loss %.9g vs %.9g", model_name, loss, lr);

    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < whale_model_num_params(m); i++) {
        const char *name = whale_model_param_name(m, i);
        char key[160];
        snprintf(key, sizeof key, "grad.%s", name);
        const whale_st_entry *ref = whale_st_find(g, key);
        whale_tensor t = whale_model_param(m, i);
        long n = (long)whale_shape_numel(t.ndim, t.shape);
        CHECK(ref && ref->nbytes == (size_t)n * 4, "%s: no golden gradient", key);
        if (!ref) continue;
        const float *gr = ref->data, *gc = whale_session_grad(s, i);
        double num = 0, den = 0;
        for (long k = 0; k < n; k++) {
            num += ((double)gc[k] - gr[k]) * ((double)gc[k] - gr[k]);
            den += (double)gr[k] * gr[k];
        }
        if (den == 0) {
            CHECK(num == 0, "%s: gradient should be exactly zero", name);
            continue;
        }
        double rel = sqrt(num / den);
        if (!(rel <= worst)) worst = rel, worst_name = name;
        CHECK(rel <= 1e-4, "%s %s: relative gradient error %.3g", model_name, name, rel);
    }
    printf("%s: loss %.7f, worst per-tensor gradient error %.3g (%s)\n", model_name, loss, worst, worst_name);

    /* the same step again, after zeroing: bit-identical gradients */
    size_t total = 0;
    for (int i = 0; i < whale_model_num_params(m); i++) {
        whale_tensor t = whale_model_param(m, i);
        total += (size_t)whale_shape_numel(t.ndim, t.shape);
    }
    float *first = malloc(total * sizeof(float));
    memcpy(first, whale_session_grad(s, 0), total * sizeof(float));
    whale_session_zero_grad(s);
    CHECK(whale_session_train_step(s, ids->data, labels->data, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK, "%s",
          err.msg);
    CHECK(memcmp(first, whale_session_grad(s, 0), total * sizeof(float)) == 0, "%s: repeated step differs", model_name);
    /* accumulation: two half-scaled steps equal one full step */
    whale_session_zero_grad(s);
    for (int k = 0; k < 2; k++)
        whale_session_train_step(s, ids->data, labels->data, NULL, NULL, B, S, 0.5, &loss, &count, &err);
    double dmax = 0, gmax = 0;
    const float *acc = whale_session_grad(s, 0);
    for (size_t k = 0; k < total; k++) {
        dmax = fmax(dmax, fabs(acc[k] - first[k]));
        gmax = fmax(gmax, fabs(first[k]));
    }
    CHECK(dmax <= 1e-6 * gmax, "%s: accumulated half steps differ by %g", model_name, dmax);
    /* recomputing each layer's activations in the backward pass changes nothing */
    whale_session *rs;
    CHECK(whale_train_session_new(m, B, S, 1, &rs, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(rs, ids->data, labels->data, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK,
          "%s", err.msg);
    CHECK(memcmp(first, whale_session_grad(rs, 0), total * sizeof(float)) == 0, "%s: --recompute changed the gradients",
          model_name);
    size_t saves_full, saves_re;
    size_t acts_full = whale_session_activation_bytes(s, &saves_full), acts_re = whale_session_activation_bytes(rs, &saves_re);
    CHECK(acts_re + saves_re == acts_full && saves_re > 0, "%s: activations %zu + saved %zu != %zu", model_name, acts_re,
          saves_re, acts_full);
    whale_session_free(rs);
    free(first);
    whale_session_free(s);
    whale_st_close(g);
    whale_model_free(m);
}

int main(void) {
    check_grads("tiny", "grads-tiny.safetensors");
    check_grads("tiny-variant", "grads-tiny-variant.safetensors");
    return test_finish("test_grad");
}
