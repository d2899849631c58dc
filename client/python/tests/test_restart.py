"""A daemon restarted under a client: the call in flight fails with ConnectionClosed, calls
while no daemon listens time out, and the client reconnects by itself to the new daemon."""
import threading

import numpy as np
import pytest

import gpucd
from daemon import Daemon


def test_daemon_restarted_under_a_client(rng):
    d = Daemon().start()
    d2 = None
    try:
        c = gpucd.Client(d.url, timeout=2)  # the slow call is cut off at once, far sooner
        weights = c.put(np.ones(4, np.float32))
        n, dim, v = 512, 256, 4096  # most of a second of the CPU backend's time
        r = c.region((n * dim + v * dim) * 4)
        E, C = r.numpy("f32", (n, dim)), r.numpy("f32", (v, dim), offset=n * dim * 4)
        E[...] = rng.standard_normal(E.shape)
        C[...] = rng.standard_normal(C.shape) * 0.05
        result = {}

        def run():
            try:
                result["value"] = c.linear_cross_entropy(E, C, np.zeros(n, np.int64), dC=True)
            except gpucd.Error as e:
                result["error"] = e

        t = threading.Thread(target=run)
        t.start()
        with gpucd.Client(d.url) as probe:
            while probe.stats()["inflight"] < 2:  # the slow call and this stats request
                assert t.is_alive(), result
        d.kill()
        t.join()
        assert isinstance(result.get("error"), gpucd.ConnectionClosed), result
        assert result["error"].code == -5

        with pytest.raises(gpucd.Timeout):  # nobody listens: a call waits its timeout
            c.ping()

        d2 = Daemon(folder=d.dir).start()
        while True:  # the client redials by itself; the new daemon answers
            try:
                c.ping()
                break
            except (gpucd.Timeout, gpucd.ConnectionClosed):
                pass
        with pytest.raises(gpucd.NotFound, match="no resident tensor"):
            weights.get()  # resident tensors do not survive a restart
        with pytest.raises(gpucd.NotFound, match="no region"):
            c.embedding_forward(r.numpy("i32", (2,)), np.ones((3, 2), np.float32))
        with c.region(4096) as fresh:  # new ones work
            idx = fresh.numpy("i32", (2,))
            idx[...] = [2, 0]
            got = c.embedding_forward(idx, np.arange(6, dtype=np.float32).reshape(3, 2))
            np.testing.assert_array_equal(got, [[4, 5], [0, 1]])
        c.close()
        assert d2.stop() == 0
    finally:
        d.remove()
        if d2 is not None:
            d2.remove()
