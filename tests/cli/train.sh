#!/usr/bin/env bash
# Training end to end on a generated corpus: the loss falls, a resumed run
# (also after SIGKILL) and a run with --recompute repeat the uninterrupted
# loss curve bit for bit, and bad inputs fail with one-line errors while the last checkpoint stays intact.
# usage: train.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
. "$(dirname "$0")/lib.bash"
expect_fail() { # expect_fail PATTERN -- command...
    local pattern=$1
    shift 2
    checks=$((checks + 1))
    "$@" >"$TMP/out" 2>"$TMP/err"
    local st=$?
    if [ "$st" = 0 ] || ! grep -Eq -- "$pattern" "$TMP/err" || [ "$(wc -l <"$TMP/err")" != 1 ]; then
        echo "FAIL: $* -> status $st, stderr: $(cat "$TMP/err")" >&2
        fails=$((fails + 1))
    fi
}

# a small deterministic corpus: 40 documents of simple sentences
mkdir "$TMP/corpus"
for d in $(seq 1 40); do
    awk -v seed="$d" 'BEGIN {
        srand(seed); split("the a one some every", det); split("cat dog bird fish horse child", noun);
        split("sees finds likes follows carries", verb); split("small red quick old happy", adj);
        for (s = 0; s < 30; s++)
            printf "%s %s %s %s %s %s.\n", det[int(rand()*5)+1], adj[int(rand()*5)+1], noun[int(rand()*6)+1],
                   verb[int(rand()*5)+1], det[int(rand()*5)+1], noun[int(rand()*6)+1] }' >"$TMP/corpus/doc$d.txt"
done
"$WHALE" tokenizer train --vocab-size 300 --out "$TMP/tok" "$TMP"/corpus/*.txt >/dev/null 2>&1
check "tokenizer trained" test -s "$TMP/tok/tokenizer.json"
"$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/data" --val-docs 4 "$TMP"/corpus/*.txt >/dev/null 2>&1
check "data prepared" test -s "$TMP/data/meta.json"

ARGS=(--init tiny --data "$TMP/data" --tokenizer "$TMP/tok" --seq-len 32 --batch-size 4 --grad-accum 2
      --max-steps 12 --lr 3e-3 --warmup-steps 2 --save-every 4 --eval-every 4 --log-every 1 --threads 2 --quiet)
"$WHALE" train "${ARGS[@]}" --out "$TMP/a" >"$TMP/a.json" 2>"$TMP/a.err"
check "training run finished: $(cat "$TMP/a.err")" test -s "$TMP/a/model.safetensors"
losses() { grep '"loss"' "$1" | sed -E 's/.*"step": ([0-9]+), "loss": ([0-9.]+), "lr": ([^,]+), "grad_norm": ([^,]+),.*/\1 \2 \3 \4/'; }
losses "$TMP/a/metrics.jsonl" >"$TMP/a.curve"
first=$(head -1 "$TMP/a.curve" | cut -d' ' -f2)
last=$(tail -1 "$TMP/a.curve" | cut -d' ' -f2)
check "loss falls ($first -> $last)" awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 0.3) }'
check "12 steps logged" test "$(wc -l <"$TMP/a.curve")" = 12
check "validation logged" grep -q '"val_loss"' "$TMP/a/metrics.jsonl"
check "checkpoints written" test -s "$TMP/a/checkpoint-8/optimizer.safetensors"
"$WHALE" generate -m "$TMP/a" -p "the cat" -n 8 --seed 1 >/dev/null 2>&1
check "the trained model generates" test $? = 0
"$WHALE" eval -m "$TMP/a" --data "$TMP/data" --seq-len 32 >"$TMP/eval" 2>&1
check "eval prints a perplexity" grep -q '"ppl"' "$TMP/eval"
"$WHALE" eval -m "$TMP/a" --text "$TMP/corpus/doc1.txt" --seq-len 32 >"$TMP/evalt" 2>&1
check "eval --text prints a perplexity: $(cat "$TMP/evalt")" grep -q '"ppl"' "$TMP/evalt"

# interrupted at step 4 (a finished run with --max-steps 12 killed later): resume = same curve
"$WHALE" train "${ARGS[@]}" --out "$TMP/b" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 6000); do [ -d "$TMP/b/checkpoint-4" ] && break; sleep 0.05; done # 5 min: sanitizers on a loaded machine
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
check "a checkpoint survived the kill" test -d "$TMP/b/checkpoint-4"
"$WHALE" train "${ARGS[@]}" --out "$TMP/b" --resume latest >/dev/null 2>"$TMP/b.err"
check "resume finished: $(cat "$TMP/b.err")" test -s "$TMP/b/model.safetensors"
losses "$TMP/b/metrics.jsonl" >"$TMP/b.curve"
check "resumed loss curve is bit-identical" cmp -s "$TMP/a.curve" "$TMP/b.curve"
check "final weights are identical" cmp -s "$TMP/a/model.safetensors" "$TMP/b/model.safetensors"

# a save interrupted by a crash leaves checkpoint-N.tmp behind: resume ignores it
mkdir "$TMP/b/checkpoint-99.tmp" && echo junk >"$TMP/b/checkpoint-99.tmp/model.safetensors"
"$WHALE" train "${ARGS[@]}" --max-steps 12 --out "$TMP/b" --resume latest >/dev/null 2>"$TMP/b2.err"
check "resume skips an interrupted save: $(cat "$TMP/b2.err")" test -s "$TMP/b/model.safetensors"

# disk full during a save: one-line error, the previous checkpoint intact, nothing partial
mkdir "$TMP/full"
if mount -t tmpfs -o size=5m tmpfs "$TMP/full" 2>/dev/null; then
    "$WHALE" train "${ARGS[@]}" --out "$TMP/full/run" >/dev/null 2>"$TMP/full.err"
    st=$?
    check "disk full: non-zero exit" test "$st" != 0
    check "disk full: one-line error naming the problem: $(cat "$TMP/full.err")" \
        grep -q 'No space left on device' "$TMP/full.err"
    check "disk full: the last good checkpoint loads" "$WHALE" info -m "$TMP/full/run/checkpoint-4" >/dev/null
    check "disk full: it equals the uninterrupted run's" \
        cmp -s "$TMP/full/run/checkpoint-4/model.safetensors" "$TMP/a/checkpoint-4/model.safetensors"
    check "disk full: no partial checkpoint left" test -z "$(ls -d "$TMP"/full/run/checkpoint-*.tmp 2>/dev/null)"
    umount "$TMP/full"
else
    echo "train.sh: cannot mount a small tmpfs here; disk-full case not run" >&2
fi

# recomputing activations in the backward pass: same curve, less memory
"$WHALE" train "${ARGS[@]}" --out "$TMP/r" --recompute >/dev/null 2>&1
losses "$TMP/r/metrics.jsonl" >"$TMP/r.curve"
check "--recompute gives the same loss curve" cmp -s "$TMP/a.curve" "$TMP/r.curve"

# lower precision: bf16 mixed precision and fp16 with loss scaling train, fp16 logs its scaler,
# resuming an fp16 run repeats its curve (the scaler state is in the checkpoint), pure bf16 runs
for dt in bf16 fp16; do
    "$WHALE" train "${ARGS[@]}" --out "$TMP/$dt" --dtype $dt >/dev/null 2>"$TMP/$dt.err"
    check "--dtype $dt trains: $(tail -1 "$TMP/$dt.err")" test -s "$TMP/$dt/model.safetensors"
    losses "$TMP/$dt/metrics.jsonl" >"$TMP/$dt.curve"
    check "--dtype $dt loss falls" awk 'NR == 1 {a = $2} END {exit !($2 < a)}' "$TMP/$dt.curve"
done
check "fp16 metrics carry the loss scale" grep -q '"loss_scale": 65536' "$TMP/fp16/metrics.jsonl"
rm -rf "$TMP/fp16/checkpoint-12" "$TMP/fp16/checkpoint-8"
"$WHALE" train "${ARGS[@]}" --out "$TMP/fp16" --dtype fp16 --resume latest >/dev/null 2>&1
losses "$TMP/fp16/metrics.jsonl" >"$TMP/fp16r.curve"
check "an fp16 run resumes on the same curve" cmp -s "$TMP/fp16.curve" "$TMP/fp16r.curve"
"$WHALE" train "${ARGS[@]}" --out "$TMP/pure" --dtype bf16 --pure-bf16 stochastic >/dev/null 2>&1
check "pure bf16 with stochastic rounding trains" test -s "$TMP/pure/model.safetensors"
"$WHALE" train "${ARGS[@]}" --out "$TMP/nc" --nan-check --max-steps 2 >/dev/null 2>&1
check "--nan-check on a healthy run passes" test -s "$TMP/nc/model.safetensors"
"$WHALE" train "${ARGS[@]}" --out "$TMP/a" --dtype bf16 2>&1 | grep -q "master weights"
check "a bf16 run prints its memory by category" test "${PIPESTATUS[0]}" = 0
expect_fail 'pure bf16 weights need --dtype bf16' -- "$WHALE" train "${ARGS[@]}" --pure-bf16 nearest --out "$TMP/g"
expect_fail 'int8 is an inference format' -- "$WHALE" train "${ARGS[@]}" --dtype int8 --out "$TMP/g"

# bad input
expect_fail 'seq-len 200 exceeds .*max_position_embeddings 128' -- "$WHALE" train "${ARGS[@]}" --seq-len 200 --out "$TMP/c"
expect_fail 'trained with --seq-len 32' -- "$WHALE" train "${ARGS[@]}" --seq-len 16 --out "$TMP/a" --resume latest
expect_fail 'no checkpoint-N' -- "$WHALE" train "${ARGS[@]}" --out "$TMP/empty" --resume latest
expect_fail 'cannot create' -- "$WHALE" train "${ARGS[@]}" --out "$TMP/no/such/dir"
# shards from another tokenizer: a larger vocabulary, or the same size with other merges
"$WHALE" tokenizer train --vocab-size 400 --out "$TMP/tok400" "$TMP"/corpus/*.txt >/dev/null 2>&1
"$WHALE" data prepare --tokenizer "$TMP/tok400" --out "$TMP/data400" --val-docs 4 "$TMP"/corpus/*.txt >/dev/null 2>&1
expect_fail 'shards were made with a tokenizer of [0-9]+ ids but the model has 300' -- \
    "$WHALE" train "${ARGS[@]}" --init "$TMP/a" --tokenizer "$TMP/a" --data "$TMP/data400" --out "$TMP/d"
"$WHALE" tokenizer train --vocab-size 300 --out "$TMP/tokB" "$TMP"/corpus/doc1*.txt >/dev/null 2>&1
"$WHALE" data prepare --tokenizer "$TMP/tokB" --out "$TMP/dataB" --val-docs 4 "$TMP"/corpus/*.txt >/dev/null 2>&1
expect_fail 'tokenizer' -- "$WHALE" train "${ARGS[@]}" --init "$TMP/a" --tokenizer "$TMP/a" --data "$TMP/dataB" --out "$TMP/d"
cp "$TMP/data/train-00000.bin" "$TMP/train.bak"
head -c 1000 "$TMP/train.bak" >"$TMP/data/train-00000.bin"
expect_fail 'train-00000.bin' -- "$WHALE" train "${ARGS[@]}" --out "$TMP/e"
cp "$TMP/train.bak" "$TMP/data/train-00000.bin"
mkdir "$TMP/emptycorpus" && : >"$TMP/emptycorpus/x.txt"
expect_fail 'empty|no text|no documents' -- "$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/f" "$TMP/emptycorpus/x.txt"
"$WHALE" info -m "$TMP/a/checkpoint-12" >/dev/null 2>&1
check "checkpoint of run a still loads" test $? = 0

finish train
