#!/usr/bin/env bash
# whale chat-template: the rendered text and ids equal the goldens of
# @huggingface/jinja / @huggingface/tokenizers (tests/data/chat), extra
# template variables, the fallback of a folder without a template (also with
# nanowhale-100m's published tokenizer_config.json), errors;
# and whale sft --dry-run trains on the same rendering.
# usage: chat_template.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"
need_tokenizer deepseek_v3
DSV3=$TOK
need_tokenizer qwen3

# a Qwen2.5 folder with only tokenizer files: no weights needed
mkdir "$TMP/q"
cp "$TOK/tokenizer.json" "$TMP/q/"
cp "$DATA/chat/templates/qwen2_5.jinja" "$TMP/q/chat_template.jinja"
printf '{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}\n' >"$TMP/q/tokenizer_config.json"

# golden CASE FIELD OUT: one field of a golden case (JSON, or the raw text)
golden() {
    python3 - "$DATA/chat/golden-jinja-$1.json" "$2" "$3" "$4" <<'PY'
import json, sys
g = json.load(open(sys.argv[1], encoding="utf-8"))
case = next(c for c in g["cases"] if c["name"] == sys.argv[2])
v = case.get(sys.argv[3])
with open(sys.argv[4], "w", encoding="utf-8", newline="") as f:
    f.write(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
PY
}

golden qwen2_5 tool_calls_and_results messages "$TMP/msgs.json"
golden qwen2_5 tool_calls_and_results tools "$TMP/tools.json"
golden qwen2_5 tool_calls_and_results text "$TMP/want.txt"
"$WHALE" chat-template -m "$TMP/q" --messages "$TMP/msgs.json" --tools "$TMP/tools.json" --add-generation-prompt \
    >"$TMP/got.txt" 2>"$TMP/err"
check "tools, tool calls and results: exit 0" test $? = 0
check "tools, tool calls and results: the text is @huggingface/jinja's, byte for byte" cmp -s "$TMP/got.txt" "$TMP/want.txt"
check "nothing on stderr" test ! -s "$TMP/err"
golden qwen2_5 tool_calls_and_results ids "$TMP/want-ids.json"
"$WHALE" chat-template -m "$TMP/q" --messages "$TMP/msgs.json" --tools "$TMP/tools.json" --add-generation-prompt --ids \
    >"$TMP/got-ids.json"
check "--ids: @huggingface/tokenizers' ids" python3 -c '
import json, sys
sys.exit(json.load(open(sys.argv[1])) != json.load(open(sys.argv[2])))' "$TMP/got-ids.json" "$TMP/want-ids.json"
# an object with "messages" and "tools" (an SFT record) works as well
python3 -c 'import json,sys; json.dump({"messages": json.load(open(sys.argv[1])), "tools": json.load(open(sys.argv[2]))}, open(sys.argv[3], "w"))' \
    "$TMP/msgs.json" "$TMP/tools.json" "$TMP/record.json"
"$WHALE" chat-template -m "$TMP/q" --messages "$TMP/record.json" --add-generation-prompt >"$TMP/got2.txt"
check "a record with messages and tools renders the same" cmp -s "$TMP/got2.txt" "$TMP/want.txt"

# --kwargs: Qwen3's enable_thinking
cp "$DATA/chat/templates/qwen3.jinja" "$TMP/q/chat_template.jinja"
golden qwen3 thinking_disabled messages "$TMP/msgs.json"
golden qwen3 thinking_disabled text "$TMP/want.txt"
"$WHALE" chat-template -m "$TMP/q" --messages "$TMP/msgs.json" --add-generation-prompt \
    --kwargs '{"enable_thinking": false}' >"$TMP/got.txt"
check "--kwargs enable_thinking=false: the empty thinking block" cmp -s "$TMP/got.txt" "$TMP/want.txt"
"$WHALE" chat-template -m "$TMP/q" --messages "$TMP/msgs.json" --add-generation-prompt >"$TMP/got.txt"
check "without it, none" test "$(tail -c 22 "$TMP/got.txt" | od -c)" = "$(printf '<|im_start|>assistant\n' | od -c)"

# --chat-template: a native format or another template file
printf '[{"role": "user", "content": "Hi"}]\n' >"$TMP/hi.json"
printf '{%% for m in messages %%}[{{ m.role }}] {{ m.content | trim }}{{ eos_token }}{%% endfor %%}' >"$TMP/mine.jinja"
"$WHALE" chat-template -m "$TMP/q" --messages "$TMP/hi.json" --chat-template "$TMP/mine.jinja" >"$TMP/got.txt"
check "--chat-template FILE.jinja, with the folder's special tokens" test "$(cat "$TMP/got.txt")" = "[user] Hi<|im_end|>"
"$WHALE" chat-template -m "$TMP/q" --messages "$TMP/hi.json" --chat-template chatml --add-generation-prompt >"$TMP/got.txt"
check "--chat-template chatml (native)" grep -q "You are Qwen" "$TMP/got.txt"

# a folder without a template: nanowhale's raw fallback, with a one-line notice
mkdir "$TMP/none"
cp "$TOK/tokenizer.json" "$TMP/none/"
"$WHALE" chat-template -m "$TMP/none" --messages "$TMP/hi.json" --add-generation-prompt >"$TMP/got.txt" 2>"$TMP/err"
check "no template: the raw format" test "$(cat "$TMP/got.txt")" = "$(printf 'user: Hi\nassistant:')"
check "no template: one notice line naming the fallback" \
    test "$(wc -l <"$TMP/err")" = 1 -a "$(grep -c "chat.py fallback" "$TMP/err")" = 1

# nanowhale-100m's published tokenizer_config.json (tests/data/real) has no
# chat_template: chat-template and sft --dry-run fall back to the named raw
# format, with one notice line, and render the same ids
mkdir "$TMP/nw"
cp "$DSV3/tokenizer.json" "$TMP/nw/"
cp "$DATA/real/nanowhale-100m-tokenizer_config.json" "$TMP/nw/tokenizer_config.json"
"$WHALE" chat-template -m "$TMP/nw" --messages "$TMP/hi.json" --add-generation-prompt >"$TMP/got.txt" 2>"$TMP/err"
check "nanowhale's real files: exit 0" test $? = 0
check "nanowhale's real files: the raw format" test "$(cat "$TMP/got.txt")" = "$(printf 'user: Hi\nassistant:')"
check "nanowhale's real files: one notice line naming the fallback" \
    test "$(wc -l <"$TMP/err")" = 1 -a "$(grep -c "^chat-template: .*nw has no chat template: using nanowhale's chat.py fallback" "$TMP/err")" = 1
printf '{"messages": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Whale."}]}\n' \
    >"$TMP/nw.jsonl"
"$WHALE" sft -m "$TMP/nw" --data "$TMP/nw.jsonl" --dry-run 1 >"$TMP/dry.txt" 2>"$TMP/err"
check "nanowhale's real files: sft --dry-run exits 0" test $? = 0
check "... with the same one notice line" \
    test "$(wc -l <"$TMP/err")" = 1 -a "$(grep -c "^sft: .*nw has no chat template: using nanowhale's chat.py fallback" "$TMP/err")" = 1
check "... names the raw format" grep -q '"template": "raw"' "$TMP/dry.txt"
check "... trains on the reply, after \"assistant:\"" grep -qxF 'assistant:[[ I am Whale.]]' "$TMP/dry.txt"
printf '[{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Whale."}]' >"$TMP/nw.json"
"$WHALE" chat-template -m "$TMP/nw" --messages "$TMP/nw.json" --ids >"$TMP/nw-ids.json" 2>/dev/null
check "... the ids chat-template gives" grep -qxF "input_ids: $(cat "$TMP/nw-ids.json")" "$TMP/dry.txt"

# errors: one line, the project's exit statuses
printf '{{ messages | wordwrap }}' >"$TMP/bad.jinja"
expect_status 6 "bad.jinja: chat template line 1: filter 'wordwrap' is not supported" -- \
    "$WHALE" chat-template -m "$TMP/q" --messages "$TMP/hi.json" --chat-template "$TMP/bad.jinja"
printf '{%% for m in messages %%}' >"$TMP/bad.jinja"
expect_status 4 "line 1: 'for' is never closed" -- \
    "$WHALE" chat-template -m "$TMP/q" --messages "$TMP/hi.json" --chat-template "$TMP/bad.jinja"
expect_status 2 "--kwargs: expected a JSON object" -- \
    "$WHALE" chat-template -m "$TMP/q" --messages "$TMP/hi.json" --kwargs '[1]'
printf '{"role": "user"}' >"$TMP/notalist.json"
expect_status 4 "expected a JSON array of messages" -- "$WHALE" chat-template -m "$TMP/q" --messages "$TMP/notalist.json"
expect_status 2 "--messages FILE.json is required" -- "$WHALE" chat-template -m "$TMP/q"
cp "$DATA/chat/templates/gemma3.jinja" "$TMP/q/chat_template.jinja"
printf '[{"role": "assistant", "content": "first"}]' >"$TMP/alt.json"
expect_status 4 "raise_exception: Conversation roles must alternate" -- \
    "$WHALE" chat-template -m "$TMP/q" --messages "$TMP/alt.json"

# whale sft --dry-run trains on the same rendering, with the reply marked
cp "$DATA/chat/templates/qwen2_5.jinja" "$TMP/q/chat_template.jinja"
printf '{"messages": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Whale."}]}\n' \
    >"$TMP/sft.jsonl"
printf '[{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Whale."}]' >"$TMP/one.json"
"$WHALE" chat-template -m "$TMP/q" --messages "$TMP/one.json" >"$TMP/want.txt"
"$WHALE" sft -m "$TMP/q" --data "$TMP/sft.jsonl" --dry-run 1 >"$TMP/dry.txt" 2>"$TMP/err"
check "sft --dry-run: exit 0 (no weights needed)" test $? = 0
check "sft --dry-run trains on the reply and its <|im_end|>" grep -qF '[[I am Whale.<|im_end|>]]' "$TMP/dry.txt"
sed -n '2,/^{"template"/p' "$TMP/dry.txt" | sed '$d' | grep -v '^input_ids: ' | sed 's/\[\[//g; s/\]\]//g' >"$TMP/dry-text.txt"
check "sft --dry-run renders what chat-template renders" \
    test "$(cat "$TMP/dry-text.txt")" = "$(cat "$TMP/want.txt")"
check "sft --dry-run names the folder's template" grep -q '"template": ".*chat_template.jinja"' "$TMP/dry.txt"

finish chat_template
