/* whale tokenizer train: byte-level BPE training (src/io/bpe_train.h). */
#include "cli/cli.h"

#include "io/bpe_train.h"

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
    "  See docs/tokenizer-training.md.\n";

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

static int cmd_train(int argc, char **argv) {
    whale_bpe_train_opts opts;
    whale_bpe_train_defaults(&opts);
    const char *out = NULL;
    int have_vocab = 0, quiet = 0, n_files = 0, n_special = 0, status;
    const char **files = calloc((size_t)argc, sizeof *files);
    const char **special = calloc((size_t)argc, sizeof *special);
    if (!files || !special) {
        free(files);
        free(special);
        fprintf(stderr, "whale: out of memory\n");
        return 7;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(train_help, stdout);
            status = 0;
            goto done;
        }
        if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (a[0] == '-' && a[1] == '-' && !a[2]) { /* "--": the rest are files */
            while (++i < argc) files[n_files++] = argv[i];
            break;
        }
        if (a[0] != '-' || !a[1]) {
            files[n_files++] = a;
            continue;
        }
        const char *val = cli_value(argc, argv, &i);
        if (strcmp(a, "--vocab-size") && strcmp(a, "--out") && strcmp(a, "--special") && strcmp(a, "--min-frequency") &&
            strcmp(a, "--model-max-length")) {
            status = cli_usage("tokenizer train", "unknown option \"%s\"", a);
            goto done;
        }
        if (!val) {
            status = cli_usage("tokenizer train", "%s needs a value", a);
            goto done;
        }
        if (!strcmp(a, "--out")) {
            out = val;
        } else if (!strcmp(a, "--special")) {
            special[n_special++] = val;
        } else {
            if ((status = cli_int("tokenizer train", a, val, 1, 1L << 30, &v))) goto done;
            if (!strcmp(a, "--vocab-size")) opts.vocab_size = (int)v, have_vocab = 1;
            else if (!strcmp(a, "--min-frequency")) opts.min_frequency = (int)v;
            else opts.model_max_length = (int)v;
        }
    }
    if (!have_vocab || !out) {
        status = cli_usage("tokenizer train", "--vocab-size N and --out DIR are required");
        goto done;
    }
    if (!n_files) {
        status = cli_usage("tokenizer train", "no input files");
        goto done;
    }
    progress_state ps = {isatty(2)};
    opts.extra_special = special;
    opts.n_extra_special = n_special;
    if (!quiet) {
        opts.progress = on_progress;
        opts.progress_user = &ps;
    }
    whale_bpe_train_stats st;
    whale_err err;
    if (whale_bpe_train(&opts, files, n_files, out, &st, &err)) {
        if (!quiet && ps.tty) fputc('\n', stderr);
        status = cli_fail(&err);
        goto done;
    }
    if (st.vocab_size < opts.vocab_size)
        fprintf(stderr,
                "whale tokenizer train: warning: the text ran out of pairs seen %d+ times: vocab is %d, not %d\n",
                opts.min_frequency, st.vocab_size, opts.vocab_size);
    printf("wrote %s/tokenizer.json: vocab %d (%d merges), %.1f MB of text, %lld pre-tokens (%lld distinct); "
           "counting %.2f s, merging %.2f s\n",
           out, st.vocab_size, st.n_merges, (double)st.n_bytes / 1e6, (long long)st.n_words,
           (long long)st.n_unique_words, st.seconds_count, st.seconds_merge);
    status = 0;
done:
    free(files);
    free(special);
    return status;
}

int cmd_tokenizer(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(train_help, stdout);
        return 0;
    }
    if (argc < 2) return cli_usage("tokenizer", "expected a subcommand: train");
    return cli_usage("tokenizer", "unknown subcommand \"%s\" (expected: train)", argv[1]);
}
