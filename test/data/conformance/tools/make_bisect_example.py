"""The README's bisect example: a tiny Qwen3 made with transformers' own classes (random init,
norm weights moved off 1), saved with save_pretrained in bf16, and the intermediates dump
(docs/DESIGN.md, "Intermediates dump and bisect") of one sequence run by transformers itself,
written by parity.hf.dump (forward hooks, and the attention function wrapped for the query and
key after RoPE), under each attention implementation asked for.

Run with the PyPI virtual environment (torch, transformers, safetensors), never the system Python:

    /work/venv-hf/bin/python test/data/conformance/tools/make_bisect_example.py [--out DIR]

DIR defaults to test/data/conformance (the folder above this script); it writes
  qwen3-tiny/                        the checkpoint as save_pretrained wrote it,
  qwen3-tiny.eager.safetensors       the dump under attn_implementation="eager",
  qwen3-tiny.sdpa.safetensors        the dump under attn_implementation="sdpa".
Seeded, one CPU thread: two runs give the same model bytes and the same tensors and metadata
in the dumps (the committed dumps were written by safetensors' own writer, whose header orders
the metadata otherwise; the conformance tier checks that parity.hf.dump on the committed model
gives their tensors and metadata).
"""
import argparse
import os
import shutil
import sys

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 4,
                                "python"))
import parity.hf  # noqa: E402

SEED = 20261207
TOKENS = 24
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=False)


def make_model(out):
    torch.manual_seed(SEED)
    config = transformers.Qwen3Config(**CONFIG)
    model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # RMSNorm weights of 1 would hide their rounding
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    return config


def dump(model_dir, attn, tokens, path):
    """Runs the saved model under `attn` on `tokens` and writes the dump to `path` with
    parity.hf.dump (the conformance tier's writer: forward hooks and the attention function
    wrapped)."""
    model = transformers.Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                          attn_implementation=attn).eval()
    written = parity.hf.dump(model, tokens, path)
    print("%s: %d tensors, %d bytes" % (path, len(written), os.path.getsize(path)))


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=here)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model_dir = os.path.join(args.out, "qwen3-tiny")
    shutil.rmtree(model_dir, ignore_errors=True)
    config = make_model(model_dir)
    g = torch.Generator().manual_seed(SEED + 1)
    tokens = torch.randint(0, config.vocab_size, (TOKENS,), generator=g, dtype=torch.int32)
    for attn in ("eager", "sdpa"):
        dump(model_dir, attn, tokens, os.path.join(args.out, "qwen3-tiny.%s.safetensors" % attn))


if __name__ == "__main__":
    main()
