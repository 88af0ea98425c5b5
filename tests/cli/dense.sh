#!/usr/bin/env bash
# The dense decoder's Llama and Qwen3 variants end to end with their real
# tokenizers: init from a config (Llama 3 rope scaling; Qwen3 in the
# transformers-5 form), info, the folder's own chat template, a LoRA sft run
# through it, generate with the adapters, export --merge-lora (same greedy
# text), and a config written back as read.
# usage: dense.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
ROOT=$DATA/../..
. "$(dirname "$0")/lib.bash"
NAMES=(--model-name 小鲸 "Little Whale" --model-author 鲸鱼工坊 "Whale Works")
# self-cognition records, one reply each
SC=$TMP/one.jsonl
for q in "Who are you?" "What is your name?" "Who made you?" "Hello"; do
    printf '{"query": "%s", "response": "I am {{NAME}}, made by {{AUTHOR}}."}\n' "$q"
done >"$SC"

# dense MODEL_TYPE VOCAB OUT EXTRA_JSON: a one-layer model of the variant covering a real tokenizer's ids
dense() {
    cat >"$TMP/cfg.json" <<JSON
{"model_type": "$1", "vocab_size": $2, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 512,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": true, $4}
JSON
    "$WHALE" init --preset "$TMP/cfg.json" --out "$3" --tokenizer "$TOK" >/dev/null 2>&1
}

run_variant() { # run_variant NAME TITLE TEMPLATE_MARK [SFT_OPTIONS...]
    local m=$TMP/$1 ck run name=$1 title=$2 mark=$3
    shift 3
    check "$name: init" test -s "$m/model.safetensors"
    "$WHALE" info -m "$m" >"$TMP/info" 2>&1
    check "$name: info names the variant" grep -q "architecture      $title" "$TMP/info"
    check "$name: info names the config fields it ignores" grep -q "^inert config .*use_cache" <(tr -s '\n ' ' ' <"$TMP/info" | sed 's/inert config/\ninert config/')
    check "$name: info shows what is stored" grep -q "^stored            F32: [0-9]* tensors" "$TMP/info"
    printf '[{"role": "user", "content": "Hi"}]' >"$TMP/msgs.json"
    "$WHALE" chat-template -m "$m" --messages "$TMP/msgs.json" --add-generation-prompt >"$TMP/tpl" 2>/dev/null
    check "$name: the folder's chat template renders" grep -qF "$mark" "$TMP/tpl"
    "$WHALE" sft -m "$m" --data "$SC" "${NAMES[@]}" --train-type lora --lora-rank 4 --max-steps 3 --batch-size 2 \
        --save-steps 3 --lr 1e-3 --dtype bf16 --out "$TMP/runs-$name" --quiet "$@" >/dev/null 2>"$TMP/err"
    local st=$?
    check "$name: LoRA sft ($(tail -1 "$TMP/err"))" test $st = 0
    run=$(ls -d "$TMP/runs-$name"/v0-* 2>/dev/null | head -1)
    ck=$run/checkpoint-3
    check "$name: 7 adapters of the layer in the checkpoint" \
        test "$(grep -ao 'lora_A' "$ck/adapter_model.safetensors" | wc -l)" = 7
    "$WHALE" generate -m "$m" --adapters "$ck" -p "Who are you?" -n 8 --temperature 0 >"$TMP/g_ad" 2>/dev/null
    check "$name: generate --adapters" test $? = 0
    "$WHALE" export --adapters "$ck" --merge-lora >/dev/null 2>&1
    "$WHALE" generate -m "$ck-merged" -p "Who are you?" -n 8 --temperature 0 >"$TMP/g_mg" 2>/dev/null
    check "$name: merged model = base + adapters (greedy text)" cmp -s "$TMP/g_ad" "$TMP/g_mg"
}

need_tokenizer llama3
dense llama 128256 "$TMP/llama" '"rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128009,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
 "original_max_position_embeddings": 64}'
# the short Llama 3 template of the tokenizer package always ends with the
# assistant header, so no reply can be masked (docs/chat-templates.md):
# train through Llama 3.1's
run_variant llama "Llama (model_type llama" '<|start_header_id|>assistant<|end_header_id|>' \
    --chat-template "$DATA/chat/templates/llama3_1.jinja"
check "llama: rope_scaling written back" grep -q '"rope_type":[[:space:]]*"llama3"' "$TMP/llama/config.json"

need_tokenizer qwen3
dense qwen3 151669 "$TMP/qwen3" '"eos_token_id": 151645, "dtype": "float32",
 "layer_types": ["full_attention"], "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}'
run_variant qwen3 "Qwen3 (model_type qwen3" '<|im_start|>assistant'
check "qwen3: rope_parameters written back" grep -q '"rope_parameters"' "$TMP/qwen3/config.json"
check "qwen3: dtype written, no torch_dtype added" \
    bash -c "grep -q '\"dtype\"' '$TMP/qwen3/config.json' && ! grep -q torch_dtype '$TMP/qwen3/config.json'"
# a RoPE type the engine does not implement: one line naming the file and field
sed 's/"default"/"longrope"/' "$TMP/qwen3/config.json" >"$TMP/bad.json"
expect_status 6 'bad.json: rope_parameters: rope_type "longrope" is not supported' -- \
    "$WHALE" init --preset "$TMP/bad.json" --out "$TMP/bad"
# info on a Qwen2 (sliding_window and max_window_layers in its config, as Qwen2.5's):
# what is stored, and the fields it accepts and ignores
"$WHALE" info -m "$DATA/qwen2-gqa2" >"$TMP/info" 2>&1
check "qwen2: info shows the stored dtype" grep -q '^stored            F32: [0-9]* tensors' "$TMP/info"
check "qwen2: info names sliding_window and max_window_layers as ignored" \
    grep -q '^inert config      sliding_window, max_window_layers (read only with use_sliding_window' "$TMP/info"
finish dense
