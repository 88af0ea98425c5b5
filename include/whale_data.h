/*
 * whale_data.h — training data: token shards made by `whale data prepare`
 * and a loader that cuts them into training windows (docs/data.md).
 *
 * A dataset is a directory:
 *
 *   meta.json            tokenizer (vocab size, EOS id, fingerprint), the
 *                        shards of each split with their token and document
 *                        counts, and how the data was prepared
 *   train-00000.bin …    the training split, in document order
 *   val.bin              the validation split (whole documents)
 *
 * Shard file (all integers little-endian):
 *
 *   offset  size  field
 *        0     8  magic "WHALETOK"
 *        8     4  format version (u32) = 1
 *       12     4  bytes per token (u32): 2 = uint16 (vocab ≤ 65536), 4 = uint32
 *       16     4  vocab size (u32): every token id is below it
 *       20     4  EOS id (u32; 0xFFFFFFFF = none)
 *       24     8  token count T (u64)
 *       32     8  document count D (u64)
 *       40     8  tokenizer fingerprint (u64, FNV-1a 64 of tokenizer.json)
 *       48    16  reserved, zero
 *       64   T·b  the tokens
 *            8·(D+1)  document index: the token index where each document
 *                 starts, then T (strictly increasing: no empty documents)
 *
 * The file size is exactly 64 + T·b + 8·(D+1). Every document ends with
 * the EOS id (prepare appends it). A document never spans two shards.
 */
#ifndef WHALE_DATA_H
#define WHALE_DATA_H

#include "whale.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WHALE_DATA_MAGIC "WHALETOK"
#define WHALE_DATA_VERSION 1
#define WHALE_DATA_HEADER_BYTES 64
#define WHALE_DATA_DEFAULT_SHARD_TOKENS 100000000

typedef enum { WHALE_SPLIT_TRAIN = 0, WHALE_SPLIT_VAL = 1 } whale_split;

/* FNV-1a 64 of a tokenizer.json's bytes; path is the file or a directory
 * holding it. Shards record it so a model with another tokenizer refuses them. */
whale_code whale_data_fingerprint(const char *tokenizer, uint64_t *fingerprint, whale_err *err);

/* ---------------------------------------------------------------- prepare */

typedef enum {
    WHALE_DOC_FILE = 0, /* a whole text file is one document */
    WHALE_DOC_LINE,     /* each line (without its \n or \r\n) */
    WHALE_DOC_BLANK     /* paragraphs separated by blank (whitespace-only) lines */
} whale_doc_split;

typedef struct {
    int64_t documents, tokens, bytes; /* done so far */
    double seconds;                   /* since prepare started */
} whale_data_progress;

typedef struct {
    const char *tokenizer;     /* directory with tokenizer.json (+ tokenizer_config.json) */
    const char *out_dir;       /* created if missing (one level) */
    const char *const *inputs; /* text files; *.jsonl: one JSON object per line */
    int n_inputs;
    double val_fraction;       /* share of documents for validation (default 0.01) */
    int64_t val_docs;          /* ≥ 0: exactly this many instead (default -1) */
    int64_t shard_tokens;      /* train shard size limit (default 100M) */
    uint64_t seed;             /* picks the validation documents */
    const char *text_field;    /* JSONL field holding the text (default "text") */
    whale_doc_split doc_split; /* for text files (default whole file) */
    int skip_bad_records;      /* count and skip bad JSONL lines instead of failing */
    int overwrite;             /* replace a dataset already in out_dir */
    int threads;               /* tokenizer threads (0 = OpenMP threads, at most 16 and one per 4 MB of text) */
    /* called about once a second from the calling thread (may be NULL) */
    void (*progress)(void *user, const whale_data_progress *p);
    void *progress_user;
} whale_data_prepare_opts;

whale_data_prepare_opts whale_data_prepare_defaults(void);

typedef struct {
    int64_t documents[2], tokens[2]; /* indexed by whale_split */
    int train_shards;
    int64_t empty_documents;         /* dropped: no text or only whitespace */
    int64_t bad_records;             /* skipped with skip_bad_records */
    char first_bad[512];             /* "FILE:LINE: problem" of the first skipped one */
    int64_t bytes;                   /* text bytes tokenized */
    double seconds;
    int vocab_size;
    int32_t eos_id;
    uint64_t fingerprint;
} whale_data_prepare_stats;

/* Tokenize the inputs into out_dir (see docs/data.md for every rule). Each
 * document is encoded with add_special (BOS or other template tokens only if
 * the tokenizer is configured to add them) and the tokenizer's EOS appended
 * unless its template already ends with it. On failure nothing is left in
 * out_dir (and a directory prepare created is removed). stats may be NULL. */
whale_code whale_data_prepare(const whale_data_prepare_opts *opts, whale_data_prepare_stats *stats, whale_err *err);

/* ---------------------------------------------------------------- writer */

/* Lower level: write documents that are already token ids (what prepare
 * uses; also for tools and tests that make datasets of their own). Every
 * file is written under a temporary name and renamed by finish. */
typedef struct {
    int vocab_size;       /* ids must be below it; ≤ 65536 stores uint16 */
    int32_t eos_id;       /* recorded in headers and meta.json; -1 = none */
    uint64_t fingerprint; /* of the tokenizer the ids come from */
    int64_t shard_tokens; /* train shard limit; 0 = default */
    int overwrite;        /* replace a dataset already in the directory */
} whale_data_layout;

typedef struct whale_data_writer whale_data_writer;

whale_code whale_data_writer_new(const char *dir, const whale_data_layout *layout, whale_data_writer **out,
                                 whale_err *err);
/* Append one document (n ≥ 1 ids, EOS included if wanted) to a split. A
 * train document that would overflow the current shard starts a new one;
 * a document larger than the limit gets a shard of its own. */
whale_code whale_data_writer_add(whale_data_writer *w, whale_split split, const int32_t *ids, int64_t n,
                                 whale_err *err);
/* Complete the shards, rename them into place, then write meta.json. */
whale_code whale_data_writer_finish(whale_data_writer *w, whale_err *err);
/* Without a successful finish this removes everything the writer made. */
void whale_data_writer_free(whale_data_writer *w);

/* ---------------------------------------------------------------- loader */

typedef struct whale_dataset whale_dataset;

/* Map the shards of one split ("train" or "val") of a prepared directory.
 * Every header, file size and document index is checked against meta.json
 * (errors name the shard). The dataset is read-only and may be shared by
 * threads. */
whale_code whale_dataset_open(const char *dir, const char *split, whale_dataset **out, whale_err *err);
void whale_dataset_free(whale_dataset *d);

int whale_dataset_vocab(const whale_dataset *d);
uint64_t whale_dataset_fingerprint(const whale_dataset *d);
int64_t whale_dataset_tokens(const whale_dataset *d);
int64_t whale_dataset_documents(const whale_dataset *d);
int32_t whale_dataset_eos(const whale_dataset *d); /* -1 = none */
int whale_dataset_num_shards(const whale_dataset *d);
const char *whale_dataset_shard_path(const whale_dataset *d, int i);

/* Can a model with model_vocab embedding rows train on this data, and (when
 * tokenizer is not NULL: its directory or tokenizer.json) was the data made
 * with that tokenizer? Errors say which, e.g. "DATA/train-00000.bin: shards
 * were made with a tokenizer of 50000 ids but the model has 8192". */
whale_code whale_dataset_check(const whale_dataset *d, int model_vocab, const char *tokenizer, whale_err *err);

/* Attend across documents: seg is 0 everywhere (plain causal attention over
 * the window); positions still restart at every document. Off by default. */
void whale_dataset_set_cross_doc(whale_dataset *d, int on);

/* The token stream (shards in order) is cut into floor(tokens / S)
 * non-overlapping windows of S tokens; a partial last window is not used. */
int64_t whale_dataset_num_windows(const whale_dataset *d, int S);

/* Window w (in stream order) of S tokens. For each position s:
 *   ids[s]     the token
 *   labels[s]  Hugging Face convention, what position s−1 predicts: ids[s],
 *              or −100 at s = 0 and where a document starts (the step from
 *              one document's EOS into the next is not trained)
 *   pos[s]     RoPE position: 0 at the window start and at every document
 *              start inside the window, then counting up
 *   seg[s]     first key s may attend to (block-diagonal causal mask: keys
 *              seg[s]..s): where s's document starts in the window, or 0;
 *              always 0 with cross-document attention
 * labels, pos and seg may be NULL. A token id outside the vocabulary is
 * WHALE_ERR_FORMAT naming the shard. */
whale_code whale_dataset_window(const whale_dataset *d, int64_t w, int S, int32_t *ids, int32_t *labels,
                                int32_t *pos, int32_t *seg, whale_err *err);

/* Where a training run is in the data: save it with a checkpoint and the
 * same cursor gives the same batches after a restart. */
typedef struct {
    uint64_t seed;   /* shuffling seed */
    int64_t epoch;   /* 0-based */
    int64_t index;   /* windows of this epoch already handed out */
    int64_t windows; /* windows per epoch (set by the first batch; checked after) */
} whale_data_cursor;

/* The window visited i-th in epoch `epoch` (0 ≤ i < n): a permutation of
 * [0, n) derived from seed and epoch (a keyed Feistel network with cycle
 * walking: no table, the same on every machine). */
int64_t whale_data_shuffle(uint64_t seed, int64_t epoch, int64_t n, int64_t i);

typedef struct {
    int32_t *ids, *labels, *pos, *seg; /* [B*S] each, row-major */
    int B, S;
} whale_batch;

whale_code whale_batch_alloc(int B, int S, whale_batch *b, whale_err *err);
void whale_batch_free(whale_batch *b);

/* The next B windows in the cursor's shuffled order (an epoch ends when all
 * windows were visited once; the next starts a new permutation, also inside
 * a batch). out's arrays must hold B*S entries; out->B and out->S are set.
 * The cursor advances only on success. Fewer tokens than one window, or a
 * cursor saved for another number of windows, is WHALE_ERR_ARG. */
whale_code whale_dataset_next_batch(const whale_dataset *d, whale_data_cursor *cur, int B, int S, whale_batch *out,
                                    whale_err *err);

#ifdef __cplusplus
}
#endif
/* Token-id files (JSON arrays of equal-length arrays of ids): */
/* ids [B*S] from path; every id in [0, vocab). At most WHALE_MAX_BATCH rows
 * and WHALE_MAX_BATCH_TOKENS ids (WHALE_ERR_RANGE beyond). Free *ids. */
whale_code whale_read_ids_file(const char *path, int vocab, int32_t **ids, int *B, int *S, whale_err *err);


#endif
