"""Threads of one process calling at once (the GIL is released during calls), and worker
processes, each with its own connection, sharing the parent's resident weights."""
import multiprocessing
import threading

import numpy as np

import gpucd
import reference as ref
from reference import assert_close

THREADS = 8


def test_eight_threads_at_once(client, rng):
    table = rng.standard_normal((50, 8)).astype(np.float32)
    shared = client.put(table)
    obs = [ref.nmmo3_obs(np.random.default_rng(i), 4) for i in range(THREADS)]
    failures = []
    start = threading.Barrier(THREADS)

    def worker(k):
        try:
            g = np.random.default_rng(100 + k)
            with client.region(1 << 20) as r:
                ob = r.numpy("u8", obs[k].shape)
                ob[...] = obs[k]
                out = r.numpy("f32", (4, 59, 11, 15), offset=8192)
                start.wait()
                for i in range(20):
                    out[...] = np.nan
                    client.multihot_encode(ob, out=out)
                    np.testing.assert_array_equal(out, ref.multihot(obs[k]))
                    idx = g.integers(0, 50, (3, 7)).astype(np.int64)
                    np.testing.assert_array_equal(client.embedding_forward(idx, shared),
                                                  table[idx])
                    E, C = g.standard_normal((5, 8)), g.standard_normal((11, 8))
                    t = g.integers(0, 11, 5)
                    got = client.linear_cross_entropy(E.astype(np.float32), C.astype(np.float32),
                                                      t, dE=True)
                    want = ref.lce(E.astype(np.float32), C.astype(np.float32), t)
                    assert_close(got.loss, want[0], 1e-5, "loss")
                    assert_close(got.dE, want[2], 1e-5, "dE")
                    client.ping()
        except BaseException as e:  # noqa: BLE001 (reported below)
            failures.append((k, repr(e)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_the_gil_is_released_during_a_call(client, rng):
    """While one thread waits seconds for the daemon, another runs Python and its own calls."""
    n, dim, v = 512, 256, 4096
    E = rng.standard_normal((n, dim)).astype(np.float32)
    C = (rng.standard_normal((v, dim)) * 0.05).astype(np.float32)
    done = threading.Event()

    def slow():
        client.linear_cross_entropy(E, C, np.zeros(n, np.int64), dC=True)
        done.set()

    t = threading.Thread(target=slow)
    t.start()
    while client.stats()["inflight"] < 2:  # the slow call is in the daemon
        assert t.is_alive()
    pings = 0
    while not done.is_set() and pings < 20:
        client.ping()
        pings += 1
    t.join()
    assert pings == 20, "the other thread's calls waited for the slow one"


def _worker(url, refs, seed, queue):
    try:
        obs = ref.nmmo3_obs(np.random.default_rng(seed), 3)
        with gpucd.Client(url) as c:  # each process its own connection
            w = c.nmmo3_weights(**refs)  # the parent's resident weights, not copied
            host_w = {k: r.get() for k, r in w.residents.items()}
            with c.region(1 << 16) as r:
                ob = r.numpy("u8", obs.shape)
                ob[...] = obs
                hidden = r.numpy("f32", (3, 16), offset=8192)
                for _ in range(5):
                    hidden[...] = np.nan
                    c.nmmo3_encode(ob, w, hidden=hidden)
                    err = ref.rel_err(hidden, ref.nmmo3_encode(obs, host_w)[1])
                    if not err <= 1e-5:
                        raise AssertionError(f"relative error {err}")
        queue.put((seed, "ok"))
    except BaseException as e:  # noqa: BLE001 (reported to the parent)
        queue.put((seed, repr(e)))


def test_four_worker_processes(client, daemon, rng):
    weights = client.nmmo3_weights(**ref.nmmo3_weights(rng, 16))
    # spawn: a process that has connected (nng's threads run) must not fork a child that
    # uses nng; spawned workers start afresh and connect on their own.
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(daemon.url, weights.refs(), s, queue))
             for s in range(4)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert results == [(s, "ok") for s in range(4)]


def test_a_client_does_not_cross_fork(client):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child():
        try:
            client.ping()
            queue.put("no error")
        except gpucd.ConnectionClosed as e:
            queue.put(str(e))

    p = ctx.Process(target=child)
    p.start()
    msg = queue.get(timeout=60)
    p.join(60)
    assert "made in another process" in msg and "connect again" in msg
