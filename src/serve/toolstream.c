/*
 * Tool calls in a streamed reply, as OpenAI streams them: content deltas
 * until a call begins, then per call one delta with its index, id and
 * function name, then the arguments' JSON text in fragments as the model
 * writes it.
 *
 * Formats, as whale_chat_parse_tool_calls reads a whole reply:
 *   - Hermes / Qwen2.5 blocks `<tool_call>{"name": N, "arguments": {...}}</tool_call>`:
 *     text before a block streams as content (a tail that may begin the tag
 *     is held back); once the block's head up to the arguments' `{` has
 *     arrived, the call is announced and the arguments stream byte for byte
 *     until their closing brace (a JSON scanner tracks strings and depth).
 *     A block whose head does not read that way (other key order, arguments
 *     as a string) is held until `</tool_call>` and parsed whole; one that
 *     does not parse, or never closes, comes back as content.
 *   - Llama 3.1, a reply that is one JSON object (after an optional
 *     <|python_tag|>): a reply that starts so is held to its end and parsed
 *     whole, a call or else content.
 * Whitespace between and after calls is dropped, as the whole-reply parser
 * does; other text after a call streams as content (the whole-reply parser
 * would call the reply text: a stream cannot take back what it sent).
 */
#include "serve/serve_impl.h"

#include "whale_chat.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

enum { TS_TEXT, TS_HEAD, TS_ARGS, TS_TAIL, TS_BLOCK, TS_WHOLE, TS_PARSED };

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>", PYTAG[] = "<|python_tag|>";

struct serve_toolstream {
    char *buf; /* everything fed */
    size_t n, cap;
    size_t pos;   /* bytes decided */
    size_t block; /* TS_HEAD / TS_BLOCK: where the block's <tool_call> began */
    int state, calls, texted, announced;
    int depth, in_str, esc; /* TS_ARGS: the JSON scanner */
    char *name;             /* the announced call's name */
    cJSON *parsed;          /* TS_PARSED: calls parsed whole, sent one piece at a time */
    const cJSON *next_call;
    int parsed_args; /* TS_PARSED: the current call's header went, its arguments next */
    size_t parsed_end;
};

serve_toolstream *serve_toolstream_new(void) { return calloc(1, sizeof(serve_toolstream)); }

void serve_toolstream_free(serve_toolstream *t) {
    if (!t) return;
    free(t->buf);
    free(t->name);
    cJSON_Delete(t->parsed);
    free(t);
}

int serve_toolstream_feed(serve_toolstream *t, const char *text, size_t len) {
    if (t->n + len + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + len + 1) cap *= 2;
        char *grown = realloc(t->buf, cap);
        if (!grown) return -1;
        t->buf = grown, t->cap = cap;
    }
    memcpy(t->buf + t->n, text, len);
    t->n += len;
    t->buf[t->n] = 0;
    return 0;
}

size_t serve_toolstream_consumed(const serve_toolstream *t) { return t->pos; }
int serve_toolstream_calls(const serve_toolstream *t) { return t->announced; }

static int space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* After whitespace, the literal s at *i: 1 (and *i past it), 0 when the
 * text ends first (on a prefix of s), -1 when it differs. */
static int lit(const char *b, size_t n, size_t *i, const char *s) {
    size_t k = *i, m = strlen(s);
    while (k < n && space(b[k])) k++;
    for (size_t q = 0; q < m; q++) {
        if (k + q >= n) return 0;
        if (b[k + q] != s[q]) return -1;
    }
    *i = k + m;
    return 1;
}

/* The longest tail of b[0..n) that is a proper prefix of s. */
static size_t partial(const char *b, size_t n, const char *s) {
    size_t m = strlen(s);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(b + n - k, s, k)) return k;
    return 0;
}

static int all_space(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!space(p[i])) return 0;
    return 1;
}

/* {"name": "N", "arguments": {  →  1 with the name and *args at the '{';
 * 0: more text is needed; -1: not this shape. */
static int head(serve_toolstream *t, size_t *args) {
    const char *b = t->buf;
    size_t i = t->pos;
    int r;
    if ((r = lit(b, t->n, &i, "{")) < 1 || (r = lit(b, t->n, &i, "\"name\"")) < 1 || (r = lit(b, t->n, &i, ":")) < 1)
        return r;
    while (i < t->n && space(b[i])) i++;
    if (i == t->n) return 0;
    if (b[i] != '"') return -1;
    size_t q = i + 1;
    while (q < t->n && b[q] != '"') q += b[q] == '\\' ? 2 : 1;
    if (q >= t->n) return 0;
    size_t after = q + 1;
    if ((r = lit(b, t->n, &after, ",")) < 1 || (r = lit(b, t->n, &after, "\"arguments\"")) < 1 ||
        (r = lit(b, t->n, &after, ":")) < 1)
        return r;
    while (after < t->n && space(b[after])) after++;
    if (after == t->n) return 0;
    if (b[after] != '{') return -1;
    cJSON *name = cJSON_ParseWithLength(b + i, q + 1 - i);
    int ok = cJSON_IsString(name) && name->valuestring[0];
    free(t->name);
    t->name = ok ? strdup(name->valuestring) : NULL;
    cJSON_Delete(name);
    if (!ok) return -1;
    *args = after;
    return t->name ? 1 : -2;
}

static int piece(serve_tool_piece *out, int kind, const char *p, size_t n, int index, const char *name) {
    *out = (serve_tool_piece){kind, p, n, index, name};
    return 1;
}

/* Text [from, to): content, except whitespace after a call (dropped). 0 when nothing to send. */
static int text_piece(serve_toolstream *t, size_t from, size_t to, serve_tool_piece *out) {
    t->pos = to;
    if (to == from || (t->calls && all_space(t->buf + from, to - from))) return 0;
    t->texted = 1;
    return piece(out, SERVE_PIECE_TEXT, t->buf + from, to - from, 0, NULL);
}

/* Parse [from, to) whole: its calls go out one piece at a time from TS_PARSED;
 * anything else is content. */
static int parse_whole(serve_toolstream *t, size_t from, size_t to, serve_tool_piece *out) {
    cJSON *m = NULL;
    whale_err err;
    if (whale_chat_parse_tool_calls(t->buf + from, to - from, &m, &err)) return -2;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!calls || (cJSON_IsString(content) && content->valuestring[0])) { /* not calls only */
        cJSON_Delete(m);
        t->state = TS_TEXT;
        return text_piece(t, from, to, out);
    }
    cJSON_Delete(t->parsed);
    t->parsed = m;
    t->next_call = calls->child;
    t->parsed_args = 0;
    t->parsed_end = to;
    t->state = TS_PARSED;
    return 0;
}

static int next_parsed(serve_toolstream *t, serve_tool_piece *out) {
    if (!t->next_call) {
        cJSON_Delete(t->parsed);
        t->parsed = NULL;
        t->pos = t->parsed_end;
        t->state = TS_TEXT;
        return 0;
    }
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t->next_call, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (!t->parsed_args) {
        t->parsed_args = 1;
        return piece(out, SERVE_PIECE_CALL, NULL, 0, t->calls, name->valuestring);
    }
    t->parsed_args = 0;
    t->next_call = t->next_call->next;
    int index = t->calls++;
    return piece(out, SERVE_PIECE_ARGS, args->valuestring, strlen(args->valuestring), index, NULL);
}

static int next_text(serve_toolstream *t, int done, serve_tool_piece *out) {
    const char *b = t->buf;
    if (!t->calls && !t->texted) { /* the reply's start: a Llama 3.1 call? */
        size_t k = t->pos;
        while (k < t->n && space(b[k])) k++;
        if (k == t->n && !done) return 0;
        size_t i = t->pos;
        int py = lit(b, t->n, &i, PYTAG);
        if (k < t->n && (b[k] == '{' || py == 1)) {
            t->state = TS_WHOLE;
            return 0;
        }
        if (py == 0 && !done) return 0;
    }
    const char *open = memmem(b + t->pos, t->n - t->pos, OPEN, sizeof OPEN - 1);
    if (open && (size_t)(open - b) == t->pos) {
        t->block = t->pos;
        t->pos += sizeof OPEN - 1;
        t->state = TS_HEAD;
        return 0;
    }
    size_t to = open ? (size_t)(open - b) : t->n - (done ? 0 : partial(b + t->pos, t->n - t->pos, OPEN));
    if (t->calls && !open && !done) /* whitespace after a call waits: it is dropped if another call follows */
        while (to > t->pos && space(b[to - 1])) to--;
    return text_piece(t, t->pos, to, out);
}

/* Returns 1 with a piece, 0 when nothing more can be decided now, -2 out of memory. */
static int step(serve_toolstream *t, int done, serve_tool_piece *out) {
    size_t args;
    switch (t->state) {
    case TS_TEXT: return next_text(t, done, out);
    case TS_HEAD: {
        int r = head(t, &args);
        if (r == 1) {
            t->pos = args;
            t->state = TS_ARGS;
            t->depth = t->in_str = t->esc = 0;
            return piece(out, SERVE_PIECE_CALL, NULL, 0, t->calls, t->name);
        }
        if (r == -1) t->state = TS_BLOCK;
        if (r == 0 && done) {
            t->state = TS_TEXT;
            t->texted = 1;
            return text_piece(t, t->block, t->n, out);
        }
        return r == -2 ? -2 : 0;
    }
    case TS_ARGS: {
        size_t k = t->pos;
        while (k < t->n) {
            char c = t->buf[k++];
            if (t->esc) t->esc = 0;
            else if (t->in_str) t->esc = c == '\\', t->in_str = c != '"';
            else if (c == '"') t->in_str = 1;
            else if (c == '{' || c == '[') t->depth++;
            else if ((c == '}' || c == ']') && --t->depth == 0) {
                t->state = TS_TAIL;
                break;
            }
        }
        size_t from = t->pos;
        t->pos = k;
        if (k == from) return 0;
        return piece(out, SERVE_PIECE_ARGS, t->buf + from, k - from, t->calls, NULL);
    }
    case TS_TAIL: {
        size_t i = t->pos;
        int r = lit(t->buf, t->n, &i, "}");
        if (r == 1) r = lit(t->buf, t->n, &i, CLOSE);
        if (r == 0) return 0;
        t->calls++;
        t->state = TS_TEXT;
        if (r == 1) t->pos = i;
        return 0;
    }
    case TS_BLOCK: {
        const char *close = memmem(t->buf + t->pos, t->n - t->pos, CLOSE, sizeof CLOSE - 1);
        if (!close && !done) return 0;
        size_t end = close ? (size_t)(close - t->buf) + sizeof CLOSE - 1 : t->n;
        if (!close) {
            t->state = TS_TEXT;
            t->texted = 1;
            return text_piece(t, t->block, end, out);
        }
        return parse_whole(t, t->block, end, out);
    }
    case TS_WHOLE: return done ? parse_whole(t, t->pos, t->n, out) : 0;
    case TS_PARSED: return next_parsed(t, out);
    }
    return 0;
}

int serve_toolstream_next(serve_toolstream *t, int done, serve_tool_piece *out) {
    for (int guard = 0; guard < 64; guard++) { /* each step without a piece changes state or position */
        int state = t->state;
        size_t pos = t->pos;
        int r = step(t, done, out);
        if (r == 1 && out->kind == SERVE_PIECE_CALL) t->announced++;
        if (r) return r;
        if (t->state == state && t->pos == pos) return 0;
    }
    return 0;
}
