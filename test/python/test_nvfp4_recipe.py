"""The quantizers of TransformerEngine's NVFP4 training recipe (parity.h, "NVFP4 training")
against references written here in numpy from TE's definitions, not from the C code:

- parity_nvfp4_quantize_2d and the forward rule "te-2d": each 16 x 16 tile's amax, then TE's
  scale arithmetic (test_quant.py's "te" reference on the tile amax), bit for bit; Wᵀ gets W's
  codes and scale grid transposed; the rule's GEMM through parity_linear equals its
  specification (block dots exact, fp32 chain, alpha) on every CPU path and thread count.
- parity_nvfp4_quantize_sr: Philox4x32-10 written from Salmon et al. (checked on Random123's
  known-answer vectors) and TE's stochastic_round_fp4_e2m1, bit for bit; the counter contract
  (same seed/stream/tensor: the same codes on every CPU path; another seed or stream: other
  codes); unbiased: the mean of many draws within its bound.
- parity_rht16: H16 by Sylvester's construction and TE's sign vector, exact where the sums are
  (integers times a power of two), within the stated bound elsewhere, bitwise the header's
  butterfly order.
- the te-nvfp4 recipe (parity.torch.linear(recipe="te-nvfp4"), needs torch): dx and dW bitwise
  the recipe's GEMMs written from its table on these references (SR, 16 x 16 tiles
  transposed, RHT of both wgrad inputs), the forward the policy's GEMM.

    /usr/bin/python3 test/python/test_nvfp4_recipe.py BUILD_DIR

Needs numpy (Debian: python3-numpy); exits 77 without it.
"""
import ctypes

import harness

BUILD = harness.setup()
(np,) = harness.require("the NVFP4 recipe tests", ["numpy"], "python3-numpy")

import unittest  # noqa: E402

import parity  # noqa: E402
from parity import _lib, quant  # noqa: E402
from parity._lib import lib  # noqa: E402
from parity.policy import policy_struct  # noqa: E402
from test_quant import F32, blocks, e2m1, e4m3_saturating, e4m3_value, ref_nvfp4  # noqa: E402

F32_DTYPE = 2  # parity_dtype PARITY_DTYPE_F32
U64 = np.uint64
M32 = U64(0xFFFFFFFF)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0,
                 -4.0, -6.0])
DEFAULT_PATH, PATHS = parity.cpu_path(), harness.runnable_paths()
TE_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=np.float64)


# ---- Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11), vectorised over counters -----------

def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counters (c0..c3, uint64 arrays holding 32-bit words) under key (k0, k1):
    ten rounds of the two 32x32 -> 64 products and the key schedule (Weyl increments)."""
    c = [np.asarray(v, dtype=U64) & M32 for v in (c0, c1, c2, c3)]
    k0, k1 = U64(k0) & M32, U64(k1) & M32
    for rnd in range(10):
        p0 = U64(0xD2511F53) * c[0]
        p1 = U64(0xCD9E8D57) * c[2]
        c = [((p1 >> U64(32)) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> U64(32)) ^ c[3] ^ k1) & M32,
             p0 & M32]
        k0, k1 = (k0 + U64(0x9E3779B9)) & M32, (k1 + U64(0xBB67AE85)) & M32
    return c


def sr_bytes(seed, stream, n):
    """The 8 random bits of elements 0..n-1: element i takes byte i % 4 of word (i % 16) / 4 of
    Philox(key = seed, counter = (i / 16, stream)) (TE's init(seed, stream, i / 16) +
    generate4, its rbits >> 8k for the k-th of four elements)."""
    i = np.arange(n, dtype=U64)
    g = i >> U64(4)
    words = philox(g & M32, g >> U64(32), np.full(n, stream & 0xFFFFFFFF, U64),
                   np.full(n, stream >> 32, U64), seed & 0xFFFFFFFF, seed >> 32)
    w = np.stack(words)[(i % U64(16) // U64(4)).astype(np.int64), np.arange(n)]
    return ((w >> (U64(8) * (i % U64(4)))) & U64(0xFF)).astype(np.int64)


def sr_e2m1(v, bits):
    """TE's stochastic_round_fp4_e2m1 (util/ptx.cuh) in float32: u = bits / 256, the grid step at
    |v|, t = |v| + u step rounded once (u step is exact), floored to the grid of t's step,
    at most 6, v's sign; as E2M1 codes."""
    v = np.asarray(v, dtype=F32)
    a = np.abs(v)
    u = (bits.astype(np.float64) / 256.0)
    step = np.where(a >= 4, 2.0, np.where(a >= 2, 1.0, 0.5))
    t = (a.astype(np.float64) + u * step).astype(F32).astype(np.float64)  # exact sum, one rounding
    step_t = np.where(t >= 4, 2.0, np.where(t >= 2, 1.0, 0.5))
    q = np.minimum(np.floor(t / step_t) * step_t, 6.0)
    code = np.searchsorted(E2M1[:8], q)
    return (code | np.where(np.signbit(v), 8, 0)).astype(np.uint8)


def ref_sr(x, seed, stream, per_row):
    """parity_nvfp4_quantize_sr under "te": test_quant's "te" scales (ref_nvfp4), the scaled
    values x * m, then sr_e2m1 with element (r, c)'s bits from counter r * cols + c."""
    rows, cols = x.shape
    _, scales = ref_nvfp4(x, "te", per_row)
    grid = -(-cols // 16)
    sf = scales[:rows * grid].reshape(rows, grid)
    s2 = scales[rows * grid:].view(F32)
    amax = np.abs(x).max(axis=1) if per_row else np.full(rows, np.abs(x).max(), F32)
    with np.errstate(divide="ignore"):
        S = np.minimum(F32(2688.0) / amax.astype(F32), np.finfo(F32).max).astype(F32)
    S = np.where((amax == 0) | (S == 0), F32(1.0), S).astype(F32)  # TE's S_enc
    sfv = e4m3_value(sf)
    dec = (sfv * (F32(1.0) / S)[:, None]).astype(F32)
    with np.errstate(divide="ignore"):
        m = np.minimum(F32(1.0) / dec, np.finfo(F32).max).astype(F32)
    v = (x * np.repeat(m, 16, axis=1)[:, :cols]).astype(F32)
    codes = sr_e2m1(v, sr_bytes(seed, stream, rows * cols).reshape(rows, cols))
    codes = np.where(np.repeat(sfv == 0, 16, axis=1)[:, :cols], 0, codes).astype(np.uint8)
    return codes, sf, s2


def ref_2d(x):
    """TE's 2-D weight quantization: test_quant's "te-2d" (tile amax, "te" arithmetic), the
    repeated row scales folded back to one a tile."""
    codes, scales = ref_nvfp4(x, "te-2d", False)
    rows, cols = x.shape
    grid = -(-cols // 16)
    sf_rows = scales[:rows * grid].reshape(rows, grid)
    return codes, sf_rows[::16], scales[rows * grid:].view(F32)


def hadamard16():
    """H16 by Sylvester's construction, H_2n = [[H, H], [H, -H]]."""
    h = np.ones((1, 1))
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_fp32(x, signs=TE_SIGNS):
    """The header's order of the transform in float32: signs, then for h = 1, 2, 4, 8 each pair
    (j, j + h) of a 16-block -> (a + b, a - b), each rounded once, then times 0.25."""
    rows, cols = x.shape
    v = (x * signs.astype(F32)[None, :].repeat(cols // 16, 0).ravel()).astype(F32)
    v = v.reshape(rows, cols // 16, 16)
    for h in (1, 2, 4, 8):
        pairs = v.reshape(rows, cols // 16, 16 // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        v = np.stack([a + b, a - b], axis=-2).reshape(rows, cols // 16, 16)
    return (v * F32(0.25)).reshape(rows, cols).astype(F32)


def nvfp4_gemm(a, b):
    """y = a b^T for NVFP4 operands (codes [m, k], E4M3 scale codes [rows / scale_rows][k / 16],
    fp32 globals (one, or one a row), scale_rows): per 1 x 16 block of k, ascending, acc = acc
    + (d * sa) * sb with d the exact dot of the E2M1 values (float64 sums of at most 16 products
    k/4 with |k| <= 144, exact), each product and sum rounded to fp32; y = RN(acc * RN(ga
    gb))."""
    (ac, asf, ag, ar), (bc, bsf, bg, br) = a, b
    m, k = ac.shape
    n = bc.shape[0]
    grid = -(-k // 16)
    av, bv = np.zeros((m, grid * 16)), np.zeros((n, grid * 16))
    av[:, :k], bv[:, :k] = E2M1[ac], E2M1[bc]
    sa = e4m3_value(np.repeat(asf, ar, axis=0)[:m])
    sb = e4m3_value(np.repeat(bsf, br, axis=0)[:n])
    acc = np.zeros((m, n), dtype=F32)
    for blk in range(grid):
        d = (av[:, 16 * blk:16 * blk + 16] @ bv[:, 16 * blk:16 * blk + 16].T).astype(F32)
        acc = (acc + ((d * sa[:, blk:blk + 1]).astype(F32) * sb[None, :, blk])).astype(F32)
    alpha = (np.broadcast_to(ag, (m,))[:, None] * np.broadcast_to(bg, (n,))[None, :]).astype(F32)
    return (acc * alpha).astype(F32)


def random_matrix(rs, rows, cols):
    """Rows of N(0, 1) at scales 10^U(-3, 3): blocks of many sizes under one tensor scale."""
    return (rs.standard_normal((rows, cols)) * 10.0 ** rs.uniform(-3, 3, (rows, 1))).astype(F32)


SHAPES = [(1, 1), (16, 16), (37, 50), (64, 128), (100, 33), (17, 300)]


class TwoD(unittest.TestCase):
    def test_against_reference(self):
        rs = np.random.RandomState(1)
        for rows, cols in SHAPES:
            x = random_matrix(rs, rows, cols)
            want = ref_2d(x)
            for rule in ("te", "te-2d"):
                got = quant.quantize_nvfp4_2d(x, rows, cols, rule)
                for w, g, what in zip(want, got, ("codes", "tile scales", "s2")):
                    self.assertTrue(np.array_equal(w.view(np.uint8), g.view(np.uint8)),
                                    "%dx%d %s %s" % (rows, cols, rule, what))

    def test_transpose_shares_codes(self):
        """Wᵀ quantized in tiles: W's codes and tile grid transposed, the same s2 (TE's
        columnwise data of a 2-D weight)."""
        rs = np.random.RandomState(2)
        for rows, cols in SHAPES:
            x = random_matrix(rs, rows, cols)
            c, sf, s2 = quant.quantize_nvfp4_2d(x, rows, cols)
            ct, sft, s2t = quant.quantize_nvfp4_2d(np.ascontiguousarray(x.T), cols, rows)
            self.assertTrue(np.array_equal(ct, c.T) and np.array_equal(sft, sf.T))
            self.assertEqual(s2.tobytes(), s2t.tobytes())

    def test_forward_rule(self):
        """nvfp4:te-2d: the model's weight quantization is the tiles with each tile's scale in its
        rows; its activations are "te"'s; parity_nvfp4_quantize gives the same bytes."""
        rs = np.random.RandomState(3)
        for rows, cols in SHAPES:
            x = random_matrix(rs, rows, cols)
            c, sf, s2 = quant.quantize_nvfp4_2d(x, rows, cols)
            grid = -(-cols // 16)
            rows_sf = np.repeat(sf, 16, axis=0)[:rows]
            wc, ws = quant.quantize_weight(x, rows, cols, "nvfp4:te-2d")
            self.assertTrue(np.array_equal(wc, c))
            self.assertTrue(np.array_equal(ws[:rows * grid], e4m3_value(rows_sf).ravel()))
            self.assertEqual(ws[-1:].tobytes(), s2.tobytes())
            nc, nsf, ns2 = quant.quantize_nvfp4(x, rows, cols, "te-2d", per_row=False)
            self.assertTrue(np.array_equal(nc, c) and np.array_equal(nsf, rows_sf))
            self.assertEqual(ns2.tobytes(), s2.tobytes())
            for a, b in zip(quant.quantize_nvfp4(x, rows, cols, "te-2d", per_row=True),
                            quant.quantize_nvfp4(x, rows, cols, "te", per_row=True)):
                self.assertTrue(np.array_equal(a.view(np.uint8), b.view(np.uint8)))
        with self.assertRaises(parity.ParityError) as cm:
            quant.adjust_bf16(random_matrix(rs, 16, 16), 16, 16, "nvfp4:te-2d")
        self.assertEqual(cm.exception.status, "PARITY_ERR_UNSUPPORTED")

    def test_gemm_is_its_specification(self):
        """parity_linear under vllm+nvfp4:te-2d against the NVFP4 GEMM written from the header:
        x per token as "te", W in tiles; per 1 x 16 block of K, ascending: acc = acc + (d * sfa)
        * sfw with d the exact dot of the E2M1 values; y = RN(acc * RN(s2a * s2w)) (fp32,
        unrounded: the caller rounds); every CPU path, 1 and 2 threads."""
        rs = np.random.RandomState(4)
        pol_c = policy_struct("vllm+nvfp4:te-2d")
        for m, k, n in ((1, 16, 1), (3, 50, 37), (9, 128, 40), (20, 300, 17)):
            x = random_matrix(rs, m, k)
            w = random_matrix(rs, n, k)
            xc, xscales = ref_nvfp4(x, "te", True)
            grid = -(-k // 16)
            xsf, xs2 = xscales[:m * grid].reshape(m, grid), xscales[m * grid:].view(F32)
            want = nvfp4_gemm((xc, xsf, xs2, 1), ref_2d(w) + (16,))
            for path in PATHS:
                parity.set_cpu_path(path)
                for threads in (1, 2):
                    pool = _lib.pool_p()
                    lib.parity_pool_create(threads, ctypes.byref(pool))
                    y = np.zeros((m, n), dtype=F32)
                    lib.parity_linear(pool, ctypes.byref(pol_c), 0, m, k, n,
                                      x.ctypes.data, k, F32_DTYPE, w.ctypes.data, k, None,
                                      y.ctypes.data, n)
                    lib.parity_pool_free(pool)
                    self.assertTrue(np.array_equal(y.view(np.uint32), want.view(np.uint32)),
                                    "%dx%dx%d %s %d threads" % (m, k, n, path, threads))
        parity.set_cpu_path(DEFAULT_PATH)


class StochasticRounding(unittest.TestCase):
    def test_reference_generator(self):
        """The reference Philox on Random123's known-answer vectors (kat_vectors, philox4x32 10)."""
        kats = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
                ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2,
                 (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
                ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
                 (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
        for ctr, key, want in kats:
            got = philox(*[np.array([c], U64) for c in ctr], *key)
            self.assertEqual(tuple(int(w[0]) for w in got), want)

    def test_reference_rounding_is_tes(self):
        """sr_e2m1 on the grid's own points and midpoints: bits 0 keep a grid value, every
        byte keeps it too (u < 1 never reaches the next point from a grid point); a midpoint
        goes up for exactly the upper half of the bytes."""
        grid = E2M1[:7]
        for g in grid:
            for b in range(256):
                self.assertEqual(E2M1[sr_e2m1(np.array([g]), np.array([b]))[0]], g)
        for lo, hi in zip(E2M1[:7], E2M1[1:8]):
            mid = (lo + hi) / 2
            ups = sum(E2M1[sr_e2m1(np.array([mid]), np.array([b]))[0]] == hi for b in range(256))
            self.assertEqual(ups, 128, mid)

    def test_against_reference(self):
        rs = np.random.RandomState(5)
        cases = [(1, 1, 0, 0), (3, 17, 1, 2), (37, 50, 2 ** 64 - 1, 2 ** 40 + 3),
                 (64, 128, 0x123456789ABCDEF, 7), (5, 300, 42, 2 ** 63)]
        for rows, cols, seed, stream in cases:
            x = random_matrix(rs, rows, cols)
            for per_row in (False, True):
                want = ref_sr(x, seed, stream, per_row)
                got = quant.quantize_nvfp4_sr(x, rows, cols, seed, stream, "te", per_row)
                for w, g, what in zip(want, got, ("codes", "scales", "s2")):
                    self.assertTrue(np.array_equal(w.view(np.uint8), g.view(np.uint8)),
                                    "%dx%d seed %d stream %d per_row %s %s"
                                    % (rows, cols, seed, stream, per_row, what))
                # the scales are parity_nvfp4_quantize's; te-2d's are te's here (1 x 16)
                rn = quant.quantize_nvfp4(x, rows, cols, "te", per_row)
                self.assertTrue(np.array_equal(rn[1], got[1]))
                self.assertEqual(rn[2].tobytes(), got[2].tobytes())
                g2 = quant.quantize_nvfp4_sr(x, rows, cols, seed, stream, "te-2d", per_row)
                self.assertTrue(all(np.array_equal(a.view(np.uint8), b.view(np.uint8))
                                    for a, b in zip(got, g2)))

    def test_counter_contract(self):
        """Same (seed, stream, tensor): the same codes on every CPU path; another seed or stream:
        other codes; a row's codes follow its elements' counters, not the call's shape."""
        rs = np.random.RandomState(6)
        x = random_matrix(rs, 40, 96)
        first = None
        for path in PATHS:
            parity.set_cpu_path(path)
            got = quant.quantize_nvfp4_sr(x, 40, 96, 1234, 5)[0]
            if first is None:
                first = got
            self.assertTrue(np.array_equal(got, first), path)
        parity.set_cpu_path(DEFAULT_PATH)
        other_seed = quant.quantize_nvfp4_sr(x, 40, 96, 1235, 5)[0]
        other_stream = quant.quantize_nvfp4_sr(x, 40, 96, 1234, 6)[0]
        print("codes that differ from seed 1234 stream 5: seed 1235 %d, stream 6 %d of %d"
              % ((other_seed != first).sum(), (other_stream != first).sum(), first.size))
        self.assertGreater((other_seed != first).sum(), first.size // 10)
        self.assertGreater((other_stream != first).sum(), first.size // 10)
        # per_row: row r alone, as a 1-row tensor, would count from 0; in the whole tensor it
        # counts from r * cols, so its codes are those of the counter r * cols + c
        r = 7
        whole = quant.quantize_nvfp4_sr(x, 40, 96, 99, 0, per_row=True)[0]
        alone = quant.quantize_nvfp4_sr(np.ascontiguousarray(x[r:r + 1]), 1, 96, 99, 0,
                                        per_row=True)[0]
        ref_alone = ref_sr(np.ascontiguousarray(x[r:r + 1]), 99, 0, True)[0]
        self.assertTrue(np.array_equal(alone, ref_alone))
        self.assertTrue(np.array_equal(whole[r], ref_sr(x, 99, 0, True)[0][r]))

    def test_unbiased(self):
        """The mean of many draws. Each 1 x 16 block holds one 6 (its amax, so its scale is
        exactly 6 / 6 * S... and m the same in every block) and 15 copies of a value v; the
        15 * 4096 copies take independent bytes (distinct counters). The exact mean of TE's
        rounding over the 256 bytes, E, is within step / 256 of the scaled value (8 bits);
        the sample mean is within 6 standard errors of E, step * sqrt(p (1 - p) / n) with p
        the fraction of bytes that round up (fixed seeds: the outcome is fixed; at 6 sigma a
        fresh seed fails with probability < 2e-9)."""
        blocks_n = 4096
        for v in (0.1, 0.3, 0.74, 1.1, 1.37, 2.2, 2.9, 3.3, 4.6, 5.5, -0.6, -3.7, -5.01):
            x = np.full((blocks_n, 16), v, dtype=F32)
            x[:, 0] = 6.0
            codes, sf, s2 = quant.quantize_nvfp4_sr(x.ravel(), 1, blocks_n * 16, 77, 3)
            m = F32(1.0) / (e4m3_value(sf[:, :1]).astype(F32) * s2[0]).astype(F32)
            scaled = F32(F32(v) * m[0, 0])
            q = E2M1[codes.reshape(blocks_n, 16)[:, 1:]].ravel()
            vals = E2M1[sr_e2m1(np.full(256, scaled, F32), np.arange(256))]
            exact = vals.mean()
            a = abs(float(scaled))
            step = 2.0 if a >= 4 else 1.0 if a >= 2 else 0.5
            self.assertLessEqual(abs(exact - float(scaled)), step / 256, v)
            lo = np.min(vals)
            p = float((vals != lo).mean())
            bound = 6 * step * np.sqrt(max(p * (1 - p), 1e-12) / q.size)
            self.assertLessEqual(abs(q.mean() - exact), bound + 1e-12,
                                 "v %g: mean %g, E %g" % (v, q.mean(), exact))

    def test_bad_input(self):
        """NaN and Inf refused naming the element, a quantizer of another format, per_row 2,
        NULL buffers: a status, and nothing written."""
        x = np.ones((2, 20), dtype=F32)
        x[1, 3] = np.nan
        codes = np.full(40, 0xAB, np.uint8)
        sf = np.full(4, 0xCD, np.uint8)
        s2 = np.full(2, 7.0, F32)
        q_te, q_mx = 8, 10  # PARITY_QUANT_NVFP4_TE, PARITY_QUANT_MXFP4_OCP
        calls = [
            (lambda q, pr, xx: lib.parity_nvfp4_quantize_sr(q, pr, 2, 20, xx, 20, 1, 2,
                                                            codes.ctypes.data, 20,
                                                            sf.ctypes.data, s2.ctypes.data)),
            (lambda q, pr, xx: lib.parity_nvfp4_quantize_2d(q, 2, 20, xx, 20, codes.ctypes.data,
                                                            20, sf.ctypes.data,
                                                            s2.ctypes.data))]
        for call in calls:
            for q, pr, xx, status in ((q_te, 0, x.ctypes.data, "PARITY_ERR_TENSOR_NONFINITE"),
                                      (q_mx, 0, x.ctypes.data, "PARITY_ERR_POLICY"),
                                      (q_te, 0, None, "PARITY_ERR_INVALID_ARGUMENT")):
                with self.assertRaises(parity.ParityError) as cm:
                    call(q, pr, xx)
                self.assertEqual(cm.exception.status, status)
                if status == "PARITY_ERR_TENSOR_NONFINITE":
                    self.assertIn("x[1][3] is NaN", cm.exception.message)
                self.assertTrue((codes == 0xAB).all() and (sf == 0xCD).all() and (s2 == 7).all())
        with self.assertRaises(parity.ParityError) as cm:
            calls[0](q_te, 2, np.ones((2, 20), dtype=F32).ctypes.data)
        self.assertEqual(cm.exception.status, "PARITY_ERR_INVALID_ARGUMENT")
        x[1, 3] = np.inf
        with self.assertRaisesRegex(parity.ParityError, r"x\[1\]\[3\] is Inf"):
            quant.quantize_nvfp4_sr(x, 2, 20, 1)
        self.assertTrue((codes == 0xAB).all())


class Hadamard(unittest.TestCase):
    def transform(self, x, sign_seed=0, signs=TE_SIGNS):
        """The definition in float64: each 16-block v -> H16 diag(signs) v / 4."""
        rows, cols = x.shape
        h = hadamard16() * signs[None, :] / 4.0
        return (x.astype(np.float64).reshape(rows, cols // 16, 16) @ h.T).reshape(rows, cols)

    def test_matrix_is_tes(self):
        """H16 diag(s) / 4 is orthogonal, and Sylvester's H16 is TE's get_hadamard_matrix: row r
        column c is (-1)^popcount(r & c)."""
        h = hadamard16()
        for r in range(16):
            for c in range(16):
                self.assertEqual(h[r, c], (-1) ** bin(r & c).count("1"))
        t = h * TE_SIGNS[None, :] / 4
        self.assertTrue(np.array_equal(t @ t.T, np.eye(16)))

    def test_exact(self):
        """Integers times one power of two (|x| < 2^19 of it): every partial sum is exact, so
        the output is the definition's exactly, in place too."""
        rs = np.random.RandomState(7)
        for rows, cols, e in ((1, 16, 0), (5, 64, -20), (33, 48, 30), (2, 4096, -3)):
            x = np.ldexp(rs.randint(-2 ** 19, 2 ** 19, (rows, cols)).astype(np.float64),
                         e).astype(F32)
            got = quant.rht16(x, rows, cols)
            self.assertTrue(np.array_equal(got.astype(np.float64), self.transform(x)))
            inplace = x.copy()
            lib.parity_rht16(rows, cols, inplace.ctypes.data, cols, 0, inplace.ctypes.data, cols)
            self.assertTrue(np.array_equal(inplace, got))

    def test_bound(self):
        """Arbitrary values: within 2^-22 sum |v| / 4 of the definition (the header's bound)."""
        rs = np.random.RandomState(8)
        x = random_matrix(rs, 64, 256)
        got = quant.rht16(x, 64, 256).astype(np.float64)
        want = self.transform(x)
        bound = np.repeat(np.abs(x.astype(np.float64)).reshape(64, 16, 16).sum(axis=2), 16,
                          axis=1) / 4 * 2.0 ** -22
        self.assertTrue(np.array_equal(got.astype(F32), rht_fp32(x)))  # the stated order
        err = np.abs(got - want)
        print("rht16: largest error / bound %.3g" % (err / bound).max())
        self.assertTrue((err <= bound).all())
        self.assertGreater((err > 0).sum(), 0)  # the bound is not vacuous: some sums round

    def test_sign_seed(self):
        """sign_seed s != 0: s_i = -1 where bit i of Philox(key s, counter 0)'s first word is
        set; the inverse transform (H diag(s) / 4 is orthogonal) gives x back."""
        rs = np.random.RandomState(9)
        x = np.ldexp(rs.randint(-1000, 1000, (3, 32)).astype(np.float64), -4).astype(F32)
        for seed in (1, 2 ** 64 - 1, 0xDEADBEEF12345678):
            w0 = int(philox(*[np.array([0], U64)] * 4, seed & 0xFFFFFFFF, seed >> 32)[0][0])
            signs = np.array([-1.0 if w0 >> i & 1 else 1.0 for i in range(16)])
            got = quant.rht16(x, 3, 32, seed)
            self.assertTrue(np.array_equal(got.astype(np.float64),
                                           self.transform(x, signs=signs)))
        self.assertFalse(np.array_equal(quant.rht16(x, 3, 32, 1), quant.rht16(x, 3, 32, 0)))

    def test_bad_input(self):
        x = np.ones((2, 32), dtype=F32)
        out = np.full((2, 32), 5.0, dtype=F32)
        for rows, cols, xx, ldo, status in ((2, 24, x.ctypes.data, 32, "INVALID_ARGUMENT"),
                                            (0, 32, x.ctypes.data, 32, "INVALID_ARGUMENT"),
                                            (2, 32, None, 32, "INVALID_ARGUMENT"),
                                            (2, 32, x.ctypes.data, 16, "INVALID_ARGUMENT")):
            with self.assertRaises(parity.ParityError) as cm:
                lib.parity_rht16(rows, cols, xx, 32, 0, out.ctypes.data, ldo)
            self.assertEqual(cm.exception.status, "PARITY_ERR_" + status)
        x[1, 31] = np.nan
        with self.assertRaises(parity.ParityError) as cm:
            lib.parity_rht16(2, 32, x.ctypes.data, 32, 0, out.ctypes.data, 32)
        self.assertEqual(cm.exception.status, "PARITY_ERR_TENSOR_NONFINITE")
        self.assertIn("x[1][31] is NaN", cm.exception.message)
        self.assertTrue((out == 5.0).all())


def te_rn(x):
    """test_quant's "te" reference, per tensor: (codes, block scale codes, s2, scale_rows 1)."""
    rows, cols = x.shape
    codes, scales = ref_nvfp4(x, "te", False)
    grid = -(-cols // 16)
    return codes, scales[:rows * grid].reshape(rows, grid), scales[rows * grid:].view(F32), 1


def transposed_padded(t):
    """tᵀ with its columns (the tokens) padded with zeros to a multiple of 16, float32."""
    cols = -(-t.shape[0] // 16) * 16
    out = np.zeros((t.shape[1], cols), dtype=F32)
    out[:, :t.shape[0]] = t.T
    return out


def te_nvfp4_gradients(x, w, dy, seed, stream):
    """dx and dW of the te-nvfp4 recipe (parity.Recipe("te-nvfp4").table()) from its
    definition: dgrad dx = dy W with dy row-wise 1 x 16, stochastically rounded (stream slot
    0 of the layer's stream * 8), and W's 16 x 16 tiles transposed; wgrad dW = dyᵀ x with dyᵀ
    and xᵀ (tokens padded with zeros to a multiple of 16) through the RHT, dyᵀ stochastically
    rounded (slot 1), xᵀ to nearest; per-tensor globals."""
    dy_q = ref_sr(dy, seed, stream * 8, False) + (1,)
    wc, wsf, ws2 = ref_2d(w)
    dx = nvfp4_gemm(dy_q, (wc.T, wsf.T, ws2, 16))
    dyt_q = ref_sr(rht_fp32(transposed_padded(dy)), seed, stream * 8 + 1, False) + (1,)
    dw = nvfp4_gemm(dyt_q, te_rn(rht_fp32(transposed_padded(x))))
    return dx, dw


try:
    import torch
except ImportError:
    torch = None


@unittest.skipUnless(torch is not None, "needs torch (Debian: python3-torch)")
class RecipeGradients(unittest.TestCase):
    """parity.torch.linear under aligned+nvfp4:te-2d with recipe te-nvfp4: the forward is
    parity_linear's (the sampler's), dx and dW equal te_nvfp4_gradients bit for bit."""

    def run_linear(self, x, w, dy, seed, stream, recipe="te-nvfp4"):
        from parity.torch import linear
        xt = torch.tensor(x, requires_grad=True)
        wt = torch.tensor(w, requires_grad=True)
        y = linear(xt, wt, policy="aligned+nvfp4:te-2d", recipe=recipe, seed=seed,
                   stream=stream)
        y.backward(torch.tensor(dy))
        return y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()

    def test_against_reference(self):
        rs = np.random.RandomState(10)
        for tokens, k, n, seed, stream in ((37, 70, 45, 3, 11), (32, 64, 48, 2 ** 63 + 5, 0),
                                           (5, 16, 20, 0, 2 ** 31)):
            x = random_matrix(rs, tokens, k)
            w = (rs.standard_normal((n, k)) * 0.05).astype(F32)
            dy = random_matrix(rs, tokens, n)
            y, dx, dw = self.run_linear(x, w, dy, seed, stream)
            want_dx, want_dw = te_nvfp4_gradients(x, w, dy, seed, stream)
            where = "%dx%dx%d seed %d stream %d" % (tokens, k, n, seed, stream)
            self.assertTrue(np.array_equal(dx.view(np.uint32), want_dx.view(np.uint32)),
                            "dx " + where)
            self.assertTrue(np.array_equal(dw.view(np.uint32), want_dw.view(np.uint32)),
                            "dW " + where)
            xc, xs = ref_nvfp4(x, "te", True)
            grid = -(-k // 16)
            want_y = nvfp4_gemm((xc, xs[:tokens * grid].reshape(tokens, grid),
                                 xs[tokens * grid:].view(F32), 1), ref_2d(w) + (16,))
            self.assertTrue(np.array_equal(y.view(np.uint32), want_y.view(np.uint32)),
                            "y " + where)

    def test_error_on_plain_data(self):
        """Informative: on N(0, 1) activations and gradients (no rows 10^6 apart, where a
        per-tensor scale leaves the small rows to the stochastic rounding's variance), the
        recipe's gradients against fp64 products of the unquantized values."""
        rs = np.random.RandomState(12)
        x, w = rs.standard_normal((256, 128)).astype(F32), rs.standard_normal((96, 128))
        w, dy = (w * 0.05).astype(F32), rs.standard_normal((256, 96)).astype(F32)
        _, dx, dw = self.run_linear(x, w, dy, 4, 4)
        exact_dx, exact_dw = dy.astype(np.float64) @ w, dy.T.astype(np.float64) @ x
        err_dx = np.linalg.norm(dx - exact_dx) / np.linalg.norm(exact_dx)
        err_dw = np.linalg.norm(dw - exact_dw) / np.linalg.norm(exact_dw)
        print("256x128x96: |dx - fp64| / |fp64| %.3f, |dW - fp64| / |fp64| %.3f"
              % (err_dx, err_dw))
        self.assertLess(max(err_dx, err_dw), 0.5)  # 4-bit operands: a coarse sanity bound

    def test_seed_keys_the_rounding(self):
        """Another seed or stream changes the stochastically rounded gradients; the same ones
        give the same bits again."""
        rs = np.random.RandomState(11)
        x, w, dy = random_matrix(rs, 32, 48), random_matrix(rs, 40, 48), random_matrix(rs, 32, 40)
        _, dx0, dw0 = self.run_linear(x, w, dy, 1, 1)
        _, dx1, dw1 = self.run_linear(x, w, dy, 1, 1)
        self.assertTrue(np.array_equal(dx0, dx1) and np.array_equal(dw0, dw1))
        for seed, stream in ((2, 1), (1, 2)):
            _, dx2, dw2 = self.run_linear(x, w, dy, seed, stream)
            self.assertFalse(np.array_equal(dx0, dx2))
            self.assertFalse(np.array_equal(dw0, dw2))


if __name__ == "__main__":
    harness.run("test_nvfp4_recipe")
