/* whale serve: an OpenAI-compatible HTTP server (src/serve, docs/serving.md).
 * Runs until SIGTERM or SIGINT, then drains: running requests finish, new
 * ones get 503, and it exits 0. */
#include "cli/cli.h"

#include "core/core.h"
#include "serve/serve.h"

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char serve_help[] =
    "usage: whale serve -m DIR [options]\n"
    "  --host ADDR            address to bind (127.0.0.1; 0.0.0.0 or :: for every interface)\n"
    "  --port N               (8080; 0: any free port, printed)\n"
    "  --parallel N           requests decoded together, one KV slot each (4)\n"
    "  --ctx-size C           KV cells per slot: prompt + reply (the model's positions, at most 4096)\n"
    "  --batch N              tokens per batched forward, prompt chunks included (512)\n"
    "  --queue N              requests waiting for a slot before 503 (64)\n"
    "  --dtype fp32|bf16|fp16|int8   precision of the weight products (fp32)\n"
    "  --api-key KEY | --api-key-file F   require Authorization: Bearer KEY (not for /health and /)\n"
    "  --model-name NAME      the id requests give as \"model\" (the folder's name)\n"
    "  --chat-template deepseek|chatml|raw|FILE.jinja   (the folder's own)\n"
    "  --max-body BYTES       largest request body (8388608)\n"
    "  --timeout S            a request must arrive within S seconds; idle connections close (30)\n"
    "  --max-connections N    (256)   --threads N (all cores)   --verbose\n"
    "  sampling defaults for requests that leave them out: generation_config.json, else OpenAI's\n"
    "endpoints: POST /v1/chat/completions /v1/completions /tokenize /detokenize, GET /v1/models /health /metrics /";

typedef struct {
    serve_config c;
    const char *key_file;
    long threads;
} serve_opts;

/* Options with a value, by kind: a string, an integer in [lo, hi], a dtype. */
typedef struct {
    const char *name;
    char kind; /* 's' string, 'i' int, 'l' long, 'z' size, 'd' dtype */
    size_t off;
    long lo, hi;
} opt_def;

#define OFF(f) offsetof(serve_opts, f)
static const opt_def serve_opt_table[] = {
    {"-m", 's', OFF(c.model_dir), 0, 0},
    {"--model", 's', OFF(c.model_dir), 0, 0},
    {"--host", 's', OFF(c.host), 0, 0},
    {"--port", 'i', OFF(c.port), 0, 65535},
    {"--parallel", 'i', OFF(c.parallel), 1, 1024},
    {"--ctx-size", 'i', OFF(c.ctx_size), 2, 1 << 24},
    {"--batch", 'i', OFF(c.batch), 1, 1 << 20},
    {"--queue", 'i', OFF(c.queue), 0, 1 << 20},
    {"--dtype", 'd', OFF(c.dtype), 0, 0},
    {"--api-key", 's', OFF(c.api_key), 0, 0},
    {"--api-key-file", 's', OFF(key_file), 0, 0},
    {"--model-name", 's', OFF(c.model_name), 0, 0},
    {"--chat-template", 's', OFF(c.chat_template), 0, 0},
    {"--max-body", 'z', OFF(c.max_body), 1, 1L << 30},
    {"--timeout", 'i', OFF(c.upload_seconds), 1, 86400},
    {"--max-connections", 'i', OFF(c.max_connections), 1, 65536},
    {"--threads", 'l', OFF(threads), 1, 1024},
};

static int set_option(serve_opts *o, const opt_def *d, const char *v) {
    char *p = (char *)o + d->off;
    long n;
    int bad = 0;
    switch (d->kind) {
    case 's': *(const char **)p = v; break;
    case 'd': bad = cli_dtype("serve", v, (whale_dtype *)p); break;
    case 'i':
        if (!(bad = cli_int("serve", d->name, v, d->lo, d->hi, &n))) *(int *)p = (int)n;
        break;
    case 'l':
        if (!(bad = cli_int("serve", d->name, v, d->lo, d->hi, &n))) *(long *)p = n;
        break;
    case 'z':
        if (!(bad = cli_int("serve", d->name, v, d->lo, d->hi, &n))) *(size_t *)p = (size_t)n;
        break;
    }
    return bad;
}

static int serve_parse(int argc, char **argv, serve_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts(serve_help);
            return -1;
        }
        if (!strcmp(a, "--verbose")) {
            o->c.verbose = 1;
            continue;
        }
        const opt_def *d = NULL;
        for (size_t k = 0; k < sizeof serve_opt_table / sizeof serve_opt_table[0]; k++)
            if (!strcmp(a, serve_opt_table[k].name)) d = &serve_opt_table[k];
        if (!d) return cli_usage("serve", "unknown option \"%s\"", a);
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("serve", "%s needs a value", a);
        int bad = set_option(o, d, v);
        if (bad) return bad;
    }
    if (!o->c.model_dir) return cli_usage("serve", "-m DIR is required");
    if (o->c.api_key && o->key_file) return cli_usage("serve", "give --api-key or --api-key-file, not both");
    return 0;
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

int cmd_serve(int argc, char **argv) {
    serve_opts o = {serve_config_defaults(), NULL, 0};
    unsigned given = 0;
    int bad = serve_parse(argc, argv, &o);
    if (bad) return bad < 0 ? 0 : bad;
    whale_set_threads((int)o.threads);
    whale_err err;
    char *key = NULL;
    if (o.key_file && read_key(o.key_file, &key, &err)) {
        free(key);
        return cli_fail(&err);
    }
    if (key) o.c.api_key = key;
    if (o.c.api_key && !*o.c.api_key) return cli_usage("serve", "--api-key is empty");
    if (cli_generation_config(o.c.model_dir, &o.c.sampling, given, 1, &err)) return cli_fail(&err);
    /* the signals go to sigwait below, not to whichever thread runs */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    serve_server *s;
    if (serve_open(&o.c, &s, &err)) {
        free(key);
        return cli_fail(&err);
    }
    serve_describe(s, stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "whale serve: %s: draining\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    serve_drain(s, 60);
    serve_close(s);
    free(key);
    fprintf(stderr, "whale serve: stopped\n");
    return 0;
}
