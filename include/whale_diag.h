/*
 * whale_diag.h — numerics diagnostics: per-tensor activation statistics and
 * the first non-finite tensor of a run (whale diagnose, --nan-check).
 *
 * A whale_diag is a collector attached to a session as its trace callback:
 *
 *     whale_diag *d = whale_diag_new(0);
 *     whale_diag_set_model(d, m, &err);            (optional: exact routing margins)
 *     whale_session_set_trace(s, whale_diag_trace, d);
 *     whale_session_forward(s, ...);                (any number of calls)
 *     whale_diag_print_table(d, stdout);
 *
 * Statistics are kept per traced name in first-seen order and summed over
 * every call with that name (a generation traces the same names each step).
 * They describe the values the engine computed (in whatever precision the
 * model runs) and what would happen to exactly those values if they were
 * stored in bf16 or fp16 (rounded to nearest even as src/kernels/convert.c
 * does); see docs/numerics.md.
 *
 * Deviation from a reference run (e.g. bf16 against fp32 on the same input):
 *
 *     whale_diag *ref = whale_diag_new(0);
 *     whale_diag_keep_values(ref, 1 << 30);          keep copies, at most 1 GiB
 *     … trace the fp32 run into ref …
 *     whale_diag_set_reference(d, ref, "fp32");
 *     … trace the bf16 run into d …                  ref must live until here
 *
 * d then compares call k of every traced name with call k of the same name
 * in ref: max |x − x_ref|, ‖x − x_ref‖ / ‖x_ref‖, and per MoE layer the
 * share of tokens whose set of top-k experts differs.
 */
#ifndef WHALE_DIAG_H
#define WHALE_DIAG_H

#include "whale.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct whale_diag whale_diag;

/* nan_check: stop collecting at the first tensor holding a NaN or ±inf (the
 * caller checks whale_diag_failed after each forward and stops). Without
 * it every tensor is measured, and the first non-finite one is still
 * recorded. NULL when out of memory. */
whale_diag *whale_diag_new(int nan_check);
void whale_diag_free(whale_diag *d);

/* Routing margins need the scores the router ranks: scoring function of
 * the config and each layer's gate.bias. Without a model the margins are
 * computed on sqrt(softplus(logit)) without bias (JSON "biased": false). */
whale_code whale_diag_set_model(whale_diag *d, const whale_model *m, whale_err *err);
/* Label for the pass being traced ("forward" unless set); the string must
 * outlive d (a literal). Names traced as "grad.<tensor>" (the backward pass
 * of whale_session_train_step) are always phase "backward". */
void whale_diag_set_phase(whale_diag *d, const char *phase);

/* Keep a copy of every traced fp32 and int32 tensor, call by call, for
 * another collector to compare with (whale_diag_set_reference). At most
 * max_bytes of values in all (0 = no limit): once a call of a name does not
 * fit, no later call of that name is kept, and those calls are not compared.
 * The copies cost exactly the traced bytes; they are freed with d. */
void whale_diag_keep_values(whale_diag *d, size_t max_bytes);
/* Bytes of copies held, and (if not NULL) calls not kept for the limit. */
size_t whale_diag_kept_bytes(const whale_diag *d, int64_t *dropped_calls);
/* Compare every traced tensor with the copy ref kept of the same name and
 * call (same element count and dtype; otherwise that tensor is simply not
 * compared), and every "…ffn.topk_idx" with ref's choice of experts. ref is
 * read while d traces and must not be traced into meanwhile; label (a
 * literal, e.g. "fp32") names the reference in the table and JSON. */
void whale_diag_set_reference(whale_diag *d, const whale_diag *ref, const char *label);

/* The whale_trace_fn: user is the whale_diag. Float tensors are measured;
 * I32 "…ffn.topk_idx" completes the routing margins of its layer. */
void whale_diag_trace(void *user, const char *name, const whale_tensor *t);

/* Statistics of one traced name, summed over its calls. Counts of values
 * below a format's smallest normal, rounding to zero or overflowing are
 * among the finite nonzero values (`nonzero`). */
typedef struct {
    const char *name;  /* valid while d lives */
    const char *phase; /* "forward", "backward" (grad.* names) or as set by whale_diag_set_phase */
    int layer;         /* N of "layers.N." or "grad.layers.N.", else -1 */
    int64_t calls, numel;
    int64_t nan, pos_inf, neg_inf, zeros, nonzero;
    double max_abs;     /* over finite values; 0 if none */
    double rms;         /* over finite values */
    double min_nonzero; /* smallest finite nonzero |x|; 0 if none */
    int64_t bf16_subnormal; /* 0 < |x| < 2^-126: denormal (flushed by hardware bf16 converts) */
    int64_t bf16_zero;      /* rounds to ±0 in bf16 (|x| ≤ 2^-134) */
    int64_t fp16_subnormal; /* 0 < |x| < 2^-14 */
    int64_t fp16_zero;      /* rounds to ±0 in fp16 (|x| ≤ 2^-25 ≈ 2.98e-8) */
    int64_t fp16_overflow;  /* rounds to ±inf in fp16 (|x| ≥ 65520) */
    double bf16_headroom, fp16_headroom; /* log2(format max / max_abs); INFINITY when max_abs is 0 */
    /* against the reference (whale_diag_set_reference), over the elements
     * finite in both runs; all 0 when cmp_calls is 0 (not compared) */
    int64_t cmp_calls;      /* calls compared */
    int64_t cmp_values;     /* elements compared */
    int64_t cmp_nonfinite;  /* elements non-finite in one run but not (or differently) in the other */
    double max_abs_diff;    /* max |x − x_ref| */
    double rel_rms_diff;    /* ‖x − x_ref‖ / ‖x_ref‖ (0 if both are 0, INFINITY if only x_ref is) */
    double lost_to_zero;    /* share of the nonzero x_ref that are exactly 0 here (underflow of this run) */
} whale_diag_stats;

int whale_diag_num_tensors(const whale_diag *d);
/* Statistics of the i-th name in first-seen order; returns 0, or -1 if i is
 * out of range. */
int whale_diag_tensor(const whale_diag *d, int i, whale_diag_stats *out);
/* The same by name; -1 if the name was never traced (or not a float tensor). */
int whale_diag_find(const whale_diag *d, const char *name, whale_diag_stats *out);

/* Routing of one MoE layer over all traced tokens. The margin of a token is
 * the lowest score among its K chosen experts minus the highest among the
 * others (the K-th minus the (K+1)-th score); a small margin means a change
 * of precision could change its experts. */
typedef struct {
    int layer;
    int biased;           /* 1: scores include gate.bias (whale_diag_set_model) */
    int64_t tokens;       /* tokens with finite scores */
    double min_margin;    /* INFINITY when no token was measured */
    double mean_margin;
    int64_t below_1e3;    /* tokens with margin < 1e-3 */
    int64_t bf16_ties;    /* tokens whose choice is undecided once scores are rounded to bf16 */
    int64_t fp16_ties;    /* … to fp16 */
    int64_t cmp_tokens;   /* tokens compared with the reference's top-k (0: no reference) */
    int64_t disagree;     /* of those, tokens whose set of K experts differs */
} whale_diag_routing;

int whale_diag_num_routing(const whale_diag *d);
int whale_diag_routing_at(const whale_diag *d, int i, whale_diag_routing *out);

/* 1 once a traced tensor held a NaN or ±inf. */
int whale_diag_failed(const whale_diag *d);
/* One line describing the first non-finite tensor, or NULL if none:
 * "non-finite value in layers.1.attn.q (forward, call 3, element 517 [4, 5]
 * = nan; 128 of 512 values); last finite inputs: layers.1.attn.q_latent
 * max|x| 4.1 rms 1, …". Valid while d lives. */
const char *whale_diag_report_nan(const whale_diag *d);
/* Where it was: name (valid while d lives), 1-based call of that name and
 * flat element index. Returns 0, or -1 if nothing non-finite was seen. */
int whale_diag_first_nonfinite(const whale_diag *d, const char **name, int64_t *call, int64_t *element);
/* WHALE_OK if nothing was non-finite; otherwise fills err with the report
 * line and returns WHALE_ERR_RANGE. */
whale_code whale_diag_nan_error(const whale_diag *d, whale_err *err);

/* Everything as one JSON object (see docs/numerics.md). run, if not NULL,
 * is JSON object text stored under "run" (model, tokens, dtype …). With a
 * reference, each tensor has "deviation" (null if not compared) and each
 * routing layer "disagree_frac". */
whale_code whale_diag_write_json(const whale_diag *d, FILE *f, const char *run, whale_err *err);
/* The readable table: one row per tensor grouped by layer (gradients in a
 * section of their own after the forward tensors), with deviation columns
 * when there is a reference; then routing, then a summary. */
void whale_diag_print_table(const whale_diag *d, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
