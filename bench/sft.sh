#!/usr/bin/env bash
# Fine-tuning speed and memory: LoRA (rank 8, all-linear) and full
# fine-tuning, fp32 and bf16, on the self-cognition set packed into rows of
# 512 tokens; prints tokens/s, seconds per step and peak resident memory.
#
#   bench/sft.sh MODEL_DIR [STEPS (6)] [CHAT_TEMPLATE] [RUNS (lora-bf16 lora-fp32 full-bf16 full-fp32)]
#
# e.g. bench/sft.sh models/nanowhale-100m
#      bench/sft.sh models/qwen2.5-0.5b 4 chatml "lora-bf16 lora-fp32"
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=$1 STEPS=${2:-6} TEMPLATE=${3:-} RUNS=${4:-lora-bf16 lora-fp32 full-bf16 full-fp32}
WHALE=${WHALE:-build/whale}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
args=(-m "$MODEL" --data data/self_cognition.jsonl --model-name 小鲸 "Little Whale" --model-author 鲸鱼工坊 "Whale Works"
      --packing --max-length 512 --batch-size 1 --grad-accum 1 --max-steps "$STEPS" --logging-steps "$STEPS"
      --save-steps 1000000 --out "$OUT")
[ -n "$TEMPLATE" ] && args+=(--chat-template "$TEMPLATE")
printf '| run | tokens/s | s/step | peak RSS (MiB) | accounted (MiB) | trainable |\n| --- | --- | --- | --- | --- | --- |\n'
for run in $RUNS; do
    type=${run%-*} dtype=${run#*-}
    if ! "$WHALE" sft "${args[@]}" --train-type "$type" --dtype "$dtype" >"$OUT/res" 2>"$OUT/err"; then
        printf '| %s | %s |\n' "$run" "$(tail -1 "$OUT/err")"
        continue
    fi
    tps=$(sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' "$OUT/res")
    spi=$(grep -o '"train_speed(s/it)": [0-9.]*' "$OUT"/v*/logging.jsonl | tail -1 | sed 's/.*: //')
    peak=$(sed -n 's/^sft: peak resident memory \([0-9.]*\) MiB/\1/p' "$OUT/err")
    est=$(sed -n 's/^  total *\([0-9.]*\) MiB.*/\1/p' "$OUT/err" | head -1)
    trainable=$(sed -n 's/.*"trainable_params": \([0-9]*\).*/\1/p' "$OUT/res")
    printf '| %s | %s | %s | %s | %s | %s |\n' "$run" "$tps" "$spi" "$peak" "$est" "$trainable"
    rm -rf "$OUT"/v*
done
