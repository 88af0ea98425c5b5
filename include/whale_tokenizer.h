/*
 * whale_tokenizer.h — Hugging Face BPE tokenizers (tokenizer.json), byte-level
 * or SentencePiece-style.
 *
 * Encodes and decodes exactly as Hugging Face's `tokenizers` library does for
 * the files it accepts (tests/test_tokenizer.c compares both directions with
 * goldens made by that library). Supported, everything else is refused at
 * load time with WHALE_ERR_UNSUPPORTED and a message naming the JSON path:
 *
 *   model           BPE: merges as "a b" strings or ["a","b"] pairs,
 *                   ignore_merges, unk_token (in model.vocab) with fuse_unk,
 *                   byte_fallback (<0xNN> tokens); no dropout
 *   normalizer      null, NFC, Replace (String pattern), Sequence of those
 *                   (NFC alone, or Replace steps only)
 *   pre_tokenizer   null, Split (Regex or String pattern; Isolated, Removed,
 *                   MergedWithPrevious, MergedWithNext, Contiguous; invert),
 *                   ByteLevel (add_prefix_space, use_regex; last step only),
 *                   Sequence of those
 *   added_tokens    matched in the raw text before everything else (longest
 *                   match at the leftmost position), with special, lstrip,
 *                   rstrip, single_word and normalized
 *   post_processor  null, ByteLevel, TemplateProcessing (single), Sequence
 *   decoder         ByteLevel, or Replace (String pattern)..., ByteFallback,
 *                   Fuse in that order (each optional), alone or in a Sequence
 *
 * Regexes are written for Oniguruma (Hugging Face's engine) and run with
 * PCRE2; the differences that matter (\s, \d, \w, \h, ^, $, and the
 * characters Unicode assigned after PCRE2's database, added to \p{..}) are
 * translated. NFC uses Unicode 14 tables (tokenizer_unidata.h).
 *
 * Invalid UTF-8 input is not an error: every maximal invalid subsequence is
 * replaced by U+FFFD first, which is what a Hugging Face tokenizer sees when
 * the bytes are decoded lossily (Rust String::from_utf8_lossy, Python
 * bytes.decode(errors="replace")). Decoding does the same with token bytes
 * that do not form valid UTF-8, so decoded text is always valid UTF-8.
 *
 * A tokenizer is immutable after loading except for the scratch space and
 * piece cache that encode uses: use one tokenizer per thread for encoding
 * (decoding and the other const functions may be shared).
 */
#ifndef WHALE_TOKENIZER_H
#define WHALE_TOKENIZER_H

#include "whale.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct whale_tokenizer whale_tokenizer;

/* Load dir/tokenizer.json and, when present, dir/tokenizer_config.json
 * (bos/eos/pad tokens, add_bos_token/add_eos_token, split_special_tokens).
 * dir may also name a tokenizer.json file directly. */
whale_code whale_tokenizer_load(const char *dir, whale_tokenizer **out, whale_err *err);
void whale_tokenizer_free(whale_tokenizer *t);

/* 1 + the highest id, added tokens included (ids below it may be holes). */
int whale_tokenizer_vocab_size(const whale_tokenizer *t);

/* Encode len bytes of text (NUL bytes are ordinary characters). *ids is
 * malloc'd (free it with free(); it is non-NULL even when *n is 0).
 * add_special adds the BOS/EOS that the post-processor's template adds;
 * tokenizer_config.json's add_bos_token / add_eos_token, when present,
 * replace the template's choice (as transformers does). */
whale_code whale_tokenizer_encode(whale_tokenizer *t, const char *text, size_t len,
                                  int add_special, int32_t **ids, int *n, whale_err *err);

/* Decode ids into malloc'd, NUL-terminated UTF-8 (*len excludes the NUL).
 * skip_special leaves out added tokens marked "special". Ids that name no
 * token (holes, or rows of a model's embedding past the tokenizer's
 * vocabulary) decode to nothing, as in Hugging Face; negative ids are
 * WHALE_ERR_RANGE. */
whale_code whale_tokenizer_decode(const whale_tokenizer *t, const int32_t *ids, int n,
                                  int skip_special, char **text, size_t *len, whale_err *err);

/* Id of a token string as written in tokenizer.json (added tokens first,
 * then the model vocabulary, e.g. "Ġhello"), or -1. */
int32_t whale_tokenizer_token_to_id(const whale_tokenizer *t, const char *token);
/* Token string of an id as written in tokenizer.json, or NULL. */
const char *whale_tokenizer_id_to_token(const whale_tokenizer *t, int32_t id);
/* The bytes an id decodes to on its own (not necessarily valid UTF-8: a
 * token may hold part of a character). NULL with *len 0 for unknown ids. */
const char *whale_tokenizer_token_bytes(const whale_tokenizer *t, int32_t id, size_t *len);
/* 1 if id is an added token marked "special" (skipped by skip_special). */
int whale_tokenizer_is_special(const whale_tokenizer *t, int32_t id);

/* Copy tokenizer.json (required) and, when present, tokenizer_config.json
 * and chat_template.jinja from folder src into folder dst (atomic writes). */
whale_code whale_tokenizer_copy_files(const char *src, const char *dst, whale_err *err);

typedef enum { WHALE_TOKEN_BOS = 0, WHALE_TOKEN_EOS, WHALE_TOKEN_PAD } whale_token_role;
/* From tokenizer_config.json (bos_token etc., a string or {"content": ...});
 * -1 / NULL when not configured. */
int32_t whale_tokenizer_role_id(const whale_tokenizer *t, whale_token_role role);
const char *whale_tokenizer_role_token(const whale_tokenizer *t, whale_token_role role);

/* ---- streaming decode: push ids one at a time, get text as it completes.
 * Each push returns only whole UTF-8 characters; bytes of a character that
 * is not complete yet are held until a later token completes it. The
 * concatenation of every push and the final flush equals
 * whale_tokenizer_decode() of all the ids. */
typedef struct whale_detokenizer whale_detokenizer;

whale_code whale_detokenizer_new(const whale_tokenizer *t, int skip_special,
                                 whale_detokenizer **out, whale_err *err);
void whale_detokenizer_free(whale_detokenizer *d);
/* *text (NUL-terminated, owned by d) is valid until the next call on d. */
whale_code whale_detokenizer_push(whale_detokenizer *d, int32_t id, const char **text,
                                  size_t *len, whale_err *err);
/* Emit what is held back (an unfinished character becomes U+FFFD) and start
 * over for a new sequence. */
whale_code whale_detokenizer_flush(whale_detokenizer *d, const char **text, size_t *len,
                                   whale_err *err);

#ifdef __cplusplus
}
#endif
#endif
