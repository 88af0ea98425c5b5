#!/usr/bin/env bash
# whale memory: the estimate from a config sizes what the run allocates, so
# it lands within 10 % of the peak resident memory measured by running it
# (each run in its own process), for training and inference in each format;
# fp32 training of Qwen-size shapes does not fit where bf16 inference does;
# and export --merge-lora streams: its peak stays under twice the largest
# tensor plus the adapters.
# usage: memory.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"
if [ "${WHALE_SANITIZED:-0}" = 1 ]; then
    echo "memory: skipped: resident memory under the sanitizers' shadow memory measures the sanitizer"
    exit 77
fi

within10() { # within10 ARGS...: run --measure --json, check |error| <= 10 %
    "$WHALE" memory "$@" --measure --json >"$TMP/m.json" 2>"$TMP/m.err"
    local err
    err=$(sed -E 's/.*"estimate_error_pct": ([-0-9.]+).*/\1/' "$TMP/m.json")
    echo "memory $*: estimate error $err %"
    check "memory $* within 10 % (got ${err:-none}: $(cat "$TMP/m.err"))" awk -v e="${err:-999}" 'BEGIN {exit !(e <= 10 && e >= -10)}'
}
within10 --config small --dtype fp32 --train full --batch 4 --seq-len 128
within10 --config small --dtype bf16 --train full --batch 4 --seq-len 128 --recompute
within10 --config nanowhale-100m --dtype fp32 --train full --batch 1 --seq-len 64
within10 --config nanowhale-100m --dtype bf16 --batch 1 --seq-len 256
within10 --config nanowhale-100m --dtype int8 --batch 1 --seq-len 256
within10 --config nanowhale-100m --dtype fp32 --batch 2 --seq-len 256
within10 --config nanowhale-100m --dtype bf16 --train lora --lora-rank 8 --batch 2 --seq-len 128

"$WHALE" memory --config nanowhale-100m --dtype bf16 --train full --batch 4 --seq-len 256 >"$TMP/t.txt"
check "the table names every category" grep -q "master weights" "$TMP/t.txt"
check "the table has gradients and moments" grep -q "AdamW moments" "$TMP/t.txt"
"$WHALE" memory --config nanowhale-100m --dtype bf16 --train lora --lora-rank 8 --json >"$TMP/l.json"
check "LoRA counts only adapter parameters as trainable" grep -q '"trainable": [1-9]' "$TMP/l.json"
"$WHALE" memory --config nanowhale-100m --dtype fp32 --train none --batch 1 --seq-len 99999 >/dev/null 2>"$TMP/e"
check "bad values fail with a one-line error" test "$(wc -l <"$TMP/e")" = 1
"$WHALE" memory --config no-such-preset >/dev/null 2>"$TMP/e"
check "unknown preset fails clearly: $(cat "$TMP/e")" grep -q 'unknown preset' "$TMP/e"
# per rank of N: the gradient sum's shard (and exchange buffers); with --zero 1 a shard of the moments
field() { sed -E "s/.*\"$1\": ([0-9]+).*/\1/" "$TMP/$2.json"; }
for r in "1" "4" "4 --zero 1"; do
    "$WHALE" memory --config nanowhale-100m --train full --seq-len 256 --ranks $r --json >"$TMP/r${r// /}.json"
done
check "4 ranks: each holds every moment" test "$(field moments r4)" = "$(field moments r1)"
check "4 ranks --zero 1: each holds a quarter of the moments" \
    awk -v a="$(field moments r1)" -v b="$(field moments r4--zero1)" 'BEGIN { exit !(4 * b >= a && 4 * b < a + 32) }'
check "4 ranks: the gradients and a quarter of them more (the sum's shard)" \
    awk -v a="$(field grads r1)" -v b="$(field grads r4)" 'BEGIN { exit !(b >= 1.25 * a && b < 1.25 * a + 64 * 2^20) }'
# in bf16 --zero 1 also shards the product weights' fp32 masters (the small tensors without a copy stay whole);
# in fp32 the weights are what the products read: whole on every rank
for r in "4" "4 --zero 1"; do
    "$WHALE" memory --config nanowhale-100m --train full --dtype bf16 --seq-len 256 --ranks $r --json >"$TMP/b${r// /}.json"
done
check "fp32, 4 ranks --zero 1: each holds every weight" test "$(field weights_f32 r4--zero1)" = "$(field weights_f32 r1)"
check "bf16, 4 ranks --zero 1: each holds a quarter of the fp32 masters" \
    awk -v a="$(field weights_f32 b4)" -v b="$(field weights_f32 b4--zero1)" 'BEGIN { exit !(4 * b >= a && 4 * b < a + 16 * 2^20) }'
expect_status 2 '--zero expects an integer in \[0, 1\]' -- "$WHALE" memory --config tiny --train full --zero 2

# export --merge-lora reads, merges and writes one tensor at a time: on a BF16
# Qwen2 whose embedding (151,669 × 1024, 296 MiB) is most of the model, the
# peak resident memory of the merge stays under twice that tensor plus the
# adapters (docs/cli.md), and the merged model is BF16 like its base
need_tokenizer qwen3
cat >"$TMP/q.json" <<JSON
{"model_type": "qwen2", "vocab_size": 151669, "hidden_size": 1024, "num_hidden_layers": 2,
 "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 2048, "max_position_embeddings": 512,
 "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false, "eos_token_id": 151645}
JSON
"$WHALE" init --preset "$TMP/q.json" --dtype bf16 --out "$TMP/q" --tokenizer "$TOK" 2>/dev/null
"$WHALE" sft -m "$TMP/q" --data "$DATA/../../data/self_cognition.jsonl#2" --model-name a b --model-author c d \
    --max-steps 1 --batch-size 2 --grad-accum 1 --lora-rank 8 --save-only-model --out "$TMP/qrun" --quiet >/dev/null 2>&1
CK=$(ls -d "$TMP"/qrun/v0-*/checkpoint-1)
check "a LoRA checkpoint on the Qwen2" test -s "$CK/adapter_model.safetensors"
"$WHALE" export --adapters "$CK" --merge-lora --out "$TMP/qm" 2>"$TMP/e"
peak=$(sed -nE 's/.*peak RSS ([0-9.]+) MiB.*/\1/p' "$TMP/e")
largest=$(( 151669 * 1024 * 2 ))
adapters=$(stat -c %s "$CK/adapter_model.safetensors")
echo "memory: merge peak RSS $peak MiB; largest tensor $((largest >> 20)) MiB, adapters $((adapters >> 20)) MiB"
check "merge: peak RSS ${peak:-none} MiB < 2 × the largest tensor + the adapters ($(cat "$TMP/e"))" \
    awk -v p="${peak:-1e9}" -v l="$largest" -v a="$adapters" 'BEGIN { exit !(p * 1048576 < 2 * l + a) }'
check "merge: BF16 in, BF16 out" grep -q '"bfloat16"' "$TMP/qm/config.json"
finish memory
