"""Precision policies: one switch per bf16 rounding point (fp16 under compute "fp16").

A policy is given to the library either by name ("aligned", "hf-eager+aligned",
"vllm+fp32-head", "hf-eager+fp16", ...: see policies()) or as a Policy whose attributes are
the switches.
"""
import ctypes

from . import _lib
from ._lib import POLICY_FIELDS, ParityError, lib

#: The values of each switch, by name, in the order of their C values (0, 1, 2).
CHOICES = {
    "compute": ("bf16", "fp32", "fp16"),
    "norm_input": ("rounded", "fp32"),
    "norm_weight": ("round-twice", "round-once"),
    "qk_norm": ("round-twice", "round-once"),
    "rope_table": ("bf16", "fp32"),
    "rope_apply": ("per-op", "fused"),
    "swiglu": ("per-op", "fused"),
    "attention": ("eager", "flash", "fp32"),
    "logits": ("bf16", "fp32"),
    "temperature": ("bf16", "fp32"),
    "gemm": ("bf16", "fp8-block", "mxfp8", "nvfp4", "mxfp4", "ternary"),
    # The quantizers of every format in one list, so a name picks one value whatever the gemm
    # switch: the library's names where they are unique, qualified where two formats share one
    # (the library's "te" of MXFP8 is "te-rceil" here, NVFP4's "te" is "te-nvfp4", MXFP4's "ocp"
    # is "ocp-mxfp4"); parity_quantizer_name gives the library's.
    "quantizer": ("deepseek", "sglang", "te", "deepgemm", "te-pow2", "ocp", "te-rceil",
                  "modelopt", "te-nvfp4", "torchao", "ocp-mxfp4", "rceil", "microxcaling",
                  "bitnet", "hf-bitlinear", "onebitllms", "te-2d"),
    "exit_dist": ("model", "fp32"),
    "moe_router": ("hf", "vllm", "sglang", "topk-softmax"),
    "moe_weights": ("rounded", "fp32"),
    "moe_combine": ("hf", "vllm", "sglang", "fp32"),
}


def policies():
    """The preset names, as the library knows them: ["fp32", "hf-eager", "hf-sdpa", ...].

    Any preset may be followed by the modifiers "+aligned", "+fp32-head" and "+fp16" (every
    bf16 rounding point rounds to fp16; not on "fp32")."""
    return _lib.null_terminated(lib.parity_policy_preset_names())


class Policy:
    """A precision policy: one attribute per rounding point (parity_policy in parity.h).

    Each switch holds an int, the C value; it may be set from the int or from its name in
    CHOICES[switch] (e.g. ``Policy(swiglu="fused")``). Switches not given are 0, which is
    exactly the "hf-eager" preset. ``Policy.from_name("aligned")`` reads a preset.

    Values are checked when the policy reaches the library: an undefined value raises
    ParityError (PARITY_ERR_POLICY); a value of the wrong type raises TypeError at once.
    """

    __slots__ = POLICY_FIELDS

    def __init__(self, **switches):
        for field in POLICY_FIELDS:
            object.__setattr__(self, field, 0)
        for field, value in switches.items():
            setattr(self, field, value)

    def __setattr__(self, field, value):
        if field not in CHOICES:
            raise AttributeError("Policy has no switch %r (switches: %s)"
                                 % (field, ", ".join(POLICY_FIELDS)))
        if isinstance(value, str):
            try:
                value = CHOICES[field].index(value)
            except ValueError:
                raise ParityError(_lib.ERR_POLICY, "policy switch %s has no value %r (values: %s)"
                                  % (field, value, ", ".join(CHOICES[field]))) from None
        elif isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError("policy switch %s must be an int or one of %s, not %s"
                            % (field, CHOICES[field], type(value).__name__))
        value = value.__index__()
        if not 0 <= value <= 255:
            raise ParityError(_lib.ERR_POLICY, "policy switch %s = %d is not defined (0..%d)"
                              % (field, value, len(CHOICES[field]) - 1))
        object.__setattr__(self, field, value)

    @classmethod
    def from_name(cls, name):
        """The policy of a preset name with optional modifiers ("hf-eager+aligned").

        Raises ParityError (PARITY_ERR_POLICY) for an unknown name."""
        c = policy_struct(name)
        return cls(**{f: getattr(c, f) for f in POLICY_FIELDS})

    def replace(self, **switches):
        """A copy with some switches changed."""
        p = Policy(**{f: getattr(self, f) for f in POLICY_FIELDS})
        for field, value in switches.items():
            setattr(p, field, value)
        return p

    def names(self):
        """The switches as {switch: value name} (an undefined value shows as its int)."""
        out = {}
        for f in POLICY_FIELDS:
            v = getattr(self, f)
            out[f] = CHOICES[f][v] if v < len(CHOICES[f]) else v
        return out

    def _struct(self):
        c = _lib.parity_policy(*(getattr(self, f) for f in POLICY_FIELDS))
        lib.parity_policy_validate(ctypes.byref(c))
        return c

    def __eq__(self, other):
        if not isinstance(other, Policy):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in POLICY_FIELDS)

    __hash__ = None  # mutable

    def __repr__(self):
        return "Policy(%s)" % ", ".join("%s=%r" % kv for kv in self.names().items())


_by_name = {}


def policy_struct(policy):
    """A validated parity_policy struct from a name or a Policy (cached by name).

    Raises ParityError (PARITY_ERR_POLICY) for an unknown name or an undefined switch value,
    TypeError for anything that is neither a str nor a Policy."""
    if isinstance(policy, str):
        c = _by_name.get(policy)
        if c is None:
            c = _lib.parity_policy()
            lib.parity_policy_from_name(policy.encode(), ctypes.byref(c))
            _by_name[policy] = c
        return c
    if isinstance(policy, Policy):
        return policy._struct()
    raise TypeError("policy must be a preset name (str) or a parity.Policy, not %s"
                    % type(policy).__name__)
