#!/bin/bash
# cpu_pair.sh - compares gpucd builds on the cpu backend under the same load: every daemon runs
# at once, and their benchmarks interleave (round by round, level by level), so that a change
# in the machine's load falls on all of them alike.  Besides gpucdctl bench's throughput and
# p50, each line has the daemon's CPU time a request (user + system, from /proc), which other
# processes' load hardly moves.
#
#   tests/bench/cpu_pair.sh GPUCDCTL "BENCH ARGS" ROUNDS "LEVELS" NAME=DAEMON...
#   tests/bench/cpu_pair.sh build/client/gpucdctl/gpucdctl "--op conv1" 3 "1 2" \
#       before=/tmp/gpucd-before after=build/daemon/gpucd
set -eu
if [ $# -lt 5 ]; then
    sed -n '2,11p' "$0" >&2
    exit 2
fi
ctl=$1 rounds=$3 levels=$4
read -r -a args <<<"$2"
shift 4
dir=$(mktemp -d /tmp/gpucd-pair-XXXXXX)
declare -A pid
names=()
cleanup() {
    for n in "${names[@]}"; do kill "${pid[$n]}" 2>/dev/null || true; done
    wait
    rm -rf "$dir"
}
trap cleanup EXIT
for spec in "$@"; do
    name=${spec%%=*}
    names+=("$name")
    "${spec#*=}" --backend cpu --stats-listen none --listen "ipc://$dir/$name.sock" \
        >"$dir/$name.log" 2>&1 &
    pid[$name]=$!
done
for n in "${names[@]}"; do # ready when it answers
    for _ in $(seq 100); do
        "$ctl" --url "ipc://$dir/$n.sock" ping 1 >/dev/null 2>&1 && break
        sleep 0.1
    done
done
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tck=$(getconf CLK_TCK)
echo "# $(date -u +%FT%TZ) $(nproc) cores: bench ${args[*]}, $rounds rounds"
for r in $(seq "$rounds"); do
    for c in $levels; do
        for n in "${names[@]}"; do
            t0=$(cpu_ticks "${pid[$n]}")
            out=$("$ctl" --url "ipc://$dir/$n.sock" bench "${args[@]}" --concurrency "$c" --seed 1 \
                --warmup-s 0.5 --window-s 1 --max-windows 3 2>&1) || true
            t1=$(cpu_ticks "${pid[$n]}")
            reqs=$(echo "$out" | sed -n 's/^requests: \([0-9]*\).*/\1/p')
            level=$(echo "$out" | awk -v c="$c" '$1 == c && $2 == "-" {print $3, $6}')
            echo "$(date -u +%T) round $r $n concurrency $c: req/s p50_us ${level:-? ?}," \
                "cpu_ms/request $(echo "scale=1; ($t1 - $t0) * 1000 / $tck / ${reqs:-1}" | bc)," \
                "load $(cut -d' ' -f1 /proc/loadavg)"
        done
    done
done
