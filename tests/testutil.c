#include "testutil.h"

#include "whale.h"
#include "core/core.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int test_failures = 0;
int test_checks = 0;

double test_max_abs_diff(const float *a, const float *b, long n) {
    double m = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

double test_max_abs(const float *a, long n) {
    double m = 0;
    for (long i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

const char *test_tmpdir(const char *tag, char *buf, size_t cap) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(buf, cap, "%s/whale-%s-XXXXXX", base, tag);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(1);
    }
    return buf;
}

int test_finish(const char *name) {
    if (test_failures) {
        fprintf(stderr, "%s: %d of %d checks failed\n", name, test_failures, test_checks);
        return 1;
    }
    printf("%s: all %d checks passed\n", name, test_checks);
    return 0;
}

cJSON *test_read_json(const char *path) {
    char *buf;
    size_t n;
    whale_err err;
    if (whale_read_file(path, &buf, &n, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(buf, n);
    free(buf);
    return j;
}
