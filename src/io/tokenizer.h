/* Internal parts of the tokenizer (tokenizer.c loads and decodes,
 * tokenizer_encode.c encodes, tokenizer_nfc.c does UTF-8 and NFC). */
#ifndef WHALE_IO_TOKENIZER_H
#define WHALE_IO_TOKENIZER_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "whale_tokenizer.h"

#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ byte buffer */

typedef struct {
    char *data;
    size_t len, cap;
} tok_buf;

/* Make room for extra more bytes (plus a NUL); 0 on allocation failure. */
int tok_buf_reserve(tok_buf *b, size_t extra);
int tok_buf_append(tok_buf *b, const void *p, size_t n);

/* ------------------------------------------------------------ UTF-8, NFC */

/* Length of the valid UTF-8 sequence at s[0..len), or 0 if it is not one
 * (overlong forms, surrogates and values above U+10FFFF are invalid). */
int tok_utf8_valid_len(const unsigned char *s, size_t len);
/* Decode the character at s (known valid); *cp receives it; returns its length. */
int tok_utf8_decode(const unsigned char *s, uint32_t *cp);
int tok_utf8_encode(uint32_t cp, char out[4]);
/* Offset of the first byte of s that is not valid UTF-8, or len. */
size_t tok_utf8_check(const unsigned char *s, size_t len);
/* Append s to out with every maximal invalid subsequence replaced by
 * U+FFFD (the Unicode "substitution of maximal subparts" that Rust's
 * from_utf8_lossy and Python's errors="replace" use). If final is 0, a
 * trailing incomplete-but-so-far-valid sequence is not consumed: the
 * number of bytes consumed is returned. */
size_t tok_utf8_lossy(tok_buf *out, const unsigned char *s, size_t len, int final, int *nomem);
/* 1 for the Unicode White_Space property (Rust char::is_whitespace). */
int tok_is_white_space(uint32_t cp);

/* Append the NFC form of valid UTF-8 s to out; 0 on allocation failure. */
int tok_nfc(tok_buf *out, const char *s, size_t len);
/* 1 if s (valid UTF-8) is certainly already in NFC (no code point in it can
 * change or combine under NFC). */
int tok_nfc_quick(const char *s, size_t len);

/* ------------------------------------------------------------ structures */

/* Open-addressing map from strings (borrowed, length-delimited) to ids. */
typedef struct {
    const char **keys;
    uint32_t *lens;
    int32_t *vals;
    size_t mask;
} tok_strmap;

int tok_strmap_init(tok_strmap *m, size_t n);
void tok_strmap_free(tok_strmap *m);
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len);
/* Insert; returns the existing value if the key is present, else -1. */
int32_t tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val);

/* Merge table: (left id, right id) -> (rank, merged id). */
typedef struct {
    uint64_t *keys; /* (left << 32 | right) + 1, 0 = empty */
    uint32_t *rank;
    int32_t *merged;
    size_t mask;
} tok_merges;

enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { STEP_SPLIT, STEP_BYTELEVEL };

typedef struct {
    int kind;
    pcre2_code *re;  /* Split pattern, or the GPT-2 pattern of ByteLevel(use_regex) */
    int jit;         /* re was JIT-compiled, for complete and hard partial matching */
    int behavior;    /* SPLIT_* */
    int invert;
    int add_prefix_space;
    char *source;    /* the Split Regex as tokenizer.json writes it (NULL for a String pattern) */
    int use_regex;   /* ByteLevel: splits with the GPT-2 pattern first */
} tok_step;

typedef struct {
    const char *content; /* as matched (NFC'd if normalized and the normalizer is NFC) */
    uint32_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
    uint8_t owned; /* content was malloc'd (its normalized form differs) */
} tok_added;

/* The added tokens matched at one stage, sorted by content bytes. */
typedef struct {
    tok_added **tok;
    int n;
    uint8_t first[256]; /* 1 if some token starts with this byte */
} tok_added_set;

/* Bounded cache of encoded pieces: direct-mapped, a newer piece evicts the
 * older one in its slot. */
#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_MAX_BYTES 48
#define TOK_CACHE_MAX_IDS 24
typedef struct {
    uint64_t hash; /* 0 = empty */
    uint8_t klen, nids;
    char key[TOK_CACHE_MAX_BYTES];
    int32_t ids[TOK_CACHE_MAX_IDS];
} tok_cache_slot;

/* A literal Replace (normalizer or decoder): every pat becomes with. */
#define TOK_MAX_REPLACE 4
typedef struct {
    char *pat, *with;
    size_t plen, wlen;
} tok_replace;

struct whale_tokenizer {
    char *arena;             /* the token strings of tokenizer.json */
    int32_t n_ids;           /* 1 + highest id */
    const char **tok;        /* id -> token string, NULL for holes */
    uint32_t *tok_len;
    char *dec;               /* decoded bytes of every id */
    size_t *dec_off;         /* id -> decoded bytes: dec + dec_off[id], dec_len[id] */
    uint32_t *dec_len;
    uint8_t *byte_tok;       /* id -> 1 if the ByteFallback decoder turns it into one byte */
    uint8_t *special;        /* id -> 1 if a special added token */
    int32_t model_vocab;     /* number of entries in model.vocab */
    tok_strmap vocab;        /* model.vocab */
    tok_strmap added_map;    /* added token content -> id */
    tok_merges merges;
    int ignore_merges;
    int byte_level;          /* the pre-tokenizer ends with ByteLevel: BPE units are bytes */
    int32_t unit_id[256];    /* byte_level: id of each byte's one-character token, -1 if none */
    int byte_fallback;       /* model.byte_fallback: a character outside the vocabulary becomes <0xNN> tokens */
    int32_t byte_id[256];    /* byte_fallback: id of <0xNN>, -1 if none */
    int32_t unk_id;          /* model.unk_token, -1 if none */
    int fuse_unk;            /* model.fuse_unk: consecutive unknown characters give one unk_id */

    tok_added *added;        /* in tokenizer.json order */
    int n_added;
    tok_added_set raw_set, norm_set;
    int split_special;       /* tokenizer_config split_special_tokens: specials are plain text */
    int clean_up;            /* tokenizer_config clean_up_tokenization_spaces: decode removes " ." etc. */
    pcre2_code *word_re;     /* \w-like class for single_word tokens (NULL if none) */

    int nfc;                 /* normalizer: NFC ... */
    tok_replace norm_repl[TOK_MAX_REPLACE]; /* ... or literal Replace steps, in order */
    int n_norm_repl;
    tok_replace dec_repl[TOK_MAX_REPLACE];  /* decoder Replace steps, before ByteFallback */
    int n_dec_repl;
    int dec_byte_level;      /* decoder ByteLevel */
    int dec_byte_fallback;   /* decoder ByteFallback: <0xNN> decodes to the byte NN */
    tok_step *steps;
    int n_steps;

    int32_t prefix[4], suffix[4]; /* ids add_special puts around the text */
    int n_prefix, n_suffix;
    int32_t role_id[3];
    char *role_tok[3];

    char *path;              /* tokenizer.json, for messages */

    /* encode scratch (see the thread-safety note in whale_tokenizer.h) */
    size_t work;             /* bytes of text the current encode's regex searches were given */
    size_t work_budget;      /* ... and how many they may be given (tokenizer_encode.c) */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    tok_buf norm;            /* normalized text of the current segment */
    tok_buf prefixed;        /* ByteLevel add_prefix_space: " " + piece */
    tok_buf mapped;          /* ignore_merges with ByteLevel: the piece as vocabulary text */
    void *bpe_scratch;       /* symbols + heap, grown on demand */
    size_t bpe_cap;          /* in symbols */
    tok_cache_slot *cache;   /* allocated on first use */
};

/* What a GGUF file's tokenizer metadata needs (tokenizer_gguf.c). */
/* llama.cpp's name for t's pre-tokenizer (tokenizer.ggml.pre: "qwen2",
 * "llama-bpe", "gpt-2", "deepseek-v3"), or NULL when llama.cpp has none of
 * its patterns. */
const char *tok_llama_pre(const whale_tokenizer *t);
/* The merges as id pairs [n][2] in rank order (malloc'd). */
whale_code tok_merge_pairs(const whale_tokenizer *t, int32_t **pairs, int *n, whale_err *err);
/* The added token with this id, or NULL. */
const tok_added *tok_added_of(const whale_tokenizer *t, int32_t id);

/* Encode text that is already valid UTF-8 (the public encode sanitizes). */
whale_code tok_encode_valid(whale_tokenizer *t, const char *text, size_t len, tok_buf *ids,
                            whale_err *err);
void tok_encode_scratch_free(whale_tokenizer *t);

#endif
