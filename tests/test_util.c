/* The core's path and file helpers: whale_path_join never cuts a path (a
 * cut one would name a different file), and its error is one line naming
 * the folder. */
#include "core/core.h"
#include "testutil.h"

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

int main(void) {
    path_join();
    return test_finish("util");
}
