/* whale export: a checkpoint written tensor by tensor, in another dtype or
 * with a LoRA checkpoint merged in, holding one tensor at a time. */
#include "whale_lora.h"

#include "core/core.h"
#include "whale_safetensors.h"
#include "kernels/convert.h"
#include "models/model.h" /* whale_config_set_dtype */
#include "io/gguf.h" /* whale_q8_0_quantize */
#include "train/export.h"
#include "train/lora_files.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int is_float(whale_dtype d) { return d == WHALE_F32 || d == WHALE_BF16 || d == WHALE_F16; }

void export_close(exporter *x) {
    whale_st_close(x->base);
    whale_st_close(x->ad);
    free(x->targets);
    free(x->t);
    free(x->buf);
}

/* "<stem>.weight" → the adapter entry "base_model.model.<stem>.lora_<AB>.weight". */
static const whale_st_entry *adapter_of(const whale_st *ad, const char *name, char ab) {
    size_t n = strlen(name);
    if (n < 8 || strcmp(name + n - 7, ".weight")) return NULL;
    char key[1200];
    if (snprintf(key, sizeof key, WHALE_PEFT_PREFIX "%.*s.lora_%c.weight", (int)(n - 7), name, ab) >= (int)sizeof key)
        return NULL;
    return whale_st_find(ad, key);
}

/* Every adapter tensor must belong to a base tensor: a pair that names a
 * module the base lacks would otherwise be dropped silently. */
static whale_code check_unmatched(const exporter *x, int matched, whale_err *err) {
    if (2 * matched == whale_st_count(x->ad)) return WHALE_OK;
    for (int i = 0; i < whale_st_count(x->ad); i++) {
        const char *nm = whale_st_at(x->ad, i)->name;
        size_t pl = strlen(WHALE_PEFT_PREFIX), n = strlen(nm);
        char stem[1200];
        if (strncmp(nm, WHALE_PEFT_PREFIX, pl) || n < pl + 14) continue;
        snprintf(stem, sizeof stem, "%.*s.weight", (int)(n - pl - 14), nm + pl);
        if (!whale_st_find(x->base, stem))
            return whale_errf(err, WHALE_ERR_FORMAT, "%s/adapter_model.safetensors: %s adapts %s, which %s does not have",
                              x->o->adapters, nm, stem, x->o->base);
    }
    return whale_errf(err, WHALE_ERR_FORMAT, "%s/adapter_model.safetensors: %d tensors are not lora_A / lora_B pairs "
                      "of %s's tensors", x->o->adapters, whale_st_count(x->ad) - 2 * matched, x->o->base);
}

/* The adapters of tensor t, checked against its shape. */
static whale_code match_adapters(exporter *x, ex_tensor *t, whale_err *err) {
    const whale_st_entry *e = t->e;
    t->a = adapter_of(x->ad, e->name, 'A');
    t->b = adapter_of(x->ad, e->name, 'B');
    if (!t->a && !t->b) return WHALE_OK;
    const char *path = x->o->adapters;
    if (!t->a || !t->b)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s/adapter_model.safetensors: %s has lora_%c but not lora_%c", path,
                          e->name, t->a ? 'A' : 'B', t->a ? 'B' : 'A');
    int r = x->cfg.rank;
    if (e->ndim != 2 || !is_float(e->dtype))
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: %s is a %d-D %s tensor: LoRA merges into 2-D float weights",
                          x->o->base, e->name, e->ndim, whale_dtype_name(e->dtype));
    if (!is_float(t->a->dtype) || !is_float(t->b->dtype) || t->a->shape[1] != e->shape[1] || t->b->shape[0] != e->shape[0])
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s/adapter_model.safetensors: the adapters of %s are [%d, %lld] and [%lld, %d] (%s, %s), "
                          "the weight [%lld, %lld]", path, e->name, r, (long long)t->a->shape[1],
                          (long long)t->b->shape[0], r, whale_dtype_name(t->a->dtype), whale_dtype_name(t->b->dtype),
                          (long long)e->shape[0], (long long)e->shape[1]);
    return WHALE_OK;
}

whale_code export_open(const whale_export_opts *o, exporter *x, whale_err *err) {
    memset(x, 0, sizeof *x);
    x->o = o;
    x->nthreads = omp_get_max_threads();
    if (o->convert && !is_float(o->dtype))
        return whale_errf(err, WHALE_ERR_ARG, "export: the dtype must be fp32, bf16 or fp16, got %s",
                          whale_dtype_name(o->dtype));
    whale_code c = whale_st_open_dir(o->base, &x->base, err);
    if (!c && o->adapters && !(c = whale_lora_read_config(o->adapters, &x->cfg, &x->targets, err))) {
        x->scale = whale_lora_scale(&x->cfg);
        c = whale_lora_open_tensors(o->adapters, x->cfg.rank, &x->ad, err);
    }
    if (c) return c;
    x->n = whale_st_count(x->base);
    if (!(x->t = calloc((size_t)(x->n ? x->n : 1), sizeof *x->t)))
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", o->base);
    int matched = 0;
    for (int i = 0; i < x->n; i++) {
        ex_tensor *t = &x->t[i];
        t->e = whale_st_at(x->base, i);
        if (x->ad && (c = match_adapters(x, t, err))) return c;
        matched += t->a != NULL;
        t->out = o->convert && is_float(t->e->dtype) ? o->dtype : t->e->dtype;
        t->out_bytes = t->e->nbytes / whale_dtype_size(t->e->dtype) * whale_dtype_size(t->out);
        t->buffered = t->a || t->out != t->e->dtype;
    }
    return x->ad ? check_unmatched(x, matched, err) : WHALE_OK;
}

/* Bytes resident while tensor t is written: its mapped pages, the output
 * buffer, the adapters in fp32 and each thread's row scratch. */
static size_t tensor_bytes(const exporter *x, const ex_tensor *t) {
    size_t b = t->e->nbytes + (t->buffered ? t->out_bytes : 0);
    if (t->a) {
        size_t rows = (size_t)t->e->shape[0], cols = (size_t)t->e->shape[1], r = (size_t)x->cfg.rank;
        b += t->a->nbytes + t->b->nbytes + 4 * r * (rows + cols) + (size_t)x->nthreads * cols * 12;
    }
    return b;
}

void export_plan(const exporter *x, whale_export_stats *st) {
    memset(st, 0, sizeof *st);
    size_t peak = 0, most = 0;
    for (int i = 0; i < x->n; i++) {
        const ex_tensor *t = &x->t[i];
        size_t b = tensor_bytes(x, t);
        if (b > peak) peak = b;
        if (t->e->nbytes > st->largest) st->largest = t->e->nbytes;
        if (is_float(t->out) && t->out_bytes > most) most = t->out_bytes, st->dtype = t->out;
        st->tensors++;
        st->merged += t->a != NULL;
    }
    st->planned = peak + EXPORT_RUNTIME_BYTES;
}

/* Row o (cols values) of a float tensor as fp32; exact. */
static void row_f32(const whale_st_entry *e, int64_t o, int64_t cols, float *dst) {
    const char *src = (const char *)e->data + (size_t)o * (size_t)cols * whale_dtype_size(e->dtype);
    if (e->dtype == WHALE_F32) memcpy(dst, src, (size_t)cols * sizeof(float));
    else if (e->dtype == WHALE_BF16) whale_bf16_to_f32(dst, src, (size_t)cols);
    else whale_f16_to_f32(dst, src, (size_t)cols);
}

/* fp32 values rounded once into dst's dtype; returns how many finite values
 * became fp16 infinity. */
static int64_t store_row(void *dst, whale_dtype out, const float *row, int64_t n) {
    int64_t over = 0;
    if (out == WHALE_F32) {
        memcpy(dst, row, (size_t)n * sizeof(float));
        return 0;
    }
    uint16_t *d = dst;
    for (int64_t k = 0; k < n; k++) {
        d[k] = out == WHALE_BF16 ? whale_float_to_bf16(row[k]) : whale_float_to_f16(row[k]);
        if (out == WHALE_F16 && isfinite(row[k]) && (d[k] & 0x7fff) == 0x7c00) over++;
    }
    return over;
}

/* Row o of W + s·B·A: ΔW[o, :] = s · Σ_k B[o, k] · A[k, :] summed in double
 * (k in order), added to the fp32 weight once: the in-memory merge's
 * arithmetic (whale_lora_merge), so the two agree bit for bit. */
static void add_delta(float *w, double *acc, const float *A, const float *B, int r, int64_t o, int64_t cols, double s) {
    for (int64_t c = 0; c < cols; c++) acc[c] = 0;
    for (int k = 0; k < r; k++) {
        const double bk = B[o * r + k];
        const float *ak = A + (int64_t)k * cols;
        for (int64_t c = 0; c < cols; c++) acc[c] += bk * ak[c];
    }
    for (int64_t c = 0; c < cols; c++) w[c] = (float)((double)w[c] + s * acc[c]);
}

static void entry_f32(float *dst, const whale_st_entry *e) {
    size_t n = e->nbytes / whale_dtype_size(e->dtype);
    if (e->dtype == WHALE_F32) memcpy(dst, e->data, e->nbytes);
    else if (e->dtype == WHALE_BF16) whale_bf16_to_f32(dst, e->data, n);
    else whale_f16_to_f32(dst, e->data, n);
}

/* Output row o's source row: itself, or, for a tensor whose rows are
 * perm_heads heads of Dh rows in Hugging Face's half-split RoPE order, the
 * row that llama.cpp's interleaved order puts there (row 2j + s of a head
 * is row s·Dh/2 + j: convert_hf_to_gguf.py's permute for Llama's q and k). */
static int64_t source_row(const ex_tensor *t, int64_t rows, int64_t o) {
    if (!t->perm_heads) return o;
    int64_t dh = rows / t->perm_heads, h = o / dh, i = o % dh;
    return h * dh + (i % 2) * (dh / 2) + i / 2;
}

whale_code export_fill(exporter *x, const ex_tensor *t, void *buf, whale_err *err) {
    const whale_st_entry *e = t->e;
    int64_t numel = (int64_t)(e->nbytes / whale_dtype_size(e->dtype));
    int64_t cols = e->ndim && !(t->perm_heads && e->ndim == 1) ? e->shape[e->ndim - 1] : 1, rows = numel / cols;
    assert(!t->perm_heads || rows % (2 * t->perm_heads) == 0);
    assert(!t->q8 || cols % WHALE_Q8_0_BLOCK == 0);
    int r = t->a ? x->cfg.rank : 0;
    float *A = t->a ? malloc(t->a->nbytes / whale_dtype_size(t->a->dtype) * sizeof(float)) : NULL;
    float *B = t->a ? malloc(t->b->nbytes / whale_dtype_size(t->b->dtype) * sizeof(float)) : NULL;
    float *rowbuf = malloc((size_t)x->nthreads * (size_t)cols * sizeof(float));
    double *acc = t->a ? malloc((size_t)x->nthreads * (size_t)cols * sizeof(double)) : NULL;
    whale_code c = WHALE_OK;
    if (!rowbuf || (t->a && (!A || !B || !acc))) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory merging %s", x->o->base, e->name);
        goto done;
    }
    if (t->a) entry_f32(A, t->a), entry_f32(B, t->b);
    const double s = x->scale;
    const size_t orow = t->q8 ? (size_t)cols / WHALE_Q8_0_BLOCK * WHALE_Q8_0_BYTES
                              : (size_t)cols * whale_dtype_size(t->out);
    int64_t over = 0;
#pragma omp parallel for schedule(static) reduction(+ : over) num_threads(x->nthreads)
    for (int64_t o = 0; o < rows; o++) {
        int id = omp_get_thread_num();
        int64_t src = source_row(t, rows, o);
        float *w = rowbuf + (size_t)id * (size_t)cols;
        row_f32(e, src, cols, w);
        if (r) add_delta(w, acc + (size_t)id * (size_t)cols, A, B, r, src, cols, s);
        char *dst = (char *)buf + (size_t)o * orow;
        if (t->q8) whale_q8_0_quantize(dst, w, cols);
        else over += store_row(dst, t->out, w, cols);
    }
    x->overflow += over;
done:
    free(A), free(B), free(rowbuf), free(acc);
    return c;
}

/* whale_st_write_stream's producer: tensor i's output bytes. The previous
 * tensor's buffer and mapped pages are dropped first. */
static const void *produce(void *user, int i, whale_err *err) {
    exporter *x = user;
    const ex_tensor *t = &x->t[i];
    free(x->buf);
    x->buf = NULL;
    whale_st_release_pages(x->base);
    whale_st_release_pages(x->ad);
    if (x->o->progress) x->o->progress(x->o->user, i, x->n);
    if (is_float(t->out)) x->values += (int64_t)(t->out_bytes / whale_dtype_size(t->out));
    if (!t->buffered) return t->e->data;
    if (!(x->buf = malloc(t->out_bytes))) {
        whale_errf(err, WHALE_ERR_NOMEM, "%s: cannot allocate %zu bytes for %s", x->o->out, t->out_bytes, t->e->name);
        return NULL;
    }
    return export_fill(x, t, x->buf, err) ? NULL : x->buf;
}

/* src/name to dst/name (temp + fsync + rename) when src has it. */
static whale_code copy_if_present(const char *src, const char *dst, const char *name, whale_err *err) {
    char from[4200], to[4200], *data;
    size_t n;
    snprintf(from, sizeof from, "%s/%s", src, name);
    snprintf(to, sizeof to, "%s/%s", dst, name);
    if (access(from, R_OK) != 0) return WHALE_OK;
    whale_code c = whale_read_file(from, &data, &n, err);
    if (c) return c;
    c = whale_write_file_atomic(to, data, n, err);
    free(data);
    return c;
}

/* config.json (its dtype field set when converting), the generation
 * defaults and the tokenizer files. */
static whale_code write_side_files(const whale_export_opts *o, whale_dtype dt, whale_err *err) {
    static const char *const files[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                        "chat_template.jinja", "vocab.json", "merges.txt", "special_tokens_map.json",
                                        "added_tokens.json"};
    char path[4200];
    whale_code c = WHALE_OK;
    if (!o->convert) c = copy_if_present(o->base, o->out, "config.json", err);
    else {
        cJSON *cfg;
        snprintf(path, sizeof path, "%s/config.json", o->base);
        if ((c = whale_read_json_object(path, &cfg, err))) return c;
        whale_config_set_dtype(cfg, dt);
        char *text = cJSON_Print(cfg);
        cJSON_Delete(cfg);
        snprintf(path, sizeof path, "%s/config.json", o->out);
        size_t n = text ? strlen(text) : 0;
        char *nl = text ? realloc(text, n + 2) : NULL;
        if (!nl) {
            free(text);
            return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
        }
        nl[n] = '\n';
        c = whale_write_file_atomic(path, nl, n + 1, err);
        free(nl);
    }
    for (size_t i = 0; !c && i < sizeof files / sizeof files[0]; i++) c = copy_if_present(o->base, o->out, files[i], err);
    return c;
}

double export_memory_limit(const whale_export_opts *o) {
    if (o->memory_limit) return o->memory_limit > 0 ? o->memory_limit : 0;
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0;
}

whale_code whale_export_plan(const whale_export_opts *o, whale_export_stats *st, whale_err *err) {
    if (o->format == WHALE_EXPORT_GGUF) return whale_export_gguf_plan(o, st, err);
    exporter x;
    whale_code c = export_open(o, &x, err);
    if (!c) export_plan(&x, st);
    export_close(&x);
    return c;
}

/* The output folder must not be the base's or the adapters' (they are
 * read while it is written). */
static whale_code check_out_dir(const whale_export_opts *o, whale_err *err) {
    char out[4096], other[4096];
    whale_code c = whale_mkdir(o->out, err);
    if (c) return c;
    if (!realpath(o->out, out)) return whale_errf(err, WHALE_ERR_IO, "%s: cannot resolve the output folder", o->out);
    const char *dirs[2] = {o->base, o->adapters};
    for (int i = 0; i < 2; i++)
        if (dirs[i] && realpath(dirs[i], other) && !strcmp(out, other))
            return whale_errf(err, WHALE_ERR_ARG, "%s: the output folder is the %s folder; choose another --out", o->out,
                              i ? "adapters'" : "base's");
    return WHALE_OK;
}

whale_code whale_export_checkpoint(const whale_export_opts *o, whale_export_stats *st, whale_err *err) {
    if (o->format == WHALE_EXPORT_GGUF) return whale_export_gguf(o, st, err);
    exporter x;
    whale_st_item *items = NULL;
    whale_code c = export_open(o, &x, err);
    if (c) goto done;
    export_plan(&x, st);
    double limit = export_memory_limit(o);
    if (limit > 0 && (double)st->planned > limit) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: exporting needs an estimated %.2f GiB (the largest tensor %.2f GiB "
                       "read and written) but %s is %.2f GiB", o->base, st->planned / 1073741824.0,
                       st->largest / 1073741824.0, o->memory_limit > 0 ? "the memory limit" : "the machine's memory",
                       limit / 1073741824.0);
        goto done;
    }
    if ((c = check_out_dir(o, err))) goto done;
    if (!(items = calloc((size_t)(x.n ? x.n : 1), sizeof *items))) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", o->out);
        goto done;
    }
    for (int i = 0; i < x.n; i++)
        items[i] = (whale_st_item){x.t[i].e->name, x.t[i].out, x.t[i].e->ndim, x.t[i].e->shape, NULL};
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", o->out);
    if ((c = whale_st_write_stream(path, items, x.n, NULL, produce, &x, err))) goto done;
    if (o->progress) o->progress(o->user, x.n, x.n);
    st->values = x.values;
    st->overflow = x.overflow;
    c = write_side_files(o, o->dtype, err);
done:
    free(items);
    export_close(&x);
    return c;
}
