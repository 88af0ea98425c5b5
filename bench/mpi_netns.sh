#!/usr/bin/env bash
# The gradient exchange over a network of a given speed, sent during the
# backward pass in buckets (--bucket-mb 25) or after it (--bucket-mb 0)
# (docs/distributed.md): two "hosts" on one machine — two network
# namespaces joined by a veth pair whose rate tc's token bucket limits in
# each direction — one rank of one thread in each, Open MPI over TCP between
# their addresses only. For each rate, ROUNDS rounds alternate the two modes
# on nanowhale-100m pretraining (batch 1 × 256 tokens, --grad-accum
# 2: one micro-batch per rank and step) and on LoRA r8 all-linear
# fine-tuning of it (self-cognition rows packed into 512 tokens, batch 1).
# Pretraining also runs with Open MPI's TCP progress thread (PT: --mca
# btl_tcp_progress_thread 1), which moves data between MPI calls.
# Prints seconds per step (pretraining: the steps after the first; LoRA:
# the run's mean), and rank 0's seconds in exchanges (moving data or
# waiting for the other rank) per step and share of bytes sent during the
# backward pass. The namespaces are removed whatever
# happens. Needs root, ip, tc, unshare and mpirun.
#
#   bench/mpi_netns.sh [STEPS (4)] [ROUNDS (2)] [RATES ("1gbit 10gbit")]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-4} ROUNDS=${2:-2} RATES=${3:-"1gbit 10gbit"}
WHALE=$(readlink -f "${WHALE:-build/whale}")
TOK=${WHALE_TOKENIZERS:-.cache/tokenizers}/deepseek_v3
[ "$(id -u)" = 0 ] || { echo "mpi_netns.sh: needs root (network namespaces)" >&2; exit 1; }
for t in ip tc unshare mpirun; do command -v $t >/dev/null || { echo "mpi_netns.sh: no $t" >&2; exit 1; }; done

OUT=$(mktemp -d)
A=wb-$$-a B=wb-$$-b VA=wb$$a VB=wb$$b NET=10.214.$(($$ % 250))
cleanup() {
    ip netns del "$A" 2>/dev/null || true # takes its end of the veth pair, and so the pair, with it
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add "$A" && ip netns add "$B" && ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B"
ip -n "$A" addr add $NET.1/24 dev "$VA" && ip -n "$B" addr add $NET.2/24 dev "$VB"
for ns in "$A:$VA" "$B:$VB"; do ip -n "${ns%:*}" link set "${ns#*:}" up && ip -n "${ns%:*}" link set lo up; done
# limit: each end's outgoing traffic to RATE (a token bucket of 4 ms of it)
limit() {
    local bits
    bits=$(sed -E 's/gbit$/000000000/; s/mbit$/000000/' <<<"$1")
    for ns in "$A:$VA" "$B:$VB"; do
        tc -n "${ns%:*}" qdisc replace dev "${ns#*:}" root tbf rate "$1" burst $((bits / 8 / 250)) latency 50ms
    done
}

mkdir "$OUT/hosts"
echo "$A" >"$OUT/hosts/$NET.1"
echo "$B" >"$OUT/hosts/$NET.2"
cat >"$OUT/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
ns=\$(cat "$OUT/hosts/\$1"); shift
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$ns; \$*"
AGENT
chmod +x "$OUT/agent"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
MPIRUN=(mpirun --allow-run-as-root --quiet -H $NET.1:1,$NET.2:1 --mca plm_rsh_agent "$OUT/agent" --mca btl tcp,self
        --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24 --bind-to none
        -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
in_a() { ip netns exec "$A" unshare --uts sh -c "hostname $A; exec \"\$@\"" sh "$@"; }

"$WHALE" data prepare --tokenizer "$TOK" --out "$OUT/data" --val-docs 1 README.md docs/*.md >/dev/null 2>&1
"$WHALE" init --preset nanowhale-100m --out "$OUT/base" --tokenizer "$TOK" >/dev/null 2>&1
train=(train --init nanowhale-100m --data "$OUT/data" --seq-len 256 --batch-size 1 --grad-accum 2 --max-steps "$STEPS"
       --log-every 1 --save-every 1000000 --threads 1 --quiet)
sft=(sft -m "$OUT/base" --data "$PWD/data/self_cognition.jsonl" --model-name 小鲸 "Little Whale" --model-author
     鲸鱼工坊 "Whale Works" --packing --max-length 512 --batch-size 1 --grad-accum 2 --max-steps "$STEPS"
     --logging-steps 1 --save-steps "$STEPS" --threads 1 --quiet)

# run NAME BUCKET_MB WHAT...: seconds per step; rank 0's seconds moving data or waiting per step, share
# sent in the backward. PT=1: with Open MPI's TCP progress thread (btl_tcp_progress_thread)
run() {
    local name=$1 mb=$2 log last first mca=()
    shift 2
    [ -n "${PT:-}" ] && mca=(--mca btl_tcp_progress_thread 1)
    rm -rf "${OUT:?}/$name"
    in_a "${MPIRUN[@]}" "${mca[@]}" -np 2 "$WHALE" "$@" --bucket-mb "$mb" --out "$OUT/$name" >/dev/null
    log=$OUT/$name/metrics.jsonl
    [ -f "$log" ] || log=$(echo "$OUT/$name"/v*/logging.jsonl)
    last=$(grep '"comm_s"' "$log" | tail -1)
    first=$(grep '"comm_s"' "$log" | head -1)
    f() { grep -o "\"$1\": [0-9.]*" <<<"$2" | sed 's/.*: //' || true; }
    local step early
    if [ -n "$(f elapsed_s "$last")" ]; then
        step=$(awk -v a="$(f elapsed_s "$first")" -v b="$(f elapsed_s "$last")" -v n="$STEPS" 'BEGIN { print (b - a) / (n - 1) }')
    else
        step=$(f 'train_speed(s/it)' "$last")
    fi
    early=$(f comm_bytes_in_backward "$last")
    awk -v step="$step" -v cs="$(f comm_s "$last")" -v ws="$(f wait_s "$last")" -v cb="$(f comm_bytes "$last")" \
        -v early="${early:--1}" -v n="$STEPS" \
        'BEGIN { printf "%7.2f s/step   rank 0 per step: %.2f s in exchanges, %.1f MB sent, %s of it during the backward\n",
                 step, (cs + ws) / n, cb / n / 1e6, early < 0 ? "none" : sprintf("%.0f %%", 100 * early / cb) }'
}

echo "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(getconf _NPROCESSORS_ONLN) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for rate in $RATES; do
    limit "$rate"
    for r in $(seq 1 "$ROUNDS"); do
        echo "$rate, round $r"
        for mb in 25 0; do
            printf '  nanowhale-100m --bucket-mb %-3s   ' "$mb"; run t$mb "$mb" "${train[@]}"
        done
        printf '  nanowhale-100m --bucket-mb 25 PT'; PT=1 run tp 25 "${train[@]}"
        printf '  nanowhale-100m --bucket-mb 0  PT'; PT=1 run tq 0 "${train[@]}" 
        for mb in 25 0; do
            printf '  LoRA r8        --bucket-mb %-3s   ' "$mb"; run l$mb "$mb" "${sft[@]}"
        done
    done
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
