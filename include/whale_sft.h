/*
 * whale_sft.h — supervised fine-tuning data: chat records in JSONL, rendered
 * with the model's chat template, with a loss mask, truncation, optional
 * packing and shuffled batches for the trainer (docs/sft-data.md).
 *
 * Input: .jsonl files, one JSON object per line (blank lines are not
 * records; a UTF-8 BOM at the start of a file and a \r before each \n are
 * ignored). Every line must be valid UTF-8. Shapes, as ms-swift reads them:
 *
 *   {"messages": [{"role", "content"}, ...]}     system / user / assistant;
 *                          an optional "system" string is put in front when
 *                          the first message is not a system message
 *   {"query", "response", "system"?, "history"?} history = [[q, a], ...]:
 *                          [system] + user q / assistant a per pair + user
 *                          query / assistant response
 *   {"instruction", "input"?, "output", "system"?, "history"?}   Alpaca: the
 *                          query is instruction + "\n" + input (or whichever
 *                          of the two is not empty), the response output
 *   any of these + "tag"   self-cognition (swift/self-cognition's shape is
 *                          {"query", "response", "tag"}): {{NAME}} and
 *                          {{AUTHOR}} in every string of the record are
 *                          replaced by the model's name and author, the
 *                          Chinese value when tag is "zh", the English one
 *                          otherwise. Records without "tag" are used as
 *                          written (a literal {{NAME}} in code stays).
 *
 * A record must end with a non-empty (not only whitespace) assistant message,
 * and no assistant message may be empty. Records with no system message get
 * opts->system when that is set (otherwise the template's default applies:
 * ChatML adds Qwen2.5's "You are Qwen, created by Alibaba Cloud…").
 *
 * A malformed record — invalid JSON or UTF-8, a "\u0000" in a string, not an
 * object, text after it, missing fields or wrong types, an unknown role, an
 * empty assistant message — is WHALE_ERR_FORMAT "FILE:LINE: problem"; what is
 * valid but not supported (tool messages and calls, lists of content parts,
 * text a normalizing tokenizer changes across a turn boundary so that the
 * loss mask cannot be placed) is WHALE_ERR_UNSUPPORTED, same form. With
 * WHALE_SFT_BAD_SKIP both are counted and passed over instead (the first is
 * kept in the stats). A {{NAME}} / {{AUTHOR}} in a tagged record without a
 * name / author in the options is always an error (WHALE_ERR_ARG naming
 * FILE:LINE), as are I/O errors and running out of memory.
 *
 * Each record becomes one sample: whale_chat_encode's ids (the template's
 * BOS included) and its mask, which is 1 on the assistant messages' content
 * and each one's end-of-turn token (WHALE_SFT_LOSS_ASSISTANT), or on every
 * token (WHALE_SFT_LOSS_ALL). The first token of a sample is never trained:
 * nothing before it predicts it. Labels are Hugging Face's: labels[i] =
 * ids[i] where trained, −100 elsewhere; the trainer shifts them.
 *
 * A dataset is immutable after opening except for the cached packing plan
 * (whale_sft_dataset_num_rows / _row / whale_sft_next_batch build it for the
 * row length S they are given): use it from one thread at a time.
 */
#ifndef WHALE_SFT_H
#define WHALE_SFT_H

#include "whale.h"
#include "whale_chat.h"
#include "whale_data.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    WHALE_SFT_LOSS_ASSISTANT = 0, /* assistant content + end-of-turn tokens (ms-swift's default) */
    WHALE_SFT_LOSS_ALL            /* every token but each sample's first */
} whale_sft_loss_scope;

/* A sample longer than max_length tokens is: */
typedef enum {
    WHALE_SFT_TRUNC_DELETE = 0, /* dropped and counted (ms-swift's default) */
    WHALE_SFT_TRUNC_LEFT,       /* cut to its last max_length tokens */
    WHALE_SFT_TRUNC_RIGHT       /* cut to its first max_length tokens */
} whale_sft_truncation;

typedef enum {
    WHALE_SFT_BAD_FAIL = 0, /* the first malformed record is the error */
    WHALE_SFT_BAD_SKIP      /* malformed records are counted and skipped */
} whale_sft_bad_policy;

typedef struct {
    whale_sft_loss_scope loss_scope;
    int max_length;                  /* tokens per sample; 0 = no limit */
    whale_sft_truncation truncation;
    int packing;                     /* pack several samples into each row */
    whale_sft_bad_policy bad_records;
    /* {{NAME}} / {{AUTHOR}} as (Chinese, English); when one of a pair is NULL
     * or "" the other serves both languages */
    const char *model_name[2];
    const char *model_author[2];
    const char *system;              /* system message for records without one; NULL = none */
} whale_sft_opts;

/* Everything 0 / NULL: assistant loss, no length limit (delete), one sample
 * per row, fail on bad records (whale sft skips them by default, as
 * ms-swift's strict=False does). */
whale_sft_opts whale_sft_defaults(void);

/* Names as the command line spells them: "assistant" | "all";
 * "delete" | "left" | "right"; "error" (also "fail") | "skip". */
whale_code whale_sft_loss_scope_from_name(const char *name, whale_sft_loss_scope *out, whale_err *err);
whale_code whale_sft_truncation_from_name(const char *name, whale_sft_truncation *out, whale_err *err);
whale_code whale_sft_bad_policy_from_name(const char *name, whale_sft_bad_policy *out, whale_err *err);

typedef struct {
    int64_t records;        /* non-blank lines read */
    int64_t samples;        /* kept */
    int64_t skipped;        /* malformed, skipped with WHALE_SFT_BAD_SKIP */
    int64_t deleted;        /* longer than max_length, dropped (delete) */
    int64_t truncated;      /* longer than max_length, cut (left/right) and kept */
    int64_t untrained;      /* dropped: no trained token left after cutting */
    int64_t tokens;         /* in the kept samples */
    int64_t trained_tokens; /* of those, the ones with a label */
    int max_sample_tokens;  /* the longest kept sample */
    char first_bad[512];    /* "FILE:LINE: problem" of the first skipped record */
} whale_sft_stats;
/* records = samples + skipped + deleted + untrained */

typedef struct whale_sft_dataset whale_sft_dataset;

/* Read, check and tokenize every record of the files, in order. The
 * tokenizer is used only during the call (encoding needs it writable) and
 * must stay alive while samples are rendered to text. No usable sample at
 * all is WHALE_ERR_FORMAT (the message gives the counts). */
whale_code whale_sft_dataset_open_template(const char *const *files, int n_files, whale_tokenizer *tok,
                                           const whale_chat_template *tpl, const whale_sft_opts *opts,
                                           whale_sft_dataset **out, whale_err *err);
/* The same with a native format (whale_chat_template_native). */
whale_code whale_sft_dataset_open(const char *const *files, int n_files, whale_tokenizer *tok,
                                  whale_chat_format fmt, const whale_sft_opts *opts,
                                  whale_sft_dataset **out, whale_err *err);
void whale_sft_dataset_free(whale_sft_dataset *ds);

int64_t whale_sft_dataset_num_samples(const whale_sft_dataset *ds);
void whale_sft_dataset_stats(const whale_sft_dataset *ds, whale_sft_stats *st);
/* The id padding rows are filled with: the tokenizer's pad token, else its
 * EOS, else the template's end-of-turn token, else 0 (never trained). */
int32_t whale_sft_dataset_pad_id(const whale_sft_dataset *ds);

/* ---------------------------------------------------------------- samples */

typedef struct {
    const int32_t *ids;   /* n tokens, after truncation */
    const uint8_t *train; /* n flags: 1 = the label is the id (train[0] is 0) */
    int n;
    const char *file;     /* the record's file and 1-based line */
    int64_t line;
    int truncated;        /* it was cut to max_length */
} whale_sft_sample;

/* Sample i (0 ≤ i < num_samples, in file order). The pointers are owned by
 * ds. */
whale_code whale_sft_dataset_sample(const whale_sft_dataset *ds, int64_t i, whale_sft_sample *out,
                                    whale_err *err);

/* Sample i as text, for inspection (`whale sft --dry-run`): the bytes of its
 * tokens in order (special tokens written out) — the rendered chat text of an
 * untruncated sample when the tokenizer does not normalize it — and, when
 * byte_mask is not NULL, one flag per byte: 1 where the byte belongs to a
 * trained token. A cut sample may start or end inside a character. *text
 * (NUL-terminated; *len excludes the NUL) and *byte_mask are malloc'd. */
whale_code whale_sft_sample_text(const whale_sft_dataset *ds, int64_t i, char **text, size_t *len,
                                 uint8_t **byte_mask, whale_err *err);

/* Fill {{NAME}} and {{AUTHOR}} in text as a record with this tag is filled
 * (tag NULL = English), e.g. for the queries of an evaluation set. *out is
 * malloc'd. A placeholder without a value in opts is WHALE_ERR_ARG. */
whale_code whale_sft_fill_placeholders(const char *text, const char *tag, const whale_sft_opts *opts, char **out,
                                       whale_err *err);

/* ---------------------------------------------------------------- rows */

/* Rows of S tokens. Without packing, row r is sample r. With packing the
 * samples are packed once for S, best fit in decreasing length order (ties
 * in file order), each row holding its samples in file order; the plan
 * depends only on the sample lengths and S. A sample longer than S is
 * WHALE_ERR_ARG naming it (set max_length ≤ S). */
whale_code whale_sft_dataset_num_rows(whale_sft_dataset *ds, int S, int64_t *rows, whale_err *err);

/* The samples read from input file f (samples are in file order):
 * [*first, *first + *count). */
void whale_sft_dataset_file_samples(const whale_sft_dataset *ds, int f, int64_t *first, int64_t *count);
/* A dataset of ds's samples idx[0..n) in that order (a sample may repeat):
 * for ms-swift's dataset sampling (FILE#N) and train/validation splits.
 * Its statistics count the selected samples (records, skipped and deleted
 * stay what reading the files found). An empty selection is allowed. */
whale_code whale_sft_dataset_select(const whale_sft_dataset *ds, const int64_t *idx, int64_t n,
                                    whale_sft_dataset **out, whale_err *err);

/* Row r of S tokens. The row's samples come one after the other, then
 * padding up to S. For each position s:
 *   ids[s]     the token; the pad id after the last sample
 *   labels[s]  ids[s] where the sample trains that token, −100 elsewhere:
 *              at every sample's first token, untrained tokens and padding
 *   pos[s]     RoPE position: 0 at every sample's start, then counting up;
 *              the padding counts from 0 as if it were a sample of its own
 *   seg[s]     first key s may attend to: where s's sample (or the
 *              padding) starts in the row — a sample never sees another
 * labels, pos and seg may be NULL. */
whale_code whale_sft_dataset_row(whale_sft_dataset *ds, int64_t r, int S, int32_t *ids, int32_t *labels,
                                 int32_t *pos, int32_t *seg, whale_err *err);

/* The next B rows in the cursor's shuffled order, exactly as
 * whale_dataset_next_batch hands out windows: the rows of epoch e are
 * visited in whale_data_shuffle(seed, e, rows, i) order, a new epoch starts
 * (also inside a batch) when all were visited, cur->windows holds the rows
 * per epoch (set by the first batch; a cursor saved for another number of
 * rows is WHALE_ERR_ARG) and the cursor advances only on success. out's
 * arrays must hold B*S entries; out->B and out->S are set. */
whale_code whale_sft_next_batch(whale_sft_dataset *ds, whale_data_cursor *cur, int B, int S, whale_batch *out,
                                whale_err *err);

#ifdef __cplusplus
}
#endif
/* Open data files given as FILE or FILE#N and select from them (ratio as
 * whale_sft_select). Without any #N and with ratio 0 (1) the whole data is
 * *train (*val) in file order. A file that does not exist is named with
 * the note that dataset ids are not downloaded. */
whale_code whale_sft_open_data(const char *const *args, int n, whale_tokenizer *tok, const whale_chat_template *tpl,
                               const whale_sft_opts *opts, double ratio, uint64_t seed, whale_sft_dataset **train,
                               whale_sft_dataset **val, whale_err *err);


#endif
