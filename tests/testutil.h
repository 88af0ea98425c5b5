/* Minimal test harness: CHECK records failures and keeps going; the test
 * program returns test_finish() so CTest sees a non-zero exit on failure. */
#ifndef WHALE_TESTUTIL_H
#define WHALE_TESTUTIL_H

#include "whale_safetensors.h"
#include "whale.h"

#include <stddef.h>
#include <stdint.h>
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
/* ‖a − b‖ / ‖b‖ (‖a − b‖ when b is 0), in double */
double test_rel_norm(const float *a, const float *b, long n);
/* Parameters [0, n) of m as stored (in their dtype), then the scales of
 * its int8 copies: test_params_changed counts what differs from such a
 * snapshot (malloc'd; free it). For "the frozen base did not move". */
struct whale_model;
unsigned char *test_snapshot_params(const struct whale_model *m, int n);
int test_params_changed(const struct whale_model *m, int n, const unsigned char *snap);
/* Parse a JSON file (NULL with a message on stderr when it cannot be read). */
struct cJSON *test_read_json(const char *path);
/* Make a fresh empty temporary directory (under $TMPDIR or /tmp). */
const char *test_tmpdir(const char *tag, char *buf, size_t cap);
/* Writes text to dir/name (the test exits if it cannot). */
void test_write_text(const char *dir, const char *name, const char *text);
/* The tokenizer in tokdir/name, or NULL after a failed CHECK. */
struct whale_tokenizer *test_load_tokenizer(const char *tokdir, const char *name);
/* max |a − b| / max |b| over n floats (|a − b| when b is 0) */
double test_rel_max(const float *a, const float *b, long n);
/* Golden tensor name of g, or NULL after a failed CHECK. */
const whale_st_entry *test_need_tensor(const whale_st *g, const char *name);
/* Elements of parameter i of m, and of all its parameters. */
long test_param_numel(const struct whale_model *m, int i);
size_t test_total_params(const struct whale_model *m);
/* Sequences decoded step by step through the batch API (test_batch,
 * test_multilora): sequence q has prompt_len[q] prompt tokens, then
 * steps_of(q) one-token steps; its token i is test_token_at(q, i, V). The
 * logits of sequence q go to l[q]: [1 + steps_of(q), V], after the prompt
 * and after each step. */
typedef struct {
    int nseq, nbatch;
    const int *prompt_len;
    int (*steps_of)(int seq);
} test_decode_plan;
int32_t test_token_at(int seq, int i, int V);
/* The prompt of sequence q as sequence id seq, logits for its last token. */
void test_add_prompt(const test_decode_plan *p, whale_dbatch *b, int q, int seq, int V);
/* Sequence q alone in s (sequence id 0). */
void test_decode_alone(whale_session *s, const test_decode_plan *p, int q, int V, float *l);
/* Every sequence in s (sequence q as id q): mixed puts all prompts in one
 * batch, else one prefill batch each; then each step one batch of the
 * sequences with steps left, at their different positions. */
void test_decode_together(whale_session *s, const test_decode_plan *p, int mixed, int V, float **l);
/* check(m, name) on nanowhale's tiny checkpoint (tests/data/tiny), then on
 * each dense preset of dense[n_dense] made with seed; each model is freed
 * after its check. */
void test_tiny_models(const char *const *dense, int n_dense, uint64_t seed,
                      void (*check)(whale_model *m, const char *name));
int test_finish(const char *name);

#endif
