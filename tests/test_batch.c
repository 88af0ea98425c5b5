/* The batch API: sequences at different positions decoded together give
 * the logits each gets alone.
 *
 * For nanowhale (tests/data/tiny) and qwen2-tiny, in fp32 and bf16, eight
 * sequences with prompts of different lengths and a fixed continuation
 * (the same tokens fed both ways, so a difference cannot hide behind a
 * different sample):
 *   alone     each in its own one-sequence session: prompt, then a token a step;
 *   together  one eight-sequence session: each prompt prefilled in its own
 *             batch, then every step one batch of the active sequences'
 *             tokens at their different positions — sequence i stops after
 *             STEPS − i steps, so the batch shrinks as in a server;
 *   mixed     all prompts in one batch, then the steps as above.
 * Decode steps are bit-identical to decoding alone (each row's products and
 * attention do not depend on the other rows). A mixed prefill puts the
 * prompts in one product of many rows, which may sum in another order:
 * bounded by 1e-5 of max |logit| in fp32 and 1e-3 in bf16 (rounding the
 * same operands, summing in fp32).
 * For nanowhale, the experts of a micro-batch of up to 16 tokens run
 * grouped (two parallel regions per group, nanowhale.c moe_few_tokens): its
 * decode steps (1..8 tokens) and prompts (1..13) give the bits of the
 * per-expert loop that longer ones take, forced by moe_few_tokens = 0, in
 * fp32, bf16 and int8.
 * Then the cells: a prefix copied into another sequence continues as the
 * original does, a sequence cut back and re-fed repeats itself, bad batches
 * are refused without changing any cell, and the cache grows with the
 * sequences while the work buffers do not. */
#include "testutil.h"

#include "models/nanowhale.h"
#include "whale.h"

#include <stdlib.h>
#include <string.h>

enum { NSEQ = 8, STEPS = 10, CTX = 48, NBATCH = 96 };
static const int prompt_len[NSEQ] = {1, 3, 5, 8, 13, 2, 21, 7};

static int steps_of(int seq) { return STEPS - seq; }
static const test_decode_plan plan = {NSEQ, NBATCH, prompt_len, steps_of};

/* logits after the prompt and after each step: [1 + STEPS, V] per sequence */
typedef struct {
    float *l[NSEQ];
} run_logits;

static void free_run(run_logits *r) {
    for (int i = 0; i < NSEQ; i++) free(r->l[i]);
}

static void run_alone(whale_model *m, run_logits *r) {
    int V = whale_model_vocab_size(m);
    whale_err err;
    for (int q = 0; q < NSEQ; q++) {
        whale_session *s;
        const whale_session_params p = {1, CTX, NBATCH};
        CHECK(whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s", err.msg);
        r->l[q] = calloc((size_t)(1 + STEPS) * V, sizeof(float));
        test_decode_alone(s, &plan, q, V, r->l[q]);
        whale_session_free(s);
    }
}

/* mixed: every prompt in the first batch; else one prefill batch each */
static void run_together(whale_model *m, int mixed, run_logits *r) {
    int V = whale_model_vocab_size(m);
    whale_err err;
    whale_session *s;
    const whale_session_params p = {NSEQ, CTX, NBATCH};
    CHECK(whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s", err.msg);
    for (int q = 0; q < NSEQ; q++) r->l[q] = calloc((size_t)(1 + STEPS) * V, sizeof(float));
    test_decode_together(s, &plan, mixed, V, r->l);
    for (int q = 0; q < NSEQ; q++)
        CHECK(whale_kv_seq_len(s, q) == prompt_len[q] + steps_of(q), "sequence %d holds %d cells", q,
              whale_kv_seq_len(s, q));
    whale_session_free(s);
}

/* worst |Δ| / max |logit| over every sequence and step */
static double compare(const run_logits *a, const run_logits *b, int V) {
    double worst = 0;
    for (int q = 0; q < NSEQ; q++)
        for (int k = 0; k <= steps_of(q); k++) {
            const float *x = a->l[q] + (size_t)k * V, *y = b->l[q] + (size_t)k * V;
            double d = test_max_abs_diff(x, y, V) / test_max_abs(y, V);
            if (d > worst) worst = d;
        }
    return worst;
}

static void check_cells(whale_model *m) {
    int V = whale_model_vocab_size(m);
    whale_err err;
    whale_session *s;
    const whale_session_params p = {3, CTX, NBATCH};
    CHECK(whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s", err.msg);
    whale_dbatch b;
    whale_dbatch_init(&b, NBATCH, &err);
    float *l0 = malloc(sizeof(float) * V), *l1 = malloc(sizeof(float) * V);
    /* sequence 0: 13 tokens; sequence 2 gets a copy of its first 9 cells */
    for (int i = 0; i < 13; i++) whale_dbatch_add(&b, test_token_at(4, i, V), i, 0, 0, &err);
    CHECK(whale_session_decode(s, &b, NULL, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_copy(s, 0, 2, 9, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_seq_len(s, 2) == 9, "copy holds %d cells", whale_kv_seq_len(s, 2));
    CHECK(whale_kv_seq_copy(s, 0, 1, 14, &err) == WHALE_ERR_RANGE, "copied more cells than held");
    /* the copy continued with token 9 = sequence 0 cut to 9 and continued */
    whale_dbatch_clear(&b);
    whale_dbatch_add(&b, test_token_at(4, 9, V), 9, 2, 1, &err);
    CHECK(whale_session_decode(s, &b, l1, &err) == WHALE_OK, "%s", err.msg);
    whale_kv_seq_keep(s, 0, 9);
    CHECK(whale_kv_seq_len(s, 0) == 9, "cut to %d", whale_kv_seq_len(s, 0));
    whale_dbatch_clear(&b);
    whale_dbatch_add(&b, test_token_at(4, 9, V), 9, 0, 1, &err);
    CHECK(whale_session_decode(s, &b, l0, &err) == WHALE_OK, "%s", err.msg);
    CHECK(memcmp(l0, l1, sizeof(float) * V) == 0, "a copied prefix continues differently (max |diff| %g)",
          test_max_abs_diff(l0, l1, V));

    /* refused batches change nothing */
    struct {
        int32_t tok, pos, seq;
        const char *what;
    } bad[][2] = {
        {{1, 10, 0, "ok"}, {1, 11, 1, "position 11 does not continue sequence 1"}},
        {{1, 10, 0, "ok"}, {1, 0, 5, "sequence id outside the session"}},
        {{1, 10, 0, "ok"}, {V, 0, 1, "token id outside the vocabulary"}},
        {{1, 10, 0, "ok"}, {1, 9, 0, "position going back"}},
        {{1, 10, 0, "ok"}, {1, 11, 0, "ok"}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        whale_dbatch_clear(&b);
        for (int j = 0; j < 2; j++) whale_dbatch_add(&b, bad[i][j].tok, bad[i][j].pos, bad[i][j].seq, 1, &err);
        int want_ok = strcmp(bad[i][1].what, "ok") == 0;
        whale_code c = whale_session_decode(s, &b, NULL, &err);
        CHECK((c == WHALE_OK) == want_ok, "%s: got %s (%s)", bad[i][1].what, whale_code_name(c), err.msg);
        if (!want_ok) CHECK(whale_kv_seq_len(s, 0) == 10 && whale_kv_seq_len(s, 1) == 0, "a refused batch moved cells");
    }
    /* sequence 1's tokens split by sequence 0's */
    whale_dbatch_clear(&b);
    whale_dbatch_add(&b, 1, 0, 1, 0, &err), whale_dbatch_add(&b, 1, 12, 0, 0, &err), whale_dbatch_add(&b, 1, 1, 1, 0, &err);
    CHECK(whale_session_decode(s, &b, NULL, &err) == WHALE_ERR_ARG && strstr(err.msg, "not consecutive"), "%s",
          err.msg);
    /* the context is full at CTX cells */
    whale_kv_seq_keep(s, 1, 0);
    whale_dbatch_clear(&b);
    for (int i = 0; i <= CTX; i++) whale_dbatch_add(&b, 1, i, 1, 0, &err);
    CHECK(whale_session_decode(s, &b, NULL, &err) == WHALE_ERR_RANGE && strstr(err.msg, "exceeds"), "%s", err.msg);
    CHECK(whale_kv_seq_len(s, 1) == 0, "overflow moved cells");
    /* too many tokens for the work buffers */
    whale_dbatch big;
    whale_dbatch_init(&big, NBATCH + 1, &err);
    for (int i = 0; i <= NBATCH; i++) whale_dbatch_add(&big, 1, i, i % 3, 0, &err);
    CHECK(whale_session_decode(s, &big, NULL, &err) == WHALE_ERR_ARG, "an oversized batch was run");
    whale_dbatch_free(&big);
    free(l0);
    free(l1);
    whale_dbatch_free(&b);
    whale_session_free(s);
}

/* whale_kv_commit writes only the cells no sequence holds: a sequence
 * continues with the same logits, bit for bit, as in a session where the
 * cache was not committed. */
static void check_commit(whale_model *m) {
    int V = whale_model_vocab_size(m);
    whale_err err;
    whale_dbatch b;
    whale_dbatch_init(&b, NBATCH, &err);
    float *l[2] = {malloc(sizeof(float) * V), malloc(sizeof(float) * V)};
    const whale_session_params p = {2, CTX, NBATCH};
    for (int commit = 0; commit < 2; commit++) {
        whale_session *s;
        CHECK(whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s", err.msg);
        whale_dbatch_clear(&b);
        for (int i = 0; i < 11; i++) whale_dbatch_add(&b, test_token_at(5, i, V), i, 1, 0, &err);
        CHECK(whale_session_decode(s, &b, NULL, &err) == WHALE_OK, "%s", err.msg);
        if (commit) whale_kv_commit(s);
        CHECK(whale_kv_seq_len(s, 0) == 0 && whale_kv_seq_len(s, 1) == 11, "lengths moved");
        whale_dbatch_clear(&b);
        whale_dbatch_add(&b, test_token_at(5, 11, V), 11, 1, 1, &err);
        CHECK(whale_session_decode(s, &b, l[commit], &err) == WHALE_OK, "%s", err.msg);
        whale_session_free(s);
    }
    CHECK(memcmp(l[0], l[1], sizeof(float) * V) == 0, "a committed cache changed held cells (max |diff| %g)",
          test_max_abs_diff(l[0], l[1], V));
    free(l[0]);
    free(l[1]);
    whale_dbatch_free(&b);
}

/* An abort callback stops a decode before a layer, and the cells stay. */
static int calls_left;
static int stop_after(void *user) {
    (void)user;
    return calls_left-- <= 0;
}

static void check_abort(whale_model *m) {
    int V = whale_model_vocab_size(m);
    whale_err err;
    whale_session *s;
    const whale_session_params p = {2, CTX, NBATCH};
    CHECK(whale_session_new_batched(m, &p, &s, &err) == WHALE_OK, "%s", err.msg);
    whale_dbatch b;
    whale_dbatch_init(&b, NBATCH, &err);
    for (int i = 0; i < 5; i++) whale_dbatch_add(&b, test_token_at(1, i, V), i, 1, i == 4, &err);
    float *l0 = malloc(sizeof(float) * V), *l1 = malloc(sizeof(float) * V);
    calls_left = 1; /* the first layer runs, the second is refused */
    whale_session_set_abort(s, stop_after, NULL);
    CHECK(whale_session_decode(s, &b, l0, &err) == WHALE_ERR_ABORTED, "abort ignored: %s", err.msg);
    CHECK(whale_kv_seq_len(s, 1) == 0, "an aborted decode advanced the cells to %d", whale_kv_seq_len(s, 1));
    whale_session_set_abort(s, NULL, NULL);
    CHECK(whale_session_decode(s, &b, l0, &err) == WHALE_OK, "%s", err.msg);
    whale_kv_seq_keep(s, 1, 0);
    CHECK(whale_session_decode(s, &b, l1, &err) == WHALE_OK, "%s", err.msg);
    CHECK(memcmp(l0, l1, sizeof(float) * V) == 0, "a decode after an abort differs");
    free(l0), free(l1);
    whale_dbatch_free(&b);
    whale_session_free(s);
}

/* The cache grows with the sequences; the work buffers follow n_batch. */
static void check_memory(whale_model *m) {
    whale_err err;
    whale_session *one, *eight;
    const whale_session_params p1 = {1, CTX, NBATCH}, p8 = {8, CTX, NBATCH};
    CHECK(whale_session_new_batched(m, &p1, &one, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_session_new_batched(m, &p8, &eight, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_kv_bytes(eight) == 8 * whale_kv_bytes(one), "cache %zu vs %zu", whale_kv_bytes(eight),
          whale_kv_bytes(one));
    size_t a1 = whale_session_activation_bytes(one, NULL), a8 = whale_session_activation_bytes(eight, NULL);
    CHECK(a8 - a1 < 64 * 1024, "activations %zu for 8 sequences vs %zu for 1", a8, a1);
    whale_session_params got = whale_session_get_params(eight);
    CHECK(got.n_seq == 8 && got.n_ctx == CTX && got.n_batch == NBATCH, "params %d %d %d", got.n_seq, got.n_ctx,
          got.n_batch);
    whale_session_free(one);
    whale_session_free(eight);
}

/* nanowhale: "together" again with the experts one by one (moe's loop)
 * gives the same bits as with them grouped. */
static void check_moe_grouped(whale_model *m, const char *name, const run_logits *grouped) {
    nw_model *nw = m->impl;
    run_logits loop = {{0}};
    int grouped_max = nw->moe_few_tokens;
    nw->moe_few_tokens = 0;
    run_together(m, 0, &loop);
    nw->moe_few_tokens = grouped_max;
    double d = compare(&loop, grouped, whale_model_vocab_size(m));
    printf("%s %s: experts grouped vs one by one: max |diff| / max |logit| %.3g\n", name,
           whale_dtype_name(whale_model_dtype(m)), d);
    CHECK(d == 0, "%s %s: the grouped experts differ from the per-expert loop (%.3g)", name,
          whale_dtype_name(whale_model_dtype(m)), d);
    free_run(&loop);
}

static void check_model(whale_model *m, const char *name) {
    int V = whale_model_vocab_size(m);
    whale_err err;
    whale_dtype dts[2] = {WHALE_F32, WHALE_BF16};
    int nanowhale = strncmp(name, "nanowhale", 9) == 0;
    for (int d = 0; d < 2; d++) {
        if (d) CHECK(whale_model_set_dtype(m, dts[d], &err) == WHALE_OK, "%s", err.msg);
        run_logits alone = {{0}}, together = {{0}}, mixed = {{0}};
        run_alone(m, &alone);
        run_together(m, 0, &together);
        run_together(m, 1, &mixed);
        double dt = compare(&together, &alone, V), dm = compare(&mixed, &alone, V);
        double bound = dts[d] == WHALE_F32 ? 1e-5 : 2e-2;
        printf("%s %s: 8 sequences decoded together vs alone: max |diff| / max |logit| %.3g; mixed prefill %.3g\n",
               name, whale_dtype_name(dts[d]), dt, dm);
        CHECK(dt == 0, "%s %s: batched decoding differs from decoding alone (%.3g)", name, whale_dtype_name(dts[d]),
              dt);
        CHECK(dm <= bound, "%s %s: mixed prefill differs by %.3g (bound %g)", name, whale_dtype_name(dts[d]), dm,
              bound);
        if (nanowhale) check_moe_grouped(m, name, &together);
        free_run(&alone), free_run(&together), free_run(&mixed);
    }
    if (nanowhale) { /* int8 too, then back to bf16 */
        run_logits together = {{0}};
        CHECK(whale_model_set_dtype(m, WHALE_I8, &err) == WHALE_OK, "%s", err.msg);
        run_together(m, 0, &together);
        check_moe_grouped(m, name, &together);
        free_run(&together);
        CHECK(whale_model_set_dtype(m, WHALE_BF16, &err) == WHALE_OK, "%s", err.msg);
    }
    check_cells(m);
    check_commit(m);
    check_abort(m);
    check_memory(m);
}

int main(void) {
    static const char *const dense[] = {"qwen2-tiny"};
    test_tiny_models(dense, 1, 5, check_model);
    return test_finish("test_batch");
}
