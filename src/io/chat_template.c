/* Chat templates as the commands use them: the model folder's own Jinja
 * template (src/io/jinja*.c), a Jinja file, or a native format (chat.c);
 * the SFT loss mask by generation-prompt prefixes (see whale_chat.h). */
#include "whale_chat.h"

#include "core/core.h"
#include "core/sbuf.h"
#include "io/jinja.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct whale_chat_template {
    int native;             /* 1: fmt; 0: jinja */
    whale_chat_format fmt;
    whale_jinja *jinja;
    char *source;           /* the Jinja text */
    cJSON *specials;        /* bos_token, eos_token, ... as transformers passes them */
    char name[4300];
    char notice[4400];
};

/* ------------------------------------------------------------ loading */

/* The folder model_dir names (a file inside it names its folder). */
static whale_code folder_of(const char *model_dir, char *dir, size_t cap, whale_err *err) {
    struct stat st;
    if (strlen(model_dir) >= cap) return whale_errf(err, WHALE_ERR_ARG, "%.64s...: path too long", model_dir);
    snprintf(dir, cap, "%s", model_dir);
    if (stat(dir, &st) != 0) return whale_errf(err, WHALE_ERR_IO, "%s: cannot open: %s", model_dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, cap, ".");
    }
    return WHALE_OK;
}

/* tokenizer_config.json's special tokens: a string or {"content": ...} */
static cJSON *special_tokens(const cJSON *cfg) {
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
    cJSON *out = cJSON_CreateObject();
    for (size_t i = 0; out && cfg && i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[i]);
        if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(v)) cJSON_AddStringToObject(out, keys[i], v->valuestring);
    }
    return out;
}

/* "chat_template" of tokenizer_config.json: a string or named list. *tpl
 * stays NULL when there is none. */
static whale_code config_template(const cJSON *cfg, const char *path, const char **tpl, whale_err *err) {
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    *tpl = NULL;
    if (!ct || cJSON_IsNull(ct)) return WHALE_OK;
    if (cJSON_IsString(ct)) {
        *tpl = ct->valuestring;
        return WHALE_OK;
    }
    if (!cJSON_IsArray(ct))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: \"chat_template\" is neither a string nor a list of {name, template}", path);
    for (const cJSON *e = ct->child; e; e = e->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(name) || !cJSON_IsString(t))
            return whale_errf(err, WHALE_ERR_FORMAT,
                              "%s: \"chat_template\" list entries must be {\"name\": string, \"template\": string}", path);
        if (!strcmp(name->valuestring, "default")) {
            *tpl = t->valuestring;
            return WHALE_OK;
        }
    }
    return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: \"chat_template\" has no \"default\" template; pass --chat-template", path);
}

static whale_code compile(whale_chat_template *t, const char *src, size_t n, const char *origin, whale_err *err) {
    t->source = malloc(n + 1);
    if (!t->source) return whale_errf(err, WHALE_ERR_NOMEM, "chat template: out of memory");
    memcpy(t->source, src, n);
    t->source[n] = 0;
    snprintf(t->name, sizeof t->name, "%s", origin);
    whale_code rc = whale_jinja_parse(src, n, &t->jinja, err);
    if (rc) {
        /* name the file in front of "chat template line N: ..." */
        char msg[WHALE_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
        whale_errf(err, rc, "%s: %s", origin, msg);
    }
    return rc;
}

/* The folder's own template, or the raw fallback with a notice. */
static whale_code load_own(whale_chat_template *t, const char *dir, const cJSON *cfg, const char *cfg_path, whale_err *err) {
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (stat(path, &st) == 0) { /* transformers prefers it over tokenizer_config.json */
        char *buf;
        size_t n;
        whale_code rc = whale_read_file(path, &buf, &n, err);
        if (rc) return rc;
        rc = compile(t, buf, n, path, err);
        free(buf);
        return rc;
    }
    const char *tpl = NULL;
    if (cfg) {
        whale_code rc = config_template(cfg, cfg_path, &tpl, err);
        if (rc) return rc;
    }
    if (tpl) return compile(t, tpl, strlen(tpl), cfg_path, err);
    t->native = 1;
    t->fmt = WHALE_CHAT_RAW;
    snprintf(t->name, sizeof t->name, "raw");
    snprintf(t->notice, sizeof t->notice,
             "%s has no chat template: using nanowhale's chat.py fallback (\"role: content\" lines, then "
             "\"assistant:\"); pass --chat-template to choose another", dir);
    return WHALE_OK;
}

whale_code whale_chat_template_native(whale_chat_format fmt, whale_chat_template **out, whale_err *err) {
    if (!out) return whale_errf(err, WHALE_ERR_ARG, "whale_chat_template_native: NULL argument");
    if (fmt != WHALE_CHAT_DEEPSEEK && fmt != WHALE_CHAT_CHATML && fmt != WHALE_CHAT_RAW)
        return whale_errf(err, WHALE_ERR_ARG, "chat: unknown format %d", (int)fmt);
    whale_chat_template *t = calloc(1, sizeof *t);
    if (!t) return whale_errf(err, WHALE_ERR_NOMEM, "chat template: out of memory");
    t->native = 1;
    t->fmt = fmt;
    t->specials = cJSON_CreateObject();
    snprintf(t->name, sizeof t->name, "%s", whale_chat_format_name(fmt));
    *out = t;
    return WHALE_OK;
}

static whale_code load_choice(whale_chat_template *t, const char *dir, const char *choice, const cJSON *cfg,
                              const char *cfg_path, whale_err *err) {
    if (!choice || !*choice) return load_own(t, dir, cfg, cfg_path, err);
    whale_chat_format fmt;
    whale_err ignore;
    if (!whale_chat_format_from_name(choice, &fmt, &ignore)) {
        t->native = 1;
        t->fmt = fmt;
        snprintf(t->name, sizeof t->name, "%s", choice);
        return WHALE_OK;
    }
    struct stat st;
    if (stat(choice, &st) != 0 || !S_ISREG(st.st_mode))
        return whale_errf(err, WHALE_ERR_ARG,
                          "--chat-template %.200s: neither deepseek, chatml, raw nor a readable template file", choice);
    size_t cl = strlen(choice);
    if (cl >= 5 && !strcmp(choice + cl - 5, ".json")) { /* a tokenizer_config.json's template */
        cJSON *other;
        const char *tpl;
        whale_code rc = whale_read_json_object(choice, &other, err);
        if (rc) return rc;
        rc = config_template(other, choice, &tpl, err);
        if (!rc && !tpl) rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: no \"chat_template\"", choice);
        if (!rc) rc = compile(t, tpl, strlen(tpl), choice, err);
        cJSON_Delete(other);
        return rc;
    }
    char *buf;
    size_t n;
    whale_code rc = whale_read_file(choice, &buf, &n, err);
    if (rc) return rc;
    rc = compile(t, buf, n, choice, err);
    free(buf);
    return rc;
}

whale_code whale_chat_template_load(const char *model_dir, const char *choice, whale_chat_template **out,
                                    whale_err *err) {
    if (!model_dir || !out) return whale_errf(err, WHALE_ERR_ARG, "whale_chat_template_load: NULL argument");
    char dir[4096], cfg_path[4200];
    whale_code rc = folder_of(model_dir, dir, sizeof dir, err);
    if (rc) return rc;
    cJSON *cfg = NULL;
    struct stat st;
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    if (stat(cfg_path, &st) == 0 && (rc = whale_read_json_object(cfg_path, &cfg, err))) return rc;
    whale_chat_template *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(cfg);
        return whale_errf(err, WHALE_ERR_NOMEM, "chat template: out of memory");
    }
    t->specials = special_tokens(cfg);
    rc = t->specials ? load_choice(t, dir, choice, cfg, cfg_path, err)
                     : whale_errf(err, WHALE_ERR_NOMEM, "chat template: out of memory");
    cJSON_Delete(cfg);
    if (rc) {
        whale_chat_template_free(t);
        return rc;
    }
    *out = t;
    return WHALE_OK;
}

void whale_chat_template_free(whale_chat_template *t) {
    if (!t) return;
    whale_jinja_free(t->jinja);
    free(t->source);
    cJSON_Delete(t->specials);
    free(t);
}

const char *whale_chat_template_name(const whale_chat_template *t) { return t ? t->name : "(none)"; }
const char *whale_chat_template_notice(const whale_chat_template *t) { return t && t->notice[0] ? t->notice : NULL; }
const char *whale_chat_template_source(const whale_chat_template *t) { return t && !t->native ? t->source : NULL; }

/* ------------------------------------------------------------ rendering */

/* The variables apply_chat_template gives the template. References only:
 * free with cJSON_Delete (the referenced items stay). */
static cJSON *template_vars(const whale_chat_template *t, const cJSON *messages, const cJSON *tools,
                            const cJSON *kwargs, int agp) {
    cJSON *v = cJSON_CreateObject();
    if (!v) return NULL;
    int ok = 1;
    for (const cJSON *e = t->specials ? t->specials->child : NULL; e && ok; e = e->next)
        ok = cJSON_AddItemReferenceToObject(v, e->string, (cJSON *)e);
    if (ok) ok = cJSON_AddItemReferenceToObject(v, "messages", (cJSON *)messages);
    if (ok && tools) ok = cJSON_AddItemReferenceToObject(v, "tools", (cJSON *)tools);
    if (ok) ok = cJSON_AddBoolToObject(v, "add_generation_prompt", agp) != NULL;
    for (const cJSON *e = kwargs ? kwargs->child : NULL; e && ok; e = e->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(v, e->string); /* kwargs win, as in transformers */
        ok = cJSON_AddItemReferenceToObject(v, e->string, (cJSON *)e);
    }
    if (!ok) {
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

/* steps NULL: a render's own step limit; else a budget shared with other
 * renders (whale_jinja_render_steps). */
static whale_code render_jinja(const whale_chat_template *t, const cJSON *messages, const cJSON *tools,
                               const cJSON *kwargs, int agp, long *steps, char **text, size_t *len, whale_err *err) {
    cJSON *vars = template_vars(t, messages, tools, kwargs, agp);
    if (!vars) return whale_errf(err, WHALE_ERR_NOMEM, "chat template: out of memory");
    whale_code rc = steps ? whale_jinja_render_steps(t->jinja, vars, steps, text, len, err)
                          : whale_jinja_render(t->jinja, vars, text, len, err);
    cJSON_Delete(vars);
    if (rc) {
        char msg[WHALE_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
        whale_errf(err, rc, "%s: %s", t->name, msg);
    }
    return rc;
}

static int non_empty(const cJSON *v) {
    return v && !cJSON_IsNull(v) && (!(cJSON_IsArray(v) || cJSON_IsObject(v)) || v->child);
}

/* The messages (and no tools) of a native format, as whale_chat_message. */
static whale_code native_messages(const whale_chat_template *t, const cJSON *messages, const cJSON *tools,
                                  whale_chat_message **m, int *n, whale_err *err) {
    if (non_empty(tools))
        return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                          "tools: the native %s format has no tools; use the model's own template", t->name);
    char *json = cJSON_PrintUnformatted(messages);
    if (!json) return whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
    whale_code rc = whale_chat_parse_json(json, strlen(json), m, n, err);
    free(json);
    return rc;
}

static whale_code render_native(const whale_chat_template *t, const cJSON *messages, const cJSON *tools, int agp,
                                char **text, size_t *len, whale_err *err) {
    whale_chat_message *m;
    int n;
    whale_code rc = native_messages(t, messages, tools, &m, &n, err);
    if (rc) return rc;
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(t->specials, "bos_token");
    rc = whale_chat_render(t->fmt, m, n, agp, cJSON_IsString(bos) ? bos->valuestring : NULL, text, len, NULL, NULL, err);
    free(m);
    return rc;
}

whale_code whale_chat_template_apply(const whale_chat_template *t, const cJSON *messages, const cJSON *tools,
                                     const cJSON *kwargs, int add_generation_prompt, char **text, size_t *len,
                                     whale_err *err) {
    if (!t || !messages || !text || !len) return whale_errf(err, WHALE_ERR_ARG, "whale_chat_template_apply: NULL argument");
    if (!cJSON_IsArray(messages)) return whale_errf(err, WHALE_ERR_FORMAT, "messages: expected a JSON array of messages");
    if (tools && !cJSON_IsArray(tools) && !cJSON_IsNull(tools))
        return whale_errf(err, WHALE_ERR_FORMAT, "tools: expected a JSON array");
    if (kwargs && !cJSON_IsObject(kwargs)) return whale_errf(err, WHALE_ERR_FORMAT, "kwargs: expected a JSON object");
    if (t->native) return render_native(t, messages, tools, add_generation_prompt, text, len, err);
    return render_jinja(t, messages, tools, kwargs, add_generation_prompt, NULL, text, len, err);
}

/* ------------------------------------------------------------ the loss mask */

/* The first k messages as a JSON array of references (free with cJSON_Delete). */
static cJSON *first_messages(const cJSON *all, int k) {
    cJSON *a = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *e = all ? all->child : NULL; a && e && i < k; e = e->next, i++)
        if (!cJSON_AddItemReferenceToArray(a, (cJSON *)e)) {
            cJSON_Delete(a);
            return NULL;
        }
    return a;
}

static cJSON *messages_json(const whale_chat_message *m, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(a, o) || !cJSON_AddStringToObject(o, "role", m[i].role ? m[i].role : "") ||
            !cJSON_AddStringToObject(o, "content", m[i].content ? m[i].content : "")) {
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* What every render of one conversation shares. Each reply's span takes
 * three renders of the conversation up to it, so their cost grows with the
 * square of the number of replies: together they get WHALE_MAX_MASK_STEPS
 * steps (the template's loop iterations and calls, and the messages each
 * render is given) and WHALE_MAX_MASK_BYTES of text. */
typedef struct {
    const whale_chat_template *t;
    const cJSON *all, *tools, *kwargs;
    long steps;   /* left for the renders of the spans */
    size_t bytes; /* they rendered so far */
} conv;

static whale_code mask_too_costly(conv *cv, whale_err *err) {
    return whale_errf(err, WHALE_ERR_RANGE, "%s: placing the loss mask of every reply in this conversation takes more "
                      "than %ld template steps or %zu bytes of text in all (each reply renders the conversation up to "
                      "it again); split it into shorter records",
                      cv->t->name, WHALE_MAX_MASK_STEPS, WHALE_MAX_MASK_BYTES);
}

/* Render the first k messages (k < 0: all, with the render's own limits;
 * else from the spans' budget). */
static whale_code render_first(conv *cv, int k, int agp, char **text, size_t *len, whale_err *err) {
    if (k >= 0 && (cv->steps -= k) < 0) return mask_too_costly(cv, err);
    cJSON *part = first_messages(cv->all, k < 0 ? cJSON_GetArraySize(cv->all) : k);
    if (!part) return whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
    whale_code rc = render_jinja(cv->t, part, cv->tools, cv->kwargs, agp, k < 0 ? NULL : &cv->steps, text, len, err);
    cJSON_Delete(part);
    if (k < 0) return rc;
    if (rc == WHALE_ERR_RANGE && cv->steps < 0) return mask_too_costly(cv, err);
    if (!rc && (cv->bytes += *len) > WHALE_MAX_MASK_BYTES) {
        free(*text);
        *text = NULL;
        return mask_too_costly(cv, err);
    }
    return rc;
}

static int is_prefix(const char *p, size_t pn, const char *s, size_t sn) { return pn <= sn && !memcmp(p, s, pn); }

static whale_code spans_refused(const whale_chat_template *t, int i, const char *why, whale_err *err) {
    return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: %s, so the loss mask of messages[%d] cannot be placed; use one "
                      "reply per record or another --chat-template", t->name, why, i);
}

/* The end-of-turn tokens of the families (they also stop generation). */
static const char *const end_tokens[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
                                         "<｜end▁of▁sentence｜>", "<|end|>", "<|return|>", "<|call|>", NULL};

/* The first end-of-turn token in s[from, n) that ends after `after`:
 * the offset just past it, or 0 when there is none. */
static size_t end_token_after(const char *s, size_t n, size_t from, size_t after) {
    size_t best = 0;
    for (int k = 0; end_tokens[k]; k++) {
        size_t tl = strlen(end_tokens[k]);
        for (size_t p = from; p + tl <= n; p++)
            if (p + tl > after && !memcmp(s + p, end_tokens[k], tl)) {
                if (!best || p + tl < best) best = p + tl;
                break;
            }
    }
    return best;
}

/* One reply as the template renders it when it is the newest message:
 * before = messages[:i] with the generation prompt, upto = messages[:i+1]
 * without; the reply is upto[start, end). */
typedef struct {
    char *before, *upto;
    size_t bn, un, start, end;
} reply;

/* A template that ignores add_generation_prompt (the short Llama 3 one
 * always ends with the assistant header) puts the same tail after every
 * conversation: what before and upto end with past their last end-of-turn
 * token. Its length, or (size_t)-1 when there is no such token. */
static size_t constant_tail(const reply *r) {
    size_t c = 0, room = r->un > r->bn ? r->un - r->bn : 0; /* the shared tail lies in upto's new text */
    while (c < r->bn && c < room && r->before[r->bn - 1 - c] == r->upto[r->un - 1 - c]) c++;
    size_t from = r->un - c, cut = 0, at;
    while ((at = end_token_after(r->upto, r->un, from, from)) != 0) cut = at, from = at;
    return cut ? r->un - cut : (size_t)-1;
}

static void reply_free(reply *r) {
    free(r->before);
    free(r->upto);
    r->before = r->upto = NULL;
}

static whale_code render_reply(conv *cv, int i, reply *r, whale_err *err) {
    char *bare = NULL;
    size_t rn = 0, tail = 0;
    *r = (reply){0};
    whale_code rc = render_first(cv, i, 1, &r->before, &r->bn, err);
    if (!rc) rc = render_first(cv, i, 0, &bare, &rn, err);
    if (!rc) rc = render_first(cv, i + 1, 0, &r->upto, &r->un, err);
    if (!rc && rn == r->bn && !memcmp(r->before, bare, rn) && (tail = constant_tail(r)) == (size_t)-1)
        rc = spans_refused(cv->t, i, "the template ignores add_generation_prompt (where a reply starts and ends "
                           "cannot be told)", err);
    if (!rc && (!is_prefix(r->before, r->bn, r->upto, r->un) || r->un - tail <= r->bn))
        rc = spans_refused(cv->t, i, "the conversation before that reply is not where its rendering starts", err);
    free(bare);
    if (rc) {
        reply_free(r);
        return rc;
    }
    size_t end = r->un - tail;
    while (end > r->bn + 1 && strchr(" \t\r\n", r->upto[end - 1])) end--; /* the template's separator */
    r->start = r->bn, r->end = end;
    return WHALE_OK;
}

/* The length of the end-of-turn token s[0, n) ends with (0: none). */
static size_t ends_with_token(const char *s, size_t n) {
    for (int k = 0; end_tokens[k]; k++) {
        size_t tl = strlen(end_tokens[k]);
        if (tl <= n && !memcmp(s + n - tl, end_tokens[k], tl)) return tl;
    }
    return 0;
}

/* Where, in the conversation before reply `next` (next->before), the
 * history up to the previous reply p ends. When the template renders p the
 * same there, that is p's end. A template that rewrites earlier replies
 * once later ones follow (Qwen3 and gpt-oss drop their thinking) renders p
 * differently from where the two renders part, up to p's first end-of-turn
 * token — and what it keeps of p must be the end of p (its text less the
 * thinking), else an end-of-turn token typed inside the reply was taken
 * for its end. 0: not found. */
static size_t history_end(const reply *p, const reply *next) {
    if (is_prefix(p->upto, p->end, next->before, next->bn)) return p->end;
    size_t l = 0;
    while (l < p->un && l < next->bn && p->upto[l] == next->before[l]) l++;
    if (l < p->start) return 0; /* something before the reply changed */
    size_t b = end_token_after(next->before, next->bn, l > p->start + 16 ? l - 16 : p->start, l);
    size_t bt = b ? ends_with_token(next->before, b) : 0, pt = ends_with_token(p->upto, p->end);
    if (!bt || !pt || b - bt < p->start) return 0;
    size_t kept = b - bt - p->start, whole = p->end - pt - p->start; /* the reply less its end token */
    if (kept > whole || memcmp(next->before + p->start, p->upto + p->end - pt - kept, kept)) return 0;
    return b;
}

static int is_assistant(const cJSON *m) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
}

/* The training text of a conversation that ends with a reply: every reply
 * as the template renders it when it is the newest message (its thinking
 * kept, the end token the model emits), joined by the text the template
 * puts between them — ms-swift's rule for thinking templates in training.
 * For a template that renders a conversation's prefixes as prefixes of the
 * whole (most do) this is the whole rendering, byte for byte. */
static whale_code composed_spans(conv *cv, whale_sbuf *text, whale_chat_span *sp, int *n_sp, whale_err *err) {
    reply prev = {0}, cur;
    whale_code rc = WHALE_OK;
    int i = 0, k = 0;
    for (const cJSON *m = cv->all->child; !rc && m; m = m->next, i++) {
        if (!is_assistant(m)) continue;
        if ((rc = render_reply(cv, i, &cur, err))) break;
        size_t from = 0;
        if (k && !(from = history_end(&prev, &cur)))
            rc = spans_refused(cv->t, i, "the template renders the conversation before that reply in a way whale "
                               "cannot align with the earlier replies", err);
        if (!rc) {
            whale_sb_put(text, cur.before + from, cur.bn - from);
            whale_sb_put(text, cur.upto + cur.start, cur.end - cur.start);
            if (text->oom) rc = whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
        }
        if (!rc) sp[k++] = (whale_chat_span){text->len - (cur.end - cur.start), text->len, i};
        reply_free(&prev);
        prev = cur;
    }
    if (!rc) whale_sb_put(text, prev.upto + prev.end, prev.un - prev.end);
    if (!rc && text->oom) rc = whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
    reply_free(&prev);
    *n_sp = k;
    return rc;
}

/* The span of assistant message i in the whole rendering (whole, wn), for
 * a conversation that goes on after its last reply or asks for the
 * generation prompt: the template must render each prefix as a prefix of
 * the whole. */
static whale_code assistant_span(conv *cv, int i, const char *whole, size_t wn, whale_chat_span *sp,
                                 whale_err *err) {
    reply r;
    whale_code rc = render_reply(cv, i, &r, err);
    if (!rc && !is_prefix(r.upto, r.end, whole, wn))
        rc = spans_refused(cv->t, i, "the template renders the conversation up to that reply differently once later "
                           "messages follow", err);
    if (!rc) *sp = (whale_chat_span){r.start, r.end, i};
    reply_free(&r);
    return rc;
}

/* The rendering and the replies' spans. A conversation that ends with a
 * reply, without the generation prompt, is a training sample: its text is
 * composed_spans' (the whole rendering, unless the template rewrites
 * earlier replies). */
static whale_code jinja_spans(conv *cv, int agp, char **text, size_t *len, whale_chat_span **spans,
                              int *n_spans, whale_err *err) {
    const cJSON *last = cv->all->child;
    while (last && last->next) last = last->next;
    int sample = !agp && is_assistant(last);
    whale_code rc = WHALE_OK;
    *text = NULL;
    if (!sample) rc = render_first(cv, -1, agp, text, len, err);
    if (rc || (!spans && !sample)) return rc;
    int n = cJSON_GetArraySize(cv->all), k = 0, i = 0;
    whale_chat_span *sp = malloc((size_t)(n > 0 ? n : 1) * sizeof *sp);
    if (!sp) rc = whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
    if (!rc && sample) {
        whale_sbuf b = {0};
        rc = composed_spans(cv, &b, sp, &k, err);
        *text = b.p;
        *len = b.len;
    } else {
        for (const cJSON *m = cv->all->child; !rc && m; m = m->next, i++)
            if (is_assistant(m)) rc = assistant_span(cv, i, *text, *len, &sp[k++], err);
    }
    if (rc || !spans) {
        free(sp);
        if (rc) free(*text), *text = NULL;
        return rc;
    }
    *spans = sp;
    *n_spans = k;
    return WHALE_OK;
}

whale_code whale_chat_template_spans(const whale_chat_template *t, const whale_chat_message *msgs, int n,
                                     int add_generation_prompt, const char *bos_token, char **text, size_t *len,
                                     whale_chat_span **spans, int *n_spans, whale_err *err) {
    if (!t || !text || !len || (spans && !n_spans))
        return whale_errf(err, WHALE_ERR_ARG, "whale_chat_template_spans: NULL argument");
    if (t->native) {
        const cJSON *bos = cJSON_GetObjectItemCaseSensitive(t->specials, "bos_token");
        if (!bos_token && cJSON_IsString(bos)) bos_token = bos->valuestring;
        return whale_chat_render(t->fmt, msgs, n, add_generation_prompt, bos_token, text, len, spans, n_spans, err);
    }
    if (!msgs || n <= 0) return whale_errf(err, WHALE_ERR_ARG, "chat: empty conversation (no messages)");
    cJSON *all = messages_json(msgs, n);
    if (!all) return whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
    conv cv = {t, all, NULL, NULL, WHALE_MAX_MASK_STEPS, 0};
    whale_code rc = jinja_spans(&cv, add_generation_prompt, text, len, spans, n_spans, err);
    cJSON_Delete(all);
    return rc;
}

whale_code whale_chat_template_spans_json(const whale_chat_template *t, const cJSON *messages, const cJSON *tools,
                                          int add_generation_prompt, const char *bos_token, char **text, size_t *len,
                                          whale_chat_span **spans, int *n_spans, whale_err *err) {
    if (!t || !messages || !text || !len || (spans && !n_spans))
        return whale_errf(err, WHALE_ERR_ARG, "whale_chat_template_spans_json: NULL argument");
    if (!cJSON_IsArray(messages) || !messages->child)
        return whale_errf(err, WHALE_ERR_FORMAT, "messages: expected a non-empty JSON array of messages");
    if (!t->native) {
        conv cv = {t, messages, tools && !cJSON_IsNull(tools) ? tools : NULL, NULL, WHALE_MAX_MASK_STEPS, 0};
        return jinja_spans(&cv, add_generation_prompt, text, len, spans, n_spans, err);
    }
    whale_chat_message *m;
    int n;
    whale_code rc = native_messages(t, messages, tools, &m, &n, err);
    if (rc) return rc;
    rc = whale_chat_template_spans(t, m, n, add_generation_prompt, bos_token, text, len, spans, n_spans, err);
    free(m);
    return rc;
}

whale_code whale_chat_template_encode(whale_tokenizer *tok, const whale_chat_template *t,
                                      const whale_chat_message *msgs, int n, int add_generation_prompt,
                                      int32_t **ids, uint8_t **loss_mask, int *n_ids, whale_err *err) {
    if (!tok || !t || !ids || !n_ids) return whale_errf(err, WHALE_ERR_ARG, "whale_chat_template_encode: NULL argument");
    if (t->native) return whale_chat_encode(tok, t->fmt, msgs, n, add_generation_prompt, ids, loss_mask, n_ids, err);
    char *text = NULL;
    size_t len = 0;
    whale_chat_span *sp = NULL;
    int n_sp = 0;
    whale_code rc = whale_chat_template_spans(t, msgs, n, add_generation_prompt, NULL, &text, &len,
                                              loss_mask ? &sp : NULL, &n_sp, err);
    if (!rc) rc = whale_chat_encode_spans(tok, text, len, sp, n_sp, ids, loss_mask, n_ids, err);
    free(text);
    free(sp);
    return rc;
}

/* ------------------------------------------------------------ stopping */

int whale_chat_template_stop_ids(const whale_tokenizer *tok, const whale_chat_template *t, int32_t *ids, int cap) {
    if (!t) return 0;
    if (t->native) return whale_chat_stop_ids(tok, t->fmt, ids, cap);
    const char *cand[16];
    int nc = 0;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(t->specials, "eos_token");
    if (cJSON_IsString(eos)) cand[nc++] = eos->valuestring;
    for (int k = 0; end_tokens[k]; k++)
        if (strstr(t->source, end_tokens[k])) {
            cand[nc++] = end_tokens[k];
            if (!strcmp(end_tokens[k], "<|im_end|>")) cand[nc++] = "<|endoftext|>"; /* Qwen's generation_config stops at both */
        }
    int count = 0;
    for (int k = 0; k < nc; k++) {
        int32_t id = whale_tokenizer_token_to_id(tok, cand[k]);
        int dup = 0;
        for (int j = 0; j < count && j < cap; j++) dup |= ids[j] == id;
        if (id < 0 || dup) continue;
        if (count < cap) ids[count] = id;
        count++;
    }
    return count;
}
