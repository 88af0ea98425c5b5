/* whale tokenizer train: byte-level BPE training (src/io/bpe_train.h). */
#include "cli.h"

#include "whale_bpe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char train_help[] =
    "usage: whale tokenizer train --vocab-size N --out DIR [options] FILE...\n"
    "  trains a byte-level BPE tokenizer with DeepSeek-V3's pre-tokenizer and writes\n"
    "  DIR/tokenizer.json and DIR/tokenizer_config.json (Hugging Face format).\n"
    "  FILE: plain text (the file is one document) or .jsonl (one JSON object per\n"
    "  line with a string \"text\"). Invalid UTF-8 becomes U+FFFD.\n"
    "\n"
    "  --vocab-size N          all ids: 3 specials + 256 bytes + merges + 2 chat markers\n"
    "                          + extra specials (at least 261 + extras)\n"
    "  --out DIR               output directory (created if missing)\n"
    "  --special TOKEN         one more special token, after <｜Assistant｜> (repeatable)\n"
    "  --min-frequency N       never merge a pair seen fewer than N times (default 2)\n"
    "  --model-max-length N    tokenizer_config.json model_max_length (default 2048)\n"
    "  --quiet                 no progress on stderr\n"
    "\n"
    "  ids: 0 <｜begin▁of▁sentence｜>, 1 <｜end▁of▁sentence｜>, 2 <｜▁pad▁｜>, 3-258 bytes,\n"
    "  then merges, then <｜User｜>, <｜Assistant｜> and the --special tokens.\n"
    "  See docs/tokenizer-training.md.";

typedef struct {
    int tty; /* stderr is a terminal: progress overwrites itself */
} progress_state;

static void on_progress(void *user, const char *stage, int64_t done, int64_t total) {
    progress_state *ps = user;
    if (!strcmp(stage, "read")) {
        fprintf(stderr, "whale tokenizer train: read %.1f MB%s", (double)done / 1e6, ps->tty ? "\r" : "\n");
    } else if (ps->tty || done == total) {
        fprintf(stderr, "whale tokenizer train: %lld / %lld merges%s", (long long)done, (long long)total,
                ps->tty && done < total ? "\r" : "\n");
    }
    fflush(stderr);
}

/* Train on the files into out and print what was made. */
static int train_files(whale_bpe_train_opts *opts, const cli_args *files, const char *out, int quiet) {
    progress_state ps = {isatty(2)};
    if (!quiet) {
        opts->progress = on_progress;
        opts->progress_user = &ps;
    }
    whale_bpe_train_stats st;
    whale_err err;
    if (whale_bpe_train(opts, files->v, files->n, out, &st, &err)) {
        if (!quiet && ps.tty) fputc('\n', stderr);
        return cli_fail(&err);
    }
    if (st.vocab_size < opts->vocab_size)
        fprintf(stderr,
                "whale tokenizer train: warning: the text ran out of pairs seen %d+ times: vocab is %d, not %d\n",
                opts->min_frequency, st.vocab_size, opts->vocab_size);
    printf("wrote %s/tokenizer.json: vocab %d (%d merges), %.1f MB of text, %lld pre-tokens (%lld distinct); "
           "counting %.2f s, merging %.2f s\n",
           out, st.vocab_size, st.n_merges, (double)st.n_bytes / 1e6, (long long)st.n_words,
           (long long)st.n_unique_words, st.seconds_count, st.seconds_merge);
    return 0;
}

static int cmd_train(int argc, char **argv) {
    whale_bpe_train_opts opts;
    whale_bpe_train_defaults(&opts);
    const char *out = NULL;
    long vocab = 0, min_freq = opts.min_frequency, max_len = opts.model_max_length;
    int quiet = 0;
    cli_list special = {0};
    cli_args files = {0};
    const cli_opt table[] = {
        {"--vocab-size", CLI_LONG, &vocab, 1, 1L << 30, NULL},
        {"--out", CLI_STR, &out, 0, 0, NULL},
        {"--special", CLI_EACH, &special, 0, 0, NULL},
        {"--min-frequency", CLI_LONG, &min_freq, 1, 1L << 30, NULL},
        {"--model-max-length", CLI_LONG, &max_len, 1, 1L << 30, NULL},
        {"--quiet", CLI_SWITCH, &quiet, 0, 0, NULL},
        {"FILE", CLI_ARGS, &files, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int status = cli_parse("tokenizer train", train_help, argc, argv, table, NULL, NULL);
    if (status) status = status < 0 ? 0 : status;
    else if (!vocab || !out) status = cli_usage("tokenizer train", "--vocab-size N and --out DIR are required");
    else if (!files.n) status = cli_usage("tokenizer train", "no input files");
    else {
        opts.vocab_size = (int)vocab, opts.min_frequency = (int)min_freq, opts.model_max_length = (int)max_len;
        opts.extra_special = special.v, opts.n_extra_special = special.n;
        status = train_files(&opts, &files, out, quiet);
    }
    free(files.v);
    return status;
}

int cmd_tokenizer(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        puts(train_help);
        return 0;
    }
    if (argc < 2) return cli_usage("tokenizer", "expected a subcommand: train");
    return cli_usage("tokenizer", "unknown subcommand \"%s\" (expected: train)", argv[1]);
}
