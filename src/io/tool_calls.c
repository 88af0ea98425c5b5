/* Tool calls in a model's reply, back into OpenAI's message form: the
 * Hermes / Qwen2.5 `<tool_call>{…}</tool_call>` blocks and Llama 3.1's bare
 * JSON call. Anything malformed is returned as text. */
#include "whale_chat.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static int space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* [p, e) without the whitespace at both ends */
static void trim(const char **p, const char **e) {
    while (*p < *e && space(**p)) (*p)++;
    while (*e > *p && space((*e)[-1])) (*e)--;
}

/* {"name": string, "arguments" | "parameters": object or JSON string} as an
 * OpenAI tool call, or NULL. */
static cJSON *one_call(const char *p, const char *e, int index) {
    trim(&p, &e);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(p, (size_t)(e - p), &end, 0);
    while (j && end && end < e && space(*end)) end++;
    if (j && end != e) { /* text after the object */
        cJSON_Delete(j);
        j = NULL;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    cJSON *call = NULL;
    if (cJSON_IsObject(j) && cJSON_IsString(name) && name->valuestring[0] && (!args || cJSON_IsObject(args) || cJSON_IsString(args))) {
        char *text = !args ? strdup("{}") : cJSON_IsString(args) ? strdup(args->valuestring) : cJSON_PrintUnformatted(args);
        char id[32];
        snprintf(id, sizeof id, "call_%d", index);
        call = cJSON_CreateObject();
        cJSON *fn = cJSON_CreateObject();
        if (!text || !call || !fn || !cJSON_AddStringToObject(call, "id", id) ||
            !cJSON_AddStringToObject(call, "type", "function") || !cJSON_AddItemToObject(call, "function", fn) ||
            !cJSON_AddStringToObject(fn, "name", name->valuestring) || !cJSON_AddStringToObject(fn, "arguments", text)) {
            if (!cJSON_GetObjectItemCaseSensitive(call, "function")) cJSON_Delete(fn);
            cJSON_Delete(call);
            call = NULL;
        }
        free(text);
    }
    cJSON_Delete(j);
    return call;
}

/* Hermes blocks: the text before the first block is the content; every
 * block must parse and nothing but whitespace may stand between and after
 * them. Returns the calls (and *content_end), or NULL. */
static cJSON *hermes_calls(const char *s, size_t n, const char **content_end) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *e = s + n, *p = memmem(s, n, open, sizeof open - 1);
    if (!p) return NULL;
    *content_end = p;
    cJSON *calls = cJSON_CreateArray();
    int k = 0;
    while (calls && p < e) {
        if ((size_t)(e - p) < sizeof open - 1 || memcmp(p, open, sizeof open - 1)) break;
        const char *body = p + sizeof open - 1, *end = memmem(body, (size_t)(e - body), close, sizeof close - 1);
        cJSON *call = end ? one_call(body, end, k++) : NULL;
        if (!call || !cJSON_AddItemToArray(calls, call)) {
            cJSON_Delete(call);
            cJSON_Delete(calls);
            return NULL;
        }
        p = end + sizeof close - 1;
        while (p < e && space(*p)) p++;
    }
    if (p < e) { /* text after the calls: not a tool-call reply */
        cJSON_Delete(calls);
        return NULL;
    }
    return calls;
}

/* Llama 3.1: the whole reply (after an optional <|python_tag|>) is one call. */
static cJSON *llama_calls(const char *s, size_t n) {
    const char *p = s, *e = s + n;
    trim(&p, &e);
    static const char tag[] = "<|python_tag|>";
    if ((size_t)(e - p) >= sizeof tag - 1 && !memcmp(p, tag, sizeof tag - 1)) p += sizeof tag - 1;
    trim(&p, &e);
    if (p == e || *p != '{') return NULL;
    cJSON *call = one_call(p, e, 0), *calls = call ? cJSON_CreateArray() : NULL;
    if (call && (!calls || !cJSON_AddItemToArray(calls, call))) {
        cJSON_Delete(call);
        cJSON_Delete(calls);
        return NULL;
    }
    return calls;
}

whale_code whale_chat_parse_tool_calls(const char *reply, size_t len, cJSON **message, whale_err *err) {
    if (!reply || !message) return whale_errf(err, WHALE_ERR_ARG, "whale_chat_parse_tool_calls: NULL argument");
    const char *content_end = reply + len;
    cJSON *calls = hermes_calls(reply, len, &content_end);
    if (!calls) {
        content_end = reply + len;
        if ((calls = llama_calls(reply, len))) content_end = reply;
    }
    cJSON *m = cJSON_CreateObject();
    const char *p = reply, *e = calls ? content_end : reply + len;
    if (calls) trim(&p, &e);
    char *content = malloc((size_t)(e - p) + 1);
    int ok = m && content && cJSON_AddStringToObject(m, "role", "assistant");
    if (ok) {
        memcpy(content, p, (size_t)(e - p));
        content[e - p] = 0;
        ok = calls && !*content ? cJSON_AddNullToObject(m, "content") != NULL
                                : cJSON_AddStringToObject(m, "content", content) != NULL;
    }
    free(content);
    if (ok && calls && cJSON_AddItemToObject(m, "tool_calls", calls)) calls = NULL;
    else if (calls) ok = 0;
    cJSON_Delete(calls);
    if (!ok) {
        cJSON_Delete(m);
        return whale_errf(err, WHALE_ERR_NOMEM, "tool calls: out of memory");
    }
    *message = m;
    return WHALE_OK;
}
