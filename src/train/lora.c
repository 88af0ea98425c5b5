/* LoRA adapters: attaching them to a model's Linear layers (PEFT's
 * initialisation), saving and loading PEFT's adapter files, and merging
 * them into the base weights. The products themselves (forward, input and
 * adapter gradients) are in models/weights.c, next to the base products. */
#include "whale_lora.h"
#include "train/lora_files.h"

#include "core/core.h"
#include "io/safetensors.h"
#include "kernels/convert.h"
#include "models/model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR_(x) #x
#define STR(x) STR_(x)

/* The attached config with its own copy of the target list. */
typedef struct {
    whale_lora_config cfg;
    char targets[]; /* as long as the list is */
} lora_cfg_store;

whale_lora_config whale_lora_defaults(void) {
    return (whale_lora_config){.rank = 8, .alpha = 32, .dropout = 0.05, .use_rslora = 0,
                               .target_modules = "all-linear", .seed = 42};
}

/* "model.layers.3.ffn.experts.1.w1.weight" → module "w1" (the last name
 * before ".weight"), as PEFT's target_modules match it. */
static void module_name(const char *param, char *out, size_t cap) {
    size_t n = strlen(param) - 7; /* drop ".weight" */
    size_t start = n;
    while (start > 0 && param[start - 1] != '.') start--;
    size_t len = n - start < cap - 1 ? n - start : cap - 1;
    memcpy(out, param + start, len);
    out[len] = 0;
}

/* all-linear: every product weight except the embedding and lm_head (the
 * gate is not a product weight: a raw parameter). */
int whale_lora_is_target(const whale_param *p, const char *targets) {
    if (p->role != WHALE_ROLE_LINEAR) return 0; /* nor the embedding, the lm_head, the gate */
    if (!strcmp(targets, "all-linear")) return 1;
    char mod[64];
    module_name(p->name, mod, sizeof mod);
    const char *s = targets;
    size_t ml = strlen(mod);
    while (*s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == ml && !strncmp(s, mod, len)) return 1;
        if (!e) break;
        s = e + 1;
    }
    return 0;
}

static int lora_cmp(const void *a, const void *b) {
    const whale_lora_target *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Adapters with zero-filled storage on every target; A and B are params
 * "<name minus .weight>.lora_A.weight" / ".lora_B.weight". */
static whale_code add_adapters(whale_model *m, const whale_lora_config *cfg, whale_err *err) {
    if (m->n_lora) return whale_errf(err, WHALE_ERR_ARG, "the model already has LoRA adapters");
    if (cfg->rank < 1 || cfg->rank > WHALE_MAX_LORA_RANK)
        return whale_errf(err, WHALE_ERR_ARG, "LoRA rank must be in [1, %d], got %d", WHALE_MAX_LORA_RANK, cfg->rank);
    if (!(cfg->alpha > 0)) return whale_errf(err, WHALE_ERR_ARG, "lora_alpha must be > 0, got %g", cfg->alpha);
    if (!(cfg->dropout >= 0 && cfg->dropout < 1))
        return whale_errf(err, WHALE_ERR_ARG, "lora_dropout must be in [0, 1), got %g", cfg->dropout);
    const char *targets = cfg->target_modules ? cfg->target_modules : "all-linear";
    int nb = m->n_base_params ? m->n_base_params : m->n_params, n = 0;
    size_t floats = 0;
    for (int i = 0; i < nb; i++)
        if (whale_lora_is_target(&m->params[i], targets)) {
            n++;
            floats += (size_t)cfg->rank * (size_t)(m->params[i].shape[0] + m->params[i].shape[1]);
        }
    if (!n) return whale_errf(err, WHALE_ERR_ARG, "target_modules \"%s\" matches no Linear layer of the model", targets);
    lora_cfg_store *store = calloc(1, sizeof *store + strlen(targets) + 1);
    whale_lora_target *lt = calloc((size_t)n, sizeof *lt);
    float *mem = whale_calloc(floats * sizeof(float));
    whale_param *grown = realloc(m->params, sizeof *m->params * (size_t)(nb + 2 * n));
    if (grown) m->params = grown;
    if (!store || !lt || !mem || !grown) {
        free(store);
        free(lt);
        free(mem);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for LoRA adapters");
    }
    store->cfg = *cfg;
    memcpy(store->targets, targets, strlen(targets) + 1);
    store->cfg.target_modules = store->targets;
    m->n_base_params = nb;
    m->n_params = nb;
    float scale = whale_lora_scale(cfg);
    size_t off = 0;
    int k = 0;
    for (int i = 0; i < nb; i++) {
        whale_param *base = &m->params[i];
        if (!whale_lora_is_target(base, targets)) continue;
        whale_lora_target *t = &lt[k++];
        int64_t rows = base->shape[0], cols = base->shape[1];
        *t = (whale_lora_target){.base = i, .start = base->data, .end = base->data + rows * cols, .rows = rows,
                                 .cols = cols, .rank = cfg->rank, .scale = scale};
        char stem[96];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(base->name) - 7), base->name);
        const int64_t sa[2] = {cfg->rank, cols}, sb[2] = {rows, cfg->rank};
        t->a = m->n_params;
        whale_param *pa = whale_model_add_param(m, nb + 2 * n, &t->A, WHALE_ROLE_ADAPTER, 1, 1, 2, sa, "%s.lora_A.weight", stem);
        t->b = m->n_params;
        whale_param *pb = whale_model_add_param(m, nb + 2 * n, &t->B, WHALE_ROLE_ADAPTER, 1, 1, 2, sb, "%s.lora_B.weight", stem);
        pa->data = t->A = mem + off;
        off += (size_t)cfg->rank * (size_t)cols;
        pb->data = t->B = mem + off;
        off += (size_t)cfg->rank * (size_t)rows;
    }
    for (int i = 0; i < nb; i++) m->params[i].frozen = 1; /* PEFT freezes the whole base */
    /* slots point into lt, which is sorted now: re-aim them after sorting */
    qsort(lt, (size_t)n, sizeof *lt, lora_cmp);
    for (int j = 0; j < n; j++) {
        m->params[lt[j].a].slot = &lt[j].A;
        m->params[lt[j].b].slot = &lt[j].B;
    }
    m->lora = lt;
    m->n_lora = n;
    m->lora_mem = mem;
    m->lora_cfg = store;
    return WHALE_OK;
}

whale_code whale_lora_attach(whale_model *m, const whale_lora_config *cfg, whale_err *err) {
    whale_code c = add_adapters(m, cfg, err);
    if (c) return c;
    /* PEFT: A ~ kaiming_uniform(a=√5) = U(−1/√in, 1/√in); B = 0 */
    whale_rng rng;
    whale_rng_seed(&rng, cfg->seed);
    for (int i = 0; i < m->n_lora; i++) {
        whale_lora_target *t = &m->lora[i];
        float bound = (float)(1.0 / sqrt((double)t->cols));
        for (int64_t k = 0; k < (int64_t)t->rank * t->cols; k++)
            t->A[k] = (2.0f * whale_rng_uniform(&rng) - 1.0f) * bound;
    }
    return WHALE_OK;
}

int whale_lora_count(const whale_model *m) { return m->n_lora; }

int64_t whale_lora_num_params(const whale_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_lora; i++) n += (int64_t)m->lora[i].rank * (m->lora[i].rows + m->lora[i].cols);
    return n;
}

const whale_lora_config *whale_lora_get_config(const whale_model *m) {
    return m->lora_cfg ? &((const lora_cfg_store *)m->lora_cfg)->cfg : NULL;
}

void whale_lora_free(whale_model *m) {
    free(m->lora);
    free(m->lora_mem);
    free(m->lora_cfg);
    m->lora = NULL;
    m->lora_mem = NULL;
    m->lora_cfg = NULL;
    if (m->n_lora) m->n_params = m->n_base_params;
    m->n_lora = 0;
    for (int i = 0; i < m->n_params; i++) m->params[i].frozen = 0;
}

/* ------------------------------------------------------------ PEFT files */

#define PEFT_PREFIX WHALE_PEFT_PREFIX

whale_code whale_lora_save(const whale_model *m, const char *dir, const char *base_name, whale_err *err) {
    if (!m->n_lora) return whale_errf(err, WHALE_ERR_ARG, "the model has no LoRA adapters to save");
    whale_code c = whale_mkdir(dir, err);
    if (c) return c;
    const whale_lora_config *cfg = whale_lora_get_config(m);
    int n = 2 * m->n_lora;
    whale_st_item *items = calloc((size_t)n, sizeof *items);
    char (*names)[160] = calloc((size_t)n, 160);
    if (!items || !names) {
        free(items);
        free(names);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    /* in parameter order (the model's module order), as PEFT writes them */
    for (int i = m->n_base_params, k = 0; i < m->n_params; i++, k++) {
        const whale_param *p = &m->params[i];
        snprintf(names[k], 160, PEFT_PREFIX "%s", p->name);
        items[k] = (whale_st_item){names[k], WHALE_F32, 2, p->shape, p->data};
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    c = whale_st_write(path, items, n, NULL, err);
    free(items);
    free(names);
    if (c) return c;

    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddNumberToObject(j, "r", cfg->rank);
    cJSON_AddNumberToObject(j, "lora_alpha", cfg->alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", cfg->dropout);
    cJSON_AddBoolToObject(j, "use_rslora", cfg->use_rslora);
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddStringToObject(j, "base_model_name_or_path", base_name ? base_name : "");
    cJSON_AddFalseToObject(j, "fan_in_fan_out");
    cJSON_AddTrueToObject(j, "inference_mode");
    cJSON *tm = cJSON_AddArrayToObject(j, "target_modules");
    /* the distinct module names adapted, in first-seen order */
    char seen[1024] = ",";
    for (int i = m->n_base_params; i < m->n_params; i += 2) {
        char mod[64], key[70];
        const char *an = m->params[i].name;               /* "<stem>.lora_A.weight" */
        size_t sl = strlen(an) - strlen(".lora_A.weight");
        size_t st = sl;
        while (st > 0 && an[st - 1] != '.') st--;
        snprintf(mod, sizeof mod, "%.*s", (int)(sl - st), an + st);
        snprintf(key, sizeof key, ",%s,", mod);
        if (strstr(seen, key)) continue;
        if (strlen(seen) + strlen(mod) + 2 < sizeof seen) strcat(strcat(seen, mod), ",");
        cJSON_AddItemToArray(tm, cJSON_CreateString(mod));
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    c = whale_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return c;
}

/* The rank every adapter in the file has: lora_A is [r, in] and lora_B
 * [out, r]. Read from the tensors before anything is sized by r. */
static whale_code file_rank(const whale_st *st, const char *path, int *rank, whale_err *err) {
    *rank = 0;
    for (int i = 0; i < whale_st_count(st); i++) {
        const whale_st_entry *e = whale_st_at(st, i);
        size_t n = strlen(e->name);
        int is_a = n > 14 && !strcmp(e->name + n - 14, ".lora_A.weight");
        int is_b = n > 14 && !strcmp(e->name + n - 14, ".lora_B.weight");
        if (!is_a && !is_b) continue;
        if (e->ndim != 2)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: %s has %d dimensions, not 2", path, e->name, e->ndim);
        int64_t r = is_a ? e->shape[0] : e->shape[1];
        if (r < 1 || r > WHALE_MAX_LORA_RANK)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: %s gives rank %lld, outside [1, %d]", path, e->name,
                              (long long)r, WHALE_MAX_LORA_RANK);
        if (*rank && r != *rank)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: %s gives rank %lld, other adapters %d", path, e->name,
                              (long long)r, *rank);
        *rank = (int)r;
    }
    if (!*rank) return whale_errf(err, WHALE_ERR_FORMAT, "%s: holds no lora_A or lora_B tensor", path);
    return WHALE_OK;
}

/* A JSON number that is an integer in [lo, hi] (checked before any cast). */
static int json_int_in(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi && v->valuedouble == floor(v->valuedouble);
}

whale_code whale_lora_read_config(const char *dir, whale_lora_config *cfg, char **targets_out, whale_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    *targets_out = NULL;
    cJSON *j;
    whale_code c = whale_read_json_object(path, &j, err);
    if (c) return c;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type"), *r = cJSON_GetObjectItemCaseSensitive(j, "r"),
                *al = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha"),
                *dr = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout"),
                *rs = cJSON_GetObjectItemCaseSensitive(j, "use_rslora"),
                *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    const char *bad = !cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") ? "peft_type must be \"LORA\""
                      : !json_int_in(r, 1, WHALE_MAX_LORA_RANK)
                          ? "r must be an integer in [1, " STR(WHALE_MAX_LORA_RANK) "]"
                      : !cJSON_IsNumber(al) || !isfinite(al->valuedouble) || !(al->valuedouble > 0)
                          ? "lora_alpha must be a positive number"
                      : dr && !cJSON_IsNull(dr) && !(cJSON_IsNumber(dr) && dr->valuedouble >= 0 && dr->valuedouble < 1)
                          ? "lora_dropout must be a number in [0, 1)"
                      : !(cJSON_IsArray(tm) || cJSON_IsString(tm)) ? "target_modules must be a list or a string"
                                                                   : NULL;
    /* the list joined with commas, however long */
    size_t tlen = cJSON_IsString(tm) ? strlen(tm->valuestring) : 0;
    const cJSON *it;
    if (!bad && cJSON_IsArray(tm)) cJSON_ArrayForEach(it, tm) {
            if (!cJSON_IsString(it) || !it->valuestring[0] || strchr(it->valuestring, ',')) {
                bad = "target_modules must list non-empty module names";
                break;
            }
            tlen += strlen(it->valuestring) + 1;
        }
    char *targets = bad ? NULL : malloc(tlen + 1);
    if (bad || !targets) {
        cJSON_Delete(j);
        return bad ? whale_errf(err, WHALE_ERR_FORMAT, "%s: %s", path, bad)
                   : whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    }
    if (cJSON_IsString(tm)) memcpy(targets, tm->valuestring, tlen + 1);
    else {
        size_t l = 0;
        targets[0] = 0;
        cJSON_ArrayForEach(it, tm) {
            size_t k = strlen(it->valuestring);
            if (l) targets[l++] = ',';
            memcpy(targets + l, it->valuestring, k + 1);
            l += k;
        }
    }
    *cfg = (whale_lora_config){.rank = (int)r->valuedouble, .alpha = al->valuedouble,
                               .dropout = cJSON_IsNumber(dr) ? dr->valuedouble : 0.0, .use_rslora = cJSON_IsTrue(rs),
                               .target_modules = targets, .seed = 0};
    cJSON_Delete(j);
    *targets_out = targets;
    return WHALE_OK;
}

float whale_lora_scale(const whale_lora_config *cfg) {
    return (float)(cfg->use_rslora ? cfg->alpha / sqrt((double)cfg->rank) : cfg->alpha / cfg->rank);
}

whale_code whale_lora_open_tensors(const char *dir, int rank, whale_st **st, whale_err *err) {
    *st = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int frank;
    whale_code c = whale_st_open(path, st, err);
    if (c) return c;
    if ((c = file_rank(*st, path, &frank, err)) ||
        (frank != rank && (c = whale_errf(err, WHALE_ERR_FORMAT, "%s/adapter_config.json: r is %d but the adapters in "
                                                                 "%s have rank %d", dir, rank, path, frank)))) {
        whale_st_close(*st);
        *st = NULL;
    }
    return c;
}

whale_code whale_lora_load(whale_model *m, const char *dir, whale_err *err) {
    char path[4200], *targets;
    whale_lora_config cfg;
    whale_code c = whale_lora_read_config(dir, &cfg, &targets, err);
    if (c) return c;
    /* The tensors first: the rank sizes every adapter, so it must be the
     * one the file's tensors have before anything is allocated by it. */
    whale_st *st = NULL;
    if ((c = whale_lora_open_tensors(dir, cfg.rank, &st, err)) || (c = add_adapters(m, &cfg, err))) {
        whale_st_close(st);
        free(targets);
        return c;
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int found = 0;
    for (int i = m->n_base_params; i < m->n_params && !c; i++) {
        whale_param *p = &m->params[i];
        char name[200];
        snprintf(name, sizeof name, PEFT_PREFIX "%s", p->name);
        const whale_st_entry *e = whale_st_find(st, name);
        if (!e) {
            c = whale_errf(err, WHALE_ERR_FORMAT, "%s: missing %s", path, name);
            break;
        }
        if (e->ndim != 2 || e->shape[0] != p->shape[0] || e->shape[1] != p->shape[1])
            c = whale_errf(err, WHALE_ERR_FORMAT, "%s: %s is [%lld, %lld], expected [%lld, %lld]", path, name,
                           (long long)e->shape[0], (long long)(e->ndim > 1 ? e->shape[1] : 0), (long long)p->shape[0],
                           (long long)p->shape[1]);
        else if (e->dtype == WHALE_F32) memcpy(p->data, e->data, e->nbytes);
        else if (e->dtype == WHALE_BF16) whale_bf16_to_f32(p->data, e->data, (size_t)(p->shape[0] * p->shape[1]));
        else if (e->dtype == WHALE_F16) whale_f16_to_f32(p->data, e->data, (size_t)(p->shape[0] * p->shape[1]));
        else c = whale_errf(err, WHALE_ERR_FORMAT, "%s: %s is %s, not a float dtype", path, name, whale_dtype_name(e->dtype));
        found++;
    }
    if (!c && found != whale_st_count(st))
        c = whale_errf(err, WHALE_ERR_FORMAT, "%s: %d tensors do not belong to an adapter of this model's %s modules",
                       path, whale_st_count(st) - found, targets);
    whale_st_close(st);
    free(targets); /* add_adapters keeps its own copy */
    if (c) whale_lora_free(m);
    return c;
}

void whale_lora_rekey(whale_model *m) {
    if (!m->n_lora) return;
    for (int i = 0; i < m->n_lora; i++) {
        whale_lora_target *t = &m->lora[i];
        t->start = m->params[t->base].data;
        t->end = t->start + t->rows * t->cols;
    }
    qsort(m->lora, (size_t)m->n_lora, sizeof *m->lora, lora_cmp);
    for (int j = 0; j < m->n_lora; j++) {
        m->params[m->lora[j].a].slot = &m->lora[j].A;
        m->params[m->lora[j].b].slot = &m->lora[j].B;
    }
}

/* ------------------------------------------------------------ merging */

whale_code whale_lora_merge(whale_model *m, whale_err *err) {
    if (!m->n_lora) return whale_errf(err, WHALE_ERR_ARG, "the model has no LoRA adapters to merge");
    /* fp32 weights may be mapped read-only from the checkpoint: own them first */
    whale_code c0 = whale_model_has_master(m) ? whale_model_make_writable(m, err) : WHALE_OK;
    if (c0) return c0;
    if (m->compute_dtype == WHALE_I8)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "cannot merge LoRA into int8 weights; merge in fp32 or bf16");
    if (m->mapped_copy_bytes)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                          "the base weights are mapped read-only from the checkpoint; load the base in fp32 to merge");
    for (int i = 0; i < m->n_lora; i++) {
        const whale_lora_target *t = &m->lora[i];
        whale_param *base = &m->params[t->base];
        int has_f32 = whale_param_has_f32(m, base);
        whale_wview v = whale_model_weight(m, base->data);
        float *row = whale_alloc(sizeof(float) * (size_t)t->cols);
        if (!row) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        for (int64_t o = 0; o < t->rows; o++) {
            /* ΔW[o, :] = s · Σ_k B[o, k] · A[k, :] in double, then added once */
            float *w = has_f32 ? base->data + o * t->cols : row;
            if (!has_f32) whale_model_row(m, base->data, o, t->cols, row);
            for (int64_t c = 0; c < t->cols; c++) {
                double acc = 0;
                for (int k = 0; k < t->rank; k++) acc += (double)t->B[o * t->rank + k] * t->A[(int64_t)k * t->cols + c];
                w[c] = (float)((double)w[c] + t->scale * acc);
            }
            if (!has_f32) { /* back into the copy, rounded to its format */
                uint16_t *dst = (uint16_t *)v.data + o * t->cols;
                for (int64_t c = 0; c < t->cols; c++)
                    dst[c] = v.dtype == WHALE_BF16 ? whale_float_to_bf16(row[c]) : whale_float_to_f16(row[c]);
            }
        }
        free(row);
    }
    whale_lora_free(m);
    whale_model_refresh_copies(m);
    return WHALE_OK;
}
