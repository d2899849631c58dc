#!/bin/sh
# The system calls the daemon makes while it serves, against the unit's
# SystemCallFilter=@system-service, without systemd: runs integration tests with the daemon under
# `strace -f` and lists every call outside the set (exit 1 if any).  With
# GPUCD_TEST_BACKEND=cuda on a GPU machine it checks the CUDA backend's calls.  The tests' own
# verdicts are ignored: strace, as the harness's wrapper, is the process the harness stops with
# SIGTERM, so their teardowns wait for a daemon that never drains and report it (20 s each).
#   syscall_filter.sh BUILD_DIR [TEST...]
#   (TEST relative to BUILD_DIR/tests; default stats/test_stats_exposition integration/test_ops
#   integration/test_doorbell integration/test_submit_queue integration/test_memfd)
set -eu
build=$(cd "$1" && pwd)
shift
[ $# -gt 0 ] || set -- stats/test_stats_exposition integration/test_ops integration/test_doorbell \
  integration/test_submit_queue integration/test_memfd
for tool in strace systemd-analyze; do
  command -v $tool >/dev/null 2>&1 || { echo "$tool not found: skipped"; exit 77; }
done
work=$(mktemp -d /tmp/gpucd-syscalls.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The set, its @groups expanded.
expand() {
  systemd-analyze syscall-filter "$1" | tail -n +2 | sed 's/^ *//; /^#/d; /^$/d' |
    while read -r name; do
      case $name in @*) expand "$name" ;; *) echo "$name" ;; esac
    done
}
expand @system-service | sort -u >"$work/allowed"

for t in "$@"; do
  name=$(basename "$t")
  GPUCD_TEST_WRAPPER="strace -f -qq -o $work/$name.trace" \
    "$build/tests/$t" "$build/daemon/gpucd" >"$work/$name.out" 2>&1 || true
  [ -s "$work/$name.trace" ] || { cat "$work/$name.out"; echo "$t: no trace"; exit 1; }
done
cat "$work"/*.trace | grep -aoE '^[0-9]+ +[a-z_0-9]+\(' | awk '{print $2}' | tr -d '(' |
  sort -u >"$work/used"
outside=$(comm -23 "$work/used" "$work/allowed")
echo "$(wc -l <"$work/used") system calls made (backend ${GPUCD_TEST_BACKEND:-cpu}):" $(cat "$work/used")
if [ -n "$outside" ]; then
  echo "outside @system-service:" $outside
  exit 1
fi
echo "all in @system-service"
