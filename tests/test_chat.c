/* Chat templates: renders byte-identical to the real Jinja templates and ids
 * identical to Hugging Face's tokenizer (goldens in tests/data/chat, made by
 * tests/reference/chat/gen_goldens.mjs), the SFT loss mask, the raw format,
 * detection from model folders, and one-line errors for what is refused.
 *
 * The real tokenizer files come from scripts/fetch-tokenizers.sh
 * (.cache/tokenizers or $WHALE_TOKENIZERS); without them this test fails. */
#include "whale_chat.h"

#include "core/core.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DS_EOS "<｜end▁of▁sentence｜>"
#define IM_END "<|im_end|>"

/* ------------------------------------------------------------ helpers */


/* tokenizer_config.json holding chat_template (a string or any JSON value) */
static void write_config(const char *dir, cJSON *chat_template) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "bos_token", "<s>");
    if (chat_template) cJSON_AddItemToObject(o, "chat_template", chat_template);
    char *s = cJSON_Print(o);
    test_write_text(dir, "tokenizer_config.json", s);
    free(s);
    cJSON_Delete(o);
}

static void remove_files(const char *dir) {
    const char *names[] = {"chat_template.jinja", "tokenizer_config.json"};
    char path[1200];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        remove(path);
    }
}

static int one_line(const whale_err *e) { return e->msg[0] && !strchr(e->msg, '\n'); }

static char *concat(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *d = malloc(la + lb + 1);
    memcpy(d, a, la);
    memcpy(d + la, b, lb + 1);
    return d;
}

/* What the tokenizer makes of s (its normalizer applied): decode(encode(s)). */
static char *normalized(whale_tokenizer *t, const char *s) {
    whale_err err;
    int32_t *ids;
    int n;
    char *out = NULL;
    size_t len;
    if (whale_tokenizer_encode(t, s, strlen(s), 0, &ids, &n, &err) ||
        whale_tokenizer_decode(t, ids, n, 0, &out, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    free(ids);
    return out;
}

/* Decoded text of each maximal run of masked tokens; returns the count. */
static int masked_runs(whale_tokenizer *t, const int32_t *ids, const uint8_t *mask, int n, char **runs, int cap) {
    int count = 0;
    for (int i = 0; i < n;) {
        if (!mask[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j < n && mask[j]) j++;
        if (count < cap) {
            whale_err err;
            size_t len;
            if (whale_tokenizer_decode(t, ids + i, j - i, 0, &runs[count], &len, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                exit(1);
            }
        }
        count++;
        i = j;
    }
    return count;
}

static void show_str(const char *label, const char *s, size_t n) {
    fprintf(stderr, "  %s: \"", label);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stderr);
        else if (c < 0x20 || c == '"' || c == '\\') fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fputs("\"\n", stderr);
}

/* ------------------------------------------------------------ goldens */

/* The end-of-turn text a span closes with. */
static const char *end_token(whale_chat_format fmt) {
    return fmt == WHALE_CHAT_DEEPSEEK ? DS_EOS : fmt == WHALE_CHAT_CHATML ? IM_END : "";
}

/* Turns whose assistant content starts with a newline give ChatML a token
 * holding the template's "\n" and the content's newlines (the documented
 * straddle rule puts it in the mask): case name and message index. */
static int straddles(whale_chat_format fmt, const char *name, int message) {
    return fmt == WHALE_CHAT_CHATML && !strcmp(name, "newlines_and_spaces") && message == 2;
}

static void check_case(whale_tokenizer *tok, whale_chat_format fmt, const char *bos, const cJSON *c) {
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    const char *fname = whale_chat_format_name(fmt);
    int agp = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
    const cJSON *want_text = cJSON_GetObjectItem(c, "text");
    const cJSON *want_ids = cJSON_GetObjectItem(c, "ids");
    whale_err err;

    /* messages through the JSON reader, as SFT data arrives */
    char *mjson = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "messages"));
    whale_chat_message *msgs;
    int n;
    whale_code rc = whale_chat_parse_json(mjson, strlen(mjson), &msgs, &n, &err);
    free(mjson);
    CHECK(rc == WHALE_OK, "%s/%s: %s", fname, name, err.msg);
    if (rc) return;

    char *text;
    size_t len;
    whale_chat_span *spans;
    int n_spans;
    rc = whale_chat_render(fmt, msgs, n, agp, bos, &text, &len, &spans, &n_spans, &err);
    CHECK(rc == WHALE_OK, "%s/%s: %s", fname, name, err.msg);
    if (rc) {
        free(msgs);
        return;
    }
    size_t wlen = strlen(want_text->valuestring);
    int same = len == wlen && !memcmp(text, want_text->valuestring, len);
    CHECK(same, "%s/%s: rendered text differs from the Jinja golden", fname, name);
    if (!same) {
        show_str("got ", text, len);
        show_str("want", want_text->valuestring, wlen);
    }

    /* spans: assistant content + end token, one per assistant message */
    int n_assist = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(msgs[i].role, "assistant")) continue;
        int k = n_assist++;
        if (k >= n_spans) break;
        char *want = concat(msgs[i].content, end_token(fmt));
        const whale_chat_span *s = &spans[k];
        CHECK(s->message == i && s->end - s->start == strlen(want) && s->end <= len &&
                  !memcmp(text + s->start, want, strlen(want)),
              "%s/%s: span %d does not hold messages[%d]'s content and end token", fname, name, k, i);
        free(want);
    }
    CHECK(n_spans == n_assist, "%s/%s: %d spans for %d assistant messages", fname, name, n_spans, n_assist);

    /* ids as Hugging Face's tokenizer gives them for the rendered text */
    int32_t *ids;
    uint8_t *mask;
    int n_ids;
    rc = tok ? whale_chat_encode(tok, fmt, msgs, n, agp, &ids, &mask, &n_ids, &err) : WHALE_ERR_IO;
    CHECK(rc == WHALE_OK || !tok, "%s/%s: %s", fname, name, err.msg);
    if (rc == WHALE_OK) {
        int ok = cJSON_GetArraySize(want_ids) == n_ids;
        int at = 0;
        for (const cJSON *v = want_ids->child; ok && v; v = v->next, at++)
            if ((int32_t)v->valuedouble != ids[at]) ok = 0;
        CHECK(ok, "%s/%s: ids differ from the golden (%d ids vs %d; first difference at %d)", fname, name, n_ids,
              cJSON_GetArraySize(want_ids), at ? at - 1 : 0);

        /* the mask: one run per assistant turn, decoding to its content and
         * end token (as the tokenizer normalizes them) */
        char *runs[64] = {0};
        int n_runs = masked_runs(tok, ids, mask, n_ids, runs, 64);
        CHECK(n_runs == n_assist, "%s/%s: %d masked runs for %d assistant messages", fname, name, n_runs,
              n_assist);
        int k = 0;
        for (int i = 0; i < n && k < n_runs && k < 64; i++) {
            if (strcmp(msgs[i].role, "assistant")) continue;
            char *body = concat(msgs[i].content, end_token(fmt));
            char *want = straddles(fmt, name, i) ? concat("\n", body) : concat("", body);
            char *norm = normalized(tok, want);
            CHECK(!strcmp(runs[k], norm), "%s/%s: masked tokens of messages[%d] decode to something else", fname,
                  name, i);
            if (strcmp(runs[k], norm)) {
                show_str("masked", runs[k], strlen(runs[k]));
                show_str("want  ", norm, strlen(norm));
            }
            free(body);
            free(want);
            free(norm);
            k++;
        }
        for (int r = 0; r < n_runs && r < 64; r++) free(runs[r]);

        /* without a mask the ids are the same */
        int32_t *ids2;
        int n2;
        rc = whale_chat_encode(tok, fmt, msgs, n, agp, &ids2, NULL, &n2, &err);
        CHECK(rc == WHALE_OK && n2 == n_ids && !memcmp(ids2, ids, (size_t)n2 * sizeof *ids),
              "%s/%s: ids without a mask differ", fname, name);
        if (rc == WHALE_OK) free(ids2);
        free(ids);
        free(mask);
    }
    free(spans);
    free(text);
    free(msgs);
}

/* Checks every case of golden-<fmt>.json; returns its chat_template (owned
 * by *root) for the detection tests. */
static const char *check_golden(const char *tokdir, const char *file, whale_chat_format fmt, cJSON **root) {
    char path[1200];
    snprintf(path, sizeof path, "%s/chat/%s", WHALE_TEST_DATA, file);
    *root = test_read_json(path);
    CHECK(*root != NULL, "%s: missing or not JSON (run tests/reference/chat/gen_goldens.mjs)", path);
    if (!*root) return NULL;
    const cJSON *tpl = cJSON_GetObjectItem(*root, "chat_template");
    const cJSON *bos = cJSON_GetObjectItem(*root, "bos_token");
    const cJSON *cases = cJSON_GetObjectItem(*root, "cases");
    CHECK(cJSON_GetArraySize(cases) >= 10, "%s: too few cases", path);
    /* without the tokenizer (a failure already reported) only renders are checked */
    whale_tokenizer *tok = tokdir ? test_load_tokenizer(tokdir, cJSON_GetObjectItem(*root, "tokenizer")->valuestring) : NULL;
    if (tok) {
        /* the golden's BOS is the tokenizer's, which encode uses */
        const char *tb = whale_tokenizer_role_token(tok, WHALE_TOKEN_BOS);
        CHECK(cJSON_IsString(bos) ? tb && !strcmp(tb, bos->valuestring) : 1, "%s: bos_token differs from the tokenizer's",
              path);
    }
    for (const cJSON *c = cases->child; c; c = c->next)
        check_case(tok, fmt, cJSON_IsString(bos) ? bos->valuestring : NULL, c);
    whale_tokenizer_free(tok);
    return cJSON_IsString(tpl) ? tpl->valuestring : NULL;
}

/* ------------------------------------------------------------ raw format */

static void check_raw(const char *tokdir) {
    whale_chat_message m[] = {
        {"system", "Be nice."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
    whale_err err;
    char *text;
    size_t len;
    whale_chat_span *spans;
    int ns;
    CHECK(whale_chat_render(WHALE_CHAT_RAW, m, 4, 1, NULL, &text, &len, &spans, &ns, &err) == WHALE_OK, "%s",
          err.msg);
    CHECK(!strcmp(text, "system: Be nice.\nuser: Hi\nassistant: Hello!\nuser: Bye\nassistant:"), "raw: got %s", text);
    CHECK(ns == 1 && spans[0].message == 2 && !memcmp(text + spans[0].start, "Hello!", 6) &&
              spans[0].end - spans[0].start == 6,
          "raw: the span is the assistant content alone");
    free(text);
    free(spans);
    CHECK(whale_chat_render(WHALE_CHAT_RAW, m, 3, 0, NULL, &text, &len, NULL, NULL, &err) == WHALE_OK, "%s", err.msg);
    CHECK(!strcmp(text, "system: Be nice.\nuser: Hi\nassistant: Hello!") && len == strlen(text), "raw: got %s", text);
    free(text);
    CHECK(whale_chat_stop_strings(WHALE_CHAT_RAW)[0] == NULL, "raw has no end-of-turn string");

    /* DeepSeek's bos_token argument: NULL = default, "" = none */
    CHECK(whale_chat_render(WHALE_CHAT_DEEPSEEK, m + 1, 1, 1, "", &text, &len, NULL, NULL, &err) == WHALE_OK, "%s",
          err.msg);
    CHECK(!strcmp(text, "<｜User｜>Hi<｜Assistant｜>"), "deepseek with bos \"\": got %s", text);
    free(text);

    /* an empty rendering: nothing but an empty system prompt */
    whale_chat_message empty_system = {"system", ""};
    CHECK(whale_chat_render(WHALE_CHAT_DEEPSEEK, &empty_system, 1, 0, "", &text, &len, &spans, &ns, &err) ==
                  WHALE_OK &&
              len == 0 && text[0] == 0 && ns == 0 && spans == NULL,
          "empty rendering");
    free(text);

    if (!tokdir) return;
    whale_tokenizer *tok = test_load_tokenizer(tokdir, "deepseek_v3");
    if (!tok) return;
    /* raw turns have no end token: the mask reaches into the template's
     * text where a token holds both (" Hello" takes the space after ':',
     * "!\n" the newline before the next turn) */
    int32_t *ids;
    uint8_t *mask;
    int n;
    CHECK(whale_chat_encode(tok, WHALE_CHAT_RAW, m, 4, 1, &ids, &mask, &n, &err) == WHALE_OK, "%s", err.msg);
    char *runs[4] = {0};
    int nr = masked_runs(tok, ids, mask, n, runs, 4);
    CHECK(nr == 1 && !strcmp(runs[0], " Hello!\n"), "raw: masked run is \"%s\"", nr ? runs[0] : "");
    for (int i = 0; i < nr && i < 4; i++) free(runs[i]);
    /* the same rule computed here from the tokens' bytes */
    size_t off = 0, s0 = strlen("system: Be nice.\nuser: Hi\nassistant: "), s1 = s0 + 6;
    int agree = 1;
    for (int i = 0; i < n; i++) {
        size_t tl;
        whale_tokenizer_token_bytes(tok, ids[i], &tl);
        int overlap = off < s1 && off + tl > s0;
        if (overlap != mask[i]) agree = 0;
        off += tl;
    }
    CHECK(agree, "raw: mask is not the set of tokens overlapping the span");
    free(ids);
    free(mask);

    /* invalid UTF-8 is replaced by U+FFFD before tokenizing, so the token
     * bytes differ from the text: the mask must still land on the turn */
    whale_chat_message bad[] = {{"user", "x\xff"}, {"assistant", "a\xffz\xc3"}, {"user", "\xe4\xb8"}};
    CHECK(whale_chat_encode(tok, WHALE_CHAT_DEEPSEEK, bad, 3, 1, &ids, &mask, &n, &err) == WHALE_OK, "%s", err.msg);
    nr = masked_runs(tok, ids, mask, n, runs, 4);
    CHECK(nr == 1 && !strcmp(runs[0], "a\xEF\xBF\xBDz\xEF\xBF\xBD" DS_EOS), "invalid UTF-8: masked run is \"%s\"",
          nr ? runs[0] : "");
    for (int i = 0; i < nr && i < 4; i++) free(runs[i]);
    free(ids);
    free(mask);

    int32_t stop[4];
    CHECK(whale_chat_stop_ids(tok, WHALE_CHAT_DEEPSEEK, stop, 4) == 1 && stop[0] == 1, "deepseek stop id is 1");
    CHECK(whale_chat_stop_ids(tok, WHALE_CHAT_RAW, stop, 4) == 0, "raw has no stop ids");
    whale_tokenizer_free(tok);

    tok = test_load_tokenizer(tokdir, "qwen3");
    if (!tok) return;
    CHECK(whale_chat_stop_ids(tok, WHALE_CHAT_CHATML, stop, 4) == 2 && stop[0] == 151645 && stop[1] == 151643,
          "chatml stop ids are <|im_end|> 151645 and <|endoftext|> 151643");
    CHECK(whale_chat_stop_ids(tok, WHALE_CHAT_CHATML, stop, 1) == 2 && stop[0] == 151645,
          "stop ids: count beyond cap");
    whale_tokenizer_free(tok);
}

/* A long conversation with NFD text, so Qwen's normalizer changes every
 * assistant turn and the mask is placed piece by piece. */
static void check_long(const char *tokdir) {
    if (!tokdir) return;
    whale_tokenizer *tok = test_load_tokenizer(tokdir, "qwen3");
    if (!tok) return;
    enum { TURNS = 400 };
    whale_chat_message *m = malloc(2 * TURNS * sizeof *m);
    for (int i = 0; i < TURNS; i++) {
        m[2 * i] = (whale_chat_message){"user", "Cafe\xcc\x81?"};
        m[2 * i + 1] = (whale_chat_message){"assistant", i % 2 ? "Cafe\xcc\x81 ok" : "\nre\xcc\x81sume\xcc\x81"};
    }
    whale_err err;
    int32_t *ids;
    uint8_t *mask;
    int n;
    double t0 = whale_now();
    CHECK(whale_chat_encode(tok, WHALE_CHAT_CHATML, m, 2 * TURNS, 1, &ids, &mask, &n, &err) == WHALE_OK, "%s",
          err.msg);
    double dt = whale_now() - t0;
    CHECK(dt < 2.0, "long conversation: encoding %d turns took %.2f s", 2 * TURNS, dt);
    char **runs = calloc(TURNS + 1, sizeof *runs);
    int nr = masked_runs(tok, ids, mask, n, runs, TURNS + 1);
    CHECK(nr == TURNS, "long conversation: %d masked runs for %d assistant turns", nr, TURNS);
    int bad = 0;
    for (int i = 0; i < nr && i < TURNS; i++) {
        /* even turns start with "\n": the straddling "\n\n" token is in */
        const char *want = i % 2 ? "Caf\xc3\xa9 ok" IM_END : "\n\nr\xc3\xa9sum\xc3\xa9" IM_END;
        if (strcmp(runs[i], want)) bad++;
        free(runs[i]);
    }
    CHECK(!bad, "long conversation: %d masked runs decode to something else", bad);
    free(runs);
    free(ids);
    free(mask);
    free(m);
    whale_tokenizer_free(tok);
}

/* ------------------------------------------------------------ detection */

static void expect_detect(const char *dir, whale_code want, whale_chat_format want_fmt, const char *needle,
                          const char *what) {
    whale_err err = {0};
    whale_chat_format fmt = (whale_chat_format)-1;
    whale_code rc = whale_chat_detect(dir, &fmt, &err);
    if (want == WHALE_OK) {
        CHECK(rc == WHALE_OK && fmt == want_fmt, "detect %s: got %s (%s)", what,
              rc ? whale_code_name(rc) : whale_chat_format_name(fmt), rc ? err.msg : "");
    } else {
        CHECK(rc == want && one_line(&err) && (!needle || strstr(err.msg, needle)),
              "detect %s: want %s mentioning \"%s\", got %s: %s", what, whale_code_name(want),
              needle ? needle : "", whale_code_name(rc), rc ? err.msg : whale_chat_format_name(fmt));
    }
}

static char *replace_all(const char *s, const char *from, const char *to) {
    size_t lf = strlen(from), lt = strlen(to), n = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + lf, from)) n++;
    char *out = malloc(strlen(s) + n * lt + 1), *o = out;
    for (const char *p; (p = strstr(s, from)); s = p + lf) {
        memcpy(o, s, (size_t)(p - s));
        o += p - s;
        memcpy(o, to, lt);
        o += lt;
    }
    strcpy(o, s);
    return out;
}

static void check_detect(const char *tokdir, const char *ds_tpl, const char *chatml_tpl) {
    char dir[512];
    test_tmpdir("chat", dir, sizeof dir);
    char msgdir[600];
    snprintf(msgdir, sizeof msgdir, "%s/tokenizer_config.json", dir);

    expect_detect(dir, WHALE_ERR_UNSUPPORTED, 0, "--chat-template", "empty folder");
    if (ds_tpl && chatml_tpl) {
        test_write_text(dir, "chat_template.jinja", ds_tpl);
        expect_detect(dir, WHALE_OK, WHALE_CHAT_DEEPSEEK, NULL, "real DeepSeek-V3 chat_template.jinja");
        remove_files(dir);
        write_config(dir, cJSON_CreateString(ds_tpl));
        expect_detect(dir, WHALE_OK, WHALE_CHAT_DEEPSEEK, NULL, "real DeepSeek-V3 in tokenizer_config.json");
        expect_detect(msgdir, WHALE_OK, WHALE_CHAT_DEEPSEEK, NULL, "a file inside the folder");
        /* chat_template.jinja wins over tokenizer_config.json */
        test_write_text(dir, "chat_template.jinja", chatml_tpl);
        expect_detect(dir, WHALE_OK, WHALE_CHAT_CHATML, NULL, "chat_template.jinja before tokenizer_config.json");
        remove_files(dir);
        write_config(dir, cJSON_CreateString(chatml_tpl));
        expect_detect(dir, WHALE_OK, WHALE_CHAT_CHATML, NULL, "Qwen2.5 ChatML in tokenizer_config.json");

        /* reformatted: a newline and indentation between every tag */
        char *pretty = replace_all(ds_tpl, "%}{", "%}\n    {");
        test_write_text(dir, "chat_template.jinja", pretty);
        expect_detect(dir, WHALE_OK, WHALE_CHAT_DEEPSEEK, NULL, "reformatted DeepSeek-V3 template");
        free(pretty);
        /* DeepSeek-R1-style: the same plus thinking */
        char *r1 = replace_all(ds_tpl, "{{'<｜Assistant｜>'}}", "{{'<｜Assistant｜><think>\\n'}}");
        test_write_text(dir, "chat_template.jinja", r1);
        expect_detect(dir, WHALE_ERR_UNSUPPORTED, 0, "think", "DeepSeek-R1-style template");
        free(r1);
        /* ChatML with another default system message */
        char *qwen2 = replace_all(chatml_tpl, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                                  "You are a helpful assistant.");
        test_write_text(dir, "chat_template.jinja", qwen2);
        expect_detect(dir, WHALE_ERR_UNSUPPORTED, 0, "ChatML", "Qwen2 ChatML template");
        free(qwen2);
        remove_files(dir);

        /* named templates: "default" is used */
        cJSON *list = cJSON_CreateArray(), *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", "tool_use");
        cJSON_AddStringToObject(e, "template", "{{ tools }}");
        cJSON_AddItemToArray(list, e);
        e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", "default");
        cJSON_AddStringToObject(e, "template", ds_tpl);
        cJSON_AddItemToArray(list, e);
        write_config(dir, list);
        expect_detect(dir, WHALE_OK, WHALE_CHAT_DEEPSEEK, NULL, "named templates with \"default\"");
        list = cJSON_CreateArray();
        e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", "rag");
        cJSON_AddStringToObject(e, "template", chatml_tpl);
        cJSON_AddItemToArray(list, e);
        write_config(dir, list);
        expect_detect(dir, WHALE_ERR_UNSUPPORTED, 0, "default", "named templates without \"default\"");
    }
    test_write_text(dir, "chat_template.jinja", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
    expect_detect(dir, WHALE_ERR_UNSUPPORTED, 0, "chat_template.jinja", "unrecognised template");
    remove_files(dir);
    write_config(dir, NULL);
    expect_detect(dir, WHALE_ERR_UNSUPPORTED, 0, "chat_template", "tokenizer_config.json without a template");
    write_config(dir, cJSON_CreateNumber(3));
    expect_detect(dir, WHALE_ERR_FORMAT, 0, "chat_template", "chat_template of the wrong type");
    test_write_text(dir, "tokenizer_config.json", "{\"chat_template\": ");
    expect_detect(dir, WHALE_ERR_FORMAT, 0, "tokenizer_config.json", "malformed tokenizer_config.json");
    remove_files(dir);
    rmdir(dir);
    char gone[600];
    snprintf(gone, sizeof gone, "%s/missing", dir);
    expect_detect(gone, WHALE_ERR_IO, 0, "missing", "a folder that does not exist");

    if (tokdir) {
        char path[1200];
        snprintf(path, sizeof path, "%s/deepseek_v3", tokdir);
        expect_detect(path, WHALE_OK, WHALE_CHAT_DEEPSEEK, NULL, "the real DeepSeek-V3 tokenizer folder");
        /* Qwen3's template thinks, and has no default system message */
        snprintf(path, sizeof path, "%s/qwen3", tokdir);
        expect_detect(path, WHALE_ERR_UNSUPPORTED, 0, "think", "the real Qwen3 tokenizer folder");
    }
}

/* ------------------------------------------------------------ errors */

static void expect_render_error(whale_chat_format fmt, const whale_chat_message *m, int n, whale_code want,
                                const char *needle, const char *what) {
    whale_err err = {0};
    char *text = NULL;
    size_t len;
    whale_code rc = whale_chat_render(fmt, m, n, 1, NULL, &text, &len, NULL, NULL, &err);
    CHECK(rc == want && one_line(&err) && strstr(err.msg, needle), "%s: want %s mentioning \"%s\", got %s: %s", what,
          whale_code_name(want), needle, whale_code_name(rc), rc ? err.msg : text);
    if (!rc) free(text);
}

static void expect_parse(const char *json, whale_code want, const char *needle, const char *what) {
    whale_err err = {0};
    whale_chat_message *m = NULL;
    int n = 0;
    whale_code rc = whale_chat_parse_json(json, strlen(json), &m, &n, &err);
    CHECK(rc == want && (!rc || (one_line(&err) && strstr(err.msg, needle))),
          "parse %s: want %s mentioning \"%s\", got %s: %s", what, whale_code_name(want), needle,
          whale_code_name(rc), rc ? err.msg : "");
    if (!rc) free(m);
}

static void check_errors(void) {
    whale_chat_message unknown[] = {{"user", "hi"}, {"bot", "hello"}};
    whale_chat_message tool[] = {{"user", "hi"}, {"assistant", "calling"}, {"tool", "42"}};
    whale_chat_message null_content[] = {{"user", NULL}};
    whale_chat_message null_assistant[] = {{"user", "hi"}, {"assistant", NULL}};
    whale_chat_message null_role[] = {{NULL, "hi"}};
    for (int f = 0; f < 3; f++) {
        whale_chat_format fmt = (whale_chat_format)f;
        expect_render_error(fmt, unknown, 2, WHALE_ERR_ARG, "messages[1]: unknown role \"bot\"", "unknown role");
        expect_render_error(fmt, tool, 3, WHALE_ERR_UNSUPPORTED, "messages[2]: role \"tool\"", "tool message");
        expect_render_error(fmt, NULL, 0, WHALE_ERR_ARG, "empty conversation", "empty conversation");
        expect_render_error(fmt, unknown, 0, WHALE_ERR_ARG, "empty conversation", "zero messages");
        expect_render_error(fmt, null_content, 1, WHALE_ERR_ARG, "messages[0]: user content is NULL",
                            "NULL content");
        expect_render_error(fmt, null_assistant, 2, WHALE_ERR_UNSUPPORTED, "messages[1]: assistant content is NULL",
                            "NULL assistant content");
        expect_render_error(fmt, null_role, 1, WHALE_ERR_ARG, "messages[0]: role is NULL", "NULL role");
    }
    expect_render_error((whale_chat_format)7, unknown, 1, WHALE_ERR_ARG, "format", "unknown format");

    whale_err err;
    whale_chat_format fmt;
    const char *names[] = {"deepseek", "chatml", "raw"};
    for (int i = 0; i < 3; i++)
        CHECK(whale_chat_format_from_name(names[i], &fmt, &err) == WHALE_OK && (int)fmt == i &&
                  !strcmp(whale_chat_format_name(fmt), names[i]),
              "format name %s", names[i]);
    CHECK(whale_chat_format_from_name("jinja", &fmt, &err) == WHALE_ERR_ARG && one_line(&err) &&
              strstr(err.msg, "jinja") && strstr(err.msg, "deepseek, chatml or raw"),
          "unknown format name: %s", err.msg);

    expect_parse("[{\"role\":\"user\",\"content\":\"hi\"}]", WHALE_OK, "", "a plain array");
    expect_parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"name\":\"x\",\"tool_calls\":null},"
                 "{\"role\":\"assistant\",\"content\":\"yo\",\"tool_calls\":[],\"reasoning_content\":\"\"}]}",
                 WHALE_OK, "", "an SFT line with empty tool fields");
    expect_parse("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,"
                 "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
                 WHALE_ERR_UNSUPPORTED, "messages[1].tool_calls", "tool calls");
    expect_parse("[{\"role\":\"assistant\",\"content\":\"x\",\"reasoning_content\":\"hmm\"}]", WHALE_ERR_UNSUPPORTED,
                 "messages[0].reasoning_content", "thinking");
    expect_parse("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}]", WHALE_ERR_UNSUPPORTED,
                 "messages[0].content", "content parts");
    expect_parse("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":null}]", WHALE_ERR_FORMAT,
                 "messages[1].content", "null content");
    expect_parse("[{\"content\":\"a\"}]", WHALE_ERR_FORMAT, "messages[0].role", "missing role");
    expect_parse("[1]", WHALE_ERR_FORMAT, "messages[0]", "not an object");
    expect_parse("{\"conversation\":[]}", WHALE_ERR_FORMAT, "\"messages\"", "no messages field");
    expect_parse("[{\"role\":", WHALE_ERR_FORMAT, "not valid JSON", "broken JSON");

    /* a parsed conversation renders like the same literal one */
    const char *j = "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Q\"},"
                    "{\"role\":\"assistant\",\"content\":\"A\"}]";
    whale_chat_message *m;
    int n;
    char *text;
    size_t len;
    CHECK(whale_chat_parse_json(j, strlen(j), &m, &n, &err) == WHALE_OK && n == 3, "%s", err.msg);
    CHECK(whale_chat_render(WHALE_CHAT_DEEPSEEK, m, n, 0, NULL, &text, &len, NULL, NULL, &err) == WHALE_OK, "%s",
          err.msg);
    CHECK(!strcmp(text, "<｜begin▁of▁sentence｜>S<｜User｜>Q<｜Assistant｜>A" DS_EOS), "parsed render: %s", text);
    free(text);
    free(m);
}

int main(void) {
    const char *env = getenv("WHALE_TOKENIZERS");
    char tokdir[1024];
    if (env && *env) snprintf(tokdir, sizeof tokdir, "%s", env);
    else snprintf(tokdir, sizeof tokdir, "%s/../../.cache/tokenizers", WHALE_TEST_DATA);
    char probe[1100];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/deepseek_v3/tokenizer.json", tokdir);
    int have = stat(probe, &st) == 0;
    snprintf(probe, sizeof probe, "%s/qwen3/tokenizer.json", tokdir);
    have = have && stat(probe, &st) == 0;
    CHECK(have, "the real tokenizer files are missing from %s: run scripts/fetch-tokenizers.sh "
                "(or set WHALE_TOKENIZERS to where they are)", tokdir);
    const char *tk = have ? tokdir : NULL;

    check_errors();
    cJSON *ds = NULL, *chatml = NULL;
    const char *ds_tpl = check_golden(tk, "golden-deepseek.json", WHALE_CHAT_DEEPSEEK, &ds);
    const char *chatml_tpl = check_golden(tk, "golden-chatml.json", WHALE_CHAT_CHATML, &chatml);
    check_raw(tk);
    check_long(tk);
    check_detect(tk, ds_tpl, chatml_tpl);
    cJSON_Delete(ds);
    cJSON_Delete(chatml);
    return test_finish("test_chat");
}
