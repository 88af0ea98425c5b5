/*
 * whale_serve.h — `whale serve`: an OpenAI-compatible HTTP server over one model
 * and one batched session (docs/serving.md).
 *
 * Threads: libmicrohttpd runs one thread per connection; they parse and
 * validate requests, render and tokenize prompts, and hand jobs to the
 * engine through a mutex/condvar queue. One engine thread owns the session
 * and runs continuous batching: every active request's next token goes
 * into one whale_session_decode, next to chunks of new prompts. With
 * --adapters, each sequence is bound to its request's adapter (or none),
 * so requests for different adapters share the same forward.
 */
#ifndef WHALE_SERVE_H
#define WHALE_SERVE_H

#include "whale.h"

/* A LoRA adapter over the model that requests may name as their "model"
 * (--adapters NAME=DIR): a PEFT folder, such as a whale sft checkpoint. */
typedef struct {
    const char *name, *dir;
} serve_adapter;
#define SERVE_MAX_ADAPTERS 64
#define SERVE_MAX_ADAPTER_NAME 128

typedef struct {
    const char *model_dir;     /* -m DIR */
    const char *model_name;    /* the id requests name (NULL: DIR's last component) */
    const char *chat_template; /* NULL: the folder's own (whale_chat_template_load) */
    const serve_adapter *adapters; /* loaded once beside the model; each request picks one or the base */
    int n_adapters;
    const char *host;          /* numeric address or name to bind (NULL: 127.0.0.1) */
    int port;                  /* 0: any free port (serve_port tells which) */
    const char *api_key;       /* NULL: no authentication */
    whale_dtype dtype;
    int parallel;              /* sequences decoded together (KV slots) */
    int ctx_size;              /* cells per slot (0: the model's maximum positions) */
    int batch;                 /* tokens per decode, prompt chunks included */
    int queue;                 /* requests waiting for a slot before 503 */
    size_t max_body;           /* request body bytes */
    int upload_seconds;        /* a request's headers and body must arrive within this */
    int max_connections;
    int stream_interval;       /* a streaming reply's text goes out every this many tokens (its first at once) */
    int verbose;               /* one line per request on stderr */
    whale_sampler_params sampling; /* what requests leave out (seed: none, each request draws one) */
} serve_config;

/* The defaults documented in docs/serving.md (model_dir left NULL). */
serve_config serve_config_defaults(void);

typedef struct serve_server serve_server;

/* Load the model, tokenizer and template, make the batched session, start
 * the engine thread and the HTTP daemon. Returns once it listens. */
whale_code serve_open(const serve_config *cfg, serve_server **out, whale_err *err);
/* The port it listens on. */
int serve_port(const serve_server *s);
/* One line about what it holds: model, slots, context, KV bytes. */
void serve_describe(const serve_server *s, FILE *f);
/* Refuse new requests (503) from now on and wait, at most timeout seconds,
 * for the running and queued ones to finish. Returns 1 when none is left,
 * 0 on timeout (serve_close then cancels the rest). Call it again to wait
 * longer. */
int serve_drain(serve_server *s, double timeout);
/* Stop (cancelling what still runs) and free. NULL is fine. */
void serve_close(serve_server *s);

#endif
