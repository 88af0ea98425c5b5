/*
 * What a request's head must satisfy before its body is read: a route, the
 * method of that route, the API key, a declared size within max_body. Apart
 * from the HTTP library, so that it can be checked (and fuzzed) without a
 * socket.
 */
#include "serve/serve_impl.h"

#include <stdlib.h>
#include <string.h>

static int route(const char *url, const char *method, serve_endpoint *ep, int *post) {
    static const struct {
        const char *path;
        serve_endpoint ep;
        int post;
    } routes[] = {{"/v1/chat/completions", SERVE_EP_CHAT, 1}, {"/v1/completions", SERVE_EP_COMPLETIONS, 1},
                  {"/v1/models", SERVE_EP_MODELS, 0},         {"/health", SERVE_EP_HEALTH, 0},
                  {"/metrics", SERVE_EP_METRICS, 0},          {"/tokenize", SERVE_EP_TOKENIZE, 1},
                  {"/detokenize", SERVE_EP_DETOKENIZE, 1},    {"/", SERVE_EP_PAGE, 0}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) {
            *ep = routes[i].ep;
            *post = routes[i].post;
            return !strcmp(method, routes[i].post ? "POST" : "GET") ? 0 : 405;
        }
    return 404;
}

/* "Bearer KEY", compared in time that depends only on the key's length. */
static int authorised(const char *key, const char *h) {
    if (!key) return 1;
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t kl = strlen(key), hl = strlen(h);
    unsigned diff = kl != hl;
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < hl ? h[i] : 0);
    return diff == 0;
}

int serve_check_head(const serve_config *cfg, const char *method, const char *url, const char *authorization,
                     const char *content_length, serve_endpoint *ep, int *routed, serve_error *e) {
    int post = 0, r = route(url, method, ep, &post);
    *routed = r != 404;
    if (r == 404) {
        serve_error_set(e, 404, "invalid_request_error", NULL, "not_found", "no route %.100s %.200s", method, url);
        return -1;
    }
    if (r == 405) {
        serve_error_set(e, 405, "invalid_request_error", NULL, NULL, "%.200s takes %s", url, post ? "POST" : "GET");
        return -1;
    }
    if (*ep != SERVE_EP_HEALTH && *ep != SERVE_EP_PAGE && !authorised(cfg->api_key, authorization)) {
        serve_error_set(e, 401, "authentication_error", NULL, "invalid_api_key",
                        "a valid API key is required (Authorization: Bearer KEY)");
        return -1;
    }
    if (content_length && strtoull(content_length, NULL, 10) > cfg->max_body) {
        serve_error_set(e, 413, "invalid_request_error", NULL, "body_too_large", "the body exceeds %zu bytes",
                        cfg->max_body);
        return -1;
    }
    return 0;
}
