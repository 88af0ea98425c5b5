/* Family-independent model plumbing: the parameter table, strict binding of
 * checkpoint tensors, loading, saving and config-field helpers. */
#include "models/model.h"

#include "core/core.h"
#include "whale_safetensors.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "kernels/loss.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>

whale_param *whale_model_add_param(whale_model *m, int cap, float **slot, whale_role role, int decay, int used,
                                   int ndim, const int64_t *shape, const char *fmt, ...) {
    if (m->n_params >= cap) return NULL;
    whale_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = ndim;
    for (int i = 0; i < ndim; i++) p->shape[i] = shape[i];
    p->slot = slot;
    p->role = role;
    p->decay = decay;
    p->used = used;
    return p;
}

static int64_t param_numel(const whale_param *p) { return whale_shape_numel(p->ndim, p->shape); }

/* ------------------------------------------------------------ family helpers */

void *whale_bufs_alloc(whale_bufs *b, size_t n, size_t sz, size_t *total) {
    assert(b->n >= 0 && b->n <= b->cap);
    if (b->count_only) {
        *total += n * sz;
        return b;
    }
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        void **grown = realloc(b->ptrs, sizeof(void *) * (size_t)cap);
        if (!grown) return NULL;
        b->ptrs = grown;
        b->cap = cap;
    }
    void *p = whale_alloc(n * sz > 0 ? n * sz : 64);
    if (p) b->ptrs[b->n++] = p;
    *total += n * sz;
    return p;
}

void whale_bufs_free(whale_bufs *b) {
    for (int i = 0; i < b->n; i++) free(b->ptrs[i]);
    free(b->ptrs);
    b->ptrs = NULL;
    b->n = b->cap = 0;
}

whale_code whale_session_alloc_grads(whale_session *s, int count_only, whale_err *err) {
    const whale_model *m = s->model;
    s->n_grad = 0;
    s->grad_offsets = malloc(sizeof(size_t) * (size_t)(m->n_params ? m->n_params : 1));
    if (!s->grad_offsets) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the gradient table");
    /* the trainable parameters first, in order: the vector the ranks
     * exchange; then the buffers of frozen norms and biases */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < m->n_params; i++) {
            const whale_param *p = &m->params[i];
            if (!!p->frozen != pass) continue;
            if (p->frozen && whale_param_is_product_weight(p)) {
                s->grad_offsets[i] = SIZE_MAX;
                continue;
            }
            s->grad_offsets[i] = s->n_grad;
            s->n_grad += (size_t)param_numel(p);
        }
        if (!pass) s->n_grad_train = s->n_grad;
    }
    assert(s->n_grad_train <= s->n_grad); /* the trainable parameters lead the vector */
    s->n_grad_bytes = sizeof(float) * s->n_grad;
    if (!count_only && !(s->grads = whale_calloc(s->n_grad_bytes)) && s->n_grad)
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of gradients", s->n_grad_bytes / 1048576.0);
    return WHALE_OK;
}

size_t whale_lora_work_floats(const whale_model *m) {
    size_t most = 0;
    for (int i = 0; i < m->n_lora; i++) {
        size_t f = (size_t)2 * m->lora[i].rank + (size_t)m->lora[i].cols;
        if (f > most) most = f;
    }
    for (int k = 0; k < m->n_adapters; k++) /* inference only: no dropped-out input */
        if ((size_t)2 * m->adapters[k]->rank > most) most = (size_t)2 * m->adapters[k]->rank;
    return most;
}

void whale_trace_emit(whale_session *s, whale_dtype dt, void *data, int ndim, const int64_t *shape, const char *fmt,
                      ...) {
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    whale_tensor t = {.dtype = dt, .ndim = ndim, .data = data};
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    s->trace(s->trace_user, name, &t);
}

const char *whale_fmt_count(char *buf, int64_t v) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%lld", (long long)v), o = 0;
    for (int i = 0; i < n; i++) {
        if (i && tmp[i - 1] != '-' && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
    return buf;
}

whale_code whale_config_eos(whale_model *m, const cJSON *cfg, const char *file, whale_err *err) {
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id"), *it;
    m->n_eos = 0;
    if (!eos || cJSON_IsNull(eos)) return WHALE_OK;
    if (!cJSON_IsNumber(eos) && !cJSON_IsArray(eos))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"eos_token_id\" must be a number or a list of numbers",
                          file);
    int cap = (int)(sizeof m->eos_ids / sizeof m->eos_ids[0]);
    for (it = cJSON_IsArray(eos) ? eos->child : eos; it; it = cJSON_IsArray(eos) ? it->next : NULL) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"eos_token_id\" must hold integers", file);
        if (m->n_eos == cap)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"eos_token_id\" lists more than %d ids", file, cap);
        double v = it->valuedouble;
        if (v < 0 || v >= m->vocab_size)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: eos_token_id %.0f is outside the vocabulary [0, %d)", file, v,
                              m->vocab_size);
        m->eos_ids[m->n_eos++] = (int32_t)v;
    }
    return WHALE_OK;
}

whale_code whale_model_new_impl(const whale_family_desc *fam, const whale_model_ops *ops, const char *model_type,
                                size_t impl_size, whale_model **out, whale_err *err) {
    *out = NULL;
    whale_model *m = calloc(1, sizeof *m);
    void *impl = calloc(1, impl_size);
    if (!m || !impl) {
        free(m);
        free(impl);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    m->family = fam;
    m->ops = ops;
    m->model_type = model_type;
    m->impl = impl;
    *out = m;
    return WHALE_OK;
}

whale_code whale_model_config_done(whale_model *m, const cJSON *cfg, const char *file, cJSON **config_json, int vocab,
                                   int max_positions, whale_err *err) {
    if (!(*config_json = cJSON_Duplicate(cfg, 1))) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    m->vocab_size = vocab;
    m->max_positions = max_positions;
    return whale_config_eos(m, cfg, file, err); /* a number or a list */
}

whale_code whale_model_alloc_params(whale_model *m, whale_err *err) {
    size_t total = 0;
    for (int i = 0; i < m->n_params; i++) total += ((size_t)param_numel(&m->params[i]) + 15) & ~(size_t)15;
    free(m->owned);
    m->owned = whale_calloc(total * sizeof(float));
    if (!m->owned && total)
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %zu bytes of weights", total * 4);
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        whale_param *p = &m->params[i];
        p->data = m->owned + off;
        *p->slot = p->data;
        off += ((size_t)param_numel(p) + 15) & ~(size_t)15;
    }
    return WHALE_OK;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Appends "item" to a comma-separated list kept within a fixed budget. */
static void list_add(char *buf, size_t cap, int *count, const char *item) {
    size_t n = strlen(buf);
    if (*count < 6 && n + strlen(item) + 3 < cap)
        snprintf(buf + n, cap - n, "%s%s", *count ? ", " : "", item);
    (*count)++;
}

static const char *strip_prefix(const char *name) {
    static const char prefix[] = "_orig_mod.";
    return strncmp(name, prefix, sizeof prefix - 1) == 0 ? name + sizeof prefix - 1 : name;
}

whale_code whale_model_bind(whale_model *m, whale_st *st, const char *path, whale_dtype dt, whale_err *err) {
    char missing[512] = "", unexpected[512] = "", badshape[512] = "", baddtype[512] = "";
    int n_missing = 0, n_unexpected = 0, n_badshape = 0, n_baddtype = 0;
    const whale_st_entry **found = calloc((size_t)m->n_params + 1, sizeof *found);
    if (!found) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);

    /* Each checkpoint tensor must name exactly one parameter. */
    for (int i = 0; i < whale_st_count(st); i++) {
        const whale_st_entry *e = whale_st_at(st, i);
        const char *name = strip_prefix(e->name);
        int j;
        for (j = 0; j < m->n_params; j++)
            if (strcmp(m->params[j].name, name) == 0) break;
        if (j == m->n_params) {
            /* a tied model (it has no lm_head parameter) saved with the
             * head's copy too: transformers ties it back and ignores it */
            if (!strcmp(name, "lm_head.weight")) continue;
            list_add(unexpected, sizeof unexpected, &n_unexpected, e->name);
            continue;
        }
        if (found[j]) { /* "x" and "_orig_mod.x" both present */
            list_add(unexpected, sizeof unexpected, &n_unexpected, e->name);
            continue;
        }
        found[j] = e;
        whale_param *p = &m->params[j];
        int ok = e->ndim == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++) ok = e->shape[d] == p->shape[d];
        if (!ok) {
            char want[64], got[64], item[200];
            shape_str(want, sizeof want, p->ndim, p->shape);
            shape_str(got, sizeof got, e->ndim, e->shape);
            snprintf(item, sizeof item, "%s is %s, expected %s", name, got, want);
            list_add(badshape, sizeof badshape, &n_badshape, item);
        }
        if (e->dtype != WHALE_F32 && e->dtype != WHALE_BF16 && e->dtype != WHALE_F16) {
            char item[160];
            snprintf(item, sizeof item, "%s is %s", name, whale_dtype_name(e->dtype));
            list_add(baddtype, sizeof baddtype, &n_baddtype, item);
        }
    }
    for (int j = 0; j < m->n_params; j++)
        if (!found[j]) list_add(missing, sizeof missing, &n_missing, m->params[j].name);

    if (n_missing || n_unexpected || n_badshape || n_baddtype) {
        char msg[WHALE_ERR_MSG_MAX];
        size_t n = (size_t)snprintf(msg, sizeof msg, "%s: checkpoint does not match config:", path);
#define PART(cnt, what, list)                                                                  \
    if (cnt && n < sizeof msg)                                                                 \
        n += (size_t)snprintf(msg + n, sizeof msg - n, " %d %s (%s%s);", cnt, what, list,       \
                              cnt > 6 ? ", ..." : "");
        PART(n_missing, "missing", missing)
        PART(n_unexpected, "unexpected", unexpected)
        PART(n_badshape, "wrong shape", badshape)
        PART(n_baddtype, "not a float dtype", baddtype)
#undef PART
        free(found);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s", msg);
    }

    /* Product weights of a low-precision load go straight to their copies
     * (zero-copy when the checkpoint already holds them in that dtype) and
     * get no fp32 values. Everything else is fp32: zero-copy for aligned
     * F32, converted into one owned buffer otherwise. */
    int lowp = dt != WHALE_F32;
    size_t owned = 0, handles = 0;
    for (int j = 0; j < m->n_params; j++) {
        const whale_st_entry *e = found[j];
        size_t na = ((size_t)param_numel(&m->params[j]) + 15) & ~(size_t)15;
        if (lowp && whale_param_is_product_weight(&m->params[j])) handles += na * sizeof(float);
        else if (e->dtype != WHALE_F32 || ((uintptr_t)e->data & 3)) owned += na;
    }
    free(m->owned);
    m->owned = NULL;
    whale_code c = whale_model_reserve_handles(m, handles, err);
    if (!c && owned && !(m->owned = whale_alloc(owned * sizeof(float))))
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: cannot allocate %zu bytes to convert weights", path, owned * 4);
    if (c) {
        free(found);
        return c;
    }
    size_t off = 0, hoff = 0;
    for (int j = 0; j < m->n_params; j++) {
        whale_param *p = &m->params[j];
        const whale_st_entry *e = found[j];
        size_t n = (size_t)param_numel(p);
        if (lowp && whale_param_is_product_weight(p)) {
            p->data = (float *)((char *)m->handles + hoff);
            hoff += ((n + 15) & ~(size_t)15) * sizeof(float);
        } else if (e->dtype == WHALE_F32 && !((uintptr_t)e->data & 3)) {
            p->data = (float *)e->data; /* read-only mapping: never written */
        } else {
            p->data = m->owned + off;
            off += (n + 15) & ~(size_t)15;
            int64_t rows = p->ndim == 2 ? p->shape[0] : 1, cols = (int64_t)n / rows;
            if ((c = whale_convert_checkpoint(p->data, WHALE_F32, e->data, e->dtype, rows, cols, err))) break;
        }
        *p->slot = p->data;
    }
    if (!c && lowp) c = whale_model_build_copies(m, dt, found, err);
    /* what was converted (owned fp32, or copies) is no longer needed
     * resident in the mapping; tensors used in place fault back in when read */
    if (!c && (lowp || owned)) whale_st_release_pages(st);
    free(found);
    return c;
}

/* ------------------------------------------------------------ JSON fields */

static whale_code json_number(const cJSON *obj, const char *key, int required, const cJSON **out,
                              const char *file, whale_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) {
        if (required) return whale_errf(err, WHALE_ERR_FORMAT, "%s: missing required field \"%s\"", file, key);
        return WHALE_OK;
    }
    if (!cJSON_IsNumber(v))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"%s\" must be a number", file, key);
    *out = v;
    return WHALE_OK;
}

whale_code whale_json_int(const cJSON *obj, const char *key, int required, long long def,
                          long long lo, long long hi, long long *out, const char *file,
                          whale_err *err) {
    const cJSON *v;
    whale_code c = json_number(obj, key, required, &v, file, err);
    if (c) return c;
    if (!v) {
        *out = def;
        return WHALE_OK;
    }
    double d = v->valuedouble;
    if (d != floor(d))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"%s\" must be an integer, got %g", file, key, d);
    if (d < (double)lo || d > (double)hi)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"%s\" = %g is out of range [%lld, %lld]",
                          file, key, d, lo, hi);
    *out = (long long)d;
    return WHALE_OK;
}

whale_code whale_json_float(const cJSON *obj, const char *key, int required, double def, double lo,
                            double hi, double *out, const char *file, whale_err *err) {
    const cJSON *v;
    whale_code c = json_number(obj, key, required, &v, file, err);
    if (c) return c;
    double d = v ? v->valuedouble : def;
    if (!(d >= lo && d <= hi))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"%s\" = %g is out of range [%g, %g]", file,
                          key, d, lo, hi);
    *out = d;
    return WHALE_OK;
}

whale_code whale_json_bool(const cJSON *obj, const char *key, int def, int *out, const char *file,
                           whale_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return WHALE_OK;
    }
    if (!cJSON_IsBool(v))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: field \"%s\" must be true or false", file, key);
    *out = cJSON_IsTrue(v);
    return WHALE_OK;
}

/* ------------------------------------------------------------ public API */

static const whale_family_desc *const families[] = {&whale_family_nanowhale, &whale_family_dense};
enum { N_FAMILIES = sizeof families / sizeof families[0] };

/* "a, b, c" of every family's model types or presets, for messages */
static const char *family_list(char *buf, size_t cap, int presets) {
    size_t n = 0;
    buf[0] = 0;
    for (int f = 0; f < N_FAMILIES; f++) {
        const char *const *t = families[f]->model_types;
        for (int k = 0; presets ? k < 1 : t[k] != NULL; k++)
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "",
                                  presets ? families[f]->presets : t[k]);
    }
    return buf;
}

static whale_code model_from_config(const cJSON *cfg, const char *file, whale_model **out, whale_err *err) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (!cJSON_IsString(mt))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: missing \"model_type\"", file);
    for (int f = 0; f < N_FAMILIES; f++)
        for (const char *const *t = families[f]->model_types; *t; t++)
            if (strcmp(mt->valuestring, *t) == 0) return families[f]->from_config(cfg, file, out, err);
    char list[256];
    return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (supported: %s)", file,
                      mt->valuestring, family_list(list, sizeof list, 0));
}

/* The config of a named preset of any family. */
static whale_code preset_config(const char *name, cJSON **out, whale_err *err) {
    for (int f = 0; f < N_FAMILIES; f++) {
        whale_code c = families[f]->preset_config(name, out, err);
        if (c != WHALE_ERR_ARG) return c;
    }
    char list[512];
    return whale_errf(err, WHALE_ERR_ARG, "unknown preset \"%s\" (%s, or a config .json file)", name,
                      family_list(list, sizeof list, 1));
}

/* Every parameter from the family's init, in order, from one generator. */
static whale_code init_weights(whale_model *m, uint64_t seed, whale_err *err) {
    (void)err;
    whale_rng rng;
    whale_rng_seed(&rng, seed);
    for (int i = 0; i < m->n_params; i++) m->family->init_param(m, i, &rng, m->params[i].data);
    return WHALE_OK;
}

/* generation_config.json, when the model directory has one, may list more
 * end-of-sequence ids than config.json (Qwen2.5-Instruct: <|im_end|> and
 * <|endoftext|>); generation stops at any of them, as in transformers. */
static whale_code add_generation_eos(whale_model *m, const char *dir, whale_err *err) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (stat(path, &sb) != 0) return WHALE_OK;
    cJSON *gc;
    whale_code c = whale_read_json_object(path, &gc, err);
    if (c) return c;
    int32_t have[8];
    int n_have = whale_model_eos_ids(m, have, 8);
    c = whale_config_eos(m, gc, path, err); /* the generation config's list */
    cJSON_Delete(gc);
    if (c) return c;
    for (int i = 0; i < n_have; i++) { /* then config.json's ids not in it */
        int dup = 0;
        for (int j = 0; j < m->n_eos; j++) dup |= m->eos_ids[j] == have[i];
        if (dup) continue;
        if (m->n_eos == 8) return whale_errf(err, WHALE_ERR_FORMAT, "%s: more than 8 end-of-sequence ids", path);
        m->eos_ids[m->n_eos++] = have[i];
    }
    return WHALE_OK;
}

whale_code whale_model_load(const char *dir, whale_model **out, whale_err *err) {
    return whale_model_load_as(dir, WHALE_F32, out, err);
}

whale_code whale_model_load_as(const char *dir, whale_dtype dt, whale_model **out, whale_err *err) {
    *out = NULL;
    if (!whale_format_of(dt))
        return whale_errf(err, WHALE_ERR_ARG, "cannot run a model in %s (fp32, bf16, fp16, int8)", whale_dtype_name(dt));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return whale_errf(err, WHALE_ERR_IO, "%s: not a model directory", dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *cfg;
    whale_code c = whale_read_json_object(path, &cfg, err);
    if (c) return c;
    whale_model *m;
    c = model_from_config(cfg, path, &m, err);
    cJSON_Delete(cfg);
    if (c) return c;
    if ((c = add_generation_eos(m, dir, err))) {
        whale_model_free(m);
        return c;
    }
    whale_st *st;
    c = whale_st_open_dir(dir, &st, err);
    if (c) {
        whale_model_free(m);
        return c;
    }
    c = whale_model_bind(m, st, whale_st_count(st) ? whale_st_at(st, 0)->file : dir, dt, err);
    if (c) {
        whale_st_close(st);
        whale_model_free(m);
        return c;
    }
    m->source = st;
    *out = m;
    return WHALE_OK;
}

/* A preset's or config file's config with the overrides applied. */
static whale_code config_with_overrides(const char *preset, const char *overrides, cJSON **out, whale_err *err) {
    cJSON *cfg;
    whale_code c;
    size_t n = strlen(preset);
    if (n > 5 && strcmp(preset + n - 5, ".json") == 0) c = whale_read_json_object(preset, &cfg, err);
    else c = preset_config(preset, &cfg, err);
    if (c) return c;
    if (overrides && *overrides) {
        cJSON *ov = cJSON_Parse(overrides);
        if (!cJSON_IsObject(ov)) {
            cJSON_Delete(ov);
            cJSON_Delete(cfg);
            return whale_errf(err, WHALE_ERR_ARG, "config overrides must be a JSON object, got: %.80s", overrides);
        }
        cJSON *it;
        cJSON_ArrayForEach(it, ov) {
            cJSON *copy = cJSON_Duplicate(it, 1);
            if (cJSON_HasObjectItem(cfg, it->string)) cJSON_ReplaceItemInObjectCaseSensitive(cfg, it->string, copy);
            else cJSON_AddItemToObject(cfg, it->string, copy);
        }
        cJSON_Delete(ov);
    }
    *out = cfg;
    return WHALE_OK;
}

/* The model of a preset or config file with overrides, parameters unallocated. */
static whale_code model_of_preset(const char *preset, const char *overrides, whale_model **out, whale_err *err) {
    cJSON *cfg = NULL;
    whale_code c = config_with_overrides(preset, overrides, &cfg, err);
    if (c) return c;
    c = model_from_config(cfg, preset, out, err);
    cJSON_Delete(cfg);
    return c;
}

whale_code whale_model_init_config(const char *preset, const char *overrides, uint64_t seed, whale_model **out,
                                   whale_err *err) {
    *out = NULL;
    whale_model *m;
    whale_code c = model_of_preset(preset, overrides, &m, err);
    if (c) return c;
    if ((c = whale_model_alloc_params(m, err)) || (c = init_weights(m, seed, err))) {
        whale_model_free(m);
        return c;
    }
    *out = m;
    return WHALE_OK;
}

whale_code whale_model_skeleton(const char *src, whale_model **out, whale_err *err) {
    *out = NULL;
    cJSON *cfg;
    whale_code c;
    char path[4096];
    struct stat sb;
    size_t n = strlen(src);
    if (stat(src, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(path, sizeof path, "%s/config.json", src);
        c = whale_read_json_object(path, &cfg, err);
    } else if (n > 5 && strcmp(src + n - 5, ".json") == 0) {
        snprintf(path, sizeof path, "%s", src);
        c = whale_read_json_object(src, &cfg, err);
    } else {
        snprintf(path, sizeof path, "%s", src);
        c = preset_config(src, &cfg, err);
    }
    if (c) return c;
    c = model_from_config(cfg, path, out, err);
    cJSON_Delete(cfg);
    return c;
}

whale_code whale_model_init(const char *preset, uint64_t seed, whale_model **out, whale_err *err) {
    return whale_model_init_config(preset, NULL, seed, out, err);
}

static whale_code write_config(const whale_model *m, const char *dir, whale_dtype dt, whale_err *err);

/* Streaming initialisation: one parameter at a time through the family's
 * init, converted to the file's dtype. */
typedef struct {
    const whale_model *m;
    whale_rng rng;
    whale_dtype dt;
    float *buf;      /* the largest parameter, fp32 */
    uint16_t *half;  /* its bf16/fp16 form */
    whale_progress_fn progress;
    void *user;
    int64_t done, total; /* values */
} init_stream;

static const void *produce_param(void *user, int i, whale_err *err) {
    init_stream *is = user;
    const whale_param *p = &is->m->params[i];
    size_t n = (size_t)whale_shape_numel(p->ndim, p->shape);
    (void)err;
    if (is->progress) is->progress(is->user, is->done, is->total);
    is->done += (int64_t)n;
    is->m->family->init_param(is->m, i, &is->rng, is->buf);
    if (is->dt == WHALE_F32) return is->buf;
    if (is->dt == WHALE_F16) whale_f32_to_f16_rows(is->half, is->buf, n);
    else whale_f32_to_bf16_rows(is->half, is->buf, n);
    return is->half;
}

whale_code whale_model_init_to_dir(const char *preset, const char *overrides, uint64_t seed, whale_dtype dt,
                                   const char *dir, int64_t *n_params, whale_err *err) {
    return whale_model_init_to_dir_progress(preset, overrides, seed, dt, dir, n_params, NULL, NULL, err);
}

whale_code whale_model_init_to_dir_progress(const char *preset, const char *overrides, uint64_t seed, whale_dtype dt,
                                            const char *dir, int64_t *n_params, whale_progress_fn progress, void *user,
                                            whale_err *err) {
    if (dt != WHALE_F32 && dt != WHALE_BF16 && dt != WHALE_F16)
        return whale_errf(err, WHALE_ERR_ARG, "a checkpoint is written in fp32, bf16 or fp16, not %s", whale_dtype_name(dt));
    whale_model *m;
    whale_code c = model_of_preset(preset, overrides, &m, err);
    if (c) return c;
    init_stream is = {.m = m, .dt = dt, .progress = progress, .user = user, .total = whale_model_param_count(m)};
    whale_rng_seed(&is.rng, seed);
    size_t largest = 0;
    whale_st_item *items = calloc((size_t)m->n_params, sizeof *items);
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        size_t n = (size_t)whale_shape_numel(p->ndim, p->shape);
        if (n > largest) largest = n;
        if (items) items[i] = (whale_st_item){p->name, dt, p->ndim, p->shape, NULL};
    }
    is.buf = whale_alloc(largest * sizeof(float));
    is.half = dt == WHALE_F32 ? NULL : whale_alloc(largest * sizeof(uint16_t));
    char path[4200];
    if (!items || !is.buf || (dt != WHALE_F32 && !is.half))
        c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory for a %zu-value parameter", largest);
    else if (!(c = whale_mkdir(dir, err)) && !(c = write_config(m, dir, dt, err))) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        c = whale_st_write_stream(path, items, m->n_params, NULL, produce_param, &is, err);
        if (!c && progress) progress(user, is.total, is.total);
    }
    if (!c && n_params) *n_params = whale_model_param_count(m);
    free(is.buf);
    free(is.half);
    free(items);
    whale_model_free(m);
    return c;
}

whale_code whale_model_config_json(const whale_model *m, char **json, whale_err *err) {
    cJSON *cfg;
    whale_code c = m->ops->config_to_json(m, &cfg, err);
    if (c) return c;
    *json = cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    return *json ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
}

void whale_config_set_dtype(cJSON *cfg, whale_dtype dt) {
    const char *keys[2] = {"torch_dtype", "dtype"};
    int found = 0;
    for (int k = 0; k < 2; k++)
        if (cJSON_GetObjectItemCaseSensitive(cfg, keys[k])) {
            cJSON_ReplaceItemInObjectCaseSensitive(cfg, keys[k], cJSON_CreateString(whale_dtype_torch_name(dt)));
            found = 1;
        }
    if (!found) cJSON_AddStringToObject(cfg, "torch_dtype", whale_dtype_torch_name(dt));
}

/* dir/config.json, recording the weights' dtype as transformers does. */
static whale_code write_config(const whale_model *m, const char *dir, whale_dtype dt, whale_err *err) {
    cJSON *cfg;
    whale_code c;
    if ((c = m->ops->config_to_json(m, &cfg, err))) return c;
    whale_config_set_dtype(cfg, dt);
    char *text = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    if (!text) return whale_errf(err, WHALE_ERR_NOMEM, "%s: cannot render config.json", dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t tn = strlen(text);
    char *withnl = malloc(tn + 2);
    if (!withnl) {
        free(text);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(withnl, text, tn);
    withnl[tn] = '\n';
    free(text);
    c = whale_write_file_atomic(path, withnl, tn + 1, err);
    free(withnl);
    return c;
}

whale_code whale_model_save(const whale_model *m, const char *dir, whale_err *err) {
    return whale_model_save_stream(m, dir, NULL, NULL, err);
}

whale_code whale_model_save_stream(const whale_model *m, const char *dir, whale_st_producer produce, void *user,
                                   whale_err *err) {
    whale_code c = whale_mkdir(dir, err);
    if (c) return c;
    whale_dtype dt = WHALE_F32; /* the dtype the product weights are stored in */
    for (int i = 0; i < (m->n_lora ? m->n_base_params : m->n_params); i++)
        if (whale_param_is_product_weight(&m->params[i]) && whale_model_param(m, i).dtype != WHALE_F32)
            dt = whale_model_param(m, i).dtype;
    if ((c = write_config(m, dir, dt, err))) return c;
    char path[4200];

    int n_save = m->n_lora ? m->n_base_params : m->n_params; /* the base model, not its adapters */
    whale_st_item *items = calloc((size_t)n_save, sizeof *items);
    if (!items) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", dir);
    for (int i = 0; i < n_save; i++) { /* weights held only in bf16/fp16 are saved as such */
        whale_tensor t = whale_model_param(m, i);
        const whale_format *f = whale_format_of(t.dtype);
        if (f && !f->saveable) {
            free(items);
            return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                              "%s: an int8 model cannot be saved as a Hugging Face checkpoint; save from fp32/bf16",
                              dir);
        }
        items[i] = (whale_st_item){m->params[i].name, t.dtype, t.ndim, m->params[i].shape, t.data};
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    c = produce ? whale_st_write_stream(path, items, n_save, NULL, produce, user, err)
                : whale_st_write(path, items, n_save, NULL, err);
    free(items);
    return c;
}

whale_code whale_model_set_dtype(whale_model *m, whale_dtype dt, whale_err *err) {
    if (!whale_format_of(dt))
        return whale_errf(err, WHALE_ERR_ARG, "cannot run a model in %s (fp32, bf16, fp16, int8)",
                          whale_dtype_name(dt));
    if (dt == m->compute_dtype) return WHALE_OK;
    if (m->handles)
        return whale_errf(err, WHALE_ERR_ARG,
                          "the model was loaded in %s without fp32 weights; load it again to run it in %s",
                          whale_dtype_name(m->compute_dtype), whale_dtype_name(dt));
    whale_model_clear_copies(m);
    m->compute_dtype = WHALE_F32;
    if (dt == WHALE_F32) return WHALE_OK;
    return whale_model_build_copies(m, dt, NULL, err);
}

whale_dtype whale_model_dtype(const whale_model *m) { return m->compute_dtype; }

int whale_model_has_master(const whale_model *m) { return m->handles == NULL; }

void whale_model_free(whale_model *m) {
    if (!m) return;
    whale_lora_free(m);
    whale_adapters_free(m);
    whale_model_clear_copies(m);
    whale_model_release_handles(m);
    if (m->ops && m->ops->free_impl) m->ops->free_impl(m);
    free(m->params);
    free(m->owned);
    if (m->source) whale_st_close(m->source);
    free(m);
}

const char *whale_model_family(const whale_model *m) { return m->family->name; }
const char *whale_model_type(const whale_model *m) { return m->model_type; }
int whale_model_vocab_size(const whale_model *m) { return m->vocab_size; }
int whale_model_max_positions(const whale_model *m) { return m->max_positions; }
int whale_model_num_params(const whale_model *m) { return m->n_params; }
const char *whale_model_param_name(const whale_model *m, int i) { return m->params[i].name; }

int64_t whale_model_param_count(const whale_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += param_numel(&m->params[i]);
    return n;
}

whale_tensor whale_model_param(const whale_model *m, int i) {
    assert(i >= 0 && i < m->n_params);
    const whale_param *p = &m->params[i];
    whale_tensor t = {.dtype = WHALE_F32, .ndim = p->ndim, .data = p->data};
    if (!whale_param_has_f32(m, p)) {
        whale_wview v = whale_model_weight(m, p->data);
        t.dtype = v.dtype;
        t.data = (void *)v.data;
    }
    for (int d = 0; d < t.ndim; d++) t.shape[d] = p->shape[d];
    return t;
}

int whale_model_eos_ids(const whale_model *m, int32_t *ids, int cap) {
    int n = m->n_eos < cap ? m->n_eos : cap;
    for (int i = 0; i < n; i++) ids[i] = m->eos_ids[i];
    return n;
}

void whale_model_print_info(const whale_model *m, FILE *f) { m->ops->print_info(m, f); }

double whale_model_forward_flops(const whale_model *m, int B, int S, int p0, int logit_rows) {
    return m->ops->forward_flops(m, B, S, p0, logit_rows);
}

double whale_model_decode_weight_bytes(const whale_model *m) { return m->ops->decode_weight_bytes(m); }

/* ------------------------------------------------------------ sessions */

whale_code whale_rope_reserve(float **cos_t, float **sin_t, int *len, int need, int R, float theta, whale_err *err) {
    if (need <= *len) return WHALE_OK;
    size_t half = R / 2 ? (size_t)(R / 2) : 1, rn;
    if (!whale_mul_size((size_t)need, half * sizeof(float), &rn))
        return whale_errf(err, WHALE_ERR_NOMEM, "RoPE tables for %d positions overflow", need);
    float *c = whale_alloc(rn), *s = whale_alloc(rn);
    if (!c || !s) {
        free(c);
        free(s);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for RoPE tables of %d positions", need);
    }
    k_rope_table(c, s, need, R, theta);
    free(*cos_t);
    free(*sin_t);
    *cos_t = c;
    *sin_t = s;
    *len = need;
    return WHALE_OK;
}

whale_code whale_train_session_new(whale_model *m, int max_batch, int seq, int recompute, whale_session **out,
                                   whale_err *err) {
    *out = NULL;
    if (max_batch < 1) return whale_errf(err, WHALE_ERR_ARG, "batch size must be >= 1, got %d", max_batch);
    if (seq < 2) return whale_errf(err, WHALE_ERR_ARG, "training sequence length must be >= 2, got %d", seq);
    if (seq > m->max_positions)
        return whale_errf(err, WHALE_ERR_RANGE, "sequence length %d exceeds the model's max_position_embeddings %d",
                          seq, m->max_positions);
    const whale_session_spec sp = {max_batch, seq, max_batch * seq, 1, recompute, 0};
    return m->ops->session_create(m, &sp, out, err);
}

size_t whale_session_activation_bytes(const whale_session *s, size_t *recompute_saves) {
    if (recompute_saves) *recompute_saves = s->recompute_saves;
    return s->activation_bytes;
}

whale_model *whale_session_model(const whale_session *s) { return s->model; }

int64_t whale_shift_targets(const int32_t *ids, const int32_t *labels, int B, int S, int32_t *tgt) {
    int64_t count = 0;
    for (int t = 0; t < B * S; t++) {
        tgt[t] = t % S == S - 1 ? -100 : labels ? labels[t + 1] : ids[t + 1];
        count += tgt[t] != -100;
    }
    return count;
}

whale_code whale_head_loss_chunk(whale_session *s, int n, int D, int V, const float *hn, const float *head,
                                 float *ghead, const int32_t *tgt, double gs, float *logits, float *dhn, double *loss,
                                 int64_t *count, whale_err *err) {
    whale_code e = whale_linear(s, n, V, D, hn, D, head, D, logits, V, err);
    if (e) return e;
    if (gs == 0) { /* evaluation: the loss, and the token accuracy's hits */
        *loss = whale_cross_entropy_labels(logits, tgt, 1, n, V, count);
        for (int r = 0; r < n; r++) {
            if (tgt[r] < 0 || tgt[r] >= V) continue;
            const float *row = logits + (size_t)r * V;
            int best = 0; /* the first largest, as torch.argmax */
            for (int v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            s->eval_hits += best == tgt[r];
        }
        return WHALE_OK;
    }
    *loss = whale_cross_entropy_labels_backward_scaled(logits, logits, tgt, 1, n, V, gs, count);
    if (s->trace) whale_trace_emit(s, WHALE_F32, logits, 2, (const int64_t[]){n, V}, "grad.logits");
    if ((e = whale_linear_dx(s, n, V, D, logits, V, head, D, dhn, D, 0, err))) return e;
    return whale_linear_dw(s, n, V, D, logits, V, hn, D, head, ghead, D, err);
}

void whale_session_sizes_of(const whale_session *s, whale_session_sizes *out) {
    out->activations = s->activation_bytes;
    out->recompute_saves = s->recompute_saves;
    out->kv_cache = s->kv_bytes;
    out->work = s->work_bytes;
    out->grads = s->n_grad_bytes;
}

float *whale_session_grad(whale_session *s, int i) {
    if (!s->grads || i < 0 || i >= s->model->n_params || s->grad_offsets[i] == SIZE_MAX) return NULL;
    return s->grads + s->grad_offsets[i];
}

void whale_session_zero_grad(whale_session *s) {
    if (s->grads) memset(s->grads, 0, sizeof(float) * s->n_grad);
}

int64_t whale_count_targets(const int32_t *labels, int B, int S) {
    int64_t n = 0;
    for (int b = 0; b < B; b++)
        for (int s = 1; s < S; s++) n += labels ? labels[(size_t)b * S + s] != -100 : 1;
    return n;
}

whale_code whale_session_train_step(whale_session *s, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                                    const int32_t *seg, int B, int S, double loss_scale, double *loss, int64_t *count,
                                    whale_err *err) {
    const whale_model *m = s->model;
    if (!s->train_fn) return whale_errf(err, WHALE_ERR_ARG, "not a training session");
    /* int8 weights take no gradient: only a frozen int8 base (LoRA) trains */
    for (int i = 0; i < m->n_copies; i++)
        if (!whale_format_of(m->copies[i].dtype)->trainable && !m->params[m->copies[i].param].frozen)
            return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                              "int8 is an inference format: train in fp32, bf16 or fp16, or attach LoRA adapters to "
                              "an int8 base");
    if (B < 1 || B > s->max_batch || S < 2 || S > s->max_seq)
        return whale_errf(err, WHALE_ERR_ARG, "batch %d × %d outside the training session's %d × %d", B, S,
                          s->max_batch, s->max_seq);
    for (long i = 0; i < (long)B * S; i++) {
        if (ids[i] < 0 || ids[i] >= m->vocab_size)
            return whale_errf(err, WHALE_ERR_RANGE, "token id %d at index %ld is outside the vocabulary [0, %d)",
                              ids[i], i, m->vocab_size);
        if (labels && labels[i] != -100 && (labels[i] < 0 || labels[i] >= m->vocab_size))
            return whale_errf(err, WHALE_ERR_RANGE, "label %d at index %ld is outside the vocabulary [0, %d)",
                              labels[i], i, m->vocab_size);
        if (pos && (pos[i] < 0 || pos[i] >= s->max_seq)) /* the RoPE tables cover the session's context */
            return whale_errf(err, WHALE_ERR_RANGE, "position %d at index %ld is outside the session's [0, %d)",
                              pos[i], i, s->max_seq);
        if (seg && (seg[i] < 0 || seg[i] > (int32_t)(i % S)))
            return whale_errf(err, WHALE_ERR_RANGE, "segment start %d at index %ld is not within its sequence",
                              seg[i], i);
    }
    s->training = loss_scale != 0; /* evaluation runs without LoRA dropout */
    s->lora_calls++;
    s->grad_final_from = m->n_lora ? m->n_base_params : m->n_params; /* none reported yet */
    whale_code c = s->train_fn(s, ids, labels, pos, seg, B, S, loss_scale, loss, count, err);
    /* the gradient-ready hook: what the family has not reported, at the end */
    return c || loss_scale == 0 ? c : whale_session_grads_final(s, NULL, err);
}

void whale_session_free(whale_session *s) {
    if (!s) return;
    free(s->seq_adapter); /* the runtime's (runtime.c); the rest is the family's */
    free(s->run_mem);
    free(s->grad_runs);
    s->free_fn(s);
}

void whale_session_set_profile(whale_session *s, int on) {
    s->profiling = on;
    memset(s->prof, 0, sizeof s->prof);
}

int whale_session_profile(const whale_session *s, const char **names, double *seconds, int cap) {
    for (int i = 0; i < s->n_prof && i < cap; i++) {
        names[i] = s->prof_names[i];
        seconds[i] = s->prof[i];
    }
    return s->n_prof;
}
void whale_session_set_trace(whale_session *s, whale_trace_fn fn, void *user) {
    s->trace = fn;
    s->trace_user = user;
}

