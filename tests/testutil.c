#include "testutil.h"

#include "whale.h"
#include "whale_tokenizer.h"
#include "core/core.h"
#include "models/model.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

double test_rel_norm(const float *a, const float *b, long n) {
    double d = 0, r = 0;
    for (long i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* Calls fn on every stored piece of parameters [0, n): tensors, int8 scales. */
static void each_stored(const whale_model *m, int n, void (*fn)(void *, const void *, size_t), void *user) {
    for (int i = 0; i < n; i++) {
        whale_tensor t = whale_model_param(m, i);
        fn(user, t.data, (size_t)whale_shape_numel(t.ndim, t.shape) * whale_dtype_size(t.dtype));
    }
    for (int j = 0; j < m->n_copies; j++)
        if (m->copies[j].scale && m->copies[j].param < n)
            fn(user, m->copies[j].scale, sizeof(float) * (size_t)m->params[m->copies[j].param].shape[0]);
}

typedef struct {
    unsigned char *at;
    size_t bytes;
    int changed;
} snap_walk;

static void count_bytes(void *u, const void *p, size_t b) { (void)p, ((snap_walk *)u)->bytes += b; }
static void copy_in(void *u, const void *p, size_t b) {
    snap_walk *w = u;
    memcpy(w->at, p, b);
    w->at += b;
}
static void compare(void *u, const void *p, size_t b) {
    snap_walk *w = u;
    w->changed += memcmp(w->at, p, b) != 0;
    w->at += b;
}

unsigned char *test_snapshot_params(const whale_model *m, int n) {
    snap_walk w = {0};
    each_stored(m, n, count_bytes, &w);
    unsigned char *snap = malloc(w.bytes ? w.bytes : 1);
    w.at = snap;
    if (snap) each_stored(m, n, copy_in, &w);
    return snap;
}

int test_params_changed(const whale_model *m, int n, const unsigned char *snap) {
    snap_walk w = {.at = (unsigned char *)snap};
    each_stored(m, n, compare, &w);
    return w.changed;
}

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

void test_tiny_models(const char *const *dense, int n_dense, uint64_t seed,
                      void (*check)(whale_model *m, const char *name)) {
    whale_err err;
    whale_model *m;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tiny", WHALE_TEST_DATA);
    CHECK(whale_model_load(dir, &m, &err) == WHALE_OK, "%s", err.msg);
    if (m) check(m, "nanowhale tiny");
    whale_model_free(m);
    for (int k = 0; k < n_dense; k++) {
        CHECK(whale_model_init(dense[k], seed, &m, &err) == WHALE_OK, "%s: %s", dense[k], err.msg);
        if (m) check(m, dense[k]);
        whale_model_free(m);
    }
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

void test_write_text(const char *dir, const char *name, const char *text) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

whale_tokenizer *test_load_tokenizer(const char *tokdir, const char *name) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", tokdir, name);
    whale_tokenizer *t = NULL;
    whale_err err;
    whale_code rc = whale_tokenizer_load(path, &t, &err);
    CHECK(rc == WHALE_OK, "%s", err.msg);
    return rc == WHALE_OK ? t : NULL;
}

double test_rel_max(const float *a, const float *b, long n) {
    double d = test_max_abs_diff(a, b, n), m = test_max_abs(b, n);
    return m > 0 ? d / m : d;
}

const whale_st_entry *test_need_tensor(const whale_st *g, const char *name) {
    const whale_st_entry *e = whale_st_find(g, name);
    CHECK(e != NULL, "golden tensor %s missing", name);
    return e;
}

long test_param_numel(const whale_model *m, int i) {
    whale_tensor t = whale_model_param(m, i);
    return (long)whale_shape_numel(t.ndim, t.shape);
}

size_t test_total_params(const whale_model *m) {
    size_t n = 0;
    for (int i = 0; i < whale_model_num_params(m); i++) n += (size_t)test_param_numel(m, i);
    return n;
}

int32_t test_token_at(int seq, int i, int V) { return (int32_t)((seq * 7919 + i * 104729 + 13) % V); }

void test_add_prompt(const test_decode_plan *p, whale_dbatch *b, int q, int seq, int V) {
    whale_err err;
    for (int i = 0; i < p->prompt_len[q]; i++)
        CHECK(whale_dbatch_add(b, test_token_at(q, i, V), i, seq, i == p->prompt_len[q] - 1, &err) == WHALE_OK, "%s",
              err.msg);
}

void test_decode_alone(whale_session *s, const test_decode_plan *p, int q, int V, float *l) {
    whale_err err;
    whale_dbatch b;
    CHECK(whale_dbatch_init(&b, p->nbatch, &err) == WHALE_OK, "%s", err.msg);
    test_add_prompt(p, &b, q, 0, V);
    CHECK(whale_session_decode(s, &b, l, &err) == WHALE_OK, "%s", err.msg);
    for (int k = 0, pos = p->prompt_len[q]; k < p->steps_of(q); k++, pos++) {
        whale_dbatch_clear(&b);
        whale_dbatch_add(&b, test_token_at(q, pos, V), pos, 0, 1, &err);
        CHECK(whale_session_decode(s, &b, l + (size_t)(1 + k) * V, &err) == WHALE_OK, "%s", err.msg);
    }
    whale_dbatch_free(&b);
}

/* One step: the next token of every sequence with steps left, the logits
 * of each into its row k + 1; 0 when none has. */
static int decode_step(whale_session *s, const test_decode_plan *p, int k, int V, whale_dbatch *b, float *out,
                       float **l) {
    whale_err err;
    whale_dbatch_clear(b);
    for (int q = 0; q < p->nseq; q++) {
        int pos = whale_kv_seq_len(s, q);
        if (k < p->steps_of(q)) whale_dbatch_add(b, test_token_at(q, pos, V), pos, q, 1, &err);
    }
    if (!b->n_tokens) return 0;
    CHECK(whale_session_decode(s, b, out, &err) == WHALE_OK, "%s", err.msg);
    for (int q = 0, row = 0; q < p->nseq; q++)
        if (k < p->steps_of(q)) memcpy(l[q] + (size_t)(1 + k) * V, out + (size_t)row++ * V, sizeof(float) * V);
    return 1;
}

void test_decode_together(whale_session *s, const test_decode_plan *p, int mixed, int V, float **l) {
    whale_err err;
    whale_dbatch b;
    CHECK(whale_dbatch_init(&b, p->nbatch, &err) == WHALE_OK, "%s", err.msg);
    float *out = malloc(sizeof(float) * (size_t)p->nseq * V);
    if (mixed) {
        for (int q = 0; q < p->nseq; q++) test_add_prompt(p, &b, q, q, V);
        CHECK(whale_session_decode(s, &b, out, &err) == WHALE_OK, "%s", err.msg);
        for (int q = 0; q < p->nseq; q++) memcpy(l[q], out + (size_t)q * V, sizeof(float) * V);
    } else
        for (int q = 0; q < p->nseq; q++) {
            whale_dbatch_clear(&b);
            test_add_prompt(p, &b, q, q, V);
            CHECK(whale_session_decode(s, &b, l[q], &err) == WHALE_OK, "%s", err.msg);
        }
    for (int k = 0; decode_step(s, p, k, V, &b, out, l); k++) {}
    free(out);
    whale_dbatch_free(&b);
}
