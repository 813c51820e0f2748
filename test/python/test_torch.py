"""parity.torch against the C kernels, bitwise, for every preset (and modifiers and a mixed
Policy) on random bf16 inputs of odd sizes, on every CPU path the machine has.

    /usr/bin/python3 test/python/test_torch.py BUILD_DIR

Needs torch and numpy (Debian: python3-torch python3-numpy); exits 77 (skipped) without them.
"""

import harness

BUILD = harness.setup()
torch, np = harness.require("parity.torch tests", ["torch", "numpy"], "python3-torch python3-numpy")

import math  # noqa: E402
import random  # noqa: E402
import unittest  # noqa: E402
from fractions import Fraction  # noqa: E402

import parity  # noqa: E402
import parity.torch as pt  # noqa: E402
from parity import regions  # noqa: E402

POLICIES = parity.policies() + ["hf-eager+aligned", "vllm+fp32-head", "sglang+aligned",
                                 "hf-eager+fp16", "vllm+fp16", "aligned+fp16"]
MIXED = parity.Policy(norm_input="fp32", norm_weight="round-twice", qk_norm="round-once",
                      rope_table="fp32", rope_apply="per-op", swiglu="per-op")
ALL = POLICIES + [MIXED]
PATHS = harness.runnable_paths()
torch.manual_seed(1234)
GEN = np.random.default_rng(1234)


def bits(t):
    """A bf16 tensor's bit patterns as a numpy uint16 array (shares memory)."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def tensor(u16, pol=None):
    """The bit patterns as a bf16 tensor, or as an fp16 one for a policy with compute "fp16"
    (whose region buffers hold fp16 patterns)."""
    p = parity.Policy.from_name(pol) if isinstance(pol, str) else pol
    dtype = torch.float16 if p is not None and p.compute == 2 else torch.bfloat16
    return torch.from_numpy(np.ascontiguousarray(u16).view(np.int16)).view(dtype)


def random_bf16(rows, dim, kind):
    """rows x dim random bf16 bit patterns of a kind: "normal" (N(0, 1) times a per-row scale
    10^U(-3, 3)), "wide" (per-row scales 10^U(-35, 35): tiny and huge squares), "bits"
    (uniform finite bit patterns), "special" (normal with zeros, +-inf, NaN, subnormals)."""
    if kind == "bits":
        u = GEN.integers(0, 1 << 16, size=(rows, dim), dtype=np.uint32).astype(np.uint16)
        finite = (u & 0x7F80) != 0x7F80
        return np.where(finite, u, u & 0x807F)
    lo, hi = (-3, 3) if kind != "wide" else (-35, 35)
    scale = 10.0 ** GEN.uniform(lo, hi, size=(rows, 1))
    x = torch.from_numpy(GEN.standard_normal((rows, dim)) * scale).float()
    u = bits(x.to(torch.bfloat16)).copy()
    if kind == "special":
        n = u.size
        idx = GEN.integers(0, n, size=n // 50)
        u.reshape(-1)[idx] = GEN.choice(np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001,
                                                  0x807F, 0x0040], dtype=np.uint16),
                                        size=idx.size)
    return u


def weight(dim):
    w = 1.0 + 0.1 * GEN.standard_normal(dim)
    return bits(torch.from_numpy(w).float().to(torch.bfloat16)).copy()


class Bitwise(unittest.TestCase):
    def assert_bits(self, got, want, what):
        got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
        self.assertEqual(got.shape, want.shape, what)
        bad = np.nonzero(got != want)[0]
        if bad.size:
            i = bad[0]
            self.fail("%s: %d of %d elements differ, first at %d: torch 0x%04x, C 0x%04x"
                      % (what, bad.size, got.size, i, got[i], want[i]))

    def each_path(self, fn):
        saved = parity.cpu_path()
        try:
            for path in PATHS:
                parity.set_cpu_path(path)
                fn(path)
        finally:
            parity.set_cpu_path(saved)


class TestFma(unittest.TestCase):
    @staticmethod
    def exact_fmaf(a, b, c):
        """round_fp32(a * b + c) with rational arithmetic (normal results only)."""
        x = Fraction(a) * Fraction(b) + Fraction(c)
        if x == 0:
            return 0.0
        sign = -1 if x < 0 else 1
        x = abs(x)
        e = math.floor(math.log2(x))
        while Fraction(2) ** e > x:
            e -= 1
        while Fraction(2) ** (e + 1) <= x:
            e += 1
        ulp = Fraction(2) ** (e - 23)
        q, r = divmod(x, ulp)
        if r * 2 > ulp or (r * 2 == ulp and q % 2 == 1):
            q += 1
        return sign * float(q * ulp)

    def test_double_rounding_case(self):
        # a*b + c = 1 + 2^-23 + 2^-24 - 2^-70: just below a midpoint. Rounding to double
        # first lands on the midpoint and then ties to even (0x3f800002); fmaf gives 0x3f800001.
        a = torch.tensor([2.0 ** -24 + 2.0 ** -47])
        b = torch.tensor([1.0 - 2.0 ** -23])
        c = torch.tensor([1.0 + 2.0 ** -23])
        naive = (a.double() * b.double() + c.double()).float()
        self.assertEqual(naive.view(torch.int32).item(), 0x3F800002)
        self.assertEqual(pt.fmaf(a, b, c).view(torch.int32).item(), 0x3F800001)

    def test_random_against_rationals(self):
        rnd = random.Random(7)
        a, b, c = [], [], []
        for i in range(4000):
            x = rnd.uniform(-4, 4) * 2.0 ** rnd.randint(-20, 20)
            y = rnd.uniform(-4, 4) * 2.0 ** rnd.randint(-20, 20)
            x, y = float(np.float32(x)), float(np.float32(y))
            if i % 2:  # cancellation: c close to -x*y
                z = float(np.float32(-x * y * (1 + rnd.uniform(-1e-6, 1e-6))))
            else:
                z = float(np.float32(rnd.uniform(-4, 4) * 2.0 ** rnd.randint(-30, 30)))
            a.append(x), b.append(y), c.append(z)
        got = pt.fmaf(torch.tensor(a), torch.tensor(b), torch.tensor(c)).tolist()
        want = [float(np.float32(self.exact_fmaf(x, y, z))) for x, y, z in zip(a, b, c)]
        self.assertEqual(got, want)

    def test_sqrtf_correctly_rounded(self):
        """The RMSNorm's sqrtf: the correctly rounded fp32 root (as the C sqrtf) on 100,000
        values over the normal range and subnormals (torch.sqrt on float32 is one ulp off on
        about 15% of these under PyTorch 2.15's CPU kernels)."""
        from parity._torch_regions import _sqrtf
        rnd = random.Random(11)
        xs = [float(np.float32(rnd.uniform(1, 4) * 2.0 ** rnd.randint(-140, 125)))
              for _ in range(100000)] + [0.0, 1.0, 4.0, float(np.float32(3.4e38))]
        got = _sqrtf(torch.tensor(xs, dtype=torch.float32)).tolist()
        self.assertEqual(got, [float(np.float32(math.sqrt(x))) for x in xs])

    def test_expf_properties(self):
        x = torch.tensor([0.0, 1.0, -1.0, 88.72283, 89.0, -104.0, -103.97, float("nan"),
                          float("inf"), -float("inf")])
        e = pt.expf(x)
        self.assertEqual(e[0].item(), 1.0)
        self.assertTrue(abs(e[1].item() - math.e) < 3e-7)
        self.assertTrue(math.isfinite(e[3].item()) and math.isinf(e[4].item()))
        self.assertEqual(e[5].item(), 0.0)
        self.assertGreater(e[6].item(), 0.0)
        self.assertTrue(math.isnan(e[7].item()))
        self.assertEqual((e[8].item(), e[9].item()), (math.inf, 0.0))
        # within 1 ulp of the correctly rounded exp over a dense sweep
        xs = torch.linspace(-103.9, 88.7, 200001)
        got = pt.expf(xs).double()
        ref = torch.tensor([math.exp(v) for v in xs.double().tolist()]).float().double()
        ulp = (ref.float().view(torch.int32) + 1).view(torch.float32).double() - ref
        self.assertLessEqual(((got - ref).abs() / ulp).max().item(), 1.0 + 1e-9)


class TestRegions(Bitwise):
    def test_rmsnorm_residual(self):
        cases = [(263, 1001, "normal"), (61, 4099, "wide"), (1000, 7, "bits"),
                 (97, 1024, "special"),
                 (3, 16, "normal"), (1, 1, "wide")]
        data = [(random_bf16(r, d, k), random_bf16(r, d, k), weight(d)) for r, d, k in cases]

        def run(path):
            for (rows, dim, kind), (d, r, w) in zip(cases, data):
                for pol in ALL:
                    ro_t, o_t = pt.rmsnorm_residual(tensor(d, pol), tensor(r, pol), tensor(w, pol), 1e-6, pol)
                    ro_c, o_c = regions.rmsnorm_residual(d, r, w, policy=pol, eps=1e-6)
                    what = "rmsnorm_residual %s %dx%d %s %s" % (path, rows, dim, kind, pol)
                    self.assert_bits(bits(ro_t), ro_c, what + " residual_out")
                    self.assert_bits(bits(o_t), o_c, what + " out")
        self.each_path(run)

    def test_rmsnorm_and_qk_norm(self):
        cases = [(2049, 128, "normal"), (777, 127, "wide"), (301, 999, "bits"),
                 (150, 2048, "special"), (5, 33, "normal")]
        data = [(random_bf16(r, d, k), weight(d)) for r, d, k in cases]

        def run(path):
            for (rows, dim, kind), (x, w) in zip(cases, data):
                for pol in ALL:
                    for qk in (False, True):
                        got = pt.rmsnorm(tensor(x, pol), tensor(w, pol), 1e-6, pol, qk_norm=qk)
                        want = regions.rmsnorm(x, w, policy=pol, eps=1e-6, qk_norm=qk)
                        self.assert_bits(bits(got), want, "rmsnorm %s %dx%d %s %s qk=%s"
                                         % (path, rows, dim, kind, pol, qk))
            # another eps
            x, w = data[0]
            self.assert_bits(bits(pt.rmsnorm(tensor(x), tensor(w), 1e-5, "aligned")),
                             regions.rmsnorm(x, w, policy="aligned", eps=1e-5), "eps 1e-5")
        self.each_path(run)

    def test_swiglu_every_gate(self):
        """Every bf16 gate value against several up values (524,288 elements), plus random."""
        gate = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        ups = [1.0, -1.0, 3.0, 0.3, -7.5, 1e-30, 3e35, 0.0]
        g8 = np.tile(gate, len(ups)).reshape(len(ups), -1)
        u8 = np.stack([bits(torch.full((1 << 16,), v).to(torch.bfloat16)) for v in ups])
        rg, ru = random_bf16(333, 1001, "normal"), random_bf16(333, 1001, "wide")

        def run(path):
            for pol in ALL:
                self.assert_bits(bits(pt.swiglu(tensor(g8, pol), tensor(u8, pol), pol)),
                                 regions.swiglu(g8, u8, policy=pol), "swiglu all gates %s %s"
                                 % (path, pol))
                self.assert_bits(bits(pt.swiglu(tensor(rg, pol), tensor(ru, pol), pol)),
                                 regions.swiglu(rg, ru, policy=pol), "swiglu random %s %s"
                                 % (path, pol))
        self.each_path(run)

    def test_rope(self):
        cases = [(257, 7, 126, 1e6, "normal"), (100, 16, 128, 1e4, "wide"),
                 (61, 3, 2, 10000.0, "bits"), (33, 5, 64, 5e5, "special")]
        data = []
        for rows, heads, hd, theta, kind in cases:
            x = random_bf16(rows, heads * hd, kind).reshape(rows, heads, hd)
            pos = GEN.integers(0, 40960, size=rows).astype(np.int32)
            pos[:3] = [0, 1, 40959]
            data.append((x, pos))

        def run(path):
            for (rows, heads, hd, theta, kind), (x, pos) in zip(cases, data):
                for pol in ALL:
                    got = pt.rope(tensor(x, pol), torch.from_numpy(pos).long()[:, None], theta, pol)
                    want = x.copy()
                    regions.rope(want, pos, policy=pol, theta=theta)
                    self.assert_bits(bits(got), want, "rope %s %dx%dx%d %s %s"
                                     % (path, rows, heads, hd, kind, pol))
        self.each_path(run)

    def test_hf_layout_and_tables(self):
        # (batch, heads, seq, head_dim) with positions (batch, 1, seq)
        b, h, s, d = 2, 3, 17, 64
        x = random_bf16(b * h * s, d, "normal").reshape(b, h, s, d)
        pos = np.stack([np.arange(s), np.arange(100, 100 + s)]).astype(np.int32)
        got = pt.rope(tensor(x), torch.from_numpy(pos)[:, None, :], 1e6, "hf-eager")
        for i in range(b):
            want = np.ascontiguousarray(x[i].transpose(1, 0, 2))  # (seq, heads, hd)
            regions.rope(want, pos[i], policy="hf-eager", theta=1e6)
            self.assert_bits(bits(got[i]).transpose(1, 0, 2), want, "hf layout")
        cos, sin = pt.rope_cos_sin(torch.tensor([[0, 5]]), 8, 1e4, "hf-eager")
        self.assertEqual(tuple(cos.shape), (1, 2, 4))
        self.assertEqual(cos[0, 0].tolist(), [1.0] * 4)
        self.assertEqual(cos.to(torch.bfloat16).float().tolist(), cos.tolist())  # bf16 table


class TestAutograd(Bitwise):
    def test_gradients_flow_and_values_stay_exact(self):
        rows, dim = 37, 301
        d, r, w = random_bf16(rows, dim, "normal"), random_bf16(rows, dim, "normal"), weight(dim)
        for pol in ("aligned", "hf-eager", "fp32"):
            dt, rt, wt = tensor(d).requires_grad_(), tensor(r).requires_grad_(), \
                tensor(w).requires_grad_()
            ro, o = pt.rmsnorm_residual(dt, rt, wt, 1e-6, pol)
            self.assert_bits(bits(o.detach()), regions.rmsnorm_residual(d, r, w, policy=pol)[1],
                             "rmsnorm_residual with grad " + pol)
            (o.float().square().sum() + ro.float().sum()).backward()
            for t in (dt, rt, wt):
                self.assertIsNotNone(t.grad)
                self.assertTrue(torch.isfinite(t.grad.float()).all())
            g = tensor(d).requires_grad_()
            u = tensor(r).requires_grad_()
            y = pt.swiglu(g, u, pol)
            self.assert_bits(bits(y.detach()), regions.swiglu(d, r, policy=pol),
                             "swiglu with grad " + pol)
            y.float().sum().backward()
            gf, uf = g.detach().float(), u.detach().float()
            sg = torch.sigmoid(gf)
            ref = uf * (sg + gf * sg * (1 - sg))  # d(silu(g) * u)/dg
            mask = ref.abs() > 1e-2
            rel = ((g.grad.float() - ref).abs() / ref.abs())[mask]
            self.assertGreater((rel < 0.02).float().mean().item(), 0.99)
            x = tensor(d[:, :300].copy()).reshape(rows, 3, 100).requires_grad_()
            pos = torch.arange(rows)[:, None]
            yr = pt.rope(x, pos, 1e4, pol)
            yr.float().sum().backward()
            self.assertIsNotNone(x.grad)

    def test_type_errors(self):
        with self.assertRaises(TypeError):
            pt.swiglu(torch.zeros(4), torch.zeros(4), "aligned")
        with self.assertRaises(TypeError):
            pt.rmsnorm(torch.zeros(4, dtype=torch.bfloat16), [1, 2, 3, 4])
        with self.assertRaises(parity.ParityError):
            pt.swiglu(torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16),
                      "no-such-preset")


class TestManifest(unittest.TestCase):
    """Weights as torch tensors: read through their data pointers (no numpy in between),
    non-contiguous ones copied in row-major order, gradients ignored."""

    def test_checksums(self):
        from parity.manifest import checksum
        x = torch.randn(33, 20) * 3
        want = checksum(x.numpy())[1]
        self.assertEqual(checksum(x), ((33, 20), want))
        self.assertEqual(checksum(x.to(torch.bfloat16)), ((33, 20), want))  # the same RNE
        self.assertEqual(checksum(x.clone().requires_grad_()), ((33, 20), want))
        self.assertEqual(checksum(x.t()), ((20, 33), checksum(x.t().contiguous().numpy())[1]))
        h = x.to(torch.float16)
        self.assertEqual(checksum(h), ((33, 20), checksum(h.numpy())[1]))
        with self.assertRaises(TypeError):
            checksum(x.double())


if __name__ == "__main__":
    harness.run("python-torch")
