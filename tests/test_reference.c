/* The C forward pass against goldens from the PyTorch reference
 * (tests/reference/gen_goldens.py): logits, loss, HC coefficients, expert
 * routing, final hidden state and a greedy continuation decoded with the
 * KV cache. */
#include "testutil.h"

#include "whale_safetensors.h"
#include "whale.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const whale_st *golden;
    const char *label;
    int compared;
} trace_ctx;

/* Tolerances: HC coefficients of layer 0 see only the embedding and must
 * agree to 1e-6; deeper layers accumulate fp32 rounding of several GEMMs. */
static void on_trace(void *user, const char *name, const whale_tensor *t) {
    trace_ctx *ctx = user;
    const whale_st_entry *g = whale_st_find(ctx->golden, name);
    if (!g) return;
    long n = (long)whale_shape_numel(t->ndim, t->shape);
    CHECK(g->nbytes == (size_t)n * whale_dtype_size(t->dtype), "%s %s: size %zu vs %ld elements", ctx->label, name,
          g->nbytes, n);
    if (g->nbytes != (size_t)n * whale_dtype_size(t->dtype)) return;
    ctx->compared++;
    if (strstr(name, "topk_idx")) {
        /* same set of experts per token (order within the top-k is by score) */
        const int32_t *a = t->data, *b = g->data;
        int K = (int)t->shape[1], mism = 0;
        for (long r = 0; r < t->shape[0]; r++)
            for (int k = 0; k < K; k++) {
                int found = 0;
                for (int k2 = 0; k2 < K; k2++) found |= a[r * K + k] == b[r * K + k2];
                mism += !found;
            }
        CHECK(mism == 0, "%s %s: %d routing choices differ", ctx->label, name, mism);
        return;
    }
    double tol = strstr(name, "layers.0.hc_attn") ? 1e-6 : 1e-5;
    double scale = strstr(name, "final_hidden") ? test_max_abs(g->data, n) : 1.0;
    double d = test_max_abs_diff(t->data, g->data, n);
    CHECK(d <= tol * scale, "%s %s: max |diff| %.3g > %.3g", ctx->label, name, d, tol * scale);
}

static const void *need(const whale_st *st, const char *name, whale_dtype dt) {
    const whale_st_entry *e = whale_st_find(st, name);
    CHECK(e && e->dtype == dt, "golden tensor %s missing", name);
    return e ? e->data : NULL;
}

static void check_model(whale_model *m, const char *golden_path, const char *label) {
    whale_err err;
    whale_st *g;
    if (whale_st_open(golden_path, &g, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const whale_st_entry *ids_e = whale_st_find(g, "input_ids");
    int B = (int)ids_e->shape[0], S = (int)ids_e->shape[1], V = whale_model_vocab_size(m);
    const int32_t *ids = ids_e->data;
    whale_session *s;
    CHECK(whale_session_new(m, B, S, &s, &err) == WHALE_OK, "%s", err.msg);
    float *logits = malloc(sizeof(float) * (size_t)B * S * V);
    trace_ctx ctx = {g, label, 0};
    whale_session_set_trace(s, on_trace, &ctx);
    CHECK(whale_session_forward(s, ids, B, S, logits, 1, &err) == WHALE_OK, "%s", err.msg);
    whale_session_set_trace(s, NULL, NULL);
    CHECK(ctx.compared >= 5, "%s: only %d traced tensors compared", label, ctx.compared);

    const whale_st_entry *lg = whale_st_find(g, "logits");
    if (lg) { /* full logits: max abs error <= 1e-5 * max |logit| */
        double d = test_max_abs_diff(logits, lg->data, (long)B * S * V), mx = test_max_abs(lg->data, (long)B * S * V);
        CHECK(d <= 1e-5 * mx, "%s logits: max |diff| %.3g, max |logit| %.3g", label, d, mx);
        printf("%s: logits max |diff| %.3g (max |logit| %.3g)\n", label, d, mx);
    } else { /* large vocab: selected columns, logsumexp and argmax per row */
        const whale_st_entry *cols = whale_st_find(g, "logits_cols");
        const float *sub = need(g, "logits_subset", WHALE_F32), *lse = need(g, "logsumexp", WHALE_F32);
        const int32_t *amax = need(g, "argmax", WHALE_I32);
        if (cols && sub && lse && amax) {
            int C = (int)cols->shape[0];
            const int32_t *ci = cols->data;
            double d = 0, mx = 0;
            for (long r = 0; r < (long)B * S; r++) {
                const float *row = logits + r * V;
                for (int k = 0; k < C; k++) {
                    d = fmax(d, fabs(row[ci[k]] - sub[r * C + k]));
                    mx = fmax(mx, fabs(sub[r * C + k]));
                }
                double m0 = -INFINITY, sum = 0;
                int best = 0;
                for (int v = 0; v < V; v++) {
                    if (row[v] > m0) m0 = row[v], best = v;
                }
                for (int v = 0; v < V; v++) sum += exp(row[v] - m0);
                CHECK(fabs(log(sum) + m0 - lse[r]) <= 1e-5 * fmax(1, fabs(lse[r])), "%s logsumexp row %ld", label, r);
                CHECK(best == amax[r], "%s argmax row %ld: %d vs %d", label, r, best, amax[r]);
            }
            CHECK(d <= 1e-5 * mx, "%s logits subset: max |diff| %.3g, max %.3g", label, d, mx);
            printf("%s: logits (subset) max |diff| %.3g (max |logit| %.3g)\n", label, d, mx);
        }
    }

    const float *loss = need(g, "loss", WHALE_F32);
    int64_t cnt;
    double l = whale_cross_entropy(logits, ids, B, S, V, &cnt);
    if (loss) CHECK(fabs(l - loss[0]) <= 1e-5 * fabs(loss[0]), "%s loss %.9g vs %.9g", label, l, loss[0]);
    const whale_st_entry *mk = whale_st_find(g, "input_ids_masked");
    const float *loss_m = whale_st_find(g, "loss_masked") ? need(g, "loss_masked", WHALE_F32) : NULL;
    if (mk && loss_m) {
        double lm = whale_cross_entropy(logits, mk->data, B, S, V, &cnt);
        CHECK(fabs(lm - loss_m[0]) <= 1e-5 * fabs(loss_m[0]), "%s masked loss %.9g vs %.9g", label, lm, loss_m[0]);
        CHECK(cnt < (int64_t)B * (S - 1), "%s masked loss counted %lld targets", label, (long long)cnt);
    }

    /* greedy continuation with the KV cache vs the reference's full recompute */
    const whale_st_entry *gp = whale_st_find(g, "greedy_prompt"), *gt = whale_st_find(g, "greedy_tokens");
    if (gp && gt) {
        int P = (int)gp->shape[0], N = (int)gt->shape[0];
        whale_session *s1;
        CHECK(whale_session_new(m, 1, P + N, &s1, &err) == WHALE_OK, "%s", err.msg);
        float *last = malloc(sizeof(float) * V);
        int ok = whale_session_forward(s1, gp->data, 1, P, last, 0, &err) == WHALE_OK, same = 0;
        const int32_t *want = gt->data;
        for (int k = 0; ok && k < N; k++) {
            int32_t best = 0;
            for (int v = 1; v < V; v++)
                if (last[v] > last[best]) best = v;
            same += best == want[k];
            if (best != want[k]) break;
            if (k + 1 < N) ok = whale_session_forward(s1, &best, 1, 1, last, 0, &err) == WHALE_OK;
        }
        CHECK(same == N, "%s greedy: first %d of %d tokens agree", label, same, N);
        free(last);
        whale_session_free(s1);
    }
    free(logits);
    whale_session_free(s);
    whale_st_close(g);
}

int main(void) {
    whale_err err;
    const char *cases[][2] = {{"tiny", "golden-tiny.safetensors"}, {"tiny-variant", "golden-tiny-variant.safetensors"}};
    for (size_t i = 0; i < 2; i++) {
        char dir[1024], golden[1024];
        snprintf(dir, sizeof dir, "%s/%s", WHALE_TEST_DATA, cases[i][0]);
        snprintf(golden, sizeof golden, "%s/%s", WHALE_TEST_DATA, cases[i][1]);
        whale_model *m;
        if (whale_model_load(dir, &m, &err)) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        check_model(m, golden, cases[i][0]);
        whale_model_free(m);
    }

    /* debug preset: weights come from `whale init --preset debug --seed 1`;
     * the golden records checksums so a drift in the initialiser shows up. */
    char golden[1024];
    snprintf(golden, sizeof golden, "%s/golden-debug.safetensors", WHALE_TEST_DATA);
    whale_st *g;
    if (whale_st_open(golden, &g, &err) == WHALE_OK) {
        whale_model *m;
        CHECK(whale_model_init("debug", 1, &m, &err) == WHALE_OK, "%s", err.msg);
        const float *sample = need(g, "embed_sample", WHALE_F32);
        whale_tensor emb = whale_model_param(m, 3);
        CHECK(strcmp(whale_model_param_name(m, 3), "model.embed_tokens.weight") == 0, "param order");
        if (sample) CHECK(memcmp(sample, emb.data, 64 * sizeof(float)) == 0, "debug init differs from the golden's weights");
        whale_st_close(g);
        check_model(m, golden, "debug");
        whale_model_free(m);
    } else {
        CHECK(0, "%s", err.msg);
    }
    return test_finish("test_reference");
}
