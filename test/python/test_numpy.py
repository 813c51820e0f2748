"""The binding with numpy arrays: token ids in, float32 arrays out; bf16 region buffers as
uint16 arrays (strided rows included).

    /usr/bin/python3 test/python/test_numpy.py BUILD_DIR

Needs numpy (Debian: python3-numpy); exits 77 (skipped) without it.
"""
import os
from array import array

import harness

BUILD = harness.setup()
np, = harness.require("the numpy tests", ["numpy"], "python3-numpy")

import unittest  # noqa: E402

import parity  # noqa: E402
from parity import ParityError, regions  # noqa: E402

REAL = os.path.join(harness.REPO, "models", "qwen3-bytes-pystdlib-4.9m")
TEXT = np.frombuffer(b"def parse(argv):\n    for i, arg in enumerate(argv):\n        "
                     b"if arg.startswith('--'):\n            yield i, arg[2:]\n", dtype=np.uint8)
rng = np.random.default_rng(5)


def bf16(values):
    """float64 values -> bf16 bits (uint16), round to nearest even through float32."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class TestScore(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.m = parity.Model(REAL, threads=2)

    @classmethod
    def tearDownClass(cls):
        cls.m.close()

    def test_one_sequence(self):
        want = self.m.score(TEXT.tolist(), policy="aligned")
        for dtype in (np.int32, np.int64, np.uint8, np.uint16, np.int16):
            got = self.m.score(TEXT.astype(dtype), policy="aligned")
            self.assertIsInstance(got, np.ndarray)
            self.assertEqual(got.dtype, np.float32)
            self.assertEqual(got.tobytes(), array("f", want).tobytes(), dtype)
        # a strided view is fine too
        wide = np.stack([TEXT, TEXT]).T.astype(np.int64)
        self.assertEqual(self.m.score(wide[:, 0], policy="aligned").tobytes(),
                         array("f", want).tobytes())

    def test_matrix_and_lists(self):
        rows = np.stack([TEXT[i:i + 40] for i in range(0, 50, 7)]).astype(np.int64)
        got = self.m.score(rows, policy="hf-eager", mode="processed", temperature=0.6)
        self.assertEqual(got.shape, (rows.shape[0], 39))
        for r, lp in zip(rows, got):
            one = self.m.score(r.tolist(), policy="hf-eager", mode="processed", temperature=0.6)
            self.assertEqual(lp.tobytes(), array("f", one).tobytes())
        mixed = self.m.score([rows[0], rows[1].tolist(), bytes(rows[2].astype(np.uint8))],
                             policy="hf-eager", mode="processed", temperature=0.6)
        self.assertIsInstance(mixed[0], np.ndarray)
        self.assertIsInstance(mixed[1], list)
        self.assertEqual([np.asarray(x, dtype=np.float32).tobytes() for x in mixed],
                         [got[i].tobytes() for i in range(3)])
        s = self.m.score(rows, policy="aligned", entropy=True, top_n=4)
        self.assertEqual(s.top_ids.shape, (rows.shape[0], 39, 4))
        self.assertEqual(s.top_logprobs.dtype, np.float32)
        self.assertEqual(s.entropy.shape, (rows.shape[0], 39))
        s1 = self.m.score(rows[0], policy="aligned", top_n=2)
        self.assertEqual(s1.top_ids.shape, (39, 2))
        self.assertTrue((s1.top_ids == s.top_ids[0, :, :2]).all())

    def test_errors(self):
        with self.assertRaises(TypeError):
            self.m.score(TEXT.astype(np.float32))
        with self.assertRaises(TypeError):
            self.m.score(np.zeros((2, 2, 2), dtype=np.int32))
        with self.assertRaises(ParityError) as e:
            self.m.score(np.array([1, 2 ** 40], dtype=np.int64))
        self.assertEqual(e.exception.status, "PARITY_ERR_TOKEN_RANGE")
        with self.assertRaises(ParityError) as e:
            self.m.score(np.array([1, 300], dtype=np.int64))
        self.assertEqual(e.exception.status, "PARITY_ERR_TOKEN_RANGE")
        with self.assertRaises(ParityError) as e:
            self.m.score(np.zeros((0, 5), dtype=np.int32))
        self.assertEqual(e.exception.status, "PARITY_ERR_EMPTY_INPUT")

    def test_generate(self):
        with self.m.sampler(policy="aligned", max_seqs=5) as s:
            a = s.generate(TEXT[:20], n=3, max_tokens=12, seed=4)
            b = s.generate(TEXT[:20].tolist(), n=3, max_tokens=12, seed=4)
            c = s.generate(np.stack([TEXT[:20], TEXT[:20]]), n=3, max_tokens=12, seed=4)
        self.assertEqual([x.to_json() for x in a], [x.to_json() for x in b])
        self.assertEqual([x.to_json() for x in c], [x.to_json() for x in b] * 2)


class TestRegions(unittest.TestCase):
    def test_against_array_buffers(self):
        rows, dim = 37, 1001
        d = bf16(rng.standard_normal((rows, dim)))
        r = bf16(rng.standard_normal((rows, dim)) * 4)
        w = bf16(1 + 0.1 * rng.standard_normal(dim))
        for pol in parity.policies():
            ro, o = regions.rmsnorm_residual(d, r, w, policy=pol)
            self.assertEqual((ro.shape, o.dtype), ((rows, dim), np.uint16))
            ro2, o2 = regions.rmsnorm_residual(array("H", d.tobytes()), array("H", r.tobytes()),
                                               array("H", w.tobytes()), policy=pol)
            self.assertEqual((ro.tobytes(), o.tobytes()), (ro2.tobytes(), o2.tobytes()))
            x = regions.rmsnorm(d, w, policy=pol)
            self.assertEqual(x.tobytes(), bytes(regions.rmsnorm(d.tobytes(), w, policy=pol)))
            g = regions.swiglu(d, r, policy=pol)
            self.assertEqual(g.tobytes(), regions.swiglu(bytearray(d.tobytes()), r.tobytes(),
                                                         policy=pol, dim=dim))

    def test_strided_rows_and_in_place(self):
        rows, dim = 20, 130
        big = bf16(rng.standard_normal((rows, dim + 30)))
        view = big[:, 5:5 + dim]  # row stride dim + 30
        w = bf16(1 + 0.1 * rng.standard_normal(dim))
        want = regions.rmsnorm(np.ascontiguousarray(view), w, policy="vllm")
        self.assertTrue((regions.rmsnorm(view, w, policy="vllm") == want).all())
        before = big.copy()
        regions.rmsnorm(view, w, policy="vllm", out=view)
        self.assertTrue((big[:, 5:5 + dim] == want).all())
        self.assertTrue((big[:, :5] == before[:, :5]).all())
        self.assertTrue((big[:, 5 + dim:] == before[:, 5 + dim:]).all())
        # 3-D activations (batch, seq, dim)
        x3 = bf16(rng.standard_normal((3, 7, dim)))
        y3 = regions.rmsnorm(x3, w, policy="aligned")
        self.assertEqual(y3.shape, x3.shape)
        self.assertTrue((y3.reshape(-1, dim) == regions.rmsnorm(x3.reshape(-1, dim), w,
                                                                  policy="aligned")).all())

    def test_rope_layouts(self):
        rows, heads, hd = 9, 4, 32
        x = bf16(rng.standard_normal((rows, heads, hd)))
        pos = np.arange(rows) * 3
        a = x.copy()
        self.assertIs(regions.rope(a, pos, policy="hf-eager", theta=1e6), a)
        b = x.reshape(rows, heads * hd).copy()
        regions.rope(b, pos.astype(np.int64), head_dim=hd, policy="hf-eager", theta=1e6)
        c = array("H", x.tobytes())
        regions.rope(c, pos.tolist(), head_dim=hd, policy="hf-eager", theta=1e6)
        self.assertEqual(a.tobytes(), b.tobytes())
        self.assertEqual(a.tobytes(), c.tobytes())
        # tokens with a stride (a slice of a fused qkv row)
        qkv = bf16(rng.standard_normal((rows, 3 * heads * hd)))
        q = qkv[:, :heads * hd].reshape(rows, heads, hd)
        regions.rope(q, pos, policy="hf-eager", theta=1e6)
        want = qkv[:, :heads * hd].copy()
        self.assertTrue((q.reshape(rows, -1) == want).all())

    def test_errors(self):
        w = bf16(np.ones(8))
        with self.assertRaisesRegex(TypeError, "float32"):
            regions.rmsnorm(np.ones((2, 8), dtype=np.float32), w)
        with self.assertRaisesRegex(TypeError, "int16"):
            regions.rmsnorm(np.ones((2, 8), dtype=np.int16), w)
        with self.assertRaisesRegex(TypeError, "contiguous"):
            regions.rmsnorm(bf16(np.ones((2, 16)))[:, ::2], w)
        ro = bf16(np.ones((2, 8)))
        ro.flags.writeable = False
        with self.assertRaisesRegex(TypeError, "read-only"):
            regions.rmsnorm(bf16(np.ones((2, 8))), w, out=ro)
        with self.assertRaises(ParityError):
            regions.rmsnorm(bf16(np.ones((2, 8))), w, out=bf16(np.ones((3, 8))))
        with self.assertRaises(TypeError):
            regions.rope(bf16(np.ones((2, 8))), np.array([0.5, 1.5]), head_dim=8)


class TestManifest(unittest.TestCase):
    """Weights as numpy arrays: read in place (uint16 bf16 bits, float16, float32), non-
    contiguous and big-endian arrays converted, all giving the checksum of the same values."""

    def test_checksums_and_update(self):
        from parity.manifest import checksum
        x = (rng.standard_normal((48, 40)) * 3).astype(np.float32)
        x[0, :4] = [np.nan, np.inf, -np.inf, 1e-40]
        want = checksum(("F32", x.shape, x.tobytes()))[1]
        self.assertEqual(checksum(x), (x.shape, want))
        self.assertEqual(checksum(bf16(x)), (x.shape, want))  # the RNE of the library
        wide = np.asfortranarray(x)
        self.assertEqual(checksum(wide), (x.shape, want))
        big = x.astype(">f4")
        self.assertEqual(checksum(big), (x.shape, want))
        ro = x.copy()
        ro.flags.writeable = False
        self.assertEqual(checksum(ro), (x.shape, want))
        self.assertEqual(checksum(("F32", x.shape, x)), (x.shape, want))
        t = np.ascontiguousarray(x.T)
        self.assertEqual(checksum(x.T), (t.shape, checksum(t)[1]))
        self.assertNotEqual(checksum(t)[1], want)
        h = x.astype(np.float16)
        self.assertEqual(checksum(h), (x.shape, checksum(("F32", x.shape,
                                                          h.astype(np.float32)))[1]))
        for bad in (x.astype(np.float64), x.astype(np.int32)):
            with self.assertRaises(TypeError):
                checksum(bad)
        # Model.update takes the same forms, and the model then verifies against the manifest
        with parity.Model("synthetic:tiny") as m:
            w = (rng.standard_normal((256, 64)) * 0.02).astype(np.float32)
            norm = np.ones(64 * 2, dtype=np.float32)[::2]  # non-contiguous
            tensors = {"model.embed_tokens.weight": w, "model.norm.weight": norm}
            m.update(tensors)
            path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "parity-np-%d.json" % os.getpid())
            try:
                m.write_manifest(path)
                with open(path) as f:
                    import json
                    theirs = json.load(f)["tensors"]
                for name, value in tensors.items():
                    self.assertEqual(theirs[name]["fnv1a64"], "%016x" % checksum(value)[1])
            finally:
                os.unlink(path)


if __name__ == "__main__":
    harness.run("python-numpy")
