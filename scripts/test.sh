#!/usr/bin/env bash
# Run the test suite three times: the optimised build for this processor; a
# build with AddressSanitizer + UndefinedBehaviorSanitizer; and the portable
# build capped to the AVX2 tier (WHALE_ISA=avx2), as on a processor without
# AVX-512, built without MPI (as where Open MPI is not installed: its MPI
# test checks that a launch of several ranks is refused); the kernel tests also at the other tiers and under the sanitizers
# at avx2. Then a short run of every fuzz target (WHALE_FUZZ_SECONDS each,
# default 15; 0 skips it).
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

echo "== tests (portable build without MPI, instruction tier capped to avx2)"
cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DWHALE_NATIVE=OFF -DWHALE_MPI=OFF >/dev/null
cmake --build build-portable -j"$(nproc)" >/dev/null
WHALE_ISA=avx2 ctest --test-dir build-portable --output-on-failure -j2
# the kernel tests at the other tiers (a cap above the machine's own tier
# runs its own tier), and the sanitizers over the AVX2 kernels
kernels="test_gemm|test_vmath|test_convert|test_ops|test_backward|test_backend_ops"
for tier in base avx512 avx512_bf16; do
    echo "== kernel tests (portable build, WHALE_ISA=$tier)"
    WHALE_ISA=$tier ctest --test-dir build-portable --output-on-failure -j2 -R "$kernels|test_sampler"
done
echo "== kernel tests (sanitizers, WHALE_ISA=avx2)"
WHALE_ISA=avx2 ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
    ctest --test-dir build-asan --output-on-failure -j2 -R "$kernels"

fuzz_seconds=${WHALE_FUZZ_SECONDS:-15}
if [ "$fuzz_seconds" != 0 ]; then
    echo "== fuzz smoke (${fuzz_seconds} s per target)"
    scripts/fuzz.sh "$fuzz_seconds"
fi
