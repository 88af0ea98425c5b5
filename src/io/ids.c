/* Token-id files: a JSON array of equal-length arrays of ids (whale score,
 * grad, diagnose, precision-report), bounded by WHALE_MAX_BATCH rows and
 * WHALE_MAX_BATCH_TOKENS ids. */
#include "whale_data.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>

/* JSON array of equal-length arrays of token ids -> ids [B*S] */
whale_code whale_read_ids_file(const char *path, int vocab, int32_t **ids, int *B, int *S, whale_err *err) {
    char *text;
    size_t n;
    whale_code c = whale_read_file(path, &text, &n, err);
    if (c) return c;
    /* cJSON makes a node of every value (~64 bytes each): count the values
     * (one more than the commas between them) before it does */
    size_t commas = 0;
    for (size_t i = 0; i < n; i++) commas += text[i] == ',';
    if (commas > (size_t)WHALE_MAX_BATCH_TOKENS + WHALE_MAX_BATCH) {
        free(text);
        return whale_errf(err, WHALE_ERR_RANGE, "%s: more than %d ids, the cap on one batch", path,
                          WHALE_MAX_BATCH_TOKENS);
    }
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!j) return whale_errf(err, WHALE_ERR_FORMAT, "%s: not valid JSON", path);
    c = WHALE_OK;
    int rows = cJSON_GetArraySize(j), cols = -1;
    if (!cJSON_IsArray(j) || rows == 0) {
        c = whale_errf(err, WHALE_ERR_FORMAT, "%s: expected a non-empty JSON array of arrays of token ids", path);
        goto done;
    }
    if (rows > WHALE_MAX_BATCH) {
        c = whale_errf(err, WHALE_ERR_RANGE, "%s: %d rows, over the cap of %d sequences in one batch", path, rows,
                       WHALE_MAX_BATCH);
        goto done;
    }
    const cJSON *row;
    int r = 0;
    cJSON_ArrayForEach(row, j) {
        int len = cJSON_GetArraySize(row);
        if (!cJSON_IsArray(row) || len == 0) {
            c = whale_errf(err, WHALE_ERR_FORMAT, "%s: row %d is not a non-empty array of token ids", path, r);
            goto done;
        }
        if (cols >= 0 && len != cols) {
            c = whale_errf(err, WHALE_ERR_FORMAT, "%s: row %d has %d ids but row 0 has %d (rows must be equal length)",
                           path, r, len, cols);
            goto done;
        }
        cols = len;
        r++;
    }
    if ((int64_t)rows * cols > WHALE_MAX_BATCH_TOKENS) {
        c = whale_errf(err, WHALE_ERR_RANGE, "%s: %d × %d ids, over the cap of %d tokens in one batch", path, rows, cols,
                       WHALE_MAX_BATCH_TOKENS);
        goto done;
    }
    *ids = malloc(sizeof(int32_t) * (size_t)rows * cols);
    if (!*ids) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    r = 0;
    cJSON_ArrayForEach(row, j) {
        const cJSON *v;
        int col = 0;
        cJSON_ArrayForEach(v, row) {
            double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
            if (!(d == floor(d))) {
                c = whale_errf(err, WHALE_ERR_FORMAT, "%s: row %d, column %d is not an integer token id", path, r, col);
            } else if (d < 0 || d >= vocab) {
                c = whale_errf(err, WHALE_ERR_RANGE, "%s: row %d, column %d: token id %.0f is outside the vocabulary [0, %d)",
                               path, r, col, d, vocab);
            }
            if (c) {
                free(*ids);
                *ids = NULL;
                goto done;
            }
            (*ids)[(size_t)r * cols + col++] = (int32_t)d;
        }
        r++;
    }
    *B = rows;
    *S = cols;
done:
    cJSON_Delete(j);
    return c;
}
