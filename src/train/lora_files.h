/* LoRA checkpoint files (PEFT's adapter_config.json and
 * adapter_model.safetensors) as lora.c reads them, shared with the
 * streamed merge (export.c). */
#ifndef WHALE_LORA_FILES_H
#define WHALE_LORA_FILES_H

#include "whale_safetensors.h"
#include "whale_lora.h"

#define WHALE_PEFT_PREFIX "base_model.model."

/* dir/adapter_config.json, validated; cfg->target_modules is *targets
 * (malloc'd, the list joined with commas). */
whale_code whale_lora_read_config(const char *dir, whale_lora_config *cfg, char **targets, whale_err *err);
/* The adapters' scale s of W + s·B·A: alpha / r, or alpha / sqrt(r) with rsLoRA. */
float whale_lora_scale(const whale_lora_config *cfg);
/* dir/adapter_model.safetensors, mmapped, with every adapter of rank rank. */
whale_code whale_lora_open_tensors(const char *dir, int rank, whale_st **st, whale_err *err);

#endif
