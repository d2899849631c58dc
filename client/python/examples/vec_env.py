#!/usr/bin/env python3
"""A vectorised RL rollout: N worker processes, each stepping a batch of NMMO3-shaped
environments and encoding every step's observations on the daemon, with the encoder's
weights resident and owned by the learner (this process).

Each worker connects on its own (spawned, not forked: see docs/python.md), keeps its batch of
1707-byte observations and the encoder's output in one shared-memory region, and per step
writes fresh observations into the region (the environments' step: random valid ones here, no
environment package needed) and calls nmmo3_encode on them.  No tensor byte crosses the
socket.  Prints a progress line, then steps/s, agent-steps/s and the encode call's p50/p99.

    python3 client/python/examples/vec_env.py --workers 8 --batch 64 --steps 500
"""
import argparse
import multiprocessing
import sys
import threading
import time

import numpy as np

import gpucd

POOL = 8  # observation batches a worker cycles through


def random_observations(rng, batch):
    """Valid NMMO3 observations: each map byte below its feature's slots, the 47 player bytes
    below the embedding's 128 rows, 10 reward bytes (kernels/cpu/nmmo3.c checks these)."""
    obs = np.zeros((batch, gpucd.NMMO3_OBS_BYTES), np.uint8)
    slots = np.array(gpucd.NMMO3.slots)
    obs[:, :1650] = (rng.integers(0, 1 << 20, (batch, 165, 10)) % slots).reshape(batch, 1650)
    obs[:, 1650:1697] = rng.integers(0, 128, (batch, 47))
    obs[:, 1697:1706] = rng.integers(0, 256, (batch, 9))
    return obs


def worker(index, args, refs, start, done, results):
    try:
        rng = np.random.default_rng(index)
        pool = [random_observations(rng, args.batch) for _ in range(POOL)]
        with gpucd.Client(args.url, spin_us=args.spin_us) as client:
            weights = client.nmmo3_weights(**refs)  # the learner's tensors, by id
            esize = 4 if args.dtype == "f32" else 2
            out_at = (args.batch * gpucd.NMMO3_OBS_BYTES + 63) // 64 * 64
            region = client.region(out_at + args.batch * args.hidden * esize)
            obs = region.numpy("u8", (args.batch, gpucd.NMMO3_OBS_BYTES))
            hidden = region.numpy(args.dtype, (args.batch, args.hidden), offset=out_at)
            latency = np.empty(args.steps)
            ended = np.empty(args.steps)  # when each step ended (time.monotonic: one clock for all)
            start.wait()  # every worker connected and ready: the clock starts
            for step in range(args.steps):
                obs[...] = pool[step % POOL]  # the environments write their observations
                t0 = time.perf_counter()
                client.nmmo3_encode(obs, weights, hidden=hidden)
                latency[step] = time.perf_counter() - t0
                ended[step] = time.monotonic()
                with done.get_lock():
                    done.value += 1
            results.put((index, (latency, ended), None))
    except BaseException as e:  # noqa: BLE001 (reported by the learner)
        start.abort()  # nobody waits for this worker
        results.put((index, None, repr(e)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="the daemon (default $GPUCD_URL, else the "
                    "library's default); must be ipc://")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="environments a worker steps")
    ap.add_argument("--steps", type=int, default=100, help="steps a worker takes")
    ap.add_argument("--hidden", type=int, default=256, help="the encoder's projection width")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="bf16")
    ap.add_argument("--spin-us", type=int, default=0, help="the workers' polling per call")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    weights = {}
    for name, shape in gpucd.NMMO3_WEIGHTS:
        shape = tuple(args.hidden if s is None else s for s in shape)
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 10
        v = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        weights[name] = v if args.dtype == "f32" else gpucd.to_bf16(v)
    with gpucd.Client(args.url) as learner:
        args.url = learner.url
        shared = learner.nmmo3_weights(**weights)  # resident while the learner is connected
        # spawn: this process is connected (nng's threads run), so its children must start
        # afresh rather than fork it.
        ctx = multiprocessing.get_context("spawn")
        done = ctx.Value("q", 0)
        start = ctx.Barrier(args.workers + 1)
        results = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(i, args, shared.refs(), start, done, results))
                 for i in range(args.workers)]
        for p in procs:
            p.start()
        total = args.workers * args.steps
        try:
            start.wait(timeout=120)
        except threading.BrokenBarrierError:
            pass  # a worker failed; its error comes through the queue
        t0 = time.monotonic()
        got = []
        while len(got) < len(procs):
            try:
                got.append(results.get(timeout=0.5))
            except Exception:  # queue.Empty: time for a progress line
                pass
            elapsed = time.monotonic() - t0
            print(f"\r{done.value}/{total} steps, {done.value / max(elapsed, 1e-9):.0f} steps/s",
                  end="", flush=True)
        elapsed = time.monotonic() - t0
        for p in procs:
            p.join()
        print()
    errors = [(i, e) for i, _, e in got if e is not None]
    if errors:
        for i, e in errors:
            print(f"worker {i}: {e}", file=sys.stderr)
        return 1
    lat = np.concatenate([r[0] for _, r, _ in got]) * 1e6
    print(f"{args.workers} workers x {args.batch} environments, {args.steps} steps each: "
          f"{total / elapsed:.0f} steps/s, {total * args.batch / elapsed:.0f} agent-steps/s "
          f"(from the moment every worker was ready until the last one ended)")
    # As crowd_bench measures: only while every worker steps, after each one's first tenth.
    ended = [r[1] for _, r, _ in got]
    w0 = max(e[args.steps // 10] for e in ended)
    w1 = min(e[-1] for e in ended)
    if w1 > w0:
        n = sum(int(np.count_nonzero((e > w0) & (e <= w1))) for e in ended)
        print(f"while all {args.workers} stepped ({w1 - w0:.3f} s, after each one's first "
              f"tenth): {n / (w1 - w0):.0f} steps/s, {n * args.batch / (w1 - w0):.0f} "
              f"agent-steps/s")
    print(f"nmmo3_encode per step: p50 {np.percentile(lat, 50):.0f} us, "
          f"p99 {np.percentile(lat, 99):.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
