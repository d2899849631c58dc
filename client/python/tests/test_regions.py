"""Region views: zero-copy both ways, offsets, bounds, lifetime."""
import gc

import numpy as np
import pytest

import gpucd
import reference as ref


def test_writes_visible_both_ways(client, rng):
    with client.region(1 << 18) as r:
        obs = r.numpy("u8", (3, 1707), offset=128)
        obs[...] = ref.nmmo3_obs(rng, 3)  # written here, read by the daemon in place
        out = r.numpy("f32", (3, 59, 11, 15), offset=8192)
        out[...] = np.nan
        assert client.multihot_encode(obs, out=out) is out  # written by the daemon in place
        np.testing.assert_array_equal(out, ref.multihot(obs))
        again = r.numpy("f32", (3, 59, 11, 15), offset=8192)  # another view of the same bytes
        np.testing.assert_array_equal(again, out)
        # the daemon reads what it wrote: put copies from the region
        res = client.put(r.numpy("f32", (3 * 59 * 11 * 15,), offset=8192))
        np.testing.assert_array_equal(res.get(), out.ravel())


def test_offsets_and_slices(client, rng):
    table = rng.standard_normal((10, 4)).astype(np.float32)
    with client.region(4096) as r:
        whole = r.numpy("i32", (64,))
        whole[...] = rng.integers(0, 10, 64)
        part = whole[8:20]  # a slice of a view is a region tensor at its own offset
        got = client.embedding_forward(part, table)
        np.testing.assert_array_equal(got, table[part])
        raw = r.numpy("u8", (4096,))
        np.testing.assert_array_equal(raw[32:80].view(np.int32), whole[8:20])


def test_bounds_refused(client):
    with client.region(4096) as r:
        assert r.nbytes >= 4096
        with pytest.raises(gpucd.InvalidArgument, match=r"bytes \[4092, 4100\) .* do not fit"):
            r.numpy("f32", (2,), offset=r.nbytes - 4)
        with pytest.raises(gpucd.InvalidArgument, match="do not fit"):
            r.numpy("u8", (1,), offset=-1)
        with pytest.raises(gpucd.InvalidArgument, match="not a multiple"):
            r.numpy("f32", (2,), offset=2)
        with pytest.raises(gpucd.InvalidArgument, match="dtype 'f64' is none of"):
            r.numpy("f64", (2,))
        tail = r.numpy("u8", (r.nbytes,))
        assert tail.size == r.nbytes  # up to the last byte is fine
    with pytest.raises(gpucd.InvalidArgument, match="must be > 0"):
        client.region(0)


def test_bf16_views(client, rng):
    x = rng.standard_normal(16).astype(np.float32)
    with client.region(4096) as r:
        bits = r.numpy("bf16", (16,))
        assert bits.dtype == np.uint16
        bits[...] = gpucd.to_bf16(x)
        res = client.put(bits)
        assert res.dtype == "bf16"
        np.testing.assert_array_equal(res.get(), bits)
        np.testing.assert_allclose(gpucd.from_bf16(bits), x, rtol=2 ** -8)


def test_torch_views(client):
    torch = pytest.importorskip("torch")
    with client.region(4096) as r:
        t = r.torch(torch.bfloat16, (4, 2))
        t[...] = 1.5
        np.testing.assert_array_equal(gpucd.from_bf16(r.numpy("bf16", (4, 2))), 1.5)


def test_region_count_and_close(client, daemon):
    def regions():
        return len(client.regions())

    before = regions()
    r = client.region(4096)
    assert regions() == before + 1
    view = r.numpy("u8", (16,))
    r.close()
    view[...] = 7  # still mapped while a view exists
    assert regions() == before + 1
    with pytest.raises(gpucd.InvalidArgument, match="closed"):
        r.numpy("u8", (1,))
    del view
    gc.collect()
    assert regions() == before  # the last view gone: unregistered and unmapped


def test_client_close_frees_regions(daemon):
    with gpucd.Client(daemon.url) as probe:
        before = probe.stats()["regions"]["count"]  # the daemon's, every client's
        c = gpucd.Client(daemon.url)
        a, b = c.region(4096), c.region(8192)
        assert sorted(r["id"] for r in c.regions()) == sorted([a.id, b.id])
        assert probe.stats()["regions"]["count"] == before + 2
        c.close()
        assert probe.stats()["regions"]["count"] == before
