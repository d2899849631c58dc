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


# (code, class name, parent, extra base, doc): the one list of codes; each becomes a class.
# The client's own EINVAL is an InvalidArgument too: `except gpucd.InvalidArgument` catches the
# package's checks, the library's and the daemon's alike.
_CODES = (
    (-1, "ClientInvalidArgument", "InvalidArgument", None,
     "an argument is invalid (found before any request)"),
    (-2, "OutOfMemory", None, MemoryError, "out of memory in the client"),
    (-3, "Timeout", None, TimeoutError, "no reply within the client's timeout"),
    (-4, "ConnectionRefused", None, ConnectionError, "no daemon listens at the URL"),
    (-5, "ConnectionClosed", None, ConnectionError,
     "the connection was lost, or the client closed"),
    (-6, "SystemCallFailed", None, OSError, "a system call failed in the client"),
    (-7, "ProtocolError", None, None, "the reply is malformed"),
    (-8, "TransportError", None, ConnectionError, "another transport (nng) failure"),
    (-9, "AddressError", None, ValueError, "the URL is malformed or of an unsupported scheme"),
    (-10, "Untrusted", None, PermissionError, "the daemon runs as a uid not trusted"),
    (-101, "BadMessage", None, None, "the daemon could not decode the request"),
    (-102, "VersionMismatch", None, None, "the daemon speaks another protocol version"),
    (-103, "UnknownOperation", None, None, "the daemon does not know the operation"),
    (-104, "InvalidArgument", None, ValueError, "shapes, dtypes, options or their combination"),
    (-105, "OutOfRange", None, ValueError, "a byte range or a data value out of range"),
    (-106, "NotFound", None, LookupError, "unknown region or resident tensor"),
    (-107, "PermissionDenied", None, PermissionError, "region of another uid, or regions remotely"),
    (-108, "ResourceExhausted", None, None,
     "workspace, message size, in-flight, memory or a quota"),
    (-109, "Unavailable", None, None, "the daemon is draining or not ready"),
    (-110, "DeviceError", None, None, "the device failed while running the request"),
    (-111, "InternalError", None, None, "a daemon bug"),
    (-112, "MessageTooLarge", None, None, "the reply would exceed the daemon's message limit"),
)

BY_CODE = {}
BY_NAME = {}
# Classes without a parent in the list first, then those whose parent is made by then.
for _code, _name, _parent, _base, _doc in sorted(_CODES, key=lambda c: c[2] is not None):
    _first = Error if _parent is None else BY_NAME[_parent]
    _bases = (_first,) if _base is None else (_first, _base)
    BY_NAME[_name] = BY_CODE[_code] = type(_name, _bases,
                                           {"code": _code, "__doc__": _doc, "__module__": "gpucd"})
globals().update(BY_NAME)

NAMES = [name for _, name, _, _, _ in _CODES]


def error_for(code, message):
    """The exception for a negative code (an unknown one is a plain Error)."""
    cls = BY_CODE.get(code)
    if cls is None:
        return Error(message, code)
    return cls(message)


def invalid(message):
    """An argument the package refused before calling the library."""
    return BY_CODE[-1](message)
