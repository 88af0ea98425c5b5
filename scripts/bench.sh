#!/usr/bin/env bash
# Speed of nanowhale-100m (random weights, the published model's exact
# shapes): forward, prefill and decode against this machine's ceilings.
set -euo pipefail
cd "$(dirname "$0")/.."
WHALE=build/whale
OUT=runs/bench
mkdir -p "$OUT"
THREADS=${THREADS:-$(nproc)}

step() { printf '\n== %s\n' "$*"; }

step "whale init --preset nanowhale-100m (reference initialisation, HF layout)"
[ -f "$OUT/model/model.safetensors" ] || $WHALE init --preset nanowhale-100m --seed 42 --out "$OUT/model"
$WHALE info -m "$OUT/model"

step "whale score: loss of 2 random sequences of 64 ids (ln 129280 = 11.77 for an untrained model)"
awk 'BEGIN { srand(1); printf "["; for (b = 0; b < 2; b++) { printf "%s[", b ? "," : ""; for (i = 0; i < 64; i++) printf "%s%d", i ? "," : "", int(rand() * 129280); printf "]" } print "]" }' >"$OUT/ids.json"
$WHALE score -m "$OUT/model" --ids "$OUT/ids.json" --threads "$THREADS"

step "whale generate: 32 greedy tokens with the KV cache"
$WHALE generate -m "$OUT/model" --ids 0,15,27 -n 32 --temperature 0 --ignore-eos --threads "$THREADS"

step "whale bench: fp32, $THREADS threads"
for what in forward prefill; do
    $WHALE bench -m "$OUT/model" --what $what --threads "$THREADS" | tee -a "$OUT/bench.jsonl"
done
for ctx in 128 1024; do
    $WHALE bench -m "$OUT/model" --what decode --context $ctx --threads "$THREADS" | tee -a "$OUT/bench.jsonl"
done
echo
echo "demo: results in $OUT/ (bench.jsonl)"
