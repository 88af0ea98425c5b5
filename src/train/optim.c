/* AdamW, gradient clipping and learning-rate schedules. The update follows
 * torch.optim.AdamW: θ ← θ·(1 − lr·wd); m ← β1·m + (1−β1)·g;
 * v ← β2·v + (1−β2)·g²; θ ← θ − lr/(1−β1ᵗ) · m / (sqrt(v)/sqrt(1−β2ᵗ) + ε). */
#include "whale.h"

#include "core/core.h"
#include "core/par.h"
#include "whale_safetensors.h"
#include "kernels/convert.h"
#include "models/model.h"
#include "train/step.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct whale_optimizer {
    whale_model *model;
    whale_adamw_config cfg;
    int64_t steps;
    float *m, *v;     /* one pair per element [lo, hi) of the trainable vector */
    size_t n_moments; /* hi − lo */
    size_t lo, hi;    /* all of it (0, n_train) unless sharded */
    int sharded;      /* whale_optimizer_shard: the caller gathers the weights and refreshes the copies */
    size_t *offsets;  /* [n_params]: the parameter's first element in the trainable vector; SIZE_MAX frozen */
};

whale_code whale_model_make_writable(whale_model *m, whale_err *err) {
    if (!whale_model_has_master(m))
        return whale_errf(err, WHALE_ERR_ARG,
                          "the model holds its weights only in %s (loaded for inference); load it in fp32 to train it",
                          whale_dtype_name(whale_model_dtype(m)));
    if (!m->source) return WHALE_OK; /* already in owned memory */
    size_t total = 0;
    for (int i = 0; i < m->n_params; i++)
        total += ((size_t)whale_shape_numel(m->params[i].ndim, m->params[i].shape) + 15) & ~(size_t)15;
    float *buf = whale_alloc(total * sizeof(float));
    if (!buf) return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB for writable weights", total * 4 / 1048576.0);
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        whale_param *p = &m->params[i];
        size_t n = (size_t)whale_shape_numel(p->ndim, p->shape);
        memcpy(buf + off, p->data, n * sizeof(float));
        p->data = buf + off;
        *p->slot = p->data;
        off += (n + 15) & ~(size_t)15;
    }
    free(m->owned);
    m->owned = buf;
    whale_st_close(m->source);
    m->source = NULL;
    /* the compute copies and adapters are found by the fp32 addresses, which moved */
    whale_lora_rekey(m);
    whale_dtype dt = m->compute_dtype;
    if (dt == WHALE_F32) return WHALE_OK;
    whale_model_clear_copies(m);
    return whale_model_build_copies(m, dt, NULL, err);
}

whale_code whale_adamw_new(whale_model *m, const whale_adamw_config *cfg, whale_optimizer **out, whale_err *err) {
    *out = NULL;
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1))
        return whale_errf(err, WHALE_ERR_ARG, "AdamW betas must be in [0, 1), got %g and %g", cfg->beta1, cfg->beta2);
    if (!(cfg->eps > 0) || !(cfg->weight_decay >= 0))
        return whale_errf(err, WHALE_ERR_ARG, "AdamW needs eps > 0 and weight decay >= 0");
    /* With LoRA only the adapters (own memory, fp32) change: the frozen base
     * stays as loaded, mapped and in any precision. */
    whale_code c = m->n_lora ? WHALE_OK : whale_model_make_writable(m, err);
    if (c) return c;
    whale_optimizer *o = calloc(1, sizeof *o);
    if (!o) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    o->model = m;
    o->cfg = *cfg;
    o->offsets = malloc(sizeof(size_t) * (size_t)m->n_params);
    size_t n = 0;
    for (int i = 0; o->offsets && i < m->n_params; i++) { /* frozen parameters (LoRA's base) have no moments */
        o->offsets[i] = m->params[i].frozen ? SIZE_MAX : n;
        if (!m->params[i].frozen) n += (size_t)whale_shape_numel(m->params[i].ndim, m->params[i].shape);
    }
    o->n_moments = n;
    o->lo = 0, o->hi = n;
    o->m = whale_calloc(n * sizeof(float));
    o->v = whale_calloc(n * sizeof(float));
    if (!o->offsets || !o->m || !o->v) {
        whale_optimizer_free(o);
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of AdamW moments", n * 8 / 1048576.0);
    }
    *out = o;
    return WHALE_OK;
}

void whale_optimizer_free(whale_optimizer *o) {
    if (!o) return;
    free(o->m);
    free(o->v);
    free(o->offsets);
    free(o);
}

int64_t whale_optimizer_steps(const whale_optimizer *o) { return o->steps; }
size_t whale_optimizer_bytes(const whale_optimizer *o) { return 2 * o->n_moments * sizeof(float); }
void whale_optimizer_set_steps(whale_optimizer *o, int64_t steps) { o->steps = steps; }

float *whale_optimizer_moment(whale_optimizer *o, int which, int i) {
    if (o->sharded || i < 0 || i >= o->model->n_params || o->offsets[i] == SIZE_MAX) return NULL;
    return (which ? o->v : o->m) + o->offsets[i];
}

whale_code whale_optimizer_shard(whale_optimizer *o, size_t lo, size_t hi, whale_err *err) {
    assert(lo <= hi && hi <= o->hi && o->lo == 0 && !o->steps);
    float *m = whale_calloc((hi - lo ? hi - lo : 1) * sizeof(float)), *v = whale_calloc((hi - lo ? hi - lo : 1) * sizeof(float));
    if (!m || !v) {
        free(m), free(v);
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of AdamW moments", (hi - lo) * 8 / 1048576.0);
    }
    free(o->m), free(o->v);
    o->m = m, o->v = v;
    o->lo = lo, o->hi = hi, o->n_moments = hi - lo, o->sharded = 1;
    return WHALE_OK;
}

float *whale_optimizer_held(whale_optimizer *o, int which, size_t *lo, size_t *hi) {
    *lo = o->lo, *hi = o->hi;
    return which ? o->v : o->m;
}

size_t whale_optimizer_offset(const whale_optimizer *o, int i) { return o->offsets[i]; }

void whale_adamw_step(whale_optimizer *o, whale_session *s, double lr) {
    const whale_model *m = o->model;
    const whale_adamw_config *c = &o->cfg;
    o->steps++;
    double bc1 = 1.0 - pow(c->beta1, (double)o->steps), bc2 = 1.0 - pow(c->beta2, (double)o->steps);
    float step = (float)(lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        if (p->no_grad || p->frozen) continue; /* PyTorch skips parameters without a gradient */
        float decay = p->decay ? (float)(1.0 - lr * c->weight_decay) : 1.0f;
        /* the elements [k0, k1) of this parameter that are in [lo, hi) */
        size_t a = o->offsets[i], len = (size_t)whale_shape_numel(p->ndim, p->shape);
        size_t k0 = a < o->lo ? o->lo - a : 0, k1 = a + len <= o->hi ? len : o->hi > a ? o->hi - a : 0;
        if (k0 >= k1) continue;
        long n = (long)(k1 - k0);
        float *w = p->data + k0, *mm = o->m + (a + k0 - o->lo), *vv = o->v + (a + k0 - o->lo);
        const float *g = whale_session_grad(s, i) + k0;
        WHALE_FOR_IF(n > 65536, (long k = 0; k < n; k++), {
            mm[k] = b1 * mm[k] + (1.0f - b1) * g[k];
            vv[k] = b2 * vv[k] + (1.0f - b2) * g[k] * g[k];
            w[k] = w[k] * decay - step * mm[k] / (sqrtf(vv[k]) * inv_sqrt_bc2 + eps);
        });
        /* pure bf16: the weights themselves are stored in bf16 (no fp32
         * master), so an update smaller than half a bf16 step is lost unless
         * it is rounded stochastically */
        if (c->weight_rounding == WHALE_WEIGHTS_BF16_NEAREST) whale_round_bf16_inplace(w, (size_t)n);
        else if (c->weight_rounding == WHALE_WEIGHTS_BF16_STOCHASTIC)
            whale_round_bf16_sr_inplace(w, (size_t)n, c->seed, ((uint64_t)o->steps << 40) + a + k0);
    }
    if (!o->sharded) whale_model_refresh_copies(o->model);
}

size_t whale_grad_chunks(const whale_session *s, size_t *start, size_t *len) {
    /* over the trainable parameters only (under LoRA the frozen norms keep a
     * buffer the optimiser never reads) */
    const whale_model *m = s->model;
    size_t c = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].frozen || s->grad_offsets[i] == SIZE_MAX) continue;
        size_t n = (size_t)whale_shape_numel(m->params[i].ndim, m->params[i].shape);
        for (size_t k = 0; k < n; k += WHALE_GRAD_CHUNK, c++)
            if (start) start[c] = s->grad_offsets[i] + k, len[c] = n - k < WHALE_GRAD_CHUNK ? n - k : WHALE_GRAD_CHUNK;
    }
    return c;
}

void whale_grad_chunk_sums(const float *grads, const size_t *start, const size_t *len, size_t n, double *part) {
#pragma omp parallel for schedule(static)
    for (size_t ch = 0; ch < n; ch++) {
        double acc = 0;
        const float *g = grads + start[ch];
        for (size_t k = 0; k < len[ch]; k++) acc += (double)g[k] * g[k];
        part[ch] = acc;
    }
}

double whale_grad_norm(whale_session *s) {
    /* in fixed chunks summed in order: the same result for any thread count */
    const whale_model *m = s->model;
    size_t nchunks = whale_grad_chunks(s, NULL, NULL);
    size_t *start = malloc(sizeof(size_t) * (nchunks ? nchunks : 1)), *len = malloc(sizeof(size_t) * (nchunks ? nchunks : 1));
    double *part = malloc(sizeof(double) * (nchunks ? nchunks : 1)), total = 0;
    if (!start || !len || !part) { /* fall back to one sequential sum */
        for (int i = 0; i < m->n_params; i++) {
            const float *g = whale_session_grad(s, i);
            if (!g || m->params[i].frozen) continue;
            for (int64_t k = 0; k < whale_shape_numel(m->params[i].ndim, m->params[i].shape); k++) total += (double)g[k] * g[k];
        }
        free(start), free(len), free(part);
        return sqrt(total);
    }
    whale_grad_chunks(s, start, len);
    whale_grad_chunk_sums(s->grads, start, len, nchunks, part);
    for (size_t ch = 0; ch < nchunks; ch++) total += part[ch];
    free(start), free(len), free(part);
    return sqrt(total);
}

double whale_clip_grad_norm(whale_session *s, double max_norm) {
    double norm = whale_grad_norm(s);
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
        float f = (float)coef;
#pragma omp parallel for schedule(static)
        for (size_t k = 0; k < s->n_grad; k++) s->grads[k] *= f;
    }
    return norm;
}

void whale_scale_grads(whale_session *s, double f) {
    float ff = (float)f;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < s->n_grad; k++) s->grads[k] *= ff;
}

double whale_lr_multiplier(whale_lr_schedule sched, int64_t k, int64_t warmup, int64_t total) {
    if (k < warmup) return (double)k / (double)(warmup > 0 ? warmup : 1);
    if (sched == WHALE_LR_CONSTANT) return 1.0;
    double span = (double)(total - warmup), done = (double)(k - warmup);
    if (span <= 0) return 0.0;
    double frac = done / span;
    if (frac > 1) frac = 1;
    if (sched == WHALE_LR_LINEAR) return 1.0 - frac;
    return 0.5 * (1.0 + cos(M_PI * frac));
}
