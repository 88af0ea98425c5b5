/*
 * whale_chat.h — chat templates.
 *
 * What the commands use is a whale_chat_template (bottom of this file): the
 * model folder's own Jinja template, rendered by the project's Jinja
 * renderer (src/io/jinja*.c, docs/chat-templates.md), a template file, or
 * one of the native formats below.
 *
 * The two formats the project's models use are also rendered natively, byte for
 * byte as Hugging Face's apply_chat_template renders their real templates
 * (tests/test_chat.c compares with goldens made by Jinja from those
 * templates), for plain conversations of system / user / assistant messages:
 *
 *   WHALE_CHAT_DEEPSEEK  DeepSeek-V3 (nanowhale):
 *                        BOS + every system message, in order, joined by
 *                        "\n\n" (gathered in front wherever they stand) +
 *                        "<｜User｜>{user}" / "<｜Assistant｜>{assistant}<｜end▁of▁sentence｜>"
 *                        turns with nothing in between; generation prompt
 *                        "<｜Assistant｜>".
 *   WHALE_CHAT_CHATML    Qwen2.5 ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n"
 *                        per message, preceded by Qwen2.5's default system
 *                        turn when the first message is not a system message;
 *                        generation prompt "<|im_start|>assistant\n".
 *   WHALE_CHAT_RAW       the original project's fallback without a template:
 *                        "{role}: {content}" lines joined by "\n", then
 *                        "\nassistant:" for the generation prompt.
 *
 * In the native formats tool messages, tool calls and thinking parts are
 * refused with an error, never rendered differently from the real template.
 * Unknown roles, which the real templates would silently drop, are refused
 * too. (Jinja templates render whatever the template renders.)
 */
#ifndef WHALE_CHAT_H
#define WHALE_CHAT_H

#include "whale.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { WHALE_CHAT_DEEPSEEK = 0, WHALE_CHAT_CHATML, WHALE_CHAT_RAW } whale_chat_format;

/* role: "system", "user" or "assistant"; content: NUL-terminated UTF-8. */
typedef struct {
    const char *role;
    const char *content;
} whale_chat_message;

/* Bytes [start, end) of the rendered text that an assistant turn is trained
 * on: its content plus the closing end-of-turn token (<｜end▁of▁sentence｜> /
 * <|im_end|>; the raw format has none). message is the index in msgs. */
typedef struct {
    size_t start, end;
    int message;
} whale_chat_span;

/* Which format a model folder's template is: dir/chat_template.jinja, else
 * dir/tokenizer_config.json "chat_template" (a string, or a list of
 * {"name", "template"} of which "default" is used). The real DeepSeek-V3 and
 * Qwen2.5 templates are recognised by their markers (see chat.c); a missing
 * or unrecognised template is WHALE_ERR_UNSUPPORTED naming the file and
 * suggesting --chat-template deepseek|chatml|raw. */
whale_code whale_chat_detect(const char *model_dir, whale_chat_format *fmt, whale_err *err);

/* "deepseek", "chatml" or "raw" (as --chat-template takes them). */
whale_code whale_chat_format_from_name(const char *name, whale_chat_format *fmt, whale_err *err);
const char *whale_chat_format_name(whale_chat_format fmt);

/* Render n messages. bos_token is the DeepSeek format's BOS string (NULL =
 * "<｜begin▁of▁sentence｜>", "" = none; the other formats use no BOS).
 * *text is malloc'd and NUL-terminated (*len excludes the NUL). When spans
 * is not NULL, *spans (malloc'd, NULL when *n_spans is 0) receives one span
 * per assistant message, in order. Free both with free(). */
whale_code whale_chat_render(whale_chat_format fmt, const whale_chat_message *msgs, int n,
                             int add_generation_prompt, const char *bos_token, char **text,
                             size_t *len, whale_chat_span **spans, int *n_spans, whale_err *err);

/* Render and tokenize as apply_chat_template(tokenize=True) does: the whole
 * text in one go, added tokens matched in it, no BOS/EOS added by the
 * tokenizer (the DeepSeek format's BOS is the tokenizer's configured
 * bos_token, else the default above). *ids and, if loss_mask is not NULL,
 * *loss_mask (malloc'd, *n_ids entries each) are freed with free().
 *
 * loss_mask[i] is 1 for the tokens of assistant spans (content + end-of-turn
 * token). A token that straddles a span boundary — it holds bytes of the
 * template and of the content, e.g. ChatML's "\n" merged with the newlines
 * an assistant reply starts with — is inside the mask: the rule of
 * transformers' return_assistant_tokens_mask (every token from the one
 * holding the span's first byte to the one holding its last). The ids are
 * never changed to make boundaries line up. */
whale_code whale_chat_encode(whale_tokenizer *tok, whale_chat_format fmt,
                             const whale_chat_message *msgs, int n, int add_generation_prompt,
                             int32_t **ids, uint8_t **loss_mask, int *n_ids, whale_err *err);

/* Tokenize text as whale_chat_encode does and mask the tokens that overlap
 * the n_sp spans (byte ranges of text, in order; adjusted in place when the
 * tokenizer's normalizer changes lengths). */
whale_code whale_chat_encode_spans(whale_tokenizer *tok, const char *text, size_t len, whale_chat_span *sp,
                                  int n_sp, int32_t **ids, uint8_t **loss_mask, int *n_ids, whale_err *err);

/* End-of-turn strings generation stops at, NULL-terminated: DeepSeek
 * "<｜end▁of▁sentence｜>"; ChatML "<|im_end|>", "<|endoftext|>" (Qwen2.5's
 * generation_config stops at both); raw none (the model's EOS only). */
const char *const *whale_chat_stop_strings(whale_chat_format fmt);
/* Their ids in tok (strings that are not one token are left out); at most
 * cap written, returns how many there are. Add the model's eos ids too. */
int whale_chat_stop_ids(const whale_tokenizer *tok, whale_chat_format fmt, int32_t *ids, int cap);

/* Messages from JSON: an array of {"role", "content"} objects, or an object
 * holding one under "messages" (one line of an SFT .jsonl file). content
 * must be a string. Non-empty "tool_calls", "function_call" or
 * "reasoning_content" are refused (the native templates do not render them);
 * other fields are ignored. *msgs is one malloc'd block (strings included):
 * free it with free(). */
whale_code whale_chat_parse_json(const char *json, size_t len, whale_chat_message **msgs, int *n,
                                 whale_err *err);

/* ------------------------------------------------------------ templates */

/* A chat template as chat, sft, chat-eval and chat-template use it: the
 * model folder's own Jinja template (rendered by the project's Jinja
 * renderer, see docs/chat-templates.md), a Jinja file, or one of the
 * native formats above. */
typedef struct whale_chat_template whale_chat_template;
struct cJSON;

/* choice NULL or "": the folder's own template — dir/chat_template.jinja,
 * else tokenizer_config.json's "chat_template" (a string, or the "default"
 * of a list of {name, template}) — and when the folder has none, the raw
 * format of nanowhale's chat.py with a notice (whale_chat_template_notice).
 * "deepseek", "chatml", "raw": the native formats. Anything else is a path
 * to a Jinja template file. The folder's tokenizer_config.json gives the
 * special tokens the template sees (bos_token, eos_token, ...), as
 * transformers passes them. model_dir may name a file inside the folder. */
whale_code whale_chat_template_load(const char *model_dir, const char *choice, whale_chat_template **out,
                                    whale_err *err);
/* A native format (no folder). */
whale_code whale_chat_template_native(whale_chat_format fmt, whale_chat_template **out, whale_err *err);
void whale_chat_template_free(whale_chat_template *t);
/* "deepseek" / "chatml" / "raw", or where the Jinja template came from
 * ("MODEL/chat_template.jinja", "MODEL/tokenizer_config.json", a file). */
const char *whale_chat_template_name(const whale_chat_template *t);
/* One line to show the user (the raw fallback was chosen), or NULL. */
const char *whale_chat_template_notice(const whale_chat_template *t);
/* The Jinja source of a template (NULL for a native format). */
const char *whale_chat_template_source(const whale_chat_template *t);

/* apply_chat_template(messages, tools=tools, add_generation_prompt=...,
 * **kwargs, tokenize=False): messages is a JSON array of message objects
 * (any fields the template reads: content, tool_calls, reasoning_content,
 * ...), tools a JSON array or NULL, kwargs a JSON object of extra template
 * variables (enable_thinking, ...) or NULL. *text is malloc'd. */
whale_code whale_chat_template_apply(const whale_chat_template *t, const struct cJSON *messages,
                                     const struct cJSON *tools, const struct cJSON *kwargs,
                                     int add_generation_prompt, char **text, size_t *len, whale_err *err);

/* whale_chat_encode through t. For a Jinja template the loss mask covers
 * each assistant message's rendering, found as transformers' and ms-swift's
 * rule has it: the text between the conversation before the message
 * rendered with the generation prompt and the conversation up to the
 * message rendered without it — its content and end-of-turn token, without
 * the whitespace the template puts after them. Refused for the mask (never
 * trained on the wrong tokens): a template that renders earlier messages
 * differently once later ones follow (those renders are then not prefixes
 * of the whole; Qwen3 drops earlier thinking), and one that ignores
 * add_generation_prompt (where a reply ends cannot be told). */
/* The rendering (add_generation_prompt as given) and, if spans is not NULL,
 * the byte span each assistant message is trained on, as
 * whale_chat_template_encode masks it (for a native format as
 * whale_chat_render; bos_token NULL: the folder's). Free both with free(). */
whale_code whale_chat_template_spans(const whale_chat_template *t, const whale_chat_message *msgs, int n,
                                     int add_generation_prompt, const char *bos_token, char **text, size_t *len,
                                     whale_chat_span **spans, int *n_spans, whale_err *err);

/* The same for a JSON messages array (any fields: tool_calls, tool
 * messages, reasoning_content, ...) and tools (JSON array or NULL); a
 * native format refuses tools and tool calls. */
whale_code whale_chat_template_spans_json(const whale_chat_template *t, const struct cJSON *messages,
                                          const struct cJSON *tools, int add_generation_prompt, const char *bos_token,
                                          char **text, size_t *len, whale_chat_span **spans, int *n_spans,
                                          whale_err *err);

whale_code whale_chat_template_encode(whale_tokenizer *tok, const whale_chat_template *t,
                                      const whale_chat_message *msgs, int n, int add_generation_prompt,
                                      int32_t **ids, uint8_t **loss_mask, int *n_ids, whale_err *err);

/* Ids generation stops at (besides the model's EOS): the native format's,
 * or for a Jinja template its eos_token and the known end-of-turn tokens
 * it contains (<|im_end|> with <|endoftext|>, <|eot_id|>, <|eom_id|>,
 * <end_of_turn>, <｜end▁of▁sentence｜>, <|end|>, <|return|>, <|call|>) that
 * are single tokens of tok. At most cap written; returns how many. */
int whale_chat_template_stop_ids(const whale_tokenizer *tok, const whale_chat_template *t, int32_t *ids, int cap);

/* A model's reply as OpenAI's assistant message (a new cJSON object, free
 * with cJSON_Delete): {"role": "assistant", "content": text,
 * "tool_calls": [{"id": "call_N", "type": "function", "function": {"name",
 * "arguments": a JSON string}}]} when the reply holds tool calls in a known
 * format — Hermes / Qwen2.5 blocks `<tool_call>{"name": …, "arguments":
 * …}</tool_call>` (one or more, after optional text, which becomes the
 * content, null when empty), or Llama 3.1's reply that is one JSON object
 * {"name", "parameters"} (after an optional <|python_tag|>). Malformed
 * calls (invalid JSON, no name, an unclosed tag, text after the calls) are
 * not calls: the message is then the whole reply as content, no tool_calls. */
whale_code whale_chat_parse_tool_calls(const char *reply, size_t len, struct cJSON **message, whale_err *err);

#ifdef __cplusplus
}
#endif
#endif
