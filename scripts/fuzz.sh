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
all=(safetensors config_nanowhale config_qwen2 tokenizer_load encode sft token_shards lora ids)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi

command -v clang >/dev/null || { echo "fuzz: clang is missing (scripts/setup.sh installs it)" >&2; exit 1; }
CC=clang cmake -S . -B build-fuzz -DWHALE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzzers >/dev/null

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
    # -timeout is above the tokenizer's per-encode budget (2 s + per byte),
    # so a budget that works ends an input before libFuzzer calls it a hang
    if ! build-fuzz/fuzz/fuzz_"$t" "$work" "fuzz/corpus/$t" -dict="$dict" -max_total_time="$seconds" \
        -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=25 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="build-fuzz/artifacts/$t-" >"build-fuzz/$t.log" 2>&1; then
        echo "fuzz_$t FAILED (build-fuzz/$t.log):" >&2
        grep -E "ERROR|SUMMARY|Test unit written|runtime error" "build-fuzz/$t.log" | head -8 >&2
        failed+=("$t")
    else
        grep -E "^stat::number_of_executed_units|^Done" "build-fuzz/$t.log" | tr '\n' ' '
        echo
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds}s without a finding"
