/* Jinja parser: tokens to a syntax tree, with @huggingface/jinja's grammar
 * and precedence (filters and tests bind tighter than arithmetic, `not`
 * looser than comparisons). Statements it does not implement are refused
 * here, by name and line. */
#include "io/jinja_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    jarena *a;
    const jtok *t;
    int pos, n;
    int depth;
    whale_err *err;
} parser;

static const jtok *cur(const parser *P) { return &P->t[P->pos]; }

static whale_code perr(const parser *P, whale_code code, const char *what, const char *detail) {
    const jtok *k = cur(P);
    return whale_errf(P->err, code, "chat template line %d: %s%s", k->line, what, detail ? detail : "");
}

/* "got 'x'" for the current token */
static whale_code perr_got(const parser *P, const char *expected) {
    const jtok *k = cur(P);
    if (k->type == T_END)
        return whale_errf(P->err, WHALE_ERR_FORMAT, "chat template line %d: %s, got the end of the template", k->line,
                          expected);
    if (k->type == T_TEXT)
        return whale_errf(P->err, WHALE_ERR_FORMAT, "chat template line %d: %s, got text (is a tag unterminated?)",
                          k->line, expected);
    return whale_errf(P->err, WHALE_ERR_FORMAT, "chat template line %d: %s, got '%.*s'", k->line, expected,
                      k->n > 40 ? 40 : (int)k->n, k->s);
}

static int is_name(const parser *P, int off, const char *name) {
    if (P->pos + off >= P->n) return 0;
    const jtok *k = &P->t[P->pos + off];
    return k->type == T_NAME && k->n == strlen(name) && !memcmp(k->s, name, k->n);
}

static int is_type(const parser *P, jtok_type t) { return cur(P)->type == t; }

static whale_code expect(parser *P, jtok_type t, const char *what) {
    if (!is_type(P, t)) return perr_got(P, what);
    P->pos++;
    return WHALE_OK;
}

static whale_code expect_name(parser *P, const char *name) {
    if (!is_name(P, 0, name)) {
        char what[64];
        snprintf(what, sizeof what, "expected '%s'", name);
        return perr_got(P, what);
    }
    P->pos++;
    return WHALE_OK;
}

static whale_code new_node(parser *P, jnode_kind kind, jnode **out) {
    jnode *n = ja_alloc(P->a, sizeof *n);
    *out = n;
    if (!n) return whale_errf(P->err, WHALE_ERR_NOMEM, "chat template: out of memory parsing");
    n->kind = kind;
    n->line = cur(P)->line;
    *out = n;
    return WHALE_OK;
}

static whale_code add(parser *P, jnodes *l, jnode *x) {
    /* grow by doubling: capacity is the next power of two above n */
    if ((l->n & (l->n - 1)) == 0) {
        int cap = l->n ? l->n * 2 : 1;
        jnode **v = ja_alloc(P->a, (size_t)cap * sizeof *v);
        if (!v) return whale_errf(P->err, WHALE_ERR_NOMEM, "chat template: out of memory parsing");
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
    }
    l->v[l->n++] = x;
    return WHALE_OK;
}

/* x gets child's height + 1; chains (a + b + c, x|f|g, a.b.c) are built in
 * loops, not by recursion, so their height is checked here. */
static whale_code grow(parser *P, jnode *x, const jnode *child) {
    int h = child ? child->height + 1 : 1;
    if (h > x->height) x->height = h;
    if (x->height > 4 * WHALE_JINJA_MAX_DEPTH)
        return perr(P, WHALE_ERR_UNSUPPORTED, "an expression nested deeper than the limit of 256", NULL);
    return WHALE_OK;
}

static whale_code enter(parser *P) {
    if (++P->depth > WHALE_JINJA_MAX_DEPTH)
        return perr(P, WHALE_ERR_UNSUPPORTED, "nesting deeper than the limit of 64", NULL);
    return WHALE_OK;
}

/* ------------------------------------------------------------ expressions */

static whale_code parse_expr(parser *P, jnode **out);
static whale_code parse_or(parser *P, jnode **out);
static whale_code parse_primary(parser *P, jnode **out);
static whale_code parse_member(parser *P, jnode **x);

/* "(" args ")" into l: expressions and name=value (N_KWARG). params: a
 * macro's parameter list (names, name=default). */
static whale_code parse_args(parser *P, jnode *owner, jnodes *l, int params) {
    JTRY(expect(P, T_LPAREN, "expected '('"));
    int kw_seen = 0;
    while (!is_type(P, T_RPAREN)) {
        if (is_type(P, T_MUL) || is_type(P, T_POW))
            return perr(P, WHALE_ERR_UNSUPPORTED, "argument unpacking (* / **) is not supported", NULL);
        jnode *x;
        JTRY(parse_expr(P, &x));
        if (is_type(P, T_ASSIGN)) {
            if (x->kind != N_NAME) return perr(P, WHALE_ERR_FORMAT, "expected a name before '='", NULL);
            P->pos++;
            jnode *k;
            JTRY(new_node(P, N_KWARG, &k));
            k->s = x->s;
            k->n = x->n;
            JTRY(parse_expr(P, &k->a));
            JTRY(grow(P, k, k->a));
            x = k;
            kw_seen = 1;
        } else if (kw_seen) {
            return perr(P, WHALE_ERR_FORMAT, "a positional argument after a keyword argument", NULL);
        } else if (params && x->kind != N_NAME) {
            return perr(P, WHALE_ERR_FORMAT, "expected a parameter name", NULL);
        }
        JTRY(grow(P, owner, x));
        JTRY(add(P, l, x));
        if (is_type(P, T_COMMA)) P->pos++;
        else if (!is_type(P, T_RPAREN)) return perr_got(P, "expected ',' or ')'");
    }
    P->pos++;
    return WHALE_OK;
}

/* "[" index or slice "]" after obj */
static whale_code parse_subscript(parser *P, jnode *obj, jnode **out) {
    jnode *part[3] = {NULL, NULL, NULL};
    int n = 0, slice = 0;
    while (!is_type(P, T_RBRACK)) {
        if (n >= 3) return perr(P, WHALE_ERR_FORMAT, "a slice takes at most 3 parts", NULL);
        if (is_type(P, T_COLON)) {
            n++;
            P->pos++;
            slice = 1;
            continue;
        }
        JTRY(parse_expr(P, &part[n]));
        n++;
        if (is_type(P, T_COLON)) {
            P->pos++;
            slice = 1;
        } else if (!is_type(P, T_RBRACK)) {
            return perr_got(P, "expected ':' or ']'");
        }
    }
    if (n == 0 && !slice) return perr(P, WHALE_ERR_FORMAT, "empty subscript []", NULL);
    P->pos++;
    jnode *x;
    JTRY(new_node(P, slice ? N_SLICE : N_INDEX, &x));
    x->a = obj;
    JTRY(grow(P, x, obj));
    for (int i = 0; i < 3; i++)
        if (part[i]) JTRY(grow(P, x, part[i]));
    if (slice) {
        JTRY(add(P, &x->args, part[0]));
        JTRY(add(P, &x->args, part[1]));
        JTRY(add(P, &x->args, part[2]));
    } else {
        x->b = part[0];
    }
    *out = x;
    return WHALE_OK;
}

/* .name, [index], [a:b:c] and calls after a primary expression */
static whale_code parse_member(parser *P, jnode **x) {
    for (;;) {
        if (is_type(P, T_DOT)) {
            P->pos++;
            const jtok *k = cur(P);
            if (k->type != T_NAME && !(k->type == T_NUM && !memchr(k->s, '.', k->n) && k->s[0] != '-'))
                return perr_got(P, "expected a name after '.'");
            jnode *m;
            JTRY(new_node(P, k->type == T_NAME ? N_ATTR : N_INDEX, &m));
            m->a = *x;
            JTRY(grow(P, m, *x));
            if (k->type == T_NAME) {
                m->s = k->s;
                m->n = k->n;
            } else {
                JTRY(new_node(P, N_LIT, &m->b));
                m->b->lit = jv_int(strtoll(k->s, NULL, 10));
            }
            P->pos++;
            *x = m;
        } else if (is_type(P, T_LBRACK)) {
            P->pos++;
            JTRY(parse_subscript(P, *x, x));
        } else if (is_type(P, T_LPAREN)) {
            jnode *c;
            JTRY(new_node(P, N_CALL, &c));
            c->a = *x;
            JTRY(grow(P, c, *x));
            JTRY(parse_args(P, c, &c->args, 0));
            *x = c;
        } else {
            return WHALE_OK;
        }
    }
}

static whale_code parse_unary(parser *P, jnode **out) {
    const jtok *k = cur(P);
    if ((k->type == T_UNARY || k->type == T_ADD) && k->n == 1 && (k->s[0] == '-' || k->s[0] == '+')) {
        JTRY(enter(P));
        jnode *x;
        JTRY(new_node(P, k->s[0] == '-' ? N_NEG : N_POS, &x));
        P->pos++;
        JTRY(parse_unary(P, &x->a));
        JTRY(grow(P, x, x->a));
        P->depth--;
        *out = x;
        return WHALE_OK;
    }
    JTRY(parse_primary(P, out));
    return parse_member(P, out);
}

static whale_code parse_filter(parser *P, jnode **out) {
    JTRY(parse_unary(P, out));
    while (is_type(P, T_PIPE)) {
        P->pos++;
        if (!is_type(P, T_NAME)) return perr_got(P, "expected a filter name after '|'");
        jnode *f;
        JTRY(new_node(P, N_FILTER, &f));
        f->a = *out;
        JTRY(grow(P, f, *out));
        f->s = cur(P)->s;
        f->n = cur(P)->n;
        P->pos++;
        if (is_type(P, T_LPAREN)) JTRY(parse_args(P, f, &f->args, 0));
        *out = f;
    }
    return WHALE_OK;
}

static whale_code parse_test(parser *P, jnode **out) {
    JTRY(parse_filter(P, out));
    while (is_name(P, 0, "is")) {
        P->pos++;
        jnode *t;
        JTRY(new_node(P, N_TEST, &t));
        t->a = *out;
        JTRY(grow(P, t, *out));
        if (is_name(P, 0, "not")) {
            t->negate = 1;
            P->pos++;
        }
        if (!is_type(P, T_NAME)) return perr_got(P, "expected a test name after 'is'");
        t->s = cur(P)->s;
        t->n = cur(P)->n;
        P->pos++;
        *out = t;
    }
    return WHALE_OK;
}

static whale_code binary(parser *P, jnode_kind kind, jnode *l, jnode *r, const jtok *op, jnode **out) {
    jnode *x;
    JTRY(new_node(P, kind, &x));
    x->a = l;
    x->b = r;
    JTRY(grow(P, x, l));
    JTRY(grow(P, x, r));
    if (op) {
        x->s = op->s;
        x->n = op->n;
        x->line = op->line;
    }
    *out = x;
    return WHALE_OK;
}

/* a left-associative level: operands by next, operators of type t */
static whale_code parse_level(parser *P, jtok_type t, whale_code (*next)(parser *, jnode **), jnode **out) {
    JTRY(next(P, out));
    while (is_type(P, t)) {
        const jtok *op = cur(P);
        P->pos++;
        jnode *r;
        JTRY(next(P, &r));
        JTRY(binary(P, N_BIN, *out, r, op, out));
    }
    return WHALE_OK;
}

static whale_code parse_pow(parser *P, jnode **out) { return parse_level(P, T_POW, parse_test, out); }
static whale_code parse_mul(parser *P, jnode **out) { return parse_level(P, T_MUL, parse_pow, out); }
static whale_code parse_add(parser *P, jnode **out) { return parse_level(P, T_ADD, parse_mul, out); }

static whale_code parse_cmp(parser *P, jnode **out) {
    JTRY(parse_add(P, out));
    static const jtok not_in = {T_NAME, "not in", 6, 0}, in = {T_NAME, "in", 2, 0};
    for (;;) {
        const jtok *op;
        if (is_name(P, 0, "not") && is_name(P, 1, "in")) {
            op = &not_in;
            P->pos += 2;
        } else if (is_name(P, 0, "in")) {
            op = &in;
            P->pos++;
        } else if (is_type(P, T_CMP)) {
            op = cur(P);
            P->pos++;
        } else {
            return WHALE_OK;
        }
        int line = P->t[P->pos - 1].line;
        jnode *r;
        JTRY(parse_add(P, &r));
        JTRY(binary(P, N_BIN, *out, r, op, out));
        (*out)->line = line;
    }
}

static whale_code parse_not(parser *P, jnode **out) {
    if (!is_name(P, 0, "not")) return parse_cmp(P, out);
    JTRY(enter(P));
    jnode *x;
    JTRY(new_node(P, N_NOT, &x));
    P->pos++;
    JTRY(parse_not(P, &x->a));
    JTRY(grow(P, x, x->a));
    P->depth--;
    *out = x;
    return WHALE_OK;
}

static whale_code parse_and(parser *P, jnode **out) {
    JTRY(parse_not(P, out));
    while (is_name(P, 0, "and")) {
        P->pos++;
        jnode *r;
        JTRY(parse_not(P, &r));
        JTRY(binary(P, N_AND, *out, r, NULL, out));
    }
    return WHALE_OK;
}

static whale_code parse_or(parser *P, jnode **out) {
    JTRY(parse_and(P, out));
    while (is_name(P, 0, "or")) {
        P->pos++;
        jnode *r;
        JTRY(parse_and(P, &r));
        JTRY(binary(P, N_OR, *out, r, NULL, out));
    }
    return WHALE_OK;
}

/* x if c else y (x if c: undefined when c is false) */
static whale_code parse_expr(parser *P, jnode **out) {
    JTRY(enter(P));
    JTRY(parse_or(P, out));
    if (is_name(P, 0, "if")) {
        P->pos++;
        jnode *x;
        JTRY(new_node(P, N_SELECT, &x));
        x->a = *out;
        JTRY(parse_or(P, &x->b));
        if (is_name(P, 0, "else")) {
            P->pos++;
            x->kind = N_TERNARY;
            JTRY(parse_expr(P, &x->c));
            JTRY(grow(P, x, x->c));
        }
        JTRY(grow(P, x, x->a));
        JTRY(grow(P, x, x->b));
        *out = x;
    }
    P->depth--;
    return WHALE_OK;
}

/* a, b, c as a tuple (one expression alone stays itself) */
static whale_code parse_sequence(parser *P, int primary, jnode **out) {
    JTRY(primary ? parse_primary(P, out) : parse_expr(P, out));
    if (!is_type(P, T_COMMA)) return WHALE_OK;
    jnode *t;
    JTRY(new_node(P, N_TUPLE, &t));
    JTRY(grow(P, t, *out));
    JTRY(add(P, &t->args, *out));
    while (is_type(P, T_COMMA)) {
        P->pos++;
        jnode *x;
        JTRY(primary ? parse_primary(P, &x) : parse_expr(P, &x));
        JTRY(grow(P, t, x));
        JTRY(add(P, &t->args, x));
    }
    *out = t;
    return WHALE_OK;
}

static whale_code parse_list_literal(parser *P, jnode *x) {
    while (!is_type(P, T_RBRACK)) {
        jnode *item;
        JTRY(parse_expr(P, &item));
        JTRY(grow(P, x, item));
        JTRY(add(P, &x->args, item));
        if (is_type(P, T_COMMA)) P->pos++;
        else if (!is_type(P, T_RBRACK)) return perr_got(P, "expected ',' or ']' in a list");
    }
    P->pos++;
    return WHALE_OK;
}

/* {k: v, ...}: keys in args, values in body */
static whale_code parse_dict_literal(parser *P, jnode *x) {
    while (!is_type(P, T_RBRACE)) {
        jnode *k, *v;
        JTRY(parse_expr(P, &k));
        JTRY(expect(P, T_COLON, "expected ':' in a dict literal"));
        JTRY(parse_expr(P, &v));
        JTRY(grow(P, x, k));
        JTRY(grow(P, x, v));
        JTRY(add(P, &x->args, k));
        JTRY(add(P, &x->body, v));
        if (is_type(P, T_COMMA)) P->pos++;
        else if (!is_type(P, T_RBRACE)) return perr_got(P, "expected ',' or '}' in a dict");
    }
    P->pos++;
    return WHALE_OK;
}

static whale_code parse_primary(parser *P, jnode **out) {
    const jtok *k = cur(P);
    jnode *x;
    switch (k->type) {
    case T_NUM:
        JTRY(new_node(P, N_LIT, &x));
        if (memchr(k->s, '.', k->n)) x->lit = (jv){.t = JV_FLOAT, .u.f = strtod(k->s, NULL)};
        else x->lit = jv_int(strtoll(k->s, NULL, 10));
        P->pos++;
        break;
    case T_STR: {
        JTRY(new_node(P, N_LIT, &x));
        size_t total = 0;
        int e = P->pos;
        while (P->t[e].type == T_STR) total += P->t[e++].n;
        char *s = ja_alloc(P->a, total + 1);
        if (!s) return whale_errf(P->err, WHALE_ERR_NOMEM, "chat template: out of memory parsing");
        size_t o = 0;
        for (; P->pos < e; P->pos++) {
            memcpy(s + o, P->t[P->pos].s, P->t[P->pos].n);
            o += P->t[P->pos].n;
        }
        x->lit = jv_str(s, total);
        break;
    }
    case T_NAME:
        JTRY(new_node(P, N_NAME, &x));
        x->s = k->s;
        x->n = k->n;
        P->pos++;
        break;
    case T_LPAREN:
        P->pos++;
        JTRY(parse_sequence(P, 0, &x));
        JTRY(expect(P, T_RPAREN, "expected ')'"));
        break;
    case T_LBRACK:
        JTRY(new_node(P, N_LIST, &x));
        P->pos++;
        JTRY(enter(P));
        JTRY(parse_list_literal(P, x));
        P->depth--;
        break;
    case T_LBRACE:
        JTRY(new_node(P, N_DICT, &x));
        P->pos++;
        JTRY(enter(P));
        JTRY(parse_dict_literal(P, x));
        P->depth--;
        break;
    default:
        return perr_got(P, "expected an expression");
    }
    *out = x;
    return WHALE_OK;
}

/* ------------------------------------------------------------ statements */

static whale_code parse_any(parser *P, jnodes *into);

static int at_statement(const parser *P, const char *const *names) {
    if (!is_type(P, T_OPEN_STMT)) return 0;
    for (; *names; names++)
        if (is_name(P, 1, *names)) return 1;
    return 0;
}

/* Statements into body until "{% name" for one of names (left unconsumed). */
static whale_code parse_block(parser *P, jnodes *body, const char *const *names, const char *opener, int line) {
    JTRY(enter(P));
    while (!at_statement(P, names)) {
        if (is_type(P, T_END))
            return whale_errf(P->err, WHALE_ERR_FORMAT,
                              "chat template line %d: '%s' is never closed (no {%% %s %%})", line, opener,
                              names[0]);
        JTRY(parse_any(P, body));
    }
    P->depth--;
    return WHALE_OK;
}

/* "{% name %}" */
static whale_code close_tag(parser *P, const char *name) {
    JTRY(expect(P, T_OPEN_STMT, "expected '{%'"));
    JTRY(expect_name(P, name));
    return expect(P, T_CLOSE_STMT, "expected '%}'");
}

static whale_code parse_if(parser *P, jnode *x) {
    static const char *const ends[] = {"endif", "elif", "else", NULL}, *const endif[] = {"endif", NULL};
    JTRY(parse_expr(P, &x->a));
    JTRY(expect(P, T_CLOSE_STMT, "expected '%}' after the if condition"));
    JTRY(parse_block(P, &x->body, ends, "if", x->line));
    if (is_name(P, 1, "elif")) {
        P->pos += 2;
        jnode *e;
        JTRY(new_node(P, N_IF, &e));
        JTRY(enter(P));
        JTRY(parse_if(P, e));
        P->depth--;
        return add(P, &x->alt, e);
    }
    if (is_name(P, 1, "else")) {
        P->pos += 2;
        JTRY(expect(P, T_CLOSE_STMT, "expected '%}' after else"));
        JTRY(parse_block(P, &x->alt, endif, "if", x->line));
    }
    return close_tag(P, "endif");
}

static whale_code parse_for(parser *P, jnode *x) {
    static const char *const ends[] = {"endfor", "else", NULL}, *const endfor[] = {"endfor", NULL};
    JTRY(parse_sequence(P, 1, &x->a));
    if (x->a->kind == N_TUPLE) {
        for (int i = 0; i < x->a->args.n; i++)
            if (x->a->args.v[i]->kind != N_NAME) return perr(P, WHALE_ERR_FORMAT, "for: loop variables must be names", NULL);
    } else if (x->a->kind != N_NAME) {
        return perr(P, WHALE_ERR_FORMAT, "for: the loop variable must be a name", NULL);
    }
    JTRY(expect_name(P, "in"));
    JTRY(parse_expr(P, &x->b));
    if (x->b->kind == N_SELECT) { /* for x in xs if cond */
        x->c = x->b->b;
        x->b = x->b->a;
    }
    if (is_name(P, 0, "recursive")) return perr(P, WHALE_ERR_UNSUPPORTED, "recursive for loops are not supported", NULL);
    JTRY(expect(P, T_CLOSE_STMT, "expected '%}' after the for header"));
    JTRY(parse_block(P, &x->body, ends, "for", x->line));
    if (is_name(P, 1, "else")) {
        P->pos += 2;
        JTRY(expect(P, T_CLOSE_STMT, "expected '%}' after else"));
        JTRY(parse_block(P, &x->alt, endfor, "for", x->line));
    }
    return close_tag(P, "endfor");
}

static whale_code parse_set(parser *P, jnode *x) {
    static const char *const endset[] = {"endset", NULL};
    JTRY(parse_sequence(P, 0, &x->a));
    jnode *t = x->a;
    int ok = t->kind == N_NAME || (t->kind == N_ATTR && t->a);
    if (t->kind == N_TUPLE) {
        ok = 1;
        for (int i = 0; i < t->args.n; i++) ok &= t->args.v[i]->kind == N_NAME;
    }
    if (!ok) return perr(P, WHALE_ERR_FORMAT, "set: can only assign to names, tuples of names or ns.attribute", NULL);
    if (is_type(P, T_ASSIGN)) {
        P->pos++;
        JTRY(parse_sequence(P, 0, &x->b));
        return expect(P, T_CLOSE_STMT, "expected '%}' after set");
    }
    JTRY(expect(P, T_CLOSE_STMT, "expected '=' or '%}' after the set target"));
    JTRY(parse_block(P, &x->body, endset, "set", x->line));
    return close_tag(P, "endset");
}

static whale_code parse_macro(parser *P, jnode *x) {
    if (!is_type(P, T_NAME)) return perr_got(P, "expected the macro's name");
    static const char *const endmacro[] = {"endmacro", NULL};
    x->s = cur(P)->s;
    x->n = cur(P)->n;
    P->pos++;
    JTRY(parse_args(P, x, &x->args, 1));
    JTRY(expect(P, T_CLOSE_STMT, "expected '%}' after the macro's parameters"));
    JTRY(parse_block(P, &x->body, endmacro, "macro", x->line));
    return close_tag(P, "endmacro");
}

static whale_code parse_statement(parser *P, jnode **out) {
    P->pos++; /* {% */
    const jtok *k = cur(P);
    if (k->type != T_NAME) return perr_got(P, "expected a statement name after '{%'");
    static const struct {
        const char *name;
        jnode_kind kind;
    } kinds[] = {{"if", N_IF}, {"for", N_FOR}, {"set", N_SET}, {"macro", N_MACRO}, {"break", N_BREAK}, {"continue", N_CONTINUE}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (!is_name(P, 0, kinds[i].name)) continue;
        jnode *x;
        JTRY(new_node(P, kinds[i].kind, &x));
        P->pos++;
        *out = x;
        switch (kinds[i].kind) {
        case N_IF: return parse_if(P, x);
        case N_FOR: return parse_for(P, x);
        case N_SET: return parse_set(P, x);
        case N_MACRO: return parse_macro(P, x);
        default: return expect(P, T_CLOSE_STMT, "expected '%}'");
        }
    }
    char name[48];
    snprintf(name, sizeof name, "%.*s", k->n > 40 ? 40 : (int)k->n, k->s);
    static const char *const closers[] = {"endif", "endfor", "endset", "endmacro", "elif", "else", NULL};
    for (int i = 0; closers[i]; i++)
        if (!strcmp(name, closers[i]))
            return whale_errf(P->err, WHALE_ERR_FORMAT, "chat template line %d: unexpected '{%% %s %%}'", k->line, name);
    return whale_errf(P->err, WHALE_ERR_UNSUPPORTED, "chat template line %d: statement '%s' is not supported",
                      k->line, name);
}

static whale_code parse_any(parser *P, jnodes *into) {
    const jtok *k = cur(P);
    jnode *x = NULL;
    switch (k->type) {
    case T_COMMENT: P->pos++; return WHALE_OK;
    case T_TEXT:
        JTRY(new_node(P, N_TEXT, &x));
        x->s = k->s;
        x->n = k->n;
        P->pos++;
        break;
    case T_OPEN_EXPR:
        JTRY(new_node(P, N_PRINT, &x));
        P->pos++;
        JTRY(parse_expr(P, &x->a));
        JTRY(expect(P, T_CLOSE_EXPR, "expected '}}'"));
        break;
    case T_OPEN_STMT: JTRY(parse_statement(P, &x)); break;
    default: return perr_got(P, "expected text, '{{' or '{%'");
    }
    return add(P, into, x);
}

whale_code jinja_parse_tokens(jarena *a, const jtok *toks, int n, jnodes *program, whale_err *err) {
    parser P = {a, toks, 0, n, 0, err};
    memset(program, 0, sizeof *program);
    while (!is_type(&P, T_END)) JTRY(parse_any(&P, program));
    return WHALE_OK;
}
