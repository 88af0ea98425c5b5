/* Token shards (whale data prepare's output): meta.json, then the train
 * shard and the val shard, separated by "\n@@SHARD@@\n" and written as
 * train-00000.bin and val.bin; both splits are opened, checked against a
 * vocabulary, and read window by window and in batches. */
#include "fuzz_util.h"
#include "whale_data.h"

#define SEP "\n@@SHARD@@\n"

static void read_split(const char *split) {
    whale_err err;
    whale_dataset *d = NULL;
    whale_code c = whale_dataset_open(fuzz_scratch(), split, &d, &err);
    fuzz_check_message(c, &err);
    if (c) return;
    c = whale_dataset_check(d, 1 << 17, NULL, &err);
    fuzz_check_message(c, &err);
    enum { S = 8 };
    int32_t ids[S], labels[S], pos[S], seg[S];
    int64_t nw = whale_dataset_num_windows(d, S);
    for (int64_t w = 0; w < nw && w < 16; w++) {
        c = whale_dataset_window(d, w, S, ids, labels, pos, seg, &err);
        fuzz_check_message(c, &err);
    }
    whale_batch b;
    if (whale_batch_alloc(2, S, &b, &err) == WHALE_OK) {
        whale_data_cursor cur = {.seed = 1};
        for (int i = 0; i < 3; i++) {
            c = whale_dataset_next_batch(d, &cur, 2, S, &b, &err);
            fuzz_check_message(c, &err);
            if (c) break;
        }
        whale_batch_free(&b);
    }
    whale_dataset_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    size_t n1, n2, n3, n4;
    const uint8_t *p2, *p3;
    fuzz_split(data, size, SEP, &n1, &p2, &n2);
    fuzz_split(p2, n2, SEP, &n3, &p3, &n4);
    fuzz_write(fuzz_path(path, sizeof path, "meta.json"), data, n1);
    fuzz_write(fuzz_path(path, sizeof path, "train-00000.bin"), p2, n3);
    fuzz_write(fuzz_path(path, sizeof path, "val.bin"), p3, n4);
    read_split("train");
    read_split("val");
    return 0;
}
