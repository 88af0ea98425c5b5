/* Native chat templates: DeepSeek-V3, Qwen2.5 ChatML and the raw fallback,
 * rendered exactly as their Jinja templates render plain conversations, with
 * the assistant spans an SFT loss is computed on (see whale_chat.h). */
#include "core/sbuf.h"
#include "whale_chat.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DS_BOS "<｜begin▁of▁sentence｜>"
#define DS_EOS "<｜end▁of▁sentence｜>"
#define DS_USER "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"
#define IM_START "<|im_start|>"
#define IM_END "<|im_end|>"
#define QWEN25_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

/* ------------------------------------------------------------ formats */

static const char *const format_names[] = {"deepseek", "chatml", "raw"};

static int format_ok(whale_chat_format fmt) {
    return fmt == WHALE_CHAT_DEEPSEEK || fmt == WHALE_CHAT_CHATML || fmt == WHALE_CHAT_RAW;
}

const char *whale_chat_format_name(whale_chat_format fmt) {
    return format_ok(fmt) ? format_names[fmt] : "unknown";
}

whale_code whale_chat_format_from_name(const char *name, whale_chat_format *fmt, whale_err *err) {
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, format_names[i])) {
            *fmt = (whale_chat_format)i;
            return WHALE_OK;
        }
    return whale_errf(err, WHALE_ERR_ARG, "--chat-template: unknown format \"%.64s\" (expected deepseek, chatml or raw)",
                      name ? name : "(null)");
}

static const char *const stops_deepseek[] = {DS_EOS, NULL};
/* Qwen2.5's generation_config.json stops at <|im_end|> and <|endoftext|> */
static const char *const stops_chatml[] = {IM_END, "<|endoftext|>", NULL};
static const char *const stops_none[] = {NULL};

const char *const *whale_chat_stop_strings(whale_chat_format fmt) {
    switch (fmt) {
    case WHALE_CHAT_DEEPSEEK: return stops_deepseek;
    case WHALE_CHAT_CHATML: return stops_chatml;
    default: return stops_none;
    }
}

int whale_chat_stop_ids(const whale_tokenizer *tok, whale_chat_format fmt, int32_t *ids, int cap) {
    int count = 0;
    for (const char *const *s = whale_chat_stop_strings(fmt); *s; s++) {
        int32_t id = whale_tokenizer_token_to_id(tok, *s);
        if (id < 0) continue;
        if (count < cap) ids[count] = id;
        count++;
    }
    return count;
}

/* ------------------------------------------------------------ messages */

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } msg_role;

/* Check every message before rendering anything, so that what is refused is
 * refused whatever comes after it. */
static whale_code check_messages(const whale_chat_message *msgs, int n, msg_role *roles, whale_err *err) {
    if (!msgs || n <= 0) return whale_errf(err, WHALE_ERR_ARG, "chat: empty conversation (no messages)");
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r) return whale_errf(err, WHALE_ERR_ARG, "messages[%d]: role is NULL", i);
        if (!strcmp(r, "system")) roles[i] = ROLE_SYSTEM;
        else if (!strcmp(r, "user")) roles[i] = ROLE_USER;
        else if (!strcmp(r, "assistant")) roles[i] = ROLE_ASSISTANT;
        else if (!strcmp(r, "tool") || !strcmp(r, "ipython") || !strcmp(r, "function"))
            return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                              "messages[%d]: role \"%s\": tool messages are not supported by the native chat "
                              "templates (system, user and assistant only)", i, r);
        else
            return whale_errf(err, WHALE_ERR_ARG,
                              "messages[%d]: unknown role \"%.64s\" (expected system, user or assistant)", i, r);
        if (!msgs[i].content) {
            /* DeepSeek-V3's template renders an assistant turn without
             * content as tool calls */
            if (roles[i] == ROLE_ASSISTANT)
                return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                                  "messages[%d]: assistant content is NULL, which the template renders as tool "
                                  "calls; tool calls are not supported", i);
            return whale_errf(err, WHALE_ERR_ARG, "messages[%d]: %s content is NULL", i, r);
        }
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ rendering */

typedef struct {
    whale_chat_span *spans; /* room for one per message */
    int n;
} span_list;

static void add_span(span_list *sl, size_t start, size_t end, int message) {
    sl->spans[sl->n++] = (whale_chat_span){start, end, message};
}

/* {{bos_token}}{{ns.system_prompt}} — every system message, joined by a blank
 * line, comes first wherever it stands — then the turns back to back. */
static void render_deepseek(whale_sbuf *b, const whale_chat_message *m, const msg_role *roles, int n, int agp,
                            const char *bos, span_list *sl) {
    whale_sb_puts(b, bos);
    int first_system = 1;
    for (int i = 0; i < n; i++)
        if (roles[i] == ROLE_SYSTEM) {
            if (!first_system) whale_sb_puts(b, "\n\n");
            whale_sb_puts(b, m[i].content);
            first_system = 0;
        }
    for (int i = 0; i < n; i++) {
        if (roles[i] == ROLE_USER) {
            whale_sb_puts(b, DS_USER);
            whale_sb_puts(b, m[i].content);
        } else if (roles[i] == ROLE_ASSISTANT) {
            whale_sb_puts(b, DS_ASSISTANT);
            size_t start = b->len;
            whale_sb_puts(b, m[i].content);
            whale_sb_puts(b, DS_EOS);
            add_span(sl, start, b->len, i);
        }
    }
    if (agp) whale_sb_puts(b, DS_ASSISTANT);
}

/* Qwen2.5: the default system turn unless the first message is a system
 * message; a later system message is an ordinary turn. */
static void render_chatml(whale_sbuf *b, const whale_chat_message *m, const msg_role *roles, int n, int agp,
                          span_list *sl) {
    if (roles[0] != ROLE_SYSTEM) whale_sb_puts(b, IM_START "system\n" QWEN25_SYSTEM IM_END "\n");
    for (int i = 0; i < n; i++) {
        whale_sb_puts(b, IM_START);
        whale_sb_puts(b, m[i].role);
        whale_sb_puts(b, "\n");
        size_t start = b->len;
        whale_sb_puts(b, m[i].content);
        whale_sb_puts(b, IM_END);
        if (roles[i] == ROLE_ASSISTANT) add_span(sl, start, b->len, i);
        whale_sb_puts(b, "\n");
    }
    if (agp) whale_sb_puts(b, IM_START "assistant\n");
}

/* The original chat.py without a template:
 * "\n".join(f"{role}: {content}") + "\nassistant:". No end-of-turn token,
 * so a span is the content alone. */
static void render_raw(whale_sbuf *b, const whale_chat_message *m, const msg_role *roles, int n, int agp,
                       span_list *sl) {
    for (int i = 0; i < n; i++) {
        if (i) whale_sb_puts(b, "\n");
        whale_sb_puts(b, m[i].role);
        whale_sb_puts(b, ": ");
        size_t start = b->len;
        whale_sb_puts(b, m[i].content);
        if (roles[i] == ROLE_ASSISTANT) add_span(sl, start, b->len, i);
    }
    if (agp) whale_sb_puts(b, "\nassistant:");
}

/* Render into b with every assistant span in sl (sl->spans has n entries). */
static whale_code render(whale_chat_format fmt, const whale_chat_message *msgs, int n, int agp,
                         const char *bos, whale_sbuf *b, span_list *sl, whale_err *err) {
    if (!format_ok(fmt)) return whale_errf(err, WHALE_ERR_ARG, "chat: unknown format %d", (int)fmt);
    msg_role *roles = malloc((size_t)(n > 0 ? n : 1) * sizeof *roles);
    if (!roles) return whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
    whale_code rc = check_messages(msgs, n, roles, err);
    if (rc) {
        free(roles);
        return rc;
    }
    /* one allocation in the usual case: contents plus the markup around them */
    size_t want = 256 + (bos ? strlen(bos) : 0);
    for (int i = 0; i < n; i++) want += strlen(msgs[i].content) + 64;
    b->p = malloc(want);
    b->cap = b->p ? want : 0;
    b->len = 0;
    b->oom = !b->p;
    if (b->p) b->p[0] = 0;
    sl->n = 0;
    switch (fmt) {
    case WHALE_CHAT_DEEPSEEK: render_deepseek(b, msgs, roles, n, agp, bos ? bos : DS_BOS, sl); break;
    case WHALE_CHAT_CHATML: render_chatml(b, msgs, roles, n, agp, sl); break;
    case WHALE_CHAT_RAW: render_raw(b, msgs, roles, n, agp, sl); break;
    }
    free(roles);
    if (b->oom) {
        free(b->p);
        b->p = NULL;
        return whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory rendering %d messages", n);
    }
    return WHALE_OK;
}

whale_code whale_chat_render(whale_chat_format fmt, const whale_chat_message *msgs, int n,
                             int add_generation_prompt, const char *bos_token, char **text,
                             size_t *len, whale_chat_span **spans, int *n_spans, whale_err *err) {
    if (!text || !len || (spans && !n_spans))
        return whale_errf(err, WHALE_ERR_ARG, "whale_chat_render: NULL output pointer");
    span_list sl = {malloc((size_t)(n > 0 ? n : 1) * sizeof(whale_chat_span)), 0};
    if (!sl.spans) return whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
    whale_sbuf b = {0};
    whale_code rc = render(fmt, msgs, n, add_generation_prompt, bos_token, &b, &sl, err);
    if (rc) {
        free(sl.spans);
        return rc;
    }
    *text = b.p;
    *len = b.len;
    if (n_spans) *n_spans = sl.n;
    if (spans && sl.n > 0) {
        *spans = sl.spans;
    } else {
        if (spans) *spans = NULL;
        free(sl.spans);
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ tokenizing */

/* Append the bytes that ids decode to (added tokens as their content) and,
 * if ends is not NULL, the running end offset of each token. */
static int token_stream(const whale_tokenizer *tok, const int32_t *ids, int n, whale_sbuf *out, size_t *ends) {
    for (int i = 0; i < n; i++) {
        size_t tl;
        const char *tb = whale_tokenizer_token_bytes(tok, ids[i], &tl);
        if (tb) whale_sb_put(out, tb, tl);
        if (ends) ends[i] = out->len;
    }
    return !out->oom;
}

/* Spans in the coordinates of the tokens' bytes. Those equal the rendered
 * text unless the tokenizer's normalizer (Qwen's NFC) or the replacement of
 * invalid UTF-8 changed it; then each piece between span boundaries is
 * tokenized on its own to learn how long it became, and the pieces must add
 * up to exactly the bytes of the one-go tokens. */
static whale_code normalized_spans(whale_tokenizer *tok, const char *text, size_t len,
                                   const whale_sbuf *whole, whale_chat_span *sp, int n_sp, whale_err *err) {
    if (whole->len == len && (len == 0 || !memcmp(whole->p, text, len))) return WHALE_OK;
    whale_sbuf pieces = {0};
    size_t cut = 0; /* rendered offset tokenized so far */
    whale_code rc = WHALE_OK;
    for (int k = 0; k <= 2 * n_sp && !rc; k++) {
        size_t *edge = k < 2 * n_sp ? (k & 1 ? &sp[k / 2].end : &sp[k / 2].start) : NULL;
        size_t to = edge ? *edge : len;
        if (to > cut) {
            int32_t *ids;
            int n;
            rc = whale_tokenizer_encode(tok, text + cut, to - cut, 0, &ids, &n, err);
            if (rc) break;
            size_t before = pieces.len;
            if (!token_stream(tok, ids, n, &pieces, NULL)) rc = whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
            free(ids);
            if (!rc && pieces.len > before &&
                (pieces.len > whole->len || memcmp(pieces.p + before, whole->p + before, pieces.len - before)))
                rc = whale_errf(err, WHALE_ERR_UNSUPPORTED,
                                "chat: the tokenizer normalizes the conversation differently as a whole than turn "
                                "by turn (bytes %zu..%zu of the rendered text); cannot place the loss mask",
                                cut, to);
            cut = to;
        }
        if (edge) *edge = pieces.len;
    }
    if (!rc && pieces.len != whole->len)
        rc = whale_errf(err, WHALE_ERR_UNSUPPORTED,
                        "chat: the tokenizer normalizes the conversation differently as a whole than turn by "
                        "turn; cannot place the loss mask");
    free(pieces.p);
    return rc;
}

whale_code whale_chat_encode_spans(whale_tokenizer *tok, const char *text, size_t len, whale_chat_span *sp,
                                  int n_sp, int32_t **ids, uint8_t **loss_mask, int *n_ids, whale_err *err) {
    int32_t *out = NULL;
    int n_out = 0;
    whale_code rc = whale_tokenizer_encode(tok, text, len, 0, &out, &n_out, err);
    uint8_t *mask = NULL;
    size_t *ends = NULL;
    whale_sbuf whole = {0};
    if (!rc && loss_mask) {
        mask = calloc((size_t)n_out + 1, 1);
        ends = malloc(((size_t)n_out + 1) * sizeof *ends);
        if (!mask || !ends || !token_stream(tok, out, n_out, &whole, ends))
            rc = whale_errf(err, WHALE_ERR_NOMEM, "chat: out of memory");
        if (!rc) rc = normalized_spans(tok, text, len, &whole, sp, n_sp, err);
        /* a token is in the mask when its bytes overlap a span's (empty
         * spans, raw turns without content, mask nothing); spans and tokens
         * are both in order, so one sweep does it */
        int s = 0;
        for (int i = 0; !rc && i < n_out && s < n_sp; i++) {
            size_t a = i ? ends[i - 1] : 0, e = ends[i];
            while (s < n_sp && (sp[s].end <= a || sp[s].start == sp[s].end)) s++;
            if (s < n_sp && e > sp[s].start) mask[i] = 1;
        }
    }
    free(ends);
    free(whole.p);
    if (rc) {
        free(mask);
        free(out);
        return rc;
    }
    *ids = out;
    *n_ids = n_out;
    if (loss_mask) *loss_mask = mask;
    return WHALE_OK;
}

whale_code whale_chat_encode(whale_tokenizer *tok, whale_chat_format fmt,
                             const whale_chat_message *msgs, int n, int add_generation_prompt,
                             int32_t **ids, uint8_t **loss_mask, int *n_ids, whale_err *err) {
    if (!tok || !ids || !n_ids) return whale_errf(err, WHALE_ERR_ARG, "whale_chat_encode: NULL argument");
    const char *bos = whale_tokenizer_role_token(tok, WHALE_TOKEN_BOS);
    char *text = NULL;
    size_t len = 0;
    whale_chat_span *sp = NULL;
    int n_sp = 0;
    whale_code rc = whale_chat_render(fmt, msgs, n, add_generation_prompt, bos, &text, &len, &sp, &n_sp, err);
    if (rc) return rc;
    rc = whale_chat_encode_spans(tok, text, len, sp, n_sp, ids, loss_mask, n_ids, err);
    free(text);
    free(sp);
    return rc;
}

/* ------------------------------------------------------------ detection */

static int has(const char *s, size_t n, const char *marker) { return memmem(s, n, marker, strlen(marker)) != NULL; }

/* Markers rather than exact bytes, so that a reformatted copy of a template
 * still counts, while the variants that render differently do not:
 * DeepSeek-R1 / V3.1 / Qwen3 templates have thinking parts ("<think>"),
 * other ChatML templates another default system message. Returns NULL and
 * sets *fmt, or why the template is not recognised. */
static const char *classify(const char *t, size_t n, whale_chat_format *fmt) {
    int ds = has(t, n, DS_USER) && has(t, n, DS_ASSISTANT) && has(t, n, DS_EOS) && has(t, n, "bos_token") &&
             has(t, n, "system_prompt");
    int qwen = has(t, n, IM_START) && has(t, n, IM_END) && has(t, n, QWEN25_SYSTEM);
    if (has(t, n, "think>"))
        return "it has thinking parts (<think>), as DeepSeek-R1, DeepSeek-V3.1 and Qwen3 templates do";
    if (ds && qwen) return "it has both DeepSeek and ChatML markers";
    if (ds) {
        *fmt = WHALE_CHAT_DEEPSEEK;
        return NULL;
    }
    if (qwen) {
        *fmt = WHALE_CHAT_CHATML;
        return NULL;
    }
    if (has(t, n, IM_START)) return "a ChatML template without Qwen2.5's default system message";
    if (has(t, n, DS_USER)) return "a DeepSeek-style template that is not DeepSeek-V3's";
    return "neither DeepSeek-V3's nor Qwen2.5's ChatML";
}

static whale_code unrecognised(const char *path, const char *why, whale_err *err) {
    return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                      "%s: chat template not recognised (%s); pass --chat-template deepseek|chatml|raw", path, why);
}

whale_code whale_chat_detect(const char *model_dir, whale_chat_format *fmt, whale_err *err) {
    if (!model_dir || !fmt) return whale_errf(err, WHALE_ERR_ARG, "whale_chat_detect: NULL argument");
    /* a path to a file inside the folder (tokenizer.json) names the folder */
    char dir[4096];
    struct stat st;
    if (strlen(model_dir) >= sizeof dir) return whale_errf(err, WHALE_ERR_ARG, "%.64s...: path too long", model_dir);
    snprintf(dir, sizeof dir, "%s", model_dir);
    if (stat(dir, &st) != 0)
        return whale_errf(err, WHALE_ERR_IO, "%s: cannot open: %s", model_dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    char path[4200];
    char *buf;
    size_t n;
    whale_code rc;

    /* transformers prefers chat_template.jinja over tokenizer_config.json */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (stat(path, &st) == 0) {
        if ((rc = whale_read_file(path, &buf, &n, err))) return rc;
        const char *why = classify(buf, n, fmt);
        free(buf);
        return why ? unrecognised(path, why, err) : WHALE_OK;
    }

    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (stat(path, &st) != 0)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                          "%s: no chat template (no chat_template.jinja or tokenizer_config.json); pass "
                          "--chat-template deepseek|chatml|raw (raw is the original chat.py's fallback)", dir);
    if ((rc = whale_read_file(path, &buf, &n, err))) return rc;
    cJSON *root = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!root) return whale_errf(err, WHALE_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    const char *tpl = NULL;
    rc = WHALE_OK;
    if (!ct || cJSON_IsNull(ct)) {
        rc = whale_errf(err, WHALE_ERR_UNSUPPORTED,
                        "%s: no \"chat_template\" (and no chat_template.jinja); pass --chat-template "
                        "deepseek|chatml|raw (raw is the original chat.py's fallback)", path);
    } else if (cJSON_IsString(ct)) {
        tpl = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        /* named templates: apply_chat_template uses "default" */
        for (const cJSON *e = ct->child; e && !rc && !tpl; e = e->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsString(name) || !cJSON_IsString(t))
                rc = whale_errf(err, WHALE_ERR_FORMAT,
                                "%s: \"chat_template\" list entries must be {\"name\": string, \"template\": string}",
                                path);
            else if (!strcmp(name->valuestring, "default"))
                tpl = t->valuestring;
        }
        if (!rc && !tpl)
            rc = whale_errf(err, WHALE_ERR_UNSUPPORTED,
                            "%s: \"chat_template\" has no \"default\" template; pass --chat-template "
                            "deepseek|chatml|raw", path);
    } else {
        rc = whale_errf(err, WHALE_ERR_FORMAT,
                        "%s: \"chat_template\" is neither a string nor a list of {name, template}", path);
    }
    if (!rc) {
        const char *why = classify(tpl, strlen(tpl), fmt);
        if (why) rc = unrecognised(path, why, err);
    }
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------ JSON input */

/* A field that must be absent, null or empty for the native templates. */
static int non_empty(const cJSON *v) {
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    if (cJSON_IsString(v)) return v->valuestring[0] != 0;
    return 1;
}

static whale_code check_json_message(const cJSON *m, int i, whale_err *err) {
    static const char *const refused[][2] = {
        {"tool_calls", "tool calls"},
        {"function_call", "function calls"},
        {"reasoning_content", "thinking parts"},
    };
    if (!cJSON_IsObject(m)) return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d]: not an object", i);
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
        if (non_empty(cJSON_GetObjectItemCaseSensitive(m, refused[k][0])))
            return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                              "messages[%d].%s: %s are not supported by the native chat templates", i,
                              refused[k][0], refused[k][1]);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsString(role)) return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d].role: missing or not a string", i);
    if (cJSON_IsArray(content))
        return whale_errf(err, WHALE_ERR_UNSUPPORTED,
                          "messages[%d].content: a list of content parts is not supported (use a string)", i);
    if (!cJSON_IsString(content))
        return whale_errf(err, WHALE_ERR_FORMAT, "messages[%d].content: missing, null or not a string", i);
    return WHALE_OK;
}

whale_code whale_chat_parse_json(const char *json, size_t len, whale_chat_message **msgs, int *n,
                                 whale_err *err) {
    if (!json || !msgs || !n) return whale_errf(err, WHALE_ERR_ARG, "whale_chat_parse_json: NULL argument");
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return whale_errf(err, WHALE_ERR_FORMAT, "chat JSON: not valid JSON");
    const cJSON *arr = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "messages") : root;
    whale_code rc = WHALE_OK;
    int count = 0;
    size_t bytes = 0;
    if (!cJSON_IsArray(arr)) {
        rc = whale_errf(err, WHALE_ERR_FORMAT, "chat JSON: expected an array of messages or an object with \"messages\"");
    } else {
        for (const cJSON *m = arr->child; m && !rc; m = m->next, count++) {
            rc = check_json_message(m, count, err);
            if (!rc)
                bytes += strlen(cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring) +
                         strlen(cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring) + 2;
        }
    }
    whale_chat_message *out = NULL;
    if (!rc) {
        /* the message array first, then the strings it points to */
        size_t head = (size_t)count * sizeof *out;
        out = malloc(head + bytes + 1);
        if (!out) rc = whale_errf(err, WHALE_ERR_NOMEM, "chat JSON: out of memory for %d messages", count);
    }
    if (!rc) {
        char *p = (char *)(out + count);
        int i = 0;
        for (const cJSON *m = arr->child; m; m = m->next, i++) {
            const char *f[2] = {cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring,
                                cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring};
            const char **dst[2] = {&out[i].role, &out[i].content};
            for (int k = 0; k < 2; k++) {
                size_t l = strlen(f[k]) + 1;
                memcpy(p, f[k], l);
                *dst[k] = p;
                p += l;
            }
        }
        *msgs = out;
        *n = count;
    }
    cJSON_Delete(root);
    return rc;
}
