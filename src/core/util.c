/* Allocation, random numbers, files and clocks. */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Buffers of 2 MiB and more (weights, activations, optimizer state) are
 * aligned to 2 MiB and offered to the kernel as transparent huge pages:
 * streaming a 165 MB weight through 4 KiB pages costs a TLB walk every
 * 4 KiB, which held decode at ~60 % of the read bandwidth. */
enum { HUGE_PAGE = 2 << 20 };

void *whale_alloc(size_t bytes) {
    if (bytes == 0) return NULL;
    size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : 64;
    size_t rounded = (bytes + align - 1) & ~(align - 1);
    if (rounded < bytes) return NULL;
    void *p = aligned_alloc(align, rounded);
#ifdef MADV_HUGEPAGE
    if (p && align == HUGE_PAGE) madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

void *whale_calloc(size_t bytes) {
    void *p = whale_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

int whale_mul_size(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void whale_rng_seed(whale_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t whale_rng_u64(whale_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float whale_rng_uniform(whale_rng *r) { return (float)(whale_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

double whale_rng_normal(whale_rng *r) {
    /* u1 in (0,1]: never log(0) */
    double u1 = ((double)(whale_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(whale_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

whale_code whale_write_file_atomic(const char *path, const void *data, size_t n, whale_err *err) {
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, plen + 16, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        whale_code c = whale_errf(err, WHALE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        free(tmp);
        return c;
    }
    const char *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            whale_code c = whale_errf(err, WHALE_ERR_IO, "%s: write failed: %s", path, strerror(errno));
            close(fd);
            unlink(tmp);
            free(tmp);
            return c;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        whale_code c = whale_errf(err, WHALE_ERR_IO, "%s: fsync/close failed: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return c;
    }
    if (rename(tmp, path) != 0) {
        whale_code c = whale_errf(err, WHALE_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return c;
    }
    free(tmp);
    return WHALE_OK;
}

whale_code whale_read_file(const char *path, char **data, size_t *n, whale_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return whale_errf(err, WHALE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return whale_errf(err, WHALE_ERR_IO, "%s: cannot seek", path);
    }
    long sz = ftell(f);
    if (sz < 0) {
        fclose(f);
        return whale_errf(err, WHALE_ERR_IO, "%s: cannot read (not a regular file?)", path);
    }
    rewind(f);
    char *buf = malloc((size_t)sz + 1);
    if (!buf) {
        fclose(f);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory reading %ld bytes", path, sz);
    }
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        free(buf);
        fclose(f);
        return whale_errf(err, WHALE_ERR_IO, "%s: short read", path);
    }
    fclose(f);
    buf[sz] = 0;
    *data = buf;
    if (n) *n = (size_t)sz;
    return WHALE_OK;
}

whale_code whale_mkdir(const char *dir, whale_err *err) {
    if (mkdir(dir, 0755) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return WHALE_OK;
        return whale_errf(err, WHALE_ERR_IO, "%s: exists and is not a directory", dir);
    }
    return whale_errf(err, WHALE_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
}

double whale_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

whale_code whale_read_json_object(const char *path, cJSON **out, whale_err *err) {
    char *text;
    size_t n;
    *out = NULL;
    whale_code c = whale_read_file(path, &text, &n, err);
    if (c) return c;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n + 1, &end, 1); /* text is NUL-terminated */
    if (!j) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        free(text);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, off);
    }
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: top level must be a JSON object", path);
    }
    *out = j;
    return WHALE_OK;
}
