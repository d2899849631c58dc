"""gpucd.Client: one connection to a daemon, its regions and resident tensors."""
import json
import os
import weakref

import numpy as np

from . import dtypes
from ._ffi import ffi, lib
from .errors import BY_CODE, error_for, invalid
from .ops import Operations
from .tensors import Resident, empty, fill

ConnectionClosed = BY_CODE[-5]

# This process's id, kept by a fork hook: a call checks it against its client's without a
# system call.
_pid = os.getpid()


def _after_fork():
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def _string(cdata):
    return ffi.string(cdata).decode(errors="replace")


def options_fill(opts, timeout, spin_us, client_name, max_reply_bytes, tls_ca, tls_cert, tls_key,
                 trust_uid):
    """Sets a gpucd_options from Client's arguments; returns what must outlive opts' use."""
    if timeout is None:
        opts.timeout_ms = -1
    else:
        ms = int(round(timeout * 1000))
        if ms <= 0:
            raise invalid(f"timeout {timeout!r}: must be positive seconds, or None")
        opts.timeout_ms = ms
    if not 0 <= int(spin_us) <= 1_000_000:
        raise invalid(f"spin_us {spin_us!r}: must be 0..1000000")
    opts.spin_us = int(spin_us)
    opts.max_reply_bytes = int(max_reply_bytes)
    keep = []
    for field, value in (("client_name", client_name), ("tls_ca", tls_ca),
                         ("tls_cert", tls_cert), ("tls_key", tls_key)):
        if value is not None:
            keep.append(ffi.new("char[]", os.fsencode(value)))
            setattr(opts, field, keep[-1])
    if trust_uid is not None:
        opts.trust_uid_set = 1
        opts.trust_uid = int(trust_uid)
    return keep


class Timings:
    """The daemon's timings of one call, in microseconds: pass timings=Timings() to a call."""

    FIELDS = ("queue_us", "copy_in_us", "compute_us", "copy_out_us", "batch_wait_us", "total_us",
              "round_trip_us")
    __slots__ = ("_t",)

    def __init__(self):
        self._t = ffi.new("gpucd_timings *")

    def __getattr__(self, name):
        if name in Timings.FIELDS:
            return getattr(self._t, name)
        raise AttributeError(name)

    def as_dict(self):
        return {f: getattr(self._t, f) for f in Timings.FIELDS}

    def __repr__(self):
        return "<gpucd.Timings " + " ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ">"


class _Connection:
    """A gpucd_client and the regions still mapped over it.  It is closed once the Client let
    it go and the last region's memory is unmapped (a view of a region keeps its memory, and so
    the connection, alive).  Connections and mappings live in module dictionaries, not in
    closures or objects the garbage collector may clear first: whatever order it frees a
    client and its regions in, the regions go before the connection."""

    __slots__ = ("ptr", "pid", "regions", "released")

    def __init__(self, ptr):
        self.ptr = ptr
        self.pid = os.getpid()
        self.regions = 0
        self.released = False
        _CONNECTIONS[id(self)] = self

    def release(self):
        self.released = True
        self._close_if_unused()

    def _close_if_unused(self):
        if self.released and self.regions == 0 and _CONNECTIONS.pop(id(self), None) is not None:
            # In a forked child the connection is the parent's: the child leaves it alone.
            if os.getpid() == self.pid:
                lib.gpucd_close(self.ptr)


_CONNECTIONS = {}
_MAPPINGS = {}  # a region's data address -> (gpucd_region *, its _Connection)


def _unmap(mem):
    """ffi.gc's destructor of a region's memory: the last view of it is gone."""
    region_ptr, conn = _MAPPINGS.pop(int(ffi.cast("uintptr_t", mem)))
    if os.getpid() == conn.pid:
        lib.gpucd_region_destroy(region_ptr)
    conn.regions -= 1
    conn._close_if_unused()


class Region:
    """Shared memory registered with the daemon (client.region(nbytes)).

    numpy() and torch() are zero-copy views of it; any contiguous view (or slice of one) passed
    to an operation goes as a region tensor: the daemon reads and writes these bytes in place.
    The memory stays mapped while any view of it exists, even after close().
    """

    def __init__(self, client, nbytes):
        out = ffi.new("gpucd_region **")
        client._check(lib.gpucd_region_create(client._handle(), nbytes, out))
        self._ptr = out[0]
        self.nbytes = int(lib.gpucd_region_size(self._ptr))
        self.id = int(lib.gpucd_region_id(self._ptr))
        data = lib.gpucd_region_data(self._ptr)
        self._base = int(ffi.cast("uintptr_t", data))
        self._end = self._base + self.nbytes
        _MAPPINGS[self._base] = (self._ptr, client._conn)
        client._conn.regions += 1
        mem = ffi.gc(ffi.cast("char *", data), _unmap)
        self._bytes = np.frombuffer(ffi.buffer(mem, self.nbytes), np.uint8)
        self._client = client

    def _span(self, dtype, shape, offset):
        if self._bytes is None:
            raise invalid(f"region {self.id} is closed")
        code = dtypes.code_of(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if any(int(s) < 0 for s in shape):
            raise invalid(f"region view: negative dimension in shape {shape}")
        size = int(np.prod(shape, dtype=np.int64)) * dtypes.SIZE[code]
        if offset < 0 or offset + size > self.nbytes:
            raise invalid(f"region {self.id}: bytes [{offset}, {offset + size}) of a "
                          f"{dtypes.NAME[code]} {shape} view do not fit its {self.nbytes} bytes")
        if offset % dtypes.SIZE[code]:
            raise invalid(f"region view: offset {offset} is not a multiple of "
                          f"{dtypes.NAME[code]}'s {dtypes.SIZE[code]} bytes")
        return code, shape, self._bytes[offset:offset + size]

    def numpy(self, dtype, shape, offset=0):
        """A numpy view of the bytes [offset, offset + size): bf16 as uint16 (see from_bf16)."""
        code, shape, raw = self._span(dtype, shape, offset)
        return raw.view(dtypes.NUMPY[code]).reshape(shape)

    def torch(self, dtype, shape, offset=0):
        """A torch view of the bytes [offset, offset + size) (bf16 as torch.bfloat16)."""
        import torch  # asked for by name: an ImportError says it is not installed

        code, shape, raw = self._span(dtype, shape, offset)
        tdtype = dtypes.torch_maps()[0][code]
        if raw.size == 0:
            return torch.empty(shape, dtype=tdtype)
        return torch.frombuffer(raw, dtype=tdtype).reshape(shape)

    def close(self):
        """Unregisters the region once no view of it is left (at once when none is)."""
        if self._bytes is not None:
            self._client._regions.remove(self)
            self._bytes = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "" if self._bytes is not None else ", closed"
        return f"<gpucd.Region {self.id}, {self.nbytes} bytes{state}>"


class Client(Operations):
    """A connection to a gpucd daemon.

    url: ipc://PATH, tcp://HOST:PORT or tls+tcp://HOST:PORT; None takes $GPUCD_URL, else the
    library's default (ipc://$XDG_RUNTIME_DIR/gpucd.sock).  timeout: seconds a call waits
    (None: for ever).  spin_us: a call polls for its end this long before it sleeps.
    Threads may share one client; processes may not: connect in each process (after fork).
    """

    def __init__(self, url=None, timeout=30.0, spin_us=0, *, client_name="gpucd-python",
                 max_reply_bytes=0, tls_ca=None, tls_cert=None, tls_key=None, trust_uid=None):
        if url is None:
            url = os.environ.get("GPUCD_URL") or None
        opts = ffi.new("gpucd_options *")
        lib.gpucd_options_init(opts)
        keep = options_fill(opts, timeout, spin_us, client_name, max_reply_bytes, tls_ca, tls_cert,
                            tls_key, trust_uid)
        out = ffi.new("gpucd_client **")
        c_url = ffi.NULL if url is None else url.encode()
        rc = lib.gpucd_connect(c_url, opts, out)
        if rc != 0:
            raise error_for(rc, _string(lib.gpucd_errmsg(ffi.NULL)))
        if url is None:
            buf = ffi.new("char[4096]")
            lib.gpucd_default_url(buf, 4096)
            url = _string(buf)
        self.url = url
        self._pid = os.getpid()
        self._conn = _Connection(out[0])
        self._c = out[0]
        self._regions = []
        self._residents = weakref.WeakValueDictionary()

    # ---- plumbing --------------------------------------------------------------------------

    def _handle(self):
        if self._c is None:
            raise ConnectionClosed("the client is closed")
        if _pid != self._pid:
            raise ConnectionClosed("this client was made in another process (before a fork): "
                                   "connect again in this one")
        return self._c

    def _check(self, rc):
        if rc != 0:
            raise error_for(rc, _string(lib.gpucd_errmsg(self._c if self._c is not None
                                                         else ffi.NULL)))

    def _region_at(self, ptr):
        for r in self._regions:
            if r._base <= ptr < r._end:
                return r
        return None

    # ---- control ----------------------------------------------------------------------------

    def info(self):
        """The daemon's identity, device and limits, as a dict."""
        i = ffi.new("gpucd_info *")
        self._check(lib.gpucd_info_get(self._handle(), i))
        return {
            "protocol_version": i.protocol_version,
            "server_version": _string(i.server_version),
            "backend": _string(i.backend),
            "device_name": _string(i.device_name),
            "sm_count": i.sm_count,
            "device_memory_bytes": i.device_memory_bytes,
            "max_message_bytes": i.max_message_bytes,
            "max_inflight": i.max_inflight,
            "workspace_bytes": i.workspace_bytes,
            "max_dims": i.max_dims,
            "max_region_bytes": i.max_region_bytes,
            "ready": bool(i.ready),
            "device_allocations": i.device_allocations,
            "operations": [_string(i.operations[k]) for k in range(i.operation_count)],
            "multi_gpu": _string(i.multi_gpu),
        }

    def ping(self, timings=None):
        """A no-op round trip with the daemon."""
        self._check(lib.gpucd_ping(self._handle(), ffi.NULL if timings is None else timings._t))

    def stats(self):
        """The daemon's counters (the JSON of /stats) as a dict."""
        out = ffi.new("char **")
        self._check(lib.gpucd_stats_json(self._handle(), out))
        try:
            return json.loads(ffi.string(out[0]).decode())
        finally:
            lib.free(out[0])

    # ---- regions and resident tensors ------------------------------------------------------

    def region(self, nbytes):
        """A new shared-memory Region of nbytes (ipc:// daemons only)."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise invalid(f"region size {nbytes}: must be > 0")
        r = Region(self, nbytes)
        self._regions.append(r)
        return r

    def regions(self):
        """The regions this connection has registered, as the daemon lists them: dicts of
        id, name, size and users (requests using it now)."""
        out = ffi.new("gpucd_region_info **")
        count = ffi.new("size_t *")
        self._check(lib.gpucd_regions_list(self._handle(), out, count))
        try:
            return [{"id": out[0][k].id, "name": _string(out[0][k].name), "size": out[0][k].size,
                     "users": out[0][k].users} for k in range(count[0])]
        finally:
            lib.free(out[0])

    def put(self, array):
        """Copies an array (numpy, torch CPU, region view or Resident) to a new Resident."""
        t = ffi.new("gpucd_tensor *")
        keep = []
        code, shape = fill(self, t, array, "", "put", keep)
        rid = ffi.new("uint64_t *")
        self._check(lib.gpucd_tensor_put(self._handle(), t, rid))
        return self._adopt(int(rid[0]), code, shape)

    def resident(self, ref):
        """A Resident for a tensor another connection made (a ResidentRef from its ref()):
        usable in every call, never freed by this client."""
        rid, dtype, shape = ref
        return Resident(self, int(rid), dtypes.code_of(dtype), shape, owned=False)

    def _adopt(self, rid, code, shape):
        r = Resident(self, rid, code, shape)
        self._residents[rid] = r
        return r

    def _tensor_get(self, res, out):
        t = ffi.new("gpucd_tensor *")
        keep = []
        code, shape = fill(self, t, out, "", "out", keep)
        if code != res.dtype_code or tuple(shape) != res.shape:
            raise invalid(f"out: {dtypes.NAME[code]} {tuple(shape)} for a resident "
                          f"{res.dtype} {res.shape}")
        if res._id == 0:
            raise invalid("the resident tensor was freed")
        self._check(lib.gpucd_tensor_get(self._handle(), res._id, t))

    def _resident_free(self, res, quiet=False):
        rid, res._id = res._id, 0
        if rid == 0 or self._c is None or os.getpid() != self._pid:
            return
        self._residents.pop(rid, None)
        rc = lib.gpucd_tensor_free(self._c, rid)
        if rc != 0 and not quiet:
            self._check(rc)

    _empty = staticmethod(empty)

    # ---- lifetime -----------------------------------------------------------------------------

    def close(self):
        """Frees this client's resident tensors and regions and closes the connection (once
        the last view of its regions is gone).  No other thread may be calling."""
        if self._c is None:
            return
        if os.getpid() == self._pid:
            for r in list(self._residents.values()):
                self._resident_free(r, quiet=True)
        for r in list(self._regions):
            r.close()
        self._c = None
        self._conn.release()

    def __del__(self):
        if getattr(self, "_c", None) is not None:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<gpucd.Client {self.url}{'' if self._c is not None else ', closed'}>"


__all__ = ["Client", "Region", "Timings"]
