/* Errors: a code plus a one-line message, filled by the failing function. */
#include "whale.h"

#include <stdarg.h>
#include <stdio.h>

whale_code whale_errf(whale_err *err, whale_code code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
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
    }
    return 1;
}
