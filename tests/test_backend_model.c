/* The tiny model of every family end to end on the reference backend
 * ($WHALE_BACKEND=ref: plain loops in double, src/backend/ref.c) against
 * the cpu backend: a forward's logits, a training step's loss and every
 * parameter's gradient, and the logits of a bf16 run. Bounds (relative to
 * the largest value): fp32 logits 1e-5, loss 1e-6, gradients 1e-4 per
 * parameter (norm-wise; sums of thousands of terms in another order, and
 * a 1e-7 difference in a routing logit is amplified by the backward's
 * divisions); bf16 logits 2e-2 (activations are rounded to bf16 before
 * each product, so a 1e-7 difference in a sum can move a value by one bf16
 * step, 2⁻⁸ relative, and that step travels: measured 6e-8 where the cpu
 * backend has bf16 products, 2e-3 for nanowhale at the AVX2 tier, whose
 * bf16 products are fp32 products of the rounded operands summed in
 * another order). */
#include "testutil.h"

#include "whale.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, S = 9 };

typedef struct {
    float *logits, *logits_bf16;
    double loss;
    float **grads;
    long *numel;
    int n_params;
} run_result;

static void run(whale_model *m, const char *backend, const int32_t *ids, run_result *r) {
    whale_err err;
    setenv("WHALE_BACKEND", backend, 1);
    int V = whale_model_vocab_size(m);
    whale_session *s;
    r->logits = malloc(sizeof(float) * B * S * V);
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, r->logits, 1, &err) == WHALE_OK, "%s: %s", backend, err.msg);
    whale_session_free(s);

    CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    int64_t count;
    CHECK(whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, 1.0, &r->loss, &count, &err) == WHALE_OK, "%s: %s",
          backend, err.msg);
    r->n_params = whale_model_num_params(m);
    r->grads = calloc((size_t)r->n_params, sizeof(float *));
    r->numel = calloc((size_t)r->n_params, sizeof(long));
    for (int i = 0; i < r->n_params; i++) {
        whale_tensor t = whale_model_param(m, i);
        const float *g = whale_session_grad(s, i);
        r->numel[i] = (long)whale_shape_numel(t.ndim, t.shape);
        if (g) {
            r->grads[i] = malloc(sizeof(float) * (size_t)r->numel[i]);
            memcpy(r->grads[i], g, sizeof(float) * (size_t)r->numel[i]);
        }
    }
    whale_session_free(s);
    unsetenv("WHALE_BACKEND");
}

static void run_bf16(whale_model *m, const char *backend, const int32_t *ids, float *logits) {
    whale_err err;
    setenv("WHALE_BACKEND", backend, 1);
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s: %s", backend, err.msg);
    whale_session_free(s);
    unsetenv("WHALE_BACKEND");
}

static void free_result(run_result *r) {
    for (int i = 0; i < r->n_params; i++) free(r->grads[i]);
    free(r->grads), free(r->numel), free(r->logits), free(r->logits_bf16);
}

static void check_family(whale_model *m, const char *name) {
    int V = whale_model_vocab_size(m);
    int32_t ids[B * S];
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)((i * 7919 + 11) % V);
    run_result cpu = {0}, ref = {0};
    run(m, "cpu", ids, &cpu);
    run(m, "ref", ids, &ref);
    long n = (long)B * S * V;
    double dl = test_max_abs_diff(cpu.logits, ref.logits, n) / test_max_abs(ref.logits, n);
    CHECK(dl <= 1e-5, "%s: logits differ by %.3g", name, dl);
    double dloss = fabs(cpu.loss - ref.loss) / fabs(ref.loss);
    CHECK(dloss <= 1e-6, "%s: loss %.9g vs %.9g", name, cpu.loss, ref.loss);
    double worst = 0;
    int with_grad = 0;
    for (int i = 0; i < cpu.n_params; i++) {
        CHECK(!cpu.grads[i] == !ref.grads[i], "%s: parameter %d has a gradient on one backend only", name, i);
        if (!cpu.grads[i] || !ref.grads[i]) continue;
        with_grad++;
        double d = test_rel_norm(cpu.grads[i], ref.grads[i], cpu.numel[i]);
        if (d > worst) worst = d;
        CHECK(d <= 1e-4, "%s: gradient of %s differs by %.3g", name, whale_model_param_name(m, i), d);
    }
    printf("%s on the ref backend: logits %.2g, loss %.2g, worst of %d gradients %.2g\n", name, dl, dloss,
           with_grad, worst);

    whale_err err;
    CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK, "%s", err.msg);
    float *c16 = malloc(sizeof(float) * (size_t)n), *r16 = malloc(sizeof(float) * (size_t)n);
    run_bf16(m, "cpu", ids, c16);
    run_bf16(m, "ref", ids, r16);
    double d16 = test_max_abs_diff(c16, r16, n) / test_max_abs(r16, n);
    printf("%s bf16 on the ref backend: logits %.2g\n", name, d16);
    CHECK(d16 <= 2e-2, "%s: bf16 logits differ by %.3g", name, d16);
    free(c16), free(r16);
    free_result(&cpu), free_result(&ref);
}

int main(void) {
    static const char *const dense[] = {"qwen2-tiny", "llama-tiny", "qwen3-tiny"}; /* the dense decoder's variants */
    test_tiny_models(dense, 3, 7, check_family);
    whale_err err;
    whale_model *m;

    setenv("WHALE_BACKEND", "cuda", 1);
    CHECK(whale_model_init("qwen2-tiny", 7, &m, &err) == WHALE_OK, "%s", err.msg);
    whale_session *s = NULL;
    CHECK(whale_session_new(m, 1, 4, &s, &err) == WHALE_ERR_ARG && strstr(err.msg, "unknown backend"),
          "an unknown backend: %s", err.msg);
    whale_session_free(s);
    whale_model_free(m);
    unsetenv("WHALE_BACKEND");
    return test_finish("test_backend_model");
}
