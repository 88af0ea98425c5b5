#!/usr/bin/env bash
# Command-line behaviour: results, exit statuses and one-line errors that
# name the file or argument, with no partial output files left behind.
# usage: commands.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
TINY=$DATA/tiny
. "$(dirname "$0")/lib.bash"

# expect STATUS PATTERN -- command...: exit status and a stderr line matching PATTERN
expect() {
    local want=$1 pattern=$2
    shift 3
    checks=$((checks + 1))
    "$@" >"$TMP/out" 2>"$TMP/err"
    local got=$?
    if [ "$got" != "$want" ] || { [ -n "$pattern" ] && ! grep -Eq -- "$pattern" "$TMP/err"; }; then
        echo "FAIL: $* -> status $got (want $want), stderr: $(cat "$TMP/err")" >&2
        fails=$((fails + 1))
    elif [ "$want" != 0 ] && [ "$(wc -l <"$TMP/err")" != 1 ]; then
        echo "FAIL: $* -> error is not one line: $(cat "$TMP/err")" >&2
        fails=$((fails + 1))
    fi
}

# usage
expect 2 'usage' -- "$WHALE"
expect 2 'unknown command' -- "$WHALE" frobnicate
expect 2 'unknown option "--bogus"' -- "$WHALE" info -m "$TINY" --bogus
expect 2 '--top-p expects a number' -- "$WHALE" generate -m "$TINY" --ids 1 --top-p 2
expect 2 'WHALE_ISA=avx3 names no instruction tier' -- env WHALE_ISA=avx3 "$WHALE" info -m "$TINY"
expect 2 'WHALE_PAR_US=fast is not a number of microseconds' -- env WHALE_PAR_US=fast "$WHALE" info -m "$TINY"
expect 2 'WHALE_PAR_US=0 is not a number of microseconds' -- env WHALE_PAR_US=0 "$WHALE" info -m "$TINY"
expect 2 'WHALE_PAR_MOVE_US=-1 is not a number of microseconds' -- env WHALE_PAR_MOVE_US=-1 "$WHALE" info -m "$TINY"

# info
expect 0 '' -- "$WHALE" info -m "$TINY"
check "info shows the parameter count" grep -q 'parameters' "$TMP/out"
expect 3 'not a model directory' -- "$WHALE" info -m "$TMP/nothing"

# score
echo '[[1, 2, 3, 4], [5, 6, 7, 8]]' >"$TMP/ids.json"
expect 0 '' -- "$WHALE" score -m "$TINY" --ids "$TMP/ids.json" --logits-out "$TMP/logits.safetensors"
expect 0 '' -- env WHALE_ISA=base "$WHALE" score -m "$TINY" --ids "$TMP/ids.json"
check "score prints loss/tokens/ppl" grep -Eq '^\{"loss": [0-9.]+, "tokens": 6, "ppl": [0-9.]+\}$' "$TMP/out"
check "logits file has 2*4*512 floats" test "$(stat -c %s "$TMP/logits.safetensors")" -gt $((2 * 4 * 512 * 4))
echo 'not json' >"$TMP/bad.json"
expect 4 'bad.json: not valid JSON' -- "$WHALE" score -m "$TINY" --ids "$TMP/bad.json"
echo '[[1, 2, 3], [4, 5]]' >"$TMP/ragged.json"
expect 4 'ragged.json: row 1 has 2 ids' -- "$WHALE" score -m "$TINY" --ids "$TMP/ragged.json"
echo '[[1, 2, 512]]' >"$TMP/range.json"
expect 5 'range.json: row 0, column 2: token id 512 is outside the vocabulary' -- \
    "$WHALE" score -m "$TINY" --ids "$TMP/range.json"
echo '[[1, -3]]' >"$TMP/neg.json"
expect 5 'token id -3' -- "$WHALE" score -m "$TINY" --ids "$TMP/neg.json"
echo '[[1, 2.5]]' >"$TMP/frac.json"
expect 4 'not an integer' -- "$WHALE" score -m "$TINY" --ids "$TMP/frac.json"
expect 3 'missing.json: cannot open' -- "$WHALE" score -m "$TINY" --ids "$TMP/missing.json"
# longer than max_position_embeddings (128)
python_free_ids=$(seq -s, 1 130)
echo "[[${python_free_ids}]]" >"$TMP/long.json"
expect 5 'exceeds the model.s max_position_embeddings 128' -- "$WHALE" score -m "$TINY" --ids "$TMP/long.json"
# unwritable output: the target is a directory, so the final rename fails
mkdir "$TMP/adir"
expect 3 'adir' -- "$WHALE" score -m "$TINY" --ids "$TMP/ids.json" --logits-out "$TMP/adir"
check "no temporary file left behind" test ! -e "$TMP/adir.tmp"
expect 3 'cannot create' -- "$WHALE" score -m "$TINY" --ids "$TMP/ids.json" --logits-out "$TMP/no/such/dir/l.safetensors"

# generate
expect 0 'generated 16 tokens' -- "$WHALE" generate -m "$TINY" --ids 0,15,27 -n 16 --temperature 0 --ignore-eos
cp "$TMP/out" "$TMP/greedy1"
expect 0 '' -- "$WHALE" generate -m "$TINY" --ids 0,15,27 -n 16 --temperature 0 --ignore-eos --threads 1
check "greedy output does not depend on threads" cmp -s "$TMP/out" "$TMP/greedy1"
check "16 ids printed" test "$(tr ',' '\n' <"$TMP/greedy1" | grep -c .)" = 16
expect 0 '' -- "$WHALE" generate -m "$TINY" --ids 3,4 -n 20 --seed 7 --temperature 1 --top-k 40 --ignore-eos
cp "$TMP/out" "$TMP/seeded"
expect 0 '' -- "$WHALE" generate -m "$TINY" --ids 3,4 -n 20 --seed 7 --temperature 1 --top-k 40 --ignore-eos
check "same seed, same sample" cmp -s "$TMP/out" "$TMP/seeded"
expect 5 'token id 999' -- "$WHALE" generate -m "$TINY" --ids 1,999 -n 4
expect 5 'exceeds max_position_embeddings' -- "$WHALE" generate -m "$TINY" --ids 1,2 -n 200
expect 2 '--ids expects comma-separated integers' -- "$WHALE" generate -m "$TINY" --ids 1,x

# init
expect 0 'wrote' -- "$WHALE" init --preset tiny --seed 5 --out "$TMP/init"
expect 0 '' -- "$WHALE" info -m "$TMP/init"
expect 2 'unknown preset "huge"' -- "$WHALE" init --preset huge --out "$TMP/x"
expect 3 'cannot create directory' -- "$WHALE" init --preset tiny --out "$TMP/no/such/place"
expect 0 'in bf16' -- "$WHALE" init --preset tiny --seed 5 --dtype bf16 --out "$TMP/init16"
check "init --dtype bf16: BF16 tensors, half the bytes" test "$(stat -c %s "$TMP/init16/model.safetensors")" -lt \
    "$(( $(stat -c %s "$TMP/init/model.safetensors") * 51 / 100 ))"
check "init --dtype bf16: the config records it under the config's own key" grep -q '"dtype":[[:space:]]*"bfloat16"' "$TMP/init16/config.json"
expect 2 'checkpoints are fp32, bf16 or fp16' -- "$WHALE" init --preset tiny --dtype int8 --out "$TMP/x"

# export to bf16 / fp16: half the bytes, loads back, scores close to fp32
expect 0 'wrote' -- "$WHALE" export -m "$TINY" --dtype bf16 --out "$TMP/bf16"
check "bf16 checkpoint is half the size" test "$(stat -c %s "$TMP/bf16/model.safetensors")" -lt \
    "$(( $(stat -c %s "$TINY/model.safetensors") * 51 / 100 ))"
check "the exported config records bfloat16" grep -q '"dtype":[[:space:]]*"bfloat16"' "$TMP/bf16/config.json"
check "... and only once" test "$(grep -c 'float32\|bfloat16' "$TMP/bf16/config.json")" = 1
expect 0 '' -- "$WHALE" score -m "$TMP/bf16" --ids "$TMP/ids.json"
loss16=$(sed -E 's/.*"loss": ([0-9.]+).*/\1/' "$TMP/out")
expect 0 '' -- "$WHALE" score -m "$TINY" --ids "$TMP/ids.json"
loss32=$(sed -E 's/.*"loss": ([0-9.]+).*/\1/' "$TMP/out")
check "bf16 checkpoint scores within 1 % of fp32 ($loss16 vs $loss32)" \
    awk -v a="$loss16" -v b="$loss32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.01 * b) }'
expect 0 '[(]fp16,' -- "$WHALE" export -m "$TINY" --dtype fp16 --out "$TMP/fp16"
expect 0 '' -- "$WHALE" score -m "$TMP/fp16" --ids "$TMP/ids.json" --dtype bf16
expect 2 '--dtype must be bf16, fp16 or fp32' -- "$WHALE" export -m "$TINY" --dtype int4 --out "$TMP/x"
expect 3 'cannot create directory' -- "$WHALE" export -m "$TINY" --dtype bf16 --out "$TMP/no/such/dir"

# precision report: fp32 and bf16 rows against fp32
expect 0 '' -- "$WHALE" precision-report -m "$TINY" --ids "$TMP/ids.json" --json "$TMP/prec.json" --reps 1
check "report has an fp32 and a bf16 row" grep -q '^| bf16 | ' "$TMP/out"
check "report JSON written" grep -q '"dtype": "bf16"' "$TMP/prec.json"

# bench (tiny shapes; only the output format is checked here)
expect 0 '' -- "$WHALE" bench -m "$TINY" --what forward --batch 1 --seq-len 8 --reps 1
check "bench prints tokens_per_s" grep -q '"tokens_per_s"' "$TMP/out"
expect 0 '' -- "$WHALE" bench -m "$TINY" --what decode --context 8 --tokens 4 --reps 1
check "decode bench prints its bound" grep -q '"bound_tokens_per_s"' "$TMP/out"
check "decode bench names the last-level cache its read probe outgrows" grep -q '"llc_mb": [0-9]' "$TMP/out"
expect 0 '' -- "$WHALE" bench -m "$TINY" --what decode --context 8 --tokens 4 --reps 1 --threads 2
check "bench gives the region cost it measured at two threads (a positive number)" \
    awk '{ if (match($0, /"region_us": [0-9.]+/)) { v = substr($0, RSTART + 13, RLENGTH - 13) + 0; ok = v > 0 } }
         END { exit !ok }' "$TMP/out"
check "bench gives what moving 64 KiB between cores counts: streaming them from memory" \
    grep -q '"move_64k_us": 2.34,' "$TMP/out"
expect 0 '' -- env WHALE_PAR_US=2.5 "$WHALE" bench -m "$TINY" --what decode --context 8 --tokens 4 --reps 1 --threads 2
check "WHALE_PAR_US fixes the region cost" grep -q '"region_us": 2.50,' "$TMP/out"
expect 0 '' -- env WHALE_PAR_MOVE_US=1.5 "$WHALE" bench -m "$TINY" --what decode --context 8 --tokens 4 --reps 1 --threads 2
check "WHALE_PAR_MOVE_US fixes the cost of moving 64 KiB" grep -q '"move_64k_us": 1.50,' "$TMP/out"
expect 0 '' -- env WHALE_PAR_US=2.5 WHALE_PAR_MOVE_US=0 "$WHALE" bench -m "$TINY" --what decode --context 8 --tokens 4 --reps 1 --threads 2
check "both fixed" grep -q '"region_us": 2.50, "move_64k_us": 0.00,' "$TMP/out"
expect 0 '' -- "$WHALE" bench -m "$TINY" --what decode --context 8 --tokens 4 --reps 1 --threads 1
check "one thread: no region cost" grep -q '"region_us": 0.00, "move_64k_us": 0.00,' "$TMP/out"
expect 0 '' -- "$WHALE" bench -m "$TINY" --what decode --context 8 --tokens 4 --reps 3
check "decode bench: the median run's share of the read rate is a positive number" \
    awk '{ if (match($0, /"pct_of_bound": [0-9.]+/)) { v = substr($0, RSTART + 16, RLENGTH - 16) + 0; ok = v > 0 } }
         END { exit !ok }' "$TMP/out"
# decode streams bound round robin to the base and adapters beside it
expect 0 '' -- "$WHALE" bench -m "$TINY" --what decode --batch 3 --context 8 --tokens 4 --reps 1 \
    --adapters "$DATA/lora-tiny" "$DATA/lora-tiny"
check "decode bench with adapters: they are counted" grep -q '"streams": 3, "adapters": 2' "$TMP/out"
expect 2 'decode only' -- "$WHALE" bench -m "$TINY" --what forward --adapters "$DATA/lora-tiny"
expect 3 'adapter_config.json' -- "$WHALE" bench -m "$TINY" --what decode --adapters "$TMP/nowhere"

echo "cli: $((checks - fails)) passed, $fails failed"
[ "$fails" = 0 ]
