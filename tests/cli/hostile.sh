#!/usr/bin/env bash
# Hostile inputs: every one ends within seconds with one error line naming
# the file and the problem and the right exit status (docs/security.md),
# never a hang, a huge allocation or an "internal" error.
# usage: hostile.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
TINY=$(cd "$DATA/tiny" && pwd)
. "$(dirname "$0")/lib.bash"

# Each command runs under a time limit and an address-space limit (skipped
# under the sanitizers, whose shadow memory needs terabytes of addresses).
# The limit is wall time on a shared machine: every case needs at most a
# few seconds of CPU (the costly-regex ones stop at their work budget).
LIMIT=60
VMEM_KB=$((4 * 1024 * 1024))
run_bounded() {
    if [ "${WHALE_SANITIZED:-0}" = 1 ]; then
        timeout -s KILL $((LIMIT * 3)) "$@"
    else
        (ulimit -v $VMEM_KB && exec timeout -s KILL $LIMIT "$@")
    fi
}

# fails STATUS PATTERN -- command...: bounded, that exit status, one stderr
# line matching PATTERN
fails() {
    local status=$1 pattern=$2
    shift 3
    expect_status "$status" "$pattern" -- run_bounded "$@"
}

# a copy of the tiny model whose files the test may replace
model_copy() { # model_copy DIR
    mkdir -p "$1" && cp "$TINY"/config.json "$TINY"/model.safetensors "$1"/
}

# ---- files that are not regular files
model_copy "$TMP/fifo-config" && rm "$TMP/fifo-config/config.json" && mkfifo "$TMP/fifo-config/config.json"
fails 3 'fifo-config/config.json: is a FIFO, not a regular file' -- "$WHALE" info -m "$TMP/fifo-config"
model_copy "$TMP/fifo-st" && rm "$TMP/fifo-st/model.safetensors" && mkfifo "$TMP/fifo-st/model.safetensors"
fails 3 'fifo-st/model.safetensors: is a FIFO, not a regular file' -- "$WHALE" info -m "$TMP/fifo-st"
model_copy "$TMP/fifo-shard" && rm "$TMP/fifo-shard/model.safetensors" && mkfifo "$TMP/fifo-shard/shard-1.safetensors"
echo '{"weight_map": {"model.embed_tokens.weight": "shard-1.safetensors"}}' >"$TMP/fifo-shard/model.safetensors.index.json"
fails 3 'fifo-shard/shard-1.safetensors: is a FIFO, not a regular file' -- "$WHALE" info -m "$TMP/fifo-shard"
model_copy "$TMP/dir-config" && rm "$TMP/dir-config/config.json" && mkdir "$TMP/dir-config/config.json"
fails 3 'dir-config/config.json: is a directory, not a regular file' -- "$WHALE" info -m "$TMP/dir-config"
# a symlinked checkpoint works (the Hugging Face cache is made of them) ...
mkdir "$TMP/linked" && ln -s "$TINY/config.json" "$TMP/linked/config.json" &&
    ln -s "$TINY/model.safetensors" "$TMP/linked/model.safetensors"
check "a model folder of symlinks loads" "$WHALE" info -m "$TMP/linked" >/dev/null
# ... one pointed at some other file says so, without echoing its bytes
printf 'root:x:0:0:root:/root:/bin/bash\n' >"$TMP/passwd"
mkdir "$TMP/link-other" && cp "$TINY/config.json" "$TMP/link-other/" && ln -s "$TMP/passwd" "$TMP/link-other/model.safetensors"
fails 4 'link-other/model.safetensors: not a safetensors file' -- "$WHALE" info -m "$TMP/link-other"
first8=$(od -An -t u8 -N8 "$TMP/passwd" | tr -d ' ')
check "the error does not show the file's first bytes as a number" bash -c "! grep -q '$first8' '$TMP/err'"

# ---- strings from files are escaped in messages (one line, no raw control bytes)
model_copy "$TMP/nl-type"
sed -i 's/"model_type": "deepseek_v4"/"model_type": "x\\nwhale: all is well\\u001b[2J"/' "$TMP/nl-type/config.json"
fails 6 'nl-type/config.json: model_type "x\\nwhale: all is well\\x1b\[2J" is not supported' -- "$WHALE" info -m "$TMP/nl-type"
model_copy "$TMP/nl-shard" && rm "$TMP/nl-shard/model.safetensors"
echo '{"weight_map": {"model.embed_tokens.weight": "a\nb.safetensors"}}' >"$TMP/nl-shard/model.safetensors.index.json"
fails 3 'nl-shard/a\\nb.safetensors: cannot open' -- "$WHALE" info -m "$TMP/nl-shard"

# ---- tokenizer.json regexes: refused at load, or bounded in time per encode
tokenizer_with() { # tokenizer_with DIR PATTERN-AS-JSON-STRING
    mkdir -p "$1"
    cat >"$1/tokenizer.json" <<JSON
{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "decoder": {"type": "ByteLevel"},
 "pre_tokenizer": {"type": "Split", "pattern": {"Regex": $2}, "behavior": "Isolated", "invert": false}}
JSON
}
# \C (one code unit) ends matches inside a UTF-8 character: encoding looped forever
tokenizer_with "$TMP/tok-C" '"\\C"'
fails 4 'tok-C/tokenizer.json: .*bad regex.*\\C' -- "$WHALE" tokenize -m "$TMP/tok-C" "é"
# quadratic: every search looks ahead to the end and consumes one character
tokenizer_with "$TMP/tok-quad" '"a(?=a*b)|a"'
head -c 300000 /dev/zero | tr '\0' a >"$TMP/a300k.txt"
fails 4 'tok-quad/tokenizer.json: a pre-tokenizer regex costs more than linear time' -- \
    "$WHALE" tokenize -m "$TMP/tok-quad" --file "$TMP/a300k.txt"
# exponential: PCRE2's match limit stops one search; a format error, not "internal"
tokenizer_with "$TMP/tok-exp" '"(a|aa)+$"'
printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab' >"$TMP/a40b.txt"
fails 4 'tok-exp/tokenizer.json: a pre-tokenizer regex is too costly to match on this text' -- \
    "$WHALE" tokenize -m "$TMP/tok-exp" --file "$TMP/a40b.txt"
# one huge id sized six per-id tables by itself (52 GB of address space)
mkdir -p "$TMP/tok-id"
echo '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 2147483646}, "merges": []}, "decoder": {"type": "ByteLevel"}}' \
    >"$TMP/tok-id/tokenizer.json"
fails 4 'tok-id/tokenizer.json: .*id 2147483646 is too sparse for 2 entries' -- "$WHALE" tokenize -m "$TMP/tok-id" a
# ---- an unpadded checkpoint: safetensors does not align tensors, so the
# fp32 data may start at an odd address; converting it to bf16, fp16 or int8
# reads it without unaligned loads (the sanitizer build checks) and gives
# what the aligned file gives
mkdir -p "$TMP/unaligned" && cp "$TINY/config.json" "$TMP/unaligned/"
python3 - "$TINY/model.safetensors" "$TMP/unaligned/model.safetensors" <<'PY'
import struct, sys
src = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", src[:8])[0]
header = src[8:8 + n].rstrip(b" ")
header += b" " * (1 if len(header) % 2 == 0 else 0)  # odd length: every tensor at an odd address
open(sys.argv[2], "wb").write(struct.pack("<Q", len(header)) + header + src[8 + n:])
PY
echo '[[1, 2, 3, 4, 5, 6]]' >"$TMP/ids6.json"
for dt in fp32 bf16 fp16 int8; do
    "$WHALE" score -m "$TINY" --ids "$TMP/ids6.json" --dtype $dt >"$TMP/aligned.out" 2>&1
    check "unaligned checkpoint in $dt" "$WHALE" score -m "$TMP/unaligned" --ids "$TMP/ids6.json" --dtype $dt \
        >"$TMP/unaligned.out" 2>&1
    check "unaligned checkpoint in $dt scores as the aligned one" cmp -s "$TMP/aligned.out" "$TMP/unaligned.out"
done
# ---- a 1 KB config.json asking for 2^20 positions of a 4096-wide RoPE: the
# tables (16 GiB) were built before any weight was read, for whale memory too
for fam in tiny qwen2-gqa1; do
    mkdir -p "$TMP/rope-$fam" && cp "$DATA/$fam/model.safetensors" "$TMP/rope-$fam/"
    python3 - "$DATA/$fam/config.json" "$TMP/rope-$fam/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(max_position_embeddings=1 << 20, head_dim=4096)
if "qk_rope_head_dim" in c:
    c["qk_rope_head_dim"] = 4096
json.dump(c, open(sys.argv[2], "w"))
PY
    fails 4 "rope-$fam/model.safetensors: checkpoint does not match config" -- "$WHALE" info -m "$TMP/rope-$fam"
    check "whale memory of that config allocates nothing" run_bounded "$WHALE" memory --config "$TMP/rope-$fam" >/dev/null
done
# ---- memory amplification: an ids file of a million one-token rows sized a
# session and logits of 10^6 × V; a huge SFT record was read whole
python3 -c 'import sys; sys.stdout.write("[" + ",".join(["[1]"] * 1000000) + "]")' >"$TMP/rows.json"
fails 5 'rows.json: 1000000 rows, over the cap of 4096 sequences' -- "$WHALE" score -m "$TINY" --ids "$TMP/rows.json"
# 5 million ids: refused before the JSON parser makes a node of each
python3 -c 'import sys; sys.stdout.write("[[" + ",".join(["1"] * 5000000) + "]]")' >"$TMP/ids5m.json"
fails 5 'ids5m.json: more than 4194304 ids, the cap on one batch' -- "$WHALE" score -m "$TINY" --ids "$TMP/ids5m.json"
python3 -c 'import sys; sys.stdout.write("[" + ",".join(["[1, 2, 3, 4]"] * 3000) + "]")' >"$TMP/rows3k.json"
check "3000 rows are scored in bounded chunks" run_bounded "$WHALE" score -m "$TINY" --ids "$TMP/rows3k.json" >/dev/null
need_tokenizer deepseek_v3
tiny_model "$TMP/sft-base" 128815 512
{
    echo '{"query": "Hi", "response": "Hello!"}'
    printf '{"query": "'
    head -c $((17 << 20)) /dev/zero | tr '\0' x
    echo '", "response": "ok"}'
} >"$TMP/big.jsonl"
fails 5 'big.jsonl:2: a record of more than 16777216 bytes' -- \
    "$WHALE" sft -m "$TMP/sft-base" --data "$TMP/big.jsonl" --dry-run 1

finish hostile
