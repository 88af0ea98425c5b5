#!/usr/bin/env bash
# The configs real tools write (tests/data/real: Qwen2.5-0.5B-Instruct as
# published and as transformers 4.55 and 5 re-save it — dtype, layer_types,
# rope_parameters — Qwen2.5-7B-Instruct with its unused sliding_window, and
# nanowhale-100m as transformers 5 serialises DeepseekV4Config) are read:
# whale memory sizes each model from its config alone, with the released
# parameter counts, and the three forms of Qwen2.5-0.5B are the same model.
# usage: realconfig.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"

# estimate NAME: whale memory's JSON for a bf16 inference of the config
estimate() { "$WHALE" memory --config "$DATA/real/$1.json" --dtype bf16 --json 2>"$TMP/err" >"$TMP/$1.out"; }
field() { sed -nE "s/.*\"$1\": ([0-9]+).*/\\1/p" "$TMP/$2.out"; }
for f in qwen2.5-0.5b-instruct qwen2.5-0.5b-instruct-tf4.55 qwen2.5-0.5b-instruct-tf5; do
    estimate "$f"
    check "$f: read ($(cat "$TMP/err"))" test -s "$TMP/$f.out"
    check "$f: Qwen2.5-0.5B's 494,032,768 parameters" test "$(field params "$f")" = 494032768
done
check "transformers 4.55's and 5's forms: the same model as the published config" \
    test "$(field total qwen2.5-0.5b-instruct-tf5)" = "$(field total qwen2.5-0.5b-instruct)" -a \
    "$(field total qwen2.5-0.5b-instruct-tf4.55)" = "$(field total qwen2.5-0.5b-instruct)"
estimate qwen2.5-7b-instruct
check "Qwen2.5-7B-Instruct: 7,615,616,512 parameters ($(cat "$TMP/err"))" \
    test "$(field params qwen2.5-7b-instruct)" = 7615616512
estimate nanowhale-100m
check "nanowhale-100m (transformers 5): 110,369,621 parameters ($(cat "$TMP/err"))" \
    test "$(field params nanowhale-100m)" = 110369621
# the long-context YaRN that Qwen2.5's model card documents, added to the real config
python3 - "$DATA/real/qwen2.5-7b-instruct.json" "$TMP/yarn.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_scaling"] = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
json.dump(c, open(sys.argv[2], "w"))
PY
"$WHALE" memory --config "$TMP/yarn.json" --dtype bf16 --json >"$TMP/yarn.out" 2>"$TMP/err"
check "Qwen2.5-7B with the model card's YaRN rope_scaling: read ($(cat "$TMP/err"))" test "$(field params yarn)" = 7615616512
finish realconfig
