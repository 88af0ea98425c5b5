/* The model side of LoRA adapters (the files, init and merge are in
 * src/train/lora.c): which weights "target_modules" selects, the targets
 * kept sorted by their base weight's address (whale_lora_find reads them),
 * and dropping them. */
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

/* all-linear: every weight of role LINEAR (not the embedding, the lm_head,
 * a router); else the modules the comma list names. */
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

void whale_lora_rekey(whale_model *m) {
    if (!m->n_lora) return;
    for (int i = 0; i < m->n_lora; i++) {
        whale_lora_target *t = &m->lora[i];
        t->start = m->params[t->base].data;
        t->end = t->start + t->rows * t->cols;
    }
    whale_lora_sort_targets(m->lora, m->n_lora);
    for (int j = 0; j < m->n_lora; j++) {
        m->params[m->lora[j].a].slot = &m->lora[j].A;
        m->params[m->lora[j].b].slot = &m->lora[j].B;
    }
}
