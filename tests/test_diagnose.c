/* The numerics collector (whale_diag.h): exact bf16/fp16 classification at
 * the format boundaries, aggregation over calls, routing margins, the first
 * non-finite tensor (synthetic and in a real model with a NaN weight),
 * deviation from a reference run and routing disagreement (synthetic, fp32
 * against itself, bf16 and the gradients against fp32), and the JSON
 * report. */
#include "testutil.h"

#include "whale.h"
#include "whale_diag.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static whale_tensor f32_tensor(float *data, int64_t rows, int64_t cols) {
    return (whale_tensor){.dtype = WHALE_F32, .ndim = 2, .shape = {rows, cols}, .data = data};
}

/* Values on both sides of every boundary the collector reports. */
static void test_classification(void) {
    float x[] = {
        0.0f,
        -0.0f,
        1e-39f,                        /* fp32/bf16 subnormal, fp16 zero */
        0x1p-134f,                     /* half the smallest bf16 subnormal: a tie, rounds to 0 */
        nextafterf(0x1p-134f, 1.0f),   /* just above: rounds to the smallest bf16 subnormal */
        0x1p-25f,                      /* half the smallest fp16 subnormal: a tie, rounds to 0 */
        nextafterf(0x1p-25f, 1.0f),    /* rounds to 2^-24 */
        1e-5f,                         /* fp16 subnormal, nonzero */
        0x1p-14f,                      /* smallest fp16 normal */
        65519.0f,                      /* rounds down to 65504 */
        -65520.0f,                     /* rounds to -inf in fp16 */
        70000.0f,
        3.0f,
    };
    int n = (int)(sizeof x / sizeof x[0]);
    whale_diag *d = whale_diag_new(0);
    whale_tensor t = f32_tensor(x, 1, n);
    whale_diag_trace(d, "layers.0.attn.q", &t);
    whale_diag_stats s;
    CHECK(whale_diag_find(d, "layers.0.attn.q", &s) == 0, "entry missing");
    CHECK(s.numel == n && s.zeros == 2 && s.nonzero == n - 2, "numel %lld zeros %lld nonzero %lld", (long long)s.numel,
          (long long)s.zeros, (long long)s.nonzero);
    CHECK(s.bf16_subnormal == 3, "bf16 subnormal %lld", (long long)s.bf16_subnormal);
    CHECK(s.bf16_zero == 1, "bf16 zero %lld", (long long)s.bf16_zero);
    CHECK(s.fp16_subnormal == 6, "fp16 subnormal %lld", (long long)s.fp16_subnormal);
    CHECK(s.fp16_zero == 4, "fp16 zero %lld", (long long)s.fp16_zero);
    CHECK(s.fp16_overflow == 2, "fp16 overflow %lld", (long long)s.fp16_overflow);
    CHECK(s.max_abs == 70000.0 && s.min_nonzero == (double)0x1p-134f, "max %g min %g", s.max_abs, s.min_nonzero);
    CHECK(fabs(s.fp16_headroom - log2(65504.0 / 70000.0)) < 1e-12 && s.fp16_headroom < 0, "fp16 headroom %g",
          s.fp16_headroom);
    CHECK(fabs(s.bf16_headroom - log2(3.3895313892515355e38 / 70000.0)) < 1e-9, "bf16 headroom %g", s.bf16_headroom);
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    CHECK(fabs(s.rms - sqrt(ss / n)) < 1e-9 * s.rms, "rms %g vs %g", s.rms, sqrt(ss / n));
    CHECK(!whale_diag_failed(d) && !whale_diag_report_nan(d), "no failure expected");

    /* a second call aggregates; a new name keeps first-seen order */
    float y[2] = {0.5f, -100000.0f};
    whale_tensor u = f32_tensor(y, 1, 2);
    whale_diag_trace(d, "layers.0.attn.kv", &u);
    whale_diag_trace(d, "layers.0.attn.q", &u);
    CHECK(whale_diag_num_tensors(d) == 2, "%d names", whale_diag_num_tensors(d));
    whale_diag_tensor(d, 0, &s);
    CHECK(!strcmp(s.name, "layers.0.attn.q") && s.calls == 2 && s.numel == n + 2 && s.max_abs == 100000.0 &&
              s.fp16_overflow == 3,
          "%s calls %lld numel %lld max %g", s.name, (long long)s.calls, (long long)s.numel, s.max_abs);
    whale_diag_tensor(d, 1, &s);
    CHECK(!strcmp(s.name, "layers.0.attn.kv") && s.calls == 1, "%s", s.name);
    CHECK(whale_diag_tensor(d, 2, &s) == -1 && whale_diag_find(d, "nope", &s) == -1, "out of range");
    whale_diag_free(d);
}

/* The first non-finite tensor, its call and element, and what came before. */
static void test_first_nonfinite(void) {
    whale_diag *d = whale_diag_new(1);
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {0.5f, 0, 0, 0, 0, 0, 0, 0};
    whale_tensor ta = f32_tensor(a, 2, 4), tb = f32_tensor(b, 2, 4);
    whale_diag_trace(d, "x", &ta);
    whale_diag_trace(d, "y", &tb);
    whale_diag_trace(d, "x", &ta);
    CHECK(!whale_diag_failed(d), "finite so far");
    b[5] = INFINITY;
    b[7] = NAN;
    whale_diag_trace(d, "y", &tb); /* call 2 of y, element 5 = [1, 1] */
    a[0] = NAN;
    whale_diag_trace(d, "x", &ta); /* after the failure: ignored in nan-check mode */
    const char *name;
    int64_t call, elem;
    CHECK(whale_diag_failed(d) && whale_diag_first_nonfinite(d, &name, &call, &elem) == 0, "failure not recorded");
    CHECK(!strcmp(name, "y") && call == 2 && elem == 5, "%s call %lld element %lld", name, (long long)call,
          (long long)elem);
    const char *msg = whale_diag_report_nan(d);
    CHECK(msg && strstr(msg, "non-finite value in y (forward, call 2, element 5 [1, 1] = +inf; 2 of 8 values") &&
              strstr(msg, "last finite inputs: x max|x| 8 rms"),
          "%s", msg ? msg : "(null)");
    whale_err err;
    CHECK(whale_diag_nan_error(d, &err) == WHALE_ERR_RANGE && !strcmp(err.msg, msg), "%s", err.msg);
    whale_diag_stats s;
    whale_diag_find(d, "x", &s);
    CHECK(s.calls == 2 && s.nan == 0, "x traced after the failure: calls %lld", (long long)s.calls);
    whale_diag_free(d);

    d = whale_diag_new(0);
    CHECK(whale_diag_nan_error(d, &err) == WHALE_OK, "no failure");
    whale_diag_free(d);
}

/* Margins from gate logits + topk_idx without a model: sqrt(softplus). */
static void test_routing_synthetic(void) {
    whale_diag *d = whale_diag_new(0);
    float logit[8] = {1.0f, 0.5f, 0.999f, -2.0f, /* token 0 chooses 0, 2 */
                      0.0f, 3.0f, -1.0f, 0.0f};  /* token 1 chooses 1, 0 (a tie with 3) */
    int32_t idx[4] = {0, 2, 1, 0};
    whale_tensor tl = f32_tensor(logit, 2, 4);
    whale_tensor ti = {.dtype = WHALE_I32, .ndim = 2, .shape = {2, 2}, .data = idx};
    whale_diag_trace(d, "layers.3.ffn.gate_logits", &tl);
    whale_diag_trace(d, "layers.3.ffn.topk_idx", &ti);
    whale_diag_routing r;
    CHECK(whale_diag_num_routing(d) == 1 && whale_diag_routing_at(d, 0, &r) == 0, "no routing entry");
    double m0 = sqrt(log1p(exp(0.999))) - sqrt(log1p(exp(0.5)));
    CHECK(r.layer == 3 && !r.biased && r.tokens == 2, "layer %d biased %d tokens %lld", r.layer, r.biased,
          (long long)r.tokens);
    CHECK(r.min_margin == 0 && fabs(r.mean_margin - m0 / 2) < 1e-6, "min %g mean %g (want 0, %g)", r.min_margin,
          r.mean_margin, m0 / 2);
    CHECK(r.below_1e3 == 1 && r.bf16_ties == 1 && r.fp16_ties == 1, "below %lld ties %lld %lld",
          (long long)r.below_1e3, (long long)r.bf16_ties, (long long)r.fp16_ties);
    whale_diag_free(d);
}

/* Deviation from a reference on hand-made values: call k against call k,
 * the set (not the order) of experts, non-finite mismatches, names and calls
 * the reference did not keep, and the memory limit. */
static void test_reference_synthetic(void) {
    whale_diag *ref = whale_diag_new(0), *d = whale_diag_new(0);
    whale_diag_keep_values(ref, 0);
    float r1[4] = {1, 2, 3, 4}, r2[4] = {0.5f, 0, 1, 1}, ry[2] = {1, NAN};
    int32_t rk[6] = {0, 1, 2, 3, 1, 3};
    whale_tensor t;
    t = f32_tensor(r1, 1, 4);
    whale_diag_trace(ref, "x", &t);
    t = f32_tensor(ry, 1, 2);
    whale_diag_trace(ref, "y", &t);
    whale_tensor tk = {.dtype = WHALE_I32, .ndim = 2, .shape = {3, 2}, .data = rk};
    whale_diag_trace(ref, "layers.2.ffn.topk_idx", &tk);
    t = f32_tensor(r2, 1, 4);
    whale_diag_trace(ref, "x", &t);
    int64_t dropped;
    CHECK(whale_diag_kept_bytes(ref, &dropped) == 4 * (4 + 2 + 6 + 4) && dropped == 0, "kept %zu dropped %lld",
          whale_diag_kept_bytes(ref, NULL), (long long)dropped);

    whale_diag_set_reference(d, ref, "fp32");
    float x1[4] = {1, 2, 3, 5}, x2[4] = {0.5f, 0, 0, 1}, y[2] = {1, 2}, z[1] = {7};
    int32_t xk[6] = {1, 0, 2, 1, 3, 1}; /* token 0: same set, other order; token 1 differs; token 2 same */
    t = f32_tensor(x1, 1, 4);
    whale_diag_trace(d, "x", &t);
    t = f32_tensor(y, 1, 2);
    whale_diag_trace(d, "y", &t);
    tk.data = xk;
    whale_diag_trace(d, "layers.2.ffn.topk_idx", &tk);
    t = f32_tensor(x2, 1, 4);
    whale_diag_trace(d, "x", &t);
    t = f32_tensor(z, 1, 1);
    whale_diag_trace(d, "z", &t); /* never traced in the reference */
    t = f32_tensor(x1, 1, 4);
    whale_diag_trace(d, "x", &t); /* a third call: the reference kept two */

    whale_diag_stats s;
    whale_diag_find(d, "x", &s);
    /* calls 1 and 2: differences 1 (element 3) and 1 (element 2, lost to zero) */
    CHECK(s.calls == 3 && s.cmp_calls == 2 && s.cmp_values == 8, "x: calls %lld compared %lld values %lld",
          (long long)s.calls, (long long)s.cmp_calls, (long long)s.cmp_values);
    CHECK(s.max_abs_diff == 1 && fabs(s.rel_rms_diff - sqrt(2 / 32.25)) < 1e-12, "x: max %g rel %g (want 1, %g)",
          s.max_abs_diff, s.rel_rms_diff, sqrt(2 / 32.25));
    CHECK(fabs(s.lost_to_zero - 1.0 / 7) < 1e-12 && s.cmp_nonfinite == 0, "x: lost %g nonfinite %lld", s.lost_to_zero,
          (long long)s.cmp_nonfinite);
    whale_diag_find(d, "y", &s);
    CHECK(s.cmp_calls == 1 && s.cmp_values == 1 && s.cmp_nonfinite == 1 && s.max_abs_diff == 0, "y: %lld %lld %g",
          (long long)s.cmp_values, (long long)s.cmp_nonfinite, s.max_abs_diff);
    whale_diag_find(d, "z", &s);
    CHECK(s.cmp_calls == 0 && s.rel_rms_diff == 0, "z was not in the reference");
    whale_diag_routing r;
    CHECK(whale_diag_num_routing(d) == 1 && whale_diag_routing_at(d, 0, &r) == 0, "no routing entry");
    CHECK(r.layer == 2 && r.cmp_tokens == 3 && r.disagree == 1, "layer %d compared %lld disagree %lld", r.layer,
          (long long)r.cmp_tokens, (long long)r.disagree);

    char *buf = NULL;
    size_t len = 0;
    whale_err err;
    FILE *f = open_memstream(&buf, &len);
    CHECK(whale_diag_write_json(d, f, NULL, &err) == WHALE_OK, "%s", err.msg);
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    const cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tensors"), 0);
    const cJSON *dev = cJSON_GetObjectItem(t0, "deviation");
    CHECK(cJSON_IsString(cJSON_GetObjectItem(j, "reference")) && cJSON_IsNumber(cJSON_GetObjectItem(dev, "max_abs_diff")),
          "JSON deviation of x");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tensors"), 2), "deviation")),
          "z: deviation null");
    const cJSON *df = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "routing"), 0), "disagree_frac");
    CHECK(cJSON_IsNumber(df) && fabs(df->valuedouble - 1.0 / 3) < 1e-12, "JSON disagree_frac");
    cJSON_Delete(j);
    free(buf);
    f = fopen("/dev/null", "w");
    whale_diag_print_table(d, f);
    fclose(f);
    whale_diag_free(d);
    whale_diag_free(ref);

    /* the limit: what does not fit is not kept, and neither are later calls of that name */
    ref = whale_diag_new(0);
    whale_diag_keep_values(ref, 20);
    t = f32_tensor(r1, 1, 4);
    whale_diag_trace(ref, "a", &t);
    whale_diag_trace(ref, "b", &t);
    t = f32_tensor(z, 1, 1);
    whale_diag_trace(ref, "a", &t);
    whale_diag_trace(ref, "b", &t);
    CHECK(whale_diag_kept_bytes(ref, &dropped) == 20 && dropped == 2, "kept %zu dropped %lld",
          whale_diag_kept_bytes(ref, NULL), (long long)dropped);
    whale_diag_free(ref);
}

/* The tiny model against itself (nothing moves), in bf16 against fp32, and
 * the gradients of a training step in fp16 against fp32. */
static void test_model_reference(whale_model *m) {
    whale_err err;
    enum { B = 2, S = 9 };
    int V = whale_model_vocab_size(m);
    int32_t ids[B * S];
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)((i * 53 + 11) % V);
    float *logits = malloc(sizeof(float) * B * S * V);
    whale_diag *ref = whale_diag_new(0), *same = whale_diag_new(0), *bf = whale_diag_new(0);
    whale_session *s;
    whale_diag_keep_values(ref, 0);
    whale_diag_set_reference(same, ref, "fp32");
    whale_diag_set_reference(bf, ref, "fp32");
    whale_diag *runs[3] = {ref, same, bf};
    for (int k = 0; k < 3; k++) {
        if (k == 2) CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK, "%s", err.msg);
        CHECK(whale_diag_set_model(runs[k], m, &err) == WHALE_OK, "%s", err.msg);
        CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
        whale_session_set_trace(s, whale_diag_trace, runs[k]);
        CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
        whale_session_free(s);
    }
    CHECK(whale_model_set_dtype(m, WHALE_F32, &err) == WHALE_OK, "%s", err.msg);
    int n = whale_diag_num_tensors(same);
    CHECK(n == whale_diag_num_tensors(ref) && n > 50, "%d tensors", n);
    for (int i = 0; i < n; i++) {
        whale_diag_stats st;
        whale_diag_tensor(same, i, &st);
        CHECK(st.cmp_calls == 1 && st.cmp_values == st.numel && st.max_abs_diff == 0 && st.rel_rms_diff == 0 &&
                  st.lost_to_zero == 0,
              "fp32 against fp32: %s compared %lld max %g", st.name, (long long)st.cmp_calls, st.max_abs_diff);
    }
    for (int i = 0; i < whale_diag_num_routing(same); i++) {
        whale_diag_routing r;
        whale_diag_routing_at(same, i, &r);
        CHECK(r.cmp_tokens == B * S && r.disagree == 0, "layer %d: %lld of %lld tokens disagree", r.layer,
              (long long)r.disagree, (long long)r.cmp_tokens);
    }
    whale_diag_stats lg;
    CHECK(whale_diag_find(bf, "logits", &lg) == 0 && lg.cmp_calls == 1 && lg.rel_rms_diff > 1e-5 &&
              lg.rel_rms_diff < 0.05 && lg.max_abs_diff > 0,
          "bf16 logits against fp32: rel %g max %g", lg.rel_rms_diff, lg.max_abs_diff);
    CHECK(whale_diag_num_routing(bf) == 2, "%d routing layers", whale_diag_num_routing(bf));
    whale_diag_free(same);
    whale_diag_free(bf);
    whale_diag_free(ref);

    /* gradients: traced as grad.*, phase backward, layer from the name, compared */
    ref = whale_diag_new(0);
    whale_diag *h = whale_diag_new(0);
    whale_diag_keep_values(ref, 0);
    whale_diag_set_reference(h, ref, "fp32");
    for (int k = 0; k < 2; k++) {
        if (k == 1) CHECK(whale_model_set_dtype(m, WHALE_F16, &err) == WHALE_OK, "%s", err.msg);
        double loss;
        int64_t count;
        CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
        whale_session_set_trace(s, whale_diag_trace, k ? h : ref);
        CHECK(whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK, "%s",
              err.msg);
        whale_session_free(s);
    }
    CHECK(whale_model_set_dtype(m, WHALE_F32, &err) == WHALE_OK, "%s", err.msg);
    whale_diag_stats g;
    CHECK(whale_diag_find(h, "grad.layers.1.ffn.out", &g) == 0 && !strcmp(g.phase, "backward") && g.layer == 1 &&
              g.cmp_calls == 1 && g.rel_rms_diff > 0 && g.rel_rms_diff < 0.05,
          "grad.layers.1.ffn.out: phase %s layer %d rel %g", g.phase, g.layer, g.rel_rms_diff);
    CHECK(whale_diag_find(h, "layers.1.attn.q", &g) == 0 && !strcmp(g.phase, "forward") && g.layer == 1,
          "the forward of the training step");
    CHECK(whale_diag_find(h, "grad.embedding", &g) == 0 && g.layer == -1 && g.cmp_calls == 1, "grad.embedding");
    FILE *f = fopen("/dev/null", "w");
    whale_diag_print_table(h, f);
    fclose(f);
    whale_diag_free(h);
    whale_diag_free(ref);
    free(logits);
}

static int param_index(const whale_model *m, const char *name) {
    for (int i = 0; i < whale_model_num_params(m); i++)
        if (!strcmp(whale_model_param_name(m, i), name)) return i;
    return -1;
}

/* The tiny model: every traced name, exact biased routing, JSON. */
static void test_model(const whale_model *m) {
    whale_err err;
    whale_session *s;
    enum { S = 10 };
    int V = whale_model_vocab_size(m);
    int32_t ids[S];
    for (int i = 0; i < S; i++) ids[i] = (int32_t)((i * 37 + 5) % V);
    float *logits = malloc(sizeof(float) * S * V);
    whale_diag *d = whale_diag_new(0);
    CHECK(whale_diag_set_model(d, m, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_new((whale_model *)m, 1, S + 1, &s, &err) == WHALE_OK, "%s", err.msg);
    whale_session_set_trace(s, whale_diag_trace, d);
    CHECK(whale_session_forward(s, ids, 1, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, 1, 1, logits, 0, &err) == WHALE_OK, "%s", err.msg); /* a decode step */

    int n = whale_diag_num_tensors(d);
    whale_diag_stats first, last, q, lg;
    whale_diag_tensor(d, 0, &first);
    whale_diag_tensor(d, n - 1, &last);
    CHECK(!strcmp(first.name, "layers.0.hc_attn.pre") && !strcmp(last.name, "logits"), "order: %s … %s", first.name,
          last.name);
    CHECK(whale_diag_find(d, "layers.1.attn.q", &q) == 0 && q.calls == 2 && q.nan + q.pos_inf + q.neg_inf == 0,
          "layers.1.attn.q calls %lld", (long long)q.calls);
    /* the full forward traces [S, V] logits, the decode step its last row */
    CHECK(whale_diag_find(d, "logits", &lg) == 0 && lg.calls == 2 && lg.numel == (int64_t)S * V + V,
          "logits numel %lld", (long long)lg.numel);
    CHECK(whale_diag_find(d, "layers.0.ffn.topk_idx", &lg) == -1, "integer tensors are not measured");
    CHECK(whale_diag_num_routing(d) == 2, "%d routing layers", whale_diag_num_routing(d));
    for (int i = 0; i < whale_diag_num_routing(d); i++) {
        whale_diag_routing r;
        whale_diag_routing_at(d, i, &r);
        /* the exact biased scores reproduce the router's choice: no negative margin */
        CHECK(r.layer == i && r.biased && r.tokens == S + 1 && r.min_margin >= 0,
              "layer %d: biased %d tokens %lld min %g", r.layer, r.biased, (long long)r.tokens, r.min_margin);
    }
    CHECK(!whale_diag_failed(d), "%s", whale_diag_report_nan(d));

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(whale_diag_write_json(d, f, "{\"model\": \"tiny\"}", &err) == WHALE_OK, "%s", err.msg);
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    CHECK(j != NULL, "report is not JSON");
    const cJSON *t = cJSON_GetObjectItem(j, "tensors"), *r = cJSON_GetObjectItem(j, "routing");
    CHECK(cJSON_GetArraySize(t) == n && cJSON_GetArraySize(r) == 2, "tensors %d routing %d", cJSON_GetArraySize(t),
          cJSON_GetArraySize(r));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "first_nonfinite")), "first_nonfinite should be null");
    const cJSON *run = cJSON_GetObjectItem(j, "run");
    CHECK(cJSON_IsString(cJSON_GetObjectItem(run, "model")), "run.model missing");
    const cJSON *h = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(t, 0), "fp16"), "headroom_bits");
    CHECK(cJSON_IsNumber(h) && h->valuedouble > 10, "fp16 headroom of layers.0.hc_attn.pre");
    cJSON_Delete(j);
    free(buf);

    f = fopen("/dev/null", "w");
    whale_diag_print_table(d, f); /* runs cleanly; the CLI test reads its text */
    fclose(f);
    whale_session_free(s);
    whale_diag_free(d);
    free(logits);
}

/* One NaN in layers.1.attn.wq_b: q of layer 1 is the first traced tensor that
 * depends on it (q_latent, traced just before, does not). */
static void test_nan_weight(whale_model *m) {
    whale_err err;
    char dir[512], path[600];
    test_tmpdir("diagnose", dir, sizeof dir);
    int p = param_index(m, "model.layers.1.attn.wq_b.weight");
    CHECK(p >= 0 && whale_model_make_writable(m, &err) == WHALE_OK, "%s", err.msg);
    whale_tensor w = whale_model_param(m, p);
    ((float *)w.data)[3 * w.shape[1] + 7] = NAN; /* row 3: head 0 */
    CHECK(whale_model_save(m, dir, &err) == WHALE_OK, "%s", err.msg);
    whale_model *bad;
    if (whale_model_load(dir, &bad, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    for (int mode = 0; mode < 2; mode++) {
        enum { S = 6 };
        int32_t ids[S] = {3, 1, 4, 1, 5, 9};
        whale_session *s;
        whale_diag *d = whale_diag_new(mode);
        CHECK(whale_session_new(bad, 1, S, &s, &err) == WHALE_OK, "%s", err.msg);
        whale_session_set_trace(s, whale_diag_trace, d);
        whale_session_forward(s, ids, 1, S, NULL, 0, &err);
        const char *name = "";
        int64_t call = 0, elem = -1;
        CHECK(whale_diag_first_nonfinite(d, &name, &call, &elem) == 0, "no non-finite tensor found");
        CHECK(!strcmp(name, "layers.1.attn.q") && call == 1 && elem == 0, "mode %d: first %s call %lld element %lld",
              mode, name, (long long)call, (long long)elem);
        CHECK(whale_diag_nan_error(d, &err) == WHALE_ERR_RANGE &&
                  strstr(err.msg, "non-finite value in layers.1.attn.q (forward, call 1, element 0 [0, 0] = nan") &&
                  strstr(err.msg, "last finite inputs: layers.1.attn.q_latent max|x|"),
              "%s", err.msg);
        whale_diag_stats st;
        if (mode == 0) /* statistics mode keeps measuring: the NaN reaches the end */
            CHECK(whale_diag_find(d, "final_hidden", &st) == 0 && st.nan > 0, "final_hidden nan %lld",
                  (long long)st.nan);
        else
            CHECK(whale_diag_find(d, "final_hidden", &st) == -1, "nan-check mode stops collecting");
        whale_session_free(s);
        whale_diag_free(d);
    }
    whale_model_free(bad);

    /* a NaN that first appears in a later pass: an embedding row that only
     * the second forward reads; nothing from the first pass counts as input */
    ((float *)w.data)[3 * w.shape[1] + 7] = 0.0f;
    whale_tensor emb = whale_model_param(m, param_index(m, "model.embed_tokens.weight"));
    ((float *)emb.data)[7 * emb.shape[1] + 2] = INFINITY;
    int32_t ids[3] = {3, 1, 4}, next = 7;
    whale_session *s;
    whale_diag *d = whale_diag_new(1);
    CHECK(whale_session_new(m, 1, 4, &s, &err) == WHALE_OK, "%s", err.msg);
    whale_session_set_trace(s, whale_diag_trace, d);
    CHECK(whale_session_forward(s, ids, 1, 3, NULL, 0, &err) == WHALE_OK && !whale_diag_failed(d), "first pass");
    whale_session_forward(s, &next, 1, 1, NULL, 0, &err);
    const char *name = "";
    int64_t call = 0, elem = -1;
    CHECK(whale_diag_first_nonfinite(d, &name, &call, &elem) == 0 && !strcmp(name, "layers.0.hc_attn.pre") && call == 2,
          "first %s call %lld", name, (long long)call);
    const char *msg = whale_diag_report_nan(d);
    CHECK(msg && strstr(msg, "(forward, call 2, element 0 [0, 0] = nan") &&
              strstr(msg, "no tensor was traced before it in this pass"),
          "%s", msg ? msg : "(null)");
    whale_session_free(s);
    whale_diag_free(d);

    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    test_classification();
    test_first_nonfinite();
    test_routing_synthetic();
    test_reference_synthetic();
    whale_err err;
    whale_model *m;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tiny", WHALE_TEST_DATA);
    if (whale_model_load(dir, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_model(m);
    test_model_reference(m);
    test_nan_weight(m);
    whale_model_free(m);
    return test_finish("test_diagnose");
}
