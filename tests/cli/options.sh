#!/usr/bin/env bash
# One option grammar: booleans as flags or true/false/1/0, ms-swift and
# swift infer spellings, notes for options that change nothing here; and
# the rough edges a new user meets: 'whale' alone lists every command,
# generate's help and output, informational lines without the error
# prefix, init's progress, chat's --multi-turn and --ctx-size, whale info's
# stored dtype.
# usage: options.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
ROOT=$DATA/../..
. "$(dirname "$0")/lib.bash"
need_tokenizer deepseek_v3
tiny_model "$TMP/m" 128815 512

# whale with no arguments: every command of the dispatch table, status 2
"$WHALE" >"$TMP/out" 2>"$TMP/err"
check "'whale' alone is a usage error (status 2)" test $? = 2
check "... of one line on stderr" test "$(wc -l <"$TMP/err")" = 1
for c in info init score generate bench chat chat-eval chat-template grad tokenizer data train sft eval export \
    precision-report plot tokenize detokenize diagnose memory; do
    check "'whale' alone lists $c" grep -q "^  $c " "$TMP/out"
done

# generate: the help, the output's last newline, the stderr lines' prefix
"$WHALE" generate --help >"$TMP/help"
check "generate --help names every dtype" grep -q -- '--dtype fp32|bf16|fp16|int8' "$TMP/help"
check "generate --help says generation_config.json replaces the defaults" grep -q 'generation_config.json replaces' "$TMP/help"
"$WHALE" generate -m "$TMP/m" -p "Hello" -n 4 --temperature 0 >"$TMP/g1" 2>"$TMP/err"
check "generate -p ends its text with a newline" test "$(tail -c 1 "$TMP/g1" | od -An -c | tr -d ' ')" = '\n'
check "generate's informational lines are not errors (no 'whale:' prefix)" test "$(grep -c '^whale:' "$TMP/err")" = 0
check "... but 'generate: seed'" grep -q '^generate: seed ' "$TMP/err"
# swift infer's spellings, --stream false, --infer_backend with a note
"$WHALE" generate -m "$TMP/m" -p "Hello" --max_new_tokens 4 --temperature 0 --top_k 5 --top_p 0.9 \
    --repetition_penalty 1.0 --stream false --infer_backend vllm >"$TMP/g2" 2>"$TMP/err"
check "generate takes --max_new_tokens, --top_k, --top_p, --repetition_penalty, --stream false" test $? = 0
check "... the same text as streamed" cmp -s "$TMP/g1" "$TMP/g2"
"$WHALE" generate -m "$TMP/m" -p "Hello" -n 4 --temperature 0 --stream 0 --nan-check 1 >"$TMP/g3" 2>/dev/null
check "booleans take 1 / 0 too (--stream 0 --nan-check 1)" cmp -s "$TMP/g1" "$TMP/g3"
check "... --infer_backend: a one-line note" grep -q '^generate: note: --infer_backend vllm: whale runs its own engine' "$TMP/err"
"$WHALE" generate -m "$TMP/m" --ids 1,2,3 -n 2 --ignore-eos true --nan-check false --temperature 0 >/dev/null 2>&1
check "booleans take true / false" test $? = 0
expect_status 2 'unexpected argument "maybe"' -- "$WHALE" generate -m "$TMP/m" --ids 1,2 --ignore-eos maybe
expect_status 2 '--top_k needs a value' -- "$WHALE" generate -m "$TMP/m" --ids 1,2 --top_k
expect_status 2 'unknown option "--bogus"' -- "$WHALE" generate -m "$TMP/m" --ids 1,2 --bogus 1
expect_status 5 'exceeds --ctx-size 8' -- "$WHALE" generate -m "$TMP/m" --ids 1,2,3 -n 20 --ctx-size 8 --dtype fp32

# chat: each piped line on its own with --multi-turn false; --ctx-size bounds the session
printf 'Hello\nHello\n' | "$WHALE" chat -m "$TMP/m" -n 5 --temperature 0 --multi-turn false >"$TMP/c1" 2>/dev/null
check "chat --multi-turn false: the same message, the same reply" \
    test "$(sed -n 1p "$TMP/c1")" = "$(sed -n 2p "$TMP/c1")" -a "$(wc -l <"$TMP/c1")" = 2
printf 'Hello\n' | "$WHALE" chat -m "$TMP/m" --max_new_tokens 5 --temperature 0 --stream false --infer_backend pt \
    >"$TMP/c2" 2>"$TMP/err"
check "chat takes swift infer's options" cmp -s <(sed -n 1p "$TMP/c1") "$TMP/c2"
check "... with a note for --infer_backend" grep -q '^chat: note: --infer_backend pt' "$TMP/err"
printf 'one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen\n' |
    "$WHALE" chat -m "$TMP/m" -n 4 --ctx-size 16 >/dev/null 2>"$TMP/err"
check "chat --ctx-size 16: a longer message fills the session" grep -q "^chat: the conversation .* fills the model's 16 positions" "$TMP/err"
if command -v script >/dev/null; then # the banner, on a terminal
    printf 'exit\n' | script -qec "'$WHALE' chat -m '$TMP/m' -n 2 --ctx-size 64" /dev/null 2>&1 | tr -d '\r' >"$TMP/tty"
    check "the chat banner is sized by --ctx-size" grep -q '^chat: .* template, 64 positions (--ctx-size N to change)' "$TMP/tty"
fi
printf 'Hi\n' | "$WHALE" chat -m "$TMP/m" -n 2 --max_model_len 64 >/dev/null 2>&1
check "chat --max_model_len" test $? = 0
"$WHALE" chat-eval -m "$TMP/m" --data "$ROOT/data/self_cognition_eval.jsonl" --model_name 小鲸 "Little Whale" \
    --model_author 鲸鱼工坊 "Whale Works" --max_new_tokens 2 >"$TMP/ev" 2>/dev/null
check "chat-eval --model_name / --model_author / --max_new_tokens" grep -q '"questions": 26' "$TMP/ev"

# init shows progress for a large model; info shows what is stored
"$WHALE" init --preset debug --dtype bf16 --out "$TMP/dbg" 2>"$TMP/err"
check "init of a 16.8M-parameter preset shows progress" grep -q 'init: 100.0% of 16.8M parameters' <(tr '\r' '\n' <"$TMP/err")
check "... and 'init: wrote', not 'whale:'" grep -q '^init: wrote ' <(tr '\r' '\n' <"$TMP/err")
"$WHALE" info -m "$TMP/dbg" >"$TMP/info"
check "info shows the stored dtype and the config's" grep -q '^stored            BF16: [0-9]* tensors, .* MiB (config: bfloat16)' "$TMP/info"
# dtypes as users expect: a BF16 checkpoint runs in bf16 unless told otherwise; memory checked up front
"$WHALE" generate -m "$TMP/dbg" --ids 1,2,3 -n 2 --temperature 0 >/dev/null 2>"$TMP/err"
check "generate on a BF16 checkpoint runs in bf16" grep -q "^generate: bf16, the checkpoint's dtype" "$TMP/err"
check "... and its memory line says so" grep -q '^generate: memory: weights .* (bf16 ' "$TMP/err"
"$WHALE" generate -m "$TMP/dbg" --ids 1,2,3 -n 2 --temperature 0 --dtype fp32 >/dev/null 2>"$TMP/err"
check "--dtype fp32 overrides it" grep -q '^generate: memory: weights .* fp32' "$TMP/err"
expect_status 7 'needs an estimated .* GiB .* but --memory-limit is' -- "$WHALE" generate -m "$TMP/dbg" --ids 1,2 -n 2 --dtype bf16 \
    --memory-limit 0.01
expect_status 7 'with 512 positions needs an estimated .* smaller --ctx-size' -- "$WHALE" chat -m "$TMP/m" \
    --memory-limit 0.0001
expect_status 7 'with 4 slots of 512 positions needs an estimated .* fewer --parallel slots' -- "$WHALE" serve \
    -m "$TMP/m" --port 0 --memory-limit 0.0001
expect_status 7 'with 3 slots of 64 positions needs an estimated' -- "$WHALE" serve -m "$TMP/m" --port 0 \
    --parallel 3 --ctx-size 64 --memory-limit 0.0001
"$WHALE" export -m "$TMP/m" --dtype bf16 --out "$TMP/m16" 2>/dev/null
"$WHALE" sft -m "$TMP/m16" --data "$ROOT/data/self_cognition.jsonl#4" --model-name a b --model-author c d --max-steps 1 \
    --grad-accum 1 --out "$TMP/sft16" >/dev/null 2>"$TMP/err"
check "sft on a BF16 checkpoint trains in bf16" grep -q "^sft: bfloat16, the checkpoint's dtype" "$TMP/err"
check "... recorded in args.json" grep -q '"torch_dtype":.*"bfloat16"' "$(ls -d "$TMP"/sft16/v0-*)/args.json"

# "--" ends the options: what follows is an argument, even a name like an option
printf '{"step":1,"loss":3.0}\n{"step":2,"loss":2.5}\n' >"$TMP/-run.jsonl"
cd "$TMP" || exit 1
"$WHALE" plot --out dash.svg -- -run.jsonl >/dev/null 2>&1
check "plot -- -run.jsonl: a file named like an option, after --" grep -q '<svg' dash.svg
expect_status 2 'unknown option "-run.jsonl"' -- "$WHALE" plot --out dash2.svg -run.jsonl
check "... and without --, an unknown option writes nothing" test ! -e dash2.svg
cd - >/dev/null || exit 1
expect_status 2 'unknown option "--"' -- "$WHALE" generate -m "$TMP/m" --ids 1,2 -- --out
finish options
