/* SFT data: one JSONL (or, when the first byte's bit 1 is set, CSV) file
 * of records in every format (messages, query/response, Alpaca,
 * self-cognition) through the DeepSeek-V3 tokenizer and a chat template;
 * the first byte picks the template, the truncation, packing, loss scope
 * and the bad-record policy; then the packed rows are built. */
#include "fuzz_util.h"
#include "whale_sft.h"

static whale_tokenizer *tok;

/* before the first input (slow when instrumented; not counted by -timeout) */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    whale_err err;
    const char *base = getenv("WHALE_TOKENIZERS") ? getenv("WHALE_TOKENIZERS") : WHALE_FUZZ_TOKENIZERS;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/deepseek_v3", base);
    if (whale_tokenizer_load(dir, &tok, &err)) {
        fprintf(stderr, "fuzz_sft: %s (run scripts/fetch-tokenizers.sh)\n", err.msg);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    whale_err err;
    if (size < 1) return 0;
    uint8_t k = data[0];
    char path[512];
    fuzz_write(fuzz_path(path, sizeof path, (k & 2) ? "data.csv" : "data.jsonl"), data + 1, size - 1);
    whale_sft_opts o = whale_sft_defaults();
    o.max_length = (k & 4) ? 16 : 0;
    o.truncation = (whale_sft_truncation)((k >> 3) % 3);
    o.packing = (k >> 5) & 1;
    o.loss_scope = (whale_sft_loss_scope)((k >> 6) & 1);
    o.bad_records = (whale_sft_bad_policy)(k >> 7);
    o.model_name[0] = "小鲸";
    o.model_name[1] = "Little Whale";
    o.model_author[0] = "鲸鱼工坊";
    o.model_author[1] = "Whale Works";
    whale_chat_format fmt = (whale_chat_format)(k % 3);
    const char *files[1] = {path};
    whale_sft_dataset *ds = NULL;
    whale_code c = whale_sft_dataset_open(files, 1, tok, fmt, &o, &ds, &err);
    fuzz_check_message(c, &err);
    if (!c) {
        int64_t rows = 0;
        int S = 32;
        c = whale_sft_dataset_num_rows(ds, S, &rows, &err);
        fuzz_check_message(c, &err);
        int32_t ids[32], labels[32], pos[32], seg[32];
        for (int64_t r = 0; !c && r < rows && r < 4; r++) {
            c = whale_sft_dataset_row(ds, r, S, ids, labels, pos, seg, &err);
            fuzz_check_message(c, &err);
        }
        char *text = NULL;
        size_t len;
        uint8_t *mask = NULL;
        if (whale_sft_sample_text(ds, 0, &text, &len, &mask, &err) == WHALE_OK) {
            free(text);
            free(mask);
        }
        whale_sft_dataset_free(ds);
    }
    return 0;
}
