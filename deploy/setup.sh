#!/usr/bin/env bash
# Installs the Debian 12 packages gpucd needs to build and test, skipping those
# already installed (so a second run costs a second).  Needs root or sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libuv1-dev libnng-dev libmbedtls-dev libprotobuf-c-dev protobuf-c-compiler
  libcmocka-dev                                  # the test framework
  clang libclang-rt-14-dev libomp-14-dev          # the libFuzzer target
  valgrind
  python3-numpy python3-cffi python3-pytest       # the Python package and its tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
