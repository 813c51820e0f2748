"""libparity's policies on transformers models: patch(model, policy) gives a transformers
Qwen2/Qwen3/Llama (or Qwen3-MoE/Qwen2-MoE) model a policy's rounding points in plain torch
operations, unpatch(model) takes them away (_patch.py); dump(model, input_ids, path) writes the
intermediates of its forward for parity.bisect (_dump.py).

The private submodules import torch and transformers; `import parity.hf` does not: each function
imports its module when it is first called.
"""

__all__ = ["patch", "unpatch", "patched_policy", "dump"]


def patch(model, policy):
    """See parity.hf._patch.patch."""
    from ._patch import patch as function
    return function(model, policy)


def unpatch(model):
    """See parity.hf._patch.unpatch."""
    from ._patch import unpatch as function
    return function(model)


def patched_policy(model):
    """See parity.hf._patch.patched_policy."""
    from ._patch import patched_policy as function
    return function(model)


def dump(model, input_ids, path, *, engine=None):
    """See parity.hf._dump.dump."""
    from ._dump import dump as function
    return function(model, input_ids, path, engine=engine)
