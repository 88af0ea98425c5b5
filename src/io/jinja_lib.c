/* The Jinja library: printing, JSON, operators, filters, tests, methods of
 * strings and dicts, and the global functions, with @huggingface/jinja's
 * semantics (see docs/chat-templates.md for the list and the known
 * differences). */
#include "io/jinja_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    F_NAMESPACE, F_RANGE, F_RAISE, F_STRFTIME,
    M_UPPER, M_LOWER, M_STRIP, M_LSTRIP, M_RSTRIP, M_TITLE, M_CAPITALIZE, M_STARTSWITH, M_ENDSWITH,
    M_SPLIT, M_RSPLIT, M_REPLACE, M_FIND,
    M_GET, M_ITEMS, M_KEYS, M_VALUES,
};

static const char *const str_methods[] = {"upper", "lower", "strip", "lstrip", "rstrip", "title", "capitalize",
                                          "startswith", "endswith", "split", "rsplit", "replace", "find", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};

static int eq(const char *s, size_t n, const char *lit) { return n == strlen(lit) && !memcmp(s, lit, n); }

static int is_num(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT; }
static double num(const jv *v) { return v->t == JV_INT ? (double)v->u.i : v->t == JV_BOOL ? v->u.b : v->u.f; }

/* ------------------------------------------------------------ numbers and strings */

/* JavaScript's Number#toString: the shortest digits that read back. */
static void js_number(double x, char *out, size_t cap) {
    if (isnan(x)) {
        snprintf(out, cap, "NaN");
        return;
    }
    if (isinf(x)) {
        snprintf(out, cap, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        snprintf(out, cap, "0");
        return;
    }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e: [-]d[.ddd]e[+-]xx */
    char digits[24];
    int k = 0, neg = e[0] == '-';
    const char *p = e + neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[k++] = *p;
    digits[k] = 0;
    int n = atoi(p + 1) + 1; /* x = 0.digits × 10^n */
    size_t o = 0;
    if (neg) out[o++] = '-';
#define PUT(ch) (o + 1 < cap ? (void)(out[o++] = (ch)) : (void)0)
    if (k <= n && n <= 21) {
        for (int i = 0; i < k; i++) PUT(digits[i]);
        for (int i = k; i < n; i++) PUT('0');
    } else if (0 < n && n <= 21) {
        for (int i = 0; i < k; i++) {
            if (i == n) PUT('.');
            PUT(digits[i]);
        }
    } else if (-6 < n && n <= 0) {
        PUT('0');
        PUT('.');
        for (int i = 0; i < -n; i++) PUT('0');
        for (int i = 0; i < k; i++) PUT(digits[i]);
    } else {
        PUT(digits[0]);
        if (k > 1) PUT('.');
        for (int i = 1; i < k; i++) PUT(digits[i]);
        out[o] = 0;
        snprintf(out + o, cap - o, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
        return;
    }
#undef PUT
    out[o] = 0;
}

long long jstr_len16(const char *p, size_t n) {
    long long count = 0;
    for (size_t k = 0; k < n; k++) {
        unsigned char b = (unsigned char)p[k];
        if ((b & 0xC0) != 0x80) count += b >= 0xF0 ? 2 : 1;
    }
    return count;
}

/* the string `+` and `~` make of a value (JavaScript's String(value)) */
static whale_code raw_string(jctx *c, const jv *v, jv *out) {
    char b[40];
    switch (v->t) {
    case JV_STR: *out = *v; return WHALE_OK;
    case JV_INT: snprintf(b, sizeof b, "%lld", v->u.i); break;
    case JV_FLOAT: js_number(v->u.f, b, sizeof b); break;
    case JV_BOOL: snprintf(b, sizeof b, "%s", v->u.b ? "true" : "false"); break;
    default: return jerr(c, WHALE_ERR_FORMAT, "cannot concatenate a %s to a string", jv_type_name(v->t));
    }
    return jv_strdup(c, b, strlen(b), out);
}

whale_code jv_to_string(jctx *c, const jv *v, jv *out) {
    char b[48];
    if (v->t == JV_FLOAT) {
        if (v->u.f == 0 && signbit(v->u.f)) snprintf(b, sizeof b, "-0.0");
        else if (v->u.f == floor(v->u.f) && fabs(v->u.f) < 1e21) snprintf(b, sizeof b, "%.1f", v->u.f);
        else js_number(v->u.f, b, sizeof b);
        return jv_strdup(c, b, strlen(b), out);
    }
    if (v->t == JV_LIST || v->t == JV_DICT || v->t == JV_NS) {
        jbuf jb = {0};
        JTRY(jv_tojson(c, v, -1, NULL, NULL, 0, 0, -1, &jb));
        *out = jv_str(jb.p ? jb.p : "", jb.n);
        return WHALE_OK;
    }
    if (v->t == JV_UNDEF || v->t == JV_NONE) {
        *out = jv_str("", 0);
        return WHALE_OK;
    }
    if (v->t == JV_FUNC || v->t == JV_MACRO) return jerr(c, WHALE_ERR_FORMAT, "cannot print a %s", jv_type_name(v->t));
    return raw_string(c, v, out);
}

/* ------------------------------------------------------------ JSON */

static whale_code json_string(jctx *c, const char *s, size_t n, int ensure_ascii, jbuf *b) {
    JTRY(jb_put(c, b, "\"", 1));
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[16];
        const char *rep = NULL;
        switch (ch) {
        case '"': rep = "\\\""; break;
        case '\\': rep = "\\\\"; break;
        case '\b': rep = "\\b"; break;
        case '\f': rep = "\\f"; break;
        case '\n': rep = "\\n"; break;
        case '\r': rep = "\\r"; break;
        case '\t': rep = "\\t"; break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
                rep = esc;
            }
        }
        if (!rep && ensure_ascii && ch >= 0x7f) {
            /* one \uXXXX per UTF-16 unit, as JavaScript's string holds them */
            unsigned u = ch, extra = ch >= 0xF0 ? 3 : ch >= 0xE0 ? 2 : ch >= 0xC0 ? 1 : 0;
            if (extra) u &= 0x3Fu >> extra;
            for (unsigned k = 0; k < extra && i + 1 < n; k++) u = (u << 6) | ((unsigned char)s[++i] & 0x3Fu);
            if (u >= 0x10000)
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + ((u - 0x10000) >> 10), 0xDC00 + ((u - 0x10000) & 0x3FF));
            else
                snprintf(esc, sizeof esc, "\\u%04x", u);
            rep = esc;
        }
        if (rep) JTRY(jb_put(c, b, rep, strlen(rep)));
        else JTRY(jb_put(c, b, s + i, 1));
    }
    return jb_put(c, b, "\"", 1);
}

static whale_code json_newline(jctx *c, int indent, int depth, jbuf *b) {
    JTRY(jb_put(c, b, "\n", 1));
    for (long i = 0; i < (long)indent * depth; i++) JTRY(jb_put(c, b, " ", 1));
    return WHALE_OK;
}

/* depth < 0: printing ({{ list }}, depth -1 - d): undefined stays
 * "undefined"; else tojson at depth d */
whale_code jv_tojson(jctx *c, const jv *v, int indent, const char *item_sep, const char *key_sep, int ensure_ascii,
                     int sort_keys, int depth, jbuf *b) {
    int printing = depth < 0, d = printing ? -1 - depth : depth;
    if (d > WHALE_JINJA_MAX_DEPTH * 4) return jerr(c, WHALE_ERR_RANGE, "tojson: data nested too deeply");
    if (!item_sep) item_sep = indent > 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    char nb[40];
    switch (v->t) {
    case JV_UNDEF: return jb_put(c, b, printing ? "undefined" : "null", printing ? 9 : 4);
    case JV_NONE: return jb_put(c, b, "null", 4);
    case JV_BOOL: return jb_put(c, b, v->u.b ? "true" : "false", v->u.b ? 4 : 5);
    case JV_INT: snprintf(nb, sizeof nb, "%lld", v->u.i); return jb_put(c, b, nb, strlen(nb));
    case JV_FLOAT:
        if (!isfinite(v->u.f)) return jb_put(c, b, "null", 4);
        js_number(v->u.f, nb, sizeof nb);
        return jb_put(c, b, nb, strlen(nb));
    case JV_STR: return json_string(c, v->u.s.p, v->u.s.n, ensure_ascii, b);
    case JV_LIST:
    case JV_DICT:
    case JV_NS: break;
    default: return jerr(c, WHALE_ERR_FORMAT, "tojson: cannot convert a %s to JSON", jv_type_name(v->t));
    }
    int list = v->t == JV_LIST, n = list ? v->u.l->n : v->u.d->n;
    int *order = NULL;
    if (!list && n) {
        order = ja_alloc(c->a, (size_t)n * sizeof *order);
        if (!order) return jerr(c, WHALE_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++) order[i] = i;
        for (int i = 1; sort_keys && i < n; i++) /* insertion sort, stable */
            for (int j = i; j > 0; j--) {
                const jv *x = &v->u.d->k[order[j - 1]], *y = &v->u.d->k[order[j]];
                size_t m = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
                int r = memcmp(x->u.s.p, y->u.s.p, m);
                if (r < 0 || (r == 0 && x->u.s.n <= y->u.s.n)) break;
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
    }
    JTRY(jb_put(c, b, list ? "[" : "{", 1));
    for (int i = 0; i < n; i++) {
        if (i) JTRY(jb_put(c, b, item_sep, strlen(item_sep)));
        if (indent > 0) JTRY(json_newline(c, indent, d + 1, b));
        if (!list) {
            const jv *k = &v->u.d->k[order[i]];
            JTRY(json_string(c, k->u.s.p, k->u.s.n, ensure_ascii, b));
            JTRY(jb_put(c, b, key_sep, strlen(key_sep)));
        }
        const jv *item = list ? &v->u.l->v[i] : &v->u.d->v[order[i]];
        JTRY(jv_tojson(c, item, indent, item_sep, key_sep, ensure_ascii, sort_keys, printing ? -2 - d : d + 1, b));
    }
    if (indent > 0 && n) JTRY(json_newline(c, indent, d, b));
    return jb_put(c, b, list ? "]" : "}", 1);
}

/* ------------------------------------------------------------ equality, order, operators */

int jv_equal(const jv *a, const jv *b) {
    int an = a->t == JV_UNDEF || a->t == JV_NONE, bn = b->t == JV_UNDEF || b->t == JV_NONE;
    if (an || bn) return an && bn;
    int anum = is_num(a) || a->t == JV_BOOL, bnum = is_num(b) || b->t == JV_BOOL;
    if (anum && bnum) return num(a) == num(b);
    if (a->t == JV_STR && b->t == JV_STR) return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    if (a->t != b->t) return 0;
    switch (a->t) {
    case JV_LIST: return a->u.l == b->u.l;
    case JV_DICT:
    case JV_NS: return a->u.d == b->u.d;
    case JV_MACRO: return a->u.m == b->u.m;
    default: return 0;
    }
}

/* JavaScript's === on the values (the `in` operator on lists) */
static int strict_equal(const jv *a, const jv *b) {
    if (is_num(a) && is_num(b)) return num(a) == num(b);
    if (a->t != b->t) return 0;
    if (a->t == JV_BOOL) return a->u.b == b->u.b;
    return jv_equal(a, b);
}

static int ascii_lower(int ch) { return ch >= 'A' && ch <= 'Z' ? ch + 32 : ch; }

whale_code jv_compare(jctx *c, const jv *a, const jv *b, int case_sensitive, int *out) {
    int anum = is_num(a) || a->t == JV_BOOL, bnum = is_num(b) || b->t == JV_BOOL;
    if ((a->t == JV_NONE && b->t == JV_NONE) || (a->t == JV_UNDEF && b->t == JV_UNDEF)) {
        *out = 0;
        return WHALE_OK;
    }
    if (anum && bnum) {
        *out = num(a) < num(b) ? -1 : num(a) > num(b);
        return WHALE_OK;
    }
    if (a->t != JV_STR || b->t != JV_STR)
        return jerr(c, WHALE_ERR_FORMAT, "cannot compare a %s with a %s", jv_type_name(a->t), jv_type_name(b->t));
    size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    for (size_t i = 0; i < m; i++) {
        int x = (unsigned char)a->u.s.p[i], y = (unsigned char)b->u.s.p[i];
        if (!case_sensitive) x = ascii_lower(x), y = ascii_lower(y);
        if (x != y) {
            *out = x < y ? -1 : 1;
            return WHALE_OK;
        }
    }
    *out = a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    return WHALE_OK;
}

static whale_code concat(jctx *c, const jv *l, const jv *r, jv *out) {
    jv a, b;
    JTRY(raw_string(c, l, &a));
    JTRY(raw_string(c, r, &b));
    jbuf jb = {0};
    JTRY(jb_put(c, &jb, a.u.s.p, a.u.s.n));
    JTRY(jb_put(c, &jb, b.u.s.p, b.u.s.n));
    *out = jv_str(jb.p ? jb.p : "", jb.n);
    return WHALE_OK;
}

static whale_code arith(jctx *c, const char *op, size_t n, const jv *l, const jv *r, jv *out) {
    int flt = l->t == JV_FLOAT || r->t == JV_FLOAT;
    double a = num(l), b = num(r);
    if (eq(op, n, "<")) *out = jv_bool(a < b);
    else if (eq(op, n, ">")) *out = jv_bool(a > b);
    else if (eq(op, n, "<=")) *out = jv_bool(a <= b);
    else if (eq(op, n, ">=")) *out = jv_bool(a >= b);
    else if (eq(op, n, "/")) {
        if (b == 0) return jerr(c, WHALE_ERR_FORMAT, "division by zero");
        *out = (jv){.t = JV_FLOAT, .u.f = a / b};
    } else {
        double res;
        long long ir = 0;
        int ovf = 0;
        if ((eq(op, n, "//") || eq(op, n, "%")) && b == 0) return jerr(c, WHALE_ERR_FORMAT, "division by zero");
        if (eq(op, n, "+")) res = a + b, ovf = !flt && __builtin_add_overflow(l->u.i, r->u.i, &ir);
        else if (eq(op, n, "-")) res = a - b, ovf = !flt && __builtin_sub_overflow(l->u.i, r->u.i, &ir);
        else if (eq(op, n, "*")) res = a * b, ovf = !flt && __builtin_mul_overflow(l->u.i, r->u.i, &ir);
        else if (eq(op, n, "//")) res = floor(a / b), ir = (long long)res;
        else res = fmod(a, b), ir = flt ? 0 : l->u.i % r->u.i;
        if (ovf) return jerr(c, WHALE_ERR_RANGE, "integer overflow in '%.*s'", (int)n, op);
        *out = flt ? (jv){.t = JV_FLOAT, .u.f = res} : jv_int(ir);
    }
    return WHALE_OK;
}

static whale_code power(jctx *c, const jv *l, const jv *r, jv *out) {
    double a = num(l), b = num(r), res = pow(a, b);
    if (a == 0 && b < 0) return jerr(c, WHALE_ERR_FORMAT, "0 cannot be raised to a negative power");
    if (!isfinite(res)) return jerr(c, WHALE_ERR_RANGE, "'**' result is not a finite number");
    if (l->t == JV_FLOAT || r->t == JV_FLOAT || b < 0 || fabs(res) >= 9007199254740992.0)
        *out = (jv){.t = JV_FLOAT, .u.f = res};
    else *out = jv_int((long long)res);
    return WHALE_OK;
}

static whale_code contains(jctx *c, const jv *l, const jv *r, int *found) {
    if (r->t == JV_LIST) {
        *found = 0;
        for (int i = 0; i < r->u.l->n && !*found; i++) *found = strict_equal(&r->u.l->v[i], l);
    } else if (l->t == JV_STR && r->t == JV_STR) {
        *found = l->u.s.n == 0 || (r->u.s.n >= l->u.s.n && memmem(r->u.s.p, r->u.s.n, l->u.s.p, l->u.s.n));
    } else if (l->t == JV_STR && r->t == JV_DICT) {
        *found = jdict_get(r->u.d, l->u.s.p, l->u.s.n) != NULL;
    } else {
        return jerr(c, WHALE_ERR_FORMAT, "'in' is not defined between a %s and a %s", jv_type_name(l->t), jv_type_name(r->t));
    }
    return WHALE_OK;
}

whale_code jinja_binary(jctx *c, const char *op, size_t n, const jv *l, const jv *r, jv *out) {
    int in = eq(op, n, "in"), not_in = eq(op, n, "not in");
    if (eq(op, n, "==") || eq(op, n, "!=")) {
        *out = jv_bool(jv_equal(l, r) == eq(op, n, "=="));
        return WHALE_OK;
    }
    if (l->t == JV_UNDEF || r->t == JV_UNDEF) {
        if (r->t == JV_UNDEF && (in || not_in)) {
            *out = jv_bool(not_in);
            return WHALE_OK;
        }
        return jerr(c, WHALE_ERR_FORMAT, "'%.*s' on an undefined value (a variable or attribute that does not exist)", (int)n, op);
    }
    if (l->t == JV_NONE || r->t == JV_NONE) return jerr(c, WHALE_ERR_FORMAT, "'%.*s' on none", (int)n, op);
    if (eq(op, n, "~")) return concat(c, l, r, out);
    int lnum = is_num(l) || l->t == JV_BOOL, rnum = is_num(r) || r->t == JV_BOOL;
    if (eq(op, n, "**") && lnum && rnum) return power(c, l, r, out);
    if (is_num(l) && is_num(r) && !in && !not_in && !eq(op, n, "**")) return arith(c, op, n, l, r, out);
    if (eq(op, n, "+") && l->t == JV_LIST && r->t == JV_LIST) {
        JTRY(jv_newlist(c, out));
        for (int i = 0; i < l->u.l->n; i++) JTRY(jlist_push(c, out->u.l, l->u.l->v[i]));
        for (int i = 0; i < r->u.l->n; i++) JTRY(jlist_push(c, out->u.l, r->u.l->v[i]));
        return WHALE_OK;
    }
    if (eq(op, n, "+") && (l->t == JV_STR || r->t == JV_STR)) return concat(c, l, r, out);
    if (in || not_in) {
        int found = 0;
        JTRY(contains(c, l, r, &found));
        *out = jv_bool(found == in);
        return WHALE_OK;
    }
    return jerr(c, WHALE_ERR_FORMAT, "operator '%.*s' is not defined between a %s and a %s", (int)n, op,
                jv_type_name(l->t), jv_type_name(r->t));
}

/* ------------------------------------------------------------ string helpers */

static int utf8_len(unsigned char b) { return b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1; }

/* bytes of the whitespace character at p (JavaScript's \s), else 0 */
static int ws_at(const char *p, const char *end) {
    unsigned char ch = (unsigned char)p[0];
    if (ch == ' ' || (ch >= '\t' && ch <= '\r')) return 1;
    if (ch == 0xC2 && end - p >= 2 && (unsigned char)p[1] == 0xA0) return 2;
    if ((ch & 0xF0) != 0xE0 || end - p < 3) return 0;
    unsigned u = ((ch & 0x0Fu) << 12) | (((unsigned char)p[1] & 0x3Fu) << 6) | ((unsigned char)p[2] & 0x3Fu);
    return (u == 0x1680 || (u >= 0x2000 && u <= 0x200A) || u == 0x2028 || u == 0x2029 || u == 0x202F ||
            u == 0x205F || u == 0x3000 || u == 0xFEFF) ? 3 : 0;
}

/* does the character at p (len bytes) occur in chars? NULL chars: whitespace */
static int strippable(const char *p, int len, const char *end, const jv *chars) {
    if (!chars) return ws_at(p, end) == len;
    for (size_t k = 0; k < chars->u.s.n; k += (size_t)utf8_len((unsigned char)chars->u.s.p[k]))
        if (utf8_len((unsigned char)chars->u.s.p[k]) == len && !memcmp(chars->u.s.p + k, p, (size_t)len)) return 1;
    return 0;
}

static jv strip(const jv *s, int left, int right, const jv *chars) {
    const char *p = s->u.s.p, *e = p + s->u.s.n;
    while (left && p < e && strippable(p, utf8_len((unsigned char)*p), e, chars)) p += utf8_len((unsigned char)*p);
    while (right && e > p) {
        const char *q = e - 1;
        while (q > p && ((unsigned char)*q & 0xC0) == 0x80) q--;
        if (!strippable(q, (int)(e - q), e, chars)) break;
        e = q;
    }
    return jv_str(p, (size_t)(e - p));
}

static int is_word(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

/* The code point at p (of at most n bytes; *len its bytes); invalid bytes
 * stand for themselves. */
static unsigned utf8_at(const char *p, size_t n, int *len) {
    const unsigned char *s = (const unsigned char *)p;
    int l = utf8_len(s[0]);
    if ((size_t)l > n || l == 1) {
        *len = 1;
        return s[0];
    }
    unsigned u = s[0] & (0x7Fu >> l);
    for (int k = 1; k < l; k++) {
        if ((s[k] & 0xC0) != 0x80) { /* not a character: the byte alone */
            *len = 1;
            return s[0];
        }
        u = (u << 6) | (s[k] & 0x3Fu);
    }
    *len = l;
    return u;
}

static whale_code put_cp(jctx *c, jbuf *b, unsigned u) {
    char o[4];
    size_t k = 0;
    if (u < 0x80) o[k++] = (char)u;
    else if (u < 0x800) o[k++] = (char)(0xC0 | (u >> 6));
    else if (u < 0x10000) o[k++] = (char)(0xE0 | (u >> 12));
    else o[k++] = (char)(0xF0 | (u >> 18)), o[k++] = (char)(0x80 | ((u >> 12) & 0x3F));
    if (u >= 0x800) o[k++] = (char)(0x80 | ((u >> 6) & 0x3F));
    if (u >= 0x80) o[k++] = (char)(0x80 | (u & 0x3F));
    return jb_put(c, b, o, k);
}

/* Greek capital sigma lowers to final sigma after a cased letter and not
 * before one, as JavaScript's toLowerCase does. */
static unsigned lower_at(const char *p, const char *start, const char *e, unsigned u, int len) {
    if (u != 0x3A3) return jcase_lower(u);
    int before = 0, after = 0, l;
    if (p > start) {
        const char *q = p - 1;
        while (q > start && ((unsigned char)*q & 0xC0) == 0x80) q--;
        before = jcase_cased(utf8_at(q, (size_t)(p - q), &l));
    }
    if (p + len < e) after = jcase_cased(utf8_at(p + len, (size_t)(e - p - len), &l));
    return before && !after ? 0x3C2 : 0x3C3;
}

/* upper / lower (JavaScript's mapping, see jinja_case.c), title (the first
 * ASCII letter of each \w run, as @huggingface/jinja does), capitalize (the
 * first character) */
static whale_code recase(jctx *c, const jv *s, int how, jv *out) {
    jbuf b = {0};
    const char *p = s->u.s.p, *e = p + s->u.s.n;
    for (const char *q = p; q < e;) {
        int len;
        unsigned u = utf8_at(q, (size_t)(e - q), &len);
        int up = how == M_UPPER || (how == M_CAPITALIZE && q == p) ||
                 (how == M_TITLE && u < 0x80 && is_word((char)u) && (q == p || !is_word(q[-1])));
        if (how == M_TITLE && u >= 0x80) up = 0;
        if (len == 1 && u >= 0x80) JTRY(jb_put(c, &b, q, 1)); /* an invalid byte */
        else if (up && u == 0xDF) JTRY(jb_put(c, &b, "SS", 2));
        else JTRY(put_cp(c, &b, up ? jcase_upper(u) : how == M_LOWER ? lower_at(q, p, e, u, len) : u));
        q += len;
    }
    *out = jv_str(b.p ? b.p : "", b.n);
    return WHALE_OK;
}

static whale_code push_str(jctx *c, jv *list, const char *p, size_t n) {
    return jlist_push(c, list->u.l, jv_str(p, n));
}

/* Python's split / rsplit: sep none splits on whitespace runs */
static whale_code split(jctx *c, const jv *s, const jv *sep, long long maxsplit, int from_right, jv *out) {
    JTRY(jv_newlist(c, out));
    const char *p = s->u.s.p, *e = p + s->u.s.n;
    if (sep && sep->u.s.n == 0) return jerr(c, WHALE_ERR_FORMAT, "split: empty separator");
    if (!from_right) {
        long long done = 0;
        if (!sep) {
            jv t = strip(s, 1, 0, NULL);
            p = t.u.s.p;
        }
        while (p <= e) {
            const char *hit = NULL;
            size_t hl = 0;
            if (maxsplit < 0 || done < maxsplit) {
                if (sep) hit = memmem(p, (size_t)(e - p), sep->u.s.p, sep->u.s.n), hl = sep->u.s.n;
                else
                    for (const char *q = p; q < e && !hit; q += utf8_len((unsigned char)*q))
                        if ((hl = (size_t)ws_at(q, e))) hit = q;
            }
            if (!hit) {
                if (sep || p < e) JTRY(push_str(c, out, p, (size_t)(e - p)));
                break;
            }
            JTRY(push_str(c, out, p, (size_t)(hit - p)));
            done++;
            p = hit + hl;
            if (!sep) {
                jv rest = strip(&(jv){.t = JV_STR, .u.s = {p, (size_t)(e - p)}}, 1, 0, NULL);
                p = rest.u.s.p;
                if (p == e) break;
            }
        }
        return WHALE_OK;
    }
    if (!sep) return jerr(c, WHALE_ERR_UNSUPPORTED, "rsplit without a separator is not supported");
    /* from the right: collect pieces backwards, then reverse */
    long long done = 0;
    const char *end = e;
    for (;;) {
        const char *hit = NULL;
        if (maxsplit < 0 || done < maxsplit)
            for (const char *q = end - sep->u.s.n; q >= p && !hit; q--)
                if (!memcmp(q, sep->u.s.p, sep->u.s.n)) hit = q;
        if (!hit) {
            JTRY(push_str(c, out, p, (size_t)(end - p)));
            break;
        }
        JTRY(push_str(c, out, hit + sep->u.s.n, (size_t)(end - hit - sep->u.s.n)));
        done++;
        end = hit;
    }
    for (int i = 0, j = out->u.l->n - 1; i < j; i++, j--) {
        jv t = out->u.l->v[i];
        out->u.l->v[i] = out->u.l->v[j];
        out->u.l->v[j] = t;
    }
    return WHALE_OK;
}

static whale_code replace(jctx *c, const jv *s, const jv *from, const jv *to, long long count, jv *out) {
    jbuf b = {0};
    const char *p = s->u.s.p, *e = p + s->u.s.n;
    long long done = 0;
    if (from->u.s.n == 0) { /* between every character, as JavaScript does */
        for (;;) {
            if (count < 0 || done < count) {
                JTRY(jb_put(c, &b, to->u.s.p, to->u.s.n));
                done++;
            }
            if (p >= e) break;
            int l = utf8_len((unsigned char)*p);
            JTRY(jb_put(c, &b, p, (size_t)l));
            p += l;
        }
    } else {
        const char *hit;
        while ((count < 0 || done < count) && (hit = memmem(p, (size_t)(e - p), from->u.s.p, from->u.s.n))) {
            JTRY(jb_put(c, &b, p, (size_t)(hit - p)));
            JTRY(jb_put(c, &b, to->u.s.p, to->u.s.n));
            p = hit + from->u.s.n;
            done++;
        }
        JTRY(jb_put(c, &b, p, (size_t)(e - p)));
    }
    *out = jv_str(b.p ? b.p : "", b.n);
    return WHALE_OK;
}

static int starts(const jv *s, const jv *pre, int at_end) {
    if (pre->u.s.n > s->u.s.n) return 0;
    const char *p = at_end ? s->u.s.p + s->u.s.n - pre->u.s.n : s->u.s.p;
    return !memcmp(p, pre->u.s.p, pre->u.s.n);
}

/* ------------------------------------------------------------ arguments */

/* argument i, or keyword name, or NULL */
static const jv *arg(const jargs *a, int i, const char *name) {
    if (i >= 0 && i < a->npos) return &a->pos[i];
    for (int k = 0; name && k < a->nkw; k++)
        if (eq(a->kw[k], a->kwn[k], name)) return &a->kwv[k];
    return NULL;
}

static whale_code want(jctx *c, const jv *v, jv_type t, const char *what) {
    if (v && v->t != t && !(t == JV_FLOAT && v->t == JV_INT))
        return jerr(c, WHALE_ERR_FORMAT, "%s must be a %s, not a %s", what, jv_type_name(t), jv_type_name(v->t));
    return WHALE_OK;
}

/* ------------------------------------------------------------ methods */

static whale_code str_method(jctx *c, int id, const jv *s, jargs *a, jv *out) {
    const jv *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL);
    switch (id) {
    case M_UPPER:
    case M_LOWER:
    case M_TITLE:
    case M_CAPITALIZE: return recase(c, s, id, out);
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        if (a0 && a0->t != JV_NONE) JTRY(want(c, a0, JV_STR, "strip's argument"));
        *out = strip(s, id != M_RSTRIP, id != M_LSTRIP, a0 && a0->t == JV_STR ? a0 : NULL);
        return WHALE_OK;
    case M_STARTSWITH:
    case M_ENDSWITH:
        if (!a0) return jerr(c, WHALE_ERR_FORMAT, "%s() needs an argument", id == M_STARTSWITH ? "startswith" : "endswith");
        if (a0->t == JV_LIST) {
            int hit = 0;
            for (int i = 0; i < a0->u.l->n; i++) {
                JTRY(want(c, &a0->u.l->v[i], JV_STR, "startswith/endswith's tuple items"));
                hit |= starts(s, &a0->u.l->v[i], id == M_ENDSWITH);
            }
            *out = jv_bool(hit);
            return WHALE_OK;
        }
        JTRY(want(c, a0, JV_STR, "startswith/endswith's argument"));
        *out = jv_bool(starts(s, a0, id == M_ENDSWITH));
        return WHALE_OK;
    case M_SPLIT:
    case M_RSPLIT: {
        const jv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
        if (sep && sep->t != JV_NONE) JTRY(want(c, sep, JV_STR, "split's separator"));
        JTRY(want(c, mx, JV_INT, "split's maxsplit"));
        return split(c, s, sep && sep->t == JV_STR ? sep : NULL, mx ? mx->u.i : -1, id == M_RSPLIT, out);
    }
    case M_REPLACE: {
        const jv *cnt = arg(a, 2, "count");
        if (!a0 || !a1) return jerr(c, WHALE_ERR_FORMAT, "replace() needs two arguments");
        JTRY(want(c, a0, JV_STR, "replace's arguments"));
        JTRY(want(c, a1, JV_STR, "replace's arguments"));
        if (cnt && cnt->t != JV_NONE) JTRY(want(c, cnt, JV_INT, "replace's count"));
        return replace(c, s, a0, a1, cnt && cnt->t == JV_INT ? cnt->u.i : -1, out);
    }
    case M_FIND: {
        if (!a0) return jerr(c, WHALE_ERR_FORMAT, "find() needs an argument");
        JTRY(want(c, a0, JV_STR, "find's argument"));
        const char *hit = memmem(s->u.s.p, s->u.s.n, a0->u.s.p, a0->u.s.n);
        long long idx = -1;
        if (hit || a0->u.s.n == 0) {
            idx = 0;
            for (const char *q = s->u.s.p; q < (hit ? hit : s->u.s.p); q++) idx += ((unsigned char)*q & 0xC0) != 0x80;
        }
        *out = jv_int(idx);
        return WHALE_OK;
    }
    default: return jerr(c, WHALE_ERR_INTERNAL, "string method %d", id);
    }
}

static whale_code dict_pairs(jctx *c, const jv *d, int what, jv *out) {
    JTRY(jv_newlist(c, out));
    for (int i = 0; i < d->u.d->n; i++) {
        jv item;
        if (what == M_KEYS) item = d->u.d->k[i];
        else if (what == M_VALUES) item = d->u.d->v[i];
        else {
            JTRY(jv_newlist(c, &item));
            JTRY(jlist_push(c, item.u.l, d->u.d->k[i]));
            JTRY(jlist_push(c, item.u.l, d->u.d->v[i]));
        }
        JTRY(jlist_push(c, out->u.l, item));
    }
    return WHALE_OK;
}

static whale_code dict_method(jctx *c, int id, const jv *d, jargs *a, jv *out) {
    if (id != M_GET) return dict_pairs(c, d, id, out);
    const jv *k = arg(a, 0, NULL), *def = arg(a, 1, NULL);
    if (!k || k->t != JV_STR) return jerr(c, WHALE_ERR_FORMAT, "get() needs a string key");
    const jv *v = jdict_get(d->u.d, k->u.s.p, k->u.s.n);
    *out = v ? *v : def ? *def : (jv){.t = JV_NONE};
    return WHALE_OK;
}

static int find_name(const char *const *names, const char *s, size_t n) {
    for (int i = 0; names[i]; i++)
        if (eq(s, n, names[i])) return i;
    return -1;
}

static whale_code method(jctx *c, int id, const jv *self, jv *out) {
    jv *copy = ja_alloc(c->a, sizeof *copy);
    if (!copy) return jerr(c, WHALE_ERR_NOMEM, "out of memory");
    *copy = *self;
    *out = (jv){.t = JV_FUNC, .u.fn = {id, copy}};
    return WHALE_OK;
}

whale_code jinja_attr(jctx *c, const jv *obj, const char *name, size_t n, jv *out) {
    *out = (jv){.t = JV_UNDEF};
    int k;
    if (obj->t == JV_DICT || obj->t == JV_NS) {
        const jv *v = jdict_get(obj->u.d, name, n);
        if (v) *out = *v;
        else if (obj->t == JV_DICT && (k = find_name(dict_methods, name, n)) >= 0) return method(c, M_GET + k, obj, out);
    } else if (obj->t == JV_STR) {
        if (eq(name, n, "length")) *out = jv_int(jstr_len16(obj->u.s.p, obj->u.s.n));
        else if ((k = find_name(str_methods, name, n)) >= 0) return method(c, M_UPPER + k, obj, out);
    } else if (obj->t == JV_LIST) {
        if (eq(name, n, "length")) *out = jv_int(obj->u.l->n);
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ globals */

static whale_code fn_namespace(jctx *c, jargs *a, jv *out) {
    JTRY(jv_newdict(c, JV_NS, out));
    if (a->npos > 1) return jerr(c, WHALE_ERR_FORMAT, "namespace() takes at most one positional argument");
    if (a->npos == 1) {
        if (a->pos[0].t != JV_DICT) return jerr(c, WHALE_ERR_UNSUPPORTED, "namespace() from a %s is not supported", jv_type_name(a->pos[0].t));
        for (int i = 0; i < a->pos[0].u.d->n; i++)
            JTRY(jdict_set(c, out->u.d, a->pos[0].u.d->k[i].u.s.p, a->pos[0].u.d->k[i].u.s.n, a->pos[0].u.d->v[i]));
    }
    for (int i = 0; i < a->nkw; i++) JTRY(jdict_set(c, out->u.d, a->kw[i], a->kwn[i], a->kwv[i]));
    return WHALE_OK;
}

static whale_code fn_range(jctx *c, jargs *a, jv *out) {
    long long v[3] = {0, 0, 1};
    if (a->npos < 1 || a->npos > 3 || a->nkw) return jerr(c, WHALE_ERR_FORMAT, "range() takes 1 to 3 integers");
    for (int i = 0; i < a->npos; i++) {
        if (a->pos[i].t != JV_INT) return jerr(c, WHALE_ERR_FORMAT, "range() takes integers");
        v[a->npos == 1 ? 1 : i] = a->pos[i].u.i;
    }
    if (v[2] == 0) return jerr(c, WHALE_ERR_FORMAT, "range() step must not be zero");
    JTRY(jv_newlist(c, out));
    for (long long i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
        if (++c->steps > c->max_steps)
            return jerr(c, WHALE_ERR_RANGE, "more than %ld loop iterations and calls", c->max_steps);
        JTRY(jlist_push(c, out->u.l, jv_int(i)));
    }
    return WHALE_OK;
}

static whale_code fn_raise(jctx *c, jargs *a) {
    jv msg = {.t = JV_STR, .u.s = {"", 0}};
    if (a->npos > 0) JTRY(jv_to_string(c, &a->pos[0], &msg));
    return jerr(c, WHALE_ERR_FORMAT, "raise_exception: %.*s", msg.u.s.n > 400 ? 400 : (int)msg.u.s.n, msg.u.s.p);
}

/* The instant strftime_now prints: SOURCE_DATE_EPOCH (seconds, in UTC) when
 * set, as reproducible builds define it, else now in local time. */
static void now_tm(struct tm *tm) {
    const char *sde = getenv("SOURCE_DATE_EPOCH");
    char *end = NULL;
    long long e = sde && *sde ? strtoll(sde, &end, 10) : -1;
    if (end && !*end && e >= 0 && e < 253402300800LL) { /* before year 10000 */
        time_t t = (time_t)e;
        gmtime_r(&t, tm);
        return;
    }
    time_t now = time(NULL);
    localtime_r(&now, tm);
}

/* strftime_now(format): %Y %m %d %b %B %H %M %% of now (above), in English */
static whale_code fn_strftime(jctx *c, jargs *a, jv *out) {
    if (a->npos < 1 || a->pos[0].t != JV_STR) return jerr(c, WHALE_ERR_FORMAT, "strftime_now() needs a format string");
    struct tm tm;
    now_tm(&tm);
    static const char *const months[] = {"January", "February", "March", "April", "May", "June", "July",
                                         "August", "September", "October", "November", "December"};
    jbuf b = {0};
    const char *f = a->pos[0].u.s.p;
    size_t n = a->pos[0].u.s.n;
    for (size_t i = 0; i < n; i++) {
        char t[32];
        t[0] = 0;
        if (f[i] == '%' && i + 1 < n && strchr("YmdbBHM%", f[i + 1])) {
            char k = f[++i];
            if (k == 'Y') snprintf(t, sizeof t, "%d", tm.tm_year + 1900);
            else if (k == 'm') snprintf(t, sizeof t, "%02d", tm.tm_mon + 1);
            else if (k == 'd') snprintf(t, sizeof t, "%02d", tm.tm_mday);
            else if (k == 'b') snprintf(t, sizeof t, "%.3s", months[tm.tm_mon]);
            else if (k == 'B') snprintf(t, sizeof t, "%s", months[tm.tm_mon]);
            else if (k == 'H') snprintf(t, sizeof t, "%02d", tm.tm_hour);
            else if (k == 'M') snprintf(t, sizeof t, "%02d", tm.tm_min);
            else snprintf(t, sizeof t, "%%");
            JTRY(jb_put(c, &b, t, strlen(t)));
        } else {
            JTRY(jb_put(c, &b, f + i, 1));
        }
    }
    *out = jv_str(b.p ? b.p : "", b.n);
    return WHALE_OK;
}

whale_code jinja_call_builtin(jctx *c, const jv *fn, jargs *a, jv *out) {
    int id = fn->u.fn.id;
    const jv *self = fn->u.fn.self;
    switch (id) {
    case F_NAMESPACE: return fn_namespace(c, a, out);
    case F_RANGE: return fn_range(c, a, out);
    case F_RAISE: return fn_raise(c, a);
    case F_STRFTIME: return fn_strftime(c, a, out);
    default: break;
    }
    if (id >= M_GET) return dict_method(c, id, self, a, out);
    return str_method(c, id, self, a, out);
}

whale_code jinja_globals(jctx *c, jdict *d) {
    static const char *const names[] = {"namespace", "range", "raise_exception", "strftime_now"};
    for (int i = 0; i < 4; i++) JTRY(jdict_set(c, d, names[i], strlen(names[i]), (jv){.t = JV_FUNC, .u.fn = {i, NULL}}));
    static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
    for (int i = 0; i < 6; i++)
        JTRY(jdict_set(c, d, consts[i], strlen(consts[i]), i < 4 ? jv_bool(i < 2) : (jv){.t = JV_NONE}));
    return WHALE_OK;
}

/* ------------------------------------------------------------ tests */

whale_code jinja_test(jctx *c, const char *name, size_t n, const jv *v, const jv *arg_, int *out) {
    jv_type t = v->t;
    if (eq(name, n, "defined")) *out = t != JV_UNDEF;
    else if (eq(name, n, "undefined")) *out = t == JV_UNDEF;
    else if (eq(name, n, "none")) *out = t == JV_NONE;
    else if (eq(name, n, "boolean")) *out = t == JV_BOOL;
    else if (eq(name, n, "true")) *out = t == JV_BOOL && v->u.b;
    else if (eq(name, n, "false")) *out = t == JV_BOOL && !v->u.b;
    else if (eq(name, n, "string")) *out = t == JV_STR;
    else if (eq(name, n, "number")) *out = t == JV_INT || t == JV_FLOAT;
    else if (eq(name, n, "integer")) *out = t == JV_INT;
    else if (eq(name, n, "iterable")) *out = t == JV_LIST || t == JV_STR;
    else if (eq(name, n, "mapping")) *out = t == JV_DICT;
    else if (eq(name, n, "sequence")) *out = t == JV_LIST || t == JV_DICT || t == JV_STR;
    else if (eq(name, n, "callable")) *out = t == JV_FUNC || t == JV_MACRO;
    else if (eq(name, n, "equalto") || eq(name, n, "eq")) *out = arg_ ? strict_equal(v, arg_) : t == JV_UNDEF;
    else if (eq(name, n, "odd") || eq(name, n, "even")) {
        if (t != JV_INT) return jerr(c, WHALE_ERR_FORMAT, "test '%.*s' needs an integer, not a %s", (int)n, name, jv_type_name(t));
        *out = (v->u.i % 2 != 0) == eq(name, n, "odd");
    } else if (eq(name, n, "lower") || eq(name, n, "upper")) {
        int up = eq(name, n, "upper"), ok = t == JV_STR;
        for (size_t i = 0; ok && i < v->u.s.n; i++) {
            char ch = v->u.s.p[i];
            ok = up ? !(ch >= 'a' && ch <= 'z') : !(ch >= 'A' && ch <= 'Z');
        }
        *out = ok;
    } else {
        return jerr(c, WHALE_ERR_UNSUPPORTED, "test '%.*s' is not supported", (int)n, name);
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ filters */

static whale_code filter_type(jctx *c, const char *name, size_t n, const jv *v) {
    return jerr(c, WHALE_ERR_FORMAT, "filter '%.*s' cannot be applied to a %s", (int)n, name, jv_type_name(v->t));
}

static whale_code f_tojson(jctx *c, const jv *v, jargs *a, jv *out) {
    const jv *ind = arg(a, -1, "indent"), *ea = arg(a, -1, "ensure_ascii"), *sk = arg(a, -1, "sort_keys"),
             *sep = arg(a, -1, "separators");
    if (ind && ind->t != JV_NONE) JTRY(want(c, ind, JV_INT, "tojson's indent"));
    JTRY(want(c, ea, JV_BOOL, "tojson's ensure_ascii"));
    JTRY(want(c, sk, JV_BOOL, "tojson's sort_keys"));
    char *seps[2] = {NULL, NULL};
    if (sep && sep->t != JV_NONE) {
        if (sep->t != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != JV_STR || sep->u.l->v[1].t != JV_STR)
            return jerr(c, WHALE_ERR_FORMAT, "tojson's separators must be two strings");
        for (int i = 0; i < 2; i++) {
            jv z;
            JTRY(jv_strdup(c, sep->u.l->v[i].u.s.p, sep->u.l->v[i].u.s.n, &z));
            seps[i] = (char *)z.u.s.p;
        }
    }
    jbuf b = {0};
    int indent = ind && ind->t == JV_INT ? (int)(ind->u.i > 64 ? 64 : ind->u.i) : -1;
    JTRY(jv_tojson(c, v, indent, seps[0], seps[1], ea && ea->u.b, sk && sk->u.b, 0, &b));
    *out = jv_str(b.p ? b.p : "", b.n);
    return WHALE_OK;
}

static whale_code f_join(jctx *c, const jv *v, jargs *a, jv *out) {
    const jv *sep = arg(a, 0, "d");
    if (!sep) sep = arg(a, -1, "separator");
    JTRY(want(c, sep, JV_STR, "join's separator"));
    if (v->t == JV_STR && !sep) {
        *out = *v;
        return WHALE_OK;
    }
    if (v->t != JV_LIST) return filter_type(c, "join", 4, v);
    jbuf b = {0};
    for (int i = 0; i < v->u.l->n; i++) {
        if (i && sep) JTRY(jb_put(c, &b, sep->u.s.p, sep->u.s.n));
        jv s;
        JTRY(jv_to_string(c, &v->u.l->v[i], &s));
        JTRY(jb_put(c, &b, s.u.s.p, s.u.s.n));
    }
    *out = jv_str(b.p ? b.p : "", b.n);
    return WHALE_OK;
}

static whale_code f_indent(jctx *c, const jv *v, jargs *a, jv *out) {
    const jv *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    JTRY(want(c, w, JV_INT, "indent's width"));
    if (v->t != JV_STR) return filter_type(c, "indent", 6, v);
    long long width = w ? w->u.i : 4;
    if (width < 0 || width > 1024) return jerr(c, WHALE_ERR_RANGE, "indent width %lld out of range", width);
    jbuf b = {0};
    const char *p = v->u.s.p, *e = p + v->u.s.n;
    for (int line = 0;; line++) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        const char *le = nl ? nl : e;
        int pad = (line > 0 || (first && jv_truthy(first))) && (le > p || (blank && jv_truthy(blank)));
        for (long long i = 0; pad && i < width; i++) JTRY(jb_put(c, &b, " ", 1));
        JTRY(jb_put(c, &b, p, (size_t)(le - p)));
        if (!nl) break;
        JTRY(jb_put(c, &b, "\n", 1));
        p = nl + 1;
    }
    *out = jv_str(b.p ? b.p : "", b.n);
    return WHALE_OK;
}

/* selectattr / rejectattr(attribute[, test[, value]]) over a list of dicts */
static whale_code f_select(jctx *c, const jv *v, jargs *a, int select, jv *out) {
    const char *name = select ? "selectattr" : "rejectattr";
    if (v->t != JV_LIST) return filter_type(c, name, strlen(name), v);
    const jv *attr = arg(a, 0, NULL), *test = arg(a, 1, NULL), *val = arg(a, 2, NULL);
    if (!attr || attr->t != JV_STR || (test && test->t != JV_STR) || (val && val->t != JV_STR) || a->nkw)
        return jerr(c, WHALE_ERR_FORMAT, "%s takes an attribute name, a test name and a value, as strings", name);
    JTRY(jv_newlist(c, out));
    for (int i = 0; i < v->u.l->n; i++) {
        const jv *item = &v->u.l->v[i];
        if (item->t != JV_DICT && item->t != JV_NS) return jerr(c, WHALE_ERR_FORMAT, "%s: the list holds a %s, not dicts", name, jv_type_name(item->t));
        const jv *x = jdict_get(item->u.d, attr->u.s.p, attr->u.s.n);
        int r = 0;
        if (x && test) JTRY(jinja_test(c, test->u.s.p, test->u.s.n, x, val, &r));
        else if (x) r = jv_truthy(x);
        if (r == select) JTRY(jlist_push(c, out->u.l, *item));
    }
    return WHALE_OK;
}

/* select / reject([test[, value]]) over a list: the items that pass the
 * test (or are truthy without one), or that fail it; Python's Jinja has
 * them (Llama 3.1's template rejects 'code_interpreter'), @huggingface/jinja
 * does not. */
static whale_code f_select_items(jctx *c, const jv *v, jargs *a, int select, jv *out) {
    const char *name = select ? "select" : "reject";
    if (v->t != JV_LIST) return filter_type(c, name, strlen(name), v);
    const jv *test = arg(a, 0, NULL), *val = arg(a, 1, NULL);
    if ((test && test->t != JV_STR) || a->npos > 2 || a->nkw)
        return jerr(c, WHALE_ERR_FORMAT, "%s takes a test name and at most one value", name);
    JTRY(jv_newlist(c, out));
    for (int i = 0; i < v->u.l->n; i++) {
        const jv *item = &v->u.l->v[i];
        int r = 0;
        if (test) JTRY(jinja_test(c, test->u.s.p, test->u.s.n, item, val, &r));
        else r = jv_truthy(item);
        if (r == select) JTRY(jlist_push(c, out->u.l, *item));
    }
    return WHALE_OK;
}

/* attribute path "a.b.0" of a value (undefined when missing) */
static jv attr_path(const jv *item, const char *p, size_t n) {
    jv v = *item;
    const char *e = p + n;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        const char *pe = dot ? dot : e;
        if (v.t == JV_DICT || v.t == JV_NS) {
            const jv *x = jdict_get(v.u.d, p, (size_t)(pe - p));
            if (!x) return (jv){.t = JV_UNDEF};
            v = *x;
        } else if (v.t == JV_LIST) {
            char num_[24];
            snprintf(num_, sizeof num_, "%.*s", (int)(pe - p > 20 ? 20 : pe - p), p);
            char *end;
            long idx = strtol(num_, &end, 10);
            if (end == num_ || idx < 0 || idx >= v.u.l->n) return (jv){.t = JV_UNDEF};
            v = v.u.l->v[idx];
        } else {
            return (jv){.t = JV_UNDEF};
        }
        if (!dot) break;
        p = dot + 1;
    }
    return v;
}

static whale_code f_map(jctx *c, const jv *v, jargs *a, jv *out) {
    const jv *attr = arg(a, -1, "attribute"), *def = arg(a, -1, "default");
    if (!attr) return jerr(c, WHALE_ERR_UNSUPPORTED, "filter 'map' without attribute= is not supported");
    JTRY(want(c, attr, JV_STR, "map's attribute"));
    if (v->t != JV_LIST) return filter_type(c, "map", 3, v);
    JTRY(jv_newlist(c, out));
    for (int i = 0; i < v->u.l->n; i++) {
        const jv *item = &v->u.l->v[i];
        if (item->t != JV_DICT && item->t != JV_NS) return jerr(c, WHALE_ERR_FORMAT, "map: the list holds a %s, not dicts", jv_type_name(item->t));
        jv x = attr_path(item, attr->u.s.p, attr->u.s.n);
        if (x.t == JV_UNDEF && def) x = *def;
        JTRY(jlist_push(c, out->u.l, x));
    }
    return WHALE_OK;
}

static whale_code f_sort(jctx *c, const jv *v, jargs *a, jv *out) {
    const jv *rev = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *attr = arg(a, 2, "attribute");
    if (v->t != JV_LIST) return filter_type(c, "sort", 4, v);
    JTRY(jv_newlist(c, out));
    for (int i = 0; i < v->u.l->n; i++) JTRY(jlist_push(c, out->u.l, v->u.l->v[i]));
    jv *x = out->u.l->v;
    for (int i = 1; i < out->u.l->n; i++) /* stable insertion sort; lists in templates are short */
        for (int j = i; j > 0; j--) {
            JTRY(c->steps++ > c->max_steps ? jerr(c, WHALE_ERR_RANGE, "sort: list too long") : WHALE_OK);
            jv ka = x[j - 1], kb = x[j];
            if (attr && attr->t == JV_STR) ka = attr_path(&x[j - 1], attr->u.s.p, attr->u.s.n), kb = attr_path(&x[j], attr->u.s.p, attr->u.s.n);
            int r = 0;
            JTRY(jv_compare(c, &ka, &kb, cs && jv_truthy(cs), &r));
            if (rev && jv_truthy(rev)) r = -r;
            if (r <= 0) break;
            jv t = x[j];
            x[j] = x[j - 1];
            x[j - 1] = t;
        }
    return WHALE_OK;
}

static whale_code f_unique(jctx *c, const jv *v, jv *out) {
    if (v->t != JV_LIST) return filter_type(c, "unique", 6, v);
    JTRY(jv_newlist(c, out));
    for (int i = 0; i < v->u.l->n; i++) {
        int seen = 0;
        for (int j = 0; j < out->u.l->n && !seen; j++) seen = strict_equal(&out->u.l->v[j], &v->u.l->v[i]);
        if (!seen) JTRY(jlist_push(c, out->u.l, v->u.l->v[i]));
    }
    return WHALE_OK;
}

static whale_code f_number(jctx *c, const char *name, size_t n, const jv *v, jargs *a, jv *out) {
    int to_int = eq(name, n, "int");
    const jv *def = arg(a, 0, "default");
    if (v->t == JV_STR) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*s", v->u.s.n > 60 ? 60 : (int)v->u.s.n, v->u.s.p);
        char *end;
        const char *p = buf;
        while (*p == ' ' || (*p >= '\t' && *p <= '\r')) p++;
        double d = to_int ? (double)strtoll(p, &end, 10) : strtod(p, &end);
        if (end == p) *out = def ? *def : to_int ? jv_int(0) : (jv){.t = JV_FLOAT, .u.f = 0};
        else *out = to_int ? jv_int((long long)d) : (jv){.t = JV_FLOAT, .u.f = d};
    } else if (v->t == JV_BOOL) {
        *out = to_int ? jv_int(v->u.b) : (jv){.t = JV_FLOAT, .u.f = v->u.b};
    } else if (is_num(v)) {
        *out = to_int ? jv_int((long long)floor(num(v))) : (jv){.t = JV_FLOAT, .u.f = num(v)};
    } else {
        return filter_type(c, name, n, v);
    }
    return WHALE_OK;
}

static whale_code f_length(jctx *c, const char *name, size_t n, const jv *v, jv *out) {
    if (v->t == JV_STR) *out = jv_int(jstr_len16(v->u.s.p, v->u.s.n));
    else if (v->t == JV_LIST) *out = jv_int(v->u.l->n);
    else if (v->t == JV_DICT) *out = jv_int(v->u.d->n);
    else return filter_type(c, name, n, v);
    return WHALE_OK;
}

static whale_code f_simple(jctx *c, const char *name, size_t n, jv *v, jargs *a, jv *out, int *done) {
    *done = 1;
    if (eq(name, n, "safe")) *out = *v;
    else if (eq(name, n, "tojson")) return f_tojson(c, v, a, out);
    else if (eq(name, n, "length") || eq(name, n, "count")) return f_length(c, name, n, v, out);
    else if (eq(name, n, "string")) {
        if (v->t == JV_UNDEF || v->t == JV_NONE) return filter_type(c, name, n, v);
        if (v->t == JV_LIST) {
            jbuf b = {0};
            JTRY(jv_tojson(c, v, -1, NULL, NULL, 0, 0, -1, &b));
            *out = jv_str(b.p ? b.p : "", b.n);
            return WHALE_OK;
        }
        return jv_to_string(c, v, out);
    } else if (eq(name, n, "default") || eq(name, n, "d")) {
        const jv *def = arg(a, 0, NULL), *boolean = arg(a, 1, "boolean");
        int use = v->t == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(v));
        *out = use ? (def ? *def : jv_str("", 0)) : *v;
    } else if (eq(name, n, "int") || eq(name, n, "float")) return f_number(c, name, n, v, a, out);
    else if (eq(name, n, "join")) return f_join(c, v, a, out);
    else if (eq(name, n, "map")) return f_map(c, v, a, out);
    else if (eq(name, n, "selectattr") || eq(name, n, "rejectattr")) return f_select(c, v, a, eq(name, n, "selectattr"), out);
    else if (eq(name, n, "select") || eq(name, n, "reject")) return f_select_items(c, v, a, eq(name, n, "select"), out);
    else if (eq(name, n, "sort")) return f_sort(c, v, a, out);
    else if (eq(name, n, "unique")) return f_unique(c, v, out);
    else if (eq(name, n, "indent")) return f_indent(c, v, a, out);
    else *done = 0;
    return WHALE_OK;
}

/* Python's str() of a scalar, as Jinja's string filters see it: None, True, 3, 2.5 */
static whale_code python_str(jctx *c, const char *name, size_t n, const jv *v, jv *out) {
    char b[48];
    if (v->t == JV_UNDEF) b[0] = 0; /* str() of Jinja's Undefined */
    else if (v->t == JV_NONE) snprintf(b, sizeof b, "None");
    else if (v->t == JV_BOOL) snprintf(b, sizeof b, "%s", v->u.b ? "True" : "False");
    else if (v->t == JV_INT) snprintf(b, sizeof b, "%lld", v->u.i);
    else if (v->t == JV_FLOAT && v->u.f == floor(v->u.f) && fabs(v->u.f) < 1e16) snprintf(b, sizeof b, "%.1f", v->u.f);
    else if (v->t == JV_FLOAT) js_number(v->u.f, b, sizeof b);
    else return filter_type(c, name, n, v);
    return jv_strdup(c, b, strlen(b), out);
}

static whale_code f_list_item(jctx *c, const char *name, size_t n, const jv *v, jv *out) {
    if (v->t != JV_LIST) return filter_type(c, name, n, v);
    int first = eq(name, n, "first");
    if (eq(name, n, "list")) *out = *v;
    else if (eq(name, n, "reverse")) {
        JTRY(jv_newlist(c, out));
        for (int i = v->u.l->n - 1; i >= 0; i--) JTRY(jlist_push(c, out->u.l, v->u.l->v[i]));
    } else *out = v->u.l->n ? v->u.l->v[first ? 0 : v->u.l->n - 1] : (jv){.t = JV_UNDEF};
    return WHALE_OK;
}

whale_code jinja_filter(jctx *c, const char *name, size_t n, jv *v, jargs *a, jv *out) {
    int done;
    JTRY(f_simple(c, name, n, v, a, out, &done));
    if (done) return WHALE_OK;
    static const char *const list_filters[] = {"list", "first", "last", "reverse", NULL};
    if (find_name(list_filters, name, n) >= 0) return f_list_item(c, name, n, v, out);
    static const char *const str_filters[] = {"upper", "lower", "title", "capitalize", "trim", "replace", NULL};
    static const int ids[] = {M_UPPER, M_LOWER, M_TITLE, M_CAPITALIZE, M_STRIP, M_REPLACE};
    int k = find_name(str_filters, name, n);
    if (k >= 0) {
        jv s = *v;
        if (v->t != JV_STR) JTRY(python_str(c, name, n, v, &s)); /* Jinja filters take str(value) */
        return str_method(c, ids[k], &s, a, out);
    }
    if (eq(name, n, "items") || eq(name, n, "keys") || eq(name, n, "values")) {
        if (v->t != JV_DICT) return filter_type(c, name, n, v);
        return dict_pairs(c, v, eq(name, n, "items") ? M_ITEMS : eq(name, n, "keys") ? M_KEYS : M_VALUES, out);
    }
    if (eq(name, n, "abs")) {
        if (!is_num(v)) return filter_type(c, name, n, v);
        *out = v->t == JV_INT ? jv_int(v->u.i < 0 ? -v->u.i : v->u.i) : (jv){.t = JV_FLOAT, .u.f = fabs(v->u.f)};
        return WHALE_OK;
    }
    return jerr(c, WHALE_ERR_UNSUPPORTED, "filter '%.*s' is not supported", (int)n, name);
}
