#!/usr/bin/env bash
# Run the test suite twice: the optimised build, then a build with
# AddressSanitizer + UndefinedBehaviorSanitizer; then a short run of every
# fuzz target (WHALE_FUZZ_SECONDS each, default 25; 0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "== tests (release build)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
ctest --test-dir build --output-on-failure -j2

echo "== tests (address + undefined-behaviour sanitizers)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DWHALE_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)" >/dev/null
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
    ctest --test-dir build-asan --output-on-failure -j2

fuzz_seconds=${WHALE_FUZZ_SECONDS:-25}
if [ "$fuzz_seconds" != 0 ]; then
    echo "== fuzz smoke (${fuzz_seconds} s per target)"
    scripts/fuzz.sh "$fuzz_seconds"
fi
