/*
 * Log-probabilities of generated tokens (OpenAI's logprobs / top_logprobs).
 *
 * The values are the log-softmax of the logits row the model produced for
 * the step, before any penalty, temperature or filter touches it (vLLM's
 * default "raw" logprobs and llama.cpp's n_probs without post-sampling
 * probabilities): they describe the model, not the sampler, so greedy and
 * sampled requests report the same numbers for the same tokens. The sums
 * are in double; NaN counts as -inf, and -inf is reported as -9999 (JSON
 * has no infinities; OpenAI uses the same value).
 */
#include "serve/serve_impl.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LP_FLOOR -9999.0f

static int finite_above(float x, float than) { return x == x && x > than; }

void serve_logprobs_row(const float *row, int V, int32_t id, int k, serve_lp *out, serve_lp *top) {
    assert(id >= 0 && id < V && k >= 0 && k <= SERVE_MAX_TOP_LOGPROBS);
    float mx = -INFINITY;
    for (int v = 0; v < V; v++)
        if (finite_above(row[v], mx)) mx = row[v];
    double sum = 0;
    for (int v = 0; mx > -INFINITY && v < V; v++)
        if (row[v] == row[v]) sum += exp((double)row[v] - mx);
    /* mx = +inf (an infinite logit) gives NaN here: such a row has no distribution */
    double lse = mx > -INFINITY ? mx + log(sum) : INFINITY;
    /* the k largest, ties to the lower id: insertion into a sorted prefix */
    int n = 0;
    for (int v = 0; v < V && k > 0; v++) {
        float x = row[v] == row[v] ? row[v] : -INFINITY;
        if (n == k && !(x > top[n - 1].logprob)) continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && x > top[at - 1].logprob) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = (serve_lp){v, x, 0};
    }
    for (int i = 0; i < n; i++) {
        double lp = (double)top[i].logprob - lse;
        top[i].logprob = lp == lp && lp > LP_FLOOR ? (float)lp : LP_FLOOR;
    }
    double lp = (row[id] == row[id] ? (double)row[id] : -INFINITY) - lse;
    out->id = id;
    out->logprob = lp == lp && lp > LP_FLOOR ? (float)lp : LP_FLOOR;
    out->end = 0;
}

int serve_lp_count(const serve_job *j, int n_lp, size_t len) {
    int n = 0;
    while (n < n_lp && (j->lp[n].end <= len || (n ? j->lp[n - 1].end : 0) < len)) n++;
    return n;
}

/* bytes as valid UTF-8: each byte of an ill-formed sequence becomes U+FFFD. */
static char *utf8_lossy(const char *b, size_t n, long *chars) {
    char *out = malloc(3 * n + 1);
    size_t o = 0;
    *chars = 0;
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)b[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2 : (c & 0xF0) == 0xE0 ? 3
                   : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4 : 0;
        int ok = len && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)b[i + k] & 0xC0) == 0x80;
        if (ok && len == 3) {
            unsigned c1 = (unsigned char)b[i + 1];
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0); /* overlong, surrogates */
        }
        if (ok && len == 4) {
            unsigned c1 = (unsigned char)b[i + 1];
            ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
        }
        if (ok && c) {
            memcpy(out + o, b + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, c ? "\xEF\xBF\xBD" : "", c ? 3 : 0); /* a NUL would end the C string: dropped */
            o += c ? 3 : 0;
            i++;
        }
        ++*chars;
    }
    out[o] = 0;
    return out;
}

/* {"token", "logprob", "bytes"} (chat), with its text's length in characters. */
static cJSON *token_json(const serve_text *tx, const serve_lp *t, long *chars) {
    size_t n = 0;
    const char *b = whale_tokenizer_token_bytes(tx->tok, t->id, &n);
    char *s = utf8_lossy(b ? b : "", b ? n : 0, chars);
    cJSON *o = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    int ok = s && o && bytes && cJSON_AddStringToObject(o, "token", s) &&
             cJSON_AddNumberToObject(o, "logprob", t->logprob) && cJSON_AddItemToObject(o, "bytes", bytes);
    if (!ok) cJSON_Delete(bytes);
    for (size_t i = 0; ok && i < n; i++) ok = cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
    free(s);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* Chat: [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]. */
static cJSON *chat_logprobs(const serve_text *tx, const serve_job *j, int from, int to) {
    cJSON *content = cJSON_CreateArray();
    long chars;
    for (int i = from; content && i < to; i++) {
        cJSON *t = token_json(tx, &j->lp[i], &chars), *tops = cJSON_CreateArray();
        int ok = t && tops && cJSON_AddItemToObject(t, "top_logprobs", tops);
        if (!ok) cJSON_Delete(tops);
        for (int k = 0; ok && k < j->top_logprobs; k++) {
            cJSON *alt = token_json(tx, &j->top[(size_t)i * (size_t)j->top_logprobs + (size_t)k], &chars);
            ok = alt && cJSON_AddItemToArray(tops, alt);
            if (!ok) cJSON_Delete(alt);
        }
        if (!ok || !cJSON_AddItemToArray(content, t)) {
            cJSON_Delete(t);
            cJSON_Delete(content);
            return NULL;
        }
    }
    cJSON *o = content ? cJSON_CreateObject() : NULL;
    if (!o || !cJSON_AddItemToObject(o, "content", content) || !cJSON_AddNullToObject(o, "refusal")) {
        if (!cJSON_GetObjectItemCaseSensitive(o, "content")) cJSON_Delete(content);
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The token's text (lossy UTF-8), NULL on out of memory. */
static char *token_text(const serve_text *tx, int32_t id, long *chars) {
    size_t n = 0;
    const char *b = whale_tokenizer_token_bytes(tx->tok, id, &n);
    return utf8_lossy(b ? b : "", b ? n : 0, chars);
}

/* Completions (the legacy shape): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
 * "text_offset"}; text_offset counts the characters of the tokens before, from *offset. */
static cJSON *legacy_logprobs(const serve_text *tx, const serve_job *j, int from, int to, long *offset) {
    cJSON *o = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs"), *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    int ok = o && toks && lps && tops && offs;
    for (int i = from; ok && i < to; i++) {
        long chars = 0, alt_chars;
        char *s = token_text(tx, j->lp[i].id, &chars);
        cJSON *alts = cJSON_CreateObject();
        ok = s && alts && cJSON_AddItemToArray(toks, cJSON_CreateString(s)) &&
             cJSON_AddItemToArray(lps, cJSON_CreateNumber(j->lp[i].logprob)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset)) && cJSON_AddItemToArray(tops, alts);
        if (!ok) cJSON_Delete(alts);
        free(s);
        *offset += chars;
        for (int k = 0; ok && k < j->top_logprobs; k++) {
            const serve_lp *t = &j->top[(size_t)i * (size_t)j->top_logprobs + (size_t)k];
            char *a = token_text(tx, t->id, &alt_chars);
            ok = a != NULL; /* two ids with the same text: the more probable one is kept */
            if (ok && !cJSON_GetObjectItemCaseSensitive(alts, a)) ok = cJSON_AddNumberToObject(alts, a, t->logprob) != NULL;
            free(a);
        }
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

cJSON *serve_logprobs_json(const serve_text *tx, const serve_job *j, int chat, int from, int to, long *offset) {
    assert(j->logprobs && from >= 0 && from <= to);
    return chat ? chat_logprobs(tx, j, from, to) : legacy_logprobs(tx, j, from, to, offset);
}
