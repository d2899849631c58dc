#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing, then
#   1. a release build (-O3) and every test (GPU tests skip where there is no GPU),
#   2. an AddressSanitizer + UndefinedBehaviorSanitizer build and every test,
#   3. the daemon under valgrind through the integration test of every operation,
#   4. the request-path fuzzer for a bounded time.
# Stops at the first failure.  FUZZ_SECONDS (default 60) bounds step 4.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)
deploy/setup.sh test

step() { printf '\n==== %s ====\n' "$*"; }

step "release build (-O3, as benchmarks are built)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
step "tests (release)"
ctest --test-dir build --output-on-failure -j "$jobs"

step "sanitizer build (address, undefined)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPUCD_SANITIZE=ON \
      -DGPUCD_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
step "tests (sanitizers)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"

step "the daemon under valgrind (test_ops)"
GPUCD_TEST_WRAPPER="valgrind --quiet --error-exitcode=99 --leak-check=full \
--errors-for-leak-kinds=definite --show-leak-kinds=definite \
--suppressions=$root/tests/valgrind.supp" \
  build/tests/integration/test_ops "$root/build/daemon/gpucd"

step "fuzzing the request path (${FUZZ_SECONDS:-60} s)"
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUCD_FUZZ=ON \
      -DGPUCD_SANITIZE=ON -DGPUCD_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_request gpucd_make_seeds
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
build-fuzz/tests/fuzz/gpucd_make_seeds "$corpus"
build-fuzz/tests/fuzz/fuzz_request -max_total_time="${FUZZ_SECONDS:-60}" -max_len=4096 \
  -rss_limit_mb=2048 -artifact_prefix="$root/build-fuzz/" -print_final_stats=1 "$corpus" 2>&1 |
  tail -n 12

echo
echo "all test stages passed"
