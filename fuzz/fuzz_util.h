/* Shared by the fuzz targets: a private scratch folder and file writing.
 * Every parser in the engine takes paths, so each input is written to a
 * file in that folder first (under /dev/shm when there is one). */
#ifndef WHALE_FUZZ_UTIL_H
#define WHALE_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[256];

/* The scratch folder (created once per process). */
static inline const char *fuzz_scratch(void) {
    if (!fuzz_dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/whale-fuzz-XXXXXX", base);
        if (!mkdtemp(fuzz_dir)) abort();
    }
    return fuzz_dir;
}

/* fuzz_scratch()/name, in buf. */
static inline const char *fuzz_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", fuzz_scratch(), name);
    return buf;
}

static inline void fuzz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    if (fclose(f) != 0) abort();
}

/* Split an input in two at the first occurrence of sep (the second part
 * empty when there is none). */
static inline void fuzz_split(const uint8_t *data, size_t size, const char *sep, size_t *n1, const uint8_t **p2, size_t *n2) {
    size_t k = strlen(sep);
    for (size_t i = 0; i + k <= size; i++)
        if (!memcmp(data + i, sep, k)) {
            *n1 = i;
            *p2 = data + i + k;
            *n2 = size - i - k;
            return;
        }
    *n1 = size;
    *p2 = data + size;
    *n2 = 0;
}

/* An error message is one line naming something: a bug if not. */
#include "whale.h"
static inline void fuzz_check_message(whale_code c, const whale_err *e) {
    if (!c) return;
    if (c == WHALE_ERR_INTERNAL || !e->msg[0] || strchr(e->msg, '\n') || strchr(e->msg, '\r')) {
        fprintf(stderr, "bad error (code %d): %s\n", (int)c, e->msg);
        abort();
    }
}

#endif
