/* Encoding arbitrary text with the real DeepSeek-V3 and Qwen tokenizers
 * (scripts/fetch-tokenizers.sh; WHALE_TOKENIZERS overrides the folder).
 * The first byte picks the tokenizer and add_special. Byte-level BPE loses
 * nothing: decoding the ids of valid UTF-8 gives the text back (DeepSeek-V3
 * has no normalizer; Qwen's NFC may change the text, so only its length
 * bound is checked). */
#include "fuzz_util.h"
#include "whale_tokenizer.h"

static whale_tokenizer *tok[2];

static whale_tokenizer *load(const char *name) {
    const char *base = getenv("WHALE_TOKENIZERS") ? getenv("WHALE_TOKENIZERS") : WHALE_FUZZ_TOKENIZERS;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", base, name);
    whale_err err;
    whale_tokenizer *t;
    if (whale_tokenizer_load(dir, &t, &err)) {
        fprintf(stderr, "fuzz_encode: %s (run scripts/fetch-tokenizers.sh)\n", err.msg);
        exit(1);
    }
    return t;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        uint32_t cp = k == 1 ? c : c & (0x7f >> k);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k;
    }
    return 1;
}

/* before the first input: loading is slow when instrumented, and must not
 * count against -timeout */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tok[0] = load("deepseek_v3");
    tok[1] = load("qwen3");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 1, add_special = (data[0] >> 1) & 1;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    whale_err err;
    int32_t *ids = NULL;
    int nid = 0;
    whale_code c = whale_tokenizer_encode(tok[which], text, n, add_special, &ids, &nid, &err);
    fuzz_check_message(c, &err);
    if (!c) {
        char *out = NULL;
        size_t len = 0;
        c = whale_tokenizer_decode(tok[which], ids, nid, 0, &out, &len, &err);
        fuzz_check_message(c, &err);
        if (!c && which == 0 && !add_special && valid_utf8(data + 1, n) && (len != n || memcmp(out, text, n))) {
            fprintf(stderr, "fuzz_encode: decode(encode(text)) differs from the text (%zu vs %zu bytes)\n", len, n);
            abort();
        }
        free(out);
    }
    free(ids);
    return 0;
}
