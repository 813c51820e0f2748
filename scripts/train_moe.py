"""Upcycles the trained byte-level Qwen3 into a mixture of experts (Qwen3-MoE) and trains it:
writes models/qwen3-moe-bytes-8.4m, so that routing figures come from a trained router.

    /usr/bin/python3 scripts/train_moe.py [--steps N] [--threads T] [--out DIR] [--fp32 FILE]
        [SHARED_MODEL_DIR]

Starts from the fp32 masters of qwen3-bytes-pystdlib-4.9m (../shared/models by default): its
embedding, attention, norms and lm_head as they are; each layer's MLP (intermediate 768) cut
into 8 slices of 96 neurons (rows of gate_proj and up_proj, columns of down_proj), expert e
made of slices e and (e + 3) mod 8 (--slices-per-expert 2; with 1, expert e is slice e mod 4 of
192 and experts e and e + 4 start equal), down_proj times --upcycle-scale 3 (before training,
the upcycled model's NLL on the evaluation sequences was 1.425 at scale 4 and 1.398 at 3; with
one slice an expert 2.100, 1.491, 1.368, 1.411 at scales 1-4); so 8 distinct experts of 192, 2
active per token; and a fresh router (mlp.gate.weight, N(0, 0.02^2), seeded). Every layer is
sparse (decoder_sparse_step 1, no mlp_only_layers), norm_topk_prob true, as Qwen3-30B-A3B.

The forward is Qwen3-MoE as transformers defines it (models/qwen3_moe/modeling_qwen3_moe.py,
Qwen3MoeTopKRouter and Qwen3MoeExperts): router logits = the gate linear; softmax in fp32;
torch.topk; the top-k weights divided by their sum; each expert applied to the tokens that chose
it, scaled by the token's weight and index-added into the output. Everything is fp32 here.
Only the routers and the experts train (--train-all: everything), so every other tensor stays
bitwise the dense model's. The loss is the cross-entropy plus --aux-coef (0.01, the Switch
Transformer's alpha) times the load-balancing loss E * sum_e (share of the top-k choices going
to e) * (mean router probability of e), k when balanced (transformers' load_balancing_loss_func),
taken per layer and averaged (--balance per-layer, as the Switch Transformer and Megatron do).
transformers pools every layer's rows into one such loss (--balance pooled), so expert e of one
layer can balance expert e of another: with it (coefficient 0.001 or 0.01) the pooled loss stayed
near 2.0-2.09 while experts of single layers took 0.0% of the choices. AdamW (0.9/0.95, weight
decay 0.01 on matrices; the routers' learning rate --router-lr-scale 5 times the experts', so a
fresh router leaves its near-uniform start in 200 steps), warm-up then cosine to a tenth, batches
of 16 x 256 bytes of the corpus, with the held-out split, of scripts/train_ternary.py.

It prints the losses, the mean NLL over the four evaluation sequences
(test/data/reference/eval_0{0..3}.bin) of the dense model, the upcycled model before training,
the trained model (fp32 weights and after the bf16 cast), and the routing on those sequences:
each layer's share of choices per expert and the router's mean entropy. README.md of the
output directory quotes this output. Writes config.json (transformers' Qwen3MoeConfig fields,
per-expert tensor names as save_pretrained writes them), model.safetensors (BF16, one
round-to-nearest-even cast of the fp32 weights) and, with --fp32 FILE, the fp32 weights (33.6 MB,
too large to ship in the repository).
"""
import argparse
import math
import os
import sys
import time

# PyTorch's OpenMP threads spin while they wait for each other; on a machine shared with other
# work that made a step 5-8 times slower (measured: 19-30 s against 3.4-4.2 s passive).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402 (after the OpenMP setting, which is read when torch loads)
import torch.nn.functional as F

from train_ternary import (DENSE_DIR, REPO, SEQ, batch, corpus, eval_nll,  # noqa: E402
                           forward, held_out_loss, learning_rate, load_dense, print_corpus,
                           write_config, write_safetensors)


def moe_config(dense, experts, top_k, expert_size, aux_coef):
    """The dense model's config.json turned into Qwen3MoeConfig's, as transformers 4.51 writes
    it (the version of the dense model's config and of Qwen3-30B-A3B's on the hub)."""
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
            "max_position_embeddings", "initializer_range", "rms_norm_eps", "rope_theta",
            "rope_scaling", "attention_bias", "attention_dropout", "tie_word_embeddings",
            "use_cache", "use_sliding_window", "sliding_window", "max_window_layers")
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}
    cfg.update({k: dense[k] for k in keep})
    cfg.update({"decoder_sparse_step": 1, "mlp_only_layers": [], "num_experts": experts,
                "num_experts_per_tok": top_k, "moe_intermediate_size": expert_size,
                "norm_topk_prob": True, "output_router_logits": False,
                "router_aux_loss_coef": aux_coef, "torch_dtype": "bfloat16",
                "transformers_version": "4.51.0"})
    return cfg


def upcycle(dense_p, cfg, scale, parts, generator):
    """The MoE's tensors from the dense model's: the layer's MLP cut into slices of (expert
    size / parts) neurons, expert e made of the slices (e + 3 j) mod slices, j < parts (parts 1:
    slice e mod slices); down_proj times scale; the router is fresh."""
    p = {n: t.clone() for n, t in dense_p.items() if ".mlp." not in n}
    size = cfg["moe_intermediate_size"] // parts
    slices = cfg["intermediate_size"] // size
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d.mlp." % i
        for e in range(cfg["num_experts"]):
            rows = torch.cat([torch.arange(size) + (e + 3 * j) % slices * size
                              for j in range(parts)])
            ex = pre + "experts.%d." % e
            p[ex + "gate_proj.weight"] = dense_p[pre + "gate_proj.weight"][rows].clone()
            p[ex + "up_proj.weight"] = dense_p[pre + "up_proj.weight"][rows].clone()
            p[ex + "down_proj.weight"] = dense_p[pre + "down_proj.weight"][:, rows] * scale
        p[pre + "gate.weight"] = torch.randn(cfg["num_experts"], cfg["hidden_size"],
                                             generator=generator) * cfg["initializer_range"]
    return p


def moe_mlp(p, cfg, record=None):
    """The sparse MoE block as a forward(..., mlp=) callback; appends each layer's (router
    logits, top-k ids) to record when given."""
    E, K = cfg["num_experts"], cfg["num_experts_per_tok"]

    def mlp(x, pre):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = F.linear(x, p[pre + "mlp.gate.weight"])
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, ids = torch.topk(probs, K, dim=-1)
        if cfg["norm_topk_prob"]:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(E):
            token, slot = torch.where(ids == e)
            if token.numel() == 0:
                continue
            ex = pre + "mlp.experts.%d." % e
            xe = x[token]
            h = F.silu(F.linear(xe, p[ex + "gate_proj.weight"])) * \
                F.linear(xe, p[ex + "up_proj.weight"])
            y = F.linear(h, p[ex + "down_proj.weight"])
            out.index_add_(0, token, y * weights[token, slot, None])
        if record is not None:
            record.append((logits, ids))
        return out.reshape(shape)

    return mlp


def load_balancing_loss(record, E, per_layer=False):
    """transformers' load_balancing_loss_func without an attention mask: every layer's rows
    pooled; E * sum_e (top-k choices of e / rows) * (mean probability of e). per_layer: the
    mean over the layers of that loss taken on each layer alone (the Switch Transformer's and
    Megatron's form; pooled, expert e of one layer can balance expert e of another)."""
    if per_layer:
        return sum(load_balancing_loss([r], E) for r in record) / len(record)
    chosen = torch.zeros(E)
    prob = torch.zeros(E)
    rows = 0
    for logits, ids in record:
        chosen = chosen + F.one_hot(ids.reshape(-1), E).sum(0).float()
        prob = prob + torch.softmax(logits, dim=-1, dtype=torch.float).sum(0)
        rows += logits.shape[0]
    return E * torch.sum((chosen / rows) * (prob / rows))


def routing_report(p, cfg, evals):
    """Per layer: each expert's share of the top-k choices on the evaluation sequences, the
    router's mean entropy (nats; ln E when uniform) and the mean weight of the first slot."""
    record = []
    x = torch.stack([torch.frombuffer(bytearray(e), dtype=torch.uint8).long() for e in evals])
    with torch.no_grad():
        forward(p, x[:, :-1], cfg, False, moe_mlp(p, cfg, record))
        aux = load_balancing_loss(record, cfg["num_experts"]).item()
    E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
    lines = ["routing on the evaluation sequences (%d tokens, top-%d of %d; balanced: %.1f%% "
             "of choices per expert, entropy ln %d = %.3f):" % (record[0][0].shape[0], K, E,
                                                                100.0 / E, E, math.log(E))]
    lines.append("  layer  choices per expert (%%, experts 0..%d)%s  entropy  top-1 weight"
                 % (E - 1, " " * (6 * E - 33)))
    for i, (logits, ids) in enumerate(record):
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        share = F.one_hot(ids.reshape(-1), E).sum(0).float() / ids.numel() * 100
        entropy = -(probs * probs.clamp(min=1e-30).log()).sum(-1).mean().item()
        top = probs.topk(K, dim=-1).values
        top1 = (top[:, 0] / top.sum(-1)).mean().item()
        lines.append("  %5d  %s  %7.3f  %12.3f" % (i, " ".join("%5.1f" % s for s in share),
                                                    entropy, top1))
    lines.append("  load-balancing loss on these tokens: %.4f (k = %d when balanced)" % (aux, K))
    return "\n".join(lines)


def bf16_rounded(p):
    return {n: t.detach().to(torch.bfloat16).to(torch.float32) for n, t in p.items()}


def count_params(cfg, p):
    total = sum(t.numel() for t in p.values())
    per_expert = sum(p["model.layers.0.mlp.experts.0.%s_proj.weight" % w].numel()
                     for w in ("gate", "up", "down"))
    idle = cfg["num_hidden_layers"] * (cfg["num_experts"] - cfg["num_experts_per_tok"]) * per_expert
    return total, total - idle


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src", nargs="?", default=DENSE_DIR)
    ap.add_argument("--out", default=os.path.join(REPO, "models", "qwen3-moe-bytes-8.4m"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-size", type=int, default=192)
    ap.add_argument("--upcycle-scale", type=float, default=3.0)
    ap.add_argument("--slices-per-expert", type=int, default=2)
    ap.add_argument("--aux-coef", type=float, default=0.01,
                    help="router_aux_loss_coef (Qwen3MoeConfig's default is 0.001)")
    ap.add_argument("--balance", choices=("pooled", "per-layer"), default="per-layer",
                    help="the load-balancing loss per layer, or over all layers' rows "
                         "(transformers)")
    ap.add_argument("--router-lr-scale", type=float, default=5.0,
                    help="the router's learning rate over the experts'")
    ap.add_argument("--train-all", action="store_true",
                    help="train every tensor, not only the router and the experts")
    ap.add_argument("--fp32", help="also write the fp32 weights to this safetensors file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dense_cfg, dense = load_dense(args.src)
    cfg = moe_config(dense_cfg, args.experts, args.top_k, args.expert_size, args.aux_coef)
    p = upcycle(dense, cfg, args.upcycle_scale, args.slices_per_expert,
                torch.Generator().manual_seed(2))
    total, active = count_params(cfg, p)
    print("qwen3_moe: %d layers, %d experts of %d, top-%d; %d parameters, %d active a token"
          % (cfg["num_hidden_layers"], cfg["num_experts"], cfg["moe_intermediate_size"],
             cfg["num_experts_per_tok"], total, active), flush=True)
    train, held, nfiles, evals = corpus()
    print_corpus(nfiles, train, held)
    dense_eval = eval_nll(dense, dense_cfg, evals, False)
    dense_held = held_out_loss(dense, dense_cfg, held, False)
    print("dense model (fp32 masters): evaluation sequences %.4f, held-out files %.4f nats/byte"
          % (dense_eval, dense_held), flush=True)
    print("upcycled, before training: evaluation sequences %.4f nats/byte"
          % eval_nll(p, cfg, evals, False, moe_mlp(p, cfg)), flush=True)
    print(routing_report(p, cfg, evals), flush=True)

    trained = {n: t for n, t in p.items() if args.train_all or ".mlp." in n}
    for t in trained.values():
        t.requires_grad_()
    print("training %d of %d tensors (%d parameters)" % (len(trained), len(p), sum(
        t.numel() for t in trained.values())), flush=True)
    router = [t for n, t in trained.items() if n.endswith(".mlp.gate.weight")]
    decay = [t for n, t in trained.items() if t.dim() == 2 and not n.endswith(".mlp.gate.weight")]
    rest = [t for t in trained.values() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01, "scale": 1.0},
                             {"params": rest, "weight_decay": 0.0, "scale": 1.0},
                             {"params": router, "weight_decay": 0.01,
                              "scale": args.router_lr_scale}], lr=args.lr, betas=(0.9, 0.95))
    data = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(1)
    coef = cfg["router_aux_loss_coef"]
    t0 = time.time()
    for step in range(args.steps):
        lr = learning_rate(step, args.steps, args.lr)
        for grp in opt.param_groups:
            grp["lr"] = lr * grp["scale"]
        x, y = batch(data, g)
        record = []
        logits = forward(p, x, cfg, False, moe_mlp(p, cfg, record))
        ce = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        aux = load_balancing_loss(record, cfg["num_experts"], args.balance == "per-layer")
        loss = ce + coef * aux
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(trained.values()), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            print("step %d loss %.4f (cross-entropy %.4f, load balance %.4f) lr %.2e %.0f s"
                  % (step, loss.item(), ce.item(), aux.item(), lr, time.time() - t0), flush=True)
    took = time.time() - t0
    print("trained %d steps (%d tokens) in %.0f s on %d thread(s)"
          % (args.steps, args.steps * 16 * SEQ, took, args.threads))
    with torch.no_grad():
        p = {n: t.detach() for n, t in p.items()}
        p16 = bf16_rounded(p)
        print("after training: evaluation sequences %.4f (fp32 weights), %.4f (bf16-cast weights, "
              "fp32 arithmetic); held-out files %.4f nats/byte; dense model %.4f, %.4f"
              % (eval_nll(p, cfg, evals, False, moe_mlp(p, cfg)),
                 eval_nll(p16, cfg, evals, False, moe_mlp(p16, cfg)),
                 held_out_loss(p, cfg, held, False, mlp=moe_mlp(p, cfg)), dense_eval, dense_held))
        print(routing_report(p, cfg, evals))
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), p, "BF16")
    if args.fp32:
        write_safetensors(args.fp32, p, "F32")
    write_config(args.out, cfg)


if __name__ == "__main__":
    sys.exit(main())
