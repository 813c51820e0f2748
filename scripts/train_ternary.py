"""Quantization-aware fine-tuning of the trained byte-level Qwen3 to ternary weights
(BitNet b1.58): writes the fp32 latents of models/qwen3-bytes-ternary-4.9m.

    /usr/bin/python3 scripts/train_ternary.py [--steps N] [--threads T] [SHARED_MODEL_DIR]

Starts from the fp32 masters of qwen3-bytes-pystdlib-4.9m (../shared/models by default) and
trains with the straight-through absmean quantizer on every decoder linear weight (q, k, v,
o, gate, up, down; the embedding, the norms and lm_head stay as they are, as transformers'
BitNet integration and onebitllms leave them), and the per-token int8 absmax quantizer on
each of those layers' inputs:

    weight:      s = 1 / max(mean|W|, 1e-5);  Wq = clamp(round(W * s), -1, 1) / s
    activation:  s = 127 / max(max_row|x|, 1e-5);  xq = clamp(round(x * s), -128, 127) / s

in fp32, round half to even (torch.round), the gradient passed straight through both. The
corpus is the one the bf16 model was trained on (the Python 3.11 standard library as Debian
12 packages it, raw bytes, test directories left out); every 20th file in sorted order is held
out, and so are the four files test/data/reference/eval_0{0..3}.bin come from. The bf16
model's own held-out split is not recorded, so it may have trained on the every-20th files:
the fair comparison is the four evaluation sequences (held out of both trainings), whose mean
NLL is printed for the fp32 masters and for the ternary model, with the loss over 256-byte
windows of the held-out files; all in fp32 arithmetic (the ternary model fake-quantized as it
trains). README.md of the output directory quotes this output.

PyTorch on CPU (Debian's python3-torch); the output is model-fp32.safetensors (the latents,
every tensor of the checkpoint in F32) and config.json; the deployed layouts are written by
libparity from these latents (tools/make-ternary-model.sh).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SEQ = 256
#: The trained dense model's directory with its fp32 masters (outside the repository).
DENSE_DIR = os.path.join(os.path.dirname(REPO), "shared", "models", "qwen3-bytes-pystdlib-4.9m")


def read_f32(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", name
        lo, hi = e["data_offsets"]
        raw = bytearray(blob[8 + n + lo:8 + n + hi])
        out[name] = torch.frombuffer(raw, dtype=torch.float32).reshape(e["shape"]).clone()
    return out


def write_safetensors(path, tensors, dtype="F32"):
    """Writes every tensor as F32, or as BF16 (one round-to-nearest-even cast of fp32)."""
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().to(torch.float32)
        if dtype == "BF16":
            t = t.to(torch.bfloat16).view(torch.int16)
        b = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def write_config(out, cfg):
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print("wrote", out)


def write_f32(path, tensors):
    write_safetensors(path, tensors, "F32")


def corpus():
    root = "/usr/lib/python3.11"
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("test", "tests", "idle_test", "__pycache__"))
        files += [os.path.join(d, x) for x in names if x.endswith(".py")]
    files.sort()
    evals = [open(os.path.join(REPO, "test", "data", "reference", "eval_%02d.bin" % k), "rb").read()
             for k in range(4)]
    train, held = [], []
    for i, p in enumerate(files):
        with open(p, "rb") as f:
            text = f.read()
        # every 20th file, and the files the evaluation sequences come from
        out = i % 20 == 0 or any(e[:200] in text for e in evals)
        (held if out else train).append(text)
    return b"".join(train), b"".join(held), len(files), evals


class Quantized(torch.autograd.Function):
    """The value of a quantizer with the identity as its gradient (straight through)."""

    @staticmethod
    def forward(ctx, x, q):
        return q

    @staticmethod
    def backward(ctx, g):
        return g, None


def ternary_weight(w):
    s = 1.0 / w.abs().mean().clamp(min=1e-5)
    return Quantized.apply(w, (w * s).round().clamp(-1, 1) / s)


def int8_activation(x):
    s = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    return Quantized.apply(x, (x * s).round().clamp(-128, 127) / s)


def rmsnorm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def forward(p, tokens, cfg, ternary, mlp=None):
    """Logits [B, T, 256]. mlp(x, layer_prefix), if given, replaces each layer's dense MLP
    (scripts/train_moe.py passes its mixture of experts)."""
    B, T = tokens.shape
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(x):
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def lin(x, name):
        w = p[name]
        if ternary:
            return F.linear(int8_activation(x), ternary_weight(w))
        return F.linear(x, w)

    h = p["model.embed_tokens.weight"][tokens]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        x = rmsnorm(h, p[pre + "input_layernorm.weight"])
        q = lin(x, pre + "self_attn.q_proj.weight").view(B, T, H, D)
        k = lin(x, pre + "self_attn.k_proj.weight").view(B, T, KV, D)
        v = lin(x, pre + "self_attn.v_proj.weight").view(B, T, KV, D)
        q = rope(rmsnorm(q, p[pre + "self_attn.q_norm.weight"]).transpose(1, 2))
        k = rope(rmsnorm(k, p[pre + "self_attn.k_norm.weight"]).transpose(1, 2))
        v = v.transpose(1, 2)
        k = k.repeat_interleave(H // KV, 1)
        v = v.repeat_interleave(H // KV, 1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, -1) @ v
        h = h + lin(a.transpose(1, 2).reshape(B, T, H * D), pre + "self_attn.o_proj.weight")
        x = rmsnorm(h, p[pre + "post_attention_layernorm.weight"])
        if mlp is not None:
            h = h + mlp(x, pre)
            continue
        m = F.silu(lin(x, pre + "mlp.gate_proj.weight")) * lin(x, pre + "mlp.up_proj.weight")
        h = h + lin(m, pre + "mlp.down_proj.weight")
    return F.linear(rmsnorm(h, p["model.norm.weight"]), p["lm_head.weight"])


def held_out_loss(p, cfg, held, ternary, windows=256, mlp=None):
    data = torch.frombuffer(bytearray(held), dtype=torch.uint8).long()
    n = min(windows, (len(data) - 1) // SEQ)
    total = 0.0
    with torch.no_grad():
        for b0 in range(0, n, 16):
            idx = torch.arange(b0, min(n, b0 + 16))
            x = torch.stack([data[i * SEQ:(i + 1) * SEQ] for i in idx])
            y = torch.stack([data[i * SEQ + 1:(i + 1) * SEQ + 1] for i in idx])
            logits = forward(p, x, cfg, ternary, mlp)
            total += F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1), reduction="sum").item()
    return total / (n * SEQ)


def eval_nll(p, cfg, evals, ternary, mlp=None):
    """Mean NLL over the 4 x 511 predictions of the 512-byte evaluation sequences (held out of
    the bf16 model's training, by its README, and of this one's)."""
    with torch.no_grad():
        x = torch.stack([torch.frombuffer(bytearray(e), dtype=torch.uint8).long() for e in evals])
        logits = forward(p, x[:, :-1], cfg, ternary, mlp)
        return F.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1)).item()


def learning_rate(step, steps, peak):
    """Linear warm-up over the first 5% of the steps, then cosine from peak to peak / 10."""
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / (steps - warm))))


def batch(data, generator):
    """16 windows of SEQ bytes at random offsets of data, and the bytes that follow each."""
    starts = torch.randint(0, len(data) - SEQ - 1, (16,), generator=generator)
    x = torch.stack([data[s:s + SEQ] for s in starts])
    y = torch.stack([data[s + 1:s + SEQ + 1] for s in starts])
    return x, y


def load_dense(src):
    """The trained dense model's config.json and fp32 masters; seeds torch's generator."""
    torch.manual_seed(0)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    return cfg, read_f32(os.path.join(src, "model-fp32.safetensors"))


def print_corpus(nfiles, train, held):
    print("corpus: %d files, %d train bytes, %d held-out bytes" % (nfiles, len(train), len(held)),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src", nargs="?", default=DENSE_DIR)
    ap.add_argument("--out", default=os.path.join(REPO, "models", "qwen3-bytes-ternary-4.9m"))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, p = load_dense(args.src)
    train, held, nfiles, evals = corpus()
    print_corpus(nfiles, train, held)
    base = held_out_loss(p, cfg, held, False)
    start_t = held_out_loss(p, cfg, held, True)
    print("held-out loss before: bf16 model's fp32 masters %.4f, ternary at step 0 %.4f nats/byte"
          % (base, start_t), flush=True)
    base_eval = eval_nll(p, cfg, evals, False)
    print("evaluation sequences before: fp32 masters %.4f, ternary at step 0 %.4f nats/byte"
          % (base_eval, eval_nll(p, cfg, evals, True)), flush=True)
    params = [t.requires_grad_() for t in p.values()]
    decay = [t for n, t in p.items() if t.dim() == 2]
    rest = [t for n, t in p.items() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr,
                            betas=(0.9, 0.95))
    del params
    data = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(1)
    t0 = time.time()
    for step in range(args.steps):
        lr = learning_rate(step, args.steps, args.lr)
        for grp in opt.param_groups:
            grp["lr"] = lr
        x, y = batch(data, g)
        loss = F.cross_entropy(forward(p, x, cfg, True).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print("step %d loss %.4f lr %.2e %.0f s" % (step, loss.item(), lr, time.time() - t0),
                  flush=True)
    took = time.time() - t0
    final = held_out_loss(p, cfg, held, True)
    print("trained %d steps (%d tokens) in %.0f s on %d thread(s)" % (args.steps, args.steps * 16 * SEQ,
                                                                     took, args.threads))
    print("held-out loss after: ternary %.4f nats/byte (bf16 model's masters %.4f)" % (final, base))
    print("evaluation sequences after: ternary %.4f nats/byte (bf16 model's masters %.4f)"
          % (eval_nll(p, cfg, evals, True), base_eval))
    os.makedirs(args.out, exist_ok=True)
    write_f32(os.path.join(args.out, "model-fp32.safetensors"), p)
    write_config(args.out, cfg)


if __name__ == "__main__":
    sys.exit(main())
