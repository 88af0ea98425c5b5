/*
 * bpe_train.h — train a byte-level BPE tokenizer and write it as Hugging
 * Face tokenizer.json + tokenizer_config.json (docs/tokenizer-training.md).
 *
 * The output is a DeepSeek-V3-shaped tokenizer, so a small model trained on
 * it tokenizes like the real one structurally and can be chat-tuned with the
 * DeepSeek-V3 chat template:
 *
 *   pre-tokenizer  DeepSeek-V3's Sequence: Split \p{N}{1,3}, Split CJK runs,
 *                  Split the word/punctuation/space regex (all Isolated),
 *                  ByteLevel without its own regex. Training splits text with
 *                  the same steps (regexes translated to PCRE2 as the
 *                  tokenizer does), after cutting out the added tokens, so
 *                  merges never cross a boundary the encoder has.
 *   model          BPE over the 256 byte-level symbols (any text encodes),
 *                  merges as ["left", "right"] pairs, no unk, no dropout.
 *   ids            0 <｜begin▁of▁sentence｜> (BOS), 1 <｜end▁of▁sentence｜>
 *                  (EOS), 2 <｜▁pad▁｜> (pad): special, in model.vocab and
 *                  added_tokens, as in DeepSeek-V3 (nanowhale's config has
 *                  bos_token_id 0, eos_token_id 1);
 *                  3..258 the byte symbols, ordered by their character's
 *                  code point ("!" = 3 ... as in DeepSeek-V3 and GPT-2);
 *                  then one id per merge that makes a new token, in merge
 *                  order; then <｜User｜>, <｜Assistant｜> (added, not
 *                  special, like DeepSeek-V3's) and the extra specials.
 *                  vocab_size counts all of them.
 *   config         bos/eos/pad tokens, add_bos_token false, add_eos_token
 *                  false, model_max_length, and DeepSeek-V3's chat_template
 *                  verbatim (whale_chat_detect recognises it).
 *
 * Training: the text is cut into pre-tokens, which are counted (a hash table
 * of distinct pre-tokens, "words"; one longer than 256 bytes is counted as
 * 256-byte pieces, so a megabyte-long run of letters cannot make every merge
 * scan a megabyte); then the most frequent adjacent pair of
 * symbols over all words is merged, repeatedly. Pair counts are kept exact
 * and updated incrementally (only the words that contain the merged pair are
 * touched, found through a pair -> words index), and the best pair comes from
 * a max-heap with lazily refreshed entries.
 *
 * Ties: among pairs of equal count, the one whose left token is older wins,
 * then the one whose right token is older (token ids are in order of
 * creation: the 256 bytes by their character's code point, then one per
 * merge). This is Hugging Face's BpeTrainer's order, so given the same
 * texts both make the same merges (tests/reference/bpe checks it). The
 * order of the input and of the hash tables never matters: two runs give
 * identical files.
 *
 * Should a merge make bytes that are already a token ("ab"+"c" after
 * "a"+"bc"; exact left-to-right merging never leads there, but the code
 * does not rely on it), the merge is recorded and reuses the token's id, as
 * Hugging Face's trainer does.
 *
 * Input text with invalid UTF-8 has every maximal invalid subsequence
 * replaced by U+FFFD first, which is what the tokenizer does before encoding.
 */
#ifndef WHALE_BPE_H
#define WHALE_BPE_H

#include "whale.h"

/* The three Split patterns of DeepSeek-V3's pre-tokenizer, exactly as its
 * tokenizer.json has them (Oniguruma syntax). */
extern const char *const whale_deepseek_v3_splits[3];

#include <stdint.h>

/* Fixed tokens (U+FF5C FULLWIDTH VERTICAL LINE, U+2581 LOWER ONE EIGHTH BLOCK). */
#define WHALE_BPE_BOS "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define WHALE_BPE_EOS "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define WHALE_BPE_PAD "<\xEF\xBD\x9C\xE2\x96\x81pad\xE2\x96\x81\xEF\xBD\x9C>"
#define WHALE_BPE_USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
#define WHALE_BPE_ASSISTANT "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"

/* 3 specials first, 256 byte symbols, 2 chat markers last. */
#define WHALE_BPE_FIXED_TOKENS (3 + 256 + 2)

/* Called now and then: stage "read" counts input bytes (total = bytes of
 * all files, 0 when unknown), stage "merge" counts merges (total = merges
 * wanted). */
typedef void (*whale_bpe_progress_fn)(void *user, const char *stage, int64_t done, int64_t total);

typedef struct {
    int vocab_size;                    /* everything: specials + bytes + merges + added */
    int min_frequency;                 /* a pair seen fewer times is never merged (default 2) */
    const char *const *extra_special;  /* more special tokens, appended after the chat markers */
    int n_extra_special;
    int model_max_length;              /* tokenizer_config.json (default 2048, nanowhale's context) */
    whale_bpe_progress_fn progress;    /* optional */
    void *progress_user;
} whale_bpe_train_opts;

typedef struct {
    int vocab_size;           /* ids written (smaller than asked when the text runs out of pairs) */
    int n_merges;             /* merges written (can exceed new tokens, see above) */
    int64_t n_bytes;          /* text bytes counted (after U+FFFD replacement) */
    int64_t n_words;          /* pre-tokens counted */
    int64_t n_unique_words;
    double seconds_count;     /* reading and pre-tokenizing */
    double seconds_merge;     /* merging */
} whale_bpe_train_stats;

void whale_bpe_train_defaults(whale_bpe_train_opts *opts);

/* Whole job: read files (*.jsonl: one JSON object per line with a string
 * field "text", each a document; anything else: the file is one document),
 * train, write out_dir/tokenizer.json and out_dir/tokenizer_config.json
 * (out_dir is created if missing; each file is written to a temporary name,
 * fsynced and renamed). stats may be NULL. */
whale_code whale_bpe_train(const whale_bpe_train_opts *opts, const char *const *files, int n_files,
                           const char *out_dir, whale_bpe_train_stats *stats, whale_err *err);

/* The same in steps, for text that is not in files. */
typedef struct whale_bpe_trainer whale_bpe_trainer;

whale_code whale_bpe_trainer_new(const whale_bpe_train_opts *opts, whale_bpe_trainer **out,
                                 whale_err *err);
void whale_bpe_trainer_free(whale_bpe_trainer *tr);
/* Count one document (any bytes; NUL is an ordinary character). */
whale_code whale_bpe_trainer_add_text(whale_bpe_trainer *tr, const char *text, size_t len,
                                      whale_err *err);
/* Count a file as whale_bpe_train() does. */
whale_code whale_bpe_trainer_add_file(whale_bpe_trainer *tr, const char *path, whale_err *err);
/* Merge and write the files. Call once. */
whale_code whale_bpe_trainer_finish(whale_bpe_trainer *tr, const char *out_dir,
                                    whale_bpe_train_stats *stats, whale_err *err);

#endif
