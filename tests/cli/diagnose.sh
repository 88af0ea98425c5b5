#!/usr/bin/env bash
# whale diagnose on the tiny model (table, JSON, text input; bf16/fp16/int8
# against fp32; --backward gradients), its one-line errors, and --nan-check of score and generate on a copy of the model whose
# layers.1.attn.wq_b holds one NaN: the report names layers.1.attn.q, the
# first traced tensor computed from that weight.
# usage: diagnose.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"

echo '[[0, 5, 17, 33, 100, 200, 300, 400], [7, 9, 11, 13, 15, 17, 19, 21]]' >"$TMP/ids.json"
"$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --json "$TMP/report.json" --threads 2 >"$TMP/table" 2>"$TMP/err"
check "diagnose runs: $(cat "$TMP/err")" test $? = 0
check "the table has a row per layer and op" grep -Eq '^1 +attn\.q +[0-9]' "$TMP/table"
check "the table ends with the logits" grep -Eq '^- +logits ' "$TMP/table"
check "routing margins per layer" grep -Eq '^1 +yes +16 ' "$TMP/table"
check "nothing non-finite" grep -Eq 'non-finite +none' "$TMP/table"
check "JSON written" grep -Eq '"first_nonfinite":[[:space:]]*null' "$TMP/report.json"
check "JSON has every tensor" test "$(grep -c '"headroom_bits"' "$TMP/report.json")" -gt 100
"$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --json - --dtype fp32 >"$TMP/stdout.json" 2>/dev/null
check "--json - prints only JSON" test "$(head -c 1 "$TMP/stdout.json")" = "{"

# other formats: measured against an fp32 run of the same tokens
for dt in bf16 fp16 int8; do
    "$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --dtype $dt --json "$TMP/$dt.json" >"$TMP/$dt" 2>"$TMP/err"
    check "diagnose runs in $dt: $(cat "$TMP/err")" grep -q "2 × 8 tokens, $dt products; loss [0-9.]* (fp32 [0-9.]*)" "$TMP/$dt"
    check "$dt: deviation columns" grep -q '| vs fp32' "$TMP/$dt"
    check "$dt: every row compared (max|dx|, rel rms, lost0%)" \
        grep -Eq '^1 +attn\.q +[0-9].*\| +[0-9.e-]+ +[0-9.e-]+ +[0-9.<]+$' "$TMP/$dt"
    check "$dt: routing compared with fp32" grep -Eq '^1 +yes +16 .* [0-9.<]+$' "$TMP/$dt"
    check "$dt: JSON deviation" grep -Eq '"rel_rms_diff":[[:space:]]*[0-9]' "$TMP/$dt.json"
    check "$dt: JSON routing disagreement" grep -Eq '"disagree_frac":[[:space:]]*[0-9]' "$TMP/$dt.json"
done
rel=$(grep -E '^- +logits ' "$TMP/bf16" | awk '{ print $(NF-1) }')
check "bf16 logits deviate a little from fp32 (rel rms $rel)" awk -v r="$rel" 'BEGIN { exit !(r > 0 && r < 0.05) }'
check "fp32 runs have no deviation columns" sh -c "! grep -q 'vs fp32' '$TMP/table'"

# --backward: a training step, gradients in a section of their own
"$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --dtype fp16 --backward --json "$TMP/back.json" \
    >"$TMP/back" 2>"$TMP/err"
check "diagnose --backward: $(cat "$TMP/err")" grep -q '^backward: gradients' "$TMP/back"
check "gradient rows per layer" grep -Eq '^1 +grad\.ffn\.out +[0-9]' "$TMP/back"
check "gradient of the logits" grep -Eq '^- +grad\.logits +[0-9]' "$TMP/back"
check "gradients compared with fp32" grep -Eq '^0 +grad\.attn\.out .*\| +[0-9.e-]+ +[0-9.e-]+ +[0-9.<]+$' "$TMP/back"
check "JSON: gradients are phase backward" grep -Eq '"phase":[[:space:]]*"backward"' "$TMP/back.json"
"$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --backward --loss-scale 1024 >"$TMP/back32" 2>"$TMP/err"
check "diagnose --backward in fp32 with a loss scale: $(cat "$TMP/err")" grep -q 'gradients of 1024 ×' "$TMP/back32"

expect_status 2 '--dtype must be fp32, bf16, fp16 or int8' \
    -- "$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --dtype fp8
expect_status 2 'int8 runs inference only' -- "$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --dtype int8 --backward
expect_status 2 '--loss-scale applies to --backward' -- "$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --loss-scale 8
expect_status 2 'exactly one of' -- "$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/ids.json" --text hi
expect_status 3 'whale: ' -- "$WHALE" diagnose -m "$TMP/missing" --ids "$TMP/ids.json"
echo '[[1, 2, 512]]' >"$TMP/range.json"
expect_status 5 'token id 512 is outside the vocabulary' -- "$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/range.json"
echo '[[1, 2' >"$TMP/bad.json"
expect_status 4 'not valid JSON' -- "$WHALE" diagnose -m "$DATA/tiny" --ids "$TMP/bad.json"
expect_status 3 'tokenizer' -- "$WHALE" diagnose -m "$DATA/tiny" --text "no tokenizer here"

# text input through a small trained tokenizer
for d in 1 2 3; do
    for s in $(seq 1 20); do echo "the cat $d sees a dog $s, and the dog sees the cat."; done >"$TMP/doc$d.txt"
done
"$WHALE" tokenizer train --vocab-size 300 --out "$TMP/tok" "$TMP"/doc*.txt >/dev/null 2>&1
"$WHALE" init --preset tiny --out "$TMP/model" --tokenizer "$TMP/tok" 2>/dev/null
"$WHALE" diagnose -m "$TMP/model" --text "the cat sees the dog" >"$TMP/text.table" 2>"$TMP/err"
check "diagnose --text: $(cat "$TMP/err")" grep -Eq '^- +logits ' "$TMP/text.table"
head -3 "$TMP/doc1.txt" >"$TMP/short.txt"
"$WHALE" diagnose -m "$TMP/model" --text-file "$TMP/short.txt" >"$TMP/file.table" 2>"$TMP/err"
check "diagnose --text-file: $(cat "$TMP/err")" grep -Eq '^- +logits ' "$TMP/file.table"
expect_status 5 'doc1.txt: [0-9]+ tokens exceed max_position_embeddings 128' \
    -- "$WHALE" diagnose -m "$TMP/model" --text-file "$TMP/doc1.txt"

# a copy of the model with one NaN in layers.1.attn.wq_b (element 40: row 1, head 0)
cp -r "$DATA/tiny" "$TMP/nan"
st="$TMP/nan/model.safetensors"
hlen=$(od -An -t u8 -N8 "$st" | tr -d ' ')
start=$(dd if="$st" bs=1 skip=8 count="$hlen" 2>/dev/null | grep -o '"model.layers.1.attn.wq_b.weight":{[^}]*}' |
    sed -E 's/.*"data_offsets":\[([0-9]+),.*/\1/')
printf '\000\000\300\177' | dd of="$st" bs=1 seek=$((8 + hlen + start + 4 * 40)) conv=notrunc 2>/dev/null
"$WHALE" diagnose -m "$TMP/nan" --ids "$TMP/ids.json" >"$TMP/nan.table" 2>/dev/null
check "diagnose names the first non-finite tensor" \
    grep -q 'non-finite value in layers.1.attn.q (forward, call 1, element 0 \[0, 0\] = nan' "$TMP/nan.table"
origin='^whale: non-finite value in layers\.1\.attn\.q \(forward, call 1, '
expect_status 5 "$origin.*last finite inputs: layers\.1\.attn\.q_latent max" \
    -- "$WHALE" score -m "$TMP/nan" --ids "$TMP/ids.json" --nan-check
expect_status 5 "$origin" -- "$WHALE" generate -m "$TMP/nan" --ids 1,2,3 -n 4 --nan-check
"$WHALE" score -m "$DATA/tiny" --ids "$TMP/ids.json" --nan-check >"$TMP/score" 2>&1
check "score --nan-check on a healthy model: $(cat "$TMP/score")" grep -q '"loss": [0-9]' "$TMP/score"

# a dense model (Qwen2): no routing, every tensor and gradient still reported
echo '[[0, 5, 17, 33, 100, 150, 190, 7]]' >"$TMP/ids-qwen.json" # its vocabulary is 192
"$WHALE" diagnose -m "$DATA/qwen2-gqa2" --ids "$TMP/ids-qwen.json" --dtype bf16 --backward >"$TMP/qwen" 2>"$TMP/err"
check "diagnose runs on a dense Qwen2 model: $(head -c 200 "$TMP/err")" grep -q 'attn.q' "$TMP/qwen"
check "... with its gradients" grep -q 'grad\.' "$TMP/qwen"

finish diagnose
