"""Resident tensors: round trips, lifetime, ownership."""
import gc

import numpy as np
import pytest

import gpucd


def _count(c):
    return c.stats()["resident_tensors"]["count"]


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.float16, np.uint8, np.int32,
                                   np.int64])
def test_round_trip(client, rng, dtype):
    a = (rng.standard_normal((3, 5, 2)) * 50).astype(dtype)
    r = client.put(a)
    assert r.shape == (3, 5, 2) and r.id != 0 and r.nbytes == a.nbytes
    got = r.get()
    assert got.dtype == a.dtype
    np.testing.assert_array_equal(got, a)
    into = np.zeros_like(a)
    assert r.get(into) is into
    np.testing.assert_array_equal(into, a)
    with pytest.raises(gpucd.InvalidArgument, match="for a resident"):
        r.get(np.zeros((2, 2), dtype))


def test_freed_on_del_free_and_close(daemon):
    with gpucd.Client(daemon.url) as probe, gpucd.Client(daemon.url) as c:
        base = _count(probe)
        a = c.put(np.ones(8, np.float32))
        b = c.put(np.ones(8, np.float32))
        assert _count(probe) == base + 2
        del a
        gc.collect()
        assert _count(probe) == base + 1
        b.free()
        b.free()  # twice is a no-op
        assert b.id == 0 and _count(probe) == base
        with pytest.raises(gpucd.InvalidArgument, match="was freed"):
            c.conv2d_forward(np.ones((1, 1, 2, 2), np.float32), b)
        kept = [c.put(np.ones(4, np.float32)) for _ in range(3)]
        assert _count(probe) == base + 3
        c.close()
        assert _count(probe) == base and all(r.id == 0 for r in kept)


def test_other_clients_and_refs(daemon):
    with gpucd.Client(daemon.url) as owner, gpucd.Client(daemon.url) as user:
        w = owner.put(np.arange(6, dtype=np.float32))
        with pytest.raises(gpucd.InvalidArgument, match="belongs to another client"):
            user.embedding_forward(np.zeros(1, np.int32), w)
        ref = w.ref()
        assert ref == gpucd.ResidentRef(w.id, "f32", (6,))
        borrowed = user.resident(ref)
        np.testing.assert_array_equal(borrowed.get(), np.arange(6, dtype=np.float32))
        base = _count(owner)
        del borrowed
        gc.collect()
        assert _count(owner) == base  # not the borrower's to free
        table = owner.put(np.arange(6, dtype=np.float32).reshape(3, 2))
        got = user.embedding_forward(np.array([2, 0], np.int32), user.resident(table.ref()))
        np.testing.assert_array_equal(got, [[4, 5], [0, 1]])


def test_torch_round_trip(client):
    torch = pytest.importorskip("torch")
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4).bfloat16()
    r = client.put(a)
    assert r.dtype == "bf16" and r.shape == (3, 4)
    back = r.get(torch=True)
    assert back.dtype == torch.bfloat16 and torch.equal(back, a)
    np.testing.assert_array_equal(gpucd.from_bf16(r.get()), a.float().numpy())
    with pytest.raises(gpucd.InvalidArgument, match="must be contiguous"):
        client.put(torch.zeros(4, 4).t())
