#include "core/sbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for n more bytes and the NUL; 0 once oom. */
static int reserve(whale_sbuf *b, size_t n) {
    if (b->oom) return 0;
    if (n >= SIZE_MAX / 2 - b->len) {
        b->oom = 1;
        return 0;
    }
    if (b->len + n + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

void whale_sb_put(whale_sbuf *b, const void *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void whale_sb_puts(whale_sbuf *b, const char *s) { whale_sb_put(b, s, strlen(s)); }

void whale_sb_putc(whale_sbuf *b, char c) { whale_sb_put(b, &c, 1); }

void whale_sb_printf(whale_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0) {
        b->oom = 1;
        return;
    }
    if (!reserve(b, (size_t)need)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)need + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)need;
}

void whale_sb_truncate(whale_sbuf *b, size_t len) {
    if (!b->p || len > b->len) return;
    b->len = len;
    b->p[len] = 0;
}

const char *whale_sb_str(const whale_sbuf *b) { return b->p ? b->p : ""; }

void whale_sb_free(whale_sbuf *b) {
    free(b->p);
    *b = (whale_sbuf){0};
}
