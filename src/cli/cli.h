/* Command-line front end: shared helpers for the subcommands. */
#ifndef WHALE_CLI_H
#define WHALE_CLI_H

#include "whale.h"
#include "whale_data.h" /* whale_read_ids_file */

/* Report an error (one line on stderr, "whale: <message>") and return the
 * exit status for it. */
int cli_fail(const whale_err *err);
/* Usage error: prints "whale CMD: message" + hint and returns 2. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Option value parsing; each returns 0 or a usage error status. */
int cli_int(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out);
int cli_float(const char *cmd, const char *opt, const char *val, double lo, double hi, double *out);
/* argv[*i] is an option that takes a value: returns it and advances *i, or NULL. */
const char *cli_value(int argc, char **argv, int *i);
/* Option a is opt, with "-" and "_" alike after the leading "--" (ms-swift
 * and Hugging Face spell --merge_lora what whale spells --merge-lora). */
int cli_opt_is(const char *a, const char *opt);
/* A boolean option: if argv[*i] is opt, *flag becomes 1, or the value that
 * follows when it is true/false/1/0 (then consumed), and 1 is returned;
 * otherwise 0. */
int cli_bool_option(int argc, char **argv, int *i, const char *opt, int *flag);

/* One option table per command, one parser. An entry names its spellings
 * ("-n|--max-new-tokens|--max-tokens"; after "--", "-" and "_" are alike,
 * so ms-swift's --max_new_tokens matches) and where its value goes:
 *   CLI_FLAG    int *: 1, or the true/false/1/0 that follows
 *   CLI_SWITCH  int *: 1 (takes no value: what follows is never consumed)
 *   CLI_STR     const char **
 *   CLI_LONG    long *, in [lo, hi]        CLI_DOUBLE  double *, in [lo, hi]
 *   CLI_DTYPE   whale_dtype * (fp32|bf16|fp16|int8 and their spellings)
 *   CLI_PAIR    const char *[2]: one or two values (Chinese, English)
 *   CLI_LIST    cli_list *: one or more values, up to the next option; the
 *               option may be repeated, each adding to the list
 *   CLI_EACH    cli_list *: one value; repeated, each adds one to the list
 *   CLI_COUNT   long *, in [lo, hi]: the value that follows unless the next
 *               argument is an option (or there is none); then note's number
 *   CLI_NOTE    takes a value that changes nothing here: note says why
 *               (printed once as "CMD: note: ...")
 *   CLI_ARGS    cli_args *: the arguments that are not options, in order
 *               (names is what they are, e.g. "FILE"; without such an
 *               entry an argument that is not an option is refused; with
 *               one, everything after "--" is an argument) */
typedef enum {
    CLI_FLAG,
    CLI_SWITCH,
    CLI_STR,
    CLI_LONG,
    CLI_DOUBLE,
    CLI_DTYPE,
    CLI_PAIR,
    CLI_LIST,
    CLI_EACH,
    CLI_COUNT,
    CLI_NOTE,
    CLI_ARGS
} cli_kind;
#define CLI_LIST_MAX 256
typedef struct {
    const char *v[CLI_LIST_MAX];
    int n;
} cli_list;
typedef struct {
    const char **v; /* malloc'd by cli_parse (room for every argument): free it */
    int n;
} cli_args;
typedef struct {
    const char *names;
    cli_kind kind;
    void *dst;
    double lo, hi;
    const char *note;
} cli_opt;

/* Parse argv[1..argc) against opts (terminated by an entry with NULL
 * names); with sp, the sampling options (cli_sampling_option) too.
 * -h/--help prints help and returns -1; an unknown option, a missing or
 * malformed value returns the usage status (2); 0 when all is parsed. */
int cli_parse(const char *cmd, const char *help, int argc, char **argv, const cli_opt *opts,
              whale_sampler_params *sp, unsigned *given);

/* Sampling options shared by generate and chat. Defaults: temperature 0.7,
 * top-k 50, top-p 0.9 (the original nanowhale chat settings with Hugging
 * Face's top-k), seed from the clock unless --seed is given. */
whale_sampler_params cli_sampling_defaults(void);
/* If option a (value v) is a sampling option, parse it into sp, mark it in
 * *given (CLI_GIVEN_*) and return 1 (*bad is then a usage status or 0);
 * otherwise return 0. */
enum {
    CLI_GIVEN_TEMPERATURE = 1,
    CLI_GIVEN_TOP_K = 2,
    CLI_GIVEN_TOP_P = 4,
    CLI_GIVEN_REPEAT_PENALTY = 8
};
int cli_sampling_option(const char *cmd, const char *a, const char *v, whale_sampler_params *sp, unsigned *given,
                        int *bad);
/* The model folder's generation_config.json (if any) sets the sampling
 * options the command line did not (as ms-swift and transformers do);
 * verbose (a command name, or NULL) prints what it took as "CMD: ...". */
whale_code cli_generation_config(const char *dir, whale_sampler_params *sp, unsigned given, const char *verbose,
                                 whale_err *err);

/* --dtype fp32|bf16 (compute precision of a model run). */
int cli_dtype(const char *cmd, const char *v, whale_dtype *dt);
/* "fp32", "bf16", "fp16", "int8" */
const char *cli_dtype_name(whale_dtype dt);

/* "whale CMD ARGS..." as typed, each argument shell-quoted when needed
 * (argv[0] is the command name), cut to cap. */
void cli_command_line(int argc, char **argv, char *out, size_t cap);

/* Parse "0,15,27" into ids (malloc'd). */
int cli_parse_id_list(const char *cmd, const char *text, int32_t **ids, int *n);

/* The model folder's tokenizer, checked against the model's vocabulary. */
whale_code cli_load_tokenizer(const char *dir, const whale_model *m, whale_tokenizer **tok, whale_err *err);

/* How a command runs a model: dtype CLI_DTYPE_AUTO takes the checkpoint's
 * (bf16 / fp16 when its config's torch_dtype or dtype says so, else fp32;
 * set to what was chosen); seq is the session's positions (0: the
 * model's), for the memory estimate (whale memory's) that is checked
 * before loading against memory_limit bytes (0: the machine's memory). */
#define CLI_DTYPE_AUTO ((whale_dtype)WHALE_DTYPE_COUNT)
whale_dtype cli_checkpoint_dtype(const char *dir);
typedef struct {
    const char *cmd; /* names the command in the note on the chosen dtype (NULL: no note) */
    whale_dtype dtype;
    int seq;
    int ctx_option; /* the command has --ctx-size (named in the refusal) */
    double memory_limit;
    size_t estimate; /* set: the estimate's total */
} cli_run;

/* A model to run: dir with a LoRA checkpoint's adapters applied when
 * adapters is not NULL (dir may then be NULL: the checkpoint's args.json
 * names the base). *base_dir (malloc'd) is the folder the model came from
 * (its tokenizer and template); *tmpl and *system (malloc'd or NULL, pass
 * NULL to skip) what the fine-tuning used. */
whale_code cli_load_model(const char *dir, const char *adapters, cli_run *run, whale_model **m, char **base_dir,
                          char **tmpl, char **system, whale_err *err);

int cmd_info(int argc, char **argv);
int cmd_memory(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_grad(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_chat_eval(int argc, char **argv);
int cmd_train_model(int argc, char **argv);
int cmd_sft(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_precision_report(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_diagnose(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* --nan-check: attach a collector (whale_diag.h) that records the first
 * non-finite traced tensor as s's trace callback; free it with
 * whale_diag_free after the session. */
struct whale_diag;
whale_code cli_nan_check_attach(whale_session *s, struct whale_diag **out, whale_err *err);

#endif
