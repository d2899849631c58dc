"""gpucd.Pool over three CPU-backend daemons: calls spread; one daemon killed with calls waiting on
it while threads call, every call answered once with its own result by the others; regions and
resident tensors refused inside a run."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import gpucd
from daemon import Daemon


def _lookup(key):
    """An embedding lookup only this call has: its arguments and its answer."""
    table = (np.arange(64 * 16, dtype=np.float32).reshape(64, 16) * 0.25) + float(key % 100003)
    idx = ((key * 7 + np.arange(40) * 13) % 64).astype(np.int32)
    return idx, table, table[idx]


def _wait_for(what, done, seconds=120):
    """Polls observable state; the bound is far past what a passing run needs."""
    until = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < until, f"no {what} within {seconds} s"
        time.sleep(0.005)


@pytest.fixture
def three():
    ds = [Daemon().start() for _ in range(3)]
    yield ds
    for d in ds:
        d.remove()


def test_spread_and_refusals(three):
    urls = [three[0].url, three[1].tcp_url, three[2].url]
    with gpucd.Pool(urls, probe_min=0.02, probe_max=0.2) as pool:
        for key in range(30):
            idx, table, want = _lookup(key)
            got = pool.run(lambda c: c.embedding_forward(idx, table))
            np.testing.assert_array_equal(got, want)
        stats = pool.stats()
        assert [s["url"] for s in stats] == urls
        assert [s["calls"] for s in stats] == [10, 10, 10]
        assert all(s["up"] and s["failures"] == 0 and s["in_flight"] == 0 for s in stats)

        with pytest.raises(gpucd.ClientInvalidArgument, match="region_create"):
            pool.run(lambda c: c.region(4096))
        with pytest.raises(gpucd.ClientInvalidArgument, match="tensor_put"):
            pool.run(lambda c: c.put(np.ones(4, np.float32)))
        with pytest.raises(ZeroDivisionError):  # not gpucd's: raised as it is, not run again
            pool.run(lambda c: 1 // 0)
        assert sum(s["retries"] for s in pool.stats()) == 0
    with pytest.raises(gpucd.ClientInvalidArgument, match="closed"):
        pool.run(lambda c: c.ping())


def test_one_killed_while_threads_call(three):
    urls = [three[0].url, three[1].tcp_url, three[2].url]
    pool = gpucd.Pool(urls, timeout=120, probe_min=0.02, probe_max=0.2)
    stop = threading.Event()
    counts = {"calls": 0, "runs": 0, "bad": []}
    lock = threading.Lock()
    # The daemon is killed while calls wait on it, not while one is being sent to it: nng 1.5.2
    # loses a send that starts as its connection closes, and the client then hangs (see
    # test_client_pool.c).  Callers pass a gate before each call, closed around the kill.
    gate = threading.Condition()
    gate_state = {"closed": False, "waiting": 0}

    def gate_pass():
        with gate:
            gate_state["waiting"] += 1
            gate.wait_for(lambda: not gate_state["closed"])
            gate_state["waiting"] -= 1

    def gate_waiters():
        with gate:
            return gate_state["waiting"] if gate_state["closed"] else 0

    def gate_set(closed):
        with gate:
            gate_state["closed"] = closed
            gate.notify_all()

    def caller(me):
        key = me << 32
        while not stop.is_set():
            gate_pass()
            key += 1
            idx, table, want = _lookup(key)
            runs = []

            def fn(c):
                runs.append(c)
                return c.embedding_forward(idx, table)

            try:
                got = pool.run(fn)
                ok = np.array_equal(got, want)
            except gpucd.Error as e:
                ok = e
            with lock:
                counts["calls"] += 1
                counts["runs"] += len(runs)
                if ok is not True:
                    counts["bad"].append((key, ok))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        _wait_for("20 calls on each daemon", lambda: all(s["calls"] >= 20 for s in pool.stats()))
        os.kill(three[2].proc.pid, signal.SIGSTOP)  # it reads nothing more: its calls wait
        # A call counted there may still get the answer it had before the stop: until some call
        # is left waiting once every other caller is at the gate, the gate opens again.
        while True:
            _wait_for("a call waiting on the stopped daemon 2",
                      lambda: pool.stats()[2]["in_flight"])
            gate_set(True)
            _wait_for("every caller at the gate or waiting on daemon 2",
                      lambda: sum(s["in_flight"] for s in pool.stats()[:2]) == 0
                      and gate_waiters() + pool.stats()[2]["in_flight"] == len(threads))
            waiting = pool.stats()[2]["in_flight"]
            if waiting:
                break
            gate_set(False)
        before = [s["calls"] for s in pool.stats()]
        three[2].kill()
        _wait_for("daemon 2 down, its waiting calls moved",
                  lambda: (lambda s: not s["up"] and not s["connected"]
                           and s["in_flight"] == 0)(pool.stats()[2]))
        gate_set(False)
        _wait_for("20 more calls on the others",
                  lambda: all(s["calls"] >= b + 20 for s, b in zip(pool.stats()[:2], before)))
    finally:
        stop.set()
        gate_set(False)
        for t in threads:
            t.join()
    stats = pool.stats()
    pool.close()
    print(counts["calls"], "calls,", counts["runs"], "runs:", stats)
    assert counts["bad"] == []  # none lost, each its own answer
    assert sum(s["calls"] for s in stats) == counts["runs"]
    assert sum(s["retries"] for s in stats) == counts["runs"] - counts["calls"]
    assert stats[2]["downs"] >= 1
    assert sum(s["retries"] for s in stats) >= waiting  # each call that waited on it moved
    assert all(s["in_flight"] == 0 for s in stats)
