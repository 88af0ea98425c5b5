/* RoPE scaling as transformers' modeling_rope_utils.py computes it (see
 * rope.h). Frequencies are computed in double and rounded to fp32, except
 * the default type, whose tables are k_rope_table's (fp32, as before). */
#include "models/rope.h"

#include "core/core.h"
#include "models/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const type_names[] = {"default", "linear", "dynamic", "yarn", "llama3"};

const char *whale_rope_type_name(whale_rope_type t) { return type_names[t]; }

/* The type's fields from obj (where = "FILE: rope_scaling" in messages). */
static whale_code read_params(const cJSON *obj, const char *where, whale_rope *r, whale_err *err) {
    whale_code e;
    long long v;
    int need_factor = r->type != WHALE_ROPE_DEFAULT, llama3 = r->type == WHALE_ROPE_LLAMA3;
    if (r->type == WHALE_ROPE_YARN && cJSON_GetObjectItemCaseSensitive(obj, "original_max_position_embeddings"))
        need_factor = 0; /* derived from the two windows when absent */
    if ((e = whale_json_float(obj, "factor", need_factor, 0, 0, 1e6, &r->factor, where, err)) ||
        (e = whale_json_int(obj, "original_max_position_embeddings", llama3, 0, 1, 1 << 24, &v, where, err)))
        return e;
    r->original_max = (int)v;
    if (need_factor && !(r->factor > 0))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"factor\" must be > 0", where);
    if (llama3) {
        if ((e = whale_json_float(obj, "low_freq_factor", 1, 0, 1e-6, 1e6, &r->low_freq_factor, where, err)) ||
            (e = whale_json_float(obj, "high_freq_factor", 1, 0, 1e-6, 1e6, &r->high_freq_factor, where, err)))
            return e;
        if (r->high_freq_factor <= r->low_freq_factor)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: high_freq_factor must exceed low_freq_factor", where);
    }
    if (r->type == WHALE_ROPE_DYNAMIC && r->dim <= 2) /* the NTK exponent dim / (dim − 2) */
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: dynamic scaling needs head_dim > 2", where);
    if (r->type == WHALE_ROPE_YARN && !(r->theta > 1)) /* the correction range divides by log(rope_theta) */
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: yarn needs rope_theta > 1", where);
    if (r->type == WHALE_ROPE_YARN) {
        if ((e = whale_json_float(obj, "attention_factor", 0, 0, 0, 1e6, &r->attention_factor, where, err)) ||
            (e = whale_json_float(obj, "beta_fast", 0, 0, 0, 1e6, &r->beta_fast, where, err)) ||
            (e = whale_json_float(obj, "beta_slow", 0, 0, 0, 1e6, &r->beta_slow, where, err)) ||
            (e = whale_json_float(obj, "mscale", 0, 0, 0, 1e6, &r->mscale, where, err)) ||
            (e = whale_json_float(obj, "mscale_all_dim", 0, 0, 0, 1e6, &r->mscale_all_dim, where, err)) ||
            (e = whale_json_bool(obj, "truncate", 1, &r->truncate, where, err)))
            return e;
    }
    return WHALE_OK;
}

/* rope_type (or its old spelling "type") of a scaling object; "default" when absent. */
static whale_code read_type(const cJSON *obj, const char *where, whale_rope *r, whale_err *err) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "rope_type");
    if (!t || cJSON_IsNull(t)) t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    if (!t || cJSON_IsNull(t)) return WHALE_OK;
    if (!cJSON_IsString(t)) return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"rope_type\" must be a string", where);
    for (int k = 0; k < (int)(sizeof type_names / sizeof type_names[0]); k++)
        if (!strcmp(t->valuestring, type_names[k])) {
            r->type = (whale_rope_type)k;
            return WHALE_OK;
        }
    return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                      "%s: rope_type \"%s\" is not supported (default, linear, dynamic, yarn, llama3)", where,
                      t->valuestring);
}

whale_code whale_rope_from_config(const cJSON *cfg, const char *file, int dim, int max_pos, whale_rope *r,
                                  whale_err *err) {
    memset(r, 0, sizeof *r);
    r->dim = dim;
    r->max_pos = max_pos;
    r->truncate = 1;
    char where[600];
    whale_code e;
    double prf;
    if ((e = whale_json_float(cfg, "partial_rotary_factor", 0, 1.0, 0, 1, &prf, file, err))) return e;
    if (prf != 1.0)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported (only 1)", file,
                          prf);
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) { /* transformers 5 */
        if (!cJSON_IsObject(rp)) return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"rope_parameters\" must be an object", file);
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        if (cJSON_IsObject(full)) rp = full; /* per layer type: every layer is full attention */
        snprintf(where, sizeof where, "%s: rope_parameters", file);
        const cJSON *src = cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") ? rp : cfg; /* else top level */
        if ((e = whale_json_float(src, "rope_theta", 1, 0, 1e-6, 1e30, &r->theta, src == rp ? where : file, err)))
            return e;
        if ((e = read_type(rp, where, r, err))) return e;
        return read_params(rp, where, r, err);
    }
    if ((e = whale_json_float(cfg, "rope_theta", 1, 0, 1e-6, 1e30, &r->theta, file, err))) return e;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return WHALE_OK;
    snprintf(where, sizeof where, "%s: rope_scaling", file);
    if (!cJSON_IsObject(rs)) return whale_errf(err, WHALE_ERR_FORMAT, "%s must be an object or null", where);
    if ((e = read_type(rs, where, r, err))) return e;
    return read_params(rs, where, r, err);
}

int whale_rope_window(const whale_rope *r) {
    if (r->type == WHALE_ROPE_DEFAULT || r->type == WHALE_ROPE_LLAMA3) return r->max_pos;
    int orig = r->type == WHALE_ROPE_YARN && r->original_max ? r->original_max : r->max_pos;
    double f = r->type == WHALE_ROPE_YARN && !(r->factor > 0) ? (double)r->max_pos / orig : r->factor;
    double w = floor((double)orig * f);
    if (w > (double)(1 << 24)) w = (double)(1 << 24);
    return w > r->max_pos ? (int)w : r->max_pos;
}

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* _compute_yarn_parameters: the ramp between interpolated (1/factor) and
 * extrapolated frequencies over the correction range of the original window. */
static void yarn(const whale_rope *r, double *inv, double *af) {
    int dim = r->dim, half = dim / 2;
    int orig = r->original_max ? r->original_max : r->max_pos;
    double factor = r->factor > 0 ? r->factor : (double)r->max_pos / orig;
    if (r->attention_factor > 0) *af = r->attention_factor;
    else if (r->mscale > 0 && r->mscale_all_dim > 0)
        *af = yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim);
    else *af = yarn_mscale(factor, 1.0);
    double bf = r->beta_fast > 0 ? r->beta_fast : 32, bs = r->beta_slow > 0 ? r->beta_slow : 1;
    double lo = dim * log(orig / (bf * 2 * M_PI)) / (2 * log(r->theta));
    double hi = dim * log(orig / (bs * 2 * M_PI)) / (2 * log(r->theta));
    if (r->truncate) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    for (int j = 0; j < half; j++) {
        double ramp = ((double)j - lo) / (hi - lo), pos = pow(r->theta, (double)(2 * j) / dim);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double ext = 1 - ramp;
        inv[j] = 1.0 / (factor * pos) * (1 - ext) + 1.0 / pos * ext;
    }
}

/* _compute_llama3_parameters: long wavelengths divided by factor, short ones
 * kept, a smooth blend between. */
static void llama3(const whale_rope *r, double *inv) {
    double old = r->original_max, lf = r->low_freq_factor, hf = r->high_freq_factor;
    double low_wl = old / lf, high_wl = old / hf;
    for (int j = 0; j < r->dim / 2; j++) {
        double f = inv[j], wl = 2 * M_PI / f;
        if (wl > low_wl) f /= r->factor;
        else if (wl >= high_wl) {
            double s = (old / wl - lf) / (hf - lf);
            f = (1 - s) * f / r->factor + s * f;
        }
        inv[j] = f;
    }
}

void whale_rope_inv_freq(const whale_rope *r, int seq_len, float *inv_freq, float *attention_factor) {
    int half = r->dim / 2;
    double inv[2048], af = 1.0, base = r->theta;
    if (half > 2048) half = 2048; /* head_dim is capped at 4096 by the config reader */
    if (r->type == WHALE_ROPE_DYNAMIC) {
        double n = seq_len > r->max_pos ? seq_len : r->max_pos;
        base *= pow(r->factor * n / r->max_pos - (r->factor - 1), (double)r->dim / (r->dim - 2));
    }
    for (int j = 0; j < half; j++) inv[j] = 1.0 / pow(base, (double)(2 * j) / r->dim);
    if (r->type == WHALE_ROPE_LINEAR)
        for (int j = 0; j < half; j++) inv[j] /= r->factor;
    if (r->type == WHALE_ROPE_YARN) yarn(r, inv, &af);
    if (r->type == WHALE_ROPE_LLAMA3) llama3(r, inv);
    for (int j = 0; j < half; j++) inv_freq[j] = (float)inv[j];
    *attention_factor = (float)af;
}

static void fill_rows(const float *inv, float af, int half, const int32_t *pos, int first, int n, float *c, float *s) {
    for (int i = 0; i < n; i++) {
        float p = (float)(pos ? pos[i] : first + i);
        for (int j = 0; j < half; j++) {
            float a = p * inv[j];
            c[(size_t)i * half + j] = cosf(a) * af;
            s[(size_t)i * half + j] = sinf(a) * af;
        }
    }
}

whale_code whale_rope_reserve_scaled(const whale_rope *r, float **cos_t, float **sin_t, int *len, int need,
                                     whale_err *err) {
    if (r->type == WHALE_ROPE_DEFAULT) /* the tables as they always were, bit for bit */
        return whale_rope_reserve(cos_t, sin_t, len, need, r->dim, (float)r->theta, err);
    if (need <= *len) return WHALE_OK;
    size_t half = (size_t)(r->dim / 2), rn;
    if (!whale_mul_size((size_t)need, half * sizeof(float), &rn))
        return whale_errf(err, WHALE_ERR_NOMEM, "RoPE tables for %d positions overflow", need);
    float *c = whale_alloc(rn), *s = whale_alloc(rn), inv[2048], af;
    if (!c || !s) {
        free(c);
        free(s);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for RoPE tables of %d positions", need);
    }
    whale_rope_inv_freq(r, r->max_pos, inv, &af);
    fill_rows(inv, af, (int)half, NULL, 0, need, c, s);
    free(*cos_t);
    free(*sin_t);
    *cos_t = c;
    *sin_t = s;
    *len = need;
    return WHALE_OK;
}

int whale_rope_needs_rows(const whale_rope *r, int seq_len) {
    return r->type == WHALE_ROPE_DYNAMIC && seq_len > r->max_pos;
}

void whale_rope_rows(const whale_rope *r, int seq_len, const int32_t *pos, int n, float *cos_t, float *sin_t) {
    float inv[2048], af;
    whale_rope_inv_freq(r, seq_len, inv, &af);
    fill_rows(inv, af, r->dim / 2, pos, 0, n, cos_t, sin_t);
}
