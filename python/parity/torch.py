"""The policies' region semantics on PyTorch bf16 tensors, bitwise equal to libparity's kernels.

A PyTorch learner that computes its residual+RMSNorm, RMSNorm (incl. Qwen3 q/k-norm), SwiGLU and
RoPE with these functions rounds at exactly the points the sampler's policy rounds, and on CPU
gets exactly the sampler's bits: the arithmetic follows lib/kernels/kernels.h and lib/kernels/kernels_ref.c
operation by operation —

  - sums of squares in the "dot16" order (16 lanes, element i in lane i % 16, acc = fmaf(x, x,
    acc), lanes folded l += l+8, l+4, l+2, l+1), then mean = sum / dim, r = 1 / sqrtf(ms + eps)
    with sqrtf the float64 root rounded to fp32 (correctly rounded; torch.sqrt on float32 is not
    on PyTorch 2.15's CPU);
  - silu(g) = g / (1 + parity_expf(-g)) with the library's own exp (a Cody-Waite reduction and a
    degree-7 polynomial in fmaf steps), not torch.exp;
  - RoPE tables as lib/model/rope.c computes them: inv_freq = 1 / (float)pow(theta, 2i/hd), angle =
    (float)pos * inv_freq in fp32, cos/sin of the angle in double (libm, the same one the library
    calls) rounded to fp32 and, for bf16 tables, to bf16;
  - every other step a single IEEE fp32 operation (torch's CPU kernels for +, -, * and / are
    correctly rounded; constants are full tensors, never 0-dim scalars, so that no kernel
    takes a scalar fast path), and every rounding point x.to(bfloat16) (round to nearest
    even). The bf16 outputs map every NaN to 0x7fc0 as the library does (the CPU conversion
    of PyTorch 1.13 and 2.15 writes 0xffff for a NaN).

fmaf(a, b, c) is emulated exactly: a*b of two fp32 values is exact in float64 (48 bits); the sum
with c computed in float64 rounds to fp32 as the exact sum does unless it lands on an fp32
midpoint itself (any other midpoint between it and the exact sum would be a double nearer the
sum), so there, and below fp32's normal range, the sum is rounded to odd instead (TwoSum gives
the exact error; an inexact sum with an even last bit moves one ulp toward the error), and
rounding that to fp32 is the correctly rounded fp32 result, since float64 has more than 24 + 2
bits (Boldo & Melquiond's round-to-odd theorem). No double rounding can slip through, whatever
the values (subnormals included).

Gradients: the outputs carry the gradient of the ordinary fp32 formula (rsqrt of the mean of
squares, g * sigmoid(g)) through the same rounding points; only the forward values are exact.

Importing this module needs torch (``import parity`` never imports it). Policies are names or
parity.Policy objects, as everywhere in parity. Tensors are bf16 on any device; the bitwise
guarantee is for CPU.
"""
from ._torch_regions import (expf, fmaf, rmsnorm, rmsnorm_residual, rope, rope_cos_sin,
                             round_point, silu, sum_squares, swiglu)
from ._torch_moe import moe_combine, moe_route
from .learner import (CausalLM, Pool, attention, embedding, head_logprobs, linear,
                      logprobs_from_logits, read_checkpoint)

__all__ = ["rmsnorm_residual", "rmsnorm", "swiglu", "rope", "rope_cos_sin", "round_point", "silu",
           "expf", "fmaf", "sum_squares",
           # the learner (parity/learner.py), built on the functions above
           "CausalLM", "Pool", "attention", "embedding", "head_logprobs", "linear",
           "logprobs_from_logits", "moe_route", "moe_combine", "read_checkpoint"]
