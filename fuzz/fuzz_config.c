/* config.json of one family (FUZZ_FAMILY): an input that parses as a JSON
 * object gets that family's model_type, then the model is built from it
 * (shapes only, no weights) and whale memory's estimate is made, both for
 * inference and for LoRA training. Other inputs are read as they are. */
#include "fuzz_util.h"
#include "models/model.h"

#include <cjson/cJSON.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_path(path, sizeof path, "config.json");
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    cJSON *j = cJSON_ParseWithLength(text, size);
    if (cJSON_IsObject(j)) {
        cJSON_DeleteItemFromObjectCaseSensitive(j, "model_type");
        cJSON_AddStringToObject(j, "model_type", FUZZ_FAMILY);
        char *out = cJSON_PrintUnformatted(j);
        if (out) fuzz_write(path, out, strlen(out));
        free(out);
    } else {
        fuzz_write(path, data, size);
    }
    cJSON_Delete(j);
    free(text);

    whale_err err;
    whale_model *m = NULL;
    whale_code c = whale_model_skeleton(fuzz_scratch(), &m, &err);
    fuzz_check_message(c, &err);
    if (!c) {
        (void)whale_model_param_count(m);
        (void)whale_model_forward_flops(m, 1, 8, 0, 1);
        char *json = NULL;
        if (whale_model_config_json(m, &json, &err) == WHALE_OK) free(json);
        whale_model_free(m);
        whale_memory mem;
        whale_memory_plan plan = {.dtype = WHALE_BF16, .train = WHALE_TRAIN_NONE, .batch = 1, .seq_len = 16};
        c = whale_memory_estimate(fuzz_scratch(), &plan, &mem, &err);
        fuzz_check_message(c, &err);
        plan = (whale_memory_plan){.dtype = WHALE_F32, .train = WHALE_TRAIN_LORA, .lora_rank = 4, .batch = 1,
                                   .seq_len = 16};
        c = whale_memory_estimate(fuzz_scratch(), &plan, &mem, &err);
        fuzz_check_message(c, &err);
    }
    return 0;
}
