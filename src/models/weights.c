/* Weights in a run's precision: the compute copies (bf16, fp16, int8) of a
 * model's product weights, how a product finds them, and the products every
 * family's Linear layers go through (forward, input gradient, weight
 * gradient) with the precision policy of docs/precision.md.
 *
 * A weight always has an fp32 pointer (the family's slot). With fp32
 * master weights the pointer holds the values and the copy is derived from
 * them (training in bf16/fp16, or a model switched with set_dtype); without
 * them the pointer is a handle into a reserved, inaccessible range and the
 * copy is the only storage (inference loads, LoRA's frozen base). */
#include "models/model.h"

#include "backend/backend.h"

#include "core/core.h"
#include "core/par.h"
#include "whale_safetensors.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "whale_lora.h"

#include <assert.h>
#include <omp.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int whale_param_is_product_weight(const whale_param *p) {
    assert(p->ndim == 2 || (p->role != WHALE_ROLE_LINEAR && p->role != WHALE_ROLE_EMBED && p->role != WHALE_ROLE_HEAD));
    return p->role == WHALE_ROLE_LINEAR || p->role == WHALE_ROLE_EMBED || p->role == WHALE_ROLE_HEAD;
}

static int is_handle(const whale_model *m, const float *W) {
    return m->handles && (const char *)W >= (const char *)m->handles &&
           (const char *)W < (const char *)m->handles + m->handle_bytes;
}

int whale_param_has_f32(const whale_model *m, const whale_param *p) { return !is_handle(m, p->data); }

static const whale_wcopy *find_copy(const whale_model *m, const float *W) {
    int lo = 0, hi = m->n_copies - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const whale_wcopy *w = &m->copies[mid];
        if (W < w->start) hi = mid - 1;
        else if (W >= w->end) lo = mid + 1;
        else return w;
    }
    return NULL;
}

whale_wview whale_model_weight(const whale_model *m, const float *W) {
    const whale_wcopy *w = m->n_copies ? find_copy(m, W) : NULL;
    if (!w) return (whale_wview){WHALE_F32, W, NULL, 0};
    size_t off = (size_t)(W - w->start);
    if (w->dtype == WHALE_I8) { /* int8 views start at a row, in a packed panel */
        assert(off % (size_t)w->cols == 0);
        const int64_t r = (int64_t)(off / (size_t)w->cols);
        return (whale_wview){WHALE_I8, (const char *)w->data + whale_copy_values_bytes(WHALE_I8, r - r % 16, w->cols),
                             w->scale + r, (int)(r % 16)};
    }
    return (whale_wview){w->dtype, (const char *)w->data + off * whale_dtype_size(w->dtype), NULL, 0};
}

static void view_row_to_f32(const whale_wview *v, int64_t cols, float *out) {
    const whale_format *f = whale_format_of(v->dtype);
    assert(f);
    if (v->dtype == WHALE_I8) whale_q8p_row(out, v->data, v->row0, (int)cols, v->scale[0]);
    else f->row_to_f32(out, v->data, f->row_scale ? v->scale[0] : 1.0f, cols);
}

void whale_model_row(const whale_model *m, const float *W, int64_t r, int64_t cols, float *out) {
    /* the copy when there is one: a run reads its weights in its format,
     * with or without fp32 masters behind them */
    whale_wview v = whale_model_weight(m, W + r * cols);
    view_row_to_f32(&v, cols, out);
}

/* ------------------------------------------------------------ conversion */

/* Drop the resident pages of checkpoint data already converted: they would
 * otherwise stay in the process's memory next to their copy (the mapping
 * is read-only and file-backed, so nothing is lost; a later read faults the
 * page in again). Releases the whole pages inside [lo, hi) and returns
 * where the next release should start (hi's page, not complete yet). */
static const char *release_pages(const char *lo, const char *hi) {
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return lo;
    uintptr_t a = ((uintptr_t)lo + (uintptr_t)ps - 1) & ~(uintptr_t)(ps - 1);
    uintptr_t b = (uintptr_t)hi & ~(uintptr_t)(ps - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
    return b > (uintptr_t)lo ? (const char *)b : lo;
}

/* fp32 source rows must go through tmp when they are not 4-byte aligned:
 * safetensors does not align tensors, and the fp32 kernels read floats. */
static int needs_tmp(const void *src, whale_dtype sdt, whale_dtype dt) {
    return sdt != dt && (sdt != WHALE_F32 || ((uintptr_t)src & (sizeof(float) - 1)));
}

/* Rows r0..r0+n of dst from src (fp32 rows f, or converted through tmp). */
static void convert_block(void *dst, float *scale, whale_dtype dt, const char *sb, whale_dtype sdt, float *tmp,
                          int64_t r0, int64_t n, int64_t cols) {
    size_t off = (size_t)(r0 * cols), cnt = (size_t)(n * cols);
    assert(dt != WHALE_I8 || r0 % 16 == 0); /* packed int8 blocks start a panel */
    if (sdt == dt) {
        memcpy((char *)dst + off * whale_dtype_size(dt), sb, cnt * whale_dtype_size(dt));
        return;
    }
    const float *f = (const float *)sb;
    if (sdt == WHALE_BF16) whale_bf16_to_f32(tmp, sb, cnt);
    else if (sdt == WHALE_F16) whale_f16_to_f32(tmp, sb, cnt);
    else if ((uintptr_t)sb & (sizeof(float) - 1)) memcpy(tmp, sb, cnt * sizeof(float)); /* unaligned fp32 */
    if (sdt != WHALE_F32 || (uintptr_t)sb & (sizeof(float) - 1)) f = tmp;
    const whale_format *fmt = whale_format_of(dt);
    assert(fmt);
    fmt->from_f32((char *)dst + whale_copy_values_bytes(dt, r0, cols), fmt->row_scale ? scale + r0 : NULL, f, n, cols);
}

/* dst (rows × cols of dt, int8 scales into scale) from src of dtype sdt, in
 * blocks of rows. With release_src (src is checkpoint data), each thread
 * converts one contiguous run of blocks in order and drops the source pages
 * behind it every CONVERT_RELEASE_BYTES, so loading holds at most that much of a
 * tensor twice per thread. Not after every block: each madvise flushes the
 * other threads' TLBs, and copying the 1 GB Qwen2.5-0.5B bf16 checkpoint
 * on 2 threads made 7,130 calls taking 3.3 s with one per 64 rows (112 KiB)
 * against 502 taking 0.14 s with one per 4 MiB (strace -c). Not much more:
 * at 32 MiB the pages held at once put the peak of an int8 nanowhale-100m
 * run 12 % over `whale memory`'s estimate. Returns 0 when a thread could
 * not get its scratch (nothing is skipped silently). */
enum { CONVERT_BLOCK = 64, CONVERT_RELEASE_BYTES = 4 << 20 };

/* Thread t of nt's share of convert_rows: its run of blocks, in order. */
static int convert_share(void *dst, float *scale, whale_dtype dt, const void *src, whale_dtype sdt, int64_t rows,
                         int64_t cols, int release_src, int t, int nt) {
    const int64_t nblocks = (rows + CONVERT_BLOCK - 1) / CONVERT_BLOCK;
    const int64_t b0 = nblocks * t / nt, b1 = nblocks * (t + 1) / nt;
    const size_t row_bytes = (size_t)cols * whale_dtype_size(sdt);
    if (b0 == b1) return 1;
    float *tmp = NULL;
    if (needs_tmp(src, sdt, dt) && !(tmp = whale_alloc(sizeof(float) * CONVERT_BLOCK * (size_t)cols))) return 0;
    const char *done = (const char *)src + (size_t)(b0 * CONVERT_BLOCK) * row_bytes; /* released up to */
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * CONVERT_BLOCK, n = rows - r0 < CONVERT_BLOCK ? rows - r0 : CONVERT_BLOCK;
        const char *sb = (const char *)src + (size_t)r0 * row_bytes;
        convert_block(dst, scale, dt, sb, sdt, tmp, r0, n, cols);
        const char *end = sb + (size_t)n * row_bytes;
        if (release_src && (end - done >= CONVERT_RELEASE_BYTES || b == b1 - 1)) done = release_pages(done, end);
    }
    free(tmp);
    return 1;
}

static int convert_rows(void *dst, float *scale, whale_dtype dt, const void *src, whale_dtype sdt, int64_t rows,
                        int64_t cols, int release_src) {
    int ok = 1;
    WHALE_PARALLEL_IF(rows > CONVERT_BLOCK, t, nt, {
        if (!convert_share(dst, scale, dt, src, sdt, rows, cols, release_src, t, nt))
            __atomic_store_n(&ok, 0, __ATOMIC_RELAXED);
    });
    return ok;
}

whale_code whale_convert_checkpoint(void *dst, whale_dtype dt, const void *src, whale_dtype sdt, int64_t rows,
                                    int64_t cols, whale_err *err) {
    if (!convert_rows(dst, NULL, dt, src, sdt, rows, cols, 1))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory converting a %lld × %lld tensor", (long long)rows,
                          (long long)cols);
    return WHALE_OK;
}

static int copy_cmp(const void *a, const void *b) {
    const whale_wcopy *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

void whale_model_clear_copies(whale_model *m) {
    free(m->copies);
    free(m->copy_mem);
    m->copies = NULL;
    m->copy_mem = NULL;
    m->n_copies = 0;
    m->copy_bytes = m->mapped_copy_bytes = 0;
}

whale_code whale_model_build_copies(whale_model *m, whale_dtype dt, const whale_st_entry *const *src,
                                    whale_err *err) {
    whale_model_clear_copies(m);
    size_t total = 0;
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        if (!whale_param_is_product_weight(p)) continue;
        n++;
        const whale_st_entry *e = src ? src[i] : NULL;
        int mapped = e && e->dtype == dt && dt != WHALE_I8 && !((uintptr_t)e->data & 1);
        if (!mapped) total += whale_copy_bytes(dt, p->shape[0], p->shape[1]);
    }
    m->copies = calloc((size_t)(n ? n : 1), sizeof *m->copies);
    m->copy_mem = total ? whale_alloc(total) : NULL;
    if (!m->copies || (total && !m->copy_mem)) {
        whale_model_clear_copies(m);
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of %s weights", total / 1048576.0,
                          whale_dtype_name(dt));
    }
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        if (!whale_param_is_product_weight(p)) continue;
        int64_t rows = p->shape[0], cols = p->shape[1];
        whale_wcopy *w = &m->copies[m->n_copies++];
        *w = (whale_wcopy){p->data, p->data + rows * cols, dt, NULL, NULL, cols, i};
        const whale_st_entry *e = src ? src[i] : NULL;
        if (e && e->dtype == dt && dt != WHALE_I8 && !((uintptr_t)e->data & 1)) { /* checkpoint already in dt: zero copy */
            w->data = e->data;
            m->mapped_copy_bytes += (size_t)(rows * cols) * whale_dtype_size(dt);
            continue;
        }
        char *dst = (char *)m->copy_mem + off;
        float *scale = whale_format_of(dt)->row_scale ? (float *)(dst + whale_copy_values_bytes(dt, rows, cols)) : NULL;
        /* the int8 values come first; scales after them, 4-byte aligned */
        if (scale) scale = (float *)(((uintptr_t)scale + 3) & ~(uintptr_t)3);
        if (!(e ? convert_rows(dst, scale, dt, e->data, e->dtype, rows, cols, 1)
                : convert_rows(dst, scale, dt, p->data, WHALE_F32, rows, cols, 0))) {
            whale_model_clear_copies(m);
            return whale_errf(err, WHALE_ERR_NOMEM, "out of memory converting %s to %s", p->name, whale_dtype_name(dt));
        }
        w->data = dst;
        w->scale = scale;
        off += whale_copy_bytes(dt, rows, cols);
    }
    m->copy_bytes = total;
    qsort(m->copies, (size_t)m->n_copies, sizeof *m->copies, copy_cmp);
    m->compute_dtype = dt;
    return WHALE_OK;
}

void whale_model_refresh_copies(whale_model *m) {
    for (int i = 0; i < m->n_copies; i++) {
        whale_wcopy *w = &m->copies[i];
        const whale_param *p = &m->params[w->param];
        if (p->frozen || !whale_param_has_f32(m, p)) continue; /* frozen: never changes */
        int64_t rows = p->shape[0];
        /* fp32 masters are aligned owned memory: no scratch, cannot fail */
        int ok = convert_rows((void *)w->data, (float *)w->scale, w->dtype, p->data, WHALE_F32, rows, w->cols, 0);
        assert(ok);
        (void)ok;
    }
}

/* Reserve an inaccessible address range of `bytes` for handles. */
whale_code whale_model_reserve_handles(whale_model *m, size_t bytes, whale_err *err) {
    if (!bytes) return WHALE_OK;
    void *h = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (h == MAP_FAILED)
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot reserve %.1f GiB of address space for weight handles",
                          bytes / 1073741824.0);
    m->handles = h;
    m->handle_bytes = bytes;
    return WHALE_OK;
}

void whale_model_release_handles(whale_model *m) {
    if (m->handles) munmap(m->handles, m->handle_bytes);
    m->handles = NULL;
    m->handle_bytes = 0;
}

whale_code whale_model_drop_master(whale_model *m, whale_err *err) {
    if (!m->n_copies || m->handles) return WHALE_OK; /* fp32 run, or already without masters */
    whale_wcopy **copy_of = calloc((size_t)m->n_params, sizeof *copy_of); /* param → its copy */
    if (!copy_of) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m->n_copies; i++) copy_of[m->copies[i].param] = &m->copies[i];
    size_t hb = 0, keep = 0;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        size_t n = ((size_t)whale_shape_numel(p->ndim, p->shape) + 15) & ~(size_t)15;
        if (copy_of[i]) hb += n * sizeof(float);
        else keep += n;
    }
    whale_code c = whale_model_reserve_handles(m, hb, err);
    float *owned = NULL;
    if (!c && keep && !(owned = whale_alloc(keep * sizeof(float)))) {
        whale_model_release_handles(m);
        c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory keeping fp32 parameters");
    }
    if (c) {
        free(copy_of);
        return c;
    }
    size_t ho = 0, ko = 0;
    for (int i = 0; i < m->n_params; i++) {
        whale_param *p = &m->params[i];
        size_t n = (size_t)whale_shape_numel(p->ndim, p->shape), na = (n + 15) & ~(size_t)15;
        whale_wcopy *w = copy_of[i];
        if (w) {
            p->data = (float *)((char *)m->handles + ho);
            w->start = p->data;
            w->end = p->data + n;
            ho += na * sizeof(float);
        } else {
            memcpy(owned + ko, p->data, n * sizeof(float));
            p->data = owned + ko;
            ko += na;
        }
        *p->slot = p->data;
    }
    free(copy_of);
    free(m->owned);
    m->owned = owned;
    qsort(m->copies, (size_t)m->n_copies, sizeof *m->copies, copy_cmp);
    whale_lora_rekey(m);
    if (m->source && !m->mapped_copy_bytes) { /* nothing points into the checkpoint any more */
        whale_st_close(m->source);
        m->source = NULL;
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ owning */

/* A tensor of the checkpoint into dst, the mapping's pages dropped behind
 * the copy (same dtype: no scratch, cannot fail). */
static void copy_out(void *dst, const void *src, whale_dtype dt, int64_t rows, int64_t cols) {
    int ok = convert_rows(dst, NULL, dt, src, dt, rows, cols, 1);
    assert(ok);
    (void)ok;
}

/* The compute copies used in place from the checkpoint into one owned
 * buffer with the owned ones (moved as they are, int8 scales with them). */
static whale_code own_copies(whale_model *m, whale_err *err) {
    if (!m->mapped_copy_bytes) return WHALE_OK;
    size_t total = m->copy_bytes;
    for (int i = 0; i < m->n_copies; i++) {
        const whale_wcopy *w = &m->copies[i];
        if (whale_st_holds(m->source, w->data)) total += whale_copy_bytes(w->dtype, m->params[w->param].shape[0], w->cols);
    }
    char *buf = whale_alloc(total), *old = m->copy_mem;
    if (!buf) return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB for the weights", total / 1048576.0);
    if (m->copy_bytes) memcpy(buf, old, m->copy_bytes);
    size_t off = m->copy_bytes;
    for (int i = 0; i < m->n_copies; i++) {
        whale_wcopy *w = &m->copies[i];
        int64_t rows = m->params[w->param].shape[0];
        if (whale_st_holds(m->source, w->data)) {
            copy_out(buf + off, w->data, w->dtype, rows, w->cols);
            w->data = buf + off;
            off += whale_copy_bytes(w->dtype, rows, w->cols);
            continue;
        }
        w->data = buf + ((const char *)w->data - old);
        if (w->scale) w->scale = (const float *)(buf + ((const char *)w->scale - old));
    }
    free(old);
    m->copy_mem = buf;
    m->copy_bytes = total;
    m->mapped_copy_bytes = 0;
    return WHALE_OK;
}

/* The fp32 values (all but handles) into one owned buffer when any of them
 * is read in place from the checkpoint; the copies and adapters are found
 * by those addresses, so they are keyed again. */
static whale_code own_f32(whale_model *m, whale_err *err) {
    size_t total = 0;
    int mapped = 0, nb = m->n_lora ? m->n_base_params : m->n_params; /* attached adapters have their memory */
    for (int i = 0; i < nb; i++) {
        const whale_param *p = &m->params[i];
        if (is_handle(m, p->data)) continue;
        total += ((size_t)whale_shape_numel(p->ndim, p->shape) + 15) & ~(size_t)15;
        mapped |= whale_st_holds(m->source, p->data);
    }
    if (!mapped) return WHALE_OK;
    float *buf = whale_alloc(total * sizeof(float));
    if (!buf) return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB for the weights", total * 4 / 1048576.0);
    size_t off = 0;
    for (int i = 0; i < nb; i++) {
        whale_param *p = &m->params[i];
        if (is_handle(m, p->data)) continue;
        int64_t n = whale_shape_numel(p->ndim, p->shape), rows = p->ndim == 2 ? p->shape[0] : 1;
        if (whale_st_holds(m->source, p->data)) copy_out(buf + off, p->data, WHALE_F32, rows, n / rows);
        else memcpy(buf + off, p->data, (size_t)n * sizeof(float));
        p->data = buf + off;
        *p->slot = p->data;
        off += ((size_t)n + 15) & ~(size_t)15;
    }
    free(m->owned);
    m->owned = buf;
    for (int i = 0; i < m->n_copies; i++) {
        whale_wcopy *w = &m->copies[i];
        w->start = m->params[w->param].data;
        w->end = w->start + whale_shape_numel(2, m->params[w->param].shape);
    }
    if (m->n_copies) qsort(m->copies, (size_t)m->n_copies, sizeof *m->copies, copy_cmp);
    whale_lora_rekey(m);
    return WHALE_OK;
}

whale_code whale_model_own_weights(whale_model *m, whale_err *err) {
    if (!m->source) return WHALE_OK;
    whale_code c = own_copies(m, err);
    if (!c) c = own_f32(m, err);
    if (c) return c;
    whale_st_close(m->source);
    m->source = NULL;
    return WHALE_OK;
}

/* ------------------------------------------------------------ products */

static void round_rows_f16(float *C, int M, int N, int ldc) {
    for (int i = 0; i < M; i++) whale_round_f16_inplace(C + (size_t)i * ldc, (size_t)N);
}

/* LoRA dropout: whether element i of the adapter input is kept, from a
 * counter-based hash of (seed, training step, adapter, row offset, i), so
 * the backward pass regenerates the forward's mask without storing it. */
static inline int lora_keep(uint64_t key, uint64_t i, uint32_t threshold) {
    uint64_t z = key + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (uint32_t)(z >> 32) >= threshold;
}

typedef struct {
    const whale_lora_target *t;
    int64_t row0;     /* first row of the base weight this product uses */
    float *xa;        /* [M, r]: drop(x)·Aᵀ, then scratch */
    float *u;         /* [M, r] */
    float *xd;        /* [M, K]: the dropped-out input, or NULL without dropout */
    uint64_t key;
    uint32_t threshold;
    float keep_scale; /* 1 / (1 − p) */
} lora_call;

/* Set up the adapter term of a product with W (0 when W has no adapter). */
static int lora_begin(whale_session *s, const float *W, int M, int K, lora_call *lc) {
    const whale_model *m = s->model;
    if (!m->n_lora || !(lc->t = whale_lora_find(m, W))) return 0;
    const whale_lora_target *t = lc->t;
    lc->row0 = (int64_t)(W - t->start) / t->cols;
    int r = t->rank;
    lc->xa = s->lora_work;
    lc->u = s->lora_work + (size_t)M * r;
    double p = m->lora_cfg ? ((const whale_lora_config *)m->lora_cfg)->dropout : 0.0;
    lc->xd = NULL;
    if (s->training && p > 0) {
        lc->xd = s->lora_work + (size_t)2 * M * r;
        uint64_t seed = ((const whale_lora_config *)m->lora_cfg)->seed;
        lc->key = seed ^ (s->lora_calls << 40) ^ ((uint64_t)(t - m->lora) << 20) ^ (uint64_t)lc->row0;
        lc->threshold = (uint32_t)(p * 4294967296.0);
        lc->keep_scale = (float)(1.0 / (1.0 - p));
    }
    (void)K;
    return 1;
}

/* The fp32 products of the adapters, through the session's backend. */
static whale_code f32_nt(whale_session *s, int M, int N, int K, const float *A, int lda, const float *W, int ldw,
                         float *C, int ldc, int acc, whale_err *err) {
    return s->be->matmul_nt(s->be, M, N, K, A, lda, (whale_wref){WHALE_F32, W, ldw, NULL, 0}, C, ldc, acc, err);
}
static whale_code f32_nn(whale_session *s, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                         float *C, int ldc, int acc, whale_err *err) {
    return s->be->matmul_nn(s->be, M, N, K, A, lda, (whale_wref){WHALE_F32, B, ldb, NULL, 0}, C, ldc, acc, err);
}
static whale_code f32_tn(whale_session *s, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                         float *C, int ldc, whale_err *err) {
    return s->be->matmul_tn(s->be, WHALE_F32, M, N, K, A, lda, B, ldb, C, ldc, 1, err);
}

whale_wref whale_model_wref(const whale_model *m, const float *W, int ldw) {
    whale_wview v = whale_model_weight(m, W);
    return (whale_wref){v.dtype, v.dtype == WHALE_F32 ? (const void *)W : v.data, ldw, v.scale, v.row0};
}

/* xa = drop(X)·Aᵀ; with dropout, xd receives drop(X). */
static whale_code lora_input(whale_session *s, lora_call *lc, int M, int K, const float *X, int ldx, whale_err *err) {
    const whale_lora_target *t = lc->t;
    if (lc->xd) {
        WHALE_FOR_IF((long)M * K > 65536, (int i = 0; i < M; i++), {
            for (int k = 0; k < K; k++) {
                uint64_t e = (uint64_t)i * (uint64_t)K + (uint64_t)k;
                lc->xd[e] = lora_keep(lc->key, e, lc->threshold) ? X[(size_t)i * ldx + k] * lc->keep_scale : 0.0f;
            }
        });
        X = lc->xd;
        ldx = K;
    }
    return f32_nt(s, M, t->rank, K, X, ldx, t->A, (int)t->cols, lc->xa, t->rank, 0, err);
}

/* The bound adapters' terms C += s·(X·Aᵀ)·B[rows]ᵀ, gathered over parts:
 * each run of a part's rows whose adapter adapts the part's weight is a
 * job. The A products of up to WHALE_MM_MAX_PARTS jobs go to the backend
 * in one call (they share K), their B products in one call per rank, and
 * each product is what its own call would give (matmul_nt_parts), so the
 * sums do not depend on how jobs are grouped. Every job's x·Aᵀ [n, rank]
 * sits in s->lora_work, which holds rank × rows of the micro-batch at
 * least (whale_lora_work_floats): a job that does not fit flushes those
 * before it. */
typedef struct {
    const whale_lora_target *t;
    const whale_linear_part *p;
    int row0, n;   /* its rows of the part */
    int64_t wrow0; /* the first row of the base weight the part uses */
    float *xa;     /* [n, rank] */
} lora_job;

typedef struct {
    lora_job job[WHALE_MM_MAX_PARTS];
    int n;
    size_t used, cap; /* floats of s->lora_work */
} lora_jobs;

static whale_code jobs_flush(whale_session *s, int K, lora_jobs *J, whale_err *err) {
    whale_mm_part np[WHALE_MM_MAX_PARTS];
    for (int i = 0; i < J->n; i++) {
        const lora_job *j = &J->job[i];
        np[i] = (whale_mm_part){j->n, j->t->rank, j->p->A + (size_t)j->row0 * j->p->lda, j->p->lda, j->t->A,
                                (int)j->t->cols, NULL, j->xa, j->t->rank, 0};
    }
    whale_code e = J->n ? s->be->matmul_nt_parts(s->be, WHALE_F32, K, J->n, np, 0, err) : WHALE_OK;
    for (int i = 0; i < J->n && !e; i++)
        for (size_t k = 0; k < (size_t)J->job[i].n * J->job[i].t->rank; k++) J->job[i].xa[k] *= J->job[i].t->scale;
    unsigned done = 0; /* jobs whose B product ran, one call per rank */
    for (int i = 0; i < J->n && !e; i++) {
        if (done >> i & 1) continue;
        const int r = J->job[i].t->rank;
        int m = 0;
        for (int k = i; k < J->n; k++) {
            const lora_job *j = &J->job[k];
            if (j->t->rank != r) continue;
            done |= 1u << k;
            np[m++] = (whale_mm_part){j->n, j->p->N, j->xa, r, j->t->B + j->wrow0 * r, r, NULL,
                                      j->p->C + (size_t)j->row0 * j->p->ldc, j->p->ldc, 0};
        }
        e = s->be->matmul_nt_parts(s->be, WHALE_F32, r, m, np, 1, err);
    }
    J->n = 0, J->used = 0;
    return e;
}

/* Part p's jobs on the rows being run (s->lora_rows). */
static whale_code jobs_add(whale_session *s, int K, const whale_linear_part *p, lora_jobs *J, whale_err *err) {
    const whale_lora_rows *rw = &s->lora_rows;
    const whale_adapter *ad = NULL;
    const whale_lora_target *t = NULL;
    for (int i = 0; i < rw->n_runs; i++) {
        const whale_lora_run *r = &rw->runs[i];
        if (r->ad != ad) {
            ad = r->ad;
            t = whale_lora_find_in(ad->t, ad->n, p->W);
        }
        if (!t) continue;
        assert(p->M == rw->rows && r->row0 >= 0 && r->row0 + r->n <= p->M && (size_t)r->n * t->rank <= J->cap);
        whale_code e;
        if ((J->n == WHALE_MM_MAX_PARTS || J->used + (size_t)r->n * t->rank > J->cap) && (e = jobs_flush(s, K, J, err)))
            return e;
        J->job[J->n++] = (lora_job){t, p, r->row0, r->n, (int64_t)(p->W - t->start) / t->cols, s->lora_work + J->used};
        J->used += (size_t)r->n * t->rank;
    }
    return WHALE_OK;
}

static lora_jobs jobs_new(const whale_session *s) {
    return (lora_jobs){.cap = (size_t)s->ub->T * s->lora_work_floats};
}

/* One product's bound-adapter terms (a single part). */
static whale_code rows_forward(whale_session *s, int M, int N, int K, const float *X, int lda, const float *W,
                               float *C, int ldc, whale_err *err) {
    const whale_linear_part p = {M, N, X, lda, W, 0, C, ldc};
    lora_jobs J = jobs_new(s);
    whale_code e = jobs_add(s, K, &p, &J, err);
    return e ? e : jobs_flush(s, K, &J, err);
}

/* The adapters' terms of one product whose base product C holds: those
 * of the sequences bound to the rows being run, then an attached adapter. */
static whale_code linear_adapters(whale_session *s, int M, int N, int K, const float *A, int lda, const float *W,
                                  float *C, int ldc, whale_err *err) {
    whale_code e = s->lora_rows.n_runs ? rows_forward(s, M, N, K, A, lda, W, C, ldc, err) : WHALE_OK;
    lora_call lc;
    if (e || !lora_begin(s, W, M, K, &lc)) return e;
    /* C += s · (drop(A)·Aᵀ) · B[rows]ᵀ */
    const whale_lora_target *t = lc.t;
    if ((e = lora_input(s, &lc, M, K, A, lda, err))) return e;
    for (size_t i = 0; i < (size_t)M * t->rank; i++) lc.xa[i] *= t->scale;
    return f32_nt(s, M, N, t->rank, lc.xa, t->rank, t->B + lc.row0 * t->rank, t->rank, C, ldc, 1, err);
}

whale_code whale_linear(whale_session *s, int M, int N, int K, const float *A, int lda, const float *W, int ldw,
                        float *C, int ldc, whale_err *err) {
    whale_wref w = whale_model_wref(s->model, W, ldw);
    whale_code e = s->be->matmul_nt(s->be, M, N, K, A, lda, w, C, ldc, 0, err);
    if (!e && w.format == WHALE_F16) round_rows_f16(C, M, N, ldc);
    return e ? e : linear_adapters(s, M, N, K, A, lda, W, C, ldc, err);
}

/* One part on its rows (the micro-batch's, or rows gathered from it): the
 * whole product (whale_linear), or only its adapters' terms after the
 * base product ran with the others. */
static whale_code part_alone(whale_session *s, int K, const whale_linear_part *p, const int32_t *rows, int base,
                             whale_err *err) {
    if (rows) whale_lora_rows_gather(s, p->M, rows);
    whale_code e = base ? whale_linear(s, p->M, p->N, K, p->A, p->lda, p->W, p->ldw, p->C, p->ldc, err)
                        : linear_adapters(s, p->M, p->N, K, p->A, p->lda, p->W, p->C, p->ldc, err);
    if (rows) whale_lora_rows_reset(s);
    return e;
}

whale_code whale_linear_parts_rows(whale_session *s, int K, int n, const whale_linear_part *parts,
                                   const int32_t *const *rows, whale_err *err) {
    const whale_model *m = s->model;
    whale_mm_part np[WHALE_MM_MAX_PARTS] = {{0}};
    whale_dtype dt = WHALE_F32;
    int joint = n <= WHALE_MM_MAX_PARTS;
    for (int i = 0; i < n && joint; i++) {
        const whale_linear_part *p = &parts[i];
        whale_wref w = whale_model_wref(m, p->W, p->ldw);
        if (!i) dt = w.format;
        joint = w.format == dt;
        np[i] = (whale_mm_part){p->M, p->N, p->A, p->lda, w.data, p->ldw, w.scale, p->C, p->ldc, w.row0};
    }
    whale_code e = WHALE_OK;
    if (!joint) {
        for (int i = 0; i < n && !e; i++) e = part_alone(s, K, &parts[i], rows ? rows[i] : NULL, 1, err);
        return e;
    }
    if ((e = s->be->matmul_nt_parts(s->be, dt, K, n, np, 0, err))) return e;
    if (dt == WHALE_F16)
        for (int i = 0; i < n; i++) round_rows_f16(parts[i].C, parts[i].M, parts[i].N, parts[i].ldc);
    /* then the adapters' terms: attached ones part after part (the sums of
     * whale_linear); bound ones gathered over all parts */
    for (int i = 0; i < n && !e && m->n_lora; i++) e = part_alone(s, K, &parts[i], rows ? rows[i] : NULL, 0, err);
    if (e || m->n_lora || !s->lora_rows.n_runs) return e;
    lora_jobs J = jobs_new(s);
    for (int i = 0; i < n && !e; i++) {
        const int32_t *r = rows ? rows[i] : NULL;
        if (r) whale_lora_rows_gather(s, parts[i].M, r);
        e = jobs_add(s, K, &parts[i], &J, err);
        if (r) whale_lora_rows_reset(s);
    }
    return e ? e : jobs_flush(s, K, &J, err);
}

whale_code whale_linear_parts(whale_session *s, int K, int n, const whale_linear_part *parts, whale_err *err) {
    return whale_linear_parts_rows(s, K, n, parts, NULL, err);
}

whale_code whale_linear_dx(whale_session *s, int M, int N, int K, const float *dC, int lddc, const float *W, int ldw,
                           float *dA, int ldda, int accumulate, whale_err *err) {
    /* int8: dC·(diag(scale)·q), dC's columns scaled in fp32, rounded to bf16, times q in bf16 */
    whale_wref w = whale_model_wref(s->model, W, ldw);
    whale_code e = s->be->matmul_nn(s->be, M, K, N, dC, lddc, w, dA, ldda, accumulate, err);
    if (!e && w.format == WHALE_F16) round_rows_f16(dA, M, K, ldda);
    lora_call lc;
    if (e || !lora_begin(s, W, M, K, &lc)) return e;
    /* dA += drop'(s · (dC·B[rows]) · A) */
    const whale_lora_target *t = lc.t;
    int r = t->rank;
    if ((e = f32_nn(s, M, r, N, dC, lddc, t->B + lc.row0 * r, r, lc.u, r, 0, err))) return e;
    for (size_t i = 0; i < (size_t)M * r; i++) lc.u[i] *= t->scale;
    if (!lc.xd) return f32_nn(s, M, K, r, lc.u, r, t->A, (int)t->cols, dA, ldda, 1, err);
    if ((e = f32_nn(s, M, K, r, lc.u, r, t->A, (int)t->cols, lc.xd, K, 0, err))) return e;
    WHALE_FOR_IF((long)M * K > 65536, (int i = 0; i < M; i++), {
        for (int k = 0; k < K; k++) {
            uint64_t el = (uint64_t)i * (uint64_t)K + (uint64_t)k;
            if (lora_keep(lc.key, el, lc.threshold)) dA[(size_t)i * ldda + k] += lc.xd[el] * lc.keep_scale;
        }
    });
    return WHALE_OK;
}

whale_code whale_linear_dw(whale_session *s, int M, int N, int K, const float *dC, int lddc, const float *A, int lda,
                           const float *W, float *dW, int lddw, whale_err *err) {
    const whale_model *m = s->model;
    whale_code e = WHALE_OK;
    if (dW) {
        if (!whale_format_of(m->compute_dtype)->trainable) /* an int8 base is frozen (LoRA): no gradient */
            return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                              "int8 weights cannot be trained: attach LoRA adapters to an int8 base");
        e = s->be->matmul_tn(s->be, m->compute_dtype, N, K, M, dC, lddc, A, lda, dW, lddw, 1, err);
    }
    lora_call lc;
    if (e || !lora_begin(s, W, M, K, &lc)) return e;
    /* gB[rows] += s · dCᵀ · (drop(x)·Aᵀ);  gA += s · (dC·B[rows])ᵀ · drop(x) */
    const whale_lora_target *t = lc.t;
    int r = t->rank;
    float *gA = whale_session_grad(s, t->a), *gB = whale_session_grad(s, t->b);
    if (!gA || !gB) return WHALE_OK; /* not a training session */
    if ((e = lora_input(s, &lc, M, K, A, lda, err))) return e;
    const float *X = lc.xd ? lc.xd : A;
    int ldx = lc.xd ? K : lda;
    for (size_t i = 0; i < (size_t)M * r; i++) lc.xa[i] *= t->scale;
    if ((e = f32_tn(s, N, r, M, dC, lddc, lc.xa, r, gB + lc.row0 * r, r, err))) return e;
    if ((e = f32_nn(s, M, r, N, dC, lddc, t->B + lc.row0 * r, r, lc.u, r, 0, err))) return e;
    for (size_t i = 0; i < (size_t)M * r; i++) lc.u[i] *= t->scale;
    return f32_tn(s, r, K, M, lc.u, r, X, ldx, gA, (int)t->cols, err);
}
