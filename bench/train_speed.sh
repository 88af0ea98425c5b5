#!/usr/bin/env bash
# Training speed of one model in several precisions, measured in alternation
# (fp32, bf16, fp32, bf16, ...) so that a slow spell of the machine hits every
# precision alike; each process reports its best of --reps steps. Prints
# every run, then per precision the median tokens/s and its ratio to fp32,
# and the median of the per-round ratios.
#
#   bench/train_speed.sh [PRESET_OR_MODEL_DIR (nanowhale-100m)] [ROUNDS (3)] [DTYPES ("fp32 bf16")]
#
# e.g. bench/train_speed.sh nanowhale-100m 5 "fp32 bf16 fp16"
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-nanowhale-100m} ROUNDS=${2:-3} DTYPES=${3:-fp32 bf16}
WHALE=${WHALE:-build/whale}
THREADS=${THREADS:-$(nproc)}
if [ -d "$MODEL" ]; then src=(-m "$MODEL"); else src=(--preset "$MODEL"); fi
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for round in $(seq "$ROUNDS"); do
    for dtype in $DTYPES; do
        tps=$("$WHALE" bench "${src[@]}" --what train --dtype "$dtype" --threads "$THREADS" 2>/dev/null |
              sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p')
        echo "round $round $dtype $tps tokens/s"
        echo "$round $dtype $tps" >>"$OUT"
    done
done
awk -v dtypes="$DTYPES" '
function median(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ tps[$1, $2] = $3; if ($1 > rounds) rounds = $1 }
END {
    nd = split(dtypes, d, " ")
    for (r = 1; r <= rounds; r++) base[r] = tps[r, "fp32"]
    fp32 = base[1] ? median(base, rounds) : 0
    for (i = 1; i <= nd; i++) {
        for (r = 1; r <= rounds; r++) { v[r] = tps[r, d[i]]; if (fp32) q[r] = tps[r, d[i]] / tps[r, "fp32"] }
        m = median(v, rounds)
        printf "%-5s median %7.1f tokens/s", d[i], m
        if (fp32 && d[i] != "fp32") printf "   x%.2f fp32 (median of per-round ratios x%.2f)", m / fp32, median(q, rounds)
        printf "\n"
    }
}' "$OUT"
