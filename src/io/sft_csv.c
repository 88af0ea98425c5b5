/* SFT records from a .csv file, as ms-swift reads them (through Hugging
 * Face datasets' csv loader): a header row of column names, then one
 * record per row; an empty cell is a missing field; "history" holds a JSON
 * list of [query, response] pairs. Fields follow RFC 4180: separated by
 * commas, optionally in double quotes (which may hold commas, newlines and
 * "" for a quote); rows end with LF or CRLF. */
#include "io/sft_csv.h"

#include "core/core.h"
#include "core/sbuf.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COLUMNS 64

/* One row's fields, unquoted, each NUL-terminated in cells. */
typedef struct {
    whale_sbuf cells;
    size_t off[MAX_COLUMNS];
    int n;
    int too_many;     /* more than MAX_COLUMNS fields */
    const char *why;  /* a malformed field: what is wrong */
    int why_field;
} row;

/* c appended to the row's cells: 0 when out of memory. */
static int cell_put(row *r, char c) {
    whale_sb_putc(&r->cells, c);
    return !r->cells.oom;
}

static int end_field(row *r, size_t start) {
    if (!cell_put(r, 0)) return 0;
    if (r->n >= MAX_COLUMNS) r->too_many = 1;
    else r->off[r->n++] = start;
    return 1;
}

/* Parse the row at s[*pos]: 1 when there was one (possibly malformed:
 * r->why), 0 at the end, -1 out of memory, -2 a quote never closed.
 * *line counts the newlines passed. */
static int parse_row(const char *s, size_t n, size_t *pos, int64_t *line, row *r) {
    size_t i = *pos;
    whale_sb_truncate(&r->cells, 0);
    r->n = 0;
    r->too_many = 0;
    r->why = NULL;
    if (i >= n) return 0;
    for (;;) {
        size_t start = r->cells.len;
        if (i < n && s[i] == '"') { /* a quoted field */
            for (i++;; i++) {
                if (i >= n) return -2;
                if (s[i] == '"' && i + 1 < n && s[i + 1] == '"') i++;
                else if (s[i] == '"') break;
                if (s[i] == '\n') ++*line;
                if (!cell_put(r, s[i])) return -1;
            }
            i++;
            if (i < n && s[i] != ',' && s[i] != '\n' && !(s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') && !r->why)
                r->why = "text after the closing quote", r->why_field = r->n;
            while (i < n && s[i] != ',' && s[i] != '\n') i++; /* dropped with the row */
        } else {
            for (; i < n && s[i] != ',' && s[i] != '\n'; i++) {
                if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') continue;
                if (s[i] == '"' && !r->why) r->why = "a quote inside an unquoted field", r->why_field = r->n;
                if (!cell_put(r, s[i])) return -1;
            }
        }
        if (!end_field(r, start)) return -1;
        if (i >= n || s[i] == '\n') break;
        i++; /* the comma */
    }
    if (i < n) i++, ++*line;
    *pos = i;
    return 1;
}

static const char *cell(const row *r, int k) { return r->cells.p + r->off[k]; }

static int blank_row(const row *r) { return r->n == 1 && !cell(r, 0)[0]; }

/* The record of one data row as JSON text (malloc'd), or why not. */
static char *row_json(const row *hdr, const row *r, char *why, size_t cap) {
    if (r->too_many || r->n != hdr->n) {
        snprintf(why, cap, "%s%d fields, the header has %d", r->too_many ? "more than " : "",
                 r->too_many ? MAX_COLUMNS : r->n, hdr->n);
        return NULL;
    }
    if (r->why) {
        snprintf(why, cap, "column \"%.64s\": %s", cell(hdr, r->why_field), r->why);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    for (int k = 0; o && k < r->n; k++) {
        const char *name = cell(hdr, k), *v = cell(r, k);
        if (!*v || !*name || cJSON_GetObjectItemCaseSensitive(o, name)) continue; /* empty: no such field */
        cJSON *item = strcmp(name, "history") ? cJSON_CreateString(v) : cJSON_Parse(v);
        if (!strcmp(name, "history") && !cJSON_IsArray(item)) {
            snprintf(why, cap, "column \"history\": not a JSON list of [query, response] pairs");
            cJSON_Delete(item);
            cJSON_Delete(o);
            return NULL;
        }
        if (!item || !cJSON_AddItemToObject(o, name, item)) {
            cJSON_Delete(item);
            cJSON_Delete(o);
            o = NULL;
        }
    }
    char *json = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!json) snprintf(why, cap, "out of memory");
    return json;
}

whale_code sft_csv_read(const char *path, sft_csv_row_fn fn, void *ctx, whale_err *err) {
    char *buf;
    size_t size, pos = 0;
    whale_code rc = whale_read_file(path, &buf, &size, err);
    if (rc) return rc;
    if (size >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3)) pos = 3;
    row hdr = {0}, r = {0};
    int64_t line = 1, at = 1;
    int got = parse_row(buf, size, &pos, &line, &hdr);
    if (got == 1 && (hdr.too_many || hdr.why))
        rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:1: the header row is not a list of at most %d column names", path,
                        MAX_COLUMNS);
    else if (got == 0 || (got == 1 && blank_row(&hdr)))
        rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: a .csv file needs a header row of column names (query, response, "
                        "system, history or instruction, input, output)", path);
    while (!rc && got == 1) {
        at = line;
        got = parse_row(buf, size, &pos, &line, &r);
        if (got != 1 || blank_row(&r)) continue;
        if (r.cells.len > WHALE_MAX_RECORD_BYTES) { /* as a JSONL line */
            rc = whale_errf(err, WHALE_ERR_RANGE, "%s:%" PRId64 ": a record of more than %zu bytes (the cap on one "
                            "record)", path, at, (size_t)WHALE_MAX_RECORD_BYTES);
            break;
        }
        char why[200];
        char *json = row_json(&hdr, &r, why, sizeof why);
        if (!json && !strcmp(why, "out of memory")) got = -1;
        else rc = fn(ctx, json, json ? NULL : why, at, err);
        free(json);
    }
    if (!rc && got == -1) rc = whale_errf(err, WHALE_ERR_NOMEM, "%s:%" PRId64 ": out of memory", path, at);
    if (!rc && got == -2)
        rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:%" PRId64 ": a quoted field is never closed", path, at);
    free(hdr.cells.p);
    free(r.cells.p);
    free(buf);
    return rc;
}
