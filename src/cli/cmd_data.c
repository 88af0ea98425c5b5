/* whale data prepare | info: text to token shards, and a look at them. */
#include "cli.h"

#include "whale_util.h"
#include "whale_data.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static const char prepare_help[] =
    "usage: whale data prepare --tokenizer DIR --out DIR [options] INPUTS...\n"
    "  Tokenizes documents into DIR/train-00000.bin..., DIR/val.bin and DIR/meta.json\n"
    "  (format: docs/data.md). Every document gets the tokenizer's EOS at its end.\n"
    "  INPUTS are text files, or *.jsonl files with one JSON object per line.\n"
    "\n"
    "  --tokenizer DIR      directory with tokenizer.json (+ tokenizer_config.json)\n"
    "  --out DIR            output directory (created if missing)\n"
    "  --doc-split MODE     documents of a text file: file (whole file, default),\n"
    "                       line (each line), blank (paragraphs between blank lines)\n"
    "  --text-field NAME    JSONL field with the text (default text)\n"
    "  --skip-bad-records   count and skip malformed JSONL lines instead of failing\n"
    "  --val-fraction F     share of documents held out for validation (default 0.01;\n"
    "                       at least 1 document when there are 2 or more)\n"
    "  --val-docs N         exactly N validation documents instead\n"
    "  --seed S             picks the validation documents (default 0)\n"
    "  --shard-tokens N     train shard size limit, e.g. 100M (default); shards split\n"
    "                       only between documents\n"
    "  --overwrite          replace a dataset already in DIR\n"
    "  --threads N          tokenizer threads (default: cores, at most 16, one per 4 MB)\n"
    "  --quiet              no progress lines";

static const char info_help[] =
    "usage: whale data info DIR [--seq S]\n"
    "  Checks every shard of both splits (headers, sizes, document index) and\n"
    "  prints their token and document counts; --seq S also prints the number\n"
    "  of training windows of S tokens.";

/* A count with an optional k/M/G suffix (decimal: 100M = 100,000,000). */
static int parse_count(const char *cmd, const char *opt, const char *val, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    int64_t mult = 1;
    if (*end == 'k' || *end == 'K') mult = 1000, end++;
    else if (*end == 'M' || *end == 'm') mult = 1000000, end++;
    else if (*end == 'G' || *end == 'g') mult = 1000000000, end++;
    if (errno || end == val || *end || v < lo || v > INT64_MAX / mult)
        return cli_usage(cmd, "%s expects a count of at least %" PRId64 " (suffixes k, M, G allowed), got \"%s\"", opt, lo,
                         val);
    *out = (int64_t)v * mult;
    return 0;
}

typedef struct {
    int tty, printed;
} progress_state;

static void on_progress(void *user, const whale_data_progress *p) {
    progress_state *ps = user;
    fprintf(stderr, "%sdata: %" PRId64 " documents, %" PRId64 " tokens, %.1f MB, %.1f MB/s%s", ps->tty ? "\r" : "",
            p->documents, p->tokens, p->bytes / 1e6, p->seconds > 0 ? p->bytes / 1e6 / p->seconds : 0.0,
            ps->tty ? "   " : "\n");
    ps->printed = 1;
}

/* --seed N (an unsigned 64-bit integer) and --doc-split file|line|blank. */
static int prepare_values(const char *cmd, const char *seed, const char *split, whale_data_prepare_opts *o) {
    if (seed) {
        char *end;
        errno = 0;
        o->seed = strtoull(seed, &end, 10);
        if (errno || end == seed || *end || seed[0] == '-')
            return cli_usage(cmd, "--seed expects a non-negative integer, got \"%s\"", seed);
    }
    if (!split) return 0;
    if (!strcmp(split, "file")) o->doc_split = WHALE_DOC_FILE;
    else if (!strcmp(split, "line")) o->doc_split = WHALE_DOC_LINE;
    else if (!strcmp(split, "blank")) o->doc_split = WHALE_DOC_BLANK;
    else return cli_usage(cmd, "--doc-split expects file, line or blank, got \"%s\"", split);
    return 0;
}

static int data_prepare(int argc, char **argv) {
    const char *cmd = "data prepare";
    whale_data_prepare_opts o = whale_data_prepare_defaults();
    const char *val_docs = NULL, *shard_tokens = NULL, *seed = NULL, *split = NULL;
    long threads = o.threads;
    int quiet = 0;
    cli_args in = {0};
    const cli_opt table[] = {
        {"--tokenizer", CLI_STR, &o.tokenizer, 0, 0, NULL},
        {"--out", CLI_STR, &o.out_dir, 0, 0, NULL},
        {"--text-field", CLI_STR, &o.text_field, 0, 0, NULL},
        {"--val-fraction", CLI_DOUBLE, &o.val_fraction, 0, 1, NULL},
        {"--val-docs", CLI_STR, &val_docs, 0, 0, NULL},
        {"--shard-tokens", CLI_STR, &shard_tokens, 0, 0, NULL},
        {"--threads", CLI_LONG, &threads, 1, 1024, NULL},
        {"--seed", CLI_STR, &seed, 0, 0, NULL},
        {"--doc-split", CLI_STR, &split, 0, 0, NULL},
        {"--skip-bad-records", CLI_FLAG, &o.skip_bad_records, 0, 0, NULL},
        {"--overwrite", CLI_FLAG, &o.overwrite, 0, 0, NULL},
        {"-q|--quiet", CLI_FLAG, &quiet, 0, 0, NULL},
        {"FILE", CLI_ARGS, &in, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int status = cli_parse(cmd, prepare_help, argc, argv, table, NULL, NULL);
    if (!status && val_docs) status = parse_count(cmd, "--val-docs", val_docs, 0, &o.val_docs);
    if (!status && shard_tokens) status = parse_count(cmd, "--shard-tokens", shard_tokens, 1, &o.shard_tokens);
    if (!status) status = prepare_values(cmd, seed, split, &o);
    if (!status && (!o.tokenizer || !o.out_dir)) status = cli_usage(cmd, "--tokenizer DIR and --out DIR are required");
    if (!status && in.n == 0) status = cli_usage(cmd, "give at least one input file");
    if (status) {
        free(in.v);
        return status < 0 ? 0 : status;
    }
    o.threads = (int)threads;
    const char **inputs = in.v;
    const int n_in = in.n;
    o.inputs = inputs;
    o.n_inputs = n_in;
    progress_state ps = {isatty(2), 0};
    if (!quiet) {
        o.progress = on_progress;
        o.progress_user = &ps;
    }
    whale_data_prepare_stats st;
    whale_err err;
    whale_code rc = whale_data_prepare(&o, &st, &err);
    free(inputs);
    if (ps.printed && ps.tty) fputc('\n', stderr);
    if (rc) return cli_fail(&err);
    if (st.bad_records)
        fprintf(stderr, "data: skipped %" PRId64 " bad record%s; the first: %s\n", st.bad_records,
                st.bad_records == 1 ? "" : "s", st.first_bad);
    double mb = st.bytes / 1e6;
    printf("data: %" PRId64 " documents, %" PRId64 " tokens: train %" PRId64 " documents / %" PRId64
           " tokens in %d shard%s, val %" PRId64 " / %" PRId64 "; %" PRId64 " empty dropped; %.1f MB in %.1f s (%.1f MB/s) -> %s\n",
           st.documents[0] + st.documents[1], st.tokens[0] + st.tokens[1], st.documents[0], st.tokens[0], st.train_shards,
           st.train_shards == 1 ? "" : "s", st.documents[1], st.tokens[1], st.empty_documents, mb, st.seconds,
           st.seconds > 0 ? mb / st.seconds : 0.0, o.out_dir);
    return 0;
}

static int data_info(int argc, char **argv) {
    const char *cmd = "data info", *dir = NULL;
    long seq = 0;
    cli_args dirs = {0};
    const cli_opt table[] = {
        {"--seq", CLI_LONG, &seq, 1, 1 << 24, NULL},
        {"DIR", CLI_ARGS, &dirs, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int status = cli_parse(cmd, info_help, argc, argv, table, NULL, NULL);
    if (!status && dirs.n != 1) status = cli_usage(cmd, dirs.n ? "give one data directory" : "give the data directory");
    dir = dirs.n ? dirs.v[0] : NULL;
    free(dirs.v);
    if (status) return status < 0 ? 0 : status;
    static const char *const splits[] = {"train", "val"};
    for (int k = 0; k < 2; k++) {
        whale_dataset *d;
        whale_err err;
        if (whale_dataset_open(dir, splits[k], &d, &err)) return cli_fail(&err);
        if (k == 0)
            printf("%s: vocab %d, eos %d, tokenizer fingerprint %016" PRIx64 "\n", dir, whale_dataset_vocab(d),
                   (int)whale_dataset_eos(d), whale_dataset_fingerprint(d));
        printf("%-5s %" PRId64 " tokens, %" PRId64 " documents, %d shard%s", splits[k], whale_dataset_tokens(d),
               whale_dataset_documents(d), whale_dataset_num_shards(d), whale_dataset_num_shards(d) == 1 ? "" : "s");
        if (seq) printf(", %" PRId64 " windows of %ld", whale_dataset_num_windows(d, (int)seq), seq);
        putchar('\n');
        whale_dataset_free(d);
    }
    return 0;
}

int cmd_data(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs("usage: whale data prepare --tokenizer DIR --out DIR [options] INPUTS...   text to token shards\n"
              "       whale data info DIR [--seq S]                                      check and count shards\n"
              "Run 'whale data prepare --help' for the options.\n",
              argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "prepare")) return data_prepare(argc - 1, argv + 1);
    if (!strcmp(argv[1], "info")) return data_info(argc - 1, argv + 1);
    return cli_usage("data", "unknown subcommand \"%s\" (prepare or info)", argv[1]);
}
