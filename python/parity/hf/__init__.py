"""libparity meets transformers: patch(model, policy) / unpatch(model) give a transformers model
a libparity policy's rounding points (parity.hf.patch), and dump(model, input_ids, path) writes
the intermediates of its forward for parity.bisect (parity.hf.dump). Both need PyTorch and
transformers, imported only when called, so `import parity.hf` works without them."""
import importlib


def _function(name):
    """The function NAME of the submodule parity.hf.NAME, imported on first use. Importing a
    submodule binds the package's attribute NAME to the module; it is bound back to the
    function of this file, so that parity.hf.NAME(...) keeps working."""
    function = getattr(importlib.import_module("." + name, __name__), name)
    globals()[name] = _WRAPPERS[name]
    return function


def patch(model, policy):
    """parity.hf.patch.patch: see there."""
    return _function("patch")(model, policy)


def unpatch(model):
    """parity.hf.patch.unpatch: see there."""
    from .patch import unpatch as function
    globals()["patch"] = _WRAPPERS["patch"]
    return function(model)


def dump(model, input_ids, path, *, engine=None):
    """parity.hf.dump.dump: see there."""
    return _function("dump")(model, input_ids, path, engine=engine)


_WRAPPERS = {"patch": patch, "dump": dump}
__all__ = ["patch", "unpatch", "dump"]
