/* Internal to src/serve: jobs, the engine, metrics and the OpenAI API objects. */
#ifndef WHALE_SERVE_IMPL_H
#define WHALE_SERVE_IMPL_H

#include "whale_serve.h"
#include "whale_chat.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>

struct cJSON;

/* ------------------------------------------------------------ jobs
 * One generation. The HTTP thread fills the request part and submits it;
 * from then on the engine writes the result part under the engine's mutex
 * and signals cv; the HTTP thread reads it under the same mutex. Both hold
 * a reference; the last release frees it. */
#define SERVE_MAX_STOP 4 /* stop strings per request, as OpenAI */
#define SERVE_MAX_TOP_LOGPROBS 20 /* alternatives per token, as OpenAI's top_logprobs */

/* A generated token's log-probability: log-softmax of the logits row the
 * model gave, before penalties, temperature and filters. */
typedef struct {
    int32_t id;
    float logprob;
    size_t end; /* the job's text length after this token's text was appended */
} serve_lp;

typedef struct serve_job {
    /* request: read-only once submitted */
    int model; /* 0: the base; k: adapter k − 1 of serve_config.adapters */
    int32_t *prompt;
    int n_prompt;
    int max_tokens;
    whale_sampler_params sp;
    float frequency_penalty, presence_penalty; /* OpenAI's, over the generated tokens */
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    int ignore_eos, skip_special;
    int logprobs;     /* report each token's log-probability */
    int top_logprobs; /* and this many alternatives (0..SERVE_MAX_TOP_LOGPROBS) */
    serve_lp *lp;     /* [max_tokens]: the tokens of the text (not a stop id), lp[0..n_lp) written */
    serve_lp *top;    /* [max_tokens * top_logprobs]: each token's alternatives, most probable first */
    int n_lp;
    /* result */
    char *text; /* generated text, NUL-terminated */
    size_t len, cap;
    size_t ready; /* bytes of text that can be sent (a possible stop string held back) */
    int n_gen;    /* tokens sampled */
    int n_reused; /* prompt tokens whose cells came from the cache */
    const char *finish; /* "stop" / "length" once done */
    int done, cancelled;
    whale_err err; /* err.code != 0: the generation failed */
    double t_submit, t_first, t_done;
    int refs;
    pthread_cond_t cv;
    size_t wake_at; /* the waiter's: wake it once ready reaches this (or done) */
    struct serve_job *next; /* the queue */
} serve_job;

/* ------------------------------------------------------------ metrics */
#define SERVE_HIST_BUCKETS 12
typedef struct {
    const double *le; /* upper bounds, ascending, +Inf implied */
    int n;
    uint64_t count[SERVE_HIST_BUCKETS + 1];
    double sum;
    uint64_t total;
} serve_hist;

typedef struct {
    pthread_mutex_t mu;
    uint64_t requests[8];   /* by endpoint (serve_endpoint) */
    uint64_t responses[6];  /* by status class: 2xx, 400, 401, 404, 413/408, 503, other */
    uint64_t prompt_tokens, reused_tokens, generated_tokens, cancelled, decode_steps;
    /* seconds of the steps by phase: [0] the batched forward, [1] drawing
     * the tokens from its logits, [2] publishing their text to the waiting
     * connections (the connection threads that wakes run then too, on the
     * same cores) */
    double phase_seconds[3];
    int queue_depth, slots_busy, batch_seqs_last, batch_seqs_max;
    serve_hist ttft, latency, step, batch_seqs;
    /* per model id (the base, then each adapter): finished requests, generated tokens */
    int n_models;
    const char *const *model_ids;
    uint64_t *model_requests, *model_generated;
} serve_metrics;

void serve_metrics_init(serve_metrics *m);
/* The model ids counted per model (n of them, kept by the caller). */
int serve_metrics_set_models(serve_metrics *m, int n, const char *const *ids);
void serve_metrics_destroy(serve_metrics *m);
void serve_hist_add(serve_hist *h, double v);
/* Prometheus text exposition; malloc'd. */
char *serve_metrics_text(serve_metrics *m, size_t kv_bytes, int parallel, int ctx);

/* ------------------------------------------------------------ engine */
typedef struct serve_engine serve_engine;

/* adapters[k] is what a job of model k + 1 runs with (model 0: the base). */
whale_code serve_engine_new(whale_model *m, const whale_tokenizer *tok, const int32_t *stop_ids, int n_stop,
                            whale_adapter *const *adapters, int n_adapters, const serve_config *cfg,
                            serve_metrics *metrics, serve_engine **out, whale_err *err);
/* Stop the thread: what runs or waits is cancelled (its jobs end as done);
 * the engine still answers wait/take/cancel until freed. */
void serve_engine_stop(serve_engine *e);
void serve_engine_free(serve_engine *e);
int serve_engine_ctx(const serve_engine *e);
size_t serve_engine_kv_bytes(const serve_engine *e);
/* Queue a job (the engine takes a reference). WHALE_ERR_RANGE: the queue
 * is full; WHALE_ERR_UNSUPPORTED: the server is draining. */
whale_code serve_engine_submit(serve_engine *e, serve_job *j, whale_err *err);
/* Wait until j is done, has new text beyond seen bytes, or timeout_ms
 * passed (seen (size_t)-1: until done; the engine then wakes the waiter
 * only when the job ends, not at every token). Returns 1 when done, 0 when
 * it has new text, -1 when the time passed without either. */
int serve_engine_wait(serve_engine *e, serve_job *j, size_t seen, int timeout_ms);
void serve_engine_cancel(serve_engine *e, serve_job *j);
/* Copy out the job's result state under the lock. */
typedef struct {
    size_t ready;
    int n_gen, n_reused, done;
    int n_lp; /* entries of j->lp written (they do not change once written) */
    const char *finish;
    whale_code code;
} serve_job_view;
serve_job_view serve_engine_view(serve_engine *e, serve_job *j);
/* A copy (malloc'd, NUL-terminated; NULL when *len is 0) of the job's
 * sendable text from byte `from`, and its state, under the lock. */
char *serve_engine_take(serve_engine *e, serve_job *j, size_t from, size_t *len, serve_job_view *v);
/* Stop taking jobs; wait until none runs or is queued (1) or timeout
 * seconds pass (0). */
int serve_engine_drain(serve_engine *e, double timeout);
int serve_engine_draining(serve_engine *e);

serve_job *serve_job_new(void);
void serve_job_release(serve_engine *e, serve_job *j);

/* ------------------------------------------------------------ logprobs (logprobs.c) */
/* Log-softmax of row[V] (the raw logits) at id into *out, and the k most
 * probable ids into top[0..k) (ties: the lower id first). */
void serve_logprobs_row(const float *row, int V, int32_t id, int k, serve_lp *out, serve_lp *top);
/* How many of the first n_lp entries of j->lp belong to the first len bytes
 * of its text: those that end within it or begin before its end. */
int serve_lp_count(const serve_job *j, int n_lp, size_t len);
/* Entries [from, to) as chat's {"content": [...], "refusal": null} or, for
 * completions, the legacy {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"} (*offset: characters before entry from; advanced). */
struct serve_text;
struct cJSON *serve_logprobs_json(const struct serve_text *tx, const serve_job *j, int chat, int from, int to,
                                  long *offset);

/* ------------------------------------------------------------ streamed tool calls (toolstream.c) */
typedef struct serve_toolstream serve_toolstream;
enum { SERVE_PIECE_TEXT = 1, SERVE_PIECE_CALL, SERVE_PIECE_ARGS };
typedef struct {
    int kind;        /* SERVE_PIECE_TEXT: content; _CALL: a call begins (index, name); _ARGS: its arguments' text */
    const char *p;   /* TEXT, ARGS: the bytes (valid until the next call on the stream) */
    size_t n;
    int index;        /* CALL, ARGS: the call's index in the reply */
    const char *name; /* CALL */
} serve_tool_piece;
serve_toolstream *serve_toolstream_new(void);
void serve_toolstream_free(serve_toolstream *t);
/* Append the reply's next text; -1 when out of memory. */
int serve_toolstream_feed(serve_toolstream *t, const char *text, size_t len);
/* The next piece that can be decided from the text so far (done: the reply
 * is complete): 1 with *out, 0 when none yet, -2 out of memory. */
int serve_toolstream_next(serve_toolstream *t, int done, serve_tool_piece *out);
/* Bytes of the text accounted for by the pieces so far; calls announced. */
size_t serve_toolstream_consumed(const serve_toolstream *t);
int serve_toolstream_calls(const serve_toolstream *t);

/* ------------------------------------------------------------ API objects */
typedef enum {
    SERVE_EP_CHAT = 0,
    SERVE_EP_COMPLETIONS,
    SERVE_EP_MODELS,
    SERVE_EP_HEALTH,
    SERVE_EP_METRICS,
    SERVE_EP_TOKENIZE,
    SERVE_EP_DETOKENIZE,
    SERVE_EP_PAGE
} serve_endpoint;

/* An error response: HTTP status and OpenAI's error object. */
typedef struct {
    int status;
    const char *type;  /* invalid_request_error, authentication_error, ... */
    const char *param; /* the field at fault or NULL */
    const char *code;  /* model_not_found, context_length_exceeded, ... or NULL */
    char message[512];
} serve_error;

void serve_error_set(serve_error *e, int status, const char *type, const char *param, const char *code,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {"message", "type", "param", "code"}}, malloc'd. */
char *serve_error_json(const serve_error *e);

/* What the model and text side of the server share with the API code. */
typedef struct serve_text {
    const char *model_name;      /* the base's id: model_ids[0] */
    const char *const *model_ids; /* the base, then each adapter's name: what "model" may say */
    int n_models;
    whale_tokenizer *tok; /* encode only under text_mu */
    pthread_mutex_t *text_mu;
    const whale_chat_template *tpl;
    int vocab, ctx;
    whale_sampler_params defaults; /* serve_config's */
} serve_text;

/* A request's head, before its body is read (request.c): the route and
 * its method, the API key (authorization: the Authorization header or
 * NULL), the declared size (content_length: that header or NULL) against
 * max_body. Returns 0, or fills e with the 4xx and returns -1. *routed
 * says whether the path named an endpoint (then *ep is it, also when the
 * request is refused). */
int serve_check_head(const serve_config *cfg, const char *method, const char *url, const char *authorization,
                     const char *content_length, serve_endpoint *ep, int *routed, serve_error *e);

/* A parsed generation request. */
typedef struct {
    int chat;   /* /v1/chat/completions (else /v1/completions) */
    int model;  /* the id the request named: tx->model_ids[model] */
    int stream, include_usage;
    int echo;   /* completions: prompt text first */
    int tools;  /* chat with tools: tool calls are parsed from the reply */
    char *prefix; /* tool_choice required or named: the reply's forced start (in the prompt, not generated) */
    char *prompt_text; /* completions with echo: the prompt as text */
} serve_gen_request;

typedef struct {
    int prompt, gen, cached;
} serve_usage;

/* Parse a chat or completion request body into job (prompt ids, limits,
 * sampling, stop strings) and req. Returns 0, or fills e and returns -1. */
int serve_parse_generation(const serve_text *tx, int chat, const char *body, size_t len, serve_job *job,
                           serve_gen_request *req, serve_error *e);
/* The non-streaming response object (malloc'd JSON); with j->logprobs,
 * the logprobs of the first n_lp entries of j->lp that belong to the text. */
char *serve_completion_json(const serve_text *tx, const serve_gen_request *req, const char *id, long created,
                            const char *text, size_t len, const char *finish, const serve_usage *u,
                            const serve_job *j, int n_lp);
/* What one stream chunk carries. */
typedef struct {
    const char *text; /* delta content (chat) or text (completions), len bytes */
    size_t len;
    int first;                  /* chat: the delta names the role */
    const char *finish;         /* the final chunk: its finish_reason */
    const serve_usage *usage;   /* the usage chunk (choices []) */
    const serve_job *job;       /* with job->logprobs: entries [lp_from, lp_to) */
    int lp_from, lp_to;
    long *lp_offset;            /* completions' text_offset so far */
    struct cJSON *tool_calls;   /* chat: a delta's tool_calls array (taken over) */
} serve_chunk;
/* One SSE event "data: {...}\n\n" (malloc'd). */
char *serve_chunk_event(const serve_text *tx, const serve_gen_request *req, const char *id, long created,
                        const serve_chunk *ch);
/* /tokenize and /detokenize bodies; /v1/models. */
int serve_tokenize(const serve_text *tx, const char *body, size_t len, char **out, serve_error *e);
int serve_detokenize(const serve_text *tx, const char *body, size_t len, char **out, serve_error *e);
char *serve_models_json(const serve_text *tx, long created);

/* ------------------------------------------------------------ request deadlines (deadline.c) */
typedef struct serve_deadlines serve_deadlines;
/* A watchdog over n connection slots: a request still arriving timeout
 * seconds after its connection opened (or its previous request ended) has
 * its socket shut down. */
whale_code serve_deadlines_start(int n, double timeout, serve_deadlines **out, whale_err *err);
void serve_deadlines_stop(serve_deadlines *d); /* and free; NULL is fine */
/* libmicrohttpd's connection notification (cls: the server). */
void serve_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe);
/* Connection c's request has arrived (arriving 0) or the next may begin (1). */
void serve_deadline_set(serve_deadlines *d, struct MHD_Connection *c, int arriving);

/* ------------------------------------------------------------ the server */
struct serve_server {
    serve_config cfg;
    char *name;
    whale_model *m;
    whale_tokenizer *tok;
    whale_chat_template *tpl;
    pthread_mutex_t text_mu;
    serve_text tx;
    serve_metrics metrics;
    serve_engine *eng;
    whale_adapter **adapters; /* [cfg.n_adapters], owned by the model */
    const char **ids;         /* the base's name, then the adapters' */
    struct MHD_Daemon *d;
    serve_deadlines *deadlines;
    int port;
    unsigned long next_id;  /* under metrics.mu */
    int replying;           /* generation requests from submission until their reply is sent, under metrics.mu */
};

/* libmicrohttpd's access handler and completion callback (http.c). */
enum MHD_Result serve_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls);
void serve_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);

/* The chat page (GET /). */
extern const char serve_page_html[];

#endif
