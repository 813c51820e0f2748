"""The cost of parity.hf.patch: a random-init transformers Qwen3 (4 layers, 1024 wide, 16 heads
of 128, bf16, eager attention) forward over 512 tokens, unpatched and patched under hf-eager,
vllm and aligned; CPU seconds on one thread, the best of 3 runs after a warm-up (CPU time, so
that other processes on the machine move it less).

    PYTHON bench/hf_patch_speed.py      (PYTHON: a Python with torch 2.x and transformers)
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import torch  # noqa: E402
import transformers  # noqa: E402

import parity.hf  # noqa: E402

RUNS = 3


def cpu_seconds(model, tokens):
    best = float("inf")
    with torch.no_grad():
        model(tokens)
        for _ in range(RUNS):
            t0 = time.process_time()
            model(tokens)
            best = min(best, time.process_time() - t0)
    return best


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = transformers.Qwen3Config(vocab_size=4096, hidden_size=1024, intermediate_size=3072,
                                      num_hidden_layers=4, num_attention_heads=16,
                                      num_key_value_heads=8, head_dim=128,
                                      tie_word_embeddings=False, attn_implementation="eager")
    model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    tokens = torch.randint(0, config.vocab_size, (1, 512))
    print("unpatched         %.2f s CPU" % cpu_seconds(model, tokens))
    for preset in ("hf-eager", "vllm", "aligned"):
        parity.hf.patch(model, preset)
        print("patched %-9s %.2f s CPU" % (preset, cpu_seconds(model, tokens)))
        parity.hf.unpatch(model)


if __name__ == "__main__":
    main()
