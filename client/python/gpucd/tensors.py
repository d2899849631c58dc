"""Python values as gpucd_tensor structs: numpy arrays, torch CPU tensors and residents.

An array whose bytes lie inside one of the client's regions (a view from Region.numpy or
Region.torch, or any contiguous slice of one) goes as a region tensor at its byte offset: no
copy, and the call can be answered through shared memory alone.  Any other array goes as host
memory, its bytes in the request (inputs) or copied back from the reply (outputs).
"""
from collections import namedtuple

import numpy as np

from . import dtypes
from ._ffi import ffi, lib
from .errors import invalid

_ndarray = np.ndarray
_HOST, _REGION, _RESIDENT = lib.GPUCD_HOST, lib.GPUCD_REGION, lib.GPUCD_RESIDENT
_MAX_DIMS = 8


class _Name:
    """'op: what', formatted only when a message needs it."""

    __slots__ = ("op", "what")

    def __init__(self, op, what):
        self.op, self.what = op, what

    def __format__(self, spec):
        return f"{self.op}: {self.what}" if self.op else self.what


def _kind(obj):
    return f"a {type(obj).__name__}"


def fill(client, t, obj, op, what, keep):
    """Describes obj in the gpucd_tensor t; returns (dtype code, shape as a tuple of ints).
    What must live until the call returns is appended to keep.  op and what name the argument
    in messages (joined only when one is raised: this runs for every tensor of every call)."""
    name = _Name(op, what)
    if isinstance(obj, _ndarray):
        code = dtypes.FROM_NUMPY.get(obj.dtype)
        if code is None:
            raise invalid(f"{name}: numpy dtype {obj.dtype} is none of float32, uint16 (bf16), "
                          "float16, uint8, int32, int64")
        if not obj.flags.c_contiguous:
            raise invalid(f"{name}: the array must be C-contiguous (np.ascontiguousarray)")
        shape = obj.shape
        buf = ffi.from_buffer(obj)
        ptr = int(ffi.cast("uintptr_t", buf))
        keep.append(buf)
    elif isinstance(obj, Resident):
        if obj._client is not client:
            raise invalid(f"{name}: the resident tensor belongs to another client")
        if obj._id == 0:
            raise invalid(f"{name}: the resident tensor was freed")
        t[0] = obj._t[0]
        return obj.dtype_code, obj.shape
    elif is_torch(obj):
        code = dtypes.torch_maps()[1].get(obj.dtype)
        if code is None:
            raise invalid(f"{name}: torch dtype {obj.dtype} is none of float32, bfloat16, "
                          "float16, uint8, int32, int64")
        if obj.device.type != "cpu":
            raise invalid(f"{name}: a torch tensor on {obj.device}; only CPU tensors can be "
                          "passed (the daemon holds the device)")
        if not obj.is_contiguous():
            raise invalid(f"{name}: the tensor must be contiguous (.contiguous())")
        shape = tuple(obj.shape)
        ptr = obj.data_ptr()
        keep.append(obj)
    else:
        raise invalid(f"{name}: expected a numpy array, a torch CPU tensor or a gpucd.Resident, "
                      f"got {_kind(obj)}")
    ndim = len(shape)
    if ndim > _MAX_DIMS:
        raise invalid(f"{name}: {ndim} dimensions, at most {_MAX_DIMS}")
    t.dtype = code
    t.ndim = ndim
    t.shape[0:ndim] = shape
    region = client._region_at(ptr)
    if region is not None:
        t.where = _REGION
        t.region = region._ptr
        t.offset = ptr - region._base
        t.data = ffi.NULL
    else:
        t.where = _HOST
        t.data = ffi.cast("void *", ptr)
        t.region = ffi.NULL
        t.offset = 0
    return code, shape


def empty(like_torch, code, shape):
    """A new output array: a torch tensor when the call's inputs were torch tensors."""
    if like_torch:
        return dtypes.torch_module().empty(shape, dtype=dtypes.torch_maps()[0][code])
    return np.empty(shape, dtypes.NUMPY[code])


def is_torch(obj):
    torch = dtypes.torch_module()
    return torch is not None and isinstance(obj, torch.Tensor)


# A resident tensor's name, picklable: what another process passes to Client.resident to use it.
ResidentRef = namedtuple("ResidentRef", "id dtype shape")


class Resident:
    """A tensor that lives on the daemon's device across requests (weights, saved activations).

    Made by Client.put (or by an operation that creates one); freed on the daemon by free(),
    by the client's close, or when the object is garbage collected.  Pass it to any operation
    in place of an array.  get() copies it back.  ref() names it for another process (of the
    same user), whose Client.resident(ref) uses it without owning it: that one never frees it.
    """

    __slots__ = ("_client", "_id", "_t", "dtype_code", "shape", "owned", "__weakref__")

    def __init__(self, client, rid, code, shape, owned=True):
        self._client = client
        self._id = rid
        self.owned = owned
        self.dtype_code = code
        self.shape = tuple(shape)
        self._t = ffi.new("gpucd_tensor *")
        t = self._t
        t.where = _RESIDENT
        t.resident = rid
        t.dtype = code
        t.ndim = len(self.shape)
        t.shape[0:len(self.shape)] = self.shape

    @property
    def id(self):
        """The daemon's id of the tensor (0 once freed)."""
        return self._id

    @property
    def dtype(self):
        """"f32", "bf16", ..."""
        return dtypes.NAME[self.dtype_code]

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * dtypes.SIZE[self.dtype_code]

    def ref(self):
        """A picklable ResidentRef(id, dtype, shape) for Client.resident in another process."""
        return ResidentRef(self._id, self.dtype, self.shape)

    def get(self, out=None, *, torch=False):
        """The tensor's contents: into out (an array or region view of its dtype and shape), or
        a new numpy array (a torch tensor with torch=True; bf16 as uint16 in numpy)."""
        if out is None:
            out = empty(torch, self.dtype_code, self.shape)
        self._client._tensor_get(self, out)
        return out

    def free(self):
        """Frees the tensor on the daemon now (also done by the client's close and on
        garbage collection).  Freeing twice is a no-op."""
        self._client._resident_free(self)

    def __del__(self):
        client = getattr(self, "_client", None)
        if client is not None and self._id != 0 and self.owned:
            client._resident_free(self, quiet=True)

    def __repr__(self):
        state = f"id {self._id}" if self._id else "freed"
        return f"<gpucd.Resident {self.dtype} {self.shape}, {state}>"
