/* The Jinja renderer: byte-identical to @huggingface/jinja on the real chat
 * templates (Qwen2.5, Qwen2, Qwen3, DeepSeek-V3, Llama 3, Llama 3.1,
 * Gemma 3) over tests/reference/chat/template_cases.mjs, and on small
 * templates for the expression semantics (goldens in tests/data/chat, made
 * by tests/reference/chat/gen_template_goldens.mjs); the same ids as
 * Hugging Face's tokenizer for every family but Gemma 3, whose
 * SentencePiece-style tokenizer whale refuses (checked); the SFT loss mask
 * on every template; the model folder's template and the fallbacks; and
 * hostile templates, which must fail with a one-line error.
 *
 * The real tokenizer files come from scripts/fetch-tokenizers.sh
 * (.cache/tokenizers or $WHALE_TOKENIZERS); without them this test fails. */
#include "io/jinja.h"
#include "whale_chat.h"
#include "whale_sft.h"

#include "core/core.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const templates[] = {"qwen2_5", "qwen2",  "qwen3",          "deepseek_v3", "llama3",
                                        "llama3_1", "gemma3", "llama3_1_tools", "gpt_oss"};
#define N_TEMPLATES ((int)(sizeof templates / sizeof templates[0]))

/* ------------------------------------------------------------ helpers */

static int one_line(const whale_err *e) { return e->msg[0] && !strchr(e->msg, '\n'); }

static void show_diff(const char *what, const char *got, size_t gn, const char *want, size_t wn) {
    size_t i = 0;
    while (i < gn && i < wn && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "%s: differs at byte %zu\n  got:  \"%.*s\"\n  want: \"%.*s\"\n", what, i,
            (int)(gn - from < 120 ? gn - from : 120), got + from, (int)(wn - from < 120 ? wn - from : 120), want + from);
}

/* Render src with vars: 0 and *out on success, else the error code (err set). */
static whale_code render(const char *src, const cJSON *vars, char **out, size_t *len, whale_err *err) {
    whale_jinja *t;
    whale_code rc = whale_jinja_parse(src, strlen(src), &t, err);
    if (rc) return rc;
    rc = whale_jinja_render(t, vars, out, len, err);
    whale_jinja_free(t);
    return rc;
}

static char *read_text(const char *path) {
    char *buf = NULL;
    size_t n;
    whale_err err;
    if (whale_read_file(path, &buf, &n, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return buf;
}

/* ------------------------------------------------------------ snippets */

static void check_snippets(void) {
    cJSON *g = test_read_json(WHALE_TEST_DATA "/chat/golden-jinja-snippets.json");
    CHECK(g != NULL, "golden-jinja-snippets.json");
    if (!g) return;
    const cJSON *vars = cJSON_GetObjectItem(g, "vars");
    int n = 0;
    for (const cJSON *s = cJSON_GetObjectItem(g, "snippets")->child; s; s = s->next, n++) {
        const char *src = cJSON_GetObjectItem(s, "template")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(s, "text");
        char *out = NULL;
        size_t len = 0;
        whale_err err = {0};
        whale_code rc = render(src, vars, &out, &len, &err);
        if (want) {
            CHECK(rc == WHALE_OK, "snippet %d: %s", n, err.msg);
            int same = !rc && len == strlen(want->valuestring) && !memcmp(out, want->valuestring, len);
            CHECK(same, "snippet %d differs from @huggingface/jinja: %.80s", n, src);
            if (!rc && !same) show_diff("snippet", out, len, want->valuestring, strlen(want->valuestring));
        } else {
            CHECK(rc != WHALE_OK, "snippet %d must fail (as @huggingface/jinja: %s): %.80s", n,
                  cJSON_GetObjectItem(s, "error")->valuestring, src);
            CHECK(rc == WHALE_OK || (one_line(&err) && strstr(err.msg, "chat template line")),
                  "snippet %d: error without a line: %s", n, err.msg);
        }
        free(out);
    }
    CHECK(n >= 40, "only %d snippets", n);
    cJSON_Delete(g);
}

/* ------------------------------------------------------------ real templates */

/* The variables of one golden case: specials, messages, tools, kwargs. */
static cJSON *case_vars(const cJSON *specials, const cJSON *c) {
    cJSON *v = cJSON_Duplicate(specials, 1);
    cJSON_AddItemToObject(v, "messages", cJSON_Duplicate(cJSON_GetObjectItem(c, "messages"), 1));
    cJSON_AddBoolToObject(v, "add_generation_prompt", cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")));
    const cJSON *tools = cJSON_GetObjectItem(c, "tools"), *kw = cJSON_GetObjectItem(c, "kwargs");
    if (tools) cJSON_AddItemToObject(v, "tools", cJSON_Duplicate(tools, 1));
    for (const cJSON *e = kw ? kw->child : NULL; e; e = e->next)
        cJSON_AddItemToObject(v, e->string, cJSON_Duplicate(e, 1));
    return v;
}

static void check_ids(whale_tokenizer *tok, const char *what, const char *text, size_t len, const cJSON *want) {
    int32_t *ids = NULL;
    int n = 0;
    whale_err err;
    CHECK(whale_tokenizer_encode(tok, text, len, 0, &ids, &n, &err) == WHALE_OK, "%s", err.msg);
    int same = n == cJSON_GetArraySize(want);
    int i = 0;
    for (const cJSON *e = want->child; same && e; e = e->next, i++) same = ids[i] == e->valueint;
    CHECK(same, "%s: ids differ from @huggingface/tokenizers' (%d vs %d ids)", what, n, cJSON_GetArraySize(want));
    free(ids);
}

static int divergent; /* cases where the two engines differ */

/* The fetched tokenizers by name, each loaded once (NULL without tokdir). */
static struct {
    char name[32];
    whale_tokenizer *tok;
} tokenizers[8];

static whale_tokenizer *family_tokenizer(const char *tokdir, const char *name) {
    int i = 0;
    for (; i < 8 && tokenizers[i].tok; i++)
        if (!strcmp(tokenizers[i].name, name)) return tokenizers[i].tok;
    if (!tokdir || i == 8) return NULL;
    snprintf(tokenizers[i].name, sizeof tokenizers[i].name, "%s", name);
    return tokenizers[i].tok = test_load_tokenizer(tokdir, name);
}

/* Every case of golden-jinja-NAME.json; returns how many rendered. */
static int check_template(const char *tokdir, const char *name) {
    char path[1200];
    snprintf(path, sizeof path, WHALE_TEST_DATA "/chat/golden-jinja-%s.json", name);
    cJSON *g = test_read_json(path);
    CHECK(g != NULL, "%s", path);
    if (!g) return 0;
    snprintf(path, sizeof path, WHALE_TEST_DATA "/chat/templates/%s.jinja", name);
    char *src = read_text(path);
    whale_jinja *t = NULL;
    whale_err err;
    CHECK(whale_jinja_parse(src, strlen(src), &t, &err) == WHALE_OK, "%s: %s", name, err.msg);
    const cJSON *tk = cJSON_GetObjectItem(g, "tokenizer"), *sde = cJSON_GetObjectItem(g, "source_date_epoch");
    whale_tokenizer *tok =
        cJSON_IsString(tk) ? family_tokenizer(tokdir, tk->valuestring) : NULL;
    char epoch[32];
    snprintf(epoch, sizeof epoch, "%.0f", cJSON_IsNumber(sde) ? sde->valuedouble : 0);
    setenv("SOURCE_DATE_EPOCH", epoch, 1); /* the instant strftime_now printed in the goldens */
    int rendered = 0;
    for (const cJSON *c = cJSON_GetObjectItem(g, "cases")->child; t && c; c = c->next) {
        char what[200];
        snprintf(what, sizeof what, "%s/%s", name, cJSON_GetObjectItem(c, "name")->valuestring);
        cJSON *vars = case_vars(cJSON_GetObjectItem(g, "specials"), c);
        char *out = NULL;
        size_t len = 0;
        whale_code rc = whale_jinja_render(t, vars, &out, &len, &err);
        /* where Python's Jinja (transformers) renders differently, whale follows it */
        const cJSON *py = cJSON_GetObjectItem(c, "python_text"), *py_err = cJSON_GetObjectItem(c, "python_error");
        const cJSON *want = py ? py : py_err ? NULL : cJSON_GetObjectItem(c, "text");
        divergent += py || py_err;
        if (!want) {
            CHECK(rc != WHALE_OK, "%s: must be refused as the reference refuses it (%s)", what,
                  (py_err ? py_err : cJSON_GetObjectItem(c, "error"))->valuestring);
            CHECK(rc == WHALE_OK || one_line(&err), "%s: %s", what, err.msg);
        } else {
            CHECK(rc == WHALE_OK, "%s: %s", what, err.msg);
            int same = !rc && len == strlen(want->valuestring) && !memcmp(out, want->valuestring, len);
            CHECK(same, "%s: differs from %s", what, py ? "Python's Jinja" : "@huggingface/jinja");
            if (!rc && !same) show_diff(what, out, len, want->valuestring, strlen(want->valuestring));
            const cJSON *ids = cJSON_GetObjectItem(c, "ids");
            if (!rc && ids && tok && !py) check_ids(tok, what, out, len, ids);
            rendered += !rc;
        }
        free(out);
        cJSON_Delete(vars);
    }
    whale_jinja_free(t);
    free(src);
    cJSON_Delete(g);
    return rendered;
}

/* ------------------------------------------------------------ the loss mask */

/* A model folder holding the template and its special tokens. */
static const char *template_folder(const char *name, char *dir, size_t cap) {
    char path[1200];
    test_tmpdir(name, dir, cap);
    snprintf(path, sizeof path, WHALE_TEST_DATA "/chat/templates/%s.jinja", name);
    char *src = read_text(path);
    test_write_text(dir, "chat_template.jinja", src);
    free(src);
    snprintf(path, sizeof path, WHALE_TEST_DATA "/chat/golden-jinja-%s.json", name);
    cJSON *g = test_read_json(path);
    char *cfg = cJSON_Print(cJSON_GetObjectItem(g, "specials"));
    test_write_text(dir, "tokenizer_config.json", cfg);
    free(cfg);
    cJSON_Delete(g);
    return dir;
}

/* What an assistant reply is trained on under each template: the reply as
 * the template renders it when it is the newest message. */
static void expected_span(const char *name, const char *content, char *out, size_t cap) {
    const char *end = !strncmp(name, "qwen", 4) ? "<|im_end|>"
                      : !strcmp(name, "deepseek_v3") ? "<｜end▁of▁sentence｜>"
                      : !strncmp(name, "llama3", 6) ? "<|eot_id|>"
                      : !strcmp(name, "gpt_oss") ? "<|return|>" : "<end_of_turn>";
    /* Qwen3 puts an empty thinking block in front of the newest reply, gpt-oss its channel */
    const char *head = !strcmp(name, "qwen3") ? "<think>\n\n</think>\n\n"
                       : !strcmp(name, "gpt_oss") ? "<|channel|>final<|message|>" : "";
    snprintf(out, cap, "%s%s%s", head, content, end);
}

/* The masked tokens, as runs of text: one per assistant reply. */
static int masked_runs(const whale_tokenizer *tok, const int32_t *ids, const uint8_t *mask, int n, char runs[][256],
                       int max_runs) {
    int k = -1;
    for (int i = 0; i < n; i++) {
        if (!mask[i]) continue;
        if (i == 0 || !mask[i - 1]) {
            if (++k >= max_runs) return k;
            runs[k][0] = 0;
        }
        size_t bl, have = strlen(runs[k]);
        const char *b = whale_tokenizer_token_bytes(tok, ids[i], &bl);
        if (have + bl < 256) {
            memcpy(runs[k] + have, b, bl);
            runs[k][have + bl] = 0;
        }
    }
    return k + 1;
}

static const whale_chat_message mask_conv[] = {{"system", "You are Whale."}, {"user", "Who are you?"},
                                               {"assistant", "I am Whale."}, {"user", "Who made you?"},
                                               {"assistant", "The nanowhale.c project."}};

/* The byte spans: each reply's text and end-of-turn token, nothing else. */
static void check_spans(const whale_chat_template *t, const char *name, int n, int replies) {
    char *text = NULL, want[256];
    size_t len = 0;
    whale_chat_span *sp = NULL;
    int n_sp = 0;
    whale_err err;
    whale_code rc = whale_chat_template_spans(t, mask_conv, n, 0, NULL, &text, &len, &sp, &n_sp, &err);
    CHECK(rc == WHALE_OK, "%s: %s", name, err.msg);
    CHECK(rc || n_sp == replies, "%s: %d spans for %d replies", name, n_sp, replies);
    for (int r = 0; !rc && r < n_sp && r < replies; r++) {
        expected_span(name, mask_conv[2 + 2 * r].content, want, sizeof want);
        size_t wl = strlen(want);
        CHECK(sp[r].message == 2 + 2 * r && sp[r].end - sp[r].start == wl && !memcmp(text + sp[r].start, want, wl),
              "%s: reply %d spans \"%.*s\", want \"%s\"", name, r, (int)(sp[r].end - sp[r].start), text + sp[r].start, want);
    }
    free(text);
    free(sp);
}

/* The token mask: the tokens holding the spans' bytes (tokenizer of the
 * template's family only, so that its special tokens are whole tokens). */
static void check_token_mask(whale_tokenizer *tok, const whale_chat_template *t, const char *name, int n, int replies) {
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    int n_ids = 0;
    whale_err err;
    whale_code rc = whale_chat_template_encode(tok, t, mask_conv, n, 0, &ids, &mask, &n_ids, &err);
    CHECK(rc == WHALE_OK, "%s: %s", name, err.msg);
    if (rc) return;
    char runs[4][256], want[256];
    int k = masked_runs(tok, ids, mask, n_ids, runs, 4);
    CHECK(k == replies, "%s: %d masked runs", name, k);
    for (int r = 0; r < k && r < replies; r++) {
        expected_span(name, mask_conv[2 + 2 * r].content, want, sizeof want);
        CHECK(!strcmp(runs[r], want), "%s: reply %d trains on \"%s\", want \"%s\"", name, r, runs[r], want);
    }
    char *text = NULL;
    size_t len = 0;
    int32_t *plain = NULL;
    int n_plain = 0;
    CHECK(whale_chat_template_spans(t, mask_conv, n, 0, NULL, &text, &len, NULL, NULL, &err) == WHALE_OK, "%s", err.msg);
    CHECK(text && whale_tokenizer_encode(tok, text, len, 0, &plain, &n_plain, &err) == WHALE_OK, "%s", err.msg);
    CHECK(n_plain == n_ids && (!n_ids || !memcmp(plain, ids, sizeof *ids * (size_t)n_ids)),
          "%s: encode's ids are not the rendering's", name);
    free(plain);
    free(text);
    free(ids);
    free(mask);
}

/* The loss mask renders the conversation up to every reply again: a
 * conversation of many replies is refused within the masking budget (it
 * took minutes before), a long but ordinary one is masked. */
static void check_mask_budget(void) {
    char dir[1024];
    template_folder("qwen2_5", dir, sizeof dir);
    whale_chat_template *t = NULL;
    whale_err err;
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "qwen2_5: %s", err.msg);
    if (!t) return;
    static const int sizes[2] = {200, 2000};
    for (int k = 0; k < 2; k++) {
        int n = sizes[k];
        cJSON *msgs = cJSON_CreateArray();
        for (int i = 0; i < n; i++) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", i % 2 ? "assistant" : "user");
            cJSON_AddStringToObject(m, "content", i % 2 ? "Sure." : "Go on.");
            cJSON_AddItemToArray(msgs, m);
        }
        char *text = NULL;
        size_t len;
        whale_chat_span *sp = NULL;
        int n_sp = 0;
        whale_code rc = whale_chat_template_spans_json(t, msgs, NULL, 0, NULL, &text, &len, &sp, &n_sp, &err);
        if (k == 0)
            CHECK(rc == WHALE_OK && n_sp == n / 2, "%d messages: masked (%d spans): %s", n, n_sp, rc ? err.msg : "");
        else
            CHECK(rc == WHALE_ERR_RANGE && !text && !sp && one_line(&err) &&
                      strstr(err.msg, "placing the loss mask of every reply in this conversation takes more than"),
                  "%d messages: refused within the budget: %s", n, rc ? err.msg : "masked");
        free(text);
        free(sp);
        cJSON_Delete(msgs);
    }
    whale_chat_template_free(t);
}

static void check_mask(whale_tokenizer *tok, const char *name) {
    char dir[1024];
    template_folder(name, dir, sizeof dir);
    whale_chat_template *t = NULL;
    whale_err err;
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "%s: %s", name, err.msg);
    if (!t) return;
    CHECK(whale_chat_template_notice(t) == NULL, "%s: a template folder gives no notice", name);
    check_spans(t, name, 5, 2);
    if (tok) check_token_mask(tok, t, name, 5, 2);
    whale_chat_template_free(t);
}

/* Qwen3's multi-turn SFT text equals ms-swift's (made by the golden script
 * from ms-swift's qwen3 template, without Jinja): every reply with its
 * thinking, up to the last reply's end. */
static void check_swift_qwen3(whale_tokenizer *qwen) {
    char dir[1024];
    template_folder("qwen3", dir, sizeof dir);
    whale_chat_template *t = NULL;
    whale_err err;
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "%s", err.msg);
    cJSON *g = test_read_json(WHALE_TEST_DATA "/chat/golden-jinja-qwen3.json");
    int n = 0;
    for (const cJSON *c = g && t ? cJSON_GetObjectItem(g, "cases")->child : NULL; c; c = c->next) {
        const cJSON *want = cJSON_GetObjectItem(c, "swift_sft_text");
        if (!want) continue;
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        char *text = NULL;
        size_t len = 0;
        whale_chat_span *sp = NULL;
        int n_sp = 0;
        whale_code rc = whale_chat_template_spans_json(t, cJSON_GetObjectItem(c, "messages"), NULL, 0, NULL, &text,
                                                       &len, &sp, &n_sp, &err);
        CHECK(rc == WHALE_OK && n_sp > 0, "qwen3/%s: %s", name, err.msg);
        size_t wl = strlen(want->valuestring), upto = rc || !n_sp ? 0 : sp[n_sp - 1].end;
        CHECK(!rc && upto == wl && !memcmp(text, want->valuestring, wl), "qwen3/%s: SFT text differs from ms-swift's", name);
        if (!rc && !(upto == wl && !memcmp(text, want->valuestring, wl))) show_diff(name, text, upto, want->valuestring, wl);
        if (!rc && qwen) { /* and it tokenizes as the whole text does */
            int32_t *ids = NULL;
            uint8_t *mask = NULL;
            int n_ids = 0;
            CHECK(whale_chat_encode_spans(qwen, text, len, sp, n_sp, &ids, &mask, &n_ids, &err) == WHALE_OK, "%s", err.msg);
            free(ids);
            free(mask);
        }
        free(text);
        free(sp);
        n++;
    }
    CHECK(n >= 4, "only %d Qwen3 SFT texts compared with ms-swift's", n);
    cJSON_Delete(g);
    whale_chat_template_free(t);
}

/* Templates whose replies cannot be placed are refused for the mask, one
 * line, never trained on the wrong tokens: one that ignores
 * add_generation_prompt and has no end-of-turn token, and one whose
 * rendering of a reply does not start where the conversation before it
 * (with the generation prompt) ends. */
static void check_unmaskable(void) {
    static const char *const srcs[][2] = {
        {"{% for m in messages %}{{ m.content }}{% endfor %}", "ignores add_generation_prompt"},
        {"{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<bot>{% endif %}",
         "not where its rendering starts"}};
    for (int k = 0; k < 2; k++) {
        char dir[1024];
        test_tmpdir("unmaskable", dir, sizeof dir);
        test_write_text(dir, "chat_template.jinja", srcs[k][0]);
        test_write_text(dir, "tokenizer_config.json", "{}");
        whale_chat_template *t = NULL;
        whale_err err;
        CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "%s", err.msg);
        char *text = NULL;
        size_t len = 0;
        whale_chat_span *sp = NULL;
        int n_sp = 0;
        whale_code rc = t ? whale_chat_template_spans(t, mask_conv, 3, 0, NULL, &text, &len, &sp, &n_sp, &err) : 0;
        CHECK(rc == WHALE_ERR_UNSUPPORTED && !text && !sp && one_line(&err) && strstr(err.msg, srcs[k][1]) &&
                  strstr(err.msg, "messages[2]"), "template %d: the mask must be refused: %s", k, err.msg);
        whale_chat_template_free(t);
    }
    /* Qwen3 with an end-of-turn token typed inside an earlier reply: where
     * the rewritten history ends cannot be told, so the record is refused */
    char dir[1024];
    template_folder("qwen3", dir, sizeof dir);
    whale_chat_template *t = NULL;
    whale_err err;
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "%s", err.msg);
    static const whale_chat_message typed[] = {
        {"user", "q"}, {"assistant", "a<|im_end|>b"}, {"user", "q2"}, {"assistant", "c"}};
    char *text = NULL;
    size_t len = 0;
    whale_chat_span *sp = NULL;
    int n_sp = 0;
    whale_code rc = t ? whale_chat_template_spans(t, typed, 4, 0, NULL, &text, &len, &sp, &n_sp, &err) : 0;
    CHECK(rc == WHALE_ERR_UNSUPPORTED && !text && one_line(&err) && strstr(err.msg, "messages[3]"),
          "qwen3, a typed <|im_end|> in an earlier reply: refused: %s", rc ? err.msg : text);
    free(text);
    free(sp);
    whale_chat_template_free(t);
}

/* ------------------------------------------------------------ folders and choices */

static whale_code apply_one(const whale_chat_template *t, const char *user, char **text, whale_err *err) {
    cJSON *msgs = cJSON_CreateArray(), *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "role", "user");
    cJSON_AddStringToObject(o, "content", user);
    cJSON_AddItemToArray(msgs, o);
    size_t len;
    whale_code rc = whale_chat_template_apply(t, msgs, NULL, NULL, 1, text, &len, err);
    cJSON_Delete(msgs);
    return rc;
}

static void check_folders(whale_tokenizer *qwen) {
    char dir[1024], path[1200];
    whale_chat_template *t = NULL;
    whale_err err;
    char *text = NULL;
    test_tmpdir("folders", dir, sizeof dir);
    /* chat_template.jinja wins over tokenizer_config.json */
    test_write_text(dir, "tokenizer_config.json", "{\"bos_token\": \"<B>\", \"chat_template\": \"config {{ bos_token }}\"}");
    test_write_text(dir, "chat_template.jinja", "jinja {{ bos_token }}{{ messages[0].content }}");
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "%s", err.msg);
    CHECK(t && strstr(whale_chat_template_name(t), "chat_template.jinja"), "name %s", whale_chat_template_name(t));
    CHECK(t && apply_one(t, "hi", &text, &err) == WHALE_OK && !strcmp(text, "jinja <B>hi"), "got %s", text ? text : err.msg);
    free(text), text = NULL;
    whale_chat_template_free(t), t = NULL;
    /* a list of named templates: "default" */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    remove(path);
    test_write_text(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tools\"}, {\"name\": \"default\", \"template\": \"default {{ add_generation_prompt }}\"}]}");
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "%s", err.msg);
    CHECK(t && apply_one(t, "hi", &text, &err) == WHALE_OK && !strcmp(text, "default true"), "got %s", text ? text : err.msg);
    free(text), text = NULL;
    whale_chat_template_free(t), t = NULL;
    test_write_text(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}]}");
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_ERR_UNSUPPORTED && one_line(&err), "%s", err.msg);
    /* no template at all: nanowhale's raw fallback, with a notice */
    test_write_text(dir, "tokenizer_config.json", "{\"bos_token\": \"<B>\"}");
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "%s", err.msg);
    CHECK(t && whale_chat_template_notice(t) && !strchr(whale_chat_template_notice(t), '\n') &&
              !strcmp(whale_chat_template_name(t), "raw"), "raw fallback with a one-line notice");
    CHECK(t && apply_one(t, "hi", &text, &err) == WHALE_OK && !strcmp(text, "user: hi\nassistant:"), "got %s",
          text ? text : err.msg);
    free(text), text = NULL;
    whale_chat_template_free(t), t = NULL;
    /* named choices: native formats, files, a tokenizer_config.json */
    CHECK(whale_chat_template_load(dir, "chatml", &t, &err) == WHALE_OK && t && !whale_chat_template_notice(t), "%s", err.msg);
    whale_chat_template_free(t), t = NULL;
    snprintf(path, sizeof path, "%s/other.jinja", dir);
    test_write_text(dir, "other.jinja", "{% for m in messages %}[{{ m.role | upper }}]{% endfor %}");
    CHECK(whale_chat_template_load(dir, path, &t, &err) == WHALE_OK, "%s", err.msg);
    CHECK(t && apply_one(t, "hi", &text, &err) == WHALE_OK && !strcmp(text, "[USER]"), "got %s", text ? text : err.msg);
    free(text), text = NULL;
    whale_chat_template_free(t), t = NULL;
    CHECK(whale_chat_template_load(dir, "nonexistent-template", &t, &err) == WHALE_ERR_ARG && one_line(&err), "%s", err.msg);
    snprintf(path, sizeof path, "%s/bad.jinja", dir);
    test_write_text(dir, "bad.jinja", "ok\n{{ x | wordwrap }}\n{% if %}");
    CHECK(whale_chat_template_load(dir, path, &t, &err) != WHALE_OK && strstr(err.msg, "bad.jinja") &&
              strstr(err.msg, "line 3"), "syntax errors name the file and line: %s", err.msg);
    test_write_text(dir, "bad.jinja", "ok\n{{ messages | wordwrap }}");
    CHECK(whale_chat_template_load(dir, path, &t, &err) == WHALE_OK, "%s", err.msg);
    CHECK(t && apply_one(t, "hi", &text, &err) == WHALE_ERR_UNSUPPORTED &&
              strstr(err.msg, "line 2: filter 'wordwrap' is not supported"), "%s", err.msg);
    whale_chat_template_free(t), t = NULL;
    /* stop ids of a ChatML template: <|im_end|> and <|endoftext|> */
    char qdir[1024];
    template_folder("qwen2_5", qdir, sizeof qdir);
    CHECK(whale_chat_template_load(qdir, NULL, &t, &err) == WHALE_OK, "%s", err.msg);
    int32_t stop[8];
    int ns = t && qwen ? whale_chat_template_stop_ids(qwen, t, stop, 8) : 0;
    int im = 0, eot = 0;
    for (int i = 0; i < ns && i < 8; i++) im |= stop[i] == 151645, eot |= stop[i] == 151643;
    CHECK(!qwen || (im && eot), "Qwen2.5 template stops at <|im_end|> and <|endoftext|> (%d ids)", ns);
    whale_chat_template_free(t);
}

/* ------------------------------------------------------------ tool records for SFT */

/* The trained text of sample i, runs joined by "|". */
static void trained_text(const whale_sft_dataset *ds, int64_t i, char *out, size_t cap) {
    char *text = NULL;
    size_t len = 0, o = 0;
    uint8_t *bm = NULL;
    whale_err err;
    out[0] = 0;
    CHECK(whale_sft_sample_text(ds, i, &text, &len, &bm, &err) == WHALE_OK, "%s", err.msg);
    for (size_t k = 0; text && k < len && o + 2 < cap; k++) {
        if (bm[k] && k > 0 && !bm[k - 1] && o) out[o++] = '|';
        if (bm[k]) out[o++] = text[k];
    }
    out[o] = 0;
    free(text);
    free(bm);
}

/* OpenAI's tool_calls / role tool and ms-swift's agent format (tools as a
 * JSON string, tool_call / tool_response roles) train the same tokens:
 * the tool calls and the replies, through the model's template; "loss":
 * false leaves a reply out. */
static void check_tool_records(whale_tokenizer *qwen) {
    if (!qwen) return;
    char dir[1024], path[1200];
    template_folder("qwen2_5", dir, sizeof dir);
    static const char data[] =
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}], "
        "\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", "
        "\"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"content\": \"21 C\"}, "
        "{\"role\": \"assistant\", \"content\": \"It is 21 C.\"}]}\n"
        "{\"tools\": \"[{\\\"type\\\": \\\"function\\\", \\\"function\\\": {\\\"name\\\": \\\"get_weather\\\", "
        "\\\"parameters\\\": {}}}]\", \"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, "
        "{\"role\": \"tool_call\", \"content\": \"{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": "
        "{\\\"city\\\": \\\"Paris\\\"}}\"}, {\"role\": \"tool_response\", \"content\": \"21 C\"}, "
        "{\"role\": \"assistant\", \"content\": \"It is 21 C.\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": "
        "\"Hello.\", \"loss\": false}, {\"role\": \"user\", \"content\": \"Bye\"}, {\"role\": \"assistant\", "
        "\"content\": \"Goodbye.\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": "
        "\"Hello.\", \"loss\": false}, {\"role\": \"user\", \"content\": \"Bye\", \"loss\": true}, {\"role\": "
        "\"assistant\", \"content\": \"Goodbye.\"}]}\n";
    test_write_text(dir, "tools.jsonl", data);
    snprintf(path, sizeof path, "%s/tools.jsonl", dir);
    const char *files[] = {path};
    whale_chat_template *t = NULL;
    whale_sft_dataset *ds = NULL;
    whale_err err;
    CHECK(whale_chat_template_load(dir, NULL, &t, &err) == WHALE_OK, "%s", err.msg);
    whale_code rc = t ? whale_sft_dataset_open_template(files, 1, qwen, t, NULL, &ds, &err) : WHALE_ERR_ARG;
    CHECK(rc == WHALE_OK && whale_sft_dataset_num_samples(ds) == 4, "%s", rc ? err.msg : "4 samples");
    if (!rc && whale_sft_dataset_num_samples(ds) == 4) {
        char got[1024];
        trained_text(ds, 0, got, sizeof got);
        const char *want = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                           "</tool_call><|im_end|>|It is 21 C.<|im_end|>";
        CHECK(!strcmp(got, want), "OpenAI tool record trains on \"%s\"", got);
        whale_sft_sample a, b;
        CHECK(!whale_sft_dataset_sample(ds, 0, &a, &err) && !whale_sft_dataset_sample(ds, 1, &b, &err), "%s", err.msg);
        CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof *a.ids * (size_t)a.n) && !memcmp(a.train, b.train, (size_t)a.n),
              "ms-swift's agent format renders and trains as OpenAI's");
        trained_text(ds, 2, got, sizeof got);
        CHECK(!strcmp(got, "Goodbye.<|im_end|>"), "\"loss\": false leaves the first reply out: \"%s\"", got);
        /* ms-swift reads "loss" of replies only: true on a user message changes nothing */
        whale_sft_sample c, d;
        CHECK(!whale_sft_dataset_sample(ds, 2, &c, &err) && !whale_sft_dataset_sample(ds, 3, &d, &err), "%s", err.msg);
        CHECK(c.n == d.n && !memcmp(c.ids, d.ids, sizeof *c.ids * (size_t)c.n) && !memcmp(c.train, d.train, (size_t)c.n),
              "\"loss\": true on a user message has no effect");
    }
    whale_sft_dataset_free(ds);
    /* under the loss scope "all", "loss": false still leaves that reply out (ms-swift) */
    whale_sft_opts all = whale_sft_defaults();
    all.loss_scope = WHALE_SFT_LOSS_ALL;
    ds = NULL;
    rc = t ? whale_sft_dataset_open_template(files, 1, qwen, t, &all, &ds, &err) : WHALE_ERR_ARG;
    CHECK(rc == WHALE_OK, "%s", err.msg);
    if (!rc) {
        char got[1024];
        trained_text(ds, 2, got, sizeof got);
        CHECK(strstr(got, "user\nBye") && strstr(got, "Goodbye.") && !strstr(got, "Hello."),
              "loss scope all: everything but the reply with \"loss\": false: \"%s\"", got);
    }
    whale_sft_dataset_free(ds);
    whale_chat_template_free(t);
    /* a native format refuses the tools, never drops them */
    ds = NULL;
    rc = whale_sft_dataset_open(files, 1, qwen, WHALE_CHAT_CHATML, NULL, &ds, &err);
    CHECK(rc == WHALE_ERR_UNSUPPORTED && strstr(err.msg, ":1: ") && strstr(err.msg, "tools"), "%s", err.msg);
    whale_sft_dataset_free(ds);
}

/* ------------------------------------------------------------ parsing tool calls */

static char *repeat(const char *a, int n, const char *mid, const char *b);

/* Parse reply; check the content (NULL: JSON null) and the calls
 * ("name args|name args", args compared as JSON). */
static void expect_calls(const char *reply, const char *content, const char *calls) {
    cJSON *m = NULL;
    whale_err err;
    CHECK(whale_chat_parse_tool_calls(reply, strlen(reply), &m, &err) == WHALE_OK, "%s", err.msg);
    if (!m) return;
    const cJSON *c = cJSON_GetObjectItem(m, "content"), *tc = cJSON_GetObjectItem(m, "tool_calls");
    CHECK(content ? cJSON_IsString(c) && !strcmp(c->valuestring, content) : cJSON_IsNull(c), "%s: content %s", reply,
          cJSON_IsString(c) ? c->valuestring : "null");
    char got[1024] = "";
    int k = 0;
    for (const cJSON *t = tc ? tc->child : NULL; t; t = t->next, k++) {
        const cJSON *fn = cJSON_GetObjectItem(t, "function");
        cJSON *args = cJSON_Parse(cJSON_GetObjectItem(fn, "arguments")->valuestring);
        char *a = cJSON_PrintUnformatted(args);
        char id[16];
        snprintf(id, sizeof id, "call_%d", k);
        CHECK(!strcmp(cJSON_GetObjectItem(t, "id")->valuestring, id) && !strcmp(cJSON_GetObjectItem(t, "type")->valuestring, "function"),
              "%s: id and type", reply);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s %s", k ? "|" : "", cJSON_GetObjectItem(fn, "name")->valuestring,
                 a ? a : "(arguments are not JSON)");
        free(a);
        cJSON_Delete(args);
    }
    CHECK(calls ? tc && !strcmp(got, calls) : !tc, "%s: calls \"%s\", want \"%s\"", reply, got, calls ? calls : "none");
    cJSON_Delete(m);
}

static void check_tool_parsing(void) {
    expect_calls("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", NULL,
                 "get_weather {\"city\":\"Paris\"}");
    expect_calls("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit\": "
                 "\"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
                 "Let me check.", "get_weather {\"city\":\"Zürich\",\"unit\":\"c\"}|get_time {}");
    expect_calls("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>", NULL, "f {\"x\":1}");
    expect_calls("<tool_call>{\"name\": \"no_args\"}</tool_call>", NULL, "no_args {}");
    expect_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", NULL, "get_weather {\"city\":\"Paris\"}");
    expect_calls("<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"whales\"}}", NULL, "search {\"q\":\"whales\"}");
    /* malformed: the whole reply is text */
    static const char *const bad[] = {
        "<tool_call>\n{not json}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"\"}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        "<tool_call>{\"name\": \"f\"}</tool_call> and then some text",
        "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{broken</tool_call>",
        "{\"name\": \"f\", \"parameters\": {}} trailing",
        "Hello {world}",
        "",
        "</tool_call><tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_calls(bad[i], bad[i], NULL);
    /* deeply nested arguments: cJSON's nesting limit, text again */
    char *deep = repeat("[", 5000, "", "]");
    char *reply = malloc(strlen(deep) + 64);
    sprintf(reply, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": %s}}</tool_call>", deep);
    expect_calls(reply, reply, NULL);
    free(reply);
    free(deep);
}

/* ------------------------------------------------------------ hostile templates */

static void expect_error(const char *what, const char *src, whale_code code, const char *needle) {
    char *out = NULL;
    size_t len = 0;
    whale_err err = {0};
    whale_code rc = render(src, NULL, &out, &len, &err);
    CHECK(rc != WHALE_OK && (code == WHALE_OK || rc == code), "%s: got code %d (%s)", what, (int)rc, err.msg);
    CHECK(rc == WHALE_OK || (one_line(&err) && strlen(err.msg) < 400), "%s: not one short line: %s", what, err.msg);
    CHECK(rc == WHALE_OK || !needle || strstr(err.msg, needle), "%s: \"%s\" lacks \"%s\"", what, err.msg, needle);
    free(out);
}

static char *repeat(const char *a, int n, const char *mid, const char *b) {
    size_t la = strlen(a), lb = strlen(b), lm = strlen(mid);
    char *s = malloc((la + lb) * (size_t)n + lm + 1), *p = s;
    for (int i = 0; i < n; i++, p += la) memcpy(p, a, la);
    memcpy(p, mid, lm), p += lm;
    for (int i = 0; i < n; i++, p += lb) memcpy(p, b, lb);
    *p = 0;
    return s;
}

static void check_hostile(void) {
    expect_error("unknown filter", "a\nb\n{{ 'x' | wordwrap }}", WHALE_ERR_UNSUPPORTED, "line 3: filter 'wordwrap' is not supported");
    expect_error("unknown test", "{{ 1 is divisibleby }}", WHALE_ERR_UNSUPPORTED, "test 'divisibleby' is not supported");
    expect_error("unknown statement", "{% include 'other.jinja' %}", WHALE_ERR_UNSUPPORTED, "statement 'include' is not supported");
    expect_error("import", "\n{% import 'x' as y %}", WHALE_ERR_UNSUPPORTED, "line 2: statement 'import'");
    expect_error("call block", "{% call m() %}x{% endcall %}", WHALE_ERR_UNSUPPORTED, "statement 'call'");
    expect_error("unknown function", "{{ cycler(1) }}", WHALE_ERR_UNSUPPORTED, "function 'cycler' is not supported");
    expect_error("list.append (an immutable sandbox, as transformers')", "{% set l = [] %}{{ l.append(1) }}",
                 WHALE_ERR_UNSUPPORTED, "method 'append' of a list is not supported");
    expect_error("string method", "{{ 'x'.zfill(3) }}", WHALE_ERR_UNSUPPORTED, "method 'zfill' of a string");
    expect_error("unterminated expression", "hello {{ name", WHALE_ERR_FORMAT, "line 1");
    expect_error("unterminated statement", "{% if true", WHALE_ERR_FORMAT, NULL);
    expect_error("unclosed if", "\n\n{% if true %}never closed", WHALE_ERR_FORMAT, "line 3: 'if' is never closed");
    expect_error("unclosed for", "{% for x in [1] %}", WHALE_ERR_FORMAT, "'for' is never closed");
    expect_error("stray endfor", "{% endfor %}", WHALE_ERR_FORMAT, "unexpected '{% endfor %}'");
    expect_error("unterminated comment", "{# forever", WHALE_ERR_FORMAT, "unterminated comment");
    expect_error("unterminated string", "{{ 'abc }}", WHALE_ERR_FORMAT, "unterminated string");
    expect_error("bad escape", "{{ '\\q' }}", WHALE_ERR_FORMAT, "unknown escape");
    expect_error("raise_exception", "{{ raise_exception('Conversation roles must alternate') }}", WHALE_ERR_FORMAT,
                 "raise_exception: Conversation roles must alternate");
    char *deep = repeat("(", 5000, "1", ")");
    char *src = malloc(strlen(deep) + 8);
    sprintf(src, "{{ %s }}", deep);
    expect_error("deep parentheses", src, WHALE_ERR_UNSUPPORTED, "nesting deeper");
    free(src);
    free(deep);
    deep = repeat("{% if true %}", 3000, "x", "{% endif %}");
    expect_error("deep ifs", deep, WHALE_ERR_UNSUPPORTED, "nesting deeper");
    free(deep);
    deep = repeat("[", 3000, "", "]");
    src = malloc(strlen(deep) + 8);
    sprintf(src, "{{ %s }}", deep);
    expect_error("deep lists", src, WHALE_ERR_UNSUPPORTED, "nesting deeper");
    free(src);
    free(deep);
    expect_error("not not not", "{{ not not not not not not not not not not not not not not not not not not not not not "
                 "not not not not not not not not not not not not not not not not not not not not not not not not not not "
                 "not not not not not not not not not not not not not not not not not not not not not not not not true }}",
                 WHALE_ERR_UNSUPPORTED, "nesting deeper");
    deep = repeat("1 + ", 100000, "1", "");
    src = malloc(strlen(deep) + 8);
    sprintf(src, "{{ %s }}", deep);
    expect_error("a long chain of +", src, WHALE_ERR_UNSUPPORTED, "nested deeper");
    free(src);
    free(deep);
    deep = repeat("", 1, "{{ 'x'", "");
    src = malloc(100000);
    strcpy(src, "{{ 'x'");
    for (int i = 0; i < 5000; i++) strcat(src, "|trim");
    strcat(src, " }}");
    expect_error("a long chain of filters", src, WHALE_ERR_UNSUPPORTED, "nested deeper");
    strcpy(src, "{{ messages");
    for (int i = 0; i < 5000; i++) strcat(src, ".a");
    strcat(src, " }}");
    expect_error("a long chain of attributes", src, WHALE_ERR_UNSUPPORTED, "nested deeper");
    free(src);
    free(deep);
    expect_error("data nested deeply by the template",
                 "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
                 WHALE_ERR_RANGE, "nested too deeply");
    expect_error("huge range", "{% for i in range(1000000000) %}x{% endfor %}", WHALE_ERR_RANGE, "loop iterations");
    expect_error("nested loops", "{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}",
                 WHALE_ERR_RANGE, "loop iterations");
    expect_error("macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", WHALE_ERR_RANGE, "nested deeper");
    expect_error("doubling string",
                 "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                 WHALE_OK, NULL);
    expect_error("output bomb", "{% for i in range(3000000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}",
                 WHALE_OK, NULL);
    expect_error("attribute of the host", "{{ messages.__class__.__mro__ }}{{ ''.__class__() }}", WHALE_OK, NULL);
    expect_error("integer overflow", "{{ 9223372036854775807 + 1 }}", WHALE_ERR_RANGE, "overflow");
    expect_error("division by zero", "{{ 1 // 0 }}", WHALE_ERR_FORMAT, "division by zero");
    /* the same rendering twice: no state leaks between renders */
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    whale_err err;
    whale_jinja *t;
    const char *s = "{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}";
    CHECK(whale_jinja_parse(s, strlen(s), &t, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_jinja_render(t, NULL, &a, &la, &err) == WHALE_OK && whale_jinja_render(t, NULL, &b, &lb, &err) == WHALE_OK &&
              !strcmp(a, "3") && !strcmp(b, "3"), "renders are independent");
    whale_jinja_free(t);
    free(a);
    free(b);
    /* a template over the size limit */
    size_t big = WHALE_JINJA_MAX_SOURCE + 1;
    char *huge = malloc(big);
    memset(huge, 'x', big);
    CHECK(whale_jinja_parse(huge, big, &t, &err) == WHALE_ERR_RANGE && one_line(&err), "huge template: %s", err.msg);
    free(huge);
}

/* ------------------------------------------------------------ Python's semantics */

/* Where @huggingface/jinja ignores an argument or lacks a method, whale
 * does what transformers' Python Jinja does. */
static void check_python_semantics(void) {
    static const char *const cases[][2] = {
        {"{{ 'xxhixx'.lstrip('x') }}|{{ 'xxhixx'.rstrip('x') }}|{{ '\\n a \\n'.strip('\\n') }}", "hixx|xxhi| a "},
        {"{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'a,b,c'.rsplit(',') }}", "[\"a,b\", \"c\"]|[\"a\", \"b\", \"c\"]"},
        {"{{ 'hello'.find('ll') }}{{ 'hello'.find('z') }}{{ 'héllo'.find('l') }}", "2-12"},
        {"{{ '  x  ' | trim('x ') }}|{{ (1, 2) | length }}", "|2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        size_t len;
        whale_err err;
        whale_code rc = render(cases[i][0], NULL, &out, &len, &err);
        CHECK(rc == WHALE_OK && !strcmp(out, cases[i][1]), "%s: got \"%s\", want \"%s\"", cases[i][0],
              rc ? err.msg : out, cases[i][1]);
        free(out);
    }
}

int main(void) {
    const char *env = getenv("WHALE_TOKENIZERS");
    char tokdir[1024], probe[1100];
    if (env && *env) snprintf(tokdir, sizeof tokdir, "%s", env);
    else snprintf(tokdir, sizeof tokdir, "%s/../../.cache/tokenizers", WHALE_TEST_DATA);
    struct stat st;
    int have = 1;
    static const char *const fetched[] = {"qwen3", "deepseek_v3", "llama3", "gptoss", "gemma3"};
    for (int i = 0; i < 5; i++) {
        snprintf(probe, sizeof probe, "%s/%s/tokenizer.json", tokdir, fetched[i]);
        have = have && stat(probe, &st) == 0;
    }
    CHECK(have, "the real tokenizer files are missing from %s: run scripts/fetch-tokenizers.sh "
                "(or set WHALE_TOKENIZERS to where they are)", tokdir);
    check_snippets();
    int rendered = 0;
    for (int i = 0; i < N_TEMPLATES; i++) rendered += check_template(have ? tokdir : NULL, templates[i]);
    CHECK(rendered >= 130, "only %d template renders compared", rendered);
    whale_tokenizer *qwen = have ? family_tokenizer(tokdir, "qwen3") : NULL;
    CHECK(divergent == 9, "%d cases where Python's Jinja and @huggingface/jinja differ (9 known)", divergent);
    for (int i = 0; i < N_TEMPLATES; i++) {
        const char *nm = templates[i];
        const char *tk = !strcmp(nm, "deepseek_v3") ? "deepseek_v3" : !strncmp(nm, "qwen", 4) ? "qwen3"
                         : !strncmp(nm, "llama3", 6) ? "llama3" : !strcmp(nm, "gpt_oss") ? "gptoss" : NULL;
        check_mask(have && tk ? family_tokenizer(tokdir, tk) : NULL, nm);
    }
    check_mask_budget();
    check_swift_qwen3(qwen);
    check_unmaskable();
    check_folders(qwen);
    check_tool_records(qwen);
    check_tool_parsing();
    check_hostile();
    check_python_semantics();
    for (int i = 0; i < 8; i++) whale_tokenizer_free(tokenizers[i].tok);
    return test_finish("test_jinja");
}
