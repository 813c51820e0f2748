"""Tiny Qwen3-MoE and Qwen2-MoE checkpoints made with transformers' own classes, and reference
outputs computed by transformers itself (see ../README.md for the file formats).

Run with the PyPI virtual environment (torch, transformers, safetensors), never the system Python:

    /work/venv-hf/bin/python test/data/moe/tools/make_moe_reference.py [--out DIR]

DIR defaults to test/data/moe (the folder above this script). For each model it writes
  MODEL/                the checkpoint as save_pretrained wrote it (config.json, model.safetensors,
                        generation_config.json),
  MODEL-fused/          the same weights in the other expert layout (see write_other_expert_layout),
  ref/MODEL.seqN.*      the token ids and the reference outputs of four fixed sequences,
and summary.txt with the figures it printed (versions, expert use, ties, file sizes, sha256).

Everything is seeded and runs on one CPU thread, so two runs give the same bytes.
"""
import argparse
import hashlib
import os
import shutil
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.integrations import moe as moe_integration

SEED = 20261207
SEQUENCE_LENGTHS = (7, 33, 64, 100)
CALIBRATION_SHAPE = (4, 64)          # token sequences used only to set the weight scales below
ROUTER_LOGIT_STD = 2.0               # spread of the router logits' token-dependent part
SHARED_GATE_LOGIT_STD = 1.5          # spread of qwen2_moe's shared-expert gate logit
LM_HEAD_LOGIT_STD = 2.0              # spread of the output logits
EMBEDDING_COMMON_SHIFT = 0.08        # common component added to every embedding row
QKV_BIAS_STD = 0.05                  # qwen2_moe q/k/v biases (transformers initialises them 0)

COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_experts=8, moe_intermediate_size=32,
              intermediate_size=96, decoder_sparse_step=1, max_position_embeddings=512,
              rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
# Per model: config class, model class, config fields, and the router's per-expert logit offsets
# (permuted for each layer): one favoured expert and two rarely chosen ones, milder for top-2.
MODELS = {
    "qwen3-moe-tiny": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                       dict(COMMON, num_experts_per_tok=2, norm_topk_prob=True,
                            mlp_only_layers=[1]),
                       (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.0, -3.0)),
    "qwen2-moe-tiny": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                       dict(COMMON, num_experts_per_tok=4, norm_topk_prob=False,
                            shared_expert_intermediate_size=48, mlp_only_layers=[],
                            qkv_bias=True),
                       (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.5, -4.0)),
}


def log(lines, text=""):
    """Prints a line and keeps it for summary.txt."""
    print(text)
    lines.append(text)


def sparse_layer_indices(model):
    """The decoder layers whose MLP is a sparse MoE block, in order."""
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]


def capture_inputs(model, module, tokens):
    """Runs the model on tokens ([B, T]) and returns what module received, as [B*T, H] fp32."""
    seen = []
    handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    with torch.no_grad():
        model(input_ids=tokens)
    handle.remove()
    return torch.cat([x.reshape(-1, x.shape[-1]) for x in seen]).float()


def scale_rows_to_spread(weight, inputs, target_std):
    """Scales a [N, H] weight so that inputs @ weight.T has standard deviation target_std."""
    with torch.no_grad():
        weight.mul_(target_std / (inputs @ weight.T).std().item())


def shape_router(router_weight, inputs, expert_bias, generator):
    """Gives a router a spread of a few units and some rarely chosen experts.

    The rows are made orthogonal to the inputs' mean direction m (so their token-dependent part
    has mean zero), scaled to ROUTER_LOGIT_STD, and then given expert_bias (in an order permuted
    for each layer) along m: expert e's logit is shifted by about bias[e] for every token
    (x . m / |m|^2 is 1 on average). transformers' router has no bias, so a direction that all
    the inputs share carries it; EMBEDDING_COMMON_SHIFT gives the inputs that direction.
    """
    with torch.no_grad():
        mean = inputs.mean(0)
        unit = mean / mean.norm()
        rows = router_weight.float()
        rows -= (rows @ unit)[:, None] * unit[None, :]
        rows *= ROUTER_LOGIT_STD / (inputs @ rows.T).std().item()
        order = torch.randperm(rows.shape[0], generator=generator)
        bias = torch.tensor(expert_bias)[order]
        rows += bias[:, None] * mean[None, :] / mean.dot(mean)
        router_weight.copy_(rows)
    return bias


def build_model(name, generator, lines):
    """Makes the fp32 model with transformers' init, then the adjustments described above."""
    config_class, model_class, fields, expert_bias = MODELS[name]
    transformers.set_seed(SEED)
    config = config_class(**fields)
    model = model_class(config).eval()
    with torch.no_grad():
        shift = torch.randn(config.hidden_size, generator=generator)
        model.model.embed_tokens.weight += EMBEDDING_COMMON_SHIFT * shift / shift.norm()
        if getattr(config, "qkv_bias", False):
            for layer in model.model.layers:
                attention = layer.self_attn
                for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
                    proj.bias.copy_(QKV_BIAS_STD * torch.randn(proj.bias.shape,
                                                               generator=generator))
    calibration = torch.randint(0, config.vocab_size, CALIBRATION_SHAPE, generator=generator)
    for index in sparse_layer_indices(model):
        block = model.model.layers[index].mlp
        inputs = capture_inputs(model, block.gate, calibration)
        bias = shape_router(block.gate.weight, inputs, expert_bias, generator)
        log(lines, f"  layer {index}: router offsets by expert {[float(b) for b in bias]}")
        if hasattr(block, "shared_expert_gate"):
            scale_rows_to_spread(block.shared_expert_gate.weight, inputs, SHARED_GATE_LOGIT_STD)
    inputs = capture_inputs(model, model.lm_head, calibration)
    scale_rows_to_spread(model.lm_head.weight, inputs, LM_HEAD_LOGIT_STD)
    return model


def write_other_expert_layout(source_dir, target_dir):
    """Writes the checkpoint in source_dir with its experts in the other layout.

    Per-expert names (model.layers.L.mlp.experts.N.{gate,up,down}_proj.weight) become the fused
    3-D tensors model.layers.L.mlp.experts.gate_up_proj [E, 2I, H] (gate rows first, then up:
    conversion_mapping.py's MergeModulelist(dim=0) then Concatenate(dim=1)) and
    model.layers.L.mlp.experts.down_proj [E, H, I]; fused tensors are split the other way.
    Returns "fused" or "per-expert", the layout written.
    """
    with safe_open(os.path.join(source_dir, "model.safetensors"), "pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
        metadata = f.metadata()
    out, experts, layout = {}, {}, None
    for key, tensor in tensors.items():
        head, sep, tail = key.partition(".mlp.experts.")
        if not sep:
            out[key] = tensor
            continue
        parts = tail.split(".")
        if parts[0].isdigit():
            layout = "fused"
            experts.setdefault(head, {})[(int(parts[0]), parts[1])] = tensor
        else:
            layout = "per-expert"
            for number, row in enumerate(tensor):
                if parts[0] == "gate_up_proj":
                    gate, up = row.chunk(2, dim=0)
                    out[f"{head}.mlp.experts.{number}.gate_proj.weight"] = gate.clone()
                    out[f"{head}.mlp.experts.{number}.up_proj.weight"] = up.clone()
                else:
                    out[f"{head}.mlp.experts.{number}.down_proj.weight"] = row.clone()
    for head, by_expert in experts.items():
        count = 1 + max(number for number, _ in by_expert)
        out[f"{head}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([by_expert[(n, "gate_proj")], by_expert[(n, "up_proj")]], dim=0)
             for n in range(count)])
        out[f"{head}.mlp.experts.down_proj"] = torch.stack(
            [by_expert[(n, "down_proj")] for n in range(count)])
    os.makedirs(target_dir, exist_ok=True)
    for other in ("config.json", "generation_config.json"):
        if os.path.exists(os.path.join(source_dir, other)):
            shutil.copyfile(os.path.join(source_dir, other), os.path.join(target_dir, other))
    save_file(dict(sorted(out.items())), os.path.join(target_dir, "model.safetensors"),
              metadata=metadata)
    return layout


def expert_names_written(directory):
    """Summarises the expert tensor names in a checkpoint, layer 0 only."""
    with safe_open(os.path.join(directory, "model.safetensors"), "pt") as f:
        return [f"{key} {list(f.get_slice(key).get_shape())}" for key in sorted(f.keys())
                if key.startswith("model.layers.0.mlp.experts.")
                and (".experts.0." in key or key.count(".") == 5)]


def load(directory, dtype, experts_implementation="eager"):
    """Loads a checkpoint the way a user would, eager attention and the given experts backend."""
    kwargs = dict(dtype=dtype, attn_implementation="eager")
    if experts_implementation is not None:
        kwargs["experts_implementation"] = experts_implementation
    return transformers.AutoModelForCausalLM.from_pretrained(directory, **kwargs).eval()


def same_bits(a, b):
    """True when two tensors have the same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def run_sequence(model, tokens):
    """One forward (batch 1, no cache). Returns the log-probs and, per sparse layer in order,
    the router's (logits, routing weights, expert ids) as the gate module returned them."""
    captured = {}
    handles = []
    for index in sparse_layer_indices(model):
        def hook(_module, _args, output, index=index):
            captured[index] = tuple(t.detach() for t in output)
        handles.append(model.model.layers[index].mlp.gate.register_forward_hook(hook))
    with torch.no_grad():
        logits = model(input_ids=tokens[None, :], use_cache=False).logits[0]
    for handle in handles:
        handle.remove()
    logp = torch.log_softmax(logits.float(), -1)[:-1].gather(-1, tokens[1:, None])[:, 0]
    return logp, [captured[i] for i in sparse_layer_indices(model)]


def count_ties(router_logits, top_k):
    """Counts, over positions, where torch's fp32 router probabilities tie: at the k-th/k+1-th
    place (the chosen set depends on the tie rule) and inside the top k (only the slot order
    does). Returns (the positions of boundary ties, the number of positions with inner ties)."""
    probs = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
    ordered = probs.sort(dim=-1, descending=True).values
    boundary = (ordered[:, top_k - 1] == ordered[:, top_k]).nonzero()[:, 0].tolist()
    inner = int((ordered[:, :top_k - 1] == ordered[:, 1:top_k]).any(-1).sum())
    return boundary, inner


LITTLE_ENDIAN = {torch.int16: "<i2", torch.int32: "<i4", torch.float32: "<f4"}


def write(path, tensor, dtype):
    """Writes a tensor's values, converted exactly to dtype, as little-endian raw data."""
    tensor.to(dtype).contiguous().numpy().astype(LITTLE_ENDIAN[dtype]).tofile(path)


def make(name, out_dir, lines):
    """Builds one model and writes its checkpoints and references."""
    generator = torch.Generator().manual_seed(SEED)
    log(lines, f"== {name}")
    model = build_model(name, generator, lines)
    model.to(torch.bfloat16)
    checkpoint = os.path.join(out_dir, name)
    shutil.rmtree(checkpoint, ignore_errors=True)
    model.save_pretrained(checkpoint, safe_serialization=True)
    written = write_other_expert_layout(checkpoint, checkpoint + "-scratch")
    saved_layout = "per-expert" if written == "fused" else "fused"
    other = checkpoint + ("-fused" if written == "fused" else "-per-expert")
    shutil.rmtree(other, ignore_errors=True)
    os.rename(checkpoint + "-scratch", other)
    log(lines, f"  save_pretrained wrote the {saved_layout} layout; {os.path.basename(other)}/ "
               f"holds the {written} copy. Layer 0 expert names:")
    for line in expert_names_written(checkpoint):
        log(lines, f"    {name}/: {line}")
    for line in expert_names_written(other):
        log(lines, f"    {os.path.basename(other)}/: {line}")

    reference = load(checkpoint, torch.bfloat16)
    copy = load(other, torch.bfloat16)
    saved_state = model.state_dict()
    for key, value in reference.state_dict().items():
        if not same_bits(value, saved_state[key]) or not same_bits(value, copy.state_dict()[key]):
            sys.exit(f"{name}: {key} differs after loading the saved checkpoints")
    log(lines, f"  both layouts load (from_pretrained) to the saved parameters bit for bit; "
               f"experts backend {reference.config._experts_implementation}, "
               f"attention {reference.config._attn_implementation}")
    default = load(checkpoint, torch.bfloat16, experts_implementation=None)
    probe = default.model.layers[0].mlp.experts.down_proj
    grouped = ("torch.nn.functional.grouped_mm" if hasattr(torch.nn.functional, "grouped_mm")
               else "torch._grouped_mm")
    can_group = moe_integration._can_use_grouped_mm(probe[:1, :1], probe, None)
    log(lines, f"  experts backend when none is asked for: {default.config._experts_implementation}"
               f" (its GEMM here: {grouped if can_group else 'the per-expert torch.mm fallback'})")
    wide = load(checkpoint, torch.bfloat16).float()
    for key, value in wide.state_dict().items():
        if not torch.equal(value, reference.state_dict()[key].float()):
            sys.exit(f"{name}: {key} did not widen exactly")

    sparse = sparse_layer_indices(reference)
    top_k, experts = reference.config.num_experts_per_tok, reference.config.num_experts
    log(lines, f"  sparse layers {sparse}, {experts} experts, top-{top_k}, norm_topk_prob "
               f"{reference.config.norm_topk_prob}")
    ref_dir = os.path.join(out_dir, "ref")
    os.makedirs(ref_dir, exist_ok=True)
    sequences = torch.Generator().manual_seed(SEED + 1)
    use = torch.zeros(len(sparse), experts, dtype=torch.long)
    totals = dict(boundary=0, inner=0, decisions=0, fp32_set=0, fp32_slot=0, fused_diff=0,
                  grouped_diff=0, logps=0)
    spread = []
    for number, length in enumerate(SEQUENCE_LENGTHS):
        tokens = torch.randint(0, 256, (length,), generator=sequences)
        stem = os.path.join(ref_dir, f"{name}.seq{number}")
        logp, routes = run_sequence(reference, tokens)
        logp_fused, routes_fused = run_sequence(copy, tokens)
        logp_grouped, _ = run_sequence(default, tokens)
        logp_fp32, routes_fp32 = run_sequence(wide, tokens)
        ids = torch.stack([r[2] for r in routes], dim=1)                # [T, L, k]
        weights = torch.stack([r[1] for r in routes], dim=1)            # [T, L, k] bf16
        router_logits = torch.stack([r[0] for r in routes], dim=1)      # [T, L, E] bf16
        ids_fp32 = torch.stack([r[2] for r in routes_fp32], dim=1)
        if not same_bits(logp, logp_fused) or any(
                not same_bits(a[2], b[2]) for a, b in zip(routes, routes_fused)):
            totals["fused_diff"] += 1
        write(stem + ".tokens.i32", tokens, torch.int32)
        write(stem + ".hf_eager.logp.f32", logp, torch.float32)
        write(stem + ".fp32.logp.f32", logp_fp32, torch.float32)
        write(stem + ".hf_grouped_mm.logp.f32", logp_grouped, torch.float32)
        write(stem + ".routing.i16", ids, torch.int16)
        write(stem + ".routing_weights.f32", weights, torch.float32)
        write(stem + ".router_logits.f32", router_logits, torch.float32)
        write(stem + ".fp32.routing.i16", ids_fp32, torch.int16)
        for layer, (route_logits, _, chosen) in enumerate(routes):
            use[layer] += torch.bincount(chosen.reshape(-1), minlength=experts)
            boundary, inner = count_ties(route_logits, top_k)
            totals["boundary"] += len(boundary)
            totals["inner"] += inner
            for position in boundary:
                probs = torch.softmax(route_logits[position].float(), -1)
                tied = (probs == probs.sort(descending=True).values[top_k - 1]).nonzero()[:, 0]
                log(lines, f"  tie at the top-{top_k} boundary: seq{number} position {position} "
                           f"layer {sparse[layer]}: experts {tied.tolist()} share p = "
                           f"{probs[tied[0]].item():.9g}; torch chose {chosen[position].tolist()}")
            spread.append(route_logits.float().std(-1))
        totals["decisions"] += ids.shape[0] * ids.shape[1]
        totals["fp32_set"] += int((ids.sort(-1).values != ids_fp32.sort(-1).values).any(-1).sum())
        totals["fp32_slot"] += int((ids != ids_fp32).any(-1).sum())
        totals["grouped_diff"] += int((logp_grouped != logp).sum())
        totals["logps"] += logp.numel()
        log(lines, f"  seq{number} (length {length}): mean |hf_eager - fp32| logp "
                   f"{(logp - logp_fp32).abs().mean().item():.6f} (max "
                   f"{(logp - logp_fp32).abs().max().item():.6f}); mean logp "
                   f"{logp.mean().item():.4f}")
    log(lines, f"  router logit spread over experts (std per position): mean "
               f"{torch.cat(spread).mean().item():.3f}")
    for layer, counts in enumerate(use):
        log(lines, f"  layer {sparse[layer]}: times each expert 0..{experts - 1} was chosen "
                   f"over all {sum(SEQUENCE_LENGTHS)} positions: {counts.tolist()}")
    log(lines, f"  ties over {totals['decisions']} (position, sparse layer) decisions: "
               f"{totals['boundary']} at the k-th/k+1-th place, {totals['inner']} inside the top "
               f"{top_k} (slot order only)")
    log(lines, f"  fp32 forward chose another expert set in {totals['fp32_set']} decisions "
               f"(another slot order in {totals['fp32_slot']})")
    log(lines, f"  fused-layout checkpoint: {totals['fused_diff']} of {len(SEQUENCE_LENGTHS)} "
               f"sequences differ from the per-expert one in logp or routing bits")
    log(lines, f"  default experts backend vs eager: {totals['grouped_diff']} of {totals['logps']} "
               f"log-probs differ in bits")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.dirname(here))
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    lines = []
    log(lines, f"torch {torch.__version__}, transformers {transformers.__version__}, "
               f"CPU capability {torch.backends.cpu.get_cpu_capability()}, 1 thread")
    for name in MODELS:
        make(name, args.out, lines)
    log(lines, "== files")
    for root, _dirs, files in sorted(os.walk(args.out)):
        if os.path.basename(root) in ("tools", "__pycache__"):
            continue
        for file in sorted(files):
            if file in ("README.md", "summary.txt"):
                continue
            path = os.path.join(root, file)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            log(lines, f"  {os.path.relpath(path, args.out)} {os.path.getsize(path)} {digest}")
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
