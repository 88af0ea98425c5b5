/* The core's helpers: whale_path_join never cuts a path (a cut one would
 * name a different file), and its error is one line naming the folder; the
 * growing string keeps its bytes, NULs included, stays NUL-terminated, and
 * once it fails every later append does nothing. */
#include "core/core.h"
#include "core/sbuf.h"
#include "testutil.h"

#include <stdint.h>
#include <string.h>

static void path_join(void) {
    whale_err err;
    char out[16];
    /* "abc/defghijklmn" is 15 bytes: it fits a 16-byte buffer exactly */
    CHECK(whale_path_join(out, sizeof out, "abc", "defghijklmn", &err) == WHALE_OK, "%s", err.msg);
    CHECK(!strcmp(out, "abc/defghijklmn"), "joined %s", out);
    /* one byte more does not fit: an error, never a shorter name */
    whale_code rc = whale_path_join(out, sizeof out, "abc", "defghijklmno", &err);
    CHECK(rc == WHALE_ERR_ARG, "a 16-byte path in 16 bytes gave code %d", (int)rc);
    CHECK(strstr(err.msg, "abc/defghijklmno") && strstr(err.msg, "longer than 15 bytes"), "message: %s", err.msg);
    CHECK(!strchr(err.msg, '\n'), "one line: %s", err.msg);
    /* a very long folder: the message stays bounded and names its start */
    char dir[5000];
    memset(dir, 'd', sizeof dir - 1);
    dir[sizeof dir - 1] = 0;
    char big[4096];
    rc = whale_path_join(big, sizeof big, dir, "config.json", &err);
    CHECK(rc == WHALE_ERR_ARG && strstr(err.msg, "dddd") && strstr(err.msg, "longer than 4095 bytes"), "message: %s",
          err.msg);
    CHECK(strlen(err.msg) < sizeof err.msg, "bounded");
}

static void sbuf(void) {
    whale_sbuf b = {0};
    CHECK(!strcmp(whale_sb_str(&b), "") && b.len == 0, "empty");
    whale_sb_puts(&b, "abc");
    whale_sb_putc(&b, 0);
    whale_sb_put(&b, "de", 2);
    CHECK(b.len == 6 && !memcmp(b.p, "abc\0de", 7), "len %zu", b.len);
    for (int i = 0; i < 1000; i++) whale_sb_printf(&b, "%d,", i); /* past the first allocations */
    CHECK(b.len == 6 + 3890 && !strcmp(b.p + b.len - 4, "999,") && b.p[b.len] == 0, "len %zu", b.len);
    whale_sb_truncate(&b, 3);
    CHECK(b.len == 3 && !strcmp(whale_sb_str(&b), "abc"), "truncated: %s", b.p);
    whale_sb_put(&b, "x", SIZE_MAX / 2); /* a length no buffer can hold: failed, nothing read */
    CHECK(b.oom && b.len == 3, "oom %d len %zu", b.oom, b.len);
    whale_sb_puts(&b, "more");
    whale_sb_printf(&b, "%s", "more");
    CHECK(b.len == 3 && !strcmp(b.p, "abc"), "appends after a failure do nothing: %s", b.p);
    whale_sb_free(&b);
    CHECK(!b.p && !b.len && !b.cap && !b.oom, "freed");
}

int main(void) {
    path_join();
    sbuf();
    return test_finish("util");
}
