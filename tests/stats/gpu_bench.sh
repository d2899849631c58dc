#!/bin/sh
# gpu_bench.sh - on the GPU machine: a cuda-backend daemon with its stats
# endpoint, what /metrics says about the device, and `gpucdctl bench` over the
# presets (each checked against the CPU kernels before it is timed).
#
#   tests/stats/gpu_bench.sh BUILD_DIR [OUT_DIR]
#
# BUILD_DIR is a relocatable CUDA build (-DGPUCD_CUDA=ON -DGPUCD_STATIC_DEPS=ON)
# with gpucd and gpucdctl; results (json, csv, logs) go to OUT_DIR (default ./out).
# GPU_BENCH_PARTS picks what runs: "client" (sweeps of concurrency, as clients
# see it) and/or "server" (--server-side: device time per iteration, B 1024 and
# 32768, or GPU_BENCH_BATCHES); default both.  GPU_BENCH_BACKEND=cpu (with small
# GPU_BENCH_BATCHES) tries the script on a machine without a GPU.
set -u
build=${1:?usage: gpu_bench.sh BUILD_DIR [OUT_DIR]}
out=${2:-${OUT:-./out}}
mkdir -p "$out"
dir=$(mktemp -d /tmp/gpucd-gpubench-XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
url="ipc://$dir/gpucd.sock"
get() { python3 -c 'import sys, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=10); print(r.status); sys.stdout.write(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print(0)' "http://127.0.0.1:$port$1"; }

parts=${GPU_BENCH_PARTS:-client server}
batches=${GPU_BENCH_BATCHES:-1024 32768}
# Large enough for the B = 32768 uploads (conv1's x is 1.3 GB in f32); nng takes at most 2 GiB.
"$build/daemon/gpucd" --backend "${GPU_BENCH_BACKEND:-cuda}" --listen "$url" \
    --max-message-mb 2048 --resident-mb 65536 --workspace-mb 16384 \
    --stats-listen "http://127.0.0.1:$port" 2>"$out/daemon.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM HUP PIPE # through the EXIT trap: no daemon left behind
i=0
until [ "$(get /health/ready | head -n 1)" = 200 ]; do
    if ! kill -0 $pid 2>/dev/null || [ $i -ge 600 ]; then
        echo "the daemon did not become ready:"
        cat "$out/daemon.log"
        exit 1
    fi
    sleep 0.1
    i=$((i + 1))
done
echo "ready after ~$((i / 10)) s of polling /health/ready"
"$build/client/gpucdctl/gpucdctl" --url "$url" info | head -n 6

status=0
case $parts in *client*) ;; *) set -- ; skip_client=1 ;; esac
for spec in "conv1 f32" "conv1 bf16" "conv2 f32" "conv2 bf16" "conv1_backward f32" \
            "conv2_backward f32" "nmmo3_encode f32" "loss bf16 --batch 1024 --vocab 32000"; do
    [ -n "${skip_client:-}" ] && break
    set -- $spec
    op=$1 dt=$2
    shift 2
    name="$op-$dt"
    echo "== bench $op $dt $*"
    "$build/client/gpucdctl/gpucdctl" --url "$url" bench --op "$op" --dtype "$dt" "$@" \
        --concurrency 1:8:x2 --warmup-s 0.5 --window-s 0.5 --max-windows 6 \
        --json "$out/$name.json" --csv "$out/$name.csv" >"$out/$name.txt" 2>&1
    rc=$?
    cat "$out/$name.txt"
    [ $rc -eq 0 ] || { echo "bench $name exited $rc"; status=1; }
done

case $parts in *server*)
    for b in $batches; do
        for spec in "conv1 f32" "conv1 bf16" "conv2 f32" "conv2 bf16" "conv1_backward f32" \
                    "conv1_backward bf16" "conv2_backward f32" "conv2_backward bf16"; do
            set -- $spec
            name="server-$1-$2-$b"
            "$build/client/gpucdctl/gpucdctl" --url "$url" bench --op "$1" --dtype "$2" --batch "$b" \
                --server-side 100 --server-warmup 10 --server-repeats 3 --json "$out/$name.json" >"$out/$name.txt" 2>&1
            rc=$?
            grep -E "^(server-side|checked)|WRONG|refused|failed" "$out/$name.txt" | sed "s/^/$1 $2 B=$b: /"
            [ $rc -eq 0 ] || { echo "bench $name exited $rc"; status=1; }
        done
    done ;;
esac

echo "== /metrics (device, memory, requests)"
get /metrics | grep -E '^gpucd_(device|workspace|resident|build|ready|requests_total)' | head -n 40
get /metrics > "$out/metrics.txt"
kill -TERM $pid
wait $pid
echo "daemon exit status $?"
exit $status
