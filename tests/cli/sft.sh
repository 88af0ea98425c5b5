#!/usr/bin/env bash
# whale sft end to end on a tiny model: the loss mask as rendered, a LoRA
# run's folder layout, PEFT adapter files, --adapters for generate/chat,
# export --merge-lora (same greedy text as the adapters), an untouched base,
# full fine-tuning, and the errors.
# usage: sft.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
ROOT=$DATA/../..
. "$(dirname "$0")/lib.bash"
need_tokenizer deepseek_v3
tiny_model "$TMP/base" 128815 512
SC=$ROOT/data/self_cognition.jsonl
NAMES=(--model-name 小鲸 "Little Whale" --model-author 鲸鱼工坊 "Whale Works")

# the loss mask: exactly the assistant contents and each turn's end token
cat >"$TMP/multi.jsonl" <<'JSON'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name?"}, {"role": "assistant", "content": "{{NAME}}"}]}
{"query": "Who made you?", "response": "{{AUTHOR}}.", "tag": "en"}
JSON
"$WHALE" sft -m "$TMP/base" --data "$TMP/multi.jsonl" "${NAMES[@]}" --dry-run 2 >"$TMP/dry" 2>"$TMP/err"
check "dry run" test $? = 0
check "multi-turn: both replies and their end tokens are trained, nothing else" \
    grep -qxF 'Be brief.<｜User｜>Hi<｜Assistant｜>[[Hello!<｜end▁of▁sentence｜>]]<｜User｜>Name?<｜Assistant｜>[[{{NAME}}<｜end▁of▁sentence｜>]]' \
    <(grep -v '^input_ids: ' "$TMP/dry" | sed -n 2p | sed 's/^<｜begin▁of▁sentence｜>//')
check "self-cognition record: {{AUTHOR}} filled in English, only the reply trained" \
    grep -qxF '<｜begin▁of▁sentence｜><｜User｜>Who made you?<｜Assistant｜>[[Whale Works.<｜end▁of▁sentence｜>]]' <(grep -v '^input_ids: ' "$TMP/dry" | sed -n 4p)
"$WHALE" sft -m "$TMP/base" --data "$TMP/multi.jsonl" "${NAMES[@]}" --dry-run 1 --loss-scope all >"$TMP/dry" 2>/dev/null
check "--loss-scope all trains everything after the first token" \
    grep -qxF '<｜begin▁of▁sentence｜>[[Be brief.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>Name?<｜Assistant｜>{{NAME}}<｜end▁of▁sentence｜>]]' \
    <(grep -v '^input_ids: ' "$TMP/dry" | sed -n 2p)
DS_TOK=$TOK
need_tokenizer qwen3 # ChatML's special tokens are single tokens here
tiny_model "$TMP/base-qwen" 151669 512
"$WHALE" sft -m "$TMP/base-qwen" --data "$TMP/multi.jsonl" "${NAMES[@]}" --dry-run 2 --chat-template chatml >"$TMP/dry" 2>/dev/null
printf '%s\n' '--- sample 0' '<|im_start|>system' 'Be brief.<|im_end|>' '<|im_start|>user' 'Hi<|im_end|>' \
    '<|im_start|>assistant' '[[Hello!<|im_end|>]]' '<|im_start|>user' 'Name?<|im_end|>' '<|im_start|>assistant' \
    '[[{{NAME}}<|im_end|>]]' '' '--- sample 1' '<|im_start|>system' \
    'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>' '<|im_start|>user' \
    'Who made you?<|im_end|>' '<|im_start|>assistant' '[[Whale Works.<|im_end|>]]' '' >"$TMP/want"
check "ChatML: replies and their <|im_end|> trained, the default system turn added, the newline after not" \
    cmp -s <(grep -v '^input_ids: ' "$TMP/dry" | sed 's/^\(--- sample [0-9]\).*/\1/' | head -20) "$TMP/want"
TOK=$DS_TOK

# a LoRA run (ms-swift's spellings accepted)
sha_before=$(sha256sum "$TMP/base/model.safetensors")
"$WHALE" sft --model "$TMP/base" --dataset "$SC" "${NAMES[@]}" --tuner_type lora --lora_rank 4 --lora_alpha 8 \
    --max_steps 4 --per_device_train_batch_size 4 --gradient_accumulation_steps 1 --save_steps 2 \
    --save_total_limit 1 --logging_steps 1 --output_dir "$TMP/runs" --dtype bf16 --learning_rate 1e-3 \
    >"$TMP/res" 2>"$TMP/err"
check "LoRA run succeeds" test $? = 0
RUN=$(ls -d "$TMP"/runs/v0-*)
CK=$RUN/checkpoint-4
check "run folder vN-YYYYMMDD-HHMMSS" test -d "$RUN"
check "--save-total-limit 1 keeps only the last checkpoint" test "$(ls -d "$RUN"/checkpoint-* | wc -l)" = 1
for f in adapter_model.safetensors adapter_config.json args.json; do check "checkpoint has $f" test -s "$CK/$f"; done
check "run folder has args.json" test -s "$RUN/args.json"
check "logging.jsonl: one line per step and a summary" test "$(wc -l <"$RUN/logging.jsonl")" = 5
for k in '"loss"' '"grad_norm"' '"learning_rate"' '"epoch"' '"global_step/max_steps": "4/4"' '"elapsed_time"' \
    '"remaining_time"' '"memory(GiB)"' '"train_speed(s/it)"' '"train_runtime"'; do
    check "logging.jsonl has $k" grep -qF "$k" "$RUN/logging.jsonl"
done
check "memory breakdown: frozen base, trainable adapters" grep -q 'frozen base parameters, [0-9]* trainable adapter' "$TMP/err"
check "progress lines" grep -q 'step     4/4  loss' "$TMP/err"
check "the base checkpoint is untouched" test "$(sha256sum "$TMP/base/model.safetensors")" = "$sha_before"
if command -v python3 >/dev/null; then
    check "PEFT reads the adapter files (names, shapes, dtypes, config)" \
        python3 "$ROOT/tests/reference/check_adapter.py" "$CK" "$TMP/base" 4
fi
check "adapter_config records the recipe" grep -q '"lora_alpha":.8' "$CK/adapter_config.json"
check "args.json's command_line keeps 'sft' and the quoting" \
    grep -qF '"command_line":	"whale sft --model ' "$RUN/args.json"
check "... 'Little Whale' quoted" grep -qF "'Little Whale'" "$RUN/args.json"
check "gradient checkpointing is on by default, as in ms-swift" grep -q '"gradient_checkpointing":.true' "$RUN/args.json"

# validation: a held-out share, eval lines, the best checkpoint, --save_only_model, ms-swift's booleans
"$WHALE" sft -m "$TMP/base" --dataset "$SC" "${NAMES[@]}" --split_dataset_ratio 0.1 --eval_steps 2 --save_steps 2 \
    --max_steps 4 --per_device_train_batch_size 4 --gradient_accumulation_steps 1 --save_total_limit 1 \
    --gradient_checkpointing true --use_rslora false --save_only_model true --output_dir "$TMP/val" >"$TMP/res" 2>"$TMP/err"
check "a run with --split_dataset_ratio 0.1 --eval_steps 2" test $? = 0
VR=$(ls -d "$TMP"/val/v0-*)
check "8 of the 88 records held out" grep -q '^sft: validation: 8 samples' "$TMP/err"
check "eval progress lines" grep -q '^eval     2/4  eval_loss [0-9.]*  eval_token_acc [0-9.]*' "$TMP/err"
check "logging.jsonl: an eval line at steps 2 and 4" \
    test "$(grep -c '"eval_loss": [0-9.]*, "eval_token_acc": [0-9.]*, "eval_runtime"' "$VR/logging.jsonl")" = 2
check "the summary line names the best checkpoint" grep -q '"best_model_checkpoint": ".*checkpoint-[24]", "best_metric": [0-9.]' "$VR/logging.jsonl"
check "trainer_state.json: best_model_checkpoint and best_metric" \
    grep -q '"best_model_checkpoint":' "$VR/checkpoint-4/trainer_state.json"
check "... and the log history with eval_loss" grep -q '"eval_loss":' "$VR/checkpoint-4/trainer_state.json"
check "--save_only_model: no optimizer state" test ! -e "$VR/checkpoint-4/optimizer.safetensors"
check "args.json records the split and gradient checkpointing" \
    grep -q '"split_dataset_ratio":.0.1' "$VR/args.json"
check "... gradient_checkpointing true" grep -q '"gradient_checkpointing":.true' "$VR/args.json"
expect_status 3 'no optimizer state' -- "$WHALE" sft -m "$TMP/base" --data "$SC" "${NAMES[@]}" --split_dataset_ratio 0.1 \
    --max_steps 6 --batch-size 4 --grad-accum 1 --quiet --out "$TMP/val2" --resume "$VR/checkpoint-4"
for f in train_loss train_learning_rate train_grad_norm eval_loss eval_token_acc; do
    check "images/$f.svg, as ms-swift's images/" grep -q '^<svg ' "$VR/images/$f.svg"
done
check "whale plot reads an sft run (logging.jsonl)" "$WHALE" plot "$VR" --out "$TMP/val.svg"
check "... with the eval points" grep -q '<circle' "$TMP/val.svg"
# a validation file (FILE#N sampling): training on it lowers its loss and raises the token accuracy
"$WHALE" sft -m "$TMP/base" --data "$SC#8" --val_dataset "$SC#8" "${NAMES[@]}" --train_type full --max_steps 6 \
    --eval_steps 3 --batch-size 8 --grad-accum 1 --lr 3e-2 --out "$TMP/learn" --quiet >"$TMP/res" 2>&1
check "--val_dataset FILE#8" test "$(grep -c '"eval_loss"' "$(ls -d "$TMP"/learn/v0-*)/logging.jsonl")" = 2
check "eval_loss falls and eval_token_acc rises" awk -F'[:,]' 'BEGIN { n = 0 } /"eval_loss"/ { l[n] = $2; a[n] = $4; n++ }
    END { exit !(n == 2 && l[1] < l[0] && a[1] > a[0] && a[1] > 0 && a[1] <= 1) }' "$(ls -d "$TMP"/learn/v0-*)/logging.jsonl"
"$WHALE" sft -m "$TMP/base" --data "$SC#20" "${NAMES[@]}" --packing true --max-length 128 --dry-run 0 >"$TMP/dry" 2>/dev/null
check "FILE#20 draws 20 samples; --packing true" grep -q '"samples": 20,' "$TMP/dry"
expect_status 3 'not downloaded' -- "$WHALE" sft -m "$TMP/base" --data "AI-ModelScope/alpaca-gpt4-data-zh#500" --dry-run 0

# Hugging Face's step count: 88 records at a total batch of 16 are 6 steps per epoch, the last of 8 rows
"$WHALE" sft -m "$TMP/base" --data "$SC" "${NAMES[@]}" --num_train_epochs 1 --batch-size 4 --grad-accum 4 \
    --logging-steps 1 --gradient_checkpointing false --out "$TMP/hf-steps" >"$TMP/res" 2>"$TMP/err"
check "88 records, batch 4 x 4: 6 steps for one epoch" grep -q '6 steps of 4 × 4 rows (1 epochs)' "$TMP/err"
check "--gradient_checkpointing false turns it off" \
    grep -q '"gradient_checkpointing":.false' "$(ls -d "$TMP"/hf-steps/v0-*)/args.json"
check "... step 5 ends at 80/88 of the epoch, step 6 at its end" \
    grep -q '"epoch": 0.9091, "global_step/max_steps": "5/6"' "$(ls -d "$TMP"/hf-steps/v0-*)/logging.jsonl"
check "... (epoch 1.0 at step 6)" grep -q '"epoch": 1.0000, "global_step/max_steps": "6/6"' \
    "$(ls -d "$TMP"/hf-steps/v0-*)/logging.jsonl"

# --resume continues exactly: the same adapters as the uninterrupted run
RS=(-m "$TMP/base" --data "$SC" "${NAMES[@]}" --max-steps 4 --batch-size 2 --grad-accum 2 --save-steps 2 --lr 1e-3 --quiet)
"$WHALE" sft "${RS[@]}" --out "$TMP/rs-full" >/dev/null 2>&1
"$WHALE" sft "${RS[@]}" --out "$TMP/rs-res" --resume_from_checkpoint "$(ls -d "$TMP"/rs-full/v0-*/checkpoint-2)" >/dev/null 2>&1
check "resume: the run goes on from checkpoint-2" test $? = 0
check "resume: checkpoint-4's adapters equal the uninterrupted run's" \
    cmp -s "$(ls -d "$TMP"/rs-full/v0-*/checkpoint-4)/adapter_model.safetensors" \
    "$(ls -d "$TMP"/rs-res/v0-*/checkpoint-4)/adapter_model.safetensors"
expect_status 2 'trained with other settings' -- "$WHALE" sft -m "$TMP/base" --data "$SC" "${NAMES[@]}" --max-steps 4 \
    --batch-size 1 --grad-accum 2 --quiet --out "$TMP/rs-bad" --resume "$(ls -d "$TMP"/rs-full/v0-*/checkpoint-2)"
check "a refused resume leaves no run folder" test ! -e "$TMP/rs-bad/v0-"*
expect_status 2 'nothing left to train' -- "$WHALE" sft "${RS[@]}" --out "$TMP/rs-done" \
    --resume "$(ls -d "$TMP"/rs-full/v0-*/checkpoint-4)"
expect_status 3 'trainer_state.json' -- "$WHALE" sft "${RS[@]}" --out "$TMP/rs-none" --resume "$TMP/base"

# the adapters alone find the base; the merged model generates the same text
"$WHALE" generate --adapters "$CK" -p "Who are you?" -n 12 --temperature 0 >"$TMP/g_ad" 2>/dev/null
check "generate --adapters (base from args.json)" test $? = 0
"$WHALE" generate -m "$TMP/base" --adapters "$CK" -p "Who are you?" -n 12 --temperature 0 >"$TMP/g_ad2" 2>/dev/null
check "generate -m BASE --adapters" cmp -s "$TMP/g_ad" "$TMP/g_ad2"
"$WHALE" export --adapters "$CK" --merge-lora 2>/dev/null
check "export --merge-lora writes CKPT-merged" test -s "$CK-merged/model.safetensors"
"$WHALE" generate -m "$CK-merged" -p "Who are you?" -n 12 --temperature 0 >"$TMP/g_mg" 2>/dev/null
check "merged model = base + adapters (greedy text)" cmp -s "$TMP/g_ad" "$TMP/g_mg"
# a BF16 base merges into BF16, with generation_config.json and the tokenizer files
"$WHALE" export -m "$TMP/base" --dtype bf16 --out "$TMP/base16" 2>/dev/null
echo '{"temperature": 0.7, "top_p": 0.8}' >"$TMP/base16/generation_config.json"
"$WHALE" export -m "$TMP/base16" --adapters "$CK" --merge_lora true --out "$TMP/m16" 2>"$TMP/err"
check "export --merge_lora true from a bf16 base" grep -q '^export: wrote .* (bf16, .* merged with LoRA' "$TMP/err"
check "... reports the planned memory and peak RSS" grep -q 'planned .* MiB, peak RSS .* MiB' "$TMP/err"
check "... keeps bfloat16 in config.json" grep -q '"bfloat16"' "$TMP/m16/config.json"
for f in generation_config.json tokenizer.json tokenizer_config.json; do check "... copies $f" test -s "$TMP/m16/$f"; done
check "... half the fp32 merge's size" test "$(stat -c %s "$TMP/m16/model.safetensors")" -lt \
    "$(( $(stat -c %s "$CK-merged/model.safetensors") * 51 / 100 ))"
expect_status 7 'needs an estimated .* GiB' -- "$WHALE" export --adapters "$CK" --merge-lora --memory-limit 0.000001 \
    --out "$TMP/m-nomem"
check "a refused export writes nothing" test ! -e "$TMP/m-nomem"
printf 'Who are you?\n' | "$WHALE" chat --adapters "$CK" -n 8 --temperature 0 >/dev/null 2>&1
check "chat --adapters" test $? = 0
"$WHALE" chat-eval --adapters "$CK" --data "$ROOT/data/self_cognition_eval.jsonl" "${NAMES[@]}" -n 4 >"$TMP/ev" 2>/dev/null
check "chat-eval scores the held-out questions" grep -q '"questions": 26' "$TMP/ev"

# LoRA on an int8 base: the base held in int8 and frozen, the adapters trained
sha_before=$(sha256sum "$TMP/base/model.safetensors")
"$WHALE" sft -m "$TMP/base" --data "$SC" "${NAMES[@]}" --train-type lora --dtype int8 --lora-rank 4 --max-steps 2 \
    --batch-size 2 --grad-accum 1 --lr 1e-3 --logging-steps 1 --out "$TMP/i8" >"$TMP/res8" 2>"$TMP/err8"
check "LoRA on an int8 base succeeds: $(tail -1 "$TMP/err8")" test $? = 0
check "the int8 run reports a finite loss" grep -Eq '"loss": [0-9]+\.[0-9]+' "$TMP/res8"
check "the int8 base is held as int8 copies" grep -q 'int8 copies of the product weights' "$TMP/err8"
check "the int8 run trains only the adapters" grep -q 'frozen base parameters, [0-9]* trainable adapter' "$TMP/err8"
I8K=$(ls -d "$TMP"/i8/v0-*/checkpoint-2 2>/dev/null)
check "the int8 run writes PEFT adapter files" test -s "$I8K/adapter_model.safetensors" -a -s "$I8K/adapter_config.json"
"$WHALE" generate -m "$TMP/base" --adapters "$I8K" -p "Hi" -n 4 --temperature 0 >/dev/null 2>&1
check "adapters trained on the int8 base load on the base" test $? = 0
check "the int8 run leaves the base checkpoint untouched" test "$(sha256sum "$TMP/base/model.safetensors")" = "$sha_before"
expect_status 2 'int8 is an inference format.*--train-type lora' -- \
    "$WHALE" sft -m "$TMP/base" --data "$SC" --train-type full --dtype int8 --max-steps 1 --out "$TMP/o"

# full fine-tuning writes loadable models
"$WHALE" sft -m "$TMP/base" --data "$SC" "${NAMES[@]}" --train-type full --max-steps 2 --batch-size 2 \
    --grad-accum 1 --out "$TMP/full" --quiet >/dev/null 2>&1
check "full fine-tuning succeeds" test $? = 0
FK=$(ls -d "$TMP"/full/v0-*/checkpoint-2)
check "full checkpoint is a model folder" test -s "$FK/model.safetensors" -a -s "$FK/config.json" -a -s "$FK/tokenizer.json"
"$WHALE" generate -m "$FK" -p "Hi" -n 4 --temperature 0 >/dev/null 2>&1
check "the fine-tuned model loads" test $? = 0

# errors: one line, the right status, nothing left behind
expect_status 7 'needs an estimated .* GiB.*--memory-limit' -- \
    "$WHALE" sft -m "$TMP/base" --data "$SC" "${NAMES[@]}" --max-steps 1 --out "$TMP/nofit" --memory-limit 0.01 --quiet
check "a refused run leaves no run folder" test ! -e "$TMP/nofit/v0-"*
printf '{"query": "Hi", "response": "Hello"}\n{"query": "Hi"}\n' >"$TMP/bad.jsonl"
expect_status 4 'bad.jsonl:2: "response": missing' -- \
    "$WHALE" sft -m "$TMP/base" --data "$TMP/bad.jsonl" --bad-records error --max-steps 1 --out "$TMP/o"
expect_status 4 'bad.jsonl:2: ' -- "$WHALE" sft -m "$TMP/base" --data "$TMP/bad.jsonl" --strict --max-steps 1 --out "$TMP/o"
# by default (ms-swift's strict=False) a bad record is skipped, counted and reported at the end
"$WHALE" sft -m "$TMP/base" --data "$TMP/bad.jsonl" --max-steps 1 --out "$TMP/skip" --dry-run 0 >"$TMP/dry" 2>"$TMP/dry.err"
check "bad records are skipped by default" grep -q '"skipped": 1' "$TMP/dry"
check "and reported with FILE:LINE and the field" grep -q 'skipped 1 bad record.*bad.jsonl:2: "response": missing' "$TMP/dry.err"
"$WHALE" sft -m "$TMP/base" --data "$TMP/bad.jsonl" "${NAMES[@]}" --max-steps 1 --out "$TMP/skip" --quiet \
    >/dev/null 2>"$TMP/run.err"
check "a training run reports the skipped records at its end" grep -q 'skipped 1 bad record.*bad.jsonl:2:' "$TMP/run.err"
# .csv with ms-swift's columns
printf 'system,query,response\n,"Who are you, really?","I am {{NAME}}."\nBe brief.,Hi,Hello\n,no reply,\n' >"$TMP/data.csv"
"$WHALE" sft -m "$TMP/base" --data "$TMP/data.csv" --max-steps 1 --out "$TMP/csv" --dry-run 0 >"$TMP/dry" 2>"$TMP/dry.err"
check ".csv rows are records" grep -q '"records": 3, "samples": 2, "skipped": 1' "$TMP/dry"
check "a bad .csv row is named by its line" grep -q 'data.csv:4: "response": missing' "$TMP/dry.err"
expect_status 3 'missing.jsonl' -- "$WHALE" sft -m "$TMP/base" --data "$TMP/missing.jsonl" --out "$TMP/o"
expect_status 2 'must be lora or full' -- "$WHALE" sft -m "$TMP/base" --data "$SC" --train-type qlora
expect_status 2 'needs --merge-lora' -- "$WHALE" export --adapters "$CK"
expect_status 2 'needs --adapters' -- "$WHALE" export -m "$TMP/base" --merge-lora
printf '{"query": "Who are you?", "tag": "en"}\n{"query": 7}\n' >"$TMP/bad-eval.jsonl"
expect_status 4 'bad-eval.jsonl:2: ' -- "$WHALE" chat-eval --adapters "$CK" --data "$TMP/bad-eval.jsonl" "${NAMES[@]}" -n 2
mkdir "$TMP/noargs" && cp "$CK"/adapter_* "$TMP/noargs/"
expect_status 3 'no args.json' -- "$WHALE" generate --adapters "$TMP/noargs" -p hi -n 2
"$WHALE" generate -m "$TMP/base" --adapters "$TMP/noargs" -p hi -n 2 >/dev/null 2>&1
check "-m BASE makes args.json unnecessary" test $? = 0
expect_status 2 'needs --max-length' -- "$WHALE" sft -m "$TMP/base" --data "$SC" --packing --out "$TMP/o"
expect_status 3 'cannot' -- "$WHALE" sft -m "$TMP/base" --data "$SC" "${NAMES[@]}" --max-steps 1 --out /proc/whale-out --quiet

finish sft
