/* GGUF version 3 writer (gguf.h). */
#include "io/gguf.h"

#include "core/core.h"
#include "kernels/convert.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *name;
    whale_gguf_type type;
    int ndim;
    int64_t ne[4];
    uint64_t offset, nbytes;
} gguf_tensor;

struct whale_gguf {
    unsigned char *kv; /* the key/values as written */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    uint64_t arr_left; /* elements the open array still expects */
    gguf_tensor *t;
    int n_t, cap_t;
    uint64_t data_bytes; /* the data area, padded */
    int nomem;
};

/* ------------------------------------------------------------ q8_0 */

void whale_q8_0_quantize(void *dst, const float *src, int64_t n) {
    assert(n % WHALE_Q8_0_BLOCK == 0);
    unsigned char *out = dst;
    for (int64_t b = 0; b < n / WHALE_Q8_0_BLOCK; b++, src += WHALE_Q8_0_BLOCK, out += WHALE_Q8_0_BYTES) {
        float amax = 0;
        for (int j = 0; j < WHALE_Q8_0_BLOCK; j++) amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t h = whale_float_to_f16(d);
        memcpy(out, &h, 2);
        for (int j = 0; j < WHALE_Q8_0_BLOCK; j++) out[2 + j] = (unsigned char)(int8_t)roundf(src[j] * id);
    }
}

void whale_q8_0_dequantize(float *dst, const void *src, int64_t n) {
    assert(n % WHALE_Q8_0_BLOCK == 0);
    const unsigned char *in = src;
    for (int64_t b = 0; b < n / WHALE_Q8_0_BLOCK; b++, in += WHALE_Q8_0_BYTES, dst += WHALE_Q8_0_BLOCK) {
        float d;
        whale_f16_to_f32(&d, in, 1);
        for (int j = 0; j < WHALE_Q8_0_BLOCK; j++) dst[j] = (float)(int8_t)in[2 + j] * d;
    }
}

size_t whale_gguf_nbytes(whale_gguf_type t, int ndim, const int64_t *ne) {
    size_t rows = 1;
    for (int i = 1; i < ndim; i++) rows *= (size_t)ne[i];
    size_t n0 = ndim ? (size_t)ne[0] : 1;
    size_t row = t == GGUF_TYPE_F32                             ? 4 * n0
                 : t == GGUF_TYPE_F16 || t == GGUF_TYPE_BF16 ? 2 * n0
                                                              : n0 / WHALE_Q8_0_BLOCK * WHALE_Q8_0_BYTES;
    return row * rows;
}

const char *whale_gguf_type_name(whale_gguf_type t) {
    switch (t) {
    case GGUF_TYPE_F32: return "F32";
    case GGUF_TYPE_F16: return "F16";
    case GGUF_TYPE_BF16: return "BF16";
    case GGUF_TYPE_Q8_0: return "Q8_0";
    }
    return "?";
}

/* ------------------------------------------------------------ key/values */

whale_gguf *whale_gguf_new(void) { return calloc(1, sizeof(whale_gguf)); }

void whale_gguf_free(whale_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_t; i++) free(g->t[i].name);
    free(g->t);
    free(g->kv);
    free(g);
}

static void put(whale_gguf *g, const void *p, size_t n) {
    if (g->nomem) return;
    if (g->kv_len + n > g->kv_cap) {
        size_t cap = g->kv_cap ? g->kv_cap : 4096;
        while (cap < g->kv_len + n) cap *= 2;
        unsigned char *nb = realloc(g->kv, cap);
        if (!nb) {
            g->nomem = 1;
            return;
        }
        g->kv = nb, g->kv_cap = cap;
    }
    memcpy(g->kv + g->kv_len, p, n);
    g->kv_len += n;
}

/* Little-endian on every target this builds for (x86-64): values as in memory. */
static void put_u32(whale_gguf *g, uint32_t v) { put(g, &v, 4); }
static void put_u64(whale_gguf *g, uint64_t v) { put(g, &v, 8); }
static void put_string(whale_gguf *g, const char *s, size_t n) {
    put_u64(g, n);
    put(g, s, n);
}

static void key(whale_gguf *g, const char *k, uint32_t vtype) {
    assert(g->arr_left == 0); /* the open array was filled */
    put_string(g, k, strlen(k));
    put_u32(g, vtype);
    g->n_kv++;
}

void whale_gguf_u32(whale_gguf *g, const char *k, uint32_t v) { key(g, k, GGUF_V_UINT32), put_u32(g, v); }
void whale_gguf_i32(whale_gguf *g, const char *k, int32_t v) { key(g, k, GGUF_V_INT32), put(g, &v, 4); }
void whale_gguf_f32(whale_gguf *g, const char *k, float v) { key(g, k, GGUF_V_FLOAT32), put(g, &v, 4); }
void whale_gguf_bool(whale_gguf *g, const char *k, int v) {
    unsigned char b = v != 0;
    key(g, k, GGUF_V_BOOL), put(g, &b, 1);
}
void whale_gguf_str(whale_gguf *g, const char *k, const char *v) { key(g, k, GGUF_V_STRING), put_string(g, v, strlen(v)); }

void whale_gguf_array(whale_gguf *g, const char *k, int vtype, uint64_t n) {
    key(g, k, GGUF_V_ARRAY);
    put_u32(g, (uint32_t)vtype);
    put_u64(g, n);
    g->arr_left = n;
}

void whale_gguf_elem_str(whale_gguf *g, const char *s, size_t len) {
    assert(g->arr_left > 0);
    g->arr_left--;
    put_string(g, s, len);
}

void whale_gguf_elem_i32(whale_gguf *g, int32_t v) {
    assert(g->arr_left > 0);
    g->arr_left--;
    put(g, &v, 4);
}

/* ------------------------------------------------------------ tensors */

static uint64_t pad(uint64_t n) { return (n + WHALE_GGUF_ALIGNMENT - 1) / WHALE_GGUF_ALIGNMENT * WHALE_GGUF_ALIGNMENT; }

void whale_gguf_tensor(whale_gguf *g, const char *name, whale_gguf_type type, int ndim, const int64_t *ne) {
    assert(ndim >= 1 && ndim <= 4 && (type != GGUF_TYPE_Q8_0 || ne[0] % WHALE_Q8_0_BLOCK == 0));
    if (g->nomem) return;
    if (g->n_t == g->cap_t) {
        int cap = g->cap_t ? 2 * g->cap_t : 64;
        gguf_tensor *nt = realloc(g->t, (size_t)cap * sizeof *nt);
        if (!nt) {
            g->nomem = 1;
            return;
        }
        g->t = nt, g->cap_t = cap;
    }
    gguf_tensor *t = &g->t[g->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) {
        g->nomem = 1;
        return;
    }
    t->type = type;
    t->ndim = ndim;
    memcpy(t->ne, ne, (size_t)ndim * sizeof *ne);
    t->nbytes = whale_gguf_nbytes(type, ndim, ne);
    t->offset = g->data_bytes;
    g->data_bytes += pad(t->nbytes);
    g->n_t++;
}

int whale_gguf_tensor_count(const whale_gguf *g) { return g->n_t; }

/* Everything before the data area: header, key/values, tensor infos. */
static uint64_t head_bytes(const whale_gguf *g) {
    uint64_t n = 4 + 4 + 8 + 8 + g->kv_len;
    for (int i = 0; i < g->n_t; i++) n += 8 + strlen(g->t[i].name) + 4 + 8 * (uint64_t)g->t[i].ndim + 4 + 8;
    return n;
}

uint64_t whale_gguf_file_bytes(const whale_gguf *g) { return pad(head_bytes(g)) + g->data_bytes; }

/* ------------------------------------------------------------ writing */

static whale_code write_all(int fd, const void *p, size_t n, const char *path, whale_err *err) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return whale_errf(err, WHALE_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        c += w, n -= (size_t)w;
    }
    return WHALE_OK;
}

static whale_code write_zeros(int fd, size_t n, const char *path, whale_err *err) {
    static const unsigned char zeros[WHALE_GGUF_ALIGNMENT];
    assert(n < sizeof zeros);
    return write_all(fd, zeros, n, path, err);
}

/* The header, key/values and tensor infos, padded to the data area. */
static whale_code write_head(const whale_gguf *g, int fd, const char *path, whale_err *err) {
    whale_gguf h = {0}; /* a scratch buffer for the fixed part and the infos */
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)g->n_t);
    put_u64(&h, g->n_kv);
    put(&h, g->kv, g->kv_len);
    for (int i = 0; i < g->n_t; i++) {
        const gguf_tensor *t = &g->t[i];
        put_string(&h, t->name, strlen(t->name));
        put_u32(&h, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) put_u64(&h, (uint64_t)t->ne[d]);
        put_u32(&h, (uint32_t)t->type);
        put_u64(&h, t->offset);
    }
    whale_code c = h.nomem ? whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory for the header", path)
                           : write_all(fd, h.kv, h.kv_len, path, err);
    if (!c) c = write_zeros(fd, (size_t)(pad(h.kv_len) - h.kv_len), path, err);
    free(h.kv);
    return c;
}

whale_code whale_gguf_write(whale_gguf *g, const char *path, whale_gguf_producer produce, void *user, whale_err *err) {
    assert(g->arr_left == 0);
    if (g->nomem) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory building the GGUF metadata", path);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, plen + 5, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    whale_code c = fd < 0 ? whale_errf(err, WHALE_ERR_IO, "%s: cannot create: %s", path, strerror(errno)) : WHALE_OK;
    if (!c) c = write_head(g, fd, path, err);
    for (int i = 0; !c && i < g->n_t; i++) {
        whale_err perr = {0};
        const void *data = produce(user, i, &perr);
        if (!data) {
            c = whale_errf(err, perr.code ? perr.code : WHALE_ERR_INTERNAL, "%s",
                           perr.code ? perr.msg : "GGUF: a tensor producer returned no data");
            break;
        }
        c = write_all(fd, data, (size_t)g->t[i].nbytes, path, err);
        if (!c) c = write_zeros(fd, (size_t)(pad(g->t[i].nbytes) - g->t[i].nbytes), path, err);
    }
    if (!c && fsync(fd) != 0) c = whale_errf(err, WHALE_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !c) c = whale_errf(err, WHALE_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    if (!c && rename(tmp, path) != 0) c = whale_errf(err, WHALE_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
    if (c && fd >= 0) unlink(tmp);
    free(tmp);
    return c;
}
