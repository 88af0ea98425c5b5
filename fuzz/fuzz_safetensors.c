/* safetensors: one file (first byte even) or a sharded index (odd) whose
 * shards are two fixed small files. */
#include "fuzz_util.h"
#include "whale_safetensors.h"

static void write_shard(const char *name, const char *tensor) {
    char path[512], header[256];
    int n = snprintf(header, sizeof header, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", tensor);
    uint8_t buf[512] = {0};
    uint64_t hl = (uint64_t)n;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hl >> (8 * i));
    memcpy(buf + 8, header, (size_t)n);
    fuzz_write(fuzz_path(path, sizeof path, name), buf, 8 + (size_t)n + 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        write_shard("a.safetensors", "x");
        write_shard("b.safetensors", "y");
        init = 1;
    }
    if (size < 1) return 0;
    char path[512];
    whale_err err;
    whale_st *st = NULL;
    whale_code c;
    if (data[0] & 1) {
        fuzz_write(fuzz_path(path, sizeof path, "model.safetensors.index.json"), data + 1, size - 1);
        c = whale_st_open_dir(fuzz_scratch(), &st, &err);
    } else {
        fuzz_write(fuzz_path(path, sizeof path, "one.safetensors"), data + 1, size - 1);
        c = whale_st_open(path, &st, &err);
    }
    fuzz_check_message(c, &err);
    if (!c) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < whale_st_count(st); i++) {
            const whale_st_entry *e = whale_st_at(st, i);
            if (whale_st_find(st, e->name) != e) abort();
            if (e->nbytes) sink ^= ((const uint8_t *)e->data)[e->nbytes - 1]; /* in bounds */
        }
        (void)whale_st_metadata(st, "format");
        (void)sink;
    }
    whale_st_close(st);
    return 0;
}
