/* UTF-8 helpers and NFC normalisation for the tokenizer. NFC follows UAX #15
 * (canonical decomposition, canonical ordering, canonical composition) with
 * the tables in tokenizer_unidata.h. */
#include "io/tokenizer.h"
#include "io/tokenizer_unidata.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ byte buffer */

int tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->cap - b->len > extra) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len <= extra) {
        if (cap > SIZE_MAX / 2) return 0;
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) return 0;
    b->data = p;
    b->cap = cap;
    return 1;
}

int tok_buf_append(tok_buf *b, const void *p, size_t n) {
    if (!tok_buf_reserve(b, n)) return 0;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 1;
}

/* ------------------------------------------------------------ UTF-8 */

/* Number of continuation bytes a lead byte wants and the allowed range of
 * the byte after it; 0 for bytes that cannot start a sequence. */
static int utf8_lead(unsigned c, unsigned *lo, unsigned *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 1;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;      /* overlong */
        else if (c == 0xED) *hi = 0x9F; /* surrogates */
        return 2;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;      /* overlong */
        else if (c == 0xF4) *hi = 0x8F; /* above U+10FFFF */
        return 3;
    }
    return 0;
}

/* Bytes at s that start a well-formed sequence: the whole sequence length
 * when complete, else -(valid prefix length) (at least 1 byte is taken). */
static int utf8_scan(const unsigned char *s, size_t len) {
    if (s[0] < 0x80) return 1;
    unsigned lo, hi;
    int more = utf8_lead(s[0], &lo, &hi);
    if (!more) return -1;
    int k = 1;
    while (k <= more && (size_t)k < len) {
        unsigned c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) break;
        k++;
    }
    return k == more + 1 ? k : -k;
}

int tok_utf8_valid_len(const unsigned char *s, size_t len) {
    if (!len) return 0;
    int k = utf8_scan(s, len);
    return k > 0 ? k : 0;
}

int tok_utf8_decode(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if (c < 0xF0) {
        *cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        return 3;
    }
    *cp = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    return 4;
}

int tok_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tok_utf8_check(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_scan(s + i, len - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return len;
}

size_t tok_utf8_lossy(tok_buf *out, const unsigned char *s, size_t len, int final, int *nomem) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0;
    *nomem = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_scan(s + i, len - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        k = -k;
        /* a valid prefix cut off by the end of the input may still complete */
        if (!final && i + (size_t)k == len && utf8_lead(s[i], &(unsigned){0}, &(unsigned){0})) break;
        if (!tok_buf_append(out, s + run, i - run) || !tok_buf_append(out, fffd, 3)) {
            *nomem = 1;
            return 0;
        }
        i += (size_t)k;
        run = i;
    }
    if (!tok_buf_append(out, s + run, i - run)) *nomem = 1;
    return i;
}

int tok_is_white_space(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ------------------------------------------------------------ NFC */

enum {
    SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7,
    LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT
};

static int ccc_of(uint32_t cp) {
    if (cp < uni_ccc[0].lo) return 0;
    size_t lo = 0, hi = sizeof uni_ccc / sizeof uni_ccc[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uni_ccc[mid].lo) hi = mid;
        else if (cp > uni_ccc[mid].hi) lo = mid + 1;
        else return uni_ccc[mid].ccc;
    }
    return 0;
}

static const uni_decomp *decomp_of(uint32_t cp) {
    size_t lo = 0, hi = sizeof uni_decomp_tab / sizeof uni_decomp_tab[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uni_decomp_tab[mid].cp) hi = mid;
        else if (cp > uni_decomp_tab[mid].cp) lo = mid + 1;
        else return &uni_decomp_tab[mid];
    }
    return NULL;
}

static int is_unsafe(uint32_t cp) {
    if (cp < uni_unsafe[0].lo) return 0;
    size_t lo = 0, hi = sizeof uni_unsafe / sizeof uni_unsafe[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uni_unsafe[mid].lo) hi = mid;
        else if (cp > uni_unsafe[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* Composite of a starter and the next character, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = sizeof uni_comp_tab / sizeof uni_comp_tab[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uni_comp *c = &uni_comp_tab[mid];
        if (a < c->a || (a == c->a && b < c->b)) hi = mid;
        else if (a > c->a || b > c->b) lo = mid + 1;
        else return c->c;
    }
    return 0;
}

typedef struct {
    uint32_t *cp;
    uint8_t *cc;
    size_t n, cap;
} cp_vec;

static int cp_push(cp_vec *v, uint32_t cp) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        uint32_t *p = realloc(v->cp, cap * sizeof *p);
        if (!p) return 0;
        v->cp = p;
        uint8_t *c = realloc(v->cc, cap);
        if (!c) return 0;
        v->cc = c;
        v->cap = cap;
    }
    v->cp[v->n] = cp;
    v->cc[v->n] = (uint8_t)ccc_of(cp);
    v->n++;
    return 1;
}

static int decompose(cp_vec *v, uint32_t cp) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        if (!cp_push(v, LBASE + s / NCOUNT) || !cp_push(v, VBASE + (s % NCOUNT) / TCOUNT)) return 0;
        return s % TCOUNT ? cp_push(v, TBASE + s % TCOUNT) : 1;
    }
    const uni_decomp *d = decomp_of(cp);
    if (!d) return cp_push(v, cp);
    if (!decompose(v, d->a)) return 0;
    return d->b ? decompose(v, d->b) : 1;
}

/* Stable sort of a run of non-starters by combining class. Runs are short in
 * real text; long ones (pathological stacks of marks) use a counting sort so
 * the cost stays linear. */
static int sort_run(cp_vec *v, size_t a, size_t b) {
    size_t n = b - a;
    if (n <= 32) {
        for (size_t i = a + 1; i < b; i++) {
            uint32_t cp = v->cp[i];
            uint8_t cc = v->cc[i];
            size_t j = i;
            while (j > a && v->cc[j - 1] > cc) {
                v->cp[j] = v->cp[j - 1];
                v->cc[j] = v->cc[j - 1];
                j--;
            }
            v->cp[j] = cp;
            v->cc[j] = cc;
        }
        return 1;
    }
    uint32_t *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return 0;
    size_t start[257] = {0};
    for (size_t i = a; i < b; i++) start[v->cc[i] + 1]++;
    for (int c = 1; c <= 256; c++) start[c] += start[c - 1];
    for (size_t i = a; i < b; i++) tmp[start[v->cc[i]]++] = v->cp[i];
    for (size_t i = 0; i < n; i++) {
        v->cp[a + i] = tmp[i];
        v->cc[a + i] = (uint8_t)ccc_of(tmp[i]);
    }
    free(tmp);
    return 1;
}

int tok_nfc_quick(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        if (u[i] < 0xCC) { /* below U+0300: nothing there changes under NFC */
            i += u[i] < 0x80 ? 1 : 2;
            continue;
        }
        uint32_t cp;
        i += (size_t)tok_utf8_decode(u + i, &cp);
        if (is_unsafe(cp)) return 0;
    }
    return 1;
}

/* Full NFC of a run that starts at a boundary and ends before one. */
static int nfc_run(tok_buf *out, const unsigned char *u, size_t len) {
    cp_vec v = {0};
    int ok = 1;
    for (size_t i = 0; i < len && ok;) {
        uint32_t cp;
        i += (size_t)tok_utf8_decode(u + i, &cp);
        ok = decompose(&v, cp);
    }
    /* canonical ordering */
    for (size_t i = 0; i < v.n && ok;) {
        if (!v.cc[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < v.n && v.cc[j]) j++;
        if (j - i > 1) ok = sort_run(&v, i, j);
        i = j;
    }
    /* canonical composition, in place */
    size_t n = 0;
    if (ok && v.n) {
        size_t starter = 0;
        int last = v.cc[0] ? 256 : 0; /* no composing onto a leading non-starter */
        n = 1;
        for (size_t i = 1; i < v.n; i++) {
            uint32_t cp = v.cp[i];
            int cc = v.cc[i];
            uint32_t c = compose(v.cp[starter], cp);
            if (c && (last < cc || last == 0)) {
                v.cp[starter] = c;
                continue;
            }
            if (!cc) starter = n;
            last = cc;
            v.cp[n++] = cp;
        }
    }
    for (size_t i = 0; i < n && ok; i++) {
        char b[4];
        ok = tok_buf_append(out, b, (size_t)tok_utf8_encode(v.cp[i], b));
    }
    free(v.cp);
    free(v.cc);
    return ok;
}

/* A code point outside the unsafe set is a starter that composes with
 * nothing before it, so NFC never looks across the boundary before it:
 * only the runs from such a boundary through the unsafe characters that
 * follow need the full algorithm; the rest is copied. */
int tok_nfc(tok_buf *out, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, copied = 0, boundary = 0;
    while (i < len) {
        uint32_t cp;
        int k;
        if (u[i] < 0xCC) {
            k = u[i] < 0x80 ? 1 : 2;
            cp = 0;
        } else {
            k = tok_utf8_decode(u + i, &cp);
        }
        if (!cp || !is_unsafe(cp)) {
            boundary = i;
            i += (size_t)k;
            continue;
        }
        size_t j = i + (size_t)k;
        while (j < len) {
            if (u[j] < 0xCC) break;
            int kk = tok_utf8_decode(u + j, &cp);
            if (!is_unsafe(cp)) break;
            j += (size_t)kk;
        }
        if (!tok_buf_append(out, s + copied, boundary - copied) || !nfc_run(out, u + boundary, j - boundary))
            return 0;
        copied = boundary = i = j;
    }
    return tok_buf_append(out, s + copied, len - copied);
}
