#!/usr/bin/env bash
# whale data prepare / info end to end, with a small byte-level tokenizer
# made here (no download): outputs, counts, determinism, shard splitting,
# error exits, and that a failed run leaves no files behind.
# usage: data.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
. "$(dirname "$0")/lib.bash"
# run CMD...: sets $status, stdout in $TMP/out, stderr in $TMP/err
run() {
    "$@" >"$TMP/out" 2>"$TMP/err"
    status=$?
}
status_is() { [ "$status" = "$1" ] || { echo "  exit status $status, want $1; stderr: $(cat "$TMP/err")" >&2; false; }; }
err_has() { grep -qF -- "$1" "$TMP/err" || { echo "  stderr lacks \"$1\": $(cat "$TMP/err")" >&2; false; }; }
one_line_err() { [ "$(wc -l <"$TMP/err")" = 1 ]; }
absent() { [ ! -e "$1" ]; }

# tokenizer: the 256 byte characters (as \u escapes), merges "Ġ t", "h e",
# "Ġt he", and <|eos|> (id 259) as EOS in tokenizer_config.json
mktok() {
    local dir=$1 with_eos=$2 b cp n=0 sep=""
    mkdir -p "$dir"
    {
        printf '{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":259,"content":"<|eos|>",'
        printf '"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,'
        printf '"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},'
        printf '"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},'
        printf '"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,'
        printf '"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{'
        for ((b = 0; b < 256; b++)); do
            if (((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae)); then
                cp=$b
            else
                cp=$((0x100 + n))
                n=$((n + 1))
            fi
            printf '%s"\\u%04x":%d' "$sep" "$cp" "$b"
            sep=,
        done
        printf ',"\\u0120t":256,"he":257,"\\u0120the":258},"merges":[["\\u0120","t"],["h","e"],["\\u0120t","he"]]}}'
    } >"$dir/tokenizer.json"
    if [ "$with_eos" = 1 ]; then echo '{"eos_token": "<|eos|>"}' >"$dir/tokenizer_config.json"; fi
}
mktok "$TMP/tok" 1
mktok "$TMP/tok-noeos" 0

printf 'the whale sings\n\nin the deep\r\nblue sea\nthe end of the lines\n' >"$TMP/a.txt"
printf '{"text": "first record"}\n\n{"text": ""}\n{"id": 3, "text": "the third one"}\n' >"$TMP/b.jsonl"
for i in $(seq 1 40); do echo "line number $i of the long file"; done >"$TMP/long.txt"

# a dataset: 4 lines + 2 records = 6 documents, 2 of them for validation
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/d1" --doc-split line --val-docs 2 --seed 3 --quiet \
    "$TMP/a.txt" "$TMP/b.jsonl"
check "prepare succeeds" status_is 0
check "summary on stdout" grep -q '^data: 6 documents, .*train 4 documents.* val 2 ' "$TMP/out"
check "--quiet: nothing on stderr" test ! -s "$TMP/err"
check "meta.json, train and val shards" test -s "$TMP/d1/meta.json" -a -s "$TMP/d1/train-00000.bin" -a -s "$TMP/d1/val.bin"
check "shards start with WHALETOK" test "$(head -c 8 "$TMP/d1/train-00000.bin")" = WHALETOK
check "uint16 tokens for a small vocabulary" test "$(od -An -tu4 -j12 -N4 "$TMP/d1/val.bin" | tr -d ' ')" = 2
check "no temporary files" test -z "$(ls "$TMP/d1" | grep tmp)"
check "meta.json counts documents" grep -q '"documents":[[:space:]]*4' "$TMP/d1/meta.json"
check "meta.json has the EOS id" grep -q '"eos_id":[[:space:]]*259' "$TMP/d1/meta.json"
run "$WHALE" data info "$TMP/d1" --seq 4
check "info succeeds" status_is 0
check "info lists both splits" grep -q '^val   .* 2 documents, 1 shard, [0-9]* windows of 4' "$TMP/out"

# the same inputs and seed give the same bytes
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/d2" --doc-split line --val-docs 2 --seed 3 \
    "$TMP/a.txt" "$TMP/b.jsonl"
check "second run" status_is 0
check "deterministic train shard" cmp -s "$TMP/d1/train-00000.bin" "$TMP/d2/train-00000.bin"
check "deterministic val shard" cmp -s "$TMP/d1/val.bin" "$TMP/d2/val.bin"

# shards split between documents
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/d3" --doc-split line --shard-tokens 100 "$TMP/long.txt"
check "small shards" status_is 0
nshards=$(ls "$TMP/d3" | grep -c '^train-.*\.bin$')
check "several train shards ($nshards)" test "$nshards" -gt 3
check "summary counts the shards" grep -q "in $nshards shards" "$TMP/out"
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/d3" "$TMP/long.txt"
check "an existing dataset is not replaced" status_is 2
check "  ... and says how" err_has "overwrite"
check "  ... and is left alone" test -e "$TMP/d3/train-00001.bin"
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/d3" --overwrite --shard-tokens 1k "$TMP/long.txt"
check "--overwrite replaces it" status_is 0
check "  ... and removes the old extra shards" absent "$TMP/d3/train-00001.bin"

# JSONL problems: file:line, or skipped and counted
printf '{"text": "good"}\n{"text": "bad"\n{"text": "also good"}\n' >"$TMP/bad.jsonl"
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e1" "$TMP/bad.jsonl"
check "malformed JSONL: exit 4" status_is 4
check "  ... names file:line" err_has "bad.jsonl:2: invalid JSON"
check "  ... one line" one_line_err
check "  ... no output" absent "$TMP/e1"
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e1" --skip-bad-records --quiet "$TMP/bad.jsonl"
check "--skip-bad-records" status_is 0
check "  ... reports the skipped record" err_has "skipped 1 bad record; the first: $TMP/bad.jsonl:2: invalid JSON"
printf '{"title": "x"}\n' >"$TMP/field.jsonl"
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e2" "$TMP/field.jsonl"
check "missing text field: exit 4" status_is 4
check "  ... names the field" err_has 'field.jsonl:1: no field "text"'
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e2" --text-field title --quiet "$TMP/field.jsonl"
check "--text-field" status_is 0

# other errors: exit status, one line, nothing left behind
: >"$TMP/empty.txt"
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e3" "$TMP/empty.txt"
check "empty corpus: exit 4" status_is 4
check "  ... says so" err_has "no documents"
check "  ... no output" absent "$TMP/e3"
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e3" "$TMP/a.txt" "$TMP/nope.txt"
check "unreadable input: exit 3" status_is 3
check "  ... names it" err_has "nope.txt: cannot open"
check "  ... no output" absent "$TMP/e3"
run "$WHALE" data prepare --tokenizer "$TMP/tok-noeos" --out "$TMP/e3" "$TMP/a.txt"
check "tokenizer without EOS: exit 4" status_is 4
check "  ... says so" err_has "no EOS token"
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/a.txt/sub" "$TMP/a.txt"
check "unwritable output: exit 3" status_is 3
check "  ... names it" err_has "a.txt/sub"
run "$WHALE" data prepare --tokenizer "$TMP/nothing" --out "$TMP/e3" "$TMP/a.txt"
check "missing tokenizer: exit 3" status_is 3

# usage errors
run "$WHALE" data prepare --out "$TMP/e4" "$TMP/a.txt"
check "no --tokenizer: exit 2" status_is 2
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e4"
check "no inputs: exit 2" status_is 2
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e4" --doc-split words "$TMP/a.txt"
check "bad --doc-split: exit 2" status_is 2
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e4" --val-fraction 1.5 "$TMP/a.txt"
check "bad --val-fraction: exit 2" status_is 2
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e4" --shard-tokens 0 "$TMP/a.txt"
check "bad --shard-tokens: exit 2" status_is 2
run "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/e4" --val-docs 6 --doc-split line "$TMP/a.txt"
check "--val-docs larger than the corpus: exit 2" status_is 2
check "  ... no output" absent "$TMP/e4"
run "$WHALE" data prepare --frobnicate
check "unknown option: exit 2" status_is 2
run "$WHALE" data
check "no subcommand: exit 2" status_is 2
run "$WHALE" data shuffle
check "unknown subcommand: exit 2" status_is 2
run "$WHALE" data prepare --help
check "prepare --help" status_is 0
check "  ... documents --doc-split" grep -q -- "--doc-split" "$TMP/out"

# info finds corrupt shards
cp -r "$TMP/d1" "$TMP/bad"
truncate -s -5 "$TMP/bad/val.bin"
run "$WHALE" data info "$TMP/bad"
check "truncated shard: exit 4" status_is 4
check "  ... names the shard" err_has "val.bin"
check "  ... one line" one_line_err
printf 'XHALETOK' | dd of="$TMP/d2/train-00000.bin" conv=notrunc status=none
run "$WHALE" data info "$TMP/d2"
check "bad magic: exit 4" status_is 4
check "  ... names the shard" err_has "train-00000.bin: not a token shard"
run "$WHALE" data info "$TMP/nowhere"
check "no dataset: exit 3" status_is 3

# a real tokenizer with more than 65536 ids stores uint32 (when fetched)
REAL=${WHALE_TOKENIZERS:-$2/../../.cache/tokenizers}/deepseek_v3
if [ -s "$REAL/tokenizer.json" ]; then
    run "$WHALE" data prepare --tokenizer "$REAL" --out "$TMP/r" --doc-split line --quiet "$TMP/long.txt"
    check "real tokenizer" status_is 0
    check "uint32 tokens for a large vocabulary" test "$(od -An -tu4 -j12 -N4 "$TMP/r/train-00000.bin" | tr -d ' ')" = 4
else
    echo "data.sh: $REAL missing, uint32 case skipped (scripts/fetch-tokenizers.sh)" >&2
fi

finish data
