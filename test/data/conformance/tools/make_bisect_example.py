"""The README's bisect example: a tiny Qwen3 made with transformers' own classes (random init,
norm weights moved off 1), saved with save_pretrained in bf16, and the intermediates dump
(docs/DESIGN.md, "Intermediates dump and bisect") of one sequence run by transformers itself,
captured with forward hooks (and apply_rotary_pos_emb wrapped for the query and key after
RoPE), under each attention implementation asked for.

Run with the PyPI virtual environment (torch, transformers, safetensors), never the system Python:

    /work/venv-hf/bin/python test/data/conformance/tools/make_bisect_example.py [--out DIR]

DIR defaults to test/data/conformance (the folder above this script); it writes
  qwen3-tiny/                        the checkpoint as save_pretrained wrote it,
  qwen3-tiny.eager.safetensors       the dump under attn_implementation="eager",
  qwen3-tiny.sdpa.safetensors        the dump under attn_implementation="sdpa".
Seeded, one CPU thread: two runs give the same model bytes and the same tensors and metadata
in the dumps (the safetensors writer orders the metadata keys as its hash map does).
"""
import argparse
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.qwen3 import modeling_qwen3

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
    """Runs the saved model under `attn` on `tokens` and writes the dump to `path`."""
    model = transformers.Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                          attn_implementation=attn).eval()
    cfg = model.config
    T = tokens.shape[0]
    got = {}

    def keep(name):
        def hook(_module, _args, output):
            out = output[0] if isinstance(output, tuple) else output
            got[name] = out.detach().reshape(T, -1).clone()
        return hook

    def keep_input(name):
        def hook(_module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            got[name] = x.detach().reshape(T, -1).clone()
        return hook

    hooks = [model.model.embed_tokens.register_forward_hook(keep("embed")),
             model.model.norm.register_forward_pre_hook(keep_input("final_residual"),
                                                        with_kwargs=True),
             model.model.norm.register_forward_hook(keep("final_norm")),
             model.lm_head.register_forward_hook(keep("logits"))]
    for i, layer in enumerate(model.model.layers):
        L, a, m = "layers.%d." % i, layer.self_attn, layer.mlp
        if i:
            hooks.append(layer.register_forward_pre_hook(keep_input(L + "input"), with_kwargs=True))
        for name, module in (("attn_norm", layer.input_layernorm), ("q_proj", a.q_proj),
                             ("k_proj", a.k_proj), ("v_proj", a.v_proj), ("q_norm", a.q_norm),
                             ("k_norm", a.k_norm), ("o_proj", a.o_proj),
                             ("mlp_norm", layer.post_attention_layernorm),
                             ("gate_proj", m.gate_proj), ("up_proj", m.up_proj), ("mlp", m)):
            hooks.append(module.register_forward_hook(keep(L + name)))
        for name, module in (("attn", a.o_proj), ("attn_residual", layer.post_attention_layernorm),
                             ("swiglu", m.down_proj)):
            hooks.append(module.register_forward_pre_hook(keep_input(L + name), with_kwargs=True))
    # the query and key after RoPE, as the attention function receives them ([1, heads, T, hd])
    rotary, layer_of = modeling_qwen3.apply_rotary_pos_emb, [0]

    def rope_kept(q, k, cos, sin, *rest, **kw):
        q, k = rotary(q, k, cos, sin, *rest, **kw)
        L = "layers.%d." % layer_of[0]
        got[L + "q_rope"] = q.detach().transpose(1, 2).reshape(T, -1).clone()
        got[L + "k_rope"] = k.detach().transpose(1, 2).reshape(T, -1).clone()
        layer_of[0] += 1
        return q, k

    modeling_qwen3.apply_rotary_pos_emb = rope_kept
    try:
        with torch.no_grad():
            model(input_ids=tokens.reshape(1, T).long())
    finally:
        modeling_qwen3.apply_rotary_pos_emb = rotary
        for h in hooks:
            h.remove()
    logp = torch.log_softmax(got["logits"].float(), dim=-1)
    tensors = {"tokens": tokens.to(torch.int32).contiguous(),
               "logprobs": logp[torch.arange(T - 1), tokens[1:].long()].contiguous()}
    tensors.update({k: v.contiguous() for k, v in got.items()})
    meta = {"parity_dump": "1", "model_type": cfg.model_type, "dtype": "bf16",
            "engine": "transformers %s, torch %s, attn_implementation=%s"
                      % (transformers.__version__, torch.__version__, attn)}
    save_file(tensors, path, metadata=meta)
    print("%s: %d tensors, %d bytes" % (path, len(tensors), os.path.getsize(path)))


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
