"""Every error class: raised by what causes it, with its code and the daemon's message."""
import os
import threading

import numpy as np
import pytest

import gpucd
from daemon import Daemon
import reference as ref


def test_every_code_has_its_class():
    seen = set()
    for name in gpucd.errors.NAMES:
        cls = getattr(gpucd, name)
        assert issubclass(cls, gpucd.Error) and cls.code < 0 and cls.code not in seen
        seen.add(cls.code)
        e = gpucd.errors.error_for(cls.code, "what happened")
        assert type(e) is cls and e.code == cls.code and e.message == "what happened"
        # the library's own name of the code follows the message
        assert str(e).startswith("what happened [") and e.strerror != "unknown error"
    assert seen == {*range(-10, 0), *range(-112, -100)}
    unknown = gpucd.errors.error_for(-999, "x")
    assert type(unknown) is gpucd.Error and unknown.code == -999


def test_python_checks_are_invalid_argument(client):
    with pytest.raises(gpucd.ClientInvalidArgument, match=r"w \(8, 4, 3, 3\) has C 4 but x "
                       r"\(2, 3, 9, 9\) has C 3") as e:
        client.conv2d_forward(np.zeros((2, 3, 9, 9), np.float32),
                              np.zeros((8, 4, 3, 3), np.float32))
    assert e.value.code == -1
    assert isinstance(e.value, gpucd.InvalidArgument) and isinstance(e.value, ValueError)
    with pytest.raises(gpucd.InvalidArgument, match="C-contiguous"):
        client.conv2d_forward(np.zeros((2, 3, 9, 9), np.float32)[..., ::2],
                              np.zeros((8, 3, 3, 3), np.float32))
    with pytest.raises(gpucd.InvalidArgument,
                       match=r"x \(N, C, H, W\) is i32; expected f32 or bf16"):
        client.conv2d_forward(np.zeros((1, 1, 3, 3), np.int32), np.zeros((1, 1, 1, 1), np.int32))
    with pytest.raises(gpucd.InvalidArgument, match="obs rows have 1706 bytes"):
        client.nmmo3_encode(np.zeros((2, 1706), np.uint8),
                            ref.nmmo3_weights(np.random.default_rng(0)))
    frozen = np.zeros((3, 2), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(gpucd.InvalidArgument, match="out .* is a read-only array"):
        client.embedding_forward(np.zeros(3, np.int32), np.ones((4, 2), np.float32), out=frozen)
    with pytest.raises(gpucd.InvalidArgument, match="got a list"):
        client.embedding_forward([1, 2], np.zeros((3, 2), np.float32))
    with pytest.raises(gpucd.InvalidArgument, match="reduction 'avg': one of mean, sum, none"):
        client.linear_cross_entropy(np.zeros((2, 2), np.float32), np.zeros((3, 2), np.float32),
                                    np.zeros(2, np.int64), reduction="avg")


def test_library_checks(client):
    e3 = np.ones((4, 3), np.float32)
    with pytest.raises(gpucd.ClientInvalidArgument,
                       match="grad_scale 0 must be finite and non-zero"):
        client.linear_cross_entropy(e3, np.ones((5, 3), np.float32), np.zeros(4, np.int64),
                                    grad_scale=0.0)


def test_invalid_argument_from_daemon(client):
    with client.region(4096) as r:
        x = r.numpy("f32", (1, 1, 4, 4))
        x[...] = 1
        y = r.numpy("f32", (1, 1, 3, 3), offset=16)  # overlaps x
        with pytest.raises(gpucd.InvalidArgument, match="output y overlaps input x") as e:
            client.conv2d_forward(x, np.ones((1, 1, 2, 2), np.float32), out=y)
        assert e.value.code == -104 and "invalid argument" in e.value.strerror
    layout = gpucd.MultihotLayout(height=1, width=1, slots=(3, 3), offsets=(0, 1))
    with pytest.raises(gpucd.InvalidArgument, match="features 0 and 1 share channels"):
        client.multihot_encode(np.zeros((1, 2), np.uint8), layout=layout)


def test_out_of_range(client, rng):
    obs = ref.nmmo3_obs(rng, 3)
    obs[1, 2 * 10 + 2] = 17  # tile 2's feature 2 has 17 slots
    with pytest.raises(gpucd.OutOfRange, match="agent 1, tile .* feature 2: value 17 >= its 17 "
                                               "slots") as e:
        client.multihot_encode(obs)
    assert e.value.code == -105
    with pytest.raises(gpucd.OutOfRange):
        client.embedding_forward(np.array([0, 5], np.int32), np.zeros((5, 2), np.float32))


def test_not_found(client):
    ghost = client.resident(gpucd.ResidentRef(12345, "f32", (3,)))
    with pytest.raises(gpucd.NotFound, match="no resident tensor 12345") as e:
        ghost.get()
    assert e.value.code == -106


def test_permission_denied_for_regions_over_tcp(daemon):
    with gpucd.Client(daemon.tcp_url) as c:
        with pytest.raises(gpucd.PermissionDenied, match="shared memory needs a daemon at an "
                                                         "ipc:// URL"):
            c.region(4096)


def test_resource_exhausted_and_message_too_large():
    d = Daemon("--resident-mb", "1", "--max-message-mb", "1").start()
    try:
        with gpucd.Client(d.url) as c:
            r = c.region(4 << 20)
            with pytest.raises(gpucd.ResourceExhausted, match="resident bytes per peer: 0 bytes "
                                                              "held, 2 MiB asked") as e:
                c.put(r.numpy("f32", (1 << 19,)))
            assert e.value.code == -108
            with pytest.raises(gpucd.MessageTooLarge, match="exceed the 1048576-byte message "
                                                            "limit; use a region"):
                c.embedding_forward(np.zeros(70000, np.int32), np.ones((2, 8), np.float32))
    finally:
        assert d.stop() == 0
        d.remove()


def test_connect_errors(daemon):
    with pytest.raises(gpucd.Untrusted, match="runs as uid"):
        gpucd.Client(daemon.url, trust_uid=os.getuid() + 1)
    with pytest.raises(gpucd.AddressError, match="must start with ipc://"):
        gpucd.Client("bogus://x")
    with pytest.raises(gpucd.ConnectionRefused, match="Connection refused"):
        gpucd.Client("ipc:///tmp/gpucd-pytest-nonexistent/x.sock")


def test_timeout(daemon, rng):
    w = ref.nmmo3_weights(rng, 64)
    with gpucd.Client(daemon.url, timeout=0.001) as c:
        # 512 agents take the CPU backend tens of milliseconds: far longer than one.
        with pytest.raises(gpucd.Timeout, match="waiting for the reply: Timed out") as e:
            c.nmmo3_encode(ref.nmmo3_obs(rng, 512), w)
        assert e.value.code == -3 and isinstance(e.value, TimeoutError)


def test_closed_client(daemon):
    c = gpucd.Client(daemon.url)
    c.close()
    with pytest.raises(gpucd.ConnectionClosed, match="the client is closed"):
        c.ping()
    c.close()  # twice is fine


def test_unavailable_while_draining(rng):
    """A draining daemon refuses new requests while it finishes the one it runs."""
    d = Daemon("--drain-timeout-s", "600").start()
    try:
        slow = gpucd.Client(d.url)
        probe = gpucd.Client(d.url)
        n, dim, v = 512, 256, 4096  # most of a second of the CPU backend's; a ping: microseconds
        r = slow.region((n * dim + v * dim) * 4)
        E, C = r.numpy("f32", (n, dim)), r.numpy("f32", (v, dim), offset=n * dim * 4)
        E[...] = rng.standard_normal(E.shape)
        C[...] = rng.standard_normal(C.shape) * 0.05
        result = {}

        def run():
            try:
                result["value"] = slow.linear_cross_entropy(E, C, np.zeros(n, np.int64),
                                                            dE=True, dC=True)
            except gpucd.Error as e:
                result["error"] = e

        t = threading.Thread(target=run)
        t.start()
        while probe.stats()["inflight"] < 2:  # the slow call and the stats request itself
            assert t.is_alive(), result
        d.proc.send_signal(15)
        while True:
            try:
                probe.ping()
            except gpucd.Error as e:
                first = e
                break
        t.join()
        assert isinstance(first, gpucd.Unavailable), repr(first)
        assert first.code == -109 and "shutting down" in str(first)
        assert "value" in result, result  # the running request was answered
        assert d.proc.wait(60) == 0
        d.proc = None
    finally:
        d.remove()
