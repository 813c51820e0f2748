"""The training recipes (parity.recipes, parity.torch.linear(recipe=...), CausalLM(recipe=...)):
each MXFP8 recipe's dx and dW against an independent reference written here from the recipe's
definition in numpy (its own E4M3 and E5M2 rounding to nearest even with saturation, TE's RCEIL
E8M0 scales, exact integer block dots rounded once to fp32, the fp32 chain of the scale products
in ascending block order: the library's quantizers and GEMM are not called), bitwise, on shapes
with partial blocks, zero blocks and wide ranges; a NaN gradient refused; the recipe's fprop
bitwise the sampler's (Model.score) under the policy; a policy whose forward is not the recipe's
refused; and a changed recipe (E4M3 for E5M2) giving other gradients.

    /usr/bin/python3 test/python/test_recipes.py BUILD_DIR

Needs torch and numpy (Debian: python3-torch, python3-numpy); exits 77 (skipped) without them.
"""
import harness

BUILD = harness.setup()
torch, np = harness.require("the recipe tests", ["torch", "numpy"], "python3-torch python3-numpy")

import copy  # noqa: E402
import os  # noqa: E402
import unittest  # noqa: E402

import parity  # noqa: E402
from parity import ParityError  # noqa: E402
from parity.torch import CausalLM, linear  # noqa: E402

TRAINED = os.path.join(harness.REPO, "models", "qwen3-bytes-pystdlib-4.9m")
POLICY = "aligned+mxfp8:te"
MX_RECIPES = ("te-mxfp8", "te-mxfp8-hybrid")

# ---- the reference: formats from their definitions ------------------------------------------

# (fraction bits, exponent bias, largest finite magnitude) of the OCP 8-bit floats
FORMATS = {"e4m3": (3, 7, 448.0), "e5m2": (2, 15, 57344.0)}


def magnitudes(element):
    """Every finite non-negative value of the format, ascending: subnormals m 2^(1 - bias -
    mbits), then normals (1 + m / 2^mbits) 2^(e - bias), up to the largest finite one (E4M3's
    top code 0x7f is NaN, E5M2's top exponent holds infinities and NaNs). The index of a value
    is its code's magnitude bits, so an even index is an even code."""
    mbits, bias, top = FORMATS[element]
    vals = [m * 2.0 ** (1 - bias - mbits) for m in range(2 ** mbits)]
    e = 1
    while True:
        for m in range(2 ** mbits):
            v = (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
            if v > top:
                return np.array(vals)
            vals.append(v)
        e += 1


def round_to(element, x):
    """x (float32 array) rounded to the format's nearest value, ties to the even code,
    saturating at the largest finite value; returned as float64 values."""
    grid = magnitudes(element)
    a = np.minimum(np.abs(x.astype(np.float64)), grid[-1])
    hi = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)  # grid[hi - 1] < a <= grid[hi]
    lo = hi - 1
    dlo, dhi = a - grid[lo], grid[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = np.where(a == 0, 0, pick)
    return np.sign(x) * grid[pick]


def rceil_exponent(amax, element):
    """TE's E8M0 scale exponent (float_to_e8m0 of amax * max_norm_rcp, both fp32): the
    unbiased exponent of v rounded up to a power of two, at least -127, at most 127."""
    rcp = np.float32(1.0 / FORMATS[element][2])
    v = float(np.float32(amax) * rcp)
    if v == 0.0:
        return -127
    f, e = np.frexp(v)                  # v = f 2^e, f in [0.5, 1)
    b = e - 1 if f == 0.5 else e
    return int(min(max(b, -127), 127))


def quantize_rows(x, element):
    """x [rows, cols] float32 in 1 x 32 blocks along each row: (values of the codes as
    float64, the block exponents [rows, ceil(cols / 32)])."""
    rows, cols = x.shape
    nb = -(-cols // 32)
    vals = np.zeros((rows, cols))
    exps = np.zeros((rows, nb), dtype=np.int64)
    for r in range(rows):
        for b in range(nb):
            blk = x[r, b * 32:(b + 1) * 32]
            e = rceil_exponent(np.max(np.abs(blk)), element)
            exps[r, b] = e
            mult = np.float32(1.0) if e == -127 else np.float32(2.0 ** -e)  # TE's exp2f_rcp
            vals[r, b * 32:(b + 1) * 32] = round_to(element, (blk * mult).astype(np.float32))
    return vals, exps


UNIT = {"e4m3": 9, "e5m2": 16}   # value = k 2^-UNIT with k an integer


def round_int_to_f32(s):
    """The exact integer s rounded to 24 significant bits, to nearest even (a Python int)."""
    a = abs(s)
    shift = a.bit_length() - 24
    if shift <= 0:
        return s
    q, rem, half = a >> shift, a & ((1 << shift) - 1), 1 << (shift - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return (q << shift) * (1 if s >= 0 else -1)


def gemm(a, b):
    """y = a b^T on quantized operands a = (values, exponents, element), b likewise, by the
    spec: per 1 x 32 block along k, ascending, d = the exact dot rounded once to fp32, then
    acc = fp32(acc + fp32(fp32(d * sa) * sb))."""
    (va, ea, ta), (vb, eb, tb) = a, b
    ka = np.rint(va * 2.0 ** UNIT[ta]).astype(np.int64)
    kb = np.rint(vb * 2.0 ** UNIT[tb]).astype(np.int64)
    m, k = va.shape
    n = vb.shape[0]
    unit = 2.0 ** -(UNIT[ta] + UNIT[tb])
    acc = np.zeros((m, n), dtype=np.float32)
    for blk in range(-(-k // 32)):
        sl = slice(blk * 32, (blk + 1) * 32)
        s = ka[:, sl] @ kb[:, sl].T         # exact: every |sum| below 2^55 for these pairs
        d = np.array([[float(round_int_to_f32(int(v))) * unit for v in row] for row in s],
                     dtype=np.float64).astype(np.float32)   # exact: 24 bits, in range
        sa = np.float32(2.0) ** ea[:, blk].astype(np.float32)
        sb = np.float32(2.0) ** eb[:, blk].astype(np.float32)
        acc = (acc + (d * sa[:, None]).astype(np.float32) * sb[None, :]).astype(np.float32)
    return acc


def reference_grads(recipe, x, w, dy):
    """(dx, dW) of `recipe` (a parity.Recipe, read only for its operands' element types) from
    its definition: dgrad dy row-wise x W column-wise, wgrad dy column-wise x x column-wise."""
    def q(t, op):
        vals, exps = quantize_rows(np.ascontiguousarray(t), op.element)
        return vals, exps, op.element
    tensors = {"x": x, "w": w, "dy": dy}

    def operand(op):
        t = tensors[op.tensor]
        return q(t if op.orientation == "row-wise" else t.T, op)
    dx = gemm(operand(recipe.dgrad.a), operand(recipe.dgrad.b))
    dw = gemm(operand(recipe.wgrad.a), operand(recipe.wgrad.b))
    return dx, dw


def bits(t):
    return np.asarray(t, dtype=np.float32).view(np.uint32)


def library_grads(recipe, x, w, dy):
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    y = linear(xt, wt, policy=POLICY, recipe=recipe)
    y.backward(torch.tensor(dy))
    return xt.grad.numpy(), wt.grad.numpy()


def operands(seed, tokens=37, n_in=70, n_out=45):
    """x, W, dy (float32) with partial blocks (no dimension a multiple of 32), a zero row and
    a zero block, and blocks of wide range."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, n_in)).astype(np.float32)
    w = (rng.standard_normal((n_out, n_in)) * 0.05).astype(np.float32)
    dy = (rng.standard_normal((tokens, n_out)) * 1e-3).astype(np.float32)
    x[3] = 0.0
    x[5:9, 32:64] = 0.0
    dy[:, 7] = 0.0
    dy[11, :32] *= np.float32(1e6)         # a row block far above the others
    x[13, 40] = np.float32(3e4)            # one large value among small ones in its block
    w[2, 64:] = np.float32(1e-30)          # a block of tiny values (their own scale)
    # blocks whose scale is exactly 2^0 (amax * RN(1 / max) = 1: RCEIL keeps a power of two)
    # holding values halfway between two codes (ties go to the even code)
    x[20, :6] = [448.0, 1.0625, 1.1875, -1.0625, 2.125, -3.25]
    w[4, :5] = [448.0, 1.0625, -1.1875, 0.5, 1.0]
    dy[21, :6] = [57344.0, 1.125, 1.375, -1.125, 2.5, -3.5]
    return x, w, dy


class ReferenceBits(unittest.TestCase):
    def test_mx_recipes_match_their_definition(self):
        """dx and dW of te-mxfp8 and te-mxfp8-hybrid equal the reference bit for bit."""
        for name in MX_RECIPES:
            r = parity.Recipe(name)
            for seed in (1, 2):
                x, w, dy = operands(seed)
                got_dx, got_dw = library_grads(name, x, w, dy)
                want_dx, want_dw = reference_grads(r, x, w, dy)
                self.assertTrue(np.array_equal(bits(got_dx), bits(want_dx)),
                                "%s dx, seed %d" % (name, seed))
                self.assertTrue(np.array_equal(bits(got_dw), bits(want_dw)),
                                "%s dW, seed %d" % (name, seed))
                self.assertTrue(np.isfinite(got_dx).all() and np.isfinite(got_dw).all())

    def test_reference_is_close_to_fp32(self):
        """The reference's gradients are near the fp32 ones (the reference is of gradients)."""
        x, w, dy = operands(3)
        for name in MX_RECIPES:
            dx, dw = reference_grads(parity.Recipe(name), x, w, dy)
            fdx, fdw = dy.astype(np.float64) @ w, dy.T.astype(np.float64) @ x
            for got, want in ((dx, fdx), (dw, fdw)):
                cos = (got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)
                self.assertGreater(cos, 0.99, name)

    def test_changed_recipe_differs(self):
        """E4M3 where the hybrid has E5M2 (and the reverse) changes the gradients: the
        reference of one recipe is not the library's other one, and a recipe edited to E4M3
        gradients is te-mxfp8's, not the hybrid's."""
        x, w, dy = operands(4)
        e4, hy = parity.Recipe("te-mxfp8"), parity.Recipe("te-mxfp8-hybrid")
        lib_e4 = library_grads("te-mxfp8", x, w, dy)
        lib_hy = library_grads("te-mxfp8-hybrid", x, w, dy)
        ref_e4 = reference_grads(e4, x, w, dy)
        ref_hy = reference_grads(hy, x, w, dy)
        for i, what in enumerate(("dx", "dW")):
            self.assertFalse(np.array_equal(bits(lib_e4[i]), bits(ref_hy[i])), what)
            self.assertFalse(np.array_equal(bits(lib_hy[i]), bits(ref_e4[i])), what)
        edited = copy.deepcopy(hy)
        edited.dgrad.a.element = edited.wgrad.a.element = "e4m3"
        got = library_grads(edited, x, w, dy)
        for i in range(2):
            self.assertTrue(np.array_equal(bits(got[i]), bits(lib_e4[i])))
            self.assertFalse(np.array_equal(bits(got[i]), bits(lib_hy[i])))

    def test_e5m2_rounding_and_scales(self):
        """The E5M2 MX quantizer (parity_mxfp8_quantize_as) against the reference's rounding
        and RCEIL scales, saturating values included."""
        import ctypes
        from parity._lib import lib
        rng = np.random.default_rng(5)
        x = (rng.standard_normal((6, 96)) * np.float32(10.0) ** rng.integers(-8, 8, (6, 1))
             ).astype(np.float32)
        x[0, :32] = np.float32(57344.0 * 1.0001)      # the scale's rounding leaves x above max
        x[1, 32:64] = 0.0
        codes = np.zeros(x.shape, dtype=np.uint8)
        scales = np.zeros((6, 3), dtype=np.uint8)
        q = parity.CHOICES["quantizer"].index("te-rceil")
        lib.parity_mxfp8_quantize_as(q, 1, 6, 96, x.ctypes.data_as(ctypes.c_void_p), 96,
                                     codes.ctypes.data_as(ctypes.c_void_p), 96,
                                     scales.ctypes.data_as(ctypes.c_void_p))
        values = np.zeros(x.shape, dtype=np.float32)
        lib.parity_fp8_to_f32(1, x.size, codes.ctypes.data_as(ctypes.c_void_p),
                              values.ctypes.data_as(ctypes.c_void_p))
        want, exps = quantize_rows(x, "e5m2")
        self.assertTrue(np.array_equal(scales.astype(np.int64) - 127, exps))
        self.assertTrue(np.array_equal(values.astype(np.float64), want))
        self.assertEqual(np.abs(want).max(), 57344.0)


class Policy(unittest.TestCase):
    def test_fprop_is_the_sampler(self):
        """Under each recipe the module's log-probs are Model.score's bit for bit, and its
        gradients are the recipe's (not the straight-through ones)."""
        seqs = [list(b"def f(x):\n    return x + 1\n"), list(b"import os")]
        with parity.Model(TRAINED, threads=2) as model:
            want = model.score(seqs, policy=POLICY)
            grads = {}
            for r in (None,) + MX_RECIPES:
                lm = CausalLM(model, policy=POLICY, threads=2, recipe=r)
                got = lm(seqs)
                for g, w in zip(got, want):
                    self.assertTrue(np.array_equal(bits(g.detach().numpy()),
                                                   bits(np.array(w, dtype=np.float32))), r)
                (-sum(g.mean() for g in got)).backward()
                grads[r] = lm._param("model.layers.0.self_attn.q_proj.weight").grad.clone()
            self.assertFalse(torch.equal(grads[None], grads["te-mxfp8"]))
            self.assertFalse(torch.equal(grads["te-mxfp8"], grads["te-mxfp8-hybrid"]))
            cos = torch.nn.functional.cosine_similarity(grads[None].flatten(),
                                                        grads["te-mxfp8"].flatten(), dim=0)
            self.assertGreater(cos.item(), 0.9)

    def test_refusals(self):
        """A policy whose forward is not the recipe's fprop, an unknown recipe, and a NaN
        gradient are refused with messages that say so."""
        x = torch.randn(4, 40, requires_grad=True)
        w = torch.randn(8, 40, requires_grad=True)
        for pol in ("aligned", "aligned+mxfp8:ocp", "aligned+fp8-block:te"):
            with self.assertRaisesRegex(ValueError, "fprop is mxfp8 with quantizer te-rceil"):
                linear(x, w, policy=pol, recipe="te-mxfp8")
            with self.assertRaisesRegex(ValueError, "fprop"):
                CausalLM("synthetic:tiny", policy=pol, threads=1, recipe="te-mxfp8-hybrid")
        with self.assertRaisesRegex(ValueError, "unknown recipe 'te-fp8'.*te-mxfp8"):
            linear(x, w, policy=POLICY, recipe="te-fp8")
        y = linear(x, w, policy=POLICY, recipe="te-mxfp8")
        gy = torch.ones(4, 8)
        gy[2, 3] = float("nan")
        with self.assertRaisesRegex(ParityError, "NaN"):
            y.backward(gy)

    def test_table(self):
        """The table: the three GEMMs' operands and orientations, and the citations."""
        self.assertEqual(parity.recipes()[:2], list(MX_RECIPES))
        hy = parity.Recipe("te-mxfp8-hybrid")
        self.assertEqual([(g.a.tensor, g.a.orientation, g.a.element, g.b.tensor,
                           g.b.orientation, g.b.element) for g in hy.gemms()],
                         [("x", "row-wise", "e4m3", "w", "row-wise", "e4m3"),
                          ("dy", "row-wise", "e5m2", "w", "column-wise", "e4m3"),
                          ("dy", "column-wise", "e5m2", "x", "column-wise", "e4m3")])
        self.assertIn("get_fp8_te_dtype", hy.table())
        self.assertIn("Format.HYBRID", hy.table())
        nv = parity.Recipe("te-nvfp4")
        self.assertEqual((nv.dgrad.b.block, nv.wgrad.a.rounding, nv.wgrad.b.transform),
                         ((16, 16), "stochastic", "rht16"))


if __name__ == "__main__":
    harness.run("recipes")
