#!/usr/bin/env bash
# Speed of one model in several precisions, measured in alternation (fp32,
# bf16, ..., fp32, bf16, ...) so that a slow spell of the machine hits every
# precision alike; each process reports its best of --reps repetitions.
# Prints every run, then per precision the median tokens/s, its ratio to
# fp32 and the median of the per-round ratios; for decode also the median
# share of the bandwidth bound (`whale bench` measures the memory read rate
# in one pass right before and one right after each run, averaged).
#
#   bench/speed.sh [WHAT (train)] [PRESET_OR_MODEL_DIR (nanowhale-100m)] [ROUNDS (3)] [DTYPES ("fp32 bf16")]
#
# e.g. bench/speed.sh train nanowhale-100m 5
#      bench/speed.sh decode nanowhale-100m 3 "fp32 bf16 fp16 int8"
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-train} MODEL=${2:-nanowhale-100m} ROUNDS=${3:-3} DTYPES=${4:-fp32 bf16}
WHALE=${WHALE:-build/whale}
THREADS=${THREADS:-$(nproc)}
if [ -d "$MODEL" ]; then src=(-m "$MODEL"); else src=(--preset "$MODEL"); fi
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }
for round in $(seq "$ROUNDS"); do
    for dtype in $DTYPES; do
        res=$("$WHALE" bench "${src[@]}" --what "$WHAT" --dtype "$dtype" --threads "$THREADS" 2>/dev/null)
        tps=$(field tokens_per_s <<<"$res") pct=$(field pct_of_bound <<<"$res")
        echo "round $round $WHAT $dtype $tps tokens/s${pct:+ ($pct % of the bandwidth bound)}"
        echo "$round $dtype $tps ${pct:-0}" >>"$OUT"
    done
done
awk -v dtypes="$DTYPES" -v what="$WHAT" '
function median(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ tps[$1, $2] = $3; pct[$1, $2] = $4; if ($1 > rounds) rounds = $1 }
END {
    nd = split(dtypes, d, " ")
    for (r = 1; r <= rounds; r++) base[r] = tps[r, "fp32"]
    fp32 = base[1] ? median(base, rounds) : 0
    for (i = 1; i <= nd; i++) {
        for (r = 1; r <= rounds; r++) {
            v[r] = tps[r, d[i]]; p[r] = pct[r, d[i]]
            if (fp32) q[r] = tps[r, d[i]] / tps[r, "fp32"]
        }
        m = median(v, rounds)
        printf "%s %-5s median %7.1f tokens/s", what, d[i], m
        if (fp32 && d[i] != "fp32") printf "   x%.2f fp32 (median of per-round ratios x%.2f)", m / fp32, median(q, rounds)
        if (what == "decode") printf "   %.0f %% of the bound", median(p, rounds)
        printf "\n"
    }
}' "$OUT"
