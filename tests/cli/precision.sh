#!/usr/bin/env bash
# whale precision-report on the tiny model: the fp32/bf16/fp16/int8 rows
# from --ids and from a prepared dataset, losses close to fp32, weight
# memory ordered by format, the routing table, the JSON; --steps 3 trains
# the five training formats and overlays their curves in an SVG; bad inputs
# fail with one-line errors and the documented exit statuses.
# usage: precision.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
TINY=$DATA/tiny
. "$(dirname "$0")/lib.bash"
# json_ok FILE: parses as JSON (node, which the setup's npm brings, or python3)
json_ok() {
    if command -v node >/dev/null; then node -e 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))' "$1"
    elif command -v python3 >/dev/null; then python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1"
    else head -c 1 "$1" | grep -q '{' && tail -c 2 "$1" | grep -q '}'; fi
}
# loss_of TABLE DTYPE: the loss column of that row of the Markdown table
loss_of() { awk -F' *\\| *' -v dt="$2" '$2 == dt { print $3; exit }' "$1"; }
close_to() { # close_to A B REL: |A - B| <= REL * B, both numbers
    awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a + 0 && b > 0 && d <= r * b) }'
}
json_field() { # json_field FILE DTYPE KEY: a numeric field of that format's row
    grep -o "{\"dtype\": \"$2\"[^]]*" "$1" | grep -o "\"$3\": [0-9.e+-]*" | head -1 | sed 's/.*: //'
}

# --ids: the four formats on the same 2 × 8 tokens
echo '[[0, 5, 17, 33, 100, 200, 300, 400], [7, 9, 11, 13, 15, 17, 19, 21]]' >"$TMP/ids.json"
"$WHALE" precision-report -m "$TINY" --ids "$TMP/ids.json" --json "$TMP/ids-report.json" --reps 1 --threads 2 \
    >"$TMP/ids.md" 2>"$TMP/err"
check "precision-report --ids runs: $(cat "$TMP/err")" test $? = 0
for dt in fp32 bf16 fp16 int8; do
    check "a $dt row" grep -Eq "^\| $dt \| [0-9]+\.[0-9]+ \| " "$TMP/ids.md"
done
l32=$(loss_of "$TMP/ids.md" fp32)
for dt in bf16 fp16 int8; do
    l=$(loss_of "$TMP/ids.md" $dt)
    check "$dt loss $l within 0.5 % of fp32 $l32" close_to "$l" "$l32" 0.005
done
check "routing table has layers 0 and 1" grep -Eq '^\| 1 \| \([0-9.e-]+\) \| [0-9.]+ % ' "$TMP/ids.md"
check "report JSON parses" json_ok "$TMP/ids-report.json"
check "JSON has four rows" test "$(grep -c '{"dtype": "' "$TMP/ids-report.json")" = 4
w32=$(json_field "$TMP/ids-report.json" fp32 weight_bytes)
w16=$(json_field "$TMP/ids-report.json" bf16 weight_bytes)
w8=$(json_field "$TMP/ids-report.json" int8 weight_bytes)
check "weight memory int8 $w8 < bf16 $w16 < fp32 $w32" awk -v a="$w8" -v b="$w16" -v c="$w32" \
    'BEGIN { exit !(a > 0 && a < b && b < c) }'
rss=$(json_field "$TMP/ids-report.json" int8 peak_rss_bytes)
check "the int8 run's peak RSS is measured ($rss bytes)" awk -v r="$rss" 'BEGIN { exit !(r > 1000000) }'
check "fp16 routing compared with fp32" grep -Eq '"dtype": "fp16".*"routing_disagree_frac": [0-9]' "$TMP/ids-report.json"

# --data: windows from a prepared dataset's val split, then 3 training steps per format
mkdir "$TMP/corpus"
for d in $(seq 1 24); do
    awk -v seed="$d" 'BEGIN {
        srand(seed); split("the a one some every", det); split("cat dog bird fish horse child", noun);
        split("sees finds likes follows carries", verb);
        for (s = 0; s < 30; s++)
            printf "%s %s %s %s %s.\n", det[int(rand()*5)+1], noun[int(rand()*6)+1], verb[int(rand()*5)+1],
                   det[int(rand()*5)+1], noun[int(rand()*6)+1] }' >"$TMP/corpus/doc$d.txt"
done
"$WHALE" tokenizer train --vocab-size 300 --out "$TMP/tok" "$TMP"/corpus/*.txt >/dev/null 2>&1
"$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/data" --val-docs 3 "$TMP"/corpus/*.txt >/dev/null 2>&1
check "data prepared" test -s "$TMP/data/meta.json"
"$WHALE" precision-report -m "$TINY" --data "$TMP/data" --batch 2 --seq-len 32 --steps 3 --reps 1 --threads 2 \
    --out "$TMP/runs" --json "$TMP/data-report.json" >"$TMP/data.md" 2>"$TMP/err"
check "precision-report --data --steps 3 runs: $(cat "$TMP/err")" test $? = 0
check "windows from the val split" grep -q '2 windows of 32 tokens from the val split' "$TMP/data.md"
for dt in fp32 bf16 fp16 int8; do
    check "a $dt row from --data" grep -Eq "^\| $dt \| [0-9]+\.[0-9]+ \| " "$TMP/data.md"
done
for run in fp32 bf16 fp16 bf16-pure-nearest bf16-pure-stochastic; do
    check "training row $run" grep -Eq "^\| $run \| [0-9]+\.[0-9]+ \| " "$TMP/data.md"
    check "run folder $run with 3 logged steps" test "$(grep -c '"loss"' "$TMP/runs/$run/metrics.jsonl")" = 3
    check "the SVG shows $run" grep -q ">$run</text>" "$TMP/runs/loss.svg"
done
check "fp16 skipped steps reported" grep -Eq '^\| fp16 \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \| [0-9]+ \|$' "$TMP/data.md"
check "data report JSON parses" json_ok "$TMP/data-report.json"
check "JSON has five training runs" test "$(grep -c '{"name": "' "$TMP/data-report.json")" = 5

# errors: one line, the usual statuses
expect_status 2 'exactly one of' -- "$WHALE" precision-report -m "$TINY"
expect_status 2 'exactly one of' -- "$WHALE" precision-report -m "$TINY" --ids "$TMP/ids.json" --data "$TMP/data"
expect_status 2 '--steps needs --data' -- "$WHALE" precision-report -m "$TINY" --ids "$TMP/ids.json" --steps 2
expect_status 2 '--batch and --seq-len apply to --data' \
    -- "$WHALE" precision-report -m "$TINY" --ids "$TMP/ids.json" --seq-len 8
expect_status 2 'unknown option "--bogus"' -- "$WHALE" precision-report -m "$TINY" --bogus 1
expect_status 2 '--reps expects an integer' -- "$WHALE" precision-report -m "$TINY" --ids "$TMP/ids.json" --reps x
expect_status 3 'missing/config.json' -- "$WHALE" precision-report -m "$TMP/missing" --ids "$TMP/ids.json"
expect_status 3 'nodata' -- "$WHALE" precision-report -m "$TINY" --data "$TMP/nodata"
expect_status 5 'seq-len 200 exceeds the model.s max_position_embeddings 128' \
    -- "$WHALE" precision-report -m "$TINY" --data "$TMP/data" --seq-len 200
echo '[[1, 2, 512]]' >"$TMP/range.json"
expect_status 5 'token id 512 is outside the vocabulary' -- "$WHALE" precision-report -m "$TINY" --ids "$TMP/range.json"
# a weight file that does not match its config: the child's load error, as one line
mkdir "$TMP/broken" && cp "$TINY/config.json" "$TMP/broken/" && head -c 1000 "$TINY/model.safetensors" >"$TMP/broken/model.safetensors"
expect_status 4 'fp32 run: .*model.safetensors' -- "$WHALE" precision-report -m "$TMP/broken" --ids "$TMP/ids.json"

finish precision
