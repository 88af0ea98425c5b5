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

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

whale_code whale_open_regular(const char *path, int *fd_out, uint64_t *size, whale_err *err) {
    *fd_out = -1;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait forever
     * for a writer; on a regular file it changes nothing and is cleared. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return whale_errf(err, WHALE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        whale_code c = whale_errf(err, WHALE_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return c;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return whale_errf(err, WHALE_ERR_IO, "%s: is %s, not a regular file", path, file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        whale_code c = whale_errf(err, WHALE_ERR_IO, "%s: cannot set blocking mode: %s", path, strerror(errno));
        close(fd);
        return c;
    }
    *fd_out = fd;
    if (size) *size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
    return WHALE_OK;
}

whale_code whale_fopen_regular(const char *path, FILE **out, uint64_t *size, whale_err *err) {
    int fd;
    *out = NULL;
    whale_code c = whale_open_regular(path, &fd, size, err);
    if (c) return c;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return c;
    }
    *out = f;
    return WHALE_OK;
}

whale_code whale_read_file_max(const char *path, size_t max, char **data, size_t *n, whale_err *err) {
    int fd;
    uint64_t sz;
    whale_code c = whale_open_regular(path, &fd, &sz, err);
    if (c) return c;
    if (sz > max) {
        close(fd);
        return whale_errf(err, WHALE_ERR_RANGE, "%s: %llu bytes is over the %zu-byte limit for this file", path,
                          (unsigned long long)sz, max);
    }
    char *buf = malloc((size_t)sz + 1);
    if (!buf) {
        close(fd);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory reading %llu bytes", path,
                          (unsigned long long)sz);
    }
    /* read until EOF, never past the size fstat reported (a file that grows
     * while being read is cut there; one that shrinks is a short read) */
    size_t got = 0;
    while (got < sz) {
        ssize_t r = read(fd, buf + got, (size_t)sz - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            c = whale_errf(err, WHALE_ERR_IO, "%s: read failed: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return c;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != sz) {
        free(buf);
        return whale_errf(err, WHALE_ERR_IO, "%s: short read (%zu of %llu bytes)", path, got,
                          (unsigned long long)sz);
    }
    buf[got] = 0;
    *data = buf;
    if (n) *n = got;
    return WHALE_OK;
}

whale_code whale_read_file(const char *path, char **data, size_t *n, whale_err *err) {
    return whale_read_file_max(path, WHALE_MAX_FILE_READ, data, n, err);
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
    whale_code c = whale_read_file_max(path, WHALE_MAX_JSON_FILE, &text, &n, err);
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

whale_code whale_path_join(char *out, size_t cap, const char *dir, const char *name, whale_err *err) {
    const int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return whale_errf(err, WHALE_ERR_ARG, "%.200s/%s: path longer than %zu bytes", dir, name, cap - 1);
    return WHALE_OK;
}
