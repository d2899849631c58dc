#!/bin/sh
# overhead.sh - ping throughput of a daemon with the stats endpoint on and being
# scraped against one started with --stats-listen none (the target: within 3%, docs/measurements.md).
#
#   tests/stats/overhead.sh BUILD_DIR [ROUNDS] [CONCURRENCY]
#
# Both daemons run the CPU backend side by side; `gpucdctl bench --op ping`
# drives them in turn (A B A B ...), so that slow drifts of a shared machine
# hit both alike, and the median of each side's rounds is compared.  The
# scraper fetches /metrics ten times a second, far more often than Prometheus.
set -eu
build=${1:?usage: overhead.sh BUILD_DIR [ROUNDS] [CONCURRENCY]}
rounds=${2:-5}
conc=${3:-1}
gpucd=$build/daemon/gpucd
ctl=$build/client/gpucdctl/gpucdctl
dir=$(mktemp -d /tmp/gpucd-overhead-XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$gpucd" --backend cpu --listen "ipc://$dir/on.sock" --stats-listen "http://127.0.0.1:$port" \
    --log-level warn 2>"$dir/on.log" &
on=$!
"$gpucd" --backend cpu --listen "ipc://$dir/off.sock" --stats-listen none --log-level warn \
    2>"$dir/off.log" &
off=$!
scraper=
cleanup() {
    [ -n "$scraper" ] && kill "$scraper" 2>/dev/null || true
    kill "$on" "$off" 2>/dev/null || true
    wait "$on" "$off" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE # through the EXIT trap: no daemon left behind
sleep 0.5
python3 -c '
import sys, time, urllib.request
url = sys.argv[1]
while True:
    try:
        urllib.request.urlopen(url, timeout=5).read()
    except Exception:
        pass
    time.sleep(0.1)
' "http://127.0.0.1:$port/metrics" &
scraper=$!

run() { # $1: on|off; prints req/s
    "$ctl" --url "ipc://$dir/$1.sock" bench --op ping --concurrency "$conc" --warmup-s 1 \
        --window-s 1 --max-windows 10 --csv "$dir/$1.csv" >/dev/null
    tail -n 1 "$dir/$1.csv" | cut -d, -f11
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

: >"$dir/on.txt"
: >"$dir/off.txt"
i=0
while [ $i -lt "$rounds" ]; do
    run on >>"$dir/on.txt"
    run off >>"$dir/off.txt"
    i=$((i + 1))
done
scrapes=$(python3 -c 'import sys, urllib.request; print(sum(1 for l in urllib.request.urlopen(sys.argv[1]).read().decode().splitlines() if l.startswith("gpucd_")))' "http://127.0.0.1:$port/metrics")
m_on=$(median <"$dir/on.txt")
m_off=$(median <"$dir/off.txt")
echo "concurrency $conc, $rounds rounds of ping each, alternating; /metrics has $scrapes samples"
echo "stats on (scraped 10/s), req/s: $(tr '\n' ' ' <"$dir/on.txt")"
echo "stats off,               req/s: $(tr '\n' ' ' <"$dir/off.txt")"
awk -v a="$m_on" -v b="$m_off" 'BEGIN {printf "median on %.1f, off %.1f: on/off = %.4f (%+.2f%%)\n", a, b, a / b, (a / b - 1) * 100}'
