/* GET /metrics: counters, gauges and histograms in Prometheus' text format. */
#include "serve/serve_impl.h"

#include "core/sbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double seconds_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double seqs_le[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

void serve_metrics_init(serve_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    serve_hist *secs[] = {&m->ttft, &m->latency, &m->step};
    for (int i = 0; i < 3; i++) secs[i]->le = seconds_le, secs[i]->n = 12;
    m->batch_seqs.le = seqs_le;
    m->batch_seqs.n = 9;
}

int serve_metrics_set_models(serve_metrics *m, int n, const char *const *ids) {
    m->model_requests = calloc((size_t)n, sizeof *m->model_requests);
    m->model_generated = calloc((size_t)n, sizeof *m->model_generated);
    if (!m->model_requests || !m->model_generated) return -1;
    m->n_models = n;
    m->model_ids = ids;
    return 0;
}

void serve_metrics_destroy(serve_metrics *m) {
    free(m->model_requests);
    free(m->model_generated);
    pthread_mutex_destroy(&m->mu);
}

void serve_hist_add(serve_hist *h, double v) {
    int b = 0;
    while (b < h->n && v > h->le[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->total++;
}

static void put_hist(whale_sbuf *s, const char *name, const char *help, const serve_hist *h) {
    whale_sb_printf(s, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < h->n; b++) {
        cum += h->count[b];
        whale_sb_printf(s, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[b], (unsigned long long)cum);
    }
    whale_sb_printf(s, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->total, name,
        h->sum, name, (unsigned long long)h->total);
}

static void put_one(whale_sbuf *s, const char *name, const char *type, const char *help, double v) {
    whale_sb_printf(s, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* A label value as the text format escapes it (backslash, quote, newline). */
static void put_label(whale_sbuf *s, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') whale_sb_printf(s, "\\%c", *v);
        else if (*v == '\n') whale_sb_printf(s, "\\n");
        else whale_sb_printf(s, "%c", *v);
    }
}

/* counter name{model="id"} for every model id */
static void put_per_model(whale_sbuf *s, const serve_metrics *m, const char *name, const char *help, const uint64_t *v) {
    whale_sb_printf(s, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (int k = 0; k < m->n_models; k++) {
        whale_sb_printf(s, "%s{model=\"", name);
        put_label(s, m->model_ids[k]);
        whale_sb_printf(s, "\"} %llu\n", (unsigned long long)v[k]);
    }
}

char *serve_metrics_text(serve_metrics *m, size_t kv_bytes, int parallel, int ctx) {
    static const char *eps[] = {"chat_completions", "completions", "models", "health",
                                "metrics", "tokenize", "detokenize", "page"};
    static const char *classes[] = {"2xx", "400", "401", "404", "413", "503"};
    whale_sbuf s = {0};
    pthread_mutex_lock(&m->mu);
    whale_sb_printf(&s, "# HELP whale_requests_total HTTP requests by endpoint\n# TYPE whale_requests_total counter\n");
    for (int i = 0; i < 8; i++)
        whale_sb_printf(&s, "whale_requests_total{endpoint=\"%s\"} %llu\n", eps[i], (unsigned long long)m->requests[i]);
    whale_sb_printf(&s, "# HELP whale_responses_total HTTP responses by status\n# TYPE whale_responses_total counter\n");
    for (int i = 0; i < 6; i++)
        whale_sb_printf(&s, "whale_responses_total{status=\"%s\"} %llu\n", classes[i], (unsigned long long)m->responses[i]);
    put_one(&s, "whale_prompt_tokens_total", "counter", "prompt tokens of admitted requests", (double)m->prompt_tokens);
    put_one(&s, "whale_prompt_tokens_reused_total", "counter", "prompt tokens whose KV cells came from the cache",
            (double)m->reused_tokens);
    put_one(&s, "whale_generated_tokens_total", "counter", "tokens sampled", (double)m->generated_tokens);
    put_one(&s, "whale_requests_aborted_total", "counter", "generations cancelled by their client or failed",
            (double)m->cancelled);
    put_one(&s, "whale_decode_steps_total", "counter", "batched forward passes", (double)m->decode_steps);
    put_one(&s, "whale_queue_depth", "gauge", "requests waiting for a slot", m->queue_depth);
    put_one(&s, "whale_slots_busy", "gauge", "slots holding a request", m->slots_busy);
    put_one(&s, "whale_slots", "gauge", "slots (--parallel)", parallel);
    put_one(&s, "whale_ctx_size", "gauge", "KV cells per slot (--ctx-size)", ctx);
    put_one(&s, "whale_kv_cache_bytes", "gauge", "KV cache memory, fixed at start", (double)kv_bytes);
    put_one(&s, "whale_batch_sequences", "gauge", "sequences in the last batched forward", m->batch_seqs_last);
    put_one(&s, "whale_batch_sequences_max", "gauge", "most sequences in one batched forward so far",
            m->batch_seqs_max);
    put_hist(&s, "whale_batch_sequences_per_step", "sequences per batched forward", &m->batch_seqs);
    put_hist(&s, "whale_step_seconds", "time of one step: a batched forward, its sampling and publishing", &m->step);
    static const char *phases[] = {"forward", "sampling", "publishing"};
    whale_sb_printf(&s, "# HELP whale_step_phase_seconds_total time of the steps by phase: the batched forward, "
                        "drawing the tokens, publishing their text to the connections\n"
                        "# TYPE whale_step_phase_seconds_total counter\n");
    for (int i = 0; i < 3; i++)
        whale_sb_printf(&s, "whale_step_phase_seconds_total{phase=\"%s\"} %.9g\n", phases[i], m->phase_seconds[i]);
    put_hist(&s, "whale_time_to_first_token_seconds", "from submission to the first generated token", &m->ttft);
    put_hist(&s, "whale_request_seconds", "from submission to the end of generation", &m->latency);
    put_per_model(&s, m, "whale_model_requests_total", "finished generations by model (the base or an adapter)",
                  m->model_requests);
    put_per_model(&s, m, "whale_model_generated_tokens_total", "tokens sampled by model (the base or an adapter)",
                  m->model_generated);
    pthread_mutex_unlock(&m->mu);
    if (s.oom) {
        free(s.p);
        return NULL;
    }
    return s.p;
}
