#!/bin/sh
# gpucdctl bench against a real daemon (CPU backend): what it refuses to report
# and what it warns of, so that no figure it prints misleads.
#   bench_cli_test.sh GPUCD_DAEMON GPUCDCTL
# Every check is decided by counts, never by how fast this machine is: the
# minimum counts asked for are far beyond (or within) what any machine reaches.
set -u
daemon=$1
ctl=$2
dir=$(mktemp -d /tmp/gpucd-bench-cli-test.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "bench_cli_test: $*" >&2; exit 1; }

# expect RC CMD...: runs CMD, output in $dir/out, and checks its exit status.
expect() {
  want=$1
  shift
  "$@" >"$dir/out" 2>&1
  got=$?
  [ "$got" -eq "$want" ] || { cat "$dir/out" >&2; fail "'$*' exited $got, want $want"; }
}
contains() { grep -q -- "$1" "$dir/out" || { cat "$dir/out" >&2; fail "output lacks '$1'"; }; }
# json EXPR: a Python expression on the bench JSON j must hold.
json() {
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' \
    "$dir/b.json" "$1" || { cat "$dir/out" "$dir/b.json" >&2; fail "bench JSON: not $1"; }
}

# Usage errors before anything connects.
url="ipc://$dir/gpucd.sock"
expect 2 "$ctl" --url "$url" bench --min-requests 0
contains "--min-requests '0'"
expect 2 "$ctl" --url "$url" bench --max-level-s 0
contains "--max-level-s '0'"
expect 0 "$ctl" --url "$url" bench --help
contains "--min-requests N"

"$daemon" --backend cpu --stats-listen none --workspace-mb 16 --listen "$url" >"$dir/daemon.log" 2>&1 &
pid=$!
i=0
until [ -S "$dir/gpucd.sock" ]; do
  i=$((i + 1))
  [ $i -le 100 ] || { cat "$dir/daemon.log" >&2; fail "daemon did not create $dir/gpucd.sock"; }
  kill -0 "$pid" 2>/dev/null || { cat "$dir/daemon.log" >&2; fail "daemon exited"; }
  sleep 0.1
done
b() { "$ctl" --url "$url" bench --json "$dir/b.json" "$@"; }

# A level that cannot measure its minimum count before --max-level-s is an error, with
# the reason: no machine makes a million round trips in half a second.
expect 1 b --op ping --min-requests 1000000 --max-level-s 0.5 --warmup-s 0 --window-s 0.1
contains "fewer than the minimum of 1000000 (--min-requests)"
contains "cut off by --max-level-s 0.5"
json 'j["levels"][0]["requests"] < 1000000 and "error" in j["levels"][0]'

# Windows stretch to fit a slow operation: the loss at a size a CPU takes milliseconds
# over, in windows of 10 ms, still measures the minimum count.
expect 0 b --op loss --batch 32 --dim 256 --vocab 4000 --min-requests 9 --warmup-s 0 --window-s 0.01 \
  --max-windows 3
json 'j["levels"][0]["requests"] >= 9 and j["min_requests"] == 9 and j["levels"][0]["windows"] >= 3'
# Percentiles that rest on few samples are flagged, in the table and the JSON.
json '"p99" in j["levels"][0]["few_samples"]'
contains "p99\\* from fewer than 10 samples beyond it"
# Latencies in units a person reads: us, ms or s.
grep -Eq '^ +1 +- .*[0-9] (us|ms|s)\*? ' "$dir/out" || { cat "$dir/out" >&2; fail "no readable latency units"; }

# An open-loop rate the daemon cannot sustain says so (a warning: exit 0).
expect 0 b --op ping --rate 10000000 --concurrency 1 --min-requests 30 --warmup-s 0 --window-s 0.05
contains "warning: the daemon did not sustain --rate 10000000"
json 'j["levels"][0]["rate_sustained"] is False'

# Progress on a terminal: each level and each server-side request shows at once on stderr.
if command -v script >/dev/null 2>&1; then
  expect 0 script -qefc "'$ctl' --url '$url' bench --op ping --concurrency 1:2:x2 --min-requests 10 --warmup-s 0 --window-s 0.01" "$dir/typescript"
  contains "level 1/2 (concurrency 1)"
  contains "level 2/2 (concurrency 2)"
  expect 0 script -qefc "'$ctl' --url '$url' bench --op conv2 --batch 4 --server-side 5 --server-warmup 1 --server-repeats 2" "$dir/typescript"
  contains "server-side conv2: request 1 of 2"
  contains "server-side conv2: request 2 of 2"
else
  echo "bench_cli_test: no script(1): the progress line on a terminal is not checked"
fi

kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ "$rc" -eq 0 ] || fail "daemon exited $rc on SIGTERM"
echo "bench_cli_test: ok"
