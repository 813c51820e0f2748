"""Known answers for the FP8, NVFP4, MXFP4 and ternary quantizers: a reference written here from the sources'
formulas (../shared/notes/quant-formats.md; numpy float32 arithmetic, which is IEEE), not from
the C code, quantizes the trained model's fp32 masters with every named rule; the library's
codes and scales must equal it bitwise. Each rule's reference is also compared with every
other rule's library output, which must differ, so that a rule applied with another's
switches is caught.

    /usr/bin/python3 test/python/test_quant.py BUILD_DIR

The masters: every 2-D tensor of ../shared/models/qwen3-bytes-pystdlib-4.9m/model-fp32.safetensors
when ../shared is beside the repository, else the three copied into
test/data/quant/masters.safetensors. Needs numpy (Debian: python3-numpy); exits 77 without it.
"""
import json
import os
import struct

import harness

BUILD = harness.setup()
(np,) = harness.require("the quantizer known-answer tests", ["numpy"], "python3-numpy")

import unittest  # noqa: E402

import parity  # noqa: E402
from parity import quant  # noqa: E402

F32 = np.float32
SHARED = os.path.join(os.path.dirname(harness.REPO), "shared", "models",
                      "qwen3-bytes-pystdlib-4.9m", "model-fp32.safetensors")
SUBSET = os.path.join(harness.REPO, "test", "data", "quant", "masters.safetensors")


TERNARY_LATENTS = os.path.join(harness.REPO, "models", "qwen3-bytes-ternary-4.9m", "latents",
                               "model.safetensors")


def read_masters(path=None):
    path = path or (SHARED if os.path.exists(SHARED) else SUBSET)
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__" or e["dtype"] != "F32" or len(e["shape"]) != 2:
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + b:8 + n + end], dtype="<f4").reshape(e["shape"])
    return path, out


# ---- the reference: E4M3 from the value, then each rule's scale arithmetic -----------------

def e4m3_saturating(v):
    """E4M3 codes of float32 values v: clamp to +-448, then round to the nearest multiple of
    the quantum of v's binade (2^(e - 3), subnormal quantum 2^-9 below 2^-6), ties to even,
    then encode the value. Written from the format, not from the library."""
    v = v.astype(np.float64)
    sign = np.signbit(v)
    a = np.minimum(np.abs(v), 448.0)
    _, e = np.frexp(a)               # a = m 2^e, m in [0.5, 1): the binade is e - 1
    binade = np.maximum(e - 1, -6)
    q = np.ldexp(1.0, binade - 3)
    n = np.rint(a / q)               # a / q is exact; rint rounds half to even
    value = np.minimum(n * q, 448.0)
    _, ev = np.frexp(value)
    ev = ev - 1
    normal = value >= 2.0 ** -6
    frac = np.where(normal, (value / np.ldexp(1.0, np.where(normal, ev, 0)) - 1.0) * 8, 0)
    code = np.where(normal, ((ev + 7) << 3) + frac.astype(np.int64), np.rint(value / 2.0 ** -9))
    return (code.astype(np.int64) | np.where(sign, 0x80, 0)).astype(np.uint8)


def blocks(x, br, bc):
    """x padded with zeros to whole br x bc blocks, as [R, C, br, bc], and the block amax."""
    rows, cols = x.shape
    R, C = -(-rows // br), -(-cols // bc)
    p = np.zeros((R * br, C * bc), dtype=F32)
    p[:rows, :cols] = x
    b = p.reshape(R, br, C, bc).transpose(0, 2, 1, 3)
    return b, np.abs(b).max(axis=(2, 3)).astype(F32)


def ref_blocks(x, rule, br, bc):
    b, amax = blocks(x, br, bc)
    one, fp8max = F32(1.0), F32(448.0)
    if rule in ("deepseek", "sglang"):
        s = np.maximum(amax, F32(1e-10)) / fp8max           # vLLM CUDA: absmax seeded with eps
        stored = s
        if rule == "deepseek":
            y = b / s[:, :, None, None]                     # x / y_s
        else:
            y = b * (one / s)[:, :, None, None]             # x * (1.0 / y_s)
    elif rule == "deepgemm":
        a = np.maximum(amax, F32(1e-4))                     # amax.clamp(1e-4)
        stored = a / fp8max
        y = b * (fp8max / a)[:, :, None, None]              # x * (448 / amax)
    else:                                                    # te, te-pow2
        with np.errstate(divide="ignore"):
            m = np.where(amax > 0, fp8max / np.where(amax > 0, amax, one), one).astype(F32)
        m = np.where(np.isinf(m), np.finfo(F32).max, m).astype(F32)
        if rule == "te-pow2":                                # keep the exponent: floor to 2^k
            _, e = np.frexp(m.astype(np.float64))
            m = np.ldexp(1.0, e - 1).astype(F32)
        stored = one / m
        y = b * m[:, :, None, None]
    codes = e4m3_saturating(y.astype(F32))
    R, C = amax.shape
    codes = codes.transpose(0, 2, 1, 3).reshape(R * br, C * bc)[:x.shape[0], :x.shape[1]]
    return codes, stored.astype(F32)


def ref_mx(x, rule):
    b, amax = blocks(x, 1, 32)
    amax = amax.astype(F32)
    if rule == "ocp":                          # floor(log2 amax) - emax(E4M3) = 8
        _, e = np.frexp(amax.astype(np.float64))
        k = np.where(amax > 0, e - 1, -1000) - 8
        biased = np.clip(k, -127, 128) + 127
        mult = np.ldexp(1.0, 127 - biased).astype(F32)
    else:                                      # te: RCEIL of amax * (1/448), byte 0 -> 1
        v = (amax * (F32(1.0) / F32(448.0))).astype(F32)
        m, e = np.frexp(v.astype(np.float64))
        ceil_log2 = np.where(m == 0.5, e - 1, e)
        biased = np.clip(np.where(v > 0, ceil_log2 + 127, 0), 0, 254)
        mult = np.where(biased == 0, 1.0, np.ldexp(1.0, 127 - biased)).astype(F32)
    y = b * mult[:, :, None, None]
    codes = e4m3_saturating(y.astype(F32))
    R, C = amax.shape
    codes = codes.transpose(0, 2, 1, 3).reshape(R, C * 32)[:, :x.shape[1]]
    return codes, biased.astype(np.uint8)


# ---- the 4-bit and ternary references ------------------------------------------------------

E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1(v, away=False):
    """E2M1 codes of float32 values: the nearest of the eight magnitudes by distance (beyond 6:
    6), ties to the even code or (away) to the larger magnitude; sign 0x8 from the sign bit."""
    v = np.asarray(v, dtype=F32).astype(np.float64)
    a = np.minimum(np.abs(v), 6.0)
    hi = np.clip(np.searchsorted(E2M1_VALUES, a, side="left"), 0, 7)
    lo = np.clip(hi - 1, 0, 7)
    d_lo, d_hi = a - E2M1_VALUES[lo], E2M1_VALUES[hi] - a
    tie = d_lo == d_hi
    pick = np.where(d_lo < d_hi, lo, hi)
    pick = np.where(tie, hi if away else np.where(lo % 2 == 0, lo, hi), pick)
    pick = np.where(a == E2M1_VALUES[hi], hi, pick)
    return (pick | np.where(np.signbit(v), 8, 0)).astype(np.uint8)


def e4m3_value(codes):
    c = codes.astype(np.int64)
    mag, e, f = c & 0x7F, (c & 0x7F) >> 3, c & 7
    v = np.where(e == 0, np.ldexp(f.astype(np.float64), -9), np.ldexp((8 + f).astype(np.float64), e - 10))
    return np.where(c & 0x80, -v, v).astype(F32)


def bf16(x):
    """float32 -> bf16 -> float32, round to nearest even (finite values)."""
    b = np.asarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return r.view(F32)


def row_blocks(x, bc):
    """[R, C, bc] zero-padded 1 x bc blocks and their amax [R, C]."""
    b, amax = blocks(x, 1, bc)
    return b[:, :, 0, :], amax


def cut(codes, x):
    R, C, bc = codes.shape
    return codes.reshape(R, C * bc)[:, :x.shape[1]]


def ref_nvfp4(x, rule, per_row):
    b, amax16 = row_blocks(x, 16)
    if rule == "te-2d" and not per_row:  # a weight: each 16 x 16 tile's amax, in its 16 rows
        amax16 = np.repeat(blocks(x, 16, 16)[1], 16, axis=0)[:x.shape[0]]
    amax_t = np.abs(x).max(axis=1).astype(F32) if per_row else np.full(x.shape[0], np.abs(x).max(), F32)
    s2row = amax_t[:, None]
    fmax = np.finfo(F32).max
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if rule in ("te", "te-2d"):
            S = np.minimum(F32(2688.0) / s2row, fmax).astype(F32)
            S = np.where((s2row == 0) | (S == 0), F32(1.0), S).astype(F32)
            s2 = (F32(1.0) / S).astype(F32)
            sf = e4m3_saturating((amax16 * (S * (F32(1.0) / F32(6.0)))).astype(F32))
            sfv = e4m3_value(sf)
            m = np.minimum(F32(1.0) / (sfv * (F32(1.0) / S)), fmax).astype(F32)
            codes = e2m1((b * m[:, :, None]).astype(F32))
            zero = np.zeros_like(s2, dtype=bool)
        else:
            s2 = (s2row / F32(2688.0)).astype(F32)
            zero = s2 == 0
            if rule == "modelopt":
                v = (amax16 / (F32(6.0) * s2)).astype(F32)
                v = np.where(v == 0, F32(1.0), v)
                sf = e4m3_saturating(v)
                sfv = e4m3_value(sf)
                codes = e2m1((b / (sfv * s2)[:, :, None]).astype(F32))
            else:  # torchao
                v = ((amax16 / F32(6.0)) / s2).astype(F32)
                sf = e4m3_saturating(np.clip(v, F32(2.0 ** -6), F32(448.0)))
                sfv = e4m3_value(sf)
                codes = e2m1(np.clip((b / (s2 * sfv)[:, :, None]).astype(F32), -6, 6))
        codes = np.where((sfv == 0)[:, :, None], 0, codes)
        sf = np.where(zero, e4m3_saturating(np.array([1.0], F32))[0], sf)
        codes = np.where(zero[:, :, None], 0, codes).astype(np.uint8)
    s2 = s2[:, 0] if per_row else s2[:1, 0]
    return cut(codes, x), np.concatenate([sf.astype(np.uint8).ravel(), s2.astype(F32).view(np.uint8)])


def ref_mxfp4(x, rule):
    b, amax = row_blocks(x, 32)
    amax = amax.astype(F32)
    if rule == "rceil":                        # RCEIL of amax * RN(1/6)
        v = (amax * (F32(1.0) / F32(6.0))).astype(F32)
        m, e = np.frexp(v.astype(np.float64))
        ceil_log2 = np.where(m == 0.5, e - 1, e)
        biased = np.clip(np.where(v > 0, ceil_log2 + 127, 0), 0, 254)
    else:                                      # floor(log2 amax) - emax(E2M1) = 2
        _, e = np.frexp(amax.astype(np.float64))
        biased = np.clip(np.where(amax > 0, e - 1, -1000) - 2, -127, 128) + 127
    mult = np.ldexp(1.0, 127 - biased).astype(F32)
    codes = e2m1((b * mult[:, :, None]).astype(F32), away=rule == "microxcaling")
    return cut(codes, x), biased.astype(np.uint8)


def ref_ternary(x, rule, per_row):
    if rule == "onebitllms":
        rnd = lambda v: np.floor((v + F32(0.5)).astype(F32))  # noqa: E731
    else:
        rnd = np.rint
    if not per_row:
        total = np.cumsum(np.abs(x).astype(np.float64).ravel())[-1]   # in row-major order
        mean = F32(total / x.size)
        s = F32(1.0) / np.maximum(mean, F32(1e-5))
        codes = np.clip(rnd((x * s).astype(F32)), -1, 1).astype(np.int8)
        stored = bf16(np.array([s], F32)) if rule == "hf-bitlinear" else np.array([s], F32)
        return codes, stored.astype(F32)
    if rule == "hf-bitlinear":                 # transformers BitLinear, in bf16
        xb = bf16(x)
        c = np.maximum(np.abs(xb).max(axis=1), bf16(np.array([1e-5], F32))[0])
        s = bf16((F32(127.0) / c).astype(F32))
        codes = np.clip(np.rint(bf16((xb * s[:, None]).astype(F32))), -128, 127)
    else:
        s = (F32(127.0) / np.maximum(np.abs(x).max(axis=1), F32(1e-5))).astype(F32)
        codes = np.clip(rnd((x * s[:, None]).astype(F32)), -128, 127)
    return codes.astype(np.int8), s.astype(F32)


def lib_nvfp4(x, rule, per_row):
    c, sf, s2 = quant.quantize_nvfp4(x, x.shape[0], x.shape[1], rule, per_row)
    return c, np.concatenate([sf.ravel(), s2.view(np.uint8)])


PATH, MASTERS = read_masters()
#: the matrices quantized: each master, one cut so that its edge blocks are partial, a random
#: one (rows of N(0, 1) at scales 10^U(-6, 4)), and one built on the element rounding's ties
CASES = [(n, w) for n, w in sorted(MASTERS.items())]
first = CASES[0]
CASES.append((first[0] + "[:200, :301]", np.ascontiguousarray(first[1][:200, :301])))
_gen = np.random.default_rng(7)
CASES.append(("random 512x384", (_gen.standard_normal((512, 384)) *
                                 10.0 ** _gen.uniform(-6, 4, (512, 1))).astype(F32)))


def ties_matrix():
    """128 x (128 x 16): block column j holds amax a_j (random) in the first element of every
    row and, elsewhere, the midpoints between neighbouring E4M3 values times a_j / 448 (in
    fp32): quotients that sit on the element rounding's ties, where x / s, x * (1 / s) and
    x * (448 / a) fall on different sides. Trained weights rarely meet a tie."""
    codes = np.arange(0, 0x7E, dtype=np.uint8)
    vals = np.array(quant.fp8_to_f32(codes.tobytes(), "e4m3"), dtype=np.float64)
    mids = (vals[1:] + vals[:-1]) / 2
    cols = []
    for a in 10.0 ** _gen.uniform(-2, 4, 16):
        a = F32(a)
        s = a / F32(448.0)
        blk = np.empty((128, 128), dtype=F32)
        blk[:, 0] = a
        blk[:, 1:] = (_gen.choice(mids, (128, 127)) * np.float64(s)).astype(F32)
        cols.append(blk)
    return np.ascontiguousarray(np.concatenate(cols, axis=1))


CASES.append(("ties 128x2048", ties_matrix()))


def ties_fp4(bc):
    """64 x (bc x 32) for the E2M1 rules: row r's block j has its amax a (random; the first
    row's first element is 10 times the largest, the tensor's amax) in its first element and
    E2M1 midpoints times a / 6 elsewhere, so that x / scale lands on the element ties; MXFP4
    blocks with a power-of-two a (half of them) meet them exactly."""
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    out = np.empty((64, bc * 32), dtype=F32)
    for j in range(32):
        a = np.where(_gen.random(64) < 0.5, 2.0 ** _gen.integers(-8, 8, 64) * 6,
                     10.0 ** _gen.uniform(-3, 3, 64)).astype(F32)
        blk = (_gen.choice(mids, (64, bc)) * _gen.choice([-1, 1], (64, bc)) * (a[:, None] / 6.0))
        blk[:, 0] = a
        out[:, j * bc:(j + 1) * bc] = blk.astype(F32)
    out[0, 0] = F32(np.abs(out).max() * 10)
    return np.ascontiguousarray(out)


def ties_ternary(activations):
    """256 x 256, half 0.5 and half 1.5 (signs random): mean |w| is 1 exactly, so every 0.5 is
    a tie of the weight rounding; or (activations) rows with amax 127 and elements k + 0.5,
    ties of the int8 rounding."""
    if not activations:
        w = _gen.permutation(np.repeat([0.5, 1.5], 256 * 128)).reshape(256, 256)
        w = w * _gen.choice([-1, 1], (256, 256))
    else:
        w = _gen.integers(-126, 126, (256, 256)) + 0.5
        w[:, 0] = 127.0
    return np.ascontiguousarray(w.astype(F32))


def equal(a, b):
    return a.shape == b.shape and a.tobytes() == b.tobytes()


class KnownAnswers(unittest.TestCase):
    def test_reference_e4m3_is_the_format(self):
        """The reference's element rounding against the library's exhaustively tested cast."""
        x = np.concatenate([np.linspace(-500, 500, 100001, dtype=F32),
                            np.ldexp(np.linspace(1, 2, 4097), -12).astype(F32)])
        self.assertTrue(equal(e4m3_saturating(x), quant.fp8_from_f32(x, "e4m3", True)))

    def check_rules(self, rules, run_ref, run_lib, label, ties=None):
        print("%s: %d matrices from %s" % (label, len(CASES), os.path.relpath(PATH, harness.REPO)))
        cases = CASES if ties is None else CASES[:-1] + [ties]
        for name, w in cases:
            refs = {r: run_ref(w, r) for r in rules}
            libs = {r: run_lib(w, r) for r in rules}
            for r in rules:
                with self.subTest(tensor=name, rule=r):
                    self.assertTrue(equal(refs[r][0], libs[r][0]), "%s %s codes differ" % (name, r))
                    self.assertTrue(equal(refs[r][1], libs[r][1]), "%s %s scales differ" % (name, r))
        # every other rule's output differs from this rule's answer somewhere, on the masters
        # or on the ties matrix (on the masters alone some pairs agree everywhere: the count
        # of codes that differ there is printed)
        for r in rules:
            for other in rules:
                if other <= r:
                    continue
                pairs = [(run_ref(w, r), run_lib(w, other)) for n, w in cases[:-3]]
                n_codes = sum(int((a[0] != b[0]).sum()) for a, b in pairs)
                n_scales = sum(int((a[1] != b[1]).sum()) for a, b in pairs)
                total = sum(a[0].size for a, b in pairs)
                a, b = run_ref(cases[-1][1], r), run_lib(cases[-1][1], other)
                t_codes, t_scales = int((a[0] != b[0]).sum()), int((a[1] != b[1]).sum())
                print("  %s vs %s: %d of %d codes and %d scales of the masters differ; on the "
                      "ties matrix %d codes, %d scales" % (r, other, n_codes, total, n_scales,
                                                           t_codes, t_scales))
                self.assertTrue(n_codes + n_scales + t_codes + t_scales > 0,
                                "%s and %s give the same codes and scales" % (r, other))

    def test_block_rules_weights(self):
        self.check_rules(quant.BLOCK_RULES, lambda w, r: ref_blocks(w, r, 128, 128),
                         lambda w, r: quant.quantize_fp8_blocks(w, w.shape[0], w.shape[1], r,
                                                                (128, 128)),
                         "fp8-block 128x128")

    def test_block_rules_activation_groups(self):
        self.check_rules(quant.BLOCK_RULES, lambda w, r: ref_blocks(w, r, 1, 128),
                         lambda w, r: quant.quantize_fp8_blocks(w, w.shape[0], w.shape[1], r,
                                                                (1, 128)),
                         "fp8-block 1x128")

    def test_mx_rules(self):
        self.check_rules(quant.MX_RULES, ref_mx,
                         lambda w, r: quant.quantize_mxfp8(w, w.shape[0], w.shape[1], r),
                         "mxfp8 1x32")

    def test_floor_and_rceil(self):
        """FLOOR and RCEIL agree for amax in (2^(k+8), 448 2^k] and disagree for amax in
        (448 2^k, 2^(k+9)), where FLOOR's 2^k makes amax saturate at 448 and RCEIL takes
        2^(k+1). (quant-formats.md §3f states the opposite interval; its "(analysis)" line is
        wrong: 300 / 2^0 fits E4M3, 500 / 2^0 does not.)"""
        for amax, want in ((300.0, (127, 127)), (448.0, (127, 127)), (500.0, (127, 128)),
                           (511.0, (127, 128)), (512.0, (128, 128))):
            x = np.array([[amax] + [1.0] * 31], dtype=F32)
            c_floor, s_floor = quant.quantize_mxfp8(x, 1, 32, "ocp")
            _, s_rceil = quant.quantize_mxfp8(x, 1, 32, "te")
            self.assertEqual((int(s_floor[0, 0]), int(s_rceil[0, 0])), want, amax)
            if want == (127, 128):
                self.assertEqual(int(c_floor[0, 0]), 0x7E)  # saturated at 448

    def test_reference_e2m1_is_the_format(self):
        """The reference's E2M1 step against the library's exhaustively tested cast."""
        x = np.concatenate([np.linspace(-8, 8, 64001, dtype=F32),
                            np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -5], F32)])
        self.assertTrue(equal(e2m1(x), quant.fp4_from_f32(x, "nearest-even")))
        self.assertTrue(equal(e2m1(x, True), quant.fp4_from_f32(x, "half-away")))

    def test_nvfp4_weights(self):
        self.check_rules(quant.NVFP4_RULES, lambda w, r: ref_nvfp4(w, r, False),
                         lambda w, r: lib_nvfp4(w, r, False), "nvfp4 1x16, tensor scale",
                         ("ties 64x512", ties_fp4(16)))

    def test_nvfp4_activations(self):
        # "te-2d" quantizes activations as "te" does (its tiles are a weight's): left out here,
        # where every pair of rules must differ; test_nvfp4_recipe.py checks the two agree
        rules = tuple(r for r in quant.NVFP4_RULES if r != "te-2d")
        self.check_rules(rules, lambda w, r: ref_nvfp4(w, r, True),
                         lambda w, r: lib_nvfp4(w, r, True), "nvfp4 1x16, per-token scale",
                         ("ties 64x512", ties_fp4(16)))

    def test_mxfp4(self):
        self.check_rules(quant.MXFP4_RULES, ref_mxfp4,
                         lambda w, r: quant.quantize_mxfp4(w, w.shape[0], w.shape[1], r),
                         "mxfp4 1x32", ("ties 64x1024", ties_fp4(32)))

    def test_ternary_weights(self):
        self.check_rules(quant.TERNARY_RULES, lambda w, r: ref_ternary(w, r, False),
                         lambda w, r: quant.quantize_ternary(w, w.shape[0], w.shape[1], r, False),
                         "ternary absmean", ("ties 256x256", ties_ternary(False)))

    def test_ternary_on_the_shipped_latents(self):
        """Every rule on the fp32 latents of the shipped ternary model (models/): the library's
        codes and multipliers equal the reference's; the deployed checkpoint beside them loads
        (tests/python/test_quant_check.py compares its codes with the latents')."""
        _, latents = read_masters(TERNARY_LATENTS)
        linear = {n: w for n, w in latents.items() if ".layers." in n}
        self.assertEqual(len(linear), 42)
        for name, w in sorted(linear.items()):
            for r in quant.TERNARY_RULES:
                ref, lib = ref_ternary(w, r, False), quant.quantize_ternary(w, *w.shape, r, False)
                self.assertTrue(equal(ref[0], lib[0]) and equal(ref[1], lib[1]), (name, r))
        deployed = parity.Model(os.path.dirname(os.path.dirname(TERNARY_LATENTS)))
        deployed.close()

    def test_ternary_activations(self):
        self.check_rules(quant.TERNARY_RULES, lambda w, r: ref_ternary(w, r, True),
                         lambda w, r: quant.quantize_ternary(w, w.shape[0], w.shape[1], r, True),
                         "int8 absmax", ("ties 256x256", ties_ternary(True)))

    def test_4bit_by_hand(self):
        """Answers worked by hand. NVFP4 modelopt: amax 6 gives s2 = 6 / 2688, sf = 448, and the
        E2M1 values themselves come back; a block 10^-6 below the tensor's amax has an E4M3
        scale of 0 and codes 0. MXFP4: amax 7 has floor scale 2^0 (7 saturates to 6) and RCEIL
        scale 2^1 (7 / 2 = 3.5, a tie, to even: 4). Ternary: mean |w| = 1 for w = (0.5, 1.5),
        so 0.5 is a tie: 0 to even, 1 half up."""
        vals = np.array([[6, 4, 3, 2, 1.5, 1, 0.5, 0, -6, -4, -3, -2, -1.5, -1, -0.5, 0]], F32)
        c, sf, s2 = quant.quantize_nvfp4(vals, 1, 16, "modelopt")
        self.assertEqual(s2[0], F32(6.0) / F32(2688.0))
        self.assertEqual(int(sf[0, 0]), 0x7E)
        self.assertTrue(np.array_equal(np.array(quant.fp4_to_f32(c.tobytes()), F32), vals[0]))
        two = np.concatenate([vals, np.full((1, 16), 1e-6, F32) * vals], axis=1)
        c2, sf2, _ = quant.quantize_nvfp4(two, 1, 32, "modelopt")
        self.assertEqual(int(sf2[0, 1]), 0)
        self.assertFalse(c2[0, 16:].any())
        x = np.array([[7.0] + [0.0] * 31], F32)
        c_ocp, s_ocp = quant.quantize_mxfp4(x, 1, 32, "ocp")
        c_rc, s_rc = quant.quantize_mxfp4(x, 1, 32, "rceil")
        self.assertEqual((int(s_ocp[0, 0]), int(c_ocp[0, 0])), (127, 0x7))
        self.assertEqual((int(s_rc[0, 0]), int(c_rc[0, 0])), (128, 0x6))
        w = np.array([[0.5, 1.5]], F32)
        self.assertEqual(list(quant.quantize_ternary(w, 1, 2, "bitnet")[0][0]), [0, 1])
        self.assertEqual(list(quant.quantize_ternary(w, 1, 2, "onebitllms")[0][0]), [1, 1])
        a = np.array([[127.0, 0.5, -0.5, 63.5]], F32)
        self.assertEqual(list(quant.quantize_ternary(a, 1, 4, "bitnet", True)[0][0]), [127, 0, 0, 64])
        self.assertEqual(list(quant.quantize_ternary(a, 1, 4, "onebitllms", True)[0][0]), [127, 1, 0, 64])

    def test_bf16_export_and_adjustment(self):
        """The export path against a numpy reference (ternary: onebitllms' bf16 arithmetic;
        4-bit: the rule on the bf16 cast), and the second remedy: the adjusted bf16 inputs'
        export gives the training codes exactly, on every master (where the plain cast does
        not)."""
        total_cast = total_adj = moved = 0
        for name, w in CASES[:-1]:
            rows, cols = w.shape
            for rule in ("ternary:bitnet", "ternary:onebitllms"):
                train, ts = quant.quantize_weight(w, rows, cols, rule)
                ref_codes, ref_s = ref_ternary(w, rule.split(":")[1], False)
                self.assertTrue(equal(train.view(np.int8), ref_codes), (name, rule))
                ex, es = quant.quantize_bf16_export(w, rows, cols, rule)
                wb = bf16(w)
                total = np.cumsum(np.abs(wb).astype(np.float64).ravel())[-1]
                mean = bf16(np.array([total / wb.size], F32))[0]
                sb = bf16(np.array([F32(1.0) / np.maximum(mean, bf16(np.array([1e-5], F32))[0])], F32))[0]
                v = bf16((wb * sb).astype(F32))
                r = np.floor((v + F32(0.5)).astype(F32)) if rule.endswith("onebitllms") else np.rint(v)
                self.assertTrue(equal(ex.view(np.int8), np.clip(r, -1, 1).astype(np.int8)), (name, rule))
                self.assertEqual(es[-1], sb)
                total_cast += int((ex != train).sum())
                adj, k = quant.adjust_bf16(w, rows, cols, rule)
                moved += k
                back = adj.astype(np.uint32).__lshift__(16).view(F32)
                ex2, _ = quant.quantize_bf16_export(np.ascontiguousarray(back), rows, cols, rule)
                total_adj += int((ex2 != train).sum())
            c4, _ = quant.quantize_bf16_export(w, rows, cols, "nvfp4:modelopt")
            ref4 = quant.quantize_nvfp4(bf16(w), rows, cols, "modelopt")[0]
            self.assertTrue(equal(c4, ref4), name)
        print("ternary bf16-cast export: %d codes differ from training; after the adjustment %d "
              "(%d inputs moved)" % (total_cast, total_adj, moved))
        self.assertGreater(total_cast, 0)
        self.assertEqual(total_adj, 0)
        # the 4-bit rules: the adjusted inputs' export has the training codes and block scales
        # (NVFP4's tensor scale, the last, stays the bf16 amax's)
        moved4 = 0
        for name, w in CASES[:-1]:
            rows, cols = w.shape
            for rule in ("nvfp4:modelopt", "nvfp4:te", "mxfp4:ocp", "mxfp4:rceil"):
                train, ts = quant.quantize_weight(w, rows, cols, rule)
                adj, k = quant.adjust_bf16(w, rows, cols, rule)
                moved4 += k
                back = adj.astype(np.uint32).__lshift__(16).view(F32)
                ex2, es2 = quant.quantize_bf16_export(np.ascontiguousarray(back), rows, cols, rule)
                self.assertTrue(equal(ex2, train), (name, rule))
                self.assertTrue(equal(np.asarray(es2[:-1], F32), np.asarray(ts[:-1], F32)), (name, rule))
                # each adjusted value is a bf16 value: the cast of itself
                self.assertTrue(equal(bf16(back), back), (name, rule))
        print("4-bit bf16 adjustment: %d inputs moved" % moved4)
        self.assertGreater(moved4, 0)
        with self.assertRaises(parity.ParityError):
            quant.adjust_bf16(CASES[0][1], *CASES[0][1].shape, "fp8-block:deepseek")

    def test_bad_input(self):
        x = np.ones((2, 4), dtype=F32)
        with self.assertRaises(parity.ParityError):
            quant.quantize_fp8_blocks(x, 2, 4, "ocp")          # an MX rule name
        with self.assertRaises(parity.ParityError):
            quant.quantize_mxfp8(x, 2, 4, "deepseek")
        with self.assertRaises(parity.ParityError):
            quant.quantize_nvfp4(x, 2, 4, "ocp")                # an MXFP4 rule name
        with self.assertRaises(parity.ParityError):
            quant.quantize_mxfp4(x, 2, 4, "modelopt")
        with self.assertRaises(parity.ParityError):
            quant.quantize_ternary(x, 2, 4, "te")
        with self.assertRaises(ValueError):
            quant.quantize_ternary(x, 2, 4, "bitnet", per_row=2)
        x[1, 2] = np.nan
        with self.assertRaisesRegex(parity.ParityError, r"x\[1\]\[2\] is NaN"):
            quant.quantize_fp8_blocks(x, 2, 4, "te")
        for call in (lambda: quant.quantize_nvfp4(x, 2, 4), lambda: quant.quantize_mxfp4(x, 2, 4),
                     lambda: quant.quantize_ternary(x, 2, 4, per_row=True)):
            with self.assertRaisesRegex(parity.ParityError, r"x\[1\]\[2\] is NaN"):
                call()
        with self.assertRaises(ValueError):
            quant.quantize_fp8_blocks(np.ones(8, dtype=F32), 3, 3)


if __name__ == "__main__":
    harness.run("test_quant")
