/*
 * OpenAI's API objects: requests parsed and checked into jobs, responses
 * and stream chunks, error objects, and the tokenizer endpoints.
 *
 * Every field is checked for its type and range; a bad one is a 400 naming
 * it in `param`, as OpenAI's API does. Fields this server does not use
 * (user, metadata, ...) are ignored; features it does not have (n > 1,
 * logprobs, several prompts) are refused rather than silently dropped.
 */
#include "serve/serve_impl.h"

#include "whale_chat.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void serve_error_set(serve_error *e, int status, const char *type, const char *param, const char *code,
                     const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

#define BAD(e, param, ...) (serve_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__), -1)

char *serve_error_json(const serve_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    if (o) {
        cJSON_AddStringToObject(o, "message", e->message);
        cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
        if (e->param) cJSON_AddStringToObject(o, "param", e->param);
        else cJSON_AddNullToObject(o, "param");
        if (e->code) cJSON_AddStringToObject(o, "code", e->code);
        else cJSON_AddNullToObject(o, "code");
    }
    char *s = o ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* ------------------------------------------------------------ fields */

static int parse_body(const char *body, size_t len, cJSON **root, serve_error *e) {
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!*root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        return BAD(e, NULL, "the body is not valid JSON (near byte %zu)", at);
    }
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return BAD(e, NULL, "the body must be a JSON object");
    }
    return 0;
}

/* An optional number field in [lo, hi]; integer when integral. 1 if present. */
static int get_number(const cJSON *o, const char *key, double lo, double hi, int integral, double *out,
                      serve_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi ||
        (integral && v->valuedouble != floor(v->valuedouble))) {
        if (integral) return BAD(e, key, "'%s' must be an integer in [%.0f, %.0f]", key, lo, hi);
        return BAD(e, key, "'%s' must be a number in [%g, %g]", key, lo, hi);
    }
    *out = v->valuedouble;
    return 1;
}

static int get_bool(const cJSON *o, const char *key, int *out, serve_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return BAD(e, key, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 1;
}

/* "model": the base's id or an adapter's; *which (may be NULL) gets its
 * index in tx->model_ids (0, the base, when absent and not required). */
static int check_model(const serve_text *tx, const cJSON *root, int required, int *which, serve_error *e) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (which) *which = 0;
    if (!m || cJSON_IsNull(m)) return required ? BAD(e, "model", "'model' is required") : 0;
    if (!cJSON_IsString(m)) return BAD(e, "model", "'model' must be a string");
    for (int k = 0; k < tx->n_models; k++)
        if (!strcmp(m->valuestring, tx->model_ids[k])) {
            if (which) *which = k;
            return 0;
        }
    serve_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                    "The model '%.200s' does not exist (this server has '%.200s'%s)", m->valuestring, tx->model_name,
                    tx->n_models > 1 ? " and its adapters: GET /v1/models lists them" : "");
    return -1;
}

/* stop: a string or up to SERVE_MAX_STOP non-empty strings. */
static int parse_stop(const cJSON *root, serve_job *j, serve_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    if (!one && !cJSON_IsArray(v)) return BAD(e, "stop", "'stop' must be a string or an array of strings");
    if (!one && cJSON_GetArraySize(v) > SERVE_MAX_STOP)
        return BAD(e, "stop", "'stop' holds at most %d strings", SERVE_MAX_STOP);
    for (const cJSON *s = one ? one : v->child; s; s = one ? NULL : s->next) {
        if (!cJSON_IsString(s) || !*s->valuestring || strlen(s->valuestring) > 256)
            return BAD(e, "stop", "each stop sequence must be a non-empty string of at most 256 bytes");
        if (!(j->stop[j->n_stop++] = strdup(s->valuestring)))
            return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    }
    return 0;
}

/* The sampling fields, over the server's defaults. */
static int parse_sampling(const serve_text *tx, const cJSON *root, serve_job *j, serve_error *e) {
    double d;
    int r;
    j->sp = tx->defaults;
    if ((r = get_number(root, "temperature", 0, 2, 0, &d, e)) < 0) return -1;
    if (r) j->sp.temperature = (float)d;
    if ((r = get_number(root, "top_p", 1e-9, 1, 0, &d, e)) < 0) return -1;
    if (r) j->sp.top_p = (float)d;
    if ((r = get_number(root, "top_k", -1, 1 << 30, 1, &d, e)) < 0) return -1;
    if (r) j->sp.top_k = d < 0 ? 0 : (int)d;
    if ((r = get_number(root, "min_p", 0, 0.999999, 0, &d, e)) < 0) return -1;
    if (r) j->sp.min_p = (float)d;
    if ((r = get_number(root, "repetition_penalty", 1e-6, 1e6, 0, &d, e)) < 0) return -1;
    if (r) j->sp.repeat_penalty = (float)d;
    if ((r = get_number(root, "frequency_penalty", -2, 2, 0, &d, e)) < 0) return -1;
    if (r) j->frequency_penalty = (float)d;
    if ((r = get_number(root, "presence_penalty", -2, 2, 0, &d, e)) < 0) return -1;
    if (r) j->presence_penalty = (float)d;
    if ((r = get_number(root, "seed", -9007199254740991.0, 9007199254740991.0, 1, &d, e)) < 0) return -1;
    if (r) j->sp.seed = (uint64_t)(int64_t)d;
    return 0;
}

/* chat: logprobs (a boolean) and top_logprobs (a count, needs logprobs);
 * completions: logprobs (a count). Counts in [0, SERVE_MAX_TOP_LOGPROBS]. */
static int parse_logprobs(const cJSON *root, int chat, serve_job *j, serve_error *e) {
    double d = 0;
    int r;
    if (chat) {
        if (get_bool(root, "logprobs", &j->logprobs, e) < 0) return -1;
        if ((r = get_number(root, "top_logprobs", 0, SERVE_MAX_TOP_LOGPROBS, 1, &d, e)) < 0) return -1;
        if (r && !j->logprobs)
            return BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs' to be true");
    } else {
        if ((r = get_number(root, "logprobs", 0, SERVE_MAX_TOP_LOGPROBS, 1, &d, e)) < 0) return -1;
        j->logprobs = r;
    }
    j->top_logprobs = (int)d;
    return 0;
}

/* n, logprobs, stream, stream_options, max_tokens and the extensions. */
static int parse_options(const cJSON *root, int chat, serve_job *j, serve_gen_request *req, serve_error *e) {
    double d;
    int r;
    if ((r = get_number(root, "n", 1, 1, 1, &d, e)) < 0) return BAD(e, "n", "only n = 1 is supported");
    if (parse_logprobs(root, chat, j, e)) return -1;
    if (get_bool(root, "stream", &req->stream, e) < 0) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return BAD(e, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &req->include_usage, e) < 0) return -1;
    }
    if (!chat && get_bool(root, "echo", &req->echo, e) < 0) return -1;
    if (req->echo && j->logprobs)
        return BAD(e, "logprobs", "'logprobs' with 'echo' is not supported (the prompt's logprobs are not computed)");
    if (get_bool(root, "ignore_eos", &j->ignore_eos, e) < 0) return -1;
    j->skip_special = 1;
    if (get_bool(root, "skip_special_tokens", &j->skip_special, e) < 0) return -1;
    const char *keys[] = {"max_completion_tokens", "max_tokens"};
    j->max_tokens = 0;
    for (int k = chat ? 0 : 1; k < 2; k++) {
        if ((r = get_number(root, keys[k], 1, 2147483647.0, 1, &d, e)) < 0) return -1;
        if (r && !j->max_tokens) j->max_tokens = (int)d;
    }
    return 0;
}

/* ------------------------------------------------------------ prompts */

static int encode(const serve_text *tx, const char *text, size_t len, int add_special, serve_job *j,
                  serve_error *e) {
    whale_err err;
    pthread_mutex_lock(tx->text_mu);
    whale_code c = whale_tokenizer_encode(tx->tok, text, len, add_special, &j->prompt, &j->n_prompt, &err);
    pthread_mutex_unlock(tx->text_mu);
    if (c) return BAD(e, NULL, "cannot tokenize the prompt: %s", err.msg);
    return 0;
}

/* content: a string, null, or an array of {"type": "text", "text"} parts
 * (joined); other parts are refused. Rewritten in place as a string. */
static int normalise_content(cJSON *msg, int i, serve_error *e) {
    cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!c || cJSON_IsString(c) || cJSON_IsNull(c)) return 0;
    if (!cJSON_IsArray(c)) return BAD(e, "messages", "messages[%d].content must be a string or an array of parts", i);
    size_t len = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type"), *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x))
            return BAD(e, "messages", "messages[%d].content: only text parts are supported", i);
        len += strlen(x->valuestring);
    }
    char *joined = malloc(len + 1);
    if (!joined) return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    size_t at = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *x = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        memcpy(joined + at, x, strlen(x));
        at += strlen(x);
    }
    joined[at] = 0;
    cJSON *s = cJSON_CreateString(joined);
    free(joined);
    if (!s || !cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", s)) {
        cJSON_Delete(s);
        return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    }
    return 0;
}

/* An assistant message's tool_calls: [{"type": "function", "function": {"name",
 * "arguments"}}]. OpenAI sends the arguments as a JSON string; templates
 * (Qwen2.5's `arguments | tojson`) expect the object, so a string that
 * parses as an object is replaced by it, as vLLM does. */
static int check_tool_calls(cJSON *m, int i, serve_error *e) {
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!calls || cJSON_IsNull(calls)) return 0;
    if (!cJSON_IsArray(calls)) return BAD(e, "messages", "messages[%d].tool_calls must be an array", i);
    int k = 0;
    for (cJSON *c = calls->child; c; c = c->next, k++) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(name) ||
            (args && !cJSON_IsString(args) && !cJSON_IsObject(args)))
            return BAD(e, "messages", "messages[%d].tool_calls[%d] must be {\"type\": \"function\", \"function\": "
                                      "{\"name\": string, \"arguments\": string}}", i, k);
        cJSON *obj = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (cJSON_IsObject(obj) && cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj)) obj = NULL;
        cJSON_Delete(obj);
    }
    return 0;
}

static int check_messages(cJSON *msgs, serve_error *e) {
    if (!cJSON_IsArray(msgs) || !msgs->child) return BAD(e, "messages", "'messages' must be a non-empty array");
    int i = 0;
    for (cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return BAD(e, "messages", "messages[%d] must be an object with a string 'role'", i);
        static const char *roles[] = {"system", "developer", "user", "assistant", "tool"};
        int known = 0;
        for (int k = 0; k < 5; k++) known |= !strcmp(role->valuestring, roles[k]);
        if (!known) return BAD(e, "messages", "messages[%d].role '%.40s' is not one of system, developer, user, "
                                              "assistant, tool", i, role->valuestring);
        if (normalise_content(m, i, e)) return -1;
        if (strcmp(role->valuestring, "assistant")) continue;
        if (check_tool_calls(m, i, e)) return -1;
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *empty = NULL;
        if ((!c || cJSON_IsNull(c)) && (!(empty = cJSON_CreateString("")) || /* a tool-call turn: templates want a string */
                                        !(c ? cJSON_ReplaceItemInObjectCaseSensitive(m, "content", empty)
                                            : cJSON_AddItemToObject(m, "content", empty)))) {
            cJSON_Delete(empty);
            return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
        }
    }
    return 0;
}

/* tools: [{"type": "function", "function": {"name", ...}}]. */
static int check_tools(const cJSON *tools, serve_error *e) {
    if (!cJSON_IsArray(tools)) return BAD(e, "tools", "'tools' must be an array");
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
            !cJSON_IsString(name) || !name->valuestring[0])
            return BAD(e, "tools", "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", k);
    }
    return 0;
}

/* tool_choice: "none" (the tools are not shown), "auto", "required" or
 * {"type": "function", "function": {"name"}} naming one of the tools. The
 * last two are honoured by starting the reply with the template's tool-call
 * opening (Hermes / Qwen2.5 `<tool_call>` blocks only: another format is a
 * 400), up to the colon after "name" or after "arguments" (where the
 * tokenizer splits the text as it would split the whole call): *prefix is
 * that start, or NULL. Returns -1 with e, 0, or 1 for none. */
static int tool_choice(const cJSON *root, const cJSON *tools, char **prefix, serve_error *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    *prefix = NULL;
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) return 1;
    if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "auto")) return 0;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
    int required = cJSON_IsString(tc) && !strcmp(tc->valuestring, "required");
    if (!required && !(cJSON_IsObject(tc) && cJSON_IsString(type) && !strcmp(type->valuestring, "function") &&
                       cJSON_IsString(name)))
        return BAD(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                                     "\"function\", \"function\": {\"name\": ...}}");
    if (!tools || !cJSON_GetArraySize(tools))
        return BAD(e, "tool_choice", "'tool_choice' other than \"none\" needs 'tools'");
    int found = required;
    for (const cJSON *t = tools->child; !found && t; t = t->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        found = !strcmp(n->valuestring, name->valuestring);
    }
    if (!found) return BAD(e, "tool_choice", "'tool_choice' names '%.100s', which is not in 'tools'", name->valuestring);
    if (required) {
        *prefix = strdup("<tool_call>\n{\"name\":");
    } else {
        cJSON *quoted = cJSON_CreateString(name->valuestring);
        char *q = quoted ? cJSON_PrintUnformatted(quoted) : NULL;
        size_t n = q ? strlen(q) + 64 : 0;
        if (q && (*prefix = malloc(n))) snprintf(*prefix, n, "<tool_call>\n{\"name\": %s, \"arguments\":", q);
        free(q);
        cJSON_Delete(quoted);
    }
    if (!*prefix) return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    return 0;
}

/* messages (+ tools, chat_template_kwargs) through the chat template. */
static int chat_prompt(const serve_text *tx, cJSON *root, serve_job *j, serve_gen_request *req, serve_error *e) {
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *kwargs = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (check_messages(msgs, e)) return -1;
    if (cJSON_IsNull(tools)) tools = NULL;
    if (tools && check_tools(tools, e)) return -1;
    char *prefix = NULL;
    int none = tool_choice(root, tools, &prefix, e);
    if (none < 0) return -1;
    if (none) tools = NULL;
    if (kwargs && !cJSON_IsNull(kwargs) && !cJSON_IsObject(kwargs)) {
        free(prefix);
        return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    char *text = NULL;
    size_t len = 0;
    whale_err err;
    whale_code c = whale_chat_template_apply(tx->tpl, msgs, tools && cJSON_GetArraySize(tools) ? tools : NULL,
                                             cJSON_IsObject(kwargs) ? kwargs : NULL, 1, &text, &len, &err);
    if (c) {
        free(prefix);
        return BAD(e, "messages", "the chat template refused the messages: %s", err.msg);
    }
    int r = 0;
    /* the forced start is the template's own format: its tool instructions show <tool_call> blocks */
    if (prefix && !memmem(text, len, "<tool_call>", 11))
        r = BAD(e, "tool_choice", "'tool_choice' \"required\" or a named function needs a chat template whose tool "
                                  "calls are <tool_call> blocks (this one's are not)");
    char *all = r ? NULL : malloc(len + (prefix ? strlen(prefix) : 0) + 1);
    if (!r && !all) r = (serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1);
    if (!r) {
        memcpy(all, text, len);
        if (prefix) memcpy(all + len, prefix, strlen(prefix)), len += strlen(prefix);
        r = encode(tx, all, len, 0, j, e);
    }
    if (req) {
        req->tools = tools && cJSON_GetArraySize(tools) > 0;
        req->prefix = prefix;
    } else {
        free(prefix);
    }
    free(all);
    free(text);
    return r;
}

/* prompt: a string, an array of token ids, or an array holding one of those. */
static int completion_prompt(const serve_text *tx, const cJSON *root, serve_job *j, serve_gen_request *req,
                             serve_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    if (cJSON_IsString(p)) {
        if (req->echo && !(req->prompt_text = strdup(p->valuestring)))
            return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
        return encode(tx, p->valuestring, strlen(p->valuestring), 1, j, e);
    }
    int n = cJSON_GetArraySize(p);
    if (!cJSON_IsArray(p) || n == 0 || cJSON_IsString(p->child) || cJSON_IsArray(p->child))
        return BAD(e, "prompt", "'prompt' must be a string or an array of token ids (one prompt per request)");
    if (!(j->prompt = malloc(sizeof(int32_t) * (size_t)n)))
        return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    for (const cJSON *v = p->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= tx->vocab)
            return BAD(e, "prompt", "prompt[%d] is not a token id in [0, %d)", j->n_prompt, tx->vocab);
        j->prompt[j->n_prompt++] = (int32_t)v->valuedouble;
    }
    return 0;
}

/* The prompt must leave room for one token; max_tokens is capped by the context. */
static int check_length(const serve_text *tx, serve_job *j, serve_error *e) {
    if (j->n_prompt == 0) return BAD(e, NULL, "the prompt is empty (it encodes to no tokens)");
    if (j->n_prompt >= tx->ctx) {
        serve_error_set(e, 400, "invalid_request_error", "messages", "context_length_exceeded",
                        "This model's maximum context length is %d tokens; the prompt has %d tokens and leaves "
                        "none to generate", tx->ctx, j->n_prompt);
        return -1;
    }
    int room = tx->ctx - j->n_prompt;
    if (!j->max_tokens || j->max_tokens > room) j->max_tokens = room;
    if (j->top_logprobs > tx->vocab) j->top_logprobs = tx->vocab;
    size_t n = (size_t)j->max_tokens, k = (size_t)j->top_logprobs;
    if (j->logprobs && (!(j->lp = malloc(sizeof *j->lp * n)) || (k && !(j->top = malloc(sizeof *j->top * n * k)))))
        return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory for %zu logprobs", n), -1;
    return 0;
}

int serve_parse_generation(const serve_text *tx, int chat, const char *body, size_t len, serve_job *j,
                           serve_gen_request *req, serve_error *e) {
    cJSON *root;
    memset(req, 0, sizeof *req);
    req->chat = chat;
    if (parse_body(body, len, &root, e)) return -1;
    int r = check_model(tx, root, 1, &req->model, e);
    j->model = req->model;
    if (!r) r = parse_options(root, chat, j, req, e);
    if (!r) r = parse_sampling(tx, root, j, e);
    if (!r) r = parse_stop(root, j, e);
    if (!r) r = chat ? chat_prompt(tx, root, j, req, e) : completion_prompt(tx, root, j, req, e);
    if (!r) r = check_length(tx, j, e);
    cJSON_Delete(root);
    return r;
}

/* ------------------------------------------------------------ responses */

static void add_usage(cJSON *o, const serve_usage *u) {
    cJSON *us = cJSON_AddObjectToObject(o, "usage");
    if (!us) return;
    cJSON_AddNumberToObject(us, "prompt_tokens", u->prompt);
    cJSON_AddNumberToObject(us, "completion_tokens", u->gen);
    cJSON_AddNumberToObject(us, "total_tokens", u->prompt + u->gen);
    cJSON *d = cJSON_AddObjectToObject(us, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", u->cached);
}

static cJSON *response_head(const serve_text *tx, const serve_gen_request *req, const char *id, long created,
                            int chunk) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", req->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                   : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", tx->model_ids[req->model]);
    cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

static char *print_free(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* A string of len bytes (generated text holds no NUL: the tokenizer maps
 * none to one, but a prompt given as ids may). */
static cJSON *string_n(const char *text, size_t len) {
    char *z = malloc(len + 1);
    if (!z) return NULL;
    memcpy(z, text, len);
    z[len] = 0;
    cJSON *s = cJSON_CreateString(z);
    free(z);
    return s;
}

/* The logprobs member of a choice: null, or entries [from, to) of j. */
static void add_logprobs(cJSON *c, const serve_text *tx, const serve_gen_request *req, const serve_job *j, int from,
                         int to, long *offset) {
    cJSON *lp = j && j->logprobs ? serve_logprobs_json(tx, j, req->chat, from, to, offset) : NULL;
    if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
    else cJSON_AddNullToObject(c, "logprobs");
}

char *serve_completion_json(const serve_text *tx, const serve_gen_request *req, const char *id, long created,
                            const char *text, size_t len, const char *finish, const serve_usage *u,
                            const serve_job *j, int n_lp) {
    cJSON *o = response_head(tx, req, id, created, 0), *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    if (!o || !choices || !c || !cJSON_AddItemToArray(choices, c)) {
        cJSON_Delete(c);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", 0);
    /* the reply as the client sees it: a forced tool-call start (chat) or the echoed prompt first */
    const char *head = req->chat ? req->prefix : req->prompt_text;
    size_t hl = head ? strlen(head) : 0;
    char *all = malloc(hl + len + 1);
    if (!all) {
        cJSON_Delete(o);
        return NULL;
    }
    memcpy(all, head ? head : "", hl);
    memcpy(all + hl, text, len);
    if (req->chat) {
        cJSON *m = NULL;
        whale_err err;
        if (req->tools && !whale_chat_parse_tool_calls(all, hl + len, &m, &err) &&
            cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))
            finish = "tool_calls";
        else {
            cJSON_Delete(m);
            m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddItemToObject(m, "content", string_n(all, hl + len));
        }
        cJSON_AddItemToObject(c, "message", m);
    } else {
        cJSON_AddItemToObject(c, "text", string_n(all, hl + len));
    }
    free(all);
    long offset = 0;
    add_logprobs(c, tx, req, j, 0, j ? serve_lp_count(j, n_lp, len) : 0, &offset);
    cJSON_AddStringToObject(c, "finish_reason", finish);
    add_usage(o, u);
    return print_free(o);
}

char *serve_chunk_event(const serve_text *tx, const serve_gen_request *req, const char *id, long created,
                        const serve_chunk *ch) {
    cJSON *o = response_head(tx, req, id, created, 1), *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *tool_calls = ch->tool_calls;
    if (!o || !choices) {
        cJSON_Delete(tool_calls);
        cJSON_Delete(o);
        return NULL;
    }
    if (!ch->usage) {
        cJSON *c = cJSON_CreateObject();
        if (!c || !cJSON_AddItemToArray(choices, c)) {
            cJSON_Delete(tool_calls);
            cJSON_Delete(c);
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddNumberToObject(c, "index", 0);
        if (req->chat) {
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            if (ch->first) cJSON_AddStringToObject(d, "role", "assistant");
            if (tool_calls && !cJSON_AddItemToObject(d, "tool_calls", tool_calls)) cJSON_Delete(tool_calls);
            else if (!tool_calls && !ch->finish) cJSON_AddItemToObject(d, "content", string_n(ch->text, ch->len));
        } else {
            cJSON_AddItemToObject(c, "text", string_n(ch->finish ? "" : ch->text, ch->finish ? 0 : ch->len));
        }
        add_logprobs(c, tx, req, ch->lp_to > ch->lp_from ? ch->job : NULL, ch->lp_from, ch->lp_to, ch->lp_offset);
        if (ch->finish) cJSON_AddStringToObject(c, "finish_reason", ch->finish);
        else cJSON_AddNullToObject(c, "finish_reason");
    } else {
        cJSON_Delete(tool_calls);
        add_usage(o, ch->usage);
    }
    if (req->include_usage && !ch->usage) cJSON_AddNullToObject(o, "usage");
    char *json = print_free(o);
    if (!json) return NULL;
    size_t n = strlen(json);
    char *ev = malloc(n + 9);
    if (ev) memcpy(ev, "data: ", 6), memcpy(ev + 6, json, n), memcpy(ev + 6 + n, "\n\n", 3);
    free(json);
    return ev;
}

/* ------------------------------------------------------------ other endpoints */

/* The base, then each adapter with its base as "parent" (vLLM's field). */
char *serve_models_json(const serve_text *tx, long created) {
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data");
    if (!o || !data) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddStringToObject(o, "object", "list");
    for (int k = 0; k < tx->n_models; k++) {
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddItemToArray(data, m)) {
            cJSON_Delete(m);
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddStringToObject(m, "id", tx->model_ids[k]);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)created);
        cJSON_AddStringToObject(m, "owned_by", "whale");
        if (k) cJSON_AddStringToObject(m, "parent", tx->model_name);
        else cJSON_AddNullToObject(m, "parent");
        cJSON_AddNumberToObject(m, "max_model_len", tx->ctx);
    }
    return print_free(o);
}

/* {"prompt" | "content": text, "add_special_tokens"} or {"messages"} → {"tokens", "count", "max_model_len"} */
int serve_tokenize(const serve_text *tx, const char *body, size_t len, char **out, serve_error *e) {
    cJSON *root;
    if (parse_body(body, len, &root, e)) return -1;
    serve_job *j = serve_job_new();
    if (!j) {
        cJSON_Delete(root);
        return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    }
    int add = 1, r = check_model(tx, root, 0, NULL, e);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) p = cJSON_GetObjectItemCaseSensitive(root, "content");
    if (!r && get_bool(root, "add_special_tokens", &add, e) < 0) r = -1;
    if (!r && cJSON_GetObjectItemCaseSensitive(root, "messages")) r = chat_prompt(tx, root, j, NULL, e);
    else if (!r && cJSON_IsString(p)) r = encode(tx, p->valuestring, strlen(p->valuestring), add, j, e);
    else if (!r) r = BAD(e, "prompt", "'prompt' (or 'content') must be a string, or give 'messages'");
    cJSON *o = r ? NULL : cJSON_CreateObject(), *ids = o ? cJSON_AddArrayToObject(o, "tokens") : NULL;
    for (int i = 0; ids && i < j->n_prompt; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(j->prompt[i]));
    if (o) cJSON_AddNumberToObject(o, "count", j->n_prompt), cJSON_AddNumberToObject(o, "max_model_len", tx->ctx);
    if (!r && !(*out = print_free(o))) r = (serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1);
    serve_job_release(NULL, j);
    cJSON_Delete(root);
    return r;
}

/* {"tokens": [ids]} → {"prompt": text} */
int serve_detokenize(const serve_text *tx, const char *body, size_t len, char **out, serve_error *e) {
    cJSON *root;
    if (parse_body(body, len, &root, e)) return -1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int n = cJSON_GetArraySize(t), r = check_model(tx, root, 0, NULL, e), k = 0;
    int32_t *ids = r ? NULL : malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!r && !cJSON_IsArray(t)) r = BAD(e, "tokens", "'tokens' must be an array of token ids");
    for (const cJSON *v = cJSON_IsArray(t) ? t->child : NULL; !r && ids && v; v = v->next, k++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= tx->vocab)
            r = BAD(e, "tokens", "tokens[%d] is not a token id in [0, %d)", k, tx->vocab);
        else ids[k] = (int32_t)v->valuedouble;
    }
    char *text = NULL;
    size_t tl = 0;
    whale_err err;
    if (!r && (!ids || whale_tokenizer_decode(tx->tok, ids, k, 0, &text, &tl, &err)))
        r = (serve_error_set(e, 500, "server_error", NULL, NULL, "cannot decode the tokens"), -1);
    if (!r) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "prompt", string_n(text, tl));
        if (!(*out = print_free(o))) r = (serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1);
    }
    free(text);
    free(ids);
    cJSON_Delete(root);
    return r;
}
