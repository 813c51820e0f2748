"""libparity from Python: bf16 forward passes of Qwen-family models with every rounding point
chosen by a precision policy, a sampler and a scorer (learner) that return bitwise-identical
log-probs.

    import parity
    with parity.Model("synthetic:tiny") as m:
        lp = m.score([[1, 2, 3, 4]], policy="aligned")          # [[lp1, lp2, lp3]]
        with m.sampler(policy="aligned") as s:
            for c in s.generate([1, 2, 3], n=4, max_tokens=16, seed=7):
                print(c.index, c.tokens, c.logprobs, c.finish_reason)

Pure Python on the standard library (ctypes); numpy arrays are accepted and returned where
given, and parity.torch (imported separately, needs PyTorch) holds the policies' region
semantics on torch tensors. The shared library is found through PARITY_LIBRARY, then the
repository's build tree, then installed locations and the system's search (see parity._lib);
its ABI, structs and enumerations are checked at import.
"""
from . import _lib, quant, regions
from ._lib import (ABI_VERSION, LIBRARY_PATH, MANIFEST_VERSION, MASTERS, MAX_STOP, ParityError,
                   lib, status_name)
from .manifest import write_manifest
from ._routes import Routes
from .model import Model, Scores
from .pool import Pool
from .policy import CHOICES, Policy, policies
from .recipes import Recipe, recipes
from .sampler import Completion, DepthSchedule, Sampler, Step

__all__ = ["Model", "Sampler", "Completion", "DepthSchedule", "Step", "Scores", "Routes", "Policy", "ParityError",
           "policies", "Recipe", "recipes", "quant", "regions", "version", "backends", "cpu_path", "cpu_paths", "set_cpu_path",
           "set_log_callback", "builtin_configs", "bf16_from_f32", "bf16_to_f32", "ABI_VERSION",
           "LIBRARY_PATH", "CHOICES", "MAX_STOP", "status_name", "write_manifest",
           "MANIFEST_VERSION", "MASTERS", "Pool"]

__version__ = lib.parity_version().decode()


def version():
    """The loaded library's version string ("0.1.0")."""
    return lib.parity_version().decode()


def cpu_path():
    """The kernel path the library runs: "portable", "avx2", "avx512" or "avx512bf16"."""
    return lib.parity_cpu_path_name(lib.parity_get_cpu_path()).decode()


def set_cpu_path(name):
    """Forces a kernel path (one of cpu_paths(): "portable", "avx2", "avx512", "avx512bf16") for
    the whole process; results never depend on it. Call it while no other thread is inside the
    library. Raises ParityError (PARITY_ERR_UNSUPPORTED) if this CPU lacks the path."""
    if name not in _lib.CPU_PATHS:
        raise ParityError(_lib.ERR_INVALID_ARGUMENT, "cpu path must be one of %s, not %r"
                          % (", ".join(_lib.CPU_PATHS), name))
    lib.parity_set_cpu_path(_lib.CPU_PATHS[name])


def cpu_paths():
    """The kernel paths the library has, as it names them (["portable", "avx2", "avx512",
    "avx512bf16"]), whether or not this CPU runs them."""
    return list(_lib.CPU_PATHS)


def backends():
    """The GEMM backends this build, CPU and OS run, as the library names them: "bf16" always,
    "openblas" unless the library was built without OpenBLAS, "amx" where the CPU has AMX-BF16
    and the OS grants the tile state (parity_backend_check)."""
    runs = []
    for name, value in _lib.BACKENDS.items():
        try:
            lib.parity_backend_check(value)
        except ParityError:
            continue
        runs.append(name)
    return runs


def builtin_configs():
    """Names of the built-in configs usable as "synthetic:NAME[:SEED]"."""
    from ._lib import null_terminated
    return null_terminated(lib.parity_config_builtin_names())


def bf16_from_f32(x):
    """The bf16 bit pattern (int) of a float rounded to float32 then to bf16 (RNE)."""
    return lib.parity_bf16_from_f32(x)


def bf16_to_f32(bits):
    """The float value of a bf16 bit pattern (exact)."""
    return lib.parity_bf16_to_f32(bits)


_LEVELS = ("error", "warn", "info", "debug")
_log_callback = None  # keeps the ctypes callback alive


def set_log_callback(fn):
    """Routes the library's log messages to fn(level, message) (level "error", "warn",
    "info" or "debug"); None stops them. Process-wide; fn may be called from any thread that
    calls into the library. Exceptions raised by fn are printed and ignored."""
    global _log_callback
    from ._lib import parity_log_fn
    if fn is None:
        cb = parity_log_fn()
    else:
        def cb_py(level, message, user):
            fn(_LEVELS[level] if 0 <= level < len(_LEVELS) else str(level),
               message.decode("utf-8", "replace"))
        cb = parity_log_fn(cb_py)
    lib.parity_set_log_callback(cb, None)
    _log_callback = cb
