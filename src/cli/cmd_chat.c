/* whale chat: an interactive conversation (like `swift infer`), or one
 * message per line from a pipe. The KV cache is kept between turns: only
 * the part of the re-rendered conversation the model has not seen is fed. */
#include "cli/cli.h"

#include "core/core.h"
#include "whale_chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    whale_detokenizer *detok;
    whale_err *err;
    int failed, n;
    int32_t *stop;
    int n_stop;
} chat_printer;

static int print_piece(void *user, int32_t id) {
    chat_printer *p = user;
    for (int i = 0; i < p->n_stop; i++)
        if (id == p->stop[i]) return 1; /* end of turn: not shown */
    const char *text;
    size_t len;
    if (whale_detokenizer_push(p->detok, id, &text, &len, p->err)) {
        p->failed = 1;
        return 1;
    }
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    p->n++;
    return 0;
}

/* One input message: a line, or with a line of """ everything up to the next such line. */
static char *read_message(FILE *in, int interactive, int *eof) {
    size_t cap = 256, n = 0;
    char *buf = malloc(cap), *line = NULL;
    size_t lcap = 0;
    int multi = 0;
    *eof = 0;
    if (!buf) return NULL;
    buf[0] = 0;
    for (;;) {
        if (interactive) fputs(multi ? "... " : "> ", stdout), fflush(stdout);
        ssize_t got = getline(&line, &lcap, in);
        if (got < 0) {
            *eof = n == 0;
            break;
        }
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!strcmp(line, "\"\"\"")) {
            if (multi) break;
            multi = 1;
            continue;
        }
        if (n + (size_t)got + 2 > cap) {
            while (n + (size_t)got + 2 > cap) cap *= 2;
            char *grown = realloc(buf, cap);
            if (!grown) break;
            buf = grown;
        }
        if (multi && n) buf[n++] = '\n';
        memcpy(buf + n, line, (size_t)got + 1);
        n += (size_t)got;
        if (!multi) break;
    }
    free(line);
    return buf;
}

int cmd_chat(int argc, char **argv) {
    const char *dir = NULL, *system = NULL, *tmpl = NULL;
    whale_dtype dtype = WHALE_F32;
    long n_new = 512, threads = 0;
    whale_sampler_params sp = cli_sampling_defaults();
    int seed_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: whale chat -m DIR [--system TEXT] [--chat-template deepseek|chatml|raw] [options]\n"
                 "  type a message and press enter; \"\"\" on a line starts and ends a multi-line message;\n"
                 "  'clear' forgets the conversation, 'exit' (or end of input) quits. From a pipe, each line\n"
                 "  is one message and each reply is printed on its own line.\n"
                 "  -n N (512) tokens per reply at most; sampling options as in 'whale generate'\n"
                 "  (--temperature 0.7 --top-k 50 --top-p 0.9 --min-p 0 --repeat-penalty 1 --seed S);\n"
                 "  --dtype fp32|bf16 (compute precision), --threads N");
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("chat", "%s needs a value", a);
        int bad = 0;
        if (cli_sampling_option("chat", a, v, &sp, &seed_given, &bad)) {
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--chat-template")) tmpl = v;
        else if (!strcmp(a, "--dtype")) bad = cli_dtype("chat", v, &dtype);
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) bad = cli_int("chat", a, v, 1, 1 << 24, &n_new);
        else if (!strcmp(a, "--threads")) bad = cli_int("chat", a, v, 1, 1024, &threads);
        else return cli_usage("chat", "unknown option \"%s\"", a);
        if (bad) return bad;
    }
    if (!dir) return cli_usage("chat", "-m DIR is required");
    whale_set_threads((int)threads);

    whale_err err;
    whale_model *m = NULL;
    whale_tokenizer *tok = NULL;
    whale_detokenizer *detok = NULL;
    whale_session *s = NULL;
    whale_sampler *sm = NULL;
    whale_chat_format fmt;
    whale_chat_message *msgs = NULL;
    int n_msgs = 0, status = 0, interactive = isatty(0) && isatty(1);
    int32_t *ctx = NULL, *ids = NULL, stop[16];
    if (whale_model_load_as(dir, dtype, &m, &err) ||
        cli_load_tokenizer(dir, m, &tok, &err) ||
        (tmpl ? whale_chat_format_from_name(tmpl, &fmt, &err) : whale_chat_detect(dir, &fmt, &err)) ||
        whale_detokenizer_new(tok, 1, &detok, &err))
        goto fail;
    int maxpos = whale_model_max_positions(m), n_stop = whale_chat_stop_ids(tok, fmt, stop, 8);
    if (n_stop > 8) n_stop = 8;
    n_stop += whale_model_eos_ids(m, stop + n_stop, 8);
    msgs = calloc(2048, sizeof *msgs);
    ctx = malloc(sizeof(int32_t) * (size_t)(maxpos + 1));
    if (!msgs || !ctx) {
        whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (whale_sampler_new(&sp, whale_model_vocab_size(m), &sm, &err) || whale_session_new(m, 1, maxpos, &s, &err))
        goto fail;
    if (system) msgs[n_msgs++] = (whale_chat_message){"system", strdup(system)};
    if (interactive) {
        whale_memory mm;
        whale_memory_of_model(m, &mm);
        whale_memory_add_session(&mm, s);
        whale_memory_print_line(&mm, stderr);
        fprintf(stderr, "whale chat: %s template, %d positions; 'clear' to forget, 'exit' to quit, \"\"\" for multi-line\n",
                whale_chat_format_name(fmt), maxpos);
    }
    int n_ctx = 0; /* ids the cache holds (plus the last sampled one) */
    for (;;) {
        int eof;
        char *text = read_message(stdin, interactive, &eof);
        if (!text || eof || !strcmp(text, "exit") || !strcmp(text, "quit")) {
            free(text);
            break;
        }
        if (!strcmp(text, "clear")) {
            free(text);
            for (int i = system ? 1 : 0; i < n_msgs; i++) free((char *)msgs[i].content);
            n_msgs = system ? 1 : 0;
            whale_session_reset(s);
            n_ctx = 0;
            if (interactive) fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (!*text) {
            free(text);
            continue;
        }
        if (n_msgs + 2 > 2048) {
            free(text);
            whale_errf(&err, WHALE_ERR_RANGE, "the conversation has too many turns; type clear");
            goto fail;
        }
        msgs[n_msgs++] = (whale_chat_message){"user", text};
        int n_ids;
        free(ids);
        ids = NULL;
        if (whale_chat_encode(tok, fmt, msgs, n_msgs, 1, &ids, NULL, &n_ids, &err)) goto fail;
        if (n_ids + 1 >= maxpos) {
            fprintf(stderr, "whale: the conversation (%d tokens) fills the model's %d positions; type clear\n", n_ids,
                    maxpos);
            free((char *)msgs[--n_msgs].content);
            continue;
        }
        /* keep the cache for the common prefix of what it holds and the new rendering */
        int common = 0;
        while (common < n_ctx && common < n_ids && ctx[common] == ids[common]) common++;
        whale_session_truncate(s, common < n_ids ? common : n_ids - 1);
        memcpy(ctx, ids, sizeof(int32_t) * (size_t)n_ids);
        n_ctx = n_ids;
        chat_printer pr = {detok, &err, 0, 0, stop, n_stop};
        whale_gen_stats st;
        int budget = (int)(n_new < maxpos - n_ctx ? n_new : maxpos - n_ctx);
        if (whale_generate(s, sm, ctx, &n_ctx, maxpos, budget, stop, n_stop, print_piece, &pr, &st, &err) || pr.failed)
            goto fail;
        const char *tail;
        size_t tl;
        if (whale_detokenizer_flush(detok, &tail, &tl, &err)) goto fail;
        fwrite(tail, 1, tl, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        /* the reply as text, for the next rendering */
        int n_reply = n_ctx - n_ids - (st.stopped ? 1 : 0);
        char *reply;
        size_t rl;
        if (whale_tokenizer_decode(tok, ctx + n_ids, n_reply, 1, &reply, &rl, &err)) goto fail;
        msgs[n_msgs++] = (whale_chat_message){"assistant", reply};
        fprintf(stderr, "[%d tokens in %.2f s, %.1f tokens/s; prompt %d new tokens]\n", st.generated, st.gen_seconds,
                st.generated > 1 ? (st.generated - 1) / st.gen_seconds : 0.0, st.prompt_tokens);
    }
    goto out;
fail:
    status = cli_fail(&err);
out:
    for (int i = 0; i < n_msgs; i++) free((char *)msgs[i].content);
    free(msgs);
    free(ctx);
    free(ids);
    whale_sampler_free(sm);
    whale_session_free(s);
    whale_detokenizer_free(detok);
    whale_tokenizer_free(tok);
    whale_model_free(m);
    return status;
}
