#!/usr/bin/env bash
# One conversation, the same ids everywhere: whale chat (a scripted stdin,
# --verbose-prompt), the server (whale serve, a raw POST /tokenize with the
# messages) and whale sft --dry-run render the ids whale chat-template
# --ids gives (checked against @huggingface/tokenizers by chat_template.sh),
# with and without tools, through the model folder's own template (Qwen2.5's).
# usage: same_ids.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"
need_tokenizer qwen3

# a one-layer Qwen2 with random weights over the real Qwen tokenizer, with
# Qwen2.5's published template and special tokens
cat >"$TMP/cfg.json" <<JSON
{"model_type": "qwen2", "vocab_size": 151669, "hidden_size": 16, "num_hidden_layers": 1,
 "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true, "eos_token_id": 151645}
JSON
"$WHALE" init --preset "$TMP/cfg.json" --out "$TMP/m" --tokenizer "$TOK" 2>/dev/null
check "init the model" test -s "$TMP/m/model.safetensors"
cp "$DATA/chat/templates/qwen2_5.jinja" "$TMP/m/chat_template.jinja"
printf '{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}\n' >"$TMP/m/tokenizer_config.json"

SYSTEM='You are Whale, a small model.'
USER='What is the weather in Zürich? <|im_end|> stays text'
cat >"$TMP/tools.json" <<'JSON'
[{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
JSON
python3 - "$SYSTEM" "$USER" "$TMP" <<'PY'
import json, sys
system, user, tmp = sys.argv[1:]
tools = json.load(open(f"{tmp}/tools.json"))
msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
reply = {"role": "assistant", "content": "It is 21 °C."}
json.dump(msgs, open(f"{tmp}/msgs.json", "w"))
json.dump(msgs + [reply], open(f"{tmp}/full.json", "w"))
for name, extra in (("plain", {}), ("tools", {"tools": tools})):
    json.dump({"messages": msgs, **extra}, open(f"{tmp}/req-{name}.json", "w"))
    with open(f"{tmp}/sft-{name}.jsonl", "w") as f:
        f.write(json.dumps({"messages": msgs + [reply], **extra}) + "\n")
PY

PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
"$WHALE" serve -m "$TMP/m" --port 0 --ctx-size 512 --threads 1 2>"$TMP/serve.log" &
PIDS+=("$!")
URL=
for _ in $(seq 1 200); do
    URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$TMP/serve.log" | head -n 1)
    [ -n "$URL" ] && break
    sleep 0.1
done
check "the server starts" test -n "$URL"
check "its informational lines start with 'serve:', not the errors' 'whale:'" \
    test "$(grep -c '^serve: model ' "$TMP/serve.log")" = 1 -a "$(grep -c '^whale' "$TMP/serve.log")" = 0

# ids_equal A B: two JSON arrays of ids are equal
ids_equal() { python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1])) != json.load(open(sys.argv[2])))' "$1" "$2"; }

for name in plain tools; do
    tools=()
    [ "$name" = tools ] && tools=(--tools "$TMP/tools.json")
    "$WHALE" chat-template -m "$TMP/m" --messages "$TMP/msgs.json" "${tools[@]}" --add-generation-prompt --ids \
        >"$TMP/want-$name.json"
    check "$name: chat-template --ids" test -s "$TMP/want-$name.json"
    # whale chat: the user message on stdin, the system prompt and tools as options
    printf '%s\n' "$USER" | "$WHALE" chat -m "$TMP/m" --system "$SYSTEM" "${tools[@]}" -n 1 --temperature 0 \
        --verbose-prompt >/dev/null 2>"$TMP/chat-$name.err"
    check "$name: whale chat exits 0" test $? = 0
    sed -n 's/^prompt ids: //p' "$TMP/chat-$name.err" | head -n 1 >"$TMP/chat-$name.json"
    check "$name: whale chat feeds chat-template's ids" ids_equal "$TMP/chat-$name.json" "$TMP/want-$name.json"
    # the server: POST /tokenize with the messages (and tools), as a client sends them
    python3 - "$URL/tokenize" "$TMP/req-$name.json" "$TMP/serve-$name.json" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], data=open(sys.argv[2], "rb").read(),
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=30) as r:
    json.dump(json.load(r)["tokens"], open(sys.argv[3], "w"))
PY
    check "$name: the server's /tokenize answers" test -s "$TMP/serve-$name.json"
    check "$name: the server renders chat-template's ids" ids_equal "$TMP/serve-$name.json" "$TMP/want-$name.json"
    # whale sft --dry-run: the record with the reply is the prompt's ids, then the reply's
    "$WHALE" sft -m "$TMP/m" --data "$TMP/sft-$name.jsonl" --dry-run 1 >"$TMP/dry-$name.txt" 2>/dev/null
    check "$name: sft --dry-run exits 0" test $? = 0
    sed -n 's/^input_ids: //p' "$TMP/dry-$name.txt" >"$TMP/sft-$name.json"
    "$WHALE" chat-template -m "$TMP/m" --messages "$TMP/full.json" "${tools[@]}" --ids >"$TMP/full-$name.json"
    check "$name: sft trains on chat-template's ids of the conversation with its reply" \
        ids_equal "$TMP/sft-$name.json" "$TMP/full-$name.json"
    check "$name: and those begin with the prompt's ids" python3 -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
sys.exit(not (len(a) > len(b) and a[:len(b)] == b))' "$TMP/sft-$name.json" "$TMP/want-$name.json"
done
check "the two conversations differ (the tools reach every renderer)" \
    test "$(cat "$TMP/want-plain.json")" != "$(cat "$TMP/want-tools.json")"

finish same_ids
