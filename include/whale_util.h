/* whale_util.h — small services of the library that its programs use too:
 * aligned allocation, seeded random numbers, files read and written
 * safely, a clock. */
#ifndef WHALE_UTIL_H
#define WHALE_UTIL_H

#include "whale.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* 64-byte aligned allocation (AVX-512 rows, cache lines); free with free().
 * Returns NULL on failure (or for 0 bytes). */
void *whale_alloc(size_t bytes);
void *whale_calloc(size_t bytes);

/* ---- random numbers: splitmix64-seeded xoshiro256**, no global state ---- */
typedef struct {
    uint64_t s[4];
} whale_rng;

void whale_rng_seed(whale_rng *r, uint64_t seed);
uint64_t whale_rng_u64(whale_rng *r);
/* uniform in [0, 1) with 24 random bits (exactly representable in float) */
float whale_rng_uniform(whale_rng *r);
/* standard normal (Box–Muller in double, deterministic across runs) */
double whale_rng_normal(whale_rng *r);

/* ---- files ---- */
/* Write a whole buffer to path via path.tmp, fsync, rename; no partial file
 * is left behind on failure. */
whale_code whale_write_file_atomic(const char *path, const void *data, size_t n, whale_err *err);
/* Open a file for reading that must be a regular file (symlinks are
 * followed). The open cannot block: a FIFO, device, socket or directory
 * named like an input is refused with a message saying what it is
 * (WHALE_ERR_IO). *size (may be NULL) gets the file's size. */
whale_code whale_open_regular(const char *path, int *fd, uint64_t *size, whale_err *err);
/* The same as a stdio stream ("rb"). */
whale_code whale_fopen_regular(const char *path, FILE **f, uint64_t *size, whale_err *err);
/* Read a whole regular file of at most max bytes (NUL-terminated for
 * convenience); a larger one is WHALE_ERR_RANGE. whale_read_file's limit is
 * WHALE_MAX_FILE_READ; whale_read_json_object's WHALE_MAX_JSON_FILE. */
whale_code whale_read_file_max(const char *path, size_t max, char **data, size_t *n, whale_err *err);
whale_code whale_read_file(const char *path, char **data, size_t *n, whale_err *err);
/* Read a JSON file whose top level must be an object; errors name the file
 * ("invalid JSON near byte N", "top level must be a JSON object"). Free
 * *out with cJSON_Delete. */
struct cJSON;
whale_code whale_read_json_object(const char *path, struct cJSON **out, whale_err *err);
/* out = "dir/name"; a path that does not fit cap is an error (never cut). */
whale_code whale_path_join(char *out, size_t cap, const char *dir, const char *name, whale_err *err);
/* mkdir -p for one level (the directory itself); ok if it exists. */
whale_code whale_mkdir(const char *dir, whale_err *err);

/* Monotonic wall clock in seconds. */
double whale_now(void);

#endif
