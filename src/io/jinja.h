/* jinja.h — a sandboxed Jinja renderer for Hugging Face chat templates.
 *
 * The subset chat templates use, with the semantics of @huggingface/jinja
 * (what transformers.js renders templates with): trim_blocks and
 * lstrip_blocks on, a single trailing newline of the template dropped,
 * whitespace control, comments; if/elif/else, for (loop.*, `for … if`,
 * else), set (names, tuples, namespace attributes, set blocks), macros,
 * break/continue; the expressions, filters, tests and methods listed in
 * docs/chat-templates.md. Anything else is refused when the template is
 * parsed or when the construct is reached, with its name and template line
 * ("chat template line 12: filter 'wordwrap' is not supported") — never a
 * silently different prompt.
 *
 * Sandboxed: the template sees only the variables it is given (JSON data,
 * the globals below) — no files, no host attributes; output, memory, loop
 * iterations and call depth are bounded (limits below), and every failure
 * is a whale_err code with a one-line message.
 */
#ifndef WHALE_JINJA_H
#define WHALE_JINJA_H

#include "whale.h"

#include <stddef.h>

struct cJSON;

#define WHALE_JINJA_MAX_SOURCE (1u << 20)   /* template bytes */
#define WHALE_JINJA_MAX_OUTPUT (16u << 20)  /* rendered bytes */
#define WHALE_JINJA_MAX_MEMORY (256u << 20) /* bytes allocated by one render */
#define WHALE_JINJA_MAX_STEPS 4000000L      /* loop iterations + calls in one render */
#define WHALE_JINJA_MAX_DEPTH 64            /* nesting of statements/expressions, macro calls */

typedef struct whale_jinja whale_jinja;

/* Compile a template (src need not be NUL-terminated). Syntax errors and
 * unsupported statements are WHALE_ERR_FORMAT / WHALE_ERR_UNSUPPORTED with
 * the line. Free with whale_jinja_free. */
whale_code whale_jinja_parse(const char *src, size_t len, whale_jinja **out, whale_err *err);
void whale_jinja_free(whale_jinja *t);

/* Render with the members of vars (a JSON object, may be NULL) as globals,
 * next to true/false/none (and True/False/None), namespace, range,
 * raise_exception and strftime_now. JSON numbers that are integral become
 * integers, as in JavaScript. *out is malloc'd and NUL-terminated (*len
 * excludes the NUL). raise_exception(msg) fails with WHALE_ERR_FORMAT and
 * "chat template line N: raise_exception: msg". */
whale_code whale_jinja_render(const whale_jinja *t, const struct cJSON *vars, char **out, size_t *len,
                              whale_err *err);
/* The same with at most *steps loop iterations and calls (and never more
 * than WHALE_JINJA_MAX_STEPS); the steps taken are subtracted from *steps,
 * so that several renders can share one budget (*steps < 0 after a
 * WHALE_ERR_RANGE: it ran out). */
whale_code whale_jinja_render_steps(const whale_jinja *t, const struct cJSON *vars, long *steps, char **out,
                                    size_t *len, whale_err *err);

#endif
