/*
 * The HTTP side of `whale serve`, on libmicrohttpd: one thread per
 * connection (bounded by max_connections), bodies read into memory up to
 * max_body, routing, authentication, and the responses: JSON, server-sent
 * events for streams, the chat page.
 *
 * A connection thread that waits for its generation polls its socket (for
 * a stream before each write, for a whole reply every 10 ms): a client that
 * went away cancels the job, which frees its slot at the engine's next step.
 */
#include "serve/serve_impl.h"

#include "core/core.h"
#include "whale_chat.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>


typedef struct {
    serve_endpoint ep;
    char *body;
    size_t len, cap;
    double t0;
    int replying;   /* counted in serve_server.replying until the reply is sent */
    char line[160]; /* "METHOD URL" for --verbose */
} conn_ctx;

/* The status this connection thread queued last (one thread per connection). */
static _Thread_local int last_status;

/* ------------------------------------------------------------ responses */

static void count_status(serve_server *s, int status) {
    int k = status < 300 ? 0 : status == 400 ? 1 : status == 401 ? 2 : status == 404 ? 3 : status == 413 ? 4
          : status == 503 ? 5 : -1;
    pthread_mutex_lock(&s->metrics.mu);
    if (k >= 0) s->metrics.responses[k]++;
    pthread_mutex_unlock(&s->metrics.mu);
    last_status = status;
}

/* Every response says how long the connection may then stay idle (the
 * --timeout after which the deadline watchdog shuts it): a client that
 * honours it (undici, the fetch of Node.js, opens a new connection a
 * second before) does not send its next request into a socket the server
 * is closing. */
static void keep_alive(const serve_server *s, struct MHD_Response *r) {
    char v[32];
    snprintf(v, sizeof v, "timeout=%d", (int)s->cfg.upload_seconds);
    MHD_add_response_header(r, "Keep-Alive", v);
}

/* Queue body (malloc'd, taken over; NULL means out of memory: a 500). */
static enum MHD_Result respond(serve_server *s, struct MHD_Connection *c, int status, const char *type, char *body,
                               const char *retry_after) {
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":null}}";
    struct MHD_Response *r =
        body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    if (!body) status = 500, type = "application/json";
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    keep_alive(s, r);
    count_status(s, status);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result respond_json(serve_server *s, struct MHD_Connection *c, int status, char *json) {
    return respond(s, c, status, "application/json", json, NULL);
}

static enum MHD_Result respond_error(serve_server *s, struct MHD_Connection *c, const serve_error *e) {
    return respond(s, c, e->status, "application/json", serve_error_json(e), e->status == 503 ? "1" : NULL);
}

static enum MHD_Result fail(serve_server *s, struct MHD_Connection *c, int status, const char *type,
                            const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result fail(serve_server *s, struct MHD_Connection *c, int status, const char *type,
                            const char *code, const char *fmt, ...) {
    serve_error e;
    serve_error_set(&e, status, type, NULL, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return respond_error(s, c, &e);
}

/* A generation may wait longer than the idle timeout (in the queue, or for
 * a long reply): the connection has none while its request runs, and gets
 * it back (its timer restarted) when the reply is ready. */
static void idle_timeout(struct MHD_Connection *c, unsigned seconds) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, seconds);
}

/* The client closed its end (or the socket failed). */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = {ci->connect_fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ------------------------------------------------------------ generations */

typedef struct {
    serve_server *s;
    struct MHD_Connection *c;
    serve_job *job;
    serve_gen_request req;
    char id[48];
    long created;
    size_t sent;   /* bytes of the job's text sent (to the tool-call parser, with tools) */
    int phase;     /* 0 first chunk, 1 text, 2 usage, 3 [DONE], 4 end */
    char *pending; /* the events being written */
    size_t off;
    int lp_sent;   /* logprobs entries sent */
    long lp_offset;
    serve_toolstream *ts; /* with tools: the reply's text becomes content and tool-call deltas */
} stream_t;

static void stream_free(void *cls) {
    stream_t *st = cls;
    serve_engine_cancel(st->s->eng, st->job); /* nothing if it is done */
    serve_job_release(st->s->eng, st->job);
    free(st->req.prompt_text);
    free(st->req.prefix);
    serve_toolstream_free(st->ts);
    free(st->pending);
    free(st);
}

static serve_usage job_usage(const serve_job *j, const serve_job_view *v) {
    serve_usage u = {j->n_prompt, v->n_gen, v->n_reused};
    return u;
}

/* Logprobs entries that can go out with the first `bytes` of the text: those
 * that end within it, and once the job is done those that begin before it. */
static int lp_ready(const serve_job *j, int n_lp, size_t bytes, int done) {
    if (!j->logprobs) return 0;
    if (done) return serve_lp_count(j, n_lp, bytes);
    int n = 0;
    while (n < n_lp && j->lp[n].end <= bytes) n++;
    return n;
}

/* Append event ev (taken over) to *out; -1 when out of memory. */
static int cat(char **out, size_t *n, char *ev) {
    size_t k = ev ? strlen(ev) : 0;
    char *grown = ev ? realloc(*out, *n + k + 1) : NULL;
    if (grown) memcpy(grown + *n, ev, k + 1), *out = grown, *n += k;
    free(ev);
    return grown ? 0 : -1;
}

/* A chunk of content, with the logprobs entries up to lp_to. */
static char *content_event(stream_t *st, const char *text, size_t len, int lp_to, cJSON *tool_calls) {
    serve_chunk ch = {text, len, st->phase == 0, NULL, NULL, st->job, st->lp_sent, lp_to, &st->lp_offset, tool_calls};
    st->phase = 1;
    st->lp_sent = lp_to > st->lp_sent ? lp_to : st->lp_sent;
    return serve_chunk_event(&st->s->tx, &st->req, st->id, st->created, &ch);
}

/* [{"index", "id", "type", "function": {"name", "arguments": ""}}] or [{"index", "function": {"arguments"}}] */
static cJSON *tool_delta(const serve_tool_piece *p) {
    cJSON *a = cJSON_CreateArray(), *d = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    char id[32];
    snprintf(id, sizeof id, "call_%d", p->index);
    int ok = a && d && fn && cJSON_AddItemToArray(a, d);
    if (!ok) cJSON_Delete(d);
    ok = ok && cJSON_AddNumberToObject(d, "index", p->index);
    if (ok && p->kind == SERVE_PIECE_CALL)
        ok = cJSON_AddStringToObject(d, "id", id) && cJSON_AddStringToObject(d, "type", "function") &&
             cJSON_AddStringToObject(fn, "name", p->name) && cJSON_AddStringToObject(fn, "arguments", "");
    char *frag = ok && p->kind == SERVE_PIECE_ARGS ? strndup(p->p, p->n) : NULL;
    if (ok && p->kind == SERVE_PIECE_ARGS) ok = frag && cJSON_AddStringToObject(fn, "arguments", frag);
    free(frag);
    if (ok && cJSON_AddItemToObject(d, "function", fn)) return a;
    if (!cJSON_GetObjectItemCaseSensitive(d, "function")) cJSON_Delete(fn);
    cJSON_Delete(a);
    return NULL;
}

/* With tools: feed the new text to the tool-call parser and turn what it can
 * decide into events (appended to *out). -1 when out of memory. */
static int tool_events(stream_t *st, const char *text, size_t len, const serve_job_view *v, char **out,
                       size_t *n) {
    size_t pl = st->req.prefix ? strlen(st->req.prefix) : 0;
    if (st->phase == 0 && pl && serve_toolstream_feed(st->ts, st->req.prefix, pl)) return -1;
    if (len && serve_toolstream_feed(st->ts, text, len)) return -1;
    serve_tool_piece p;
    int r;
    while ((r = serve_toolstream_next(st->ts, v->done, &p)) == 1) {
        size_t used = serve_toolstream_consumed(st->ts);
        int lp_to = lp_ready(st->job, v->n_lp, used > pl ? used - pl : 0, 0);
        cJSON *calls = p.kind == SERVE_PIECE_TEXT ? NULL : tool_delta(&p);
        if (p.kind != SERVE_PIECE_TEXT && !calls) return -1;
        if (cat(out, n, content_event(st, p.p, p.kind == SERVE_PIECE_TEXT ? p.n : 0, lp_to, calls))) return -1;
    }
    return r < 0 ? -1 : 0;
}

/* The next events of the stream, or NULL with *end set (1 done, -1 failed). */
static char *stream_next(stream_t *st, int *end) {
    serve_server *s = st->s;
    const serve_text *tx = &s->tx;
    *end = 0;
    for (;;) {
        size_t len, n = 0;
        serve_job_view v;
        char *text = serve_engine_take(s->eng, st->job, st->sent, &len, &v), *out = NULL;
        int lp_to = lp_ready(st->job, v.n_lp, st->sent + len, v.done);
        if (st->ts && v.code == 0) {
            int bad = tool_events(st, text ? text : "", len, &v, &out, &n);
            st->sent += len;
            if (!bad && !out && st->phase == 0) bad = cat(&out, &n, content_event(st, "", 0, st->lp_sent, NULL));
            if (!bad && !out && v.done && lp_to > st->lp_sent) bad = cat(&out, &n, content_event(st, "", 0, lp_to, NULL));
            free(text);
            if (bad) free(out);
            if (bad) return *end = -1, NULL;
            if (out) return out;
        } else if (len || lp_to > st->lp_sent || (st->phase == 0 && st->req.chat)) {
            char *ev = content_event(st, text ? text : "", len, lp_to, NULL);
            st->sent += len;
            free(text);
            return ev ? ev : (*end = -1, NULL);
        } else {
            free(text);
        }
        /* A client gone while its job waits for a slot or text cancels it.
         * Only a wait that saw nothing asks the socket: a client that leaves
         * mid-stream fails the next send, and MHD then closes the
         * connection (stream_free cancels the job). Asking at every token
         * had cost each stream two system calls a token. */
        if (!v.done) {
            if (serve_engine_wait(s->eng, st->job, st->sent, 100) < 0 && client_gone(st->c)) return *end = -1, NULL;
            continue;
        }
        if (v.code) {
            serve_error e;
            serve_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s", st->job->err.msg);
            char *json = serve_error_json(&e), *ev = json ? malloc(strlen(json) + 9) : NULL;
            if (ev) sprintf(ev, "data: %s\n\n", json);
            free(json);
            st->phase = 3;
            return ev ? ev : (*end = -1, NULL);
        }
        serve_usage u = job_usage(st->job, &v);
        if (st->phase <= 1) {
            st->phase = st->req.include_usage ? 2 : 3;
            const char *finish = st->ts && serve_toolstream_calls(st->ts) && !strcmp(v.finish, "stop") ? "tool_calls"
                                                                                                      : v.finish;
            serve_chunk ch = {"", 0, 0, finish, NULL, NULL, 0, 0, NULL, NULL};
            return serve_chunk_event(tx, &st->req, st->id, st->created, &ch);
        }
        if (st->phase == 2) {
            st->phase = 3;
            serve_chunk ch = {"", 0, 0, NULL, &u, NULL, 0, 0, NULL, NULL};
            return serve_chunk_event(tx, &st->req, st->id, st->created, &ch);
        }
        if (st->phase == 3) {
            st->phase = 4;
            return strdup("data: [DONE]\n\n");
        }
        *end = 1;
        return NULL;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_t *st = cls;
    (void)pos;
    if (!st->pending) {
        int end;
        st->pending = stream_next(st, &end);
        st->off = 0;
        if (!st->pending && end > 0) idle_timeout(st->c, (unsigned)st->s->cfg.upload_seconds);
        if (!st->pending) return end > 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = strlen(st->pending + st->off);
    if (n > max) n = max;
    memcpy(buf, st->pending + st->off, n);
    st->off += n;
    if (!st->pending[st->off]) {
        free(st->pending);
        st->pending = NULL;
    }
    return (ssize_t)n;
}

/* Wait for a non-streaming job; NULL when the client went away. */
static char *wait_whole(stream_t *st, int *status) {
    serve_server *s = st->s;
    serve_job_view v;
    for (;;) {
        if (serve_engine_wait(s->eng, st->job, (size_t)-1, 10) > 0) break;
        if (client_gone(st->c)) return NULL;
    }
    size_t len;
    char *text = serve_engine_take(s->eng, st->job, 0, &len, &v);
    char *json = NULL;
    *status = 200;
    if (v.code) {
        serve_error e;
        serve_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s", st->job->err.msg);
        *status = 500;
        json = serve_error_json(&e);
    } else {
        serve_usage u = job_usage(st->job, &v);
        json = serve_completion_json(&s->tx, &st->req, st->id, st->created, text ? text : "", len, v.finish, &u,
                                     st->job, v.n_lp);
    }
    free(text);
    return json;
}

static enum MHD_Result handle_generation(serve_server *s, struct MHD_Connection *c, conn_ctx *cc) {
    serve_error e;
    stream_t *st = calloc(1, sizeof *st);
    serve_job *j = st ? serve_job_new() : NULL;
    if (!j) {
        free(st);
        return respond_json(s, c, 500, NULL);
    }
    st->s = s, st->c = c, st->job = j, st->created = (long)time(NULL);
    pthread_mutex_lock(&s->metrics.mu);
    unsigned long id = ++s->next_id;
    pthread_mutex_unlock(&s->metrics.mu);
    snprintf(st->id, sizeof st->id, "%s-%lx%04lx", cc->ep == SERVE_EP_CHAT ? "chatcmpl" : "cmpl", (unsigned long)st->created, id);
    if (!j->sp.seed) j->sp.seed = ((uint64_t)st->created << 20) ^ id;
    if (serve_parse_generation(&s->tx, cc->ep == SERVE_EP_CHAT, cc->body ? cc->body : "", cc->len, j, &st->req, &e)) {
        stream_free(st);
        return respond_error(s, c, &e);
    }
    whale_err err;
    idle_timeout(c, 0);
    whale_code rc = serve_engine_submit(s->eng, j, &err);
    if (rc) {
        idle_timeout(c, (unsigned)s->cfg.upload_seconds);
        serve_error_set(&e, 503, "server_error", NULL, rc == WHALE_ERR_RANGE ? "server_busy" : "shutting_down", "%s",
                        err.msg);
        stream_free(st);
        return respond_error(s, c, &e);
    }
    pthread_mutex_lock(&s->metrics.mu);
    s->replying++;
    pthread_mutex_unlock(&s->metrics.mu);
    cc->replying = 1;
    if (st->req.stream && st->req.tools && !(st->ts = serve_toolstream_new())) {
        stream_free(st);
        return respond_json(s, c, 500, NULL);
    }
    if (st->req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
        if (!r) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        keep_alive(s, r);
        count_status(s, 200);
        enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ok;
    }
    int status;
    char *json = wait_whole(st, &status);
    stream_free(st);
    if (!json) return MHD_NO; /* the client is gone */
    idle_timeout(c, (unsigned)s->cfg.upload_seconds);
    return respond_json(s, c, status, json);
}

/* ------------------------------------------------------------ other endpoints */

static char *health_json(serve_server *s) {
    pthread_mutex_lock(&s->metrics.mu);
    int busy = s->metrics.slots_busy, queued = s->metrics.queue_depth;
    pthread_mutex_unlock(&s->metrics.mu);
    char *out = malloc(512);
    if (out)
        snprintf(out, 512,
                 "{\"status\":\"%s\",\"model\":\"%s\",\"dtype\":\"%s\",\"parallel\":%d,\"ctx_size\":%d,\"kv_cache_bytes\":%zu,"
                 "\"slots_busy\":%d,\"queue_depth\":%d}",
                 serve_engine_draining(s->eng) ? "draining" : "ok", s->tx.model_name, whale_dtype_name(s->cfg.dtype), s->cfg.parallel, s->tx.ctx,
                 serve_engine_kv_bytes(s->eng), busy, queued);
    return out;
}

static enum MHD_Result handle(serve_server *s, struct MHD_Connection *c, conn_ctx *cc) {
    serve_error e;
    char *out = NULL;
    const char *body = cc->body ? cc->body : "";
    switch (cc->ep) {
    case SERVE_EP_CHAT:
    case SERVE_EP_COMPLETIONS: return handle_generation(s, c, cc);
    case SERVE_EP_MODELS: return respond_json(s, c, 200, serve_models_json(&s->tx, (long)time(NULL)));
    case SERVE_EP_HEALTH: return respond_json(s, c, serve_engine_draining(s->eng) ? 503 : 200, health_json(s));
    case SERVE_EP_METRICS:
        return respond(s, c, 200, "text/plain; version=0.0.4",
                       serve_metrics_text(&s->metrics, serve_engine_kv_bytes(s->eng), s->cfg.parallel, s->tx.ctx),
                       NULL);
    case SERVE_EP_TOKENIZE:
        if (serve_tokenize(&s->tx, body, cc->len, &out, &e)) return respond_error(s, c, &e);
        return respond_json(s, c, 200, out);
    case SERVE_EP_DETOKENIZE:
        if (serve_detokenize(&s->tx, body, cc->len, &out, &e)) return respond_error(s, c, &e);
        return respond_json(s, c, 200, out);
    case SERVE_EP_PAGE: return respond(s, c, 200, "text/html; charset=utf-8", strdup(serve_page_html), NULL);
    }
    return MHD_NO;
}

/* ------------------------------------------------------------ the head */

/* The first call for a request: route, authenticate, check the declared
 * size (request.c). */
static enum MHD_Result first_call(serve_server *s, struct MHD_Connection *c, const char *url, const char *method,
                                  void **con_cls) {
    conn_ctx *cc = calloc(1, sizeof *cc);
    if (!cc) return MHD_NO;
    cc->t0 = whale_now();
    *con_cls = cc;
    snprintf(cc->line, sizeof cc->line, "%.16s %.140s", method, url);
    for (char *p = cc->line; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?'; /* one line, no escapes */
    last_status = 0;
    serve_error e;
    int routed;
    int bad = serve_check_head(&s->cfg, method, url, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
                               MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length"), &cc->ep, &routed, &e);
    if (routed) {
        pthread_mutex_lock(&s->metrics.mu);
        s->metrics.requests[cc->ep]++;
        pthread_mutex_unlock(&s->metrics.mu);
    }
    return bad ? respond_error(s, c, &e) : MHD_YES;
}

enum MHD_Result serve_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    serve_server *s = cls;
    (void)version;
    conn_ctx *cc = *con_cls;
    if (!cc) return first_call(s, c, url, method, con_cls);
    if (*upload_size) { /* a part of the body */
        if (cc->len + *upload_size > s->cfg.max_body || whale_now() - cc->t0 > s->cfg.upload_seconds)
            return MHD_NO; /* chunked past the limit, or too slow: close */
        if (cc->len + *upload_size + 1 > cc->cap) {
            size_t cap = cc->cap ? cc->cap : 4096;
            while (cap < cc->len + *upload_size + 1) cap *= 2;
            char *grown = realloc(cc->body, cap);
            if (!grown) return MHD_NO;
            cc->body = grown, cc->cap = cap;
        }
        memcpy(cc->body + cc->len, upload, *upload_size);
        cc->len += *upload_size;
        cc->body[cc->len] = 0;
        *upload_size = 0;
        return MHD_YES;
    }
    serve_deadline_set(s->deadlines, c, 0);
    if (whale_now() - cc->t0 > s->cfg.upload_seconds)
        return fail(s, c, 408, "invalid_request_error", "timeout", "the request took more than %d s to arrive",
                    s->cfg.upload_seconds);
    return handle(s, c, cc);
}

void serve_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    serve_server *s = cls;
    serve_deadline_set(s->deadlines, c, 1); /* the next request on the connection may begin */
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (cc->replying) {
        pthread_mutex_lock(&s->metrics.mu);
        s->replying--;
        pthread_mutex_unlock(&s->metrics.mu);
    }
    if (s->cfg.verbose) {
        const char *how = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed)";
        fprintf(stderr, "serve: %s -> %d in %.1f ms%s\n", cc->line, last_status, (whale_now() - cc->t0) * 1e3,
                how);
    }
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}
