/* Jinja tokenizer: the preprocessing and the token rules of
 * @huggingface/jinja (trim_blocks and lstrip_blocks on), with the template
 * line of every token kept for error messages. */
#include "io/jinja_impl.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ arena */

struct jarena_block {
    jarena_block *next;
    size_t size, used;
    max_align_t data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    jarena_block *b = a->head;
    if (!b || b->size - b->used < n) {
        size_t size = n > 60000 ? n : 60000;
        if (a->used + size > a->cap) return NULL;
        b = malloc(sizeof *b + size);
        if (!b) return NULL;
        b->next = a->head;
        b->size = size;
        b->used = 0;
        a->head = b;
        a->used += size;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free(jarena *a) {
    for (jarena_block *b = a->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->head = NULL;
    a->used = 0;
}

/* ------------------------------------------------------------ characters */

/* Bytes of the JavaScript whitespace character (\s) at p, else 0. */
static int ws_len(const char *p, const char *end) {
    unsigned char c = (unsigned char)p[0];
    if (c == ' ' || (c >= '\t' && c <= '\r')) return 1;
    if (c == 0xC2 && end - p >= 2 && (unsigned char)p[1] == 0xA0) return 2;
    if (end - p < 3) return 0;
    unsigned u = ((c & 0x0Fu) << 12) | (((unsigned char)p[1] & 0x3Fu) << 6) | ((unsigned char)p[2] & 0x3Fu);
    if ((c & 0xF0) != 0xE0) return 0;
    if (u == 0x1680 || (u >= 0x2000 && u <= 0x200A) || u == 0x2028 || u == 0x2029 || u == 0x202F || u == 0x205F ||
        u == 0x3000 || u == 0xFEFF)
        return 3;
    return 0;
}

/* Length of s[0..n) without its trailing JavaScript whitespace. */
static size_t trim_end(const char *s, size_t n) {
    for (;;) {
        size_t cut = 0;
        for (size_t k = 1; k <= 3 && k <= n; k++)
            if (ws_len(s + n - k, s + n) == (int)k) cut = k;
        if (!cut) return n;
        n -= cut;
    }
}

static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* ------------------------------------------------------------ preprocessing */

typedef struct {
    char *s;
    int *ln; /* template line of each byte */
    size_t n;
} ptext;

/* lstrip_blocks: spaces and tabs from a line start up to "{%", "{#" or "{-". */
static void pp_lstrip(ptext *t) {
    size_t o = 0;
    for (size_t i = 0; i < t->n;) {
        if (i == 0 || t->s[i - 1] == '\n' || t->s[i - 1] == '\r') {
            size_t j = i;
            while (j < t->n && (t->s[j] == ' ' || t->s[j] == '\t')) j++;
            if (j + 1 < t->n && t->s[j] == '{' && strchr("#%-", t->s[j + 1]) && t->s[j + 1]) i = j;
        }
        t->s[o] = t->s[i];
        t->ln[o++] = t->ln[i++];
    }
    t->n = o;
}

/* trim_blocks: the newline right after "%}", "#}" or "-}". */
static void pp_trim(ptext *t) {
    size_t o = 0;
    for (size_t i = 0; i < t->n;) {
        if (i + 2 < t->n && t->s[i] && strchr("#%-", t->s[i]) && t->s[i + 1] == '}' && t->s[i + 2] == '\n') {
            t->s[o] = t->s[i];
            t->ln[o++] = t->ln[i];
            t->s[o] = t->s[i + 1];
            t->ln[o++] = t->ln[i + 1];
            i += 3;
            continue;
        }
        t->s[o] = t->s[i];
        t->ln[o++] = t->ln[i++];
    }
    t->n = o;
}

/* Length of a "{% generation %}" / "{% endgeneration %}" tag at i (0 if
 * none); *ls / *rs: whether it has "-" on the left / right. */
static size_t generation_tag(const ptext *t, size_t i, int *ls, int *rs) {
    const char *s = t->s, *end = t->s + t->n;
    size_t j = i;
    if (j + 2 > t->n || s[j] != '{' || s[j + 1] != '%') return 0;
    j += 2;
    *ls = j < t->n && s[j] == '-';
    j += (size_t)*ls;
    int w;
    while (j < t->n && (w = ws_len(s + j, end))) j += (size_t)w;
    if (t->n - j >= 3 && !memcmp(s + j, "end", 3)) j += 3;
    if (t->n - j < 10 || memcmp(s + j, "generation", 10)) return 0;
    j += 10;
    while (j < t->n && (w = ws_len(s + j, end))) j += (size_t)w;
    *rs = j < t->n && s[j] == '-';
    j += (size_t)*rs;
    if (t->n - j < 2 || s[j] != '%' || s[j + 1] != '}') return 0;
    return j + 2 - i;
}

/* transformers' {% generation %} markers render nothing (whitespace around
 * them is stripped where they say "-"). */
static void pp_generation(ptext *t) {
    size_t o = 0, kept = 0; /* output bytes before which nothing may be stripped */
    for (size_t i = 0; i < t->n;) {
        int ls, rs;
        size_t tag = t->s[i] == '{' ? generation_tag(t, i, &ls, &rs) : 0;
        if (!tag) {
            t->s[o] = t->s[i];
            t->ln[o++] = t->ln[i++];
            continue;
        }
        if (ls) o = kept + trim_end(t->s + kept, o - kept);
        i += tag;
        int w;
        if (rs)
            while (i < t->n && (w = ws_len(t->s + i, t->s + t->n))) i += (size_t)w;
        kept = o;
    }
    t->n = o;
}

static whale_code preprocess(jarena *a, const char *src, size_t len, ptext *t, whale_err *err) {
    t->s = ja_alloc(a, len + 1);
    t->ln = ja_alloc(a, (len + 1) * sizeof *t->ln);
    if (!t->s || !t->ln) return whale_errf(err, WHALE_ERR_NOMEM, "chat template: out of memory");
    int line = 1;
    for (size_t i = 0; i < len; i++) {
        t->s[i] = src[i];
        t->ln[i] = line;
        if (src[i] == '\n') line++;
    }
    t->n = len;
    if (t->n && t->s[t->n - 1] == '\n') t->n--;
    pp_lstrip(t);
    pp_trim(t);
    pp_generation(t);
    return WHALE_OK;
}

/* ------------------------------------------------------------ tokens */

typedef struct {
    jarena *a;
    const ptext *t;
    size_t pos;
    jtok *v;
    int n, cap;
    whale_err *err;
} lexer;

static whale_code lex_err(lexer *L, const char *fmt, const char *what) {
    int line = L->t->n ? L->t->ln[L->pos < L->t->n ? L->pos : L->t->n - 1] : 1;
    return whale_errf(L->err, WHALE_ERR_FORMAT, "chat template line %d: %s%s", line, fmt, what ? what : "");
}

static whale_code push(lexer *L, jtok_type type, const char *s, size_t n, size_t at) {
    if (L->n + 1 >= L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        jtok *v = ja_alloc(L->a, (size_t)cap * sizeof *v);
        if (!v) return whale_errf(L->err, WHALE_ERR_NOMEM, "chat template: out of memory for tokens");
        if (L->n) memcpy(v, L->v, (size_t)L->n * sizeof *v);
        L->v = v;
        L->cap = cap;
    }
    int line = L->t->n ? L->t->ln[at < L->t->n ? at : L->t->n - 1] : 1;
    L->v[L->n++] = (jtok){type, s, n, line};
    return WHALE_OK;
}

static jtok_type last_type(const lexer *L) { return L->n ? L->v[L->n - 1].type : T_END; }

static void strip_last_text(lexer *L) {
    if (!L->n || L->v[L->n - 1].type != T_TEXT) return;
    jtok *k = &L->v[L->n - 1];
    k->n = trim_end(k->s, k->n);
    if (!k->n) L->n--;
}

static void skip_ws(lexer *L) {
    int w;
    while (L->pos < L->t->n && (w = ws_len(L->t->s + L->pos, L->t->s + L->t->n))) L->pos += (size_t)w;
}

static int at(const lexer *L, const char *s) {
    size_t n = strlen(s);
    return L->t->n - L->pos >= n && !memcmp(L->t->s + L->pos, s, n);
}

static void put_utf8(char *o, size_t *k, unsigned u) {
    if (u < 0x80) o[(*k)++] = (char)u;
    else if (u < 0x800) {
        o[(*k)++] = (char)(0xC0 | (u >> 6));
        o[(*k)++] = (char)(0x80 | (u & 0x3F));
    } else {
        o[(*k)++] = (char)(0xE0 | (u >> 12));
        o[(*k)++] = (char)(0x80 | ((u >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (u & 0x3F));
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A quoted string at pos (the quote), escapes resolved. */
static whale_code lex_string(lexer *L) {
    const char *s = L->t->s;
    char q = s[L->pos];
    size_t start = L->pos++;
    char *o = ja_alloc(L->a, L->t->n - L->pos + 1);
    size_t k = 0;
    if (!o) return whale_errf(L->err, WHALE_ERR_NOMEM, "chat template: out of memory");
    for (;;) {
        if (L->pos >= L->t->n) return lex_err(L, "unterminated string literal", NULL);
        char c = s[L->pos];
        if (c == q) break;
        if (c != '\\') {
            o[k++] = c;
            L->pos++;
            continue;
        }
        if (++L->pos >= L->t->n) return lex_err(L, "unterminated string literal", NULL);
        char e = s[L->pos++];
        static const char from[] = "ntrbfv'\"\\", to[] = "\n\t\r\b\f\v'\"\\";
        const char *m = strchr(from, e);
        if (e == 'x' || e == 'u') {
            int digits = e == 'x' ? 2 : 4;
            unsigned u = 0;
            for (int d = 0; d < digits; d++) {
                int h = L->pos < L->t->n ? hexval(s[L->pos]) : -1;
                if (h < 0) return lex_err(L, "invalid hexadecimal escape in a string literal", NULL);
                u = u * 16 + (unsigned)h;
                L->pos++;
            }
            put_utf8(o, &k, u);
        } else if (e && m) {
            o[k++] = to[m - from];
        } else {
            char what[2] = {e, 0};
            return lex_err(L, "unknown escape in a string literal: \\", what);
        }
    }
    L->pos++;
    return push(L, T_STR, o, k, start);
}

static whale_code lex_number(lexer *L, size_t start) {
    const char *s = L->t->s;
    size_t p = L->pos;
    while (p < L->t->n && is_digit(s[p])) p++;
    if (p > L->pos && last_type(L) != T_DOT && p + 1 < L->t->n && s[p] == '.' && is_digit(s[p + 1])) {
        p++;
        while (p < L->t->n && is_digit(s[p])) p++;
    }
    L->pos = p;
    return push(L, T_NUM, s + start, p - start, start);
}

static const struct {
    const char *s;
    jtok_type t;
} op_table[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR}, {"(", T_LPAREN},
    {")", T_RPAREN},     {"{", T_LBRACE},      {"}", T_RBRACE},     {"[", T_LBRACK},     {"]", T_RBRACK},
    {",", T_COMMA},      {".", T_DOT},         {":", T_COLON},      {"|", T_PIPE},       {"<=", T_CMP},
    {">=", T_CMP},       {"==", T_CMP},        {"!=", T_CMP},       {"<", T_CMP},        {">", T_CMP},
    {"+", T_ADD},        {"-", T_ADD},         {"~", T_ADD},        {"**", T_POW},       {"*", T_MUL},
    {"//", T_MUL},       {"/", T_MUL},         {"%", T_MUL},        {"=", T_ASSIGN},
};

/* Text up to the next "{%", "{{" or "{#"; returns whether there was any. */
static whale_code lex_text(lexer *L, int *got) {
    const char *s = L->t->s;
    size_t p = L->pos;
    while (p < L->t->n && !(s[p] == '{' && p + 1 < L->t->n && (s[p + 1] == '%' || s[p + 1] == '{' || s[p + 1] == '#')))
        p++;
    *got = p > L->pos;
    if (!*got) return WHALE_OK;
    whale_code rc = push(L, T_TEXT, s + L->pos, p - L->pos, L->pos);
    L->pos = p;
    return rc;
}

static whale_code lex_comment(lexer *L) {
    const char *s = L->t->s;
    size_t start = L->pos;
    L->pos += 2;
    int strip_before = L->pos < L->t->n && s[L->pos] == '-';
    L->pos += (size_t)strip_before;
    size_t c0 = L->pos;
    while (!(L->pos + 1 < L->t->n && s[L->pos] == '#' && s[L->pos + 1] == '}')) {
        if (L->pos + 2 >= L->t->n) {
            L->pos = start;
            return lex_err(L, "unterminated comment (no \"#}\")", NULL);
        }
        L->pos++;
    }
    int strip_after = L->pos > c0 && s[L->pos - 1] == '-';
    if (strip_before) strip_last_text(L);
    JTRY(push(L, T_COMMENT, s + c0, L->pos - c0, start));
    L->pos += 2;
    if (strip_after) skip_ws(L);
    return WHALE_OK;
}

/* One token inside a tag; *curly counts open "{" so that "}}" closes dicts. */
static whale_code lex_inner(lexer *L, int *curly) {
    const char *s = L->t->s;
    size_t start = L->pos;
    char ch = s[L->pos];
    if (ch == '-' || ch == '+') {
        jtok_type lt = last_type(L);
        if (lt == T_TEXT || lt == T_END) return lex_err(L, "unexpected character ", ch == '-' ? "'-'" : "'+'");
        if (lt != T_NAME && lt != T_NUM && lt != T_STR && lt != T_RPAREN && lt != T_RBRACK) {
            L->pos++;
            size_t d = L->pos;
            while (d < L->t->n && is_digit(s[d])) d++;
            if (d == L->pos) return push(L, T_UNARY, s + start, 1, start);
            return lex_number(L, start);
        }
    }
    for (size_t k = 0; k < sizeof op_table / sizeof op_table[0]; k++) {
        if (op_table[k].t == T_CLOSE_EXPR && *curly > 0) continue;
        if (!at(L, op_table[k].s)) continue;
        size_t n = strlen(op_table[k].s);
        JTRY(push(L, op_table[k].t, s + start, n, start));
        if (op_table[k].t == T_OPEN_EXPR) *curly = 0;
        else if (op_table[k].t == T_LBRACE) ++*curly;
        else if (op_table[k].t == T_RBRACE) --*curly;
        L->pos += n;
        return WHALE_OK;
    }
    if (ch == '\'' || ch == '"') return lex_string(L);
    if (is_digit(ch)) return lex_number(L, start);
    if (is_word(ch)) {
        while (L->pos < L->t->n && is_word(s[L->pos])) L->pos++;
        return push(L, T_NAME, s + start, L->pos - start, start);
    }
    char what[8];
    snprintf(what, sizeof what, "'%c'", ch);
    if ((unsigned char)ch >= 0x80) snprintf(what, sizeof what, "0x%02x", (unsigned char)ch);
    return lex_err(L, "unexpected character ", what);
}

static whale_code lex_step(lexer *L, int *curly) {
    jtok_type lt = last_type(L);
    if (lt == T_END || lt == T_CLOSE_STMT || lt == T_CLOSE_EXPR || lt == T_COMMENT) {
        int got;
        JTRY(lex_text(L, &got));
        if (got) return WHALE_OK;
    }
    if (at(L, "{#")) return lex_comment(L);
    if (at(L, "{%-") || at(L, "{{-")) {
        strip_last_text(L);
        int expr = L->t->s[L->pos + 1] == '{';
        JTRY(push(L, expr ? T_OPEN_EXPR : T_OPEN_STMT, L->t->s + L->pos, 2, L->pos));
        if (expr) *curly = 0;
        L->pos += 3;
        return WHALE_OK;
    }
    skip_ws(L);
    if (L->pos >= L->t->n) return WHALE_OK;
    if (at(L, "-%}") || at(L, "-}}")) {
        JTRY(push(L, L->t->s[L->pos + 1] == '%' ? T_CLOSE_STMT : T_CLOSE_EXPR, L->t->s + L->pos + 1, 2, L->pos));
        L->pos += 3;
        skip_ws(L);
        return WHALE_OK;
    }
    return lex_inner(L, curly);
}

whale_code jinja_lex(jarena *a, const char *src, size_t len, jtok **toks, int *n, whale_err *err) {
    ptext t;
    JTRY(preprocess(a, src, len, &t, err));
    lexer L = {a, &t, 0, NULL, 0, 0, err};
    int curly = 0;
    while (L.pos < t.n) JTRY(lex_step(&L, &curly));
    JTRY(push(&L, T_END, "", 0, t.n));
    *toks = L.v;
    *n = L.n;
    return WHALE_OK;
}
