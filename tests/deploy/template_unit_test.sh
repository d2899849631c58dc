#!/bin/sh
# The template unit gpucd@.service (one daemon per GPU) as `cmake --install` puts it: every line
# of gpucd.service but those an instance must change is its own too, and it changes no other;
# its start command, run with a stand-in daemon, passes --device N and the stats port 9470 + N
# and refuses an instance that is no device number; then, where systemd's tools are here,
# systemd-analyze verify of the instances gpucd@0 and gpucd@1 with nothing to say.  Exits 77
# (skipped) after the other checks when systemd-analyze is absent.
#   template_unit_test.sh SOURCE_DIR BUILD_DIR WORK_DIR HAVE_SYSTEMD(ON|OFF)
set -eu
src=$1
build=$2
work=$3
have_systemd=$4
fail() { echo "template_unit_test: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
unit="$prefix/lib/systemd/system/gpucd@.service"
test -f "$unit" || fail "gpucd@.service is not in lib/systemd/system"
grep -q "gpucd@.service" "$build/install_manifest.txt" || fail "the template is not in install_manifest.txt"

# What an instance must change: its description, start command, socket folder and URL.
instance_keys='^(Description|ExecStart|RuntimeDirectory|Environment)='
settings() { grep -v -e '^#' -e '^$' "$1"; }
settings "$src/deploy/gpucd.service" | grep -v -E "$instance_keys" >"$work/shared"
settings "$src/deploy/gpucd@.service" | grep -v -E "$instance_keys" >"$work/template"
diff -u "$work/shared" "$work/template" >"$work/diff" ||
  fail "gpucd@.service differs from gpucd.service beyond the instance's lines: $(cat "$work/diff")"

if [ "$have_systemd" = ON ]; then
  grep -qx "Type=notify" "$unit" || fail "a build with libsystemd installs Type=notify"
else
  grep -qx "Type=exec" "$unit" || fail "a build without libsystemd must install Type=exec"
fi
grep -qx "RuntimeDirectory=gpucd-%i" "$unit" || fail "instances do not get a socket folder each"
grep -qx "Environment=GPUCD_URL=ipc:///run/gpucd-%i/gpucd.sock" "$unit" || fail "no per-instance GPUCD_URL"

# The start command's shell script, run as systemd would ($$ is a dollar sign to it), with a
# stand-in for the daemon that prints its arguments.
script=$(sed -n "s|^ExecStart=/bin/sh -c '\(.*\)'\$|\1|p" "$unit" | sed 's/\$\$/$/g')
[ -n "$script" ] || fail "no ExecStart=/bin/sh -c '...' line"
case "$script" in
  *"exec $prefix/bin/gpucd --config $prefix/etc/gpucd/gpucd.conf "*) ;;
  *) fail "the start command does not run the installed gpucd with its gpucd.conf: $script" ;;
esac
test -x "$prefix/bin/gpucd" || fail "the gpucd the template runs is not installed"
mkdir -p "$work/fake"
printf '#!/bin/sh\necho "$@"\n' >"$work/fake/gpucd"
chmod +x "$work/fake/gpucd"
fake_script=$(printf '%s' "$script" | sed "s|$prefix/bin/gpucd|$work/fake/gpucd|")
for pair in 0:9470 1:9471 7:9477 12:9482; do
  n=${pair%%:*}
  got=$(GPUCD_DEVICE=$n sh -c "$fake_script") || fail "instance $n did not start"
  want="--config $prefix/etc/gpucd/gpucd.conf --device $n --stats-listen http://127.0.0.1:${pair#*:}"
  [ "$got" = "$want" ] || fail "instance $n runs gpucd $got; expected $want"
done
for bad in "" x 01 -1 "1;true" "1 2" '$(true)'; do
  if out=$(GPUCD_DEVICE=$bad sh -c "$fake_script" 2>&1); then
    fail "instance '$bad' started: $out"
  fi
  case "$out" in
    *"must be a device number"*) ;;
    *) fail "instance '$bad' refused without saying why: $out" ;;
  esac
done

command -v systemd-analyze >/dev/null 2>&1 || { echo "systemd-analyze not found: skipped"; exit 77; }
mkdir -p "$work/units"
cp "$unit" "$work/units/"
for n in 0 1; do
  out=$(systemd-analyze verify "$work/units/gpucd@$n.service" 2>&1) ||
    fail "systemd-analyze verify gpucd@$n.service failed: $out"
  [ -z "$out" ] || fail "systemd-analyze verify gpucd@$n.service: $out"
done
echo "installed, verified: $unit (gpucd@0, gpucd@1)"
