/* ms-swift's dataset sampling (FILE#N) and train / validation split. */
#include "train/sft_select.h"

#include "whale_data.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void whale_sft_parse_sample(const char *arg, char **path, int64_t *n) {
    *n = -1;
    const char *hash = strrchr(arg, '#');
    if (hash && hash[1] && access(arg, F_OK) != 0) {
        const char *d = hash + 1;
        while (isdigit((unsigned char)*d)) d++;
        char *prefix = strndup(arg, (size_t)(hash - arg));
        if (!*d && d - hash <= 16 && prefix && access(prefix, F_OK) == 0) {
            *path = prefix;
            *n = strtoll(hash + 1, NULL, 10);
            return;
        }
        free(prefix);
    }
    *path = strdup(arg);
}

typedef struct {
    int64_t *v;
    int64_t n, cap;
} idx_list;

static int push(idx_list *l, int64_t x) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 256;
        int64_t *g = realloc(l->v, (size_t)cap * sizeof *g);
        if (!g) return 0;
        l->v = g;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return 1;
}

/* ms-swift's sample_dataset: k of the n indices in from[], all of them
 * floor(k/n) times, then the first k mod n of a seeded permutation. */
static int draw(idx_list *out, const int64_t *from, int64_t n, int64_t k, uint64_t seed, int64_t salt) {
    if (n == 0) return 1; /* nothing asked of an empty file (checked by the caller) */
    for (int64_t r = 0; r < k / n; r++)
        for (int64_t i = 0; i < n; i++)
            if (!push(out, from[i])) return 0;
    for (int64_t i = 0; i < k % n; i++)
        if (!push(out, from[whale_data_shuffle(seed, salt, n, i)])) return 0;
    return 1;
}

/* One file's samples [first, first + n): the validation share, then the draw. */
static whale_code select_file(int64_t first, int64_t n, int64_t want, double ratio, uint64_t seed, int f,
                              const char *name, idx_list *train, idx_list *val, whale_err *err) {
    int64_t k = want < 0 ? n : want, nval = (int64_t)((double)(n < k ? n : k) * ratio);
    if (nval < 1) nval = 1;
    if (n == 0 && k > 0) return whale_errf(err, WHALE_ERR_FORMAT, "%s: no usable sample to draw %lld from", name, (long long)k);
    if (ratio >= 1 && k > n)
        return whale_errf(err, WHALE_ERR_ARG, "%s: %lld validation samples asked, it has %lld", name, (long long)k,
                          (long long)n);
    if (ratio > 0 && ratio < 1 && (k - nval < 1 || nval >= n))
        return whale_errf(err, WHALE_ERR_ARG, "%s: %lld samples leave none for training after holding out %lld for "
                          "validation (--split_dataset_ratio %g)", name, (long long)n, (long long)nval, ratio);
    int64_t *ord = malloc((size_t)(n ? n : 1) * sizeof *ord);
    if (!ord) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    int ok = 1;
    if (ratio <= 0 || ratio >= 1) { /* no split: a draw from the file in order */
        for (int64_t i = 0; i < n; i++) ord[i] = first + i;
        ok = draw(ratio >= 1 ? val : train, ord, n, k, seed, 2 * (int64_t)f + 1);
    } else { /* HF's train_test_split: the permutation's head is the test set */
        for (int64_t i = 0; i < n; i++) ord[i] = first + whale_data_shuffle(seed, 2 * (int64_t)f, n, i);
        for (int64_t i = 0; i < nval && ok; i++) ok = push(val, ord[i]);
        ok = ok && draw(train, ord + nval, n - nval, k - nval, seed, 2 * (int64_t)f + 1);
    }
    free(ord);
    return ok ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
}

whale_code whale_sft_select(const whale_sft_dataset *ds, int n_files, const char *const *names, const int64_t *want,
                            double ratio, uint64_t seed, whale_sft_dataset **train, whale_sft_dataset **val,
                            whale_err *err) {
    idx_list tl = {0}, vl = {0};
    *train = *val = NULL;
    whale_code c = WHALE_OK;
    for (int f = 0; f < n_files && !c; f++) {
        int64_t first, n;
        whale_sft_dataset_file_samples(ds, f, &first, &n);
        c = select_file(first, n, want[f], ratio, seed, f, names[f], &tl, &vl, err);
    }
    if (!c && ratio < 1) {
        if (!tl.n) c = whale_errf(err, WHALE_ERR_ARG, "%s: no training sample selected", names[0]);
        else c = whale_sft_dataset_select(ds, tl.v, tl.n, train, err);
    }
    if (!c && ratio > 0) c = whale_sft_dataset_select(ds, vl.v, vl.n, val, err);
    if (c) {
        whale_sft_dataset_free(*train);
        *train = NULL;
    }
    free(tl.v);
    free(vl.v);
    return c;
}

static void free_paths(char **paths, int n) {
    for (int i = 0; paths && i < n; i++) free(paths[i]);
    free(paths);
}

whale_code whale_sft_open_data(const char *const *args, int n, whale_tokenizer *tok, const whale_chat_template *tpl,
                               const whale_sft_opts *opts, double ratio, uint64_t seed, whale_sft_dataset **train,
                               whale_sft_dataset **val, whale_err *err) {
    *train = *val = NULL;
    char **paths = calloc((size_t)n, sizeof *paths);
    int64_t *want = calloc((size_t)n, sizeof *want);
    whale_code c = paths && want ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    int sampled = 0;
    for (int i = 0; i < n && !c; i++) {
        whale_sft_parse_sample(args[i], &paths[i], &want[i]);
        sampled |= want[i] >= 0;
        if (!paths[i]) c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        else if (access(paths[i], F_OK) != 0)
            c = whale_errf(err, WHALE_ERR_IO, "%s: no such file (whale sft reads local .jsonl / .json files; dataset "
                           "ids of ModelScope or Hugging Face are not downloaded)", args[i]);
    }
    whale_sft_dataset *all = NULL;
    if (!c) c = whale_sft_dataset_open_template((const char *const *)paths, n, tok, tpl, opts, &all, err);
    if (!c && !sampled && (ratio <= 0 || ratio >= 1)) {
        *(ratio >= 1 ? val : train) = all;
        all = NULL;
    } else if (!c) {
        c = whale_sft_select(all, n, (const char *const *)paths, want, ratio, seed, train, val, err);
    }
    whale_sft_dataset_free(all);
    free_paths(paths, n);
    free(want);
    return c;
}
