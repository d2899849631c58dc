"""The dtypes of gpucd.h and how numpy and torch spell them.

numpy has no bfloat16: a bf16 tensor travels as a uint16 array of its bits (no operation takes
uint16 data, so the two cannot be confused), and `to_bf16`/`from_bf16` convert.

torch is optional and never imported here (it takes seconds, in every worker process): a torch
tensor or dtype can only reach the package from a process that has imported torch already.
"""
import sys

import numpy as np

# (gpucd code, name, numpy dtype, torch dtype name): the one list the maps below come from.
_DTYPES = (
    (1, "f32", np.float32, "float32"),
    (2, "bf16", np.uint16, "bfloat16"),
    (3, "f16", np.float16, "float16"),
    (4, "u8", np.uint8, "uint8"),
    (5, "i32", np.int32, "int32"),
    (6, "i64", np.int64, "int64"),
)

NAME = {code: name for code, name, _, _ in _DTYPES}
NUMPY = {code: np.dtype(nd) for code, _, nd, _ in _DTYPES}
FROM_NUMPY = {np.dtype(nd): code for code, _, nd, _ in _DTYPES}
SIZE = {code: NUMPY[code].itemsize for code in NAME}
_torch_maps = []


def torch_module():
    """torch when this process has imported it, else None."""
    return sys.modules.get("torch")


def torch_maps():
    """(code -> torch dtype, torch dtype -> code), made at the first use."""
    if not _torch_maps:
        torch = torch_module()
        to = {code: getattr(torch, td) for code, _, _, td in _DTYPES}
        _torch_maps.extend((to, {v: k for k, v in to.items()}))
    return _torch_maps

F32, BF16, F16, U8, I32, I64 = 1, 2, 3, 4, 5, 6


def code_of(dtype):
    """The gpucd code of "f32"/"bf16"/... , a numpy dtype (uint16 for bf16) or a torch dtype."""
    if isinstance(dtype, str) and dtype in _BY_NAME:
        return _BY_NAME[dtype]
    torch = torch_module()
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype in torch_maps()[1]:
            return torch_maps()[1][dtype]
    else:
        try:
            code = FROM_NUMPY.get(np.dtype(dtype))
        except TypeError:
            code = None
        if code is not None:
            return code
    from .errors import invalid

    raise invalid(f"dtype {dtype!r} is none of {', '.join(NAME.values())} "
                  "(or their numpy/torch dtypes; numpy uint16 for bf16)")


_BY_NAME = {name: code for code, name in NAME.items()}


def to_bf16(a):
    """float32 values to bf16 bits (uint16), rounded to nearest even as the daemon rounds."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)  # stays a (quiet) NaN
    return out


def from_bf16(bits):
    """bf16 bits (uint16) to float32 values (exact)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)
