#!/usr/bin/env bash
# Quick start: install what running gpucd needs (deploy/setup.sh run), build the
# daemon, gpucdctl and the client library in build-quickstart/ (no tests, no
# benchmarks), install the client (libgpucd, gpucd.h, gpucdctl and the Python
# package, under /usr/local), and run the daemon in the foreground with its defaults: the CUDA
# backend when a GPU is usable, else the CPU backend; the socket under
# $XDG_RUNTIME_DIR or /tmp/gpucd-$UID/.
#
# The CUDA backend is built only where a GPU is present (nvidia-smi lists one and
# /dev/nvidia0 exists): compiling it takes minutes.  GPUCD_CUDA=ON builds it
# anyway, GPUCD_CUDA=OFF never.  Extra arguments go to the daemon, e.g.
#   deploy/quickstart.sh --backend cpu --log-level debug
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh run

if [ -z "${GPUCD_CUDA:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1 && [ -e /dev/nvidia0 ]; then
    GPUCD_CUDA=AUTO
  else
    GPUCD_CUDA=OFF
    echo "quickstart: no GPU here, building the CPU backend only (GPUCD_CUDA=ON builds CUDA too)"
  fi
fi

cmake -S . -B build-quickstart -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUCD_TESTS=OFF \
      -DGPUCD_CUDA="$GPUCD_CUDA" >/dev/null
cmake --build build-quickstart
# The client where programs find it: `import gpucd` in python3, gpucdctl on the PATH.
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo cmake --install build-quickstart --component client >/dev/null
$sudo ldconfig
exec build-quickstart/daemon/gpucd "$@"
