#!/usr/bin/env bash
# Self-cognition LoRA fine-tuning, ms-swift's recipe on this engine: teach a
# pretrained nanowhale model a name and an author, then compare the base, the
# LoRA adapters and the merged model on held-out paraphrased questions.
#
#   scripts/demo-self-cognition.sh [MODEL_DIR] [NAME_ZH NAME_EN AUTHOR_ZH AUTHOR_EN]
#
# MODEL_DIR defaults to the README demo's trained model (runs/demo/run; the
# demo is run first when it is missing). Everything goes to runs/self-cognition/.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-runs/demo/run}
NAME_ZH=${2:-小鲸} NAME_EN=${3:-Little Whale} AUTHOR_ZH=${4:-鲸鱼工坊} AUTHOR_EN=${5:-Whale Works}
WHALE=${WHALE:-build/whale}
OUT=runs/self-cognition
[ -x "$WHALE" ] || scripts/setup.sh
if [ ! -s "$MODEL/model.safetensors" ]; then
    [ "$MODEL" = runs/demo/run ] || { echo "$MODEL: not a model folder" >&2; exit 1; }
    echo "== no pretrained model yet: running scripts/demo.sh first"
    scripts/demo.sh
fi
NAMES=(--model-name "$NAME_ZH" "$NAME_EN" --model-author "$AUTHOR_ZH" "$AUTHOR_EN")
rm -rf "$OUT"
mkdir -p "$OUT"

ask() { # ask LABEL WHALE_ARGS... : the two questions, each in a fresh conversation
    local label=$1
    shift
    for q in "你是谁？" "Who made you?"; do
        printf '  %-8s %s → ' "$label" "$q"
        printf '%s\n' "$q" | "$WHALE" chat "$@" --temperature 0 -n 48 2>/dev/null | head -c 300
    done
}

echo "== before: $MODEL"
ask base -m "$MODEL"

echo
echo "== LoRA fine-tuning (rank 8, alpha 32, all-linear, bf16 base, fp32 adapters)"
"$WHALE" sft -m "$MODEL" --data data/self_cognition.jsonl "${NAMES[@]}" \
    --train-type lora --lora-rank 8 --lora-alpha 32 --lora-dropout 0.05 --target-modules all-linear --dtype bf16 \
    --epochs 20 --batch-size 8 --grad-accum 1 --lr 3e-3 --logging-steps 20 --save-total-limit 1 \
    --out "$OUT/output" | tee "$OUT/sft.json"
CKPT=$(sed -n 's/.*"last_checkpoint": "\([^"]*\)".*/\1/p' "$OUT/sft.json")

echo
echo "== after: $CKPT"
ask LoRA --adapters "$CKPT"

echo
echo "== merging the adapters into the base"
"$WHALE" export --adapters "$CKPT" --merge-lora --out "$OUT/merged"

echo
echo "== held-out paraphrases (data/self_cognition_eval.jsonl): answers that name the right name / author"
score() { "$WHALE" chat-eval "$@" --data data/self_cognition_eval.jsonl "${NAMES[@]}" 2>/dev/null; }
score -m "$MODEL" --answers "$OUT/answers-base.jsonl" >"$OUT/score-base.json"
score --adapters "$CKPT" --answers "$OUT/answers-lora.jsonl" >"$OUT/score-lora.json"
score -m "$OUT/merged" --answers "$OUT/answers-merged.jsonl" >"$OUT/score-merged.json"
printf '  %-8s %s\n' base "$(cat "$OUT/score-base.json")" LoRA "$(cat "$OUT/score-lora.json")" \
    merged "$(cat "$OUT/score-merged.json")"
echo
echo "answers: $OUT/answers-*.jsonl; adapters: $CKPT; merged model: $OUT/merged"
