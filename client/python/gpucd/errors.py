"""gpucd.Error and one subclass per code of gpucd.h, each carrying the code and the message."""
from ._ffi import ffi, lib


class Error(Exception):
    """A gpucd call failed: `code` is the GPUCD_E* value (negative), `message` what the client
    library or the daemon said, `strerror` the code's short name."""

    code = 0

    def __init__(self, message, code=None):
        if code is not None:
            self.code = code
        self.message = message
        self.strerror = ffi.string(lib.gpucd_strerror(self.code)).decode()
        super().__init__(f"{message} [{self.strerror}]" if message else self.strerror)


# (code, class name, extra base, doc): the one list of codes; each becomes a class below.
_CODES = (
    (-1, "ClientInvalidArgument", ValueError, "an argument is invalid (found before any request)"),
    (-2, "OutOfMemory", MemoryError, "out of memory in the client"),
    (-3, "Timeout", TimeoutError, "no reply within the client's timeout"),
    (-4, "ConnectionRefused", ConnectionError, "no daemon listens at the URL"),
    (-5, "ConnectionClosed", ConnectionError, "the connection was lost, or the client closed"),
    (-6, "SystemCallFailed", OSError, "a system call failed in the client"),
    (-7, "ProtocolError", None, "the reply is malformed"),
    (-8, "TransportError", ConnectionError, "another transport (nng) failure"),
    (-9, "AddressError", ValueError, "the URL is malformed or of an unsupported scheme"),
    (-10, "Untrusted", PermissionError, "the daemon runs as a uid not trusted"),
    (-101, "BadMessage", None, "the daemon could not decode the request"),
    (-102, "VersionMismatch", None, "the daemon speaks another protocol version"),
    (-103, "UnknownOperation", None, "the daemon does not know the operation"),
    (-104, "InvalidArgument", ValueError, "shapes, dtypes, options or their combination"),
    (-105, "OutOfRange", ValueError, "a byte range or a data value out of range"),
    (-106, "NotFound", LookupError, "unknown region or resident tensor"),
    (-107, "PermissionDenied", PermissionError, "region of another uid, or regions remotely"),
    (-108, "ResourceExhausted", None, "workspace, message size, in-flight, memory or a quota"),
    (-109, "Unavailable", None, "the daemon is draining or not ready"),
    (-110, "DeviceError", None, "the device failed while running the request"),
    (-111, "InternalError", None, "a daemon bug"),
    (-112, "MessageTooLarge", None, "the reply would exceed the daemon's message limit"),
)

BY_CODE = {}
for _code, _name, _base, _doc in _CODES:
    _bases = (Error,) if _base is None else (Error, _base)
    BY_CODE[_code] = type(_name, _bases, {"code": _code, "__doc__": _doc, "__module__": "gpucd"})
    globals()[_name] = BY_CODE[_code]
# The client's own EINVAL is an InvalidArgument too: `except gpucd.InvalidArgument` catches the
# package's checks, the library's and the daemon's alike.
ClientInvalidArgument.__bases__ = (InvalidArgument,)  # noqa: F821 (made above)

NAMES = [name for _, name, _, _ in _CODES]


def error_for(code, message):
    """The exception for a negative code (an unknown one is a plain Error)."""
    cls = BY_CODE.get(code)
    if cls is None:
        return Error(message, code)
    return cls(message)


def invalid(message):
    """An argument the package refused before calling the library."""
    return BY_CODE[-1](message)

__all__ = ["Error", *NAMES]
