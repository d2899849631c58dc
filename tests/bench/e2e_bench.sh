#!/usr/bin/env bash
# e2e_bench.sh - the observation path's end-to-end figures, from client processes on the
# daemon's host: the NMMO3 encoder forward with observations in a registered
# shared-memory region and the projected hidden (512, bf16) back, weights
# resident.  Run ON the GPU machine from the repository root, after a build
# (default build folder build-gpu; argument 1 overrides it).  Environment:
# WINDOW_US, PROCS, MAX_BATCHES, SUBMIT_QUEUES, SIZES, LOW_LATENCY_FLAGS, CLIENT_SPIN_FLAGS,
# BACKEND, QUICK, CROWD_ONLY (1: step 2 alone) (below).
#
#  0. the transport's floor: a bare nng req/rep echo, one client process and $PROCS;
#  1. one client, B = 1024 and B = 32768: latency percentiles and the split
#     that gpucdctl bench reports (socket round trip, queue, copy in, compute,
#     copy out, the daemon's other time), with the daemon's defaults, with
#     $LOW_LATENCY_FLAGS, and with those and gpucdctl $CLIENT_SPIN_FLAGS;
#  2. 64 client processes sharing one set of resident weights, each sending
#     B = 64 batches back to back (closed loop; tests/bench/crowd_bench.c),
#     against a daemon with batching off and then with each --batch-window-us
#     of $WINDOW_US and each --max-batch of $MAX_BATCHES, for each --submit-queues
#     of $SUBMIT_QUEUES: the summed throughput and percentiles over every request.
#
# Each gpucdctl checks one request against the CPU kernels before timing and
# every reply after; a failed run fails the script.  The summary goes to
# stdout, every CSV and log into $OUT/e2e.tar.gz.
set -euo pipefail
build=${1:-build-gpu}
out=${OUT:-./out}
mkdir -p "$out"
work=$(mktemp -d /tmp/gpucd-e2e-XXXXXX)
WINDOW_US=${WINDOW_US:-1000} # --batch-window-us values of the batching-on runs
PROCS=${PROCS:-64}
MAX_BATCHES=${MAX_BATCHES:-1024 2048 4096 8192} # --max-batch values of the batching-on runs
SUBMIT_QUEUES=${SUBMIT_QUEUES:-1 0} # --submit-queues values of the crowd runs
# Seconds of warm-up and of each measured window: ping, encode, crowd (QUICK=1: a smoke test
# of the script, its figures meaningless; the crowd's window still holds several requests of
# the CPU backend under a sanitizer on a loaded 2-core machine, ~0.5 s each).
if [ "${QUICK:-0}" = 1 ]; then
    PING_S=0.2 ENCODE_S=0.2 CROWD_WARMUP_S=0.2 CROWD_S=2 WINDOWS=3
else
    PING_S=1 ENCODE_S=2 CROWD_WARMUP_S=2 CROWD_S=4 WINDOWS=
fi
SIZES=${SIZES:-1024 32768}  # the one-client batch sizes
BACKEND=${BACKEND:-cuda}    # cpu: to try the script itself on a machine without a GPU
sock="ipc://$(mktemp -u /tmp/gpucd-e2e-XXXXXX).sock"
ctl="$build/client/gpucdctl/gpucdctl"
client_flags= # gpucdctl's own flags for the one-client runs
daemon_pid=

daemon_start() { # extra daemon flags...
    "$build/daemon/gpucd" --listen "$sock" --backend "$BACKEND" --workspace-mb 8192 \
        --resident-mb 2048 --stats-listen none --log-level warn "$@" &
    daemon_pid=$!
    for _ in $(seq 1 200); do
        "$ctl" --url "$sock" --timeout-ms 1000 ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "e2e_bench: the daemon did not answer" >&2
    return 1
}

daemon_stop() {
    kill -TERM "$daemon_pid"
    wait "$daemon_pid" || true
}
trap '[ -n "$daemon_pid" ] && kill -KILL "$daemon_pid" 2>/dev/null || true' EXIT

encode() { # csv batch concurrency [extra gpucdctl flags]
    local csv=$1 batch=$2 conc=$3
    shift 3
    # shellcheck disable=SC2086 # the flags are words
    "$ctl" --url "$sock" $client_flags bench --op nmmo3_encode --dtype bf16 --hidden 512 --batch "$batch" \
        --concurrency "$conc" --csv "$csv" "$@"
}

# A CSV row's named columns, "name=value" each.
csv_fields() { # csv name...
    local csv=$1
    shift
    awk -F, -v want="$*" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        { n = split(want, w, " "); line = "";
          for (i = 1; i <= n; i++) line = line w[i] "=" $(col[w[i]]) " ";
          print line }' "$csv"
}

# ping: the socket round trip alone, back to back and at the encoder's request rate (threads
# idle between requests wake up slower), with the workers polling (default) and without.
ping() { # csv [gpucdctl bench flags]
    local csv=$1
    shift
    # shellcheck disable=SC2086 # the flags are words
    "$ctl" --url "$sock" $client_flags bench --op ping --concurrency 1 --warmup-s "$PING_S" --window-s "$PING_S" \
        ${WINDOWS:+--max-windows "$WINDOWS"} --csv "$csv" "$@" >/dev/null
    csv_fields "$csv" requests_per_s p50_us p99_us client_transport_us server_queue_us server_other_us
}
if [ "${CROWD_ONLY:-0}" != 1 ]; then
    # The floor under every round trip below: nng alone, two processes, no gpucd code.
    echo "== the transport's floor (tests/bench/nng_echo.c)"
    "$build/tests/bench/nng_echo" 1 "$PING_S"
    "$build/tests/bench/nng_echo" "$PROCS" "$PING_S"
    echo "== ping, --spin-us 0"
    daemon_start --spin-us 0
    ping "$work/e2e_ping_nospin.csv"
    ping "$work/e2e_ping_nospin_slow.csv" --rate 1500
    daemon_stop
    # The one-client figures with the daemon's defaults, then with the latency settings an operator
    # may choose (CPUs kept out of deep sleep while the daemon runs, workers that poll long enough to
    # catch a closed-loop client's next request), then with the client polling for its replies too.
    LOW_LATENCY_FLAGS=${LOW_LATENCY_FLAGS:---cpu-latency-us 0 --spin-us 1000}
    CLIENT_SPIN_FLAGS=${CLIENT_SPIN_FLAGS:---spin-us 1000}
    for variant in defaults noqueues lowlat lowlat_clientspin; do
        flags=
        client_flags=
        case $variant in
        defaults) ;;
        noqueues) flags="--submit-queues 0" ;;
        *) flags=$LOW_LATENCY_FLAGS ;;
        esac
        [ "$variant" = lowlat_clientspin ] && client_flags=$CLIENT_SPIN_FLAGS
        echo "== ping, then nmmo3_encode bf16 hidden 512 from one client, obs in a region;" \
            "daemon flags: ${flags:-defaults}; gpucdctl flags: ${client_flags:-defaults}"
        # shellcheck disable=SC2086 # the flags are words
        daemon_start $flags
        ping "$work/e2e_ping_$variant.csv"
        ping "$work/e2e_ping_slow_$variant.csv" --rate 1500
        for b in $SIZES; do
            encode "$work/e2e_b${b}_$variant.csv" "$b" 1 --warmup-s "$ENCODE_S" --window-s "$ENCODE_S" \
                ${WINDOWS:+--max-windows "$WINDOWS"}
            csv_fields "$work/e2e_b${b}_$variant.csv" batch requests_per_s p50_us p99_us \
                client_transport_us server_queue_us copy_in_us compute_us copy_out_us server_other_us \
                overhead_p50_us overhead_p99_us
        done
        daemon_stop
    done
    client_flags=
fi

# $PROCS worker processes sharing one encoder (crowd_bench: one upload, resident weights used by
# every worker, as RL workers of one learner do), each a closed loop of B = 64 requests.
crowd() { # label
    "$build/tests/bench/crowd_bench" "$sock" --workers "$PROCS" --batch 64 --hidden 512 \
        --warmup-s "$CROWD_WARMUP_S" --seconds "$CROWD_S" | sed "s/^/$1: /"
}

echo "== $PROCS processes sending pings: the request rate of the transport and request path alone"
daemon_start
"$build/tests/bench/crowd_bench" "$sock" --workers "$PROCS" --ping 1 --warmup-s "$CROWD_WARMUP_S" \
    --seconds "$CROWD_S"
daemon_stop
# Each with the submission queues (the default) and without (every request through the socket,
# whose one nng poller thread in the daemon bounded the crowd before them).
for q in $SUBMIT_QUEUES; do
    echo "== $PROCS processes x B = 64 sharing the weights, --submit-queues $q," \
        "batching off, then on (window $WINDOW_US us)"
    daemon_start --submit-queues "$q"
    crowd "queues $q, off"
    daemon_stop
    # A batch closes when its window ends or when it holds --max-batch rows: the
    # smaller max-batch values let batches run on several execution slots at once.
    for w in $WINDOW_US; do
        for mb in $MAX_BATCHES; do
            daemon_start --submit-queues "$q" --batch-window-us "$w" --max-batch "$mb"
            crowd "queues $q, on window $w us max-batch $mb"
            daemon_stop
        done
    done
done
tar -C "$work" -czf "$out/e2e.tar.gz" .
