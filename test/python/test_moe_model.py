"""The trained mixture of experts shipped in models/qwen3-moe-bytes-8.4m (scripts/train_moe.py):
it loads as a qwen3_moe of 6 sparse layers, top-2 of 8 experts; every tensor but the routers and
the experts is bitwise the dense model's it was upcycled from (only those trained); libparity
serving it under hf-eager gives the mean NLL its README quotes on the four evaluation
sequences; and its routers are trained, not collapsed: every expert of every layer takes a
share of the choices there. Plain python3 (no numpy).

    python3 test/python/test_moe_model.py BUILD_DIR
"""
import json
import os
import struct

import harness

harness.setup()

import unittest  # noqa: E402

import parity  # noqa: E402

MODEL = os.path.join(harness.REPO, "models", "qwen3-moe-bytes-8.4m")
DENSE = os.path.join(harness.REPO, "models", "qwen3-bytes-pystdlib-4.9m")
#: The mean NLL hf-eager gives (scripts/check_moe_model.py prints it rounded, the model's README
#: quotes it): the same bits on every CPU path (portable, avx2, avx512, avx512bf16 checked).
NLL_HF_EAGER = 1.12564020
#: The least share of a layer's top-2 choices any expert takes on the evaluation sequences
#: (12.5% when balanced; the README's routing table has the shares).
MIN_SHARE = 0.02


def tensors(path):
    """name -> (dtype, shape, raw bytes) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return {name: (e["dtype"], e["shape"], blob[8 + n + e["data_offsets"][0]:
                                              8 + n + e["data_offsets"][1]])
            for name, e in header.items()}


def evaluation_sequences():
    return [open(os.path.join(harness.REPO, "test", "data", "reference", "eval_%02d.bin" % k),
                 "rb").read() for k in range(4)]


class TrainedMoe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = parity.Model(MODEL)

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def test_shape(self):
        c = self.model.config
        self.assertEqual(c["arch"], "qwen3_moe")
        self.assertEqual((c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]),
                         (8, 2, 192))
        self.assertEqual(self.model.route_stride, 6 * 2)

    def test_untrained_tensors_are_the_dense_models(self):
        moe = tensors(os.path.join(MODEL, "model.safetensors"))
        dense = tensors(os.path.join(DENSE, "model.safetensors"))
        shared = [n for n in dense if ".mlp." not in n]
        self.assertEqual(len(shared), 51)
        for name in shared:
            self.assertEqual(moe[name], dense[name], name)
        routed = [n for n in moe if ".mlp." in n]
        self.assertEqual(len(routed), 6 * (1 + 8 * 3))
        self.assertTrue(all(moe[n][0] == "BF16" for n in routed))

    def test_nll_and_routing(self):
        logprobs, routes = self.model.score(evaluation_sequences(), policy="hf-eager",
                                            return_routes=True)
        flat = [x for seq in logprobs for x in seq]
        self.assertEqual(len(flat), 4 * 511)
        self.assertAlmostEqual(-sum(flat) / len(flat), NLL_HF_EAGER, delta=1e-7)
        counts = [[0] * 8 for _ in range(6)]
        for record in routes:  # parity.Routes: (positions, sparse layers, k) of the scored ones
            self.assertEqual(record.shape, (511, 6, 2))
            seq = record.data
            for at in range(0, len(seq), 2):
                layer = (at // 2) % 6
                self.assertNotEqual(seq[at], seq[at + 1])
                counts[layer][seq[at]] += 1
                counts[layer][seq[at + 1]] += 1
        for layer, row in enumerate(counts):
            share = min(row) / sum(row)
            self.assertGreaterEqual(share, MIN_SHARE, "layer %d: choices %s" % (layer, row))


if __name__ == "__main__":
    harness.run("test_moe_model")
