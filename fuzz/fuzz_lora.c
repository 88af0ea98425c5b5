/* LoRA adapters: adapter_config.json, then "\n@@TENSORS@@\n", then
 * adapter_model.safetensors, loaded onto the tiny test model (loaded once).
 * A successful load is removed again, so every input starts from the bare
 * base; a failed one must leave nothing behind. */
#include "fuzz_util.h"
#include "models/model.h" /* whale_lora_free */
#include "whale_lora.h"

#define SEP "\n@@TENSORS@@\n"

static whale_model *base;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    whale_err err;
    if (whale_model_load(WHALE_FUZZ_DATA "/tiny", &base, &err)) {
        fprintf(stderr, "fuzz_lora: %s\n", err.msg);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    whale_err err;
    char path[512];
    size_t n1, n2;
    const uint8_t *p2;
    fuzz_split(data, size, SEP, &n1, &p2, &n2);
    fuzz_write(fuzz_path(path, sizeof path, "adapter_config.json"), data, n1);
    fuzz_write(fuzz_path(path, sizeof path, "adapter_model.safetensors"), p2, n2);
    int before = whale_model_num_params(base);
    whale_code c = whale_lora_load(base, fuzz_scratch(), &err);
    fuzz_check_message(c, &err);
    if (!c) {
        if (whale_lora_count(base) < 1 || whale_lora_num_params(base) < 1) abort();
        whale_lora_free(base);
    }
    if (whale_model_num_params(base) != before || whale_lora_count(base) != 0) abort(); /* nothing left behind */
    return 0;
}
