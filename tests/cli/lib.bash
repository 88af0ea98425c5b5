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
