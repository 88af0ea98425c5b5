/* The server's requests, without a socket: the input is an HTTP/1.1
 * request as a client sends it ("METHOD URL HTTP/1.1", header lines,
 * an empty line, the body). Its method, path, Authorization and
 * Content-Length go through serve_check_head as libmicrohttpd hands them
 * to the server; a body of at most max_body bytes then through what its
 * endpoint does before the engine: serve_parse_generation (chat and
 * completions: fields, the chat template, the real Qwen3 tokenizer, the
 * context), serve_tokenize, serve_detokenize, and for an accepted
 * generation the response objects and stream chunks. A refusal must be
 * an OpenAI-style 4xx whose JSON parses back; nothing but memory may be a
 * 500. */
#include "fuzz_util.h"
#include "serve/serve_impl.h"
#include "whale_tokenizer.h"

#include <cjson/cJSON.h>
#include <strings.h>

#define MAX_BODY 16384

static serve_config cfg;
static serve_text tx;
static pthread_mutex_t text_mu = PTHREAD_MUTEX_INITIALIZER;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *base = getenv("WHALE_TOKENIZERS") ? getenv("WHALE_TOKENIZERS") : WHALE_FUZZ_TOKENIZERS;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3", base);
    whale_err err;
    whale_tokenizer *tok;
    whale_chat_template *tpl;
    if (whale_tokenizer_load(dir, &tok, &err) || whale_chat_template_load(dir, NULL, &tpl, &err)) {
        fprintf(stderr, "fuzz_http: %s (run scripts/fetch-tokenizers.sh)\n", err.msg);
        exit(1);
    }
    cfg = serve_config_defaults();
    cfg.api_key = "sekret-key";
    cfg.max_body = MAX_BODY;
    tx.model_name = "m";
    tx.tok = tok;
    tx.text_mu = &text_mu;
    tx.tpl = tpl;
    tx.vocab = whale_tokenizer_vocab_size(tok);
    tx.ctx = 256;
    tx.defaults = whale_sampler_defaults();
    return 0;
}

/* A refusal: a 4xx (a 500 only for memory) whose error object parses. */
static void check_error(const serve_error *e) {
    if (!(e->status >= 400 && e->status < 500) && !(e->status == 500 && strstr(e->message, "out of memory"))) {
        fprintf(stderr, "fuzz_http: status %d: %s\n", e->status, e->message);
        abort();
    }
    char *json = serve_error_json(e);
    cJSON *back = json ? cJSON_Parse(json) : NULL;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(back, "error");
    if (!e->message[0] || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "message"))) abort();
    cJSON_Delete(back);
    free(json);
}

static void check_json(char *json) {
    if (!json) return; /* out of memory */
    cJSON *back = cJSON_Parse(json);
    if (!back) abort();
    cJSON_Delete(back);
    free(json);
}

/* What a generation's responses are made of, with the body's first bytes
 * as the generated text (tool calls are parsed from it when tools were
 * given). */
static void responses(const serve_gen_request *req, const serve_job *j, const char *text, size_t len) {
    serve_usage u = {3, 2, 1};
    check_json(serve_completion_json(&tx, req, "id-1", 1, text, len, "stop", &u, j, 0));
    for (int k = 0; k < 3; k++) {
        long offset = 0;
        serve_chunk ch = {text, len, k == 0, k == 1 ? "length" : NULL, k == 2 ? &u : NULL, j, 0, 0, &offset, NULL};
        char *ev = serve_chunk_event(&tx, req, "id-1", 1, &ch);
        if (ev && (strncmp(ev, "data: ", 6) || strlen(ev) < 8 || strcmp(ev + strlen(ev) - 2, "\n\n"))) abort();
        free(ev);
    }
}

static void body(serve_endpoint ep, const char *b, size_t n) {
    serve_error e;
    char *out = NULL;
    if (ep == SERVE_EP_CHAT || ep == SERVE_EP_COMPLETIONS) {
        serve_job *j = serve_job_new();
        serve_gen_request req;
        if (!j) return;
        if (serve_parse_generation(&tx, ep == SERVE_EP_CHAT, b, n, j, &req, &e)) {
            check_error(&e);
        } else {
            if (j->n_prompt < 1 || j->n_prompt >= tx.ctx || j->max_tokens < 1 || j->n_prompt + j->max_tokens > tx.ctx ||
                j->n_stop > SERVE_MAX_STOP)
                abort();
            for (int i = 0; i < j->n_prompt; i++)
                if (j->prompt[i] < 0 || j->prompt[i] >= tx.vocab) abort();
            responses(&req, j, b, n < 256 ? n : 256);
        }
        free(req.prompt_text);
        serve_job_release(NULL, j);
    } else if (ep == SERVE_EP_TOKENIZE || ep == SERVE_EP_DETOKENIZE) {
        int bad = ep == SERVE_EP_TOKENIZE ? serve_tokenize(&tx, b, n, &out, &e) : serve_detokenize(&tx, b, n, &out, &e);
        if (bad) check_error(&e);
        else check_json(out);
    } else if (ep == SERVE_EP_MODELS) {
        check_json(serve_models_json(&tx, 1));
    }
}

/* The next line of the head (without its CR LF); NULL at the end. */
static const char *next_line(const char **p, const char *end, size_t *len) {
    if (*p >= end) return NULL;
    const char *s = *p, *nl = memchr(s, '\n', (size_t)(end - s));
    const char *e = nl ? nl : end;
    *p = nl ? nl + 1 : end;
    *len = (size_t)(e - s) - (e > s && e[-1] == '\r');
    return s;
}

/* A NUL-terminated copy of at most cap - 1 bytes. */
static void copy(char *dst, size_t cap, const char *s, size_t n) {
    if (n >= cap) n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t nh, nb;
    const uint8_t *pb;
    fuzz_split(data, size, "\r\n\r\n", &nh, &pb, &nb);
    const char *p = (const char *)data, *end = p + nh;
    size_t n;
    const char *line = next_line(&p, end, &n);
    if (!line) return 0;
    char method[32], url[4096], auth[1024], clen[64];
    const char *sp = memchr(line, ' ', n);
    if (!sp) return 0;
    copy(method, sizeof method, line, (size_t)(sp - line));
    const char *u = sp + 1, *ue = memchr(u, ' ', n - (size_t)(u - line));
    copy(url, sizeof url, u, ue ? (size_t)(ue - u) : n - (size_t)(u - line));
    int have_auth = 0, have_len = 0;
    while ((line = next_line(&p, end, &n))) {
        const char *colon = memchr(line, ':', n);
        if (!colon) continue;
        size_t kn = (size_t)(colon - line), vn = n - kn - 1;
        const char *v = colon + 1;
        while (vn && (*v == ' ' || *v == '\t')) v++, vn--;
        if (!have_auth && kn == 13 && !strncasecmp(line, "Authorization", 13)) copy(auth, sizeof auth, v, vn), have_auth = 1;
        if (!have_len && kn == 14 && !strncasecmp(line, "Content-Length", 14)) copy(clen, sizeof clen, v, vn), have_len = 1;
    }
    serve_endpoint ep;
    serve_error e;
    int routed;
    if (serve_check_head(&cfg, method, url, have_auth ? auth : NULL, have_len ? clen : NULL, &ep, &routed, &e)) {
        check_error(&e);
        return 0;
    }
    if (nb > cfg.max_body) return 0; /* the server closes the connection there */
    char *b = malloc(nb + 1); /* as the server holds a body */
    if (!b) return 0;
    memcpy(b, pb, nb);
    b[nb] = 0;
    body(ep, b, nb);
    free(b);
    return 0;
}
