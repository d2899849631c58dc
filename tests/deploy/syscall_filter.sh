#!/bin/sh
# The system calls the daemon makes while it serves, against the unit's
# SystemCallFilter=@system-service, without systemd: runs integration tests with the daemon under
# `strace -f` and lists every call outside the set (exit 1 if any).  With
# GPUCD_TEST_BACKEND=cuda on a GPU machine it checks the CUDA backend's calls.  A test that
# fails is reported, but the calls are what this checks (test_ops compares with the CPU kernels
# byte for byte, which the CUDA backend does not match).
#   syscall_filter.sh BUILD_DIR [TEST...]
#   (TEST relative to BUILD_DIR/tests; default stats/test_stats_exposition integration/test_ops
#   integration/test_doorbell: tests that neither kill their daemon, which would leave it traced
#   and running, nor read its /proc entry, which is the wrapper's)
set -eu
build=$(cd "$1" && pwd)
shift
[ $# -gt 0 ] || set -- stats/test_stats_exposition integration/test_ops integration/test_doorbell
for tool in strace systemd-analyze; do
  command -v $tool >/dev/null 2>&1 || { echo "$tool not found: skipped"; exit 77; }
done
work=$(mktemp -d /tmp/gpucd-syscalls.XXXXXX)
# A daemon still traced at the end (its test killed the wrapper) is killed: the first process of
# each trace, while it still runs this build's gpucd.
finish() {
  for trace in "$work"/*.trace.*; do
    [ -s "$trace" ] || continue
    pid=$(head -n 1 "$trace" | awk '{print $1}')
    [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$build/daemon/gpucd" ] && kill -KILL "$pid"
  done
  rm -rf "$work"
}
trap finish EXIT

# The set, its @groups expanded.
expand() {
  systemd-analyze syscall-filter "$1" | tail -n +2 | sed 's/^ *//; /^#/d; /^$/d' |
    while read -r name; do
      case $name in @*) expand "$name" ;; *) echo "$name" ;; esac
    done
}
expand @system-service | sort -u >"$work/allowed"

wrap=$(cd "$(dirname "$0")" && pwd)/strace_wrap.sh
for t in "$@"; do
  name=$(basename "$t")
  GPUCD_TEST_WRAPPER="sh $wrap $work/$name.trace" \
    "$build/tests/$t" "$build/daemon/gpucd" >"$work/$name.out" 2>&1 ||
    echo "$t failed under strace (it sees the wrapper's pid as the daemon's); its calls count"
  ls "$work/$name".trace.* >/dev/null 2>&1 || { cat "$work/$name.out"; echo "$t: no trace"; exit 1; }
done
cat "$work"/*.trace.* | grep -aoE '^[0-9]+ +[a-z_0-9]+\(' | awk '{print $2}' | tr -d '(' |
  sort -u >"$work/used"
outside=$(comm -23 "$work/used" "$work/allowed")
echo "$(wc -l <"$work/used") system calls made (backend ${GPUCD_TEST_BACKEND:-cpu}):" $(cat "$work/used")
if [ -n "$outside" ]; then
  echo "outside @system-service:" $outside
  exit 1
fi
echo "all in @system-service"
