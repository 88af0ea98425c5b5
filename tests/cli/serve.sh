#!/usr/bin/env bash
# whale serve on loopback, driven by the official OpenAI client (npm
# `openai`, installed by scripts/setup.sh into tests/serve) and by raw
# requests: chat and completions whole and streamed, greedy replies equal to
# whale generate's, concurrent streams on the base and two LoRA adapters
# (made by whale sft) batched, bad and hostile input, a full queue, SIGTERM
# draining.
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
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512,
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

expect_status 2 'unknown option' -- "$WHALE" serve -m "$TMP/m" --bogus 1
expect_status 2 'expects NAME=DIR' -- "$WHALE" serve -m "$TMP/m" --adapters "$A1"
expect_status 2 'needs at least one value' -- "$WHALE" serve -m "$TMP/m" --adapters --port 0
expect_status 2 'given twice.*base' -- "$WHALE" serve -m "$TMP/m" --port 0 --adapters "m=$A1"
expect_status 2 'given twice' -- "$WHALE" serve -m "$TMP/m" --port 0 --adapters "a=$A1" "a=$A2"
expect_status 2 'must be 1 to' -- "$WHALE" serve -m "$TMP/m" --port 0 --adapters "a b=$A1"
expect_status 3 'adapter_config.json' -- "$WHALE" serve -m "$TMP/m" --port 0 --adapters "a=$TMP/nowhere"
expect_status 2 '--parallel expects an integer' -- "$WHALE" serve -m "$TMP/m" --parallel 0
expect_status 5 'exceeds the model' -- "$WHALE" serve -m "$TMP/m" --ctx-size 100000 --port 0
printf '' >"$TMP/empty-key"
expect_status 4 'API key file is empty' -- "$WHALE" serve -m "$TMP/m" --api-key-file "$TMP/empty-key"

PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT

# start_server LOG ARGS...: runs it in the background, sets PID and URL
start_server() {
    local log=$1
    shift
    "$WHALE" serve -m "$TMP/m" --port 0 "$@" 2>"$log" &
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
start_server "$TMP/serve.log" --parallel 8 --ctx-size 256 --batch 64 --api-key-file "$TMP/key" --max-body 1048576 \
    --threads 2 --adapters "sql=$A1" --lora-modules "poet=$A2" || exit 1
PID1=$PID URL1=$URL
start_server "$TMP/serve2.log" --parallel 1 --queue 1 --ctx-size 256 --api-key sekret-key --timeout 3 --threads 1 ||
    exit 1
PID2=$PID URL2=$URL

export SERVE_URL=$URL1 SERVE_KEY=sekret-key SERVE_MODEL=m SERVE_DIR=$TMP/m WHALE TMP SERVE_PID=$PID1
export SERVE_URL2=$URL2 SERVE_PID2=$PID2 SERVE_ADAPTERS="sql=$A1,poet=$A2"
for script in client.mjs "concurrent.mjs 12" hostile.mjs; do
    # shellcheck disable=SC2086
    node "$SERVE_JS"/$script >"$TMP/node.out" 2>&1
    st=$?
    cat "$TMP/node.out"
    check "node $script" test $st = 0
done

# hostile.mjs sent SIGTERM to the second server; give it 30 s to drain and exit
for _ in $(seq 1 300); do kill -0 "$PID2" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID2" 2>/dev/null && kill -9 "$PID2"
wait "$PID2"
check "SIGTERM: the drained server exits 0" test $? = 0
check "SIGTERM: it says it drained" grep -q 'draining' "$TMP/serve2.log"
kill -TERM "$PID1"
wait "$PID1"
check "SIGTERM: exit 0" test $? = 0
check "the server printed no error" test "$(grep -c -i 'error\|sanitizer' "$TMP/serve.log")" = 0
if [ "$fails" != 0 ]; then
    echo "--- server log:" && tail -n 40 "$TMP/serve.log"
    echo "--- second server's log:" && tail -n 20 "$TMP/serve2.log"
fi
finish serve
