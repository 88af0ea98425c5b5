/* Byte-level BPE training (see bpe_train.h for the design and the output
 * format, docs/tokenizer-training.md for usage). */
#include "whale_bpe.h"

#include "core/core.h"
#include "io/tokenizer.h" /* tok_buf, UTF-8 helpers, PCRE2 */
#include "io/tokenizer_uniregex.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ DeepSeek-V3 */

/* The three Split patterns of DeepSeek-V3's pre-tokenizer, exactly as its
 * tokenizer.json has them (Oniguruma syntax; \r and \n are the characters). */
const char *const whale_deepseek_v3_splits[3] = {
    "\\p{N}{1,3}",
    /* CJK ideographs U+4E00-U+9FA5, hiragana, katakana */
    "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
     " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
};

/* DeepSeek-V3's chat template, verbatim from its tokenizer_config.json (so
 * chat-template detection recognises it; tests/test_bpe_train.c compares it
 * with the real file when that is present). */
static const char chat_template[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif "
    "%}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='"
    "', is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' "
    "%}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'"
    "] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt "
    "+ '\n\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false "
    "-%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' "
    "and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls'"
    "]%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' "
    "+ tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' "
    "+ tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first "
    "= true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' "
    "+ tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' "
    "+ '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif "
    "%}{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is "
    "not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'"
    "}}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'"
    "}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if "
    "ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'"
    "] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\n<｜tool▁output▁begin｜>' "
    "+ message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if "
    "ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool "
    "%}{{'<｜Assistant｜>'}}{% endif %}";

/* Added tokens in id order within their block: the first three open the
 * vocabulary, the chat markers (and extra specials) close it. */
enum { N_HEAD = 3, N_TAIL = 2 };
static const char *const head_tokens[N_HEAD] = {WHALE_BPE_BOS, WHALE_BPE_EOS, WHALE_BPE_PAD};
static const char *const tail_tokens[N_TAIL] = {WHALE_BPE_USER, WHALE_BPE_ASSISTANT};

/* ------------------------------------------------------------ byte-level map */

/* GPT-2's byte -> character map: printable Latin-1 bytes stand for
 * themselves, the other 68 take U+0100.. in byte order. */
static int byte_kept(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

static uint32_t byte_char(int b) {
    if (byte_kept(b)) return (uint32_t)b;
    uint32_t k = 0;
    for (int x = 0; x < b; x++) k += !byte_kept(x);
    return 0x100 + k;
}

/* ------------------------------------------------------------ growable arrays */

/* Make room for need elements of size elem in *p (capacity *cap). */
static int grow(void *pp, size_t *cap, size_t need, size_t elem) {
    void **p = pp;
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem) return 0;
        c *= 2;
    }
    void *q = realloc(*p, c * elem);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* ------------------------------------------------------------ string table */

/* Distinct byte strings, numbered in order of arrival, stored back to back
 * in one arena (offsets, not pointers, so the arena may move). */
typedef struct {
    char *bytes;
    size_t len, cap;
    size_t *off;
    uint32_t *slen;
    uint64_t *hash;
    size_t n, ecap;
    int32_t *slot; /* entry + 1, 0 = empty */
    size_t mask;
} strtab;

static void strtab_free(strtab *t) {
    free(t->bytes);
    free(t->off);
    free(t->slen);
    free(t->hash);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

static const char *strtab_str(const strtab *t, size_t i, uint32_t *len) {
    *len = t->slen[i];
    return t->bytes + t->off[i];
}

static int strtab_rehash(strtab *t, size_t cap) {
    int32_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return 0;
    for (size_t i = 0; i < t->n; i++) {
        size_t k = (size_t)t->hash[i] & (cap - 1);
        while (slot[k]) k = (k + 1) & (cap - 1);
        slot[k] = (int32_t)i + 1;
    }
    free(t->slot);
    t->slot = slot;
    t->mask = cap - 1;
    return 1;
}

/* Index of s, adding it if new (*added = 1). -1 when out of memory or when
 * the table is full (2^31 - 1 strings). */
static int64_t strtab_put(strtab *t, const char *s, size_t n, int *added) {
    uint64_t h = hash_bytes(s, n);
    *added = 0;
    if (t->slot) {
        for (size_t k = (size_t)h & t->mask; t->slot[k]; k = (k + 1) & t->mask) {
            size_t i = (size_t)t->slot[k] - 1;
            if (t->hash[i] == h && t->slen[i] == n && !memcmp(t->bytes + t->off[i], s, n)) return (int64_t)i;
        }
    }
    if (t->n >= INT32_MAX - 1 || n > UINT32_MAX) return -1;
    if (2 * (t->n + 1) > (t->slot ? t->mask + 1 : 0) && !strtab_rehash(t, t->slot ? 2 * (t->mask + 1) : 1024))
        return -1;
    if (!grow(&t->bytes, &t->cap, t->len + n + 1, 1)) return -1;
    size_t need = t->n + 1, c1 = t->ecap, c2 = t->ecap;
    if (!grow(&t->off, &c1, need, sizeof *t->off) || !grow(&t->slen, &c2, need, sizeof *t->slen)) return -1;
    if (!grow(&t->hash, &t->ecap, need, sizeof *t->hash)) return -1;
    memcpy(t->bytes + t->len, s, n);
    t->off[t->n] = t->len;
    t->slen[t->n] = (uint32_t)n;
    t->hash[t->n] = h;
    t->len += n;
    size_t k = (size_t)h & t->mask;
    while (t->slot[k]) k = (k + 1) & t->mask;
    t->slot[k] = (int32_t)t->n + 1;
    *added = 1;
    return (int64_t)t->n++;
}

/* ------------------------------------------------------------ trainer */

#define MAX_EXTRA_SPECIAL 64
/* Plain text is read in blocks of about this size (see add_plain). */
#define READ_BLOCK ((size_t)16 << 20)

struct whale_bpe_trainer {
    whale_bpe_train_opts opts;
    char **extra;              /* copies of opts.extra_special */
    /* added tokens, cut out of the text before pre-tokenizing (as the
     * encoder does); longest match at the leftmost position */
    const char *added[N_HEAD + N_TAIL + MAX_EXTRA_SPECIAL];
    size_t added_len[N_HEAD + N_TAIL + MAX_EXTRA_SPECIAL];
    int n_added;
    uint8_t added_first[256];

    pcre2_code *re[3];
    int jit[3];
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;

    tok_buf fixed;             /* the current text with invalid UTF-8 replaced */
    strtab words;              /* distinct pre-tokens */
    int64_t *wcount;
    size_t wcap;
    int added_newline;         /* some added token holds a '\n' */
    int64_t n_bytes, n_words;
    int64_t read_done, read_total; /* file bytes, for progress */
    double seconds_count;
    int finished;
};

void whale_bpe_train_defaults(whale_bpe_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->vocab_size = 8192;
    o->min_frequency = 2;
    o->model_max_length = 2048;
}

/* Oniguruma -> PCRE2 for the constructs of whale_deepseek_v3_splits, the way the
 * tokenizer's loader translates them: \s is White_Space (PCRE2's \s misses
 * U+0085) and \p{..} also gets the characters Unicode assigned after
 * PCRE2's database. Everything else means the same in both engines. */
static int translate(const char *src, tok_buf *out) {
    int in_class = 0;
    for (size_t i = 0; src[i]; i++) {
        char c = src[i];
        if (c == '\\' && src[i + 1]) {
            char e = src[++i];
            if (e == 's' || e == 'S') {
                if (!tok_buf_append(out, e == 's' ? "\\p{White_Space}" : "\\P{White_Space}", 15)) return 0;
            } else if (e == 'p' && src[i + 1] == '{') {
                const char *close = strchr(src + i, '}');
                char name[16];
                if (!close || (size_t)(close - (src + i + 2)) >= sizeof name) return 0;
                size_t len = (size_t)(close - (src + i + 2));
                memcpy(name, src + i + 2, len);
                name[len] = 0;
                const char *extra = "";
                for (size_t x = 0; x < sizeof uni_regex_extra / sizeof uni_regex_extra[0]; x++)
                    if (!strcmp(uni_regex_extra[x].name, name)) extra = uni_regex_extra[x].extra;
                int wrap = !in_class && *extra;
                if ((wrap && !tok_buf_append(out, "[", 1)) || !tok_buf_append(out, "\\p{", 3) ||
                    !tok_buf_append(out, name, len) || !tok_buf_append(out, "}", 1) ||
                    !tok_buf_append(out, extra, strlen(extra)) || (wrap && !tok_buf_append(out, "]", 1)))
                    return 0;
                i += len + 2;
            } else {
                char esc[2] = {'\\', e};
                if (!tok_buf_append(out, esc, 2)) return 0;
            }
            continue;
        }
        if (c == '[' && !in_class) in_class = 1;
        else if (c == ']' && in_class) in_class = 0;
        if (!tok_buf_append(out, &c, 1)) return 0;
    }
    return 1;
}

static whale_code compile_patterns(whale_bpe_trainer *tr, whale_err *err) {
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) return whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    whale_code rc = WHALE_OK;
    for (int k = 0; k < 3 && !rc; k++) {
        tok_buf src = {0};
        if (!translate(whale_deepseek_v3_splits[k], &src)) {
            rc = whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
        } else {
            int ecode;
            PCRE2_SIZE eoff;
            uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_ALT_CIRCUMFLEX;
            tr->re[k] = pcre2_compile((PCRE2_SPTR)src.data, src.len, opts, &ecode, &eoff, cc);
            if (!tr->re[k]) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(ecode, msg, sizeof msg);
                rc = whale_errf(err, WHALE_ERR_INTERNAL, "bpe train: pre-tokenizer regex %d: %s", k, (const char *)msg);
            } else {
                tr->jit[k] = pcre2_jit_compile(tr->re[k], PCRE2_JIT_COMPLETE) == 0;
            }
        }
        free(src.data);
    }
    pcre2_compile_context_free(cc);
    if (rc) return rc;
    tr->md = pcre2_match_data_create(1, NULL);
    tr->mctx = pcre2_match_context_create(NULL);
    /* long runs (100 KB of spaces) need more than the default 32 KB */
    tr->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!tr->md || !tr->mctx || !tr->jit_stack) return whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
    pcre2_jit_stack_assign(tr->mctx, NULL, tr->jit_stack);
    return WHALE_OK;
}

whale_code whale_bpe_trainer_new(const whale_bpe_train_opts *opts, whale_bpe_trainer **out, whale_err *err) {
    *out = NULL;
    int fixed = WHALE_BPE_FIXED_TOKENS;
    if (opts->n_extra_special < 0 || opts->n_extra_special > MAX_EXTRA_SPECIAL)
        return whale_errf(err, WHALE_ERR_ARG, "bpe train: at most %d extra special tokens", MAX_EXTRA_SPECIAL);
    if (opts->vocab_size < fixed + opts->n_extra_special)
        return whale_errf(err, WHALE_ERR_ARG,
                          "bpe train: vocab size %d is smaller than the %d fixed tokens (3 special + 256 bytes + "
                          "2 chat markers + %d extra special)",
                          opts->vocab_size, fixed + opts->n_extra_special, opts->n_extra_special);
    if (opts->min_frequency < 1)
        return whale_errf(err, WHALE_ERR_ARG, "bpe train: min frequency must be at least 1, got %d", opts->min_frequency);
    if (opts->model_max_length < 1)
        return whale_errf(err, WHALE_ERR_ARG, "bpe train: model max length must be positive, got %d",
                          opts->model_max_length);
    whale_bpe_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) return whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
    tr->opts = *opts;
    tr->opts.extra_special = NULL;
    whale_code rc = WHALE_OK;
    for (int i = 0; i < N_HEAD; i++) tr->added[tr->n_added++] = head_tokens[i];
    for (int i = 0; i < N_TAIL; i++) tr->added[tr->n_added++] = tail_tokens[i];
    if (opts->n_extra_special) {
        tr->extra = calloc((size_t)opts->n_extra_special, sizeof *tr->extra);
        if (!tr->extra) rc = whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
    }
    for (int i = 0; i < opts->n_extra_special && !rc; i++) {
        const char *s = opts->extra_special[i];
        size_t n = s ? strlen(s) : 0;
        if (!n || tok_utf8_check((const unsigned char *)s, n) < n) {
            rc = whale_errf(err, WHALE_ERR_ARG, "bpe train: special token %d is %s", i + 1,
                            n ? "not valid UTF-8" : "empty");
            break;
        }
        for (int k = 0; k < tr->n_added; k++)
            if (!strcmp(tr->added[k], s)) rc = whale_errf(err, WHALE_ERR_ARG, "bpe train: special token \"%s\" is given twice or built in", s);
        if (rc) break;
        if (!(tr->extra[i] = strdup(s))) {
            rc = whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
            break;
        }
        tr->added[tr->n_added++] = tr->extra[i];
    }
    for (int k = 0; k < tr->n_added && !rc; k++) {
        tr->added_len[k] = strlen(tr->added[k]);
        tr->added_first[(unsigned char)tr->added[k][0]] = 1;
        tr->added_newline |= strchr(tr->added[k], '\n') != NULL;
    }
    if (!rc) rc = compile_patterns(tr, err);
    if (rc) {
        whale_bpe_trainer_free(tr);
        return rc;
    }
    *out = tr;
    return WHALE_OK;
}

void whale_bpe_trainer_free(whale_bpe_trainer *tr) {
    if (!tr) return;
    for (int i = 0; tr->extra && i < tr->opts.n_extra_special; i++) free(tr->extra[i]);
    free(tr->extra);
    for (int k = 0; k < 3; k++) pcre2_code_free(tr->re[k]);
    pcre2_match_data_free(tr->md);
    pcre2_match_context_free(tr->mctx);
    pcre2_jit_stack_free(tr->jit_stack);
    free(tr->fixed.data);
    strtab_free(&tr->words);
    free(tr->wcount);
    free(tr);
}

/* ------------------------------------------------------------ counting */

/* Pre-tokens longer than this are counted as pieces of at most this many
 * bytes, cut at character boundaries. Merging scans every word that holds
 * the pair, so one megabyte-long word (a run of letters with no space)
 * would make every merge cost a megabyte; cut, only the pieces that hold the
 * pair are scanned. Natural text has few pre-tokens this long, and losing
 * the pairs across a cut changes nothing measurable. */
#define MAX_WORD_BYTES 256

static whale_code count_piece(whale_bpe_trainer *tr, const char *s, size_t n, whale_err *err) {
    int added;
    int64_t i = strtab_put(&tr->words, s, n, &added);
    if (i < 0 || (added && !grow(&tr->wcount, &tr->wcap, tr->words.n, sizeof *tr->wcount)))
        return whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory counting words");
    if (added) tr->wcount[i] = 0;
    tr->wcount[i]++;
    return WHALE_OK;
}

static whale_code count_word(whale_bpe_trainer *tr, const char *s, size_t n, whale_err *err) {
    tr->n_words++;
    while (n > MAX_WORD_BYTES) {
        size_t k = MAX_WORD_BYTES;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--; /* s[k] starts the next piece */
        whale_code rc = count_piece(tr, s, k, err);
        if (rc) return rc;
        s += k;
        n -= k;
    }
    return count_piece(tr, s, n, err);
}

/* Split step k (Isolated: matches and the text between them are pieces,
 * empty pieces are dropped) and pass every piece to step k + 1. */
static whale_code split(whale_bpe_trainer *tr, int k, const char *s, size_t n, whale_err *err) {
    if (!n) return WHALE_OK;
    if (k == 3) return count_word(tr, s, n, err);
    whale_code rc;
    size_t prev = 0, from = 0;
    while (from < n) {
        int r = tr->jit[k] ? pcre2_jit_match(tr->re[k], (PCRE2_SPTR)s, n, from, 0, tr->md, tr->mctx)
                           : pcre2_match(tr->re[k], (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, tr->md, tr->mctx);
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            return whale_errf(err, r == PCRE2_ERROR_NOMEMORY ? WHALE_ERR_NOMEM : WHALE_ERR_INTERNAL,
                              "bpe train: pre-tokenizer regex failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(tr->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* none of the patterns matches empty; step over a character anyway */
            from = me + (size_t)tok_utf8_valid_len((const unsigned char *)s + me, n - me);
            continue;
        }
        if ((rc = split(tr, k + 1, s + prev, ms - prev, err)) || (rc = split(tr, k + 1, s + ms, me - ms, err)))
            return rc;
        prev = from = me;
    }
    return split(tr, k + 1, s + prev, n - prev, err);
}

/* Longest added token at s[i], or -1. */
static int added_at(const whale_bpe_trainer *tr, const char *s, size_t n, size_t i) {
    int best = -1;
    for (int k = 0; k < tr->n_added; k++) {
        size_t l = tr->added_len[k];
        if (l <= n - i && !memcmp(s + i, tr->added[k], l) && (best < 0 || l > tr->added_len[best])) best = k;
    }
    return best;
}

whale_code whale_bpe_trainer_add_text(whale_bpe_trainer *tr, const char *text, size_t len, whale_err *err) {
    if (tr->finished) return whale_errf(err, WHALE_ERR_ARG, "bpe train: text added after finish");
    if (!text && len) return whale_errf(err, WHALE_ERR_ARG, "bpe train: NULL text");
    if (!len) return WHALE_OK;
    double t0 = whale_now();
    if (tok_utf8_check((const unsigned char *)text, len) < len) {
        int nomem;
        tr->fixed.len = 0;
        tok_utf8_lossy(&tr->fixed, (const unsigned char *)text, len, 1, &nomem);
        if (nomem) return whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
        text = tr->fixed.data;
        len = tr->fixed.len;
    }
    tr->n_bytes += (int64_t)len;
    whale_code rc;
    size_t done = 0;
    for (size_t i = 0; i < len;) {
        int a = tr->added_first[(unsigned char)text[i]] ? added_at(tr, text, len, i) : -1;
        if (a < 0) {
            i++;
            continue;
        }
        if ((rc = split(tr, 0, text + done, i - done, err))) return rc;
        i += tr->added_len[a];
        done = i;
    }
    rc = split(tr, 0, text + done, len - done, err);
    tr->seconds_count += whale_now() - t0;
    return rc;
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static void report_read(whale_bpe_trainer *tr, size_t n) {
    tr->read_done += (int64_t)n;
    if (tr->opts.progress) tr->opts.progress(tr->opts.progress_user, "read", tr->read_done, tr->read_total);
}

/* One JSON object per line with a string "text"; blank lines are skipped. */
static whale_code add_jsonl(whale_bpe_trainer *tr, const char *path, FILE *f, whale_err *err) {
    char *line = NULL;
    size_t cap = 0, line_no = 0, since_report = 0;
    ssize_t got;
    whale_code rc = WHALE_OK;
    while (!rc && (got = getline(&line, &cap, f)) >= 0) {
        size_t ll = (size_t)got, k = 0;
        line_no++;
        since_report += ll;
        while (k < ll && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r' || line[k] == '\n')) k++;
        if (k == ll) continue;
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(line, ll, &end, 0);
        if (!j) {
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:%zu: invalid JSON", path, line_no);
            break;
        }
        while (end && end < line + ll && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (end != line + ll) rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:%zu: text after the JSON value", path, line_no);
        else if (!cJSON_IsObject(j) || !cJSON_IsString(text))
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:%zu: expected an object with a string field \"text\"", path,
                            line_no);
        else rc = whale_bpe_trainer_add_text(tr, text->valuestring, strlen(text->valuestring), err);
        cJSON_Delete(j);
        if (since_report >= READ_BLOCK) {
            report_read(tr, since_report);
            since_report = 0;
        }
    }
    if (!rc && ferror(f)) rc = whale_errf(err, WHALE_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (!rc) report_read(tr, since_report);
    free(line);
    return rc;
}

/* Where a block of plain text may end: right after a '\n' that is followed
 * by an ASCII letter or digit. No pre-token holds both (the pieces with a
 * '\n' end at their last line break, letters never follow one in a piece,
 * digit runs start after it) and matching needs nothing before the point,
 * so counting the blocks one by one counts the words of the whole file.
 * 0 if there is no such point. */
static size_t block_end(const char *s, size_t n) {
    for (size_t i = n; i-- > 1;) {
        char c = s[i];
        if (s[i - 1] == '\n' && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return i;
    }
    return 0;
}

/* Plain text: the file is one document, read in blocks of about
 * READ_BLOCK bytes so memory does not grow with the file. */
static whale_code add_plain(whale_bpe_trainer *tr, const char *path, FILE *f, whale_err *err) {
    tok_buf buf = {0};
    whale_code rc = WHALE_OK;
    for (int eof = 0; !eof && !rc;) {
        if (!tok_buf_reserve(&buf, READ_BLOCK)) {
            rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory reading", path);
            break;
        }
        size_t got = fread(buf.data + buf.len, 1, READ_BLOCK, f);
        buf.len += got;
        if (got < READ_BLOCK) {
            if (ferror(f)) {
                rc = whale_errf(err, WHALE_ERR_IO, "%s: read failed: %s", path, strerror(errno));
                break;
            }
            eof = 1;
        }
        /* an added token with a line break could span a block end */
        size_t n = eof ? buf.len : tr->added_newline ? 0 : block_end(buf.data, buf.len);
        if (!n) continue;
        rc = whale_bpe_trainer_add_text(tr, buf.data, n, err);
        memmove(buf.data, buf.data + n, buf.len - n);
        buf.len -= n;
        report_read(tr, n);
    }
    free(buf.data);
    return rc;
}

whale_code whale_bpe_trainer_add_file(whale_bpe_trainer *tr, const char *path, whale_err *err) {
    FILE *f;
    whale_code rc = whale_fopen_regular(path, &f, NULL, err);
    if (rc) return rc;
    rc = has_suffix(path, ".jsonl") ? add_jsonl(tr, path, f, err) : add_plain(tr, path, f, err);
    fclose(f);
    return rc;
}

/* ------------------------------------------------------------ merging
 *
 * Every distinct word is an array of token ids. Pair counts are exact at
 * every step: a merge visits only the words listed for its pair and
 * subtracts the pairs it destroys and adds the pairs it creates. The heap
 * holds (count, pair) entries that may be stale; the invariant is that
 * every pair seen min_frequency times or more has an entry with at least
 * its count (pairs whose count rises get a new entry), so the first popped
 * entry whose count is current is the best pair. */

typedef struct {
    int32_t a, b;
    int32_t merged;     /* the token it was merged into, -1 before */
    uint32_t dirty;     /* merge step that last queued it for a heap push */
    int64_t count;      /* occurrences in the corpus (word counts summed) */
    int32_t *words;     /* words that contain it (may hold stale entries and repeats) */
    uint32_t nw, cw;
} pair_rec;

typedef struct {
    int64_t count;
    int32_t pair;
} heap_ent;

typedef struct {
    strtab tok;          /* token bytes; index = internal id (bytes first) */
    int32_t *sym;        /* the words as symbols, back to back */
    size_t *woff;
    uint32_t *wlen;
    const int64_t *wcnt;
    size_t nwords;
    int32_t *old;        /* scratch: a word before a merge */
    size_t old_cap;

    pair_rec *pairs;
    size_t npairs, pcap;
    uint64_t *pkey;      /* (a << 32 | b) + 1, 0 = empty */
    int32_t *pidx;
    size_t pmask;

    heap_ent *heap;
    size_t nheap, hcap;
    int32_t *dirty;
    size_t ndirty, dcap;
    uint32_t step;
    int64_t min_freq;
    int oom;
} merger;

/* The merges in rank order (internal token ids). */
typedef struct {
    int32_t *left, *right;
    size_t n, cap_left, cap_right;
} merge_list;

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static size_t pair_slot(const merger *M, uint64_t key) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & M->pmask;
    while (M->pkey[i] && M->pkey[i] != key) i = (i + 1) & M->pmask;
    return i;
}

static int pair_rehash(merger *M, size_t cap) {
    uint64_t *keys = M->pkey;
    int32_t *idx = M->pidx;
    size_t old = keys ? M->pmask + 1 : 0;
    M->pkey = calloc(cap, sizeof *M->pkey);
    M->pidx = malloc(cap * sizeof *M->pidx);
    if (!M->pkey || !M->pidx) {
        free(M->pkey);
        free(M->pidx);
        M->pkey = keys, M->pidx = idx;
        return 0;
    }
    M->pmask = cap - 1;
    for (size_t i = 0; i < old; i++)
        if (keys[i]) {
            size_t s = pair_slot(M, keys[i]);
            M->pkey[s] = keys[i];
            M->pidx[s] = idx[i];
        }
    free(keys);
    free(idx);
    return 1;
}

/* Index of pair (a, b), created with count 0 if new; -1 when out of memory. */
static int32_t pair_get(merger *M, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b);
    size_t s = pair_slot(M, key);
    if (M->pkey[s]) return M->pidx[s];
    if (M->npairs >= INT32_MAX - 1 || !grow(&M->pairs, &M->pcap, M->npairs + 1, sizeof *M->pairs)) return -1;
    if (2 * (M->npairs + 1) > M->pmask + 1) {
        if (!pair_rehash(M, 2 * (M->pmask + 1))) return -1;
        s = pair_slot(M, key);
    }
    pair_rec *p = &M->pairs[M->npairs];
    memset(p, 0, sizeof *p);
    p->a = a, p->b = b, p->merged = -1;
    M->pkey[s] = key;
    M->pidx[s] = (int32_t)M->npairs;
    return (int32_t)M->npairs++;
}

/* Does pair p go before pair q at equal counts? The older left token
 * first, then the older right token (ids are in order of creation: the
 * bytes by character code point, then the merges), which is the order
 * Hugging Face's BpeTrainer uses. */
static int pair_before(const merger *M, int32_t p, int32_t q) {
    const pair_rec *P = &M->pairs[p], *Q = &M->pairs[q];
    return P->a != Q->a ? P->a < Q->a : P->b < Q->b;
}

static int ent_before(const merger *M, const heap_ent *x, const heap_ent *y) {
    if (x->count != y->count) return x->count > y->count;
    return pair_before(M, x->pair, y->pair);
}

static void heap_sift_down(merger *M, size_t i) {
    heap_ent e = M->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        const heap_ent *b = &e;
        if (l < M->nheap && ent_before(M, &M->heap[l], b)) best = l, b = &M->heap[l];
        if (r < M->nheap && ent_before(M, &M->heap[r], b)) best = r;
        if (best == i) break;
        M->heap[i] = M->heap[best];
        i = best;
    }
    M->heap[i] = e;
}

static void heap_push(merger *M, int32_t pair, int64_t count) {
    if (!grow(&M->heap, &M->hcap, M->nheap + 1, sizeof *M->heap)) {
        M->oom = 1;
        return;
    }
    heap_ent e = {count, pair};
    size_t i = M->nheap++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!ent_before(M, &e, &M->heap[p])) break;
        M->heap[i] = M->heap[p];
        i = p;
    }
    M->heap[i] = e;
}

static heap_ent heap_pop(merger *M) {
    heap_ent top = M->heap[0];
    M->heap[0] = M->heap[--M->nheap];
    if (M->nheap) heap_sift_down(M, 0);
    return top;
}

/* Add d occurrences of pair (a, b), found in word w. A pair whose count
 * rises is queued for a heap push at the end of the merge step. */
static void pair_add(merger *M, int32_t a, int32_t b, int64_t d, int32_t w) {
    int32_t pi = pair_get(M, a, b);
    if (pi < 0) {
        M->oom = 1;
        return;
    }
    pair_rec *p = &M->pairs[pi];
    p->count += d;
    if (d < 0) {
        if (p->count == 0) { /* its words are of no use until it comes back */
            free(p->words);
            p->words = NULL;
            p->nw = p->cw = 0;
        }
        return;
    }
    if (!p->nw || p->words[p->nw - 1] != w) {
        if (p->nw == p->cw) {
            uint32_t c = p->cw ? 2 * p->cw : 4;
            int32_t *q = c > p->cw ? realloc(p->words, (size_t)c * sizeof *q) : NULL;
            if (!q) {
                M->oom = 1;
                return;
            }
            p->words = q;
            p->cw = c;
        }
        p->words[p->nw++] = w;
    }
    if (p->dirty != M->step) {
        p->dirty = M->step;
        if (!grow(&M->dirty, &M->dcap, M->ndirty + 1, sizeof *M->dirty)) {
            M->oom = 1;
            return;
        }
        M->dirty[M->ndirty++] = pi;
    }
}

/* Replace every (a, b) in word w by c, left to right, and update the pair
 * counts exactly: the old pairs that touch a merged position go, the new
 * pairs that touch a c come (each counted once even when merges are
 * adjacent, as in "a b a b" -> "c c"). */
static void merge_word(merger *M, int32_t w, int32_t a, int32_t b, int32_t c) {
    int32_t *x = M->sym + M->woff[w];
    uint32_t L = M->wlen[w], i;
    for (i = 0; i + 1 < L; i++)
        if (x[i] == a && x[i + 1] == b) break;
    if (i + 1 >= L) return; /* a stale entry of the pair's word list */
    if (!grow(&M->old, &M->old_cap, L, sizeof *M->old)) {
        M->oom = 1;
        return;
    }
    int32_t *o = memcpy(M->old, x, L * sizeof *x);
    int64_t cnt = M->wcnt[w], gone = -1, came = -1; /* last old / new pair index counted */
    uint32_t m = 0;
    int after_c = 0;
    for (uint32_t r = 0; r < L;) {
        if (r + 1 < L && o[r] == a && o[r + 1] == b) {
            for (int64_t j = (int64_t)r - 1; j <= (int64_t)r + 1; j++)
                if (j >= 0 && j + 1 < (int64_t)L && j > gone) {
                    pair_add(M, o[j], o[j + 1], -cnt, w);
                    gone = j;
                }
            x[m++] = c;
            r += 2;
            if (m >= 2 && (int64_t)m - 2 > came) {
                pair_add(M, x[m - 2], c, cnt, w);
                came = m - 2;
            }
            after_c = 1;
        } else {
            x[m++] = o[r++];
            if (after_c) {
                pair_add(M, c, x[m - 1], cnt, w);
                came = m - 2;
                after_c = 0;
            }
        }
    }
    M->wlen[w] = m;
}

/* Merge pair pi into token c in every word that has it. */
static void apply_merge(merger *M, int32_t pi, int32_t c) {
    int32_t a = M->pairs[pi].a, b = M->pairs[pi].b;
    int32_t *list = M->pairs[pi].words;
    uint32_t n = M->pairs[pi].nw;
    /* detached: merging never adds (a, b) again, since c differs from a and b */
    M->pairs[pi].words = NULL;
    M->pairs[pi].nw = M->pairs[pi].cw = 0;
    M->step++;
    M->ndirty = 0;
    for (uint32_t i = 0; i < n && !M->oom; i++) merge_word(M, list[i], a, b, c);
    free(list);
    for (size_t i = 0; i < M->ndirty && !M->oom; i++) {
        const pair_rec *p = &M->pairs[M->dirty[i]];
        if (p->count >= M->min_freq) heap_push(M, M->dirty[i], p->count);
    }
}

static void merger_free(merger *M) {
    strtab_free(&M->tok);
    free(M->sym);
    free(M->woff);
    free(M->wlen);
    free(M->old);
    for (size_t i = 0; i < M->npairs; i++) free(M->pairs[i].words);
    free(M->pairs);
    free(M->pkey);
    free(M->pidx);
    free(M->heap);
    free(M->dirty);
}

/* Words -> symbol arrays, the initial pair counts and the heap. */
static int merger_init(merger *M, const whale_bpe_trainer *tr) {
    const strtab *W = &tr->words;
    M->min_freq = tr->opts.min_frequency;
    M->wcnt = tr->wcount;
    M->nwords = W->n;
    /* byte symbols first, in the order of their characters' code points */
    int32_t byte_sym[256];
    int added;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            if (byte_kept(b) != !pass) continue;
            char ch = (char)b;
            int64_t id = strtab_put(&M->tok, &ch, 1, &added);
            if (id < 0) return 0;
            byte_sym[b] = (int32_t)id;
        }
    M->sym = malloc((W->len ? W->len : 1) * sizeof *M->sym);
    M->woff = malloc((W->n ? W->n : 1) * sizeof *M->woff);
    M->wlen = malloc((W->n ? W->n : 1) * sizeof *M->wlen);
    if (!M->sym || !M->woff || !M->wlen || !pair_rehash(M, 1 << 16)) return 0;
    size_t used = 0;
    for (size_t w = 0; w < W->n; w++) {
        uint32_t len;
        const unsigned char *s = (const unsigned char *)strtab_str(W, w, &len);
        M->woff[w] = used;
        M->wlen[w] = len;
        for (uint32_t i = 0; i < len; i++) M->sym[used + i] = byte_sym[s[i]];
        for (uint32_t i = 0; i + 1 < len; i++) pair_add(M, M->sym[used + i], M->sym[used + i + 1], M->wcnt[w], (int32_t)w);
        used += len;
        if (M->oom) return 0;
    }
    M->ndirty = 0; /* the heap is built below from every pair at once */
    if (!grow(&M->heap, &M->hcap, M->npairs + 1, sizeof *M->heap)) return 0;
    for (size_t i = 0; i < M->npairs; i++)
        if (M->pairs[i].count >= M->min_freq) M->heap[M->nheap++] = (heap_ent){M->pairs[i].count, (int32_t)i};
    for (size_t i = M->nheap / 2; i-- > 0;) heap_sift_down(M, i);
    return 1;
}

/* ------------------------------------------------------------ JSON output */

typedef struct {
    tok_buf b;
    tok_buf tmp; /* scratch for put_token */
    int oom;
} jout;

static void put(jout *j, const char *s, size_t n) {
    if (!j->oom && !tok_buf_append(&j->b, s, n)) j->oom = 1;
}
static void puts_(jout *j, const char *s) { put(j, s, strlen(s)); }

static void putf(jout *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(jout *j, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    put(j, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string (s is valid UTF-8; written as is, escaping only what JSON
 * requires). */
static void put_str(jout *j, const char *s, size_t n) {
    put(j, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(j, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"': puts_(j, "\\\""); break;
        case '\\': puts_(j, "\\\\"); break;
        case '\n': puts_(j, "\\n"); break;
        case '\r': puts_(j, "\\r"); break;
        case '\t': puts_(j, "\\t"); break;
        default: putf(j, "\\u%04x", c);
        }
    }
    put(j, s + run, n - run);
    put(j, "\"", 1);
}

/* The byte-level alphabet: each byte's character as UTF-8 (at most 2 bytes,
 * all below U+0144). */
typedef struct {
    char s[256][2];
    uint8_t len[256];
} byte_map;

static void byte_map_init(byte_map *m) {
    for (int b = 0; b < 256; b++) {
        char u[4];
        m->len[b] = (uint8_t)tok_utf8_encode(byte_char(b), u);
        memcpy(m->s[b], u, m->len[b]);
    }
}

/* A token's vocabulary string: its bytes through the byte-level map. */
static void put_token(jout *j, const strtab *tok, int32_t id, const byte_map *m) {
    uint32_t len;
    const unsigned char *s = (const unsigned char *)strtab_str(tok, (size_t)id, &len);
    j->tmp.len = 0;
    for (uint32_t i = 0; i < len; i++)
        if (!tok_buf_append(&j->tmp, m->s[s[i]], m->len[s[i]])) {
            j->oom = 1;
            return;
        }
    put_str(j, j->tmp.data, j->tmp.len);
}

static void put_added(jout *j, int32_t id, const char *content, int special, int last) {
    putf(j, "    {\"id\": %d, \"content\": ", (int)id);
    put_str(j, content, strlen(content));
    putf(j, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": %s, \"special\": %s}%s\n",
         special ? "false" : "true", special ? "true" : "false", last ? "" : ",");
}

typedef struct {
    const char *content;
    int32_t id;
    int special;
} added_tok;

static void write_tokenizer_json(jout *j, const merger *M, const merge_list *ml, const added_tok *added,
                                 int n_added) {
    byte_map map;
    byte_map_init(&map);
    puts_(j, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [\n");
    for (int i = 0; i < n_added; i++) put_added(j, added[i].id, added[i].content, added[i].special, i + 1 == n_added);
    puts_(j, "  ],\n  \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": []},\n"
             "  \"pre_tokenizer\": {\n    \"type\": \"Sequence\",\n    \"pretokenizers\": [\n");
    for (int k = 0; k < 3; k++) {
        puts_(j, "      {\"type\": \"Split\", \"pattern\": {\"Regex\": ");
        put_str(j, whale_deepseek_v3_splits[k], strlen(whale_deepseek_v3_splits[k]));
        puts_(j, "}, \"behavior\": \"Isolated\", \"invert\": false},\n");
    }
    puts_(j, "      {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}\n"
             "    ]\n  },\n"
             "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, "
             "\"use_regex\": true},\n"
             "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
             "\"use_regex\": true},\n"
             "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
             "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
             "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
             "    \"vocab\": {\n");
    for (int i = 0; i < N_HEAD; i++) {
        puts_(j, "      ");
        put_str(j, head_tokens[i], strlen(head_tokens[i]));
        putf(j, ": %d,\n", i);
    }
    for (size_t t = 0; t < M->tok.n; t++) {
        puts_(j, "      ");
        put_token(j, &M->tok, (int32_t)t, &map);
        putf(j, ": %d%s\n", (int)(N_HEAD + t), t + 1 == M->tok.n ? "" : ",");
    }
    puts_(j, "    },\n    \"merges\": [\n");
    for (size_t r = 0; r < ml->n; r++) {
        puts_(j, "      [");
        put_token(j, &M->tok, ml->left[r], &map);
        puts_(j, ", ");
        put_token(j, &M->tok, ml->right[r], &map);
        puts_(j, r + 1 == ml->n ? "]\n" : "],\n");
    }
    puts_(j, "    ]\n  }\n}\n");
}

static void write_config_json(jout *j, const whale_bpe_train_opts *o, const added_tok *added, int n_added) {
    puts_(j, "{\n  \"add_bos_token\": false,\n  \"add_eos_token\": false,\n  \"added_tokens_decoder\": {\n");
    for (int i = 0; i < n_added; i++) {
        putf(j, "    \"%d\": {\"content\": ", (int)added[i].id);
        put_str(j, added[i].content, strlen(added[i].content));
        putf(j, ", \"lstrip\": false, \"normalized\": %s, \"rstrip\": false, \"single_word\": false, \"special\": %s}%s\n",
             added[i].special ? "false" : "true", added[i].special ? "true" : "false", i + 1 == n_added ? "" : ",");
    }
    puts_(j, "  },\n  \"bos_token\": ");
    put_str(j, WHALE_BPE_BOS, strlen(WHALE_BPE_BOS));
    puts_(j, ",\n  \"chat_template\": ");
    put_str(j, chat_template, strlen(chat_template));
    puts_(j, ",\n  \"clean_up_tokenization_spaces\": false,\n  \"eos_token\": ");
    put_str(j, WHALE_BPE_EOS, strlen(WHALE_BPE_EOS));
    putf(j, ",\n  \"model_max_length\": %d,\n  \"pad_token\": ", o->model_max_length);
    put_str(j, WHALE_BPE_PAD, strlen(WHALE_BPE_PAD));
    puts_(j, ",\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"unk_token\": null\n}\n");
}

/* ------------------------------------------------------------ finish */

static whale_code write_file(const char *dir, const char *name, const jout *j, whale_err *err) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    if (!path) return whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
    snprintf(path, n, "%s/%s", dir, name);
    whale_code rc = whale_write_file_atomic(path, j->b.data, j->b.len, err);
    free(path);
    return rc;
}

/* Merge the best pair until `want` new tokens exist or no pair is seen
 * min_frequency times. 0 when out of memory. */
static int run_merges(merger *M, size_t want, merge_list *ml, const whale_bpe_train_opts *o) {
    tok_buf joined = {0};
    size_t made = 0;
    while (made < want && M->nheap && !M->oom) {
        heap_ent e = heap_pop(M);
        pair_rec *p = &M->pairs[e.pair];
        if (e.count != p->count) {
            /* stale: a smaller count is queued again; a larger one is queued already */
            if (e.count > p->count && p->count >= M->min_freq) heap_push(M, e.pair, p->count);
            continue;
        }
        if (p->count < M->min_freq) break;
        if (p->merged >= 0) {
            /* a merged pair formed again (only possible after a merge that
             * reused a token): the encoder merges it at its old rank */
            apply_merge(M, e.pair, p->merged);
            continue;
        }
        uint32_t la, lb;
        const char *a = strtab_str(&M->tok, (size_t)p->a, &la), *b = strtab_str(&M->tok, (size_t)p->b, &lb);
        joined.len = 0; /* copied: adding to the table may move its arena */
        int added;
        int64_t c = -1;
        if (tok_buf_append(&joined, a, la) && tok_buf_append(&joined, b, lb))
            c = strtab_put(&M->tok, joined.data, joined.len, &added);
        if (c < 0 || !grow(&ml->left, &ml->cap_left, ml->n + 1, sizeof *ml->left) ||
            !grow(&ml->right, &ml->cap_right, ml->n + 1, sizeof *ml->right)) {
            M->oom = 1;
            break;
        }
        ml->left[ml->n] = p->a;
        ml->right[ml->n] = p->b;
        ml->n++;
        p->merged = (int32_t)c;
        made += (size_t)added;
        apply_merge(M, e.pair, (int32_t)c);
        if (o->progress && added && (made % 256 == 0 || made == want))
            o->progress(o->progress_user, "merge", (int64_t)made, (int64_t)want);
    }
    free(joined.data);
    return !M->oom;
}

whale_code whale_bpe_trainer_finish(whale_bpe_trainer *tr, const char *out_dir, whale_bpe_train_stats *stats,
                                    whale_err *err) {
    if (tr->finished) return whale_errf(err, WHALE_ERR_ARG, "bpe train: finish called twice");
    tr->finished = 1;
    if (!tr->words.n) return whale_errf(err, WHALE_ERR_FORMAT, "bpe train: no text to train on (the input is empty)");
    double t0 = whale_now();
    const whale_bpe_train_opts *o = &tr->opts;
    merger M = {0};
    merge_list ml = {0};
    jout tj = {0}, cj = {0};
    whale_code rc = WHALE_OK;
    if (!merger_init(&M, tr) ||
        !run_merges(&M, (size_t)(o->vocab_size - WHALE_BPE_FIXED_TOKENS - o->n_extra_special), &ml, o)) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory merging (%zu distinct words, %zu pairs)",
                        tr->words.n, M.npairs);
        goto done;
    }
    /* the added tokens: three first, the rest after the merges */
    added_tok added[N_HEAD + N_TAIL + MAX_EXTRA_SPECIAL];
    int n_added = 0;
    int32_t next = (int32_t)(N_HEAD + M.tok.n);
    for (int i = 0; i < N_HEAD; i++) added[n_added++] = (added_tok){head_tokens[i], i, 1};
    for (int i = 0; i < N_TAIL; i++) added[n_added++] = (added_tok){tail_tokens[i], next++, 0};
    for (int i = 0; i < o->n_extra_special; i++) added[n_added++] = (added_tok){tr->extra[i], next++, 1};
    write_tokenizer_json(&tj, &M, &ml, added, n_added);
    write_config_json(&cj, o, added, n_added);
    if (tj.oom || cj.oom) {
        rc = whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory writing the tokenizer");
        goto done;
    }
    if ((rc = whale_mkdir(out_dir, err)) || (rc = write_file(out_dir, "tokenizer.json", &tj, err)) ||
        (rc = write_file(out_dir, "tokenizer_config.json", &cj, err)))
        goto done;
    if (stats) {
        stats->vocab_size = next;
        stats->n_merges = (int)ml.n;
        stats->n_bytes = tr->n_bytes;
        stats->n_words = tr->n_words;
        stats->n_unique_words = (int64_t)tr->words.n;
        stats->seconds_count = tr->seconds_count;
        stats->seconds_merge = whale_now() - t0;
    }
done:
    merger_free(&M);
    free(ml.left);
    free(ml.right);
    free(tj.b.data);
    free(tj.tmp.data);
    free(cj.b.data);
    free(cj.tmp.data);
    return rc;
}

/* ------------------------------------------------------------ whole job */

/* Fail before reading any input when the output cannot be written. */
static whale_code check_out_dir(const char *dir, whale_err *err) {
    struct stat st;
    if (!dir || !*dir) return whale_errf(err, WHALE_ERR_ARG, "bpe train: no output directory given");
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return whale_errf(err, WHALE_ERR_IO, "%s: exists and is not a directory", dir);
        if (access(dir, W_OK) != 0) return whale_errf(err, WHALE_ERR_IO, "%s: not writable: %s", dir, strerror(errno));
        return WHALE_OK;
    }
    if (errno != ENOENT) return whale_errf(err, WHALE_ERR_IO, "%s: %s", dir, strerror(errno));
    /* created at the end: its parent must be a writable directory */
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    while (n > 0 && dir[n - 1] != '/') n--;
    char *parent = n ? strndup(dir, n) : strdup(".");
    if (!parent) return whale_errf(err, WHALE_ERR_NOMEM, "bpe train: out of memory");
    whale_code rc = WHALE_OK;
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
        rc = whale_errf(err, WHALE_ERR_IO, "%s: cannot create directory: %s is not a directory", dir, parent);
    else if (access(parent, W_OK) != 0)
        rc = whale_errf(err, WHALE_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    free(parent);
    return rc;
}

whale_code whale_bpe_train(const whale_bpe_train_opts *opts, const char *const *files, int n_files,
                           const char *out_dir, whale_bpe_train_stats *stats, whale_err *err) {
    if (n_files < 1) return whale_errf(err, WHALE_ERR_ARG, "bpe train: no input files");
    whale_code rc = check_out_dir(out_dir, err);
    if (rc) return rc;
    whale_bpe_trainer *tr;
    if ((rc = whale_bpe_trainer_new(opts, &tr, err))) return rc;
    for (int i = 0; i < n_files; i++) {
        struct stat st;
        if (stat(files[i], &st) == 0 && S_ISREG(st.st_mode)) tr->read_total += (int64_t)st.st_size;
    }
    for (int i = 0; i < n_files && !rc; i++) rc = whale_bpe_trainer_add_file(tr, files[i], err);
    if (!rc) rc = whale_bpe_trainer_finish(tr, out_dir, stats, err);
    whale_bpe_trainer_free(tr);
    return rc;
}
