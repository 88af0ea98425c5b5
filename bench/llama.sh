#!/usr/bin/env bash
# whale against llama.cpp on the same weights: a random Qwen2.5-0.5B-shaped
# model (`whale init --preset qwen2.5-0.5b`, Qwen's tokenizer) exported by
# `whale export --format gguf` in f32, bf16 and q8_0, and run by
#   - whale: `whale bench -m DIR --dtype fp32|bf16|int8` (the safetensors
#     folder, converted on load);
#   - llama.cpp: build/bench_llama on the GGUF of the matching type (F32,
#     BF16, Q8_0), npm's prebuilt libllama (tests/gguf, scripts/setup.sh).
# Prefill: 512 tokens in one call, the last token's logits. Decode: 64
# tokens one by one after 128 in the cache. Every measurement is a fresh
# process reporting its best of REPS; the rounds alternate engines and
# types (whale fp32, llama.cpp F32, whale bf16, ...) so that a slow spell of
# the machine hits all alike, and the medians over rounds are printed with
# whale's ratio to llama.cpp (and the median of the per-round ratios).
#
#   bench/llama.sh [ROUNDS (3)] [THREADS (2)] [WHAT ("prefill decode")] [PAIRS ("fp32:f32 bf16:bf16 int8:q8_0")]
#
# The model (2 GB) and its GGUF files (3.5 GB) are made once in
# $LLAMA_BENCH_DIR (default build/bench-llama) and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3} THREADS=${2:-2} WHATS=${3:-prefill decode} PAIRS=${4:-fp32:f32 bf16:bf16 int8:q8_0}
WHALE=${WHALE:-build/whale} LLAMA=${LLAMA:-build/bench_llama} REPS=${REPS:-3}
DIR=${LLAMA_BENCH_DIR:-build/bench-llama}
BINS=tests/gguf/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
TOK=${WHALE_TOKENIZERS:-.cache/tokenizers}/qwen3
for f in "$WHALE" "$LLAMA" "$TOK/tokenizer.json"; do
    [ -e "$f" ] || { echo "llama.sh: $f missing: run scripts/setup.sh" >&2; exit 1; }
done
[ -d "$BINS" ] || { echo "llama.sh: $BINS missing: run scripts/setup.sh" >&2; exit 1; }
mkdir -p "$DIR"
if [ ! -s "$DIR/model/model.safetensors" ]; then
    "$WHALE" init --preset qwen2.5-0.5b --out "$DIR/model.tmp" --tokenizer "$TOK" >/dev/null 2>&1
    mv "$DIR/model.tmp" "$DIR/model"
fi
for pair in $PAIRS; do
    g=${pair#*:}
    [ -s "$DIR/model-$g.gguf" ] || "$WHALE" export -m "$DIR/model" --format gguf --dtype "$g" \
        --out "$DIR/model-$g.gguf" --quiet
done

OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
field() { sed -n "s/.*\"$1\": \"*\([^,\"}]*\).*/\1/p"; }
for round in $(seq "$ROUNDS"); do
    for what in $WHATS; do
        if [ "$what" = decode ]; then wargs=(--context 128 --tokens 64) largs=(128 64); else wargs=() largs=(512); fi
        for pair in $PAIRS; do
            d=${pair%%:*} g=${pair#*:}
            w=$("$WHALE" bench -m "$DIR/model" --what "$what" --dtype "$d" --threads "$THREADS" --reps "$REPS" \
                "${wargs[@]}" 2>/dev/null)
            l=$("$LLAMA" "$BINS" "$DIR/model-$g.gguf" "$what" "$THREADS" "$REPS" "${largs[@]}")
            wt=$(field tokens_per_s <<<"$w") lt=$(field tokens_per_s <<<"$l")
            echo "round $round $what whale $d $wt tokens/s, llama.cpp $g $lt tokens/s" \
                "(tier $(field isa <<<"$w"), ggml-cpu-$(field cpu_variant <<<"$l"), load $(cut -d' ' -f1 /proc/loadavg))"
            echo "$round $what $d $g $wt $lt" >>"$OUT"
        done
    done
done
echo "processor: $(field cpu <<<"$w"), $THREADS threads, best of $REPS reps per run"
awk '
function median(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ key = $2 " " $3 " " $4; if (!(key in n)) order[++rows] = key; i = ++n[key]; w[key, i] = $5; l[key, i] = $6 }
END {
    for (r = 1; r <= rows; r++) {
        key = order[r]; split(key, k, " ")
        for (i = 1; i <= n[key]; i++) { a[i] = w[key, i]; b[i] = l[key, i]; q[i] = w[key, i] / l[key, i] }
        mw = median(a, n[key]); ml = median(b, n[key])
        printf "%-7s whale %-4s median %8.1f tokens/s   llama.cpp %-4s %8.1f   x%.2f (median of per-round ratios x%.2f)\n",
               k[1], k[2], mw, k[3], ml, mw / ml, median(q, n[key])
    }
}' "$OUT"
