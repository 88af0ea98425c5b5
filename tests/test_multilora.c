/* Adapters per sequence: sequences bound to different LoRA adapters (and
 * some to none) decoded together give the logits each gets alone with its
 * adapter attached the existing way (whale_lora_load, the path of
 * `whale chat --adapters`).
 *
 * For nanowhale (tests/data/tiny) and a Qwen2 (tests/data/qwen2-gqa2),
 * three adapters each: the PyTorch reference's (tests/data/lora-tiny;
 * qwen2-lora and its rsLoRA twin) and ones made here with other ranks and
 * target modules (PEFT init, then random nonzero B) — so the rows of one
 * product see adapters on some of them and not others, of different ranks
 * and scales, in attention, the MLP and nanowhale's
 * experts (rows gathered per expert). Six sequences, bound
 * {A, B, none, A, C, B}, prompts of different lengths and a fixed
 * continuation (the same tokens fed both ways):
 *   alone     a fresh model with the sequence's adapter loaded into it (or
 *             none) and a one-sequence session: the prompt, then a token
 *             a step;
 *   together  the base with the three adapters loaded beside it and one
 *             six-sequence session: each prompt in its own batch, then every
 *             step one batch of the active sequences' tokens (sequence i
 *             stops after STEPS − i steps);
 *   mixed     every prompt in one batch, then the steps.
 * In fp32, bf16, fp16 and int8 the prefills and steps are bit-identical to
 * decoding alone, as in test_batch; a mixed prefill may sum in another
 * order (test_batch's bounds). Every adapter changes its sequences' logits.
 * Then what is refused: rebinding a sequence that holds cells, copying cells
 * between sequences of different adapters, binding over attached adapters,
 * an adapter of another model, one loaded after the session with a larger
 * rank, a training session, a broken adapter folder; and the memory: each
 * adapter is held once, by the model. */
#include "testutil.h"

#include "core/core.h"
#include "whale.h"
#include "whale_lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { NSEQ = 6, STEPS = 6, CTX = 40, NBATCH = 80, NAD = 3 };
static const int prompt_len[NSEQ] = {3, 1, 9, 5, 14, 2};
static const int bind[NSEQ] = {0, 1, -1, 0, 2, 1}; /* adapter of each sequence, −1: the base */

typedef struct {
    const char *name, *tag;
    char base[512];
    char ad[NAD][600];
} model_case;

static int steps_of(int seq) { return STEPS - seq; }
static const test_decode_plan plan = {NSEQ, NBATCH, prompt_len, steps_of};

typedef struct {
    float *l[NSEQ]; /* [1 + STEPS, V]: after the prompt, then after each step */
} run_logits;

static void free_run(run_logits *r) {
    for (int i = 0; i < NSEQ; i++) free(r->l[i]);
}

static whale_model *load(const char *dir, whale_dtype dt) {
    whale_err err;
    whale_model *m = NULL;
    CHECK(whale_model_load_as(dir, dt, &m, &err) == WHALE_OK, "%s", err.msg);
    return m;
}

/* An adapter made the way whale sft starts one (PEFT's init), with B drawn
 * at random so that it matters, saved as a PEFT folder. */
static void make_adapter(const char *base, const char *targets, int rank, int rslora, uint64_t seed, const char *out) {
    whale_err err;
    whale_model *m = load(base, WHALE_F32);
    if (!m) return;
    whale_lora_config cfg = whale_lora_defaults();
    cfg.rank = rank, cfg.alpha = 2.0 * rank, cfg.dropout = 0, cfg.use_rslora = rslora, cfg.target_modules = targets;
    cfg.seed = seed;
    CHECK(whale_lora_attach(m, &cfg, &err) == WHALE_OK, "%s", err.msg);
    whale_rng rng;
    whale_rng_seed(&rng, seed + 1);
    for (int i = 0; i < whale_model_num_params(m); i++) {
        if (!strstr(whale_model_param_name(m, i), "lora_B")) continue;
        whale_tensor t = whale_model_param(m, i);
        float *b = t.data;
        for (int64_t k = 0; k < whale_shape_numel(t.ndim, t.shape); k++) b[k] = 0.5f * (2 * whale_rng_uniform(&rng) - 1);
    }
    CHECK(whale_lora_save(m, out, base, &err) == WHALE_OK, "%s", err.msg);
    whale_model_free(m);
}

/* Sequence q alone: its adapter loaded into a fresh model (adapter NULL: the base). */
static float *run_alone(const model_case *mc, whale_dtype dt, int q, const char *adapter) {
    whale_err err;
    whale_model *m = load(mc->base, dt);
    if (!m) return NULL;
    if (adapter) CHECK(whale_lora_load(m, adapter, &err) == WHALE_OK, "%s", err.msg);
    int V = whale_model_vocab_size(m);
    float *l = calloc((size_t)(1 + STEPS) * V, sizeof(float));
    whale_session *s;
    const whale_session_params p = {1, CTX, NBATCH};
    CHECK(whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s", err.msg);
    test_decode_alone(s, &plan, q, V, l);
    whale_session_free(s);
    whale_model_free(m);
    return l;
}

/* The base with the adapters beside it; s bound as bind[] says. */
static whale_model *load_with_adapters(const model_case *mc, whale_dtype dt, whale_adapter **ad) {
    whale_err err;
    whale_model *m = load(mc->base, dt);
    for (int a = 0; m && a < NAD; a++)
        CHECK(whale_adapter_load(m, mc->ad[a], &ad[a], &err) == WHALE_OK, "%s", err.msg);
    return m;
}

static void bind_all(whale_session *s, whale_adapter **ad) {
    whale_err err;
    for (int q = 0; q < NSEQ; q++)
        CHECK(whale_kv_seq_set_adapter(s, q, bind[q] < 0 ? NULL : ad[bind[q]], &err) == WHALE_OK, "%s", err.msg);
}

static void run_together(const model_case *mc, whale_dtype dt, int mixed, run_logits *r) {
    whale_err err;
    whale_adapter *ad[NAD];
    whale_model *m = load_with_adapters(mc, dt, ad);
    if (!m) return;
    int V = whale_model_vocab_size(m);
    whale_session *s;
    const whale_session_params p = {NSEQ, CTX, NBATCH};
    CHECK(whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s", err.msg);
    bind_all(s, ad);
    for (int q = 0; q < NSEQ; q++) r->l[q] = calloc((size_t)(1 + STEPS) * V, sizeof(float));
    test_decode_together(s, &plan, mixed, V, r->l);
    whale_session_free(s);
    whale_model_free(m);
}

/* worst |Δ| / max |logit| over every step of sequence q */
static double seq_diff(const float *a, const float *b, int q, int V) {
    double worst = 0;
    for (int k = 0; k <= steps_of(q); k++) {
        double d = test_max_abs_diff(a + (size_t)k * V, b + (size_t)k * V, V) / test_max_abs(b + (size_t)k * V, V);
        if (d > worst || isnan(d)) worst = d;
    }
    return worst;
}

static void check_decoding(const model_case *mc, whale_dtype dt) {
    run_logits alone = {{0}}, together = {{0}}, mixed = {{0}};
    for (int q = 0; q < NSEQ; q++) alone.l[q] = run_alone(mc, dt, q, bind[q] < 0 ? NULL : mc->ad[bind[q]]);
    run_together(mc, dt, 0, &together);
    run_together(mc, dt, 1, &mixed);
    whale_err err;
    whale_model *m = load(mc->base, dt);
    int V = m ? whale_model_vocab_size(m) : 0;
    whale_model_free(m);
    double dt_worst = 0, dm_worst = 0, effect = INFINITY;
    for (int q = 0; q < NSEQ && V; q++) {
        if (!alone.l[q] || !together.l[q]) continue;
        double d = seq_diff(together.l[q], alone.l[q], q, V), dm = seq_diff(mixed.l[q], alone.l[q], q, V);
        dt_worst = d > dt_worst || isnan(d) ? d : dt_worst;
        dm_worst = dm > dm_worst || isnan(dm) ? dm : dm_worst;
        if (bind[q] >= 0 && dt == WHALE_F32) { /* the adapter must matter */
            float *base = run_alone(mc, dt, q, NULL);
            double e = base ? seq_diff(alone.l[q], base, q, V) : 0;
            effect = e < effect ? e : effect;
            free(base);
        }
    }
    (void)err;
    double bound = dt == WHALE_F32 ? 1e-5 : 2e-2;
    printf("%s %s: %d sequences on %d adapters together vs alone: max |diff| / max |logit| %.3g; mixed prefill %.3g",
           mc->name, whale_dtype_name(dt), NSEQ, NAD, dt_worst, dm_worst);
    if (dt == WHALE_F32) printf("; the adapters move the logits by at least %.3g", effect);
    printf("\n");
    CHECK(dt_worst == 0, "%s %s: sequences decoded together on their adapters differ from alone (%.3g)", mc->name,
          whale_dtype_name(dt), dt_worst);
    CHECK(dm_worst <= bound, "%s %s: mixed prefill differs by %.3g (bound %g)", mc->name, whale_dtype_name(dt),
          dm_worst, bound);
    if (dt == WHALE_F32)
        CHECK(effect > 1e-3, "%s %s: an adapter changes its sequence's logits by only %.3g", mc->name,
              whale_dtype_name(dt), effect);
    free_run(&alone), free_run(&together), free_run(&mixed);
}

/* Cells under adapters: a prefix copied between sequences of one adapter
 * continues as the original does; what is refused changes nothing. */
static void check_cells(const model_case *mc, const char *tmp) {
    whale_err err;
    whale_adapter *ad[NAD];
    whale_model *m = load_with_adapters(mc, WHALE_F32, ad);
    if (!m) return;
    int V = whale_model_vocab_size(m);
    whale_session *s;
    const whale_session_params p = {3, CTX, NBATCH};
    CHECK(whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s", err.msg);
    whale_dbatch b;
    whale_dbatch_init(&b, NBATCH, &err);
    CHECK(whale_kv_seq_set_adapter(s, 0, ad[0], &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_adapter(s, 0) == ad[0] && whale_kv_seq_adapter(s, 1) == NULL, "bindings read back wrong");
    for (int i = 0; i < 11; i++) whale_dbatch_add(&b, test_token_at(2, i, V), i, 0, 0, &err);
    CHECK(whale_session_decode(s, &b, NULL, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_set_adapter(s, 0, ad[1], &err) == WHALE_ERR_ARG && strstr(err.msg, "holds 11 cells"),
          "rebinding a sequence with cells: %s", err.msg);
    CHECK(whale_kv_seq_set_adapter(s, 0, ad[0], &err) == WHALE_OK, "binding the same adapter again: %s", err.msg);
    CHECK(whale_kv_seq_copy(s, 0, 1, 7, &err) == WHALE_ERR_ARG && strstr(err.msg, "different adapters"),
          "a copy from adapter 0 to the base: %s", err.msg);
    CHECK(whale_kv_seq_len(s, 1) == 0, "a refused copy moved cells");
    CHECK(whale_kv_seq_set_adapter(s, 2, ad[0], &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_copy(s, 0, 2, 7, &err) == WHALE_OK, "%s", err.msg);
    float *l0 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    whale_dbatch_clear(&b);
    whale_dbatch_add(&b, test_token_at(2, 7, V), 7, 2, 1, &err);
    CHECK(whale_session_decode(s, &b, l2, &err) == WHALE_OK, "%s", err.msg);
    whale_kv_seq_keep(s, 0, 7);
    whale_dbatch_clear(&b);
    whale_dbatch_add(&b, test_token_at(2, 7, V), 7, 0, 1, &err);
    CHECK(whale_session_decode(s, &b, l0, &err) == WHALE_OK, "%s", err.msg);
    CHECK(memcmp(l0, l2, sizeof(float) * V) == 0, "a prefix copied under one adapter continues differently (%g)",
          test_max_abs_diff(l0, l2, V));
    /* emptied, a sequence takes another adapter */
    whale_kv_seq_keep(s, 2, 0);
    CHECK(whale_kv_seq_set_adapter(s, 2, ad[2], &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_set_adapter(s, 3, ad[0], &err) == WHALE_ERR_ARG, "sequence 3 of 3 was bound");

    /* an adapter of another model, adapters attached to every row */
    whale_model *other = load(mc->base, WHALE_F32);
    whale_adapter *oa = NULL;
    if (other) CHECK(whale_adapter_load(other, mc->ad[0], &oa, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_set_adapter(s, 1, oa, &err) == WHALE_ERR_ARG && strstr(err.msg, "another model"), "%s", err.msg);
    /* a larger rank than the session's scratch was sized for */
    char big[700];
    snprintf(big, sizeof big, "%s/%s-rank-32", tmp, mc->tag);
    make_adapter(mc->base, "all-linear", 32, 0, 99, big);
    whale_adapter *late;
    CHECK(whale_adapter_load(m, big, &late, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_set_adapter(s, 1, late, &err) == WHALE_ERR_ARG && strstr(err.msg, "before creating sessions"),
          "%s", err.msg);
    CHECK(whale_kv_seq_adapter(s, 1) == NULL, "a refused binding stuck");
    /* a broken folder: the model's adapters stay as they were */
    whale_memory before, after;
    whale_memory_of_model(m, &before);
    char broken[700];
    snprintf(broken, sizeof broken, "%s/%s-broken", tmp, mc->tag);
    CHECK(mkdir(broken, 0700) == 0, "cannot make %s", broken);
    test_write_text(broken, "adapter_config.json", "{\"peft_type\": \"LORA\", \"r\": 0}");
    whale_adapter *bad = (whale_adapter *)1;
    whale_code c = whale_adapter_load(m, broken, &bad, &err);
    CHECK(c == WHALE_ERR_FORMAT && strstr(err.msg, "adapter_config.json") && bad == NULL, "a broken adapter: %s (%s)",
          whale_code_name(c), err.msg);
    whale_memory_of_model(m, &after);
    CHECK(after.adapters == before.adapters, "a refused adapter changed the model's memory");
    /* memory: each adapter once, in the model */
    size_t want = 0;
    for (int a = 0; a < NAD; a++) want += (size_t)whale_adapter_num_params(ad[a]) * sizeof(float);
    want += (size_t)whale_adapter_num_params(late) * sizeof(float);
    CHECK(after.adapters == want, "the model holds %zu bytes of adapters, expected %zu", after.adapters, want);
    CHECK(whale_adapter_rank(late) == 32 && whale_adapter_count(late) > 0, "rank %d, %d weights",
          whale_adapter_rank(late), whale_adapter_count(late));
    free(l0), free(l2);
    whale_dbatch_free(&b);
    whale_session_free(s);

    whale_session *t;
    CHECK(whale_train_session_new(m, 1, 8, 0, &t, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_set_adapter(t, 0, ad[0], &err) == WHALE_ERR_ARG, "a training session took an adapter");
    whale_session_free(t);
    whale_model_free(m);

    if (other) CHECK(whale_lora_load(other, mc->ad[1], &err) == WHALE_OK, "%s", err.msg);
    whale_session *so;
    const whale_session_params p1 = {1, CTX, NBATCH};
    if (other) {
        CHECK(whale_session_new_batched(other, &p1, &so, &err) == WHALE_OK, "%s", err.msg);
        CHECK(whale_kv_seq_set_adapter(so, 0, oa, &err) == WHALE_ERR_UNSUPPORTED && strstr(err.msg, "attached"),
              "binding over attached adapters: %s", err.msg);
        whale_session_free(so);
    }
    whale_model_free(other);
}

int main(void) {
    char tmp[512];
    test_tmpdir("multilora", tmp, sizeof tmp);
    model_case cases[2] = {{.name = "nanowhale tiny", .tag = "nw"}, {.name = "qwen2-gqa2", .tag = "qw"}};
    snprintf(cases[0].base, sizeof cases[0].base, "%s/tiny", WHALE_TEST_DATA);
    snprintf(cases[0].ad[0], sizeof cases[0].ad[0], "%s/lora-tiny", WHALE_TEST_DATA);
    snprintf(cases[0].ad[1], sizeof cases[0].ad[1], "%s/nw-a", tmp);
    snprintf(cases[0].ad[2], sizeof cases[0].ad[2], "%s/nw-b", tmp);
    make_adapter(cases[0].base, "wq_b,wkv,w2", 2, 0, 11, cases[0].ad[1]);
    make_adapter(cases[0].base, "wq_a,wo_b,w1,w3", 6, 1, 12, cases[0].ad[2]);
    snprintf(cases[1].base, sizeof cases[1].base, "%s/qwen2-gqa2", WHALE_TEST_DATA);
    snprintf(cases[1].ad[0], sizeof cases[1].ad[0], "%s/qwen2-lora", WHALE_TEST_DATA);
    snprintf(cases[1].ad[1], sizeof cases[1].ad[1], "%s/qwen2-lora/rslora", WHALE_TEST_DATA);
    snprintf(cases[1].ad[2], sizeof cases[1].ad[2], "%s/qw-a", tmp);
    make_adapter(cases[1].base, "q_proj,v_proj,down_proj", 3, 0, 13, cases[1].ad[2]);
    const whale_dtype dts[4] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};
    for (int k = 0; k < 2; k++) {
        for (int d = 0; d < 4; d++) check_decoding(&cases[k], dts[d]);
        check_cells(&cases[k], tmp);
    }
    return test_finish("test_multilora");
}
