/* SFT data (whale_sft.h): JSONL chat records → the chat template's tokens and
 * loss mask → samples cut to max_length → rows of S tokens (one sample each,
 * or packed) → batches in a shuffled order that a data cursor reproduces. */
#include "whale_sft.h"

#include "core/core.h"
#include "io/sft_csv.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define PH_NAME "{{NAME}}"
#define PH_AUTHOR "{{AUTHOR}}"

typedef struct {
    int64_t off;  /* into ds->ids / ds->train */
    int32_t n;
    int32_t file; /* into ds->files */
    int64_t line;
    int truncated;
} sample_rec;

struct whale_sft_dataset {
    const whale_tokenizer *tok;
    char **files;
    int n_files;
    int32_t *ids;
    uint8_t *train;
    int64_t n_tok, cap_tok;
    sample_rec *s;
    int64_t n_s, cap_s;
    whale_sft_stats st;
    int32_t pad;
    int packing;
    /* the rows for plan_S (0 = none yet); packed rows list their samples in
     * row_samp[row_off[r] .. row_off[r+1]) */
    int plan_S;
    int64_t n_rows;
    int64_t *row_off, *row_samp;
};

/* ------------------------------------------------------------ options */

whale_sft_opts whale_sft_defaults(void) {
    whale_sft_opts o;
    memset(&o, 0, sizeof o);
    o.loss_scope = WHALE_SFT_LOSS_ASSISTANT;
    o.truncation = WHALE_SFT_TRUNC_DELETE;
    o.bad_records = WHALE_SFT_BAD_FAIL;
    return o;
}

static whale_code from_name(const char *what, const char *name, const char *const *names, int n, int *out,
                            whale_err *err) {
    for (int i = 0; i < n; i++)
        if (name && !strcmp(name, names[i])) {
            *out = i;
            return WHALE_OK;
        }
    char list[128] = "";
    for (int i = 0; i < n; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? (i == n - 1 ? " or " : ", ") : "", names[i]);
    }
    return whale_errf(err, WHALE_ERR_ARG, "%s: unknown value \"%.64s\" (expected %s)", what, name ? name : "(null)",
                      list);
}

whale_code whale_sft_loss_scope_from_name(const char *name, whale_sft_loss_scope *out, whale_err *err) {
    static const char *const names[] = {"assistant", "all"};
    int v = 0;
    whale_code rc = from_name("loss scope", name, names, 2, &v, err);
    if (!rc) *out = (whale_sft_loss_scope)v;
    return rc;
}

whale_code whale_sft_truncation_from_name(const char *name, whale_sft_truncation *out, whale_err *err) {
    static const char *const names[] = {"delete", "left", "right"};
    int v = 0;
    whale_code rc = from_name("truncation strategy", name, names, 3, &v, err);
    if (!rc) *out = (whale_sft_truncation)v;
    return rc;
}

whale_code whale_sft_bad_policy_from_name(const char *name, whale_sft_bad_policy *out, whale_err *err) {
    static const char *const names[] = {"error", "skip", "fail"}; /* fail: the former spelling of error */
    int v = 0;
    whale_code rc = from_name("bad record policy", name, names, 3, &v, err);
    if (!rc) *out = v == 1 ? WHALE_SFT_BAD_SKIP : WHALE_SFT_BAD_FAIL;
    return rc;
}

/* ------------------------------------------------------------ placeholders */

/* The value for a language (0 = Chinese, 1 = English), or the other one. */
static const char *pick(const char *const pair[2], int lang) {
    if (pair[lang] && *pair[lang]) return pair[lang];
    if (pair[1 - lang] && *pair[1 - lang]) return pair[1 - lang];
    return NULL;
}

static size_t count_str(const char *s, const char *needle) {
    size_t k = 0, nl = strlen(needle);
    for (const char *p = strstr(s, needle); p; p = strstr(p + nl, needle)) k++;
    return k;
}

/* *out = s with the placeholders filled (malloc'd), or NULL when s has none. */
static whale_code fill(const char *s, int lang, const whale_sft_opts *o, char **out, whale_err *err) {
    *out = NULL;
    size_t kn = count_str(s, PH_NAME), ka = count_str(s, PH_AUTHOR);
    if (!kn && !ka) return WHALE_OK;
    const char *name = pick(o->model_name, lang), *author = pick(o->model_author, lang);
    if (kn && !name)
        return whale_errf(err, WHALE_ERR_ARG, "%s needs the model's name (model_name, --model-name)", PH_NAME);
    if (ka && !author)
        return whale_errf(err, WHALE_ERR_ARG, "%s needs the model's author (model_author, --model-author)", PH_AUTHOR);
    size_t len = strlen(s) + kn * (name ? strlen(name) : 0) + ka * (author ? strlen(author) : 0);
    char *d = malloc(len + 1), *w = d;
    if (!d) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory filling placeholders");
    for (const char *p = s; *p;) {
        if (!strncmp(p, PH_NAME, sizeof PH_NAME - 1)) {
            w = stpcpy(w, name);
            p += sizeof PH_NAME - 1;
        } else if (!strncmp(p, PH_AUTHOR, sizeof PH_AUTHOR - 1)) {
            w = stpcpy(w, author);
            p += sizeof PH_AUTHOR - 1;
        } else {
            *w++ = *p++;
        }
    }
    *w = 0;
    *out = d;
    return WHALE_OK;
}

static int tag_lang(const char *tag) { return tag && !strcmp(tag, "zh") ? 0 : 1; }

whale_code whale_sft_fill_placeholders(const char *text, const char *tag, const whale_sft_opts *opts, char **out,
                                       whale_err *err) {
    if (!text || !opts || !out) return whale_errf(err, WHALE_ERR_ARG, "whale_sft_fill_placeholders: NULL argument");
    whale_code rc = fill(text, tag_lang(tag), opts, out, err);
    if (!rc && !*out && !(*out = strdup(text))) rc = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    return rc;
}

/* ------------------------------------------------------------ one record */

/* The messages of one record: contents point into the parsed JSON or into
 * strings the record owns. */
typedef struct {
    whale_chat_message *m;
    int n, cap;
    char **owned;
    int n_owned, cap_owned;
    whale_chat_message *parsed; /* from whale_chat_parse_json */
    cJSON *root;                /* the parsed line: the other contents point into it */
    int fatal;                  /* the error is not the record's fault: never skipped */
    /* records with tools, tool calls, tool messages, thinking or per-message
     * "loss" keep their JSON (OpenAI's form) for the template instead of m: */
    cJSON *jmsgs, *jtools;
    signed char *loss; /* per message of jmsgs: 1 true, 0 false, -1 default */
    int n_loss;
} rec;

static void rec_reset(rec *r) {
    for (int i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->parsed);
    cJSON_Delete(r->root);
    cJSON_Delete(r->jmsgs);
    cJSON_Delete(r->jtools);
    free(r->loss);
    r->jmsgs = r->jtools = NULL;
    r->loss = NULL;
    r->n_loss = 0;
    r->parsed = NULL;
    r->root = NULL;
    r->n = r->n_owned = 0;
    r->fatal = 0;
}

static void rec_free(rec *r) {
    rec_reset(r);
    free(r->m);
    free(r->owned);
}

static whale_code oom(rec *r, whale_err *err) {
    r->fatal = 1;
    return whale_errf(err, WHALE_ERR_NOMEM, "out of memory reading SFT records");
}

static whale_code rec_push(rec *r, const char *role, const char *content, whale_err *err) {
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        whale_chat_message *m = realloc(r->m, (size_t)cap * sizeof *m);
        if (!m) return oom(r, err);
        r->m = m;
        r->cap = cap;
    }
    r->m[r->n++] = (whale_chat_message){role, content};
    return WHALE_OK;
}

/* Keep s (malloc'd) until the record is done. */
static whale_code rec_own(rec *r, char *s, whale_err *err) {
    if (r->n_owned == r->cap_owned) {
        int cap = r->cap_owned ? 2 * r->cap_owned : 16;
        char **o = realloc(r->owned, (size_t)cap * sizeof *o);
        if (!o) {
            free(s);
            return oom(r, err);
        }
        r->owned = o;
        r->cap_owned = cap;
    }
    r->owned[r->n_owned++] = s;
    return WHALE_OK;
}

static int blank(const char *s) {
    for (; *s; s++)
        if (!(*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '\f' || *s == '\v')) return 0;
    return 1;
}

/* A field that may be absent or null (→ NULL) or else must be a string. */
static whale_code opt_string(const cJSON *o, const char *key, const char **out, whale_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return WHALE_OK;
    if (!cJSON_IsString(v)) return whale_errf(err, WHALE_ERR_FORMAT, "\"%s\": not a string", key);
    *out = v->valuestring;
    return WHALE_OK;
}

static whale_code req_string(const cJSON *o, const char *key, const char **out, whale_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return whale_errf(err, WHALE_ERR_FORMAT, "\"%s\": missing", key);
    if (!cJSON_IsString(v)) return whale_errf(err, WHALE_ERR_FORMAT, "\"%s\": not a string", key);
    *out = v->valuestring;
    return WHALE_OK;
}

static whale_code check_role(const char *role, int i, whale_err *err) {
    static const char *const tools[] = {"tool", "ipython", "function", "tool_call", "tool_response",
                                        "function_call", "observation"};
    if (!strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "assistant")) return WHALE_OK;
    for (size_t k = 0; k < sizeof tools / sizeof tools[0]; k++)
        if (!strcmp(role, tools[k]))
            return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                              "messages[%d]: role \"%s\": tool messages are not supported by the native chat "
                              "templates (system, user and assistant only)", i, role);
    return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d]: unknown role \"%.64s\" (expected system, user or assistant)",
                      i, role);
}

/* ------------------------------------------------------------ records with tools */

static int is_role(const cJSON *m, const char *role) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(r) && !strcmp(r->valuestring, role);
}

static int present(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) && !(cJSON_IsArray(v) && !v->child);
}

/* Does the record need its JSON for the template (see rec)? */
static int wants_json(const cJSON *root, const cJSON *arr) {
    if (present(root, "tools")) return 1;
    static const char *const roles[] = {"tool", "tool_call", "tool_response"};
    static const char *const fields[] = {"tool_calls", "reasoning_content", "loss"};
    for (const cJSON *m = arr->child; m; m = m->next) {
        for (int k = 0; k < 3; k++)
            if (is_role(m, roles[k]) || cJSON_GetObjectItemCaseSensitive(m, fields[k])) return 1;
    }
    return 0;
}

static whale_code json_oom(rec *r, cJSON *x, whale_err *err) {
    cJSON_Delete(x);
    return oom(r, err);
}

/* ms-swift's {"role": "tool_call", "content": "{\"name\": …, \"arguments\": …}"}
 * as an OpenAI tool call, appended to the assistant message before it (or
 * a new one). */
static whale_code add_tool_call(rec *r, cJSON *out, const cJSON *m, int i, signed char loss, whale_err *err) {
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    cJSON *call = cJSON_IsString(content) ? cJSON_Parse(content->valuestring) : NULL;
    if (!cJSON_IsObject(call) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(call, "name"))) {
        cJSON_Delete(call);
        return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d]: a tool_call's content must be a JSON object "
                          "{\"name\": ..., \"arguments\": ...}", i);
    }
    cJSON *last = cJSON_GetArrayItem(out, cJSON_GetArraySize(out) - 1);
    if (!last || !is_role(last, "assistant")) {
        last = cJSON_CreateObject();
        if (!last || !cJSON_AddItemToArray(out, last) || !cJSON_AddStringToObject(last, "role", "assistant") ||
            !cJSON_AddStringToObject(last, "content", ""))
            return json_oom(r, call, err);
        r->loss[r->n_loss++] = loss;
    }
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if (!calls && !(calls = cJSON_AddArrayToObject(last, "tool_calls"))) return json_oom(r, call, err);
    cJSON *wrap = cJSON_CreateObject();
    if (!wrap || !cJSON_AddItemToArray(calls, wrap) || !cJSON_AddStringToObject(wrap, "type", "function") ||
        !cJSON_AddItemToObject(wrap, "function", call))
        return json_oom(r, call, err);
    return WHALE_OK;
}

/* One message in OpenAI's form: tool_response → tool, "loss" taken out. */
static whale_code add_message(rec *r, cJSON *out, const cJSON *m, int i, whale_err *err) {
    if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")))
        return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d]: not an object with a string \"role\"", i);
    static const char *const roles[] = {"system", "user", "assistant", "tool", "tool_call", "tool_response"};
    int known = 0;
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) known |= is_role(m, roles[k]);
    if (!known) /* a template would drop it silently */
        return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d]: unknown role \"%.64s\" (expected system, user, "
                          "assistant, tool, tool_call or tool_response)", i,
                          cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring);
    const cJSON *lv = cJSON_GetObjectItemCaseSensitive(m, "loss");
    if (lv && !cJSON_IsNull(lv) && !cJSON_IsBool(lv))
        return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d].loss: must be true, false or null", i);
    /* ms-swift reads "loss" of replies only: on a system, user or tool
     * message it changes nothing (the loss scope decides those) */
    signed char loss = cJSON_IsBool(lv) ? (signed char)cJSON_IsTrue(lv) : -1;
    if (is_role(m, "tool_call")) return add_tool_call(r, out, m, i, loss, err);
    cJSON *copy = cJSON_Duplicate(m, 1);
    if (!copy || !cJSON_AddItemToArray(out, copy)) return json_oom(r, copy, err);
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "loss");
    if (is_role(m, "tool_response") && !cJSON_ReplaceItemInObjectCaseSensitive(copy, "role", cJSON_CreateString("tool")))
        return oom(r, err);
    r->loss[r->n_loss++] = loss;
    return WHALE_OK;
}

static whale_code record_tools(rec *r, const cJSON *root, whale_err *err) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!t || cJSON_IsNull(t)) return WHALE_OK;
    /* ms-swift writes the tools as a JSON string */
    r->jtools = cJSON_IsString(t) ? cJSON_Parse(t->valuestring) : cJSON_Duplicate(t, 1);
    if (!cJSON_IsArray(r->jtools))
        return whale_errf(err, WHALE_ERR_FORMAT, "\"tools\": expected a list of tool definitions (or one as a JSON string)");
    return WHALE_OK;
}

/* The record's messages as the template gets them, checked. */
static whale_code json_messages(rec *r, const cJSON *root, const cJSON *arr, const char *system, whale_err *err) {
    int n = cJSON_GetArraySize(arr);
    if (!(r->jmsgs = cJSON_CreateArray()) || !(r->loss = malloc((size_t)n + 2))) return oom(r, err);
    whale_code rc = record_tools(r, root, err);
    if (!rc && system && !is_role(arr->child, "system")) {
        cJSON *s = cJSON_CreateObject();
        if (!s || !cJSON_AddItemToArray(r->jmsgs, s) || !cJSON_AddStringToObject(s, "role", "system") ||
            !cJSON_AddStringToObject(s, "content", system))
            return oom(r, err);
        r->loss[r->n_loss++] = -1;
    }
    int i = 0;
    for (const cJSON *m = arr->child; !rc && m; m = m->next, i++) rc = add_message(r, r->jmsgs, m, i, err);
    for (const cJSON *m = r->jmsgs->child; !rc && m; m = m->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (is_role(m, "assistant") && !present(m, "tool_calls") && (!cJSON_IsString(c) || blank(c->valuestring)))
            rc = whale_errf(err, WHALE_ERR_FORMAT, "an assistant message with neither content nor tool_calls");
    }
    cJSON *last = cJSON_GetArrayItem(r->jmsgs, cJSON_GetArraySize(r->jmsgs) - 1);
    if (!rc && !is_role(last, "assistant"))
        rc = whale_errf(err, WHALE_ERR_FORMAT, "the conversation ends with a %s message, not the assistant's "
                        "(nothing to train on after it)", cJSON_GetObjectItemCaseSensitive(last, "role")->valuestring);
    return rc;
}

/* ShareGPT: {"conversations": [{"from", "value"}, ...], "system"?, "tools"?}
 * with ms-swift's role names, kept as JSON messages. */
static whale_code sharegpt_shape(rec *r, const cJSON *root, whale_err *err) {
    static const char *const from[][2] = {{"human", "user"}, {"user", "user"}, {"gpt", "assistant"},
                                          {"assistant", "assistant"}, {"system", "system"},
                                          {"function_call", "tool_call"}, {"observation", "tool_response"},
                                          {"tool", "tool_response"}};
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(root, "conversations");
    if (!cJSON_IsArray(conv) || !conv->child) return whale_errf(err, WHALE_ERR_FORMAT, "\"conversations\": not a non-empty array");
    const char *system;
    whale_code rc = opt_string(root, "system", &system, err);
    cJSON *msgs = cJSON_CreateArray();
    if (!msgs) return oom(r, err);
    int i = 0;
    for (const cJSON *t = conv->child; !rc && t; t = t->next, i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "from"), *v = cJSON_GetObjectItemCaseSensitive(t, "value");
        if (!cJSON_IsString(f) || !cJSON_IsString(v)) {
            rc = whale_errf(err, WHALE_ERR_FORMAT, "conversations[%d]: needs string \"from\" and \"value\"", i);
            break;
        }
        const char *role = NULL;
        for (size_t k = 0; k < sizeof from / sizeof from[0] && !role; k++)
            if (!strcmp(f->valuestring, from[k][0])) role = from[k][1];
        if (!role) {
            rc = whale_errf(err, WHALE_ERR_FORMAT, "conversations[%d]: unknown \"from\": \"%.64s\"", i, f->valuestring);
            break;
        }
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddItemToArray(msgs, m) || !cJSON_AddStringToObject(m, "role", role) ||
            !cJSON_AddStringToObject(m, "content", v->valuestring))
            rc = oom(r, err);
    }
    if (!rc) rc = json_messages(r, root, msgs, system, err);
    cJSON_Delete(msgs);
    return rc;
}

/* {"messages": [...], "system"?} */
static whale_code messages_shape(rec *r, const cJSON *root, const char *line, size_t len, whale_err *err) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(arr)) return whale_errf(err, WHALE_ERR_FORMAT, "\"messages\": not an array");
    if (!arr->child) return whale_errf(err, WHALE_ERR_FORMAT, "\"messages\": empty");
    const char *system;
    whale_code rc = opt_string(root, "system", &system, err);
    if (rc) return rc;
    if (wants_json(root, arr)) return json_messages(r, root, arr, system, err);
    /* the project's one reader of JSON messages: same refusals as `whale chat` */
    whale_chat_message *m;
    int n;
    if ((rc = whale_chat_parse_json(line, len, &m, &n, err))) {
        if (rc == WHALE_ERR_NOMEM) r->fatal = 1;
        return rc;
    }
    r->parsed = m;
    for (int i = 0; i < n; i++) {
        if ((rc = check_role(m[i].role, i, err))) return rc;
        if (!strcmp(m[i].role, "assistant") && blank(m[i].content))
            return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d]: empty assistant content", i);
    }
    if (strcmp(m[n - 1].role, "assistant"))
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "messages[%d]: the conversation ends with a %s message, not the assistant's (nothing to "
                          "train on after it)", n - 1, m[n - 1].role);
    if (system && strcmp(m[0].role, "system") && (rc = rec_push(r, "system", system, err))) return rc;
    for (int i = 0; i < n && !rc; i++) rc = rec_push(r, m[i].role, m[i].content, err);
    return rc;
}

/* [system] + history pairs + the query and its response (ms-swift's
 * history_to_messages). */
static whale_code history_shape(rec *r, const cJSON *root, const char *query, const char *response,
                                const char *resp_key, whale_err *err) {
    const char *system;
    whale_code rc = opt_string(root, "system", &system, err);
    if (rc) return rc;
    if (blank(response)) return whale_errf(err, WHALE_ERR_FORMAT, "\"%s\": empty", resp_key);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "history");
    if (h && !cJSON_IsNull(h) && !cJSON_IsArray(h))
        return whale_errf(err, WHALE_ERR_FORMAT, "\"history\": not an array of [query, response] pairs");
    if (system && (rc = rec_push(r, "system", system, err))) return rc;
    int k = 0;
    for (const cJSON *p = h && cJSON_IsArray(h) ? h->child : NULL; p; p = p->next, k++) {
        const cJSON *q = cJSON_IsArray(p) ? p->child : NULL, *a = q ? q->next : NULL;
        if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) != 2 || !cJSON_IsString(q) || !cJSON_IsString(a))
            return whale_errf(err, WHALE_ERR_FORMAT, "history[%d]: not a [query, response] pair of strings", k);
        if (blank(a->valuestring)) return whale_errf(err, WHALE_ERR_FORMAT, "history[%d][1]: empty response", k);
        if ((rc = rec_push(r, "user", q->valuestring, err)) || (rc = rec_push(r, "assistant", a->valuestring, err)))
            return rc;
    }
    if ((rc = rec_push(r, "user", query, err))) return rc;
    return rec_push(r, "assistant", response, err);
}

/* {"query", "response", "system"?, "history"?} */
static whale_code query_shape(rec *r, const cJSON *root, whale_err *err) {
    const char *q = NULL, *a = NULL;
    whale_code rc;
    if ((rc = req_string(root, "query", &q, err)) || (rc = req_string(root, "response", &a, err))) return rc;
    return history_shape(r, root, q, a, "response", err);
}

/* Alpaca: {"instruction", "input"?, "output"}; the query as ms-swift's
 * AlpacaPreprocessor makes it. */
static whale_code alpaca_shape(rec *r, const cJSON *root, whale_err *err) {
    const char *ins = NULL, *in = NULL, *out = NULL;
    whale_code rc;
    if ((rc = opt_string(root, "instruction", &ins, err)) || (rc = opt_string(root, "input", &in, err)) ||
        (rc = req_string(root, "output", &out, err)))
        return rc;
    if (!ins && !in) return whale_errf(err, WHALE_ERR_FORMAT, "\"instruction\": missing");
    const char *q;
    if (ins && *ins && in && *in) {
        size_t a = strlen(ins), b = strlen(in);
        char *s = malloc(a + b + 2);
        if (!s) return oom(r, err);
        memcpy(s, ins, a);
        s[a] = '\n';
        memcpy(s + a + 1, in, b + 1);
        if ((rc = rec_own(r, s, err))) return rc;
        q = s;
    } else {
        q = ins && *ins ? ins : in ? in : "";
    }
    return history_shape(r, root, q, out, "output", err);
}

/* Byte offset of the first invalid UTF-8 sequence, or n. */
static size_t utf8_invalid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) k = 1, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) k = 2, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) k = 3, cp = c & 0x07, min = 0x10000;
        else return i;
        if (n - i <= (size_t)k) return i;
        for (int j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += (size_t)k + 1;
    }
    return n;
}

/* Does the JSON text escape a NUL? cJSON would end the string there. */
static int escapes_nul(const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '\\') {
            if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return 1;
            i++; /* the escaped character (\\ included) */
        }
    return 0;
}

static int has(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key) != NULL; }

/* --system and self-cognition placeholders for a record kept as JSON. */
static whale_code json_finish(rec *r, const whale_sft_opts *o, const char *tag, whale_err *err) {
    if (o->system && !is_role(r->jmsgs->child, "system")) {
        cJSON *s = cJSON_CreateObject();
        if (!s || !cJSON_AddStringToObject(s, "role", "system") || !cJSON_AddStringToObject(s, "content", o->system) ||
            !cJSON_InsertItemInArray(r->jmsgs, 0, s)) {
            cJSON_Delete(s);
            return oom(r, err);
        }
        memmove(r->loss + 1, r->loss, (size_t)r->n_loss++);
        r->loss[0] = -1;
    }
    for (cJSON *m = r->jmsgs->child; tag && m; m = m->next) {
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        char *f = NULL;
        whale_code rc = cJSON_IsString(c) ? fill(c->valuestring, tag_lang(tag), o, &f, err) : WHALE_OK;
        if (rc) {
            r->fatal = 1;
            return rc;
        }
        if (f && !cJSON_SetValuestring(c, f)) {
            free(f);
            return oom(r, err);
        }
        free(f);
    }
    return WHALE_OK;
}

/* The messages of the JSONL line [s, s+n). */
static whale_code parse_record(rec *r, const whale_sft_opts *o, const char *s, size_t n, whale_err *err) {
    size_t bad = utf8_invalid((const unsigned char *)s, n);
    if (bad < n) return whale_errf(err, WHALE_ERR_FORMAT, "invalid UTF-8 at byte %zu", bad + 1);
    if (escapes_nul(s, n))
        return whale_errf(err, WHALE_ERR_FORMAT, "a string holds \\u0000 (NUL), which cannot be a chat message");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!root)
        return whale_errf(err, WHALE_ERR_FORMAT, "invalid JSON (column %zu)",
                          end && end >= s ? (size_t)(end - s) + 1 : (size_t)1);
    r->root = root;
    whale_code rc = WHALE_OK;
    while (end < s + n && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
    const char *tag = NULL;
    if (end != s + n) rc = whale_errf(err, WHALE_ERR_FORMAT, "text after the JSON value");
    else if (!cJSON_IsObject(root)) rc = whale_errf(err, WHALE_ERR_FORMAT, "expected a JSON object");
    else rc = opt_string(root, "tag", &tag, err);
    if (!rc) {
        if (has(root, "messages")) rc = messages_shape(r, root, s, n, err);
        else if (has(root, "conversations")) rc = sharegpt_shape(r, root, err);
        else if (has(root, "query") || has(root, "response"))
            rc = query_shape(r, root, err);
        else if (has(root, "instruction") || has(root, "output"))
            rc = alpaca_shape(r, root, err);
        else
            rc = whale_errf(err, WHALE_ERR_FORMAT,
                            "no \"messages\", \"conversations\", \"query\"/\"response\" or \"instruction\"/\"output\" field");
    }
    if (!rc && r->jmsgs) return json_finish(r, o, tag, err);
    if (!rc && o->system) {
        int has_system = 0;
        for (int i = 0; i < r->n; i++) has_system |= !strcmp(r->m[i].role, "system");
        if (!has_system && (rc = rec_push(r, "system", o->system, err)) == WHALE_OK) {
            memmove(r->m + 1, r->m, (size_t)(r->n - 1) * sizeof *r->m);
            r->m[0] = (whale_chat_message){"system", o->system};
        }
    }
    /* self-cognition: a tagged record gets its placeholders filled */
    for (int i = 0; !rc && tag && i < r->n; i++) {
        char *f;
        rc = fill(r->m[i].content, tag_lang(tag), o, &f, err);
        if (rc) r->fatal = 1;
        else if (f && !(rc = rec_own(r, f, err))) r->m[i].content = f;
    }
    return rc;
}

/* ------------------------------------------------------------ opening */

void whale_sft_dataset_free(whale_sft_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_files; i++) free(ds->files[i]);
    free(ds->files);
    free(ds->ids);
    free(ds->train);
    free(ds->s);
    free(ds->row_off);
    free(ds->row_samp);
    free(ds);
}

/* Append a sample of n tokens (ids and train flags). */
static int add_sample(whale_sft_dataset *ds, const int32_t *ids, const uint8_t *train, int n, int file, int64_t line,
                      int truncated) {
    if (ds->n_tok + n > ds->cap_tok) {
        int64_t cap = ds->cap_tok ? ds->cap_tok : 1 << 16;
        while (cap < ds->n_tok + n) cap *= 2;
        int32_t *i2 = realloc(ds->ids, (size_t)cap * sizeof *i2);
        if (!i2) return 0;
        ds->ids = i2;
        uint8_t *t2 = realloc(ds->train, (size_t)cap);
        if (!t2) return 0;
        ds->train = t2;
        ds->cap_tok = cap;
    }
    if (ds->n_s == ds->cap_s) {
        int64_t cap = ds->cap_s ? 2 * ds->cap_s : 1024;
        sample_rec *s2 = realloc(ds->s, (size_t)cap * sizeof *s2);
        if (!s2) return 0;
        ds->s = s2;
        ds->cap_s = cap;
    }
    memcpy(ds->ids + ds->n_tok, ids, (size_t)n * sizeof *ids);
    memcpy(ds->train + ds->n_tok, train, (size_t)n);
    ds->s[ds->n_s++] = (sample_rec){ds->n_tok, n, file, line, truncated};
    ds->n_tok += n;
    return 1;
}

/* Turn one record's tokens into a sample (or count why not). */
static whale_code take_sample(whale_sft_dataset *ds, const whale_sft_opts *o, int32_t *ids, uint8_t *mask, int n,
                              int final, int file, int64_t line, whale_err *err) {
    int start = 0, cut = 0;
    if (o->max_length > 0 && n > o->max_length) {
        if (o->truncation == WHALE_SFT_TRUNC_DELETE) {
            ds->st.deleted++;
            return WHALE_OK;
        }
        if (o->truncation == WHALE_SFT_TRUNC_LEFT) start = n - o->max_length;
        n = o->max_length;
        cut = 1;
    }
    if (o->loss_scope == WHALE_SFT_LOSS_ALL && !final) memset(mask + start, 1, (size_t)n);
    mask[start] = 0; /* nothing before a sample's first token predicts it */
    int64_t trained = 0;
    for (int i = 0; i < n; i++) trained += mask[start + i] != 0;
    if (!trained) {
        ds->st.untrained++;
        return WHALE_OK;
    }
    if (!add_sample(ds, ids + start, mask + start, n, file, line, cut))
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory holding %" PRId64 " SFT tokens", ds->n_tok + n);
    ds->st.samples++;
    ds->st.truncated += cut;
    ds->st.tokens += n;
    ds->st.trained_tokens += trained;
    if (n > ds->st.max_sample_tokens) ds->st.max_sample_tokens = n;
    return WHALE_OK;
}

/* A record kept as JSON: rendered by the template, the replies whose
 * "loss" is false left out of the mask — under the loss scope "all" too,
 * as ms-swift's per-message loss overrides its loss scale; there the mask
 * is final (*final = 1): every token but those replies'. */
static whale_code encode_json(whale_tokenizer *tok, const whale_chat_template *tpl, const whale_sft_opts *o, rec *r,
                              int32_t **ids, uint8_t **mask, int *n_ids, int *final, whale_err *err) {
    char *text = NULL;
    size_t len = 0;
    whale_chat_span *sp = NULL;
    int n_sp = 0, kept = 0, all = o->loss_scope == WHALE_SFT_LOSS_ALL;
    whale_code rc = whale_chat_template_spans_json(tpl, r->jmsgs, r->jtools, 0,
                                                   whale_tokenizer_role_token(tok, WHALE_TOKEN_BOS), &text, &len, &sp,
                                                   &n_sp, err);
    for (int k = 0; !rc && k < n_sp; k++) /* all: the replies left out; else: those trained */
        if ((sp[k].message < r->n_loss && r->loss[sp[k].message] == 0) == all) sp[kept++] = sp[k];
    if (!rc) rc = whale_chat_encode_spans(tok, text, len, sp, kept, ids, mask, n_ids, err);
    *final = all;
    for (int i = 0; !rc && all && i < *n_ids; i++) (*mask)[i] = !(*mask)[i];
    free(text);
    free(sp);
    return rc;
}

/* A record that cannot be used: the error, or counted as skipped. */
static whale_code bad_record(whale_sft_dataset *ds, const whale_sft_opts *o, const char *where, whale_code code,
                             int fatal, const char *msg, whale_err *err) {
    if (fatal || o->bad_records == WHALE_SFT_BAD_FAIL) return whale_errf(err, code, "%s: %s", where, msg);
    if (ds->st.skipped++ == 0) snprintf(ds->st.first_bad, sizeof ds->st.first_bad, "%.220s: %.280s", where, msg);
    return WHALE_OK;
}

/* One record, text s[0..n), line (or element) number line of file fi;
 * array: the file is a JSON array (errors say "record N"). */
static whale_code one_record(whale_sft_dataset *ds, whale_tokenizer *tok, const whale_chat_template *tpl,
                             const whale_sft_opts *o, int fi, rec *r, const char *s, size_t n, int64_t line, int array,
                             whale_err *err) {
    const char *path = ds->files[fi];
    char where[300];
    snprintf(where, sizeof where, array ? "%.200s: record %" PRId64 : "%.200s:%" PRId64, path, line);
    ds->st.records++;
    whale_err e;
    rec_reset(r);
    whale_code rc = WHALE_OK, bad = parse_record(r, o, s, n, &e);
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    int n_ids = 0, final = 0;
    if (!bad) {
        bad = r->jmsgs ? encode_json(tok, tpl, o, r, &ids, &mask, &n_ids, &final, &e)
                       : whale_chat_template_encode(tok, tpl, r->m, r->n, 0, &ids, &mask, &n_ids, &e);
        if (bad == WHALE_ERR_NOMEM) r->fatal = 1;
        if (bad == WHALE_ERR_ARG) bad = WHALE_ERR_FORMAT; /* the record's messages, not the caller's */
    }
    if (bad) {
        rc = bad_record(ds, o, where, bad, r->fatal, e.msg, err);
    } else {
        rc = take_sample(ds, o, ids, mask, n_ids, final, fi, line, err);
    }
    free(ids);
    free(mask);
    return rc;
}

/* A .json file holding one array of records (ms-swift reads those too). */
static whale_code read_array(whale_sft_dataset *ds, whale_tokenizer *tok, const whale_chat_template *tpl,
                             const whale_sft_opts *o, int fi, rec *r, const char *buf, size_t size, whale_err *err) {
    const char *end = NULL;
    cJSON *arr = cJSON_ParseWithLengthOpts(buf, size, &end, 0);
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(arr);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: a file starting with '[' must be one JSON array of records "
                          "(invalid JSON near byte %zu)", ds->files[fi], end ? (size_t)(end - buf) + 1 : (size_t)1);
    }
    whale_code rc = WHALE_OK;
    int64_t k = 0;
    for (const cJSON *e = arr->child; e && !rc; e = e->next) {
        char *text = cJSON_PrintUnformatted(e);
        if (!text) rc = whale_errf(err, WHALE_ERR_NOMEM, "out of memory reading SFT records");
        else rc = one_record(ds, tok, tpl, o, fi, r, text, strlen(text), ++k, 1, err);
        free(text);
    }
    cJSON_Delete(arr);
    return rc;
}

/* The next line of f into *buf (without its newline, NUL-terminated):
 * 1 if there was one, 0 at the end, -1 on a read error or out of memory.
 * At most max bytes are kept: *too_long is set for a longer line, whose
 * rest is read and dropped, so a huge record never sits in memory. */
static int next_line(FILE *f, char **buf, size_t *cap, size_t *len, size_t max, int *too_long) {
    *len = 0;
    *too_long = 0;
    int c, any = 0;
    while ((c = getc_unlocked(f)) != EOF) {
        any = 1;
        if (c == '\n') break;
        if (*len >= max) {
            *too_long = 1;
            continue;
        }
        if (*len + 2 > *cap) {
            size_t nc = *cap ? 2 * *cap : 4096;
            char *b = realloc(*buf, nc);
            if (!b) return -1;
            *buf = b;
            *cap = nc;
        }
        (*buf)[(*len)++] = (char)c;
    }
    if (ferror(f)) return -1;
    if (*buf) (*buf)[*len] = 0;
    return any;
}

/* Does the file start (after a BOM and blanks) with '[', a JSON array?
 * Leaves f at its start. */
static int starts_array(FILE *f) {
    unsigned char bom[3];
    if (fread(bom, 1, 3, f) != 3 || memcmp(bom, "\xEF\xBB\xBF", 3)) rewind(f);
    int c;
    do c = getc_unlocked(f);
    while (c == ' ' || c == '\t' || c == '\r' || c == '\n');
    rewind(f);
    return c == '[';
}

/* A .json array file, read whole (within whale_read_file's cap). */
static whale_code read_array_file(whale_sft_dataset *ds, whale_tokenizer *tok, const whale_chat_template *tpl,
                                  const whale_sft_opts *o, int fi, rec *r, whale_err *err) {
    char *buf;
    size_t size;
    whale_code rc = whale_read_file(ds->files[fi], &buf, &size, err);
    if (rc) return rc;
    size_t first = size >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3) ? 3 : 0;
    while (first < size && strchr(" \t\r\n", buf[first])) first++;
    rc = read_array(ds, tok, tpl, o, fi, r, buf + first, size - first, err);
    rec_reset(r);
    free(buf);
    return rc;
}

/* What reading a .csv file row by row needs. */
typedef struct {
    whale_sft_dataset *ds;
    whale_tokenizer *tok;
    const whale_chat_template *tpl;
    const whale_sft_opts *o;
    int fi;
    rec *r;
} csv_ctx;

static whale_code csv_row(void *ctx, const char *json, const char *bad, int64_t line, whale_err *err) {
    csv_ctx *c = ctx;
    if (json) return one_record(c->ds, c->tok, c->tpl, c->o, c->fi, c->r, json, strlen(json), line, 0, err);
    char where[300];
    snprintf(where, sizeof where, "%.200s:%" PRId64, c->ds->files[c->fi], line);
    c->ds->st.records++;
    return bad_record(c->ds, c->o, where, WHALE_ERR_FORMAT, 0, bad, err);
}

static int is_csv(const char *path) {
    size_t n = strlen(path);
    return n >= 4 && (!strcmp(path + n - 4, ".csv") || !strcmp(path + n - 4, ".CSV"));
}

/* Every record of one file: .csv rows, a JSON array, or JSONL read a line
 * at a time (a record longer than the cap is refused without being held). */
static whale_code read_file(whale_sft_dataset *ds, whale_tokenizer *tok, const whale_chat_template *tpl,
                            const whale_sft_opts *o, int fi, rec *r, whale_err *err) {
    const char *path = ds->files[fi];
    if (is_csv(path)) {
        csv_ctx c = {ds, tok, tpl, o, fi, r};
        whale_code rc = sft_csv_read(path, csv_row, &c, err);
        rec_reset(r);
        return rc;
    }
    FILE *f;
    whale_code rc = whale_fopen_regular(path, &f, NULL, err);
    if (rc) return rc;
    if (starts_array(f)) {
        fclose(f);
        return read_array_file(ds, tok, tpl, o, fi, r, err);
    }
    char *buf = NULL;
    size_t cap = 0, n;
    int64_t line = 0;
    int got, too_long;
    while (!rc && (got = next_line(f, &buf, &cap, &n, WHALE_MAX_RECORD_BYTES, &too_long)) != 0) {
        if (got < 0) {
            rc = whale_errf(err, ferror(f) ? WHALE_ERR_IO : WHALE_ERR_NOMEM, "%s:%" PRId64 ": %s", path, line + 1,
                            ferror(f) ? "read failed" : "out of memory");
            break;
        }
        const char *s = buf;
        line++;
        if (too_long) {
            rc = whale_errf(err, WHALE_ERR_RANGE, "%s:%" PRId64 ": a record of more than %zu bytes (the cap on one record)",
                            path, line, (size_t)WHALE_MAX_RECORD_BYTES);
            break;
        }
        if (line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) s += 3, n -= 3; /* a BOM is not part of the first record */
        if (n && s[n - 1] == '\r') n--;
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r' || s[k] == '\f' || s[k] == '\v')) k++;
        if (k == n) continue; /* blank lines are not records */
        rc = one_record(ds, tok, tpl, o, fi, r, s, n, line, 0, err);
    }
    rec_reset(r);
    free(buf);
    fclose(f);
    return rc;
}

static int32_t pad_id(const whale_tokenizer *tok, const whale_chat_template *tpl) {
    int32_t id = whale_tokenizer_role_id(tok, WHALE_TOKEN_PAD);
    if (id < 0) id = whale_tokenizer_role_id(tok, WHALE_TOKEN_EOS);
    if (id < 0 && whale_chat_template_stop_ids(tok, tpl, &id, 1) < 1) id = -1;
    return id < 0 ? 0 : id;
}

whale_code whale_sft_dataset_open(const char *const *files, int n_files, whale_tokenizer *tok,
                                  whale_chat_format fmt, const whale_sft_opts *opts,
                                  whale_sft_dataset **out, whale_err *err) {
    whale_chat_template *tpl;
    whale_code rc = whale_chat_template_native(fmt, &tpl, err);
    if (rc) return rc;
    rc = whale_sft_dataset_open_template(files, n_files, tok, tpl, opts, out, err);
    whale_chat_template_free(tpl);
    return rc;
}

whale_code whale_sft_dataset_open_template(const char *const *files, int n_files, whale_tokenizer *tok,
                                           const whale_chat_template *tpl, const whale_sft_opts *opts,
                                           whale_sft_dataset **out, whale_err *err) {
    if (!out || !tok || !tpl) return whale_errf(err, WHALE_ERR_ARG, "whale_sft_dataset_open: NULL argument");
    *out = NULL;
    if (!files || n_files < 1) return whale_errf(err, WHALE_ERR_ARG, "SFT data: no input files");
    for (int i = 0; i < n_files; i++)
        if (!files[i]) return whale_errf(err, WHALE_ERR_ARG, "SFT data: input file %d is NULL", i);
    whale_sft_opts o = opts ? *opts : whale_sft_defaults();
    if (o.max_length < 0) return whale_errf(err, WHALE_ERR_ARG, "SFT data: max_length %d is negative", o.max_length);
    if ((unsigned)o.loss_scope > WHALE_SFT_LOSS_ALL || (unsigned)o.truncation > WHALE_SFT_TRUNC_RIGHT ||
        (unsigned)o.bad_records > WHALE_SFT_BAD_SKIP)
        return whale_errf(err, WHALE_ERR_ARG, "SFT data: loss scope, truncation or bad record policy out of range");

    whale_sft_dataset *ds = calloc(1, sizeof *ds);
    if (!ds || !(ds->files = calloc((size_t)n_files, sizeof *ds->files))) {
        free(ds);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    ds->tok = tok;
    ds->packing = o.packing != 0;
    ds->pad = pad_id(tok, tpl);
    whale_code rc = WHALE_OK;
    for (int i = 0; i < n_files && !rc; i++) {
        if (!(ds->files[i] = strdup(files[i]))) rc = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        ds->n_files = i + 1;
    }
    rec r = {0};
    for (int i = 0; i < n_files && !rc; i++) rc = read_file(ds, tok, tpl, &o, i, &r, err);
    rec_free(&r);
    if (!rc && ds->n_s == 0) {
        const whale_sft_stats *st = &ds->st;
        rc = whale_errf(err, WHALE_ERR_FORMAT,
                        "%s%s: no usable SFT sample: %" PRId64 " records, %" PRId64 " skipped as malformed, %" PRId64
                        " longer than max_length %d deleted, %" PRId64 " left without a trained token",
                        files[0], n_files > 1 ? " …" : "", st->records, st->skipped, st->deleted, o.max_length,
                        st->untrained);
    }
    if (rc) {
        whale_sft_dataset_free(ds);
        return rc;
    }
    *out = ds;
    return WHALE_OK;
}

int64_t whale_sft_dataset_num_samples(const whale_sft_dataset *ds) { return ds ? ds->n_s : 0; }

void whale_sft_dataset_file_samples(const whale_sft_dataset *ds, int f, int64_t *first, int64_t *count) {
    int64_t lo = 0;
    while (lo < ds->n_s && ds->s[lo].file < f) lo++;
    int64_t hi = lo;
    while (hi < ds->n_s && ds->s[hi].file == f) hi++;
    *first = lo;
    *count = hi - lo;
}

whale_code whale_sft_dataset_select(const whale_sft_dataset *ds, const int64_t *idx, int64_t n,
                                    whale_sft_dataset **out, whale_err *err) {
    *out = NULL;
    if (!ds || (n && !idx)) return whale_errf(err, WHALE_ERR_ARG, "whale_sft_dataset_select: NULL argument");
    whale_sft_dataset *d = calloc(1, sizeof *d);
    if (!d || !(d->files = calloc((size_t)ds->n_files, sizeof *d->files))) {
        free(d);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    d->tok = ds->tok;
    d->packing = ds->packing;
    d->pad = ds->pad;
    d->st = ds->st; /* what reading the files found; the sample counts are the selection's */
    d->st.samples = d->st.truncated = d->st.tokens = d->st.trained_tokens = d->st.max_sample_tokens = 0;
    int ok = 1;
    for (int i = 0; i < ds->n_files && ok; i++) ok = (d->files[d->n_files++] = strdup(ds->files[i])) != NULL;
    for (int64_t k = 0; k < n && ok; k++) {
        if (idx[k] < 0 || idx[k] >= ds->n_s) {
            whale_sft_dataset_free(d);
            return whale_errf(err, WHALE_ERR_RANGE, "SFT sample %" PRId64 " is outside the %" PRId64 " samples",
                              idx[k], ds->n_s);
        }
        const sample_rec *r = &ds->s[idx[k]];
        ok = add_sample(d, ds->ids + r->off, ds->train + r->off, r->n, r->file, r->line, r->truncated);
        int64_t trained = 0;
        for (int q = 0; q < r->n; q++) trained += ds->train[r->off + q];
        d->st.samples++;
        d->st.truncated += r->truncated != 0;
        d->st.tokens += r->n;
        d->st.trained_tokens += trained;
        if (r->n > d->st.max_sample_tokens) d->st.max_sample_tokens = r->n;
    }
    if (!ok) {
        whale_sft_dataset_free(d);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory selecting SFT samples");
    }
    *out = d;
    return WHALE_OK;
}

void whale_sft_dataset_stats(const whale_sft_dataset *ds, whale_sft_stats *st) {
    if (ds) *st = ds->st;
    else memset(st, 0, sizeof *st);
}

int32_t whale_sft_dataset_pad_id(const whale_sft_dataset *ds) { return ds ? ds->pad : 0; }

/* ------------------------------------------------------------ samples */

whale_code whale_sft_dataset_sample(const whale_sft_dataset *ds, int64_t i, whale_sft_sample *out, whale_err *err) {
    if (!ds || !out) return whale_errf(err, WHALE_ERR_ARG, "whale_sft_dataset_sample: NULL argument");
    if (i < 0 || i >= ds->n_s)
        return whale_errf(err, WHALE_ERR_RANGE, "SFT sample %" PRId64 " is outside the %" PRId64 " samples", i, ds->n_s);
    const sample_rec *s = &ds->s[i];
    out->ids = ds->ids + s->off;
    out->train = ds->train + s->off;
    out->n = s->n;
    out->file = ds->files[s->file];
    out->line = s->line;
    out->truncated = s->truncated;
    return WHALE_OK;
}

whale_code whale_sft_sample_text(const whale_sft_dataset *ds, int64_t i, char **text, size_t *len,
                                 uint8_t **byte_mask, whale_err *err) {
    whale_sft_sample s;
    if (!text || !len) return whale_errf(err, WHALE_ERR_ARG, "whale_sft_sample_text: NULL argument");
    whale_code rc = whale_sft_dataset_sample(ds, i, &s, err);
    if (rc) return rc;
    size_t total = 0, tl;
    for (int k = 0; k < s.n; k++)
        if (whale_tokenizer_token_bytes(ds->tok, s.ids[k], &tl)) total += tl;
    char *t = malloc(total + 1);
    uint8_t *m = byte_mask ? malloc(total + 1) : NULL;
    if (!t || (byte_mask && !m)) {
        free(t);
        free(m);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for the text of SFT sample %" PRId64, i);
    }
    size_t at = 0;
    for (int k = 0; k < s.n; k++) {
        const char *b = whale_tokenizer_token_bytes(ds->tok, s.ids[k], &tl);
        if (!b) continue;
        memcpy(t + at, b, tl);
        if (m) memset(m + at, s.train[k], tl);
        at += tl;
    }
    t[at] = 0;
    *text = t;
    *len = at;
    if (byte_mask) *byte_mask = m;
    return WHALE_OK;
}

/* ------------------------------------------------------------ packing */

/* Counts of rows by free space, in a segment tree over 0..P-1 (leaves at
 * P + c): finding the smallest free space that still fits a sample is
 * O(log S). */
static void tree_add(int64_t *cnt, int64_t P, int64_t c, int64_t d) {
    for (int64_t node = P + c; node >= 1; node >>= 1) cnt[node] += d;
}

static int64_t tree_first_at_least(const int64_t *cnt, int64_t P, int64_t lo) {
    if (lo >= P) return -1;
    int64_t node = P + lo;
    if (cnt[node]) return lo;
    for (;;) {
        while (node & 1) { /* a right child: go up until a right sibling exists */
            node >>= 1;
            if (node == 0) return -1;
        }
        node++;
        if (cnt[node]) break;
    }
    while (node < P) { /* the leftmost non-empty leaf below */
        node *= 2;
        if (!cnt[node]) node++;
    }
    return node - P;
}

typedef struct {
    int32_t n;
    int64_t i;
} len_idx;

static int by_length_desc(const void *a, const void *b) {
    const len_idx *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Best fit decreasing: each sample, longest first, goes to the row with the
 * least free space that still holds it (the row made last among equals). */
static whale_code pack(whale_sft_dataset *ds, int S, whale_err *err) {
    int64_t n = ds->n_s, P = 1;
    while (P < (int64_t)S + 1) P *= 2;
    len_idx *order = malloc((size_t)n * sizeof *order);
    int64_t *cnt = calloc((size_t)(2 * P), sizeof *cnt);
    int64_t *head = malloc(((size_t)S + 1) * sizeof *head);
    int64_t *next = malloc((size_t)n * sizeof *next);
    int64_t *row_of = malloc((size_t)n * sizeof *row_of);
    int64_t *off = NULL, *samp = malloc((size_t)n * sizeof *samp);
    whale_code rc = WHALE_OK;
    if (!order || !cnt || !head || !next || !row_of || !samp) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "out of memory packing %" PRId64 " SFT samples", n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) order[i] = (len_idx){ds->s[i].n, i};
    qsort(order, (size_t)n, sizeof *order, by_length_desc);
    for (int i = 0; i <= S; i++) head[i] = -1;
    int64_t rows = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t L = order[k].n, c = tree_first_at_least(cnt, P, L), r;
        if (c < 0) {
            r = rows++;
            c = S;
        } else {
            r = head[c];
            head[c] = next[r];
            tree_add(cnt, P, c, -1);
        }
        row_of[order[k].i] = r;
        int64_t left = c - L;
        if (left > 0) { /* a full row takes nothing more */
            next[r] = head[left];
            head[left] = r;
            tree_add(cnt, P, left, 1);
        }
    }
    if (!(off = calloc((size_t)rows + 1, sizeof *off))) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "out of memory packing %" PRId64 " SFT samples", n);
        goto done;
    }
    /* counting sort by row keeps each row's samples in file order */
    for (int64_t i = 0; i < n; i++) off[row_of[i] + 1]++;
    for (int64_t r = 0; r < rows; r++) off[r + 1] += off[r];
    for (int64_t i = 0; i < n; i++) samp[off[row_of[i]]++] = i;
    for (int64_t r = rows; r > 0; r--) off[r] = off[r - 1];
    off[0] = 0;
    free(ds->row_off);
    free(ds->row_samp);
    ds->row_off = off;
    ds->row_samp = samp;
    ds->n_rows = rows;
    off = samp = NULL;
done:
    free(order);
    free(cnt);
    free(head);
    free(next);
    free(row_of);
    free(off);
    free(samp);
    return rc;
}

/* The rows for S (built once per S). */
static whale_code plan(whale_sft_dataset *ds, int S, whale_err *err) {
    if (!ds) return whale_errf(err, WHALE_ERR_ARG, "SFT data: NULL dataset");
    if (S < 1) return whale_errf(err, WHALE_ERR_ARG, "SFT data: row length %d", S);
    if (ds->plan_S == S) return WHALE_OK;
    if (ds->st.max_sample_tokens > S) {
        for (int64_t i = 0; i < ds->n_s; i++)
            if (ds->s[i].n > S)
                return whale_errf(err, WHALE_ERR_ARG,
                                  "%s:%" PRId64 ": the sample has %d tokens, more than the rows of %d (set max_length "
                                  "to at most %d)", ds->files[ds->s[i].file], ds->s[i].line, (int)ds->s[i].n, S, S);
    }
    if (ds->packing) {
        whale_code rc = pack(ds, S, err);
        if (rc) return rc;
    } else {
        ds->n_rows = ds->n_s;
    }
    ds->plan_S = S;
    return WHALE_OK;
}

whale_code whale_sft_dataset_num_rows(whale_sft_dataset *ds, int S, int64_t *rows, whale_err *err) {
    whale_code rc = plan(ds, S, err);
    if (!rc && rows) *rows = ds->n_rows;
    return rc;
}

/* Write the samples samp[0..k) of one row, then the padding. */
static void fill_row(const whale_sft_dataset *ds, const int64_t *samp, int64_t k, int S, int32_t *ids,
                     int32_t *labels, int32_t *pos, int32_t *seg) {
    int t = 0;
    for (int64_t j = 0; j < k; j++) {
        const sample_rec *s = &ds->s[samp[j]];
        const int32_t *si = ds->ids + s->off;
        const uint8_t *st = ds->train + s->off;
        int t0 = t;
        for (int q = 0; q < s->n; q++, t++) {
            ids[t] = si[q];
            if (labels) labels[t] = st[q] ? si[q] : -100;
            if (pos) pos[t] = q;
            if (seg) seg[t] = t0;
        }
    }
    for (int t0 = t; t < S; t++) { /* padding: a segment of its own, never trained */
        ids[t] = ds->pad;
        if (labels) labels[t] = -100;
        if (pos) pos[t] = t - t0;
        if (seg) seg[t] = t0;
    }
}

whale_code whale_sft_dataset_row(whale_sft_dataset *ds, int64_t r, int S, int32_t *ids, int32_t *labels,
                                 int32_t *pos, int32_t *seg, whale_err *err) {
    whale_code rc = plan(ds, S, err);
    if (rc) return rc;
    if (!ids) return whale_errf(err, WHALE_ERR_ARG, "whale_sft_dataset_row: NULL ids");
    if (r < 0 || r >= ds->n_rows)
        return whale_errf(err, WHALE_ERR_RANGE, "SFT row %" PRId64 " is outside the %" PRId64 " rows of %d tokens", r,
                          ds->n_rows, S);
    if (ds->packing) fill_row(ds, ds->row_samp + ds->row_off[r], ds->row_off[r + 1] - ds->row_off[r], S, ids, labels,
                              pos, seg);
    else fill_row(ds, &r, 1, S, ids, labels, pos, seg);
    return WHALE_OK;
}

whale_code whale_sft_next_batch(whale_sft_dataset *ds, whale_data_cursor *cur, int B, int S, whale_batch *out,
                                whale_err *err) {
    if (B < 1 || S < 1 || !cur || !out || !out->ids)
        return whale_errf(err, WHALE_ERR_ARG, "SFT data: batch of %d rows of %d tokens", B, S);
    whale_code rc = plan(ds, S, err);
    if (rc) return rc;
    int64_t n = ds->n_rows;
    whale_data_cursor c = *cur;
    if (c.windows == 0) c.windows = n;
    if (c.windows != n || c.index < 0 || c.index > n || c.epoch < 0)
        return whale_errf(err, WHALE_ERR_ARG,
                          "SFT data: the data cursor (epoch %" PRId64 ", row %" PRId64 " of %" PRId64
                          ") does not fit the %" PRId64 " rows of %d tokens: resume with the same data, options and "
                          "sequence length", c.epoch, c.index, c.windows, n, S);
    for (int b = 0; b < B; b++) {
        if (c.index == n) {
            c.epoch++;
            c.index = 0;
        }
        int64_t r = whale_data_shuffle(c.seed, c.epoch, n, c.index++);
        size_t o = (size_t)b * (size_t)S;
        rc = whale_sft_dataset_row(ds, r, S, out->ids + o, out->labels ? out->labels + o : NULL,
                                   out->pos ? out->pos + o : NULL, out->seg ? out->seg + o : NULL, err);
        if (rc) return rc;
    }
    out->B = B;
    out->S = S;
    *cur = c;
    return WHALE_OK;
}
