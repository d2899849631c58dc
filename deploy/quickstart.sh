#!/usr/bin/env bash
# Quick start: install what is missing, build, and run the daemon in the
# foreground with its defaults (the CUDA backend when a GPU is usable, else
# the CPU backend; socket under $XDG_RUNTIME_DIR or /tmp/gpucd-$UID/).
# Extra arguments go to the daemon, e.g. deploy/quickstart.sh --backend cpu
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build
exec build/daemon/gpucd "$@"
