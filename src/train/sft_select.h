/* ms-swift's dataset syntax and selection for whale sft: FILE#N sampling
 * and the train / validation split (--split_dataset_ratio). */
#ifndef WHALE_SFT_SELECT_H
#define WHALE_SFT_SELECT_H

#include "whale_sft.h"

/* "FILE#N" where FILE#N itself is no file but FILE is: *path = FILE
 * (malloc'd) and *n = N; otherwise a copy of arg and -1. NULL path: out of
 * memory. As ms-swift's DatasetSyntax.parse (the last '#'). */
void whale_sft_parse_sample(const char *arg, char **path, int64_t *n);

/* ms-swift's DatasetLoader._post_preprocess, file by file over ds (the
 * files in the order opened; want[f] is file f's N, -1 = all): with ratio
 * in (0, 1) max(floor(min(n, N)·ratio), 1) samples of a seeded permutation
 * are held out for validation and N minus that many are drawn from the
 * rest; ratio 1 sends N to validation; drawing k from n repeats all of
 * them floor(k/n) times, then takes the first k mod n of a seeded
 * permutation. *train (NULL when ratio is 1) and *val (NULL when ratio is
 * 0) are new datasets; a file that cannot give what is asked is an error
 * naming it. */
whale_code whale_sft_select(const whale_sft_dataset *ds, int n_files, const char *const *names, const int64_t *want,
                            double ratio, uint64_t seed, whale_sft_dataset **train, whale_sft_dataset **val,
                            whale_err *err);

#endif
