"""Makes test/data/tokenizer-model/: a byte-level BPE tokenizer of 512 tokens trained with
Hugging Face `tokenizers` on this repository's README.md and docs/DESIGN.md (Qwen2's
pre-tokenizer regex, NFC, ByteLevel decoding; special tokens <|endoftext|>, <|im_start|>,
<|im_end|>), its tokenizer_config.json with a Qwen-style chat template, and a synthetic
Qwen3 model of the same vocabulary (parity's "tiny" config with vocab_size 512, weights from
seed 53) saved by libparity. The server's tests (issue 53) use it for text prompts, stop
strings, offsets and chat.

    PYTHONPATH=python PARITY_LIBRARY=build/lib/libparity.so \\
        /work/venv-hf/bin/python test/data/tokenizer-model/make.py [OUT_DIR]

Reproducible: the training text is those files as of commit TRAINING_COMMIT (read with git,
so later edits of them change nothing), BPE training is deterministic and the model comes
from a seed: run twice, it writes the same bytes (test/serve/test_text.py checks the
committed files against a fresh run).
"""
import ctypes
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
# The training text: these files as of TRAINING_COMMIT, so that later edits of the files do
# not change the tokenizer a fresh run makes.
TRAINING = ["README.md", "docs/DESIGN.md"]
TRAINING_COMMIT = "c4e7bd0"
VOCAB = 512
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SEED = 53
# Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation runs,
# newlines, spaces), as its tokenizer.json's Split pre-tokenizer holds it.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# A Qwen-style chat template: an optional system message first (a default one when the
# conversation has none), each message as <|im_start|>ROLE\nCONTENT<|im_end|>\n, and
# <|im_start|>assistant\n when a generation prompt is asked for.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] not in ['user', 'assistant', 'system'] %}"
    "{{- raise_exception('unknown role: ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}")


def training_text():
    texts = []
    for path in TRAINING:
        spec = "%s:%s" % (TRAINING_COMMIT, path)
        texts.append(subprocess.run(["git", "-C", REPO, "show", spec], check=True,
                                    capture_output=True).stdout.decode("utf-8"))
    return texts


def make_tokenizer(out):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        trainers
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    if tok.get_vocab_size() != VOCAB:
        sys.exit("make.py: the tokenizer has %d tokens, not %d" % (tok.get_vocab_size(), VOCAB))
    tok.save(os.path.join(out, "tokenizer.json"))
    added = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False,
                                       "rstrip": False, "single_word": False, "special": True}
             for s in SPECIAL}
    config = {"add_bos_token": False, "add_prefix_space": False,
              "added_tokens_decoder": added, "additional_special_tokens": SPECIAL[1:],
              "bos_token": None, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces":
              False, "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 2048,
              "pad_token": "<|endoftext|>", "split_special_tokens": False,
              "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    return tok


def make_model(out, tok):
    sys.path.insert(0, os.path.join(REPO, "python"))
    from parity import _lib
    cfg = _lib.parity_config()
    _lib.lib.parity_config_builtin(b"tiny", ctypes.byref(cfg))
    cfg.vocab_size = VOCAB
    cfg.max_position_embeddings = 2048
    handle = _lib.model_p()
    _lib.lib.parity_model_synthetic(ctypes.byref(cfg), SEED, ctypes.byref(handle))
    try:
        _lib.lib.parity_model_save(handle, out.encode())
    finally:
        _lib.lib.parity_model_free(handle)
    # generation_config.json as transformers writes it: generation ends at <|im_end|> or
    # <|endoftext|>
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": None, "eos_token_id": [tok.token_to_id("<|im_end|>"),
                                                          tok.token_to_id("<|endoftext|>")]},
                  f, indent=2, sort_keys=True)
        f.write("\n")


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else HERE)
    os.makedirs(out, exist_ok=True)
    tok = make_tokenizer(out)
    make_model(out, tok)
    print("make.py: wrote %s (vocab %d)" % (out, VOCAB))


if __name__ == "__main__":
    main()
