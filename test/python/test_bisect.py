#!/usr/bin/env python3
"""The bisect of an intermediates dump (parity.bisect and the C program parity-bisect), on
dumps libparity writes itself (test/python/dump_writer.py: its forward pieces free-running
under one policy; the writer's log-probs equal Model.score's bit for bit):

  - under the dump's own policy every point is bitwise (rounding points and GEMMs alike), for a
    Qwen3 (bf16), the same model saved fp16 (hf-eager+fp16: the F16 dump, run as PRESET+fp16,
    fp32 skipped), a Qwen3-MoE and a Qwen2-MoE (router points);
  - under a policy one switch away the first departure is that switch's first point: hf-sdpa
    (attention) departs at layers.0.attn; vllm departs at layers.0.q_rope, not at
    layers.0.attn_norm: layer 0's norm has no residual add, so norm_input does not enter it,
    and vllm's q-norm rounds as hf-eager's, so its fused RoPE is the first switch that meets a
    value;
  - the C program's --json is byte for byte the Python module's (and `python3 -m parity.bisect
    --json`'s), for the bisect and for --between;
  - --between's increments add up to the total, the switches are those where the policies
    differ, in field order;
  - bad input (a missing tensor, a shape, a dtype, the metadata, tokens out of range, an unknown
    preset, an unsupported model, a preset that cannot meet the dump's dtype) gets the same
    message from both: DumpError / ParityError in Python, exit status 2 in C.

    test/python/test_bisect.py [BUILD_DIR]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness

BUILD = harness.setup()
(np,) = harness.require("the bisect tests", ["numpy"], "python3-numpy")

import parity  # noqa: E402
from parity import _safetensors  # noqa: E402
from parity import bisect as B  # noqa: E402
from parity.policy import POLICY_FIELDS, Policy  # noqa: E402
from dump_writer import write_dump  # noqa: E402

TOOL = harness.tool(BUILD, "parity-bisect")
MOE = os.path.join(harness.REPO, "test", "data", "moe")


def tokens_for(vocab, n=13):
    return [(7 * i * i + 3 * i + 1) % vocab for i in range(n)]


def run_c(*args):
    p = subprocess.run([TOOL] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def run_module(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(harness.REPO, "python"))
    p = subprocess.run([sys.executable, "-m", "parity.bisect"] + list(args), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


class Bisect(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="parity-bisect-")
        cls.models, cls.dumps, cls.written = {}, {}, {}
        fp16_dir = os.path.join(cls.tmp, "tiny-fp16")
        os.mkdir(fp16_dir)
        with parity.Model("synthetic:tiny", threads=1) as m:
            m.save(fp16_dir, layout="fp16")
        for key, spec, policy in (("hf", "synthetic:tiny", "hf-eager"),
                                  ("vllm", "synthetic:tiny", "vllm"),
                                  ("f16", fp16_dir, "hf-eager+fp16"),
                                  ("qwen3moe", os.path.join(MOE, "qwen3-moe-tiny"), "hf-eager"),
                                  ("qwen2moe", os.path.join(MOE, "qwen2-moe-tiny"), "vllm")):
            m = parity.Model(spec, threads=1)
            path = os.path.join(cls.tmp, key + ".safetensors")
            toks = tokens_for(m.vocab_size)
            out = write_dump(m, toks, policy, path)
            cls.models[key], cls.dumps[key] = (m, spec, policy, toks), path
            cls.written[key] = out

    @classmethod
    def tearDownClass(cls):
        for m, *_ in cls.models.values():
            m.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_writer_is_the_forward(self):
        # the dumps' log-probs are parity_score's under the writer's policy, bit for bit
        for key, (m, _, policy, toks) in self.models.items():
            want = np.array(m.score(toks, policy=policy), dtype=np.float32)
            got = self.written[key]["logprobs"]
            self.assertTrue(np.array_equal(want.view(np.uint32), got.view(np.uint32)), key)

    def _every_point_bitwise(self, report, preset):
        (p,) = [p for p in report["presets"] if p["preset"] == preset]
        self.assertIsNone(p["first_departure"], preset)
        self.assertEqual([q["name"] for q in p["points"] if q["differing"]], [], preset)
        self.assertEqual(p["after_fraction"], 0.0)
        self.assertEqual(p["gemm_floor"], 1.0)
        return p

    def test_own_preset_every_point_bitwise(self):
        for key in ("hf", "vllm", "qwen3moe", "qwen2moe"):
            m, _, policy, toks = self.models[key]
            r = B.bisect(m, self.dumps[key], [policy])
            p = self._every_point_bitwise(r, policy)
            self.assertEqual(r["dump"]["tokens"], len(toks))
            self.assertEqual(r["dump"]["parity_dump"], "1")
            names = [q["name"] for q in p["points"]]
            self.assertEqual(names[0], "layers.0.attn_norm")
            self.assertEqual(names[-3:], ["final_norm", "logits", "logprobs"])
            self.assertEqual(p["kinds"]["logits"], {"elements": len(toks) - 1, "differing": 0})
            if key.endswith("moe"):
                self.assertIn("layers.0.router_weights", names)
                self.assertGreater(p["kinds"]["moe_route"]["elements"], 0)
                self.assertIn("layers.0.router_logits", names)
            if key == "qwen3moe":  # layer 1 is dense (mlp_only_layers)
                self.assertIn("layers.1.swiglu", names)
                self.assertNotIn("layers.0.swiglu", names)

    def test_f16_dump(self):
        m, _, _, _ = self.models["f16"]
        r = B.bisect(m, self.dumps["f16"])
        names = [p["preset"] for p in r["presets"]]
        self.assertEqual(names, [n + "+fp16" for n in parity.policies() if n != "fp32"])
        self._every_point_bitwise(r, "hf-eager+fp16")
        self.assertEqual(r["dump"]["dtype"], "f16")
        (sdpa,) = [p for p in r["presets"] if p["preset"] == "hf-sdpa+fp16"]
        self.assertEqual(sdpa["first_departure"]["name"], "layers.0.attn")

    def test_first_departure_one_switch_away(self):
        m = self.models["hf"][0]
        hf, sdpa = Policy.from_name("hf-eager"), Policy.from_name("hf-sdpa")
        self.assertEqual([f for f in POLICY_FIELDS if getattr(hf, f) != getattr(sdpa, f)],
                         ["attention"])
        r = B.bisect(m, self.dumps["hf"], ["hf-sdpa", "vllm"])
        sdpa_r, vllm_r = r["presets"]
        first = sdpa_r["first_departure"]
        self.assertEqual((first["name"], first["kind"]), ("layers.0.attn", "attention"))
        self.assertGreater(first["differing"], 0)
        self.assertEqual(first["fraction"], first["differing"] / first["elements"])
        # before it every point is bitwise; after it only attention points differ
        at = [p["name"] for p in sdpa_r["points"]].index("layers.0.attn")
        self.assertTrue(all(p["differing"] == 0 for p in sdpa_r["points"][:at]))
        self.assertEqual({p["kind"] for p in sdpa_r["points"] if p["differing"]}, {"attention"})
        after = [p for p in sdpa_r["points"][at:] if p["kind"] != "gemm"]
        self.assertEqual(sdpa_r["after_fraction"], sum(p["differing"] for p in after)
                         / sum(p["elements"] for p in after))
        # vllm: layer 0's input norm has no residual add (norm_input does not enter) and its
        # q-norm rounds as hf-eager's: the fused RoPE is its first departure
        v = vllm_r["first_departure"]
        self.assertEqual((v["name"], v["kind"]), ("layers.0.q_rope", "rope"))
        norms = {p["name"]: p["differing"] for p in vllm_r["points"]}
        self.assertEqual(norms["layers.0.attn_norm"], 0)
        self.assertEqual(norms["layers.0.q_norm"], 0)
        self.assertGreater(norms["layers.0.mlp_norm"], 0)   # the fp32 sum read by the norm
        self.assertEqual(norms["layers.0.attn_residual"], 0)  # the stream rounds alike
        # and the other way round: hf-eager on the vllm dump departs there too
        r = B.bisect(m, self.dumps["vllm"], ["hf-eager"])
        self.assertEqual(r["presets"][0]["first_departure"]["name"], "layers.0.q_rope")

    def test_c_json_equals_python(self):
        for key in ("hf", "f16", "qwen3moe", "qwen2moe"):
            m, spec, _, _ = self.models[key]
            rc, out, err = run_c("--model", spec, "--dump", self.dumps[key], "--json")
            self.assertEqual((rc, err), (0, ""), key)
            want = B.to_json(B.bisect(m, self.dumps[key]))
            self.assertEqual(out, want, key)
            json.loads(out)
            rc, table, err = run_c("--model", spec, "--dump", self.dumps[key])
            self.assertEqual(table, B.table(B.bisect(m, self.dumps[key])), key)
        spec = self.models["hf"][1]
        rc, out, _ = run_c("--model", spec, "--dump", self.dumps["hf"], "--json", "--policy",
                           "vllm", "--policy", "hf-eager+fp32-head", "--threads", "2")
        rc2, out2, err2 = run_module("--model", spec, "--dump", self.dumps["hf"], "--policy",
                                     "vllm", "--policy", "hf-eager+fp32-head", "--json")
        self.assertEqual((rc, rc2, err2), (0, 0, ""))
        self.assertEqual(out, out2)
        self.assertEqual([p["preset"] for p in json.loads(out)["presets"]],
                         ["vllm", "hf-eager+fp32-head"])
        # metadata as JSON strings (escapes, characters beyond ASCII and the BMP) and a
        # "tokens" field of its own, which the count replaces in its place
        odd = self._variant("odd-metadata", change_meta=lambda meta: meta.update(
            engine='transformers "5" \\ \u00fc \u65e5\U0001f600\n\t\x01\x7f', tokens="x",
            a_first="1"))
        rc, out, err = run_c("--model", spec, "--dump", odd, "--json", "--policy", "hf-eager")
        self.assertEqual((rc, err), (0, ""))
        want = B.bisect(self.models["hf"][0], odd, ["hf-eager"])
        self.assertEqual(list(want["dump"]), ["a_first", "dtype", "engine", "model_type",
                                              "parity_dump", "tokens"])
        self.assertEqual(out, B.to_json(want))
        for key in ("hf", "qwen2moe"):
            m, spec, _, _ = self.models[key]
            rc, out, err = run_c("--model", spec, "--dump", self.dumps[key], "--json",
                                 "--between", "hf-eager", "vllm")
            self.assertEqual((rc, err), (0, ""))
            self.assertEqual(out, B.to_json(B.attribute(m, self.dumps[key], "hf-eager", "vllm")))
            rc, table, _ = run_c("--model", spec, "--dump", self.dumps[key], "--between",
                                 "hf-eager", "vllm")
            self.assertEqual(table, B.table(B.attribute(m, self.dumps[key], "hf-eager", "vllm")))

    def test_standard_library_path(self):
        # without numpy (the module's own conversions and counts) the same report, NaN and
        # infinite values in the dump included
        m = self.models["hf"][0]
        nan_dump = self._variant("nan", lambda ts: [
            [n, dt, shape, (b"\xc1\x7f\x80\x7f\x80\xff" + raw[6:]) if n == "layers.0.attn"
             else raw] for n, dt, shape, raw in ts])
        for dump, f16 in ((self.dumps["hf"], False), (nan_dump, False),
                          (self.dumps["f16"], True)):
            model = self.models["f16"][0] if f16 else m
            want = B.to_json(B.bisect(model, dump))
            saved = B._NUMPY[0]
            B._NUMPY[0] = None
            try:
                got = B.to_json(B.bisect(model, dump))
            finally:
                B._NUMPY[0] = saved
            self.assertEqual(got, want, dump)
        r = B.bisect(m, nan_dump, ["hf-eager"])
        self.assertEqual(r["presets"][0]["first_departure"]["name"], "layers.0.attn")
        rc, out, _ = run_c("--model", "synthetic:tiny", "--dump", nan_dump, "--json")
        self.assertEqual(out, B.to_json(B.bisect(m, nan_dump)))

    def test_between(self):
        m, _, _, toks = self.models["hf"]
        r = B.attribute(m, self.dumps["hf"], "hf-eager", "vllm")["between"]
        a, b = Policy.from_name("hf-eager"), Policy.from_name("vllm")
        self.assertEqual([s["switch"] for s in r["switches"]],
                         [f for f in POLICY_FIELDS if getattr(a, f) != getattr(b, f)])
        self.assertEqual(r["positions"], len(toks) - 1)
        for what in ("k3", "bias"):
            total = sum(s["increment"][what] for s in r["switches"])
            self.assertAlmostEqual(total, r["total"][what], delta=1e-12 + 1e-9 * abs(total))
        # the total is B's log-probs against A's, as bench/mismatch.h defines them
        la = np.array(m.score(toks, policy="hf-eager"), dtype=np.float64)
        lb = np.array(m.score(toks, policy="vllm"), dtype=np.float64)
        d = lb - la
        self.assertAlmostEqual(r["total"]["bias"], d.mean(), delta=1e-12)
        self.assertAlmostEqual(r["total"]["k3"], (np.exp(d) - d - 1).mean(), delta=1e-12)
        self.assertGreater(r["total"]["k3"], 0)
        # a switch that does not move raw log-probs: increment and alone 0
        (t,) = [s for s in r["switches"] if s["switch"] == "temperature"]
        self.assertEqual((t["increment"]["k3"], t["alone"]["k3"]), (0.0, 0.0))
        # one switch apart: its alone is the total
        one = B.attribute(m, self.dumps["hf"], "hf-eager", "hf-sdpa")["between"]
        (s,) = one["switches"]
        self.assertEqual((s["switch"], s["a"], s["b"]), ("attention", 0, 1))
        self.assertEqual(s["alone"], one["total"])
        same = B.attribute(m, self.dumps["hf"], "vllm", "vllm")["between"]
        self.assertEqual((same["switches"], same["total"]), ([], {"k3": 0.0, "bias": 0.0}))

    def test_transformers_dump(self):
        # the committed dumps transformers 5.25 wrote (test/data/conformance/tools/
        # make_bisect_example.py): under eager attention hf-eager is bitwise at every rounding
        # point; the presets one switch away depart where the switch first meets a value
        conf = os.path.join(harness.REPO, "test", "data", "conformance")
        model = os.path.join(conf, "qwen3-tiny")
        eager = os.path.join(conf, "qwen3-tiny.eager.safetensors")
        r = B.bisect(model, eager)
        self.assertTrue(r["dump"]["engine"].startswith("transformers "))
        first = {p["preset"]: p["first_departure"] for p in r["presets"]}
        self.assertIsNone(first["hf-eager"])
        self.assertEqual(first["hf-sdpa"]["name"], "layers.0.attn")
        self.assertEqual(first["vllm"]["name"], "layers.0.q_rope")
        self.assertEqual(first["aligned"]["name"], "layers.0.attn_norm")
        rc, out, err = run_c("--model", model, "--dump", eager, "--json")
        self.assertEqual((rc, err, out), (0, "", B.to_json(r)))
        sdpa = B.bisect(model, os.path.join(conf, "qwen3-tiny.sdpa.safetensors"),
                        ["hf-eager", "hf-sdpa"])
        hf, flash = sdpa["presets"]
        self.assertEqual(hf["first_departure"]["name"], "layers.0.attn")
        self.assertEqual(flash["first_departure"]["kind"], "attention")
        self.assertLess(flash["kinds"]["attention"]["differing"],
                        hf["kinds"]["attention"]["differing"])

    # ---- bad input -----------------------------------------------------------------------

    def _variant(self, name, change_tensors=None, change_meta=None, key="hf"):
        """A copy of a dump with its tensors or metadata changed."""
        path = self.dumps[key]
        with open(path, "rb") as f:
            data = f.read()
        meta = _safetensors.metadata(data, path)
        tensors = [[n, dt, list(shape), bytes(mv)]
                   for n, (dt, shape, mv) in _safetensors.parse(data, path).items()]
        if change_tensors:
            tensors = change_tensors(tensors)
        if change_meta:
            change_meta(meta)
        out = os.path.join(self.tmp, name + ".safetensors")
        _safetensors.write(out, tensors, meta)
        return out

    def _refused(self, spec, dump, want, policies=(), errors=(B.DumpError, parity.ParityError)):
        """Both refuse: Python with `want` in its message, C with exit 2 and the same message."""
        m = parity.Model(spec, threads=1)
        try:
            with self.assertRaises(errors) as e:
                B.bisect(m, dump, list(policies) or None)
        finally:
            m.close()
        self.assertIn(want, str(e.exception))
        args = ["--model", spec, "--dump", dump]
        for p in policies:
            args += ["--policy", p]
        rc, out, err = run_c(*args)
        self.assertEqual((rc, out, err), (2, "", "error: %s\n" % e.exception))
        rc, out, err2 = run_module(*args)
        self.assertEqual((rc, err2), (2, err))

    def test_bad_input(self):
        spec = "synthetic:tiny"

        def drop(name):
            return lambda ts: [t for t in ts if t[0] != name]

        def reshape(name, shape):
            def f(ts):
                for t in ts:
                    if t[0] == name:
                        t[2] = shape
                        t[3] = t[3][:2 * shape[0] * shape[1]]
                return ts
            return f

        def retype(name, dtype):
            def f(ts):
                for t in ts:
                    if t[0] == name:
                        t[1] = dtype
                return ts
            return f

        def token(i, value):
            def f(ts):
                for t in ts:
                    if t[0] == "tokens":
                        a = np.frombuffer(t[3], dtype=np.int32).copy()
                        a[i] = value
                        t[3] = a.tobytes()
                return ts
            return f

        d = self._variant("missing", drop("layers.1.q_rope"))
        self._refused(spec, d, "no tensor layers.1.q_rope in the dump (the model needs BF16 "
                               "[13, 64])")
        d = self._variant("shape", reshape("layers.0.attn", [13, 8]))
        self._refused(spec, d, "tensor layers.0.attn has shape [13, 8], the model needs [13, 64]")
        d = self._variant("dtype", retype("logits", "F16"))
        self._refused(spec, d, "tensor logits has dtype F16, the model needs BF16")
        d = self._variant("tokens", token(3, 999))
        self._refused(spec, d, "tokens[3] = 999 is outside the model's vocabulary [0, 256)")
        d = self._variant("extra", lambda ts: ts + [["layers.2.attn", "BF16", [13, 64],
                                                     bytes(2 * 13 * 64)]])
        self._refused(spec, d, "tensor layers.2.attn is not one this model has (qwen3, 2 layers)")
        d = self._variant("version", change_meta=lambda m: m.update(parity_dump="2"))
        self._refused(spec, d, '__metadata__ parity_dump is "2": this bisect reads format 1')
        d = self._variant("unversioned", change_meta=lambda m: m.pop("parity_dump"))
        self._refused(spec, d, "__metadata__ has no parity_dump (not an intermediates dump)")
        d = self._variant("no-engine", change_meta=lambda m: m.pop("engine"))
        self._refused(spec, d, "__metadata__ has no engine")
        d = self._variant("meta-dtype", change_meta=lambda m: m.update(dtype="fp8"))
        self._refused(spec, d, '__metadata__ dtype is "fp8": "bf16" or "f16"')
        d = self._variant("model-type", change_meta=lambda m: m.update(model_type="llama"))
        self._refused(spec, d, '__metadata__ model_type is "llama", the model is qwen3')
        # another model than the dump's
        self._refused(os.path.join(MOE, "qwen3-moe-tiny"), self.dumps["hf"],
                      '__metadata__ model_type is "qwen3", the model is qwen3_moe')
        # an unknown preset; presets that cannot meet the dump's dtype
        self._refused(spec, self.dumps["hf"], "PARITY_ERR_POLICY", ["no-such-preset"])
        self._refused(spec, self.dumps["hf"], "policy hf-eager+fp16 rounds to fp16; the dump "
                      "holds BF16 values", ["hf-eager+fp16"])
        f16_spec = self.models["f16"][1]
        self._refused(f16_spec, self.dumps["f16"], "policy fp32 computes in fp32", ["fp32"])
        # an unsupported model: rope scaling
        scaled = os.path.join(self.tmp, "tiny-linear-rope")
        shutil.copytree(f16_spec, scaled, dirs_exist_ok=True)
        cfg_path = os.path.join(scaled, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        self._refused(scaled, self.dumps["f16"], "the model's rope scaling (linear) is not "
                      "supported: the bisect recomputes default RoPE only")
        # no such file: both exit 2
        missing = os.path.join(self.tmp, "no-such-dump.safetensors")
        self.assertEqual(run_c("--model", spec, "--dump", missing)[0], 2)
        self.assertEqual(run_module("--model", spec, "--dump", missing)[0], 2)
        # not a safetensors file at all: refused by both (their own readers' words)
        junk = os.path.join(self.tmp, "junk.safetensors")
        with open(junk, "wb") as f:
            f.write(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
        with self.assertRaises(ValueError):
            B.bisect(self.models["hf"][0], junk)
        rc, _, err = run_c("--model", spec, "--dump", junk)
        self.assertEqual(rc, 2)
        self.assertTrue(err.startswith("error: "), err)


if __name__ == "__main__":
    harness.run("python-bisect")
