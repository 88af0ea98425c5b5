/* One optimiser step over accumulated micro-batches, and run-folder
 * housekeeping, shared by pretraining and fine-tuning runs. */
#include "train/step.h"

#include "dist/dist.h"
#include "whale_safetensors.h"
#include "models/model.h"
#include "whale_diag.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct whale_zero {
    size_t lo, hi;         /* this rank's shard of the trainable vector */
    size_t *start, *len;   /* the gradient norm's chunks, [n_chunks] */
    int *first;            /* [N + 1]: rank r's chunks are [first[r], first[r + 1]) */
    int kmax;              /* the most chunks a rank has */
    double *part, *all;    /* [kmax], [N × kmax]: partial sums of squares */
    /* The trainable weights in order, all-gathered after each step: as fp32
     * (those without a compute copy, and all of an fp32 run), or as their
     * bf16/fp16 copy (mixed precision: each rank keeps the fp32 masters of
     * its shard only, whale_zero_drop_masters). */
    whale_wspan *f32, *half;
    int n_f32, n_half;
    int *half_param;              /* [n_half]: the parameter of each half span */
    const whale_format *fmt;      /* of the copies */
    struct { void *p; size_t n; } *dropped; /* [n_half × 2]: master pages given back */
    int n_dropped;
    size_t dropped_bytes;
};

/* Name the first parameter whose gradient is not finite (with zero: in
 * this rank's shard, the only part of the sum it holds). */
static const char *first_nonfinite_grad(whale_session *s, const whale_zero *z) {
    const whale_model *m = whale_session_model(s);
    for (int i = 0; i < whale_model_num_params(m); i++) {
        whale_tensor t = whale_model_param(m, i);
        const float *g = whale_session_grad(s, i);
        size_t n = (size_t)whale_shape_numel(t.ndim, t.shape), k = 0, a = g ? (size_t)(g - s->grads) : 0;
        if (z && g && !m->params[i].frozen) { /* the part of [a, a + n) in [lo, hi) */
            k = a < z->lo ? z->lo - a : 0;
            n = a + n <= z->hi ? n : z->hi > a ? z->hi - a : 0;
        }
        for (; g && k < n; k++) /* frozen parameters have no gradient */
            if (!isfinite(g[k])) return whale_model_param_name(m, i);
    }
    return NULL;
}

/* One micro-batch's forward and backward into the session's gradients
 * (added to what they hold); *l gets its loss, 0 when it has no target.
 * The LoRA dropout counter is set to the value it has in one process that
 * runs the step's scored micro-batches one after the other, so that every
 * rank draws the masks one process would. */
static whale_code run_micro(whale_session *s, struct whale_diag *nan, whale_batch *b, double scale, uint64_t calls,
                            int64_t step, int i, double *l, whale_err *err) {
    int64_t got;
    *l = 0;
    if (!whale_count_targets(b->labels, b->B, b->S)) return WHALE_OK;
    s->lora_calls = calls;
    whale_code c = whale_session_train_step(s, b->ids, b->labels, b->pos, b->seg, b->B, b->S, scale, l, &got, err);
    if (c) return c;
    if (whale_diag_failed(nan))
        return whale_errf(err, WHALE_ERR_RANGE, "step %lld, micro-batch %d: %s", (long long)step, i + 1,
                          whale_diag_report_nan(nan));
    return WHALE_OK;
}

/* Micro-batches before i that have a target (each one runs the model once). */
static uint64_t scored_before(const whale_batch *micro, int i) {
    uint64_t n = 0;
    for (int k = 0; k < i; k++) n += whale_count_targets(micro[k].labels, micro[k].B, micro[k].S) > 0;
    return n;
}

/* The session's gradient-ready hook: a range the backward pass finished
 * goes into the gradient sum's buckets. */
static whale_code grads_ready(void *sum, size_t lo, size_t hi, whale_err *err) {
    return whale_grad_sum_ready(sum, lo, hi, err);
}

/* Round j's micro-batch i into the gradient sum: its gradient sent after
 * its backward pass, or with buckets during it. */
static whale_code run_round(whale_session *s, struct whale_diag *nan, whale_grad_sum *sum, whale_batch *b,
                            double scale, uint64_t calls, int64_t step, int i, int j, double *l, whale_err *err) {
    if (!sum || !whale_grad_sum_buckets(sum)) {
        whale_code c = run_micro(s, nan, b, scale, calls, step, i, l, err);
        return c || !sum ? c : whale_grad_sum_add(sum, s->grads, j == 0, step, err);
    }
    whale_grad_sum_begin(sum, s->grads, j == 0, step);
    whale_code c = whale_session_set_grad_ready(s, grads_ready, sum, err);
    if (!c) c = run_micro(s, nan, b, scale, calls, step, i, l, err);
    whale_session_set_grad_ready(s, NULL, NULL, err);
    return c ? c : whale_grad_sum_end(sum, err);
}

/* The step's gradient and loss. Without sum (one process, one micro-batch)
 * the backward accumulates straight into the session's gradients. With sum,
 * round j gives rank r micro-batch j·N + r, its gradient computed alone and
 * added to the others in micro-batch order (whale_grad_sum), which is the
 * same sum for any number of ranks; the losses are gathered and summed in
 * micro-batch order too. */
static whale_code step_gradient(whale_session *s, struct whale_diag *nan, whale_grad_sum *sum, const whale_zero *zero,
                                whale_batch *micro, int n, int hf_compat, double loss_scale, int64_t total,
                                int64_t step, double *loss, whale_err *err) {
    int N = sum ? whale_dist_size() : 1, rank = sum ? whale_dist_rank() : 0, rounds = n / N;
    uint64_t base = s->lora_calls;
    double *mine = calloc((size_t)rounds, sizeof(double)), *all = calloc((size_t)n, sizeof(double));
    whale_code c = mine && all ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    whale_session_zero_grad(s);
    for (int j = 0; !c && j < rounds; j++) {
        int i = j * N + rank;
        int64_t cnt = whale_count_targets(micro[i].labels, micro[i].B, micro[i].S);
        double scale = (hf_compat ? 1.0 : (double)cnt / (double)total) * loss_scale;
        if (sum && j) whale_session_zero_grad(s);
        c = run_round(s, nan, sum, &micro[i], scale, base + scored_before(micro, i), step, i, j, &mine[j], err);
    }
    if (!c && sum) c = zero ? whale_grad_sum_shard(sum, s->grads) : whale_grad_sum_finish(sum, s->grads, step, err);
    if (!c) c = whale_dist_allgather_f64(mine, rounds, all, "exchange of losses", err);
    *loss = 0;
    for (int i = 0; !c && i < n; i++) { /* all[r·rounds + j] is micro-batch j·N + r */
        int64_t cnt = whale_count_targets(micro[i].labels, micro[i].B, micro[i].S);
        double l = all[(i % N) * rounds + i / N];
        if (cnt) *loss += hf_compat ? l : l * (double)cnt / (double)total;
    }
    s->lora_calls = base + scored_before(micro, n);
    free(mine);
    free(all);
    return c;
}

/* The gradients times f as whale_scale_grads scales them: with zero, this
 * rank's shard (the rest is not the sum). */
static void scale_grads(whale_session *s, const whale_zero *z, double f) {
    if (!z) {
        whale_scale_grads(s, f);
        return;
    }
    float ff = (float)f, *g = s->grads + z->lo;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < z->hi - z->lo; k++) g[k] *= ff;
}

/* The global gradient norm with zero: this rank's chunks' sums of squares,
 * every rank's gathered, added in chunk order as whale_grad_norm adds them. */
static whale_code zero_norm(whale_zero *z, whale_session *s, double *norm, whale_err *err) {
    int N = whale_dist_size(), r0 = whale_dist_rank(), mine = z->first[r0 + 1] - z->first[r0];
    memset(z->part, 0, sizeof(double) * (size_t)z->kmax);
    whale_grad_chunk_sums(s->grads, z->start + z->first[r0], z->len + z->first[r0], (size_t)mine, z->part);
    whale_code c = whale_dist_allgather_f64(z->part, z->kmax, z->all, "exchange of gradient norms", err);
    double total = 0;
    for (int r = 0; !c && r < N; r++)
        for (int j = 0; j < z->first[r + 1] - z->first[r]; j++) total += z->all[(size_t)r * z->kmax + j];
    *norm = sqrt(total);
    return c;
}

/* The gradient norm, clipped to max_norm (0: not) as whale_clip_grad_norm
 * clips: with zero over the whole sum, scaling this rank's shard only. */
static whale_code step_norm(whale_session *s, whale_zero *z, double max_norm, double *norm, whale_err *err) {
    if (!z) {
        *norm = max_norm > 0 ? whale_clip_grad_norm(s, max_norm) : whale_grad_norm(s);
        return WHALE_OK;
    }
    whale_code c = zero_norm(z, s, norm, err);
    double coef = max_norm / (*norm + 1e-6);
    if (!c && max_norm > 0 && coef < 1.0) scale_grads(s, z, coef);
    return c;
}

/* Every rank updated its shard of the fp32 weights: its part of the
 * sharded masters into their compute copies, then every rank's part of
 * the fp32 weights and of those copies to all. */
static whale_code zero_gather(whale_zero *z, const whale_model *m, whale_grad_sum *sum, int64_t step, whale_err *err) {
    for (int k = 0; k < z->n_half; k++) {
        const whale_wspan *h = &z->half[k];
        size_t k0 = h->at < z->lo ? z->lo - h->at : 0, k1 = h->at + h->n <= z->hi ? h->n : z->hi > h->at ? z->hi - h->at : 0;
        const float *w = m->params[z->half_param[k]].data;
        char *dst = h->data;
        long nb = k1 > k0 ? (long)((k1 - k0 + WHALE_GRAD_CHUNK - 1) / WHALE_GRAD_CHUNK) : 0;
#pragma omp parallel for schedule(static) if (nb > 1)
        for (long b = 0; b < nb; b++) { /* element by element, as whale_model_refresh_copies converts */
            size_t e0 = k0 + (size_t)b * WHALE_GRAD_CHUNK, e1 = e0 + WHALE_GRAD_CHUNK < k1 ? e0 + WHALE_GRAD_CHUNK : k1;
            z->fmt->from_f32(dst + 2 * e0, NULL, w + e0, 1, (int64_t)(e1 - e0));
        }
    }
    whale_code c = whale_grad_sum_gather_spans(sum, z->f32, z->n_f32, sizeof(float), step, err);
    if (!c) c = whale_grad_sum_gather_spans(sum, z->half, z->n_half, 2, step, err);
    return c;
}

whale_code whale_train_one_step(whale_session *s, whale_optimizer *opt, whale_loss_scaler *scaler,
                                struct whale_diag *nan, whale_grad_sum *sum, whale_zero *zero, whale_batch *micro,
                                int n, int hf_compat, double max_grad_norm, double lr, int64_t step,
                                whale_step_result *out, whale_err *err) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += whale_count_targets(micro[i].labels, micro[i].B, micro[i].S);
    if (!sum && (n != 1 || whale_dist_size() != 1))
        return whale_errf(err, WHALE_ERR_ARG, "several micro-batches or ranks need a gradient sum");
    if (sum && n % whale_dist_size())
        return whale_errf(err, WHALE_ERR_ARG, "%d micro-batches do not divide among %d ranks", n, whale_dist_size());
    double loss, loss_scale = scaler ? scaler->scale : 1.0, norm = NAN;
    whale_code c = step_gradient(s, nan, sum, zero, micro, n, hf_compat, loss_scale, total, step, &loss, err);
    if (c) return c;
    int taken = 1;
    if (scaler) { /* GradScaler: skip the step on inf/NaN, else unscale */
        double raw;
        if ((c = step_norm(s, zero, 0, &raw, err))) return c;
        taken = whale_loss_scaler_update(scaler, !isfinite(raw));
        if (taken) scale_grads(s, zero, 1.0 / loss_scale);
    }
    if (taken && (c = step_norm(s, zero, max_grad_norm, &norm, err))) return c;
    if (taken && (!isfinite(loss) || !isfinite(norm))) {
        const char *bad = first_nonfinite_grad(s, zero);
        return whale_errf(err, WHALE_ERR_RANGE,
                          "step %lld: the %s is not finite (loss %g, gradient norm %g); first non-finite gradient%s: %s",
                          (long long)step, isfinite(loss) ? "gradient" : "loss", loss, norm,
                          zero ? " in this rank's shard" : "", bad ? bad : "none");
    }
    if (taken) whale_adamw_step(opt, s, lr);
    if (taken && zero && (c = zero_gather(zero, s->model, sum, step, err))) return c;
    out->loss = loss;
    out->grad_norm = norm;
    out->targets = total;
    out->taken = taken;
    return WHALE_OK;
}

/* Cut a batch's rows to its longest trained prefix: positions after a row's
 * last label see nothing the loss uses (causal attention), so dropping the
 * columns past the batch's last label changes no loss and no gradient. */
void whale_batch_trim(whale_batch *b) {
    int B = b->B, S = b->S, L = 2;
    for (int r = 0; r < B; r++)
        for (int s = S - 1; s >= L; s--)
            if (b->labels[(size_t)r * S + s] != -100) {
                L = s + 1;
                break;
            }
    if (L == S) return;
    for (int r = 1; r < B; r++) { /* row r moves left: memmove, increasing r */
        memmove(b->ids + (size_t)r * L, b->ids + (size_t)r * S, sizeof(int32_t) * L);
        memmove(b->labels + (size_t)r * L, b->labels + (size_t)r * S, sizeof(int32_t) * L);
        memmove(b->pos + (size_t)r * L, b->pos + (size_t)r * S, sizeof(int32_t) * L);
        memmove(b->seg + (size_t)r * L, b->seg + (size_t)r * S, sizeof(int32_t) * L);
    }
    b->S = L;
}

/* ---------------------------------------------------------------- folders */

int whale_is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

void whale_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

void whale_remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

int whale_list_checkpoints(const char *out, int64_t **steps) {
    DIR *d = opendir(out);
    int n = 0, cap = 0;
    *steps = NULL;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "checkpoint-", 11) != 0) continue;
        long long v = strtoll(e->d_name + 11, &end, 10);
        if (*end) continue; /* checkpoint-N.tmp: an interrupted save */
        if (n == cap) {
            int64_t *grown = realloc(*steps, sizeof(int64_t) * (size_t)(cap = cap ? 2 * cap : 8));
            if (!grown) break;
            *steps = grown;
        }
        (*steps)[n++] = v;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            int64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return n;
}

void whale_prune_checkpoints(const char *dir, int limit) {
    if (limit <= 0) return;
    int64_t *steps;
    int n = whale_list_checkpoints(dir, &steps);
    for (int i = 0; i + limit < n; i++) {
        char old[4096];
        snprintf(old, sizeof old, "%s/checkpoint-%lld", dir, (long long)steps[i]);
        whale_remove_flat_dir(old);
    }
    free(steps);
}

whale_code whale_publish_dir(const char *tmp, const char *dir, const char *parent, whale_err *err) {
    whale_fsync_dir(tmp);
    if (whale_is_dir(dir)) whale_remove_flat_dir(dir);
    if (rename(tmp, dir) != 0) {
        whale_code c = whale_errf(err, WHALE_ERR_IO, "%s: cannot rename into place: %s", dir, strerror(errno));
        whale_remove_flat_dir(tmp);
        return c;
    }
    whale_fsync_dir(parent);
    return WHALE_OK;
}

void whale_fmt_duration(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 1e7) snprintf(buf, cap, "?");
    else if (s < 60) snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

const char *whale_json_double(char *buf, size_t cap, const char *fmt, double v) {
    if (isfinite(v)) snprintf(buf, cap, fmt, v);
    else snprintf(buf, cap, "null");
    return buf;
}

/* ---------------------------------------------------------------- ranks */

static whale_code check_divides(int n_micro, int N, whale_err *err) {
    if (n_micro % N)
        return whale_errf(err, WHALE_ERR_ARG,
                          "--grad-accum %d does not divide among %d ranks: the %d micro-batches of each step are "
                          "shared out, so make it a multiple of the number of ranks",
                          n_micro, N, n_micro);
    return WHALE_OK;
}

whale_code whale_step_sum_new(whale_session *s, int n_micro, whale_grad_sum **out, whale_err *err) {
    int N = whale_dist_size();
    *out = NULL;
    whale_code c = check_divides(n_micro, N, err);
    if (c) return c;
    if (n_micro == 1 && N == 1) return WHALE_OK; /* the backward accumulates in place */
    return whale_grad_sum_new(s->n_grad_train, NULL, out, err); /* frozen buffers stay out of the exchange */
}

whale_code whale_step_sum_buckets(whale_grad_sum *sum, double mb, whale_err *err) {
    return sum && mb > 0 ? whale_grad_sum_set_buckets(sum, whale_bucket_floats(mb), err) : WHALE_OK;
}

void whale_zero_free(whale_zero *z) {
    if (!z) return;
    for (int k = 0; k < z->n_dropped; k++) /* the allocation they are in is the model's to free */
        mprotect(z->dropped[k].p, z->dropped[k].n, PROT_READ | PROT_WRITE);
    free(z->start), free(z->len), free(z->first), free(z->part), free(z->all);
    free(z->f32), free(z->half), free(z->half_param), free(z->dropped);
    free(z);
}

/* Give back the pages of [p, p + n) bytes that lie wholly inside it. */
static void drop_range(whale_zero *z, char *p, size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(uintptr_t)(pg - 1), b = ((uintptr_t)p + n) & ~(uintptr_t)(pg - 1);
    if (b <= a) return;
    /* an access would be a bug (a read of a master this rank does not
     * hold): make it fault rather than read zeros */
    if (madvise((void *)a, b - a, MADV_DONTNEED) || mprotect((void *)a, b - a, PROT_NONE)) return;
    z->dropped[z->n_dropped].p = (void *)a, z->dropped[z->n_dropped++].n = b - a;
    z->dropped_bytes += b - a;
}

void whale_zero_drop_masters(whale_zero *z, whale_session *s) {
    if (!z) return;
    const whale_model *m = s->model;
    for (int k = 0; k < z->n_half; k++) {
        const whale_wspan *h = &z->half[k];
        size_t k0 = h->at < z->lo ? z->lo - h->at : 0, k1 = h->at + h->n <= z->hi ? h->n : z->hi > h->at ? z->hi - h->at : 0;
        if (k0 > h->n) k0 = h->n; /* the shard is wholly past this weight */
        if (k1 < k0) k1 = k0;
        float *w = m->params[z->half_param[k]].data;
        drop_range(z, (char *)w, sizeof(float) * k0);
        drop_range(z, (char *)(w + k1), sizeof(float) * (h->n - k1));
    }
}

size_t whale_zero_dropped_bytes(const whale_zero *z) { return z ? z->dropped_bytes : 0; }

void whale_step_memory(const whale_model *m, const whale_session *s, const whale_optimizer *opt,
                       const whale_grad_sum *sum, const whale_zero *zero, whale_memory *mm) {
    whale_memory_of_model(m, mm);
    whale_memory_add_session(mm, s);
    whale_memory_add_optimizer(mm, whale_optimizer_bytes(opt));
    size_t g = sum ? whale_grad_sum_bytes(sum) : 0, dropped = whale_zero_dropped_bytes(zero);
    mm->grads += g, mm->total += g;
    mm->weights_f32 -= dropped, mm->total -= dropped;
    mm->ranks = whale_dist_size(), mm->zero = zero != NULL;
}

/* Shard boundaries on chunk boundaries: rank r's shard starts at the first
 * chunk at or past r/N of the vector. */
static void zero_shards(whale_zero *z, size_t nch, size_t n, int N, size_t *shards) {
    size_t c = 0;
    z->kmax = 0;
    for (int r = 0; r <= N; r++) {
        size_t target = (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)N);
        while (r == N ? c < nch : c < nch && z->start[c] < target) c++;
        z->first[r] = (int)c;
        shards[r] = r == N || c == nch ? n : z->start[c];
        if (r && z->first[r] - z->first[r - 1] > z->kmax) z->kmax = z->first[r] - z->first[r - 1];
    }
}

whale_code whale_zero_new(whale_session *s, whale_optimizer *opt, int n_micro, whale_grad_sum **sum, whale_zero **out,
                          whale_err *err) {
    int N = whale_dist_size();
    *out = NULL, *sum = NULL;
    if (N == 1) return whale_step_sum_new(s, n_micro, sum, err);
    whale_code c = check_divides(n_micro, N, err);
    if (c) return c;
    const whale_model *m = s->model;
    size_t nch = whale_grad_chunks(s, NULL, NULL), n = s->n_grad_train, *shards = malloc(sizeof(size_t) * (size_t)(N + 1));
    whale_zero *z = calloc(1, sizeof *z);
    if (z) {
        z->start = malloc(sizeof(size_t) * (nch ? nch : 1)), z->len = malloc(sizeof(size_t) * (nch ? nch : 1));
        z->first = malloc(sizeof(int) * (size_t)(N + 1));
        z->f32 = malloc(sizeof(whale_wspan) * (size_t)(m->n_params ? m->n_params : 1));
        z->half = malloc(sizeof(whale_wspan) * (size_t)(m->n_params ? m->n_params : 1));
        z->half_param = malloc(sizeof(int) * (size_t)(m->n_params ? m->n_params : 1));
        z->dropped = malloc(sizeof *z->dropped * 2 * (size_t)(m->n_params ? m->n_params : 1));
    }
    if (!shards || !z || !z->start || !z->len || !z->first || !z->f32 || !z->half || !z->half_param || !z->dropped) {
        free(shards);
        whale_zero_free(z);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    whale_grad_chunks(s, z->start, z->len);
    for (int i = 0; i < m->n_params; i++) { /* the trainable vector: gradients, moments and weights alike */
        if (m->params[i].frozen) continue;
        assert(whale_optimizer_offset(opt, i) == s->grad_offsets[i]);
        size_t len = (size_t)whale_shape_numel(m->params[i].ndim, m->params[i].shape), at = s->grad_offsets[i];
        const whale_wcopy *w = NULL; /* its bf16/fp16 compute copy, if it has one */
        for (int k = 0; k < m->n_copies && !w; k++)
            if (m->copies[k].param == i && (m->copies[k].dtype == WHALE_BF16 || m->copies[k].dtype == WHALE_F16))
                w = &m->copies[k];
        if (w) {
            z->fmt = whale_format_of(w->dtype);
            z->half_param[z->n_half] = i;
            z->half[z->n_half++] = (whale_wspan){(void *)w->data, at, len};
        } else
            z->f32[z->n_f32++] = (whale_wspan){m->params[i].data, at, len};
    }
    zero_shards(z, nch, n, N, shards);
    z->part = calloc((size_t)(z->kmax ? z->kmax : 1), sizeof(double));
    z->all = calloc((size_t)N * (size_t)(z->kmax ? z->kmax : 1), sizeof(double));
    if (!z->part || !z->all) c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if (!c) c = whale_grad_sum_new(n, shards, sum, err);
    if (!c) {
        whale_grad_sum_range(*sum, &z->lo, &z->hi);
        c = whale_optimizer_shard(opt, z->lo, z->hi, err);
    }
    free(shards);
    if (c) {
        whale_grad_sum_free(*sum);
        *sum = NULL;
        whale_zero_free(z);
        return c;
    }
    *out = z;
    return WHALE_OK;
}

whale_code whale_step_sum_dealt(const double *mine, int n, int k, double *sum, whale_err *err) {
    int N = whale_dist_size(), per = (n + N - 1) / N;
    double *all = calloc((size_t)N * (size_t)(per ? per : 1) * (size_t)k, sizeof(double));
    if (!all) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    whale_code c = whale_dist_allgather_f64(mine, per * k, all, "exchange of evaluation losses", err);
    for (int q = 0; q < k; q++) sum[q] = 0;
    for (int j = 0; !c && j < n; j++)
        for (int q = 0; q < k; q++) sum[q] += all[((size_t)(j % N) * (size_t)per + (size_t)(j / N)) * (size_t)k + (size_t)q];
    free(all);
    return c;
}

/* ---------------------------------------------------------------- moments in checkpoints */

typedef struct {
    const whale_model *m;
    whale_optimizer *opt;
    whale_grad_sum *sum;
    const int *param;  /* [items]: the parameter of item j (exp_avg, exp_avg_sq in turn) */
    float *buf;        /* one tensor */
    int64_t step;
} moments_out;

/* Item j's bytes: gathered from the ranks that hold a part of it (zero), or
 * the moments themselves. */
static const void *moment_bytes(void *user, int j, whale_err *err) {
    moments_out *w = user;
    int i = w->param[j];
    size_t lo, hi, a = whale_optimizer_offset(w->opt, i);
    const float *held = whale_optimizer_held(w->opt, j % 2, &lo, &hi);
    if (!w->sum) return held + a;
    whale_tensor t = whale_model_param(w->m, i);
    return whale_grad_sum_collect(w->sum, held, a, (size_t)whale_shape_numel(t.ndim, t.shape), w->buf, w->step, err)
               ? NULL
               : w->buf;
}

whale_code whale_step_save_moments(const char *path, const whale_model *m, whale_optimizer *opt, whale_grad_sum *sum,
                                   whale_zero *zero, int64_t step, whale_err *err) {
    if (!path && !zero) return WHALE_OK; /* rank 0 holds every moment */
    int n = whale_model_num_params(m), k = 0;
    size_t most = 1;
    whale_st_item *items = calloc((size_t)2 * n, sizeof *items);
    char (*names)[200] = calloc((size_t)2 * n, 200);
    whale_tensor *shapes = calloc((size_t)n, sizeof *shapes);
    int *param = calloc((size_t)2 * n, sizeof *param);
    whale_code c = items && names && shapes && param ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "out of memory writing a checkpoint");
    for (int i = 0; !c && i < n; i++) {
        if (whale_optimizer_offset(opt, i) == SIZE_MAX) continue; /* frozen */
        shapes[i] = whale_model_param(m, i);
        size_t numel = (size_t)whale_shape_numel(shapes[i].ndim, shapes[i].shape);
        most = numel > most ? numel : most;
        for (int which = 0; which < 2; which++, k++) {
            snprintf(names[k], 200, "%s.%s", which ? "exp_avg_sq" : "exp_avg", whale_model_param_name(m, i));
            items[k] = (whale_st_item){names[k], WHALE_F32, shapes[i].ndim, shapes[i].shape, NULL};
            param[k] = i;
        }
    }
    moments_out w = {m, opt, zero ? sum : NULL, param, NULL, step};
    if (!c && zero && path && !(w.buf = whale_alloc(sizeof(float) * most)))
        c = whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB to gather moments", most * 4.0 / 1048576.0);
    if (!c && path) c = whale_st_write_stream(path, items, k, NULL, moment_bytes, &w, err);
    for (int j = 0; !c && !path && j < k; j++) { /* the other ranks send their parts, in the same order */
        size_t lo, hi, a = whale_optimizer_offset(opt, param[j]);
        const float *held = whale_optimizer_held(opt, j % 2, &lo, &hi);
        c = whale_grad_sum_collect(sum, held, a, (size_t)whale_shape_numel(items[j].ndim, items[j].shape), NULL, step, err);
    }
    free(w.buf);
    free(items);
    free(names);
    free(shapes);
    free(param);
    return c;
}

/* ---------------------------------------------------------------- sharded masters in checkpoints */

typedef struct {
    const whale_model *m;
    const whale_zero *z;
    whale_grad_sum *sum;
    float *buf; /* the largest sharded master */
    int64_t step;
} masters_out;

/* Parameter i's half span, or −1. */
static int half_of(const whale_zero *z, int i) {
    for (int k = 0; k < z->n_half; k++)
        if (z->half_param[k] == i) return k;
    return -1;
}

static const void *master_bytes(void *user, int i, whale_err *err) {
    masters_out *w = user;
    int k = half_of(w->z, i);
    if (k < 0) return whale_model_param(w->m, i).data;
    const whale_wspan *h = &w->z->half[k];
    return whale_grad_sum_collect_at(w->sum, w->m->params[i].data, h->at, h->n, w->buf, w->step, err) ? NULL : w->buf;
}

whale_code whale_step_save_model(const char *dir, const whale_model *m, whale_grad_sum *sum, const whale_zero *zero,
                                 int64_t step, whale_err *err) {
    if (!zero || !zero->n_half) return dir ? whale_model_save(m, dir, err) : WHALE_OK;
    whale_code c = WHALE_OK;
    if (!dir) { /* send this rank's parts, in the order rank 0 writes the tensors */
        for (int k = 0; !c && k < zero->n_half; k++)
            c = whale_grad_sum_collect_at(sum, m->params[zero->half_param[k]].data, zero->half[k].at, zero->half[k].n,
                                          NULL, step, err);
        return c;
    }
    size_t most = 1;
    for (int k = 0; k < zero->n_half; k++) most = zero->half[k].n > most ? zero->half[k].n : most;
    masters_out w = {m, zero, sum, whale_alloc(sizeof(float) * most), step};
    if (!w.buf) return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB to gather weights", most * 4.0 / 1048576.0);
    c = whale_model_save_stream(m, dir, master_bytes, &w, err);
    free(w.buf);
    return c;
}

whale_code whale_step_load_moments(const char *path, const whale_model *m, whale_optimizer *opt, whale_err *err) {
    whale_st *st;
    whale_code c = whale_st_open(path, &st, err);
    if (c) return c;
    for (int i = 0; i < whale_model_num_params(m) && !c; i++)
        for (int which = 0; which < 2 && !c; which++) {
            size_t a = whale_optimizer_offset(opt, i), lo, hi;
            if (a == SIZE_MAX) continue; /* frozen */
            float *held = whale_optimizer_held(opt, which, &lo, &hi);
            char name[200];
            snprintf(name, sizeof name, "%s.%s", which ? "exp_avg_sq" : "exp_avg", whale_model_param_name(m, i));
            const whale_st_entry *e = whale_st_find(st, name);
            whale_tensor t = whale_model_param(m, i);
            size_t n = (size_t)whale_shape_numel(t.ndim, t.shape);
            if (!e || e->dtype != WHALE_F32 || e->nbytes != sizeof(float) * n) {
                c = whale_errf(err, WHALE_ERR_FORMAT, "%s: missing or mis-sized %s", path, name);
                break;
            }
            size_t from = a > lo ? a : lo, to = a + n < hi ? a + n : hi; /* the part in this rank's shard */
            if (from < to) memcpy(held + (from - lo), (const float *)e->data + (from - a), sizeof(float) * (to - from));
        }
    whale_st_close(st);
    return c;
}

/* The metrics' fields for several ranks: each rank's tokens per second of
 * its own compute (time in and waiting for exchanges left out), and rank 0's
 * seconds moving data, seconds waiting, and bytes sent in exchanges (with
 * buckets also those sent during backward passes). Every rank calls it at
 * the same steps. */
whale_code whale_step_dist_metrics(FILE *f, const whale_grad_sum *sum, double rank_tokens, double t_train,
                                   whale_err *err) {
    int N = whale_dist_size();
    if (N == 1) return WHALE_OK;
    double comm, wait, bytes, *all = malloc(sizeof(double) * (size_t)N);
    if (!all) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    whale_dist_stats(&comm, &wait, &bytes);
    double mine = t_train > comm + wait ? rank_tokens / (t_train - comm - wait) : 0;
    whale_code c = whale_dist_allgather_f64(&mine, 1, all, "exchange of metrics", err);
    if (!c && f) {
        fprintf(f, ", \"world_size\": %d, \"rank_tokens_per_s\": [", N);
        for (int r = 0; r < N; r++) fprintf(f, "%s%.1f", r ? ", " : "", all[r]);
        fprintf(f, "], \"comm_s\": %.3f, \"wait_s\": %.3f, \"comm_bytes\": %.0f", comm, wait, bytes);
        if (sum && whale_grad_sum_buckets(sum))
            fprintf(f, ", \"comm_bytes_in_backward\": %.0f", whale_grad_sum_bytes_early(sum));
    }
    free(all);
    return c;
}

whale_code whale_step_check_start(whale_session *s, whale_optimizer *opt, const whale_data_cursor *cur, int64_t step,
                                  whale_err *err) {
    if (whale_dist_size() == 1) return WHALE_OK;
    const whale_model *m = whale_session_model(s);
    uint64_t h = whale_hash_bytes(&step, sizeof step, 1469598103934665603ull);
    h = whale_hash_bytes(cur, sizeof *cur, h);
    for (int i = 0; i < whale_model_num_params(m); i++) {
        whale_tensor t = whale_model_param(m, i);
        const float *mom = whale_optimizer_moment(opt, 0, i);
        size_t bytes = sizeof(float) * (size_t)whale_shape_numel(t.ndim, t.shape);
        if (whale_optimizer_offset(opt, i) == SIZE_MAX) continue; /* frozen: read from the same files by every rank */
        h = whale_hash_bytes(t.data, bytes, h);
        if (!mom) continue; /* sharded: each rank holds its own */
        h = whale_hash_bytes(mom, bytes, h);
        h = whale_hash_bytes(whale_optimizer_moment(opt, 1, i), bytes, h);
    }
    return whale_dist_check_same(h, "the starting weights, moments, step or data position", err);
}
