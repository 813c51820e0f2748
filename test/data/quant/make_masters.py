"""Writes test/data/quant/masters.safetensors: three fp32 master tensors of the trained model
(../shared/models/qwen3-bytes-pystdlib-4.9m/model-fp32.safetensors), copied byte for byte, so
that the quantizer known-answer test (test/python/test_quant.py) runs on a fresh clone. With
../shared beside the repository the test reads every master instead.

    python3 test/data/quant/make_masters.py [SHARED_MODEL_DIR]
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
NAMES = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
         "model.layers.3.mlp.gate_proj.weight"]

src_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(REPO), "shared", "models", "qwen3-bytes-pystdlib-4.9m")
with open(os.path.join(src_dir, "model-fp32.safetensors"), "rb") as f:
    blob = f.read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
data = blob[8 + n:]
out_header, chunks, offset = {}, [], 0
for name in NAMES:
    e = header[name]
    assert e["dtype"] == "F32", name
    b, end = e["data_offsets"]
    chunk = data[b:end]
    out_header[name] = {"dtype": "F32", "shape": e["shape"], "data_offsets": [offset, offset + len(chunk)]}
    chunks.append(chunk)
    offset += len(chunk)
h = json.dumps(out_header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(HERE, "masters.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))
print("wrote", os.path.join(HERE, "masters.safetensors"), offset, "bytes of data")
