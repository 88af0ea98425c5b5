/* The Qwen2 family against the PyTorch reference (tests/reference/
 * gen_qwen2.py) on three small models with GQA ratios 1, 2 and 7, tied and
 * untied: logits and traced intermediates (≤ 1e-5 of the reference's
 * largest value), gradients of every parameter (≤ 1e-4), a decode one token
 * at a time equal to the full forward, packed rows (positions and segment
 * starts) equal to the documents run separately, recompute bit-identical,
 * bf16 close to fp32. Then LoRA on qwen2-tiny (7 adapters per layer, merge
 * exact), a PEFT adapter folder on qwen2-gqa2 against the reference's LoRA
 * (tests/reference/gen_qwen2_lora.py: logits, loss, adapter gradients,
 * merged logits, rsLoRA), save/load, bf16 and int8 loads without fp32
 * weights (and LoRA training on the bf16 one), sharded checkpoints and their failures, the
 * weights of a checkpoint moved into owned memory, bad configs, the memory estimate against live sessions and the parameter
 * counts of the real Qwen2.5-0.5B and 7B shapes. */
#include "testutil.h"

#include "whale_safetensors.h"
#include "models/model.h"
#include "whale.h"
#include "whale_lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ traces */

typedef struct {
    const whale_st *golden;
    const char *label, *prefix; /* golden name = prefix + traced name */
    int compared;
    double worst;
} trace_ctx;

/* Every traced tensor the golden has, within 1e-5 of its largest value. */
static void on_trace(void *user, const char *name, const whale_tensor *t) {
    trace_ctx *ctx = user;
    char key[160];
    snprintf(key, sizeof key, "%s%s", ctx->prefix, name);
    const whale_st_entry *g = whale_st_find(ctx->golden, key);
    if (!g || strcmp(name, "logits") == 0) return;
    long n = (long)whale_shape_numel(t->ndim, t->shape);
    CHECK(g->dtype == WHALE_F32 && g->nbytes == (size_t)n * 4, "%s %s: %zu bytes vs %ld floats", ctx->label, key,
          g->nbytes, n);
    if (g->nbytes != (size_t)n * 4) return;
    double r = test_rel_max(t->data, g->data, n);
    ctx->compared++;
    if (r > ctx->worst) ctx->worst = r;
    CHECK(r <= 1e-5, "%s %s: max |diff| %.3g of max |ref|", ctx->label, key, r);
}

/* ------------------------------------------------------------ one golden case */

static void check_forward(whale_model *m, const whale_st *g, const char *label, float *logits) {
    whale_err err;
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1], V = whale_model_vocab_size(m);
    long nl = (long)B * S * V;
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    trace_ctx ctx = {g, label, "", 0, 0};
    whale_session_set_trace(s, on_trace, &ctx);
    CHECK(whale_session_forward(s, ids_e->data, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
    double r = test_rel_max(logits, test_need_tensor(g, "logits")->data, nl);
    printf("%s: logits %.2g, %d intermediates ≤ %.2g (relative to max |ref|)\n", label, r, ctx.compared, ctx.worst);
    CHECK(r <= 1e-5, "%s logits: max |diff| %.3g of max |logit|", label, r);
    CHECK(ctx.compared >= 10, "%s: only %d traced tensors compared", label, ctx.compared);

    /* decode: a prefill of 5 positions, then one token at a time, against
     * the reference's full forward and ours */
    float *step = malloc(sizeof(float) * (size_t)B * V), *pre = malloc(sizeof(float) * (size_t)B * 5 * V);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * 5);
    const int32_t *ids = ids_e->data;
    const float *ref = test_need_tensor(g, "logits")->data;
    double worst_ref = 0, worst_full = 0;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    for (int b = 0; b < B; b++) memcpy(tok + b * 5, ids + (size_t)b * S, sizeof(int32_t) * 5);
    CHECK(whale_session_forward(s, tok, B, 5, pre, 1, &err) == WHALE_OK, "%s", err.msg);
    for (int b = 0; b < B; b++)
        for (int p = 0; p < 5; p++) {
            const float *got = pre + ((size_t)b * 5 + p) * V;
            worst_ref = fmax(worst_ref, test_rel_max(got, ref + ((size_t)b * S + p) * V, V));
            worst_full = fmax(worst_full, test_rel_max(got, logits + ((size_t)b * S + p) * V, V));
        }
    for (int p = 5; p < S; p++) {
        for (int b = 0; b < B; b++) tok[b] = ids[(size_t)b * S + p];
        CHECK(whale_session_forward(s, tok, B, 1, step, 0, &err) == WHALE_OK, "%s", err.msg);
        for (int b = 0; b < B; b++) {
            worst_ref = fmax(worst_ref, test_rel_max(step + (size_t)b * V, ref + ((size_t)b * S + p) * V, V));
            worst_full = fmax(worst_full, test_rel_max(step + (size_t)b * V, logits + ((size_t)b * S + p) * V, V));
        }
    }
    CHECK(whale_session_cached(s) == S, "cached %d", whale_session_cached(s));
    whale_session_free(s);
    printf("%s: decode vs reference %.2g, vs full forward %.2g\n", label, worst_ref, worst_full);
    CHECK(worst_ref <= 1e-5 && worst_full <= 1e-5, "%s decode: %.3g vs reference, %.3g vs full forward", label,
          worst_ref, worst_full);
    free(step);
    free(pre);
    free(tok);
}

static void check_grads(whale_model *m, const whale_st *g, const char *label) {
    whale_err err;
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids"), *lab_e = test_need_tensor(g, "labels");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1];
    whale_session *s;
    double loss;
    int64_t count;
    CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(s, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK,
          "%s", err.msg);
    float lr = *(const float *)test_need_tensor(g, "loss")->data;
    CHECK(fabs(loss - lr) <= 1e-5 * fabs(lr), "%s loss %.9g vs %.9g", label, loss, lr);
    CHECK(count == whale_count_targets(lab_e->data, B, S), "%s count %lld", label, (long long)count);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < whale_model_num_params(m); i++) {
        char key[160];
        snprintf(key, sizeof key, "grad.%s", whale_model_param_name(m, i));
        const whale_st_entry *e = test_need_tensor(g, key);
        if (!e || e->nbytes != (size_t)test_param_numel(m, i) * 4) continue;
        double r = test_rel_max(whale_session_grad(s, i), e->data, test_param_numel(m, i));
        if (r > worst) worst = r, worst_name = whale_model_param_name(m, i);
    }
    printf("%s: loss %.7f, gradients ≤ %.2g of max |ref| (%s)\n", label, loss, worst, worst_name);
    CHECK(worst <= 1e-4, "%s gradient of %s: max |diff| %.3g of max |ref|", label, worst_name, worst);

    /* the same step again: bit-identical; with recompute: bit-identical */
    size_t n = test_total_params(m);
    float *first = malloc(n * sizeof(float));
    memcpy(first, whale_session_grad(s, 0), n * sizeof(float));
    whale_session_zero_grad(s);
    CHECK(whale_session_train_step(s, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK,
          "%s", err.msg);
    CHECK(memcmp(first, whale_session_grad(s, 0), n * sizeof(float)) == 0, "%s: repeated step differs", label);
    whale_session *rs;
    CHECK(whale_train_session_new(m, B, S, 1, &rs, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(rs, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &count, &err) == WHALE_OK,
          "%s", err.msg);
    CHECK(memcmp(first, whale_session_grad(rs, 0), n * sizeof(float)) == 0, "%s: recompute changed the gradients", label);
    size_t saves_full, saves_re;
    size_t acts_full = whale_session_activation_bytes(s, &saves_full), acts_re = whale_session_activation_bytes(rs, &saves_re);
    CHECK(acts_re + saves_re == acts_full && saves_re > 0, "%s: activations %zu + saved %zu != %zu", label, acts_re,
          saves_re, acts_full);
    whale_session_free(rs);
    whale_session_free(s);
    free(first);
}

/* A row packing two documents (positions restart, attention stays within
 * each) against the reference, then against the documents as their own rows. */
static void check_packed(whale_model *m, const whale_st *g, const char *label) {
    whale_err err;
    const whale_st_entry *ids_e = test_need_tensor(g, "packed.input_ids");
    const int32_t *ids = ids_e->data, *pos = test_need_tensor(g, "packed.position_ids")->data,
                  *seg = test_need_tensor(g, "packed.segment_start")->data, *lab = test_need_tensor(g, "packed.labels")->data;
    int S = (int)ids_e->shape[1], n1 = 0;
    while (n1 < S && seg[n1] == 0) n1++;
    int n2 = S - n1;
    whale_session *s;
    double loss, l1, l2;
    int64_t cnt, c1, c2;
    CHECK(whale_train_session_new(m, 1, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    trace_ctx ctx = {g, label, "packed.", 0, 0};
    whale_session_set_trace(s, on_trace, &ctx);
    CHECK(whale_session_train_step(s, ids, lab, pos, seg, 1, S, 1.0, &loss, &cnt, &err) == WHALE_OK, "%s", err.msg);
    whale_session_set_trace(s, NULL, NULL);
    float lr = *(const float *)test_need_tensor(g, "packed.loss")->data;
    CHECK(ctx.compared == 1 && fabs(loss - lr) <= 1e-5 * fabs(lr), "%s packed: loss %.9g vs %.9g (%d compared)", label,
          loss, lr, ctx.compared);
    size_t n = test_total_params(m);
    float *packed = malloc(n * sizeof(float));
    memcpy(packed, whale_session_grad(s, 0), n * sizeof(float));
    /* the documents alone, each weighted by its share of the targets */
    whale_session_zero_grad(s);
    CHECK(whale_session_train_step(s, ids, NULL, NULL, NULL, 1, n1, (double)(n1 - 1) / (double)cnt, &l1, &c1, &err) ==
              WHALE_OK,
          "%s", err.msg);
    CHECK(whale_session_train_step(s, ids + n1, NULL, NULL, NULL, 1, n2, (double)(n2 - 1) / (double)cnt, &l2, &c2,
                                   &err) == WHALE_OK,
          "%s", err.msg);
    double lsep = (l1 * (double)c1 + l2 * (double)c2) / (double)(c1 + c2), r = test_rel_max(whale_session_grad(s, 0), packed, (long)n);
    printf("%s: packed row vs its documents: loss %.9g vs %.9g, gradients %.2g\n", label, loss, lsep, r);
    CHECK(c1 + c2 == cnt && fabs(lsep - loss) <= 1e-6 * fabs(loss), "%s packed loss %.9g vs separate %.9g", label, loss,
          lsep);
    CHECK(r <= 1e-5, "%s packed gradients differ from separate rows by %.3g", label, r);
    free(packed);
    whale_session_free(s);
}

/* bf16 products: logits and gradients near fp32's. */
static void check_bf16(whale_model *m, const whale_st *g, const char *label, const float *logits32) {
    whale_err err;
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids"), *lab_e = test_need_tensor(g, "labels");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1], V = whale_model_vocab_size(m);
    long nl = (long)B * S * V;
    size_t n = test_total_params(m);
    float *lg = malloc(sizeof(float) * (size_t)nl), *g32 = malloc(n * sizeof(float));
    whale_session *s;
    double loss;
    int64_t cnt;
    CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(s, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK,
          "%s", err.msg);
    memcpy(g32, whale_session_grad(s, 0), n * sizeof(float));
    whale_session_free(s);
    CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids_e->data, B, S, lg, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
    double rl = test_rel_max(lg, logits32, nl);
    CHECK(whale_train_session_new(m, B, S, 0, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_train_step(s, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK,
          "%s", err.msg);
    double rg = test_rel_norm(whale_session_grad(s, 0), g32, (long)n);
    whale_session_free(s);
    CHECK(whale_model_set_dtype(m, WHALE_F32, &err) == WHALE_OK, "%s", err.msg);
    printf("%s: bf16 vs fp32: logits %.2g of max |logit|, gradients %.2g (norm-relative)\n", label, rl, rg);
    CHECK(rl <= 3e-2 && rg <= 5e-2, "%s bf16: logits %.3g, gradients %.3g from fp32", label, rl, rg);
    free(lg);
    free(g32);
}

static void check_case(const char *name) {
    char dir[512], golden[600];
    snprintf(dir, sizeof dir, "%s/%s", WHALE_TEST_DATA, name);
    snprintf(golden, sizeof golden, "%s/golden.safetensors", dir);
    whale_err err;
    whale_model *m;
    whale_st *g;
    if (whale_model_load(dir, &m, &err) || whale_st_open(golden, &g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int32_t eos[8];
    CHECK(!strcmp(whale_model_family(m), "dense") && !strcmp(whale_model_type(m), "qwen2") && whale_model_eos_ids(m, eos, 8) == 2 && eos[0] == 1 &&
              eos[1] == 2,
          "%s: family and eos list", name);
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids");
    float *logits = malloc(sizeof(float) * (size_t)(ids_e->shape[0] * ids_e->shape[1]) * whale_model_vocab_size(m));
    check_forward(m, g, name, logits);
    check_grads(m, g, name);
    check_packed(m, g, name);
    check_bf16(m, g, name, logits);
    free(logits);
    whale_st_close(g);
    whale_model_free(m);
}

/* ------------------------------------------------------------ LoRA */

static void forward_all(whale_model *m, const int32_t *ids, int B, int S, float *logits) {
    whale_err err;
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_free(s);
}

static void check_lora(void) {
    whale_err err;
    whale_model *m;
    if (whale_model_init("qwen2-tiny", 3, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int n_base = whale_model_num_params(m), V = whale_model_vocab_size(m), L = 0;
    int64_t want = 0;
    const int rank = 4;
    for (int i = 0; i < n_base; i++) { /* the seven projections of every layer, by shape */
        const char *nm = whale_model_param_name(m, i);
        whale_tensor t = whale_model_param(m, i);
        static const char *const mods[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                           "gate_proj.weight", "up_proj.weight", "down_proj.weight"};
        for (int k = 0; k < 7; k++)
            if (strstr(nm, mods[k])) want += (int64_t)rank * (t.shape[0] + t.shape[1]);
        L += strstr(nm, "input_layernorm") != NULL;
    }
    whale_lora_config cfg = whale_lora_defaults();
    cfg.rank = rank;
    cfg.dropout = 0;
    CHECK(whale_lora_attach(m, &cfg, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_lora_count(m) == 7 * L, "all-linear: %d adapters for %d layers", whale_lora_count(m), L);
    CHECK(whale_lora_num_params(m) == want, "LoRA parameters %lld, expected %lld", (long long)whale_lora_num_params(m),
          (long long)want);
    for (int i = n_base; i < whale_model_num_params(m); i++) {
        const char *nm = whale_model_param_name(m, i);
        CHECK(!strstr(nm, "embed_tokens") && !strstr(nm, "lm_head") && !strstr(nm, "norm") && !strstr(nm, "bias"),
              "adapter on %s", nm);
    }

    /* train the adapters a little (B starts at zero), base frozen */
    enum { B = 2, S = 10 };
    int32_t ids[B * S];
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    whale_session *ts;
    whale_optimizer *o;
    double loss;
    int64_t cnt;
    whale_adamw_config ac = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
    CHECK(whale_train_session_new(m, B, S, 0, &ts, &err) == WHALE_OK && whale_adamw_new(m, &ac, &o, &err) == WHALE_OK,
          "%s", err.msg);
    for (int i = 0; i < n_base; i++) {
        const whale_param *p = &m->params[i];
        CHECK((whale_session_grad(ts, i) == NULL) == whale_param_is_product_weight(p), "%s: gradient buffer", p->name);
    }
    whale_tensor wq = whale_model_param(m, 1);
    long nq = (long)whale_shape_numel(wq.ndim, wq.shape);
    float *before = malloc(sizeof(float) * (size_t)nq);
    memcpy(before, wq.data, sizeof(float) * (size_t)nq);
    double first = 0;
    for (int k = 0; k < 5; k++) {
        whale_session_zero_grad(ts);
        CHECK(whale_session_train_step(ts, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK, "%s",
              err.msg);
        if (!k) first = loss;
        whale_adamw_step(o, ts, 1e-2);
    }
    CHECK(loss < first, "LoRA training lowers the loss: %.4f → %.4f", first, loss);
    CHECK(memcmp(before, whale_model_param(m, 1).data, sizeof(float) * (size_t)nq) == 0, "a frozen base weight changed");
    whale_optimizer_free(o);
    whale_session_free(ts);

    float *adapted = malloc(sizeof(float) * B * S * V), *merged = malloc(sizeof(float) * B * S * V);
    forward_all(m, ids, B, S, adapted);
    CHECK(whale_lora_merge(m, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_lora_count(m) == 0 && whale_model_num_params(m) == n_base, "merge drops the adapters");
    forward_all(m, ids, B, S, merged);
    double r = test_rel_max(merged, adapted, (long)B * S * V);
    printf("qwen2-tiny LoRA: %d adapters, %lld parameters; merged vs adapted logits %.2g\n", 7 * L, (long long)want, r);
    CHECK(r <= 1e-5, "merged logits differ from the adapted ones by %.3g", r);
    free(before);
    free(adapted);
    free(merged);
    whale_model_free(m);
}

/* A PEFT adapter folder (tests/reference/gen_qwen2_lora.py) on qwen2-gqa2,
 * against the reference's hand-written LoRA: adapted logits (≤ 1e-5 of the
 * largest), loss and every adapter's gradient with the base frozen (≤ 1e-4
 * norm-relative per tensor); golden names are prefix + "logits", "loss",
 * "grad.<adapter file key>". */
static void check_lora_pass(whale_model *m, const whale_st *g, const char *prefix, const char *label) {
    whale_err err;
    char key[256];
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids"), *lab_e = test_need_tensor(g, "labels");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1], V = whale_model_vocab_size(m);
    long nl = (long)B * S * V;
    float *logits = malloc(sizeof(float) * (size_t)nl);
    forward_all(m, ids_e->data, B, S, logits);
    snprintf(key, sizeof key, "%slogits", prefix);
    double rl = test_rel_max(logits, test_need_tensor(g, key)->data, nl);
    CHECK(rl <= 1e-5, "%s logits: max |diff| %.3g of max |logit|", label, rl);
    free(logits);

    whale_session *ts;
    double loss;
    int64_t cnt;
    CHECK(whale_train_session_new(m, B, S, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    if (!ts) return;
    whale_session_zero_grad(ts);
    CHECK(whale_session_train_step(ts, ids_e->data, lab_e->data, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK,
          "%s", err.msg);
    snprintf(key, sizeof key, "%sloss", prefix);
    float lref = *(const float *)test_need_tensor(g, key)->data;
    CHECK(fabs(loss - lref) <= 1e-5 * fabs(lref), "%s loss %.9g vs %.9g", label, loss, lref);
    CHECK(cnt == whale_count_targets(lab_e->data, B, S), "%s: %lld targets", label, (long long)cnt);
    int n_base = whale_model_num_params(m) - 2 * whale_lora_count(m), compared = 0;
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < whale_model_num_params(m); i++) {
        if (i < n_base) { /* frozen base: only non-product parameters may keep a buffer */
            CHECK(whale_session_grad(ts, i) == NULL || !whale_param_is_product_weight(&m->params[i]),
                  "%s: frozen %s has a gradient buffer", label, whale_model_param_name(m, i));
            continue;
        }
        snprintf(key, sizeof key, "%sgrad.base_model.model.%s", prefix, whale_model_param_name(m, i));
        const whale_st_entry *e = test_need_tensor(g, key);
        if (!e || e->nbytes != (size_t)test_param_numel(m, i) * 4) continue;
        double r = test_rel_norm(whale_session_grad(ts, i), e->data, test_param_numel(m, i));
        compared++;
        if (r > worst) worst = r, worst_name = whale_model_param_name(m, i);
    }
    printf("%s: logits %.2g of max |logit|, loss %.7f (|diff| %.2g), %d adapter gradients ≤ %.2g (%s)\n", label, rl,
           loss, fabs(loss - lref), compared, worst, worst_name);
    CHECK(compared == 2 * whale_lora_count(m), "%s: %d adapter gradients compared", label, compared);
    CHECK(worst <= 1e-4, "%s adapter gradient %s: %.3g norm-relative", label, worst_name, worst);
    whale_session_free(ts);
}

static void check_lora_reference(void) {
    char base[512], adir[600], rsdir[700], gpath[700];
    snprintf(base, sizeof base, "%s/qwen2-gqa2", WHALE_TEST_DATA);
    snprintf(adir, sizeof adir, "%s/qwen2-lora", WHALE_TEST_DATA);
    snprintf(rsdir, sizeof rsdir, "%s/rslora", adir);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", adir);
    whale_err err;
    whale_model *m;
    whale_st *g;
    if (whale_st_open(gpath, &g, &err) || whale_model_load(base, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int n_base = whale_model_num_params(m), V = whale_model_vocab_size(m);
    CHECK(whale_lora_load(m, adir, &err) == WHALE_OK, "%s", err.msg);
    const whale_lora_config *c = whale_lora_get_config(m);
    CHECK(whale_lora_count(m) == 14 && whale_lora_num_params(m) == 7424 && c && c->rank == 4 && c->alpha == 8.0 &&
              c->dropout == 0.0 && !c->use_rslora,
          "qwen2-lora: %d adapters, %lld parameters", whale_lora_count(m), (long long)whale_lora_num_params(m));
    check_lora_pass(m, g, "", "qwen2-lora");

    /* merged: the adapted model's logits without adapters */
    const whale_st_entry *ids_e = test_need_tensor(g, "input_ids");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1];
    long nl = (long)B * S * V;
    float *merged = malloc(sizeof(float) * (size_t)nl);
    CHECK(whale_lora_merge(m, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_lora_count(m) == 0 && whale_model_num_params(m) == n_base, "merge drops the adapters");
    forward_all(m, ids_e->data, B, S, merged);
    double rm = test_rel_max(merged, test_need_tensor(g, "merged_logits")->data, nl);
    printf("qwen2-lora merged: logits %.2g of max |logit|\n", rm);
    CHECK(rm <= 1e-5, "merged logits: max |diff| %.3g of max |logit|", rm);
    free(merged);
    whale_model_free(m);

    /* rsLoRA: the same tensors, scale alpha / sqrt(r) = 4 instead of 2 */
    if (whale_model_load(base, &m, &err)) {
        CHECK(0, "%s", err.msg);
    } else {
        CHECK(whale_lora_load(m, rsdir, &err) == WHALE_OK, "%s", err.msg);
        c = whale_lora_get_config(m);
        CHECK(c && c->use_rslora, "rslora/adapter_config.json: use_rslora not read");
        check_lora_pass(m, g, "rslora.", "qwen2-lora rsLoRA");
        whale_model_free(m);
    }
    whale_st_close(g);
}

/* ------------------------------------------------------------ files */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Save → load (tied: no lm_head.weight in the file), a bf16 load without
 * fp32 weights, generation_config.json's eos ids, and a checkpoint split in
 * two shards: it loads, then a missing shard and an index escaping the
 * folder are refused with messages naming the files. */
static void check_files(void) {
    whale_err err;
    whale_model *m, *m2;
    char tmp[512], dir[600], path[700];
    test_tmpdir("qwen2", tmp, sizeof tmp);
    if (whale_model_init("qwen2-tiny", 5, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    enum { B = 1, S = 9 };
    int V = whale_model_vocab_size(m);
    int32_t ids[S] = {5, 77, 3, 400, 12, 12, 9, 250, 31};
    float *a = malloc(sizeof(float) * S * V), *b = malloc(sizeof(float) * S * V);
    forward_all(m, ids, B, S, a);

    snprintf(dir, sizeof dir, "%s/single", tmp);
    CHECK(whale_model_save(m, dir, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_model_load(dir, &m2, &err) == WHALE_OK, "%s", err.msg);
    if (m2) {
        forward_all(m2, ids, B, S, b);
        CHECK(memcmp(a, b, sizeof(float) * S * V) == 0, "save → load changes the logits");
        char *json = NULL;
        CHECK(whale_model_config_json(m2, &json, &err) == WHALE_OK && strstr(json, "\"Qwen2ForCausalLM\"") &&
                  strstr(json, "\"model_type\":\"qwen2\"") && strstr(json, "\"tie_word_embeddings\":true") &&
                  strstr(json, "\"rms_norm_eps\":1e-06"),
              "config.json: %s", json ? json : err.msg);
        free(json);
        for (int i = 0; i < whale_model_num_params(m2); i++)
            CHECK(strcmp(whale_model_param_name(m2, i), "lm_head.weight") != 0, "a tied model has no lm_head.weight");
        whale_model_free(m2);
    }
    /* bf16 and int8 without fp32 weights: the embedding rows and the tied
     * lm_head read the copy (the fp32 pointers are inaccessible handles) */
    const whale_dtype lowp[2] = {WHALE_BF16, WHALE_I8};
    for (int k = 0; k < 2; k++) {
        CHECK(whale_model_load_as(dir, lowp[k], &m2, &err) == WHALE_OK, "%s", err.msg);
        if (!m2) continue;
        forward_all(m2, ids, B, S, b);
        double r = test_rel_max(b, a, (long)S * V);
        CHECK(!whale_model_has_master(m2) && r <= 3e-2, "%s load: logits %.3g from fp32", whale_dtype_name(lowp[k]),
              r);
        whale_model_free(m2);
    }
    /* LoRA on that bf16 base: the adapters train, the base has no gradient */
    CHECK(whale_model_load_as(dir, WHALE_BF16, &m2, &err) == WHALE_OK, "%s", err.msg);
    if (m2) {
        whale_lora_config cfg = whale_lora_defaults();
        whale_session *ts = NULL;
        whale_optimizer *o = NULL;
        whale_adamw_config ac = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
        double loss, first = 0;
        int64_t cnt;
        CHECK(whale_lora_attach(m2, &cfg, &err) == WHALE_OK && whale_train_session_new(m2, B, S, 0, &ts, &err) == WHALE_OK &&
                  whale_adamw_new(m2, &ac, &o, &err) == WHALE_OK,
              "%s", err.msg);
        for (int k = 0; ts && o && k < 4; k++) {
            whale_session_zero_grad(ts);
            CHECK(whale_session_train_step(ts, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK, "%s",
                  err.msg);
            if (!k) first = loss;
            whale_adamw_step(o, ts, 1e-2);
        }
        CHECK(loss < first, "LoRA on a bf16 base: loss %.4f → %.4f", first, loss);
        whale_optimizer_free(o);
        whale_session_free(ts);
        whale_model_free(m2);
    }
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    write_text(path, "{\"eos_token_id\": [7, 1], \"temperature\": 0.7}");
    CHECK(whale_model_load(dir, &m2, &err) == WHALE_OK, "%s", err.msg);
    if (m2) {
        int32_t eos[8];
        int n = whale_model_eos_ids(m2, eos, 8);
        CHECK(n == 2 && eos[0] == 7 && eos[1] == 1, "generation_config eos: %d ids", n);
        whale_model_free(m2);
    }

    /* a tied checkpoint that also stores lm_head.weight (as some exporters
     * do) loads: transformers ties it back and ignores the copy */
    snprintf(dir, sizeof dir, "%s/tied-with-head", tmp);
    CHECK(whale_model_save(m, dir, &err) == WHALE_OK, "%s", err.msg);
    {
        int n = whale_model_num_params(m);
        whale_st_item *items = calloc((size_t)n + 1, sizeof *items);
        whale_tensor *ts = calloc((size_t)n, sizeof *ts); /* the items point at their shapes */
        for (int i = 0; i < n; i++) {
            ts[i] = whale_model_param(m, i);
            items[i] = (whale_st_item){whale_model_param_name(m, i), WHALE_F32, ts[i].ndim, ts[i].shape, ts[i].data};
            if (strstr(items[i].name, "embed_tokens")) items[n] = items[i], items[n].name = "lm_head.weight";
        }
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(whale_st_write(path, items, n + 1, NULL, &err) == WHALE_OK, "%s", err.msg);
        free(items);
        free(ts);
        CHECK(whale_model_load(dir, &m2, &err) == WHALE_OK, "tied + lm_head.weight: %s", err.msg);
        if (m2) {
            forward_all(m2, ids, B, S, b);
            CHECK(memcmp(a, b, sizeof(float) * S * V) == 0, "the ignored lm_head copy changed the logits");
            whale_model_free(m2);
        }
    }

    /* two shards */
    snprintf(dir, sizeof dir, "%s/sharded", tmp);
    CHECK(whale_model_save(m, dir, &err) == WHALE_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    int n = whale_model_num_params(m), half = n / 2;
    whale_st_item *items = calloc((size_t)n, sizeof *items);
    for (int i = 0; i < n; i++) {
        whale_tensor t = whale_model_param(m, i);
        items[i] = (whale_st_item){whale_model_param_name(m, i), t.dtype, t.ndim, m->params[i].shape, t.data};
    }
    const char *shard[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, shard[k]);
        CHECK(whale_st_write(path, items + (k ? half : 0), k ? n - half : half, NULL, &err) == WHALE_OK, "%s", err.msg);
    }
    size_t cap = 256 + (size_t)n * 160, len = 0;
    char *index = malloc(cap);
    len += (size_t)snprintf(index + len, cap - len, "{\"metadata\": {\"total_size\": %zu}, \"weight_map\": {",
                            test_total_params(m) * 4);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(index + len, cap - len, "%s\"%s\": \"%s\"", i ? ", " : "", items[i].name,
                                shard[i >= half]);
    snprintf(index + len, cap - len, "}}");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_text(path, index);
    CHECK(whale_model_load(dir, &m2, &err) == WHALE_OK, "%s", err.msg);
    if (m2) {
        forward_all(m2, ids, B, S, b);
        CHECK(memcmp(a, b, sizeof(float) * S * V) == 0, "the sharded checkpoint gives other logits");
        whale_model_free(m2);
    }
    /* the same shards in BF16, run in bf16: used in place from both files
     * (mapped, no copy), the logits of the single-file bf16 load */
    {
        char single[600], dir16[640];
        snprintf(single, sizeof single, "%s/single", tmp);
        snprintf(dir16, sizeof dir16, "%s/sharded-bf16", tmp);
        whale_model *m16 = NULL, *s16 = NULL;
        CHECK(whale_model_load_as(single, WHALE_BF16, &m16, &err) == WHALE_OK, "%s", err.msg);
        CHECK(whale_model_save(m16, dir16, &err) == WHALE_OK, "%s", err.msg); /* config + a BF16 single file */
        snprintf(path, sizeof path, "%s/model.safetensors", dir16);
        unlink(path);
        whale_tensor *ts = calloc((size_t)n, sizeof *ts);
        whale_st_item *it16 = calloc((size_t)n, sizeof *it16);
        for (int i = 0; i < n; i++) {
            ts[i] = whale_model_param(m16, i);
            it16[i] = (whale_st_item){whale_model_param_name(m16, i), ts[i].dtype, ts[i].ndim, m16->params[i].shape,
                                      ts[i].data};
        }
        for (int k = 0; k < 2; k++) {
            snprintf(path, sizeof path, "%s/%s", dir16, shard[k]);
            CHECK(whale_st_write(path, it16 + (k ? half : 0), k ? n - half : half, NULL, &err) == WHALE_OK, "%s",
                  err.msg);
        }
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir16);
        write_text(path, index);
        float *c16 = malloc(sizeof(float) * S * V);
        forward_all(m16, ids, B, S, c16);
        CHECK(whale_model_load_as(dir16, WHALE_BF16, &s16, &err) == WHALE_OK, "%s", err.msg);
        if (s16) {
            whale_memory mm;
            whale_memory_of_model(s16, &mm);
            forward_all(s16, ids, B, S, b);
            CHECK(mm.weights_mapped > 0 && mm.weights_lowp == 0 && !whale_model_has_master(s16),
                  "sharded BF16 in bf16: %zu bytes mapped, %zu copied", mm.weights_mapped, mm.weights_lowp);
            CHECK(memcmp(c16, b, sizeof(float) * S * V) == 0, "sharded BF16 gives other logits than one BF16 file");
            whale_model_free(s16);
        }
        free(c16);
        free(ts);
        free(it16);
        whale_model_free(m16);
    }

    snprintf(path, sizeof path, "%s/%s", dir, shard[1]);
    unlink(path);
    whale_code c = whale_model_load(dir, &m2, &err);
    CHECK(c == WHALE_ERR_IO && strstr(err.msg, shard[1]) && !strchr(err.msg, '\n'), "missing shard: %d \"%s\"", (int)c,
          err.msg);
    char *esc = strstr(index, shard[1]);
    while (esc) { /* the second shard's entries now point outside the folder */
        memcpy(esc, "../x", 4);
        esc = strstr(esc + 4, shard[1]);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_text(path, index);
    c = whale_model_load(dir, &m2, &err);
    CHECK(c == WHALE_ERR_FORMAT && strstr(err.msg, "not a plain file name") && strstr(err.msg, "index.json"),
          "index escaping the folder: %d \"%s\"", (int)c, err.msg);
    free(index);
    free(items);
    free(a);
    free(b);
    whale_model_free(m);
}

/* whale_model_own_weights (how the inference commands hold a checkpoint)
 * gives the logits of the same model read in place from the file, bit for
 * bit, with nothing left mapped: fp32; fp32 masters with bf16 copies (found
 * by the moved fp32 addresses); a BF16 checkpoint in bf16; one with a
 * product weight left in F32 (copies partly owned, partly mapped); int8
 * from fp32 (only the norms move). */
static void check_own_weights(void) {
    whale_err err;
    whale_model *m = NULL, *m16 = NULL;
    char tmp[512], f32[600], b16[600], mixed[600], path[700];
    test_tmpdir("qwen2-own", tmp, sizeof tmp);
    snprintf(f32, sizeof f32, "%s/f32", tmp);
    snprintf(b16, sizeof b16, "%s/bf16", tmp);
    snprintf(mixed, sizeof mixed, "%s/mixed", tmp);
    CHECK(whale_model_init("qwen2-tiny", 9, &m, &err) == WHALE_OK && whale_model_save(m, f32, &err) == WHALE_OK &&
              whale_model_load_as(f32, WHALE_BF16, &m16, &err) == WHALE_OK &&
              whale_model_save(m16, b16, &err) == WHALE_OK && whale_model_save(m16, mixed, &err) == WHALE_OK,
          "%s", err.msg);
    if (!m16) {
        whale_model_free(m);
        return;
    }
    int n = whale_model_num_params(m16), replaced = 0;
    whale_tensor *ts = calloc((size_t)n, sizeof *ts);
    whale_st_item *items = calloc((size_t)n, sizeof *items);
    for (int i = 0; i < n; i++) {
        ts[i] = whale_model_param(m16, i);
        if (ts[i].dtype == WHALE_BF16 && !replaced++) ts[i] = whale_model_param(m, i); /* one product weight in F32 */
        items[i] = (whale_st_item){whale_model_param_name(m16, i), ts[i].dtype, ts[i].ndim, m16->params[i].shape,
                                   ts[i].data};
    }
    snprintf(path, sizeof path, "%s/model.safetensors", mixed);
    CHECK(whale_st_write(path, items, n, NULL, &err) == WHALE_OK, "%s", err.msg);
    free(items);
    free(ts);
    whale_model_free(m16);
    whale_model_free(m);

    enum { B = 1, S = 7 };
    const int32_t ids[S] = {3, 91, 400, 17, 17, 250, 8};
    const struct {
        const char *dir;
        whale_dtype load, run;
        int mapped_copies;
    } cases[] = {{f32, WHALE_F32, WHALE_F32, 0},
                 {f32, WHALE_F32, WHALE_BF16, 0},
                 {b16, WHALE_BF16, WHALE_BF16, 1},
                 {mixed, WHALE_BF16, WHALE_BF16, 1},
                 {f32, WHALE_I8, WHALE_I8, 0}};
    for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        whale_model *x = NULL;
        whale_code c = cases[k].load == WHALE_F32 ? whale_model_load(cases[k].dir, &x, &err)
                                                  : whale_model_load_as(cases[k].dir, cases[k].load, &x, &err);
        if (!c && cases[k].run != cases[k].load) c = whale_model_set_dtype(x, cases[k].run, &err);
        CHECK(!c, "case %d: %s", k, err.msg);
        if (c) {
            whale_model_free(x);
            continue;
        }
        int V = whale_model_vocab_size(x);
        float *a = malloc(sizeof(float) * S * V), *b = malloc(sizeof(float) * S * V);
        whale_memory before, after;
        whale_memory_of_model(x, &before);
        forward_all(x, ids, B, S, a);
        CHECK(whale_model_own_weights(x, &err) == WHALE_OK, "case %d: %s", k, err.msg);
        whale_memory_of_model(x, &after);
        forward_all(x, ids, B, S, b);
        CHECK(!x->source && !after.weights_mapped && !!before.weights_mapped == cases[k].mapped_copies &&
                  after.weights_lowp == before.weights_lowp + before.weights_mapped &&
                  after.weights_f32 == before.weights_f32,
              "case %d: source %p, mapped %zu → %zu, copies %zu → %zu", k, (void *)x->source, before.weights_mapped,
              after.weights_mapped, before.weights_lowp, after.weights_lowp);
        CHECK(memcmp(a, b, sizeof(float) * S * V) == 0, "case %d: owned weights give other logits", k);
        if (cases[k].dir == mixed)
            CHECK(before.weights_lowp > 0, "the mixed checkpoint has no converted copy");
        free(a);
        free(b);
        whale_model_free(x);
    }
}

/* ------------------------------------------------------------ configs */

static void check_bad_configs(void) {
    static const struct {
        const char *overrides, *expect;
        whale_code code;
    } cases[] = {
        {"{\"use_sliding_window\": true}", "sliding-window attention is not supported", WHALE_ERR_UNSUPPORTED},
        {"{\"layer_types\": [\"full_attention\", \"sliding_attention\"]}", "sliding-window attention is not supported",
         WHALE_ERR_UNSUPPORTED},
        {"{\"rope_scaling\": {\"type\": \"longrope\", \"factor\": 4.0}}",
         "rope_scaling: rope_type \"longrope\" is not supported", WHALE_ERR_UNSUPPORTED},
        {"{\"rope_scaling\": {\"rope_type\": \"dynamic\"}}", "rope_scaling: missing required field \"factor\"",
         WHALE_ERR_FORMAT},
        {"{\"rope_parameters\": {\"rope_theta\": 1e6, \"rope_type\": \"mrope\"}}",
         "rope_parameters: rope_type \"mrope\" is not supported", WHALE_ERR_UNSUPPORTED},
        {"{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}",
         "rope_scaling: missing required field \"original_max_position_embeddings\"", WHALE_ERR_FORMAT},
        {"{\"num_key_value_heads\": 3}", "num_key_value_heads (3) must divide num_attention_heads (4)",
         WHALE_ERR_FORMAT},
        {"{\"hidden_size\": 66}", "hidden_size (66) must be divisible by num_attention_heads (4)", WHALE_ERR_FORMAT},
        {"{\"rope_theta\": null}", "missing required field \"rope_theta\"", WHALE_ERR_FORMAT},
        {"{\"tie_word_embeddings\": null}", "missing required field \"tie_word_embeddings\"", WHALE_ERR_FORMAT},
        {"{\"intermediate_size\": 0}", "\"intermediate_size\" = 0 is out of range", WHALE_ERR_FORMAT},
        {"{\"eos_token_id\": [1, 512]}", "eos_token_id 512 is outside the vocabulary", WHALE_ERR_FORMAT},
        {"{\"hidden_act\": \"gelu\"}", "hidden_act \"gelu\" is not supported", WHALE_ERR_UNSUPPORTED},
        {"{\"attention_dropout\": 0.1}", "attention_dropout", WHALE_ERR_UNSUPPORTED},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        whale_err err = {0};
        whale_model *m = NULL;
        whale_code c = whale_model_init_config("qwen2-tiny", cases[k].overrides, 1, &m, &err);
        CHECK(c == cases[k].code && strstr(err.msg, cases[k].expect) && strncmp(err.msg, "qwen2-tiny: ", 12) == 0 &&
                  !m,
              "%s: got %d \"%s\"", cases[k].overrides, (int)c, err.msg);
        whale_model_free(m);
    }
    /* accepted: fields the model does not use, an explicit head_dim, the
     * default K/V heads, an eos list */
    whale_err err;
    whale_model *m;
    CHECK(whale_model_init_config("qwen2-tiny",
                                  "{\"torch_dtype\": \"bfloat16\", \"something_new\": [1], \"head_dim\": 32, "
                                  "\"num_key_value_heads\": null, \"eos_token_id\": [1, 2]}",
                                  1, &m, &err) == WHALE_OK,
          "%s", err.msg);
    if (m) {
        CHECK(whale_model_param(m, 1).shape[0] == 128 && whale_model_param(m, 3).shape[0] == 128,
              "head_dim 32 × 4 heads, 4 K/V heads");
        whale_model_free(m);
    }
    CHECK(whale_model_init("no-such-preset", 1, &m, &err) == WHALE_ERR_ARG && strstr(err.msg, "qwen2.5-7b"),
          "unknown preset: %s", err.msg);
}

/* ------------------------------------------------------------ shapes and memory */

static void check_sizes(void) {
    static const struct {
        const char *preset;
        int64_t params, lora8;
    } real[] = {{"qwen2.5-7b", 7615616512LL, 20185088}, {"qwen2.5-0.5b", 494032768LL, 4399104}};
    for (int k = 0; k < 2; k++) {
        whale_err err;
        whale_model *m;
        if (whale_model_skeleton(real[k].preset, &m, &err)) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        int targets = 0, layers = 0;
        for (int i = 0; i < whale_model_num_params(m); i++) {
            targets += whale_lora_is_target(&m->params[i], "all-linear");
            layers += strstr(m->params[i].name, "input_layernorm") != NULL;
        }
        CHECK(whale_model_param_count(m) == real[k].params, "%s: %lld parameters", real[k].preset,
              (long long)whale_model_param_count(m));
        CHECK(targets == 7 * layers, "%s: %d all-linear targets in %d layers", real[k].preset, targets, layers);
        whale_model_free(m);
        whale_memory est;
        whale_memory_plan plan = {.dtype = WHALE_BF16, .train = WHALE_TRAIN_LORA, .lora_rank = 8, .batch = 1,
                                  .seq_len = 512, .recompute = 1};
        CHECK(whale_memory_estimate(real[k].preset, &plan, &est, &err) == WHALE_OK, "%s", err.msg);
        CHECK(est.trainable == real[k].lora8, "%s LoRA rank 8: %lld trainable", real[k].preset,
              (long long)est.trainable);
        printf("%s: %lld parameters, LoRA rank 8 all-linear %lld; bf16 LoRA 1 × 512 estimate %.0f MiB\n",
               real[k].preset, (long long)real[k].params, (long long)est.trainable, est.total / 1048576.0);
    }
    /* the estimate sizes the same buffers the sessions allocate */
    /* (bf16 training keeps its activations in bf16: other sizes) */
    for (int bf = 0; bf < 2; bf++)
    for (int training = 0; training < 2; training++)
        for (int recompute = 0; recompute <= training; recompute++) {
            whale_err err;
            whale_model *m;
            whale_session *s;
            CHECK(whale_model_init("qwen2-tiny", 1, &m, &err) == WHALE_OK, "%s", err.msg);
            if (bf) CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK, "%s", err.msg);
            whale_code c = training ? whale_train_session_new(m, 2, 24, recompute, &s, &err)
                                    : whale_session_new(m, 2, 24, &s, &err);
            CHECK(c == WHALE_OK, "%s", err.msg);
            whale_memory live, est;
            whale_memory_of_model(m, &live);
            whale_memory_add_session(&live, s);
            whale_memory_plan plan = {.dtype = bf ? WHALE_BF16 : WHALE_F32, .train = training ? WHALE_TRAIN_FULL : WHALE_TRAIN_NONE,
                                      .batch = 2, .seq_len = 24, .recompute = recompute};
            CHECK(whale_memory_estimate("qwen2-tiny", &plan, &est, &err) == WHALE_OK, "%s", err.msg);
            /* (a bf16 inference run holds no fp32 weights; this model kept them) */
            CHECK((est.weights_f32 == live.weights_f32 || (bf && !training)) && est.activations == live.activations &&
                      est.kv_cache == live.kv_cache && est.workspace == live.workspace && est.grads == live.grads,
                  "bf16=%d training=%d recompute=%d: estimate %zu/%zu/%zu/%zu/%zu vs live %zu/%zu/%zu/%zu/%zu", bf,
                  training, recompute, est.weights_f32, est.activations, est.kv_cache, est.workspace, est.grads, live.weights_f32,
                  live.activations, live.kv_cache, live.workspace, live.grads);
            whale_session_free(s);
            whale_model_free(m);
        }
}

int main(void) {
    check_case("qwen2-gqa1");
    check_case("qwen2-gqa2");
    check_case("qwen2-gqa7");
    check_lora();
    check_lora_reference();
    check_files();
    check_own_weights();
    check_bad_configs();
    check_sizes();
    return test_finish("test_qwen2");
}
