/* Hugging Face tokenizer.json loader, decoder and streaming decoder.
 *
 * Loading is strict: every field that changes what encode or decode produce
 * is either implemented or refused with an error naming its JSON path, so a
 * tokenizer that loads behaves like Hugging Face's. Encoding lives in
 * tokenizer_encode.c. */
#include "io/tokenizer.h"
#include "io/tokenizer_uniregex.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ hash maps */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

int tok_strmap_init(tok_strmap *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2; /* load factor at most 1/2 */
    m->keys = calloc(cap, sizeof *m->keys);
    m->lens = malloc(cap * sizeof *m->lens);
    m->vals = malloc(cap * sizeof *m->vals);
    m->mask = cap - 1;
    if (!m->keys || !m->lens || !m->vals) {
        tok_strmap_free(m);
        return 0;
    }
    return 1;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->keys);
    free(m->lens);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t strmap_slot(const tok_strmap *m, const char *key, size_t len) {
    size_t i = (size_t)hash_bytes(key, len) & m->mask;
    while (m->keys[i] && (m->lens[i] != len || memcmp(m->keys[i], key, len) != 0))
        i = (i + 1) & m->mask;
    return i;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
    if (!m->keys) return -1;
    size_t i = strmap_slot(m, key, len);
    return m->keys[i] ? m->vals[i] : -1;
}

int32_t tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val) {
    size_t i = strmap_slot(m, key, len);
    if (m->keys[i]) return m->vals[i];
    m->keys[i] = key;
    m->lens[i] = (uint32_t)len;
    m->vals[i] = val;
    return -1;
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static size_t merges_slot(const tok_merges *m, uint64_t key) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & m->mask;
    return i;
}

static int merges_init(tok_merges *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->rank = malloc(cap * sizeof *m->rank);
    m->merged = malloc(cap * sizeof *m->merged);
    m->mask = cap - 1;
    return m->keys && m->rank && m->merged;
}

static void merges_free(tok_merges *m) {
    free(m->keys);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------ byte-level map */

/* GPT-2's byte <-> character map: printable Latin-1 bytes stand for
 * themselves, the other 68 bytes take U+0100.. in byte order. */
static void byte_level_map(uint32_t map[256]) {
    int next = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        map[b] = keep ? (uint32_t)b : 0x100u + (uint32_t)next++;
    }
}

/* The byte a character stands for, or -1. */
static int byte_of_char(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 0x100 || cp >= 0x100 + 68) return -1;
    int k = (int)(cp - 0x100); /* k-th byte outside the kept ranges */
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (!keep && k-- == 0) return b;
    }
    return -1;
}

/* ------------------------------------------------------------ load context */

typedef struct {
    const char *file; /* for messages: the path as given */
    whale_err *err;
    whale_tokenizer *t;
} loader;

/* Shorten a string for an error message (one readable line). */
static const char *shown(const char *s, char *buf, size_t cap) {
    size_t n = 0;
    for (; *s && n + 4 < cap; s++) buf[n++] = (unsigned char)*s < 0x20 ? '?' : *s;
    if (*s) memcpy(buf + n, "...", 3), n += 3;
    buf[n] = 0;
    return buf;
}

#define FAIL(L, code, ...) fail_at(L, code, __VA_ARGS__)
static whale_code fail_at(loader *L, whale_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static whale_code fail_at(loader *L, whale_code code, const char *fmt, ...) {
    char msg[WHALE_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return whale_errf(L->err, code, "%s: %s", L->file, msg);
}

static const cJSON *field(const cJSON *obj, const char *name) {
    return cJSON_GetObjectItemCaseSensitive(obj, name);
}

static int is_null(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* Optional boolean field; dflt when absent or null. -1 if it is another type. */
static int opt_bool(const cJSON *obj, const char *name, int dflt) {
    const cJSON *v = field(obj, name);
    if (is_null(v)) return dflt;
    if (!cJSON_IsBool(v)) return -1;
    return cJSON_IsTrue(v);
}

static whale_code get_bool(loader *L, const cJSON *obj, const char *path, const char *name, int dflt,
                           int *out) {
    int b = opt_bool(obj, name, dflt);
    if (b < 0) return FAIL(L, WHALE_ERR_FORMAT, "%s.%s: expected true or false", path, name);
    *out = b;
    return WHALE_OK;
}

static int json_id(const cJSON *v, int32_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d < 2147483647.0) || (double)(int32_t)d != d) return 0;
    *out = (int32_t)d;
    return 1;
}

static const char *type_of(const cJSON *obj) {
    const cJSON *ty = field(obj, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

/* ------------------------------------------------------------ regexes */

/* Oniguruma's \w (Hugging Face's regex engine), for PCRE2. */
#define ONIG_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"

/* Rewrite an Oniguruma pattern for PCRE2 (UTF, UCP, multiline, LF
 * newlines). Constructs whose meaning differs and that are not translated
 * are refused, so a pattern never matches differently without notice. */
static whale_code translate_regex(loader *L, const char *path, const char *src, tok_buf *out) {
    size_t n = strlen(src), i;
    int in_class = 0;
    char shown_buf[80];
    for (i = 0; i < n; i++) {
        char c = src[i];
        const char *rep = NULL;
        if (c == '\\' && i + 1 < n) {
            char e = src[++i];
            switch (e) {
            case 's': rep = "\\p{White_Space}"; break; /* PCRE2's \s misses U+0085 */
            case 'S': rep = "\\P{White_Space}"; break;
            case 'd': rep = "\\p{Nd}"; break;
            case 'D': rep = "\\P{Nd}"; break;
            case 'w': rep = in_class ? ONIG_WORD : "[" ONIG_WORD "]"; break;
            case 'h': rep = in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]"; break; /* hex digit, not blank */
            case 'W':
            case 'H':
                if (in_class) goto unsupported;
                rep = e == 'W' ? "[^" ONIG_WORD "]" : "[^0-9A-Fa-f]";
                break;
            case 'b':
            case 'B':
            case 'G':
            case 'y':
            case 'Y':
            case 'O':
            case 'N':
                goto unsupported;
            case 'p':
            case 'P': {
                /* \pL, \p{L}, \p{^L}, \P{L}: PCRE2's Unicode database is older
                 * than Oniguruma's, so add the characters assigned since */
                char name[32], head[48];
                size_t k = i + 1, len;
                int neg = e == 'P', braced = k < n && src[k] == '{';
                if (braced) {
                    const char *close = strchr(src + k, '}');
                    if (!close) goto unsupported;
                    k++;
                    if (src[k] == '^') neg = !neg, k++;
                    len = (size_t)(close - (src + k));
                } else {
                    len = 1;
                }
                if (len == 0 || len >= sizeof name) goto unsupported;
                memcpy(name, src + k, len);
                name[len] = 0;
                const char *extra = "";
                for (size_t x = 0; x < sizeof uni_regex_extra / sizeof uni_regex_extra[0]; x++)
                    if (!strcmp(uni_regex_extra[x].name, name)) extra = uni_regex_extra[x].extra;
                if (!strcmp(name, "C") || !strcmp(name, "Cn")) goto unsupported; /* shrank since */
                if (in_class && neg && *extra) goto unsupported;
                if (in_class || !*extra) snprintf(head, sizeof head, "\\%c{%s}", neg ? 'P' : 'p', name);
                else snprintf(head, sizeof head, "%s\\p{%s}", neg ? "[^" : "[", name);
                if (!tok_buf_append(out, head, strlen(head)) || !tok_buf_append(out, extra, strlen(extra)) ||
                    (!in_class && *extra && !tok_buf_append(out, "]", 1)))
                    goto nomem;
                i = k + len - (braced ? 0 : 1);
                continue;
            }
            case 'u': { /* \uHHHH */
                if (n - i <= 4) goto unsupported;
                char hex[5] = {0};
                memcpy(hex, src + i + 1, 4);
                char buf[16];
                snprintf(buf, sizeof buf, "\\x{%s}", hex);
                if (!tok_buf_append(out, buf, strlen(buf))) goto nomem;
                i += 4;
                continue;
            }
            default: {
                /* copy the escape and the whole character after the backslash */
                size_t k = 1;
                while (i + k < n && ((unsigned char)src[i + k] & 0xC0) == 0x80) k++;
                if (!tok_buf_append(out, "\\", 1) || !tok_buf_append(out, src + i, k)) goto nomem;
                i += k - 1;
                continue;
            }
            }
            if (!tok_buf_append(out, rep, strlen(rep))) goto nomem;
            continue;
        }
        if (in_class) {
            if (c == '[') {
                if (src[i + 1] == ':') { /* POSIX class [:alpha:] */
                    const char *end = strstr(src + i, ":]");
                    if (!end) goto unsupported;
                    size_t k = (size_t)(end - (src + i)) + 2;
                    if (!tok_buf_append(out, src + i, k)) goto nomem;
                    i += k - 1;
                    continue;
                }
                goto unsupported; /* nested classes */
            }
            if (c == '&' && src[i + 1] == '&') goto unsupported; /* intersection */
            if (c == ']') in_class = 0;
        } else if (c == '[') {
            in_class = 1;
            if (!tok_buf_append(out, "[", 1)) goto nomem;
            /* a ']' right after '[' or '[^' is literal in both engines */
            if (src[i + 1] == '^') {
                if (!tok_buf_append(out, "^", 1)) goto nomem;
                i++;
            }
            if (src[i + 1] == ']') {
                if (!tok_buf_append(out, "\\]", 2)) goto nomem;
                i++;
            }
            continue;
        } else if (c == '(' && src[i + 1] == '?') {
            /* (?m) means "dot matches newline" in Oniguruma's Ruby syntax */
            for (size_t k = i + 2; k < n && src[k] != ':' && src[k] != ')'; k++) {
                if (src[k] == 'm') goto unsupported;
                if (!(src[k] == 'i' || src[k] == 'x' || src[k] == '-')) break;
            }
        }
        if (!tok_buf_append(out, &c, 1)) goto nomem;
    }
    return WHALE_OK;
unsupported:
    return FAIL(L, WHALE_ERR_UNSUPPORTED,
                "%s: regex construct near offset %zu is not supported (Oniguruma semantics "
                "differ from PCRE2): %s",
                path, i, shown(src, shown_buf, sizeof shown_buf));
nomem:
    return FAIL(L, WHALE_ERR_NOMEM, "%s: out of memory", path);
}

/* Compile a Split pattern (or the ByteLevel one) for matching valid UTF-8. */
static whale_code compile_regex(loader *L, const char *path, const char *pattern, int literal,
                                pcre2_code **out, int *jit) {
    tok_buf src = {0};
    whale_code rc = WHALE_OK;
    uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
    if (literal) {
        opts |= PCRE2_LITERAL;
        if (!tok_buf_append(&src, pattern, strlen(pattern)))
            return FAIL(L, WHALE_ERR_NOMEM, "%s: out of memory", path);
    } else {
        /* Oniguruma's ^ and $ always work on lines (LF only). \C (one code
         * unit) is refused: it could end a match inside a UTF-8 character,
         * and the next search would start there with the UTF check off. */
        opts |= PCRE2_UCP | PCRE2_MULTILINE | PCRE2_ALT_CIRCUMFLEX | PCRE2_NEVER_BACKSLASH_C;
        if ((rc = translate_regex(L, path, pattern, &src)) != WHALE_OK) {
            free(src.data);
            return rc;
        }
    }
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        free(src.data);
        return FAIL(L, WHALE_ERR_NOMEM, "%s: out of memory", path);
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int ecode;
    PCRE2_SIZE eoff;
    *out = pcre2_compile((PCRE2_SPTR)(src.data ? src.data : ""), src.len, opts, &ecode, &eoff, cc);
    pcre2_compile_context_free(cc);
    free(src.data);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return FAIL(L, WHALE_ERR_FORMAT, "%s: bad regex (offset %zu after translation): %s", path,
                    (size_t)eoff, (const char *)msg);
    }
    *jit = pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD) == 0;
    return WHALE_OK;
}

/* ------------------------------------------------------------ sections */

/* A Replace whose pattern is a literal {"String": ...}; a Regex pattern is refused. */
static whale_code parse_replace(loader *L, const cJSON *n, const char *path, tok_replace *list, int *count) {
    const cJSON *pat = field(n, "pattern"), *content = field(n, "content");
    const cJSON *lit = cJSON_IsObject(pat) ? field(pat, "String") : NULL;
    if (cJSON_IsObject(pat) && field(pat, "Regex"))
        return FAIL(L, WHALE_ERR_UNSUPPORTED, "%s.pattern: a Regex pattern is not supported (only String)", path);
    if (!cJSON_IsString(lit) || !lit->valuestring[0])
        return FAIL(L, WHALE_ERR_FORMAT, "%s.pattern: expected {\"String\": a non-empty string}", path);
    if (!cJSON_IsString(content)) return FAIL(L, WHALE_ERR_FORMAT, "%s.content: expected a string", path);
    if (*count == TOK_MAX_REPLACE)
        return FAIL(L, WHALE_ERR_UNSUPPORTED, "%s: more than %d Replace steps are not supported", path, TOK_MAX_REPLACE);
    tok_replace *r = &list[*count];
    r->pat = strdup(lit->valuestring);
    r->with = strdup(content->valuestring);
    if (!r->pat || !r->with) {
        free(r->pat), free(r->with);
        return FAIL(L, WHALE_ERR_NOMEM, "%s: out of memory", path);
    }
    r->plen = strlen(r->pat);
    r->wlen = strlen(r->with);
    (*count)++;
    return WHALE_OK;
}

static whale_code parse_normalizer(loader *L, const cJSON *n, const char *path) {
    if (is_null(n)) return WHALE_OK;
    const char *ty = cJSON_IsObject(n) ? type_of(n) : NULL;
    if (!ty) return FAIL(L, WHALE_ERR_FORMAT, "%s: expected an object with a \"type\"", path);
    if (!strcmp(ty, "NFC") || !strcmp(ty, "Replace")) {
        if (L->t->nfc || (L->t->n_norm_repl && !strcmp(ty, "NFC")))
            return FAIL(L, WHALE_ERR_UNSUPPORTED, "%s: NFC together with another normalizer is not supported", path);
        if (!strcmp(ty, "Replace")) return parse_replace(L, n, path, L->t->norm_repl, &L->t->n_norm_repl);
        L->t->nfc = 1;
        return WHALE_OK;
    }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = field(n, "normalizers");
        if (!cJSON_IsArray(list)) return FAIL(L, WHALE_ERR_FORMAT, "%s.normalizers: expected an array", path);
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", path, i);
            whale_code rc = parse_normalizer(L, c, sub);
            if (rc) return rc;
        }
        return WHALE_OK;
    }
    char b[64];
    return FAIL(L, WHALE_ERR_UNSUPPORTED, "%s: normalizer type \"%s\" is not supported (only NFC, Replace, Sequence)",
                path, shown(ty, b, sizeof b));
}

static whale_code add_step(loader *L, const char *path, tok_step **st) {
    whale_tokenizer *t = L->t;
    if (t->n_steps && t->steps[t->n_steps - 1].kind == STEP_BYTELEVEL)
        return FAIL(L, WHALE_ERR_UNSUPPORTED,
                    "%s: a pre-tokenizer after ByteLevel is not supported (ByteLevel must be last)", path);
    tok_step *p = realloc(t->steps, (size_t)(t->n_steps + 1) * sizeof *p);
    if (!p) return FAIL(L, WHALE_ERR_NOMEM, "%s: out of memory", path);
    t->steps = p;
    *st = &p[t->n_steps++];
    memset(*st, 0, sizeof **st);
    return WHALE_OK;
}

static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static whale_code parse_pretok(loader *L, const cJSON *n, const char *path) {
    if (is_null(n)) return WHALE_OK;
    const char *ty = cJSON_IsObject(n) ? type_of(n) : NULL;
    if (!ty) return FAIL(L, WHALE_ERR_FORMAT, "%s: expected an object with a \"type\"", path);
    char sub[256], b[64];
    whale_code rc;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = field(n, "pretokenizers");
        if (!cJSON_IsArray(list)) return FAIL(L, WHALE_ERR_FORMAT, "%s.pretokenizers: expected an array", path);
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", path, i);
            if ((rc = parse_pretok(L, c, sub))) return rc;
        }
        return WHALE_OK;
    }
    tok_step *st;
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = field(n, "pattern");
        const cJSON *re = cJSON_IsObject(pat) ? field(pat, "Regex") : NULL;
        const cJSON *lit = cJSON_IsObject(pat) ? field(pat, "String") : NULL;
        if (!cJSON_IsString(re) && !cJSON_IsString(lit))
            return FAIL(L, WHALE_ERR_FORMAT, "%s.pattern: expected {\"Regex\": ...} or {\"String\": ...}", path);
        const cJSON *beh = field(n, "behavior");
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        int behavior = -1;
        for (int k = 0; k < 5 && cJSON_IsString(beh); k++)
            if (!strcmp(beh->valuestring, names[k])) behavior = k;
        if (behavior < 0)
            return FAIL(L, cJSON_IsString(beh) ? WHALE_ERR_UNSUPPORTED : WHALE_ERR_FORMAT,
                        "%s.behavior: expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous",
                        path);
        int invert = 0;
        if ((rc = get_bool(L, n, path, "invert", 0, &invert))) return rc;
        if ((rc = add_step(L, path, &st))) return rc;
        st->kind = STEP_SPLIT;
        st->behavior = behavior;
        st->invert = invert;
        if (cJSON_IsString(re)) {
            snprintf(sub, sizeof sub, "%s.pattern.Regex", path);
            if (!(st->source = strdup(re->valuestring))) return FAIL(L, WHALE_ERR_NOMEM, "%s: out of memory", path);
            return compile_regex(L, sub, re->valuestring, 0, &st->re, &st->jit);
        }
        if (!lit->valuestring[0]) return WHALE_OK; /* an empty String pattern never matches */
        snprintf(sub, sizeof sub, "%s.pattern.String", path);
        return compile_regex(L, sub, lit->valuestring, 1, &st->re, &st->jit);
    }
    if (!strcmp(ty, "ByteLevel")) {
        int prefix = 0, use_regex = 0;
        if ((rc = get_bool(L, n, path, "add_prefix_space", 1, &prefix))) return rc;
        if ((rc = get_bool(L, n, path, "use_regex", 1, &use_regex))) return rc;
        if ((rc = add_step(L, path, &st))) return rc;
        st->kind = STEP_BYTELEVEL;
        st->add_prefix_space = prefix;
        st->use_regex = use_regex;
        st->behavior = SPLIT_ISOLATED;
        L->t->byte_level = 1;
        if (use_regex) {
            snprintf(sub, sizeof sub, "%s(use_regex)", path);
            return compile_regex(L, sub, gpt2_pattern, 0, &st->re, &st->jit);
        }
        return WHALE_OK;
    }
    return FAIL(L, WHALE_ERR_UNSUPPORTED,
                "%s: pre-tokenizer type \"%s\" is not supported (only Split, ByteLevel, Sequence)", path,
                shown(ty, b, sizeof b));
}

static whale_code parse_template(loader *L, const cJSON *n, const char *path) {
    whale_tokenizer *t = L->t;
    const cJSON *single = field(n, "single");
    const cJSON *specials = field(n, "special_tokens");
    if (!cJSON_IsArray(single)) return FAIL(L, WHALE_ERR_FORMAT, "%s.single: expected an array", path);
    int seen_a = 0, i = 0;
    t->n_prefix = t->n_suffix = 0;
    for (const cJSON *c = single->child; c; c = c->next, i++) {
        const cJSON *seq = field(c, "Sequence"), *sp = field(c, "SpecialToken");
        if (cJSON_IsObject(seq)) {
            const cJSON *id = field(seq, "id");
            if (seen_a || !cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0)
                return FAIL(L, WHALE_ERR_UNSUPPORTED, "%s.single[%d]: only one sequence, \"A\", is supported",
                            path, i);
            seen_a = 1;
            continue;
        }
        const cJSON *name = cJSON_IsObject(sp) ? field(sp, "id") : NULL;
        if (!cJSON_IsString(name))
            return FAIL(L, WHALE_ERR_FORMAT, "%s.single[%d]: expected {\"Sequence\": ...} or {\"SpecialToken\": ...}",
                        path, i);
        const cJSON *def = cJSON_IsObject(specials) ? field(specials, name->valuestring) : NULL;
        const cJSON *ids = def ? field(def, "ids") : NULL;
        char b[64];
        if (!cJSON_IsArray(ids))
            return FAIL(L, WHALE_ERR_FORMAT, "%s.special_tokens: no ids for \"%s\"", path,
                        shown(name->valuestring, b, sizeof b));
        for (const cJSON *x = ids->child; x; x = x->next) {
            int32_t id;
            if (!json_id(x, &id) || id >= t->n_ids)
                return FAIL(L, WHALE_ERR_FORMAT, "%s.special_tokens.%s.ids: not a token id", path,
                            shown(name->valuestring, b, sizeof b));
            int32_t *dst = seen_a ? t->suffix : t->prefix;
            int *cnt = seen_a ? &t->n_suffix : &t->n_prefix;
            if (*cnt == 4) return FAIL(L, WHALE_ERR_UNSUPPORTED, "%s.single: more than 4 special ids on one side", path);
            dst[(*cnt)++] = id;
        }
    }
    if (!seen_a) return FAIL(L, WHALE_ERR_FORMAT, "%s.single: no {\"Sequence\": {\"id\": \"A\"}}", path);
    return WHALE_OK;
}

static whale_code parse_post(loader *L, const cJSON *n, const char *path) {
    if (is_null(n)) return WHALE_OK;
    const char *ty = cJSON_IsObject(n) ? type_of(n) : NULL;
    if (!ty) return FAIL(L, WHALE_ERR_FORMAT, "%s: expected an object with a \"type\"", path);
    if (!strcmp(ty, "ByteLevel")) return WHALE_OK; /* only adjusts offsets */
    if (!strcmp(ty, "TemplateProcessing")) return parse_template(L, n, path);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = field(n, "processors");
        if (!cJSON_IsArray(list)) return FAIL(L, WHALE_ERR_FORMAT, "%s.processors: expected an array", path);
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.processors[%d]", path, i);
            whale_code rc = parse_post(L, c, sub);
            if (rc) return rc;
        }
        return WHALE_OK;
    }
    char b[64];
    return FAIL(L, WHALE_ERR_UNSUPPORTED,
                "%s: post-processor type \"%s\" is not supported (only ByteLevel, TemplateProcessing, Sequence)",
                path, shown(ty, b, sizeof b));
}

/* The decoders: ByteLevel alone, or the SentencePiece-style chain
 * Replace..., ByteFallback, Fuse (each optional, in that order). */
static whale_code parse_decoder_step(loader *L, const cJSON *n, const char *path, int *stage) {
    whale_tokenizer *t = L->t;
    const char *ty = cJSON_IsObject(n) ? type_of(n) : NULL;
    char b[64];
    if (!ty) return FAIL(L, WHALE_ERR_FORMAT, "%s: expected an object with a \"type\"", path);
    static const char *const order[] = {"Replace", "ByteFallback", "Fuse"};
    int k = 0;
    while (k < 3 && strcmp(ty, order[k]) != 0) k++;
    if (k == 3)
        return FAIL(L, WHALE_ERR_UNSUPPORTED,
                    "%s: decoder type \"%s\" is not supported (only ByteLevel, Replace, ByteFallback, Fuse, Sequence)",
                    path, shown(ty, b, sizeof b));
    if (k < *stage || (k == *stage && k > 0))
        return FAIL(L, WHALE_ERR_UNSUPPORTED, "%s: %s here is not supported (only Replace..., ByteFallback, Fuse in order)",
                    path, ty);
    *stage = k;
    if (k == 0) return parse_replace(L, n, path, t->dec_repl, &t->n_dec_repl);
    if (k == 1) t->dec_byte_fallback = 1;
    return WHALE_OK; /* Fuse: the decoded pieces are concatenated anyway */
}

static whale_code parse_decoder(loader *L, const cJSON *n) {
    const char *ty = cJSON_IsObject(n) ? type_of(n) : NULL;
    if (is_null(n)) return FAIL(L, WHALE_ERR_UNSUPPORTED, "decoder: null is not supported");
    if (!ty) return FAIL(L, WHALE_ERR_FORMAT, "decoder: expected an object with a \"type\"");
    if (!strcmp(ty, "ByteLevel")) {
        L->t->dec_byte_level = 1;
        return WHALE_OK;
    }
    int stage = 0;
    if (strcmp(ty, "Sequence") != 0) return parse_decoder_step(L, n, "decoder", &stage);
    const cJSON *list = field(n, "decoders");
    if (!cJSON_IsArray(list)) return FAIL(L, WHALE_ERR_FORMAT, "decoder.decoders: expected an array");
    int i = 0;
    for (const cJSON *c = list->child; c; c = c->next, i++) {
        char sub[64];
        snprintf(sub, sizeof sub, "decoder.decoders[%d]", i);
        whale_code rc = parse_decoder_step(L, c, sub, &stage);
        if (rc) return rc;
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ model */

static whale_code check_model_options(loader *L, const cJSON *m) {
    char b[64];
    const char *ty = type_of(m);
    if (ty && strcmp(ty, "BPE") != 0)
        return FAIL(L, WHALE_ERR_UNSUPPORTED, "model.type: \"%s\" is not supported (only BPE)", shown(ty, b, sizeof b));
    const cJSON *v = field(m, "dropout");
    if (!is_null(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return FAIL(L, WHALE_ERR_UNSUPPORTED, "model.dropout: BPE dropout is not supported");
    const cJSON *unk = field(m, "unk_token");
    if (!is_null(unk) && (!cJSON_IsString(unk) || !unk->valuestring[0]))
        return FAIL(L, WHALE_ERR_FORMAT, "model.unk_token: expected a non-empty string or null");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        v = field(m, affixes[k]);
        if (!is_null(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return FAIL(L, WHALE_ERR_UNSUPPORTED, "model.%s: a non-empty value is not supported", affixes[k]);
    }
    int fallback = 0;
    whale_code rc = get_bool(L, m, "model", "byte_fallback", 0, &fallback);
    if (rc) return rc;
    L->t->byte_fallback = fallback;
    if ((rc = get_bool(L, m, "model", "fuse_unk", 0, &L->t->fuse_unk))) return rc;
    return get_bool(L, m, "model", "ignore_merges", 0, &L->t->ignore_merges);
}

/* Vocabulary and added tokens: ids, strings and the maps. */
static whale_code load_vocab(loader *L, const cJSON *vocab, const cJSON *added) {
    whale_tokenizer *t = L->t;
    char b[64];
    if (!cJSON_IsObject(vocab)) return FAIL(L, WHALE_ERR_FORMAT, "model.vocab: expected an object");
    if (!is_null(added) && !cJSON_IsArray(added)) return FAIL(L, WHALE_ERR_FORMAT, "added_tokens: expected an array");
    size_t bytes = 0;
    int32_t max_id = -1, nv = 0, na = 0;
    for (const cJSON *c = vocab->child; c; c = c->next, nv++) {
        int32_t id;
        if (!json_id(c, &id))
            return FAIL(L, WHALE_ERR_FORMAT, "model.vocab[\"%s\"]: expected a non-negative integer id",
                        shown(c->string, b, sizeof b));
        if (id > max_id) max_id = id;
        bytes += strlen(c->string) + 1;
    }
    if (cJSON_IsArray(added)) {
        for (const cJSON *c = added->child; c; c = c->next, na++) {
            const cJSON *id = field(c, "id"), *content = field(c, "content");
            int32_t v;
            if (!cJSON_IsObject(c) || !json_id(id, &v))
                return FAIL(L, WHALE_ERR_FORMAT, "added_tokens[%d].id: expected a non-negative integer", na);
            if (!cJSON_IsString(content) || !content->valuestring[0])
                return FAIL(L, WHALE_ERR_FORMAT, "added_tokens[%d].content: expected a non-empty string", na);
            if (v > max_id) max_id = v;
            bytes += strlen(content->valuestring) + 1;
        }
    }
    if (max_id < 0) return FAIL(L, WHALE_ERR_FORMAT, "model.vocab: empty");
    /* The per-id tables are sized by the largest id, so ids must be about
     * as dense as the entries: one huge id would size them by itself. */
    int64_t entries = (int64_t)nv + na;
    if ((int64_t)max_id >= 2 * entries + WHALE_TOKENIZER_ID_SLACK)
        return FAIL(L, WHALE_ERR_FORMAT,
                    "model.vocab / added_tokens: id %d is too sparse for %lld entries (ids must stay below 2 × "
                    "entries + %d)",
                    (int)max_id, (long long)entries, WHALE_TOKENIZER_ID_SLACK);
    t->n_ids = max_id + 1;
    t->model_vocab = nv;
    t->n_added = na;
    t->arena = malloc(bytes + 1);
    t->tok = calloc((size_t)t->n_ids, sizeof *t->tok);
    t->tok_len = calloc((size_t)t->n_ids, sizeof *t->tok_len);
    t->dec_off = calloc((size_t)t->n_ids, sizeof *t->dec_off);
    t->dec_len = calloc((size_t)t->n_ids, sizeof *t->dec_len);
    t->special = calloc((size_t)t->n_ids, 1);
    t->added = calloc((size_t)(na ? na : 1), sizeof *t->added);
    if (!t->arena || !t->tok || !t->tok_len || !t->dec_off || !t->dec_len || !t->special || !t->added ||
        !tok_strmap_init(&t->vocab, (size_t)nv) || !tok_strmap_init(&t->added_map, 2 * (size_t)na))
        return FAIL(L, WHALE_ERR_NOMEM, "out of memory for %d tokens", t->n_ids);
    size_t used = 0;
    for (const cJSON *c = vocab->child; c; c = c->next) {
        int32_t id = (int32_t)c->valuedouble;
        size_t len = strlen(c->string);
        char *s = memcpy(t->arena + used, c->string, len + 1);
        used += len + 1;
        if (tok_strmap_put(&t->vocab, s, len, id) >= 0)
            return FAIL(L, WHALE_ERR_FORMAT, "model.vocab: token \"%s\" appears twice", shown(s, b, sizeof b));
        if (t->tok[id]) {
            char b2[64];
            return FAIL(L, WHALE_ERR_FORMAT, "model.vocab: id %d is used by both \"%s\" and \"%s\"", (int)id,
                        shown(t->tok[id], b, sizeof b), shown(s, b2, sizeof b2));
        }
        t->tok[id] = s;
        t->tok_len[id] = (uint32_t)len;
    }
    int i = 0;
    for (const cJSON *c = cJSON_IsArray(added) ? added->child : NULL; c; c = c->next, i++) {
        tok_added *a = &t->added[i];
        const char *content = field(c, "content")->valuestring;
        size_t len = strlen(content);
        char *s = memcpy(t->arena + used, content, len + 1);
        used += len + 1;
        a->content = s;
        a->len = (uint32_t)len;
        a->id = (int32_t)field(c, "id")->valuedouble;
        static const char *const flags[] = {"special", "lstrip", "rstrip", "single_word", "normalized"};
        uint8_t *dst[] = {&a->special, &a->lstrip, &a->rstrip, &a->single_word, &a->normalized};
        for (int k = 0; k < 5; k++) {
            int v = opt_bool(c, flags[k], k == 4 ? !a->special : 0);
            if (v < 0) return FAIL(L, WHALE_ERR_FORMAT, "added_tokens[%d].%s: expected true or false", i, flags[k]);
            *dst[k] = (uint8_t)v;
        }
        int32_t prev = tok_strmap_put(&t->added_map, s, len, a->id);
        if (prev >= 0 && prev != a->id)
            return FAIL(L, WHALE_ERR_FORMAT, "added_tokens[%d]: \"%s\" is also added with id %d", i,
                        shown(s, b, sizeof b), (int)prev);
        /* a normalized token is matched in normalized text, so in its
         * normalized form, and Hugging Face also decodes it in that form */
        if (a->normalized && t->nfc && !tok_nfc_quick(s, len)) {
            tok_buf nb = {0};
            if (!tok_nfc(&nb, s, len)) {
                free(nb.data);
                return FAIL(L, WHALE_ERR_NOMEM, "added_tokens: out of memory");
            }
            a->content = nb.data;
            a->len = (uint32_t)nb.len;
            a->owned = 1;
            tok_strmap_put(&t->added_map, a->content, a->len, a->id);
        }
        for (int r = 0; a->normalized && r < t->n_norm_repl; r++)
            if (memmem(a->content, a->len, t->norm_repl[r].pat, t->norm_repl[r].plen))
                return FAIL(L, WHALE_ERR_UNSUPPORTED,
                            "added_tokens[%d]: a normalized token that the Replace normalizer changes is not supported", i);
        /* the added token's string wins for id_to_token, as in Hugging Face */
        t->tok[a->id] = a->content;
        t->tok_len[a->id] = a->len;
        if (a->special) t->special[a->id] = 1;
    }
    return WHALE_OK;
}

static whale_code load_merges(loader *L, const cJSON *merges) {
    whale_tokenizer *t = L->t;
    char b[64];
    if (is_null(merges)) merges = NULL;
    else if (!cJSON_IsArray(merges)) return FAIL(L, WHALE_ERR_FORMAT, "model.merges: expected an array");
    int n = merges ? cJSON_GetArraySize(merges) : 0;
    if (!merges_init(&t->merges, (size_t)n)) return FAIL(L, WHALE_ERR_NOMEM, "model.merges: out of memory");
    tok_buf joined = {0};
    int rank = 0;
    whale_code rc = WHALE_OK;
    for (const cJSON *c = merges ? merges->child : NULL; c; c = c->next, rank++) {
        const char *a, *bb;
        size_t la, lb;
        if (cJSON_IsString(c)) {
            const char *sp = strchr(c->valuestring, ' ');
            if (!sp || sp == c->valuestring || !sp[1] || strchr(sp + 1, ' ')) {
                rc = FAIL(L, WHALE_ERR_FORMAT, "model.merges[%d]: expected \"left right\", got \"%s\"", rank,
                          shown(c->valuestring, b, sizeof b));
                break;
            }
            a = c->valuestring;
            la = (size_t)(sp - a);
            bb = sp + 1;
            lb = strlen(bb);
        } else if (cJSON_IsArray(c) && cJSON_GetArraySize(c) == 2 && cJSON_IsString(c->child) &&
                   cJSON_IsString(c->child->next)) {
            a = c->child->valuestring;
            la = strlen(a);
            bb = c->child->next->valuestring;
            lb = strlen(bb);
        } else {
            rc = FAIL(L, WHALE_ERR_FORMAT, "model.merges[%d]: expected \"left right\" or [\"left\", \"right\"]", rank);
            break;
        }
        int32_t ia = tok_strmap_get(&t->vocab, a, la), ib = tok_strmap_get(&t->vocab, bb, lb);
        joined.len = 0;
        if (!tok_buf_append(&joined, a, la) || !tok_buf_append(&joined, bb, lb)) {
            rc = FAIL(L, WHALE_ERR_NOMEM, "model.merges: out of memory");
            break;
        }
        int32_t im = tok_strmap_get(&t->vocab, joined.data, joined.len);
        if (ia < 0 || ib < 0 || im < 0) {
            const char *missing = ia < 0 ? a : ib < 0 ? bb : joined.data;
            size_t ml = ia < 0 ? la : ib < 0 ? lb : joined.len;
            char tmp[64];
            snprintf(tmp, sizeof tmp, "%.*s", (int)(ml < 63 ? ml : 63), missing);
            rc = FAIL(L, WHALE_ERR_FORMAT, "model.merges[%d]: token \"%s\"%s is not in model.vocab", rank,
                      shown(tmp, b, sizeof b), ia >= 0 && ib >= 0 ? " (the merged pair)" : "");
            break;
        }
        /* a repeated pair keeps its last rank, as Hugging Face's map does */
        uint64_t key = pair_key(ia, ib);
        size_t slot = merges_slot(&t->merges, key);
        t->merges.keys[slot] = key;
        t->merges.rank[slot] = (uint32_t)rank;
        t->merges.merged[slot] = im;
    }
    free(joined.data);
    return rc;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The bytes a token decodes to under the SentencePiece-style decoder:
 * the Replace steps, then <0xNN> is the byte NN. Returns the length
 * written to dst (NULL: only measured). */
static size_t decode_piece(const whale_tokenizer *t, const char *s, size_t n, char *dst, tok_buf *tmp, uint8_t *is_byte) {
    tmp->len = 0;
    *is_byte = 0;
    if (!tok_buf_append(tmp, s, n)) return SIZE_MAX;
    for (int r = 0; r < t->n_dec_repl; r++) {
        const tok_replace *rp = &t->dec_repl[r];
        tok_buf o = {0};
        if (!tok_buf_reserve(&o, 0)) return SIZE_MAX;
        for (size_t i = 0; i < tmp->len;) {
            int hit = i + rp->plen <= tmp->len && !memcmp(tmp->data + i, rp->pat, rp->plen);
            if (!(hit ? tok_buf_append(&o, rp->with, rp->wlen) : tok_buf_append(&o, tmp->data + i, 1))) {
                free(o.data);
                return SIZE_MAX;
            }
            i += hit ? rp->plen : 1;
        }
        free(tmp->data);
        *tmp = o;
    }
    const char *d = tmp->data;
    int hi = tmp->len == 6 ? hex_digit(d[3]) : -1, lo = tmp->len == 6 ? hex_digit(d[4]) : -1;
    if (t->dec_byte_fallback && hi >= 0 && lo >= 0 && !memcmp(d, "<0x", 3) && d[5] == '>') {
        if (dst) dst[0] = (char)(hi << 4 | lo);
        *is_byte = 1;
        return 1;
    }
    if (dst && tmp->len) memcpy(dst, tmp->data, tmp->len);
    return tmp->len;
}

/* Decoded bytes of every id. ByteLevel: a token whose characters all
 * stand for bytes decodes to those bytes, any other token to its own
 * text. Otherwise the Replace / ByteFallback chain (decode_piece). */
static whale_code build_decoded(loader *L) {
    whale_tokenizer *t = L->t;
    tok_buf tmp = {0};
    size_t total = 1, used = 0;
    uint8_t is_byte;
    t->byte_tok = calloc((size_t)t->n_ids, 1);
    if (!t->byte_tok) goto oom;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!t->tok[id]) continue;
        size_t k = t->dec_byte_level ? t->tok_len[id]
                                     : decode_piece(t, t->tok[id], t->tok_len[id], NULL, &tmp, &is_byte);
        if (k == SIZE_MAX) goto oom;
        total += k;
    }
    t->dec = malloc(total);
    if (!t->dec) goto oom;
    for (int32_t id = 0; id < t->n_ids; id++) {
        const unsigned char *s = (const unsigned char *)t->tok[id];
        if (!s) continue;
        size_t n = t->tok_len[id], k = 0, j = 0;
        char *dst = t->dec + used;
        if (!t->dec_byte_level) {
            if ((k = decode_piece(t, t->tok[id], n, dst, &tmp, &t->byte_tok[id])) == SIZE_MAX) goto oom;
        } else {
            while (j < n) {
                uint32_t cp;
                j += (size_t)tok_utf8_decode(s + j, &cp);
                int byte = byte_of_char(cp);
                if (byte < 0) break;
                dst[k++] = (char)byte;
            }
            if (j < n || k == 0) {
                memcpy(dst, s, n);
                k = n;
            }
        }
        t->dec_off[id] = used;
        t->dec_len[id] = (uint32_t)k;
        used += k;
    }
    free(tmp.data);
    return WHALE_OK;
oom:
    free(tmp.data);
    return FAIL(L, WHALE_ERR_NOMEM, "out of memory for %d tokens", t->n_ids);
}

/* ------------------------------------------------------------ added-token sets */

static int cmp_added(const void *pa, const void *pb) {
    const tok_added *a = *(tok_added *const *)pa, *b = *(tok_added *const *)pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->content, b->content, n);
    if (c) return c;
    return (a->len > b->len) - (a->len < b->len);
}

static whale_code build_added_sets(loader *L) {
    whale_tokenizer *t = L->t;
    int need_word = 0;
    tok_added_set *sets[2] = {&t->raw_set, &t->norm_set};
    for (int s = 0; s < 2; s++) {
        sets[s]->tok = malloc((size_t)(t->n_added ? t->n_added : 1) * sizeof(tok_added *));
        if (!sets[s]->tok) return FAIL(L, WHALE_ERR_NOMEM, "added_tokens: out of memory");
    }
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (t->split_special && a->special) continue; /* matched as plain text */
        tok_added_set *set = a->normalized ? &t->norm_set : &t->raw_set;
        set->tok[set->n++] = a;
        set->first[(unsigned char)a->content[0]] = 1;
        need_word |= a->single_word;
    }
    for (int s = 0; s < 2; s++) qsort(sets[s]->tok, (size_t)sets[s]->n, sizeof(tok_added *), cmp_added);
    if (need_word) {
        int jit;
        return compile_regex(L, "added_tokens(single_word)",
                             "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]", 0, &t->word_re, &jit);
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ tokenizer_config.json */

static whale_code load_config(loader *L, const cJSON *cfg) {
    whale_tokenizer *t = L->t;
    char b[64];
    if (!cJSON_IsObject(cfg)) return FAIL(L, WHALE_ERR_FORMAT, "expected a JSON object");
    static const char *const roles[] = {"bos_token", "eos_token", "pad_token"};
    for (int r = 0; r < 3; r++) {
        const cJSON *v = field(cfg, roles[r]);
        if (cJSON_IsObject(v)) v = field(v, "content");
        if (is_null(v)) continue;
        if (!cJSON_IsString(v))
            return FAIL(L, WHALE_ERR_FORMAT, "%s: expected a string or {\"content\": ...}", roles[r]);
        int32_t id = whale_tokenizer_token_to_id(t, v->valuestring);
        if (id < 0)
            return FAIL(L, WHALE_ERR_FORMAT, "%s: \"%s\" is not a token of tokenizer.json", roles[r],
                        shown(v->valuestring, b, sizeof b));
        t->role_id[r] = id;
        t->role_tok[r] = strdup(v->valuestring);
        if (!t->role_tok[r]) return FAIL(L, WHALE_ERR_NOMEM, "out of memory");
    }
    int v = 0;
    whale_code rc;
    if ((rc = get_bool(L, cfg, "tokenizer_config", "clean_up_tokenization_spaces", 0, &v))) return rc;
    t->clean_up = v; /* decode as transformers does (Llama 3's files ask for it) */
    if ((rc = get_bool(L, cfg, "tokenizer_config", "split_special_tokens", 0, &t->split_special))) return rc;
    /* add_bos_token / add_eos_token rebuild the template, as transformers does */
    static const char *const adds[] = {"add_bos_token", "add_eos_token"};
    for (int k = 0; k < 2; k++) {
        int on = opt_bool(cfg, adds[k], -2);
        if (on == -2) continue;
        if (on < 0) return FAIL(L, WHALE_ERR_FORMAT, "%s: expected true or false", adds[k]);
        int32_t id = t->role_id[k]; /* BOS for add_bos_token, EOS for add_eos_token */
        if (on && id < 0) return FAIL(L, WHALE_ERR_FORMAT, "%s: true but %s is not set", adds[k], roles[k]);
        if (k == 0) {
            t->n_prefix = on;
            t->prefix[0] = id;
        } else {
            t->n_suffix = on;
            t->suffix[0] = id;
        }
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ load */

static whale_code parse_json_file(const char *path, cJSON **out, int optional, whale_err *err) {
    char *buf;
    size_t n;
    *out = NULL;
    if (optional) {
        struct stat st;
        if (stat(path, &st) != 0 && errno == ENOENT) return WHALE_OK;
    }
    whale_code rc = whale_read_file_max(path, WHALE_MAX_JSON_FILE, &buf, &n, err);
    if (rc) return rc;
    size_t bad = tok_utf8_check((const unsigned char *)buf, n);
    if (bad < n) {
        free(buf);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: byte %zu: invalid UTF-8", path, bad);
    }
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!*out) {
        int line = 1, col = 1;
        for (const char *p = buf; end && p < end && p < buf + n; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        free(buf);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: invalid JSON at line %d, column %d", path, line, col);
    }
    free(buf);
    return WHALE_OK;
}

/* unk_token's id and, for byte_fallback, the ids of <0x00>..<0xFF>. */
static whale_code resolve_unknowns(loader *L, const cJSON *unk) {
    whale_tokenizer *t = L->t;
    char b[64];
    t->unk_id = -1;
    if (cJSON_IsString(unk) && (t->unk_id = tok_strmap_get(&t->vocab, unk->valuestring, strlen(unk->valuestring))) < 0)
        return FAIL(L, WHALE_ERR_FORMAT, "model.unk_token: \"%s\" is not in model.vocab",
                    shown(unk->valuestring, b, sizeof b));
    for (int k = 0; k < 256; k++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", k);
        t->byte_id[k] = t->byte_fallback ? tok_strmap_get(&t->vocab, name, 6) : -1;
    }
    return WHALE_OK;
}

static whale_code load_all(loader *L, const cJSON *root) {
    whale_tokenizer *t = L->t;
    whale_code rc;
    if (!cJSON_IsObject(root)) return FAIL(L, WHALE_ERR_FORMAT, "expected a JSON object");
    if (!is_null(field(root, "truncation")))
        return FAIL(L, WHALE_ERR_UNSUPPORTED, "truncation: not supported (must be null)");
    if (!is_null(field(root, "padding")))
        return FAIL(L, WHALE_ERR_UNSUPPORTED, "padding: not supported (must be null)");
    const cJSON *model = field(root, "model");
    if (!cJSON_IsObject(model)) return FAIL(L, WHALE_ERR_FORMAT, "model: expected an object");
    if ((rc = check_model_options(L, model))) return rc;
    if ((rc = parse_normalizer(L, field(root, "normalizer"), "normalizer"))) return rc;
    if ((rc = load_vocab(L, field(model, "vocab"), field(root, "added_tokens")))) return rc;
    if ((rc = load_merges(L, field(model, "merges")))) return rc;
    if ((rc = resolve_unknowns(L, field(model, "unk_token")))) return rc;
    if ((rc = parse_pretok(L, field(root, "pre_tokenizer"), "pre_tokenizer"))) return rc;
    if ((rc = parse_post(L, field(root, "post_processor"), "post_processor"))) return rc;
    if ((rc = parse_decoder(L, field(root, "decoder")))) return rc;
    if ((rc = build_decoded(L))) return rc;
    if (t->byte_level) {
        uint32_t map[256];
        byte_level_map(map);
        for (int b = 0; b < 256; b++) {
            char s[4];
            int n = tok_utf8_encode(map[b], s);
            t->unit_id[b] = tok_strmap_get(&t->vocab, s, (size_t)n);
        }
    }
    return WHALE_OK;
}

static whale_code alloc_scratch(whale_tokenizer *t, whale_err *err) {
    t->md = pcre2_match_data_create(1, NULL);
    t->mctx = pcre2_match_context_create(NULL);
    /* long runs (100 KB of spaces) need more than the default 32 KB */
    t->jit_stack = pcre2_jit_stack_create(32 * 1024, WHALE_REGEX_STACK_BYTES, NULL);
    if (!t->md || !t->mctx || !t->jit_stack) return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
    pcre2_jit_stack_assign(t->mctx, NULL, t->jit_stack);
    /* one regex call's limits; the whole encode has a work budget too */
    pcre2_set_match_limit(t->mctx, WHALE_REGEX_MATCH_LIMIT);
    pcre2_set_depth_limit(t->mctx, WHALE_REGEX_MATCH_LIMIT);
    pcre2_set_heap_limit(t->mctx, (uint32_t)(WHALE_REGEX_STACK_BYTES / 1024));
    return WHALE_OK;
}

whale_code whale_tokenizer_load(const char *dir, whale_tokenizer **out, whale_err *err) {
    *out = NULL;
    if (!dir || !*dir) return whale_errf(err, WHALE_ERR_ARG, "tokenizer: no directory given");
    size_t dl = strlen(dir);
    char *json_path = malloc(dl + 32), *cfg_path = malloc(dl + 32);
    whale_tokenizer *t = calloc(1, sizeof *t);
    cJSON *root = NULL, *cfg = NULL;
    whale_code rc = WHALE_OK;
    if (!json_path || !cfg_path || !t) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (int r = 0; r < 3; r++) t->role_id[r] = -1;
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) { /* a tokenizer.json file itself */
        strcpy(json_path, dir);
        const char *slash = strrchr(dir, '/');
        int dn = slash ? (int)(slash - dir + 1) : 0;
        snprintf(cfg_path, dl + 32, "%.*stokenizer_config.json", dn, dir);
    } else {
        snprintf(json_path, dl + 32, "%s/tokenizer.json", dir);
        snprintf(cfg_path, dl + 32, "%s/tokenizer_config.json", dir);
    }
    if ((rc = parse_json_file(json_path, &root, 0, err))) goto done;
    loader L = {json_path, err, t};
    if ((rc = load_all(&L, root))) goto done;
    if ((rc = parse_json_file(cfg_path, &cfg, 1, err))) goto done;
    if (cfg) {
        loader C = {cfg_path, err, t};
        if ((rc = load_config(&C, cfg))) goto done;
    }
    if ((rc = build_added_sets(&L))) goto done;
    if (!(t->path = strdup(json_path))) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    rc = alloc_scratch(t, err);
done:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    free(json_path);
    free(cfg_path);
    if (rc) whale_tokenizer_free(t);
    else *out = t;
    return rc;
}

void whale_tokenizer_free(whale_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re), free(t->steps[i].source);
    free(t->steps);
    for (int r = 0; r < t->n_norm_repl; r++) free(t->norm_repl[r].pat), free(t->norm_repl[r].with);
    for (int r = 0; r < t->n_dec_repl; r++) free(t->dec_repl[r].pat), free(t->dec_repl[r].with);
    pcre2_code_free(t->word_re);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].owned) free((char *)t->added[i].content);
    free(t->added);
    free(t->raw_set.tok);
    free(t->norm_set.tok);
    tok_strmap_free(&t->vocab);
    tok_strmap_free(&t->added_map);
    merges_free(&t->merges);
    free(t->tok);
    free(t->tok_len);
    free(t->dec_off);
    free(t->dec_len);
    free(t->byte_tok);
    free(t->special);
    free(t->arena);
    free(t->dec);
    for (int r = 0; r < 3; r++) free(t->role_tok[r]);
    pcre2_match_data_free(t->md);
    pcre2_match_context_free(t->mctx);
    pcre2_jit_stack_free(t->jit_stack);
    tok_encode_scratch_free(t);
    free(t->path);
    free(t);
}

/* ------------------------------------------------------------ lookups */

int whale_tokenizer_vocab_size(const whale_tokenizer *t) { return t->n_ids; }

int32_t whale_tokenizer_token_to_id(const whale_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    int32_t id = tok_strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : tok_strmap_get(&t->vocab, token, n);
}

const char *whale_tokenizer_id_to_token(const whale_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->tok[id] : NULL;
}

const char *whale_tokenizer_token_bytes(const whale_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->tok[id]) {
        *len = 0;
        return NULL;
    }
    *len = t->dec_len[id];
    return t->dec + t->dec_off[id];
}

int whale_tokenizer_is_special(const whale_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

int32_t whale_tokenizer_role_id(const whale_tokenizer *t, whale_token_role role) {
    return (unsigned)role < 3 ? t->role_id[role] : -1;
}

const char *whale_tokenizer_role_token(const whale_tokenizer *t, whale_token_role role) {
    return (unsigned)role < 3 ? t->role_tok[role] : NULL;
}

/* ------------------------------------------------------------ encode (public) */

whale_code whale_tokenizer_encode(whale_tokenizer *t, const char *text, size_t len, int add_special,
                                  int32_t **ids, int *n, whale_err *err) {
    *ids = NULL;
    *n = 0;
    if (!text && len) return whale_errf(err, WHALE_ERR_ARG, "tokenizer encode: NULL text");
    tok_buf out = {0}, fixed = {0};
    whale_code rc = WHALE_OK;
    const char *src = text ? text : "";
    if (tok_utf8_check((const unsigned char *)src, len) < len) {
        int nomem;
        tok_utf8_lossy(&fixed, (const unsigned char *)src, len, 1, &nomem);
        if (nomem) {
            rc = whale_errf(err, WHALE_ERR_NOMEM, "tokenizer encode: out of memory");
            goto done;
        }
        src = fixed.data;
        len = fixed.len;
    }
    if (!tok_buf_reserve(&out, 64)) goto oom;
    if (add_special && !tok_buf_append(&out, t->prefix, (size_t)t->n_prefix * sizeof(int32_t))) goto oom;
    if ((rc = tok_encode_valid(t, src, len, &out, err))) goto done;
    if (add_special && !tok_buf_append(&out, t->suffix, (size_t)t->n_suffix * sizeof(int32_t))) goto oom;
    if (out.len / sizeof(int32_t) > (size_t)INT32_MAX) {
        rc = whale_errf(err, WHALE_ERR_RANGE, "tokenizer encode: more than 2^31 tokens");
        goto done;
    }
    *n = (int)(out.len / sizeof(int32_t));
    *ids = (int32_t *)out.data;
    out.data = NULL;
    goto done;
oom:
    rc = whale_errf(err, WHALE_ERR_NOMEM, "tokenizer encode: out of memory");
done:
    free(out.data);
    free(fixed.data);
    return rc;
}

/* ------------------------------------------------------------ decode */

/* A run of ByteFallback tokens ends: its bytes if they are valid UTF-8,
 * else one U+FFFD per byte, as Hugging Face's ByteFallback decoder. */
static int end_byte_run(tok_buf *b, tok_buf *run) {
    int ok = 1;
    if (tok_utf8_check((const unsigned char *)run->data, run->len) == run->len) ok = tok_buf_append(b, run->data, run->len);
    else
        for (size_t i = 0; ok && i < run->len; i++) ok = tok_buf_append(b, "\xEF\xBF\xBD", 3);
    run->len = 0;
    return ok;
}

/* Append the bytes of one id (a ByteFallback token's to run); -1 for a
 * negative id. */
static int append_id(const whale_tokenizer *t, tok_buf *b, tok_buf *run, int32_t id, int skip_special) {
    if (id < 0) return -1;
    if (id >= t->n_ids || !t->tok[id] || (skip_special && t->special[id])) return 1;
    if (t->byte_tok[id]) return tok_buf_append(run, t->dec + t->dec_off[id], 1);
    if (run->len && !end_byte_run(b, run)) return 0;
    return tok_buf_append(b, t->dec + t->dec_off[id], t->dec_len[id]);
}

/* transformers' clean_up_tokenization on n bytes, in place (each pattern
 * replaced left to right over the whole text, in this order, as Python's
 * str.replace chain does); returns the new length. */
static size_t clean_up(char *s, size_t n) {
    static const char *const pat[][2] = {{" .", "."},  {" ?", "?"},   {" !", "!"},   {" ,", ","},   {" ' ", "'"},
                                          {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t k = 0; k < sizeof pat / sizeof pat[0]; k++) {
        size_t pl = strlen(pat[k][0]), rl = strlen(pat[k][1]), o = 0;
        for (size_t i = 0; i < n;) {
            if (i + pl <= n && !memcmp(s + i, pat[k][0], pl)) {
                memmove(s + o, pat[k][1], rl);
                o += rl, i += pl;
            } else s[o++] = s[i++];
        }
        n = o;
    }
    return n;
}

/* How much of the n decoded bytes can be cleaned up and emitted now: no
 * pattern (at most 4 bytes, each starting with a space) may straddle the
 * cut, so the 4 bytes before it hold no space, and it falls between
 * characters. */
static size_t clean_up_safe(const char *s, size_t n) {
    for (size_t p = n; p > 0; p--) {
        if (p < 4) return 0;
        if (p < n && ((unsigned char)s[p] & 0xC0) == 0x80) continue;
        if (!memchr(s + p - 4, ' ', 4)) return p;
    }
    return 0;
}

whale_code whale_tokenizer_decode(const whale_tokenizer *t, const int32_t *ids, int n, int skip_special,
                                  char **text, size_t *len, whale_err *err) {
    tok_buf raw = {0}, out = {0}, run = {0};
    *text = NULL;
    if (len) *len = 0;
    for (int i = 0; i < n; i++) {
        int r = append_id(t, &raw, &run, ids[i], skip_special);
        if (r < 0) {
            free(raw.data);
            free(run.data);
            return whale_errf(err, WHALE_ERR_RANGE, "tokenizer decode: ids[%d] = %d is negative", i, (int)ids[i]);
        }
        if (!r) goto oom;
    }
    if (run.len && !end_byte_run(&raw, &run)) goto oom;
    free(run.data);
    run.data = NULL;
    int nomem;
    tok_utf8_lossy(&out, (const unsigned char *)(raw.data ? raw.data : ""), raw.len, 1, &nomem);
    if (nomem || !tok_buf_reserve(&out, 0)) goto oom;
    if (t->clean_up) out.len = clean_up(out.data, out.len);
    out.data[out.len] = 0;
    free(raw.data);
    *text = out.data;
    if (len) *len = out.len;
    return WHALE_OK;
oom:
    free(raw.data);
    free(run.data);
    free(out.data);
    return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer decode: out of memory");
}

struct whale_detokenizer {
    const whale_tokenizer *t;
    int skip_special;
    tok_buf pending; /* bytes of an unfinished character */
    tok_buf out;
    tok_buf held;    /* clean_up: decoded text a later token may still change */
    tok_buf run;     /* ByteFallback tokens not yet followed by another token */
};

whale_code whale_detokenizer_new(const whale_tokenizer *t, int skip_special, whale_detokenizer **out,
                                 whale_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return whale_errf(err, WHALE_ERR_NOMEM, "detokenizer: out of memory");
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    return WHALE_OK;
}

void whale_detokenizer_free(whale_detokenizer *d) {
    if (!d) return;
    free(d->pending.data);
    free(d->out.data);
    free(d->held.data);
    free(d->run.data);
    free(d);
}

static whale_code detok_emit(whale_detokenizer *d, int final, const char **text, size_t *len, whale_err *err) {
    int nomem;
    d->out.len = 0;
    size_t used = tok_utf8_lossy(&d->out, (const unsigned char *)(d->pending.data ? d->pending.data : ""),
                                 d->pending.len, final, &nomem);
    if (nomem || !tok_buf_reserve(&d->out, 0)) return whale_errf(err, WHALE_ERR_NOMEM, "detokenizer: out of memory");
    d->out.data[d->out.len] = 0;
    if (used) { /* pending.data may still be NULL when nothing was pushed */
        memmove(d->pending.data, d->pending.data + used, d->pending.len - used);
        d->pending.len -= used;
    }
    if (d->t->clean_up) { /* emit what no later token can change, cleaned up */
        if (!tok_buf_append(&d->held, d->out.data, d->out.len) || !tok_buf_reserve(&d->out, d->held.len))
            return whale_errf(err, WHALE_ERR_NOMEM, "detokenizer: out of memory");
        size_t cut = final ? d->held.len : clean_up_safe(d->held.data, d->held.len);
        if (cut) {
            memcpy(d->out.data, d->held.data, cut);
            memmove(d->held.data, d->held.data + cut, d->held.len - cut);
            d->held.len -= cut;
        }
        d->out.len = clean_up(d->out.data, cut);
        d->out.data[d->out.len] = 0;
    }
    *text = d->out.data;
    if (len) *len = d->out.len;
    return WHALE_OK;
}

whale_code whale_detokenizer_push(whale_detokenizer *d, int32_t id, const char **text, size_t *len,
                                  whale_err *err) {
    int r = append_id(d->t, &d->pending, &d->run, id, d->skip_special);
    if (r < 0) return whale_errf(err, WHALE_ERR_RANGE, "detokenizer: id %d is negative", (int)id);
    if (!r) return whale_errf(err, WHALE_ERR_NOMEM, "detokenizer: out of memory");
    return detok_emit(d, 0, text, len, err);
}

whale_code whale_detokenizer_flush(whale_detokenizer *d, const char **text, size_t *len, whale_err *err) {
    if (d->run.len && !end_byte_run(&d->pending, &d->run))
        return whale_errf(err, WHALE_ERR_NOMEM, "detokenizer: out of memory");
    return detok_emit(d, 1, text, len, err);
}
