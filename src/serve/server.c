/* Starting and stopping `whale serve`: model, tokenizer, template, engine, daemon. */
#include "serve/serve_impl.h"

#include "core/core.h"
#include "whale_chat.h"
#include "whale_lora.h"

#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

serve_config serve_config_defaults(void) {
    serve_config c;
    memset(&c, 0, sizeof c);
    c.host = "127.0.0.1";
    c.port = 8080;
    c.dtype = WHALE_F32;
    c.parallel = 4;
    c.ctx_size = 0;
    c.batch = 512;
    c.queue = 64;
    c.max_body = (size_t)8 << 20;
    c.upload_seconds = 30;
    c.max_connections = 256;
    c.stream_interval = 1;
    c.sampling = whale_sampler_defaults(); /* OpenAI's: temperature 1, top_p 1 */
    return c;
}

static whale_code check_config(const serve_config *c, whale_err *err) {
    if (!c->model_dir) return whale_errf(err, WHALE_ERR_ARG, "serve: a model folder is required");
    if (c->parallel < 1 || c->parallel > 1024) return whale_errf(err, WHALE_ERR_ARG, "serve: --parallel must be in [1, 1024]");
    if (c->batch < 1 || c->queue < 0 || c->max_body < 1 || c->upload_seconds < 1 || c->max_connections < 1)
        return whale_errf(err, WHALE_ERR_ARG, "serve: --batch, --queue, --max-body, --timeout, --max-connections out of range");
    if (c->stream_interval < 1 || c->stream_interval > 1024)
        return whale_errf(err, WHALE_ERR_ARG, "serve: --stream-interval must be in [1, 1024]");
    if (c->port < 0 || c->port > 65535) return whale_errf(err, WHALE_ERR_ARG, "serve: --port must be in [0, 65535]");
    if (c->n_adapters < 0 || c->n_adapters > SERVE_MAX_ADAPTERS || (c->n_adapters && !c->adapters))
        return whale_errf(err, WHALE_ERR_ARG, "serve: --adapters takes at most %d adapters", SERVE_MAX_ADAPTERS);
    return WHALE_OK;
}

/* The last component of the folder's path ("models/qwen/" → "qwen"). */
static char *default_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    return strndup(dir + b, n - b);
}

static whale_code load_text(serve_server *s, whale_err *err) {
    const serve_config *c = &s->cfg;
    whale_code rc = whale_tokenizer_load(c->model_dir, &s->tok, err);
    if (rc) return rc;
    int tv = whale_tokenizer_vocab_size(s->tok), mv = whale_model_vocab_size(s->m);
    if (tv > mv)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: the tokenizer has %d ids but the model's embedding only %d rows",
                          c->model_dir, tv, mv);
    if ((rc = whale_chat_template_load(c->model_dir, c->chat_template, &s->tpl, err))) return rc;
    if (whale_chat_template_notice(s->tpl)) fprintf(stderr, "whale: %s\n", whale_chat_template_notice(s->tpl));
    pthread_mutex_init(&s->text_mu, NULL);
    s->tx.model_name = s->name;
    s->tx.tok = s->tok;
    s->tx.text_mu = &s->text_mu;
    s->tx.tpl = s->tpl;
    s->tx.vocab = mv;
    s->tx.defaults = c->sampling;
    return WHALE_OK;
}

/* A name requests can give: 1..SERVE_MAX_ADAPTER_NAME of letters, digits and ._-:/@+ */
static int good_name(const char *n) {
    size_t len = strlen(n);
    return len >= 1 && len <= SERVE_MAX_ADAPTER_NAME &&
           strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/@+") == len;
}

/* --adapters: each folder loaded once beside the model, under a name of
 * its own; the ids requests may give are the base's, then these. */
static whale_code load_adapters(serve_server *s, whale_err *err) {
    const serve_config *c = &s->cfg;
    int n = c->n_adapters;
    s->adapters = calloc((size_t)n + 1, sizeof *s->adapters);
    s->ids = calloc((size_t)n + 1, sizeof *s->ids);
    if (!s->adapters || !s->ids) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    s->ids[0] = s->name;
    for (int k = 0; k < n; k++) {
        const serve_adapter *a = &c->adapters[k];
        if (!good_name(a->name))
            return whale_errf(err, WHALE_ERR_ARG, "serve: --adapters: the name \"%.200s\" must be 1 to %d letters, "
                              "digits or ._-:/@+", a->name, SERVE_MAX_ADAPTER_NAME);
        for (int i = 0; i <= k; i++)
            if (!strcmp(a->name, s->ids[i]))
                return whale_errf(err, WHALE_ERR_ARG, "serve: --adapters: the name \"%s\" is given twice%s", a->name,
                                  i ? "" : " (it is the base model's)");
        whale_code rc = whale_adapter_load(s->m, a->dir, &s->adapters[k], err);
        if (rc) return rc;
        s->ids[k + 1] = a->name;
    }
    s->tx.model_ids = s->ids;
    s->tx.n_models = n + 1;
    if (serve_metrics_set_models(&s->metrics, n + 1, s->ids))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    return WHALE_OK;
}

/* Stop ids: the template's end-of-turn tokens, the config's and the tokenizer's EOS. */
static int stop_ids(const serve_server *s, int32_t *ids) {
    int n = whale_chat_template_stop_ids(s->tok, s->tpl, ids, 16);
    if (n > 16) n = 16;
    int k = whale_model_eos_ids(s->m, ids + n, 8);
    n += k > 8 ? 8 : k;
    int32_t eos = whale_tokenizer_role_id(s->tok, WHALE_TOKEN_EOS);
    if (eos >= 0) ids[n++] = eos;
    return n;
}

static whale_code start_daemon(serve_server *s, whale_err *err) {
    const serve_config *c = &s->cfg;
    char port[16];
    snprintf(port, sizeof port, "%d", c->port);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int g = getaddrinfo(c->host, port, &hints, &ai);
    if (g) return whale_errf(err, WHALE_ERR_ARG, "serve: --host %s: %s", c->host, gai_strerror(g));
    whale_code rc = serve_deadlines_start(c->max_connections, c->upload_seconds, &s->deadlines, err);
    if (rc) {
        freeaddrinfo(ai);
        return rc;
    }
    unsigned flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)c->port, NULL, NULL, serve_on_request, s, MHD_OPTION_SOCK_ADDR,
                            ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)c->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)c->upload_seconds, MHD_OPTION_NOTIFY_COMPLETED,
                            serve_on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, serve_on_connection, s,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) return whale_errf(err, WHALE_ERR_IO, "serve: cannot listen on %s port %d (in use?)", c->host, c->port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : c->port;
    return WHALE_OK;
}

whale_code serve_open(const serve_config *cfg, serve_server **out, whale_err *err) {
    *out = NULL;
    whale_code rc = check_config(cfg, err);
    if (rc) return rc;
    serve_server *s = calloc(1, sizeof *s);
    if (!s) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    s->cfg = *cfg;
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    serve_metrics_init(&s->metrics);
    s->name = cfg->model_name ? strdup(cfg->model_name) : default_name(cfg->model_dir);
    if (!s->name) rc = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if (!rc) rc = whale_model_load_as(cfg->model_dir, cfg->dtype, &s->m, err);
    if (!rc) rc = whale_model_own_weights(s->m, err);
    if (!rc) rc = load_text(s, err);
    if (!rc) rc = load_adapters(s, err); /* before the session: its scratch fits their ranks */
    if (!rc) {
        int maxpos = whale_model_max_positions(s->m);
        s->cfg.ctx_size = cfg->ctx_size > 0 ? cfg->ctx_size : (maxpos < 4096 ? maxpos : 4096);
        if (s->cfg.ctx_size > maxpos)
            rc = whale_errf(err, WHALE_ERR_RANGE, "serve: --ctx-size %d exceeds the model's %d positions",
                            s->cfg.ctx_size, maxpos);
        if (s->cfg.ctx_size < 2) rc = whale_errf(err, WHALE_ERR_RANGE, "serve: --ctx-size must be at least 2");
        s->tx.ctx = s->cfg.ctx_size;
    }
    int32_t ids[32];
    if (!rc)
        rc = serve_engine_new(s->m, s->tok, ids, stop_ids(s, ids), s->adapters, s->cfg.n_adapters, &s->cfg, &s->metrics,
                              &s->eng, err);
    if (!rc) rc = start_daemon(s, err);
    if (rc) {
        serve_close(s);
        return rc;
    }
    *out = s;
    return WHALE_OK;
}

int serve_port(const serve_server *s) { return s->port; }

void serve_describe(const serve_server *s, FILE *f) {
    for (int k = 0; k < s->cfg.n_adapters; k++)
        fprintf(f, "serve: adapter \"%s\": %d weights, rank %d, %lld parameters\n", s->ids[k + 1],
                whale_adapter_count(s->adapters[k]), whale_adapter_rank(s->adapters[k]),
                (long long)whale_adapter_num_params(s->adapters[k]));
    fprintf(f, "serve: model \"%s\" (%s, %s template), %d slots x %d cells, KV cache %.1f MiB, on http://%s%s%s:%d/\n",
            s->name, whale_dtype_name(s->cfg.dtype), whale_chat_template_name(s->tpl), s->cfg.parallel, s->cfg.ctx_size,
            serve_engine_kv_bytes(s->eng) / 1048576.0, strchr(s->cfg.host, ':') ? "[" : "", s->cfg.host,
            strchr(s->cfg.host, ':') ? "]" : "", s->port);
}

int serve_drain(serve_server *s, double timeout) {
    return !s || !s->eng || serve_engine_drain(s->eng, timeout);
}

void serve_close(serve_server *s) {
    if (!s) return;
    /* the engine first: it cancels what runs, so connection threads waiting
     * for a job return, each sending its reply's end (finish_reason
     * "cancelled"); then, once they have (at most 2 s: a client that does
     * not read holds its thread), the daemon, which closes the connections
     * and joins their threads */
    if (s->d) MHD_quiesce_daemon(s->d);
    serve_engine_stop(s->eng);
    for (int i = 0; s->d && i < 200; i++) {
        pthread_mutex_lock(&s->metrics.mu);
        int replying = s->replying;
        pthread_mutex_unlock(&s->metrics.mu);
        if (!replying) break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    serve_deadlines_stop(s->deadlines);
    serve_engine_free(s->eng);
    whale_chat_template_free(s->tpl);
    whale_tokenizer_free(s->tok);
    if (s->tx.text_mu) pthread_mutex_destroy(&s->text_mu);
    whale_model_free(s->m); /* and the adapters it holds */
    serve_metrics_destroy(&s->metrics);
    free(s->adapters);
    free(s->ids);
    free(s->name);
    free(s);
}
