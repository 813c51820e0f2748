#!/usr/bin/python3
"""PyTorch bf16 on a libparity model shape: the peer parity-speed is compared with.

Written as a user would write it: plain nn.Modules (Linear, an RMSNorm, rotate-half RoPE,
grouped-query eager attention, SwiGLU), weights bf16 with random values, run under
torch.inference_mode(). It measures, with the model shape of a libparity built-in config:

    prefill   one prompt of L tokens, up to the logits of its last position (tok/s = L / time)
    decode    B sequences at a context of C tokens, one token each per step with a KV cache
              (tok/s = B * steps / time); the context is prefilled once, untimed, and its
              cache copied to the B sequences (B samples of one prompt, as parity-speed's
              forks are)

and prints which oneDNN ISA and kernels its bf16 GEMMs ran on (ONEDNN_VERBOSE of a small
matmul in a subprocess: torch does not say otherwise).

The weights are bf16 unless this CPU has no bf16 GEMM kernel in torch: --dtype auto (the
default) times one bf16 and one fp32 matmul of the model's width first, and where bf16 runs at
under a quarter of fp32's rate (seen on an AVX2-only AMD EPYC: 1.6 against 145 GFLOP/s, a
reference loop, which would take the default run past a quarter of an hour) it runs the model
in fp32, as a user of that CPU would, and says so in its first line (`weights fp32 (...)`).
--dtype bf16 or fp32 forces one.

    /usr/bin/python3 bench/torch_peer.py [--config qwen3-0.6b] [--threads 2] [--prompt 512]
        [--batches 1,32] [--context 128] [--steps 8] [--reps 3] [--dtype auto|bf16|fp32]
        [--row-seconds S] [--json FILE]

Needs Debian's python3-torch (apt-get install python3-torch); the shapes come from the
library's table of built-in configs (python/parity, which needs a built libparity).
Median of the repetitions after one warm-up; the min..max spread beside it.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit("torch_peer.py: needs PyTorch (Debian: apt-get install python3-torch; run it "
             "with /usr/bin/python3)")


def builtin_config(name):
    """The shape of a libparity built-in config, from the library's own table."""
    import ctypes
    from parity import _lib
    c = _lib.parity_config()
    c.size = ctypes.sizeof(c)
    _lib.lib.parity_config_builtin(name.encode(), ctypes.byref(c))
    return c


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kvh, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        d = c.hidden_size
        self.q_proj = nn.Linear(d, self.h * self.hd, bias=bool(c.attention_bias))
        self.k_proj = nn.Linear(d, self.kvh * self.hd, bias=bool(c.attention_bias))
        self.v_proj = nn.Linear(d, self.kvh * self.hd, bias=bool(c.attention_bias))
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=False)
        self.q_norm = RMSNorm(self.hd, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(self.hd, c.rms_norm_eps) if c.qk_norm else None

    def forward(self, x, cos, sin, cache, pos):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd)
        k = self.k_proj(x).view(B, T, self.kvh, self.hd)
        v = self.v_proj(x).view(B, T, self.kvh, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        kc, vc = cache
        kc[:, :, pos:pos + T] = k
        vc[:, :, pos:pos + T] = v
        k, v = kc[:, :, :pos + T], vc[:, :, :pos + T]
        rep = self.h // self.kvh
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(self.hd))
        if T > 1:
            mask = torch.full((T, pos + T), float("-inf"), dtype=s.dtype).triu(pos + 1)
            s = s + mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(p, v).transpose(1, 2).reshape(B, T, self.h * self.hd)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, cache, pos):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        half = c.head_dim // 2
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, half, dtype=torch.float32) / half))

    def new_cache(self, batch, length):
        c, dt = self.c, self.norm.weight.dtype
        shape = (batch, c.num_key_value_heads, length, c.head_dim)
        return [(torch.zeros(shape, dtype=dt), torch.zeros(shape, dtype=dt))
                for _ in range(c.num_hidden_layers)]

    def forward(self, tokens, cache, pos, last_only=True):
        T = tokens.shape[1]
        angle = torch.arange(pos, pos + T, dtype=torch.float32)[:, None] * self.inv_freq[None]
        emb = torch.cat((angle, angle), dim=-1)
        dt = self.norm.weight.dtype
        cos, sin = emb.cos().to(dt), emb.sin().to(dt)
        x = self.embed_tokens(tokens)
        for layer, kv in zip(self.layers, cache):
            x = layer(x, cos, sin, kv, pos)
        x = self.norm(x[:, -1:] if last_only else x)
        return self.lm_head(x).float()


def onednn_kernels():
    """What oneDNN ran a bf16 matmul on, from ONEDNN_VERBOSE in a subprocess: (isa, impl)."""
    code = ("import torch; a = torch.randn(64, 1024).bfloat16(); "
            "w = torch.nn.Linear(1024, 1024, bias=False).bfloat16(); "
            "torch.set_num_threads(1); w(a)")
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return "unknown (%s)" % e, "unknown"
    isa = impl = "not reported (oneDNN verbose printed nothing: not oneDNN?)"
    for line in out.splitlines():
        if ",info,cpu,isa:" in line:
            isa = line.split("isa:", 1)[1].strip()
        if ",exec," in line and ("matmul" in line or "inner_product" in line):
            parts = line.split(",")  # onednn_verbose,exec,cpu,PRIMITIVE,IMPLEMENTATION,...
            impl = "%s %s" % (parts[3], parts[4]) if len(parts) > 4 else line
    return isa, impl


def matmul_gflops(dtype, width):
    """GFLOP/s of one (64 x width) @ (width x width) linear in this dtype (best of three)."""
    a = torch.randn(64, width).to(dtype)
    w = torch.randn(width, width).to(dtype)
    F.linear(a, w)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        F.linear(a, w)
        best = min(best, time.perf_counter() - t)
    return 2.0 * 64 * width * width / best / 1e9


def choose_dtype(requested, width):
    """(dtype, why): bf16 unless auto finds torch's bf16 GEMM far slower than its fp32 one."""
    if requested != "auto":
        return getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[requested]), "as asked"
    bf16, fp32 = matmul_gflops(torch.bfloat16, width), matmul_gflops(torch.float32, width)
    rates = "bf16 matmul %.1f GFLOP/s, fp32 %.1f" % (bf16, fp32)
    if bf16 < fp32 / 4:
        return torch.float32, "%s: torch has no bf16 GEMM kernel for this CPU" % rates
    return torch.bfloat16, rates


def blas_info():
    """The BLAS torch was built with (BLAS_INFO in torch.__config__.show(): "mkl", "open",
    "generic" for its own reference loops, ...): what its fp32 GEMMs run on."""
    import re
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return m.group(1) if m else "not reported"


def timed(fn, reps, row_seconds=0.0):
    """(median, min, max) seconds of fn over reps repetitions after an untimed warm-up; with
    row_seconds, fewer repetitions (at least one) where reps of the warm-up's length would
    take longer than that."""
    t = time.perf_counter()
    fn()  # warm-up
    warm = time.perf_counter() - t
    if row_seconds > 0:
        reps = max(1, min(reps, int(row_seconds / max(warm, 1e-9))))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2], times[0], times[-1]


def decode_steps(step, steps, row_seconds):
    """The decode steps to time: `steps`, or fewer (at least one) where one step already takes
    more than row_seconds / steps (measured once); the tok/s are per step either way."""
    if row_seconds <= 0:
        return steps
    t = time.perf_counter()
    step(0)
    one = time.perf_counter() - t
    return max(1, min(steps, int(row_seconds / max(one, 1e-9))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen3-0.6b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto")
    ap.add_argument("--row-seconds", type=float, default=0.0,
                    help="time budget per row: fewer repetitions (and decode steps) where the "
                         "warm-up says the row would take longer; 0 = none")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    c = builtin_config(a.config)
    dtype, why = choose_dtype(a.dtype, c.hidden_size)
    dtype_name = "bf16" if dtype == torch.bfloat16 else "fp32"
    # The weights are set right below, so the constructors' own initialisation (an fp32
    # kaiming draw over every matrix, 11 s of the start-up here) is skipped.
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        model = Model(c).to(dtype).eval()
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved
    # random weights, as libparity's synthetic models (one N(0, 0.02) draw, reused by every
    # matrix: the values do not change the speed)
    params = [p for p in model.parameters() if p.dim() > 1]
    pool = (torch.randn(max(p.numel() for p in params)) * 0.02).to(torch.bfloat16).to(dtype)
    with torch.no_grad():
        for p in params:
            p.copy_(pool[:p.numel()].view_as(p))
    isa, impl = onednn_kernels()
    blas = blas_info()
    print("torch_peer: PyTorch %s, %d thread(s), %s shape; weights %s (%s); oneDNN ISA: %s; "
          "bf16 matmul: %s; BLAS (fp32 GEMMs): %s"
          % (torch.__version__, a.threads, a.config, dtype_name, why, isa, impl, blas))
    rows = []
    with torch.inference_mode():
        prompt = torch.randint(0, c.vocab_size, (1, a.prompt))
        cache = model.new_cache(1, a.prompt)
        med, lo, hi = timed(lambda: model(prompt, cache, 0), a.reps, a.row_seconds)
        rows.append({"phase": "prefill", "batch": 1, "tokens": a.prompt, "context": a.prompt,
                     "tok_s": a.prompt / med, "tok_s_min": a.prompt / hi,
                     "tok_s_max": a.prompt / lo})
        one = model.new_cache(1, a.context + a.steps + 1)
        model(torch.randint(0, c.vocab_size, (1, a.context)), one, 0)
        for b in [int(x) for x in a.batches.split(",") if x]:
            cache = [(k.repeat(b, 1, 1, 1), v.repeat(b, 1, 1, 1)) for k, v in one]
            tok = torch.randint(0, c.vocab_size, (b, 1))

            n_steps = decode_steps(lambda s: model(tok, cache, a.context + s), a.steps,
                                   a.row_seconds)

            def steps():
                for s in range(n_steps):
                    model(tok, cache, a.context + s)
            med, lo, hi = timed(steps, a.reps, a.row_seconds)
            n = b * n_steps
            rows.append({"phase": "decode", "batch": b, "tokens": b, "context": a.context,
                         "tok_s": n / med, "tok_s_min": n / hi, "tok_s_max": n / lo})
    print("%-8s %5s %6s %7s %10s %20s" % ("phase", "batch", "tokens", "context", "tok/s",
                                          "(min..max)"))
    for r in rows:
        print("%-8s %5d %6d %7d %10.1f (%7.1f..%7.1f)" % (r["phase"], r["batch"], r["tokens"],
                                                         r["context"], r["tok_s"], r["tok_s_min"],
                                                         r["tok_s_max"]))
    result = {"peer": "pytorch", "torch": torch.__version__, "threads": a.threads,
              "config": a.config, "dtype": dtype_name, "dtype_reason": why, "blas": blas,
              "onednn_isa": isa,
              "bf16_matmul": impl, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
