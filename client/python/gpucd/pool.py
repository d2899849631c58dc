"""gpucd.Pool: calls spread over several daemons, and moved to another when theirs is down.

    pool = gpucd.Pool(["tls+tcp://gpu-a:7070", "tls+tcp://gpu-b:7070"], tls_ca=..., ...)
    loss = pool.run(lambda c: c.linear_cross_entropy(E, C, targets, dE=True))

The C library's gpucd_pool underneath (docs/clients.md#a-pool-of-daemons): run(fn) calls fn with
the client of the daemon that is up with the fewest calls in flight, and again with another
daemon's when the one it ran on was down.  fn may therefore run more than once: it passes numpy
arrays or torch CPU tensors only (regions and resident tensors belong to one daemon: the library
refuses them inside fn) and returns what its last run computed.
"""
import os
import weakref

from ._ffi import ffi, lib
from .client import Client, _string, options_fill
from .errors import Error, error_for, invalid


_EINVAL = -1  # GPUCD_EINVAL: a failure of the caller's own, which the pool never retries


class _Lent(Client):
    """A daemon's client lent by the pool for one run: host tensors only, closed by the pool."""

    def __init__(self, ptr):  # not Client's: the pool made the connection
        self.url = "a daemon of the pool"
        self._pid = os.getpid()
        self._conn = None
        self._c = ptr
        self._regions = []
        self._residents = weakref.WeakValueDictionary()

    def close(self):
        self._c = None


class _Run:
    """One run's function, and what its last run returned or raised."""

    __slots__ = ("fn", "value", "error")

    def __init__(self, fn):
        self.fn, self.value, self.error = fn, None, None


@ffi.callback("int(gpucd_client *, void *)")
def _call(ptr, handle):
    run = ffi.from_handle(handle)
    client = _Lent(ptr)
    try:
        run.value, run.error = run.fn(client), None
        return 0
    except Error as e:  # the code tells the pool whether to run it again elsewhere
        run.error = e
        return e.code
    except BaseException as e:
        run.error = e  # not gpucd's: raised as it is, never run again
        return _EINVAL
    finally:
        client.close()


class Pool:
    """A pool of gpucd daemons (urls: ipc://, tcp://, tls+tcp://), each connected with Client's
    options.  probe_min, probe_max: seconds before a down daemon's first probe, and the most
    between two; probe_timeout: seconds a probe waits."""

    def __init__(self, urls, timeout=30.0, spin_us=0, *, client_name="gpucd-python",
                 max_reply_bytes=0, tls_ca=None, tls_cert=None, tls_key=None, trust_uid=None,
                 probe_min=0.1, probe_max=5.0, probe_timeout=2.0):
        if isinstance(urls, (str, bytes)):
            raise invalid("urls: a list of URLs, not one string")
        self.urls = [str(u) for u in urls]
        opts = ffi.new("gpucd_pool_options *")
        lib.gpucd_pool_options_init(opts)
        keep = options_fill(opts.client, timeout, spin_us, client_name, max_reply_bytes, tls_ca,
                            tls_cert, tls_key, trust_uid)
        for field, seconds in (("probe_min_ms", probe_min), ("probe_max_ms", probe_max),
                               ("probe_timeout_ms", probe_timeout)):
            ms = int(round(seconds * 1000))
            if ms <= 0:
                raise invalid(f"{field[:-3]} {seconds!r}: must be positive seconds")
            setattr(opts, field, ms)
        c_urls = [ffi.new("char[]", u.encode()) for u in self.urls]
        out = ffi.new("gpucd_pool **")
        rc = lib.gpucd_pool_open(ffi.new("const char *[]", c_urls), len(c_urls), opts, out)
        del keep
        if rc != 0:
            raise error_for(rc, _string(lib.gpucd_errmsg(ffi.NULL)))
        self._p = out[0]

    def run(self, fn):
        """fn(client) on the least busy daemon that is up, again on another when that one was
        down; returns what fn returned."""
        if self._p is None:
            raise invalid("the pool is closed")
        run = _Run(fn)
        rc = lib.gpucd_pool_run(self._p, _call, ffi.new_handle(run))
        if rc == 0:
            return run.value
        if run.error is not None and not isinstance(run.error, Error):
            raise run.error
        raise error_for(rc, _string(lib.gpucd_errmsg(ffi.NULL)))

    def stats(self):
        """Each daemon as the pool sees it: a list of dicts (url, up, last_error, calls,
        failures, retries, downs, in_flight, connected)."""
        if self._p is None:
            raise invalid("the pool is closed")
        s = ffi.new("gpucd_pool_daemon *")
        result = []
        for i in range(lib.gpucd_pool_size(self._p)):
            if lib.gpucd_pool_stats(self._p, i, s) != 0:
                raise error_for(_EINVAL, _string(lib.gpucd_errmsg(ffi.NULL)))
            result.append({"url": _string(s.url), "up": bool(s.up), "last_error": s.last_error,
                           "calls": s.calls, "failures": s.failures, "retries": s.retries,
                           "downs": s.downs, "in_flight": s.in_flight,
                           "connected": bool(s.connected)})
        return result

    def close(self):
        """Stops the pool's thread and closes every connection.  No other thread may be in run."""
        if self._p is not None:
            lib.gpucd_pool_close(self._p)
            self._p = None

    def __del__(self):
        if getattr(self, "_p", None) is not None:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<gpucd.Pool {len(self.urls)} daemons{'' if self._p is not None else ', closed'}>"


__all__ = ["Pool"]
