#!/usr/bin/env bash
# Training on several ranks (docs/distributed.md), on this machine's
# loopback: 2 ranks equal one process with the same --grad-accum bit for bit
# (pretraining, LoRA and full fine-tuning: losses, gradient norms, weights,
# moments, validation losses), with the optimizer state whole on every rank
# or sharded (--zero 1); LoRA's frozen parameters stay out of the exchange;
# the gradient sent in buckets during the backward pass (--bucket-mb) or
# after it gives the same bits; a rank killed with SIGKILL or stopped (with
# buckets in flight) ends the job non-zero within the bound with a message
# naming the rank and leaves the last checkpoint
# intact, from which the run resumes on the same curve (sharded); a
# checkpoint resumes on another number of ranks, sharded or not; in bf16
# and fp16 --zero 1 shards the fp32 master weights too. A build
# without MPI refuses a launch of several ranks in one line. Skipped (77)
# without mpirun.
# usage: mpi.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

if ! ldd "$WHALE" | grep -q libmpi; then # this build has no MPI
    expect_status 6 'launched as one of 2 ranks, but this build has no MPI' -- \
        env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$WHALE" train --init tiny --data x --out "$TMP/x"
    finish mpi.sh || exit 1
    command -v mpirun >/dev/null || exit 77
    exit 0
fi
command -v mpirun >/dev/null || { echo "mpi.sh: no mpirun: skipped" >&2; exit 77; }
# Open MPI's own allocations are not this program's leaks (see the file);
# its libraries have no frame pointers: only the slow unwinder's stacks reach
# the libmpi frames the suppressions name
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")/.." && pwd)/lsan-openmpi.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
for v in OMP_NUM_THREADS OMP_WAIT_POLICY LSAN_OPTIONS ASAN_OPTIONS UBSAN_OPTIONS WHALE_ISA; do
    [ -n "${!v+x}" ] && MPIRUN+=(-x $v)
done
run2() { "${MPIRUN[@]}" --quiet -np 2 "$@"; }

mkdir "$TMP/corpus"
for d in $(seq 1 24); do
    awk -v seed="$d" 'BEGIN { srand(seed); split("the a one some every", det); split("cat dog bird fish horse", noun);
        split("sees finds likes follows", verb);
        for (s = 0; s < 30; s++) printf "%s %s %s %s %s.\n", det[int(rand()*5)+1], noun[int(rand()*5)+1],
            verb[int(rand()*4)+1], det[int(rand()*5)+1], noun[int(rand()*5)+1] }' >"$TMP/corpus/doc$d.txt"
done
"$WHALE" tokenizer train --vocab-size 300 --out "$TMP/tok" "$TMP"/corpus/*.txt >/dev/null 2>&1
"$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/data" --val-docs 2 "$TMP"/corpus/*.txt >/dev/null 2>&1
check "data prepared" test -s "$TMP/data/meta.json"
curve() { grep '"loss"' "$1" | sed -E 's/.*"step": ([0-9]+), "loss": ([^,]+), "lr": ([^,]+), "grad_norm": ([^,]+),.*/\1 \2 \3 \4/'; }
same_run() { # same_run WHAT DIR_ONE DIR_TWO: curves, final weights, last moments
    check "$1: the loss and gradient-norm curves are bit-identical" \
        cmp -s <(curve "$2/metrics.jsonl") <(curve "$3/metrics.jsonl")
    check "$1: the final weights are bit-identical" cmp -s "$2/model.safetensors" "$3/model.safetensors"
    check "$1: the AdamW moments are bit-identical" \
        cmp -s "$2/checkpoint-6/optimizer.safetensors" "$3/checkpoint-6/optimizer.safetensors"
}

# pretraining: 2 ranks × 1 micro-batch = 1 process × --grad-accum 2; 2 ranks × 2 = 1 × 4
ARGS=(--init tiny --data "$TMP/data" --tokenizer "$TMP/tok" --seq-len 32 --batch-size 2 --max-steps 6 --lr 3e-3
      --warmup-steps 1 --save-every 3 --eval-every 3 --log-every 1 --threads 1 --quiet)
for ga in 2 4; do
    "$WHALE" train "${ARGS[@]}" --grad-accum $ga --out "$TMP/one$ga" >/dev/null 2>"$TMP/err"
    check "one process, --grad-accum $ga: $(tail -1 "$TMP/err")" test -s "$TMP/one$ga/model.safetensors"
    run2 "$WHALE" train "${ARGS[@]}" --grad-accum $ga --out "$TMP/two$ga" >"$TMP/two.json" 2>"$TMP/err"
    check "2 ranks, --grad-accum $ga: $(tail -1 "$TMP/err")" test -s "$TMP/two$ga/model.safetensors"
    same_run "train, 2 ranks, --grad-accum $ga" "$TMP/one$ga" "$TMP/two$ga"
    # --zero 1: moments sharded, gradients reduce-scattered, weights all-gathered
    run2 "$WHALE" train "${ARGS[@]}" --grad-accum $ga --zero 1 --out "$TMP/zero$ga" >/dev/null 2>"$TMP/err"
    check "2 ranks --zero 1, --grad-accum $ga: $(tail -1 "$TMP/err")" test -s "$TMP/zero$ga/model.safetensors"
    same_run "train, 2 ranks --zero 1, --grad-accum $ga" "$TMP/one$ga" "$TMP/zero$ga"
done
# the gradient in buckets sent during the backward pass (--bucket-mb; the runs above use the default 0,
# one exchange after the backward pass): small ones, so that many are in flight while the earlier layers'
# backward runs. The bits of one process either way.
cp -r "$TMP/two4" "$TMP/bk0-0" && cp -r "$TMP/zero4" "$TMP/bk1-0" # the default's runs, --grad-accum 4
for z in 0 1; do
    bm=0.004 # --grad-accum 4: two rounds, so the order of the pieces' sum matters
    run2 "$WHALE" train "${ARGS[@]}" --grad-accum 4 --zero $z --bucket-mb $bm --out "$TMP/bk$z-$bm" >/dev/null 2>"$TMP/err"
    check "2 ranks --zero $z --bucket-mb $bm: $(tail -1 "$TMP/err")" test -s "$TMP/bk$z-$bm/model.safetensors"
    same_run "train, 2 ranks --zero $z --bucket-mb $bm" "$TMP/one4" "$TMP/bk$z-$bm"
    # rank 0 sends half of the gradient in each of the 2 rounds, then (without --zero) half of the sum in
    # the all-gather or (--zero 1) half of the weights: nearly all the rounds' part leaves during the backward
    sent=$(grep -m1 -o '"comm_bytes": [0-9]*, "comm_bytes_in_backward": [0-9]*' "$TMP/bk$z-0.004/metrics.jsonl")
    check "--bucket-mb 0.004 --zero $z: step 1 sent during the backward pass: $sent" \
        awk -v s="$sent" 'BEGIN { split(s, f, /[:,] */); exit !(f[4] > 0.6 * f[2]) }'
    check "--bucket-mb 0 --zero $z: no buckets counted" bash -c "! grep -q comm_bytes_in_backward '$TMP/bk$z-0/metrics.jsonl'"
done
check "validation on 2 ranks: the losses of one process" \
    cmp -s <(grep val_loss "$TMP/one4/metrics.jsonl") <(grep val_loss "$TMP/zero4/metrics.jsonl")
# the global batch does not depend on the number of ranks: resume with another one
run2 "$WHALE" train "${ARGS[@]}" --grad-accum 2 --out "$TMP/res12" --resume "$TMP/one2/checkpoint-3" >/dev/null 2>&1
check "a one-process checkpoint resumed on 2 ranks ends as the uninterrupted run" \
    cmp -s "$TMP/one2/model.safetensors" "$TMP/res12/model.safetensors"
"$WHALE" train "${ARGS[@]}" --grad-accum 4 --out "$TMP/res21" --resume "$TMP/two4/checkpoint-3" >/dev/null 2>&1
check "a 2-rank checkpoint resumed in one process ends as the uninterrupted run" \
    cmp -s "$TMP/two4/model.safetensors" "$TMP/res21/model.safetensors"
# sharded moments re-shard for any number of ranks: 1 → 2 with --zero 1, and 2 with --zero 1 → 1
run2 "$WHALE" train "${ARGS[@]:0:${#ARGS[@]}-1}" --grad-accum 2 --zero 1 --out "$TMP/resz12" \
    --resume "$TMP/one2/checkpoint-3" >/dev/null 2>"$TMP/err" # ARGS without its last word, --quiet
check "a one-process checkpoint resumed on 2 ranks with --zero 1 ends as the uninterrupted run" \
    cmp -s "$TMP/one2/model.safetensors" "$TMP/resz12/model.safetensors"
check "the memory line counts one shard of the moments" grep -q 'AdamW moments .*1/2 of them' "$TMP/err"
"$WHALE" train "${ARGS[@]}" --grad-accum 4 --out "$TMP/resz21" --resume "$TMP/zero4/checkpoint-3" >/dev/null 2>&1
check "a 2-rank --zero 1 checkpoint resumed in one process ends as the uninterrupted run" \
    cmp -s "$TMP/one4/model.safetensors" "$TMP/resz21/model.safetensors"
# --zero 1 in mixed precision: each rank keeps the fp32 masters of its shard only and the bf16 copies are
# all-gathered; the checkpoints still hold whole fp32 masters and moments, and re-shard either way
B16=("${ARGS[@]:0:${#ARGS[@]}-1}" --dtype bf16 --grad-accum 2)
"$WHALE" train "${B16[@]}" --quiet --out "$TMP/b16one" >/dev/null 2>"$TMP/err"
check "bf16, one process: $(tail -1 "$TMP/err")" test -s "$TMP/b16one/model.safetensors"
run2 "$WHALE" train "${B16[@]}" --zero 1 --out "$TMP/b16zero" >/dev/null 2>"$TMP/err"
check "bf16, 2 ranks --zero 1: $(tail -1 "$TMP/err")" test -s "$TMP/b16zero/model.safetensors"
same_run "train bf16, 2 ranks --zero 1" "$TMP/b16one" "$TMP/b16zero"
check "train bf16, 2 ranks --zero 1: the gathered fp32 masters of a checkpoint are bit-identical" \
    cmp -s "$TMP/b16one/checkpoint-3/model.safetensors" "$TMP/b16zero/checkpoint-3/model.safetensors"
run2 "$WHALE" train "${B16[@]}" --zero 1 --bucket-mb 0.004 --out "$TMP/b16bk" >/dev/null 2>"$TMP/err"
check "bf16, 2 ranks --zero 1 --bucket-mb 0.004: $(tail -1 "$TMP/err")" test -s "$TMP/b16bk/model.safetensors"
same_run "train bf16, 2 ranks --zero 1 --bucket-mb 0.004" "$TMP/b16one" "$TMP/b16bk"
check "bf16 --zero 1: the memory line counts one shard of the masters" \
    grep -q 'weights fp32 .*master weights: of the product weights 1/2' "$TMP/err"
run2 "$WHALE" train "${B16[@]}" --quiet --zero 1 --out "$TMP/b16r12" --resume "$TMP/b16one/checkpoint-3" >/dev/null 2>&1
check "bf16: a one-process checkpoint resumed on 2 ranks with --zero 1 ends as the uninterrupted run" \
    cmp -s "$TMP/b16one/model.safetensors" "$TMP/b16r12/model.safetensors"
"$WHALE" train "${B16[@]}" --quiet --out "$TMP/b16r21" --resume "$TMP/b16zero/checkpoint-3" >/dev/null 2>&1
check "bf16: a 2-rank --zero 1 checkpoint resumed in one process ends as the uninterrupted run" \
    cmp -s "$TMP/b16one/model.safetensors" "$TMP/b16r21/model.safetensors"
check "only rank 0 prints the summary" test "$(grep -c '"steps"' "$TMP/two.json")" = 1
check "metrics carry the world size and each rank's tokens/s" \
    grep -q '"world_size": 2, "rank_tokens_per_s": \[[0-9.]*, [0-9.]*\], "comm_s"' "$TMP/two4/metrics.jsonl"
check "validation logged once per evaluation" test "$(grep -c '"val_loss"' "$TMP/two4/metrics.jsonl")" = 2
expect_status 2 '--grad-accum 3 is not a multiple of the 2 ranks' -- \
    "${MPIRUN[@]}" --quiet -np 2 "$WHALE" train "${ARGS[@]}" --grad-accum 3 --out "$TMP/bad"
run2 "$WHALE" info -m "$TMP/one2" >/dev/null 2>"$TMP/err"
check "a command other than train/sft on 2 ranks is refused" grep -q 'only train and sft run on several ranks' "$TMP/err"

# fine-tuning on a tiny model with the real DeepSeek-V3 tokenizer: LoRA (dropout on) and full
need_tokenizer deepseek_v3
tiny_model "$TMP/base" 128815 512
SFT=(-m "$TMP/base" --data "$DATA/../../data/self_cognition.jsonl" --model-name 小鲸 "Little Whale" --model-author
     鲸鱼工坊 "Whale Works" --max-steps 3 --batch-size 2 --grad-accum 2 --save-steps 3 --logging-steps 1 --lr 1e-3
     --split-dataset-ratio 0.2 --eval-steps 2 --threads 1 --quiet)
sft_eval() { grep -o '"eval_loss": [^,]*, "eval_token_acc": [^,]*' "$1"/v0-*/logging.jsonl; }
# bytes rank 0 sent by step 1: the trainable gradients' 4 bytes × T × 2 × (N−1)/N, and a few doubles
step1_bytes() { grep -m1 -o '"comm_bytes": [0-9]*' "$1"/v0-*/logging.jsonl | sed 's/.* //'; }
sft_curve() { grep '"loss"' "$1"/v0-*/logging.jsonl | grep -v train_runtime | sed -E 's/.*"loss": ([^,]+), "grad_norm": ([^,]+),.*/\1 \2/'; }
for tt in lora full; do
    f=adapter_model.safetensors
    [ $tt = full ] && f=model.safetensors
    "$WHALE" sft "${SFT[@]}" --train-type $tt --out "$TMP/sft1-$tt" >"$TMP/one-$tt.json" 2>"$TMP/err"
    check "sft $tt, one process: $(tail -1 "$TMP/err")" test -s "$(ls "$TMP"/sft1-$tt/v0-*/checkpoint-3/$f)"
    for z in 0 1; do
        run2 "$WHALE" sft "${SFT[@]}" --train-type $tt --zero $z --out "$TMP/sft2-$tt$z" >/dev/null 2>"$TMP/err"
        what="sft $tt, 2 ranks --zero $z"
        check "$what: $(tail -1 "$TMP/err")" test -s "$(ls "$TMP"/sft2-$tt$z/v0-*/checkpoint-3/$f)"
        check "$what: one run folder" test "$(ls -d "$TMP"/sft2-$tt$z/v* | wc -l)" = 1
        check "$what: the loss and gradient-norm curves are bit-identical" \
            cmp -s <(sft_curve "$TMP/sft1-$tt") <(sft_curve "$TMP/sft2-$tt$z")
        check "$what: the validation losses and accuracies are bit-identical" \
            cmp -s <(sft_eval "$TMP/sft1-$tt") <(sft_eval "$TMP/sft2-$tt$z")
        check "$what: the trained weights are bit-identical" \
            cmp -s "$TMP"/sft1-$tt/v0-*/checkpoint-3/$f "$TMP"/sft2-$tt$z/v0-*/checkpoint-3/$f
        check "$what: the moments are bit-identical" \
            cmp -s "$TMP"/sft1-$tt/v0-*/checkpoint-3/optimizer.safetensors \
            "$TMP"/sft2-$tt$z/v0-*/checkpoint-3/optimizer.safetensors
    done
done
# LoRA with small buckets: each layer's adapters leave as its backward pass ends
for z in 0 1; do
    run2 "$WHALE" sft "${SFT[@]}" --train-type lora --zero $z --bucket-mb 0.002 --out "$TMP/sftbk$z" >/dev/null 2>"$TMP/err"
    what="sft lora, 2 ranks --zero $z --bucket-mb 0.002"
    check "$what: $(tail -1 "$TMP/err")" test -s "$(ls "$TMP"/sftbk$z/v0-*/checkpoint-3/adapter_model.safetensors)"
    check "$what: the loss and gradient-norm curves are bit-identical" \
        cmp -s <(sft_curve "$TMP/sft1-lora") <(sft_curve "$TMP/sftbk$z")
    check "$what: the adapters and moments are bit-identical" \
        cmp -s <(cat "$TMP"/sft1-lora/v0-*/checkpoint-3/{adapter_model,optimizer}.safetensors) \
        <(cat "$TMP"/sftbk$z/v0-*/checkpoint-3/{adapter_model,optimizer}.safetensors)
    check "$what: adapters sent during the backward pass" \
        grep -Eq '"comm_bytes_in_backward": [1-9]' "$(ls "$TMP"/sftbk$z/v0-*/logging.jsonl)"
done
# full fine-tuning in fp16 (loss scaling) with the masters sharded
"$WHALE" sft "${SFT[@]}" --train-type full --dtype fp16 --out "$TMP/sft1-f16" >/dev/null 2>"$TMP/err"
check "sft full fp16, one process: $(tail -1 "$TMP/err")" test -s "$(ls "$TMP"/sft1-f16/v0-*/checkpoint-3/model.safetensors)"
run2 "$WHALE" sft "${SFT[@]}" --train-type full --dtype fp16 --zero 1 --out "$TMP/sft2-f16" >/dev/null 2>"$TMP/err"
check "sft full fp16, 2 ranks --zero 1: $(tail -1 "$TMP/err")" test -s "$(ls "$TMP"/sft2-f16/v0-*/checkpoint-3/model.safetensors)"
check "sft full fp16, 2 ranks --zero 1: the loss and gradient-norm curves are bit-identical" \
    cmp -s <(sft_curve "$TMP/sft1-f16") <(sft_curve "$TMP/sft2-f16")
check "sft full fp16, 2 ranks --zero 1: the weights and moments are bit-identical" \
    cmp -s <(cat "$TMP"/sft1-f16/v0-*/checkpoint-3/{model,optimizer}.safetensors) \
    <(cat "$TMP"/sft2-f16/v0-*/checkpoint-3/{model,optimizer}.safetensors)
check "sft: validation ran (2 evaluations)" test "$(sft_eval "$TMP/sft1-lora" | wc -l)" = 2
T=$(sed -E 's/.*"trainable_params": ([0-9]+).*/\1/' "$TMP/one-lora.json")
for z in 0 1; do # the frozen norms' gradient buffers stay home; --zero 1 adds the norm's partial sums
    b=$(step1_bytes "$TMP/sft2-lora$z")
    check "sft lora --zero $z: step 1 sent $b bytes: 4 × $T adapter parameters and no more than 1 KiB besides" \
        awk -v b="${b:-0}" -v t="$T" 'BEGIN { exit !(b >= 4 * t && b <= 4 * t + 1024) }'
done

# an epoch that ends inside a step whose micro-batches do not divide among
# the ranks: the step goes on into the next epoch (no error at the epoch's end)
run2 "$WHALE" sft -m "$TMP/base" --data "$DATA/../../data/self_cognition.jsonl#5" --model-name W W --model-author A A \
    --max-steps 4 --batch-size 1 \
    --grad-accum 2 --save-steps 4 --lr 1e-3 --threads 1 --quiet --out "$TMP/sft-epoch" >/dev/null 2>"$TMP/err"
check "sft on 2 ranks past an epoch end that splits a step: $(tail -1 "$TMP/err")" \
    test -s "$(ls "$TMP"/sft-epoch/v0-*/checkpoint-4/adapter_model.safetensors)"

# faults: rank 1 killed with SIGKILL mid-run, or stopped (a hang); the job ends within the bound
rank_pid() { # rank_pid OUT_DIR RANK: the pid of that rank of the run writing OUT_DIR (no procps needed)
    local p
    for p in /proc/[0-9]*; do
        grep -qaF -- "$1" "$p/cmdline" 2>/dev/null || continue
        tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "${p#/proc/}"; return; }
    done
}
LONG=(--init tiny --data "$TMP/data" --tokenizer "$TMP/tok" --seq-len 32 --batch-size 2 --grad-accum 2 --max-steps 100000
      --lr 3e-3 --lr-scheduler constant --warmup-steps 0 --save-every 2 --log-every 1 --threads 1 --quiet
      --bucket-mb 0.004) # buckets in flight when the rank stops or dies
for fault in KILL STOP; do
    # without --quiet: mpirun's own message names a rank that died; the killed run shards its moments
    zero=0
    [ $fault = KILL ] && zero=1
    WHALE_DIST_TIMEOUT=4 "${MPIRUN[@]}" -np 2 -x WHALE_DIST_TIMEOUT "$WHALE" train "${LONG[@]}" --zero $zero \
        --out "$TMP/f$fault" >/dev/null 2>"$TMP/f.err" &
    job=$!
    for _ in $(seq 1 3000); do [ -d "$TMP/f$fault/checkpoint-4" ] && break; sleep 0.05; done
    victim=$(rank_pid "$TMP/f$fault" 1)
    t0=$(date +%s)
    kill -$fault "$victim"
    for _ in $(seq 1 1200); do kill -0 $job 2>/dev/null || break; sleep 0.05; done # 60 s
    kill -0 $job 2>/dev/null && { kill -9 $job "$victim"; echo "mpi.sh: the job outlived the bound" >&2; }
    wait $job
    st=$?
    kill -9 "$victim" 2>/dev/null
    check "SIG$fault of rank 1: the job ends non-zero ($st) within 60 s ($(($(date +%s) - t0)) s)" test "$st" != 0
    if [ $fault = KILL ]; then
        check "SIGKILL: the message names rank 1: $(grep -m1 rank "$TMP/f.err")" grep -Eq 'rank 1 .*(signal 9|Killed)' "$TMP/f.err"
    else
        check "stopped rank: rank 0 names it: $(grep -m1 'rank 0:' "$TMP/f.err")" \
            grep -Eq 'rank 0: step [0-9]+: (rank 1 did not reach the .* within [0-9]+ s \(dead or hung|not every rank of 2 completed the .* within 4 s: a rank died or hangs)' "$TMP/f.err"
    fi
done
last=$(ls -d "$TMP"/fKILL/checkpoint-* | grep -v "\.tmp$" | sed 's/.*-//' | sort -n | tail -1)
check "SIGKILL: the last checkpoint ($last) loads" "$WHALE" info -m "$TMP/fKILL/checkpoint-$last" >/dev/null 2>&1
"$WHALE" train "${LONG[@]}" --max-steps $((last + 2)) --out "$TMP/fone" >/dev/null 2>&1
run2 "$WHALE" train "${LONG[@]}" --max-steps $((last + 2)) --zero 1 --out "$TMP/fKILL" --resume latest >/dev/null 2>"$TMP/err"
st=$?
check "SIGKILL: 2 ranks --zero 1 resume from the last checkpoint: $(tail -1 "$TMP/err")" test $st = 0
check "SIGKILL: the resumed run ends with the weights of an uninterrupted one" \
    cmp -s "$TMP/fone/model.safetensors" "$TMP/fKILL/model.safetensors"

[ -n "${KEEP:-}" ] && cp -r "$TMP" "$KEEP"
finish mpi.sh
