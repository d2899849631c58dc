"""gpucd for Python: the client of the gpucd daemon, over the C library libgpucd.so.

    import gpucd
    with gpucd.Client() as c:            # $GPUCD_URL, else the daemon's default URL
        c.ping()
        r = c.region(1 << 20)
        obs = r.numpy("u8", (4, 1707))   # zero-copy view of shared memory
        ...

See docs/python.md for the whole API.
"""
from ._ffi import ffi as _cffi, lib as _lib
from .client import Client, Region, Timings
from .dtypes import from_bf16, to_bf16
from .errors import BY_NAME as _ERRORS, NAMES as _ERROR_NAMES, Error
from .layout import NMMO3, MultihotLayout
from .ops import (NMMO3_FEATURES, NMMO3_OBS_BYTES, NMMO3_WEIGHTS, Conv2dGrads, LceResult,
                  Nmmo3Output, Nmmo3SaveOutput, Nmmo3Weights)
from .pool import Pool
from .tensors import Resident, ResidentRef

globals().update(_ERRORS)  # one subclass of Error per code: gpucd.OutOfRange, ...
Error.__module__ = "gpucd"
__version__ = _cffi.string(_lib.gpucd_version_string()).decode()

__all__ = ["Client", "Pool", "Region", "Resident", "ResidentRef", "Timings", "Error", "MultihotLayout",
           "NMMO3", "Nmmo3Weights", "Nmmo3Output", "Nmmo3SaveOutput", "Conv2dGrads", "LceResult",
           "NMMO3_OBS_BYTES", "NMMO3_FEATURES", "NMMO3_WEIGHTS", "to_bf16", "from_bf16",
           *_ERROR_NAMES]
