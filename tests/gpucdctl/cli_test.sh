#!/bin/sh
# gpucdctl and the rl_worker example against a real daemon (CPU backend):
# exit codes, what they print, and that the daemon and the library agree on
# the default URL.
#   cli_test.sh GPUCD_DAEMON GPUCDCTL RL_WORKER VERSION
set -u
daemon=$1
ctl=$2
worker=$3
version=$4
dir=$(mktemp -d /tmp/gpucd-cli-test.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "cli_test: $*" >&2; exit 1; }
unset GPUCD_URL # the default URL is the one under test

# expect RC CMD...: runs CMD, output in $dir/out, and checks its exit status.
expect() {
  want=$1
  shift
  "$@" >"$dir/out" 2>&1
  got=$?
  [ "$got" -eq "$want" ] || { cat "$dir/out" >&2; fail "'$*' exited $got, want $want"; }
}
contains() { grep -q -- "$1" "$dir/out" || { cat "$dir/out" >&2; fail "output lacks '$1'"; }; }

# Usage errors: 2; help: 0.
expect 0 "$ctl" --help
contains "commands:"
for c in info ping regions; do contains "  $c "; done
expect 2 "$ctl"
contains "no command given"
expect 2 "$ctl" frobnicate
contains "unknown command 'frobnicate'"
expect 2 "$ctl" --timeout-ms 0 info
contains "--timeout-ms '0'"
expect 2 "$ctl" --spin-us -1 info
contains "--spin-us '-1'"
expect 2 "$ctl" ping 0
contains "COUNT '0'"
expect 2 "$ctl" ping 3 4
contains "unexpected argument '4'"
expect 2 "$ctl" info now
contains "info: unexpected argument 'now'"
expect 2 "$worker" --batch 0
expect 2 "$ctl" stats --yaml
contains "stats: unexpected argument '--yaml'"

# --version: the project's version, from both programs, with no daemon.
expect 0 "$ctl" --version
grep -q "^gpucdctl $version (libgpucd $version, protocol 1)\$" "$dir/out" || { cat "$dir/out" >&2; fail "gpucdctl --version"; }
expect 0 "$daemon" --version
grep -q "^gpucd $version\$" "$dir/out" || { cat "$dir/out" >&2; fail "gpucd --version"; }
expect 0 "$daemon" --help
contains "--version"

# No daemon: 1, with the reason.
expect 1 "$ctl" --url "ipc://$dir/nobody.sock" info
contains "connection refused"
contains "$dir/nobody.sock"
expect 1 "$ctl" --url "http://x" ping
contains "ipc://, tls+tcp:// or tcp://"

# A daemon on its default URL under XDG_RUNTIME_DIR; gpucdctl finds it without --url.
export XDG_RUNTIME_DIR="$dir"
"$daemon" --backend cpu --stats-listen none --workspace-mb 16 >"$dir/daemon.log" 2>&1 &
pid=$!
i=0
until [ -S "$dir/gpucd.sock" ]; do
  i=$((i + 1))
  [ $i -le 100 ] || { cat "$dir/daemon.log" >&2; fail "daemon did not create $dir/gpucd.sock"; }
  kill -0 "$pid" 2>/dev/null || { cat "$dir/daemon.log" >&2; fail "daemon exited"; }
  sleep 0.1
done

expect 0 "$ctl" info
contains "backend              cpu"
contains "protocol             1"
contains "nmmo3_encode"
# GPUCD_URL, when set, is the clients' default instead (the system service's clients set it).
expect 0 env GPUCD_URL="ipc://$dir/gpucd.sock" XDG_RUNTIME_DIR=/nonexistent "$ctl" info
contains "backend              cpu"
expect 1 env GPUCD_URL="ipc://$dir/nobody.sock" "$ctl" info
contains "$dir/nobody.sock"
expect 0 "$ctl" ping 3
[ "$(grep -c '^ping [0-9]*: round trip [0-9.]* [um]s' "$dir/out")" -eq 3 ] || fail "ping 3 did not print 3 lines"
# ... and ends with a summary of the three.
tail -n 1 "$dir/out" | grep -q '^3 pings: round trip min [0-9.]* [um]s, median [0-9.]* [um]s, mean [0-9.]* [um]s, max [0-9.]* [um]s' ||
  { cat "$dir/out" >&2; fail "ping 3 did not end with a summary line"; }

# stats: indented for people by default, the daemon's JSON as it sent it with --json; both parse.
expect 0 "$ctl" stats --json
[ "$(wc -l <"$dir/out")" -eq 1 ] || { cat "$dir/out" >&2; fail "stats --json is not one line"; }
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["ready"] is True and d["backend"] == "cpu"' "$dir/out" ||
  { cat "$dir/out" >&2; fail "stats --json is not the daemon's JSON"; }
expect 0 "$ctl" stats
contains '^  "ready": true,$'
contains '^  "requests": {$'
contains '^    "ping": {"OK": [0-9]*}'
[ "$(wc -l <"$dir/out")" -gt 20 ] || { cat "$dir/out" >&2; fail "stats is not indented"; }
[ "$(awk 'length > 120' "$dir/out" | wc -l)" -eq 0 ] || { cat "$dir/out" >&2; fail "stats has lines over 120 columns"; }
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$dir/out" ||
  { cat "$dir/out" >&2; fail "stats printed no JSON"; }
expect 0 "$ctl" --spin-us 500 ping 3
[ "$(grep -c '^ping [0-9]*: round trip' "$dir/out")" -eq 3 ] || fail "a polling ping 3 did not print 3 lines"
expect 0 "$ctl" --url "ipc://$dir/gpucd.sock" regions
contains "0 regions"
expect 0 "$worker" --batch 8 --steps 3 --hidden 32 --seed 7
contains "round trip us: p50"
contains "backend cpu"

# The daemon runs as this user: told to trust another uid, gpucdctl refuses it.  (The
# refusals come last: nng 1.5.2 rarely fails to accept a connection right after one the
# client closed at once.)
me=$(id -u)
expect 0 env GPUCD_TRUST_UID=$((me + 1)) "$ctl" --trust-uid "$me" info
contains "backend              cpu"
expect 2 "$ctl" --trust-uid nobody info
contains "--trust-uid 'nobody'"
expect 1 "$ctl" --trust-uid $((me + 1)) info
contains "runs as uid $me, expected $((me + 1))"
expect 1 env GPUCD_TRUST_UID=$((me + 1)) "$ctl" info
contains "runs as uid $me, expected $((me + 1))"

kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ "$rc" -eq 0 ] || fail "daemon exited $rc on SIGTERM"
echo "cli_test: ok"
