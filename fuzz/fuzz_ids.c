/* Token-id files (whale score / grad / diagnose --ids). */
#include "fuzz_util.h"
#include "whale_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_write(fuzz_path(path, sizeof path, "ids.json"), data, size);
    whale_err err;
    int32_t *ids = NULL;
    int B = 0, S = 0;
    whale_code c = whale_read_ids_file(path, 512, &ids, &B, &S, &err);
    fuzz_check_message(c, &err);
    if (!c) {
        if (B < 1 || S < 1 || B > WHALE_MAX_BATCH || (int64_t)B * S > WHALE_MAX_BATCH_TOKENS) abort();
        for (int64_t i = 0; i < (int64_t)B * S; i++)
            if (ids[i] < 0 || ids[i] >= 512) abort();
    }
    free(ids);
    return 0;
}
