/* whale: the nanowhale.c command-line program. */
#include "cli.h"

#include "whale_bench.h"
#include "whale_util.h"
#include "whale_dist.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: whale COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  info      -m DIR                        architecture, parameter counts, memory\n"
    "  init      --preset NAME|FILE.json --out DIR [--seed N]   random weights, HF layout\n"
    "  score     -m DIR --ids FILE [--logits-out FILE]          loss / perplexity of token ids\n"
    "  generate  -m DIR --ids 0,15,27 [-n N] [sampling options] generate token ids\n"
    "  bench     (-m DIR | --preset NAME) --what forward|prefill|decode   speed\n"
    "  chat      -m DIR [--system TEXT]                            interactive chat (or from a pipe)\n"
    "  chat-eval (-m DIR | --adapters CKPT) --data EVAL.jsonl ...   score identity answers (self-cognition)\n"
    "  chat-template -m DIR --messages FILE.json [--ids]          render a conversation (apply_chat_template)\n"
    "  grad      -m DIR --ids FILE --out GRADS.safetensors         gradient of the mean loss\n"
    "  tokenizer train --vocab-size N --out DIR FILES...           train a byte-level BPE tokenizer\n"
    "  data prepare --tokenizer DIR --out DIR FILES...             text to token shards\n"
    "  train     --init PRESET|DIR --data DIR --out DIR            train (or resume) a model\n"
    "  sft       -m DIR --data F.jsonl [--train-type lora|full]    fine-tune on chat data (LoRA or full)\n"
    "  eval      -m DIR --data DIR                                 validation loss and perplexity\n"
    "  export    -m DIR --dtype bf16|fp16|fp32 --out DIR           checkpoint in another dtype\n"
    "  precision-report -m DIR (--ids FILE | --data DIR) [--steps N]  fp32, bf16, fp16, int8 side by side\n"
    "  plot      RUN... --out loss.svg                             loss curves as SVG\n"
    "  tokenize  -m DIR \"text\" | --file F [--show]                text to token ids\n"
    "  detokenize -m DIR --ids 1,2,3 [--skip-special]                token ids to text\n"
    "  diagnose  -m DIR (--ids FILE | --text TEXT) [--json OUT]     numerics: ranges, underflow, routing margins\n"
    "  memory    --config PRESET|DIR --dtype D [--train full|lora]  memory a run needs, by category\n"
    "  serve     -m DIR [--port 8080] [--parallel N] [--api-key KEY]   OpenAI-compatible HTTP server\n"
    "\n"
    "Run 'whale COMMAND --help' for a command's options. Exit status: 0 ok, 2 usage,\n"
    "3 i/o, 4 malformed input, 5 out of range, 6 unsupported, 7 out of memory, 1 other.\n";

/* Launched by mpirun with several ranks: train and sft run as one job
 * (docs/distributed.md). Rank 0 speaks for the job: the other ranks write
 * nothing to stdout, and their stderr is held back; a rank that fails ends
 * the whole job (the others would wait for it), and another rank's message
 * is shown only when rank 0 has not ended the job first with its own (every
 * rank fails the same way on a bad option or input). */
static int run_on_ranks(int (*fn)(int, char **), const char *cmd, int argc, char **argv) {
    whale_err err;
    int quiet = whale_dist_launched_rank() != 0, saved = -1;
    if (strcmp(cmd, "train") && strcmp(cmd, "sft")) {
        if (!quiet) fprintf(stderr, "whale %s: runs in one process; only train and sft run on several ranks\n", cmd);
        return 2;
    }
    if (whale_dist_init(&err)) return quiet ? whale_exit_status(err.code) : cli_fail(&err);
    FILE *held = quiet ? tmpfile() : NULL;
    if (held && (saved = dup(2)) >= 0) dup2(fileno(held), 2);
    if (quiet && !freopen("/dev/null", "w", stdout)) whale_dist_abort(3);
    int status = fn(argc, argv);
    if (status && saved >= 0) { /* let rank 0 speak first */
        nanosleep(&(struct timespec){3, 0}, NULL); /* rank 0's MPI_Abort ends the job first */
        fflush(stderr);
        rewind(held);
        char line[4096];
        FILE *out = fdopen(saved, "w");
        while (out && fgets(line, sizeof line, held)) fprintf(out, "rank %d: %s", whale_dist_rank(), line);
        if (out) fflush(out);
    }
    if (status) whale_dist_abort(status);
    whale_dist_finalize();
    return status;
}

int main(int argc, char **argv) {
    if (argc < 2) { /* every command on stdout, as --help lists them; a one-line usage error */
        fputs(usage_text, stdout);
        fprintf(stderr, "whale: usage: whale COMMAND [options] (no command given; the commands are listed above)\n");
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    const char *cmd = argv[1];
    whale_err err;
    if (whale_isa_init(&err)) return cli_fail(&err); /* a WHALE_ISA that names no tier */
    if (whale_par_init(&err)) return cli_fail(&err);
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"info", cmd_info}, {"init", cmd_init}, {"score", cmd_score}, {"generate", cmd_generate}, {"chat", cmd_chat}, {"bench", cmd_bench},
                  {"tokenize", cmd_tokenize}, {"grad", cmd_grad}, {"train", cmd_train_model}, {"sft", cmd_sft}, {"chat-eval", cmd_chat_eval}, {"chat-template", cmd_chat_template}, {"eval", cmd_eval}, {"export", cmd_export},
                  {"precision-report", cmd_precision_report},
                  {"data", cmd_data}, {"plot", cmd_plot}, {"tokenizer", cmd_tokenizer}, {"detokenize", cmd_detokenize}, {"diagnose", cmd_diagnose}, {"memory", cmd_memory}, {"serve", cmd_serve}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name))
            return whale_dist_launched_size() > 1 ? run_on_ranks(cmds[i].fn, cmd, argc - 1, argv + 1)
                                                  : cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "whale: unknown command \"%s\" (see 'whale --help')\n", cmd);
    return 2;
}
