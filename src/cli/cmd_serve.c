/* whale serve: an OpenAI-compatible HTTP server (src/serve, docs/serving.md).
 * Runs until SIGTERM or SIGINT, then drains: new requests get 503, running
 * and queued ones finish (for at most --drain-timeout seconds, or until a
 * second signal), and it exits 0. */
#include "cli.h"

#include "whale_util.h"
#include "whale_serve.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char serve_help[] =
    "usage: whale serve -m DIR [--adapters NAME=DIR ...] [options]\n"
    "  --adapters NAME=DIR ...   LoRA adapters over the model (PEFT folders: whale sft checkpoints), each loaded\n"
    "                         once; a request's \"model\" names the base or one of them, per request, in one batch\n"
    "  --host ADDR            address to bind (127.0.0.1; 0.0.0.0 or :: for every interface)\n"
    "  --port N               (8080; 0: any free port, printed)\n"
    "  --parallel N           requests decoded together, one KV slot each (4)\n"
    "  --ctx-size C           KV cells per slot: prompt + reply (the model's positions, at most 4096)\n"
    "  --batch N              tokens per batched forward, prompt chunks included (512)\n"
    "  --queue N              requests waiting for a slot before 503 (64)\n"
    "  --dtype fp32|bf16|fp16|int8   precision of the weight products (the checkpoint's: bf16/fp16 if its config says so, else fp32)\n"
    "  --api-key KEY | --api-key-file F   require Authorization: Bearer KEY (not for /health and /)\n"
    "  --model-name NAME      the id requests give as \"model\" (the folder's name)\n"
    "  --chat-template deepseek|chatml|raw|FILE.jinja   (the folder's own)\n"
    "  --max-body BYTES       largest request body (8388608)\n"
    "  --timeout S            a request's headers and body must arrive within S seconds, however slowly sent;\n"
    "                         idle connections close (30)\n"
    "  --drain-timeout S      after SIGTERM or SIGINT, running and queued requests get S seconds to finish\n"
    "                         before they are cancelled (60; a second signal cancels them at once)\n"
    "  --stream-interval N    a streaming reply sends its text every N generated tokens, its first at once (1):\n"
    "                         fewer events and wake-ups a token when many streams run, in coarser pieces\n"
    "  --max-connections N    (256)   --threads N (all cores)   --verbose\n"
    "  --memory-limit GIB     refuse, before loading, a server whose estimate (weights, every slot's KV cells,\n"
    "                         one batch's workspace) is larger (the machine's memory)\n"
    "  sampling defaults for requests that leave them out: generation_config.json, else OpenAI's\n"
    "endpoints: POST /v1/chat/completions /v1/completions /tokenize /detokenize, GET /v1/models /health /metrics /";

/* The options, parsed by cli_parse into longs and strings, then checked
 * into the server's configuration. */
typedef struct {
    const char *dir, *host, *key, *key_file, *name, *tmpl;
    cli_list adapters;                         /* NAME=DIR */
    serve_adapter parsed[CLI_LIST_MAX]; /* the same, split */
    char names[CLI_LIST_MAX][SERVE_MAX_ADAPTER_NAME + 1];
    long port, parallel, ctx, batch, queue, max_body, timeout, drain, max_conn, threads, interval;
    double memory_limit; /* GiB; 0: the machine's memory */
    whale_dtype dtype;
    int verbose;
} serve_opts;

static int serve_parse(int argc, char **argv, serve_opts *o) {
    const cli_opt opts[] = {
        {"-m|--model", CLI_STR, &o->dir, 0, 0, NULL},
        {"--adapters|--lora-modules", CLI_LIST, &o->adapters, 0, 0, NULL},
        {"--host", CLI_STR, &o->host, 0, 0, NULL},
        {"--port", CLI_LONG, &o->port, 0, 65535, NULL},
        {"--parallel|-np", CLI_LONG, &o->parallel, 1, 1024, NULL},
        {"-c|--ctx-size|--max-model-len", CLI_LONG, &o->ctx, 2, 1 << 24, NULL},
        {"--batch|-b", CLI_LONG, &o->batch, 1, 1 << 20, NULL},
        {"--queue", CLI_LONG, &o->queue, 0, 1 << 20, NULL},
        {"--dtype|--torch-dtype", CLI_DTYPE, &o->dtype, 0, 0, NULL},
        {"--api-key", CLI_STR, &o->key, 0, 0, NULL},
        {"--api-key-file", CLI_STR, &o->key_file, 0, 0, NULL},
        {"--model-name|--served-model-name", CLI_STR, &o->name, 0, 0, NULL},
        {"--chat-template", CLI_STR, &o->tmpl, 0, 0, NULL},
        {"--max-body", CLI_LONG, &o->max_body, 1, 1L << 30, NULL},
        {"--timeout", CLI_LONG, &o->timeout, 1, 86400, NULL},
        {"--drain-timeout", CLI_LONG, &o->drain, 0, 86400, NULL},
        {"--max-connections", CLI_LONG, &o->max_conn, 1, 65536, NULL},
        {"--stream-interval", CLI_LONG, &o->interval, 1, 1024, NULL},
        {"--threads", CLI_LONG, &o->threads, 1, 1024, NULL},
        {"--memory-limit", CLI_DOUBLE, &o->memory_limit, 1e-6, 1e6, NULL},
        {"--verbose", CLI_FLAG, &o->verbose, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL}};
    int st = cli_parse("serve", serve_help, argc, argv, opts, NULL, NULL);
    if (st) return st;
    if (!o->dir) return cli_usage("serve", "-m DIR is required");
    if (o->key && o->key_file) return cli_usage("serve", "give --api-key or --api-key-file, not both");
    if (o->key && !*o->key) return cli_usage("serve", "--api-key is empty");
    for (int k = 0; k < o->adapters.n; k++) { /* NAME=DIR, as swift deploy --adapters and vLLM --lora-modules */
        const char *v = o->adapters.v[k], *eq = strchr(v, '=');
        if (!eq || eq == v || !eq[1]) return cli_usage("serve", "--adapters expects NAME=DIR, got \"%s\"", v);
        if ((size_t)(eq - v) > SERVE_MAX_ADAPTER_NAME)
            return cli_usage("serve", "--adapters: a name is at most %d bytes", SERVE_MAX_ADAPTER_NAME);
        memcpy(o->names[k], v, (size_t)(eq - v));
        o->names[k][eq - v] = 0;
        o->parsed[k] = (serve_adapter){o->names[k], eq + 1};
    }
    return 0;
}

static serve_config serve_config_from(const serve_opts *o) {
    serve_config c = serve_config_defaults();
    c.model_dir = o->dir;
    c.model_name = o->name;
    c.chat_template = o->tmpl;
    c.adapters = o->parsed;
    c.n_adapters = o->adapters.n;
    if (o->host) c.host = o->host;
    c.port = (int)o->port;
    c.api_key = o->key;
    c.dtype = o->dtype == CLI_DTYPE_AUTO ? cli_checkpoint_dtype(o->dir) : o->dtype;
    c.parallel = (int)o->parallel;
    c.ctx_size = (int)o->ctx;
    c.batch = (int)o->batch;
    c.queue = (int)o->queue;
    c.max_body = (size_t)o->max_body;
    c.upload_seconds = (int)o->timeout;
    c.max_connections = (int)o->max_conn;
    c.stream_interval = (int)o->interval;
    c.verbose = o->verbose;
    return c;
}

/* The key file's first line, without its newline; an empty key is refused. */
static whale_code read_key(const char *path, char **key, whale_err *err) {
    size_t n;
    whale_code rc = whale_read_file(path, key, &n, err);
    if (rc) return rc;
    (*key)[strcspn(*key, "\r\n")] = 0;
    if (!**key) return whale_errf(err, WHALE_ERR_FORMAT, "%s: the API key file is empty", path);
    return WHALE_OK;
}

/* Wait for the running and queued requests, a quarter second at a time,
 * until none is left, timeout seconds pass or a second signal comes. */
static void drain(serve_server *s, const sigset_t *set, double timeout) {
    double left = timeout;
    while (!serve_drain(s, left < 0.25 ? left : 0.25)) {
        left -= 0.25;
        struct timespec now = {0, 0};
        if (sigtimedwait(set, NULL, &now) > 0) {
            fprintf(stderr, "serve: a second signal: cancelling what still runs\n");
            return;
        }
        if (left <= 0) {
            fprintf(stderr, "serve: the drain timeout passed: cancelling what still runs\n");
            return;
        }
    }
}

int cmd_serve(int argc, char **argv) {
    serve_config d = serve_config_defaults();
    serve_opts o = {.port = d.port, .parallel = d.parallel, .batch = d.batch, .queue = d.queue,
                    .max_body = (long)d.max_body, .timeout = d.upload_seconds, .drain = 60, .max_conn = d.max_connections,
                    .interval = d.stream_interval,
                    .dtype = CLI_DTYPE_AUTO};
    int bad = serve_parse(argc, argv, &o);
    if (bad) return bad < 0 ? 0 : bad;
    whale_set_threads((int)o.threads);
    whale_err err;
    char *key = NULL;
    if (o.key_file && read_key(o.key_file, &key, &err)) {
        free(key);
        return cli_fail(&err);
    }
    if (key) o.key = key;
    serve_config c = serve_config_from(&o);
    /* whale memory's estimate, checked before loading: the weights, every
     * slot's KV cells (the server's default --ctx-size: the model's
     * positions, at most 4096) and one batch's workspace */
    cli_run run = {.dtype = c.dtype, .seq = c.ctx_size, .ctx_option = 1, .memory_limit = o.memory_limit * 1073741824.0};
    whale_model *skel = NULL;
    whale_code rc = run.seq ? WHALE_OK : whale_model_skeleton(c.model_dir, &skel, &err);
    if (skel) {
        run.seq = whale_model_max_positions(skel) < 4096 ? whale_model_max_positions(skel) : 4096;
        whale_model_free(skel);
    }
    if (rc || cli_check_memory(c.model_dir, &run, c.parallel, c.batch, &err) ||
        cli_generation_config(c.model_dir, &c.sampling, 0, "serve", &err)) {
        free(key);
        return cli_fail(&err);
    }
    /* the signals go to sigwait below, not to whichever thread runs */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    serve_server *s;
    if (serve_open(&c, &s, &err)) {
        free(key);
        return cli_fail(&err);
    }
    serve_describe(s, stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "serve: %s: draining (at most %ld s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", o.drain);
    drain(s, &set, (double)o.drain);
    serve_close(s);
    free(key);
    fprintf(stderr, "serve: stopped\n");
    return 0;
}
