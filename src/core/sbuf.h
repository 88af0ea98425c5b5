/* A growing string, always NUL-terminated once anything is in it (in the
 * spirit of SQLite's sqlite3_str). Appends cannot fail loudly: the first
 * allocation that fails, or a length past SIZE_MAX / 2, sets oom, which
 * stays set and makes every later append do nothing, so a writer appends
 * freely and checks oom once at the end. Zero-initialise to start
 * (whale_sbuf b = {0}); bytes, NULs included, may be appended. */
#ifndef WHALE_SBUF_H
#define WHALE_SBUF_H

#include <stddef.h>

typedef struct {
    char *p;    /* NULL until the first append */
    size_t len; /* bytes, without the terminating NUL */
    size_t cap; /* bytes allocated */
    int oom;
} whale_sbuf;

void whale_sb_put(whale_sbuf *b, const void *s, size_t n);
void whale_sb_puts(whale_sbuf *b, const char *s);
void whale_sb_putc(whale_sbuf *b, char c);
void whale_sb_printf(whale_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Back to its first len bytes (len <= b->len). */
void whale_sb_truncate(whale_sbuf *b, size_t len);
/* The text so far ("" while empty). */
const char *whale_sb_str(const whale_sbuf *b);
/* Frees the text and empties b (oom cleared). */
void whale_sb_free(whale_sbuf *b);

#endif
