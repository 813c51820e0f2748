#!/usr/bin/env python3
"""How long parity.write_manifest takes for a qwen3-0.6b-shaped set of weights (the learner's
side of the sync check, once per weight update).

    python3 bench/manifest_speed.py [--config qwen3-0.6b] [--dtype bf16|f32|both] [--repeat 1]
                                    [--json FILE]

The tensors are those of a Hugging Face checkpoint of the built-in config
(parity_config_builtin: layers, hidden, intermediate, heads, kv heads, head_dim, vocab, tied
embeddings, q/k-norm), each its own buffer (bytearray, filled with a repeated random block so
that every page is really there), given as ("BF16" | "F32", shape, buffer) tuples. Times the
write_manifest call alone (wall clock, best of --repeat), prints one line per dtype and a JSON
object. The target is under 10 s.
"""
import argparse
import ctypes
import json
import os
import random
import sys
import tempfile
import time

import pybench  # noqa: F401  (puts python/ on sys.path)
import parity  # noqa: E402
from parity import _lib  # noqa: E402


def shapes(config):
    """{checkpoint name: shape} of a model of `config` (a parity_config)."""
    c = config
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, \
        c.num_key_value_heads * c.head_dim
    out = {"model.embed_tokens.weight": (c.vocab_size, h)}
    for i in range(c.num_hidden_layers):
        p = "model.layers.%d." % i
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (q, h)
        out[p + "self_attn.k_proj.weight"] = (kv, h)
        out[p + "self_attn.v_proj.weight"] = (kv, h)
        if c.attention_bias:
            out[p + "self_attn.q_proj.bias"] = (q,)
            out[p + "self_attn.k_proj.bias"] = (kv,)
            out[p + "self_attn.v_proj.bias"] = (kv,)
        out[p + "self_attn.o_proj.weight"] = (h, q)
        if c.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (c.head_dim,)
            out[p + "self_attn.k_norm.weight"] = (c.head_dim,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "mlp.gate_proj.weight"] = (c.intermediate_size, h)
        out[p + "mlp.up_proj.weight"] = (c.intermediate_size, h)
        out[p + "mlp.down_proj.weight"] = (h, c.intermediate_size)
    out["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    return out


def weights(shape_of, dtype, seed=0):
    """{name: (dtype, shape, bytearray)}: values from a repeated random block of 64 KiB (finite
    fp32 / bf16 values around 1)."""
    rnd = random.Random(seed)
    itemsize = 4 if dtype == "F32" else 2
    if dtype == "F32":
        block = b"".join(((0x3F000000 | rnd.getrandbits(23)) ^ (rnd.getrandbits(1) << 31))
                         .to_bytes(4, "little") for _ in range(16384))
    else:
        block = b"".join(((0x3F00 | rnd.getrandbits(7)) ^ (rnd.getrandbits(1) << 15))
                         .to_bytes(2, "little") for _ in range(32768))
    out = {}
    for name, shape in shape_of.items():
        n = 1
        for s in shape:
            n *= s
        nbytes = n * itemsize
        buf = bytearray(block * (nbytes // len(block)) + block[:nbytes % len(block)])
        out[name] = (dtype, shape, buf)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="qwen3-0.6b")
    ap.add_argument("--dtype", choices=["bf16", "f32", "both"], default="both")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", help="also write the JSON summary here")
    args = ap.parse_args()
    cfg = _lib.parity_config()
    _lib.lib.parity_config_builtin(args.config.encode(), ctypes.byref(cfg))
    shape_of = shapes(cfg)
    params = sum(1 if not s else s[0] * (s[1] if len(s) > 1 else 1) for s in shape_of.values())
    result = {"config": args.config, "tensors": len(shape_of), "parameters": params,
              "python": sys.version.split()[0], "library": parity.LIBRARY_PATH, "seconds": {},
              "target_seconds": 10}
    path = os.path.join(tempfile.mkdtemp(prefix="parity-manifest-"), "manifest.json")
    for dtype in (["BF16", "F32"] if args.dtype == "both" else [args.dtype.upper()]):
        tensors = weights(shape_of, dtype)
        nbytes = sum(len(t[2]) for t in tensors.values())
        best = float("inf")
        for _ in range(max(args.repeat, 1)):
            t0 = time.perf_counter()
            parity.write_manifest(path, tensors, version=1)
            best = min(best, time.perf_counter() - t0)
        with open(path) as f:
            assert len(json.load(f)["tensors"]) == len(shape_of)
        result["seconds"][dtype] = round(best, 3)
        print("%s: %d tensors, %.2f G parameters, %s buffers of %.2f GB: write_manifest %.2f s "
              "(%.2f GB/s)" % (args.config, len(shape_of), params / 1e9, dtype, nbytes / 1e9,
                               best, nbytes / 1e9 / best))
        del tensors
    os.unlink(path)
    os.rmdir(os.path.dirname(path))
    result["target_met"] = all(v < 10 for v in result["seconds"].values())
    pybench.emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
