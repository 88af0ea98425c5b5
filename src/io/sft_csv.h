/* SFT records from a .csv file (src/io/sft_csv.c). */
#ifndef WHALE_IO_SFT_CSV_H
#define WHALE_IO_SFT_CSV_H

#include "whale.h"

#include <stdint.h>

/* Called for each data row, in order: json is the row's record as a JSON
 * object (the non-empty cells by column name, "history" parsed), or NULL
 * with bad saying why the row is not a record; line is where the row
 * starts. A non-zero return stops the reading with that code. */
typedef whale_code (*sft_csv_row_fn)(void *ctx, const char *json, const char *bad, int64_t line, whale_err *err);

/* Read path (at most WHALE_MAX_FILE_READ bytes) row by row. A missing
 * header row and a quoted field never closed are errors of the file
 * (WHALE_ERR_FORMAT, "FILE:LINE: ..."), a row of more than
 * WHALE_MAX_RECORD_BYTES too (WHALE_ERR_RANGE). */
whale_code sft_csv_read(const char *path, sft_csv_row_fn fn, void *ctx, whale_err *err);

#endif
