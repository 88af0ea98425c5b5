/* LoRA adapters: attaching them to a model's Linear layers (PEFT's
 * initialisation), saving and loading PEFT's adapter files, and merging
 * them into the base weights. The products themselves (forward, input and
 * adapter gradients) are in models/weights.c, next to the base products. */
#include "whale_lora.h"
#include "train/lora_files.h"

#include "core/core.h"
#include "whale_safetensors.h"
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

static whale_code check_config(const whale_lora_config *cfg, whale_err *err) {
    if (cfg->rank < 1 || cfg->rank > WHALE_MAX_LORA_RANK)
        return whale_errf(err, WHALE_ERR_ARG, "LoRA rank must be in [1, %d], got %d", WHALE_MAX_LORA_RANK, cfg->rank);
    if (!(cfg->alpha > 0)) return whale_errf(err, WHALE_ERR_ARG, "lora_alpha must be > 0, got %g", cfg->alpha);
    if (!(cfg->dropout >= 0 && cfg->dropout < 1))
        return whale_errf(err, WHALE_ERR_ARG, "lora_dropout must be in [0, 1), got %g", cfg->dropout);
    return WHALE_OK;
}

/* The targets of cfg among m's base parameters, in parameter order, each
 * with zero-filled A and B in one block (*mem); a and b are −1. */
static whale_code make_targets(const whale_model *m, const whale_lora_config *cfg, whale_lora_target **out, int *n_out,
                               float **mem_out, size_t *floats_out, whale_err *err) {
    whale_code c = check_config(cfg, err);
    if (c) return c;
    const char *targets = cfg->target_modules ? cfg->target_modules : "all-linear";
    int nb = m->n_base_params ? m->n_base_params : m->n_params, n = 0;
    size_t floats = 0;
    for (int i = 0; i < nb; i++)
        if (whale_lora_is_target(&m->params[i], targets)) {
            n++;
            floats += (size_t)cfg->rank * (size_t)(m->params[i].shape[0] + m->params[i].shape[1]);
        }
    if (!n) return whale_errf(err, WHALE_ERR_ARG, "target_modules \"%s\" matches no Linear layer of the model", targets);
    whale_lora_target *lt = calloc((size_t)n, sizeof *lt);
    float *mem = whale_calloc(floats * sizeof(float));
    if (!lt || !mem) {
        free(lt);
        free(mem);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for LoRA adapters");
    }
    float scale = whale_lora_scale(cfg);
    size_t off = 0;
    for (int i = 0, k = 0; i < nb; i++) {
        const whale_param *base = &m->params[i];
        if (!whale_lora_is_target(base, targets)) continue;
        int64_t rows = base->shape[0], cols = base->shape[1];
        lt[k++] = (whale_lora_target){.base = i, .a = -1, .b = -1, .start = base->data, .end = base->data + rows * cols,
                                      .rows = rows, .cols = cols, .rank = cfg->rank, .scale = scale,
                                      .A = mem + off, .B = mem + off + (size_t)cfg->rank * (size_t)cols};
        off += (size_t)cfg->rank * (size_t)(rows + cols);
    }
    *out = lt;
    *n_out = n;
    *mem_out = mem;
    *floats_out = floats;
    return WHALE_OK;
}

/* Adapters with zero-filled storage on every target, attached to the
 * model: A and B are params "<name minus .weight>.lora_A.weight" /
 * ".lora_B.weight". */
static whale_code add_adapters(whale_model *m, const whale_lora_config *cfg, whale_err *err) {
    if (m->n_lora) return whale_errf(err, WHALE_ERR_ARG, "the model already has LoRA adapters");
    whale_lora_target *lt;
    float *mem;
    size_t floats;
    int n;
    whale_code c = make_targets(m, cfg, &lt, &n, &mem, &floats, err);
    if (c) return c;
    const char *targets = cfg->target_modules ? cfg->target_modules : "all-linear";
    int nb = m->n_base_params ? m->n_base_params : m->n_params;
    lora_cfg_store *store = calloc(1, sizeof *store + strlen(targets) + 1);
    whale_param *grown = realloc(m->params, sizeof *m->params * (size_t)(nb + 2 * n));
    if (grown) m->params = grown;
    if (!store || !grown) {
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
    for (int k = 0; k < n; k++) { /* in parameter order, as PEFT writes them */
        whale_lora_target *t = &lt[k];
        const char *bname = m->params[t->base].name;
        char stem[96];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(bname) - 7), bname);
        const int64_t sa[2] = {cfg->rank, t->cols}, sb[2] = {t->rows, cfg->rank};
        t->a = m->n_params;
        whale_param *pa = whale_model_add_param(m, nb + 2 * n, &t->A, WHALE_ROLE_ADAPTER, 1, 1, 2, sa, "%s.lora_A.weight", stem);
        t->b = m->n_params;
        whale_param *pb = whale_model_add_param(m, nb + 2 * n, &t->B, WHALE_ROLE_ADAPTER, 1, 1, 2, sb, "%s.lora_B.weight", stem);
        pa->data = t->A;
        pb->data = t->B;
    }
    for (int i = 0; i < nb; i++) m->params[i].frozen = 1; /* PEFT freezes the whole base */
    /* slots point into lt, which is sorted now: re-aim them after sorting */
    whale_lora_sort_targets(lt, n);
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

/* Tensor PEFT_PREFIX name of st (the file path) into dst [rows, cols] as fp32. */
static whale_code read_tensor(const whale_st *st, const char *path, const char *pname, float *dst, int64_t rows,
                              int64_t cols, whale_err *err) {
    char name[200];
    snprintf(name, sizeof name, PEFT_PREFIX "%s", pname);
    const whale_st_entry *e = whale_st_find(st, name);
    if (!e) return whale_errf(err, WHALE_ERR_FORMAT, "%s: missing %s", path, name);
    if (e->ndim != 2 || e->shape[0] != rows || e->shape[1] != cols)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: %s is [%lld, %lld], expected [%lld, %lld]", path, name,
                          (long long)e->shape[0], (long long)(e->ndim > 1 ? e->shape[1] : 0), (long long)rows,
                          (long long)cols);
    if (e->dtype == WHALE_F32) memcpy(dst, e->data, e->nbytes);
    else if (e->dtype == WHALE_BF16) whale_bf16_to_f32(dst, e->data, (size_t)(rows * cols));
    else if (e->dtype == WHALE_F16) whale_f16_to_f32(dst, e->data, (size_t)(rows * cols));
    else return whale_errf(err, WHALE_ERR_FORMAT, "%s: %s is %s, not a float dtype", path, name, whale_dtype_name(e->dtype));
    return WHALE_OK;
}

/* Every tensor of the file was read (found of them). */
static whale_code check_all_read(const whale_st *st, const char *path, int found, const char *targets, whale_err *err) {
    if (found == whale_st_count(st)) return WHALE_OK;
    return whale_errf(err, WHALE_ERR_FORMAT, "%s: %d tensors do not belong to an adapter of this model's %s modules",
                      path, whale_st_count(st) - found, targets);
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
    for (int i = m->n_base_params; i < m->n_params && !c; i++) {
        whale_param *p = &m->params[i];
        c = read_tensor(st, path, p->name, p->data, p->shape[0], p->shape[1], err);
    }
    if (!c) c = check_all_read(st, path, m->n_params - m->n_base_params, targets, err);
    whale_st_close(st);
    free(targets); /* add_adapters keeps its own copy */
    if (c) whale_lora_free(m);
    return c;
}

/* ------------------------------------------------------------ adapters beside the model */

whale_code whale_adapter_load(whale_model *m, const char *dir, whale_adapter **out, whale_err *err) {
    char path[4200], *targets;
    whale_lora_config cfg;
    *out = NULL;
    whale_code c = whale_lora_read_config(dir, &cfg, &targets, err);
    if (c) return c;
    whale_st *st = NULL;
    whale_adapter *a = calloc(1, sizeof *a);
    whale_adapter **list = realloc(m->adapters, sizeof *list * (size_t)(m->n_adapters + 1));
    if (list) m->adapters = list;
    size_t floats = 0;
    if (!a || !list) c = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory for an adapter", dir);
    if (!c) c = whale_lora_open_tensors(dir, cfg.rank, &st, err);
    if (!c) c = make_targets(m, &cfg, &a->t, &a->n, &a->mem, &floats, err);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    for (int k = 0; !c && k < a->n; k++) { /* parameter order: the first missing tensor is the one named */
        const whale_lora_target *t = &a->t[k];
        const char *bname = m->params[t->base].name;
        char name[160];
        snprintf(name, sizeof name, "%.*s.lora_A.weight", (int)(strlen(bname) - 7), bname);
        c = read_tensor(st, path, name, t->A, t->rank, t->cols, err);
        snprintf(name, sizeof name, "%.*s.lora_B.weight", (int)(strlen(bname) - 7), bname);
        if (!c) c = read_tensor(st, path, name, t->B, t->rows, t->rank, err);
    }
    if (!c) c = check_all_read(st, path, 2 * a->n, targets, err);
    whale_st_close(st);
    free(targets);
    if (c) {
        if (a) free(a->t), free(a->mem);
        free(a);
        return c;
    }
    whale_lora_sort_targets(a->t, a->n);
    a->model = m;
    a->index = m->n_adapters;
    a->rank = cfg.rank;
    a->bytes = floats * sizeof(float);
    m->adapters[m->n_adapters++] = a;
    *out = a;
    return WHALE_OK;
}

int whale_adapter_rank(const whale_adapter *a) { return a->rank; }
int whale_adapter_count(const whale_adapter *a) { return a->n; }
int64_t whale_adapter_num_params(const whale_adapter *a) { return (int64_t)(a->bytes / sizeof(float)); }

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
