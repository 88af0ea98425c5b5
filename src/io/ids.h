/* Token-id files (JSON arrays of equal-length arrays of ids). */
#ifndef WHALE_IO_IDS_H
#define WHALE_IO_IDS_H

#include "whale.h"

/* ids [B*S] from path; every id in [0, vocab). At most WHALE_MAX_BATCH rows
 * and WHALE_MAX_BATCH_TOKENS ids (WHALE_ERR_RANGE beyond). Free *ids. */
whale_code whale_read_ids_file(const char *path, int vocab, int32_t **ids, int *B, int *S, whale_err *err);

#endif
