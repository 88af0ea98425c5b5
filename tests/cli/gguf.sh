#!/usr/bin/env bash
# whale export --format gguf for each dense family (Qwen2 with Qwen's
# tokenizer; Llama with Llama 3's, its RoPE scaling, GQA and an untied head;
# Qwen3 with q/k norms and an explicit head_dim), in f32, f16, bf16 and q8_0
# and merged with a LoRA checkpoint, checked twice:
#   - read back by @huggingface/gguf (tests/gguf/check.mjs): metadata,
#     tokenizer, tensor names, shapes, types and data;
#   - run by llama.cpp itself (tests/gguf_llama, npm's prebuilt libllama):
#     the same tokens for a text, logits within a bound of whale's (f32:
#     1e-5 of the largest logit, bit-level agreement apart from summation
#     order), the same greedy continuation.
# And the refusals: nanowhale, a bad --dtype, a missing tokenizer. Under
# the sanitizers llama.cpp is not run.
# usage: gguf.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
ROOT=$DATA/../..
. "$(dirname "$0")/lib.bash"
JS=$ROOT/tests/gguf
BINS=$JS/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
LLAMA=$(dirname "$WHALE")/tests/gguf_llama
if [ ! -f "$JS/node_modules/@huggingface/gguf/package.json" ] || [ ! -d "$BINS" ] || ! command -v node >/dev/null; then
    echo "gguf.sh: node and $JS/node_modules (@huggingface/gguf, @node-llama-cpp/linux-x64) are needed: run scripts/setup.sh" >&2
    exit 1
fi
TEXT='Hello, world! <|im_start|>user 12345 ¿Qué tal? 你好'

# dense MODEL_TYPE VOCAB OUT EXTRA_JSON: a two-layer random model of the variant with $TOK's files
dense() {
    cat >"$TMP/cfg.json" <<JSON
{"model_type": "$1", "vocab_size": $2, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, $4}
JSON
    "$WHALE" init --preset "$TMP/cfg.json" --out "$3" --tokenizer "$TOK" >/dev/null 2>&1
}

# llama TOL [--greedy] -- MODEL FILE: llama.cpp runs FILE as whale runs MODEL
# (not under the sanitizers: that would test llama.cpp's memory, and
# LeakSanitizer reports its process-lifetime allocations)
llama() {
    local tol=$1 greedy=$2 m=$3 f=$4
    [ "${WHALE_SANITIZED:-0}" = 1 ] && return 0
    OMP_NUM_THREADS=2 "$LLAMA" "$BINS" "$m" "$f" "$TEXT" 8 $tol $greedy >"$TMP/ll" 2>&1
    local st=$?
    check "$(basename "$f"): llama.cpp runs it like whale ($(head -1 "$TMP/ll" | cut -c1-110))" test $st = 0
    [ $st = 0 ] && echo "$(basename "$f"): $(tr '\n' ' ' <"$TMP/ll")" || cat "$TMP/ll" >&2
}

# family NAME PRE "TYPES" "LLAMA_TYPES": export each type and read it back;
# run those of LLAMA_TYPES in llama.cpp
family() {
    local name=$1 pre=$2 m=$TMP/$1 t
    check "$name: init" test -s "$m/model.safetensors"
    local files=()
    for t in $3; do
        "$WHALE" export -m "$m" --format gguf --dtype "$t" --out "$TMP/$name-$t.gguf" 2>"$TMP/err"
        check "$name $t: export ($(tail -1 "$TMP/err"))" test -s "$TMP/$name-$t.gguf"
        files+=("$TMP/$name-$t.gguf:$t")
    done
    node "$JS/check.mjs" "$m" "$pre" "${files[@]}" >"$TMP/js" 2>&1
    local st=$?
    check "$name: @huggingface/gguf reads them back ($(tr '\n' ' ' <"$TMP/js" | cut -c1-200))" test $st = 0
    [ $st = 0 ] || cat "$TMP/js" >&2
    for t in $4; do # the lossy types: their rounding bounds the logits, greedy ties may go either way
        case $t in f32) llama 1e-5 --greedy "$m" "$TMP/$name-$t.gguf" ;; f16) llama 2e-3 "" "$m" "$TMP/$name-$t.gguf" ;;
        *) llama 5e-2 "" "$m" "$TMP/$name-$t.gguf" ;; esac
    done
}

need_tokenizer qwen3
dense qwen2 151936 "$TMP/qwen2" '"rms_norm_eps": 1e-6, "tie_word_embeddings": true, "rope_theta": 1000000.0,
 "bos_token_id": 151643, "eos_token_id": 151645'
family qwen2 qwen2 "f32 f16 bf16 q8_0" "f32 q8_0"
dense qwen3 151669 "$TMP/qwen3" '"head_dim": 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "eos_token_id": 151645,
 "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}'
family qwen3 qwen2 "f32 q8_0" f32

need_tokenizer llama3
dense llama 128256 "$TMP/llama" '"rms_norm_eps": 1e-5, "tie_word_embeddings": false, "attention_bias": true,
 "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
 "original_max_position_embeddings": 64}'
family llama llama-bpe "f32 q8_0" "f32 q8_0"

# merged with a LoRA checkpoint: the GGUF holds the merged safetensors' values
need_tokenizer qwen3
printf '{"query": "Who are you?", "response": "I am a small whale."}\n' >"$TMP/sc.jsonl"
"$WHALE" sft -m "$TMP/qwen2" --data "$TMP/sc.jsonl" --train-type lora --lora-rank 4 --max-steps 2 --batch-size 1 \
    --save-steps 2 --lr 1e-2 --out "$TMP/runs" --quiet >/dev/null 2>&1
ck=$(ls -d "$TMP"/runs/v0-*/checkpoint-2 2>/dev/null | head -1)
check "LoRA checkpoint" test -n "$ck"
"$WHALE" export --adapters "$ck" --merge-lora --quiet 2>/dev/null
"$WHALE" export --adapters "$ck" --merge-lora --format gguf --dtype f32 --quiet 2>/dev/null
check "merged GGUF next to the checkpoint" test -s "$ck-merged.gguf"
node "$JS/check.mjs" "$ck-merged" qwen2 "$ck-merged.gguf:f32" >"$TMP/js" 2>&1
check "merged GGUF = merged safetensors ($(tail -1 "$TMP/js"))" test $? = 0

# refusals: one line, the right status
need_tokenizer deepseek_v3
tiny_model "$TMP/nw" 129280 64
expect_status 6 'deepseek_v4 \(nanowhale\) has no mapping' -- \
    "$WHALE" export -m "$TMP/nw" --format gguf --out "$TMP/nw.gguf"
check "nothing written for nanowhale" test ! -e "$TMP/nw.gguf"
expect_status 2 'dtype must be f32, f16, bf16 or q8_0' -- \
    "$WHALE" export -m "$TMP/qwen2" --format gguf --dtype int8 --out "$TMP/x.gguf"
expect_status 2 'format must be safetensors or gguf' -- "$WHALE" export -m "$TMP/qwen2" --format ggml --out "$TMP/x"
mkdir -p "$TMP/notok" && cp "$TMP/qwen2/config.json" "$TMP/qwen2/model.safetensors" "$TMP/notok/"
expect_status 3 'notok/tokenizer.json' -- "$WHALE" export -m "$TMP/notok" --format gguf --out "$TMP/x.gguf"
check "no partial file" test ! -e "$TMP/x.gguf" -a ! -e "$TMP/x.gguf.tmp"
finish gguf
