"""The conformance tier's models: small random-init causal LMs made with transformers' own
classes (Qwen2, Qwen3, Llama, Qwen3-MoE, Qwen2-MoE), seeded, with an init whose every rounding
point matters, saved with save_pretrained; and the hidden-permuted twin of a model, which
measures the GEMMs' summation-order floor.

transformers' own init (normal(0, 0.02) weights, RMSNorm weights of exactly 1, zero biases) is
degenerate for this purpose: a norm weight of 1 makes "round, then multiply by the weight" equal
to one rounding, and 0.02-scale weights leave the logits almost uniform. So every matrix is
drawn with standard deviation 1/sqrt(fan-in) (activations of order 1), the norm weights
uniformly in [0.5, 1.5), q/k/v biases (qwen2, qwen2_moe) with std 0.05, the embedding with std 1,
and lm_head with std 2/sqrt(hidden) (logits spread over a few units).

Run by conformance.py with the tier's virtual environment.
"""
import math

import torch
import transformers

SEED = 20261207
#: The shape every model shares (a head_dim of 16; 2 layers; 256 tokens).
COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
              rms_norm_eps=1e-6, tie_word_embeddings=False)
_MOE = dict(num_experts=8, moe_intermediate_size=32, decoder_sparse_step=1)
#: model_type: (config class, model class, the fields beyond the shape).
ARCHITECTURES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=16)),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(_MOE, head_dim=16, num_experts_per_tok=2, norm_topk_prob=True,
                       mlp_only_layers=[1])),
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  dict(_MOE, num_experts_per_tok=4, norm_topk_prob=False,
                       shared_expert_intermediate_size=48, mlp_only_layers=[], qkv_bias=True)),
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _init(model, generator):
    """Draws every parameter as the module docstring says (in fp32, in place)."""
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if p.dim() == 1 and "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=generator))
            elif name.endswith(".bias"):
                p.copy_(0.05 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            elif name.startswith("lm_head"):
                p.copy_(noise * 2.0 / math.sqrt(hidden))
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))


def build(model_type, dtype, directory):
    """Builds the model_type's model of the COMMON shape (seeded), casts it to dtype ("bf16" or
    "f16") and saves it with save_pretrained into directory. Returns directory."""
    config_class, model_class, fields = ARCHITECTURES[model_type]
    transformers.set_seed(SEED)
    config = config_class(**dict(COMMON, **fields))
    model = model_class(config).eval()
    generator = torch.Generator().manual_seed(SEED + sorted(ARCHITECTURES).index(model_type))
    _init(model, generator)
    model.to(DTYPES[dtype]).save_pretrained(directory)
    return directory


def load(model_type, directory, dtype, attn_implementation):
    """The saved model, loaded by transformers with that attn_implementation; a mixture of
    experts with experts_implementation "eager" (the loop over the experts that hf-eager's and
    hf-sdpa's moe_combine follow: each expert's weighted output added into the model-dtype
    output in ascending expert index). transformers 5 defaults to "grouped_mm", whose
    weighted outputs are summed in fp32 and rounded once: the same bits for k <= 2 experts per
    token, not for more (facts.py prints it)."""
    model_class = ARCHITECTURES[model_type][1]
    extra = {"experts_implementation": "eager"} if model_type.endswith("_moe") else {}
    return model_class.from_pretrained(directory, dtype=DTYPES[dtype],
                                       attn_implementation=attn_implementation, **extra).eval()


def tokens(count, vocab_size, seed=SEED):
    """count token ids drawn uniformly (seeded)."""
    return torch.randint(0, vocab_size, (count,), generator=torch.Generator().manual_seed(seed))


# Parameters whose LAST dimension runs over the hidden units (inputs of a GEMM over the hidden
# size, the embedding's rows) and those whose SECOND-TO-LAST does (outputs onto the residual).
_HIDDEN_IN = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight",
              "up_proj.weight", "mlp.gate.weight", "shared_expert_gate.weight", "lm_head.weight",
              "embed_tokens.weight", "experts.gate_up_proj")
_HIDDEN_OUT = ("o_proj.weight", "down_proj.weight", "experts.down_proj")
_HIDDEN_VECTOR = ("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight")
# Parameters over the heads' side, whatever their size (q_proj's output may be as wide as hidden).
_HEAD_SIDE = ("q_norm.weight", "k_norm.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias")


def permuted_twin(model, seed=SEED):
    """A copy of model with its hidden units (the residual stream's coordinates) permuted: the
    same function exactly, but every GEMM over the hidden size and every norm's sum of squares
    adds in another order. The difference between the two models' log-probs is what summation
    order alone moves them by: the floor a different GEMM cannot go below."""
    import copy
    hidden = model.config.hidden_size
    order = torch.randperm(hidden, generator=torch.Generator().manual_seed(seed))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if name.endswith(_HIDDEN_IN):
                p.copy_(p.index_select(p.dim() - 1, order))
            elif name.endswith(_HIDDEN_OUT):
                p.copy_(p.index_select(p.dim() - 2, order))
            elif name.endswith(_HIDDEN_VECTOR):
                p.copy_(p[order])
            elif p.shape[-1] == hidden and not name.endswith(_HEAD_SIDE):
                raise ValueError("permuted_twin: %s %s: which of its axes is hidden?"
                                 % (name, tuple(p.shape)))
    return twin
