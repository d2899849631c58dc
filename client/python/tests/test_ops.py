"""Every operation against the float64 reference, on random shapes, with inputs as host arrays,
region views and residents."""
import numpy as np
import pytest

import gpucd
import reference as ref
from reference import assert_close

SEEDS = range(3)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    return request.param


@pytest.fixture
def client(request, backend):
    """Each test once against the CPU backend, once against the CUDA backend (skipped, and
    shown as skipped, without a GPU)."""
    d = request.getfixturevalue("daemon" if backend == "cpu" else "cuda_daemon")
    with gpucd.Client(d.url) as c:
        yield c


@pytest.fixture
def tol(backend):
    """f32 results: the CPU backend accumulates in double; the GPU in float, in its own order."""
    return 1e-5 if backend == "cpu" else 2e-4


def assert_same(got, want, tol, what):
    """Bit for bit where the backend promises it (CPU); within tol otherwise."""
    if tol <= 1e-5:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        assert_close(got, want, tol, what)


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("seed", SEEDS)
def test_conv2d_forward(client, rng, seed, tol):
    n, c, oc = rng.integers(1, 4), rng.integers(1, 6), rng.integers(1, 7)
    kh, kw = rng.integers(1, 4, 2)
    stride = tuple(int(s) for s in rng.integers(1, 3, 2))
    pad = tuple(int(p) for p in rng.integers(0, 2, 2))
    h, w = kh + rng.integers(0, 6), kw + rng.integers(0, 6)
    x, wt, b = _rand(rng, n, c, h, w), _rand(rng, oc, c, kh, kw), _rand(rng, oc)
    relu = bool(seed % 2)
    y = client.conv2d_forward(x, wt, b, stride=stride, padding=pad, relu=relu)
    assert y.dtype == np.float32
    assert_close(y, ref.conv2d(x, wt, b, stride, pad, relu), tol, "y")
    y0 = client.conv2d_forward(x, wt, stride=stride, padding=pad)
    assert_close(y0, ref.conv2d(x, wt, None, stride, pad), tol, "y without bias")


@pytest.mark.parametrize("seed", SEEDS)
def test_conv2d_backward(client, rng, seed, tol):
    n, c, oc = rng.integers(1, 4), rng.integers(1, 5), rng.integers(1, 6)
    kh, kw = rng.integers(1, 4, 2)
    stride = tuple(int(s) for s in rng.integers(1, 3, 2))
    pad = tuple(int(p) for p in rng.integers(0, 2, 2))
    h, w = kh + rng.integers(0, 5), kw + rng.integers(0, 5)
    x, wt, b = _rand(rng, n, c, h, w), _rand(rng, oc, c, kh, kw), _rand(rng, oc)
    y = client.conv2d_forward(x, wt, b, stride=stride, padding=pad, relu=True)
    dy = _rand(rng, *y.shape)
    g = client.conv2d_backward(x, wt, dy, y=y, stride=stride, padding=pad, relu=True)
    dx, dw, db = ref.conv2d_backward(x, wt, dy, y, stride, pad, relu=True)
    assert_close(g.dx, dx, tol, "dx")
    assert_close(g.dw, dw, tol, "dw")
    assert_close(g.db, db, tol, "db")
    only_dw = client.conv2d_backward(x, wt, dy, dx=False, db=False, stride=stride, padding=pad)
    assert only_dw.dx is None and only_dw.db is None
    assert_close(only_dw.dw, ref.conv2d_backward(x, wt, dy, None, stride, pad)[1], tol, "dw")


def test_conv2d_bf16(client, rng):
    x, wt = _rand(rng, 2, 3, 7, 6), _rand(rng, 4, 3, 3, 3)
    y = client.conv2d_forward(gpucd.to_bf16(x), gpucd.to_bf16(wt))
    assert y.dtype == np.uint16  # bf16 bits
    want = ref.conv2d(gpucd.from_bf16(gpucd.to_bf16(x)), gpucd.from_bf16(gpucd.to_bf16(wt)))
    assert_close(gpucd.from_bf16(y), want, 1e-2, "bf16 y")


@pytest.mark.parametrize("seed", SEEDS)
def test_multihot_nmmo3(client, rng, seed):
    obs = ref.nmmo3_obs(rng, int(rng.integers(1, 9)))
    out = client.multihot_encode(obs)
    assert out.shape == (len(obs), 59, 11, 15)
    np.testing.assert_array_equal(out, ref.multihot(obs))
    bits = client.multihot_encode(obs, dtype="bf16")
    np.testing.assert_array_equal(gpucd.from_bf16(bits), ref.multihot(obs))


def test_multihot_custom_layout(client, rng):
    layout = gpucd.MultihotLayout(height=3, width=2, slots=(2, 5, 3), obs_offset=4)
    assert layout.channels == 10 and layout.offsets == (0, 2, 7)
    b = 5
    obs = np.zeros((b, 4 + 3 * 2 * 3 + 3), np.uint8)
    obs[:, 4:22] = (rng.integers(0, 100, (b, 6, 3)) % np.array(layout.slots)).reshape(b, 18)
    out = client.multihot_encode(obs, layout=layout)
    np.testing.assert_array_equal(out, ref.multihot(obs, layout))


@pytest.mark.parametrize("idx_dtype", [np.uint8, np.int32, np.int64])
def test_embedding(client, rng, idx_dtype, tol):
    v, d = int(rng.integers(2, 50)), int(rng.integers(1, 20))
    shape = tuple(int(s) for s in rng.integers(1, 5, rng.integers(1, 4)))
    idx = rng.integers(0, v, shape).astype(idx_dtype)
    table = _rand(rng, v, d)
    out = client.embedding_forward(idx, table)
    np.testing.assert_array_equal(out, table[idx.astype(np.int64)])
    dout = _rand(rng, *shape, d)
    dt = client.embedding_backward(idx, dout, vocab=v)
    assert_close(dt, ref.embedding_backward(idx, dout, v), tol, "dtable")
    into = np.full((v, d), np.nan, np.float32)
    assert client.embedding_backward(idx, dout, dtable=into) is into
    assert_close(into, ref.embedding_backward(idx, dout, v), tol, "dtable given")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_embedding_bag(client, rng, dtype, tol):
    b, k, v, d = (int(x) for x in rng.integers(1, 40, 4))
    idx = rng.integers(-1, v, (b, k)).astype(np.int32)
    idx[0, 0] = v - 1  # one row at least, so that the sums are not all zero
    table = _rand(rng, v, d)
    if dtype == "bf16":
        table = gpucd.to_bf16(table)
    want = ref.embedding_bag(idx, gpucd.from_bf16(table) if dtype == "bf16" else table)
    out = client.embedding_bag(idx, table)
    assert out.dtype == np.float32 and out.shape == (b, d)
    assert_close(out, want, tol, "out")
    into = np.full((b, d), np.nan, np.float32)
    assert client.embedding_bag(idx, table, out=into) is into
    np.testing.assert_array_equal(into, out)
    idx[b - 1, k - 1] = -2
    with pytest.raises(gpucd.OutOfRange, match=f"position {b * k - 1} .*value -2"):
        client.embedding_bag(idx, table)
    with pytest.raises(gpucd.Error, match="idx"):
        client.embedding_bag(idx.astype(np.int64), table)


LCE_CASES = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(shift=True),
    dict(softcap=3.0),
    dict(grad_scale=2.5, reduction="sum"),
    dict(bias=True),
    dict(ignore_index=0),
]


@pytest.mark.parametrize("opts", LCE_CASES, ids=lambda o: ",".join(o) or "defaults")
def test_linear_cross_entropy(client, rng, opts, tol):
    opts = dict(opts)
    n, d, v = int(rng.integers(1, 40)), int(rng.integers(1, 24)), int(rng.integers(2, 70))
    E, C = _rand(rng, n, d), _rand(rng, v, d) * 0.5
    targets = rng.integers(0, v, n).astype(np.int64)
    targets[rng.random(n) < 0.2] = opts.get("ignore_index", -100)
    bias = _rand(rng, v) if opts.pop("bias", False) else None
    r = client.linear_cross_entropy(E, C, targets, bias, lse=True, dE=True, dC=True,
                                    dbias=bias is not None, **opts)
    loss, lse, dE, dC, dbias = ref.lce(E, C, targets, bias, **opts)
    assert_close(r.loss, loss, tol, "loss")
    assert r.loss.shape == ((n,) if opts.get("reduction") == "none" else ())
    assert_close(r.lse, lse, tol, "lse")
    assert_close(r.dE, dE, tol, "dE")
    assert_close(r.dC, dC, tol, "dC")
    if bias is not None:
        assert_close(r.dbias, dbias, tol, "dbias")
    else:
        assert r.dbias is None


def test_linear_cross_entropy_defaults_only_loss(client, rng, tol):
    E, C = _rand(rng, 6, 4), _rand(rng, 9, 4)
    targets = rng.integers(0, 9, 6).astype(np.int32)
    r = client.linear_cross_entropy(E, C, targets)
    assert r.lse is None and r.dE is None and r.dC is None and r.dbias is None
    assert_close(r.loss, ref.lce(E, C, targets)[0], tol, "loss")


@pytest.mark.parametrize("hidden", [0, 24])
def test_nmmo3_encode(client, rng, hidden, tol):
    obs = ref.nmmo3_obs(rng, int(rng.integers(1, 6)))
    w = ref.nmmo3_weights(rng, hidden)
    feat, hid = ref.nmmo3_encode(obs, w)
    out = client.nmmo3_encode(obs, w, features=True)  # weights as host arrays
    assert_close(out.features, feat, tol, "features")
    if hidden:
        assert_close(out.hidden, hid, tol, "hidden")
    else:
        assert out.hidden is None
    resident = client.nmmo3_weights(**w)  # the same, resident
    again = client.nmmo3_encode(obs, resident, features=True)
    assert_same(again.features, out.features, tol, "features from resident weights")
    resident.free()


@pytest.mark.parametrize("hidden", [0, 16])
def test_nmmo3_backward_and_saved(client, rng, hidden, tol):
    b = int(rng.integers(1, 5))
    obs = ref.nmmo3_obs(rng, b)
    w = client.nmmo3_weights(**ref.nmmo3_weights(rng, hidden))
    host_w = {k: r.get() for k, r in w.residents.items()}
    dout = _rand(rng, b, hidden if hidden else 1817)
    want = ref.nmmo3_backward(obs, host_w, dout)
    got = client.nmmo3_encode_backward(obs, w, dout)
    assert set(got) == set(want)
    for k in want:
        assert_close(got[k], want[k], tol, k)
    fwd = client.nmmo3_encode_save(obs, w, features=True)
    feat, hid = ref.nmmo3_encode(obs, host_w)
    assert_close(fwd.features, feat, tol, "features")
    assert isinstance(fwd.saved, gpucd.Resident) and fwd.saved.id != 0
    saved = client.nmmo3_encode_backward_saved(obs, w, fwd.saved, dout)
    for k in want:  # the same arithmetic on the same values: the same bits
        assert_same(saved[k], got[k], tol, k)
    again = client.nmmo3_encode_save(obs, w, saved=fwd.saved)  # overwrites the same tensor
    assert again.saved is fwd.saved
    fwd.saved.free()


def test_inputs_as_residents_and_region_views(client, rng, tol):
    x, wt = _rand(rng, 2, 3, 6, 5), _rand(rng, 4, 3, 2, 2)
    want = ref.conv2d(x, wt)
    with client.region(1 << 16) as r:
        xv = r.numpy("f32", x.shape, offset=64)
        xv[...] = x
        yv = r.numpy("f32", want.shape, offset=64 + x.nbytes)
        yv[...] = np.nan
        got = client.conv2d_forward(xv, client.put(wt), out=yv)
        assert got is yv
        assert_close(yv, want, tol, "y in the region")
        res_y = client.put(np.zeros(want.shape, np.float32))
        client.conv2d_forward(client.put(x), wt, out=res_y)
        assert_close(res_y.get(), want, tol, "y resident")


def test_torch_tensors(client, rng, tol):
    torch = pytest.importorskip("torch")
    x, wt = _rand(rng, 2, 3, 6, 5), _rand(rng, 4, 3, 2, 2)
    y = client.conv2d_forward(torch.from_numpy(x), torch.from_numpy(wt))
    assert isinstance(y, torch.Tensor)
    assert_close(y.numpy(), ref.conv2d(x, wt), tol, "torch y")
    yb = client.conv2d_forward(torch.from_numpy(x).bfloat16(), torch.from_numpy(wt).bfloat16())
    assert yb.dtype == torch.bfloat16
    assert_close(yb.float().numpy(), ref.conv2d(x, wt), 2e-2, "torch bf16 y")
