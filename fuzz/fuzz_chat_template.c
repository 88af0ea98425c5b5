/* Chat templates: a conversation rendered as `whale chat-template` renders
 * it (whale_chat_template_load, then whale_chat_template_apply), under the
 * renderer's output, memory, step and depth limits.
 *
 * The first byte k picks the mode. k odd: the rest is a template, then
 * "\n@@VARS@@\n", then the variables; the template is written as a folder's
 * chat_template.jinja and loaded as its own. k even: one of the real
 * templates of tests/data/chat/templates ((k >> 3) % count, parsed once),
 * and the rest is the variables; k & 4 also asks for the loss-mask spans
 * (whale_chat_template_spans_json, what SFT uses). k & 2 is
 * add_generation_prompt. The variables are a JSON messages array, or an
 * object with "messages", "tools" and "chat_template_kwargs". */
#include "fuzz_util.h"
#include "whale_chat.h"

#include <cjson/cJSON.h>

#define SEP "\n@@VARS@@\n"

static const char *const real_names[] = {"deepseek_v3", "gemma3", "llama3", "llama3_1", "qwen2", "qwen2_5", "qwen3"};
#define N_REAL (sizeof real_names / sizeof real_names[0])
static whale_chat_template *real[N_REAL];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    whale_err err;
    for (size_t i = 0; i < N_REAL; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/chat/templates/%s.jinja", WHALE_FUZZ_DATA, real_names[i]);
        if (whale_chat_template_load(WHALE_FUZZ_DATA "/chat/templates", path, &real[i], &err)) {
            fprintf(stderr, "fuzz_chat_template: %s\n", err.msg);
            exit(1);
        }
    }
    return 0;
}

static void render(const whale_chat_template *t, const uint8_t *vars, size_t n, int agp, int spans) {
    cJSON *root = cJSON_ParseWithLength((const char *)vars, n);
    if (!root) return;
    const cJSON *messages = root, *tools = NULL, *kwargs = NULL;
    if (cJSON_IsObject(root)) {
        messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
        tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        kwargs = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    }
    whale_err err;
    char *text = NULL;
    size_t len = 0;
    whale_code c = whale_chat_template_apply(t, messages ? messages : root, tools, kwargs, agp, &text, &len, &err);
    fuzz_check_message(c, &err);
    if (!c && len > 0 && !text) abort();
    free(text);
    if (spans && cJSON_IsArray(messages)) {
        whale_chat_span *sp = NULL;
        int n_sp = 0;
        text = NULL;
        c = whale_chat_template_spans_json(t, messages, cJSON_IsArray(tools) ? tools : NULL, agp, NULL, &text, &len,
                                           &sp, &n_sp, &err);
        fuzz_check_message(c, &err);
        for (int i = 0; !c && i < n_sp; i++)
            if (sp[i].start > sp[i].end || sp[i].end > len) abort(); /* a span inside the text */
        free(text);
        free(sp);
    }
    cJSON_Delete(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t k = data[0];
    int agp = (k >> 1) & 1;
    if (!(k & 1)) {
        render(real[(k >> 3) % N_REAL], data + 1, size - 1, agp, (k >> 2) & 1);
        return 0;
    }
    size_t n1, n2;
    const uint8_t *p2;
    fuzz_split(data + 1, size - 1, SEP, &n1, &p2, &n2);
    char path[512];
    fuzz_write(fuzz_path(path, sizeof path, "chat_template.jinja"), data + 1, n1);
    whale_err err;
    whale_chat_template *t = NULL;
    whale_code c = whale_chat_template_load(fuzz_scratch(), NULL, &t, &err);
    fuzz_check_message(c, &err);
    if (!c) render(t, p2, n2, agp, 0);
    whale_chat_template_free(t);
    return 0;
}
