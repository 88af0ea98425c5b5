#!/usr/bin/env bash
# whale chat driven through a pipe: replies per message, each piped line its
# own conversation unless --multi-turn true (a terminal keeps one), 'clear',
# multi-line input, template detection and its errors.
# usage: chat.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
DATA=$2
. "$(dirname "$0")/lib.bash"
need_tokenizer deepseek_v3
tiny_model "$TMP/m" 128815 128

printf 'Hello there\n你是谁？\nclear\n"""\nline one\nline two\n"""\nexit\nnot read\n' |
    "$WHALE" chat -m "$TMP/m" -n 6 --seed 3 --ignore-case 2>/dev/null
check "unknown options are refused" test $? = 2
printf 'Hello there\n你是谁？\nclear\n"""\nline one\nline two\n"""\nexit\nnot read\n' |
    "$WHALE" chat -m "$TMP/m" -n 6 --seed 3 --multi-turn true >"$TMP/out" 2>"$TMP/err"
check "chat exits cleanly" test $? = 0
check "three replies (clear is a command, exit stops reading)" test "$(grep -c 'tokens/s' "$TMP/err")" = 3
check "the second turn reuses the cached conversation" grep -q 'prompt [0-9] new tokens' <(sed -n 2p "$TMP/err")
check "replies are valid UTF-8" iconv -f UTF-8 -t UTF-8 "$TMP/out" -o /dev/null
printf 'Hello\n' | "$WHALE" chat -m "$TMP/m" -n 6 --seed 3 --temperature 0 >"$TMP/g1" 2>/dev/null
printf 'Hello\n' | "$WHALE" chat -m "$TMP/m" -n 6 --seed 9 --temperature 0 >"$TMP/g2" 2>/dev/null
check "greedy replies do not depend on the seed" cmp -s "$TMP/g1" "$TMP/g2"

# prompts PREFIX FILE: the turns' prompt ids (--verbose-prompt) in FILE, one per line, as PREFIX.1, PREFIX.2
prompts() {
    grep -ao 'prompt ids: \[[0-9, ]*\]' "$2" | sed 's/^prompt ids: \[//; s/\]$//' >"$1"
    sed -n 1p "$1" >"$1.1"
    sed -n 2p "$1" >"$1.2"
}
# grows A B: B is A followed by more ids (the first turn is kept in the second)
grows() { test -s "$1" -a "$(wc -c <"$2")" -gt "$(wc -c <"$1")" -a "$(head -c "$(($(wc -c <"$1") - 1))" "$2")" = "$(cat "$1")"; }
# from a pipe, each line is a conversation of its own
printf 'Hello\nHello\n' | "$WHALE" chat -m "$TMP/m" -n 3 --temperature 0 --verbose-prompt >"$TMP/o1" 2>"$TMP/e1"
prompts "$TMP/p1" "$TMP/e1"
check "piped: a reply per line" test "$(wc -l <"$TMP/o1")" = 2 -a "$(wc -l <"$TMP/p1")" = 2
check "piped: each line in a fresh conversation (the same prompt twice)" cmp -s "$TMP/p1.1" "$TMP/p1.2"
check "piped: the same message, the same reply" test "$(sed -n 1p "$TMP/o1")" = "$(sed -n 2p "$TMP/o1")"
# ... unless --multi-turn true: one growing conversation
printf 'Hello\nHello\n' | "$WHALE" chat -m "$TMP/m" -n 3 --temperature 0 --verbose-prompt --multi-turn true \
    >/dev/null 2>"$TMP/e2"
prompts "$TMP/p2" "$TMP/e2"
check "piped --multi-turn true: the first prompt is the same" cmp -s "$TMP/p1.1" "$TMP/p2.1"
check "piped --multi-turn true: the second prompt holds the first turn" grows "$TMP/p2.1" "$TMP/p2.2"
# a terminal keeps one conversation, and --multi-turn false there answers each message on its own
if command -v script >/dev/null; then
    printf 'Hello\nHello\nexit\n' | script -qec "'$WHALE' chat -m '$TMP/m' -n 3 --temperature 0 --verbose-prompt" \
        /dev/null >"$TMP/t3" 2>&1
    tr -d '\r' <"$TMP/t3" >"$TMP/e3"
    prompts "$TMP/p3" "$TMP/e3"
    check "terminal: one conversation (the second prompt holds the first turn)" grows "$TMP/p3.1" "$TMP/p3.2"
    printf 'Hello\nHello\nexit\n' |
        script -qec "'$WHALE' chat -m '$TMP/m' -n 3 --temperature 0 --verbose-prompt --multi-turn false" \
            /dev/null >"$TMP/t4" 2>&1
    tr -d '\r' <"$TMP/t4" >"$TMP/e4"
    prompts "$TMP/p4" "$TMP/e4"
    check "terminal --multi-turn false: the same prompt twice" test -s "$TMP/p4.1" -a "$(cat "$TMP/p4.1")" = "$(cat "$TMP/p4.2")"
fi

# --tools: the tool definitions reach the template, '/tool TEXT' is a tool result
printf '[{"type": "function", "function": {"name": "get_time", "parameters": {}}}]' >"$TMP/tools.json"
printf 'What time is it?\n/tool 12:00\n' | "$WHALE" chat -m "$TMP/m" -n 4 --seed 3 --tools "$TMP/tools.json" \
    >"$TMP/out" 2>"$TMP/err"
check "--tools: exit 0" test $? = 0
check "--tools: a reply to the message and one to the tool result" test "$(grep -c 'tokens/s' "$TMP/err")" = 2
printf '{"not": "a list"}' >"$TMP/tools.json"
echo hi | "$WHALE" chat -m "$TMP/m" -n 4 --tools "$TMP/tools.json" >/dev/null 2>"$TMP/err"
check "--tools must be a list" grep -q 'expected a JSON array of tool definitions' "$TMP/err"
printf '[{"type": "function", "function": {"name": "get_time", "parameters": {}}}]' >"$TMP/tools.json"
echo hi | "$WHALE" chat -m "$TMP/m" -n 4 --chat-template raw --tools "$TMP/tools.json" >/dev/null 2>"$TMP/err"
check "--tools with a native format is refused" grep -q 'native raw format has no tools' "$TMP/err"

# generation_config.json fills the sampling options the command line leaves out
printf '{"do_sample": false, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}\n' >"$TMP/m/generation_config.json"
"$WHALE" generate -m "$TMP/m" -p "Hello" -n 6 --seed 1 >"$TMP/s1" 2>"$TMP/err"
check "generation_config.json is reported" grep -q 'top_k 20, top_p 0.8, repetition_penalty 1.05, do_sample false' "$TMP/err"
"$WHALE" generate -m "$TMP/m" -p "Hello" -n 6 --seed 2 >"$TMP/s2" 2>/dev/null
check "do_sample false: greedy whatever the seed" cmp -s "$TMP/s1" "$TMP/s2"
"$WHALE" generate -m "$TMP/m" -p "Hello" -n 6 --seed 1 --temperature 0.7 2>"$TMP/err" >/dev/null
check "a flag wins over the file (temperature given: do_sample not applied)" \
    grep -q 'top_k 20, top_p 0.8, repetition_penalty 1.05$' "$TMP/err"
printf '{"top_p": 7}\n' >"$TMP/m/generation_config.json"
expect_status 4 'generation_config.json: "top_p" must be' -- "$WHALE" generate -m "$TMP/m" -p "Hello" -n 2
rm "$TMP/m/generation_config.json"

# template detection: a folder whose tokenizer has no chat template
mkdir "$TMP/notmpl"
cp "$TMP/m/config.json" "$TMP/m/model.safetensors" "$TMP/m/tokenizer.json" "$TMP/notmpl/"
echo hi | "$WHALE" chat -m "$TMP/notmpl" -n 4 >/dev/null 2>"$TMP/err"
check "no template: exit 0 with nanowhale's raw fallback" test $? = 0
check "no template: a notice naming the fallback and --chat-template" grep -q -- "chat.py fallback.*--chat-template" "$TMP/err"
echo hi | "$WHALE" chat -m "$TMP/notmpl" -n 4 --chat-template raw >/dev/null 2>&1
check "--chat-template raw works without a template" test $? = 0
echo hi | "$WHALE" chat -m "$TMP/notmpl" -n 4 --chat-template jinja >/dev/null 2>"$TMP/err"
check "an unknown template name is refused" grep -q 'jinja' "$TMP/err"

finish chat
