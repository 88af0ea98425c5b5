#!/usr/bin/env bash
# Regenerate docs/img/serve-chat.png, the chat page of `whale serve` as the
# serve test's headless Chromium sees it (tests/serve/page.mjs). The model is
# the test's tiny Qwen2 on the real Qwen tokenizer, fine-tuned here for a
# minute or two to answer "Who are you?" from the project's self-cognition set, so
# the picture shows a reply that reads. Needs scripts/setup.sh (chromium,
# playwright-core, the tokenizers) and build/whale.
#   scripts/serve-screenshot.sh [OUT.png]   (default docs/img/serve-chat.png)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/img/serve-chat.png}
WHALE=build/whale
TOK=.cache/tokenizers/qwen3
[ -s "$TOK/tokenizer.json" ] && [ -x /usr/bin/chromium ] && [ -d tests/serve/node_modules/playwright-core ] ||
    { echo "serve-screenshot: run scripts/setup.sh first" >&2; exit 1; }
TMP=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"' EXIT
cat >"$TMP/cfg.json" <<JSON
{"model_type": "qwen2", "vocab_size": 151669, "hidden_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true, "eos_token_id": 151645,
 "initializer_range": 0.3}
JSON
"$WHALE" init --preset "$TMP/cfg.json" --out "$TMP/base" --tokenizer "$TOK" 2>/dev/null
cp tests/data/chat/templates/qwen2_5.jinja "$TMP/base/chat_template.jinja" # Qwen2.5's: no thinking block
grep '"Who are you?"' data/self_cognition.jsonl >"$TMP/who.jsonl"
"$WHALE" sft -m "$TMP/base" --data "$TMP/who.jsonl" --model-name 小鲸 whale --model-author 鲸鱼工坊 "the nanowhale.c project" \
    --train-type full --max-steps 100 --batch-size 1 --grad-accum 1 --lr 3e-2 --lr-scheduler constant \
    --weight-decay 0 --save-only-model --out "$TMP/run" --quiet >/dev/null
mv "$(ls -d "$TMP"/run/v0-*/checkpoint-100)" "$TMP/whale"
"$WHALE" serve -m "$TMP/whale" --port 0 --parallel 2 --ctx-size 2048 --api-key screenshot 2>"$TMP/serve.log" &
PID=$!
URL=
for _ in $(seq 1 100); do
    URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$TMP/serve.log" | head -n 1) && [ -n "$URL" ] && break
    sleep 0.1
done
SERVE_URL=$URL SERVE_KEY=screenshot SERVE_MODEL=whale SERVE_DIR=$TMP/whale WHALE=$WHALE TMP=$TMP SERVE_PID=$PID \
    SERVE_PAGE_SYSTEM= SERVE_PAGE_QUESTION="Who are you?" SERVE_SCREENSHOT=$OUT node tests/serve/page.mjs
echo "serve-screenshot: wrote $OUT"
