#!/usr/bin/env bash
# Text in, text out through the CLI with the real DeepSeek-V3 tokenizer
# (fetched by scripts/fetch-tokenizers.sh).
# usage: text.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"
need_tokenizer deepseek_v3

# tokenize / detokenize round trip, pieces shown
text='你是谁？我是由 nanowhale 开发的 AI 助手。Hello, world! 12345'
ids=$("$WHALE" tokenize -m "$TOK" "$text")
check "tokenize prints ids" grep -Eq '^[0-9]+(,[0-9]+)+$' <<<"$ids"
back=$("$WHALE" detokenize -m "$TOK" --ids "$ids")
check "detokenize(tokenize(s)) == s" test "$back" = "$text"
"$WHALE" tokenize -m "$TOK" --show "Hello world" >"$TMP/show"
check "--show lists one piece per line" test "$(wc -l <"$TMP/show")" = 2
"$WHALE" tokenize -m "$TOK" "<｜User｜>hi<｜Assistant｜>" >"$TMP/special"
check "chat markers are single ids" grep -q '^128803,' "$TMP/special"

# a tiny model that uses this tokenizer (its embedding must cover every id)
tiny_model "$TMP/model" 128815 64
check "init copies the tokenizer" test -s "$TMP/model/tokenizer.json"
"$WHALE" generate -m "$TMP/model" -p "Once upon a time" -n 12 --seed 3 --ignore-eos >"$TMP/gen" 2>"$TMP/err"
check "generate -p streams text and reports speed" grep -q 'generated 12 tokens' "$TMP/err"
check "generated text is valid UTF-8" iconv -f UTF-8 -t UTF-8 "$TMP/gen" -o /dev/null
"$WHALE" generate -m "$TMP/model" -p "" -n 4 >/dev/null 2>"$TMP/err"
check "empty prompt is an error" grep -q 'prompt is empty' "$TMP/err"
"$WHALE" init --preset tiny --out "$TMP/small" --tokenizer "$TOK" 2>"$TMP/err"
check "a tokenizer larger than the embedding is refused" grep -q 'the tokenizer has 128815 ids but the model' "$TMP/err"

finish text
