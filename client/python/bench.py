#!/usr/bin/env python3
"""The per-call cost the gpucd package adds over the C library, for ping and for a B = 1024
nmmo3_encode from a region with resident weights (the preset of `gpucdctl bench --op
nmmo3_encode`: f32, hidden 256).

Three ways of making the same call, each one request outstanding, measured in the same run:
  C        `gpucdctl bench` (the C client: its own loop, its p50 over its stable windows)
  cffi     libgpucd's function called straight through cffi with structs built once (what any
           binding pays at least: the Python loop and the foreign call)
  gpucd    the package's method, as an application calls it (argument checks, struct building)
The cffi and gpucd loops alternate in rounds, so that the daemon's drift hits both alike.
For every call of those two, "binding" is its wall time less the round trip the C library
measured inside the same call (request built to reply decoded): what the Python side adds.

    python3 client/python/bench.py --url ipc:///run/gpucd/gpucd.sock [--spin-us 1000]

Exit status 1 when a measurement got no calls or gpucdctl failed (--no-c skips it).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import gpucd
from gpucd._ffi import ffi, lib


def percentile(values, q):
    return float(np.percentile(np.asarray(values, np.float64), q)) if values else float("nan")


class Series:
    def __init__(self):
        self.wall, self.binding = [], []

    def add(self, wall_us, round_trip_us):
        self.wall.append(wall_us)
        self.binding.append(wall_us - round_trip_us)


def run_rounds(variants, seconds, round_calls):
    """Runs each variant round_calls times in turn until seconds have passed."""
    series = {name: Series() for name in variants}
    clock = time.perf_counter_ns
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, (call, timings) in variants.items():
            s = series[name]
            for _ in range(round_calls):
                t0 = clock()
                call()
                s.add((clock() - t0) / 1000.0, timings.round_trip_us)
    return series


def bench_ping(client, seconds, round_calls):
    t = gpucd.Timings()
    handle, raw_t = client._handle(), t._t

    def raw():
        if lib.gpucd_ping(handle, raw_t) != 0:
            client._check(-1)

    def package():
        client.ping(timings=t)

    return run_rounds({"cffi": (raw, t), "gpucd": (package, t)}, seconds, round_calls)


def bench_encode(client, seconds, round_calls, batch, hidden, dtype):
    rng = np.random.default_rng(1)
    wdt = np.float32 if dtype == "f32" else np.uint16
    weights = {}
    for name, shape in gpucd.NMMO3_WEIGHTS:
        shape = tuple(hidden if s is None else s for s in shape)
        v = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        weights[name] = v if wdt is np.float32 else gpucd.to_bf16(v)
    w = client.nmmo3_weights(**weights)
    esize = 4 if dtype == "f32" else 2
    region = client.region(batch * 1707 + 64 + batch * hidden * esize)
    obs = region.numpy("u8", (batch, 1707))
    slots = np.array(gpucd.NMMO3.slots)
    obs[:, :1650] = (rng.integers(0, 1 << 20, (batch, 165, 10)) % slots).reshape(batch, 1650)
    obs[:, 1650:1697] = rng.integers(0, 128, (batch, 47))
    out_at = (batch * 1707 + 63) // 64 * 64
    out = region.numpy(dtype, (batch, hidden), offset=out_at)
    t = gpucd.Timings()
    # The same call with its structs built once.
    tobs = ffi.new("gpucd_tensor *")
    tout = ffi.new("gpucd_tensor *")
    shape = ffi.new("int64_t[2]", [batch, 1707])
    tobs[0] = lib.gpucd_tensor_region(region._ptr, 0, lib.GPUCD_U8, 2, shape)
    shape_out = ffi.new("int64_t[2]", [batch, hidden])
    code = lib.GPUCD_F32 if dtype == "f32" else lib.GPUCD_BF16
    tout[0] = lib.gpucd_tensor_region(region._ptr, out_at, code, 2, shape_out)
    handle, ws, raw_t = client._handle(), w._w, t._t

    def raw():
        rc = lib.gpucd_nmmo3_encode(handle, ws, tobs, ffi.NULL, tout, raw_t)
        if rc != 0:
            client._check(rc)

    def package():
        client.nmmo3_encode(obs, w, hidden=out, timings=t)

    package()  # the first call's errors, if any, before timing
    return run_rounds({"cffi": (raw, t), "gpucd": (package, t)}, seconds, round_calls)


def c_client(gpucdctl, url, spin_us, op_args, seconds):
    """gpucdctl bench's p50 and p99 (us) at concurrency 1."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "c.json")
        cmd = [gpucdctl, "--url", url, "--spin-us", str(spin_us), "bench", *op_args,
               "--concurrency", "1", "--warmup-s", "0.5", "--window-s", str(max(seconds / 3, 0.3)),
               "--json", path]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}"
                               f"{done.stderr}")
        with open(path) as f:
            level = json.load(f)["levels"][0]
    return level["latency_us"]["p50"], level["latency_us"]["p99"], level.get("requests", 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="the daemon (default $GPUCD_URL, else the "
                    "library's default); ipc:// for the region measurement")
    ap.add_argument("--spin-us", type=int, default=0, help="the client's polling (both clients)")
    ap.add_argument("--seconds", type=float, default=3.0, help="per operation and client")
    ap.add_argument("--round", type=int, default=50, help="calls per variant per round")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--gpucdctl", default=os.environ.get("GPUCDCTL") or shutil.which("gpucdctl"),
                    help="the C client (default $GPUCDCTL, else gpucdctl on PATH)")
    ap.add_argument("--no-c", action="store_true", help="skip the C client's measurement")
    ap.add_argument("--json", help="also write the results there")
    args = ap.parse_args()

    client = gpucd.Client(args.url, spin_us=args.spin_us)
    info = client.info()
    print(f"daemon {client.url}: backend {info['backend']}, {info['device_name']}; "
          f"spin_us {args.spin_us}; B {args.batch}, hidden {args.hidden}, {args.dtype}")
    results = []
    ops = (("ping", lambda: bench_ping(client, args.seconds, args.round), ["--op", "ping"]),
           (f"nmmo3_encode B={args.batch}",
            lambda: bench_encode(client, args.seconds, args.round, args.batch, args.hidden,
                                 args.dtype),
            ["--op", "nmmo3_encode", "--batch", str(args.batch), "--hidden", str(args.hidden),
             "--dtype", args.dtype]))
    failed = False
    for name, measure, c_args in ops:
        c = None
        if not args.no_c:
            if not args.gpucdctl:
                print("bench: no gpucdctl (give --gpucdctl PATH, or --no-c)", file=sys.stderr)
                return 1
            try:
                c = c_client(args.gpucdctl, client.url, args.spin_us, c_args, args.seconds)
            except RuntimeError as e:
                print(f"bench: the C client failed: {e}", file=sys.stderr)
                failed = True
        series = measure()
        for variant, s in series.items():
            if not s.wall:
                print(f"bench: {name} {variant}: no call measured", file=sys.stderr)
                failed = True
                continue
            results.append({"op": name, "client": variant, "calls": len(s.wall),
                            "p50_us": percentile(s.wall, 50), "p99_us": percentile(s.wall, 99),
                            "binding_p50_us": percentile(s.binding, 50),
                            "binding_p99_us": percentile(s.binding, 99),
                            "over_c_p50_us": percentile(s.wall, 50) - c[0] if c else None})
        if c is not None:
            if c[2] == 0:
                print(f"bench: {name} C: no call measured", file=sys.stderr)
                failed = True
            results.append({"op": name, "client": "C", "calls": c[2], "p50_us": c[0],
                            "p99_us": c[1], "binding_p50_us": None, "binding_p99_us": None,
                            "over_c_p50_us": 0.0})

    def num(v):
        return "-" if v is None else f"{v:.1f}"

    print(f"{'operation':<20} {'client':<6} {'calls':>8} {'p50 us':>9} {'p99 us':>9} "
          f"{'binding p50':>12} {'binding p99':>12} {'p50 over C':>11}")
    for r in results:
        print(f"{r['op']:<20} {r['client']:<6} {r['calls']:>8} {num(r['p50_us']):>9} "
              f"{num(r['p99_us']):>9} {num(r['binding_p50_us']):>12} "
              f"{num(r['binding_p99_us']):>12} {num(r['over_c_p50_us']):>11}")
    print("binding = wall time of the call less the C library's own round trip in it")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": client.url, "backend": info["backend"], "device": info["device_name"],
                       "spin_us": args.spin_us, "results": results}, f, indent=1)
    client.close()
    if failed or not results:
        print("bench: FAILED (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
