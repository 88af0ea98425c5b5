/* LoRA adapters: adapter_config.json, then "\n@@TENSORS@@\n", then
 * adapter_model.safetensors, loaded onto the tiny test model (loaded once),
 * both into it (whale_lora_load) and beside it (whale_adapter_load): the
 * two must accept the same files with the same parameters. A successful
 * load is removed again, so every input starts from the bare base; a
 * failed one must leave nothing behind. */
#include "fuzz_util.h"
#include "models/model.h" /* whale_lora_free, whale_adapters_free */
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
    int64_t attached = 0;
    if (!c) {
        if (whale_lora_count(base) < 1 || (attached = whale_lora_num_params(base)) < 1) abort();
        whale_lora_free(base);
    }
    if (whale_model_num_params(base) != before || whale_lora_count(base) != 0) abort(); /* nothing left behind */
    whale_adapter *a = NULL;
    whale_code c2 = whale_adapter_load(base, fuzz_scratch(), &a, &err);
    fuzz_check_message(c2, &err);
    if ((c2 == WHALE_OK) != (c == WHALE_OK) || (!c2 && whale_adapter_num_params(a) != attached) || (c2 && a)) abort();
    whale_adapters_free(base);
    return 0;
}
