"""Tests of the ctypes binding (python/parity) with the standard library alone.

    python3 test/python/test_binding.py BUILD_DIR

Checks that Model.score returns bitwise what parity-score prints (its text and its --out
float32 file) and Sampler.generate exactly what parity-generate prints, for several policies,
modes and truncations; the low-level sampler calls; the region functions on Python buffers
(against each other and against the known answers in test/data/regions.safetensors); error
handling; thread safety and that the GIL is released during long calls.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from array import array

import harness

BUILD = harness.setup()
import parity  # noqa: E402
from parity import ParityError, regions  # noqa: E402

SCORE = harness.tool(BUILD, "parity-score")
GENERATE = harness.tool(BUILD, "parity-generate")
REAL = os.path.join(harness.REPO, "models", "qwen3-bytes-pystdlib-4.9m")
TEXT = (b"import os\nimport sys\n\n\ndef main(argv=None):\n    \"\"\"Parse the arguments.\"\"\"\n"
        b"    if argv is None:\n        argv = sys.argv[1:]\n    for name in argv:\n"
        b"        print(os.path.basename(name))\n    return 0\n")
TMP = tempfile.mkdtemp(prefix="parity-pytest-")


def f32_bits(values):
    return array("f", values).tobytes()


def write(name, data):
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def cli(*args):
    p = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode:
        raise AssertionError("%s failed (%d): %s" % (" ".join(args), p.returncode,
                                                     p.stderr.decode()))
    return p.stdout.decode()


def tokens_file(tokens):
    return write("tok-%d.txt" % abs(hash(tuple(tokens))), " ".join(map(str, tokens)).encode())


def cli_score(model, policy, tokens, *extra):
    """parity-score's text output parsed to floats, its --out file, and its raw lines."""
    path = tokens_file(tokens)
    out = os.path.join(TMP, "lp.f32")
    text = cli(SCORE, "--model", model, "--policy", policy, "--tokens", path, *extra)
    cli(SCORE, "--model", model, "--policy", policy, "--tokens", path, "--out", out, *extra)
    with open(out, "rb") as f:
        raw = f.read()
    lines = text.split()
    return [float(x) for x in lines], raw, lines


def cli_generate(model, policy, prompt, *extra):
    text = cli(GENERATE, "--model", model, "--policy", policy, "--prompt-tokens",
               tokens_file(prompt), *extra)
    return text.splitlines()


class Models:
    tiny = None
    real = None

    @classmethod
    def get(cls):
        if cls.tiny is None:
            cls.tiny = parity.Model("synthetic:tiny", threads=2)
            cls.real = parity.Model(REAL, threads=2)
        return cls.tiny, cls.real


class TestLoading(unittest.TestCase):
    def test_abi(self):
        self.assertEqual(parity.ABI_VERSION, 3)
        self.assertEqual(parity.lib.parity_abi_version(), parity.ABI_VERSION)
        import ctypes
        from parity import _lib
        for name, struct_ in _lib.MIRRORED_STRUCTS.items():
            self.assertEqual(parity.lib.parity_struct_size(name.encode()), ctypes.sizeof(struct_))
        self.assertEqual(parity.lib.parity_struct_size(b"nonsense"), 0)
        self.assertEqual(os.path.realpath(parity.LIBRARY_PATH),
                         os.path.realpath(os.environ["PARITY_LIBRARY"]))

    def test_abi_mismatch_messages(self):
        from parity import _lib

        class Fake:
            def __init__(self, abi, delta):
                self.abi, self.delta = abi, delta

            def parity_abi_version(self):
                return self.abi

            def parity_struct_size(self, name):
                import ctypes
                s = ctypes.sizeof(_lib.MIRRORED_STRUCTS[name.decode()])
                return s + self.delta if name == b"parity_sampling" else s

        with self.assertRaisesRegex(ImportError, "ABI version 4.*mirrors ABI 3.*[Rr]ebuild"):
            _lib._check_abi(Fake(4, 0), "/x/libparity.so")
        with self.assertRaisesRegex(ImportError,
                                    "parity_sampling is 136 bytes in the library, 128 in"):
            _lib._check_abi(Fake(3, 8), "/x/libparity.so")

    def _import_with(self, env_update, cwd=None):
        env = dict(os.environ)
        env.pop("PARITY_LIBRARY", None)
        env.update(env_update)
        env["PYTHONPATH"] = os.path.join(harness.REPO, "python")
        return subprocess.run([sys.executable, "-c", "import parity; print(parity.LIBRARY_PATH)"],
                              env=env, cwd=cwd or TMP, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)

    def test_torch_is_optional(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(harness.REPO, "python"))
        code = ("import sys, parity\nassert 'torch' not in sys.modules and 'numpy' not in "
                "sys.modules\ntry:\n    import torch\nexcept ImportError:\n    try:\n"
                "        import parity.torch\n    except ImportError as e:\n        print(e)\n"
                "else:\n    import parity.torch\n    print('imported')\n")
        p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = p.stdout.decode()
        self.assertTrue(out.startswith("parity.torch needs PyTorch") or out == "imported\n", out)

    def test_bad_library_path_falls_through(self):
        """PARITY_LIBRARY naming a file that is not the library: the build tree is used, and a
        warning names what failed."""
        rel = os.path.relpath(BUILD, harness.REPO)
        if rel.startswith("..") or not rel.startswith("build"):
            self.skipTest("the build directory %s is not <repo>/build*" % BUILD)
        junk = write("not-a-library.so", b"this is not an ELF file\n")
        p = self._import_with({"PARITY_LIBRARY": junk})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.decode().strip().startswith(os.path.join(harness.REPO, "build")))
        err = p.stderr.decode()
        self.assertIn("RuntimeWarning", err)
        self.assertIn("PARITY_LIBRARY: %s: " % junk, err)

    def test_every_candidate_fails(self):
        """An installed copy of the package (no source tree around it) with PARITY_LIBRARY
        naming a file that is not the library: every place is tried and named with its
        reason — unless a libparity is installed on this machine, which is then what loads."""
        import shutil
        from parity import _lib
        site = tempfile.mkdtemp(prefix="site-", dir=TMP)
        shutil.copytree(os.path.join(harness.REPO, "python", "parity"),
                        os.path.join(site, "parity"))
        junk = write("junk.so", b"\x7fELF but not really")
        env = dict(os.environ, PARITY_LIBRARY=junk, PYTHONPATH=site)
        code = "import parity; print(parity.LIBRARY_PATH)"
        p = subprocess.run([sys.executable, "-c", code], env=env, cwd=site,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        installed = [path for where, path in _lib.candidates()
                     if where in ("installed", "dynamic linker search",
                                  "ctypes.util.find_library") and path]
        if p.returncode == 0:  # this machine has a libparity installed: it must be one of those
            got = p.stdout.decode().strip()
            self.assertIn(got, installed)
            self.assertIn("PARITY_LIBRARY: %s" % junk, p.stderr.decode())
            return
        err = p.stderr.decode()
        self.assertIn("ImportError: parity: no usable libparity; tried, in order:", err)
        self.assertIn("PARITY_LIBRARY: %s: " % junk, err)
        self.assertIn("build tree: not in a source tree", err)
        for path in installed:
            self.assertIn(": %s: " % path, err)
        self.assertIn("dynamic linker search: libparity.so.0: ", err)
        self.assertIn("ctypes.util.find_library: ", err)
        # each place on its own line, in the order tried
        lines = [ln.strip() for ln in err.split("tried, in order:\n")[1].splitlines()]
        self.assertEqual([ln.split(":")[0] for ln in lines[:2]], ["PARITY_LIBRARY", "build tree"])
        hint = next(i for i, ln in enumerate(lines) if ln.startswith("build it with"))
        self.assertEqual(lines[hint - 1].split(":")[0], "ctypes.util.find_library")

    def test_load_tries_each_place(self):
        from parity import _lib
        import ctypes.util
        junk = write("also-junk.so", b"not a library")
        libm = ctypes.util.find_library("m")
        places = [("PARITY_LIBRARY", junk), ("build tree", "/nonexistent/libparity.so"),
                  ("installed", TMP), ("other", libm), ("ctypes.util.find_library", None)]
        with self.assertRaises(ImportError) as e:
            _lib.load(places)
        msg = str(e.exception)
        self.assertIn("PARITY_LIBRARY: %s: " % junk, msg)
        self.assertIn("build tree: /nonexistent/libparity.so: no such file", msg)
        self.assertIn("installed: %s: a directory" % TMP, msg)
        self.assertIn("other: %s: it lacks parity_version()" % libm, msg)
        self.assertIn("ctypes.util.find_library: nothing found", msg)
        self.assertEqual([ln.split(":")[0].strip() for ln in msg.splitlines()[1:6]],
                         [w for w, _ in places])
        # a good place after bad ones: used, with a warning naming the ones worth naming (the
        # place the user asked for; a file that is there but is not the library), not the
        # usual places where nothing is installed
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            handle, path, tables = _lib.load(places[:3] + [("good", parity.LIBRARY_PATH)])
        self.assertEqual(path, parity.LIBRARY_PATH)
        self.assertEqual(handle.parity_abi_version(), parity.ABI_VERSION)
        self.assertEqual(tables["backends"], parity.model.BACKENDS)
        self.assertEqual(len(caught), 1)
        self.assertIn("PARITY_LIBRARY: %s" % junk, str(caught[0].message))
        self.assertIn("installed: %s: a directory" % TMP, str(caught[0].message))
        self.assertNotIn("/nonexistent/libparity.so", str(caught[0].message))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, path, _ = _lib.load([places[1], ("good", parity.LIBRARY_PATH)])
        self.assertEqual(path, parity.LIBRARY_PATH)
        self.assertEqual(caught, [])

    def test_load_names_a_place_reached_twice(self):
        """A place that resolves to one tried before (a venv's lib64, a symbolic link to its
        lib) is named in the error with the place it repeats, and not opened again."""
        from parity import _lib
        lib_dir = tempfile.mkdtemp(prefix="lib-", dir=TMP)
        lib64 = os.path.join(TMP, "lib64-of-" + os.path.basename(lib_dir))
        os.symlink(lib_dir, lib64)
        junk = os.path.join(lib_dir, "libparity.so")
        with open(junk, "wb") as f:
            f.write(b"not a library")
        twice = os.path.join(lib64, "libparity.so")
        with self.assertRaises(ImportError) as e:
            _lib.load([("installed", junk), ("installed", twice)])
        lines = str(e.exception).splitlines()[1:3]
        self.assertTrue(lines[0].strip().startswith("installed: %s: " % junk), lines)
        self.assertEqual(lines[1].strip(), "installed: %s: the same place as %s (tried above)"
                         % (twice, junk))

    def test_enum_mirrors(self):
        from parity import _lib
        lib = parity.lib
        tables = _lib.check_mirrors(lib, "lib")
        self.assertEqual(tables, {"backends": parity.model.BACKENDS,
                                  "modes": parity.model.MODES, "archs": _lib.ARCHS,
                                  "cpu_paths": _lib.CPU_PATHS})
        # the tables are the library's names, each value round-tripping
        for table, name_fn in (("backends", lib.parity_backend_name),
                               ("modes", lib.parity_logprob_mode_name),
                               ("archs", lib.parity_arch_name),
                               ("cpu_paths", lib.parity_cpu_path_name)):
            self.assertTrue(tables[table], table)
            for name, value in tables[table].items():
                self.assertEqual(name_fn(value).decode(), name)
        self.assertEqual(set(parity.model.BACKENDS), {"bf16", "openblas", "amx"})
        runs = parity.backends()
        self.assertEqual(runs[0], "bf16")
        if "openblas" not in runs:  # a build with -Dopenblas=disabled: refused with the reason
            with self.assertRaisesRegex(parity.ParityError, "built without OpenBLAS"):
                Models.get()[0].score([1, 2, 3], backend="openblas")
        else:
            self.assertEqual(runs[:2], ["bf16", "openblas"])
        self.assertLessEqual(set(runs), set(parity.model.BACKENDS))
        if "amx" not in runs:  # refused with the reason
            with self.assertRaisesRegex(parity.ParityError, "amx backend is not available"):
                Models.get()[0].score([1, 2, 3], backend="amx")
        self.assertEqual(list(parity.model.MODES), ["raw", "processed", "processed-truncated"])
        self.assertEqual(parity.cpu_paths()[0], "portable")
        self.assertIn(parity.cpu_path(), parity.cpu_paths())
        for name, code in _lib.STATUSES.items():
            self.assertEqual(parity.status_name(code), name)
        # a wrong mirror is caught, named
        with self.assertRaisesRegex(ImportError, "status -41 is PARITY_ERR_EMPTY_INPUT in the "
                                    "library, PARITY_ERR_TOKEN_RANGE in the binding"):
            _lib.check_mirrors(lib, "lib", statuses={"PARITY_ERR_TOKEN_RANGE": -41})
        with self.assertRaisesRegex(ImportError, "default backend 'cuda' is not one of the "
                                    "library's \\(bf16, openblas, amx\\)"):
            _lib.check_mirrors(lib, "lib", defaults={"backends": "cuda"})
        with self.assertRaisesRegex(ImportError, "default mode 'logits'"):
            _lib.check_mirrors(lib, "lib", defaults={"modes": "logits"})
        with self.assertRaisesRegex(ImportError, "dtypes BF16=0, F16=2, F32=1"):
            _lib.check_mirrors(lib, "lib", dtypes={"BF16": 0, "F16": 2, "F32": 1})
        with self.assertRaisesRegex(ImportError, "dtypes"):
            _lib.check_mirrors(lib, "lib", dtypes={"BF16": 0, "F16": 1})  # F32 = 2 left over
        with self.assertRaises(ParityError) as e:
            parity.set_cpu_path("avx1024")
        self.assertIn("portable", e.exception.message)


class TestScore(unittest.TestCase):
    def setUp(self):
        self.tiny, self.real = Models.get()

    def check_against_cli(self, model, spec, policy, tokens, py_kwargs, cli_args):
        floats, raw, lines = cli_score(spec, policy, tokens, *cli_args)
        got = model.score(tokens, policy=policy, **py_kwargs)
        self.assertEqual(len(got), len(tokens) - 1)
        self.assertEqual(f32_bits(got), raw, "%s %s: not bitwise what parity-score wrote"
                         % (policy, cli_args))
        self.assertEqual(["%.9g" % v for v in got], lines)
        self.assertEqual(f32_bits(got), f32_bits(floats))
        return got

    def test_weight_bytes(self):
        """Model.weight_bytes mirrors parity_model_bytes: the decoder's linear weights read once
        a step, 2 bytes a parameter in bf16, 1 a code and 4 a 128 x 128 block's scale under
        fp8-block, two E2M1 codes a byte (a row's odd last code a byte of its own) and 1 a 1 x 16
        block's E4M3 scale under nvfp4, ternary codes four a byte (a row's in groups of 64 in 16
        bytes) and 4 for each weight's scale; the head the same under all; what a policy keeps
        within what is held."""
        c = self.tiny.config
        hd, h, inter = c["head_dim"], c["hidden_size"], c["intermediate_size"]
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        shapes = [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]
        params = c["num_hidden_layers"] * sum(r * k for r, k in shapes)
        grid = c["num_hidden_layers"] * sum(-(-r // 128) * -(-k // 128) for r, k in shapes)
        ternary_codes = c["num_hidden_layers"] * sum(r * -(-k // 64) * 16 for r, k in shapes)
        nv_codes = c["num_hidden_layers"] * sum(r * -(-k // 2) for r, k in shapes)
        nv_grid = c["num_hidden_layers"] * sum(r * -(-k // 16) for r, k in shapes)
        bf16 = self.tiny.weight_bytes("vllm")
        fp8 = self.tiny.weight_bytes("vllm+fp8-block:deepseek")
        nvfp4 = self.tiny.weight_bytes("vllm+nvfp4:modelopt")
        ternary = self.tiny.weight_bytes("vllm+ternary:bitnet")
        self.assertEqual(bf16["step_linear"], 2 * params)
        self.assertEqual(fp8["step_linear"], params + 4 * grid)
        self.assertEqual(nvfp4["step_linear"], nv_codes + nv_grid)
        self.assertEqual(ternary["step_linear"], ternary_codes + 4 * 7 * c["num_hidden_layers"])
        for b in (fp8, nvfp4, ternary):
            self.assertEqual(bf16["step_head"], b["step_head"])
        self.assertEqual(bf16["embedding_row"], 2 * h)
        for b in (bf16, fp8, nvfp4, ternary):
            self.assertTrue(0 < b["held_for_policy"] <= b["held"], b)
        with self.assertRaises((ValueError, ParityError)):
            self.tiny.weight_bytes("vllm", backend="no-such-backend")
        with self.assertRaises(ParityError):
            self.tiny.weight_bytes("no-such-policy")

    def test_config_and_policies(self):
        c = self.tiny.config
        self.assertEqual((c["arch"], c["vocab_size"], c["hidden_size"], c["qk_norm"]),
                         ("qwen3", 256, 64, True))
        self.assertEqual(self.real.config["num_hidden_layers"], 6)
        self.assertEqual(c["mlp_only_layers"], [])
        with parity.Model("synthetic:qwen3-moe-tiny") as moe:
            m = moe.config
            self.assertEqual((m["arch"], m["num_experts"], m["num_experts_per_tok"],
                              m["moe_intermediate_size"], m["norm_topk_prob"],
                              m["decoder_sparse_step"], m["mlp_only_layers"]),
                             ("qwen3_moe", 8, 2, 32, 1, 1, [1]))
            m["mlp_only_layers"].append(2)
            self.assertEqual(moe.config["mlp_only_layers"], [1])
        self.assertEqual(parity.policies(),
                         ["fp32", "hf-eager", "hf-sdpa", "vllm", "sglang", "aligned"])
        p = parity.Policy.from_name("hf-eager+aligned")
        self.assertEqual((p.attention, p.swiglu, p.norm_input), (0, 1, 1))
        self.assertEqual(parity.Policy(), parity.Policy.from_name("hf-eager"))
        self.assertEqual(parity.Policy.from_name("vllm").replace(logits="fp32", temperature=1),
                         parity.Policy.from_name("vllm+fp32-head"))
        self.assertEqual(parity.Policy.from_name("vllm").replace(compute="fp16"),
                         parity.Policy.from_name("vllm+fp16"))
        with self.assertRaises(parity.ParityError):
            parity.Policy.from_name("fp32+fp16")
        self.assertEqual(parity.Policy.from_name("vllm+fp8-block:te-pow2").names()["quantizer"],
                         "te-pow2")
        # Every format and rule the library names: the switches by name (no int left), and the
        # names set back give the same policy.
        rules = {"fp8-block": ["deepseek", "sglang", "te", "deepgemm", "te-pow2"],
                 "mxfp8": ["ocp", "te"], "nvfp4": ["modelopt", "te", "torchao", "te-2d"],
                 "mxfp4": ["ocp", "rceil", "microxcaling"],
                 "ternary": ["bitnet", "hf-bitlinear", "onebitllms"]}
        seen = set()
        for fmt, names in rules.items():
            for rule in names:
                pol = parity.Policy.from_name("hf-eager+%s:%s" % (fmt, rule))
                named = pol.names()
                self.assertEqual(named["gemm"], fmt)
                self.assertIsInstance(named["quantizer"], str)
                self.assertEqual(parity.Policy(**named), pol)
                seen.add(named["quantizer"])
        self.assertEqual(len(seen), 17)
        with self.assertRaises(parity.ParityError) as cm:
            parity.Policy.from_name("nonsense")
        self.assertIn("fp8-block, mxfp8, nvfp4, mxfp4, ternary)", str(cm.exception))
        self.assertIn("tiny", parity.builtin_configs())

    def test_quantizers_without_numpy(self):
        """parity.quant on array('f'): a 2 x 2 block of amax 896 (deepseek's scale 2), MXFP8's
        two rules on a block of amax 500 (FLOOR saturates at 2^0, RCEIL takes 2^1)."""
        from array import array
        codes, scales = parity.quant.quantize_fp8_blocks(array("f", [896.0, -3.0, 1.0, 0.0]), 2, 2,
                                                         "deepseek", (2, 2))
        self.assertEqual((codes, list(scales)), (bytes([0x7E, 0xBC, 0x30, 0x00]), [2.0]))
        row = array("f", [500.0] + [1.0] * 31)
        self.assertEqual(parity.quant.quantize_mxfp8(row, 1, 32, "ocp")[1], bytes([127]))
        self.assertEqual(parity.quant.quantize_mxfp8(row, 1, 32, "te")[1], bytes([128]))
        self.assertEqual(parity.quant.fp8_from_f32(array("f", [448.0, 465.0]), "e4m3", False),
                         bytes([0x7E, 0x7F]))
        self.assertEqual(list(parity.quant.fp8_to_f32(bytes([0x38, 0xC4]))), [1.0, -3.0])
        self.assertEqual(parity.quant.fp16_from_f32(65520.0), 0x7C00)
        ties = array("f", [0.25, 0.75, 1.75, 5.0, 1e9, -2.6])
        self.assertEqual(parity.quant.fp4_from_f32(ties), bytes([0, 2, 4, 6, 7, 0xD]))
        self.assertEqual(parity.quant.fp4_from_f32(ties, "half-away"), bytes([1, 2, 4, 7, 7, 0xD]))
        self.assertEqual(list(parity.quant.fp4_to_f32(bytes([0x7, 0xB]))), [6.0, -1.5])
        self.assertEqual(parity.quant.fp4_pack(bytes([1, 2, 3])), bytes([0x21, 0x03]))
        self.assertEqual(parity.quant.fp4_unpack(bytes([0x21, 0x03]), 3), bytes([1, 2, 3]))
        with self.assertRaises(parity.ParityError):
            parity.quant.fp4_from_f32(array("f", [float("nan")]))
        with self.assertRaises(parity.ParityError):
            parity.quant.fp4_to_f32(bytes([0x10]))
        with self.assertRaises(parity.ParityError):
            parity.quant.quantize_fp8_blocks(array("f", [1.0]), 1, 1, "no-such-rule")
        with self.assertRaises(TypeError):
            parity.quant.quantize_mxfp8(array("d", [1.0]), 1, 1)

    def test_save_layouts(self):
        """Model.save in each layout loads back: fp8-block:deepseek, bitnet:RULE, nvfp4:RULE
        (ModelOpt's layout, with hf_quant_config.json) and mxfp4:RULE score as
        the bf16 model quantized at load (bitwise), fp16 as the model under +fp16, fp32 under
        fp32."""
        import tempfile
        seq = [[(i * 37 + 11) % 256 for i in range(40)]]
        with tempfile.TemporaryDirectory(prefix="parity-save-") as d:
            for layout, policy in (("fp8-block:deepseek", "vllm+fp8-block:deepseek"),
                                   ("bitnet:bitnet", "hf-eager+ternary:bitnet"),
                                   ("bitnet:hf-bitlinear", "hf-eager+ternary:hf-bitlinear"),
                                   ("nvfp4:modelopt", "vllm+nvfp4:modelopt"),
                                   ("nvfp4:te", "vllm+nvfp4:te"),
                                   ("mxfp4:ocp", "vllm+mxfp4:ocp"),
                                   ("mxfp4:rceil", "vllm+mxfp4:rceil"),
                                   ("fp16", "hf-eager+fp16"), ("fp32", "fp32"), ("bf16", "vllm")):
                path = os.path.join(d, layout.replace(":", "-"))
                self.tiny.save(path, layout=layout)
                back = parity.Model(path, threads=2)
                self.assertEqual(f32_bits(back.score(seq, policy=policy)[0]),
                                 f32_bits(self.tiny.score(seq, policy=policy)[0]), layout)
                back.close()
                self.assertEqual(os.path.exists(os.path.join(path, "hf_quant_config.json")),
                                 layout.startswith("nvfp4"), layout)
            with self.assertRaises(parity.ParityError) as e:
                self.tiny.save(os.path.join(d, "x"), layout="int4")
            self.assertEqual(e.exception.code, -1)
            with self.assertRaises(parity.ParityError) as e:
                self.tiny.save(os.path.join(d, "y"), layout="fp8-block")
            self.assertIn("fp8-block:RULE", str(e.exception))

    def _masters_in_sampler(self, d):
        """The tiny model saved as fp32 in d: its tensors {name: (array, shape)}, the same as
        float32 masters for Model.update, and a new tiny Model (2 threads) updated with them."""
        self.tiny.save(os.path.join(d, "f32"), layout="fp32")
        tensors, _ = load_safetensors(os.path.join(d, "f32", "model.safetensors"))
        masters = {k: ("F32", tuple(shape), arr) for k, (arr, shape) in tensors.items()}
        sampler = parity.Model("synthetic:tiny", threads=2)
        sampler.update(masters)
        return tensors, masters, sampler

    def test_fp8_sync(self):
        """The learner's fp8 manifest written in Python from its float32 masters
        (parity.write_manifest with a policy) is the library's (Model.write_manifest with the
        same policy) and verifies a sampler that received the masters; a sampler that
        quantizes with te-pow2 fails the quantizer identity check on every linear weight; a
        layer the learner keeps in bf16 is reported; codes shipped as F8_E4M3 verify too."""
        import tempfile
        ds = "vllm+fp8-block:deepseek"
        with tempfile.TemporaryDirectory(prefix="parity-fp8-sync-") as d:
            tensors, masters, sampler = self._masters_in_sampler(d)
            mine, theirs = os.path.join(d, "learner.json"), os.path.join(d, "library.json")
            parity.write_manifest(mine, masters, version=1, policy=ds)
            sampler.write_manifest(theirs, policy=ds)
            with open(mine) as f, open(theirs) as g:
                self.assertEqual(json.load(f), json.load(g))
            self.assertEqual(sampler.verify(mine, policy=ds), [])
            self.assertEqual(sampler.verify(mine), [])
            lines = sampler.verify(mine, policy="vllm+fp8-block:te-pow2")
            self.assertEqual(len(lines), 14)
            self.assertTrue(all("quantizer identity" in l and "only the quantizer differs" in l
                                for l in lines), lines)
            kept = "model.layers.1.mlp.up_proj"
            parity.write_manifest(mine, masters, version=1, policy=ds, kept=[kept])
            lines = sampler.verify(mine, policy=ds)
            self.assertEqual(len(lines), 1)
            self.assertIn(kept + ".weight: kept in bf16: the learner keeps it in bf16", lines[0])
            with self.assertRaises(TypeError):
                parity.write_manifest(mine, {"model.layers.0.mlp.up_proj.weight":
                                             ("BF16", (160, 64), bytes(2 * 160 * 64))}, policy=ds)
            # codes and scales shipped to a third model verify against the same manifest
            codes = {}
            for name, (arr, shape) in tensors.items():
                if ".layers." in name and name.endswith("_proj.weight"):
                    c, sc = parity.quant.quantize_fp8_blocks(arr, shape[0], shape[1], "deepseek")
                    codes[name] = ("F8_E4M3", shape, c)
                    codes[name + "_scale_inv"] = ("F32", (-(-shape[0] // 128), -(-shape[1] // 128)), sc)
                else:
                    codes[name] = masters[name]
            shipped = parity.Model("synthetic:tiny", threads=2)
            shipped.update(codes)
            parity.write_manifest(mine, masters, version=1, policy=ds)
            self.assertEqual(shipped.verify(mine, policy=ds), [])
            self.assertEqual(f32_bits(shipped.score([[1, 2, 3, 4, 5]], policy=ds)[0]),
                             f32_bits(sampler.score([[1, 2, 3, 4, 5]], policy=ds)[0]))
            sampler.close()
            shipped.close()

    def test_lowbit_sync(self):
        """The manifests of the 4-bit and ternary policies: the learner's, written in Python
        from its float32 masters, is the library's and verifies the sampler that received the
        masters; a sampler quantizing with another rule of the format fails the quantizer
        identity check on every linear weight (only the quantizer differs); a sampler of
        another format is told so; an NVFP4 checkpoint the library wrote (shipped codes)
        verifies against the learner's manifest of its rule."""
        import tempfile
        cases = (("vllm+nvfp4:modelopt", "vllm+nvfp4:te"), ("vllm+mxfp4:ocp", "vllm+mxfp4:rceil"),
                 ("hf-eager+ternary:bitnet", "hf-eager+ternary:hf-bitlinear"))
        with tempfile.TemporaryDirectory(prefix="parity-lowbit-sync-") as d:
            _, masters, sampler = self._masters_in_sampler(d)
            mine, theirs = os.path.join(d, "learner.json"), os.path.join(d, "library.json")
            for pol, other in cases:
                parity.write_manifest(mine, masters, version=1, policy=pol)
                sampler.write_manifest(theirs, policy=pol)
                with open(mine) as f, open(theirs) as g:
                    self.assertEqual(json.load(f), json.load(g), pol)
                self.assertEqual(sampler.verify(mine, policy=pol), [], pol)
                self.assertEqual(sampler.verify(mine), [], pol)
                # (the rules agree on some weights: NVFP4's modelopt and te differ in a few codes)
                lines = sampler.verify(mine, policy=other)
                self.assertTrue(1 <= len(lines) <= 14, (pol, lines))
                self.assertTrue(all("quantizer identity" in l and "only the quantizer differs" in l
                                    for l in lines), lines)
                lines = sampler.verify(mine, policy="vllm+fp8-block:deepseek")
                self.assertEqual(len(lines), 14, (pol, lines))
                self.assertTrue(all("format differs" in l for l in lines), lines)
            # shipped NVFP4 codes: the checkpoint written with modelopt's rule from the masters
            f32 = parity.Model(os.path.join(d, "f32"), threads=2)
            f32.save(os.path.join(d, "nv"), layout="nvfp4:modelopt")
            f32.close()
            shipped = parity.Model(os.path.join(d, "nv"), threads=2)
            parity.write_manifest(mine, masters, version=0, policy="vllm+nvfp4:modelopt")
            lines = shipped.verify(mine, policy="vllm+nvfp4:modelopt")
            # the embedding, norms and lm_head hold bf16 casts of the masters: equal checksums
            self.assertEqual(lines, [])
            shipped.close()
            sampler.close()

    def test_acceptance_one_liner(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(harness.REPO, "python"))
        p = subprocess.run([sys.executable, "-c", "import parity; m = parity.Model("
                            "'synthetic:tiny'); print(m.score([[1,2,3,4]], policy='aligned'))"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout.decode())
        self.assertEqual(len(got), 1)
        self.assertEqual(["%.9g" % v for v in got[0]],
                         cli_score("synthetic:tiny", "aligned", [1, 2, 3, 4])[2])

    def test_policies_modes_match_cli(self):
        toks = list(TEXT[:97])
        cases = [
            ({}, []),
            (dict(mode="processed", temperature=0.7), ["--temperature", "0.7"]),
            (dict(mode="processed-truncated", temperature=0.9, top_k=20, top_p=0.9, min_p=0.02),
             ["--temperature", "0.9", "--logprob-mode", "processed-truncated", "--top-k", "20",
              "--top-p", "0.9", "--min-p", "0.02"]),
            (dict(mode="processed-truncated", temperature=0.0),
             ["--temperature", "0", "--logprob-mode", "processed-truncated"]),
            (dict(mode="raw", temperature=0.5), ["--temperature", "0.5", "--logprob-mode", "raw"]),
        ]
        for policy in ["aligned", "hf-eager", "hf-sdpa", "vllm", "sglang", "fp32",
                       "hf-eager+aligned", "vllm+fp32-head"]:
            for kw, args in cases:
                with self.subTest(policy=policy, args=args):
                    self.check_against_cli(self.real, REAL, policy, toks, kw, args)
        got = self.check_against_cli(self.real, REAL, "aligned", toks,
                                     dict(mode="processed-truncated", temperature=0.0),
                                     ["--temperature", "0", "--logprob-mode",
                                      "processed-truncated"])
        self.assertIn(float("-inf"), got)  # greedy's support is the arg max alone
        for policy in ["aligned", "hf-eager"]:
            if "openblas" in parity.backends():
                self.check_against_cli(self.tiny, "synthetic:tiny", policy,
                                       [5, 9, 200, 3, 3, 7, 1], dict(backend="openblas"),
                                       ["--backend", "openblas"])
            if "amx" in parity.backends():
                self.check_against_cli(self.real, REAL, policy, toks, dict(backend="amx"),
                                       ["--backend", "amx"])
        seeded = parity.Model("synthetic:tiny:42")
        self.check_against_cli(seeded, "synthetic:tiny:42", "hf-eager", list(range(0, 256, 3)),
                               dict(threads=1), ["--threads", "2"])
        seeded.close()

    def test_batch_invariance_and_shapes(self):
        seqs = [list(TEXT[i:i + n]) for i, n in [(0, 40), (5, 1), (17, 2), (30, 100), (3, 16)]]
        many = self.real.score(seqs, policy="hf-eager")
        self.assertEqual([len(x) for x in many], [39, 0, 1, 99, 15])
        for s, lp in zip(seqs, many):
            self.assertEqual(f32_bits(self.real.score(s, policy="hf-eager", threads=1)),
                             f32_bits(lp))
        rev = self.real.score(seqs[::-1], policy="hf-eager", threads=3)
        self.assertEqual([f32_bits(x) for x in rev[::-1]], [f32_bits(x) for x in many])
        # input kinds: bytes, array('i'), array('H'), tuple, a list of bytes
        ref = self.real.score(list(TEXT[:50]), policy="vllm")
        for kind in (TEXT[:50], bytearray(TEXT[:50]), array("i", list(TEXT[:50])),
                     array("H", list(TEXT[:50])),
                     tuple(TEXT[:50]), memoryview(TEXT[:50])):
            self.assertEqual(f32_bits(self.real.score(kind, policy="vllm")), f32_bits(ref))
        both = self.real.score([TEXT[:50], array("i", list(TEXT[:50]))], policy="vllm")
        self.assertEqual([f32_bits(x) for x in both], [f32_bits(ref)] * 2)
        self.assertEqual(self.real.score([TEXT[:50]], policy="vllm"), [ref])

    def test_entropy_and_top(self):
        s = self.real.score(TEXT[:30], policy="aligned", entropy=True, top_n=3)
        self.assertIsInstance(s, parity.Scores)
        self.assertEqual(len(s.entropy), 29)
        self.assertEqual(len(s.top_ids), 29)
        self.assertTrue(all(len(t) == 3 for t in s.top_ids))
        for lp, ids, tlp, nxt in zip(s.logprobs, s.top_ids, s.top_logprobs, TEXT[1:30]):
            self.assertGreaterEqual(tlp[0], tlp[1])
            if ids[0] == nxt:
                self.assertEqual(tlp[0], lp)
        self.assertTrue(all(e >= 0 for e in s.entropy))
        s2 = self.real.score([TEXT[:30], TEXT[:5]], policy="aligned", top_n=1)
        self.assertIsNone(s2.entropy)
        self.assertEqual(s2.top_ids[0], s.top_ids and [t[:1] for t in s.top_ids])
        self.assertEqual(len(s2.top_ids[1]), 4)

    def test_long_sequence_grows_scorer(self):
        m = parity.Model("synthetic:tiny", max_tokens=32)
        toks = [i % 256 for i in range(300)]
        lp = m.score(toks, policy="aligned")
        self.assertEqual(f32_bits(lp), cli_score("synthetic:tiny", "aligned", toks)[1])
        with self.assertRaises(ParityError) as e:
            m.score([0] * 513, policy="aligned")
        self.assertEqual(e.exception.status, "PARITY_ERR_TOO_LONG")
        m.close()


class TestGenerate(unittest.TestCase):
    def setUp(self):
        self.tiny, self.real = Models.get()

    def compare(self, model, spec, policy, prompt, n, max_tokens, extra, **kw):
        args = ["--n", str(n), "--max-tokens", str(max_tokens)] + extra
        want = cli_generate(spec, policy, prompt, *args)
        self.assertEqual(len(want), n)
        with model.sampler(policy=policy) as s:
            got = s.generate(prompt, n=n, max_tokens=max_tokens, **kw)
        self.assertEqual([c.to_json() for c in got], want)
        for c, line in zip(got, want):
            d = json.loads(line)
            self.assertEqual(c.tokens, d["tokens"])
            self.assertEqual(f32_bits(c.logprobs), f32_bits(d["logprobs"]))
            self.assertEqual((c.index, c.prompt_len), (d["index"], d["prompt_len"]))
        # the CLI-sized sampler of Model.generate gives the same
        again = model.generate(prompt, n=n, max_tokens=max_tokens, policy=policy, **kw)
        self.assertEqual([c.to_json() for c in again], want)
        return got

    def test_matches_cli(self):
        prompt = list(TEXT[:40])
        self.compare(self.real, REAL, "aligned", prompt, 4, 24, ["--seed", "7", "--batch", "2"],
                     seed=7, batch=2)
        self.compare(self.real, REAL, "hf-eager", prompt, 3, 20,
                     ["--temperature", "0.8", "--top-k", "12", "--top-p", "0.9", "--seed", "3",
                      "--logprob-mode", "processed"],
                     temperature=0.8, top_k=12, top_p=0.9, seed=3, mode="processed")
        self.compare(self.real, REAL, "vllm", prompt, 5, 30,
                     ["--temperature", "0.7", "--min-p", "0.05", "--seed", "11", "--batch", "3",
                      "--logprob-mode", "processed-truncated", "--stop", "10", "--stop", "58"],
                     temperature=0.7, min_p=0.05, seed=11, batch=3, mode="processed-truncated",
                     stop=[10, 58])
        got = self.compare(self.real, REAL, "aligned", prompt, 2, 25,
                           ["--temperature", "0", "--threads", "2"], temperature=0)
        self.assertEqual(got[0].tokens, got[1].tokens)  # greedy
        got = self.compare(self.tiny, "synthetic:tiny", "sglang", [1, 2, 3], 4, 40,
                           ["--seed", "5", "--stop", "7", "--batch", "2"], seed=5, stop=[7],
                           batch=2)
        self.assertEqual({c.finish_reason for c in got} <= {"stop", "length"}, True)

    def test_looped_exit_depths_and_replay(self):
        """A looped model (Ouro): early exit, the exit depths parity-generate prints, and the
        scorer replaying Completion.schedule() under the same KV rule, bit for bit."""
        spec = "synthetic:ouro-tiny:5"
        prompt = list(TEXT[:12])
        with parity.Model(spec) as m:
            T = m.config["total_ut_steps"]
            for kv in ("last-exited", "full"):
                want = cli_generate(spec, "vllm", prompt, "--n", "3", "--max-tokens", "9",
                                    "--seed", "2", "--exit-rule", "threshold",
                                    "--exit-threshold", "0.55", "--loop-kv", kv)
                with m.sampler(policy="vllm", loop_kv=kv) as s:
                    got = s.generate(prompt, n=3, max_tokens=9, seed=2, exit_rule="threshold",
                                     exit_threshold=0.55)
                self.assertEqual([c.to_json() for c in got], want)
                for c in got:
                    self.assertEqual(c.exit_depths[0], T)  # the prompt's last token: all loops
                    self.assertTrue(all(1 <= d <= T for d in c.exit_depths))
                    self.assertEqual(len(c.schedule(T)), len(prompt) + len(c.tokens))
                    lp = m.score(prompt + c.tokens, policy="vllm", depths=c.schedule(T),
                                 loop_kv=c.loop_kv)
                    self.assertEqual(f32_bits(lp[len(prompt) - 1:]), f32_bits(c.logprobs))
                    # the schedule knows its KV rule: replayed by default, another refused
                    self.assertEqual(c.schedule(T).loop_kv, kv)
                    lp = m.score(prompt + c.tokens, policy="vllm", depths=c.schedule(T))
                    self.assertEqual(f32_bits(lp[len(prompt) - 1:]), f32_bits(c.logprobs))
                    other = "full" if kv == "last-exited" else "last-exited"
                    with self.assertRaisesRegex(parity.ParityError,
                                                "sampled with loop_kv '%s', not '%s'" % (kv, other)):
                        m.score(prompt + c.tokens, policy="vllm", depths=c.schedule(T),
                                loop_kv=other)
                many = m.score([prompt + c.tokens for c in got], policy="vllm",
                               depths=[c.schedule(T) for c in got])
                self.assertEqual([f32_bits(lp[len(prompt) - 1:]) for lp in many],
                                 [f32_bits(c.logprobs) for c in got])
            with self.assertRaisesRegex(parity.ParityError, "one depth per token"):
                m.score([1, 2, 3], policy="vllm", depths=[T, T])
            with self.assertRaisesRegex(parity.ParityError, "depth 0"):
                m.score([1, 2, 3], policy="vllm", depths=[T, 0, 1])
            with self.assertRaisesRegex(parity.ParityError, "loop_kv"):
                m.score([1, 2, 3], policy="vllm", loop_kv="shared")
        with self.assertRaisesRegex(parity.ParityError, "does not loop"):
            self.tiny.generate([1, 2], n=1, max_tokens=2, exit_rule="fixed", max_depth=1)
        with self.assertRaisesRegex(parity.ParityError, "does not loop"):
            self.tiny.score([1, 2, 3], loop_logprobs=True)

    def test_looped_dense_readouts(self):
        """The dense learner's readouts of a looped model: every loop's log-probs (the last
        the dense learner's), a chosen loop, the expected logits; bitwise what one loop read
        alone gives, and the same for a batch as one by one."""
        seqs = [list(TEXT[:15]), list(TEXT[20:31])]
        with parity.Model("synthetic:ouro-tiny:5") as m:
            T = m.config["total_ut_steps"]
            for pol in ("hf-eager", "aligned"):
                every = m.score(seqs, policy=pol, loop_logprobs=True)
                dense = m.score(seqs, policy=pol)
                self.assertEqual([f32_bits(x) for x in every.logprobs], [f32_bits(x) for x in dense])
                for i, seq in enumerate(seqs):
                    self.assertEqual(len(every.loop_logprobs[i]), len(seq) - 1)
                    self.assertTrue(all(len(row) == T for row in every.loop_logprobs[i]))
                    self.assertEqual(f32_bits([row[T - 1] for row in every.loop_logprobs[i]]),
                                     f32_bits(dense[i]))
                for k in range(1, T + 1):
                    lp = m.score(seqs[1], policy=pol, readout=k)
                    self.assertEqual(f32_bits(lp), f32_bits([r[k - 1] for r in every.loop_logprobs[1]]))
                mix = m.score(seqs, policy=pol, readout="expected-logits")
                alone = [m.score(seq, policy=pol, readout="expected-logits") for seq in seqs]
                self.assertEqual([f32_bits(x) for x in mix], [f32_bits(x) for x in alone])
                self.assertNotEqual(f32_bits(mix[0]), f32_bits(dense[0]))
            with self.assertRaisesRegex(parity.ParityError, "readout_loop 9 is not in 1..4"):
                m.score(seqs[0], readout=9)
            with self.assertRaisesRegex(parity.ParityError, "readout must be one of"):
                m.score(seqs[0], readout="mean")
            with self.assertRaisesRegex(parity.ParityError, "dense learner"):
                m.score(seqs[0], readout="expected-logits", depths=[T] * len(seqs[0]))
        with parity.Model("synthetic:ouro-tiny-fixed:5") as m:
            with self.assertRaisesRegex(parity.ParityError, "no exit gate"):
                m.score(seqs[0], readout="expected-logits")
        self.assertIsNone(self.tiny.generate([1, 2], n=1, max_tokens=2)[0].exit_depths)

    def test_finish_reasons_and_scoring_parity(self):
        prompt = list(TEXT[:20])
        with self.real.sampler(policy="hf-eager", max_len=30) as s:
            got = s.generate(prompt, n=3, max_tokens=50, temperature=0.9, seed=1, stop=[10],
                             mode="processed")
        for c in got:
            self.assertIn(c.finish_reason, ("stop", "capacity"))
            if c.finish_reason == "stop":
                self.assertEqual(c.tokens[-1], 10)
            else:
                self.assertEqual(c.prompt_len + len(c.tokens), 30)
            # the sampler's log-probs are the scorer's, bitwise
            lp = self.real.score(prompt + c.tokens, policy="hf-eager", mode="processed",
                                 temperature=0.9)
            self.assertEqual(f32_bits(lp[len(prompt) - 1:]), f32_bits(c.logprobs))
        # a prefaulted sampler (its cache written at creation) draws the same bits
        with self.real.sampler(policy="hf-eager", max_len=30, prefault=True) as s:
            again = s.generate(prompt, n=3, max_tokens=50, temperature=0.9, seed=1, stop=[10],
                               mode="processed")
        self.assertEqual([(c.tokens, f32_bits(c.logprobs)) for c in again],
                         [(c.tokens, f32_bits(c.logprobs)) for c in got])
        with self.real.sampler(policy="aligned", max_len=20) as s:
            full = s.generate(prompt, n=2, max_tokens=5)
        self.assertEqual([(c.tokens, c.finish_reason) for c in full], [([], "capacity")] * 2)

    def test_many_prompts(self):
        prompts = [list(TEXT[:12]), TEXT[40:41], list(TEXT[60:90])]
        with self.real.sampler(policy="aligned", max_seqs=4) as s:
            together = s.generate(prompts, n=3, max_tokens=9, seed=2, temperature=1.1)
            self.assertEqual([(c.prompt_index, c.index) for c in together],
                             [(p, i) for p in range(3) for i in range(3)])
            for p, prompt in enumerate(prompts):
                alone = s.generate(prompt, n=3, max_tokens=9, seed=2, temperature=1.1, batch=1)
                self.assertEqual([c.to_json() for c in alone],
                                 [c.to_json() for c in together[3 * p:3 * p + 3]])

    def test_low_level(self):
        prompt = list(TEXT[:10])
        with self.real.sampler(policy="aligned", max_seqs=4) as s:
            parent = s.add(prompt, stream=0, seed=9, max_tokens=3)
            kids = [s.fork(parent, stream=i, seed=9, max_tokens=3, top_n=2) for i in range(2)]
            self.assertEqual(s.tokens(kids[0]), (prompt, 10))
            steps = []
            for _ in range(3):
                steps.append(s.step(kids, max_top_n=2))
            self.assertEqual([st.finish_reason for st in steps[-1]], ["length", "length"])
            self.assertEqual(len(steps[0][0].top_ids), 2)
            toks, plen = s.tokens(kids[1])
            self.assertEqual(toks, prompt + [st[1].token for st in steps])
            with self.assertRaises(ParityError) as e:
                s.step(kids)
            self.assertEqual(e.exception.status, "PARITY_ERR_SEQUENCE_FINISHED")
            for k in kids + [parent]:
                s.release(k)
            with self.assertRaises(ParityError) as e:
                s.release(parent)
            self.assertEqual(e.exception.status, "PARITY_ERR_UNKNOWN_SEQUENCE")
            # the same draws through generate()
            gen = s.generate(prompt, n=2, max_tokens=3, seed=9)
            self.assertEqual([c.tokens for c in gen],
                             [[st[i].token for st in steps] for i in range(2)])
            self.assertEqual([f32_bits(c.logprobs) for c in gen],
                             [f32_bits([st[i].logprob for st in steps]) for i in range(2)])
            with self.assertRaises(ParityError) as e:
                s.generate(prompt, n=8, batch=5)
            self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")
            with self.assertRaises(ParityError) as e:
                for i in range(5):
                    s.add(prompt)
            self.assertEqual(e.exception.status, "PARITY_ERR_CACHE_FULL")
        with self.assertRaises(ParityError):
            s.add(prompt)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        code = {"BF16": "H", "I32": "i", "F32": "f"}[t["dtype"]]
        arr = array(code)
        arr.frombytes(body[a:b])
        out[name] = (arr, t["shape"])
    return out, header.get("__metadata__", {})


class TestRegions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.vec, cls.meta = load_safetensors(
            os.path.join(harness.REPO, "test", "data", "regions.safetensors"))

    def agree(self, got, want, what):
        """The known answers' bar: >= 99.9% bitwise equal, the rest within one bf16 ulp."""
        got, want = array("H", bytes(got)) if isinstance(got, bytearray) else got, want
        self.assertEqual(len(got), len(want))
        equal = sum(1 for a, b in zip(got, want) if a == b)
        worse = sum(1 for a, b in zip(got, want) if a != b and abs(a - b) > 1)
        self.assertGreaterEqual(equal / len(want), 0.999, what)
        self.assertEqual(worse, 0, what)

    def test_known_answers(self):
        v = self.vec
        names = {"hf_bf16": "hf-eager", "vllm": "vllm", "aligned": "aligned"}
        for case in ("resnorm", "resnorm_odd"):
            rows, dim = v[case + ".delta"][1]
            for mode, policy in names.items():
                r_out, out = regions.rmsnorm_residual(v[case + ".delta"][0],
                                                      v[case + ".residual"][0],
                                                      v[case + ".weight"][0], policy=policy,
                                                      eps=1e-6)
                self.agree(out, v["%s.%s.out" % (case, mode)][0], case + mode)
                self.assertEqual(r_out, v["%s.%s.residual_out" % (case, mode)][0])
        for mode in ("hf_bf16", "aligned"):
            out = regions.rmsnorm(v["qknorm.x"][0], v["qknorm.weight"][0], policy=names[mode],
                                  eps=1e-6, qk_norm=True)
            self.agree(out, v["qknorm.%s.out" % mode][0], "qknorm " + mode)
            for case in ("swiglu", "swiglu_odd"):
                rows, dim = v[case + ".gate"][1]
                out = regions.swiglu(v[case + ".gate"][0], v[case + ".up"][0], policy=names[mode],
                                     rows=rows, dim=dim)
                self.agree(out, v["%s.%s.out" % (case, mode)][0], case + mode)
        for case in ("rope", "rope_small"):
            rows, heads, hd = v[case + ".x"][1]
            for mode, policy in names.items():
                x = array("H", v[case + ".x"][0])
                res = regions.rope(x, v[case + ".positions"][0], head_dim=hd, policy=policy,
                                   theta=float(self.meta[case + ".theta"]))
                self.assertIs(res, x)
                self.agree(x, v["%s.%s.out" % (case, mode)][0], case + mode)

    def test_buffer_kinds_and_in_place(self):
        v = self.vec
        d, r = v["resnorm_odd.delta"][0], v["resnorm_odd.residual"][0]
        w = v["resnorm_odd.weight"][0]
        ro, o = regions.rmsnorm_residual(d, r, w, policy="hf-eager")
        self.assertIsInstance(o, array)
        ro2, o2 = regions.rmsnorm_residual(bytearray(d.tobytes()), bytes(r.tobytes()),
                                           memoryview(w), policy="hf-eager")
        self.assertIsInstance(o2, bytearray)
        self.assertEqual((bytes(o2), bytes(ro2)), (o.tobytes(), ro.tobytes()))
        dd, rr = array("H", d), array("H", r)
        res = regions.rmsnorm_residual(dd, rr, w, policy="hf-eager", out=dd, residual_out=rr)
        self.assertIs(res[0], rr)
        self.assertEqual((dd, rr), (o, ro))
        # rows are independent
        part = regions.rmsnorm_residual(d[1000:3000], r[1000:3000], w, policy="hf-eager")[1]
        self.assertEqual(part, o[1000:3000])
        x = v["qknorm.x"][0]
        a = regions.rmsnorm(x, v["qknorm.weight"][0], policy="sglang", qk_norm=True)
        xx = array("H", x)
        regions.rmsnorm(xx, v["qknorm.weight"][0], policy="sglang", qk_norm=True, out=xx)
        self.assertEqual(xx, a)
        g, u = v["swiglu_odd.gate"][0], v["swiglu_odd.up"][0]
        s1 = regions.swiglu(g, u, policy="hf-eager")
        s2 = regions.swiglu(g, u, policy="hf-eager", rows=7, dim=1001)
        uu = array("H", u)
        regions.swiglu(g, uu, policy="hf-eager", out=uu)
        self.assertEqual((s1, s2), (uu, uu))
        # the fp32 preset and a Policy object
        pol = parity.Policy(compute="fp32")
        self.assertEqual(regions.swiglu(g, u, policy=pol), regions.swiglu(g, u, policy="fp32"))

    def test_rope_reference(self):
        """RoPE against a pure-Python model of the C arithmetic (fp32 products, libm tables)."""
        import math
        rows, heads, hd = 5, 3, 10
        x = regions.to_bf16([math.sin(i * 0.37) * (1 + i % 7) for i in range(rows * heads * hd)])
        pos = [0, 1, 7, 300, 4099]
        f32 = lambda z: array("f", [z])[0]  # noqa: E731
        bf = lambda z: regions.from_bf16(regions.to_bf16([z]))[0]  # noqa: E731
        for policy, per_op, table16 in (("hf-eager", True, True), ("vllm", False, True),
                                        ("aligned", False, False)):
            got = regions.rope(array("H", x), pos, head_dim=hd, policy=policy, theta=10000.0)
            xs = regions.from_bf16(x)
            want = list(xs)
            for r, p in enumerate(pos):
                for i in range(hd // 2):
                    inv = f32(1.0 / f32(math.pow(10000.0, f32(2 * i / hd))))
                    ang = f32(float(p) * inv)
                    c, s = f32(math.cos(ang)), f32(math.sin(ang))
                    if table16:
                        c, s = bf(c), bf(s)
                    for h in range(heads):
                        k = r * heads * hd + h * hd + i
                        a, b = xs[k], xs[k + hd // 2]
                        rd = bf if per_op else (lambda z: z)
                        want[k] = f32(rd(f32(a * c)) - rd(f32(b * s)))
                        want[k + hd // 2] = f32(rd(f32(b * c)) + rd(f32(a * s)))
            self.assertEqual(got, regions.to_bf16(want), policy)

    def test_errors(self):
        w = array("H", [0x3F80] * 8)
        x = array("H", [0x3F80] * 16)
        with self.assertRaisesRegex(TypeError, "array\\('f'\\)"):
            regions.rmsnorm(array("f", [1.0] * 16), w)
        with self.assertRaisesRegex(TypeError, "bf16 buffer"):
            regions.rmsnorm([1, 2, 3], w)
        with self.assertRaises(ParityError) as e:
            regions.rmsnorm(x[:15], w)
        self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")
        with self.assertRaises(ParityError) as e:
            regions.rmsnorm(x, w, eps=0.0)
        self.assertIn("eps", e.exception.message)
        with self.assertRaises(ParityError) as e:
            regions.rmsnorm(x, w, out=array("H", [0] * 8))
        with self.assertRaisesRegex(TypeError, "read-only"):
            regions.rmsnorm(x, w, out=bytes(32))
        with self.assertRaises(ParityError) as e:
            regions.swiglu(x, x, policy="nope")
        self.assertEqual(e.exception.status, "PARITY_ERR_POLICY")
        with self.assertRaises(ParityError) as e:
            regions.rope(array("H", [0] * 18), [0, 1], head_dim=9)
        self.assertIn("head_dim", e.exception.message)
        with self.assertRaises(ParityError) as e:
            regions.rope(array("H", [0] * 16), [0, -1], head_dim=8)
        self.assertIn("negative", e.exception.message)
        with self.assertRaises(ParityError):
            regions.rope(array("H", [0] * 16), [0, 1, 2], head_dim=8)
        with self.assertRaises(ParityError) as e:
            regions.rmsnorm_residual(x, x, w, out=x, residual_out=x)
        self.assertIn("same buffer", e.exception.message)
        with self.assertRaises(ParityError) as e:
            parity.Policy(swiglu=7)._struct()
        self.assertEqual(e.exception.status, "PARITY_ERR_POLICY")
        with self.assertRaises(ParityError):
            parity.Policy(swiglu="sometimes")
        with self.assertRaises(TypeError):
            parity.Policy(swiglu=1.5)
        with self.assertRaises(AttributeError):
            parity.Policy(colour=1)


class TestMisuse(unittest.TestCase):
    def setUp(self):
        self.tiny, self.real = Models.get()

    def status(self, fn, *a, **k):
        with self.assertRaises(ParityError) as e:
            fn(*a, **k)
        self.assertTrue(e.exception.message)
        self.assertLess(e.exception.code, 0)
        self.assertEqual(parity.status_name(e.exception.code), e.exception.status)
        return e.exception.status

    def test_score_errors(self):
        m = self.tiny
        self.assertEqual(self.status(m.score, [1, 2, 256]), "PARITY_ERR_TOKEN_RANGE")
        self.assertEqual(self.status(m.score, [1, -2]), "PARITY_ERR_TOKEN_RANGE")
        self.assertEqual(self.status(m.score, [1, 2 ** 40]), "PARITY_ERR_TOKEN_RANGE")
        self.assertEqual(self.status(m.score, []), "PARITY_ERR_EMPTY_INPUT")
        self.assertEqual(self.status(m.score, [[1, 2], []]), "PARITY_ERR_EMPTY_INPUT")
        self.assertEqual(self.status(m.score, [1, 2], policy="hf-eagre"), "PARITY_ERR_POLICY")
        self.assertEqual(self.status(m.score, [1, 2], mode="cooked"), "PARITY_ERR_INVALID_ARGUMENT")
        self.assertEqual(self.status(m.score, [1, 2], top_p=1.5), "PARITY_ERR_INVALID_ARGUMENT")
        self.assertEqual(self.status(m.score, [1, 2], temperature=-1),
                         "PARITY_ERR_INVALID_ARGUMENT")
        self.assertEqual(self.status(m.score, [1, 2], backend="cuda"),
                         "PARITY_ERR_INVALID_ARGUMENT")
        for bad in ([1.5, 2.0], "hello", [[1, 2], 3], array("f", [1.0]), None, 7):
            with self.assertRaises(TypeError, msg=repr(bad)):
                m.score(bad)
        with self.assertRaises(TypeError):
            m.score([1, 2], policy=3)
        with self.assertRaises(TypeError):
            m.score([1, 2], top_k=1.5)
        try:
            m.score([1, 2, 256])
        except ParityError as e:
            self.assertEqual((e.code, e.status), (-40, "PARITY_ERR_TOKEN_RANGE"))
            self.assertIn("token id 256 is outside the vocabulary", str(e))

    def test_open_errors(self):
        self.assertEqual(self.status(parity.Model, "/nonexistent/model"), "PARITY_ERR_IO")
        self.assertEqual(self.status(parity.Model, "synthetic:nothing"),
                         "PARITY_ERR_INVALID_ARGUMENT")
        with self.assertRaises(TypeError):
            parity.Model(42)

    def test_closed(self):
        m = parity.Model("synthetic:tiny")
        s = m.sampler(policy="aligned", max_seqs=3)
        with m:
            m.score([1, 2, 3])
        self.assertTrue(m.closed)
        m.close()
        m.__del__()
        self.assertEqual(self.status(m.score, [1, 2]), "PARITY_ERR_INVALID_ARGUMENT")
        self.assertIn("closed", str(self._err(m.score, [1, 2])))
        self.assertEqual(self.status(m.sampler), "PARITY_ERR_INVALID_ARGUMENT")
        # a live sampler keeps what it needs
        self.assertEqual(len(s.generate([1, 2, 3], n=2, max_tokens=4)), 2)
        s.close()
        s.close()
        self.assertIn("closed", str(self._err(s.generate, [1, 2, 3])))
        del s, m

    def _err(self, fn, *a):
        try:
            fn(*a)
        except ParityError as e:
            return e
        self.fail("no error")

    def test_sampler_errors(self):
        with self.tiny.sampler(max_seqs=2, max_len=8) as s:
            self.assertEqual(self.status(s.add, [1] * 9), "PARITY_ERR_TOO_LONG")
            self.assertEqual(self.status(s.add, [1, 999]), "PARITY_ERR_TOKEN_RANGE")
            self.assertEqual(self.status(s.add, [1], stop=[1] * 17), "PARITY_ERR_INVALID_ARGUMENT")
            self.assertEqual(self.status(s.add, [1], seed=-1), "PARITY_ERR_INVALID_ARGUMENT")
            self.assertEqual(self.status(s.step, [5]), "PARITY_ERR_UNKNOWN_SEQUENCE")
            self.assertEqual(self.status(s.step, []), "PARITY_ERR_EMPTY_INPUT")
            self.assertEqual(self.status(s.fork, 1, 0), "PARITY_ERR_UNKNOWN_SEQUENCE")
            with self.assertRaises(TypeError):
                s.add([1, 2], temperature="hot")

    def test_profile(self):
        """Sampler.profile(): counts what ran, bits unchanged, zeros when off."""
        with self.tiny.sampler(max_seqs=2, threads=2) as a, self.tiny.sampler(max_seqs=2, threads=2) as b:
            self.assertFalse(b.profile()["enabled"])
            b.set_profiling()
            qa, qb = a.add([1, 2, 3, 4], seed=3), b.add([1, 2, 3, 4], seed=3)
            for _ in range(3):
                x, y = a.step([qa]), b.step([qb])
                self.assertEqual(f32_bits([s.logprob for s in x]), f32_bits([s.logprob for s in y]))
            p = b.profile()
            self.assertTrue(p["enabled"])
            self.assertEqual((p["calls"], p["forwards"], p["rows"]), (4, 4, 3 + 3))
            self.assertEqual(sorted(p["phase_seconds"]), sorted(["embed", "gemm", "rounding",
                                                                 "regions", "attention", "head",
                                                                 "sampling"]))
            self.assertLessEqual(sum(p["phase_seconds"].values()), p["call_seconds"])
            self.assertGreater(p["phase_seconds"]["gemm"], 0)
            self.assertEqual(a.profile()["calls"], 0)
            b.set_profiling(False)
            self.assertEqual(b.profile()["calls"], 0)

    def test_add_batch(self):
        """Sampler.add_batch: the ids, tokens and log-prob bits of add() one by one; all or
        nothing."""
        prompts = [[1, 2, 3], [4] * 20, [5], [6, 7]]
        with self.tiny.sampler(max_seqs=6, prefill_chunk=7) as a, \
                self.tiny.sampler(max_seqs=6, prefill_chunk=7) as b:
            one = [a.add(p, stream=10 + i, seed=4, temperature=0.9) for i, p in enumerate(prompts)]
            many = b.add_batch(prompts, streams=[10, 11, 12, 13], seed=4, temperature=0.9)
            self.assertEqual(many, one)
            for _ in range(5):
                x, y = a.step(one), b.step(many)
                self.assertEqual([s.token for s in x], [s.token for s in y])
                self.assertEqual(f32_bits([s.logprob for s in x]), f32_bits([s.logprob for s in y]))
            for q in many:
                b.release(q)
            e = self._err(b.add_batch, [[1, 2], [1, 999]])
            self.assertEqual(e.status, "PARITY_ERR_TOKEN_RANGE")
            self.assertIn("prompt 1", str(e))
            self.assertEqual(self.status(b.add_batch, [[1]] * 7), "PARITY_ERR_CACHE_FULL")
            self.assertEqual(self.status(b.add_batch, [[1], [2]], streams=[1]),
                             "PARITY_ERR_INVALID_ARGUMENT")
            self.assertEqual(b.add_batch([[1]] * 6), list(range(6)))   # nothing was taken

    def test_no_crash_in_subprocess(self):
        code = ("import parity\nfrom array import array\nm = parity.Model('synthetic:tiny')\n"
                "for f in (lambda: m.score([[1, 2], [3, 10**6]]), lambda: parity.regions.rmsnorm("
                "array('H', [1]*3), array('H', [1]*4)), lambda: m.sampler(max_len=10**6)):\n"
                "    try: f()\n"
                "    except (parity.ParityError, TypeError) as e: print(type(e).__name__)\n"
                "m.close(); m.close()\nprint('ok')\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(harness.REPO, "python"))
        p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.decode().split(), ["ParityError"] * 3 + ["ok"])


class TestScorerCache(unittest.TestCase):
    """The model's idle scorers: bounded by count and by bytes, least recently used out."""

    def idle(self, m):
        return [e["threads"] for e in m.idle_scorers()]

    def test_count_bound_lru(self):
        with parity.Model("synthetic:tiny", max_idle_scorers=2) as m:
            self.assertEqual((m.max_idle_scorers, m.max_idle_bytes),
                             (2, parity.model.DEFAULT_IDLE_BYTES))
            want = m.score([1, 2, 3], threads=1)
            for t in (1, 2, 3):
                self.assertEqual(m.score([1, 2, 3], threads=t), want)
            self.assertEqual(self.idle(m), [2, 3])      # 1, the least recently used, freed
            m.score([1, 2, 3], threads=2)               # 2 is now the most recently used
            self.assertEqual(self.idle(m), [3, 2])
            m.score([1, 2, 3], threads=4)
            self.assertEqual(self.idle(m), [2, 4])      # 3 out, not 2
            m.probe([1, 2, 3], want, threads=2)         # probe takes from the same cache
            self.assertEqual(self.idle(m), [4, 2])
            m.score([1, 2, 3], policy="hf-eager", threads=4)  # another policy: its own scorer
            self.assertEqual([(e["threads"], e["policy"]) for e in m.idle_scorers()],
                             [(2, parity.Policy.from_name("aligned")),
                              (4, parity.Policy.from_name("hf-eager"))])
            self.assertEqual(m.idle_scorers()[0]["backend"], "bf16")
            m.max_idle_scorers = 1                      # lowering the bound frees at once
            self.assertEqual(self.idle(m), [4])
            m.max_idle_scorers = 0
            self.assertEqual(m.idle_scorers(), [])
            self.assertEqual(m.score([1, 2, 3], threads=1), want)  # still scores, keeps none
            self.assertEqual(m.idle_scorers(), [])
            m.max_idle_scorers = None
            for t in range(1, 7):
                m.score([1, 2, 3], threads=t)
            self.assertEqual(self.idle(m), [1, 2, 3, 4, 5, 6])
        self.assertEqual(m.idle_scorers(), [])          # closed: all freed
        with self.assertRaises(ParityError):
            parity.Model("synthetic:tiny", max_idle_scorers=-1)
        with self.assertRaises(TypeError):
            parity.Model("synthetic:tiny", max_idle_bytes="1G")

    def test_byte_bound_lru(self):
        long_seq = list(range(200)) * 2
        with parity.Model("synthetic:tiny", max_idle_scorers=None, max_idle_bytes=None,
                          max_tokens=64) as m:
            for t in (1, 2, 3, 4):
                m.score([1, 2, 3], threads=t)
            m.score(long_seq, threads=5)                # a larger capacity: more bytes
            idle = m.idle_scorers()
            self.assertEqual([(e["threads"], e["max_tokens"]) for e in idle],
                             [(1, 64), (2, 64), (3, 64), (4, 64), (5, 400)])
            size = {e["threads"]: e["bytes"] for e in idle}  # each its parity_scorer_bytes
            big = size.pop(5)
            self.assertTrue(all(b > 0 for b in size.values()))
            bound = size[2] + size[4]                   # room for scorers 2 and 4, not 1, 2, 3
            self.assertGreater(size[1] + size[3], size[4])
            self.assertGreater(big, bound)
            self.assertEqual(m._idle_bytes, sum(size.values()) + big)
            m.max_idle_bytes = 0                        # frees them all at once
            self.assertEqual(m.idle_scorers(), [])
            m.max_idle_bytes = bound
            for t in (1, 2, 3):
                m.score([1, 2, 3], threads=t)
            self.assertEqual(self.idle(m), [2, 3])      # 1, the least recently used, out
            m.score([1, 2, 3], threads=2)
            m.score([1, 2, 3], threads=4)
            self.assertEqual(self.idle(m), [2, 4])      # 3 out, not 2
            m.score(long_seq, threads=5)                # alone too large: freed, the others stay
            self.assertEqual(self.idle(m), [2, 4])
            m.max_idle_bytes = big + size[4]            # room for the large one and 4
            m.score(long_seq, threads=5)
            self.assertEqual(self.idle(m), [4, 5])      # 2, the least recently used, out
            self.assertEqual(m._idle_bytes, big + size[4])
            m.max_idle_bytes = big
            self.assertEqual(self.idle(m), [5])
            m.max_idle_bytes = big - 1
            self.assertEqual(m.idle_scorers(), [])
            self.assertEqual(m._idle_bytes, 0)


class TestThreads(unittest.TestCase):
    def setUp(self):
        self.tiny, self.real = Models.get()

    def test_gil_released(self):
        seqs = [list(TEXT[i:i + 120]) for i in range(0, 60, 2)]
        t0 = time.perf_counter()
        self.real.score(seqs, policy="aligned", threads=1)
        alone = time.perf_counter() - t0
        ticks = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0)

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.01)
        before = ticks[0]
        self.real.score(seqs, policy="aligned", threads=1)
        during = ticks[0] - before
        stop.set()
        t.join()
        # with the GIL held for the whole call the other thread could not count at all
        self.assertGreater(during, 100, "the other thread ran %d times in %.2fs" % (during, alone))

    def test_concurrent_scoring(self):
        seqs = [list(TEXT[i:i + 50]) for i in range(0, 40, 4)]
        want = [f32_bits(x) for x in self.real.score(seqs, policy="vllm")]
        results, errors = [], []

        def work():
            try:
                for _ in range(3):
                    results.append([f32_bits(x) for x in self.real.score(seqs, policy="vllm")])
            except Exception as e:  # pragma: no cover
                errors.append(e)

        ts = [threading.Thread(target=work) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(results, [want] * 12)


class TestUpdates(unittest.TestCase):
    """Weight updates, manifests (the Python writer against the library's) and the probe."""

    def test_update_threads(self):
        """Model.update on 1, 2 and 3 threads (parity_model_update_on): the same weights (the
        same manifest afterwards), and for bad input the same status and message, the first
        failure in the order given (a NaN in one tensor before a shape error in a later one:
        the NaN; the shape error alone, then the NaN after it: the shape error)."""
        weights, _ = load_safetensors(os.path.join(REAL, "model.safetensors"))
        names = sorted(weights)
        masters = {n: ("F32", weights[n][1], array("f", array("I", [(h << 16) + 0x9000 + i % 7
                                                                   for i, h in enumerate(
                                                                       weights[n][0])]).tobytes()))
                   for n in names}
        nan = array("f", masters[names[2]][2])
        nan[len(nan) // 2] = float("nan")
        bad_nan = dict(masters, **{names[2]: ("F32", masters[names[2]][1], nan)})
        bad_both = dict(bad_nan, **{names[4]: ("F32", (1,), array("f", [1.0]))})
        shape_first = {n: bad_both[n] for n in names[3:]}
        shape_first[names[2]] = bad_both[names[2]]  # after the bad shape in the order given
        texts, messages = set(), []
        for threads in (1, 2, 3):
            with parity.Model(REAL, threads=2) as m:
                for bad in (bad_both, shape_first):
                    with self.assertRaises(ParityError) as e:
                        m.update(bad, threads=threads)
                    messages.append((e.exception.status, e.exception.message))
                m.update(masters, threads=threads)
                path = os.path.join(TMP, "after-%d.json" % threads)
                m.write_manifest(path)
                with open(path, "rb") as f:
                    texts.add(f.read())
        self.assertEqual(len(texts), 1)
        self.assertEqual(messages[0::2], [messages[0]] * 3)
        self.assertEqual(messages[1::2], [messages[1]] * 3)
        self.assertEqual(messages[0][0], "PARITY_ERR_TENSOR_NONFINITE")
        self.assertIn(names[2], messages[0][1])
        self.assertIn("NaN", messages[0][1])
        self.assertEqual(messages[1][0], "PARITY_ERR_TENSOR_SHAPE")
        self.assertIn(names[4], messages[1][1])

    def test_first_update_keeps_masters(self):
        """A model that owns its bf16 values (synthetic:tiny): its first update of F32 values
        adds their fp32 masters (4 bytes a value; the bf16 cast goes into the buffers it
        holds), the next one writes them in place (it holds no more), an update that fails
        changes nothing, held memory included (a value beyond bf16's range in its last
        tensor), and BF16 values drop the masters."""
        d = os.path.join(TMP, "tiny-bf16")
        with parity.Model("synthetic:tiny") as m:
            m.save(d)
        weights, _ = load_safetensors(os.path.join(d, "model.safetensors"))
        names = sorted(weights)
        count = sum(len(weights[n][0]) for n in names)

        def masters(offset):
            return {n: ("F32", weights[n][1],
                        array("f", array("I", [(h << 16) + offset + i % 7
                                               for i, h in enumerate(weights[n][0])]).tobytes()))
                    for n in names}

        def manifest(m):
            path = os.path.join(TMP, "tiny-manifest.json")
            m.write_manifest(path)
            with open(path, "rb") as f:
                return f.read()

        with parity.Model("synthetic:tiny", threads=2) as m:
            held, before = m.weight_bytes()["held"], manifest(m)
            bad = masters(0x9000)
            big = array("f", bad[names[-1]][2])
            big[-1] = 3.4e38
            bad[names[-1]] = ("F32", bad[names[-1]][1], big)
            with self.assertRaises(ParityError) as e:
                m.update(bad)
            self.assertEqual(e.exception.status, "PARITY_ERR_TENSOR_NONFINITE")
            self.assertIn(names[-1], e.exception.message)
            self.assertEqual((m.version, m.weight_bytes()["held"], manifest(m)),
                             (0, held, before))
            body = before.split(b",", 1)[1]  # the manifest after its version
            m.update(masters(0x9000))  # above half an ulp: rounds up
            self.assertEqual(m.weight_bytes()["held"], held + 4 * count)
            self.assertNotEqual(manifest(m).split(b",", 1)[1], body)
            m.update(masters(0x5000))  # below: the bf16 values loaded
            self.assertEqual(m.weight_bytes()["held"], held + 4 * count)
            self.assertEqual(manifest(m).split(b",", 1)[1], body)
            m.update({n: ("BF16", weights[n][1], weights[n][0]) for n in names})
            self.assertEqual((m.version, m.weight_bytes()["held"]), (3, held))
            self.assertEqual(manifest(m).split(b",", 1)[1], body)

    def test_manifest_update_verify_probe(self):
        weights, _ = load_safetensors(os.path.join(REAL, "model.safetensors"))
        tensors = {name: ("BF16", shape, arr) for name, (arr, shape) in weights.items()}
        mine = os.path.join(TMP, "learner.manifest.json")
        theirs = os.path.join(TMP, "model.manifest.json")
        parity.write_manifest(mine, tensors, version=0)
        with parity.Model(REAL, threads=1) as m:
            self.assertEqual(m.version, 0)
            self.assertEqual(m.verify(mine), [])
            m.write_manifest(theirs)
            with open(mine) as f1, open(theirs) as f2:
                self.assertEqual(json.load(f1), json.load(f2))
            toks = list(TEXT[:40])
            before = m.score(toks, policy="aligned")
            m.probe(toks, before, policy="aligned")
            bad = list(before)
            bad[5] += 1e-3
            with self.assertRaises(ParityError) as e:
                m.probe(toks, bad, policy="aligned")
            self.assertEqual(e.exception.status, "PARITY_ERR_VERIFY")
            # a sampler sequence prefilled before the update goes stale
            s = m.sampler(policy="aligned", max_seqs=2)
            seq = s.add(toks)
            # the learner sends fp32 masters of one tensor; the library casts them (RNE)
            name = "model.norm.weight"
            arr, shape = weights[name]
            f32 = array("f", array("I", [(h << 16) + 0x9000 for h in arr]).tobytes())
            update = {name: ("F32", shape, f32)}
            m.update(update)
            self.assertEqual(m.version, 1)
            diffs = m.verify(mine)
            self.assertTrue(any(name in d and "checksum" in d for d in diffs), diffs)
            self.assertTrue(any(d.startswith("version") for d in diffs), diffs)
            tensors.update(update)
            parity.write_manifest(mine, tensors, version=1)
            self.assertEqual(m.verify(mine), [])
            after = m.score(toks, policy="aligned")
            self.assertNotEqual(f32_bits(after), f32_bits(before))
            with self.assertRaises(ParityError) as e:
                s.step([seq])
            self.assertEqual(e.exception.status, "PARITY_ERR_STALE")
            s.close()
            with self.assertRaises(ParityError) as e:
                m.update({"model.nothing.weight": ("BF16", (4,), bytes(8))})
            with self.assertRaises(ParityError) as e:
                m.update({name: ("BF16", (3,), bytes(6))})
            with self.assertRaises(TypeError):
                m.update({name: [1.0, 2.0]})
            with self.assertRaises(ParityError) as e:
                m.verify(os.path.join(TMP, "no-such-manifest.json"))
            self.assertEqual(e.exception.status, "PARITY_ERR_IO")


def ref_fnv1a64(data):
    """FNV-1a 64 over bytes, in plain Python."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def ref_stream_checksum(data, manifest_version):
    """The checksum of a manifest of `manifest_version` over a byte stream, written from
    parity.h's definition: version 1 FNV-1a 64 over the bytes; version 2 the FNV-1a 64 of each
    65536-byte chunk, those hashed in order as 8 little-endian bytes each."""
    if manifest_version == 1:
        return ref_fnv1a64(data)
    chunks = b"".join(ref_fnv1a64(data[c:c + 65536]).to_bytes(8, "little")
                      for c in range(0, len(data), 65536))
    return ref_fnv1a64(chunks)


def ref_checksum(f32_bits_list=None, bf16_list=None, manifest_version=2):
    """The checksum of the little-endian bf16 of values, in plain Python (the reference the
    library's parity_tensor_checksums is held to): fp32 bit patterns rounded to nearest even,
    NaN -> 0x7fc0."""
    if bf16_list is None:
        bf16_list = [0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000 else (u + 0x7FFF + ((u >> 16) & 1))
                     >> 16 for u in f32_bits_list]
    return ref_stream_checksum(b"".join(v.to_bytes(2, "little") for v in bf16_list),
                               manifest_version)


class TestManifest(unittest.TestCase):
    """parity.write_manifest: the library's checksum on every input form, zero-copy; both
    manifest versions."""

    # fp32 bit patterns: ties to even both ways, NaNs (quiet, signalling, negative), infinities,
    # subnormals, the largest finite (rounds to inf), zeros
    BITS = [0x3F800000, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,
            0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0x00000000, 0x80000000,
            0x40490FDB, 0xC2F6E979]

    def test_forms_and_reference(self):
        from parity.manifest import checksum
        self.assertEqual(ref_fnv1a64(b"a"), 0xAF63DC4C8601EC8C)  # FNV-1a 64's published vector
        for mv in (1, 2):
            with self.subTest(manifest_version=mv):
                self.check_forms(mv, lambda value, mv=mv: checksum(value, manifest_version=mv))
        # the library's version by default
        self.assertEqual(parity.MANIFEST_VERSION, 2)
        self.assertEqual(checksum(("F32", (16,), array("I", self.BITS))),
                         ((16,), ref_checksum(self.BITS, manifest_version=2)))

    def check_forms(self, mv, checksum):
        f32 = array("I", self.BITS)
        want = ref_checksum(self.BITS, manifest_version=mv)
        bf = array("H", [0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000 else
                         (u + 0x7FFF + ((u >> 16) & 1)) >> 16 for u in self.BITS])
        self.assertEqual(ref_checksum(bf16_list=list(bf), manifest_version=mv), want)
        raw32, raw16 = f32.tobytes(), bf.tobytes()
        n = len(self.BITS)
        for kind in (raw32, bytearray(raw32), memoryview(raw32), array("f", raw32),
                     memoryview(bytearray(raw32)).cast("I")):
            self.assertEqual(checksum(("F32", (n,), kind)), ((n,), want), type(kind))
            self.assertEqual(checksum(("F32", [4, n // 4], kind)), ((4, n // 4), want))
        for kind in (raw16, bytearray(raw16), memoryview(raw16), bf):
            self.assertEqual(checksum(("BF16", (2, n // 2), kind)), ((2, n // 2), want))
        # unaligned, read-only: a slice of bytes one byte in
        shifted = (b"x" + raw32)
        self.assertEqual(checksum(("F32", (n,), memoryview(shifted)[1:])), ((n,), want))
        # a non-contiguous view is read in row-major order
        every_other = memoryview(array("I", [v for u in self.BITS for v in (u, 0)])).cast(
            "B").cast("I")[::2]
        self.assertFalse(every_other.c_contiguous)
        self.assertEqual(checksum(("F32", (n,), every_other)), ((n,), want))
        # f16: exact in bf16 or rounded (1 + 2^-8 + 2^-10 rounds up), and a NaN
        halves = [1.0, -2.5, 65504.0, 6.103515625e-05, 1.0 + 2 ** -8 + 2 ** -10, 0.0]
        f16 = struct.pack("<%de" % len(halves), *halves) + b"\x01\x7e"  # + a NaN
        as32 = list(array("I", array("f", halves).tobytes())) + [0x7FC00000]
        self.assertEqual(checksum(("F16", (7,), f16)), ((7,), ref_checksum(as32, manifest_version=mv)))
        self.assertEqual(checksum(("BF16", (0,), b"")), ((0,), ref_checksum([], manifest_version=mv)))

    def test_chunks(self):
        """Tensors of many chunks (the library hashes four at a time, on a pool's threads):
        the plain-Python reference for a stream of 5 chunks and a tail, one of exactly 4, one
        of a single short chunk; F32 (rounded), BF16 and F16 inputs; on 1, 2 and 3 threads."""
        from parity._convert import Pinned
        from parity.manifest import _checksums, checksum
        for count in (5 * 32768 + 777, 4 * 32768, 3):
            bits = array("I", [(i * 2654435761 + 12345) & 0xFFFFFFFF for i in range(count)])
            bf = [0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000 else (u + 0x7FFF + ((u >> 16) & 1))
                  >> 16 for u in bits]
            for mv in (1, 2):
                want = ref_checksum(bf16_list=bf, manifest_version=mv)
                self.assertEqual(checksum(("F32", (count,), bits), manifest_version=mv)[1], want)
                self.assertEqual(checksum(("BF16", (count,), array("H", bf)),
                                          manifest_version=mv)[1], want)
                with Pinned() as pin:
                    views = [("F32", count, pin.address(bits)), ("BF16", 3, pin.address(bits))]
                    alone = [_checksums(views[:1], mv)[0], _checksums(views[1:], mv)[0]]
                    for threads in (1, 2, 3):
                        with parity.Pool(threads) as pool:
                            self.assertEqual(_checksums(views, mv, pool), alone, threads)
            # F16 values exact in bf16 (1 + 8k/1024: 3 of fp16's 10 mantissa bits): widened
            f16 = array("H", [0x3C00 + 8 * (i % 128) for i in range(count)])
            self.assertEqual(checksum(("F16", (count,), f16))[1],
                             ref_checksum(bf16_list=[0x3F80 + i % 128 for i in range(count)]))
        # any bytes (fp8 codes, scales): their stream as it is
        data = bytes((i * 7 + 3) & 0xFF for i in range(5 * 65536 + 9))
        with Pinned() as pin:
            for mv in (1, 2):
                self.assertEqual(_checksums([("F8_E4M3", len(data), pin.address(data))], mv),
                                 [ref_stream_checksum(data, mv)])

    def test_bad_input(self):
        from parity.manifest import checksum
        with self.assertRaises(ParityError) as e:
            checksum(("F32", (3,), bytes(8)))
        self.assertIn("8 bytes for shape (3,) of F32 (want 12)", e.exception.message)
        with self.assertRaises(ParityError):
            checksum(("BF16", (2, 2), bytes(6)))
        with self.assertRaises(ParityError):
            checksum(("BF16", (-1,), bytes(0)))
        for bad in (("F64", (1,), bytes(8)), ("BF16", 1, bytes(2)), ("BF16", (1,), [1, 2]),
                    ("BF16", (1.5,), bytes(2)), [1.0, 2.0], "weights", None):
            with self.assertRaises(TypeError, msg=repr(bad)):
                checksum(bad)
        with self.assertRaises(TypeError):
            parity.write_manifest(os.path.join(TMP, "m.json"), {1: ("BF16", (1,), bytes(2))})
        with self.assertRaises(TypeError):
            parity.write_manifest(os.path.join(TMP, "m.json"), [("BF16", (1,), bytes(2))])

    def test_same_text_as_the_library(self):
        """The learner's manifest of the weights a model holds is the model's own, byte for
        byte (given in the model's order), and verifies."""
        weights, _ = load_safetensors(os.path.join(REAL, "model.safetensors"))
        theirs = os.path.join(TMP, "c.manifest.json")
        mine = os.path.join(TMP, "py.manifest.json")
        with parity.Model(REAL, threads=1) as m:
            m.write_manifest(theirs)
            with open(theirs) as f:
                order = list(json.load(f)["tensors"])
            parity.write_manifest(mine, {name: ("BF16", weights[name][1], weights[name][0])
                                         for name in order})
            with open(theirs, "rb") as f1, open(mine, "rb") as f2:
                self.assertEqual(f1.read(), f2.read())
            self.assertEqual(m.verify(mine), [])
            # one value of one tensor off by one ulp: that tensor's checksum differs
            name = order[3]
            arr = array("H", weights[name][0])
            arr[7] ^= 1
            parity.write_manifest(mine, {n: ("BF16", weights[n][1], arr if n == name
                                             else weights[n][0]) for n in order})
            diffs = m.verify(mine)
            self.assertEqual(len(diffs), 1, diffs)
            self.assertIn(name, diffs[0])

    def test_versions_and_threads(self):
        """Manifests of both versions: the library's (version 2) and version 1 (no
        "manifest_version", the single-chain FNV-1a) written alike by the model and by the
        learner's side, byte for byte; each verifies, and a changed value is found in both;
        files and reports the same on 1, 2 and 3 threads; a version the library does not know
        refused."""
        weights, _ = load_safetensors(os.path.join(REAL, "model.safetensors"))
        with parity.Model(REAL, threads=2) as m:
            texts = {}
            for mv in (1, 2):
                for threads in (1, 2, 3):
                    theirs = os.path.join(TMP, "c%d-%d.json" % (mv, threads))
                    m.write_manifest(theirs, threads=threads, manifest_version=mv)
                    with open(theirs, "rb") as f:
                        texts.setdefault(mv, set()).add(f.read())
                self.assertEqual(len(texts[mv]), 1, "manifest version %d differs by threads" % mv)
                doc = json.loads(next(iter(texts[mv])).decode())
                self.assertEqual(doc.get("manifest_version", 1), mv)
                self.assertEqual(mv == 1, b'"manifest_version"' not in next(iter(texts[mv])))
                order = list(doc["tensors"])
                # every entry is the plain-Python reference of its version
                for name in order[:4]:
                    raw, shape = weights[name]
                    self.assertEqual(int(doc["tensors"][name]["fnv1a64"], 16),
                                     ref_stream_checksum(bytes(raw), mv), name)
                mine = os.path.join(TMP, "py%d.json" % mv)
                for threads in (1, 2, 3):
                    parity.write_manifest(mine, {n: ("BF16", weights[n][1], weights[n][0])
                                                 for n in order}, threads=threads,
                                          manifest_version=mv)
                    with open(mine, "rb") as f:
                        self.assertEqual({f.read()}, texts[mv], threads)
                    self.assertEqual(m.verify(mine, threads=threads), [])
                # hashed in batches of a few tensors (the pinned memory bounded): the same file
                import parity.manifest as manifest_module
                saved, manifest_module._BATCH_BYTES = manifest_module._BATCH_BYTES, 5000
                try:
                    parity.write_manifest(mine, {n: ("BF16", weights[n][1], weights[n][0])
                                                 for n in order}, manifest_version=mv)
                finally:
                    manifest_module._BATCH_BYTES = saved
                with open(mine, "rb") as f:
                    self.assertEqual({f.read()}, texts[mv], "batches")
                name = order[5]
                arr = array("H", weights[name][0])
                arr[len(arr) - 1] ^= 1
                parity.write_manifest(mine, {n: ("BF16", weights[n][1], arr if n == name
                                                 else weights[n][0]) for n in order},
                                      manifest_version=mv)
                reports = [m.verify(mine, threads=t) for t in (1, 2, 3)]
                self.assertEqual(reports[0], reports[1])
                self.assertEqual(reports[0], reports[2])
                self.assertEqual(len(reports[0]), 1, reports[0])
                self.assertIn(name + ": checksum differs", reports[0][0])
            self.assertNotEqual(texts[1], texts[2])
            # a version 2 checksum under a version 1 header (or the reverse) is a difference
            v2 = json.loads(next(iter(texts[2])).decode())
            del v2["manifest_version"]
            relabelled = os.path.join(TMP, "relabelled.json")
            with open(relabelled, "w") as f:
                json.dump(v2, f)
            self.assertEqual(len(m.verify(relabelled)), len(v2["tensors"]))
            for bad in (3, 0, "2", 2.5):
                v2["manifest_version"] = bad
                with open(relabelled, "w") as f:
                    json.dump(v2, f)
                with self.assertRaises(ParityError) as e:
                    m.verify(relabelled)
                self.assertEqual(e.exception.status, "PARITY_ERR_VERIFY")
                self.assertIn("manifest_version", e.exception.message)
            for bad in (0, 3):
                with self.assertRaises(ParityError):
                    m.write_manifest(relabelled, manifest_version=bad)
                with self.assertRaises(ParityError):
                    parity.write_manifest(relabelled, {}, manifest_version=bad)


class TestExamples(unittest.TestCase):
    EXAMPLES = os.path.join(harness.REPO, "examples", "python")

    def run_example(self, name, *args):
        env = dict(os.environ)
        p = subprocess.run([sys.executable, os.path.join(self.EXAMPLES, name)] + list(args),
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def test_score_rollouts(self):
        prompt = write("rollout-prompt.txt", TEXT[:30])
        rollouts = write("rollouts.jsonl", cli(
            GENERATE, "--model", REAL, "--policy", "vllm", "--prompt-bytes", prompt, "--n", "4",
            "--max-tokens", "20", "--seed", "3", "--temperature", "0.9", "--logprob-mode",
            "processed").encode())
        base = ["--model", REAL, "--prompt-bytes", prompt, "--logprob-mode", "processed",
                "--temperature", "0.9", rollouts]
        rc, out, err = self.run_example("score_rollouts.py", "--policy", "vllm", "--json", *base)
        self.assertEqual(rc, 0, err)
        same = json.loads(out)
        self.assertEqual((same["tokens"], same["bitwise_equal"], same["mean_abs_dlogp"]),
                         (80, 1.0, 0.0))
        rc, out, err = self.run_example("score_rollouts.py", "--policy", "hf-eager", "--json",
                                        *base)
        self.assertEqual(rc, 0, err)
        other = json.loads(out)
        self.assertGreater(other["mean_abs_dlogp"], 0)
        self.assertLess(other["bitwise_equal"], 0.5)
        rc, out, err = self.run_example("score_rollouts.py", "--policy", "aligned", *base)
        self.assertIn("k3 KL", out)

    def test_grpo_group(self):
        rc, out, err = self.run_example("grpo_group.py", "--model", REAL, "--n", "3",
                                        "--max-tokens", "12", "--seed", "2")
        self.assertEqual(rc, 0, out + err)
        self.assertIn("parity: 36 of 36 tokens bitwise equal", out)
        rc, out, err = self.run_example("grpo_group.py", "--model", REAL, "--n", "2",
                                        "--max-tokens", "8", "--learner-policy", "hf-eager")
        self.assertEqual(rc, 0, out + err)
        self.assertIn("learner (hf-eager)", out)


if __name__ == "__main__":
    harness.run("python-binding")
