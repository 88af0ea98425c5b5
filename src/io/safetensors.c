/* safetensors reader (mmap, strict validation) and streaming writer. */
#define _POSIX_C_SOURCE 200809L
#include "whale_safetensors.h"

#include "core/core.h"
#include "core/sbuf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Largest integer a double (and so cJSON) holds exactly. */
#define EXACT_INT_MAX 9007199254740992.0
/* Data is written in pieces this size so no single write() is huge. */
#define WRITE_CHUNK ((size_t)1 << 20)

/* ------------------------------------------------------------ small helpers */

/* Open-addressing hash map from borrowed strings to non-negative ints. It is
 * sized once for the number of keys it will hold, so it never grows. */
typedef struct {
    const char **keys; /* NULL marks an empty slot */
    int *vals;
    size_t mask;
} strmap;

static uint64_t hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static int strmap_init(strmap *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2; /* load factor at most 1/2 */
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = malloc(cap * sizeof *m->vals);
    m->mask = cap - 1;
    if (!m->keys || !m->vals) {
        free(m->keys);
        free(m->vals);
        m->keys = NULL;
        m->vals = NULL;
        return 0;
    }
    return 1;
}

static void strmap_free(strmap *m) {
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
}

static size_t strmap_slot(const strmap *m, const char *key) {
    size_t i = (size_t)hash_str(key) & m->mask;
    while (m->keys[i] && strcmp(m->keys[i], key) != 0) i = (i + 1) & m->mask;
    return i;
}

/* Value for key, or -1. */
static int strmap_get(const strmap *m, const char *key) {
    if (!m->keys) return -1;
    size_t i = strmap_slot(m, key);
    return m->keys[i] ? m->vals[i] : -1;
}

/* Insert key -> val and return -1, or return the existing value if the key
 * is already present (the map is left unchanged). */
static int strmap_put(strmap *m, const char *key, int val) {
    size_t i = strmap_slot(m, key);
    if (m->keys[i]) return m->vals[i];
    m->keys[i] = key;
    m->vals[i] = val;
    return -1;
}

/* Offset of the first byte that is not well-formed UTF-8 (overlong forms,
 * surrogates and code points above U+10FFFF are rejected), or len. With
 * json_text, control bytes other than tab, LF and CR are rejected too: they
 * cannot appear raw anywhere in JSON, and refusing them also keeps NUL bytes
 * away from cJSON's C strings. */
static size_t utf8_bad_offset(const unsigned char *s, size_t len, int json_text) {
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            if (json_text && c < 0x20 && c != '\t' && c != '\n' && c != '\r') return i;
            i++;
            continue;
        }
        int more;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
            else if (c == 0xED) hi = 0x9F; /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
        } else
            return i;
        if (len - i <= (size_t)more) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (int k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += (size_t)more + 1;
    }
    return len;
}

static int is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A JSON number that is an exact integer in [0, 2^53]. cJSON's valueint
 * saturates at INT_MAX, so offsets are read from valuedouble. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= EXACT_INT_MAX)) return 0;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return 0;
    *out = u;
    return 1;
}

/* Copy a name for an error message: control characters become '?' and long
 * names are shortened, so the message stays one readable line. */
static const char *shown(const char *s, char *buf, size_t cap) {
    size_t n = 0;
    for (; *s && n + 4 < cap; s++) buf[n++] = (unsigned char)*s < 0x20 ? '?' : *s;
    if (*s) memcpy(buf + n, "...", 3), n += 3;
    buf[n] = 0;
    return buf;
}

#define SHOWN(s) shown((s), (char[96]){0}, 96)

static void format_shape(char *buf, size_t cap, int ndim, const uint64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ------------------------------------------------------------ the tensor set */

typedef struct {
    char *path;
    void *base;
    size_t size;
} st_file;

typedef struct {
    char *key, *value;
} st_meta;

struct whale_st {
    whale_st_entry *entries; /* names are owned (malloc'd) */
    int n;
    st_file *files;
    int nfiles;
    st_meta *meta;
    int nmeta;
    strmap by_name; /* entry name -> index */
};

int whale_st_count(const whale_st *st) { return st ? st->n : 0; }

const whale_st_entry *whale_st_at(const whale_st *st, int i) {
    return st && i >= 0 && i < st->n ? &st->entries[i] : NULL;
}

const whale_st_entry *whale_st_find(const whale_st *st, const char *name) {
    if (!st || !name) return NULL;
    int i = strmap_get(&st->by_name, name);
    return i >= 0 ? &st->entries[i] : NULL;
}

const char *whale_st_metadata(const whale_st *st, const char *key) {
    if (!st || !key) return NULL;
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

void whale_st_release_pages(whale_st *st) {
    for (int i = 0; st && i < st->nfiles; i++) madvise(st->files[i].base, st->files[i].size, MADV_DONTNEED);
}

int whale_st_holds(const whale_st *st, const void *p) {
    for (int i = 0; st && i < st->nfiles; i++) {
        const char *b = st->files[i].base;
        if ((const char *)p >= b && (const char *)p < b + st->files[i].size) return 1;
    }
    return 0;
}

void whale_st_close(whale_st *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free((char *)st->entries[i].name);
    free(st->entries);
    for (int i = 0; i < st->nfiles; i++) {
        munmap(st->files[i].base, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->files);
    for (int i = 0; i < st->nmeta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->meta);
    strmap_free(&st->by_name);
    free(st);
}

/* ------------------------------------------------------------ header parsing */

/* One tensor while its header is checked; begin/end are data-area offsets
 * and order its position in the header (a tie-break for a stable sort). */
typedef struct {
    whale_st_entry e;
    uint64_t begin, end;
    int order;
} parsed;

static int cmp_parsed(const void *a, const void *b) {
    const parsed *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* Check one header entry {"dtype":..,"shape":[..],"data_offsets":[b,e]}.
 * Unknown fields are ignored, as the reference reader does; a repeated field
 * is an error. p->e.name is set by the caller. */
static whale_code parse_entry(const char *path, const cJSON *c, uint64_t data_len, parsed *p,
                              whale_err *err) {
    const char *name = SHOWN(c->string);
    if (!cJSON_IsObject(c))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: tensor '%s': entry is not an object", path, name);

    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *f = c->child; f; f = f->next) {
        const cJSON **slot = strcmp(f->string, "dtype") == 0          ? &dtype
                             : strcmp(f->string, "shape") == 0        ? &shape
                             : strcmp(f->string, "data_offsets") == 0 ? &offs
                                                                      : NULL;
        if (!slot) continue;
        if (*slot)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: tensor '%s': duplicate field \"%s\"", path,
                              name, f->string);
        *slot = f;
    }

    if (!cJSON_IsString(dtype))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"",
                          path, name);
    if (whale_dtype_from_name(dtype->valuestring, &p->e.dtype) != 0)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported dtype \"%s\"", path,
                          name, SHOWN(dtype->valuestring));

    if (!cJSON_IsArray(shape))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", path,
                          name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > WHALE_MAX_DIMS)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                          "%s: tensor '%s': shape has %d dims, at most %d are supported", path, name,
                          ndim, WHALE_MAX_DIMS);
    uint64_t dims[WHALE_MAX_DIMS];
    int d = 0;
    for (const cJSON *v = shape->child; v; v = v->next, d++)
        if (!json_uint(v, &dims[d]))
            return whale_errf(err, WHALE_ERR_FORMAT,
                              "%s: tensor '%s': \"shape\" element %d is not a non-negative integer "
                              "(at most 2^53)",
                              path, name, d);

    uint64_t se[2];
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(offs->child, &se[0]) ||
        !json_uint(offs->child->next, &se[1]))
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: tensor '%s': \"data_offsets\" must be 2 non-negative integers", path,
                          name);
    if (se[0] > se[1])
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] have begin > end", path, name,
                          (unsigned long long)se[0], (unsigned long long)se[1]);
    if (se[1] > data_len)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] fall outside the %llu-byte data "
                          "area",
                          path, name, (unsigned long long)se[0], (unsigned long long)se[1],
                          (unsigned long long)data_len);

    /* Byte size with overflow checks; like the reference reader, a shape
     * whose product overflows is refused even if a later dimension is 0. */
    char sh[160];
    format_shape(sh, sizeof sh, ndim, dims);
    size_t nbytes = whale_dtype_size(p->e.dtype);
    for (int i = 0; i < ndim; i++)
        if (dims[i] > SIZE_MAX || !whale_mul_size(nbytes, (size_t)dims[i], &nbytes))
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: tensor '%s': byte size of %s %s overflows",
                              path, name, dtype->valuestring, sh);
    if ((uint64_t)nbytes != se[1] - se[0])
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: tensor '%s': size mismatch: data_offsets span %llu bytes but %s %s "
                          "needs %zu",
                          path, name, (unsigned long long)(se[1] - se[0]), dtype->valuestring, sh,
                          nbytes);

    p->e.ndim = ndim;
    for (int i = 0; i < ndim; i++) p->e.shape[i] = (int64_t)dims[i];
    p->e.nbytes = nbytes;
    p->begin = se[0];
    p->end = se[1];
    return WHALE_OK;
}

/* __metadata__ must be an object whose values are all strings. The pairs
 * are appended to *meta / *nmeta (owned by the caller even on failure). */
static whale_code parse_metadata(const char *path, const cJSON *c, st_meta **meta, int *nmeta,
                                 whale_err *err) {
    if (!cJSON_IsObject(c))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: __metadata__ is not an object", path);
    int n = cJSON_GetArraySize(c);
    if (n == 0) return WHALE_OK;
    strmap seen;
    if (!strmap_init(&seen, (size_t)n)) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    whale_code rc = WHALE_OK;
    st_meta *m = realloc(*meta, (size_t)(*nmeta + n) * sizeof *m);
    if (!m) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    *meta = m;
    for (const cJSON *v = c->child; v; v = v->next) {
        if (!cJSON_IsString(v)) {
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: __metadata__ value for '%s' is not a string",
                            path, SHOWN(v->string));
            goto done;
        }
        if (strmap_put(&seen, v->string, 0) >= 0) {
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: __metadata__ has duplicate key '%s'", path,
                            SHOWN(v->string));
            goto done;
        }
        char *k = dup_str(v->string), *val = dup_str(v->valuestring);
        if (!k || !val) {
            free(k);
            free(val);
            rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        m[*nmeta].key = k;
        m[*nmeta].value = val;
        (*nmeta)++;
    }
done:
    strmap_free(&seen);
    return rc;
}

/* The header of file f (already mapped) -> entries appended to st. */
static whale_code parse_header(whale_st *st, const st_file *f, whale_err *err) {
    const char *path = f->path;
    const unsigned char *b = f->base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    /* The number is not shown: for a file that is not safetensors at all
     * (a symlink pointed elsewhere) it is just that file's first 8 bytes. */
    if (hlen > WHALE_ST_MAX_HEADER)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: not a safetensors file (its first 8 bytes are not a header length of at most %u)",
                          path, WHALE_ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                          (unsigned long long)hlen, f->size);
    const char *h = (const char *)b + 8;
    size_t len = (size_t)hlen;
    const unsigned char *data = b + 8 + len;
    uint64_t data_len = f->size - 8 - len;

    size_t bad = utf8_bad_offset((const unsigned char *)h, len, 1);
    if (bad < len)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: header is not valid JSON: %s at byte %zu", path,
                          (unsigned char)h[bad] < 0x20 ? "raw control character" : "invalid UTF-8", bad);

    /* Whitespace around the JSON is allowed (writers pad with it). The rest
     * is copied so cJSON gets a NUL-terminated string and never reads past
     * the header, which may end at the very end of the mapping. */
    size_t lead = 0;
    while (lead < len && is_json_space(h[lead])) lead++;
    while (len > lead && is_json_space(h[len - 1])) len--;
    char *text = malloc(len - lead + 1);
    if (!text) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory for header", path);
    memcpy(text, h + lead, len - lead);
    text[len - lead] = 0;

    whale_code rc = WHALE_OK;
    parsed *p = NULL;
    int np = 0, count = 0;
    st_meta *meta = NULL;
    int nmeta = 0;
    strmap seen = {0};
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: header is not valid JSON (error at byte %zu)", path,
                        (size_t)(end ? end - text : 0) + lead);
        goto done;
    }
    if (!cJSON_IsObject(root) || text[0] != '{') {
        rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }

    count = cJSON_GetArraySize(root);
    if (!strmap_init(&seen, (size_t)count) || (count && !(p = calloc((size_t)count, sizeof *p)))) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory for %d header entries", path, count);
        goto done;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        /* cJSON keeps repeated keys, so duplicates are caught here. */
        if (strmap_put(&seen, c->string, 0) >= 0) {
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: duplicate key '%s' in header", path,
                            SHOWN(c->string));
            goto done;
        }
        if (strcmp(c->string, "__metadata__") == 0) {
            rc = parse_metadata(path, c, &meta, &nmeta, err);
            if (rc) goto done;
            continue;
        }
        parsed *q = &p[np];
        q->order = np;
        rc = parse_entry(path, c, data_len, q, err);
        if (rc) goto done;
        if (!(q->e.name = dup_str(c->string))) {
            rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        q->e.file = f->path;
        q->e.data = data + q->begin;
        np++;
    }

    /* The byte ranges must tile the data area exactly: sorted by offset,
     * each tensor starts where the previous one ended. */
    if (np) qsort(p, (size_t)np, sizeof *p, cmp_parsed);
    uint64_t pos = 0;
    int last = -1;
    for (int i = 0; i < np; i++) {
        if (p[i].begin < pos) {
            char a[96];
            rc = whale_errf(err, WHALE_ERR_FORMAT,
                            "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", path,
                            shown(p[last].e.name, a, sizeof a), (unsigned long long)p[last].begin,
                            (unsigned long long)p[last].end, SHOWN(p[i].e.name),
                            (unsigned long long)p[i].begin, (unsigned long long)p[i].end);
            goto done;
        }
        if (p[i].begin > pos) {
            rc = whale_errf(err, WHALE_ERR_FORMAT,
                            "%s: hole in the data area: bytes [%llu, %llu) before tensor '%s' belong "
                            "to no tensor",
                            path, (unsigned long long)pos, (unsigned long long)p[i].begin,
                            SHOWN(p[i].e.name));
            goto done;
        }
        last = i;
        pos = p[i].end;
    }
    if (pos != data_len) {
        rc = whale_errf(err, WHALE_ERR_FORMAT,
                        "%s: %llu trailing bytes after the last tensor (data area is %llu bytes)", path,
                        (unsigned long long)(data_len - pos), (unsigned long long)data_len);
        goto done;
    }

    /* Hand everything over to st. */
    if (np) {
        whale_st_entry *e = realloc(st->entries, (size_t)(st->n + np) * sizeof *e);
        if (!e) {
            rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        st->entries = e;
        for (int i = 0; i < np; i++) e[st->n++] = p[i].e;
        np = 0; /* names now belong to st */
    }
    if (nmeta) {
        st_meta *m = realloc(st->meta, (size_t)(st->nmeta + nmeta) * sizeof *m);
        if (!m) {
            rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        st->meta = m;
        memcpy(m + st->nmeta, meta, (size_t)nmeta * sizeof *m);
        st->nmeta += nmeta;
        nmeta = 0;
    }

done:
    for (int i = 0; i < np; i++) free((char *)p[i].e.name);
    free(p);
    for (int i = 0; i < nmeta; i++) {
        free(meta[i].key);
        free(meta[i].value);
    }
    free(meta);
    strmap_free(&seen);
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* Map one file and append its tensors to st. */
static whale_code load_file(whale_st *st, const char *path, whale_err *err) {
    int fd;
    uint64_t fsize;
    whale_code oc = whale_open_regular(path, &fd, &fsize, err); /* cannot block on a FIFO */
    if (oc) return oc;
    if (fsize < 8) {
        close(fd);
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: file is too short (%llu bytes) to hold a safetensors header", path,
                          (unsigned long long)fsize);
    }
    if (fsize > SIZE_MAX) {
        close(fd);
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: file too large to map", path);
    }
    size_t size = (size_t)fsize;
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping stays valid */
    if (base == MAP_FAILED)
        return whale_errf(err, WHALE_ERR_IO, "%s: cannot mmap: %s", path, strerror(map_errno));

    /* Record the mapping first so whale_st_close releases it on any error. */
    st_file *files = realloc(st->files, (size_t)(st->nfiles + 1) * sizeof *files);
    char *pathcopy = dup_str(path);
    if (files) st->files = files;
    if (!files || !pathcopy) {
        free(pathcopy);
        munmap(base, size);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    }
    st_file *f = &st->files[st->nfiles++];
    f->path = pathcopy;
    f->base = base;
    f->size = size;
    return parse_header(st, f, err);
}

/* Index the entries by name (names are already known to be unique). */
static whale_code build_index(whale_st *st, const char *path, whale_err *err) {
    if (!strmap_init(&st->by_name, (size_t)st->n))
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < st->n; i++)
        if (strmap_put(&st->by_name, st->entries[i].name, i) >= 0)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: tensor '%s' appears twice", path,
                              SHOWN(st->entries[i].name));
    return WHALE_OK;
}

whale_code whale_st_open(const char *path, whale_st **out, whale_err *err) {
    if (!out) return whale_errf(err, WHALE_ERR_ARG, "whale_st_open: out is NULL");
    *out = NULL;
    if (!path) return whale_errf(err, WHALE_ERR_ARG, "whale_st_open: path is NULL");
    whale_st *st = calloc(1, sizeof *st);
    if (!st) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    whale_code rc = load_file(st, path, err);
    if (!rc) rc = build_index(st, path, err);
    if (rc) {
        whale_st_close(st);
        return rc;
    }
    *out = st;
    return WHALE_OK;
}

/* ------------------------------------------------------------ sharded models */

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name must be a plain file name, so the index cannot make us read
 * outside the model directory. */
static int plain_file_name(const char *s) {
    return *s && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && !strchr(s, '/') && !strchr(s, '\\');
}

/* Open the shards that index (already read into text) names, in name order. */
static whale_code open_sharded(whale_st *st, const char *dir, const char *ipath, const char *text,
                               size_t n, whale_err *err) {
    whale_code rc = WHALE_OK;
    cJSON *root = NULL;
    strmap tensors = {0}, shards = {0};
    const char **names = NULL; /* distinct shard names, sorted */
    int nshards = 0;
    char *spath = NULL;

    const char *end = NULL;
    size_t bad = utf8_bad_offset((const unsigned char *)text, n, 1);
    if (bad < n)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: not valid JSON: %s at byte %zu", ipath,
                          (unsigned char)text[bad] < 0x20 ? "raw control character" : "invalid UTF-8", bad);
    root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: not valid JSON (error at byte %zu)", ipath,
                          (size_t)(end ? end - text : 0));
    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: missing or non-object \"weight_map\"", ipath);
        goto done;
    }

    /* tensor name -> shard number, after checking every shard name. */
    int nt = cJSON_GetArraySize(wm);
    if (!strmap_init(&tensors, (size_t)nt) || !strmap_init(&shards, (size_t)nt) ||
        (nt && !(names = malloc((size_t)nt * sizeof *names)))) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", ipath);
        goto done;
    }
    for (const cJSON *c = wm->child; c; c = c->next) {
        if (!cJSON_IsString(c)) {
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: weight_map entry for '%s' is not a string",
                            ipath, SHOWN(c->string));
            goto done;
        }
        if (!plain_file_name(c->valuestring)) {
            rc = whale_errf(err, WHALE_ERR_FORMAT,
                            "%s: weight_map entry for '%s': shard '%s' is not a plain file name in "
                            "the model directory",
                            ipath, SHOWN(c->string), SHOWN(c->valuestring));
            goto done;
        }
        if (strmap_put(&shards, c->valuestring, 0) < 0) names[nshards++] = c->valuestring;
    }
    if (nshards) qsort(names, (size_t)nshards, sizeof *names, cmp_str);
    /* Re-number shards in sorted order, then map each tensor to its shard. */
    strmap_free(&shards);
    if (!strmap_init(&shards, (size_t)nshards)) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", ipath);
        goto done;
    }
    for (int i = 0; i < nshards; i++) strmap_put(&shards, names[i], i);
    for (const cJSON *c = wm->child; c; c = c->next)
        if (strmap_put(&tensors, c->string, strmap_get(&shards, c->valuestring)) >= 0) {
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: weight_map lists tensor '%s' twice", ipath,
                            SHOWN(c->string));
            goto done;
        }

    for (int s = 0; s < nshards; s++) {
        free(spath);
        if (!(spath = join_path(dir, names[s]))) {
            rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", ipath);
            goto done;
        }
        int first = st->n;
        if ((rc = load_file(st, spath, err))) goto done;
        for (int i = first; i < st->n; i++) {
            int want = strmap_get(&tensors, st->entries[i].name);
            if (want < 0) {
                rc = whale_errf(err, WHALE_ERR_FORMAT,
                                "%s: shard holds tensor '%s' that %s does not list for it", spath,
                                SHOWN(st->entries[i].name), ipath);
                goto done;
            }
            if (want != s) {
                rc = whale_errf(err, WHALE_ERR_FORMAT,
                                "%s: shard holds tensor '%s' that %s does not list for it (it is "
                                "listed for %s)",
                                spath, SHOWN(st->entries[i].name), ipath, SHOWN(names[want]));
                goto done;
            }
        }
    }

    /* Every shard tensor was listed for that shard, so an index entry that
     * cannot be found now is missing from its shard. */
    if ((rc = build_index(st, ipath, err))) goto done;
    for (const cJSON *c = wm->child; c; c = c->next)
        if (!whale_st_find(st, c->string)) {
            rc = whale_errf(err, WHALE_ERR_FORMAT,
                            "%s: tensor '%s' is listed for shard %s, but that shard does not hold it",
                            ipath, SHOWN(c->string), SHOWN(c->valuestring));
            goto done;
        }

done:
    free(spath);
    free(names);
    strmap_free(&tensors);
    strmap_free(&shards);
    cJSON_Delete(root);
    return rc;
}

whale_code whale_st_open_dir(const char *dir, whale_st **out, whale_err *err) {
    if (!out) return whale_errf(err, WHALE_ERR_ARG, "whale_st_open_dir: out is NULL");
    *out = NULL;
    if (!dir) return whale_errf(err, WHALE_ERR_ARG, "whale_st_open_dir: dir is NULL");

    char *single = join_path(dir, "model.safetensors");
    char *ipath = join_path(dir, "model.safetensors.index.json");
    whale_st *st = calloc(1, sizeof *st);
    whale_code rc = WHALE_OK;
    struct stat sb;
    if (!single || !ipath || !st) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", dir);
    } else if (stat(single, &sb) == 0) {
        /* A single file wins over an index, as in transformers. */
        rc = load_file(st, single, err);
        if (!rc) rc = build_index(st, single, err);
    } else if (stat(ipath, &sb) == 0) {
        char *text = NULL;
        size_t n = 0;
        rc = whale_read_file_max(ipath, WHALE_MAX_JSON_FILE, &text, &n, err);
        if (!rc) rc = open_sharded(st, dir, ipath, text, n, err);
        free(text);
    } else {
        rc = whale_errf(err, WHALE_ERR_IO,
                        "%s: neither model.safetensors nor model.safetensors.index.json found", dir);
    }
    free(single);
    free(ipath);
    if (rc) {
        whale_st_close(st);
        return rc;
    }
    *out = st;
    return WHALE_OK;
}

/* ------------------------------------------------------------ writing */

static void sb_u64(whale_sbuf *s, uint64_t v) {
    char t[24];
    whale_sb_put(s, t, (size_t)snprintf(t, sizeof t, "%llu", (unsigned long long)v));
}

/* A JSON string literal; the text is known to be valid UTF-8. */
static void sb_json_str(whale_sbuf *s, const char *str) {
    whale_sb_put(s, "\"", 1);
    for (const char *p = str; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            char t[2] = {'\\', (char)c};
            whale_sb_put(s, t, 2);
        } else if (c < 0x20) {
            char t[8];
            whale_sb_put(s, t, (size_t)snprintf(t, sizeof t, "\\u%04x", c));
        } else {
            whale_sb_put(s, p, 1);
        }
    }
    whale_sb_put(s, "\"", 1);
}

static whale_code write_all(int fd, const void *data, size_t n, const char *path, whale_err *err) {
    const char *p = data;
    while (n > 0) {
        size_t chunk = n < WRITE_CHUNK ? n : WRITE_CHUNK;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return whale_errf(err, WHALE_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return WHALE_OK;
}

/* Check the items and compute each one's byte size. */
static whale_code check_items(const char *path, const whale_st_item *items, int n, size_t *sizes, int need_data,
                              whale_err *err) {
    strmap seen;
    if (!strmap_init(&seen, (size_t)n)) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    whale_code rc = WHALE_OK;
    for (int i = 0; i < n && !rc; i++) {
        const whale_st_item *it = &items[i];
        if (!it->name) {
            rc = whale_errf(err, WHALE_ERR_ARG, "%s: item %d has no name", path, i);
            break;
        }
        const char *name = SHOWN(it->name);
        if (utf8_bad_offset((const unsigned char *)it->name, strlen(it->name), 0) < strlen(it->name))
            rc = whale_errf(err, WHALE_ERR_ARG, "%s: tensor '%s': name is not valid UTF-8", path, name);
        else if (strcmp(it->name, "__metadata__") == 0)
            rc = whale_errf(err, WHALE_ERR_ARG, "%s: tensor name '__metadata__' is reserved", path);
        else if (strmap_put(&seen, it->name, i) >= 0)
            rc = whale_errf(err, WHALE_ERR_ARG, "%s: duplicate tensor name '%s'", path, name);
        else if ((unsigned)it->dtype >= WHALE_DTYPE_COUNT)
            rc = whale_errf(err, WHALE_ERR_ARG, "%s: tensor '%s': invalid dtype %d", path, name,
                            (int)it->dtype);
        else if (it->ndim < 0 || it->ndim > WHALE_MAX_DIMS)
            rc = whale_errf(err, WHALE_ERR_ARG, "%s: tensor '%s': ndim %d outside 0..%d", path, name,
                            it->ndim, WHALE_MAX_DIMS);
        else if (it->ndim > 0 && !it->shape)
            rc = whale_errf(err, WHALE_ERR_ARG, "%s: tensor '%s': shape is NULL", path, name);
        if (rc) break;
        size_t nb = whale_dtype_size(it->dtype);
        for (int d = 0; d < it->ndim && !rc; d++) {
            int64_t v = it->shape[d];
            if (v < 0 || (double)v > EXACT_INT_MAX)
                rc = whale_errf(err, WHALE_ERR_ARG, "%s: tensor '%s': shape dim %d is %lld", path, name,
                                d, (long long)v);
            else if ((uint64_t)v > SIZE_MAX || !whale_mul_size(nb, (size_t)v, &nb))
                rc = whale_errf(err, WHALE_ERR_ARG, "%s: tensor '%s': byte size overflows", path, name);
        }
        if (!rc && nb > 0 && need_data && !it->data)
            rc = whale_errf(err, WHALE_ERR_ARG, "%s: tensor '%s': data is NULL for %zu bytes", path, name,
                            nb);
        sizes[i] = nb;
    }
    strmap_free(&seen);
    return rc;
}

/* Build the padded JSON header. Offsets are printed as plain integers (not
 * through cJSON, which would print large ones in exponent form). */
static whale_code build_header(const char *path, const whale_st_item *items, int n,
                               const size_t *sizes, const char *const *meta, whale_sbuf *sb,
                               whale_err *err) {
    whale_sb_puts(sb, "{\"__metadata__\":{\"format\":\"pt\"");
    for (int i = 0; meta && meta[i]; i += 2) {
        const char *k = meta[i], *v = meta[i + 1];
        if (!v)
            return whale_errf(err, WHALE_ERR_ARG, "%s: metadata key '%s' has no value", path, SHOWN(k));
        if (strcmp(k, "format") == 0)
            return whale_errf(err, WHALE_ERR_ARG, "%s: metadata key 'format' is reserved (always \"pt\")",
                              path);
        if (utf8_bad_offset((const unsigned char *)k, strlen(k), 0) < strlen(k) ||
            utf8_bad_offset((const unsigned char *)v, strlen(v), 0) < strlen(v))
            return whale_errf(err, WHALE_ERR_ARG, "%s: metadata '%s' is not valid UTF-8", path, SHOWN(k));
        for (int j = 0; j < i; j += 2)
            if (strcmp(meta[j], k) == 0)
                return whale_errf(err, WHALE_ERR_ARG, "%s: duplicate metadata key '%s'", path, SHOWN(k));
        whale_sb_puts(sb, ",");
        sb_json_str(sb, k);
        whale_sb_puts(sb, ":");
        sb_json_str(sb, v);
    }
    whale_sb_puts(sb, "}");

    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const whale_st_item *it = &items[i];
        whale_sb_puts(sb, ",");
        sb_json_str(sb, it->name);
        whale_sb_puts(sb, ":{\"dtype\":\"");
        whale_sb_puts(sb, whale_dtype_name(it->dtype));
        whale_sb_puts(sb, "\",\"shape\":[");
        for (int d = 0; d < it->ndim; d++) {
            if (d) whale_sb_puts(sb, ",");
            sb_u64(sb, (uint64_t)it->shape[d]);
        }
        whale_sb_puts(sb, "],\"data_offsets\":[");
        sb_u64(sb, off);
        whale_sb_puts(sb, ",");
        if ((double)off + (double)sizes[i] > EXACT_INT_MAX)
            return whale_errf(err, WHALE_ERR_ARG, "%s: tensor data exceeds 2^53 bytes", path);
        off += sizes[i];
        sb_u64(sb, off);
        whale_sb_puts(sb, "]}");
    }
    whale_sb_puts(sb, "}");
    while (!sb->oom && sb->len % 8 != 0) whale_sb_puts(sb, " ");
    if (sb->oom) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory for header", path);
    if (sb->len > WHALE_ST_MAX_HEADER)
        return whale_errf(err, WHALE_ERR_ARG, "%s: header of %zu bytes exceeds the %u-byte limit", path,
                          sb->len, WHALE_ST_MAX_HEADER);
    return WHALE_OK;
}

/* Make the rename itself durable; failure here is not worth an error. */
static void sync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? malloc((size_t)(slash - path) + 2) : dup_str(".");
    if (!dir) return;
    if (slash) {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

static whale_code write_file(const char *path, const whale_st_item *items, int n, const char *const *meta,
                             whale_st_producer produce, void *user, whale_err *err);

whale_code whale_st_write(const char *path, const whale_st_item *items, int n,
                          const char *const *meta, whale_err *err) {
    return write_file(path, items, n, meta, NULL, NULL, err);
}

whale_code whale_st_write_stream(const char *path, const whale_st_item *items, int n, const char *const *meta,
                                 whale_st_producer produce, void *user, whale_err *err) {
    if (!produce) return whale_errf(err, WHALE_ERR_ARG, "%s: whale_st_write_stream needs a producer", path);
    return write_file(path, items, n, meta, produce, user, err);
}

static whale_code write_file(const char *path, const whale_st_item *items, int n, const char *const *meta,
                             whale_st_producer produce, void *user, whale_err *err) {
    if (!path) return whale_errf(err, WHALE_ERR_ARG, "whale_st_write: path is NULL");
    if (n < 0 || (n > 0 && !items))
        return whale_errf(err, WHALE_ERR_ARG, "%s: bad item list (n = %d)", path, n);

    whale_code rc;
    whale_sbuf sb = {0};
    char *tmp = NULL;
    int fd = -1, created = 0;
    size_t *sizes = malloc((size_t)(n ? n : 1) * sizeof *sizes);
    if (!sizes) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    if ((rc = check_items(path, items, n, sizes, !produce, err))) goto done;
    if ((rc = build_header(path, items, n, sizes, meta, &sb, err))) goto done;

    size_t plen = strlen(path);
    if (!(tmp = malloc(plen + 5))) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = whale_errf(err, WHALE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    created = 1;

    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)sb.len >> (8 * i));
    if ((rc = write_all(fd, len8, 8, path, err))) goto done;
    if ((rc = write_all(fd, sb.p, sb.len, path, err))) goto done;
    for (int i = 0; i < n; i++) {
        const void *data = items[i].data;
        if (produce && sizes[i]) {
            whale_err perr = {0};
            if (!(data = produce(user, i, &perr))) {
                rc = perr.code ? whale_errf(err, perr.code, "%s", perr.msg)
                               : whale_errf(err, WHALE_ERR_INTERNAL, "%s: no data for tensor %d", path, i);
                goto done;
            }
        }
        if ((rc = write_all(fd, data, sizes[i], path, err))) goto done;
    }

    if (fsync(fd) != 0) {
        rc = whale_errf(err, WHALE_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
        goto done;
    }
    int c = close(fd);
    fd = -1;
    if (c != 0) {
        rc = whale_errf(err, WHALE_ERR_IO, "%s: close failed: %s", path, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        rc = whale_errf(err, WHALE_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
        goto done;
    }
    sync_parent_dir(path);

done:
    if (fd >= 0) close(fd);
    if (rc && created) unlink(tmp); /* no partial file is left behind */
    free(tmp);
    free(sb.p);
    free(sizes);
    return rc;
}
