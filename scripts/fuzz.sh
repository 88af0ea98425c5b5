#!/usr/bin/env bash
# Build the libFuzzer targets (clang, address + undefined-behaviour
# sanitizers) and run each for SECONDS (default 60) from its committed seed
# corpus, with a memory and a time limit per input. A crash, leak, timeout
# or out-of-memory stops that target and fails the script; the input that
# caused it is left in build-fuzz/artifacts/ (add it to fuzz/corpus/TARGET/
# once fixed). New inputs the fuzzer finds go to build-fuzz/corpus/, not to
# the committed seeds. docs/security.md describes the targets.
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
all=(safetensors config_nanowhale config_qwen2 tokenizer_load encode chat_template sft token_shards lora ids http)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi

command -v clang >/dev/null || { echo "fuzz: clang is missing (scripts/setup.sh installs it)" >&2; exit 1; }
CC=clang cmake -S . -B build-fuzz -DWHALE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzzers >/dev/null

# the time limit per input: above the slowest input a target may take by
# design under the instrumentation (25 s: the encode budget; a chat template
# render may take its 4 million steps, ~20 s instrumented)
timeout_of() {
    case $1 in
    chat_template) echo 120 ;;
    *) echo 25 ;;
    esac
}

dict_of() {
    case $1 in
    safetensors) echo safetensors ;;
    config_*) echo config ;;
    tokenizer_load) echo tokenizer ;;
    *) echo "$1" ;;
    esac
}

export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
mkdir -p build-fuzz/artifacts
failed=()
for t in "${targets[@]}"; do
    work=build-fuzz/corpus/$t
    mkdir -p "$work"
    dict=build-fuzz/$t.dict
    cat fuzz/dict/json.dict >"$dict"
    d=fuzz/dict/$(dict_of "$t").dict
    [ -f "$d" ] && cat "$d" >>"$dict"
    echo "== fuzz_$t: ${seconds}s"
    if ! build-fuzz/fuzz/fuzz_"$t" "$work" "fuzz/corpus/$t" -dict="$dict" -max_total_time="$seconds" \
        -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout="$(timeout_of "$t")" -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="build-fuzz/artifacts/$t-" >"build-fuzz/$t.log" 2>&1; then
        echo "fuzz_$t FAILED (build-fuzz/$t.log):" >&2
        grep -E "ERROR|SUMMARY|Test unit written|runtime error" "build-fuzz/$t.log" | head -8 >&2
        failed+=("$t")
    else
        # executions, and the coverage (edges, features, corpus) at the end
        execs=$(grep -E "^stat::number_of_executed_units" "build-fuzz/$t.log" | awk '{print $2}')
        cov=$(grep -E "^#[0-9]+.*cov: " "build-fuzz/$t.log" | tail -n 1 | grep -oE "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[^ ]+")
        echo "fuzz_$t: $execs executions, $cov"
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds}s without a finding"
