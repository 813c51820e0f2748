"""libparity's policies on transformers models: patch(model, policy) gives a transformers
Qwen2/Qwen3/Llama model a policy's rounding points in plain torch operations, unpatch(model)
takes them away (patch.py); dump(...) writes a model's intermediates for the bisect (dump.py).

The submodules import torch and transformers; `import parity.hf` does not: each name imports
its module when it is first called. (Importing a submodule makes its name an attribute of this
package, the module in place of the function of that name: _load puts the functions back.)
"""
import importlib

__all__ = ["patch", "unpatch", "dump"]


def _load(name):
    module = importlib.import_module(__name__ + "." + name)
    globals().update(patch=patch, unpatch=unpatch, dump=dump)
    return module


def patch(model, policy):
    """See parity.hf.patch.patch."""
    return _load("patch").patch(model, policy)


def unpatch(model):
    """See parity.hf.patch.unpatch."""
    return _load("patch").unpatch(model)


def dump(*args, **kwargs):
    """See parity.hf.dump.dump."""
    return _load("dump").dump(*args, **kwargs)
