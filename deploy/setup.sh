#!/usr/bin/env bash
# Installs the Debian 12 packages one use of gpucd needs, skipping those already
# installed (a second run costs a second).  Installing needs root, or sudo.
#
#   deploy/setup.sh run    build and run the daemon, gpucdctl and the client library
#                          (deploy/quickstart.sh; the default)
#   deploy/setup.sh test   also what the test suite needs (tests/run.sh)
#
# The CUDA toolkit is not a Debian package: install NVIDIA's under /usr/local/cuda
# for the CUDA backend.
set -euo pipefail

# Every package, the use that needs it and why, one a line: the one list to add to.
# "test" includes "run".
packages='
build-essential        run   the C compiler, make, binutils
cmake                  run   the build
ninja-build            run   the build
pkg-config             run   finds libuv and protobuf-c
libuv1-dev             run   the daemon event loop
libnng-dev             run   the transport (ipc://, tcp://, tls+tcp://, the stats HTTP server)
libmbedtls-dev         run   nng TLS; its static archives for GPUCD_STATIC_DEPS
libprotobuf-c-dev      run   the wire schema at run time
protobuf-c-compiler    run   protoc-c generates the wire code at build time
libsystemd-dev         run   sd_notify: Type=notify, STATUS lines and the watchdog under systemd
python3-numpy          run   the Python package: arrays and zero-copy region views
python3-cffi           run   the Python package: calls into libgpucd.so without a compiled module
libcmocka-dev          test  the test framework
clang                  test  the request-path fuzzer (libFuzzer)
libclang-rt-14-dev     test  libFuzzer and the sanitizers for clang
libomp-14-dev          test  OpenMP for the fuzzing build (clang)
valgrind               test  the daemon under valgrind
openssl                test  certificates for the TLS tests
python3                test  the documentation link check, the stats scripts
python3-pytest         test  the tests of the Python package
python3-yaml           test  reads the Kubernetes manifest in its test (tests/deploy/k8s_manifest_test.py)
python3-kubernetes     test  the Kubernetes API models, generated from its schema: a schema check of the manifest (kubeconform is not in Debian)
prometheus             test  promtool checks the metrics and alert rules (the package also enables a Prometheus server: systemctl disable --now prometheus where none should run)
'

use=${1:-run}
case "$use" in
  run) wanted='$2 == "run"' ;;
  test) wanted='$2 == "run" || $2 == "test"' ;;
  *) echo "usage: deploy/setup.sh [run|test]" >&2; exit 2 ;;
esac

missing=()
for p in $(awk "$wanted"' { print $1 }' <<<"$packages"); do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "setup: installing ${missing[*]} needs root: run deploy/setup.sh $use as root" >&2
    exit 1
  fi
  sudo="sudo"
fi
echo "setup ($use): installing ${missing[*]}${sudo:+ (with sudo)}"
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
