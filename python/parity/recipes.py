"""Training recipes: the formats of a linear layer's three GEMMs, beside the precision policy.

A policy says how the forward quantizes (its gemm switch and quantizer), which the sampler and
the learner share bit for bit. A recipe adds what a low-precision trainer does in the backward.
A linear layer y = x W^T (x [tokens, in], W [out, in], dy = dL/dy [tokens, out]) runs three
GEMMs, each written as the library's y = a b^T with both operands quantized along the GEMM's
reduction dimension (parity_quant_gemm, include/parity_ops.h):

    fprop  y  = x W^T        a = x   (row-wise: along in),      b = W   (row-wise: along in)
    dgrad  dx = dy W         a = dy  (row-wise: along out),     b = W^T (W column-wise: along out)
    wgrad  dW = dy^T x       a = dy^T (dy column-wise: along tokens),
                             b = x^T (x column-wise: along tokens)

"Column-wise" quantizes the transpose with the same rule (transposing values is exact), so a
tensor that two GEMMs read is quantized twice, once per direction, from its fp32 values, as
TransformerEngine does ("both versions are computed from the high precision input to avoid
double quantization errors", common/recipe/__init__.py, MXFP8BlockScaling's docstring).

Each operand names its element type (e4m3, e5m2, e2m1), its block shape as (rows, cols) of the
operand as the GEMM reads it (1 x 32: MX; 1 x 16 and 16 x 16: NVFP4), the quantizer rule (the
policy's names, parity.CHOICES["quantizer"]), its global scale (NVFP4: per row or per tensor),
the rounding (nearest, or stochastic from a counter-based generator) and transforms (the random
Hadamard transform "rht16" along the reduction dimension). Recipe(name).table() prints it.

A recipe's fprop must be the policy's quantized GEMM: its forward is parity_linear under the
policy, bitwise the sampler's, so log-probs stay bitwise equal; check_policy refuses any other.
"""
from ._lib import lib
from .policy import CHOICES, policy_struct

__all__ = ["Operand", "Gemm", "Recipe", "recipes"]

_ELEMENTS = ("e4m3", "e5m2", "e2m1")
_ROUNDINGS = ("nearest", "stochastic")
_TE = "TransformerEngine (github.com/NVIDIA/TransformerEngine @ d0067d0)"


class Operand:
    """One operand of one GEMM: `tensor` ("x", "w", "dy") read `orientation` ("row-wise": the
    stored tensor; "column-wise": its transpose), quantized in blocks of `block` (rows, cols)
    along the reduction dimension (the operand's rows) with `element` codes, the policy quantizer
    `quantizer`, `rounding`, global scales `globals` (NVFP4: "per-row" or "per-tensor"; None for
    MX) and `transform` (None or "rht16")."""

    __slots__ = ("tensor", "orientation", "element", "block", "quantizer", "rounding", "globals",
                 "transform")

    def __init__(self, tensor, orientation, element, block, quantizer, rounding="nearest",
                 globals=None, transform=None):
        if tensor not in ("x", "w", "dy") or orientation not in ("row-wise", "column-wise"):
            raise ValueError("operand %r %r: tensor is x, w or dy; orientation row-wise or "
                             "column-wise" % (tensor, orientation))
        if element not in _ELEMENTS or rounding not in _ROUNDINGS:
            raise ValueError("operand %s: element %r (one of %s), rounding %r (one of %s)"
                             % (tensor, element, ", ".join(_ELEMENTS), rounding,
                                ", ".join(_ROUNDINGS)))
        self.tensor, self.orientation, self.element = tensor, orientation, element
        self.block, self.quantizer, self.rounding = tuple(block), quantizer, rounding
        self.globals, self.transform = globals, transform

    @property
    def format(self):
        """"mxfp8" (E4M3 or E5M2 in 1 x 32 blocks, E8M0 scales) or "nvfp4"."""
        return "nvfp4" if self.element == "e2m1" else "mxfp8"

    def describe(self):
        what = self.tensor + ("^T" if self.orientation == "column-wise" else "")
        parts = ["%s %s" % (what, self.element.upper()), "%dx%d" % self.block, self.orientation,
                 self.quantizer, self.rounding]
        if self.globals:
            parts.append("global " + self.globals)
        if self.transform:
            parts.append(self.transform.upper())
        return ", ".join(parts)

    def __eq__(self, other):
        return isinstance(other, Operand) and all(getattr(self, s) == getattr(other, s)
                                                  for s in self.__slots__)

    __hash__ = None

    def __repr__(self):
        return "Operand(%s)" % self.describe()


class Gemm:
    """One of the three GEMMs: its name ("fprop", "dgrad", "wgrad"), operands a and b of
    y = a b^T, and the lines of the trainer it follows."""

    __slots__ = ("name", "a", "b", "cite")

    def __init__(self, name, a, b, cite):
        if a.format != b.format:
            raise ValueError("%s: operands of one format (a %s, b %s)" % (name, a.format,
                                                                           b.format))
        self.name, self.a, self.b, self.cite = name, a, b, cite

    @property
    def format(self):
        return self.a.format


_FORMULA = {"fprop": "y = x W^T", "dgrad": "dx = dy W", "wgrad": "dW = dy^T x"}


class Recipe:
    """A training recipe by name (recipes() lists them): .fprop, .dgrad, .wgrad (Gemm),
    .policy_gemm and .policy_quantizer (what the policy's forward must be), .cite."""

    def __init__(self, name):
        row = _TABLE.get(name)
        if row is None:
            raise ValueError("unknown recipe %r (recipes: %s)" % (name, ", ".join(_TABLE)))
        self.name = name
        self.summary, self.policy_gemm, self.policy_quantizer, self.needs, gemms, self.cite = row
        self.fprop, self.dgrad, self.wgrad = gemms

    def gemms(self):
        return (self.fprop, self.dgrad, self.wgrad)

    def missing(self):
        """What this recipe needs that the loaded library lacks: its functions ("name()") and
        the policy quantizers its operands name ([] when it runs)."""
        out = [f + "()" for f in self.needs if not hasattr(lib, f)]
        for q in sorted({o.quantizer for g in self.gemms() for o in (g.a, g.b)}):
            if q not in CHOICES["quantizer"]:
                out.append("the quantizer %r (parity.CHOICES['quantizer'])" % q)
        return out

    def check_policy(self, policy):
        """Raises ValueError unless `policy` (a name or a Policy) runs this recipe's fprop: its
        gemm switch and quantizer are the recipe's, so that the learner's forward under the
        recipe is the sampler's quantized GEMM bit for bit. Also refuses a recipe whose
        library functions are missing."""
        missing = self.missing()
        if missing:
            raise ValueError("recipe %s needs %s, which this libparity lacks"
                             % (self.name, ", ".join(missing)))
        c = policy_struct(policy)
        gemm = CHOICES["gemm"][c.gemm]
        quantizer = CHOICES["quantizer"][c.quantizer] if gemm != "bf16" else None
        if (gemm, quantizer) != (self.policy_gemm, self.policy_quantizer):
            spelled = _policy_spelling(self.policy_gemm, self.policy_quantizer)
            raise ValueError(
                "recipe %s's fprop is %s with quantizer %s; policy %s runs its linear layers in "
                "%s: the learner's forward would not be the sampler's (use a policy with "
                "\"%s\", e.g. \"aligned%s\")"
                % (self.name, self.policy_gemm, self.policy_quantizer,
                   repr(policy) if isinstance(policy, str) else "given",
                   gemm if quantizer is None else "%s with quantizer %s" % (gemm, quantizer),
                   spelled, spelled))

    def table(self):
        """The recipe as text: one line per GEMM and operand, with the lines it follows."""
        lines = ["recipe %s: %s" % (self.name, self.summary),
                 "  policy: gemm %s, quantizer %s" % (self.policy_gemm, self.policy_quantizer)]
        for g in self.gemms():
            lines.append("  %-5s %-12s (%s)" % (g.name, _FORMULA[g.name], g.format))
            lines.append("        a: " + g.a.describe())
            lines.append("        b: " + g.b.describe())
            lines.append("        follows: " + g.cite)
        lines.append("  sources: " + self.cite)
        return "\n".join(lines)

    def __repr__(self):
        return "Recipe(%r)" % self.name


def _policy_spelling(gemm, quantizer):
    """The policy-string modifier of a gemm and a CHOICES quantizer name ("+mxfp8:te" for
    "te-rceil": the library's name of the rule within its format)."""
    name = lib.parity_quantizer_name(CHOICES["quantizer"].index(quantizer))
    return "+%s:%s" % (gemm, name.decode())


def recipes():
    """The recipe names: ["te-mxfp8", "te-mxfp8-hybrid", "te-nvfp4"]."""
    return list(_TABLE)


# ---- the table -----------------------------------------------------------------------------

def _mx(tensor, orientation, element):
    """An MXFP8 operand: 1 x 32 blocks along the reduction dimension, TE's RCEIL rule (the
    policy's "te-rceil": E8M0 = float_to_e8m0(amax * max_norm_rcp), rounded up), nearest."""
    return Operand(tensor, orientation, element, (1, 32), "te-rceil")


_MX_FPROP = ("TE pytorch/module/linear.py _Linear forward: general_gemm(weightmat, "
             "inputmat_total, ...) under 'Note: y = x * w^T', both quantized row-wise "
             "(input_quantizer.set_usage(rowwise=True, ...))")
_MX_DGRAD = ("TE pytorch/module/linear.py backward: general_gemm(weight_for_dgrad, grad_output, "
             "layout=\"NN\", ...); 'Note: dgrad GEMM requires row-wise usage, wgrad GEMM "
             "requires column-wise usage' (of grad_output); the weight's columnwise data "
             "(weight_fp8.update_usage(columnwise_usage=True))")
_MX_WGRAD = ("TE pytorch/module/linear.py backward: wgrad_gemm -> general_gemm(x, dy, "
             "layout=\"NT\", ...) on inputmat_total and grad_output in columnwise usage "
             "(inputmat_total.update_usage(columnwise_usage=True))")

_MXFP8_CITE = (
    _TE + ": common/recipe/__init__.py MXFP8BlockScaling (1x32 blocks, E8M0 scales; "
    "fp8_format: Format = Format.E4M3, the default); pytorch/quantization.py "
    "MXFP8BlockScalingRecipeState.__init__: self.dtype = get_fp8_te_dtype(recipe, mode == "
    "\"forward\"), and get_fp8_te_dtype returns kFloat8E4M3 for Format.E4M3 in every mode; "
    "common/cast/mxfp8/quantize_mxfp8.cuh: float_to_e8m0(thread_amax * "
    "Quantized_Limits<OType>::max_norm_rcp), then in * exp2f_rcp(biased_exponent) cast to "
    "OType (the policy's MXFP8 \"te\" rule, parity_quant.h)")
_HYBRID_CITE = (
    _TE + ": common/recipe/__init__.py Format.HYBRID = _FormatHelper(max_fwd=E4M3.max_fwd, "
    "max_bwd=E5M2.max_bwd) ('FP8 tensors in the forward pass are in e4m3 format, FP8 tensors "
    "in the backward pass are in e5m2 format'); pytorch/quantization.py get_fp8_te_dtype: "
    "E4M3 if fp8_format == E4M3 or (HYBRID and fprop_tensor), else kFloat8E5M2, with "
    "fprop_tensor = (mode == \"forward\") in MXFP8BlockScalingRecipeState: the forward-mode "
    "quantizers (input, weight, also their columnwise copies the backward reads) are E4M3, the "
    "backward-mode ones (grad_output) E5M2; the E5M2 cast as the E4M3 one with "
    "Quantized_Limits<fp8e5m2> (common/utils.cuh: max_norm 57344, max_norm_rcp = 1.0 / "
    "max_norm): parity_mxfp8_quantize_as")

# The NVFP4 recipe's 16 x 16 weight rule in the policy (the forward the sampler runs): NVQ's
# rule, by its policy name.
NVFP4_WEIGHT_2D_QUANTIZER = "te-2d"

_NVFP4_CITE = (
    _TE + ": common/recipe/__init__.py NVFP4BlockScaling.__post_init__: fp4_quant_fwd_inp = "
    "QParams(random_hadamard_transform=not disable_rht, stochastic_rounding=False, "
    "fp4_2d_quantization=False); fp4_quant_fwd_weight = QParams(random_hadamard_transform="
    "False, stochastic_rounding=False, fp4_2d_quantization=not disable_2d_quantization); "
    "fp4_quant_bwd_grad = QParams(random_hadamard_transform=not disable_rht, "
    "stochastic_rounding=not disable_stochastic_rounding, ...), with 'Note: RHT is currently "
    "only applied to column-wise usage so that it can be used for wgrad GEMM'; "
    "row_scaled_activation (NVTE_NVFP4_ROW_SCALED_ACTIVATION: 'forward activation quantizers "
    "emit row-scaled NVFP4 tensors'), the library's per-token s2 of the forward; "
    "pytorch/quantization.py NVFP4BlockScalingRecipeState._qparams: grad_output -> "
    "fp4_quant_bwd_grad, weight -> fp4_quant_fwd_weight, else fp4_quant_fwd_inp")


def _mx_recipe(summary, gradient, cite):
    """A row of an MXFP8 recipe: E4M3 x and W in every GEMM, the gradient dy in `gradient`."""
    return (summary, "mxfp8", "te-rceil", ("parity_mxfp8_quantize_as", "parity_quant_gemm"),
            (Gemm("fprop", _mx("x", "row-wise", "e4m3"), _mx("w", "row-wise", "e4m3"),
                  _MX_FPROP),
             Gemm("dgrad", _mx("dy", "row-wise", gradient), _mx("w", "column-wise", "e4m3"),
                  _MX_DGRAD),
             Gemm("wgrad", _mx("dy", "column-wise", gradient), _mx("x", "column-wise", "e4m3"),
                  _MX_WGRAD)),
            cite)


def _nv(tensor, orientation, block, quantizer="te-nvfp4", rounding="nearest",
        globals="per-tensor", transform=None):
    return Operand(tensor, orientation, "e2m1", block, quantizer, rounding, globals, transform)


_TABLE = {
    "te-mxfp8": _mx_recipe(
        "TE MXFP8BlockScaling(fp8_format=Format.E4M3): E4M3 in 1x32 blocks along each GEMM's "
        "reduction dimension in all three GEMMs, RCEIL E8M0 scales, round to nearest",
        "e4m3", _MXFP8_CITE),
    "te-mxfp8-hybrid": _mx_recipe(
        "TE MXFP8BlockScaling(fp8_format=Format.HYBRID): as te-mxfp8 with the gradient dy in "
        "E5M2 (both backward GEMMs), x and W in E4M3",
        "e5m2", _MXFP8_CITE + "; " + _HYBRID_CITE),
    "te-nvfp4": (
        "TE NVFP4BlockScaling(): E2M1 with E4M3 block scales and fp32 globals; weights in 16x16 "
        "blocks (W and W^T share codes), activations and gradients in 1x16 blocks; gradients "
        "rounded stochastically (counter-based generator); the random Hadamard transform on "
        "both wgrad inputs",
        "nvfp4", NVFP4_WEIGHT_2D_QUANTIZER,
        ("parity_nvfp4_quantize_2d", "parity_nvfp4_quantize_sr", "parity_rht16",
         "parity_quant_gemm"),
        (Gemm("fprop", _nv("x", "row-wise", (1, 16), globals="per-row"),
              _nv("w", "row-wise", (16, 16), NVFP4_WEIGHT_2D_QUANTIZER),
              "TE fp4_quant_fwd_inp (no RHT on row-wise usage) and fp4_quant_fwd_weight "
              "(fp4_2d_quantization): the policy's forward"),
         Gemm("dgrad", _nv("dy", "row-wise", (1, 16), rounding="stochastic"),
              _nv("w", "column-wise", (16, 16), NVFP4_WEIGHT_2D_QUANTIZER),
              "TE fp4_quant_bwd_grad (stochastic_rounding; RHT only column-wise) and the 16x16 "
              "weight's transposed codes and scale grid"),
         Gemm("wgrad", _nv("dy", "column-wise", (1, 16), rounding="stochastic",
                           transform="rht16"),
              _nv("x", "column-wise", (1, 16), transform="rht16"),
              "TE fp4_quant_bwd_grad and fp4_quant_fwd_inp in column-wise usage: RHT on both "
              "wgrad inputs, stochastic rounding on the gradient")),
        _NVFP4_CITE),
}
