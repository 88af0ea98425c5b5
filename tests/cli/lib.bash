# Shared by the CLI test scripts (sourced, not run): a temporary folder
# removed on exit, a check counter, and the closing summary line.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0 checks=0

# check DESCRIPTION COMMAND...: the command must succeed
check() {
    local what=$1
    shift
    checks=$((checks + 1))
    if ! "$@"; then
        echo "FAIL: $what" >&2
        fails=$((fails + 1))
    fi
}

# the real tokenizer files (scripts/fetch-tokenizers.sh), or fail clearly
need_tokenizer() { # need_tokenizer NAME -> sets TOK
    TOK=${WHALE_TOKENIZERS:-$DATA/../../.cache/tokenizers}/$1
    if [ ! -s "$TOK/tokenizer.json" ]; then
        echo "$(basename "$0"): $TOK/tokenizer.json missing: run scripts/fetch-tokenizers.sh" >&2
        exit 1
    fi
}

# tiny_model OUT VOCAB MAX_POSITIONS: a one-layer nanowhale with random
# weights whose embedding covers a real tokenizer's ids, with $TOK's files
tiny_model() {
    cat >"$TMP/tiny-cfg.json" <<JSON
{"model_type": "deepseek_v4", "vocab_size": $2, "hidden_size": 32, "num_hidden_layers": 1,
 "num_attention_heads": 2, "head_dim": 16, "qk_rope_head_dim": 8, "q_lora_rank": 16, "o_groups": 1,
 "o_lora_rank": 8, "moe_intermediate_size": 32, "n_routed_experts": 2, "num_experts_per_tok": 1,
 "hc_mult": 2, "hc_sinkhorn_iters": 2, "max_position_embeddings": $3, "eos_token_id": 1}
JSON
    "$WHALE" init --preset "$TMP/tiny-cfg.json" --out "$1" --tokenizer "$TOK" 2>/dev/null
}

# expect_status STATUS PATTERN -- command...: the command fails with that
# exit status and exactly one stderr line matching PATTERN
expect_status() {
    local status=$1 pattern=$2
    shift 3
    checks=$((checks + 1))
    "$@" >"$TMP/out" 2>"$TMP/err"
    local st=$?
    if [ "$st" != "$status" ] || ! grep -Eq -- "$pattern" "$TMP/err" || [ "$(wc -l <"$TMP/err")" != 1 ]; then
        echo "FAIL: $* -> status $st (want $status), stderr: $(cat "$TMP/err")" >&2
        fails=$((fails + 1))
    fi
}

# finish NAME: the summary line CI reads, and the exit status
finish() {
    echo "$1: $((checks - fails)) passed, $fails failed"
    [ "$fails" = 0 ]
}
