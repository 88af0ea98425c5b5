/* Copying a tokenizer's files between model folders (init, checkpoints). */
#include "whale_tokenizer.h"

#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

whale_code whale_tokenizer_copy_files(const char *src, const char *dst, whale_err *err) {
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};
    for (int i = 0; i < 3; i++) {
        char from[4096], to[4096], *data;
        size_t n;
        snprintf(from, sizeof from, "%s/%s", src, names[i]);
        snprintf(to, sizeof to, "%s/%s", dst, names[i]);
        if (i > 0 && access(from, R_OK) != 0) continue; /* optional files */
        whale_code c = whale_read_file(from, &data, &n, err);
        if (c) return c;
        c = whale_write_file_atomic(to, data, n, err);
        free(data);
        if (c) return c;
    }
    return WHALE_OK;
}
