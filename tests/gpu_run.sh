#!/usr/bin/env bash
# gpu_run.sh - run ON the GPU machine, from the repository root: the GPU tests
# (ctest label gpu) of the relocatable build folder build-gpu, then every
# benchmark built there (conv_bench against cuDNN, obs_bench, lce_bench
# --quick, encoder_bench --quick; tests/bench/e2e_bench.sh is separate).  Logs go under $OUT (./out without it); a short summary table is
# printed last.
#
# build-gpu is made on a development machine (GPUCD_STATIC_DEPS=ON,
# GPUCD_CUDA=ON) and only works at the absolute path it was configured at:
# when the checkout lands elsewhere, that path is made a link to it.
#
# Usage: tests/gpu_run.sh [--quick]     (--quick: conv_bench at B = 1024 only)
# Env:   GPU_RUN_TESTS  ctest -R filter (default: every gpu test built here)
set -u
root=$(pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
cache="$root/build-gpu/CMakeCache.txt"
if [ ! -f "$cache" ]; then
    echo "gpu_run.sh: no build-gpu/CMakeCache.txt: build it first (see kernels/cuda/NOTES.md)" >&2
    exit 2
fi
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
if [ "$src" != "$root" ]; then
    if [ -e "$src" ] && [ ! "$src" -ef "$root" ]; then
        echo "gpu_run.sh: build made for $src, which exists here and is another tree" >&2
        exit 2
    fi
    [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; }
fi
build="$src/build-gpu"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

# Only the gpu tests whose executables were built here (others are no part of this build).
filter=${GPU_RUN_TESTS:-}
if [ -z "$filter" ]; then
    filter=$(ctest --test-dir "$build" -L gpu -N -V 2>/dev/null |
        sed -n 's/^[0-9]*: Test command: \([^ ]*\).*/\1/p' |
        while read -r exe; do [ -x "$exe" ] && basename "$exe"; done | paste -sd'|')
fi
ctest_rc=0
if [ -n "$filter" ]; then
    ctest --test-dir "$build" -L gpu -R "^($filter)\$" -V >"$out/ctest.log" 2>&1 || ctest_rc=$?
else
    echo "no gpu test executables built" >"$out/ctest.log"
    ctest_rc=1
fi
grep -E "rel err" "$out/ctest.log" | awk '{print $NF, $0}' | sort -g | tail -n 4 | cut -d" " -f2-
tail -n 8 "$out/ctest.log"

# Every benchmark built here, each with its log; a failed one fails the run.  They all land in
# tests/bench of the build, wherever their sources sit (gpucd_add_cuda_bench).
bench_rc=0
run_bench() {
    local name=$1
    shift
    local exe="$build/tests/bench/$name"
    [ -x "$exe" ] || return 0
    timeout 300 "$exe" "$@" >"$out/$name.log" 2>&1 || {
        echo "$name failed (rc $?)"
        bench_rc=1
    }
}
run_bench conv_bench "$@"
run_bench obs_bench
run_bench lce_bench --quick --iters 2
run_bench encoder_bench --quick

echo
echo "==== summary ===="
grep -E "tests passed|tests failed|Skipped|Failed|\*\*\*" "$out/ctest.log" | tail -n 8
echo "ctest rc $ctest_rc, bench rc $bench_rc"
for log in "$out"/conv_bench.log "$out"/obs_bench.log "$out"/lce_bench.log "$out"/encoder_bench.log; do
    [ -f "$log" ] || continue
    echo "-- $(basename "$log" .log)"
    grep -E "^(device|ceilings)" "$log"
    grep -E "^\|" "$log" | cut -d'|' -f2-11
done
[ "$ctest_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
