/* Jinja evaluation: statements write into the output buffer, expressions
 * produce values, with @huggingface/jinja's semantics (scoping of for and
 * macros, the `loop` object, operators). Limits from jinja.h bound what a
 * hostile template can make the renderer do. */
#include "io/jinja_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct whale_jinja {
    jarena a;
    jnodes program;
};

whale_code jerr(jctx *c, whale_code code, const char *fmt, ...) {
    char msg[WHALE_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return whale_errf(c->err, code, "chat template line %d: %s", c->line, msg);
}

static whale_code oom(jctx *c) {
    return jerr(c, WHALE_ERR_NOMEM, "out of memory (a render may use at most %u MiB)", WHALE_JINJA_MAX_MEMORY >> 20);
}

/* ------------------------------------------------------------ buffers and values */

whale_code jb_put(jctx *c, jbuf *b, const char *s, size_t n) {
    if (n > WHALE_JINJA_MAX_OUTPUT || b->n + n > WHALE_JINJA_MAX_OUTPUT)
        return jerr(c, WHALE_ERR_RANGE, "the rendered text would exceed %u MiB", WHALE_JINJA_MAX_OUTPUT >> 20);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = ja_alloc(c->a, cap);
        if (!p) return oom(c);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return WHALE_OK;
}

jv jv_str(const char *p, size_t n) { return (jv){.t = JV_STR, .u.s = {p, n}}; }
jv jv_int(long long i) { return (jv){.t = JV_INT, .u.i = i}; }
jv jv_bool(int b) { return (jv){.t = JV_BOOL, .u.b = !!b}; }

whale_code jv_strdup(jctx *c, const char *p, size_t n, jv *out) {
    char *s = ja_alloc(c->a, n + 1);
    if (!s) return oom(c);
    if (n) memcpy(s, p, n);
    *out = jv_str(s, n);
    return WHALE_OK;
}

whale_code jv_newlist(jctx *c, jv *out) {
    jlist *l = ja_alloc(c->a, sizeof *l);
    if (!l) return oom(c);
    *out = (jv){.t = JV_LIST, .u.l = l};
    return WHALE_OK;
}

whale_code jv_newdict(jctx *c, jv_type t, jv *out) {
    jdict *d = ja_alloc(c->a, sizeof *d);
    if (!d) return oom(c);
    *out = (jv){.t = t, .u.d = d};
    return WHALE_OK;
}

whale_code jlist_push(jctx *c, jlist *l, jv v) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc(c->a, (size_t)cap * sizeof *nv);
        if (!nv) return oom(c);
        if (l->n) memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return WHALE_OK;
}

const jv *jdict_get(const jdict *d, const char *k, size_t kn) {
    for (int i = d->n - 1; i >= 0; i--)
        if (d->k[i].u.s.n == kn && !memcmp(d->k[i].u.s.p, k, kn)) return &d->v[i];
    return NULL;
}

whale_code jdict_set(jctx *c, jdict *d, const char *k, size_t kn, jv v) {
    jv *slot = (jv *)jdict_get(d, k, kn);
    if (slot) {
        *slot = v;
        return WHALE_OK;
    }
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 8;
        jv *nk = ja_alloc(c->a, (size_t)cap * sizeof *nk), *nv = ja_alloc(c->a, (size_t)cap * sizeof *nv);
        if (!nk || !nv) return oom(c);
        if (d->n) {
            memcpy(nk, d->k, (size_t)d->n * sizeof *nk);
            memcpy(nv, d->v, (size_t)d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = jv_str(k, kn);
    d->v[d->n++] = v;
    return WHALE_OK;
}

int jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0 && !isnan(v->u.f);
    case JV_STR: return v->u.s.n > 0;
    case JV_LIST: return v->u.l->n > 0;
    case JV_DICT: return v->u.d->n > 0;
    default: return 1;
    }
}

const char *jv_type_name(jv_type t) {
    static const char *const names[] = {"undefined", "none", "boolean", "integer", "float", "string",
                                        "list", "dict", "namespace", "function", "macro"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "value";
}

whale_code jv_from_json(jctx *c, const cJSON *j, jv *out) {
    if (++c->depth > WHALE_JINJA_MAX_DEPTH * 4) return jerr(c, WHALE_ERR_RANGE, "JSON data nested too deeply");
    whale_code rc = WHALE_OK;
    if (!j || cJSON_IsNull(j)) *out = (jv){.t = JV_NONE};
    else if (cJSON_IsBool(j)) *out = jv_bool(cJSON_IsTrue(j));
    else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) *out = jv_int((long long)d);
        else *out = (jv){.t = JV_FLOAT, .u.f = d};
    } else if (cJSON_IsString(j)) {
        *out = jv_str(j->valuestring, strlen(j->valuestring));
    } else if (cJSON_IsArray(j)) {
        rc = jv_newlist(c, out);
        for (const cJSON *e = j->child; e && !rc; e = e->next) {
            jv v;
            rc = jv_from_json(c, e, &v);
            if (!rc) rc = jlist_push(c, out->u.l, v);
        }
    } else if (cJSON_IsObject(j)) {
        rc = jv_newdict(c, JV_DICT, out);
        for (const cJSON *e = j->child; e && !rc; e = e->next) {
            jv v;
            rc = jv_from_json(c, e, &v);
            if (!rc) rc = jdict_set(c, out->u.d, e->string, strlen(e->string), v);
        }
    } else {
        *out = (jv){.t = JV_UNDEF};
    }
    c->depth--;
    return rc;
}

/* ------------------------------------------------------------ scopes */

static whale_code frame_new(jctx *c, jframe *parent, jframe **out) {
    jframe *f = ja_alloc(c->a, sizeof *f);
    if (!f) return oom(c);
    f->parent = parent;
    *out = f;
    return WHALE_OK;
}

static jv lookup(const jframe *f, const char *name, size_t n) {
    for (; f; f = f->parent) {
        const jv *v = jdict_get(&f->vars, name, n);
        if (v) return *v;
    }
    return (jv){.t = JV_UNDEF};
}

static whale_code step(jctx *c) {
    if (++c->steps > c->max_steps)
        return jerr(c, WHALE_ERR_RANGE, "more than %ld loop iterations and calls", c->max_steps);
    return WHALE_OK;
}

/* ------------------------------------------------------------ expressions */

static whale_code eval(jctx *c, jframe *f, const jnode *x, jv *out);
static whale_code exec_block(jctx *c, jframe *f, const jnodes *body, jbuf *out);

/* control flow out of a loop body (jctx.flow) */
enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

static whale_code eval_args(jctx *c, jframe *f, const jnodes *l, jargs *a) {
    memset(a, 0, sizeof *a);
    a->pos = ja_alloc(c->a, (size_t)(l->n + 1) * sizeof *a->pos);
    a->kwv = ja_alloc(c->a, (size_t)(l->n + 1) * sizeof *a->kwv);
    a->kw = ja_alloc(c->a, (size_t)(l->n + 1) * sizeof *a->kw);
    a->kwn = ja_alloc(c->a, (size_t)(l->n + 1) * sizeof *a->kwn);
    if (!a->pos || !a->kwv || !a->kw || !a->kwn) return oom(c);
    for (int i = 0; i < l->n; i++) {
        const jnode *x = l->v[i];
        if (x->kind == N_KWARG) {
            for (int k = 0; k < a->nkw; k++)
                if (a->kwn[k] == x->n && !memcmp(a->kw[k], x->s, x->n))
                    return jerr(c, WHALE_ERR_FORMAT, "keyword argument '%.*s' given twice", (int)x->n, x->s);
            a->kw[a->nkw] = x->s;
            a->kwn[a->nkw] = x->n;
            JTRY(eval(c, f, x->a, &a->kwv[a->nkw]));
            a->nkw++;
        } else {
            JTRY(eval(c, f, x, &a->pos[a->npos++]));
        }
    }
    return WHALE_OK;
}

static whale_code call_macro(jctx *c, jframe *f, const jnode *m, jargs *a, jv *out) {
    if (a->npos > m->args.n)
        return jerr(c, WHALE_ERR_FORMAT, "macro '%.*s' takes at most %d argument(s), got %d", (int)m->n, m->s,
                    m->args.n, a->npos);
    if (++c->depth > WHALE_JINJA_MAX_DEPTH)
        return jerr(c, WHALE_ERR_RANGE, "macro calls nested deeper than %d", WHALE_JINJA_MAX_DEPTH);
    jframe *scope = NULL;
    JTRY(frame_new(c, f, &scope));
    int used = 0;
    for (int i = 0; i < m->args.n; i++) {
        const jnode *p = m->args.v[i];
        jv v = {.t = JV_UNDEF};
        if (i < a->npos) v = a->pos[i];
        else
            for (int k = 0; k < a->nkw; k++)
                if (a->kwn[k] == p->n && !memcmp(a->kw[k], p->s, p->n)) {
                    v = a->kwv[k];
                    used++;
                }
        JTRY(jdict_set(c, &scope->vars, p->s, p->n, v));
    }
    if (used < a->nkw)
        return jerr(c, WHALE_ERR_FORMAT, "macro '%.*s' got a keyword argument it does not take", (int)m->n, m->s);
    for (int i = 0; i < m->args.n; i++) { /* defaults see the other parameters */
        const jnode *p = m->args.v[i];
        if (p->kind == N_KWARG && jdict_get(&scope->vars, p->s, p->n)->t == JV_UNDEF) {
            jv d;
            JTRY(eval(c, scope, p->a, &d));
            JTRY(jdict_set(c, &scope->vars, p->s, p->n, d));
        }
    }
    jbuf b = {0};
    JTRY(exec_block(c, scope, &m->body, &b));
    c->flow = FLOW_NONE;
    c->depth--;
    *out = jv_str(b.p ? b.p : "", b.n);
    return WHALE_OK;
}

static whale_code eval_call(jctx *c, jframe *f, const jnode *x, jv *out) {
    jv fn, obj = {.t = JV_UNDEF};
    if (x->a->kind == N_ATTR) {
        JTRY(eval(c, f, x->a->a, &obj));
        c->line = x->line;
        JTRY(jinja_attr(c, &obj, x->a->s, x->a->n, &fn));
    } else {
        JTRY(eval(c, f, x->a, &fn));
    }
    jargs a;
    JTRY(eval_args(c, f, &x->args, &a));
    c->line = x->line;
    JTRY(step(c));
    if (fn.t == JV_MACRO) return call_macro(c, f, fn.u.m, &a, out);
    if (fn.t == JV_FUNC) return jinja_call_builtin(c, &fn, &a, out);
    if (x->a->kind == N_NAME)
        return jerr(c, WHALE_ERR_UNSUPPORTED, "function '%.*s' is not supported", (int)x->a->n, x->a->s);
    if (x->a->kind == N_ATTR && (obj.t == JV_STR || obj.t == JV_LIST || obj.t == JV_DICT))
        return jerr(c, WHALE_ERR_UNSUPPORTED, "method '%.*s' of a %s is not supported", (int)x->a->n, x->a->s,
                    jv_type_name(obj.t));
    return jerr(c, WHALE_ERR_FORMAT, "cannot call a value of type %s", jv_type_name(fn.t));
}

/* v[i] for lists and strings (negative from the end), dict[key] */
static whale_code index_value(jctx *c, const jv *obj, const jv *key, jv *out) {
    *out = (jv){.t = JV_UNDEF};
    if (obj->t == JV_DICT || obj->t == JV_NS) {
        if (key->t != JV_STR) return jerr(c, WHALE_ERR_FORMAT, "a dict key must be a string, not %s", jv_type_name(key->t));
        return jinja_attr(c, obj, key->u.s.p, key->u.s.n, out);
    }
    if (key->t == JV_STR) return jinja_attr(c, obj, key->u.s.p, key->u.s.n, out);
    if (key->t != JV_INT) return jerr(c, WHALE_ERR_FORMAT, "cannot index a %s with a %s", jv_type_name(obj->t), jv_type_name(key->t));
    long long i = key->u.i;
    if (obj->t == JV_LIST) {
        if (i < 0) i += obj->u.l->n;
        if (i >= 0 && i < obj->u.l->n) *out = obj->u.l->v[i];
    } else if (obj->t == JV_STR) {
        /* JavaScript indexes UTF-16 units; this indexes characters, the same for the BMP */
        const unsigned char *s = (const unsigned char *)obj->u.s.p;
        size_t n = obj->u.s.n, count = 0;
        for (size_t k = 0; k < n; k++) count += (s[k] & 0xC0) != 0x80;
        if (i < 0) i += (long long)count;
        if (i < 0 || i >= (long long)count) return WHALE_OK;
        size_t k = 0, ch = 0;
        for (; k < n; k++)
            if ((s[k] & 0xC0) != 0x80 && ch++ == (size_t)i) break;
        size_t e = k + 1;
        while (e < n && (s[e] & 0xC0) == 0x80) e++;
        *out = jv_str((const char *)s + k, e - k);
    }
    return WHALE_OK;
}

/* Python slice bounds over n items, as @huggingface/jinja computes them */
static whale_code slice_value(jctx *c, jframe *f, const jnode *x, jv *out) {
    jv obj, b[3];
    JTRY(eval(c, f, x->a, &obj));
    for (int i = 0; i < 3; i++) {
        b[i] = (jv){.t = JV_UNDEF};
        if (x->args.v[i]) JTRY(eval(c, f, x->args.v[i], &b[i]));
        if (b[i].t != JV_UNDEF && b[i].t != JV_INT) return jerr(c, WHALE_ERR_FORMAT, "slice bounds must be integers");
    }
    if (obj.t != JV_LIST && obj.t != JV_STR) return jerr(c, WHALE_ERR_FORMAT, "cannot slice a %s", jv_type_name(obj.t));
    long long step_ = b[2].t == JV_INT ? b[2].u.i : 1;
    if (step_ == 0) return jerr(c, WHALE_ERR_FORMAT, "slice step cannot be zero");
    /* characters of a string: their byte offsets */
    long long n;
    size_t *off = NULL;
    if (obj.t == JV_LIST) n = obj.u.l->n;
    else {
        off = ja_alloc(c->a, (obj.u.s.n + 1) * sizeof *off);
        if (!off) return oom(c);
        n = 0;
        for (size_t k = 0; k < obj.u.s.n; k++)
            if (((unsigned char)obj.u.s.p[k] & 0xC0) != 0x80) off[n++] = k;
        off[n] = obj.u.s.n;
    }
    long long start, stop;
    if (step_ > 0) {
        start = b[0].t == JV_INT ? b[0].u.i : 0;
        stop = b[1].t == JV_INT ? b[1].u.i : n;
        start = start < 0 ? (n + start > 0 ? n + start : 0) : (start < n ? start : n);
        stop = stop < 0 ? (n + stop > 0 ? n + stop : 0) : (stop < n ? stop : n);
    } else {
        start = b[0].t == JV_INT ? b[0].u.i : n - 1;
        stop = b[1].t == JV_INT ? b[1].u.i : -1;
        start = start < 0 ? (n + start > -1 ? n + start : -1) : (start < n - 1 ? start : n - 1);
        stop = stop < -1 ? (n + stop > -1 ? n + stop : -1) : (stop < n - 1 ? stop : n - 1);
    }
    jbuf sb = {0};
    if (obj.t == JV_LIST) JTRY(jv_newlist(c, out));
    for (long long i = start; step_ > 0 ? i < stop : i > stop; i += step_) {
        if (obj.t == JV_LIST) JTRY(jlist_push(c, out->u.l, obj.u.l->v[i]));
        else JTRY(jb_put(c, &sb, obj.u.s.p + off[i], off[i + 1] - off[i]));
    }
    if (obj.t == JV_STR) *out = jv_str(sb.p ? sb.p : "", sb.n);
    return WHALE_OK;
}

static whale_code eval_literal_container(jctx *c, jframe *f, const jnode *x, jv *out) {
    if (x->kind == N_DICT) {
        JTRY(jv_newdict(c, JV_DICT, out));
        for (int i = 0; i < x->args.n; i++) {
            jv k, v;
            JTRY(eval(c, f, x->args.v[i], &k));
            if (k.t != JV_STR) return jerr(c, WHALE_ERR_FORMAT, "dict literal keys must be strings");
            JTRY(eval(c, f, x->body.v[i], &v));
            JTRY(jdict_set(c, out->u.d, k.u.s.p, k.u.s.n, v));
        }
        return WHALE_OK;
    }
    JTRY(jv_newlist(c, out));
    for (int i = 0; i < x->args.n; i++) {
        jv v;
        JTRY(eval(c, f, x->args.v[i], &v));
        JTRY(jlist_push(c, out->u.l, v));
    }
    return WHALE_OK;
}

static whale_code eval_filter(jctx *c, jframe *f, const jnode *x, jv *out) {
    jv operand;
    JTRY(eval(c, f, x->a, &operand));
    jargs a;
    JTRY(eval_args(c, f, &x->args, &a));
    c->line = x->line;
    /* selectattr/rejectattr take string literals only, as in @huggingface/jinja */
    return jinja_filter(c, x->s, x->n, &operand, &a, out);
}

static whale_code eval_test(jctx *c, jframe *f, const jnode *x, jv *out) {
    jv operand;
    JTRY(eval(c, f, x->a, &operand));
    c->line = x->line;
    int r;
    JTRY(jinja_test(c, x->s, x->n, &operand, NULL, &r));
    *out = jv_bool(x->negate ? !r : r);
    return WHALE_OK;
}

static whale_code eval_expr2(jctx *c, jframe *f, const jnode *x, jv *out) {
    jv l, r;
    switch (x->kind) {
    case N_AND:
    case N_OR:
        JTRY(eval(c, f, x->a, &l));
        if (jv_truthy(&l) == (x->kind == N_OR)) {
            *out = l;
            return WHALE_OK;
        }
        return eval(c, f, x->b, out);
    case N_NOT:
        JTRY(eval(c, f, x->a, &l));
        *out = jv_bool(!jv_truthy(&l));
        return WHALE_OK;
    case N_NEG:
    case N_POS:
        JTRY(eval(c, f, x->a, &l));
        c->line = x->line;
        if (l.t == JV_BOOL) l = jv_int(l.u.b);
        if (l.t == JV_INT) *out = jv_int(x->kind == N_NEG ? -l.u.i : l.u.i);
        else if (l.t == JV_FLOAT) *out = (jv){.t = JV_FLOAT, .u.f = x->kind == N_NEG ? -l.u.f : l.u.f};
        else return jerr(c, WHALE_ERR_FORMAT, "unary %s on a %s", x->kind == N_NEG ? "-" : "+", jv_type_name(l.t));
        return WHALE_OK;
    case N_BIN:
        JTRY(eval(c, f, x->a, &l));
        JTRY(eval(c, f, x->b, &r));
        c->line = x->line;
        return jinja_binary(c, x->s, x->n, &l, &r, out);
    case N_TERNARY:
        JTRY(eval(c, f, x->b, &l));
        return eval(c, f, jv_truthy(&l) ? x->a : x->c, out);
    case N_SELECT:
        JTRY(eval(c, f, x->b, &l));
        if (!jv_truthy(&l)) {
            *out = (jv){.t = JV_UNDEF};
            return WHALE_OK;
        }
        return eval(c, f, x->a, out);
    default: return jerr(c, WHALE_ERR_INTERNAL, "unknown expression kind %d", (int)x->kind);
    }
}

static whale_code eval(jctx *c, jframe *f, const jnode *x, jv *out) {
    int saved = c->line;
    c->line = x->line;
    whale_code rc = WHALE_OK;
    jv obj, key;
    switch (x->kind) {
    case N_LIT: *out = x->lit; break;
    case N_NAME: *out = lookup(f, x->s, x->n); break;
    case N_LIST:
    case N_TUPLE:
    case N_DICT: rc = eval_literal_container(c, f, x, out); break;
    case N_ATTR:
        if (!(rc = eval(c, f, x->a, &obj))) rc = jinja_attr(c, &obj, x->s, x->n, out);
        break;
    case N_INDEX:
        if (!(rc = eval(c, f, x->a, &obj)) && !(rc = eval(c, f, x->b, &key))) {
            c->line = x->line;
            rc = index_value(c, &obj, &key, out);
        }
        break;
    case N_SLICE: rc = slice_value(c, f, x, out); break;
    case N_CALL: rc = eval_call(c, f, x, out); break;
    case N_FILTER: rc = eval_filter(c, f, x, out); break;
    case N_TEST: rc = eval_test(c, f, x, out); break;
    default: rc = eval_expr2(c, f, x, out); break;
    }
    if (!rc) c->line = saved;
    return rc;
}

/* ------------------------------------------------------------ statements */

static whale_code assign(jctx *c, jframe *f, const jnode *target, const jv *v) {
    if (target->kind == N_NAME) return jdict_set(c, &f->vars, target->s, target->n, *v);
    if (target->kind == N_ATTR) {
        jv obj;
        JTRY(eval(c, f, target->a, &obj));
        if (obj.t != JV_NS) return jerr(c, WHALE_ERR_FORMAT, "can only assign attributes of a namespace(), not of a %s", jv_type_name(obj.t));
        return jdict_set(c, obj.u.d, target->s, target->n, *v);
    }
    /* a tuple of names */
    if (v->t != JV_LIST) return jerr(c, WHALE_ERR_FORMAT, "cannot unpack a %s", jv_type_name(v->t));
    if (v->u.l->n != target->args.n)
        return jerr(c, WHALE_ERR_FORMAT, "cannot unpack %d values into %d names", v->u.l->n, target->args.n);
    for (int i = 0; i < target->args.n; i++)
        JTRY(jdict_set(c, &f->vars, target->args.v[i]->s, target->args.v[i]->n, v->u.l->v[i]));
    return WHALE_OK;
}

static whale_code exec_set(jctx *c, jframe *f, const jnode *x) {
    jv v;
    if (x->b) {
        JTRY(eval(c, f, x->b, &v));
    } else {
        jbuf b = {0};
        JTRY(exec_block(c, f, &x->body, &b));
        v = jv_str(b.p ? b.p : "", b.n);
    }
    c->line = x->line;
    return assign(c, f, x->a, &v);
}

/* The loop object, one per loop updated in place each iteration (as Jinja's
 * LoopContext is). */
static whale_code loop_object(jctx *c, const jlist *items, int i, jv *out) {
    if (out->t != JV_DICT) JTRY(jv_newdict(c, JV_DICT, out));
    jdict *d = out->u.d;
    int n = items->n;
    JTRY(jdict_set(c, d, "index", 5, jv_int(i + 1)));
    JTRY(jdict_set(c, d, "index0", 6, jv_int(i)));
    JTRY(jdict_set(c, d, "revindex", 8, jv_int(n - i)));
    JTRY(jdict_set(c, d, "revindex0", 9, jv_int(n - i - 1)));
    JTRY(jdict_set(c, d, "first", 5, jv_bool(i == 0)));
    JTRY(jdict_set(c, d, "last", 4, jv_bool(i == n - 1)));
    JTRY(jdict_set(c, d, "length", 6, jv_int(n)));
    JTRY(jdict_set(c, d, "previtem", 8, i > 0 ? items->v[i - 1] : (jv){.t = JV_UNDEF}));
    return jdict_set(c, d, "nextitem", 8, i < n - 1 ? items->v[i + 1] : (jv){.t = JV_UNDEF});
}

/* the items a for loop runs over: a list, or a dict's keys; filtered by `if` */
static whale_code loop_items(jctx *c, jframe *scope, const jnode *x, jlist **out) {
    jv it;
    JTRY(eval(c, scope, x->b, &it));
    c->line = x->line;
    if (it.t == JV_DICT) {
        jv keys;
        JTRY(jv_newlist(c, &keys));
        for (int i = 0; i < it.u.d->n; i++) JTRY(jlist_push(c, keys.u.l, it.u.d->k[i]));
        it = keys;
    }
    if (it.t != JV_LIST) return jerr(c, WHALE_ERR_FORMAT, "for: cannot iterate over a %s", jv_type_name(it.t));
    if (!x->c) {
        *out = it.u.l;
        return WHALE_OK;
    }
    jv kept = {.t = JV_UNDEF};
    JTRY(jv_newlist(c, &kept));
    jframe *probe = NULL;
    JTRY(frame_new(c, scope, &probe));
    for (int i = 0; i < it.u.l->n; i++) {
        JTRY(step(c));
        probe->vars.n = 0; /* a fresh scope for each item's test */
        JTRY(assign(c, probe, x->a, &it.u.l->v[i]));
        jv keep;
        JTRY(eval(c, probe, x->c, &keep));
        if (jv_truthy(&keep)) JTRY(jlist_push(c, kept.u.l, it.u.l->v[i]));
    }
    *out = kept.u.l;
    return WHALE_OK;
}

static whale_code exec_for(jctx *c, jframe *f, const jnode *x, jbuf *out) {
    jframe *scope = NULL;
    JTRY(frame_new(c, f, &scope));
    jlist *items = NULL;
    JTRY(loop_items(c, scope, x, &items));
    int ran = 0;
    jv loop = {.t = JV_UNDEF};
    for (int i = 0; i < items->n; i++) {
        JTRY(step(c));
        JTRY(loop_object(c, items, i, &loop));
        JTRY(jdict_set(c, &scope->vars, "loop", 4, loop));
        c->line = x->line;
        JTRY(assign(c, scope, x->a, &items->v[i]));
        JTRY(exec_block(c, scope, &x->body, out));
        int fl = c->flow;
        c->flow = FLOW_NONE;
        if (fl == FLOW_CONTINUE) continue;
        if (fl == FLOW_BREAK) break;
        ran = 1;
    }
    if (!ran) JTRY(exec_block(c, scope, &x->alt, out));
    return WHALE_OK;
}

static whale_code print_value(jctx *c, const jv *v, jbuf *out) {
    if (v->t == JV_UNDEF || v->t == JV_NONE) return WHALE_OK;
    jv s;
    JTRY(jv_to_string(c, v, &s));
    return jb_put(c, out, s.u.s.p, s.u.s.n);
}

static whale_code exec(jctx *c, jframe *f, const jnode *x, jbuf *out) {
    c->line = x->line;
    jv v;
    switch (x->kind) {
    case N_TEXT: return jb_put(c, out, x->s, x->n);
    case N_PRINT:
        JTRY(eval(c, f, x->a, &v));
        return print_value(c, &v, out);
    case N_IF:
        JTRY(eval(c, f, x->a, &v));
        return exec_block(c, f, jv_truthy(&v) ? &x->body : &x->alt, out);
    case N_FOR: return exec_for(c, f, x, out);
    case N_SET: return exec_set(c, f, x);
    case N_MACRO: return jdict_set(c, &f->vars, x->s, x->n, (jv){.t = JV_MACRO, .u.m = x});
    case N_BREAK: c->flow = FLOW_BREAK; return WHALE_OK;
    case N_CONTINUE: c->flow = FLOW_CONTINUE; return WHALE_OK;
    default:
        /* an expression statement cannot be written in the grammar */
        return jerr(c, WHALE_ERR_INTERNAL, "unknown statement kind %d", (int)x->kind);
    }
}

static whale_code exec_block(jctx *c, jframe *f, const jnodes *body, jbuf *out) {
    if (++c->depth > WHALE_JINJA_MAX_DEPTH * 2)
        return jerr(c, WHALE_ERR_RANGE, "blocks nested deeper than %d", WHALE_JINJA_MAX_DEPTH * 2);
    for (int i = 0; i < body->n && c->flow == FLOW_NONE; i++) JTRY(exec(c, f, body->v[i], out));
    c->depth--;
    return WHALE_OK;
}

/* ------------------------------------------------------------ API */

whale_code whale_jinja_parse(const char *src, size_t len, whale_jinja **out, whale_err *err) {
    if (!src || !out) return whale_errf(err, WHALE_ERR_ARG, "whale_jinja_parse: NULL argument");
    if (len > WHALE_JINJA_MAX_SOURCE)
        return whale_errf(err, WHALE_ERR_RANGE, "chat template: %zu bytes is more than the limit of %u", len,
                          WHALE_JINJA_MAX_SOURCE);
    whale_jinja *t = calloc(1, sizeof *t);
    if (!t) return whale_errf(err, WHALE_ERR_NOMEM, "chat template: out of memory");
    t->a.cap = 64u * len + (1u << 20);
    jtok *toks;
    int n;
    whale_code rc = jinja_lex(&t->a, src, len, &toks, &n, err);
    if (!rc) rc = jinja_parse_tokens(&t->a, toks, n, &t->program, err);
    if (rc) {
        whale_jinja_free(t);
        return rc;
    }
    *out = t;
    return WHALE_OK;
}

void whale_jinja_free(whale_jinja *t) {
    if (!t) return;
    ja_free(&t->a);
    free(t);
}

static whale_code render_in(jctx *c, const whale_jinja *t, const cJSON *vars, jbuf *b) {
    jframe *globals = NULL, *top = NULL;
    JTRY(frame_new(c, NULL, &globals));
    JTRY(jinja_globals(c, &globals->vars));
    if (vars && !cJSON_IsObject(vars)) return jerr(c, WHALE_ERR_ARG, "the template variables must be a JSON object");
    for (const cJSON *e = vars ? vars->child : NULL; e; e = e->next) {
        jv v;
        JTRY(jv_from_json(c, e, &v));
        JTRY(jdict_set(c, &globals->vars, e->string, strlen(e->string), v));
    }
    JTRY(frame_new(c, globals, &top));
    c->flow = FLOW_NONE;
    return exec_block(c, top, &t->program, b);
}

whale_code whale_jinja_render_steps(const whale_jinja *t, const cJSON *vars, long *steps, char **out, size_t *len,
                                   whale_err *err) {
    if (!t || !steps || !out || !len) return whale_errf(err, WHALE_ERR_ARG, "whale_jinja_render: NULL argument");
    jarena a = {NULL, 0, WHALE_JINJA_MAX_MEMORY};
    jctx c = {&a, err, 0, *steps < WHALE_JINJA_MAX_STEPS ? *steps : WHALE_JINJA_MAX_STEPS, 0, 1, FLOW_NONE};
    jbuf b = {0};
    whale_code rc = render_in(&c, t, vars, &b);
    *steps -= c.steps;
    if (!rc) {
        *out = malloc(b.n + 1);
        if (!*out) rc = whale_errf(err, WHALE_ERR_NOMEM, "chat template: out of memory");
        else {
            if (b.n) memcpy(*out, b.p, b.n);
            (*out)[b.n] = 0;
            *len = b.n;
        }
    }
    ja_free(&a);
    return rc;
}

whale_code whale_jinja_render(const whale_jinja *t, const cJSON *vars, char **out, size_t *len, whale_err *err) {
    long steps = WHALE_JINJA_MAX_STEPS;
    return whale_jinja_render_steps(t, vars, &steps, out, len, err);
}
