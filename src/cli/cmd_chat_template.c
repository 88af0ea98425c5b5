/* whale chat-template: apply_chat_template from the command line. */
#include "cli.h"

#include "whale_util.h"
#include "whale_chat.h"
#include "whale_tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: whale chat-template -m DIR --messages FILE.json [--tools FILE.json]\n"
    "                           [--add-generation-prompt] [--kwargs JSON] [--ids]\n"
    "                           [--chat-template deepseek|chatml|raw|FILE.jinja]\n"
    "  renders the conversation as transformers' apply_chat_template does and prints\n"
    "  the text exactly, nothing added (--ids: the token ids as a JSON array).\n"
    "  FILE.json: an OpenAI-style messages array (or an object with \"messages\" and\n"
    "  optionally \"tools\"); --kwargs: extra template variables as a JSON object,\n"
    "  e.g. '{\"enable_thinking\": false}'. Needs only DIR's tokenizer files.";

typedef struct {
    const char *model, *messages, *tools, *kwargs, *tmpl;
    int agp, ids;
} ct_opts;

/* 0, -1 after --help, or a usage status */
static int parse_opts(int argc, char **argv, ct_opts *o) {
    memset(o, 0, sizeof *o);
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &o->model, 0, 0, NULL},
        {"--messages", CLI_STR, &o->messages, 0, 0, NULL},
        {"--tools", CLI_STR, &o->tools, 0, 0, NULL},
        {"--kwargs", CLI_STR, &o->kwargs, 0, 0, NULL},
        {"--chat-template", CLI_STR, &o->tmpl, 0, 0, NULL},
        {"--add-generation-prompt", CLI_FLAG, &o->agp, 0, 0, NULL},
        {"--ids", CLI_FLAG, &o->ids, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int status = cli_parse("chat-template", help, argc, argv, table, NULL, NULL);
    if (status) return status;
    if (!o->model) return cli_usage("chat-template", "-m DIR is required");
    if (!o->messages) return cli_usage("chat-template", "--messages FILE.json is required");
    return 0;
}

static whale_code read_json(const char *path, cJSON **out, whale_err *err) {
    char *buf;
    size_t n;
    whale_code rc = whale_read_file(path, &buf, &n, err);
    if (rc) return rc;
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    size_t at = end ? (size_t)(end - buf) : 0;
    free(buf);
    if (!*out) return whale_errf(err, WHALE_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, at);
    return WHALE_OK;
}

/* messages and tools from the files (tools may come with the messages) */
static whale_code load_inputs(const ct_opts *o, cJSON **root, cJSON **tools_root, const cJSON **messages,
                              const cJSON **tools, cJSON **kwargs, whale_err *err) {
    whale_code rc = read_json(o->messages, root, err);
    if (rc) return rc;
    *messages = *root;
    if (cJSON_IsObject(*root)) {
        *messages = cJSON_GetObjectItemCaseSensitive(*root, "messages");
        *tools = cJSON_GetObjectItemCaseSensitive(*root, "tools");
    }
    if (!cJSON_IsArray(*messages))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: expected a JSON array of messages (or an object with \"messages\")",
                          o->messages);
    if (o->tools) {
        if ((rc = read_json(o->tools, tools_root, err))) return rc;
        *tools = *tools_root;
    }
    if (o->kwargs) {
        *kwargs = cJSON_Parse(o->kwargs);
        if (!cJSON_IsObject(*kwargs)) return whale_errf(err, WHALE_ERR_ARG, "--kwargs: expected a JSON object");
    }
    return WHALE_OK;
}

static whale_code print_ids(const char *model, const char *text, size_t len, whale_err *err) {
    whale_tokenizer *tok;
    whale_code rc = whale_tokenizer_load(model, &tok, err);
    if (rc) return rc;
    int32_t *ids;
    int n;
    rc = whale_tokenizer_encode(tok, text, len, 0, &ids, &n, err);
    whale_tokenizer_free(tok);
    if (rc) return rc;
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", (int)ids[i]);
    puts("]");
    free(ids);
    return WHALE_OK;
}

int cmd_chat_template(int argc, char **argv) {
    ct_opts o;
    int status = parse_opts(argc, argv, &o);
    if (status) return status < 0 ? 0 : status;
    whale_err err;
    cJSON *root = NULL, *tools_root = NULL, *kwargs = NULL;
    const cJSON *messages = NULL, *tools = NULL;
    whale_chat_template *t = NULL;
    char *text = NULL;
    size_t len = 0;
    whale_code rc = load_inputs(&o, &root, &tools_root, &messages, &tools, &kwargs, &err);
    if (!rc) rc = whale_chat_template_load(o.model, o.tmpl, &t, &err);
    if (!rc && whale_chat_template_notice(t)) fprintf(stderr, "chat-template: %s\n", whale_chat_template_notice(t));
    if (!rc) rc = whale_chat_template_apply(t, messages, tools, kwargs, o.agp, &text, &len, &err);
    if (!rc && o.ids) rc = print_ids(o.model, text, len, &err);
    else if (!rc) fwrite(text, 1, len, stdout);
    free(text);
    whale_chat_template_free(t);
    cJSON_Delete(root);
    cJSON_Delete(tools_root);
    cJSON_Delete(kwargs);
    if (!rc && fflush(stdout) != 0) rc = whale_errf(&err, WHALE_ERR_IO, "stdout: write failed");
    return rc ? cli_fail(&err) : 0;
}
