"""A mixture-of-experts layer's router and combine as PyTorch autograd Functions for the learner
(learner.py): the forward through the C entry points the model's forward runs
(parity_moe_route, parity_moe_combine: their bits), the backward the fp32 formula of what each
computes, every rounding point passing its gradient straight through.

Router: p = softmax(logits) over the experts (fp32), the chosen experts' p, renormalised to
sum 1 with norm_topk_prob; a topk-softmax router's softmax over the chosen logits alone. The
top-k choice itself (or a replayed one) is a constant: the gradient reaches the router logits
through the chosen experts' weights only, as the frameworks' routing replay keeps it.
Combine: out = sum over slots of w_s y_s (+ sigmoid(g) y_shared for a shared expert).
"""
import ctypes

import torch as _torch

from . import _lib
from ._lib import lib
from .policy import policy_struct

__all__ = ["moe_route", "moe_combine"]

_f32 = _torch.float32
_TOPK_SOFTMAX = 3   # PARITY_MOE_ROUTER_TOPK_SOFTMAX


def _addr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else None


def _route_formula(logits, ids, norm, router):
    """The chosen experts' weights in fp32 (differentiable in logits)."""
    if router == _TOPK_SOFTMAX:
        return _torch.softmax(logits.gather(1, ids), dim=1)
    w = _torch.softmax(logits, dim=1).gather(1, ids)
    return w / w.sum(1, keepdim=True) if norm else w


class _Route(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, replay, k, norm, pol_c):
        rows, n_experts = logits.shape
        x = logits.detach().contiguous()
        ids16 = _torch.empty(rows, k, dtype=_torch.int16)
        weights = _torch.empty(rows, k, dtype=_f32)
        rep = replay.to(_torch.int16).contiguous() if replay is not None else None
        lib.parity_moe_route(ctypes.byref(pol_c), rows, n_experts, k, 1 if norm else 0, _addr(x),
                             n_experts, _addr(rep), _addr(ids16), _addr(weights))
        ids = ids16.to(_torch.int64) & 0xFFFF
        ctx.save_for_backward(x, ids)
        ctx.norm, ctx.router = norm, pol_c.moe_router
        ctx.mark_non_differentiable(ids)
        return weights, ids

    @staticmethod
    def backward(ctx, g_weights, g_ids):
        x, ids = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with _torch.enable_grad():
            w = _route_formula(x, ids, ctx.norm, ctx.router)
            (gx,) = _torch.autograd.grad(w, x, g_weights)
        return gx, None, None, None, None


def route(logits, k, norm, pol_c, replay=None):
    """(weights [rows, k] fp32, ids [rows, k] int64) of router logits [rows, n_experts]
    (fp32, contiguous); replay: None or int64 ids [rows, k] to take instead of the top-k."""
    return _Route.apply(logits, replay, k, bool(norm), pol_c)


class _Combine(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, weights, y_shared, gate, ids, pol_c):
        rows, k, width = y.shape
        out = _torch.empty(rows, width, dtype=_f32)
        yc, wc = y.detach().contiguous(), weights.detach().contiguous()
        ids16 = ids.to(_torch.int16).contiguous()
        ys = y_shared.detach().contiguous() if y_shared is not None else None
        gc = gate.detach().contiguous() if gate is not None else None
        lib.parity_moe_combine(ctypes.byref(pol_c), rows, width, k, _addr(ids16), _addr(wc),
                               _addr(yc), _addr(ys), _addr(gc), _addr(out))
        ctx.save_for_backward(yc, wc, ys, gc)
        return out

    @staticmethod
    def backward(ctx, g):
        y, w, ys, gate = ctx.saved_tensors
        g = g.contiguous()
        gy = w.unsqueeze(2) * g.unsqueeze(1) if ctx.needs_input_grad[0] else None
        gw = (y * g.unsqueeze(1)).sum(2) if ctx.needs_input_grad[1] else None
        gys = gg = None
        if ys is not None:
            sig = _torch.sigmoid(gate)
            gys = sig.unsqueeze(1) * g
            gg = (g * ys).sum(1) * sig * (1 - sig)
        return gy, gw, gys, gg, None, None


def combine(y, weights, ids, pol_c, y_shared=None, gate=None):
    """The combine's output [rows, width] (fp32 holding the policy's rounded values) of the
    experts' unrounded outputs y [rows, k, width], weights [rows, k], ids [rows, k] and a shared
    expert's y_shared [rows, width] and gate logits [rows] (or None)."""
    return _Combine.apply(y, weights, y_shared, gate, ids, pol_c)


def _check(t, name, ndim, dtype=_f32):
    if not isinstance(t, _torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, not %s" % (name, type(t).__name__))
    if t.dtype != dtype or t.dim() != ndim or t.device.type != "cpu":
        raise ValueError("%s must be a %d-D %s CPU tensor, not %s %s of shape %s"
                         % (name, ndim, dtype, t.device, t.dtype, tuple(t.shape)))


def moe_route(logits, k, norm_topk_prob=True, policy="aligned", replay=None):
    """A mixture-of-experts router as parity_moe_route, on a torch tensor: logits fp32 [rows,
    n_experts] (the router GEMM's output as the policy rounds it) to (weights fp32 [rows, k],
    ids int64 [rows, k]), the k experts in slot order (descending probability, ties to the
    lower index) per the policy's moe_router and moe_weights; replay: None, or int ids [rows,
    k] (distinct per row, below n_experts) taken instead of the top-k. The weights are
    differentiable in logits (the fp32 formula: softmax, the chosen, renormalised; straight
    through a rounding to bf16); the choice is not."""
    _check(logits, "logits", 2)
    if replay is not None:
        if not isinstance(replay, _torch.Tensor):
            replay = _torch.as_tensor(replay)
        if replay.dtype.is_floating_point or tuple(replay.shape) != (logits.shape[0], k):
            raise ValueError("replay must be integer ids of shape %s, not %s %s"
                             % ((logits.shape[0], k), replay.dtype, tuple(replay.shape)))
        if replay.numel() and (int(replay.min()) < 0 or int(replay.max()) > 2 ** 15 - 1):
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "replay: an expert id is outside [0, 32767]")
    k = _lib.as_int(k, "k", 1, 64)
    return route(logits, k, norm_topk_prob, policy_struct(policy), replay)


def moe_combine(y, weights, ids, policy="aligned", y_shared=None, shared_gate=None):
    """A mixture-of-experts combine as parity_moe_combine, on torch tensors: y fp32 [rows, k,
    width] (the chosen experts' unrounded down-projection outputs, slot order), weights fp32
    [rows, k] and ids [rows, k] (moe_route's), and for a shared expert y_shared fp32 [rows,
    width] and shared_gate fp32 [rows] (its gate's logits, rounded). Returns fp32 [rows,
    width], rounded where the policy's moe_combine rounds; differentiable in y, weights,
    y_shared and shared_gate (the fp32 formula sum_s w_s y_s + sigmoid(g) y_shared)."""
    _check(y, "y", 3)
    _check(weights, "weights", 2)
    if tuple(weights.shape) != tuple(y.shape[:2]) or tuple(ids.shape) != tuple(y.shape[:2]):
        raise ValueError("y %s, weights %s and ids %s disagree on (rows, k)"
                         % (tuple(y.shape), tuple(weights.shape), tuple(ids.shape)))
    if (y_shared is None) != (shared_gate is None):
        raise ValueError("y_shared and shared_gate go together")
    if y_shared is not None:
        _check(y_shared, "y_shared", 2)
        _check(shared_gate, "shared_gate", 1)
    return combine(y, weights, ids, policy_struct(policy), y_shared, shared_gate)
