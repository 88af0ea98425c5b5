/* Minimal test harness: CHECK records failures and keeps going; the test
 * program returns test_finish() so CTest sees a non-zero exit on failure. */
#ifndef WHALE_TESTUTIL_H
#define WHALE_TESTUTIL_H

#include <stdio.h>

extern int test_failures;
extern int test_checks;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        test_checks++;                                                          \
        if (!(cond)) {                                                          \
            test_failures++;                                                    \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* max |a-b| and max |b| over n floats */
double test_max_abs_diff(const float *a, const float *b, long n);
double test_max_abs(const float *a, long n);
/* Parse a JSON file (NULL with a message on stderr when it cannot be read). */
struct cJSON *test_read_json(const char *path);
/* Make a fresh empty temporary directory (under $TMPDIR or /tmp). */
const char *test_tmpdir(const char *tag, char *buf, size_t cap);
int test_finish(const char *name);

#endif
