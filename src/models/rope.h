/* RoPE frequencies of the dense decoder family with the scaling types of
 * transformers' modeling_rope_utils.py (default, linear, dynamic, yarn,
 * llama3), read from either config form: transformers-4 "rope_theta" +
 * "rope_scaling", or transformers-5 "rope_parameters" {rope_theta,
 * rope_type, ...}. */
#ifndef WHALE_ROPE_H
#define WHALE_ROPE_H

#include "whale.h"

#include <cjson/cJSON.h>

typedef enum { WHALE_ROPE_DEFAULT = 0, WHALE_ROPE_LINEAR, WHALE_ROPE_DYNAMIC, WHALE_ROPE_YARN, WHALE_ROPE_LLAMA3 } whale_rope_type;

typedef struct {
    whale_rope_type type;
    int dim;            /* rotated dims (the head) */
    int max_pos;        /* the config's max_position_embeddings */
    double theta, factor;
    int original_max;   /* original_max_position_embeddings (0: absent) */
    double low_freq_factor, high_freq_factor;               /* llama3 */
    double attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim; /* yarn (0: absent) */
    int truncate;                                           /* yarn, default true */
} whale_rope;

/* The RoPE settings of config cfg (file names it in messages) for heads of
 * dim dims. Unknown rope types and malformed fields are refused with one
 * line naming the file and field. */
whale_code whale_rope_from_config(const cJSON *cfg, const char *file, int dim, int max_pos, whale_rope *r,
                                  whale_err *err);
const char *whale_rope_type_name(whale_rope_type t);
/* Positions a model with these settings is meant to run: the config's
 * max_position_embeddings, or the original window times the factor when
 * that is larger (linear, dynamic and yarn extend the window they scale). */
int whale_rope_window(const whale_rope *r);
/* inv_freq [dim/2] and the factor cos and sin are multiplied by, for a
 * forward whose longest position is seq_len − 1 (only dynamic depends on it). */
void whale_rope_inv_freq(const whale_rope *r, int seq_len, float *inv_freq, float *attention_factor);
/* cos/sin tables [need, dim/2] (grown, never shrunk; *len = positions held),
 * with the frequencies of seq_len = max_pos. */
whale_code whale_rope_reserve_scaled(const whale_rope *r, float **cos_t, float **sin_t, int *len, int need,
                                     whale_err *err);
/* Rows [n, dim/2] for the positions pos[0..n) with the frequencies of
 * seq_len (dynamic scaling past the original window). */
void whale_rope_rows(const whale_rope *r, int seq_len, const int32_t *pos, int n, float *cos_t, float *sin_t);
/* Whether the forward with longest position seq_len − 1 needs rows of its own. */
int whale_rope_needs_rows(const whale_rope *r, int seq_len);

#endif
