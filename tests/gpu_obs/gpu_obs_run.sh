#!/usr/bin/env bash
# gpu_obs_run.sh - run ON the GPU machine, from the repository root: the
# observation-path GPU test (gpu_obs), obs_bench, then the existing GPU tests
# (gpu_conv, test_gpu_daemon) to show nothing else broke.  Logs go under $OUT
# (./out without it); a short summary is printed last.
#
# The binaries come from the relocatable build folder build-gpuobs
# (GPUCD_STATIC_DEPS=ON, GPUCD_CUDA=ON), made on a development machine at
# /work/main: when the checkout lands elsewhere, that path is made a link to it.
set -u
root=$(pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
home=/work/main
if [ ! "$home" -ef "$root" ]; then
    if [ -e "$home" ]; then
        echo "gpu_obs_run.sh: $home exists here and is another tree" >&2
        exit 2
    fi
    mkdir -p "$(dirname "$home")" && ln -s "$root" "$home"
fi
b=$home/build-gpuobs
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv >"$out/gpu.txt" 2>&1

timeout 75 "$b/tests/gpu_obs/gpu_obs" "$b/daemon/gpucd" >"$out/gpu_obs.log" 2>&1
obs_rc=$?
timeout 35 "$b/tests/bench/obs_bench" >"$out/obs_bench.log" 2>&1
bench_rc=$?
# The two existing suites at once (correctness only; neither asserts a time).
timeout 105 "$b/tests/gpu_conv/gpu_conv" >"$out/gpu_conv.log" 2>&1 &
conv_pid=$!
timeout 105 "$b/tests/gpu_daemon/test_gpu_daemon" "$b/daemon/gpucd" >"$out/gpu_daemon.log" 2>&1
daemon_rc=$?
wait "$conv_pid"
conv_rc=$?

echo "==== gpu_obs (rc $obs_rc) ===="
echo "$(grep -c '^ok ' "$out/gpu_obs.log") bitwise-equal cases, $(grep -c '^rel err' "$out/gpu_obs.log") dtable cases"
grep -E "^rel err" "$out/gpu_obs.log" | awk '{print $(NF-7), $0}' | sort -g | tail -n 2 | cut -d' ' -f2-
grep -E "^(bad|daemon,)" "$out/gpu_obs.log" | head -n 4
grep -E "^\[  (FAILED|PASSED|  ERROR)|FAILED|Error|error:|not ok" "$out/gpu_obs.log" | head -n 20
echo "==== gpu_conv (rc $conv_rc) ===="
grep -E "^\[  (FAILED|PASSED)|FAILED" "$out/gpu_conv.log" | head -n 8
echo "==== test_gpu_daemon (rc $daemon_rc) ===="
grep -E "^\[  (FAILED|PASSED)|FAILED|^\[  ERROR" "$out/gpu_daemon.log" | head -n 10
echo "==== obs_bench (rc $bench_rc) ===="
grep -E "^(device|ceilings|\||summary)" "$out/obs_bench.log"
echo "==== summary ===="
echo "gpu_obs rc $obs_rc, obs_bench rc $bench_rc, gpu_conv rc $conv_rc, test_gpu_daemon rc $daemon_rc"
[ "$obs_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$conv_rc" -eq 0 ]
