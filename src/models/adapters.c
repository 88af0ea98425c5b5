/* The model side of LoRA adapters (the files, init and merge are in
 * src/train/lora.c): which weights "target_modules" selects, the targets
 * kept sorted by their base weight's address (whale_lora_find reads them),
 * and dropping them; the same for the adapters loaded beside the model
 * (whale_adapter_load), which sequences are bound to one by one. */
#include "models/model.h"

#include <stdlib.h>
#include <string.h>

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

int whale_lora_peft_inert(const char *model_type, const char *name) {
    static const char wo_a[] = ".attn.wo_a.weight";
    size_t n = strlen(name), k = sizeof wo_a - 1;
    return model_type && !strcmp(model_type, "deepseek_v4") && n > k && !strcmp(name + n - k, wo_a);
}

/* Whether the comma list targets names p's module. */
static int names_module(const whale_param *p, const char *targets) {
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

/* all-linear: every weight of role LINEAR (not the embedding, the lm_head,
 * a router) that PEFT's wrappers act on; else the modules the comma list
 * names, among those. */
int whale_lora_is_target(const whale_param *p, const char *targets) {
    if (p->role != WHALE_ROLE_LINEAR) return 0; /* nor the embedding, the lm_head, the gate */
    if (p->peft_inert) return 0;                /* PEFT never calls it: an adapter would act in whale only */
    return !strcmp(targets, "all-linear") || names_module(p, targets);
}

const whale_param *whale_lora_inert_named(const whale_model *m, const char *targets) {
    int nb = m->n_base_params ? m->n_base_params : m->n_params;
    for (int i = 0; i < nb; i++)
        if (m->params[i].peft_inert && strcmp(targets, "all-linear") && names_module(&m->params[i], targets))
            return &m->params[i];
    return NULL;
}

static int lora_cmp(const void *a, const void *b) {
    const whale_lora_target *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

void whale_lora_sort_targets(whale_lora_target *t, int n) { qsort(t, (size_t)n, sizeof *t, lora_cmp); }

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

const whale_lora_target *whale_lora_find_in(const whale_lora_target *t, int n, const float *W) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (W < t[mid].start) hi = mid - 1;
        else if (W >= t[mid].end) lo = mid + 1;
        else return &t[mid];
    }
    return NULL;
}

const whale_lora_target *whale_lora_find(const whale_model *m, const float *W) {
    return whale_lora_find_in(m->lora, m->n_lora, W);
}

static void rekey(const whale_model *m, whale_lora_target *t, int n) {
    for (int i = 0; i < n; i++) {
        t[i].start = m->params[t[i].base].data;
        t[i].end = t[i].start + t[i].rows * t[i].cols;
    }
    whale_lora_sort_targets(t, n);
}

void whale_lora_rekey(whale_model *m) {
    for (int k = 0; k < m->n_adapters; k++) rekey(m, m->adapters[k]->t, m->adapters[k]->n);
    if (!m->n_lora) return;
    rekey(m, m->lora, m->n_lora);
    for (int j = 0; j < m->n_lora; j++) {
        m->params[m->lora[j].a].slot = &m->lora[j].A;
        m->params[m->lora[j].b].slot = &m->lora[j].B;
    }
}

void whale_adapters_free(whale_model *m) {
    for (int k = 0; k < m->n_adapters; k++) {
        free(m->adapters[k]->t);
        free(m->adapters[k]->mem);
        free(m->adapters[k]);
    }
    free(m->adapters);
    m->adapters = NULL;
    m->n_adapters = 0;
}
