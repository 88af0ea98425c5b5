/* LoRA on a frozen int8 base (weights W[n,k] = q[n,k]·scale[n], adapters
 * fp32): the loss and the adapters' gradients follow those of the same
 * adapters on the fp32 base within the int8 weight error; the input
 * gradient through an int8 weight is what the bf16 policy defines,
 * bf16(dC ⊙ scale)·q with fp32 sums, against a double-precision reference
 * (one and several conversion blocks, oneDNN and our kernels, with and
 * without accumulation, with the adapters' term added); three AdamW steps
 * lower the loss and leave every base tensor (values and scales) bit for
 * bit; full training of an int8 model is refused. */
#include "testutil.h"

#include "backend/backend.h"

#include "whale_safetensors.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "models/model.h"
#include "train/step.h"
#include "whale.h"
#include "whale_lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const REFUSAL = "attach LoRA adapters to an int8 base";

static whale_model *load(whale_dtype dt) {
    char dir[512];
    whale_err err;
    whale_model *m = NULL;
    snprintf(dir, sizeof dir, "%s/tiny", WHALE_TEST_DATA);
    whale_code c = dt == WHALE_F32 ? whale_model_load(dir, &m, &err) : whale_model_load_as(dir, dt, &m, &err);
    CHECK(c == WHALE_OK, "%s", err.msg);
    return m;
}

static int param_index(const whale_model *m, const char *name) {
    for (int i = 0; i < whale_model_num_params(m); i++)
        if (!strcmp(whale_model_param_name(m, i), name)) return i;
    return -1;
}

static void fill(float *x, long n, unsigned seed, float amp) {
    whale_rng r;
    whale_rng_seed(&r, seed);
    for (long i = 0; i < n; i++) x[i] = (2.0f * whale_rng_uniform(&r) - 1.0f) * amp;
}

/* Relative RMS error of the int8 weights against the fp32 ones, over every
 * product weight of the model. */
static double int8_weight_error(const whale_model *m32, const whale_model *mi8) {
    double d = 0, r = 0;
    int n_base = mi8->n_lora ? mi8->n_base_params : mi8->n_params;
    for (int i = 0; i < n_base; i++) {
        const whale_param *p = &mi8->params[i];
        if (!whale_param_is_product_weight(p)) continue;
        int64_t rows = p->shape[0], cols = p->shape[1];
        float *row = malloc(sizeof(float) * (size_t)cols);
        const float *w = m32->params[i].data;
        for (int64_t o = 0; o < rows; o++) {
            whale_model_row(mi8, p->data, o, cols, row);
            for (int64_t c = 0; c < cols; c++) {
                double e = (double)row[c] - w[o * cols + c];
                d += e * e;
                r += (double)w[o * cols + c] * w[o * cols + c];
            }
        }
        free(row);
    }
    return sqrt(d / r);
}

/* Loss and adapter gradients of one step of m on B rows of the golden batch
 * starting at row r0; grads receives every adapter gradient in parameter
 * order. */
static double adapter_step(whale_model *m, const whale_st_entry *eids, const whale_st_entry *elab, int r0, int B,
                           float *grads) {
    whale_err err;
    whale_session *ts;
    int S = (int)eids->shape[1];
    double loss = NAN;
    int64_t cnt;
    CHECK(whale_train_session_new(m, B, S, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    whale_session_zero_grad(ts);
    CHECK(whale_session_train_step(ts, (const int32_t *)eids->data + r0 * S, (const int32_t *)elab->data + r0 * S, NULL,
                                   NULL, B, S, 1.0, &loss, &cnt, &err) == WHALE_OK,
          "%s", err.msg);
    size_t off = 0;
    for (int i = m->n_base_params; i < m->n_params; i++) {
        size_t n = (size_t)whale_shape_numel(2, m->params[i].shape);
        memcpy(grads + off, whale_session_grad(ts, i), n * sizeof(float));
        off += n;
    }
    whale_session_free(ts);
    return loss;
}

/* Relative error of the adapter gradients g against g0, all together and
 * of the worst tensor. */
static void grad_errors(const whale_model *m, const float *g, const float *g0, double *all, double *worst,
                        const char **worst_name) {
    double d = 0, r = 0;
    size_t off = 0;
    *worst = 0;
    for (int i = m->n_base_params; i < m->n_params; i++) {
        size_t n = (size_t)whale_shape_numel(2, m->params[i].shape);
        for (size_t j = 0; j < n; j++) {
            d += ((double)g[off + j] - g0[off + j]) * ((double)g[off + j] - g0[off + j]);
            r += (double)g0[off + j] * g0[off + j];
        }
        double e = test_rel_norm(g + off, g0 + off, (long)n);
        if (e > *worst) *worst = e, *worst_name = m->params[i].name;
        off += n;
    }
    *all = sqrt(d / r);
}

/* (a) loss and adapter gradients on the int8 base vs the fp32 base, the
 * same PEFT adapters (tests/data/lora-tiny) on each; the bf16 base for
 * scale, and an fp32 base holding the dequantized int8 values, which
 * separates the weights' quantisation from the products' bf16 rounding. */
static void test_against_fp32(void) {
    char adir[512], gpath[600];
    snprintf(adir, sizeof adir, "%s/lora-tiny", WHALE_TEST_DATA);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", adir);
    whale_err err;
    whale_st *g;
    if (whale_st_open(gpath, &g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const whale_st_entry *eids = whale_st_find(g, "input_ids"), *elab = whale_st_find(g, "labels");
    enum { F32, BF16, I8, DEQ };
    const whale_dtype dts[4] = {WHALE_F32, WHALE_BF16, WHALE_I8, WHALE_F32};
    whale_model *ms[4];
    for (int k = 0; k < 4; k++) {
        ms[k] = load(dts[k]);
        CHECK(whale_lora_load(ms[k], adir, &err) == WHALE_OK, "%s", err.msg);
    }
    /* DEQ: the fp32 weights replaced by q·scale */
    CHECK(whale_model_make_writable(ms[DEQ], &err) == WHALE_OK, "%s", err.msg);
    for (int i = 0; i < ms[DEQ]->n_base_params; i++) {
        whale_param *p = &ms[DEQ]->params[i];
        if (!whale_param_is_product_weight(p)) continue;
        for (int64_t o = 0; o < p->shape[0]; o++)
            whale_model_row(ms[I8], ms[I8]->params[i].data, o, p->shape[1], p->data + o * p->shape[1]);
    }
    double werr = int8_weight_error(ms[F32], ms[I8]);
    printf("int8 weights vs fp32: relative RMS error %.3g\n", werr);
    CHECK(werr > 1e-3 && werr < 0.01, "int8 weight error %g outside the expected 0.1-1 %%", werr);
    size_t ng = (size_t)whale_lora_num_params(ms[F32]);
    float *gr[4];
    for (int k = 0; k < 4; k++) gr[k] = malloc(ng * sizeof(float));
    /* Row 1 of the golden batch routes every token to the same experts in
     * int8 as in fp32 (whale diagnose --dtype int8: 0 % differ); row 0
     * sends one token of layer 1 elsewhere (margin 0.004), a discrete change
     * that moves the gradients of the experts involved by 20-45 % and, through
     * them, those upstream. The gradient comparison uses row 1; the loss is
     * compared on both rows. */
    double loss[4], all[4], worst[4];
    const char *wn[4] = {"", "", "", ""};
    for (int k = 0; k < 4; k++) loss[k] = adapter_step(ms[k], eids, elab, 1, 1, gr[k]);
    for (int k = 1; k < 4; k++) grad_errors(ms[F32], gr[k], gr[F32], &all[k], &worst[k], &wn[k]);
    double all_q, worst_q;
    const char *wn_q = "";
    grad_errors(ms[F32], gr[I8], gr[DEQ], &all_q, &worst_q, &wn_q);
    double dl = fabs(loss[I8] - loss[F32]) / loss[F32];
    printf("row 1: loss fp32 %.7f, bf16 %.7f, int8 %.7f (%.2g relative)\n", loss[F32], loss[BF16], loss[I8], dl);
    printf("row 1: adapter gradients vs the fp32 base: int8 %.3g (worst tensor %.3g, %s), bf16 %.3g (worst %.3g), "
           "fp32 dequantized %.3g (worst %.3g)\n",
           all[I8], worst[I8], wn[I8], all[BF16], worst[BF16], all[DEQ], worst[DEQ]);
    printf("row 1: int8 vs fp32 on the dequantized weights: %.3g (worst %.3g, %s)\n", all_q, worst_q, wn_q);
    /* Tolerances, from the values printed above (measured: int8 against
     * fp32 3.4 % together, 6.1 % worst tensor; fp32 on the dequantized
     * weights 2.7 % / 4.7 %, so most of it is the weights' quantisation;
     * int8 against those dequantized weights 2.1 % / 3.8 %, against bf16
     * vs fp32's 1.1 % / 1.8 %). The weights are off by 0.6 % RMS (each
     * within scale/2) and a gradient, a product of several weights and of
     * activations carrying their errors, moves by a few times that: 5 %
     * together and 10 % for the worst tensor. The products' own rounding
     * is the forward's activations rounded to int8 per block of 32 (an
     * error up to 1/254 of the block's largest value, 2-4 times bf16's
     * 2^-9 relative) and the backward's bf16: 4 % together, 6 % worst. */
    CHECK(dl <= 5e-3, "int8 loss %g vs fp32 %g", loss[I8], loss[F32]);
    CHECK(all[I8] <= 0.05, "adapter gradients on the int8 base off by %g", all[I8]);
    CHECK(worst[I8] <= 0.10, "adapter gradient %s off by %g", wn[I8], worst[I8]);
    CHECK(all_q <= 0.04 && worst_q <= 0.06, "int8 vs the dequantized fp32 base: %g, worst %g (%s)", all_q, worst_q,
          wn_q);
    /* both rows: the loss only (the routing change is a per-token effect) */
    double lb[3];
    float *tmp = malloc(ng * sizeof(float));
    for (int k = 0; k < 3; k++) lb[k] = adapter_step(ms[k], eids, elab, 0, 2, tmp);
    printf("both rows: loss fp32 %.7f, bf16 %.7f, int8 %.7f (%.2g relative)\n", lb[F32], lb[BF16], lb[I8],
           fabs(lb[I8] - lb[F32]) / lb[F32]);
    CHECK(fabs(lb[I8] - lb[F32]) <= 5e-3 * lb[F32], "int8 loss %g vs fp32 %g on both rows", lb[I8], lb[F32]);
    free(tmp);
    for (int k = 0; k < 4; k++) {
        free(gr[k]);
        whale_model_free(ms[k]);
    }
    whale_st_close(g);
}

/* dA = bf16(dC ⊙ scale)·q summed in double, + acc0 */
static void ref_dx(int M, int N, int K, const float *dC, const int8_t *q, const float *scale, const float *acc0,
                   double *out) {
    for (int m = 0; m < M; m++) {
        for (int k = 0; k < K; k++) out[(size_t)m * K + k] = acc0 ? acc0[(size_t)m * K + k] : 0.0;
        for (int n = 0; n < N; n++) {
            float p = dC[(size_t)m * N + n] * scale[n];
            double a = whale_bf16_to_float(whale_float_to_bf16(p));
            for (int k = 0; k < K; k++) out[(size_t)m * K + k] += a * q[(size_t)n * K + k];
        }
    }
}

static double rel_d(const float *a, const double *b, long n) {
    double d = 0, r = 0;
    for (long i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        r += b[i] * b[i];
    }
    return sqrt(d / r);
}

/* (b) whale_linear_dx with int8 weights against the double reference. */
static void test_input_gradient(void) {
    whale_err err;
    whale_model *m = load(WHALE_I8), *ma = load(WHALE_I8);
    char adir[512];
    snprintf(adir, sizeof adir, "%s/lora-tiny", WHALE_TEST_DATA);
    CHECK(whale_lora_load(ma, adir, &err) == WHALE_OK, "%s", err.msg);
    whale_session *s, *sa;
    CHECK(whale_session_new(m, 4, 100, &s, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_new(ma, 4, 100, &sa, &err) == WHALE_OK, "%s", err.msg);
    const char *names[] = {"model.layers.0.attn.wq_b.weight", "model.layers.1.ffn.experts.2.w2.weight",
                           "lm_head.weight"};
    const int rows[] = {3, 37, 300};
    double worst = 0, worst_lora = 0;
    for (int w = 0; w < 3; w++) {
        int pi = param_index(m, names[w]);
        const whale_param *p = &m->params[pi];
        int N = (int)p->shape[0], K = (int)p->shape[1];
        whale_wview v = whale_model_weight(m, p->data);
        CHECK(v.dtype == WHALE_I8 && v.scale, "%s is held in int8", names[w]);
        for (int ri = 0; ri < 3; ri++) {
            int M = rows[ri];
            size_t nc = (size_t)M * N, na = (size_t)M * K;
            float *dC = malloc(nc * sizeof(float)), *dA = malloc(na * sizeof(float)), *a0 = malloc(na * sizeof(float));
            double *ref = malloc(na * sizeof(double));
            fill(dC, (long)nc, 11u + (unsigned)(w * 7 + ri), 1e-2f);
            fill(a0, (long)na, 99u + (unsigned)(w * 7 + ri), 3e-3f);
            int8_t *q = malloc((size_t)N * K); /* the weight's values, row after row */
            whale_q8p_unpack(q, K, v.data, v.row0, N, K);
            for (int acc = 0; acc < 2; acc++) {
                ref_dx(M, N, K, dC, q, v.scale, acc ? a0 : NULL, ref);
                /* the shape rules, then several blocks (small limits), then our f32 kernels */
                for (int mode = 0; mode < 3; mode++) {
                    whale_gemm_set_block_limits(whale_backend_cpu_gemm(s->be), mode == 1 ? 16 : 0, mode == 1 ? 4096 : 0);
                    whale_gemm_set_path(whale_backend_cpu_gemm(s->be), mode == 2 ? WHALE_GEMM_OWN : WHALE_GEMM_AUTO);
                    memcpy(dA, a0, na * sizeof(float));
                    CHECK(whale_linear_dx(s, M, N, K, dC, N, p->data, K, dA, K, acc, &err) == WHALE_OK, "%s",
                          err.msg);
                    double r = rel_d(dA, ref, (long)na);
                    if (r > worst) worst = r;
                    CHECK(r <= 1e-5, "%s M=%d accumulate=%d mode %d: relative %g (%s)", names[w], M, acc, mode, r,
                          whale_gemm_last_impl(whale_backend_cpu_gemm(s->be)));
                }
                whale_gemm_set_block_limits(whale_backend_cpu_gemm(s->be), 0, 0);
                whale_gemm_set_path(whale_backend_cpu_gemm(s->be), WHALE_GEMM_AUTO);
                /* with an adapter: + s·(dC·B)·A */
                const whale_lora_target *t = whale_lora_find(ma, ma->params[pi].data);
                if (!t) continue;
                memcpy(dA, a0, na * sizeof(float));
                CHECK(whale_linear_dx(sa, M, N, K, dC, N, ma->params[pi].data, K, dA, K, acc, &err) == WHALE_OK, "%s",
                      err.msg);
                for (int mm = 0; mm < M; mm++)
                    for (int r = 0; r < t->rank; r++) {
                        double u = 0;
                        for (int n = 0; n < N; n++) u += (double)dC[(size_t)mm * N + n] * t->B[(size_t)n * t->rank + r];
                        u *= t->scale;
                        for (int k = 0; k < K; k++) ref[(size_t)mm * K + k] += u * t->A[(size_t)r * K + k];
                    }
                double r = rel_d(dA, ref, (long)na);
                if (r > worst_lora) worst_lora = r;
                CHECK(r <= 1e-5, "%s with its adapter, M=%d accumulate=%d: relative %g", names[w], M, acc, r);
            }
            free(dC);
            free(q);
            free(dA);
            free(a0);
            free(ref);
        }
    }
    printf("whale_linear_dx with int8 weights vs the double reference: worst relative %.3g, with adapters %.3g\n",
           worst, worst_lora);
    /* the weight gradient of a frozen int8 weight is not asked for, and
     * asking is an error, not a write into the int8 copy */
    int pi = param_index(m, "model.layers.0.attn.wq_b.weight");
    const whale_param *p = &m->params[pi];
    int N = (int)p->shape[0], K = (int)p->shape[1];
    float *dC = calloc((size_t)4 * N, sizeof(float)), *X = calloc((size_t)4 * K, sizeof(float)),
          *dW = calloc((size_t)N * K, sizeof(float));
    CHECK(whale_linear_dw(s, 4, N, K, dC, N, X, K, p->data, NULL, K, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_linear_dw(s, 4, N, K, dC, N, X, K, p->data, dW, K, &err) == WHALE_ERR_UNSUPPORTED &&
              strstr(err.msg, "int8") && !strchr(err.msg, '\n'),
          "an int8 weight gradient must be refused: %s", err.msg);
    /* a NULL scale is an argument error of the product */
    CHECK(whale_gemm_nn_q8(whale_backend_cpu_gemm(s->be), 4, K, N, dC, N, whale_model_weight(m, p->data).data, K, NULL, X, K, 0, &err) ==
              WHALE_ERR_ARG,
          "nn_q8 without scales must fail");
    free(dC);
    free(X);
    free(dW);
    whale_session_free(s);
    whale_session_free(sa);
    whale_model_free(m);
    whale_model_free(ma);
}

/* (c) three AdamW steps: the loss goes down, the base stays bit for bit */
static void test_steps(void) {
    char gpath[600];
    snprintf(gpath, sizeof gpath, "%s/lora-tiny/golden.safetensors", WHALE_TEST_DATA);
    whale_err err;
    whale_st *g;
    if (whale_st_open(gpath, &g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const whale_st_entry *eids = whale_st_find(g, "input_ids"), *elab = whale_st_find(g, "labels");
    int B = (int)eids->shape[0], S = (int)eids->shape[1];
    whale_model *m = load(WHALE_I8);
    int n_base = whale_model_num_params(m);
    whale_lora_config lc = whale_lora_defaults();
    lc.rank = 4;
    lc.dropout = 0;
    CHECK(whale_lora_attach(m, &lc, &err) == WHALE_OK, "%s", err.msg);
    /* every base tensor in its stored form, and the int8 scales */
    unsigned char *snap = test_snapshot_params(m, n_base);
    int n_i8 = 0;
    for (int i = 0; i < n_base; i++) n_i8 += whale_model_param(m, i).dtype == WHALE_I8;
    CHECK(n_i8 > 0 && n_i8 == m->n_copies, "the base's product weights are int8 (%d of %d)", n_i8, m->n_copies);
    whale_memory before_mm;
    whale_memory_of_model(m, &before_mm);

    whale_session *ts;
    whale_optimizer *o;
    whale_adamw_config ac = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
    CHECK(whale_train_session_new(m, B, S, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_adamw_new(m, &ac, &o, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_optimizer_bytes(o) == 2 * sizeof(float) * (size_t)whale_lora_num_params(m),
          "moments for the adapters only: %zu bytes", whale_optimizer_bytes(o));
    /* the estimate of this run counts the buffers the run holds */
    whale_memory live, est;
    whale_memory_of_model(m, &live);
    whale_memory_add_session(&live, ts);
    whale_memory_add_optimizer(&live, whale_optimizer_bytes(o));
    char tdir[512];
    snprintf(tdir, sizeof tdir, "%s/tiny", WHALE_TEST_DATA);
    whale_memory_plan plan = {.dtype = WHALE_I8, .train = WHALE_TRAIN_LORA, .lora_rank = 4, .batch = B, .seq_len = S};
    CHECK(whale_memory_estimate(tdir, &plan, &est, &err) == WHALE_OK, "%s", err.msg);
    CHECK(est.weights_f32 == live.weights_f32 && est.weights_lowp == live.weights_lowp &&
              est.adapters == live.adapters && est.moments == live.moments && est.trainable == live.trainable,
          "int8 LoRA estimate: weights %zu + %zu, adapters %zu, moments %zu; live %zu + %zu, %zu, %zu",
          est.weights_f32, est.weights_lowp, est.adapters, est.moments, live.weights_f32, live.weights_lowp,
          live.adapters, live.moments);

    whale_batch bt;
    CHECK(whale_batch_alloc(B, S, &bt, &err) == WHALE_OK, "%s", err.msg);
    memcpy(bt.ids, eids->data, sizeof(int32_t) * (size_t)B * S);
    memcpy(bt.labels, elab->data, sizeof(int32_t) * (size_t)B * S);
    for (int i = 0; i < B * S; i++) bt.pos[i] = i % S, bt.seg[i] = 0;
    bt.B = B, bt.S = S;
    double l_first = 0, l_last = 0;
    for (int k = 0; k < 3; k++) {
        whale_step_result sr;
        CHECK(whale_train_one_step(ts, o, NULL, NULL, NULL, NULL, &bt, 1, 0, 1.0, 1e-2, k + 1, &sr, &err) == WHALE_OK, "%s",
              err.msg);
        if (!k) l_first = sr.loss;
        l_last = sr.loss;
    }
    int changed = test_params_changed(m, n_base, snap);
    whale_memory after_mm;
    whale_memory_of_model(m, &after_mm);
    printf("LoRA on an int8 base, 3 AdamW steps: loss %.4f -> %.4f, %d base tensors or scales changed\n", l_first,
           l_last, changed);
    CHECK(changed == 0, "%d base tensors changed during LoRA training", changed);
    CHECK(l_last < l_first, "three steps at lr 1e-2 must lower the loss (%g -> %g)", l_first, l_last);
    int ib = param_index(m, "model.layers.0.attn.wq_a.lora_B.weight");
    float bmax = 0;
    const float *bw = whale_model_param(m, ib).data;
    for (int i = 0; i < 64 * 4; i++) bmax = fmaxf(bmax, fabsf(bw[i]));
    CHECK(bmax > 0, "lora_B (zero at init) did not move");
    CHECK(after_mm.weights_lowp == before_mm.weights_lowp && after_mm.weights_f32 == before_mm.weights_f32 &&
              whale_model_dtype(m) == WHALE_I8,
          "the base must stay int8 without fp32 copies (lowp %zu -> %zu, fp32 %zu -> %zu)", before_mm.weights_lowp,
          after_mm.weights_lowp, before_mm.weights_f32, after_mm.weights_f32);
    whale_batch_free(&bt);
    whale_optimizer_free(o);
    whale_session_free(ts);
    free(snap);
    whale_model_free(m);
    whale_st_close(g);
}

/* (d) full training in int8 is refused with the message */
static void test_refusal(void) {
    whale_err err;
    int32_t ids[2 * 8] = {0};
    for (int i = 0; i < 16; i++) ids[i] = (i * 37) % 512;
    for (int variant = 0; variant < 2; variant++) {
        /* loaded in int8, or fp32 switched to int8 (int8 copies of fp32 masters) */
        whale_model *m = load(variant ? WHALE_F32 : WHALE_I8);
        if (variant) CHECK(whale_model_set_dtype(m, WHALE_I8, &err) == WHALE_OK, "%s", err.msg);
        whale_session *ts;
        CHECK(whale_train_session_new(m, 2, 8, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
        double loss;
        int64_t cnt;
        whale_code c = whale_session_train_step(ts, ids, NULL, NULL, NULL, 2, 8, 1.0, &loss, &cnt, &err);
        CHECK(c == WHALE_ERR_UNSUPPORTED && strstr(err.msg, REFUSAL) && strstr(err.msg, "int8 is an inference format") &&
                  !strchr(err.msg, '\n'),
              "full training of an int8 model (variant %d) must be refused: %d \"%s\"", variant, (int)c, err.msg);
        whale_session_free(ts);
        /* with adapters the same model trains */
        whale_lora_config lc = whale_lora_defaults();
        lc.rank = 2;
        CHECK(whale_lora_attach(m, &lc, &err) == WHALE_OK, "%s", err.msg);
        CHECK(whale_train_session_new(m, 2, 8, 0, &ts, &err) == WHALE_OK, "%s", err.msg);
        c = whale_session_train_step(ts, ids, NULL, NULL, NULL, 2, 8, 1.0, &loss, &cnt, &err);
        CHECK(c == WHALE_OK && isfinite(loss), "LoRA on int8 (variant %d): %s", variant, err.msg);
        whale_session_free(ts);
        whale_model_free(m);
    }
    /* the memory estimate refuses full training in int8 too */
    whale_memory est;
    whale_memory_plan plan = {.dtype = WHALE_I8, .train = WHALE_TRAIN_FULL, .batch = 1, .seq_len = 16};
    CHECK(whale_memory_estimate("tiny", &plan, &est, &err) == WHALE_ERR_ARG, "int8 full-training estimate refused");
}

int main(void) {
    test_against_fp32();
    test_input_gradient();
    test_steps();
    test_refusal();
    return test_finish("test_lora_int8");
}
