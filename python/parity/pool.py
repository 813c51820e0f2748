"""parity.Pool: a libparity thread pool (parity_pool) for the calls that take one (parity.torch's
kernel calls, the manifests' checksums, the weight update), and the default thread count."""
import ctypes
import os

from . import _lib
from ._lib import ParityError, lib


def _default_threads():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Pool(_lib.Closing):
    """A libparity thread pool (parity_pool) for the kernel calls (parity.torch) and the
    manifests' checksums; threads 1..256, the calling thread included (None = the CPUs this
    process may use). The bits never depend on it."""

    def __init__(self, threads=None):
        self.threads = _default_threads() if threads is None else \
            _lib.as_int(threads, "threads", 1, 256)
        self._handle = None
        h = _lib.pool_p()
        lib.parity_pool_create(self.threads, ctypes.byref(h))
        self._handle = h

    @property
    def handle(self):
        if self._handle is None:
            raise ParityError(_lib.ERR_INVALID_ARGUMENT, "the pool is closed")
        return self._handle

    def close(self):
        h, self._handle = self._handle, None
        if h:
            lib.parity_pool_free(h)
