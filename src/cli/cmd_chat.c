/* whale chat: an interactive conversation (like `swift infer`), or one
 * message per line from a pipe. The KV cache is kept between turns: only
 * the part of the re-rendered conversation the model has not seen is fed. */
#include "cli.h"

#include "whale_util.h"
#include "whale_chat.h"
#include "whale_sft.h"

#include <cjson/cJSON.h>
#include <errno.h>

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
    int show; /* stream the reply as it is made */
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
    if (p->show) fwrite(text, 1, len, stdout), fflush(stdout);
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

/* ------------------------------------------------------------ the conversation */

/* The messages so far, as the template gets them (OpenAI's form). */
typedef struct {
    cJSON *msgs;
    const cJSON *tools; /* --tools, or NULL */
    int keep;           /* messages that 'clear' keeps (the system prompt) */
} convo;

static whale_code convo_push(convo *c, const char *role, const char *content, whale_err *err) {
    if (cJSON_GetArraySize(c->msgs) >= 4096)
        return whale_errf(err, WHALE_ERR_RANGE, "the conversation has too many turns; type clear");
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddStringToObject(o, "role", role) || !cJSON_AddStringToObject(o, "content", content) ||
        !cJSON_AddItemToArray(c->msgs, o)) {
        cJSON_Delete(o);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    return WHALE_OK;
}

static void convo_drop_last(convo *c) { cJSON_DeleteItemFromArray(c->msgs, cJSON_GetArraySize(c->msgs) - 1); }

static void convo_clear(convo *c) {
    while (cJSON_GetArraySize(c->msgs) > c->keep) convo_drop_last(c);
}

/* "prompt ids: [1, 2, 3]" on one line. */
static void print_ids(FILE *f, const int32_t *ids, int n) {
    fputs("prompt ids: [", f);
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", (int)ids[i]);
    fputs("]\n", f);
}

/* The conversation rendered with the generation prompt, as ids. */
static whale_code convo_ids(const convo *c, whale_tokenizer *tok, const whale_chat_template *tpl, int32_t **ids,
                            int *n_ids, whale_err *err) {
    char *text = NULL;
    size_t len = 0;
    whale_code rc = whale_chat_template_spans_json(tpl, c->msgs, c->tools, 1, whale_tokenizer_role_token(tok, WHALE_TOKEN_BOS),
                                                   &text, &len, NULL, NULL, err);
    if (!rc) rc = whale_tokenizer_encode(tok, text, len, 0, ids, n_ids, err);
    free(text);
    return rc;
}

/* The reply joins the conversation; with --tools its tool calls are parsed
 * (OpenAI's tool_calls) and printed as one JSON line. */
static whale_code convo_reply(convo *c, const char *reply, whale_err *err) {
    if (!c->tools) return convo_push(c, "assistant", reply, err);
    cJSON *m;
    whale_code rc = whale_chat_parse_tool_calls(reply, strlen(reply), &m, err);
    if (rc) return rc;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (calls) {
        char *line = cJSON_PrintUnformatted(calls);
        if (line) printf("tool_calls: %s\n", line);
        free(line);
    }
    if (!cJSON_AddItemToArray(c->msgs, m)) {
        cJSON_Delete(m);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ chat */

typedef struct {
    const char *dir, *system, *tmpl, *adapters, *tools;
    whale_dtype dtype;
    long n_new, threads, ctx;
    double memory_limit; /* GiB */
    int stream, multi_turn, verbose_prompt;
    whale_sampler_params sp;
    unsigned given;
} chat_opts;

static const char chat_help[] =
    "usage: whale chat (-m DIR | --adapters CKPT | both) [--system TEXT] [--chat-template deepseek|chatml|raw|FILE.jinja]\n"
    "                  [--tools FILE.json]\n"
    "  --adapters CKPT: a LoRA checkpoint of whale sft; its args.json gives the base model and\n"
    "  the template and system prompt it was trained with (flags override them)\n"
    "  type a message and press enter; \"\"\" on a line starts and ends a multi-line message;\n"
    "  'clear' forgets the conversation, 'exit' (or end of input) quits. From a pipe, each line\n"
    "  is one message, answered on its own line in a fresh conversation (--multi-turn true keeps one)\n"
    "  --tools FILE.json: tool definitions for the template; tool calls in a reply are printed\n"
    "  as a line 'tool_calls: [...]' (OpenAI's form), and a message '/tool TEXT' answers them\n"
    "  as a tool result.\n"
    "  -n N (512; alias --max-new-tokens) tokens per reply at most; sampling options as in\n"
    "  'whale generate' (--temperature 0.7 --top-k 50 --top-p 0.9 --min-p 0 --repeat-penalty 1\n"
    "  --seed S; generation_config.json's values replace the defaults, not what is given);\n"
    "  --ctx-size N (alias -c, --max-model-len): positions of the session (default: the model's)\n"
    "  --multi-turn [true|false] (true on a terminal, false from a pipe): false answers each message\n"
    "  in a fresh conversation (the system prompt stays), true keeps one growing conversation\n"
    "  --stream [true|false] (true): false prints each reply when it is complete\n"
    "  --verbose-prompt: print each turn's prompt ids (the rendered conversation) to stderr\n"
    "  --dtype fp32|bf16|fp16|int8 (compute precision; default: the checkpoint's torch_dtype),\n"
    "  --memory-limit GIB (refuse up front a session estimated to need more), --threads N; swift infer's spellings\n"
    "  (--max_new_tokens, --top_k, --repetition_penalty, ...) work too, --infer_backend is ignored";

static int chat_parse(int argc, char **argv, chat_opts *o) {
    const cli_opt opts[] = {
        {"-m|--model", CLI_STR, &o->dir, 0, 0, NULL},
        {"--adapters", CLI_STR, &o->adapters, 0, 0, NULL},
        {"--system", CLI_STR, &o->system, 0, 0, NULL},
        {"--chat-template|--template", CLI_STR, &o->tmpl, 0, 0, NULL},
        {"--tools", CLI_STR, &o->tools, 0, 0, NULL},
        {"--dtype|--torch-dtype", CLI_DTYPE, &o->dtype, 0, 0, NULL},
        {"-n|--max-new-tokens", CLI_LONG, &o->n_new, 1, 1 << 24, NULL},
        {"--threads", CLI_LONG, &o->threads, 1, 1024, NULL},
        {"-c|--ctx-size|--max-model-len", CLI_LONG, &o->ctx, 16, 1 << 24, NULL},
        {"--memory-limit", CLI_DOUBLE, &o->memory_limit, 1e-6, 1e6, NULL},
        {"--stream", CLI_FLAG, &o->stream, 0, 0, NULL},
        {"--multi-turn", CLI_FLAG, &o->multi_turn, 0, 0, NULL},
        {"--verbose-prompt", CLI_FLAG, &o->verbose_prompt, 0, 0, NULL},
        {"--infer-backend", CLI_NOTE, NULL, 0, 0, "whale runs its own engine; the option is ignored"},
        {NULL, 0, NULL, 0, 0, NULL}};
    int st = cli_parse("chat", chat_help, argc, argv, opts, &o->sp, &o->given);
    if (st) return st;
    if (!o->dir && !o->adapters) return cli_usage("chat", "-m DIR or --adapters CKPT is required");
    return 0;
}

static whale_code read_tools(const char *path, cJSON **out, whale_err *err) {
    char *buf;
    size_t n;
    whale_code rc = whale_read_file(path, &buf, &n, err);
    if (rc) return rc;
    *out = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!cJSON_IsArray(*out)) return whale_errf(err, WHALE_ERR_FORMAT, "%s: expected a JSON array of tool definitions", path);
    return WHALE_OK;
}

/* A conversation: its options, the model and session it runs, and the ids
 * the KV cache holds. */
typedef struct {
    chat_opts o;
    const char *dir, *system, *tmpl; /* the base model's directory and what is in use */
    char *base, *run_tmpl, *run_system;
    whale_sampler_params sp;
    whale_model *m;
    whale_tokenizer *tok;
    whale_detokenizer *detok;
    whale_session *s;
    whale_sampler *sm;
    whale_chat_template *tpl;
    cJSON *tools;
    convo cv;
    int interactive, maxpos, n_stop;
    int n_ctx; /* ids the cache holds (plus the last sampled one) */
    int32_t *ctx, *ids, stop[16];
} chat_t;

/* The tools, the model (with its adapters), its generation config,
 * tokenizer and template. */
static whale_code chat_load(chat_t *c, whale_err *err) {
    whale_code rc;
    if (!(c->cv.msgs = cJSON_CreateArray())) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if (c->o.tools && (rc = read_tools(c->o.tools, &c->tools, err))) return rc;
    c->cv.tools = c->tools;
    cli_run run = {"chat", c->o.dtype, (int)c->o.ctx, 1, c->o.memory_limit * 1073741824.0, 0};
    if ((rc = cli_load_model(c->o.dir, c->o.adapters, &run, &c->m, &c->base, &c->run_tmpl, &c->run_system, err)))
        return rc;
    c->dir = c->base;
    if ((rc = cli_generation_config(c->dir, &c->sp, c->o.given, c->interactive ? "chat" : NULL, err))) return rc;
    if (!c->tmpl) c->tmpl = c->run_tmpl;
    if (!c->system) c->system = c->run_system;
    if ((rc = cli_load_tokenizer(c->dir, c->m, &c->tok, err)) ||
        (rc = whale_chat_template_load(c->dir, c->tmpl, &c->tpl, err)) ||
        (rc = whale_detokenizer_new(c->tok, 1, &c->detok, err)))
        return rc;
    if (whale_chat_template_notice(c->tpl)) fprintf(stderr, "chat: %s\n", whale_chat_template_notice(c->tpl));
    return WHALE_OK;
}

/* The positions and stop ids, the sampler and session, the system prompt. */
static whale_code chat_prepare(chat_t *c, whale_err *err) {
    whale_code rc;
    c->maxpos = whale_model_max_positions(c->m);
    c->n_stop = whale_chat_template_stop_ids(c->tok, c->tpl, c->stop, 8);
    if (c->o.ctx > c->maxpos)
        fprintf(stderr, "chat: note: --ctx-size %ld is beyond the model's %d positions\n", c->o.ctx, c->maxpos);
    else if (c->o.ctx) c->maxpos = (int)c->o.ctx;
    if (c->n_stop > 8) c->n_stop = 8;
    c->n_stop += whale_model_eos_ids(c->m, c->stop + c->n_stop, 8);
    if (!(c->ctx = malloc(sizeof(int32_t) * (size_t)(c->maxpos + 1))))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if ((rc = whale_sampler_new(&c->sp, whale_model_vocab_size(c->m), &c->sm, err)) ||
        (rc = whale_session_new(c->m, 1, c->maxpos, &c->s, err)))
        return rc;
    if (c->system && (rc = convo_push(&c->cv, "system", c->system, err))) return rc;
    c->cv.keep = cJSON_GetArraySize(c->cv.msgs);
    if (c->interactive) {
        whale_memory mm;
        whale_memory_of_model(c->m, &mm);
        whale_memory_add_session(&mm, c->s);
        whale_memory_print_line(&mm, stderr);
        fprintf(stderr, "chat: %s template, %d positions (--ctx-size N to change); 'clear' to forget, 'exit' to quit, "
                "\"\"\" for multi-line\n", whale_chat_template_name(c->tpl), c->maxpos);
    }
    return WHALE_OK;
}

/* The message joins the conversation, rendered as c->ids; *skip when it
 * does not fit (the message is dropped again). */
static whale_code chat_prompt(chat_t *c, const char *text, int *n_ids, int *skip, whale_err *err) {
    int is_tool = c->tools && !strncmp(text, "/tool ", 6);
    if (!c->o.multi_turn && !is_tool) convo_clear(&c->cv); /* each message on its own */
    whale_code rc = convo_push(&c->cv, is_tool ? "tool" : "user", is_tool ? text + 6 : text, err);
    if (rc) return rc;
    free(c->ids);
    c->ids = NULL;
    if ((rc = convo_ids(&c->cv, c->tok, c->tpl, &c->ids, n_ids, err))) return rc;
    if (c->o.verbose_prompt) print_ids(stderr, c->ids, *n_ids);
    *skip = *n_ids + 1 >= c->maxpos;
    if (*skip) {
        fprintf(stderr, "chat: the conversation (%d tokens) fills the model's %d positions; type clear\n", *n_ids,
                c->maxpos);
        convo_drop_last(&c->cv);
    }
    return WHALE_OK;
}

/* The reply to the rendered conversation of n_ids ids: generated (the cache
 * kept for the prefix it shares with what it holds), printed, and added to
 * the conversation. */
static whale_code chat_reply(chat_t *c, int n_ids, whale_err *err) {
    int common = 0;
    while (common < c->n_ctx && common < n_ids && c->ctx[common] == c->ids[common]) common++;
    whale_session_truncate(c->s, common < n_ids ? common : n_ids - 1);
    memcpy(c->ctx, c->ids, sizeof(int32_t) * (size_t)n_ids);
    c->n_ctx = n_ids;
    chat_printer pr = {c->detok, err, 0, 0, c->stop, c->n_stop, c->o.stream};
    whale_gen_stats st;
    int budget = (int)(c->o.n_new < c->maxpos - c->n_ctx ? c->o.n_new : c->maxpos - c->n_ctx);
    whale_code rc = whale_generate(c->s, c->sm, c->ctx, &c->n_ctx, c->maxpos, budget, c->stop, c->n_stop, print_piece,
                                   &pr, &st, err);
    if (rc || pr.failed) return rc ? rc : err->code;
    const char *tail;
    size_t tl;
    if ((rc = whale_detokenizer_flush(c->detok, &tail, &tl, err))) return rc;
    /* the reply as text, for the next rendering */
    int n_reply = c->n_ctx - n_ids - (st.stopped ? 1 : 0);
    char *reply;
    size_t rl;
    if ((rc = whale_tokenizer_decode(c->tok, c->ctx + n_ids, n_reply, 1, &reply, &rl, err))) return rc;
    if (c->o.stream) fwrite(tail, 1, tl, stdout);
    else fwrite(reply, 1, rl, stdout);
    fputc('\n', stdout);
    rc = convo_reply(&c->cv, reply, err);
    free(reply);
    fflush(stdout);
    if (rc) return rc;
    fprintf(stderr, "[%d tokens in %.2f s, %.1f tokens/s; prompt %d new tokens]\n", st.generated, st.gen_seconds,
            st.generated > 1 ? (st.generated - 1) / st.gen_seconds : 0.0, st.prompt_tokens);
    return WHALE_OK;
}

/* Messages read and answered until 'exit' or the end of input. */
static whale_code chat_loop(chat_t *c, whale_err *err) {
    for (;;) {
        int eof, n_ids = 0, skip = 0;
        char *text = read_message(stdin, c->interactive, &eof);
        if (!text || eof || !strcmp(text, "exit") || !strcmp(text, "quit")) {
            free(text);
            return WHALE_OK;
        }
        if (!strcmp(text, "clear")) {
            convo_clear(&c->cv);
            whale_session_reset(c->s);
            c->n_ctx = 0;
            if (c->interactive) fprintf(stderr, "(conversation cleared)\n");
        }
        whale_code rc = WHALE_OK;
        if (*text && strcmp(text, "clear")) {
            rc = chat_prompt(c, text, &n_ids, &skip, err);
            if (!rc && !skip) rc = chat_reply(c, n_ids, err);
        }
        free(text);
        if (rc) return rc;
    }
}

static void chat_free(chat_t *c) {
    cJSON_Delete(c->cv.msgs);
    cJSON_Delete(c->tools);
    free(c->ctx);
    free(c->ids);
    whale_sampler_free(c->sm);
    whale_session_free(c->s);
    whale_detokenizer_free(c->detok);
    whale_chat_template_free(c->tpl);
    whale_tokenizer_free(c->tok);
    whale_model_free(c->m);
    free(c->base);
    free(c->run_tmpl);
    free(c->run_system);
}

int cmd_chat(int argc, char **argv) {
    chat_t c = {.o = {.dtype = CLI_DTYPE_AUTO, .n_new = 512, .stream = 1, .multi_turn = -1, .sp = cli_sampling_defaults()}};
    int bad = chat_parse(argc, argv, &c.o);
    if (bad) return bad < 0 ? 0 : bad;
    whale_set_threads((int)c.o.threads);
    c.system = c.o.system, c.tmpl = c.o.tmpl, c.sp = c.o.sp;
    c.interactive = isatty(0) && isatty(1);
    if (c.o.multi_turn < 0) c.o.multi_turn = isatty(0); /* from a pipe, each line on its own */
    whale_err err;
    int status = 0;
    if (chat_load(&c, &err) || chat_prepare(&c, &err) || chat_loop(&c, &err)) status = cli_fail(&err);
    chat_free(&c);
    return status;
}

/* ------------------------------------------------------------ chat-eval */


/* Does text contain any of the (one or two) values? */
static int mentions(const char *text, const char *const v[2]) {
    for (int i = 0; i < 2; i++)
        if (v[i] && *v[i] && strstr(text, v[i])) return 1;
    return 0;
}

/* One greedy reply to a single-turn conversation. *reply is malloc'd. */
static whale_code reply_to(whale_session *s, whale_sampler *sm, whale_tokenizer *tok, const whale_chat_template *tpl,
                           const char *system, const char *query, int32_t *buf, int cap, int n_new,
                           const int32_t *stop, int n_stop, char **reply, whale_err *err) {
    whale_chat_message msgs[2];
    int n = 0, n_ids;
    if (system) msgs[n++] = (whale_chat_message){"system", system};
    msgs[n++] = (whale_chat_message){"user", query};
    int32_t *ids;
    whale_code c = whale_chat_template_encode(tok, tpl, msgs, n, 1, &ids, NULL, &n_ids, err);
    if (c) return c;
    if (n_ids + 1 >= cap) {
        free(ids);
        return whale_errf(err, WHALE_ERR_RANGE, "the question (%d tokens) fills the model's %d positions", n_ids, cap);
    }
    memcpy(buf, ids, sizeof(int32_t) * (size_t)n_ids);
    free(ids);
    whale_session_reset(s);
    int n_ctx = n_ids, budget = n_new < cap - n_ids ? n_new : cap - n_ids;
    whale_gen_stats st;
    if ((c = whale_generate(s, sm, buf, &n_ctx, cap, budget, stop, n_stop, NULL, NULL, &st, err))) return c;
    size_t len;
    return whale_tokenizer_decode(tok, buf + n_ids, n_ctx - n_ids - (st.stopped ? 1 : 0), 1, reply, &len, err);
}

/* An evaluation: its options, the model it asks, the files and the counts. */
typedef struct {
    const char *dir, *adapters, *data, *system, *tmpl, *answers;
    const char *names[2], *authors[2];
    whale_dtype dtype;
    long n_new, threads, ctx;
    int show;
    char *base, *run_tmpl, *run_system;
    whale_sft_opts fo; /* the name and author, for {{NAME}} / {{AUTHOR}} */
    whale_model *m;
    whale_tokenizer *tok;
    whale_session *s;
    whale_sampler *sm;
    whale_chat_template *tpl;
    int32_t *buf, stop[16];
    int n_stop, maxpos;
    FILE *in, *out;
    long asked[2], right[2], questions, correct, lineno;
} eval_t;

static const char eval_help[] =
    "usage: whale chat-eval (-m DIR | --adapters CKPT | both) --data EVAL.jsonl --model-name ZH [EN]\n"
    "                       --model-author ZH [EN] [--show] [--answers OUT.jsonl] [-n N (64)]\n"
    "  asks each {\"query\", \"tag\", \"expect\": [\"name\", \"author\"]} record's question in a fresh\n"
    "  conversation (greedy), and counts the replies that contain the expected name / author\n"
    "  (either language's value); {{NAME}} / {{AUTHOR}} in queries are filled as in whale sft.\n"
    "  --system, --chat-template, --dtype, --ctx-size, --threads as in whale chat; ms-swift's spellings\n"
    "  (--model_name, --max_new_tokens, ...) work too; prints a JSON summary";

/* 0, -1 after --help, or the usage status. */
static int eval_parse(int argc, char **argv, eval_t *e) {
    const cli_opt opts[] = {
        {"-m|--model", CLI_STR, &e->dir, 0, 0, NULL},
        {"--adapters", CLI_STR, &e->adapters, 0, 0, NULL},
        {"--data|--val-dataset", CLI_STR, &e->data, 0, 0, NULL},
        {"--answers", CLI_STR, &e->answers, 0, 0, NULL},
        {"--system", CLI_STR, &e->system, 0, 0, NULL},
        {"--chat-template|--template", CLI_STR, &e->tmpl, 0, 0, NULL},
        {"--dtype|--torch-dtype", CLI_DTYPE, &e->dtype, 0, 0, NULL},
        {"-n|--max-new-tokens", CLI_LONG, &e->n_new, 1, 1 << 20, NULL},
        {"--threads", CLI_LONG, &e->threads, 1, 1024, NULL},
        {"-c|--ctx-size|--max-model-len", CLI_LONG, &e->ctx, 16, 1 << 24, NULL},
        {"--show", CLI_FLAG, &e->show, 0, 0, NULL},
        {"--model-name", CLI_PAIR, e->names, 0, 0, NULL},
        {"--model-author", CLI_PAIR, e->authors, 0, 0, NULL},
        {"--infer-backend", CLI_NOTE, NULL, 0, 0, "whale runs its own engine; the option is ignored"},
        {NULL, 0, NULL, 0, 0, NULL}};
    int st = cli_parse("chat-eval", eval_help, argc, argv, opts, NULL, NULL);
    if (st) return st;
    if ((!e->dir && !e->adapters) || !e->data || !e->names[0] || !e->authors[0])
        return cli_usage("chat-eval", "-m DIR (or --adapters), --data, --model-name and --model-author are required");
    return 0;
}

/* The model, tokenizer, template, a greedy sampler and a session; the data
 * opened and the answers file created. */
static whale_code eval_load(eval_t *e, whale_err *err) {
    e->fo = whale_sft_defaults();
    e->fo.model_name[0] = e->names[0], e->fo.model_name[1] = e->names[1];
    e->fo.model_author[0] = e->authors[0], e->fo.model_author[1] = e->authors[1];
    cli_run run = {NULL, e->dtype, (int)e->ctx, 1, 0, 0};
    whale_code c = cli_load_model(e->dir, e->adapters, &run, &e->m, &e->base, &e->run_tmpl, &e->run_system, err);
    if (c) return c;
    if (!e->tmpl) e->tmpl = e->run_tmpl;
    if (!e->system) e->system = e->run_system;
    whale_sampler_params sp = whale_sampler_defaults();
    sp.temperature = 0;
    e->maxpos = whale_model_max_positions(e->m);
    if (e->ctx > 0 && e->ctx < e->maxpos) e->maxpos = (int)e->ctx;
    if ((c = cli_load_tokenizer(e->base, e->m, &e->tok, err)) ||
        (c = whale_chat_template_load(e->base, e->tmpl, &e->tpl, err)) ||
        (c = whale_sampler_new(&sp, whale_model_vocab_size(e->m), &e->sm, err)) ||
        (c = whale_session_new(e->m, 1, e->maxpos, &e->s, err)))
        return c;
    e->n_stop = whale_chat_template_stop_ids(e->tok, e->tpl, e->stop, 8);
    if (e->n_stop > 8) e->n_stop = 8;
    e->n_stop += whale_model_eos_ids(e->m, e->stop + e->n_stop, 8);
    if (!(e->buf = malloc(sizeof(int32_t) * (size_t)(e->maxpos + 1))))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if ((c = whale_fopen_regular(e->data, &e->in, NULL, err))) return c;
    if (e->answers && !(e->out = fopen(e->answers, "w")))
        return whale_errf(err, WHALE_ERR_IO, "%s: cannot create: %s", e->answers, strerror(errno));
    return WHALE_OK;
}

/* The record's query and which of name / author its reply must contain. */
static whale_code eval_record_shape(const eval_t *e, const cJSON *j, int want[2], whale_err *err) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "query");
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(j, "expect"), *x;
    int ok_shape = cJSON_IsString(q) && (!ex || cJSON_IsArray(ex));
    want[0] = want[1] = 0;
    cJSON_ArrayForEach(x, ex) {
        if (cJSON_IsString(x) && !strcmp(x->valuestring, "name")) want[0] = 1;
        else if (cJSON_IsString(x) && !strcmp(x->valuestring, "author")) want[1] = 1;
        else ok_shape = 0;
    }
    if (!ex) want[0] = 1;
    if (!ok_shape)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s:%ld: want {\"query\": string, \"tag\"?, \"expect\"?: [\"name\"|\"author\"]}",
                          e->data, e->lineno);
    return WHALE_OK;
}

/* The reply scored, shown with --show and written with --answers. */
static void eval_score(eval_t *e, const int want[2], const char *query, const char *reply) {
    int hit[2] = {mentions(reply, e->fo.model_name), mentions(reply, e->fo.model_author)}, ok = 1;
    for (int k = 0; k < 2; k++)
        if (want[k]) {
            e->asked[k]++;
            e->right[k] += hit[k];
            ok &= hit[k];
        }
    e->questions++;
    e->correct += ok;
    if (e->show) fprintf(stderr, "%s %s\n    → %s\n", ok ? "[ok]  " : "[miss]", query, reply);
    if (e->out) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "query", query);
        cJSON_AddStringToObject(a, "response", reply);
        cJSON_AddBoolToObject(a, "correct", ok);
        char *t = cJSON_PrintUnformatted(a);
        if (t) fprintf(e->out, "%s\n", t);
        free(t);
        cJSON_Delete(a);
    }
}

/* One line of the data: its question asked and the reply scored. */
static whale_code eval_line(eval_t *e, const char *line, whale_err *err) {
    cJSON *j = cJSON_Parse(line);
    int want[2];
    char *query = NULL, *reply = NULL;
    whale_code c = eval_record_shape(e, j, want, err);
    if (!c) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "query"), *tag = cJSON_GetObjectItemCaseSensitive(j, "tag");
        c = whale_sft_fill_placeholders(q->valuestring, cJSON_IsString(tag) ? tag->valuestring : NULL, &e->fo, &query,
                                        err);
    }
    if (!c)
        c = reply_to(e->s, e->sm, e->tok, e->tpl, e->system, query, e->buf, e->maxpos, (int)e->n_new, e->stop,
                     e->n_stop, &reply, err);
    if (!c) eval_score(e, want, query, reply);
    free(query);
    free(reply);
    cJSON_Delete(j);
    return c;
}

/* Every question of the data asked; the answers file closed. */
static whale_code eval_run(eval_t *e, whale_err *err) {
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    whale_code c = WHALE_OK;
    while (!c && (got = getline(&line, &lcap, e->in)) >= 0) {
        e->lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got) c = eval_line(e, line, err);
    }
    free(line);
    if (c) return c;
    if (!e->questions) return whale_errf(err, WHALE_ERR_FORMAT, "%s: no questions", e->data);
    FILE *out = e->out;
    e->out = NULL;
    if (out && fclose(out) != 0) return whale_errf(err, WHALE_ERR_IO, "%s: write failed", e->answers);
    return WHALE_OK;
}

static void eval_print(const eval_t *e) {
    printf("{\"questions\": %ld, \"correct\": %ld, \"score\": %.4f, \"name\": {\"asked\": %ld, \"correct\": %ld}, "
           "\"author\": {\"asked\": %ld, \"correct\": %ld}}\n",
           e->questions, e->correct, (double)e->correct / (double)e->questions, e->asked[0], e->right[0], e->asked[1],
           e->right[1]);
}

static void eval_free(eval_t *e) {
    if (e->in) fclose(e->in);
    if (e->out) fclose(e->out);
    free(e->buf);
    whale_sampler_free(e->sm);
    whale_session_free(e->s);
    whale_chat_template_free(e->tpl);
    whale_tokenizer_free(e->tok);
    whale_model_free(e->m);
    free(e->base);
    free(e->run_tmpl);
    free(e->run_system);
}

int cmd_chat_eval(int argc, char **argv) {
    eval_t e = {.dtype = CLI_DTYPE_AUTO, .n_new = 64};
    int st = eval_parse(argc, argv, &e);
    if (st) return st < 0 ? 0 : st;
    whale_set_threads((int)e.threads);
    whale_err err;
    int status = 0;
    if (eval_load(&e, &err) || eval_run(&e, &err)) status = cli_fail(&err);
    else eval_print(&e);
    eval_free(&e);
    return status;
}
