#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair,
# one rank in each, Open MPI over TCP between their addresses only (the
# second rank's daemon is started in its namespace by an rsh agent, as ssh
# would start it on another machine). The run crosses a real network stack
# and equals one process bit for bit. The namespaces are removed whatever
# happens. Skipped (77) without root, ip, unshare, mpirun or MPI in the build.
# usage: mpi_netns.sh WHALE_BIN TEST_DATA_DIR
set -u
WHALE=$1
. "$(dirname "$0")/lib.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
skip() { echo "mpi_netns.sh: $1: skipped" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root"
for t in ip unshare mpirun; do command -v $t >/dev/null || skip "no $t"; done
ldd "$WHALE" | grep -q libmpi || skip "this build has no MPI"

A=whale-$$-a B=whale-$$-b VA=wv$$a VB=wv$$b NET=10.213.$(($$ % 250))
cleanup() {
    ip netns del "$A" 2>/dev/null # takes its end of the veth pair, and so the pair, with it
    ip netns del "$B" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
ip netns add "$A" && ip netns add "$B" && ip link add "$VA" type veth peer name "$VB" || skip "cannot make namespaces"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B"
ip -n "$A" addr add $NET.1/24 dev "$VA" && ip -n "$B" addr add $NET.2/24 dev "$VB"
for ns in "$A:$VA" "$B:$VB"; do ip -n "${ns%:*}" link set "${ns#*:}" up && ip -n "${ns%:*}" link set lo up; done

# the rsh agent: "AGENT [options] HOST COMMAND…" runs COMMAND in HOST's namespace under its own host name
mkdir "$TMP/hosts"
echo "$A" >"$TMP/hosts/$NET.1"
echo "$B" >"$TMP/hosts/$NET.2"
cat >"$TMP/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
ns=\$(cat "$TMP/hosts/\$1"); shift
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$ns; \$*"
AGENT
chmod +x "$TMP/agent"
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")/.." && pwd)/lsan-openmpi.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
MPIRUN=(mpirun --allow-run-as-root --quiet -H $NET.1:1,$NET.2:1 --mca plm_rsh_agent "$TMP/agent" --mca btl tcp,self
        --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24 --bind-to none)
for v in OMP_NUM_THREADS OMP_WAIT_POLICY LSAN_OPTIONS ASAN_OPTIONS UBSAN_OPTIONS WHALE_ISA; do
    [ -n "${!v+x}" ] && MPIRUN+=(-x $v)
done
in_a() { ip netns exec "$A" unshare --uts sh -c "hostname $A; exec \"\$@\"" sh "$@"; }

mkdir "$TMP/corpus"
for d in $(seq 1 12); do
    awk -v seed="$d" 'BEGIN { srand(seed); split("the a some", det); split("cat dog bird fish", noun);
        for (s = 0; s < 30; s++) printf "%s %s sees %s %s.\n", det[int(rand()*3)+1], noun[int(rand()*4)+1],
            det[int(rand()*3)+1], noun[int(rand()*4)+1] }' >"$TMP/corpus/doc$d.txt"
done
"$WHALE" tokenizer train --vocab-size 300 --out "$TMP/tok" "$TMP"/corpus/*.txt >/dev/null 2>&1
"$WHALE" data prepare --tokenizer "$TMP/tok" --out "$TMP/data" --val-docs 2 "$TMP"/corpus/*.txt >/dev/null 2>&1
ARGS=(--init tiny --data "$TMP/data" --tokenizer "$TMP/tok" --seq-len 32 --batch-size 2 --grad-accum 2 --max-steps 4
      --lr 3e-3 --warmup-steps 1 --save-every 4 --log-every 1 --threads 1 --quiet)
"$WHALE" train "${ARGS[@]}" --out "$TMP/one" >/dev/null 2>&1
check "one process trains" test -s "$TMP/one/model.safetensors"

tx() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes"; }
a0=$(tx "$A" "$VA") b0=$(tx "$B" "$VB")
in_a timeout 300 "${MPIRUN[@]}" -np 2 "$WHALE" train "${ARGS[@]}" --out "$TMP/two" >"$TMP/out" 2>"$TMP/err"
st=$?
a1=$(tx "$A" "$VA") b1=$(tx "$B" "$VB")
check "2 ranks in 2 namespaces train (status $st): $(tail -1 "$TMP/err")" test "$st" = 0
check "the run equals one process bit for bit" cmp -s "$TMP/one/model.safetensors" "$TMP/two/model.safetensors"
sent=$(grep '"comm_bytes"' "$TMP/two/metrics.jsonl" | tail -1 | sed -E 's/.*"comm_bytes": ([0-9]+).*/\1/')
check "rank 0's exchanges ($sent bytes) crossed the veth pair ($((a1 - a0)) bytes out of $A, $((b1 - b0)) out of $B)" \
    test "$((a1 - a0))" -ge "${sent:-1000000000}" -a "$((b1 - b0))" -ge "${sent:-1000000000}"
finish mpi_netns.sh
