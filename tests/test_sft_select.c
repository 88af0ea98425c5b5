/* ms-swift's dataset syntax and selection (train/sft_select.h): FILE#N
 * parsing, drawing fewer or more samples than a file has (seeded, the
 * repeats whole), the train / validation split per file (disjoint, HF's
 * sizes), validation files, and the files that cannot give what is asked.
 * Uses the real Qwen tokenizer (scripts/fetch-tokenizers.sh). */
#include "testutil.h"

#include "train/sft_select.h"
#include "whale_chat.h"
#include "whale_tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A file of n query/response records, line i asking "q<i>". */
static void write_records(const char *dir, const char *name, int n) {
    char *text = malloc((size_t)n * 64 + 1), *p = text;
    for (int i = 1; i <= n; i++) p += sprintf(p, "{\"query\": \"q%d\", \"response\": \"r%d\"}\n", i, i);
    test_write_text(dir, name, text);
    free(text);
}

/* The line of each sample, and how often each line 1..cap occurs. */
static int64_t lines_of(const whale_sft_dataset *ds, int64_t *line, int *seen, int cap) {
    int64_t n = whale_sft_dataset_num_samples(ds);
    memset(seen, 0, sizeof(int) * (size_t)(cap + 1));
    for (int64_t i = 0; i < n; i++) {
        whale_sft_sample s;
        whale_err err;
        CHECK(whale_sft_dataset_sample(ds, i, &s, &err) == WHALE_OK, "%s", err.msg);
        line[i] = s.line;
        if (s.line >= 1 && s.line <= cap) seen[s.line]++;
    }
    return n;
}

typedef struct {
    whale_tokenizer *tok;
    whale_chat_template *tpl;
    const char *dir;
} env;

static whale_code open_sel(const env *e, const char *a, const char *b, double ratio, uint64_t seed,
                           whale_sft_dataset **tr, whale_sft_dataset **va, whale_err *err) {
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/%s", e->dir, a);
    snprintf(pb, sizeof pb, "%s/%s", e->dir, b ? b : "");
    const char *args[2] = {pa, pb};
    whale_sft_opts o = whale_sft_defaults();
    return whale_sft_open_data(args, b ? 2 : 1, e->tok, e->tpl, &o, ratio, seed, tr, va, err);
}

static void check_parse(const char *dir) {
    char arg[700], *path;
    int64_t n;
    snprintf(arg, sizeof arg, "%s/ten.jsonl#4", dir);
    whale_sft_parse_sample(arg, &path, &n);
    CHECK(n == 4 && strlen(path) == strlen(arg) - 2, "FILE#4: %s %lld", path, (long long)n);
    free(path);
    snprintf(arg, sizeof arg, "%s/missing.jsonl#4", dir);
    whale_sft_parse_sample(arg, &path, &n);
    CHECK(n == -1 && !strcmp(path, arg), "a missing FILE keeps its name: %s", path);
    free(path);
    snprintf(arg, sizeof arg, "%s/odd#3", dir); /* a file whose name has a '#' */
    whale_sft_parse_sample(arg, &path, &n);
    CHECK(n == -1 && !strcmp(path, arg), "an existing FILE#N is that file: %s", path);
    free(path);
}

static void check_draws(const env *e) {
    whale_sft_dataset *tr, *va;
    whale_err err;
    int64_t line[64], line2[64];
    int seen[11];
    CHECK(open_sel(e, "ten.jsonl#4", NULL, 0, 42, &tr, &va, &err) == WHALE_OK && !va, "%s", err.msg);
    int64_t n = tr ? lines_of(tr, line, seen, 10) : 0, distinct = 0;
    for (int i = 1; i <= 10; i++) distinct += seen[i] == 1;
    CHECK(n == 4 && distinct == 4, "#4 of 10: %lld samples, %lld distinct", (long long)n, (long long)distinct);
    whale_sft_dataset_free(tr);
    CHECK(open_sel(e, "ten.jsonl#4", NULL, 0, 42, &tr, &va, &err) == WHALE_OK, "%s", err.msg);
    CHECK(tr && lines_of(tr, line2, seen, 10) == 4 && !memcmp(line, line2, 4 * sizeof *line), "the same seed, the same draw");
    whale_sft_dataset_free(tr);
    CHECK(open_sel(e, "ten.jsonl#4", NULL, 0, 43, &tr, &va, &err) == WHALE_OK, "%s", err.msg);
    CHECK(tr && lines_of(tr, line2, seen, 10) == 4 && memcmp(line, line2, 4 * sizeof *line), "another seed, another draw");
    whale_sft_dataset_free(tr);
    CHECK(open_sel(e, "ten.jsonl#25", NULL, 0, 7, &tr, &va, &err) == WHALE_OK, "%s", err.msg);
    n = tr ? lines_of(tr, line, seen, 10) : 0;
    int ok = n == 25;
    for (int i = 0; i < 20 && ok; i++) ok = line[i] == i % 10 + 1; /* twice in order, then 5 at random */
    for (int i = 1; i <= 10 && ok; i++) ok = seen[i] == 2 || seen[i] == 3;
    CHECK(ok, "#25 of 10: the file twice in order, then 5 distinct (%lld samples)", (long long)n);
    whale_sft_dataset_free(tr);
}

static void check_split(const env *e) {
    whale_sft_dataset *tr, *va;
    whale_err err;
    int64_t line[64];
    int st[11], sv[11];
    CHECK(open_sel(e, "ten.jsonl", NULL, 0.2, 42, &tr, &va, &err) == WHALE_OK, "%s", err.msg);
    int64_t nt = tr ? lines_of(tr, line, st, 10) : 0, nv = va ? lines_of(va, line, sv, 10) : 0;
    int ok = nt == 8 && nv == 2;
    for (int i = 1; i <= 10 && ok; i++) ok = st[i] + sv[i] == 1;
    CHECK(ok, "ratio 0.2 of 10: 8 + 2, disjoint, covering the file (%lld + %lld)", (long long)nt, (long long)nv);
    whale_sft_dataset_free(tr);
    whale_sft_dataset_free(va);
    /* #25 with 0.2: 2 held out of min(10, 25), 23 drawn from the other 8 */
    CHECK(open_sel(e, "ten.jsonl#25", "five.jsonl", 0.2, 42, &tr, &va, &err) == WHALE_OK, "%s", err.msg);
    nt = tr ? whale_sft_dataset_num_samples(tr) : 0, nv = va ? whale_sft_dataset_num_samples(va) : 0;
    CHECK(nt == 23 + 4 && nv == 2 + 1, "per file: train %lld (want 27), validation %lld (want 3)", (long long)nt,
          (long long)nv);
    whale_sft_dataset_free(tr);
    whale_sft_dataset_free(va);
    CHECK(open_sel(e, "ten.jsonl#3", NULL, 1.0, 42, &tr, &va, &err) == WHALE_OK && !tr, "%s", err.msg);
    CHECK(va && whale_sft_dataset_num_samples(va) == 3, "validation files: #3 gives 3");
    whale_sft_dataset_free(va);
    whale_code c = open_sel(e, "one.jsonl", NULL, 0.5, 42, &tr, &va, &err);
    CHECK(c == WHALE_ERR_ARG && strstr(err.msg, "one.jsonl") && !tr && !va, "one sample cannot be split: %s", err.msg);
    c = open_sel(e, "ten.jsonl#11", NULL, 1.0, 42, &tr, &va, &err);
    CHECK(c == WHALE_ERR_ARG && strstr(err.msg, "11 validation samples"), "more validation than there is: %s", err.msg);
    c = open_sel(e, "AI-ModelScope/alpaca#5", NULL, 0, 42, &tr, &va, &err);
    CHECK(c == WHALE_ERR_IO && strstr(err.msg, "not downloaded"), "a dataset id: %s", err.msg);
}

int main(void) {
    const char *envdir = getenv("WHALE_TOKENIZERS");
    char tokdir[1024], dir[512];
    if (envdir && *envdir) snprintf(tokdir, sizeof tokdir, "%s", envdir);
    else snprintf(tokdir, sizeof tokdir, "%s/../../.cache/tokenizers", WHALE_TEST_DATA);
    env e = {test_load_tokenizer(tokdir, "qwen3"), NULL, test_tmpdir("sft-select", dir, sizeof dir)};
    whale_err err;
    if (!e.tok || whale_chat_template_native(WHALE_CHAT_CHATML, &e.tpl, &err)) return test_finish("test_sft_select");
    write_records(dir, "ten.jsonl", 10);
    write_records(dir, "five.jsonl", 5);
    write_records(dir, "one.jsonl", 1);
    write_records(dir, "odd#3", 2);
    check_parse(dir);
    check_draws(&e);
    check_split(&e);
    whale_chat_template_free(e.tpl);
    whale_tokenizer_free(e.tok);
    return test_finish("test_sft_select");
}
