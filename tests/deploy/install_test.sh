#!/bin/sh
# `cmake --install` of the systemd pieces to a temporary prefix: the unit (naming that prefix's
# gpucd and gpucd.conf, Type=notify only in a build that can notify), the configuration, the
# sysusers.d entry; then, where systemd's tools are here, systemd-analyze verify of the unit and
# systemd-sysusers --dry-run of the entry, each with nothing to say.  Exits 77 (skipped) after
# the file checks when systemd-analyze is absent.
#   install_test.sh BUILD_DIR WORK_DIR HAVE_SYSTEMD(ON|OFF)
set -eu
build=$1
work=$2
have_systemd=$3
fail() { echo "install_test: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"

unit="$prefix/lib/systemd/system/gpucd.service"
test -f "$unit" || fail "the unit is not in lib/systemd/system"
test -f "$prefix/etc/gpucd/gpucd.conf" || fail "gpucd.conf is not in etc/gpucd"
test -f "$prefix/lib/sysusers.d/gpucd.conf" || fail "the sysusers.d entry is not in lib/sysusers.d"
grep -qx "ExecStart=$prefix/bin/gpucd --config $prefix/etc/gpucd/gpucd.conf" "$unit" ||
  fail "ExecStart does not name the installed files: $(grep ExecStart= "$unit")"
grep -q "gpucd.service" "$build/install_manifest.txt" || fail "the unit is not in install_manifest.txt"
if [ "$have_systemd" = ON ]; then
  grep -qx "Type=notify" "$unit" || fail "a build with libsystemd installs Type=notify"
  grep -q "^WatchdogSec=" "$unit" || fail "no WatchdogSec= in a build that pings the watchdog"
else
  grep -qx "Type=exec" "$unit" || fail "a build without libsystemd must install Type=exec"
  ! grep -q "^WatchdogSec=" "$unit" || fail "WatchdogSec= in a build that never pings"
fi
# The service's socket and the clients' default agree: the unit sets GPUCD_URL, and the shipped
# configuration names no other listener.
grep -qx "Environment=GPUCD_URL=ipc:///run/gpucd/gpucd.sock" "$unit" || fail "the unit sets no GPUCD_URL"
grep -q "^RuntimeDirectory=gpucd$" "$unit" || fail "the unit makes no /run/gpucd"
! grep -q "^listen" "$prefix/etc/gpucd/gpucd.conf" || fail "gpucd.conf overrides GPUCD_URL with a listen line"
# Hardening that must be there, and what must stay off.
for line in UMask=0077 SystemCallFilter=@system-service; do
  grep -qx "$line" "$unit" || fail "no $line"
done
! grep -q "^RemoveIPC=yes" "$unit" || fail "RemoveIPC= would delete the clients' shared memory"

command -v systemd-analyze >/dev/null 2>&1 || { echo "systemd-analyze not found: skipped"; exit 77; }
out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify failed: $out"
[ -z "$out" ] || fail "systemd-analyze verify: $out"
mkdir -p "$work/root/etc"
out=$(systemd-sysusers --dry-run --root="$work/root" "$prefix/lib/sysusers.d/gpucd.conf" 2>&1 >/dev/null) ||
  fail "systemd-sysusers rejects the entry: $out"
echo "installed, verified: $unit"
