#!/usr/bin/env bash
# Prove the README's promise that its two commands work on a fresh Debian 12
# machine: build a bare `debootstrap --variant=minbase bookworm` chroot, copy
# the committed tree into it (`git archive HEAD`, what a fresh clone sees),
# run the commands of README.md's first ```sh block inside as a new user
# would, report each one, then unmount everything and remove the chroot.
#
#   sudo scripts/check-fresh.sh        (root: debootstrap, chroot and mounts)
#
# The mirror comes from this machine's apt sources; its CA certificates,
# apt proxy, proxy variables and npm settings are carried in, so the chroot
# reaches Debian and npm the same way the host does (a TLS-inspecting proxy
# included). Nothing else of the host is visible inside.
#
# Environment:
#   CHECK_FRESH_MIRROR=URL   Debian mirror to use instead of the apt sources'
#   CHECK_FRESH_CACHE=0      no debootstrap tarball / apt cache in .cache/check-fresh
#   CHECK_FRESH_VERBOSE=1    stream each command's output (otherwise: its tail on failure)
#   CHECK_FRESH_TIMEOUT=S    seconds allowed per command (default 3600)
#   CHECK_FRESH_ENV="V=x ..." variables set for the commands inside, e.g. STEPS=20
#                            for a shorter demo (not for the proof itself)
# Exit status: 0 when every command passed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
suite=bookworm
cache_dir=$repo/.cache/check-fresh # .cache/ is ignored by git
use_cache=${CHECK_FRESH_CACHE:-1}
verbose=${CHECK_FRESH_VERBOSE:-0}
cmd_timeout=${CHECK_FRESH_TIMEOUT:-3600}

exec 3>&1 4>&2 # the terminal, for cleanup's messages even when a command's output goes to its log
say() { printf 'check-fresh: %s\n' "$*"; }
die() {
    printf 'check-fresh: error: %s\n' "$*" >&2
    exit 1
}
# seconds -> "4m05s"
dur() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot and mounts): sudo $0"
git -C "$repo" rev-parse --verify -q HEAD >/dev/null 2>&1 ||
    die "needs git and a git checkout: the chroot gets \`git archive HEAD\`"

# ---------------------------------------------------------------- mirror
# Debian archive entries of the host's apt sources, one "URI SUITE" line per
# enabled `deb` entry with component main, from one-line .list files and
# deb822 .sources files alike.
apt_entries() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # deb [options] URI SUITE COMPONENT...
        sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
            awk '$1 == "deb" && NF >= 4 { for (i = 4; i <= NF; i++) if ($i == "main") { print $2, $3; break } }'
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # stanzas separated by blank lines; fields Types/URIs/Suites/Components/Enabled
        awk '
            function flush(   u, s, nu, ns, i, j) {
                if (types ~ /(^| )deb( |$)/ && comps ~ /(^| )main( |$)/ && enabled !~ /^[Nn]o/) {
                    nu = split(uris, u, " "); ns = split(suites, s, " ")
                    for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print u[i], s[j]
                }
                types = uris = suites = comps = enabled = ""
            }
            /^[ \t]*#/ { next } # a comment line does not end the stanza
            /^[ \t]*$/ { flush(); next }
            /^[A-Za-z-]+:/ {
                key = tolower($1); $1 = ""; sub(/^ +/, "")
                if (key == "types:") types = $0
                else if (key == "uris:") uris = $0
                else if (key == "suites:") suites = $0
                else if (key == "components:") comps = $0
                else if (key == "enabled:") enabled = $0
            }
            END { flush() }' "$f"
    done
}

# Is URI's SUITE the Debian archive? Not when apt's downloaded Release file
# for it names another origin (a third-party "bookworm main" repository).
is_debian() {
    local uri=$1 dist=$2 f r
    f=/var/lib/apt/lists/$(printf '%s/dists/%s' "${uri%/}" "$dist" | sed -e 's|^[a-z+]*://||' -e 's|/|_|g')
    for r in "${f}_InRelease" "${f}_Release"; do
        [ -f "$r" ] && { grep -q '^Origin: Debian$' "$r"; return; }
    done
    return 0 # never downloaded here: trust the entry
}

# first Debian entry for SUITE -> its URI
entry_for() {
    local uri dist
    while read -r uri dist; do
        [ "$dist" = "$1" ] && is_debian "$uri" "$dist" && { echo "$uri"; return 0; }
    done < <(apt_entries)
    return 1
}

mirror=${CHECK_FRESH_MIRROR:-$(entry_for "$suite" || true)}
[ -n "$mirror" ] || die "no Debian 'deb ... $suite main' entry in /etc/apt/sources.list{,.d/*}; set CHECK_FRESH_MIRROR"
updates=$(entry_for "$suite-updates" || true)
security=$(entry_for "$suite-security" || true)
say "mirror from the host's apt sources: $mirror"

# apt proxy settings of the host (Acquire::http::Proxy and the like)
apt_proxy=$(apt-config dump 2>/dev/null | grep -E '^Acquire::[A-Za-z]+::Proxy' || true)
if [ -z "${http_proxy:-}" ] && proxy=$(printf '%s\n' "$apt_proxy" | sed -n 's/^Acquire::http::Proxy "\(.*\)";$/\1/p') &&
    [ -n "$proxy" ] && [ "$proxy" != DIRECT ]; then
    export http_proxy=$proxy # debootstrap downloads with wget, which reads http_proxy, not apt's settings
fi

# ---------------------------------------------------------------- host tools
if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap on the host"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null
    }
fi

# ---------------------------------------------------------------- work folder and cleanup
work=$(mktemp -d "${TMPDIR:-/tmp}/check-fresh.XXXXXX")
root=$work/root
case $work in *[[:space:]]*) rmdir "$work"; die "temporary folder '$work' has white space: set TMPDIR" ;; esac
mkdir "$root"
child="" ticker=""

# mount points at or below $root, deepest first
mounts_below() {
    findmnt -rn -o TARGET | awk -v r="$root" '$0 == r || index($0, r "/") == 1 { print length($0), $0 }' |
        sort -rn | cut -d' ' -f2-
}

cleanup() {
    local status=$? m pid left
    set +e
    trap - EXIT INT TERM
    exec 1>&3 2>&4
    case $status in 130 | 143) say "interrupted: cleaning up" ;; esac
    [ -n "$child" ] && kill "$child" 2>/dev/null
    [ -n "$ticker" ] && kill "$ticker" 2>/dev/null
    # processes still running inside the chroot (a test's leftover, a timed-out command)
    for sig in TERM KILL; do
        left=0
        for pid in /proc/[0-9]*; do
            [ "$(readlink "$pid/root" 2>/dev/null)" = "$root" ] || continue
            kill -s "$sig" "${pid#/proc/}" 2>/dev/null && left=1
        done
        [ "$left" = 1 ] && [ "$sig" = TERM ] && sleep 2
    done
    # unmount everything below the chroot (ours, and any a test left behind), deepest first
    for m in $(mounts_below); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "cannot unmount $m"
    done
    if [ -n "$(mounts_below)" ]; then
        say "still mounted below $root, NOT removing $work:"
        mounts_below | sed 's/^/check-fresh:   /'
        exit 1
    fi
    # --one-file-system: even if a mount slipped in, never descend into it
    say "unmounted; removing the chroot"
    rm -rf --one-file-system "$work"
    say "done in $(dur "$SECONDS") in all"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run the command line in the background and wait for it, so a signal reaches
# our trap at once rather than after the command finishes
run_bg() {
    "$@" 3>&- 4>&- &
    child=$!
    local rc=0
    wait "$child" || rc=$?
    child=""
    return "$rc"
}

# the chroot must allow device files and executables
opts=$(findmnt -n -o OPTIONS -T "$work")
case ",$opts," in *,noexec,* | *,nodev,*)
    die "$work is on a noexec/nodev mount ($opts): set TMPDIR to another folder" ;;
esac

# ---------------------------------------------------------------- debootstrap
include=()
case $mirror in https:*) include=(--include=ca-certificates) ;; esac # apt over TLS needs them from the start
t0=$SECONDS
if [ "$use_cache" = 1 ]; then
    # packages of the base system as a tarball, rebuilt when older than 30 days
    mkdir -p "$cache_dir"
    tarball=$cache_dir/$suite-minbase-$(dpkg --print-architecture)${include:+-ca}.tgz
    if [ -z "$(find "$tarball" -mtime -30 2>/dev/null)" ]; then
        say "debootstrap: downloading the $suite minbase packages into ${tarball#"$repo"/}"
        mkdir "$work/tarball"
        run_bg debootstrap --variant=minbase "${include[@]}" --make-tarball="$tarball.part" \
            "$suite" "$work/tarball" "$mirror" >"$work/debootstrap.log" 2>&1 ||
            { tail -n 30 "$work/debootstrap.log"; die "debootstrap --make-tarball failed"; }
        mv "$tarball.part" "$tarball"
        rm -rf --one-file-system "$work/tarball"
    fi
    say "debootstrap: $suite minbase from ${tarball#"$repo"/}"
    run_bg debootstrap --variant=minbase "${include[@]}" --unpack-tarball="$tarball" \
        "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
        { tail -n 30 "$work/debootstrap.log"; die "debootstrap failed (rerun with CHECK_FRESH_CACHE=0 to bypass the cached tarball)"; }
else
    say "debootstrap: $suite minbase from the mirror"
    run_bg debootstrap --variant=minbase "${include[@]}" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
        { tail -n 30 "$work/debootstrap.log"; die "debootstrap failed"; }
fi
say "debootstrap: done in $(dur $((SECONDS - t0)))"

# ---------------------------------------------------------------- the host's network settings
# apt: the Debian entries the host uses (the release, its updates and security)
{
    echo "deb $mirror $suite main"
    [ -n "$updates" ] && echo "deb $updates $suite-updates main"
    [ -n "$security" ] && echo "deb $security $suite-security main"
} >"$root/etc/apt/sources.list"
[ -n "$apt_proxy" ] && printf '%s\n' "$apt_proxy" >"$root/etc/apt/apt.conf.d/01proxy"
# no daemon started by a package install may outlive the run
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
cp -L /etc/hosts "$root/etc/hosts" 2>/dev/null || true

# CA certificates: the host's bundle as is (for what runs before the
# ca-certificates package is installed), and as a local CA file, so the
# bundle the package regenerates still trusts everything the host trusts.
host_bundle=/etc/ssl/certs/ca-certificates.crt
if [ -s "$host_bundle" ]; then
    mkdir -p "$root/etc/ssl/certs" "$root/usr/local/share/ca-certificates"
    cp -L "$host_bundle" "$root$host_bundle"
    cp -L "$host_bundle" "$root/usr/local/share/ca-certificates/host-bundle.crt"
fi
# copy_in FILE: the host's file at the same path inside (CA files named by
# the environment or npm's settings)
copy_in() {
    case $1 in /*) ;; *) return 0 ;; esac
    [ -f "$1" ] || return 0
    [ -e "$root$1" ] && cmp -s "$1" "$root$1" && return 0
    mkdir -p "$root$(dirname "$1")"
    cp -L "$1" "$root$1"
}
# variables passed inside: CA locations and proxies, as the host has them
pass_vars=(NODE_EXTRA_CA_CERTS SSL_CERT_FILE SSL_CERT_DIR CURL_CA_BUNDLE REQUESTS_CA_BUNDLE GIT_SSL_CAINFO
    http_proxy https_proxy ftp_proxy all_proxy no_proxy HTTP_PROXY HTTPS_PROXY FTP_PROXY ALL_PROXY NO_PROXY)
env_in=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb)
for v in "${pass_vars[@]}"; do
    [ -n "${!v:-}" ] || continue
    env_in+=("$v=${!v}")
    copy_in "${!v}"
done
read -r -a extra_env <<<"${CHECK_FRESH_ENV:-}"
for v in "${extra_env[@]}"; do
    [[ $v == [A-Za-z_]*=* ]] || die "CHECK_FRESH_ENV: '$v' is not VAR=value"
    env_in+=("$v")
done
while IFS='=' read -r v _; do # npm_config_* variables (npm reads them as settings)
    env_in+=("$v=${!v}")
    copy_in "${!v}"
done < <(env | grep -iE '^npm_config_[a-z_]+=' || true)

# npm: the host's user and global config files become root's ~/.npmrc and
# /etc/npmrc inside (Debian's npm reads its global config there); a cafile
# they name is copied in too
if command -v npm >/dev/null; then
    userconfig=$(npm config get userconfig 2>/dev/null || true)
    globalconfig=$(npm config get globalconfig 2>/dev/null || true)
    [ -f "$userconfig" ] && cp -L "$userconfig" "$root/root/.npmrc"
    [ -f "$globalconfig" ] && cp -L "$globalconfig" "$root/etc/npmrc"
    copy_in "$(npm config get cafile 2>/dev/null || true)"
    say "npm settings carried in: $(npm config get registry 2>/dev/null), cafile $(npm config get cafile 2>/dev/null)"
else
    say "no npm on the host: npm inside uses its defaults"
fi

# ---------------------------------------------------------------- the checkout
src=/root/nanowhale.c
commit=$(git -C "$repo" rev-parse --short HEAD)
[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] ||
    say "note: uncommitted changes are not part of the check (it sees commit $commit)"
mkdir -p "$root$src"
git -C "$repo" archive --format=tar HEAD | tar -x -C "$root$src"

# the README's commands: the first ```sh block, comments and blank lines left out
mapfile -t commands < <(awk '/^```sh[[:space:]]*$/ { inblock = 1; next }
    inblock && /^```/ { exit }
    inblock && !/^[[:space:]]*(#|$)/' "$repo/README.md")
[ ${#commands[@]} -gt 0 ] || die "no commands found in README.md's first \`\`\`sh block"

# apt's downloaded packages from earlier runs (apt still resolves everything
# against the mirror's current indexes; this only saves the downloads)
debs=$cache_dir/apt-archives
if [ "$use_cache" = 1 ] && compgen -G "$debs/*.deb" >/dev/null; then
    cp "$debs"/*.deb "$root/var/cache/apt/archives/"
fi

# ---------------------------------------------------------------- mounts
mount -t proc proc "$root/proc" 2>/dev/null || mount --bind /proc "$root/proc"
mount --bind /sys "$root/sys"
mount --make-slave "$root/sys" # nothing mounted below it inside propagates back to the host
mount --bind /dev "$root/dev"
mount --make-slave "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount --make-slave "$root/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm" # a private /dev/shm

# ---------------------------------------------------------------- the commands
say "commit $commit in $src; ${#commands[@]} commands from README.md"
mkdir -p "$cache_dir/logs"
failed=0
results=()
for i in "${!commands[@]}"; do
    cmd=${commands[$i]}
    log=$work/command-$((i + 1)).log
    say "run $((i + 1))/${#commands[@]}: $cmd"
    t0=$SECONDS
    rc=0
    if [ "$verbose" != 1 ]; then # a sign of life every 5 minutes, for CI logs
        (while sleep 300; do say "  ... still running ($(dur $((SECONDS - t0))))"; done) &
        ticker=$!
    fi
    # a login shell of a new root user, with only the environment above;
    # stdin is /dev/null as in CI
    run_in=(timeout --kill-after=30 "$cmd_timeout" chroot "$root" /usr/bin/env -i "${env_in[@]}"
        /bin/bash -lc "cd $src && $cmd")
    if [ "$verbose" = 1 ]; then
        run_bg "${run_in[@]}" </dev/null > >(tee "$log" | sed 's/^/  | /') 2>&1 || rc=$?
    else
        run_bg "${run_in[@]}" </dev/null >"$log" 2>&1 || rc=$?
    fi
    took=$((SECONDS - t0))
    [ -n "$ticker" ] && { kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true; ticker=""; }
    cp "$log" "$cache_dir/logs/"
    if [ "$use_cache" = 1 ]; then # apt's downloads, for the next run
        mkdir -p "$debs"
        cp -u "$root"/var/cache/apt/archives/*.deb "$debs/" 2>/dev/null || true
    fi
    if [ "$rc" = 0 ]; then
        results+=("PASS  exit 0  $(dur "$took")  $cmd")
        say "passed in $(dur "$took")"
    else
        failed=1
        [ "$rc" = 124 ] && say "timed out after ${cmd_timeout}s"
        results+=("FAIL  exit $rc  $(dur "$took")  $cmd")
        say "FAILED with exit $rc after $(dur "$took"); the last 40 lines of its output:"
        tail -n 40 "$log" | awk '{ print "check-fresh: | " $0 }' # awk ends even a cut-off last line
    fi
done

say "summary (Debian $suite minbase, commit $commit${CHECK_FRESH_ENV:+, with $CHECK_FRESH_ENV}; full logs in ${cache_dir#"$repo"/}/logs/):"
for r in "${results[@]}"; do say "  $r"; done
[ "$failed" = 0 ] && say "the README's commands work on a fresh Debian 12" ||
    say "the README's commands do NOT all work on a fresh Debian 12"
exit "$failed"
