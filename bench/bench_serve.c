/*
 * Throughput and latency of a running `whale serve` at several
 * concurrencies: N streams at once (one libcurl multi handle, one thread),
 * each a different prompt, greedy, a fixed number of tokens (ignore_eos).
 * Per concurrency, one JSON line: aggregate tokens/s (all generated tokens
 * over the wall time of the round, prefill included), aggregate decode
 * tokens/s (each stream's tokens after its first over the time from its
 * first text to its usage chunk, summed over the streams), time to first
 * token and inter-token latency (p50, p99), the server's mean time per step
 * and its phases (the batched forward, sampling, publishing the text to the
 * connections; from /metrics), the most sequences it put in one forward,
 * and this client's own processor time per token.
 *
 *   bench_serve URL MODEL[,MODEL...] [TOKENS (64)] [CONCURRENCIES (1,4,8,16)] [KEY]
 *
 * Several models (the base and its adapters): stream i asks for the i-th,
 * round robin. Speed is measured, never asserted.
 *
 * Why C and libcurl: on a small machine the client shares the cores with
 * the server, and every microsecond it spends on a token is taken from the
 * forward. A node:http client used ~100 us of processor time a token on a
 * 2-core Zen 5 at eight streams; this one ~50 with curl_multi_perform and
 * curl_multi_poll, 29-33 once SIGPIPE is ignored once instead of around
 * every libcurl call, and 25-29 driven by epoll (libcurl told which socket
 * is ready). The events are still parsed as JSON (cJSON), over real
 * HTTP/1.1 with chunked transfer (libcurl), as a program would.
 */
#include <cjson/cJSON.h>
#include <curl/curl.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>

#define MAX_STREAMS 256
#define MAX_EVENT (16u << 20) /* bytes of one server-sent event, at most */

typedef struct {
    CURL *h;
    char *body;            /* the request */
    char *buf;             /* bytes received, not yet a whole event */
    size_t n, cap;
    double t0, t_end;      /* request sent; usage chunk received */
    double *times;         /* arrival of each chunk with text */
    int n_times, max_times;
    int n_tokens;          /* usage.completion_tokens */
    int failed;            /* 1 an event that is not JSON, 2 one over MAX_EVENT */
} stream_t;

static const char *g_url, *g_key;
static struct curl_slist *g_headers;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_serve: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* ------------------------------------------------------------ events */

/* One server-sent event: a chunk with text is a token's arrival, the
 * usage chunk ends the stream's timing. */
static void on_event(stream_t *s, const char *ev, size_t len) {
    if (len < 7 || memcmp(ev, "data: {", 7)) return; /* [DONE], comments */
    cJSON *o = cJSON_ParseWithLength(ev + 6, len - 6);
    if (!o) {
        s->failed = 1;
        return;
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(o, "usage");
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(choice, "text");
    if (cJSON_IsObject(usage)) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        s->n_tokens = cJSON_IsNumber(n) ? n->valueint : 0;
        s->t_end = now();
    } else if (cJSON_IsString(text) && text->valuestring[0] && s->n_times < s->max_times) {
        s->times[s->n_times++] = now();
    }
    cJSON_Delete(o);
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg) {
    stream_t *s = arg;
    size_t len = size * nmemb;
    if (s->n + len > MAX_EVENT) {
        s->failed = 2; /* libcurl ends the transfer with an error */
        return 0;
    }
    if (s->n + len + 1 > s->cap) {
        size_t cap = 2 * (s->n + len + 1);
        char *b = realloc(s->buf, cap);
        if (!b) return 0; /* libcurl ends the transfer with an error */
        s->buf = b, s->cap = cap;
    }
    memcpy(s->buf + s->n, p, len);
    s->n += len;
    size_t at = 0;
    for (;;) {
        char *end = s->n - at >= 2 ? memmem(s->buf + at, s->n - at, "\n\n", 2) : NULL;
        if (!end) break;
        on_event(s, s->buf + at, (size_t)(end - (s->buf + at)));
        at = (size_t)(end - s->buf) + 2;
    }
    memmove(s->buf, s->buf + at, s->n - at);
    s->n -= at;
    return len;
}

/* ------------------------------------------------------------ requests */

static char *request_body(const char *model, int i, int tokens) {
    char prompt[96];
    snprintf(prompt, sizeof prompt, "Stream %d: once upon a time there was a whale that", i);
    cJSON *o = cJSON_CreateObject(), *so = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "prompt", prompt);
    cJSON_AddNumberToObject(o, "max_tokens", tokens);
    cJSON_AddNumberToObject(o, "temperature", 0);
    cJSON_AddTrueToObject(o, "ignore_eos");
    cJSON_AddTrueToObject(o, "stream");
    cJSON_AddTrueToObject(so, "include_usage");
    cJSON_AddItemToObject(o, "stream_options", so);
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body) die("out of memory");
    return body;
}

static void stream_setup(stream_t *s, CURL *h, const char *model, int i, int tokens) {
    free(s->body);
    *s = (stream_t){.h = h, .buf = s->buf, .cap = s->cap, .times = s->times, .max_times = tokens + 1};
    s->body = request_body(model, i, tokens);
    s->times = realloc(s->times, sizeof(double) * (size_t)s->max_times);
    if (!s->times) die("out of memory");
    char url[1024];
    snprintf(url, sizeof url, "%s/v1/completions", g_url);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, g_headers);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, s->body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* SIGPIPE is ignored once, in main */
    s->t0 = now();
}

/* GET URL/path into a string (the caller frees it). */
typedef struct {
    char *p;
    size_t n;
} text_t;

static size_t on_text(char *p, size_t size, size_t nmemb, void *arg) {
    text_t *t = arg;
    size_t len = size * nmemb;
    char *b = realloc(t->p, t->n + len + 1);
    if (!b) return 0;
    memcpy(b + t->n, p, len);
    t->p = b, t->n += len;
    b[t->n] = 0;
    return len;
}

static char *get_text(CURL *h, const char *path) {
    char url[1024];
    text_t t = {0};
    snprintf(url, sizeof url, "%s%s", g_url, path);
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, g_headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_text);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode c = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (c != CURLE_OK) die("GET %s: %s", url, curl_easy_strerror(c));
    if (status != 200) die("GET %s: HTTP %ld: %s", url, status, t.p ? t.p : "");
    if (!t.p && !(t.p = strdup(""))) die("out of memory");
    return t.p;
}

/* A value of the Prometheus text (a line "name value"), NaN when absent. */
static double metric(const char *text, const char *name) {
    size_t k = strlen(name);
    for (const char *p = text; *p;) {
        if (!strncmp(p, name, k) && p[k] == ' ') return strtod(p + k + 1, NULL);
        const char *nl = strchr(p, '\n');
        if (!nl) break;
        p = nl + 1;
    }
    return 0.0 / 0.0;
}

/* ------------------------------------------------------------ a round */

/* The streams' sockets in one epoll set that libcurl keeps up to date
 * (CURLMOPT_SOCKETFUNCTION), and its timer: each wake-up hands libcurl
 * only the sockets that are ready (curl_multi_socket_action). With
 * curl_multi_perform and curl_multi_poll, libcurl polled the sockets
 * again inside every perform: 2.2 poll calls a token at eight streams. */
typedef struct {
    int ep;
    double deadline; /* when libcurl's timer fires; < 0: none */
} loop_t;

static int on_socket(CURL *e, curl_socket_t fd, int what, void *arg, void *sockp) {
    (void)e, (void)sockp;
    loop_t *L = arg;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(L->ep, EPOLL_CTL_DEL, fd, NULL); /* fails harmlessly when closed already */
        return 0;
    }
    struct epoll_event ev = {.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u),
                             .data.fd = fd};
    if (epoll_ctl(L->ep, EPOLL_CTL_MOD, fd, &ev) && (errno != ENOENT || epoll_ctl(L->ep, EPOLL_CTL_ADD, fd, &ev)))
        die("epoll_ctl: %s", strerror(errno));
    return 0;
}

static int on_timer(CURLM *m, long ms, void *arg) {
    (void)m;
    loop_t *L = arg;
    L->deadline = ms < 0 ? -1 : now() + (double)ms * 1e-3;
    return 0;
}

static void socket_action(CURLM *multi, curl_socket_t fd, int flags, int *running) {
    CURLMcode mc = curl_multi_socket_action(multi, fd, flags, running);
    if (mc) die("%s", curl_multi_strerror(mc));
}

/* Run n streams at once to their ends; dies on a transfer or HTTP error. */
static void run_streams(CURLM *multi, loop_t *L, stream_t *st, int n, char **models, int n_models, int first,
                        int tokens) {
    for (int i = 0; i < n; i++) {
        int k = first + i;
        stream_setup(&st[i], st[i].h, models[((k % n_models) + n_models) % n_models], k, tokens);
        curl_multi_add_handle(multi, st[i].h);
    }
    int running = n;
    while (running) {
        double left = L->deadline < 0 ? 1.0 : L->deadline - now();
        struct epoll_event ev[64];
        int got = left <= 0 ? 0 : epoll_wait(L->ep, ev, 64, (int)(left * 1e3) + 1);
        if (got < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < got; i++) {
            const unsigned e = ev[i].events;
            socket_action(multi, ev[i].data.fd,
                          (e & EPOLLIN ? CURL_CSELECT_IN : 0) | (e & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                              (e & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0),
                          &running);
        }
        if (L->deadline >= 0 && now() >= L->deadline) {
            L->deadline = -1;
            socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
        }
    }
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(multi, &left)))
        for (int i = 0; i < n; i++)
            if (m->msg == CURLMSG_DONE && m->easy_handle == st[i].h && st[i].failed == 2)
                die("POST %s/v1/completions: an event of over %u bytes", g_url, MAX_EVENT);
            else if (m->msg == CURLMSG_DONE && m->easy_handle == st[i].h && m->data.result != CURLE_OK)
                die("POST %s/v1/completions: %s", g_url, curl_easy_strerror(m->data.result));
    for (int i = 0; i < n; i++) {
        long status = 0;
        curl_easy_getinfo(st[i].h, CURLINFO_RESPONSE_CODE, &status);
        curl_multi_remove_handle(multi, st[i].h);
        if (status != 200) die("POST %s/v1/completions: HTTP %ld: %.*s", g_url, status, (int)st[i].n, st[i].buf);
        if (st[i].failed) die("stream %d: an event that is not JSON", i);
        if (st[i].n_times == 0 || st[i].t_end == 0) die("stream %d: no text or no usage chunk", i);
    }
}

/* A JSON number with d decimals, or null (no gap between two tokens was
 * seen, a metric the server did not report). */
static void jnum(char out[32], double v, int d) {
    if (isfinite(v)) snprintf(out, 32, "%.*f", d, v);
    else snprintf(out, 32, "null");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *a, int n, double p) {
    if (n == 0) return 0.0 / 0.0;
    int k = (int)(p / 100 * n);
    return a[k < n - 1 ? k : n - 1];
}

/* What a round reads of /metrics, before it and after. */
typedef struct {
    double step_sum, steps, batch_max;
    double phase[3]; /* whale_step_phase_seconds_total: forward, sampling, publishing */
} server_stats;

static server_stats stats(CURL *h) {
    char *m = get_text(h, "/metrics");
    server_stats v = {metric(m, "whale_step_seconds_sum"),
                      metric(m, "whale_step_seconds_count"),
                      metric(m, "whale_batch_sequences_max"),
                      {metric(m, "whale_step_phase_seconds_total{phase=\"forward\"}"),
                       metric(m, "whale_step_phase_seconds_total{phase=\"sampling\"}"),
                       metric(m, "whale_step_phase_seconds_total{phase=\"publishing\"}")}};
    free(m);
    return v;
}

/* The round's line, from the streams' timings and the server's counts. */
static void report(const stream_t *st, int n, double wall, double cpu, server_stats s0, server_stats s1) {
    const double bmax = s1.batch_max;
    int total = 0, n_itl = 0;
    double decode = 0, *ttft = malloc(sizeof(double) * (size_t)n), *itl;
    for (int i = 0; i < n; i++) n_itl += st[i].n_times - 1;
    itl = malloc(sizeof(double) * (size_t)(n_itl > 0 ? n_itl : 1));
    if (!ttft || !itl) die("out of memory");
    n_itl = 0;
    for (int i = 0; i < n; i++) {
        const stream_t *s = &st[i];
        total += s->n_tokens;
        ttft[i] = s->times[0] - s->t0;
        if (s->t_end > s->times[0]) decode += (s->n_tokens - 1) / (s->t_end - s->times[0]);
        for (int k = 1; k < s->n_times; k++) itl[n_itl++] = s->times[k] - s->times[k - 1];
    }
    qsort(ttft, (size_t)n, sizeof(double), cmp_double);
    qsort(itl, (size_t)n_itl, sizeof(double), cmp_double);
    char f[11][32];
    jnum(f[0], total / wall, 1), jnum(f[1], decode, 1), jnum(f[2], 1e3 * pct(ttft, n, 50), 1);
    jnum(f[3], 1e3 * pct(ttft, n, 99), 1), jnum(f[4], 1e3 * pct(itl, n_itl, 50), 2);
    jnum(f[5], 1e3 * pct(itl, n_itl, 99), 2), jnum(f[6], 1e3 * (s1.step_sum - s0.step_sum) / (s1.steps - s0.steps), 3);
    jnum(f[7], total ? 1e6 * cpu / total : 0.0 / 0.0, 1);
    for (int k = 0; k < 3; k++) jnum(f[8 + k], 1e3 * (s1.phase[k] - s0.phase[k]) / (s1.steps - s0.steps), 3);
    printf("{\"concurrency\": %d, \"tokens\": %d, \"seconds\": %.3f, \"aggregate_tokens_per_s\": %s, "
           "\"decode_tokens_per_s\": %s, \"ttft_p50_ms\": %s, \"ttft_p99_ms\": %s, \"itl_p50_ms\": %s, "
           "\"itl_p99_ms\": %s, \"step_ms\": %s, \"forward_ms\": %s, \"sampling_ms\": %s, "
           "\"publishing_ms\": %s, \"batch_sequences_max\": %.0f, \"client_cpu_us_per_token\": %s}\n",
           n, total, wall, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[8], f[9], f[10], isfinite(bmax) ? bmax : 0,
           f[7]);
    fflush(stdout);
    free(ttft);
    free(itl);
}

/* ------------------------------------------------------------ main */

static int parse_list(char *s, int *out, int max) {
    int n = 0;
    for (char *t = strtok(s, ","); t; t = strtok(NULL, ",")) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || v < 1 || v > MAX_STREAMS) die("concurrencies: 1 to %d, comma-separated: \"%s\"", MAX_STREAMS, t);
        if (n == max) die("concurrencies: at most %d rounds", max);
        out[n++] = (int)v;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 6) {
        fprintf(stderr, "usage: bench_serve URL MODEL[,MODEL...] [TOKENS (64)] [CONCURRENCIES (1,4,8,16)] [KEY]\n");
        return 2;
    }
    g_url = argv[1], g_key = argc > 5 ? argv[5] : NULL;
    for (size_t k = strlen(argv[1]); k > 0 && argv[1][k - 1] == '/'; k--) argv[1][k - 1] = 0; /* URL/ is URL */
    char *models[64], conc_arg[256] = "1,4,8,16";
    int n_models = 0, conc[64];
    for (char *t = strtok(argv[2], ","); t; t = strtok(NULL, ",")) {
        if (n_models == 64) die("MODEL: at most 64 names");
        models[n_models++] = t;
    }
    if (!n_models) die("MODEL: a name is needed");
    char *end;
    long tokens = argc > 3 ? strtol(argv[3], &end, 10) : 64;
    if (argc > 3 && (*end || tokens < 1 || tokens > 1000000)) die("TOKENS: an integer from 1: \"%s\"", argv[3]);
    if (argc > 4) snprintf(conc_arg, sizeof conc_arg, "%s", argv[4]);
    int n_conc = parse_list(conc_arg, conc, 64), most = 1;
    for (int k = 0; k < n_conc; k++) most = conc[k] > most ? conc[k] : most;

    /* A server that closes a stream's connection must not kill the client:
     * SIGPIPE ignored here, once, rather than by libcurl around every call
     * (two rt_sigaction calls each time: three a token at eight streams,
     * a quarter of the client's processor time on a machine where a
     * system call costs a microsecond). */
    signal(SIGPIPE, SIG_IGN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) die("libcurl did not start");
    g_headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (g_key) {
        char auth[512];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", g_key);
        g_headers = curl_slist_append(g_headers, auth);
    }
    CURLM *multi = curl_multi_init();
    CURL *get = curl_easy_init();
    stream_t *st = calloc((size_t)most, sizeof *st);
    if (!multi || !get || !st) die("out of memory");
    for (int i = 0; i < most; i++)
        if (!(st[i].h = curl_easy_init())) die("out of memory");
    loop_t L = {epoll_create1(EPOLL_CLOEXEC), -1};
    if (L.ep < 0) die("epoll_create1: %s", strerror(errno));
    curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, &L);
    curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(multi, CURLMOPT_TIMERDATA, &L);

    run_streams(multi, &L, st, 1, models, n_models, -1, (int)tokens); /* warm up */
    for (int k = 0; k < n_conc; k++) {
        const server_stats s0 = stats(get);
        double t0 = now(), cpu0 = cpu_seconds();
        run_streams(multi, &L, st, conc[k], models, n_models, 0, (int)tokens);
        double wall = now() - t0, cpu = cpu_seconds() - cpu0;
        report(st, conc[k], wall, cpu, s0, stats(get));
    }
    for (int i = 0; i < most; i++) {
        curl_easy_cleanup(st[i].h);
        free(st[i].body), free(st[i].buf), free(st[i].times);
    }
    free(st);
    curl_easy_cleanup(get);
    curl_multi_cleanup(multi);
    close(L.ep);
    curl_slist_free_all(g_headers);
    curl_global_cleanup();
    return 0;
}
