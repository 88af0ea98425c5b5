/* tokenizer.json: loading, then a short encode and decode with whatever
 * loaded. */
#include "fuzz_util.h"
#include "whale_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_write(fuzz_path(path, sizeof path, "tokenizer.json"), data, size);
    whale_err err;
    whale_tokenizer *t = NULL;
    whale_code c = whale_tokenizer_load(fuzz_scratch(), &t, &err);
    fuzz_check_message(c, &err);
    if (!c) {
        static const char text[] = "Hello wörld, 12345 \xe4\xbd\xa0\xe5\xa5\xbd!\n\t  <|endoftext|> a\xcc\x81";
        int32_t *ids = NULL;
        int n = 0;
        c = whale_tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &n, &err);
        fuzz_check_message(c, &err);
        if (!c) {
            char *out = NULL;
            size_t len;
            if (whale_tokenizer_decode(t, ids, n, 0, &out, &len, &err) == WHALE_OK) free(out);
        }
        free(ids);
        whale_tokenizer_free(t);
    }
    return 0;
}
