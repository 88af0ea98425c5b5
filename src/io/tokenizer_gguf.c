/* What a GGUF file says of a tokenizer (tokenizer.h): llama.cpp's name for
 * its pre-tokenizer, the merges in rank order, the added tokens. */
#include "whale_bpe.h" /* whale_deepseek_v3_splits */
#include "io/tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* The pre-tokenizers llama.cpp implements under a name (llama-vocab.cpp
 * applies the same regexes), as tokenizer.json writes them: Split patterns
 * (Isolated, not inverted) in order, then ByteLevel without a prefix space,
 * splitting with the GPT-2 pattern itself or not. llama.cpp's converter
 * finds the name from a hash of encoded text; for these tokenizers the
 * patterns decide it. */
static const char qwen2_split[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                                  "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char llama3_split[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
                                   "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const struct {
    const char *name;
    int n_split;
    const char *split[3];
    int use_regex;
} pres[] = {
    {"qwen2", 1, {qwen2_split}, 0}, /* Qwen2, Qwen2.5, Qwen3 */
    {"llama-bpe", 1, {llama3_split}, 0}, /* Llama 3, 3.1, 3.2 */
    {"deepseek-v3", 3, {NULL}, 0},  /* DeepSeek-V3, and whale tokenizer train's tokenizers */
    {"gpt-2", 0, {NULL}, 1},
};

const char *tok_llama_pre(const whale_tokenizer *t) {
    for (size_t p = 0; p < sizeof pres / sizeof pres[0]; p++) {
        int n = pres[p].n_split, ok = t->n_steps == n + 1;
        for (int i = 0; ok && i < n; i++) {
            const tok_step *s = &t->steps[i];
            const char *want = pres[p].split[0] ? pres[p].split[i] : whale_deepseek_v3_splits[i];
            ok = s->kind == STEP_SPLIT && s->behavior == SPLIT_ISOLATED && !s->invert && s->source &&
                 !strcmp(s->source, want);
        }
        const tok_step *bl = ok ? &t->steps[n] : NULL;
        if (bl && bl->kind == STEP_BYTELEVEL && !bl->add_prefix_space && bl->use_regex == pres[p].use_regex)
            return pres[p].name;
    }
    return NULL;
}

typedef struct {
    uint32_t rank;
    int32_t left, right;
} merge_entry;

static int by_rank(const void *a, const void *b) {
    uint32_t x = ((const merge_entry *)a)->rank, y = ((const merge_entry *)b)->rank;
    return (x > y) - (x < y);
}

whale_code tok_merge_pairs(const whale_tokenizer *t, int32_t **pairs, int *n, whale_err *err) {
    size_t slots = t->merges.keys ? t->merges.mask + 1 : 0, count = 0;
    for (size_t s = 0; s < slots; s++) count += t->merges.keys[s] != 0;
    merge_entry *m = malloc((count ? count : 1) * sizeof *m);
    int32_t *out = malloc((count ? count : 1) * 2 * sizeof *out);
    if (!m || !out) {
        free(m), free(out);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory listing the merges", t->path);
    }
    size_t k = 0;
    for (size_t s = 0; s < slots; s++) {
        uint64_t key = t->merges.keys[s];
        if (!key) continue;
        key -= 1; /* stored as (left << 32 | right) + 1 */
        m[k++] = (merge_entry){t->merges.rank[s], (int32_t)(uint32_t)(key >> 32), (int32_t)(uint32_t)key};
    }
    qsort(m, count, sizeof *m, by_rank);
    for (size_t i = 0; i < count; i++) out[2 * i] = m[i].left, out[2 * i + 1] = m[i].right;
    free(m);
    *pairs = out;
    *n = (int)count;
    return WHALE_OK;
}

const tok_added *tok_added_of(const whale_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) return &t->added[i];
    return NULL;
}
