/* Internals of the Jinja renderer (see jinja.h): arena, tokens, syntax
 * tree, values, and the interfaces between jinja_lex.c, jinja_parse.c,
 * jinja_eval.c and jinja_lib.c. */
#ifndef WHALE_JINJA_IMPL_H
#define WHALE_JINJA_IMPL_H

#include "io/jinja.h"

#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------ arena */

/* Bump allocator with a cap; everything a parse or a render allocates lives
 * in one and is freed at once. */
typedef struct jarena_block jarena_block;
typedef struct {
    jarena_block *head;
    size_t used, cap;
} jarena;

void *ja_alloc(jarena *a, size_t n); /* zeroed; NULL past the cap or on OOM */
void ja_free(jarena *a);

/* ------------------------------------------------------------ tokens */

typedef enum {
    T_TEXT, T_COMMENT, T_OPEN_STMT, T_CLOSE_STMT, T_OPEN_EXPR, T_CLOSE_EXPR,
    T_NUM, T_STR, T_NAME,
    T_LPAREN, T_RPAREN, T_LBRACE, T_RBRACE, T_LBRACK, T_RBRACK,
    T_COMMA, T_DOT, T_COLON, T_PIPE, T_ASSIGN,
    T_CMP,   /* < > <= >= == != */
    T_ADD,   /* + - ~ */
    T_MUL,   /* * / // % */
    T_POW,   /* ** */
    T_UNARY, /* a sign before an operand */
    T_END
} jtok_type;

typedef struct {
    jtok_type type;
    const char *s; /* text, the string literal unescaped, the name or the operator */
    size_t n;
    int line;
} jtok;

/* Tokenize src as @huggingface/jinja does with trim_blocks/lstrip_blocks.
 * Tokens and their strings are allocated in a; *toks ends with T_END. */
whale_code jinja_lex(jarena *a, const char *src, size_t len, jtok **toks, int *n, whale_err *err);

/* ------------------------------------------------------------ values */

typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_FUNC, JV_MACRO } jv_type;

typedef struct jlist jlist;
typedef struct jdict jdict;
struct jnode;

typedef struct {
    jv_type t;
    union {
        int b;
        long long i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        jlist *l;
        jdict *d; /* dicts and namespaces */
        struct {
            int id;         /* which builtin (jinja_lib.c) */
            const void *self; /* receiver of a method: a jv * */
        } fn;
        const struct jnode *m; /* macro */
    } u;
} jv;

struct jlist {
    jv *v;
    int n, cap;
};

struct jdict {
    jv *k; /* strings */
    jv *v;
    int n, cap;
};

/* ------------------------------------------------------------ syntax tree */

typedef enum {
    /* statements */
    N_TEXT, N_PRINT, N_IF, N_FOR, N_SET, N_MACRO, N_BREAK, N_CONTINUE,
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_INDEX, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_BIN, N_TERNARY, N_SELECT, N_KWARG
} jnode_kind;

typedef struct jnode jnode;
typedef struct {
    jnode **v;
    int n;
} jnodes;

struct jnode {
    jnode_kind kind;
    int line;
    const char *s; /* name, attribute, operator, filter/test name, text */
    size_t n;
    jv lit;
    jnode *a, *b, *c; /* operands; if: test; for: target, iterable, filter */
    jnodes args;      /* call/filter arguments (N_KWARG for keywords), items, tuple names, macro params */
    jnodes body, alt; /* if/for/set/macro bodies; else branches */
    int negate;       /* `is not` */
    int height;       /* of the expression tree below (evaluation recurses that deep) */
};

whale_code jinja_parse_tokens(jarena *a, const jtok *toks, int n, jnodes *program, whale_err *err);

/* ------------------------------------------------------------ evaluation */

typedef struct jframe jframe;
struct jframe {
    jframe *parent;
    jdict vars;
};

typedef struct {
    jarena *a;
    whale_err *err;
    long steps;     /* loop iterations and calls so far */
    long max_steps; /* ... and how many this render may take */
    int depth;  /* nesting of blocks, macro calls and JSON data */
    int line;   /* of the node being evaluated, for errors */
    int flow;   /* break / continue on its way out of a loop body */
} jctx;

/* An error at the current line: "chat template line N: ..." */
whale_code jerr(jctx *c, whale_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define JTRY(x)                                                                                              \
    do {                                                                                                     \
        whale_code jtry_rc_ = (x);                                                                           \
        if (jtry_rc_) return jtry_rc_;                                                                       \
    } while (0)

/* values */
jv jv_str(const char *p, size_t n);
jv jv_int(long long i);
jv jv_bool(int b);
whale_code jv_strdup(jctx *c, const char *p, size_t n, jv *out);
whale_code jv_newlist(jctx *c, jv *out);
whale_code jv_newdict(jctx *c, jv_type t, jv *out);
whale_code jlist_push(jctx *c, jlist *l, jv v);
whale_code jdict_set(jctx *c, jdict *d, const char *k, size_t kn, jv v);
const jv *jdict_get(const jdict *d, const char *k, size_t kn);
int jv_truthy(const jv *v);
const char *jv_type_name(jv_type t);
/* @huggingface/jinja's toString: what {{ v }} prints (undefined and none print nothing) */
whale_code jv_to_string(jctx *c, const jv *v, jv *out);
whale_code jv_from_json(jctx *c, const struct cJSON *j, jv *out);

/* A growing string in the arena. */
typedef struct {
    char *p;
    size_t n, cap;
} jbuf;
whale_code jb_put(jctx *c, jbuf *b, const char *s, size_t n);

/* JSON text of v: indent < 0 for none; separators NULL for the defaults. */
whale_code jv_tojson(jctx *c, const jv *v, int indent, const char *item_sep, const char *key_sep, int ensure_ascii,
                     int sort_keys, int depth, jbuf *b);

/* library (jinja_lib.c) */
typedef struct {
    jv *pos;
    int npos;
    const char **kw; /* keyword names (NUL-terminated) */
    size_t *kwn;
    jv *kwv;
    int nkw;
} jargs;

whale_code jinja_filter(jctx *c, const char *name, size_t n, jv *operand, jargs *args, jv *out);
whale_code jinja_test(jctx *c, const char *name, size_t n, const jv *operand, const jv *arg, int *out);
/* attribute of a value: dict member, or a method / property of the type */
whale_code jinja_attr(jctx *c, const jv *obj, const char *name, size_t n, jv *out);
/* call a builtin function or method */
whale_code jinja_call_builtin(jctx *c, const jv *fn, jargs *args, jv *out);
/* the globals every render has (true, none, namespace, range, …) */
whale_code jinja_globals(jctx *c, jdict *d);
int jv_equal(const jv *a, const jv *b);
whale_code jv_compare(jctx *c, const jv *a, const jv *b, int case_sensitive, int *out);
/* a binary operator (not and/or) applied to two values */
whale_code jinja_binary(jctx *c, const char *op, size_t n, const jv *l, const jv *r, jv *out);
/* case mapping of one code point (jinja_case.c); jcase_cased: it has case */
unsigned jcase_upper(unsigned u);
unsigned jcase_lower(unsigned u);
int jcase_cased(unsigned u);
/* length in UTF-16 code units, as JavaScript counts */
long long jstr_len16(const char *p, size_t n);

#endif
