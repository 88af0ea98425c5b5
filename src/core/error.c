/* Errors: a code plus a one-line message, filled by the failing function. */
#include "whale.h"

#include <stdarg.h>
#include <stdio.h>

/* A message is one line whatever the strings in it came from (file names,
 * JSON strings and tensor names from a downloaded file): control characters
 * are written as escapes, so a newline or a terminal escape in a hostile
 * file cannot forge a second log line or reach the terminal raw. */
static void escape_controls(const char *in, char *out, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        unsigned c = *p;
        char esc[5];
        size_t k = 0;
        if (c == '\n') esc[k++] = '\\', esc[k++] = 'n';
        else if (c == '\r') esc[k++] = '\\', esc[k++] = 'r';
        else if (c == '\t') esc[k++] = '\\', esc[k++] = 't';
        else if (c < 0x20 || c == 0x7f)
            esc[k++] = '\\', esc[k++] = 'x', esc[k++] = hex[c >> 4], esc[k++] = hex[c & 15];
        else esc[k++] = (char)c;
        if (n + k + 1 > cap) break;
        for (size_t i = 0; i < k; i++) out[n++] = esc[i];
    }
    out[n] = 0;
}

whale_code whale_errf(whale_err *err, whale_code code, const char *fmt, ...) {
    if (err) {
        /* formatted apart from err->msg, which may be one of the arguments */
        char raw[WHALE_ERR_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(raw, sizeof raw, fmt, ap);
        va_end(ap);
        escape_controls(raw, err->msg, sizeof err->msg);
        err->code = code;
    }
    return code;
}

const char *whale_code_name(whale_code code) {
    switch (code) {
    case WHALE_OK: return "ok";
    case WHALE_ERR_ARG: return "bad argument";
    case WHALE_ERR_IO: return "i/o error";
    case WHALE_ERR_FORMAT: return "malformed input";
    case WHALE_ERR_NOMEM: return "out of memory";
    case WHALE_ERR_RANGE: return "out of range";
    case WHALE_ERR_UNSUPPORTED: return "unsupported";
    case WHALE_ERR_INTERNAL: return "internal error";
    case WHALE_ERR_ABORTED: return "aborted";
    }
    return "unknown error";
}

/* Exit statuses are documented in docs/cli.md; 2 is kept for usage errors. */
int whale_exit_status(whale_code code) {
    switch (code) {
    case WHALE_OK: return 0;
    case WHALE_ERR_ARG: return 2;
    case WHALE_ERR_IO: return 3;
    case WHALE_ERR_FORMAT: return 4;
    case WHALE_ERR_RANGE: return 5;
    case WHALE_ERR_UNSUPPORTED: return 6;
    case WHALE_ERR_NOMEM: return 7;
    case WHALE_ERR_INTERNAL: return 1;
    case WHALE_ERR_ABORTED: return 8;
    }
    return 1;
}
