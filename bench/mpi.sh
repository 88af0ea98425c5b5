#!/usr/bin/env bash
# One machine's cores as 1 rank × T threads or T ranks × 1 thread
# (docs/distributed.md): nanowhale-100m pretraining (batch 2 × 256 tokens,
# grad-accum T) and nanowhale-100m LoRA fine-tuning (self-cognition rows
# packed into 512 tokens, batch 1, grad-accum T), alternated ROUNDS times.
# Prints tokens/s, and for the ranks the bytes rank 0 sent, its seconds
# moving data and its seconds waiting for the other rank, per step.
# ZERO=1 runs the ranks with --zero 1 (the optimizer state sharded).
#
#   [ZERO=1] bench/mpi.sh [STEPS (6)] [ROUNDS (2)] [T (2)]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-6} ROUNDS=${2:-2} T=${3:-2} ZERO=${ZERO:-0}
WHALE=${WHALE:-build/whale}
TOK=${WHALE_TOKENIZERS:-.cache/tokenizers}/deepseek_v3
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMP_WAIT_POLICY=passive
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none --quiet -x OMP_WAIT_POLICY)

"$WHALE" data prepare --tokenizer "$TOK" --out "$OUT/data" --val-docs 1 README.md docs/*.md >/dev/null 2>&1
"$WHALE" init --preset nanowhale-100m --out "$OUT/base" --tokenizer "$TOK" >/dev/null 2>&1
train=(train --init nanowhale-100m --data "$OUT/data" --seq-len 256 --batch-size 2 --grad-accum "$T"
       --max-steps "$STEPS" --log-every 1 --save-every 1000000 --quiet)
sft=(sft -m "$OUT/base" --data data/self_cognition.jsonl --model-name 小鲸 "Little Whale" --model-author 鲸鱼工坊
     "Whale Works" --packing --max-length 512 --batch-size 1 --grad-accum "$T" --max-steps "$STEPS"
     --logging-steps 1 --save-steps "$STEPS" --quiet)

# run NAME RANKS THREADS WHAT...: tokens/s of the run; exchanges per step
run() {
    local name=$1 ranks=$2 threads=$3
    shift 3
    rm -rf "$OUT/$name"
    if [ "$ranks" = 1 ]; then
        OMP_NUM_THREADS=$threads "$WHALE" "$@" --threads "$threads" --out "$OUT/$name" >/dev/null
    else
        "${MPIRUN[@]}" -x OMP_NUM_THREADS="$threads" -np "$ranks" "$WHALE" "$@" --threads "$threads" \
            --zero "$ZERO" --out "$OUT/$name" >/dev/null
    fi
    local log
    log=$OUT/$name/metrics.jsonl
    [ -f "$log" ] || log=$(echo "$OUT/$name"/v*/logging.jsonl)
    local last
    last=$(grep '"tokens_per_s"' "$log" | grep -v train_runtime | tail -1)
    printf '%8.1f tok/s' "$(sed -E 's/.*"tokens_per_s": ([0-9.]+).*/\1/' <<<"$last")"
    if [ "$ranks" != 1 ]; then
        local cs ws cb
        cs=$(sed -E 's/.*"comm_s": ([0-9.]+).*/\1/' <<<"$last") ws=$(sed -E 's/.*"wait_s": ([0-9.]+).*/\1/' <<<"$last")
        cb=$(sed -E 's/.*"comm_bytes": ([0-9]+).*/\1/' <<<"$last")
        awk -v cs="$cs" -v ws="$ws" -v cb="$cb" -v n="$STEPS" 'BEGIN {
            printf "   per step (rank 0): %.1f MB sent, %.3f s moving data, %.3f s waiting", cb / n / 1e6, cs / n, ws / n }'
    fi
    echo
}

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r"
    printf '  train 1 × %d threads  ' "$T"; run t1 1 "$T" "${train[@]}"
    printf '  train %d × 1 thread   ' "$T"; run tn "$T" 1 "${train[@]}"
    printf '  lora  1 × %d threads  ' "$T"; run l1 1 "$T" "${sft[@]}"
    printf '  lora  %d × 1 thread   ' "$T"; run ln "$T" 1 "${sft[@]}"
done
