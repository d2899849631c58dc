"""The operations in numpy float64, written from gpucd.h's definitions: what the daemon's
answers are checked against."""
import numpy as np

from gpucd import NMMO3


def rel_err(got, want):
    """Relative L2 error (the measure gpucdctl bench checks with)."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (scale if scale > 0 else 1.0)


def assert_close(got, want, tol=1e-5, what=""):
    err = rel_err(got, want)
    assert err <= tol, f"{what}: relative L2 error {err:.3g} > {tol}"


def _windows(x, kh, kw, stride, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return win[:, :, ::stride[0], ::stride[1]]  # (N, C, OH, OW, KH, KW)


def conv2d(x, w, b=None, stride=(1, 1), pad=(0, 0), relu=False):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    y = np.einsum("nchwij,ocij->nohw", _windows(x, w.shape[2], w.shape[3], stride, pad), w)
    if b is not None:
        y = y + np.asarray(b, np.float64)[None, :, None, None]
    return np.maximum(y, 0) if relu else y


def conv2d_backward(x, w, dy, y=None, stride=(1, 1), pad=(0, 0), relu=False):
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    if relu:
        dy = dy * (np.asarray(y) > 0)
    kh, kw = w.shape[2], w.shape[3]
    oh, ow = dy.shape[2], dy.shape[3]
    dw = np.einsum("nchwij,nohw->ocij", _windows(x, kh, kw, stride, pad), dy)
    db = dy.sum(axis=(0, 2, 3))
    dxp = np.zeros((x.shape[0], x.shape[1], x.shape[2] + 2 * pad[0], x.shape[3] + 2 * pad[1]))
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i:i + stride[0] * oh:stride[0], j:j + stride[1] * ow:stride[1]] += \
                np.einsum("nohw,oc->nchw", dy, w[:, :, i, j])
    dx = dxp[:, :, pad[0]:pad[0] + x.shape[2], pad[1]:pad[1] + x.shape[3]]
    return dx, dw, db


def multihot(obs, layout=NMMO3):
    b = obs.shape[0]
    out = np.zeros((b, layout.channels, layout.height, layout.width))
    tiles = layout.height * layout.width
    grid = obs[:, layout.obs_offset:layout.obs_offset + tiles * layout.nfeat]
    grid = grid.reshape(b, layout.height, layout.width, layout.nfeat)
    n, h, w = np.meshgrid(np.arange(b), np.arange(layout.height), np.arange(layout.width),
                          indexing="ij")
    for f in range(layout.nfeat):
        out[n, layout.offsets[f] + grid[..., f].astype(np.int64), h, w] = 1.0
    return out


def embedding_backward(idx, dout, vocab):
    d = dout.shape[-1]
    dt = np.zeros((vocab, d))
    np.add.at(dt, np.asarray(idx, np.int64).ravel(), np.asarray(dout, np.float64).reshape(-1, d))
    return dt


def embedding_bag(idx, table):
    """out[b] = the float64 sum of table[idx[b, k]] over k, ids of -1 left out."""
    idx = np.asarray(idx, np.int64)
    t = np.asarray(table, np.float64)
    rows = np.where(idx[..., None] >= 0, t[np.maximum(idx, 0)], 0.0)
    return rows.sum(axis=1)


def lce(E, C, targets, bias=None, ignore_index=-100, softcap=0.0, reduction="mean",
        shift=False, grad_scale=1.0):
    """(loss, lse, dE, dC, dbias) of the fused linear cross entropy, in float64."""
    E, C = np.asarray(E, np.float64), np.asarray(C, np.float64)
    raw = E @ C.T
    if bias is not None:
        raw = raw + np.asarray(bias, np.float64)
    z = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
    t = np.asarray(targets, np.int64)
    if shift:
        t = np.concatenate([t[1:], [ignore_index]])
    valid = t != ignore_index
    zmax = z.max(axis=1, keepdims=True)
    lse = (zmax + np.log(np.exp(z - zmax).sum(axis=1, keepdims=True)))[:, 0]
    rows = np.arange(len(t))
    tv = np.where(valid, t, 0)
    row_loss = np.where(valid, lse - z[rows, tv], 0.0)
    count = valid.sum()
    if reduction == "mean":
        loss = row_loss.sum() / count if count else 0.0
        weight = grad_scale / count if count else 0.0
    elif reduction == "sum":
        loss, weight = row_loss.sum(), grad_scale
    else:
        loss, weight = row_loss, grad_scale
    dz = np.exp(z - lse[:, None])
    dz[rows, tv] -= 1.0
    dz *= (weight * valid)[:, None]
    if softcap > 0:
        dz *= 1.0 - np.tanh(raw / softcap) ** 2
    return loss, lse, dz @ C, dz.T @ E, dz.sum(axis=0)


def _nmmo3_parts(obs, w):
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    m = multihot(obs)
    c1 = conv2d(m, w["conv1_w"], w["conv1_b"], stride=(3, 3), relu=True)
    c2 = conv2d(c1, w["conv2_w"], w["conv2_b"])
    player = obs[:, 1650:1697].astype(np.int64)
    reward = obs[:, 1697:1707].astype(np.float64)
    feat = np.concatenate([c2.reshape(len(obs), -1), w["embed"][player].reshape(len(obs), -1),
                           player.astype(np.float64), reward], axis=1)
    pre = feat @ w["proj_w"].T + w["proj_b"] if "proj_w" in w else None
    return w, m, c1, feat, pre


def nmmo3_encode(obs, weights):
    """(features, hidden or None) of the NMMO3 encoder."""
    _, _, _, feat, pre = _nmmo3_parts(obs, weights)
    return feat, None if pre is None else np.maximum(pre, 0)


def nmmo3_backward(obs, weights, dout):
    """Every weight's gradient from d(hidden) (with a projection) or d(features)."""
    w, m, c1, feat, pre = _nmmo3_parts(obs, weights)
    dout = np.asarray(dout, np.float64)
    g = {}
    if pre is not None:
        dpre = dout * (pre > 0)
        g["proj_w"] = dpre.T @ feat
        g["proj_b"] = dpre.sum(axis=0)
        dfeat = dpre @ w["proj_w"]
    else:
        dfeat = dout
    b = len(obs)
    player = obs[:, 1650:1697].astype(np.int64)
    g["embed"] = embedding_backward(player, dfeat[:, 256:1760].reshape(b, 47, 32), 128)
    dc2 = dfeat[:, :256].reshape(b, 128, 1, 2)
    dc1, g["conv2_w"], g["conv2_b"] = conv2d_backward(c1, w["conv2_w"], dc2)
    _, g["conv1_w"], g["conv1_b"] = conv2d_backward(m, w["conv1_w"], dc1, y=c1, stride=(3, 3),
                                                    relu=True)
    return g


def nmmo3_obs(rng, batch):
    """Random valid NMMO3 observations (as tests/integration/harness.c makes them): map values
    below each feature's slots, player bytes below the embedding's 128 rows, reward bytes."""
    obs = np.zeros((batch, 1707), np.uint8)
    slots = np.array(NMMO3.slots)
    obs[:, :1650] = (rng.integers(0, 1 << 30, (batch, 165, 10)) % slots).reshape(batch, 1650)
    obs[:, 1650:1697] = rng.integers(0, 128, (batch, 47))
    obs[:, 1697:1706] = rng.integers(0, 256, (batch, 9))
    return obs


def nmmo3_weights(rng, hidden=0, dtype=np.float32):
    shapes = {"conv1_w": (128, 59, 5, 5), "conv1_b": (128,), "conv2_w": (128, 128, 3, 3),
              "conv2_b": (128,), "embed": (128, 32)}
    if hidden:
        shapes.update(proj_w=(hidden, 1817), proj_b=(hidden,))
    scale = {"conv1_w": 1 / np.sqrt(59 * 25), "conv2_w": 1 / np.sqrt(128 * 9),
             "proj_w": 1 / np.sqrt(1817), "embed": 1.0}
    return {k: (rng.standard_normal(s) * scale.get(k, 0.1)).astype(dtype)
            for k, s in shapes.items()}
