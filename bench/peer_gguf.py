#!/usr/bin/env python3
"""Write a BF16 GGUF of a built-in config's shape, for llama.cpp's llama-bench as a speed peer.

    python3 bench/peer_gguf.py OUT.gguf [--config qwen3-0.6b]

parity-speed compares libparity with llama.cpp when LLAMA_BENCH names a llama-bench binary and
LLAMA_GGUF a BF16 GGUF of the model's shape; this script writes that file. Its weights are
small random bf16 values (a speed peer needs the shape, not the trained values), so the file
is not a model of anything: its tokenizer is "none" with the config's vocab size, which
llama-bench accepts (it feeds random token ids).

The architecture written is llama.cpp's "llama" (RMSNorm, rotary attention with GQA, SwiGLU
MLP, tied embeddings when the config ties them), with the config's head_dim given as the
attention key and value lengths: the GEMM, attention and head shapes of a Qwen3 model. What it
leaves out is Qwen3's per-head q/k RMSNorm (two norms of head_dim per head per token, a
fraction of a percent of a layer's work), since the llama.cpp versions this was written
against do not all know the qwen3 architecture.

llama.cpp's nearest types beside libparity's quantized formats (parity-speed --formats) are
this file quantized by llama.cpp's own tool, one GGUF per type, every layer matrix in the type
and the tied embedding and head kept bf16 as libparity keeps its head:

    for t in Q8_0 Q4_0 MXFP4_MOE TQ2_0; do
        llama-quantize --pure --token-embedding-type bf16 --output-tensor-type bf16 \
            OUT.gguf OUT-$t.gguf $t
    done
    LLAMA_BENCH=llama-bench build/bench/parity-speed --formats \
        --ggufs OUT.gguf,OUT-Q8_0.gguf,OUT-Q4_0.gguf,OUT-MXFP4_MOE.gguf,OUT-TQ2_0.gguf

(--pure matters for MXFP4_MOE: without it llama-quantize gives MXFP4 only to MoE experts and
Q8_0 to a dense model's matrices. TQ2_0 needs rows of a multiple of 256 values, which
qwen3-0.6b's are.) parity-speed reads each file's type from llama-bench's model_type and
compares Q8_0 with FP8 and MXFP8, Q4_0 and MXFP4 with NVFP4 and MXFP4, TQ2_0 with ternary.

The file format is GGUF version 3 as llama.cpp's gguf documentation defines it: the header,
the metadata key/values, the tensor infos (dimensions innermost first), then the tensor data,
each tensor aligned to general.alignment (32). Plain python3, no package.
"""
import argparse
import random
import struct
import sys

# built-in shapes (as lib/model/config.c's; the peer needs only these fields)
CONFIGS = {
    "qwen3-0.6b": dict(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128,
                       intermediate=3072, vocab=151936, rope_theta=1e6, eps=1e-6,
                       tied=True, context=40960),
}

GGUF_TYPE_UINT32, GGUF_TYPE_FLOAT32, GGUF_TYPE_STRING = 4, 6, 8
GGML_TYPE_F32, GGML_TYPE_BF16 = 0, 30
ALIGN = 32


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == GGUF_TYPE_UINT32:
        out += struct.pack("<I", value)
    elif vtype == GGUF_TYPE_FLOAT32:
        out += struct.pack("<f", value)
    elif vtype == GGUF_TYPE_STRING:
        out += gguf_string(value)
    else:
        raise ValueError(vtype)
    return out


def tensors_of(c):
    """(name, dims innermost first, ggml type) in llama.cpp's llama naming."""
    h, hd, ff = c["hidden"], c["head_dim"], c["intermediate"]
    q, kvw = c["heads"] * hd, c["kv_heads"] * hd
    t = [("token_embd.weight", (h, c["vocab"]), GGML_TYPE_BF16),
         ("output_norm.weight", (h,), GGML_TYPE_F32)]
    if not c["tied"]:
        t.append(("output.weight", (h, c["vocab"]), GGML_TYPE_BF16))
    for i in range(c["layers"]):
        b = "blk.%d." % i
        t += [(b + "attn_norm.weight", (h,), GGML_TYPE_F32),
              (b + "attn_q.weight", (h, q), GGML_TYPE_BF16),
              (b + "attn_k.weight", (h, kvw), GGML_TYPE_BF16),
              (b + "attn_v.weight", (h, kvw), GGML_TYPE_BF16),
              (b + "attn_output.weight", (q, h), GGML_TYPE_BF16),
              (b + "ffn_norm.weight", (h,), GGML_TYPE_F32),
              (b + "ffn_gate.weight", (h, ff), GGML_TYPE_BF16),
              (b + "ffn_up.weight", (h, ff), GGML_TYPE_BF16),
              (b + "ffn_down.weight", (ff, h), GGML_TYPE_BF16)]
    return t


def nbytes(dims, gtype):
    n = 1
    for d in dims:
        n *= d
    return n * (2 if gtype == GGML_TYPE_BF16 else 4)


#: The shape's metadata (llama.KEY, its GGUF type, the CONFIGS field), in the file's order.
LLAMA_SHAPE_KEYS = (
    ("block_count", GGUF_TYPE_UINT32, "layers"),
    ("context_length", GGUF_TYPE_UINT32, "context"),
    ("embedding_length", GGUF_TYPE_UINT32, "hidden"),
    ("feed_forward_length", GGUF_TYPE_UINT32, "intermediate"),
    ("attention.head_count", GGUF_TYPE_UINT32, "heads"),
    ("attention.head_count_kv", GGUF_TYPE_UINT32, "kv_heads"),
    ("attention.key_length", GGUF_TYPE_UINT32, "head_dim"),
    ("attention.value_length", GGUF_TYPE_UINT32, "head_dim"),
    ("rope.dimension_count", GGUF_TYPE_UINT32, "head_dim"),
    ("rope.freq_base", GGUF_TYPE_FLOAT32, "rope_theta"),
    ("attention.layer_norm_rms_epsilon", GGUF_TYPE_FLOAT32, "eps"),
    ("vocab_size", GGUF_TYPE_UINT32, "vocab"),
)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--config", default="qwen3-0.6b", choices=sorted(CONFIGS))
    a = ap.parse_args()
    c = CONFIGS[a.config]

    meta = [kv("general.architecture", GGUF_TYPE_STRING, "llama"),
            kv("general.name", GGUF_TYPE_STRING, "libparity peer shape " + a.config),
            kv("general.alignment", GGUF_TYPE_UINT32, ALIGN),
            # llama.cpp's LLAMA_FTYPE_MOSTLY_BF16, so that llama-bench names the type BF16
            kv("general.file_type", GGUF_TYPE_UINT32, 32)]
    meta += [kv("llama." + key, kind, c[field]) for key, kind, field in LLAMA_SHAPE_KEYS]
    meta.append(kv("tokenizer.ggml.model", GGUF_TYPE_STRING, "none"))
    tensors = tensors_of(c)

    infos, offset = [], 0
    for name, dims, gtype in tensors:
        infos.append(gguf_string(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) +
                     struct.pack("<IQ", gtype, offset))
        offset += (nbytes(dims, gtype) + ALIGN - 1) // ALIGN * ALIGN

    # 1 MiB of random bf16 values of about N(0, 0.02)'s size, repeated: the shape is the point
    rng = random.Random(0)
    block = bytearray()
    for _ in range(1 << 19):
        bits = struct.unpack("<I", struct.pack("<f", rng.gauss(0.0, 0.02)))[0]
        block += struct.pack("<H", bits >> 16)
    block = bytes(block)
    ones = struct.pack("<f", 1.0)

    with open(a.out, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        for i in infos:
            f.write(i)
        f.write(b"\0" * (-f.tell() % ALIGN))
        for name, dims, gtype in tensors:
            n = nbytes(dims, gtype)
            if gtype == GGML_TYPE_F32:  # norm weights: 1.0, as a fresh RMSNorm
                f.write(ones * (n // 4))
            else:
                full, rest = divmod(n, len(block))
                for _ in range(full):
                    f.write(block)
                f.write(block[:rest])
            f.write(b"\0" * (-n % ALIGN))
    total = sum(nbytes(d, t) for _, d, t in tensors)
    print("peer_gguf: wrote %s (%s, %d tensors, %.2f GB of weights)" %
          (a.out, a.config, len(tensors), total / 1e9), file=sys.stderr)


if __name__ == "__main__":
    main()
