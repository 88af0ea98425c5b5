#!/usr/bin/env bash
# whale serve on loopback, driven by the official OpenAI client (npm
# `openai`, installed by scripts/setup.sh into tests/serve) and by raw
# requests: chat and completions whole and streamed, greedy replies equal to
# whale generate's, logprobs against whale score's logits, tool calls from a
# model fine-tuned here to make one, concurrent streams on the base and two
# LoRA adapters (made by whale sft) batched, a long prompt prefilled in chunks
# next to a running stream, --dtype, --chat-template and --host other than the
# defaults, bad, slow and hostile input, a full queue, SIGTERM draining, and
# the chat page in headless Chromium (playwright-core).
# usage: serve.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"
need_tokenizer qwen3
SERVE_JS=$(cd "$(dirname "$0")/../serve" && pwd)
if [ ! -f "$SERVE_JS/node_modules/openai/package.json" ] || ! command -v node >/dev/null; then
    echo "serve.sh: node and $SERVE_JS/node_modules/openai are needed: run scripts/setup.sh" >&2
    exit 1
fi

# a two-layer Qwen2 with random weights (initializer_range 0.3: replies that
# differ from prompt to prompt) over the real Qwen tokenizer
cat >"$TMP/cfg.json" <<JSON
{"model_type": "qwen2", "vocab_size": 151669, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true, "eos_token_id": 151645,
 "initializer_range": 0.3}
JSON
"$WHALE" init --preset "$TMP/cfg.json" --out "$TMP/m" --tokenizer "$TOK" 2>/dev/null
check "init the model" test -s "$TMP/m/model.safetensors"

# two LoRA adapters trained by whale sft (a few steps at a high rate, so
# that they change the replies): every Linear at rank 4, and q/v/down_proj
# at rank 8
SC=$DATA/../../data/self_cognition.jsonl
sft_adapter() { # sft_adapter OUT ARGS...
    local out=$1
    shift
    "$WHALE" sft -m "$TMP/m" --data "$SC#16" --model-name 小鲸 "Little Whale" --model-author 鲸鱼工坊 "Whale Works" \
        --lora-dropout 0 --max-steps 3 --batch-size 4 --grad-accum 1 --lr 0.05 --save-steps 3 --out "$TMP/$out" \
        "$@" >/dev/null 2>&1
    ls -d "$TMP/$out"/v0-*/checkpoint-3
}
A1=$(sft_adapter sft1 --lora-rank 4 --lora-alpha 16)
A2=$(sft_adapter sft2 --lora-rank 8 --lora-alpha 32 --target-modules q_proj v_proj down_proj --seed 7)
check "whale sft made two adapters" test -s "$A1/adapter_model.safetensors" -a -s "$A2/adapter_model.safetensors"

# a model that makes a tool call: a 400-id tokenizer trained on the record and
# Qwen2.5's template (its <tool_call> tags added tokens that are not special,
# as in Qwen's tokenizer), a two-layer Qwen2 on it fine-tuned for 40 steps to
# answer the weather question with get_weather {"city": "Paris"}
TEMPLATE=$DATA/chat/templates/qwen2_5.jinja
cat >"$TMP/tools.jsonl" <<'JSON'
{"messages": [{"role": "user", "content": "What is the weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]}
JSON
cp "$TMP/tools.jsonl" "$TMP/tools-corpus.txt"
"$WHALE" tokenizer train --vocab-size 400 --special '<|im_start|>' --special '<|im_end|>' --special '<tool_call>' \
    --special '</tool_call>' --out "$TMP/tools-tok" --quiet "$TMP/tools-corpus.txt" "$TEMPLATE" 2>/dev/null
node -e 'const fs = require("fs");
for (const f of process.argv.slice(1)) {
  const j = JSON.parse(fs.readFileSync(f, "utf8"));
  for (const t of j.added_tokens ?? Object.values(j.added_tokens_decoder)) if (/tool_call/.test(t.content)) t.special = false;
  fs.writeFileSync(f, JSON.stringify(j));
}' "$TMP/tools-tok/tokenizer.json" "$TMP/tools-tok/tokenizer_config.json"
IM_END=$("$WHALE" tokenize -m "$TMP/tools-tok" '<|im_end|>')
sed -e 's/"vocab_size": 151669/"vocab_size": 400/' -e "s/\"eos_token_id\": 151645/\"eos_token_id\": $IM_END/" \
    "$TMP/cfg.json" >"$TMP/tools-cfg.json"
"$WHALE" init --preset "$TMP/tools-cfg.json" --out "$TMP/tools-base" --tokenizer "$TMP/tools-tok" 2>/dev/null
cp "$TEMPLATE" "$TMP/tools-base/chat_template.jinja"
"$WHALE" sft -m "$TMP/tools-base" --data "$TMP/tools.jsonl" --train-type full --max-steps 40 --batch-size 1 \
    --grad-accum 1 --lr 3e-2 --lr-scheduler constant --weight-decay 0 --save-only-model --out "$TMP/tools-run" \
    --threads 2 --quiet >/dev/null 2>&1
mv "$(ls -d "$TMP"/tools-run/v0-*/checkpoint-40)" "$TMP/tools"
check "fine-tune the tool-call model" test -s "$TMP/tools/model.safetensors"
# whale chat parses the same model's reply into OpenAI's tool_calls (one JSON line)
node -e 'const fs = require("fs");
fs.writeFileSync(process.argv[2], JSON.stringify(JSON.parse(fs.readFileSync(process.argv[1], "utf8")).tools));' \
    "$TMP/tools.jsonl" "$TMP/tools-defs.json"
echo 'What is the weather in Paris?' | "$WHALE" chat -m "$TMP/tools" --tools "$TMP/tools-defs.json" --temperature 0 \
    -n 64 --threads 2 >"$TMP/chat-tools.out" 2>"$TMP/chat-tools.err"
check "whale chat --tools prints the reply's tool call as OpenAI's tool_calls ($(head -c 300 "$TMP/chat-tools.out"))" \
    node -e 'const fs = require("fs");
const line = fs.readFileSync(process.argv[1], "utf8").split("\n").find((l) => l.startsWith("tool_calls: "));
const calls = JSON.parse(line.slice(12));
const ok = calls.length === 1 && calls[0].type === "function" && calls[0].function.name === "get_weather" &&
  JSON.stringify(JSON.parse(calls[0].function.arguments)) === JSON.stringify({city: "Paris"}) && /^call_/.test(calls[0].id);
process.exit(ok ? 0 : 1);' "$TMP/chat-tools.out"

expect_status 2 'unknown option' -- "$WHALE" serve -m "$TMP/m" --bogus 1
expect_status 2 'expects NAME=DIR' -- "$WHALE" serve -m "$TMP/m" --adapters "$A1"
expect_status 2 'needs at least one value' -- "$WHALE" serve -m "$TMP/m" --adapters --port 0
expect_status 2 'given twice.*base' -- "$WHALE" serve -m "$TMP/m" --port 0 --adapters "m=$A1"
expect_status 2 'given twice' -- "$WHALE" serve -m "$TMP/m" --port 0 --adapters "a=$A1" "a=$A2"
expect_status 2 'must be 1 to' -- "$WHALE" serve -m "$TMP/m" --port 0 --adapters "a b=$A1"
expect_status 3 'adapter_config.json' -- "$WHALE" serve -m "$TMP/m" --port 0 --adapters "a=$TMP/nowhere"
expect_status 2 '--drain-timeout' -- "$WHALE" serve -m "$TMP/m" --drain-timeout -1
expect_status 2 '--parallel expects an integer' -- "$WHALE" serve -m "$TMP/m" --parallel 0
expect_status 2 '--stream-interval expects an integer' -- "$WHALE" serve -m "$TMP/m" --stream-interval 0
expect_status 5 'exceeds the model' -- "$WHALE" serve -m "$TMP/m" --ctx-size 100000 --port 0
printf '' >"$TMP/empty-key"
expect_status 4 'API key file is empty' -- "$WHALE" serve -m "$TMP/m" --api-key-file "$TMP/empty-key"
expect_status 2 '--host 127\.0\.0\.256' -- "$WHALE" serve -m "$TMP/m" --host 127.0.0.256 --port 0

PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT

# start_server LOG -m DIR ARGS...: runs it in the background, sets PID and URL
start_server() {
    local log=$1
    shift
    "$WHALE" serve --port 0 "$@" 2>"$log" &
    PID=$!
    PIDS+=("$PID")
    URL=
    for _ in $(seq 1 200); do
        URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -n 1)
        [ -n "$URL" ] && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "serve.sh: the server did not start: $(cat "$log")" >&2
    return 1
}

printf 'sekret-key\n' >"$TMP/key"
start_server "$TMP/serve.log" -m "$TMP/m" --parallel 8 --ctx-size 256 --batch 64 --api-key-file "$TMP/key" --max-body 1048576 \
    --threads 2 --adapters "sql=$A1" --lora-modules "poet=$A2" || exit 1
PID1=$PID URL1=$URL
start_server "$TMP/serve2.log" -m "$TMP/m" --parallel 1 --queue 1 --ctx-size 2048 --api-key sekret-key --timeout 3 --threads 1 \
    --drain-timeout 600 ||
    exit 1
PID2=$PID URL2=$URL
start_server "$TMP/serve3.log" -m "$TMP/tools" --parallel 2 --ctx-size 512 --api-key sekret-key --threads 2 || exit 1
PID3=$PID URL3=$URL
start_server "$TMP/serve4.log" -m "$TMP/m" --parallel 2 --ctx-size 2048 --api-key sekret-key --threads 2 \
    --adapters "sql=$A1" --drain-timeout 0 || exit 1
PID4=$PID URL4=$URL
# another precision and template than the folder's, the address given, a
# small batch (a long prompt takes several chunks), streamed text every 4
# tokens
start_server "$TMP/serve5.log" -m "$TMP/m" --host 127.0.0.1 --dtype bf16 --chat-template "$TEMPLATE" --parallel 2 \
    --ctx-size 1024 --batch 32 --api-key sekret-key --threads 2 --stream-interval 4 || exit 1
PID5=$PID URL5=$URL
check "the log names --dtype and --chat-template" grep -q '^serve: model "m" (BF16, .*/qwen2_5.jinja template)' "$TMP/serve5.log"

export SERVE_URL=$URL1 SERVE_KEY=sekret-key SERVE_MODEL=m SERVE_DIR=$TMP/m WHALE TMP SERVE_PID=$PID1
export SERVE_URL2=$URL2 SERVE_PID2=$PID2 SERVE_TOOLS_URL=$URL3 SERVE_TOOLS_DIR=$TMP/tools SERVE_PAGE_URL=$URL4 SERVE_PID4=$PID4 SERVE_PAGE_ADAPTERS=1 SERVE_ADAPTERS="sql=$A1,poet=$A2"
export SERVE_OPT_URL=$URL5 SERVE_OPT_BATCH=32 SERVE_OPT_DTYPE=bf16 SERVE_OPT_TEMPLATE=$TEMPLATE SERVE_OPT_INTERVAL=4
scripts=(client.mjs logprobs.mjs tools.mjs "concurrent.mjs 16" prefill.mjs options.mjs hostile.mjs)
# the page in headless Chromium: scripts/setup.sh installs Debian's chromium and
# playwright-core; without both (and setup.sh not run) the page test is skipped,
# never in CI and never after setup.sh
if [ -x /usr/bin/chromium ] && [ -f "$SERVE_JS/node_modules/playwright-core/package.json" ]; then
    scripts+=(page.mjs)
elif [ "${CI:-}" = true ] || cmp -s "$SERVE_JS/package-lock.json" "$SERVE_JS/node_modules/.package-lock.json.installed"; then
    echo "FAIL: /usr/bin/chromium or playwright-core is missing although scripts/setup.sh ran (or CI)" >&2
    fails=$((fails + 1))
else
    echo "serve.sh: SKIP the chat page test: /usr/bin/chromium or playwright-core is missing (run scripts/setup.sh)" >&2
fi
scripts+=(drain.mjs) # last: it stops the page server
for script in "${scripts[@]}"; do
    t=$SECONDS
    # shellcheck disable=SC2086
    node "$SERVE_JS"/$script >"$TMP/node.out" 2>&1
    st=$?
    cat "$TMP/node.out"
    echo "serve.sh: node $script took $((SECONDS - t)) s"
    check "node $script" test $st = 0
done

# hostile.mjs sent SIGTERM to the second server; give it 60 s to drain and exit
for _ in $(seq 1 600); do kill -0 "$PID2" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID2" 2>/dev/null && kill -9 "$PID2"
wait "$PID2"
check "SIGTERM: the drained server exits 0" test $? = 0
check "SIGTERM: it says it drained" grep -q 'draining' "$TMP/serve2.log"
# bench/bench_serve, the load generator of the serving benchmark, on the
# first server: the base and two adapters round robin, every token counted
BENCH_SERVE=$(dirname "$WHALE")/bench_serve
"$BENCH_SERVE" "$URL1/" m,sql,poet 8 1,3 sekret-key >"$TMP/bench.out" 2>&1 # URL/ is URL
check "bench_serve: exit 0" test $? = 0
check "bench_serve: two rounds of 8 and 24 tokens, batched, the step's phases within it" node -e 'const fs = require("fs");
const r = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
const ok = r.length === 2 && r[0].concurrency === 1 && r[0].tokens === 8 && r[1].concurrency === 3 &&
  r[1].tokens === 24 && r[1].batch_sequences_max > 1 && r.every((x) => x.step_ms > 0 && x.forward_ms > 0 &&
  x.sampling_ms >= 0 && x.publishing_ms >= 0 && x.forward_ms + x.sampling_ms + x.publishing_ms <= x.step_ms + 0.003 &&
  Object.values(x).every((v) => v === null || (Number.isFinite(v) && v >= 0))); // a tiny model: tokens may arrive together
process.exit(ok ? 0 : 1)' "$TMP/bench.out"
expect_status 1 'HTTP 401' -- "$BENCH_SERVE" "$URL1" m 8 1 wrong-key
expect_status 1 'HTTP 404.*model' -- "$BENCH_SERVE" "$URL1" nosuchmodel 8 1 sekret-key
expect_status 1 'TOKENS' -- "$BENCH_SERVE" "$URL1" m 0 1 sekret-key
expect_status 1 'concurrencies: 1 to 256.*"x"' -- "$BENCH_SERVE" "$URL1" m 8 1,x sekret-key
expect_status 1 "Couldn't connect" -- "$BENCH_SERVE" http://127.0.0.1:1 m 8 1
node "$SERVE_JS/bench_fake.mjs" >"$TMP/fake.url" &
FAKE=$!
PIDS+=("$FAKE")
for _ in $(seq 1 100); do [ -s "$TMP/fake.url" ] && break; sleep 0.1; done
expect_status 1 'not JSON' -- "$BENCH_SERVE" "$(cat "$TMP/fake.url")" bad 8 1
expect_status 1 'an event of over 16777216 bytes' -- "$BENCH_SERVE" "$(cat "$TMP/fake.url")" big 8 1
kill "$FAKE"
kill -TERM "$PID1"
wait "$PID1"
check "SIGTERM: exit 0" test $? = 0
# drain.mjs sent SIGTERM to the fourth (--drain-timeout 0) during a stream
wait "$PID4"
check "--drain-timeout 0: exit 0" test $? = 0
check "--drain-timeout 0: it says it cancelled" grep -q 'drain timeout passed' "$TMP/serve4.log"
kill -TERM "$PID3" "$PID5"
wait "$PID3" "$PID5"
check "the servers printed no error" test "$(cat "$TMP/serve.log" "$TMP/serve5.log" | grep -c -i 'error\|sanitizer')" = 0
if [ "$fails" != 0 ]; then
    echo "--- server log:" && tail -n 40 "$TMP/serve.log"
    echo "--- second server's log:" && tail -n 20 "$TMP/serve2.log"
fi
finish serve
