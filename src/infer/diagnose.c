/* Numerics diagnostics (whale_diag.h): a trace callback that measures every
 * traced tensor against the bf16 and fp16 formats, derives routing margins
 * from the gate logits, remembers the first non-finite tensor and, given a
 * reference run's kept copies, measures how far each tensor and each
 * token's expert choice moved from it. */
#include "whale_diag.h"

#include "kernels/ops.h"

#include "kernels/convert.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum { RING = 4 }; /* tensors remembered as "inputs" of a failure */
/* scoring functions: the NW_SCORE_* values of kernels/ops.h */
enum { SCORE_SQRTSOFTPLUS = NW_SCORE_SQRTSOFTPLUS, SCORE_SOFTMAX = NW_SCORE_SOFTMAX, SCORE_SIGMOID = NW_SCORE_SIGMOID };

#define BF16_MAX 3.3895313892515355e38 /* (2 - 2^-7) * 2^127 */
#define FP16_MAX 65504.0

typedef struct {
    char *name;
    const char *phase; /* "backward" for grad.* names, else the phase when first seen */
    int layer;         /* N of "layers.N." (also after "grad."), -1 for the head and logits */
    int64_t calls, numel, nan, pos_inf, neg_inf, zeros, nonzero;
    int64_t bf16_sub, bf16_zero, fp16_sub, fp16_zero, fp16_ovf;
    double max_abs, sumsq, min_nz;
    /* against the reference run (whale_diag_set_reference) */
    int64_t cmp_calls, cmp_n, cmp_nonfinite, cmp_ref_nz, cmp_lost;
    double cmp_max, cmp_sumsq, cmp_ref_sumsq;
} entry;

typedef struct {
    int layer, biased;
    int64_t tokens, below, bf16_ties, fp16_ties;
    double min_margin, sum_margin;
    int64_t topk_calls, cmp_tokens, disagree; /* routing against the reference run */
} route;

/* Copies of one traced name's values, call by call (whale_diag_keep_values).
 * Only the first nkept calls are kept, so call k of a name always means the
 * same thing in the keeping and the comparing collector. */
typedef struct {
    char *name;
    whale_dtype dtype;
    int64_t calls;    /* calls seen */
    int64_t nkept;    /* the first nkept calls are in vals */
    int dropped;      /* a call went over the limit: keep nothing more of this name */
    void **vals;      /* [nkept] malloc'd copies */
    int64_t *numel;   /* [nkept] */
    int64_t cap;
} kept;

typedef struct { /* one call's summary, for the report of a failure */
    int entry;
    double max_abs, rms;
} recent;

struct whale_diag {
    int nan_check, oom;
    const char *phase;
    entry *e;
    int n, cap, cursor; /* cursor: where the next name is expected (names repeat in order) */
    route *r;
    int nr, rcap;
    /* router description from whale_diag_set_model */
    int scoring, n_layers, n_experts;
    float *bias;             /* [n_layers][n_experts] */
    unsigned char *has_bias; /* [n_layers] */
    /* the last gate logits, waiting for their topk_idx */
    float *glog, *sel;
    size_t glog_cap, sel_cap;
    int glog_layer;
    int64_t glog_T, glog_E;
    /* the first non-finite tensor */
    int failed, bad_entry;
    int64_t bad_call, bad_elem;
    const char *bad_phase;
    recent ring[RING], bad_inputs[RING];
    int ring_n, ring_head, n_bad_inputs;
    char report[WHALE_ERR_MSG_MAX]; /* becomes a whale_err message */
    /* keeping copies for another collector (whale_diag_keep_values) */
    int keep;
    size_t keep_max, kept_bytes;
    int64_t kept_dropped; /* calls not kept because of keep_max */
    kept *k;
    int nk, kcap, kcursor;
    /* comparing with a reference collector's copies (whale_diag_set_reference) */
    const whale_diag *ref;
    const char *ref_label;
    int ref_cursor;
};

whale_diag *whale_diag_new(int nan_check) {
    whale_diag *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->nan_check = nan_check;
    d->phase = "forward";
    d->glog_layer = -1;
    d->bad_entry = -1;
    return d;
}

void whale_diag_free(whale_diag *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) free(d->e[i].name);
    for (int i = 0; i < d->nk; i++) {
        for (int64_t c = 0; c < d->k[i].nkept; c++) free(d->k[i].vals[c]);
        free(d->k[i].vals);
        free(d->k[i].numel);
        free(d->k[i].name);
    }
    free(d->k);
    free(d->e);
    free(d->r);
    free(d->bias);
    free(d->has_bias);
    free(d->glog);
    free(d->sel);
    free(d);
}

void whale_diag_set_phase(whale_diag *d, const char *phase) {
    if (d && phase) d->phase = phase;
}

void whale_diag_keep_values(whale_diag *d, size_t max_bytes) {
    if (!d) return;
    d->keep = 1;
    d->keep_max = max_bytes;
}

size_t whale_diag_kept_bytes(const whale_diag *d, int64_t *dropped_calls) {
    if (dropped_calls) *dropped_calls = d ? d->kept_dropped : 0;
    return d ? d->kept_bytes : 0;
}

void whale_diag_set_reference(whale_diag *d, const whale_diag *ref, const char *label) {
    if (!d) return;
    d->ref = ref;
    d->ref_label = label ? label : "reference";
    d->ref_cursor = 0;
}

whale_code whale_diag_set_model(whale_diag *d, const whale_model *m, whale_err *err) {
    char *json = NULL;
    whale_code c = whale_model_config_json(m, &json, err);
    if (c) return c;
    cJSON *j = cJSON_Parse(json);
    free(json);
    if (!j) return whale_errf(err, WHALE_ERR_INTERNAL, "diagnose: cannot parse the model's config");
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(j, "scoring_func");
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(j, "num_hidden_layers");
    const cJSON *ne = cJSON_GetObjectItemCaseSensitive(j, "n_routed_experts");
    int scoring = SCORE_SQRTSOFTPLUS;
    if (cJSON_IsString(sf) && !strcmp(sf->valuestring, "softmax")) scoring = SCORE_SOFTMAX;
    else if (cJSON_IsString(sf) && !strcmp(sf->valuestring, "sigmoid")) scoring = SCORE_SIGMOID;
    int L = cJSON_IsNumber(nl) ? nl->valueint : 0, E = cJSON_IsNumber(ne) ? ne->valueint : 0;
    cJSON_Delete(j);
    if (L <= 0) return whale_errf(err, WHALE_ERR_INTERNAL, "diagnose: the model's config has no num_hidden_layers");
    if (E <= 0) { /* a dense model (Qwen2): no routing to follow */
        free(d->bias);
        free(d->has_bias);
        d->bias = NULL;
        d->has_bias = NULL;
        d->scoring = scoring;
        d->n_layers = L;
        d->n_experts = 0;
        return WHALE_OK;
    }

    float *bias = calloc((size_t)L * E, sizeof(float));
    unsigned char *has = calloc((size_t)L, 1);
    if (!bias || !has) {
        free(bias);
        free(has);
        return whale_errf(err, WHALE_ERR_NOMEM, "diagnose: out of memory");
    }
    int np = whale_model_num_params(m);
    for (int i = 0; i < np; i++) {
        int l, end = 0;
        const char *name = whale_model_param_name(m, i);
        if (sscanf(name, "model.layers.%d.ffn.gate.bias%n", &l, &end) != 1 || name[end] || l < 0 || l >= L) continue;
        whale_tensor t = whale_model_param(m, i);
        if (t.dtype != WHALE_F32 || whale_shape_numel(t.ndim, t.shape) != E) continue;
        memcpy(bias + (size_t)l * E, t.data, sizeof(float) * E);
        has[l] = 1;
    }
    free(d->bias);
    free(d->has_bias);
    d->bias = bias;
    d->has_bias = has;
    d->scoring = scoring;
    d->n_layers = L;
    d->n_experts = E;
    return WHALE_OK;
}

/* ------------------------------------------------------------------ scanning */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

typedef struct {
    int64_t nan, pos_inf, neg_inf, zeros, nonzero, bf16_sub, bf16_zero, fp16_sub, fp16_zero, fp16_ovf, first_bad;
    double max_abs, sumsq, min_nz;
} scan;

/* One pass over x. The bit pattern sorts values into the ranges that
 * matter; the exact converters are consulted only near a boundary. */
static void scan_floats(const float *x, int64_t n, scan *s) {
    memset(s, 0, sizeof *s);
    s->first_bad = -1;
    s->min_nz = INFINITY;
    float mx = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        uint32_t a = bits(v) & 0x7fffffffu;
        if (a >= 0x7f800000u) {
            if (a > 0x7f800000u) s->nan++;
            else if (v > 0) s->pos_inf++;
            else s->neg_inf++;
            if (s->first_bad < 0) s->first_bad = i;
            continue;
        }
        if (a == 0) {
            s->zeros++;
            continue;
        }
        float m = fabsf(v);
        s->nonzero++;
        s->sumsq += (double)m * m;
        if (m > mx) mx = m;
        if (m < s->min_nz) s->min_nz = m;
        if (a < 0x38800000u) { /* below 2^-14: fp16 subnormal, maybe less */
            s->fp16_sub++;
            if ((whale_float_to_f16(v) & 0x7fffu) == 0) s->fp16_zero++;
            if (a < 0x00800000u) { /* fp32 (and so bf16) subnormal */
                s->bf16_sub++;
                if ((whale_float_to_bf16(v) & 0x7fffu) == 0) s->bf16_zero++;
            }
        } else if (a >= 0x477fe000u && (whale_float_to_f16(v) & 0x7fffu) == 0x7c00u) { /* from 65504 up */
            s->fp16_ovf++;
        }
    }
    s->max_abs = mx;
    if (!s->nonzero) s->min_nz = 0;
}

/* ------------------------------------------------------------------ entries */

static int is_grad(const char *name) { return strncmp(name, "grad.", 5) == 0; }

/* N of "layers.N." or "grad.layers.N."; -1 for other names. */
static int layer_of(const char *name) {
    int l, end = 0;
    if (is_grad(name)) name += 5;
    if (sscanf(name, "layers.%d.%n", &l, &end) == 1 && end > 0) return l;
    return -1;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int find_entry(const whale_diag *d, const char *name) {
    if (d->cursor < d->n && !strcmp(d->e[d->cursor].name, name)) return d->cursor;
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->e[i].name, name)) return i;
    return -1;
}

static int add_entry(whale_diag *d, const char *name) {
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 64;
        entry *grown = realloc(d->e, sizeof(entry) * cap);
        if (!grown) return -1;
        d->e = grown;
        d->cap = cap;
    }
    entry *e = &d->e[d->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return -1;
    /* gradients are traced as "grad.<tensor>" by the backward pass */
    e->phase = is_grad(name) ? "backward" : d->phase;
    e->layer = layer_of(name);
    e->min_nz = INFINITY;
    return d->n++;
}

static route *route_for(whale_diag *d, int layer) {
    for (int i = 0; i < d->nr; i++)
        if (d->r[i].layer == layer) return &d->r[i];
    if (d->nr == d->rcap) {
        int cap = d->rcap ? 2 * d->rcap : 16;
        route *grown = realloc(d->r, sizeof(route) * cap);
        if (!grown) return NULL;
        d->r = grown;
        d->rcap = cap;
    }
    route *r = &d->r[d->nr++];
    memset(r, 0, sizeof *r);
    r->layer = layer;
    r->min_margin = INFINITY;
    return r;
}

/* ------------------------------------------------------------------ routing */

static const char *scoring_name(int scoring) {
    return scoring == SCORE_SOFTMAX ? "softmax(logits)" : scoring == SCORE_SIGMOID ? "sigmoid(logit)"
                                                                                  : "sqrt(softplus(logit))";
}

/* The router's scores exactly as the engine ranks them (k_gate_route):
 * score(logit) + bias, in float. */
static void gate_scores(const whale_diag *d, int layer, const float *logit, int64_t E, float *sel) {
    k_gate_scores(d->scoring, (int)E, logit, sel);
    if (d->has_bias && layer < d->n_layers && d->has_bias[layer] && E == d->n_experts)
        for (int64_t e = 0; e < E; e++) sel[e] += d->bias[(size_t)layer * E + e];
}

static int undecided_bf16(float lo_chosen, float hi_other) {
    return whale_bf16_to_float(whale_float_to_bf16(lo_chosen)) <= whale_bf16_to_float(whale_float_to_bf16(hi_other));
}

static int undecided_fp16(float lo_chosen, float hi_other) {
    return whale_f16_to_float(whale_float_to_f16(lo_chosen)) <= whale_f16_to_float(whale_float_to_f16(hi_other));
}

/* topk_idx [T, K] of the layer whose gate logits were just traced. */
static void route_topk(whale_diag *d, const char *name, const whale_tensor *t) {
    int layer = layer_of(name);
    if (layer < 0 || layer != d->glog_layer || t->ndim != 2 || t->shape[0] != d->glog_T) return;
    d->glog_layer = -1;
    int64_t T = t->shape[0], K = t->shape[1], E = d->glog_E;
    if (K <= 0 || K >= E) return; /* every expert chosen: no margin */
    if (d->sel_cap < (size_t)E) {
        float *grown = realloc(d->sel, sizeof(float) * E);
        if (!grown) {
            d->oom = 1;
            return;
        }
        d->sel = grown;
        d->sel_cap = (size_t)E;
    }
    route *r = route_for(d, layer);
    if (!r) {
        d->oom = 1;
        return;
    }
    r->biased = d->has_bias && layer < d->n_layers && d->has_bias[layer] && E == d->n_experts;
    const int32_t *idx = t->data;
    for (int64_t tok = 0; tok < T; tok++) {
        gate_scores(d, layer, d->glog + tok * E, E, d->sel);
        float lo = INFINITY, hi = -INFINITY;
        int ok = 1;
        for (int64_t k = 0; k < K && ok; k++) {
            int32_t e = idx[tok * K + k];
            if (e < 0 || e >= E || !isfinite(d->sel[e])) ok = 0;
            else {
                lo = fminf(lo, d->sel[e]);
                d->sel[e] = NAN; /* mark chosen */
            }
        }
        for (int64_t e = 0; e < E && ok; e++) {
            if (isnan(d->sel[e])) continue;
            if (!isfinite(d->sel[e])) ok = 0;
            else hi = fmaxf(hi, d->sel[e]);
        }
        if (!ok) continue;
        double margin = (double)lo - hi;
        r->tokens++;
        r->sum_margin += margin;
        if (margin < r->min_margin) r->min_margin = margin;
        if (margin < 1e-3) r->below++;
        r->bf16_ties += undecided_bf16(lo, hi);
        r->fp16_ties += undecided_fp16(lo, hi);
    }
}

static void keep_gate_logits(whale_diag *d, const char *name, const whale_tensor *t) {
    d->glog_layer = -1;
    if (t->ndim != 2) return;
    size_t n = (size_t)t->shape[0] * t->shape[1];
    if (d->glog_cap < n) {
        float *grown = realloc(d->glog, sizeof(float) * n);
        if (!grown) {
            d->oom = 1;
            return;
        }
        d->glog = grown;
        d->glog_cap = n;
    }
    memcpy(d->glog, t->data, sizeof(float) * n);
    d->glog_layer = layer_of(name);
    d->glog_T = t->shape[0];
    d->glog_E = t->shape[1];
}

/* ------------------------------------------------------------------ failures */

static size_t appendf(char *buf, size_t cap, size_t len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t appendf(char *buf, size_t cap, size_t len, const char *fmt, ...) {
    if (len >= cap) return len;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    return k < 0 ? len : len + (size_t)k;
}

static void record_failure(whale_diag *d, int ei, const whale_tensor *t, const scan *s, int64_t numel) {
    const entry *e = &d->e[ei];
    d->failed = 1;
    d->bad_entry = ei;
    d->bad_call = e->calls;
    d->bad_elem = s->first_bad;
    d->bad_phase = is_grad(e->name) ? "backward" : d->phase;
    d->n_bad_inputs = d->ring_n;
    for (int k = 0; k < d->ring_n; k++) /* most recent first */
        d->bad_inputs[k] = d->ring[(d->ring_head - 1 - k + RING) % RING];

    float v = ((const float *)t->data)[s->first_bad];
    char *b = d->report;
    size_t cap = sizeof d->report, n = 0;
    n = appendf(b, cap, n, "non-finite value in %s (%s, call %lld, element %lld", e->name, d->bad_phase,
                (long long)d->bad_call, (long long)d->bad_elem);
    if (t->ndim > 1) { /* the flat index as coordinates, e.g. [token, feature] */
        int64_t rest = s->first_bad, coord[WHALE_MAX_DIMS];
        for (int k = t->ndim - 1; k >= 0; k--) {
            coord[k] = t->shape[k] ? rest % t->shape[k] : 0;
            rest = t->shape[k] ? rest / t->shape[k] : 0;
        }
        for (int k = 0; k < t->ndim; k++) n = appendf(b, cap, n, "%s%lld", k ? ", " : " [", (long long)coord[k]);
        n = appendf(b, cap, n, "]");
    }
    n = appendf(b, cap, n, " = %s; %lld of %lld values non-finite)", isnan(v) ? "nan" : v > 0 ? "+inf" : "-inf",
                (long long)(s->nan + s->pos_inf + s->neg_inf), (long long)numel);
    if (!d->n_bad_inputs) n = appendf(b, cap, n, "; no tensor was traced before it in this pass");
    for (int k = 0; k < d->n_bad_inputs; k++) {
        const recent *r = &d->bad_inputs[k];
        n = appendf(b, cap, n, "%s%s max|x| %.3g rms %.3g", k ? ", " : "; last finite inputs: ", d->e[r->entry].name,
                    r->max_abs, r->rms);
    }
    if (n >= cap) memcpy(b + cap - 4, "...", 4); /* truncated */
}

/* ------------------------------------------------------------------ reference */

static int find_kept(const whale_diag *d, const char *name, int *cursor) {
    if (*cursor < d->nk && !strcmp(d->k[*cursor].name, name)) return (*cursor)++;
    for (int i = 0; i < d->nk; i++)
        if (!strcmp(d->k[i].name, name)) {
            *cursor = i + 1;
            return i;
        }
    return -1;
}

/* A copy of this call's values, unless it would pass the limit. */
static void keep_call(whale_diag *d, const char *name, const whale_tensor *t) {
    int i = find_kept(d, name, &d->kcursor);
    if (i < 0) {
        if (d->nk == d->kcap) {
            int cap = d->kcap ? 2 * d->kcap : 64;
            kept *grown = realloc(d->k, sizeof(kept) * cap);
            if (!grown) {
                d->oom = 1;
                return;
            }
            d->k = grown;
            d->kcap = cap;
        }
        kept *k = &d->k[d->nk];
        memset(k, 0, sizeof *k);
        if (!(k->name = strdup(name))) {
            d->oom = 1;
            return;
        }
        k->dtype = t->dtype;
        i = d->nk++;
        d->kcursor = d->nk;
    }
    kept *k = &d->k[i];
    k->calls++;
    int64_t numel = whale_shape_numel(t->ndim, t->shape);
    size_t bytes = (size_t)numel * whale_dtype_size(t->dtype);
    if (k->dropped || k->dtype != t->dtype || (d->keep_max && d->kept_bytes + bytes > d->keep_max)) {
        k->dropped = 1; /* later calls would no longer line up with their call numbers */
        d->kept_dropped++;
        return;
    }
    if (k->nkept == k->cap) {
        int64_t cap = k->cap ? 2 * k->cap : 4;
        void **v = realloc(k->vals, sizeof(void *) * cap);
        if (v) k->vals = v;
        int64_t *n = v ? realloc(k->numel, sizeof(int64_t) * cap) : NULL;
        if (n) k->numel = n;
        if (!v || !n) {
            d->oom = 1;
            return;
        }
        k->cap = cap;
    }
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy) {
        k->dropped = 1;
        d->oom = 1;
        return;
    }
    memcpy(copy, t->data, bytes);
    k->vals[k->nkept] = copy;
    k->numel[k->nkept++] = numel;
    d->kept_bytes += bytes;
}

/* The reference's copy of call `call` (0-based) of name, or NULL. */
static const void *ref_values(whale_diag *d, const char *name, whale_dtype dt, int64_t call, int64_t numel) {
    const whale_diag *r = d->ref;
    int i = find_kept(r, name, &d->ref_cursor);
    if (i < 0) return NULL;
    const kept *k = &r->k[i];
    if (k->dtype != dt || call >= k->nkept || k->numel[call] != numel) return NULL;
    return k->vals[call];
}

/* Deviation of this call of entry e from the reference's same call. */
static void compare_floats(whale_diag *d, entry *e, const float *x, int64_t n) {
    const float *r = ref_values(d, e->name, WHALE_F32, e->calls - 1, n);
    if (!r) return;
    int64_t cmp = 0, nonfinite = 0, ref_nz = 0, lost = 0;
    double mx = 0, ss = 0, rs = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = x[i], b = r[i];
        if (!isfinite(a) || !isfinite(b)) { /* the same non-finite value in both is no deviation */
            if (!(isnan(a) && isnan(b)) && a != b) nonfinite++;
            continue;
        }
        double diff = fabs((double)a - b);
        cmp++;
        if (diff > mx) mx = diff;
        ss += diff * diff;
        rs += (double)b * b;
        if (b != 0) {
            ref_nz++;
            lost += a == 0; /* underflowed to zero in this run */
        }
    }
    e->cmp_calls++;
    e->cmp_n += cmp;
    e->cmp_nonfinite += nonfinite;
    e->cmp_ref_nz += ref_nz;
    e->cmp_lost += lost;
    e->cmp_sumsq += ss;
    e->cmp_ref_sumsq += rs;
    if (mx > e->cmp_max) e->cmp_max = mx;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Tokens whose set of K experts differs from the reference's (the order
 * within the K does not matter). */
static void compare_topk(whale_diag *d, const char *name, const whale_tensor *t) {
    int layer = layer_of(name);
    if (layer < 0 || t->ndim != 2 || t->shape[1] <= 0 || t->shape[1] > 64) return;
    route *r = route_for(d, layer);
    if (!r) {
        d->oom = 1;
        return;
    }
    int64_t call = r->topk_calls++, T = t->shape[0], K = t->shape[1];
    const int32_t *ref = ref_values(d, name, WHALE_I32, call, T * K), *x = t->data;
    if (!ref) return;
    for (int64_t tok = 0; tok < T; tok++) {
        int32_t a[64], b[64];
        memcpy(a, x + tok * K, sizeof(int32_t) * K);
        memcpy(b, ref + tok * K, sizeof(int32_t) * K);
        qsort(a, (size_t)K, sizeof *a, cmp_i32);
        qsort(b, (size_t)K, sizeof *b, cmp_i32);
        r->cmp_tokens++;
        r->disagree += memcmp(a, b, sizeof(int32_t) * K) != 0;
    }
}

/* ------------------------------------------------------------------ callback */

void whale_diag_trace(void *user, const char *name, const whale_tensor *t) {
    whale_diag *d = user;
    if (!d || !name || !t || (d->nan_check && d->failed)) return;
    if (d->keep && (t->dtype == WHALE_F32 || t->dtype == WHALE_I32)) keep_call(d, name, t);
    if (t->dtype == WHALE_I32) {
        if (ends_with(name, ".topk_idx")) {
            route_topk(d, name, t);
            if (d->ref) compare_topk(d, name, t);
        }
        return;
    }
    if (t->dtype != WHALE_F32) return;
    int ei = find_entry(d, name);
    if (ei < 0 && (ei = add_entry(d, name)) < 0) {
        d->oom = 1;
        return;
    }
    d->cursor = ei + 1;
    if (ei == 0) d->ring_n = 0; /* the first name again: a new pass, whose inputs are not the last pass's outputs */
    int64_t numel = whale_shape_numel(t->ndim, t->shape);
    scan s;
    scan_floats(t->data, numel, &s);

    entry *e = &d->e[ei];
    e->calls++;
    e->numel += numel;
    e->nan += s.nan;
    e->pos_inf += s.pos_inf;
    e->neg_inf += s.neg_inf;
    e->zeros += s.zeros;
    e->nonzero += s.nonzero;
    e->bf16_sub += s.bf16_sub;
    e->bf16_zero += s.bf16_zero;
    e->fp16_sub += s.fp16_sub;
    e->fp16_zero += s.fp16_zero;
    e->fp16_ovf += s.fp16_ovf;
    e->sumsq += s.sumsq;
    if (s.max_abs > e->max_abs) e->max_abs = s.max_abs;
    if (s.nonzero && s.min_nz < e->min_nz) e->min_nz = s.min_nz;

    if (d->ref) compare_floats(d, e, t->data, numel);
    if (s.first_bad >= 0 && !d->failed) record_failure(d, ei, t, &s, numel);
    int64_t finite = s.nonzero + s.zeros;
    d->ring[d->ring_head] = (recent){ei, s.max_abs, finite ? sqrt(s.sumsq / finite) : 0};
    d->ring_head = (d->ring_head + 1) % RING;
    if (d->ring_n < RING) d->ring_n++;

    if (ends_with(name, ".gate_logits")) keep_gate_logits(d, name, t);
}

/* ------------------------------------------------------------------ queries */

int whale_diag_num_tensors(const whale_diag *d) { return d ? d->n : 0; }

static double headroom(double fmax, double max_abs) { return max_abs > 0 ? log2(fmax / max_abs) : INFINITY; }

int whale_diag_tensor(const whale_diag *d, int i, whale_diag_stats *out) {
    if (!d || i < 0 || i >= d->n) return -1;
    const entry *e = &d->e[i];
    int64_t finite = e->nonzero + e->zeros;
    *out = (whale_diag_stats){
        .name = e->name,
        .phase = e->phase,
        .layer = e->layer,
        .calls = e->calls,
        .numel = e->numel,
        .nan = e->nan,
        .pos_inf = e->pos_inf,
        .neg_inf = e->neg_inf,
        .zeros = e->zeros,
        .nonzero = e->nonzero,
        .max_abs = e->max_abs,
        .rms = finite ? sqrt(e->sumsq / finite) : 0,
        .min_nonzero = e->nonzero ? e->min_nz : 0,
        .bf16_subnormal = e->bf16_sub,
        .bf16_zero = e->bf16_zero,
        .fp16_subnormal = e->fp16_sub,
        .fp16_zero = e->fp16_zero,
        .fp16_overflow = e->fp16_ovf,
        .bf16_headroom = headroom(BF16_MAX, e->max_abs),
        .fp16_headroom = headroom(FP16_MAX, e->max_abs),
        .cmp_calls = e->cmp_calls,
        .cmp_values = e->cmp_n,
        .cmp_nonfinite = e->cmp_nonfinite,
        .max_abs_diff = e->cmp_max,
        .rel_rms_diff = e->cmp_ref_sumsq > 0 ? sqrt(e->cmp_sumsq / e->cmp_ref_sumsq)
                        : e->cmp_sumsq > 0   ? INFINITY
                                             : 0,
        .lost_to_zero = e->cmp_ref_nz ? (double)e->cmp_lost / e->cmp_ref_nz : 0,
    };
    return 0;
}

int whale_diag_find(const whale_diag *d, const char *name, whale_diag_stats *out) {
    for (int i = 0; d && i < d->n; i++)
        if (!strcmp(d->e[i].name, name)) return whale_diag_tensor(d, i, out);
    return -1;
}

int whale_diag_num_routing(const whale_diag *d) { return d ? d->nr : 0; }

int whale_diag_routing_at(const whale_diag *d, int i, whale_diag_routing *out) {
    if (!d || i < 0 || i >= d->nr) return -1;
    const route *r = &d->r[i];
    *out = (whale_diag_routing){
        .layer = r->layer,
        .biased = r->biased,
        .tokens = r->tokens,
        .min_margin = r->min_margin,
        .mean_margin = r->tokens ? r->sum_margin / r->tokens : NAN,
        .below_1e3 = r->below,
        .bf16_ties = r->bf16_ties,
        .fp16_ties = r->fp16_ties,
        .cmp_tokens = r->cmp_tokens,
        .disagree = r->disagree,
    };
    return 0;
}

int whale_diag_failed(const whale_diag *d) { return d && d->failed; }

const char *whale_diag_report_nan(const whale_diag *d) { return d && d->failed ? d->report : NULL; }

int whale_diag_first_nonfinite(const whale_diag *d, const char **name, int64_t *call, int64_t *element) {
    if (!d || !d->failed) return -1;
    if (name) *name = d->e[d->bad_entry].name;
    if (call) *call = d->bad_call;
    if (element) *element = d->bad_elem;
    return 0;
}

whale_code whale_diag_nan_error(const whale_diag *d, whale_err *err) {
    if (!d || !d->failed) return WHALE_OK;
    return whale_errf(err, WHALE_ERR_RANGE, "%s", d->report);
}

/* ------------------------------------------------------------------ output */

static double frac(int64_t k, int64_t n) { return n ? (double)k / n : 0; }

static void add_num_or_null(cJSON *o, const char *key, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

static cJSON *stats_json(const whale_diag *d, const whale_diag_stats *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", s->name);
    cJSON_AddStringToObject(o, "phase", s->phase);
    cJSON_AddNumberToObject(o, "layer", s->layer);
    cJSON_AddNumberToObject(o, "calls", (double)s->calls);
    cJSON_AddNumberToObject(o, "numel", (double)s->numel);
    cJSON_AddNumberToObject(o, "max_abs", s->max_abs);
    cJSON_AddNumberToObject(o, "rms", s->rms);
    cJSON_AddNumberToObject(o, "min_nonzero", s->min_nonzero);
    cJSON_AddNumberToObject(o, "nan", (double)s->nan);
    cJSON_AddNumberToObject(o, "pos_inf", (double)s->pos_inf);
    cJSON_AddNumberToObject(o, "neg_inf", (double)s->neg_inf);
    cJSON_AddNumberToObject(o, "zeros", (double)s->zeros);
    cJSON_AddNumberToObject(o, "nonzero", (double)s->nonzero);
    cJSON *b = cJSON_AddObjectToObject(o, "bf16");
    cJSON_AddNumberToObject(b, "subnormal_frac", frac(s->bf16_subnormal, s->nonzero));
    cJSON_AddNumberToObject(b, "zero_frac", frac(s->bf16_zero, s->nonzero));
    if (isfinite(s->bf16_headroom)) cJSON_AddNumberToObject(b, "headroom_bits", s->bf16_headroom);
    else cJSON_AddNullToObject(b, "headroom_bits");
    cJSON *h = cJSON_AddObjectToObject(o, "fp16");
    cJSON_AddNumberToObject(h, "subnormal_frac", frac(s->fp16_subnormal, s->nonzero));
    cJSON_AddNumberToObject(h, "zero_frac", frac(s->fp16_zero, s->nonzero));
    cJSON_AddNumberToObject(h, "overflow_frac", frac(s->fp16_overflow, s->nonzero));
    if (isfinite(s->fp16_headroom)) cJSON_AddNumberToObject(h, "headroom_bits", s->fp16_headroom);
    else cJSON_AddNullToObject(h, "headroom_bits");
    if (d->ref && s->cmp_calls) {
        cJSON *v = cJSON_AddObjectToObject(o, "deviation");
        cJSON_AddNumberToObject(v, "calls", (double)s->cmp_calls);
        cJSON_AddNumberToObject(v, "values", (double)s->cmp_values);
        cJSON_AddNumberToObject(v, "max_abs_diff", s->max_abs_diff);
        add_num_or_null(v, "rel_rms_diff", s->rel_rms_diff);
        cJSON_AddNumberToObject(v, "lost_to_zero_frac", s->lost_to_zero);
        cJSON_AddNumberToObject(v, "nonfinite_mismatch", (double)s->cmp_nonfinite);
    } else if (d->ref) {
        cJSON_AddNullToObject(o, "deviation");
    }
    return o;
}

whale_code whale_diag_write_json(const whale_diag *d, FILE *f, const char *run, whale_err *err) {
    if (d->oom) return whale_errf(err, WHALE_ERR_NOMEM, "diagnose: ran out of memory while collecting statistics");
    cJSON *j = cJSON_CreateObject();
    if (run) {
        cJSON *r = cJSON_Parse(run);
        if (!r) {
            cJSON_Delete(j);
            return whale_errf(err, WHALE_ERR_ARG, "diagnose: the run description is not valid JSON");
        }
        cJSON_AddItemToObject(j, "run", r);
    }
    if (d->ref) cJSON_AddStringToObject(j, "reference", d->ref_label);
    else cJSON_AddNullToObject(j, "reference");
    cJSON *arr = cJSON_AddArrayToObject(j, "tensors");
    for (int i = 0; i < d->n; i++) {
        whale_diag_stats s;
        whale_diag_tensor(d, i, &s);
        cJSON_AddItemToArray(arr, stats_json(d, &s));
    }
    cJSON *ra = cJSON_AddArrayToObject(j, "routing");
    for (int i = 0; i < d->nr; i++) {
        whale_diag_routing r;
        whale_diag_routing_at(d, i, &r);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", r.layer);
        cJSON_AddBoolToObject(o, "biased", r.biased);
        cJSON_AddStringToObject(o, "score", scoring_name(d->scoring));
        cJSON_AddNumberToObject(o, "tokens", (double)r.tokens);
        if (r.tokens) {
            cJSON_AddNumberToObject(o, "min_margin", r.min_margin);
            cJSON_AddNumberToObject(o, "mean_margin", r.mean_margin);
        } else {
            cJSON_AddNullToObject(o, "min_margin");
            cJSON_AddNullToObject(o, "mean_margin");
        }
        cJSON_AddNumberToObject(o, "below_1e-3_frac", frac(r.below_1e3, r.tokens));
        cJSON_AddNumberToObject(o, "bf16_undecided_frac", frac(r.bf16_ties, r.tokens));
        cJSON_AddNumberToObject(o, "fp16_undecided_frac", frac(r.fp16_ties, r.tokens));
        if (d->ref) {
            cJSON_AddNumberToObject(o, "compared_tokens", (double)r.cmp_tokens);
            if (r.cmp_tokens) cJSON_AddNumberToObject(o, "disagree_frac", frac(r.disagree, r.cmp_tokens));
            else cJSON_AddNullToObject(o, "disagree_frac");
        }
        cJSON_AddItemToArray(ra, o);
    }
    if (d->failed) {
        cJSON *o = cJSON_AddObjectToObject(j, "first_nonfinite");
        cJSON_AddStringToObject(o, "name", d->e[d->bad_entry].name);
        cJSON_AddStringToObject(o, "phase", d->bad_phase);
        cJSON_AddNumberToObject(o, "call", (double)d->bad_call);
        cJSON_AddNumberToObject(o, "element", (double)d->bad_elem);
        cJSON *in = cJSON_AddArrayToObject(o, "previous");
        for (int k = 0; k < d->n_bad_inputs; k++) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "name", d->e[d->bad_inputs[k].entry].name);
            cJSON_AddNumberToObject(p, "max_abs", d->bad_inputs[k].max_abs);
            cJSON_AddNumberToObject(p, "rms", d->bad_inputs[k].rms);
            cJSON_AddItemToArray(in, p);
        }
        cJSON_AddStringToObject(o, "message", d->report);
    } else {
        cJSON_AddNullToObject(j, "first_nonfinite");
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return whale_errf(err, WHALE_ERR_NOMEM, "diagnose: out of memory writing JSON");
    int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF;
    free(text);
    if (bad || fflush(f)) return whale_errf(err, WHALE_ERR_IO, "diagnose: cannot write the JSON report");
    return WHALE_OK;
}

/* A percentage that keeps small nonzero shares visible ("<0.001"). */
static const char *pct(char *buf, size_t cap, int64_t k, int64_t n) {
    double p = 100.0 * frac(k, n);
    if (k == 0) snprintf(buf, cap, "0");
    else if (p < 0.001) snprintf(buf, cap, "<0.001");
    else snprintf(buf, cap, "%.3g", p);
    return buf;
}

static const char *bits_str(char *buf, size_t cap, double h) {
    if (isfinite(h)) snprintf(buf, cap, "%.1f", h);
    else snprintf(buf, cap, "-");
    return buf;
}

/* One summary line: how many tensors have any value counted by the int64_t
 * field at offset `field` of entry, and the three with the largest share. */
static void print_worst(const whale_diag *d, FILE *f, const char *what, size_t field) {
    int top[3] = {-1, -1, -1}, count = 0;
    double share[3] = {0, 0, 0};
    for (int i = 0; i < d->n; i++) {
        int64_t k;
        memcpy(&k, (const char *)&d->e[i] + field, sizeof k);
        if (!k) continue;
        count++;
        double sh = frac(k, d->e[i].nonzero);
        for (int j = 0; j < 3; j++)
            if (top[j] < 0 || sh > share[j]) {
                for (int m = 2; m > j; m--) top[m] = top[m - 1], share[m] = share[m - 1];
                top[j] = i, share[j] = sh;
                break;
            }
    }
    fprintf(f, "  %-20s %s", what, count ? "" : "none");
    for (int j = 0; j < 3 && top[j] >= 0; j++) {
        char p[16];
        int64_t k;
        memcpy(&k, (const char *)&d->e[top[j]] + field, sizeof k);
        fprintf(f, "%s%s %s%%", j ? ", " : "", d->e[top[j]].name, pct(p, sizeof p, k, d->e[top[j]].nonzero));
    }
    if (count > 3) fprintf(f, " (%d tensors)", count);
    fputc('\n', f);
}

/* The part of a name shown in the op column: after "layers.N." (gradients
 * keep their "grad." prefix: grad.ffn.out). */
static void op_name(const entry *e, char *buf, size_t cap) {
    const char *n = e->name, *pre = "";
    if (is_grad(n)) {
        pre = "grad.";
        n += 5;
    }
    if (e->layer >= 0) {
        const char *dot = strchr(n + 7, '.'); /* after "layers.N" */
        if (dot) n = dot + 1;
    }
    snprintf(buf, cap, "%s%s", pre, n);
}

static void print_row(const whale_diag *d, FILE *f, int i) {
    char p[7][16], hb[2][16], lay[16] = "-", op[128];
    whale_diag_stats s;
    whale_diag_tensor(d, i, &s);
    const entry *e = &d->e[i];
    if (e->layer >= 0) snprintf(lay, sizeof lay, "%d", e->layer);
    op_name(e, op, sizeof op);
    fprintf(f, "%-5s %-26s %10.3g %10.3g %7lld %7s | %7s %7s %6s | %7s %7s %7s %6s", lay, op, s.max_abs, s.rms,
            (long long)(s.nan + s.pos_inf + s.neg_inf), pct(p[0], 16, s.zeros, s.numel),
            pct(p[1], 16, s.bf16_subnormal, s.nonzero), pct(p[2], 16, s.bf16_zero, s.nonzero),
            bits_str(hb[0], 16, s.bf16_headroom), pct(p[3], 16, s.fp16_subnormal, s.nonzero),
            pct(p[4], 16, s.fp16_zero, s.nonzero), pct(p[5], 16, s.fp16_overflow, s.nonzero),
            bits_str(hb[1], 16, s.fp16_headroom));
    if (d->ref) {
        if (s.cmp_calls)
            fprintf(f, " | %9.3g %9.3g %7s", s.max_abs_diff, s.rel_rms_diff,
                    pct(p[6], 16, e->cmp_lost, e->cmp_ref_nz));
        else
            fprintf(f, " | %9s %9s %7s", "-", "-", "-");
    }
    fputc('\n', f);
}

/* The compared tensor of a phase that moved most from the reference. */
static int worst_deviation(const whale_diag *d, int backward) {
    int worst = -1;
    double w = -1;
    for (int i = 0; i < d->n; i++) {
        whale_diag_stats s;
        whale_diag_tensor(d, i, &s);
        if (!s.cmp_calls || is_grad(s.name) != backward) continue;
        double r = isnan(s.rel_rms_diff) ? INFINITY : s.rel_rms_diff;
        if (r > w) w = r, worst = i;
    }
    return worst;
}

void whale_diag_print_table(const whale_diag *d, FILE *f) {
    char p[6][16];
    int n_grad = 0;
    for (int i = 0; i < d->n; i++) n_grad += is_grad(d->e[i].name);
    fprintf(f, "%71s| %-23s| %-31s%s%s\n", "", "bf16", "fp16", d->ref ? "| vs " : "", d->ref ? d->ref_label : "");
    fprintf(f, "%-5s %-26s %10s %10s %7s %7s | %7s %7s %6s | %7s %7s %7s %6s", "layer", "tensor", "max|x|", "rms",
            "nonfin", "zero%", "subn%", "->0%", "head", "subn%", "->0%", "ovf%", "head");
    if (d->ref) fprintf(f, " | %9s %9s %7s", "max|dx|", "rel rms", "lost0%");
    fputc('\n', f);
    /* forward tensors, then the gradients of the backward pass */
    for (int pass = 0; pass < 2; pass++) {
        int last_layer = -2, printed = 0;
        if (pass == 1 && n_grad)
            fprintf(f, "\nbackward: gradients of the loss, grad.X = dloss/dX (phase backward)\n");
        for (int i = 0; i < d->n; i++) {
            const entry *e = &d->e[i];
            if (is_grad(e->name) != pass) continue;
            if (e->layer != last_layer && printed) fputc('\n', f);
            last_layer = e->layer;
            printed++;
            print_row(d, f, i);
        }
    }
    if (d->nr) {
        fprintf(f, "\nrouting: margin = K-th minus (K+1)-th score, score = %s + gate.bias"
                   " (bias \"no\": scored without it)\n",
                scoring_name(d->scoring));
        fprintf(f, "%-5s %4s %8s %11s %11s %9s %11s %11s", "layer", "bias", "tokens", "min", "mean", "<1e-3 %",
                "bf16 tie %", "fp16 tie %");
        if (d->ref) fprintf(f, "  %s", "experts differ %");
        fputc('\n', f);
        for (int i = 0; i < d->nr; i++) {
            whale_diag_routing r;
            whale_diag_routing_at(d, i, &r);
            fprintf(f, "%-5d %4s %8lld %11.3g %11.3g %9s %11s %11s", r.layer, r.biased ? "yes" : "no",
                    (long long)r.tokens, r.tokens ? r.min_margin : NAN, r.mean_margin,
                    pct(p[0], 16, r.below_1e3, r.tokens), pct(p[1], 16, r.bf16_ties, r.tokens),
                    pct(p[2], 16, r.fp16_ties, r.tokens));
            if (d->ref) {
                if (r.cmp_tokens) fprintf(f, "  %16s", pct(p[3], 16, r.disagree, r.cmp_tokens));
                else fprintf(f, "  %16s", "-");
            }
            fputc('\n', f);
        }
    }

    /* the lines to read first */
    int widest = -1; /* the largest |x| has the least headroom in both formats */
    for (int i = 0; i < d->n; i++)
        if (d->e[i].nonzero && (widest < 0 || d->e[i].max_abs > d->e[widest].max_abs)) widest = i;
    fprintf(f, "\nsummary\n");
    if (widest >= 0)
        fprintf(f, "  least headroom       %s: max|x| %.4g, fp16 %.1f bits, bf16 %.1f bits\n", d->e[widest].name,
                d->e[widest].max_abs, headroom(FP16_MAX, d->e[widest].max_abs),
                headroom(BF16_MAX, d->e[widest].max_abs));
    print_worst(d, f, "fp16 overflow", offsetof(entry, fp16_ovf));
    print_worst(d, f, "fp16 subnormal", offsetof(entry, fp16_sub));
    print_worst(d, f, "rounds to 0 in fp16", offsetof(entry, fp16_zero));
    print_worst(d, f, "bf16 subnormal", offsetof(entry, bf16_sub));
    print_worst(d, f, "rounds to 0 in bf16", offsetof(entry, bf16_zero));
    if (d->ref) {
        for (int back = 0; back < 2; back++) {
            int w = worst_deviation(d, back);
            if (w < 0) continue;
            whale_diag_stats s;
            whale_diag_tensor(d, w, &s);
            fprintf(f, "  %-20s %s: rel rms %.3g, max|dx| %.3g\n", back ? "largest grad dev." : "largest deviation",
                    s.name, s.rel_rms_diff, s.max_abs_diff);
        }
        int lost = -1, count = 0, not_compared = 0;
        for (int i = 0; i < d->n; i++) {
            const entry *e = &d->e[i];
            not_compared += !e->cmp_calls;
            if (!e->cmp_lost) continue;
            count++;
            if (lost < 0 || frac(e->cmp_lost, e->cmp_ref_nz) > frac(d->e[lost].cmp_lost, d->e[lost].cmp_ref_nz))
                lost = i;
        }
        if (lost >= 0)
            fprintf(f, "  %-20s %s %s%% of the %s run's nonzero values (%d tensors)\n", "lost to zero",
                    d->e[lost].name, pct(p[0], 16, d->e[lost].cmp_lost, d->e[lost].cmp_ref_nz), d->ref_label, count);
        else
            fprintf(f, "  %-20s none\n", "lost to zero");
        int worst = -1;
        for (int i = 0; i < d->nr; i++)
            if (d->r[i].cmp_tokens &&
                (worst < 0 || frac(d->r[i].disagree, d->r[i].cmp_tokens) > frac(d->r[worst].disagree, d->r[worst].cmp_tokens)))
                worst = i;
        if (worst >= 0 && d->r[worst].disagree)
            fprintf(f, "  %-20s layer %d: %s%% of tokens chose other experts than %s\n", "routing changed",
                    d->r[worst].layer, pct(p[0], 16, d->r[worst].disagree, d->r[worst].cmp_tokens), d->ref_label);
        else if (worst >= 0)
            fprintf(f, "  %-20s none: every token chose the same experts as %s\n", "routing changed", d->ref_label);
        if (not_compared) fprintf(f, "  %-20s %d tensors (no copy of them in the %s run)\n", "not compared",
                                  not_compared, d->ref_label);
    }
    fprintf(f, "  non-finite           %s\n", d->failed ? d->report : "none");
    if (d->oom) fprintf(f, "  (out of memory while collecting: statistics are incomplete)\n");
}
