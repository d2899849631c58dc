"""The compute operations of gpucd.h as methods of gpucd.Client.

Every tensor argument takes a numpy array, a torch CPU tensor, a region view or a Resident.
An output argument takes True (a new array is made and returned: a torch tensor when the
call's first input is one), False or None (not computed; where the operation allows it), or an
array, region view or Resident to write into.  Shapes and dtypes are checked here, before any
request, and named in the message; the daemon checks everything again.
"""
from collections import namedtuple

import numpy as np

from . import dtypes
from ._ffi import ffi, lib
from .errors import invalid
from .layout import MultihotLayout
from .tensors import Resident, ResidentRef, fill, is_torch

F32, BF16 = dtypes.F32, dtypes.BF16
_NULL = ffi.NULL
_MATH = {"default": lib.GPUCD_MATH_DEFAULT, "tf32": lib.GPUCD_MATH_TF32}
_REDUCTION = {"mean": lib.GPUCD_REDUCE_MEAN, "sum": lib.GPUCD_REDUCE_SUM,
              "none": lib.GPUCD_REDUCE_NONE}
NMMO3_OBS_BYTES, NMMO3_FEATURES = 1707, 1817
# The encoder's weights: (name, shape with None for the projection's hidden width).
NMMO3_WEIGHTS = (("conv1_w", (128, 59, 5, 5)), ("conv1_b", (128,)), ("conv2_w", (128, 128, 3, 3)),
                 ("conv2_b", (128,)), ("embed", (128, 32)), ("proj_w", (None, NMMO3_FEATURES)),
                 ("proj_b", (None,)))

Conv2dGrads = namedtuple("Conv2dGrads", "dx dw db")
LceResult = namedtuple("LceResult", "loss lse dE dC dbias")
Nmmo3Output = namedtuple("Nmmo3Output", "features hidden")
Nmmo3SaveOutput = namedtuple("Nmmo3SaveOutput", "features hidden saved")


def _name(code):
    return dtypes.NAME[code]


def _pair(v, what):
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise invalid(f"{what} {v!r}: an int or a pair")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _option(table, value, what):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise invalid(f"{what} {value!r}: one of {', '.join(table)}") from None


def _shape_str(shape):
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


class _Args:
    """The tensors of one call: their structs, and what must live until it returns."""

    __slots__ = ("client", "op", "keep", "torch")

    def __init__(self, client, op, first):
        self.client = client
        self.op = op
        self.keep = []
        self.torch = is_torch(first)

    def fail(self, msg):
        return invalid(f"{self.op}: {msg}")

    def tensor(self, obj, name, ndim=None, codes=None):
        """An input: its struct, dtype code and shape."""
        t = ffi.new("gpucd_tensor *")
        code, shape = fill(self.client, t, obj, self.op, name, self.keep)
        if ndim is not None and len(shape) != ndim:
            raise self.fail(f"{name} has shape {_shape_str(shape)}: {ndim} dimensions expected")
        if codes is not None and code not in codes:
            raise self.fail(f"{name} is {_name(code)}; expected "
                            + " or ".join(_name(c) for c in codes))
        return t, code, shape

    def output(self, spec, name, code, shape, codes=None, required=False):
        """An output of the given shape: (struct or NULL, the value returned)."""
        if spec is None or spec is False:
            if required:
                raise self.fail(f"{name} is required")
            return _NULL, None
        if spec is True:
            value = self.client._empty(self.torch, code, shape)
        else:
            value = spec
        t, got, got_shape = self.tensor(value, name)
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            raise self.fail(f"{name} is a read-only array")
        allowed = codes if codes is not None else (code,)
        if got not in allowed:
            raise self.fail(f"{name} is {_name(got)}; expected "
                            + " or ".join(_name(c) for c in allowed))
        if got_shape != tuple(shape):
            raise self.fail(f"{name} has shape {_shape_str(got_shape)}; expected "
                            f"{_shape_str(shape)}")
        return t, value


def _timings(timings):
    return _NULL if timings is None else timings._t


class Nmmo3Weights:
    """The NMMO3 encoder's weights, ready for nmmo3_encode: made by Client.nmmo3_weights,
    which keeps every weight resident on the daemon (a call then names them, no bytes move)."""

    def __init__(self, residents):
        self.residents = residents
        self._w = ffi.new("gpucd_nmmo3_weights *")
        for name, _ in NMMO3_WEIGHTS:
            r = residents.get(name)
            setattr(self._w, name, _NULL if r is None else r._t)
        first = residents["conv1_w"]
        self.dtype_code = first.dtype_code
        self.hidden = residents["proj_w"].shape[0] if "proj_w" in residents else 0

    def refs(self):
        """name -> ResidentRef, picklable: Client.nmmo3_weights(**refs) in another process uses
        the same tensors."""
        return {name: r.ref() for name, r in self.residents.items()}

    def free(self):
        for r in self.residents.values():
            r.free()


class Operations:
    """Mixed into gpucd.Client."""

    # ---- convolutions ------------------------------------------------------------------------

    @staticmethod
    def _conv_params(stride, padding, relu, math):
        p = ffi.new("gpucd_conv2d_params *")
        p.stride_h, p.stride_w = _pair(stride, "stride")
        p.pad_h, p.pad_w = _pair(padding, "padding")
        p.relu = 1 if relu else 0
        p.math = _option(_MATH, math, "math")
        return p

    def _conv_shapes(self, a, p, x, w, b):
        tx, cx, sx = a.tensor(x, "x (N, C, H, W)", 4, (F32, BF16))
        tw, cw, sw = a.tensor(w, "w (OC, C, KH, KW)", 4, (F32, BF16))
        if cw != cx:
            raise a.fail(f"w is {_name(cw)} but x is {_name(cx)}: one dtype for all tensors")
        if sw[1] != sx[1]:
            raise a.fail(f"w {_shape_str(sw)} has C {sw[1]} but x {_shape_str(sx)} has C {sx[1]}")
        if p.stride_h < 1 or p.stride_w < 1 or p.pad_h < 0 or p.pad_w < 0:
            raise a.fail(f"stride ({p.stride_h}, {p.stride_w}) must be >= 1 and padding "
                         f"({p.pad_h}, {p.pad_w}) >= 0")
        oh = (sx[2] + 2 * p.pad_h - sw[2]) // p.stride_h + 1
        ow = (sx[3] + 2 * p.pad_w - sw[3]) // p.stride_w + 1
        if sx[2] + 2 * p.pad_h < sw[2] or sx[3] + 2 * p.pad_w < sw[3]:
            raise a.fail(f"the kernel {sw[2]}x{sw[3]} is larger than the padded input "
                         f"{sx[2] + 2 * p.pad_h}x{sx[3] + 2 * p.pad_w}")
        tb = _NULL
        if b is not None:
            tb, cb, sb = a.tensor(b, "b (OC)", 1, (cx,))
            if sb[0] != sw[0]:
                raise a.fail(f"b {_shape_str(sb)} has {sb[0]} entries; w has OC {sw[0]}")
        return tx, tw, tb, cx, (sx[0], sw[0], oh, ow), sx, sw

    def conv2d_forward(self, x, w, b=None, *, out=True, stride=1, padding=0, relu=False,
                       math="default", timings=None):
        """y (N, OC, OH, OW) = conv2d(x (N, C, H, W), w (OC, C, KH, KW)) + b (OC), optionally
        relu; all f32 or all bf16."""
        a = _Args(self, "conv2d_forward", x)
        p = self._conv_params(stride, padding, relu, math)
        tx, tw, tb, code, yshape, _, _ = self._conv_shapes(a, p, x, w, b)
        ty, y = a.output(out, "out (N, OC, OH, OW)", code, yshape, required=True)
        self._check(lib.gpucd_conv2d_forward(self._handle(), p, tx, tw, tb, ty, _timings(timings)))
        return y

    def conv2d_backward(self, x, w, dy, *, y=None, dx=True, dw=True, db=True, stride=1,
                        padding=0, relu=False, math="default", timings=None):
        """The gradients (dx, dw, db) of conv2d_forward from dy (N, OC, OH, OW); y, the forward's
        output, is required with relu.  dw is required, dx and db optional."""
        a = _Args(self, "conv2d_backward", x)
        p = self._conv_params(stride, padding, relu, math)
        tx, tw, _, code, yshape, sx, sw = self._conv_shapes(a, p, x, w, None)
        tdy, _, sdy = a.tensor(dy, "dy (N, OC, OH, OW)", 4, (code,))
        if sdy != yshape:
            raise a.fail(f"dy has shape {_shape_str(sdy)}; the forward's output is "
                         f"{_shape_str(yshape)}")
        if relu and y is None:
            raise a.fail("relu needs y, the forward's output")
        ty = _NULL
        if y is not None:
            ty, _, sy = a.tensor(y, "y (N, OC, OH, OW)", 4, (code,))
            if sy != yshape:
                raise a.fail(f"y has shape {_shape_str(sy)}; expected {_shape_str(yshape)}")
        tdx, gx = a.output(dx, "dx", code, sx)
        tdw, gw = a.output(dw, "dw", code, sw, required=True)
        tdb, gb = a.output(db, "db", code, (sw[0],))
        self._check(lib.gpucd_conv2d_backward(self._handle(), p, tx, tw, ty, tdy, tdx, tdw, tdb,
                                              _timings(timings)))
        return Conv2dGrads(gx, gw, gb)

    # ---- multihot and embeddings -------------------------------------------------------------

    def multihot_encode(self, obs, *, layout=None, out=True, dtype="f32", timings=None):
        """obs u8 (B, L) to out (B, channels, height, width) in f32 or bf16; layout a
        MultihotLayout, None for the NMMO3 preset (gpucd.NMMO3)."""
        from .layout import NMMO3

        a = _Args(self, "multihot_encode", obs)
        lay = NMMO3 if layout is None else layout
        if not isinstance(lay, MultihotLayout):
            raise a.fail(f"layout: a gpucd.MultihotLayout or None, not {type(lay).__name__}")
        tobs, _, sobs = a.tensor(obs, "obs (B, L)", 2, (dtypes.U8,))
        if sobs[1] < lay.obs_bytes:
            raise a.fail(f"obs rows have {sobs[1]} bytes; the layout reads {lay.obs_bytes}")
        code = dtypes.code_of(dtype)
        if code not in (F32, BF16):
            raise a.fail(f"dtype {_name(code)}: f32 or bf16")
        tout, value = a.output(out, "out (B, channels, H, W)", code,
                               (sobs[0], lay.channels, lay.height, lay.width), codes=(F32, BF16),
                               required=True)
        self._check(lib.gpucd_multihot_encode(self._handle(), _NULL if layout is None else lay._c,
                                              tobs, tout, _timings(timings)))
        return value

    def embedding_forward(self, idx, table, *, out=True, timings=None):
        """out (S..., D) = table (V, D)[idx (S...)]; idx u8|i32|i64, table f32|bf16."""
        a = _Args(self, "embedding_forward", table)
        tidx, _, sidx = a.tensor(idx, "idx", None, (dtypes.U8, dtypes.I32, dtypes.I64))
        ttab, ctab, stab = a.tensor(table, "table (V, D)", 2, (F32, BF16))
        tout, value = a.output(out, "out (S..., D)", ctab, sidx + (stab[1],), required=True)
        self._check(lib.gpucd_embedding_forward(self._handle(), tidx, ttab, tout,
                                                _timings(timings)))
        return value

    def embedding_backward(self, idx, dout, *, vocab=None, dtable=True, timings=None):
        """dtable (V, D) f32 = the sum of dout's rows by index; V is vocab, or dtable's rows."""
        a = _Args(self, "embedding_backward", dout)
        tidx, _, sidx = a.tensor(idx, "idx", None, (dtypes.U8, dtypes.I32, dtypes.I64))
        tdo, _, sdo = a.tensor(dout, "dout (S..., D)", None, (F32, BF16))
        if sdo[:-1] != sidx or len(sdo) != len(sidx) + 1:
            raise a.fail(f"dout has shape {_shape_str(sdo)}; idx {_shape_str(sidx)} needs "
                         f"(S..., D): idx's shape and one more dimension")
        if vocab is None:
            if dtable is True or dtable is None or dtable is False:
                raise a.fail("vocab (the table's rows) is needed unless dtable is given")
            vocab = dtable.shape[0]
        tdt, value = a.output(dtable, "dtable (V, D)", F32, (int(vocab), sdo[-1]), required=True)
        self._check(lib.gpucd_embedding_backward(self._handle(), tidx, tdo, tdt,
                                                 _timings(timings)))
        return value

    def embedding_bag(self, idx, table, *, out=True, timings=None):
        """out (B, D) f32 = the sum over k of table (V, D)[idx[b, k]]; idx i32 (B, K), -1 is
        padding (adds nothing); table f32|bf16.  Forward only."""
        a = _Args(self, "embedding_bag", table)
        tidx, _, sidx = a.tensor(idx, "idx (B, K)", 2, (dtypes.I32,))
        ttab, _, stab = a.tensor(table, "table (V, D)", 2, (F32, BF16))
        tout, value = a.output(out, "out (B, D)", F32, (sidx[0], stab[1]), required=True)
        self._check(lib.gpucd_embedding_bag(self._handle(), tidx, ttab, tout, _timings(timings)))
        return value

    # ---- linear cross entropy ------------------------------------------------------------------

    def linear_cross_entropy(self, E, C, targets, bias=None, *, ignore_index=-100, softcap=0.0,
                             reduction="mean", shift=False, filter_eps=0.0, math="default",
                             grad_scale=1.0, loss=True, lse=False, dE=False, dC=False,
                             dbias=False, timings=None):
        """The fused linear cross entropy of logits E (N, D) . C (V, D)^T + bias (V) against
        targets (N) i32|i64, with the C library's options and defaults: rows whose target is
        ignore_index count for nothing; softcap > 0 caps logits at softcap*tanh(z/softcap);
        reduction "mean" (over counted rows), "sum" or "none" (loss (N)); shift scores row i
        against target i+1; filter_eps > 0 drops gradient terms below it, "auto" picks 2^-12
        for bf16/f16 inputs; math "tf32" allows tf32 for f32 inputs; gradients are of
        grad_scale * loss.  Outputs: loss f32, lse (N) f32, dE, dC, dbias (f32 by default, or
        arrays of the input dtype given to write into).  Returns an LceResult."""
        a = _Args(self, "linear_cross_entropy", E)
        halves = (F32, BF16, dtypes.F16)
        tE, code, sE = a.tensor(E, "E (N, D)", 2, halves)
        tC, cC, sC = a.tensor(C, "C (V, D)", 2, halves)
        if cC != code:
            raise a.fail(f"C is {_name(cC)} but E is {_name(code)}: one dtype for E, C and bias")
        if sC[1] != sE[1]:
            raise a.fail(f"C {_shape_str(sC)} has D {sC[1]} but E {_shape_str(sE)} has D {sE[1]}")
        n, v = sE[0], sC[0]
        tt, _, st = a.tensor(targets, "targets (N)", 1, (dtypes.I32, dtypes.I64))
        if st[0] != n:
            raise a.fail(f"targets has {st[0]} entries; E has N {n} rows")
        tb = _NULL
        if bias is not None:
            tb, _, sb = a.tensor(bias, "bias (V)", 1, (code,))
            if sb[0] != v:
                raise a.fail(f"bias has {sb[0]} entries; C has V {v} rows")
        elif dbias is not False and dbias is not None:
            raise a.fail("dbias needs bias")
        p = ffi.new("gpucd_lce_params *")
        lib.gpucd_lce_params_init(p)
        p.ignore_index = int(ignore_index)
        p.softcap = float(softcap)
        p.reduction = _option(_REDUCTION, reduction, "reduction")
        p.shift = 1 if shift else 0
        if isinstance(filter_eps, str):
            if filter_eps != "auto":
                raise a.fail(f"filter_eps {filter_eps!r}: a float >= 0 or \"auto\"")
            p.filter_auto = 1
        else:
            p.filter_eps = float(filter_eps)
        p.math = _option(_MATH, math, "math")
        p.grad_scale = float(grad_scale)
        grad = (F32, code)
        tl, vl = a.output(loss, "loss", F32, (n,) if reduction == "none" else (), required=True)
        ts, vs = a.output(lse, "lse (N)", F32, (n,))
        tdE, gE = a.output(dE, "dE (N, D)", F32, sE, codes=grad)
        tdC, gC = a.output(dC, "dC (V, D)", F32, sC, codes=grad)
        tdb, gb = a.output(dbias, "dbias (V)", F32, (v,), codes=grad)
        self._check(lib.gpucd_linear_cross_entropy(self._handle(), p, tE, tC, tb, tt, tl, ts, tdE,
                                                   tdC, tdb, _timings(timings)))
        return LceResult(vl, vs, gE, gC, gb)

    # ---- the NMMO3 encoder -----------------------------------------------------------------------

    def nmmo3_weights(self, **weights):
        """Nmmo3Weights from conv1_w, conv1_b, conv2_w, conv2_b, embed and optionally proj_w
        and proj_b: arrays (made resident here), Residents (used as they are) or the
        ResidentRefs of another process's (Nmmo3Weights.refs())."""
        a = _Args(self, "nmmo3_weights", None)
        residents = {}
        unknown = set(weights) - {n for n, _ in NMMO3_WEIGHTS}
        if unknown:
            raise a.fail(f"unknown weights {sorted(unknown)}")
        for name, _ in NMMO3_WEIGHTS:
            w = weights.get(name)
            if isinstance(w, ResidentRef):
                residents[name] = self.resident(w)
            elif isinstance(w, Resident):
                residents[name] = w
            elif w is not None:
                residents[name] = self.put(w)
        self._nmmo3_check(a, {n: (r.dtype_code, r.shape) for n, r in residents.items()})
        return Nmmo3Weights(residents)

    def _nmmo3_check(self, a, found):
        """found: name -> (dtype code, shape).  Checks names, shapes and the one dtype;
        returns (dtype code, hidden or 0)."""
        for name in ("conv1_w", "conv1_b", "conv2_w", "conv2_b", "embed"):
            if name not in found:
                raise a.fail(f"weights: {name} is missing")
        if ("proj_w" in found) != ("proj_b" in found):
            raise a.fail("weights: proj_w and proj_b go together (both or neither)")
        code = found["conv1_w"][0]
        hidden = found["proj_w"][1][0] if "proj_w" in found and found["proj_w"][1] else 0
        for name, shape in NMMO3_WEIGHTS:
            if name not in found:
                continue
            got_code, got_shape = found[name]
            want = tuple(hidden if s is None else s for s in shape)
            if tuple(got_shape) != want:
                raise a.fail(f"weights: {name} has shape {_shape_str(got_shape)}; expected "
                             f"{_shape_str(want)}")
            if got_code not in (F32, BF16):
                raise a.fail(f"weights: {name} is {_name(got_code)}; f32 or bf16")
            if got_code != code:
                raise a.fail(f"weights: {name} is {_name(got_code)} but conv1_w is "
                             f"{_name(code)}: one dtype for all weights")
        return code, hidden

    def _nmmo3_struct(self, a, weights):
        """A gpucd_nmmo3_weights for weights (Nmmo3Weights, or a dict of arrays/Residents)."""
        if isinstance(weights, Nmmo3Weights):
            if weights.residents["conv1_w"]._client is not self:
                raise a.fail("weights: they belong to another client")
            return weights._w, weights.dtype_code, weights.hidden
        if not isinstance(weights, dict):
            raise a.fail(f"weights: an Nmmo3Weights or a dict, not {type(weights).__name__}")
        w = ffi.new("gpucd_nmmo3_weights *")
        a.keep.append(w)
        found = {}
        for name, _ in NMMO3_WEIGHTS:
            obj = weights.get(name)
            if obj is None:
                setattr(w, name, _NULL)
                continue
            t, code, shape = a.tensor(obj, f"weights: {name}")
            a.keep.append(t)
            setattr(w, name, t)
            found[name] = (code, shape)
        unknown = set(weights) - {n for n, _ in NMMO3_WEIGHTS}
        if unknown:
            raise a.fail(f"weights: unknown names {sorted(unknown)}")
        code, hidden = self._nmmo3_check(a, found)
        return w, code, hidden

    def _nmmo3_obs(self, a, weights, obs):
        """The weights' struct, dtype and hidden width; obs's struct and batch size."""
        w, code, nh = self._nmmo3_struct(a, weights)
        tobs, _, sobs = a.tensor(obs, "obs (B, 1707)", 2, (dtypes.U8,))
        if sobs[1] != NMMO3_OBS_BYTES:
            raise a.fail(f"obs rows have {sobs[1]} bytes; NMMO3 observations have "
                         f"{NMMO3_OBS_BYTES}")
        return w, code, nh, tobs, sobs[0]

    @staticmethod
    def _nmmo3_outputs(a, code, nh, b, features, hidden):
        if features is None:
            features = nh == 0
        if hidden is None:
            hidden = nh > 0
        if hidden is not False and nh == 0:
            raise a.fail("hidden needs the projection's weights (proj_w, proj_b)")
        tf, vf = a.output(features, "features (B, 1817)", code, (b, NMMO3_FEATURES))
        th, vh = a.output(hidden, "hidden (B, hidden)", code, (b, nh))
        if tf is _NULL and th is _NULL:
            raise a.fail("nothing to compute: ask for features or hidden")
        return tf, vf, th, vh

    def nmmo3_encode(self, obs, weights, *, features=None, hidden=None, timings=None):
        """The NMMO3 encoder: obs u8 (B, 1707) to features (B, 1817) and/or, with a projection,
        hidden (B, hidden), in the weights' dtype.  By default features without a projection,
        hidden with one.  Returns Nmmo3Output(features, hidden)."""
        a = _Args(self, "nmmo3_encode", obs)
        w, code, nh, tobs, b = self._nmmo3_obs(a, weights, obs)
        tf, vf, th, vh = self._nmmo3_outputs(a, code, nh, b, features, hidden)
        self._check(lib.gpucd_nmmo3_encode(self._handle(), w, tobs, tf, th, _timings(timings)))
        return Nmmo3Output(vf, vh)

    def _nmmo3_grads(self, a, nh, grads):
        """The gradient outputs (f32, the weights' shapes): a dict name -> array or True."""
        g = ffi.new("gpucd_nmmo3_weights *")
        a.keep.append(g)
        grads = {} if grads is None else dict(grads)
        unknown = set(grads) - {n for n, _ in NMMO3_WEIGHTS}
        if unknown:
            raise a.fail(f"grads: unknown names {sorted(unknown)}")
        values = {}
        for name, shape in NMMO3_WEIGHTS:
            if nh == 0 and name.startswith("proj"):
                setattr(g, name, _NULL)
                continue
            want = tuple(nh if s is None else s for s in shape)
            t, values[name] = a.output(grads.get(name, True), f"grads: {name}", F32, want,
                                       required=True)
            a.keep.append(t)  # g holds only its address
            setattr(g, name, t)
        return g, values

    def _nmmo3_dout(self, a, dout, code, b, nh):
        want = (b, nh) if nh else (b, NMMO3_FEATURES)
        what = "dout = d(hidden) (B, hidden)" if nh else "dout = d(features) (B, 1817)"
        tdo, cdo, sdo = a.tensor(dout, what, 2, (code,))
        if sdo != want:
            raise a.fail(f"dout has shape {_shape_str(sdo)}; expected {_shape_str(want)}")
        return tdo

    def nmmo3_encode_backward(self, obs, weights, dout, *, grads=None, timings=None):
        """Every weight's gradient (f32) from dout: d(hidden) with a projection, else
        d(features).  grads: a dict of arrays to write into (the rest are made).  Returns a
        dict name -> gradient."""
        a = _Args(self, "nmmo3_encode_backward", obs)
        w, code, nh, tobs, b = self._nmmo3_obs(a, weights, obs)
        tdo = self._nmmo3_dout(a, dout, code, b, nh)
        g, values = self._nmmo3_grads(a, nh, grads)
        self._check(lib.gpucd_nmmo3_encode_backward(self._handle(), w, tobs, tdo, g,
                                                    _timings(timings)))
        return values

    def nmmo3_encode_save(self, obs, weights, *, features=None, hidden=None, saved=None,
                          timings=None):
        """nmmo3_encode that also keeps, on the daemon, the activations the backward needs:
        saved is a Resident (made here, or one from an earlier call of the same batch size and
        weights, overwritten).  Returns Nmmo3SaveOutput(features, hidden, saved)."""
        a = _Args(self, "nmmo3_encode_save", obs)
        w, code, nh, tobs, b = self._nmmo3_obs(a, weights, obs)
        tf, vf, th, vh = self._nmmo3_outputs(a, code, nh, b, features, hidden)
        if saved is None:
            ts = ffi.new("gpucd_tensor *")
            ts.where = lib.GPUCD_NEW_RESIDENT
            ts.dtype = dtypes.U8
            ts.ndim = 0
        elif isinstance(saved, Resident):
            ts, _, _ = a.tensor(saved, "saved")
        else:
            raise a.fail(f"saved: a gpucd.Resident or None, not {type(saved).__name__}")
        self._check(lib.gpucd_nmmo3_encode_save(self._handle(), w, tobs, tf, th, ts,
                                                _timings(timings)))
        if saved is None:
            saved = self._adopt(int(ts.resident), int(ts.dtype), tuple(ts.shape[0:ts.ndim]))
        return Nmmo3SaveOutput(vf, vh, saved)

    def nmmo3_encode_backward_saved(self, obs, weights, saved, dout, *, grads=None,
                                    timings=None):
        """nmmo3_encode_backward from the activations nmmo3_encode_save kept in saved (the
        same weights and obs as that forward)."""
        a = _Args(self, "nmmo3_encode_backward_saved", obs)
        w, code, nh, tobs, b = self._nmmo3_obs(a, weights, obs)
        if not isinstance(saved, Resident):
            raise a.fail(f"saved: the gpucd.Resident nmmo3_encode_save returned, not "
                         f"{type(saved).__name__}")
        ts, _, _ = a.tensor(saved, "saved")
        tdo = self._nmmo3_dout(a, dout, code, b, nh)
        g, values = self._nmmo3_grads(a, nh, grads)
        self._check(lib.gpucd_nmmo3_encode_backward_saved(self._handle(), w, tobs, ts, tdo, g,
                                                          _timings(timings)))
        return values
