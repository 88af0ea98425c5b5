/* LoRA against the PyTorch reference with PEFT's semantics written by hand
 * (tests/reference/gen_lora.py: adapters act only where a Linear is called,
 * so PEFT's all-linear adapter on nanowhale's wo_a, which the reference reads
 * as a weight, changes nothing): the PEFT adapter folder loads, logits and
 * loss match, the adapters' gradients match with the base frozen, merging
 * gives the adapted logits, a training step changes only the adapters (the
 * base bit for bit), save → load round-trips, PEFT's initialisation leaves
 * the model unchanged, and with dropout the backward pass uses the forward's
 * masks (central differences of the loss with the masks held fixed). */
#include "testutil.h"

#include "backend/backend.h"
#include "kernels/gemm.h"

#include "core/core.h"
#include "whale_safetensors.h"
#include "models/model.h"
#include "whale.h"
#include "whale_lora.h"
#include "train/step.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static whale_model *load_tiny(void) {
    char dir[512];
    whale_err err;
    whale_model *m = NULL;
    snprintf(dir, sizeof dir, "%s/tiny", WHALE_TEST_DATA);
    CHECK(whale_model_load(dir, &m, &err) == WHALE_OK, "%s", err.msg);
    return m;
}

static int param_index(const whale_model *m, const char *name) {
    for (int i = 0; i < whale_model_num_params(m); i++)
        if (!strcmp(whale_model_param_name(m, i), name)) return i;
    return -1;
}

/* One training step of the LoRA session ts on batch b: its loss, target
 * count and adapter gradients (parameters n_base.., concatenated into g),
 * and how many of its products oneDNN computed (the rest ran on our
 * kernels). */
typedef struct {
    double loss;
    int64_t count, dnnl_calls;
    float *g;
} trim_step;

static void trim_run(whale_session *ts, whale_model *mb, int n_base, const whale_batch *b, trim_step *o) {
    whale_err err;
    whale_gemm_stats st0, st1;
    whale_gemm *gm = whale_backend_cpu_gemm(ts->be);
    whale_gemm_get_stats(gm, &st0);
    whale_session_zero_grad(ts);
    CHECK(whale_session_train_step(ts, b->ids, b->labels, b->pos, b->seg, b->B, b->S, 1.0, &o->loss, &o->count,
                                   &err) == WHALE_OK,
          "%s", err.msg);
    whale_gemm_get_stats(gm, &st1);
    o->dnnl_calls = st1.calls - st0.calls;
    size_t off = 0;
    for (int i = n_base; i < whale_model_num_params(mb); i++) {
        size_t n = (size_t)whale_shape_numel(2, whale_model_param(mb, i).shape);
        memcpy(o->g + off, whale_session_grad(ts, i), n * sizeof(float));
        off += n;
    }
}

/* Worst relative difference (norm) of b's adapter gradients from a's, per tensor. */
static double trim_grad_diff(const whale_model *mb, int n_base, const trim_step *a, const trim_step *b) {
    double worst = 0;
    size_t off = 0;
    for (int i = n_base; i < whale_model_num_params(mb); i++) {
        size_t n = (size_t)whale_shape_numel(2, whale_model_param(mb, i).shape);
        double r = test_rel_norm(b->g + off, a->g + off, (long)n);
        if (r > worst) worst = r;
        off += n;
    }
    return worst;
}

/* Cutting a bf16 LoRA batch to its last label (whale_batch_trim: full ->
 * cut) changes neither the function the step computes nor, on our
 * kernels, its bits. Two claims, checked apart:
 *  - the bits. Our kernels give an output row the same bits whatever the
 *    number of rows (each output summed along K in one order; where K is
 *    the tokens, in the weight gradients and P·V, the padding only adds
 *    exact zeros), and the other ops work per row or sum the same terms in
 *    the same order. So where our kernels run every product of both steps
 *    the two must agree bit for bit. The forced own path (WHALE_GEMM_OWN)
 *    gives that at every tier. The shape rules give it only if they hand
 *    oneDNN none of the products, which the gemm's call counter tells:
 *    here they hand it some at every tier (the Linear products have 32
 *    and 26 rows, more than own_max_m_nt except at avx512, and from
 *    avx512 up the bf16 nn/tn products have no own path under the rules).
 *  - the function. oneDNN's blocking changes with the number of rows, so a
 *    row's fp32 sums may differ in their last bits between the batches;
 *    where such a value is rounded to bf16 (every bf16 product rounds its
 *    fp32 operands) the two may round to neighbours, one bf16 ulp (2u,
 *    u = 2^-8 the unit roundoff) apart, and the step goes on from there.
 *    Few values lie that close to a rounding midpoint, each flip moves one
 *    operand of a sum by at most 2u relative, and the loss averages over
 *    the targets: u/4 (9.8e-4 relative) bounds the loss. An adapter's
 *    gradient also passes through the backward products' roundings and is
 *    a sum over tokens with cancellation: 16u (6.25e-2 relative, per
 *    tensor) bounds it. Measured over 1-16 optimiser steps before the
 *    check, at every tier (own_max_m_nt 16 or 24 at avx512_bf16,
 *    own_max_m_nn 4 or 1 at avx2): the trimmed step up to 6.6e-5 (loss)
 *    and 6.8e-3 (gradients) from the full one; the rules' steps up to
 *    3.1e-4 and 1.8e-2 from the own path's (printed as a yardstick: the
 *    same mechanism, other kernels). Wrong trims tried (a row's positions
 *    not moved, its ids shifted by one, two positions swapped, later
 *    positions shifted, the last target dropped) moved some tensor's
 *    gradients by 0.5-3.3 relative; the dropped target also changes the
 *    count. */
static void trim_check(whale_session *ts, whale_model *mb, int n_base, const whale_batch *full,
                       const whale_batch *cut) {
    const double u = 1.0 / 256, loss_bound = u / 4, grad_bound = 16 * u;
    size_t ng = 0;
    for (int i = n_base; i < whale_model_num_params(mb); i++)
        ng += (size_t)whale_shape_numel(2, whale_model_param(mb, i).shape);
    trim_step own[2], rules[2];
    for (int k = 0; k < 2; k++) own[k].g = malloc(ng * sizeof(float)), rules[k].g = malloc(ng * sizeof(float));
    whale_gemm *gm = whale_backend_cpu_gemm(ts->be);
    whale_gemm_set_path(gm, WHALE_GEMM_OWN);
    trim_run(ts, mb, n_base, full, &own[0]);
    trim_run(ts, mb, n_base, cut, &own[1]);
    whale_gemm_set_path(gm, WHALE_GEMM_AUTO);
    trim_run(ts, mb, n_base, full, &rules[0]);
    trim_run(ts, mb, n_base, cut, &rules[1]);

    CHECK(own[0].dnnl_calls == 0 && own[1].dnnl_calls == 0, "the forced own path ran %lld/%lld products on oneDNN",
          (long long)own[0].dnnl_calls, (long long)own[1].dnnl_calls);
    double g_own = trim_grad_diff(mb, n_base, &own[0], &own[1]);
    printf("trimmed batch, our kernels: loss %.9g vs %.9g, gradients relative %.3g\n", own[1].loss, own[0].loss,
           g_own);
    CHECK(own[1].count == own[0].count && own[1].loss == own[0].loss &&
              !memcmp(own[1].g, own[0].g, ng * sizeof(float)),
          "trimming changed the step on our kernels: loss %.9g vs %.9g (%lld/%lld targets), gradients %g", own[1].loss,
          own[0].loss, (long long)own[1].count, (long long)own[0].count, g_own);

    const int all_own = rules[0].dnnl_calls == 0 && rules[1].dnnl_calls == 0;
    double g_rules = trim_grad_diff(mb, n_base, &rules[0], &rules[1]);
    double l_rules = fabs(rules[1].loss - rules[0].loss) / fabs(rules[0].loss);
    printf("trimmed batch, shape rules (%lld/%lld products on oneDNN): loss %.9g vs %.9g, gradients relative %.3g\n",
           (long long)rules[1].dnnl_calls, (long long)rules[0].dnnl_calls, rules[1].loss, rules[0].loss, g_rules);
    CHECK(rules[1].count == rules[0].count, "trimming changed the targets: %lld vs %lld", (long long)rules[1].count,
          (long long)rules[0].count);
    if (all_own)
        CHECK(rules[1].loss == rules[0].loss && !memcmp(rules[1].g, rules[0].g, ng * sizeof(float)),
              "trimming changed the step on our kernels: loss %.9g vs %.9g, gradients %g", rules[1].loss,
              rules[0].loss, g_rules);
    else
        CHECK(l_rules <= loss_bound && g_rules <= grad_bound,
              "trimming changed the step beyond bf16 rounding: loss %.9g vs %.9g (relative %.3g, bound %.3g), "
              "gradients %.3g (bound %.3g)",
              rules[1].loss, rules[0].loss, l_rules, loss_bound, g_rules, grad_bound);
    for (int k = 0; k < 2; k++) /* the rules against our kernels: the same function, other bits */
        printf("%s batch, shape rules vs our kernels: loss relative %.3g, gradients %.3g\n", k ? "trimmed" : "full",
               fabs(rules[k].loss - own[k].loss) / fabs(own[k].loss), trim_grad_diff(mb, n_base, &own[k], &rules[k]));
    for (int k = 0; k < 2; k++) free(own[k].g), free(rules[k].g);
}

int main(void) {
    char adir[512], gpath[600];
    snprintf(adir, sizeof adir, "%s/lora-tiny", WHALE_TEST_DATA);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", adir);
    whale_err err;
    whale_st *g;
    if (whale_st_open(gpath, &g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const whale_st_entry *eids = whale_st_find(g, "input_ids"), *elab = whale_st_find(g, "labels"),
                         *elog = whale_st_find(g, "logits"), *eloss = whale_st_find(g, "loss"),
                         *emerged = whale_st_find(g, "merged_logits");
    int B = (int)eids->shape[0], S = (int)eids->shape[1];
    const int32_t *ids = eids->data, *labels = elab->data;

    whale_model *m = load_tiny();
    int n_base = whale_model_num_params(m), V = whale_model_vocab_size(m);
    CHECK(whale_lora_load(m, adir, &err) == WHALE_OK, "%s", err.msg);
    /* the file has PEFT's all-linear (wo_a too); the model never calls wo_a, so PeftModel ignores its pair */
    CHECK(whale_lora_count(m) == 38, "38 adapters on tiny's called Linear modules, got %d", whale_lora_count(m));
    for (int i = n_base; i < whale_model_num_params(m); i++)
        CHECK(!strstr(whale_model_param_name(m, i), "wo_a"), "wo_a's adapter must not act: %s",
              whale_model_param_name(m, i));

    /* forward */
    size_t nl = (size_t)B * S * V;
    float *logits = malloc(nl * sizeof(float)), *merged = malloc(nl * sizeof(float));
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
    double dl = test_rel_norm(logits, elog->data, (long)nl);
    printf("adapted logits vs the PEFT-semantics reference: relative %.3g\n", dl);
    CHECK(dl <= 1e-5, "adapted logits differ from the reference by %g", dl);

    /* backward: the adapters' gradients, the base frozen */
    whale_session *ts;
    double loss;
    int64_t cnt;
    CHECK(whale_train_session_new(m, B, S, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    whale_session_zero_grad(ts);
    CHECK(whale_session_train_step(ts, ids, labels, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK, "%s",
          err.msg);
    CHECK(fabs(loss - ((const float *)eloss->data)[0]) <= 1e-5 * fabs(loss), "loss %.7f vs %.7f", loss,
          ((const float *)eloss->data)[0]);
    double worst = 0;
    const char *worst_name = "";
    for (int i = n_base; i < whale_model_num_params(m); i++) {
        char key[256];
        snprintf(key, sizeof key, "grad.base_model.model.%s", whale_model_param_name(m, i));
        const whale_st_entry *e = whale_st_find(g, key);
        CHECK(e != NULL, "golden has no %s", key);
        if (!e) continue;
        double r = test_rel_norm(whale_session_grad(ts, i), e->data, (long)(e->nbytes / 4));
        if (r > worst) worst = r, worst_name = whale_model_param_name(m, i);
    }
    double sq = 0; /* PEFT clips the norm of the trainable gradients: the adapters' */
    for (int i = n_base; i < whale_model_num_params(m); i++) {
        whale_tensor t = whale_model_param(m, i);
        const float *gr = whale_session_grad(ts, i);
        for (long k = 0; k < (long)whale_shape_numel(t.ndim, t.shape); k++) sq += (double)gr[k] * gr[k];
    }
    CHECK(fabs(whale_grad_norm(ts) - sqrt(sq)) <= 1e-12 * sqrt(sq), "gradient norm %.12g, adapters only %.12g",
          whale_grad_norm(ts), sqrt(sq));
    printf("adapter gradients vs reference: worst relative %.3g (%s)\n", worst, worst_name);
    CHECK(worst <= 1e-4, "adapter gradient %s off by %g", worst_name, worst);
    for (int i = 0; i < n_base; i++)
        CHECK(whale_session_grad(ts, i) == NULL || !strstr(whale_model_param_name(m, i), ".weight") ||
                  strstr(whale_model_param_name(m, i), "norm") || strstr(whale_model_param_name(m, i), "gate"),
              "frozen product weight %s has a gradient buffer", whale_model_param_name(m, i));

    /* one AdamW step changes the adapters and nothing else */
    int iw = param_index(m, "model.layers.0.attn.wq_a.weight");
    whale_tensor tw = whale_model_param(m, iw);
    size_t nw = (size_t)whale_shape_numel(tw.ndim, tw.shape);
    float *before = malloc(nw * sizeof(float)), *a_before = malloc(sizeof(float) * 4 * 64);
    memcpy(before, tw.data, nw * sizeof(float));
    int ia = param_index(m, "model.layers.0.attn.wq_a.lora_A.weight");
    memcpy(a_before, whale_model_param(m, ia).data, sizeof(float) * 4 * 64);
    whale_optimizer *o;
    whale_adamw_config ac = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
    CHECK(whale_adamw_new(m, &ac, &o, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_optimizer_bytes(o) == 2 * sizeof(float) * (size_t)whale_lora_num_params(m),
          "moments for the adapters only: %zu bytes", whale_optimizer_bytes(o));
    whale_adamw_step(o, ts, 1e-3);
    tw = whale_model_param(m, iw);
    CHECK(memcmp(before, tw.data, nw * sizeof(float)) == 0, "a frozen base weight changed");
    CHECK(memcmp(a_before, whale_model_param(m, ia).data, sizeof(float) * 4 * 64) != 0, "lora_A did not change");
    whale_optimizer_free(o);
    whale_session_free(ts);
    free(before);
    free(a_before);

    /* save → load round trip, then merge: the adapted logits without adapters */
    char tmp[512];
    test_tmpdir("lora", tmp, sizeof tmp);
    CHECK(whale_lora_save(m, tmp, "tests/data/tiny", &err) == WHALE_OK, "%s", err.msg);
    whale_model *m2 = load_tiny();
    CHECK(whale_lora_load(m2, tmp, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_new(m2, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
    CHECK(whale_lora_merge(m2, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_lora_count(m2) == 0 && whale_model_num_params(m2) == n_base, "merge removes the adapters");
    CHECK(whale_session_new(m2, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, merged, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
    double dm = test_rel_norm(merged, logits, (long)nl);
    printf("merged vs adapted logits: relative %.3g\n", dm);
    CHECK(dm <= 1e-5, "merged logits differ from the adapted ones by %g", dm);
    (void)emerged;
    whale_model_free(m2);

    /* PEFT's initialisation (B = 0) changes nothing */
    whale_model *m3 = load_tiny();
    float *plain = malloc(nl * sizeof(float));
    CHECK(whale_session_new(m3, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, plain, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
    whale_lora_config cfg = whale_lora_defaults();
    cfg.rank = 8;
    CHECK(whale_lora_attach(m3, &cfg, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_new(m3, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
    CHECK(memcmp(plain, logits, nl * sizeof(float)) == 0, "fresh adapters must not change the logits");
    /* whale memory --train lora counts the same trainable parameters */
    whale_memory est;
    whale_memory_plan plan = {.dtype = WHALE_BF16, .train = WHALE_TRAIN_LORA, .lora_rank = 8, .batch = 1, .seq_len = 16};
    char tdir[512];
    snprintf(tdir, sizeof tdir, "%s/tiny", WHALE_TEST_DATA);
    CHECK(whale_memory_estimate(tdir, &plan, &est, &err) == WHALE_OK, "%s", err.msg);
    CHECK(est.trainable == whale_lora_num_params(m3), "LoRA estimate %lld trainable, attached %lld",
          (long long)est.trainable, (long long)whale_lora_num_params(m3));
    for (int i = n_base; i < whale_model_num_params(m3); i++)
        CHECK(!strstr(whale_model_param_name(m3, i), "wo_a"), "all-linear attaches to wo_a: %s",
              whale_model_param_name(m3, i));
    CHECK(whale_lora_count(m3) == 38, "all-linear: %d adapters, 38 wanted", whale_lora_count(m3));
    cfg.target_modules = "no_such_module";
    whale_model *m4 = load_tiny();
    CHECK(whale_lora_attach(m4, &cfg, &err) == WHALE_ERR_ARG, "a target that matches nothing is refused");
    cfg.target_modules = "wq_a,wo_a";
    CHECK(whale_lora_attach(m4, &cfg, &err) == WHALE_ERR_ARG && strstr(err.msg, "model.layers.0.attn.wo_a") &&
              strstr(err.msg, "PEFT would never apply it") && whale_lora_count(m4) == 0,
          "an adapter on wo_a (never called by the reference) is refused: %s", err.msg);
    whale_model_free(m4);

    whale_model_free(m3);

    /* dropout 0.3: the masks come from the session's step counter, so holding
     * it fixed makes the loss a function of the adapters that the gradient
     * must match */
    m3 = load_tiny();
    CHECK(whale_lora_load(m3, adir, &err) == WHALE_OK, "%s", err.msg);
    ((whale_lora_config *)m3->lora_cfg)->dropout = 0.3; /* lora_cfg starts with the config */
    CHECK(whale_train_session_new(m3, B, S, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    const uint64_t step = 77;
    double l0, lp, lm, lother;
    ts->lora_calls = step - 1; /* train_step counts it up */
    whale_session_zero_grad(ts);
    CHECK(whale_session_train_step(ts, ids, labels, NULL, NULL, B, S, 1.0, &l0, &cnt, &err) == WHALE_OK, "%s", err.msg);
    ts->lora_calls = step + 100;
    CHECK(whale_session_train_step(ts, ids, labels, NULL, NULL, B, S, 0.0, &lother, &cnt, &err) == WHALE_OK, "%s",
          err.msg);
    CHECK(fabs(lother - l0) > 1e-6, "dropout must change the loss (eval %g vs train %g)", lother, l0);
    const char *probe[] = {"model.layers.0.attn.wq_a.lora_A.weight", "model.layers.1.ffn.experts.0.w2.lora_B.weight",
                           "model.layers.0.attn.wo_b.lora_B.weight"};
    for (int k = 0; k < 3; k++) {
        ts->lora_calls = step - 1; /* a fresh gradient of the step (the buffer accumulates) */
        whale_session_zero_grad(ts);
        CHECK(whale_session_train_step(ts, ids, labels, NULL, NULL, B, S, 1.0, &l0, &cnt, &err) == WHALE_OK, "%s",
              err.msg);
        int pi = param_index(m3, probe[k]);
        whale_tensor t = whale_model_param(m3, pi);
        float *w = t.data;
        const float *gr = whale_session_grad(ts, pi);
        long n = (long)whale_shape_numel(t.ndim, t.shape), at = 0;
        for (long i = 1; i < n; i++)
            if (fabsf(gr[i]) > fabsf(gr[at])) at = i;
        double g_at = gr[at]; /* before the probes below add theirs */
        float keep = w[at], h = 1e-2f;
        w[at] = keep + h;
        ts->lora_calls = step - 1;
        CHECK(whale_session_train_step(ts, ids, labels, NULL, NULL, B, S, 1.0, &lp, &cnt, &err) == WHALE_OK, "%s",
              err.msg);
        w[at] = keep - h;
        ts->lora_calls = step - 1;
        CHECK(whale_session_train_step(ts, ids, labels, NULL, NULL, B, S, 1.0, &lm, &cnt, &err) == WHALE_OK, "%s",
              err.msg);
        w[at] = keep;
        double fd = (lp - lm) / (2.0 * h);
        printf("dropout 0.3, %s[%ld]: gradient %.6g, central difference %.6g\n", probe[k], at, g_at, fd);
        CHECK(fabs(fd - g_at) <= 0.03 * fabs(g_at) + 1e-5, "%s: dropout gradient %g vs finite difference %g", probe[k],
              g_at, fd);
    }
    whale_session_free(ts);
    whale_model_free(m3);

    /* bad adapter folders: one-line errors naming the file */
    char bad[600], path[700];
    snprintf(bad, sizeof bad, "%s/bad", tmp);
    CHECK(whale_lora_save(m, bad, "tests/data/tiny", &err) == WHALE_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/adapter_config.json", bad);
    struct {
        const char *config, *expect;
        whale_code code;
    } cases[] = {
        {"{\"peft_type\": \"PREFIX_TUNING\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"wq_a\"]}",
         "peft_type must be \"LORA\"", WHALE_ERR_FORMAT},
        {"{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 8, \"target_modules\": \"all-linear\"}",
         "r is 8 but the adapters in", WHALE_ERR_FORMAT}, /* the file holds rank-4 tensors: nothing allocated by r */
        {"{\"peft_type\": \"LORA\", \"r\": 65536, \"lora_alpha\": 8, \"target_modules\": \"all-linear\"}",
         "r is 65536 but the adapters in", WHALE_ERR_FORMAT},
        {"{\"peft_type\": \"LORA\", \"r\": 1e10, \"lora_alpha\": 8, \"target_modules\": \"all-linear\"}",
         "r must be an integer in [1, 65536]", WHALE_ERR_FORMAT}, /* was a float-to-int overflow */
        {"{\"peft_type\": \"LORA\", \"r\": 2.5, \"lora_alpha\": 8, \"target_modules\": \"all-linear\"}",
         "r must be an integer", WHALE_ERR_FORMAT}, /* was silently 2 */
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"wq_a\", 3]}",
         "target_modules must list non-empty module names", WHALE_ERR_FORMAT},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"lora_dropout\": 7, \"target_modules\": \"all-linear\"}",
         "lora_dropout must be a number in [0, 1)", WHALE_ERR_FORMAT},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"wq_a\"]}",
         "do not belong to an adapter", WHALE_ERR_FORMAT}, /* tensors for modules the config does not name */
        {"{\"peft_type\": \"LORA\", \"r\": 4", "invalid JSON", WHALE_ERR_FORMAT},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        FILE *f = fopen(path, "w");
        fputs(cases[k].config, f);
        fclose(f);
        whale_model *mb = load_tiny();
        whale_code c = whale_lora_load(mb, bad, &err);
        CHECK(c == cases[k].code && strstr(err.msg, cases[k].expect) && strstr(err.msg, bad) && !strchr(err.msg, '\n'),
              "bad adapter %zu: got %d \"%s\"", k, (int)c, err.msg);
        CHECK(whale_lora_count(mb) == 0 && whale_model_num_params(mb) == n_base, "a failed load leaves no adapters");
        whale_model_free(mb);
    }
    /* a target_modules list of any length is read whole: 300 names that
     * match nothing (over 4 KB) before the real ones (it was cut at 512) */
    {
        char *text;
        size_t n;
        cJSON *j = NULL;
        whale_model *mb;
        CHECK(whale_lora_save(m, bad, "tests/data/tiny", &err) == WHALE_OK, "%s", err.msg);
        CHECK(whale_read_file(path, &text, &n, &err) == WHALE_OK && (j = cJSON_Parse(text)), "re-read the config");
        free(text);
        cJSON *tm = cJSON_GetObjectItem(j, "target_modules"), *longer = cJSON_CreateArray();
        for (int i = 0; i < 300; i++) {
            char name[32];
            snprintf(name, sizeof name, "no_such_module_%03d", i);
            cJSON_AddItemToArray(longer, cJSON_CreateString(name));
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, tm) cJSON_AddItemToArray(longer, cJSON_CreateString(it->valuestring));
        cJSON_ReplaceItemInObject(j, "target_modules", longer);
        char *out = cJSON_Print(j);
        CHECK(strlen(out) > 4096, "the list is long");
        FILE *f = fopen(path, "w");
        fputs(out, f);
        fclose(f);
        free(out);
        cJSON_Delete(j);
        mb = load_tiny();
        CHECK(whale_lora_load(mb, bad, &err) == WHALE_OK && whale_lora_count(mb) == whale_lora_count(m),
              "a long target_modules list: %s", err.msg);
        const whale_lora_config *lc = whale_lora_get_config(mb);
        CHECK(lc && strlen(lc->target_modules) > 4096, "the attached config keeps the whole list");
        whale_model_free(mb);
    }
    whale_model *mb = load_tiny();
    CHECK(whale_lora_load(mb, "no/such/adapter", &err) == WHALE_ERR_IO, "a missing folder is an i/o error: %s", err.msg);
    CHECK(whale_lora_merge(mb, &err) == WHALE_ERR_ARG, "merging without adapters is refused");
    whale_model_free(mb);

    /* a base used in place from a BF16 checkpoint cannot take a merge */
    char b16[600];
    snprintf(b16, sizeof b16, "%s/base-bf16", tmp);
    mb = load_tiny();
    CHECK(whale_model_set_dtype(mb, WHALE_BF16, &err) == WHALE_OK && whale_model_drop_master(mb, &err) == WHALE_OK &&
              whale_model_save(mb, b16, &err) == WHALE_OK,
          "%s", err.msg);
    whale_model_free(mb);
    CHECK(whale_model_load_as(b16, WHALE_BF16, &mb, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_lora_load(mb, adir, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_lora_merge(mb, &err) == WHALE_ERR_UNSUPPORTED && strstr(err.msg, "mapped read-only"),
          "merge into a mapped bf16 base must be refused: %s", err.msg);
    whale_model_free(mb);

    /* LoRA training on that bf16 base (the fine-tuning setup): after three
     * optimiser steps every base tensor is bit for bit what it was, the
     * adapters moved and the base was never copied out of its mapping */
    CHECK(whale_model_load_as(b16, WHALE_BF16, &mb, &err) == WHALE_OK, "%s", err.msg);
    whale_lora_config lc = whale_lora_defaults();
    lc.rank = 4;
    lc.dropout = 0; /* the trim comparison below needs the same function twice */
    CHECK(whale_lora_attach(mb, &lc, &err) == WHALE_OK, "%s", err.msg);
    unsigned char *snap = test_snapshot_params(mb, n_base);
    whale_memory before_mm;
    whale_memory_of_model(mb, &before_mm);
    CHECK(whale_train_session_new(mb, B, S, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_adamw_new(mb, &ac, &o, &err) == WHALE_OK, "%s", err.msg);
    whale_batch bt;
    CHECK(whale_batch_alloc(B, S, &bt, &err) == WHALE_OK, "%s", err.msg);
    memcpy(bt.ids, ids, sizeof(int32_t) * (size_t)B * S);
    memcpy(bt.labels, labels, sizeof(int32_t) * (size_t)B * S);
    for (int i = 0; i < B * S; i++) bt.pos[i] = i % S, bt.seg[i] = 0;
    bt.B = B, bt.S = S;
    int ib = param_index(mb, "model.layers.0.attn.wq_a.lora_B.weight");
    double l_first = 0, l_last = 0;
    for (int k = 0; k < 3; k++) {
        whale_step_result sr;
        CHECK(whale_train_one_step(ts, o, NULL, NULL, NULL, NULL, &bt, 1, 0, 1.0, 1e-2, k + 1, &sr, &err) == WHALE_OK, "%s",
              err.msg);
        if (!k) l_first = sr.loss;
        l_last = sr.loss;
    }
    int changed = test_params_changed(mb, n_base, snap);
    whale_memory after_mm;
    whale_memory_of_model(mb, &after_mm);
    printf("LoRA on a mapped bf16 base, 3 steps: loss %.4f -> %.4f, %d base tensors changed\n", l_first, l_last, changed);
    CHECK(changed == 0, "%d base tensors changed during LoRA training", changed);
    CHECK(l_last < l_first, "three steps at lr 1e-2 must lower the loss (%g -> %g)", l_first, l_last);
    float bmax = 0;
    const float *bw = whale_model_param(mb, ib).data;
    for (int i = 0; i < 64 * 4; i++) bmax = fmaxf(bmax, fabsf(bw[i]));
    CHECK(bmax > 0, "lora_B (zero at init) did not move");
    CHECK(after_mm.weights_mapped == before_mm.weights_mapped && after_mm.weights_mapped > 0 &&
              after_mm.weights_lowp == 0,
          "the base must stay mapped in place (mapped %zu -> %zu, owned copies %zu)", before_mm.weights_mapped,
          after_mm.weights_mapped, after_mm.weights_lowp);
    /* cutting a batch to its last label changes neither loss nor gradients (trim_check) */
    for (int b = 0; b < B; b++) /* rows end early, at different places */
        for (int i = S - 1 - 2 * b - 2; i < S; i++) bt.labels[b * S + i] = -100;
    memcpy(bt.ids, ids, sizeof(int32_t) * (size_t)B * S);
    whale_batch full = bt;
    whale_batch cut;
    CHECK(whale_batch_alloc(B, S, &cut, &err) == WHALE_OK, "%s", err.msg);
    for (size_t i = 0; i < (size_t)B * S; i++)
        cut.ids[i] = bt.ids[i], cut.labels[i] = bt.labels[i], cut.pos[i] = bt.pos[i], cut.seg[i] = bt.seg[i];
    cut.B = B, cut.S = S;
    whale_batch_trim(&cut);
    CHECK(cut.S == S - 3, "trimmed to %d columns, want %d", cut.S, S - 3);
    trim_check(ts, mb, n_base, &full, &cut);
    whale_batch_free(&cut);
    whale_batch_free(&bt);
    whale_optimizer_free(o);
    whale_session_free(ts);
    free(snap);
    whale_model_free(mb);

    free(plain);
    free(logits);
    free(merged);
    whale_model_free(m);
    whale_st_close(g);
    return test_finish("test_lora");
}
