"""The export check of bench/parity-quant-check, in Python (plain python3, no numpy).

    python3 -m parity.quant_check --latents DIR|FILE.safetensors --quantizer FORMAT:RULE
        [--deployed DIR] [--policy PRESET] [--write-export DIR] [--eval FILE ...] [--json FILE]

Does a deployed quantized checkpoint hold the codes its training quantizer computes from the
fp32 latents? For every decoder linear weight (FORMAT nvfp4, mxfp4 or ternary):
  (a) train     the training quantizer on the fp32 latents (parity.quant.quantize_weight);
  (b) export    the same quantizer after a bf16 cast of the latents (quantize_bf16_export:
                the ternary rules in bf16 arithmetic, as onebitllms' quantize_to_1bit);
  (c) deployed  the --deployed checkpoint's codes: its shipped codes (a BitNet, ModelOpt NVFP4
                or MXFP4 checkpoint, unpacked here from its files), else the quantizer applied
                to its values (fake-quantized weights);
the codes and scales where (b) and (c) differ from (a); then the effect on the evaluation
sequences: held-out NLL and the sampler/learner mismatch when the sampler serves (b), (c) or a
remedy and the learner scores the latents, both under PRESET+FORMAT:RULE. The export (b) is
served as a real checkpoint of the format, written by this module (packing the codes as the
layouts do), and loaded by parity.Model. Remedy 1 writes the training codes
(Model.save(dir, layout=FORMAT:RULE)); remedy 2 moves each bf16 input to the nearest bf16 value
whose export gives the training code (quant.adjust_bf16). check() returns the report as a dict
with the keys of the C tool's --json; its counts are the C tool's, and its log-probs too, bit
for bit (test_quant_check compares them).
"""
import json
import math
import os
import shutil
import sys
import tempfile
from array import array

from . import _safetensors, quant
from .model import Model

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
LAYOUTS = {"nvfp4": "nvfp4", "mxfp4": "mxfp4", "ternary": "bitnet"}
_SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "U8": 1, "I8": 1}


# ---- safetensors, read ------------------------------------------------------------------------

def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file."""
    return {name: (dtype, shape, bytes(raw))
            for name, (dtype, shape, raw) in _safetensors.read(path).items()}


def _f32(dtype, raw):
    """The values of a BF16, F16 or F32 tensor as array('f')."""
    if dtype == "F32":
        return array("f", raw)
    if dtype == "BF16":
        h = array("H", raw)
        return array("f", array("I", [v << 16 for v in h]).tobytes())
    if dtype == "F16":
        return array("f", [quant.fp16_to_f32(h) for h in array("H", raw)])
    raise ValueError("a weight of dtype %s" % dtype)


def _bf16_bits(x):
    """RNE bf16 bit patterns (array('H')) of array('f') values (finite)."""
    u = array("I", x.tobytes())
    return array("H", [(v + 0x7FFF + ((v >> 16) & 1)) >> 16 for v in u])


def _bits(values):
    return array("I", array("f", values).tobytes())


# ---- the layouts' packing ---------------------------------------------------------------------

def _pack_rows(codes, rows, cols, row_codes):
    """E2M1 codes (one a byte, row-major) two a byte, low nibble the even column, each row
    padded with +0 to row_codes codes."""
    out = bytearray()
    for r in range(rows):
        row = bytes(codes[r * cols:(r + 1) * cols]) + bytes(row_codes - cols)
        out += bytes(quant.fp4_pack(row))
    return bytes(out)


def _unpack_rows(packed, rows, cols, row_bytes):
    out = bytearray()
    for r in range(rows):
        out += bytes(quant.fp4_unpack(packed[r * row_bytes:(r + 1) * row_bytes], 2 * row_bytes))[:cols]
    return bytes(out)


_TERNARY_ENCODE = [bytes((((c + 1) & 0xFF) & 3) << (2 * i) for c in range(256)) for i in range(4)]
_TERNARY_DECODE = [bytes((((b >> (2 * i)) & 3) - 1) & 0xFF for b in range(256)) for i in range(4)]


def _ternary_pack(codes, rows, cols):
    """transformers' pack_weights: row i * R + r in bits 2i of packed row r, value + 1 (the
    four fields of a byte are disjoint bits, so a packed row is the OR of four encoded rows)."""
    pr = (rows + 3) // 4
    codes = bytes(codes)
    out = bytearray()
    for r in range(pr):
        acc = 0
        for i in range(4):
            row = i * pr + r
            if row < rows:
                acc |= int.from_bytes(codes[row * cols:(row + 1) * cols].translate(_TERNARY_ENCODE[i]), "little")
        out += acc.to_bytes(cols, "little")
    return bytes(out)


def _ternary_unpack(packed, rows, cols):
    pr = (rows + 3) // 4
    packed = bytes(packed)
    out = bytearray()
    for row in range(rows):
        i, r = divmod(row, pr)
        out += packed[r * cols:(r + 1) * cols].translate(_TERNARY_DECODE[i])
    return bytes(out)


def _e8m0(v):
    m, e = math.frexp(v)  # v = 0.5 * 2^e for a power of two
    return e - 1 + 127


def layout_tensors(fmt, name, rows, cols, codes, scales):
    """A weight's tensors in the checkpoint layout of fmt, from codes and scales as
    quant.quantize_weight returns them (block scales, then the tensor scale)."""
    if fmt == "nvfp4":
        g = (cols + 15) // 16
        return [(name, "U8", (rows, (cols + 1) // 2), _pack_rows(codes, rows, cols, 2 * ((cols + 1) // 2))),
                (name + "_scale", "F8_E4M3", (rows, g), bytes(quant.fp8_from_f32(array("f", scales[:rows * g])))),
                (name + "_scale_2", "F32", (), array("f", [scales[rows * g]]).tobytes())]
    if fmt == "mxfp4":
        g = (cols + 31) // 32
        return [(name + "_blocks", "U8", (rows, g, 16), _pack_rows(codes, rows, cols, 32 * g)),
                (name + "_scales", "U8", (rows, g), bytes(_e8m0(s) for s in scales[:rows * g]))]
    s_w = array("f", [scales[-1]])
    return [(name, "U8", ((rows + 3) // 4, cols), _ternary_pack(codes, rows, cols)),
            (name + "_scale", "BF16", (1,), _bf16_bits(s_w).tobytes())]


def shipped_codes(fmt, cfg, st, name, rows, cols):
    """The codes and scales (quantize_weight's layout) of a shipped weight of a checkpoint whose
    config says how it is quantized, or None when the weight holds values."""
    if fmt == "nvfp4" and name + "_scale_2" in st:
        g = (cols + 15) // 16
        codes = _unpack_rows(st[name][2], rows, cols, (cols + 1) // 2)
        scales = array("f", quant.fp8_to_f32(st[name + "_scale"][2]))
        scales.append(array("f", st[name + "_scale_2"][2])[0])
        return codes, scales[:rows * g + 1]
    if fmt == "mxfp4" and name + "_blocks" in st:
        g = (cols + 31) // 32
        codes = _unpack_rows(st[name + "_blocks"][2], rows, cols, 16 * g)
        scales = array("f", [math.ldexp(1.0, b - 127) for b in st[name + "_scales"][2]])
        scales.append(0.0)
        return codes, scales
    if fmt == "ternary" and st.get(name, ("",))[0] == "U8":
        q = cfg.get("quantization_config") or {}
        dtype, _, raw = st[name + "_scale"]
        s = _f32(dtype, raw)[0]
        s_w = array("f", [1.0 / s])[0] if q.get("linear_class") == "autobitlinear" else s
        return _ternary_unpack(st[name][2], rows, cols), array("f", [0.0, s_w])
    return None


# ---- the check --------------------------------------------------------------------------------

def _first_and_count(fmt, grid):
    """Where a format's scales start in quantize_weight's list and how many it has."""
    if fmt == "ternary":
        return grid, 1
    return 0, grid + 1 if fmt == "nvfp4" else grid


class _Counts:
    def __init__(self):
        self.codes = self.code_diff = self.scales = self.scale_diff = 0
        self.scale_rel = 0.0

    def add(self, a, a_s, b, b_s, fmt, grid):
        first, n = _first_and_count(fmt, grid)
        self.codes += len(a)
        if bytes(a) != bytes(b):
            self.code_diff += sum(1 for x, y in zip(a, b) if x != y)
        sa, sb = _bits(a_s[first:first + n]), _bits(b_s[first:first + n])
        self.scales += n
        for i in range(n):
            if sa[i] != sb[i]:
                self.scale_diff += 1
                x, y = a_s[first + i], b_s[first + i]
                self.scale_rel = max(self.scale_rel, abs(y - x) / max(abs(x), 1e-30))

    def as_dict(self):
        return {"codes": self.codes, "differ": self.code_diff, "scales": self.scales,
                "scales_differ": self.scale_diff, "max_relative": self.scale_rel}


def _effect(learner, sampler):
    """NLL of the sampler's log-probs and their mismatch against the learner's."""
    n = len(learner)
    r = [float(a) - float(b) for a, b in zip(learner, sampler)]
    la, sb = _bits(learner), _bits(sampler)
    return {"nll": -sum(float(x) for x in sampler) / n, "mean_abs": sum(abs(x) for x in r) / n,
            "max_abs": max(abs(x) for x in r), "k3": sum(math.exp(x) - x - 1 for x in r) / n,
            "equal": sum(1 for i in range(n) if la[i] == sb[i]) / n}


def _score(directory, seqs, policy):
    m = Model(directory, threads=2)
    try:
        lp = m.score(seqs, policy=policy)
    finally:
        m.close()
    return [x for seq in lp for x in seq]


def _write_served(template_dir, st_latents, fmt, served, out_dir):
    """out_dir: template_dir's config files (a checkpoint of the format the library wrote) and
    a model.safetensors with the latents' other tensors cast to bf16 and each linear weight's
    `served` codes and scales in the format's layout."""
    os.makedirs(out_dir, exist_ok=True)
    for f in ("config.json", "hf_quant_config.json"):
        if os.path.exists(os.path.join(template_dir, f)):
            shutil.copy(os.path.join(template_dir, f), os.path.join(out_dir, f))
    tensors = []
    for name, (dtype, shape, raw) in sorted(st_latents.items()):
        if name in served:
            rows, cols, codes, scales = served[name]
            tensors += layout_tensors(fmt, name, rows, cols, codes, scales)
        else:
            tensors.append((name, "BF16", shape, _bf16_bits(_f32(dtype, raw)).tobytes()))
    _safetensors.write(os.path.join(out_dir, "model.safetensors"), tensors)


def check(latents, quantizer, policy="hf-eager", deployed=None, evals=None, write_export=None,
          log=print):
    """The export check; returns the report (a dict). See the module's docstring."""
    fmt = quantizer.partition(":")[0]
    if fmt not in LAYOUTS:
        raise ValueError("FORMAT must be nvfp4, mxfp4 or ternary, not %r" % fmt)
    if quantizer == "nvfp4:te-2d":
        raise ValueError("nvfp4:te-2d: the second remedy (quant.adjust_bf16) is written for "
                         "1 x 16 blocks, not 16 x 16 tiles; check a 1 x 16 rule")
    full_policy = "%s+%s" % (policy, quantizer)
    if os.path.isdir(latents):
        ldir, lfile = latents, os.path.join(latents, "model.safetensors")
    else:
        ldir, lfile = os.path.dirname(os.path.abspath(latents)), latents
    with open(os.path.join(ldir, "config.json")) as f:
        cfg = json.load(f)
    st = read_safetensors(lfile)
    if evals is None:
        root = os.environ.get("PARITY_SOURCE_ROOT", ".")
        evals = [os.path.join(root, "test", "data", "reference", "eval_%02d.bin" % k) for k in range(4)]
    seqs = []
    for path in evals:
        with open(path, "rb") as f:
            seqs.append(list(f.read()[:4096]))
    dep_cfg = dep_st = None
    if deployed:
        with open(os.path.join(deployed, "config.json")) as f:
            dep_cfg = json.load(f)
        dep_st = read_safetensors(os.path.join(deployed, "model.safetensors"))
    t_export, t_deployed, t_adjusted, t_written = _Counts(), _Counts(), _Counts(), _Counts()
    served_export, served_adjusted, trained, moved = {}, {}, {}, 0
    for layer in range(cfg["num_hidden_layers"]):
        for lin in LINEARS:
            name = "model.layers.%d.%s.weight" % (layer, lin)
            dtype, (rows, cols), raw = st[name]
            x = _f32(dtype, raw)
            a, a_s = quant.quantize_weight(x, rows, cols, quantizer)
            grid = len(a_s) - 1  # the block scales; then the tensor scale
            b, b_s = quant.quantize_bf16_export(x, rows, cols, quantizer)
            trained[name] = (a, a_s, grid)
            t_export.add(a, a_s, b, b_s, fmt, grid)
            served_export[name] = (rows, cols, b, b_s)
            if deployed:
                got = shipped_codes(fmt, dep_cfg, dep_st, name, rows, cols)
                if got is None:
                    dd, _, draw = dep_st[name]
                    got = quant.quantize_weight(_f32(dd, draw), rows, cols, quantizer)
                t_deployed.add(a, a_s, got[0], got[1], fmt, grid)
            adj, k = quant.adjust_bf16(x, rows, cols, quantizer)
            moved += k
            back = array("f", array("I", [h << 16 for h in adj]).tobytes())
            c, c_s = quant.quantize_bf16_export(back, rows, cols, quantizer)
            t_adjusted.add(a, a_s, c, c_s, fmt, grid)
            served_adjusted[name] = (rows, cols, c, c_s)
    work = tempfile.mkdtemp(prefix="parity-quant-check-py-")
    try:
        # remedy 1: the latents written with the training rule by the library, loaded back
        written = os.path.join(work, "written")
        lat_dir = os.path.join(work, "latents")
        os.makedirs(lat_dir)
        shutil.copy(os.path.join(ldir, "config.json"), os.path.join(lat_dir, "config.json"))
        os.symlink(os.path.abspath(lfile), os.path.join(lat_dir, "model.safetensors"))
        m = Model(lat_dir, threads=2)
        try:
            m.save(written, layout="%s:%s" % (LAYOUTS[fmt], quantizer.partition(":")[2]))
        finally:
            m.close()
        with open(os.path.join(written, "config.json")) as f:
            wcfg = json.load(f)
        wst = read_safetensors(os.path.join(written, "model.safetensors"))
        for name, (a, a_s, grid) in trained.items():
            rows, cols = served_export[name][:2]
            got = shipped_codes(fmt, wcfg, wst, name, rows, cols)
            t_written.add(a, a_s, got[0], got[1], fmt, grid)
        # the export (b) and the export of the adjusted inputs, served as checkpoints
        export_dir = write_export or os.path.join(work, "export")
        _write_served(written, st, fmt, served_export, export_dir)
        adjusted_dir = os.path.join(work, "adjusted")
        _write_served(written, st, fmt, served_adjusted, adjusted_dir)
        lp_l = _score(lat_dir, seqs, full_policy)
        report = {"latents": latents, "quantizer": quantizer, "policy": full_policy,
                  "export": dict(t_export.as_dict(), **_effect(lp_l, _score(export_dir, seqs, full_policy))),
                  "remedy_written": dict(t_written.as_dict(), **_effect(lp_l, _score(written, seqs, full_policy))),
                  "remedy_adjusted": dict(t_adjusted.as_dict(), moved=moved,
                                          **_effect(lp_l, _score(adjusted_dir, seqs, full_policy))),
                  "learner_nll": _effect(lp_l, lp_l)["nll"],
                  "reference_nll": _effect(lp_l, _score(lat_dir, seqs, policy))["nll"]}
        if deployed:
            report["deployed"] = dict(t_deployed.as_dict(), **_effect(lp_l, _score(deployed, seqs, full_policy)))
    finally:
        shutil.rmtree(work)
    _print(report, log)
    return report


def _print(r, log):
    log("parity.quant_check: latents %s, policy %s" % (r["latents"], r["policy"]))
    log("codes that differ from (a) the training quantizer on the fp32 latents:")
    rows = [("(b) bf16-cast export", "export"), ("(c) deployed checkpoint", "deployed"),
            ("remedy 1: codes written", "remedy_written"), ("remedy 2: bf16 adjusted", "remedy_adjusted")]
    for label, key in rows:
        if key in r:
            c = r[key]
            log("  %-26s %10d of %d (%.4f%%); scales %d of %d differ (max relative %.3g)"
                % (label, c["differ"], c["codes"], 100.0 * c["differ"] / max(c["codes"], 1),
                   c["scales_differ"], c["scales"], c["max_relative"]))
    log("effect (learner = the latents with the training quantizer):")
    log("  %-26s %9s %10s %10s %10s %8s" % ("sampler serves", "NLL", "mean|d|", "max|d|", "k3 KL", "equal"))
    log("  %-26s %9.4f" % ("(a) the training codes", r["learner_nll"]))
    for label, key in rows:
        if key in r:
            c = r[key]
            log("  %-26s %9.4f %10.3g %10.3g %10.3g %8.3f"
                % (label.split(":")[0], c["nll"], c["mean_abs"], c["max_abs"], c["k3"], c["equal"]))
    log("  %-26s %9.4f   (the latents unquantized)" % ("reference", r["reference_nll"]))


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python3 -m parity.quant_check", description=__doc__.split("\n")[0])
    p.add_argument("--latents", required=True)
    p.add_argument("--quantizer", required=True)
    p.add_argument("--deployed")
    p.add_argument("--policy", default="hf-eager")
    p.add_argument("--write-export")
    p.add_argument("--eval", nargs="+")
    p.add_argument("--json")
    a = p.parse_args(argv)
    r = check(a.latents, a.quantizer, a.policy, a.deployed, a.eval, a.write_export)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    ok = r["remedy_written"]["differ"] == 0 and r["remedy_adjusted"]["differ"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
