"""parity.serve against the binding in-process: concurrent requests equal Model.generate() of
the same prompts and parameters bit for bit, /parity/score reproduces served log-probs, a
weight update during load, stop strings, and bad input while other requests are served; on a
mixture-of-experts model, return_routed_experts gives the sampler's routing record, which
Model.score replays to the served log-probs.

Run as `python3 test/serve/test_serve.py BUILD_DIR` (meson: serve-binding)."""
import http.client
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import harness  # noqa: E402

harness.setup()
import parity  # noqa: E402
from parity import serve  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_curl import MODEL, Server  # noqa: E402  (the server subprocess, shared)
PROMPTS = ["def main(", "import os\n", "The quick brown fox", "for i in range(",
           "# Copyright", "int main(void) {"]


def bits(values):
    return [struct.pack("<f", v) for v in values]


class Served(Server):
    """test_curl's server subprocess, with JSON requests."""

    def close(self):
        self.stop()

    def request(self, method, path, body=None, headers=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=headers or {})
            r = conn.getresponse()
            raw = r.read()
            return r.status, raw
        finally:
            conn.close()

    def post(self, path, body, **kw):
        status, raw = self.request("POST", path, body, **kw)
        return status, json.loads(raw)

    def complete(self, **params):
        params.setdefault("model", MODEL)
        if not params.get("stream"):
            return self.post("/v1/completions", params)
        status, raw = self.request("POST", "/v1/completions", params)
        if status != 200:
            return status, json.loads(raw)
        return status, merge_stream(raw)


def merge_stream(raw):
    """A streamed completion put together as the non-streamed response's choices."""
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]", events[-1]
    choices, version = {}, None
    for e in events[:-1]:
        assert e.startswith("data: "), e
        chunk = json.loads(e[6:])
        version = chunk["weight_version"]
        for ch in chunk["choices"]:
            c = choices.setdefault(ch["index"], {"index": ch["index"], "text": "",
                                                 "token_ids": [], "token_logprobs": [],
                                                 "finish_reason": None})
            c["text"] += ch["text"]
            c["token_ids"] += ch.get("token_ids", [])
            if ch["logprobs"]:
                c["token_logprobs"] += ch["logprobs"]["token_logprobs"]
            if ch["finish_reason"]:
                c["finish_reason"] = ch["finish_reason"]
    return {"weight_version": version, "choices": [
        {"index": c["index"], "text": c["text"], "token_ids": c["token_ids"],
         "logprobs": {"token_logprobs": c["token_logprobs"]}, "finish_reason": c["finish_reason"]}
        for _, c in sorted(choices.items())]}


def request_params(i):
    """A varied, fixed request: prompt, n, sampling, mode."""
    modes = ("raw", "processed", "processed-truncated")
    prompt = PROMPTS[i % len(PROMPTS)]
    if i % 5 == 0:  # two prompts in one request: completion i of each has stream i
        prompt = [prompt, PROMPTS[(i + 1) % len(PROMPTS)]]
    return {"prompt": prompt, "n": 1 + i % 3, "max_tokens": 8 + (i * 7) % 17,
            "seed": 1000 + i, "temperature": (0.0, 0.7, 1.0, 1.3)[i % 4],
            "top_k": (-1, 20, 0, 5)[i % 4], "top_p": (1.0, 0.9, 0.8, 1.0)[i % 4],
            "logprob_mode": modes[i % 3], "logprobs": i % 3, "return_token_ids": True,
            "stream": i % 4 == 1}


def reference(model, p):
    """Model.generate() of the same request: [(tokens, logprobs)] per choice."""
    prompts = p["prompt"]
    prompts = [x.encode() for x in prompts] if isinstance(prompts, list) else prompts.encode()
    out = model.generate(prompts, n=p["n"], max_tokens=p["max_tokens"],
                         seed=p["seed"], temperature=p["temperature"],
                         top_k=None if p["top_k"] <= 0 else p["top_k"],
                         top_p=None if p["top_p"] == 1.0 else p["top_p"], mode=p["logprob_mode"])
    return [(c.tokens, c.logprobs) for c in out]


class TestServe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Served("--max-batch", "16", "--client-timeout", "3", "--max-body-bytes",
                         "65536")
        cls.model = parity.Model(MODEL, threads=2)

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        cls.model.close()

    def check_equal(self, resp, ref, what):
        self.assertEqual(len(resp["choices"]), len(ref), what)
        for ch, (tokens, lps) in zip(resp["choices"], ref):
            self.assertEqual(ch["token_ids"], tokens, what)
            self.assertEqual(bits(ch["logprobs"]["token_logprobs"]), bits(lps), what)
            self.assertEqual(ch["text"], bytes(tokens).decode("utf-8", "replace"), what)

    def run_clients(self, count, make, clients=8):
        results, errors = [None] * count, []

        def client(k):
            for i in range(k, count, clients):
                try:
                    results[i] = make(i)
                except Exception as e:  # reported below
                    errors.append("%d: %r" % (i, e))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        return results

    def test_concurrent_equals_generate(self):
        count = 24
        results = self.run_clients(count, lambda i: self.srv.complete(**request_params(i)))
        for i, (status, resp) in enumerate(results):
            self.assertEqual(status, 200, resp)
            self.check_equal(resp, reference(self.model, request_params(i)), "request %d" % i)
            self.assertEqual(resp["weight_version"], self.model.version)

    def test_score_reproduces(self):
        for i in range(6):
            p = request_params(i)
            p["stream"] = False
            status, resp = self.srv.complete(**p)
            self.assertEqual(status, 200, resp)
            prompts = p["prompt"] if isinstance(p["prompt"], list) else [p["prompt"]]
            for ch in resp["choices"]:
                prompt = list(prompts[ch["index"] // p["n"]].encode())
                status, sc = self.srv.post("/parity/score", {
                    "sequences": [prompt + ch["token_ids"]], "mode": p["logprob_mode"],
                    "temperature": p["temperature"], "top_k": p["top_k"], "top_p": p["top_p"]})
                self.assertEqual(status, 200, sc)
                n = len(ch["token_ids"])
                self.assertEqual(bits(sc["logprobs"][0][-n:]),
                                 bits(ch["logprobs"]["token_logprobs"]), "request %d" % i)

    def test_stop_strings(self):
        p = {"prompt": "import os\n", "max_tokens": 40, "seed": 5, "temperature": 0.8,
             "return_token_ids": True}
        status, full = self.srv.complete(**p)
        self.assertEqual(status, 200, full)
        text = full["choices"][0]["text"]
        stop = text[10:12]
        self.assertEqual(len(stop), 2)
        for stream in (False, True):
            status, resp = self.srv.complete(stop=[stop, "\x00never"], stream=stream, **p)
            self.assertEqual(status, 200, resp)
            ch = resp["choices"][0]
            cut = text.index(stop)
            self.assertEqual(ch["text"], text[:cut])
            self.assertEqual(ch["finish_reason"], "stop")
            self.assertEqual(ch["token_ids"], full["choices"][0]["token_ids"][:cut + 2])

    def test_bad_input_while_serving(self):
        good = dict(request_params(2), stream=False)
        done = {}

        def background():
            done["r"] = self.srv.complete(**good)

        t = threading.Thread(target=background)
        t.start()
        cases = [
            ("malformed JSON", b"{\"model\": ", 400),
            ("not an object", b"[1, 2]", 400),
            ("unknown field", {"model": MODEL, "prompt": "x", "bogus": 1}, 400),
            ("negative temperature", {"model": MODEL, "prompt": "x", "temperature": -1}, 400),
            ("huge n", {"model": MODEL, "prompt": "x", "n": 10 ** 6}, 400),
            ("huge max_tokens", {"model": MODEL, "prompt": "x", "max_tokens": 10 ** 9}, 400),
            ("token out of range", {"model": MODEL, "prompt": [1, 256]}, 400),
            ("wrong model", {"model": "other", "prompt": "x"}, 404),
            ("routed experts without the server's record",
             {"model": MODEL, "prompt": "x", "return_routed_experts": True}, 400),
            ("prompt beyond the context", {"model": MODEL, "prompt": "x" * 5000}, 413),
            ("body over the limit", {"model": MODEL, "prompt": "x" * 70000}, 413),
        ]
        for what, body, want in cases:
            status, raw = self.srv.request("POST", "/v1/completions", body)
            err = json.loads(raw)
            self.assertEqual(status, want, "%s: %s" % (what, raw[:200]))
            self.assertIsInstance(err["error"]["message"], str, what)
            self.assertIn("type", err["error"], what)
        # a client that never finishes its body gets 408; everyone else is served meanwhile
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 1000\r\n\r\n{\"model\"")
        status, _ = self.srv.request("GET", "/health")
        self.assertEqual(status, 200)
        s.settimeout(30)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        s.close()
        self.assertTrue(reply.startswith(b"HTTP/1.1 408"), reply[:100])
        t.join()
        status, resp = done["r"]
        self.assertEqual(status, 200, resp)
        self.check_equal(resp, reference(self.model, good), "request beside bad ones")

    def test_http_edges(self):
        """A kept-alive connection survives an error whose body was not read; HEAD has no
        body; JSON a strict parser reads; odd values are 400s, not 500s."""
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=60)
        try:
            conn.request("POST", "/v1/embeddings", body=b'{"model": "x"}')
            r = conn.getresponse()
            r.read()
            self.assertEqual(r.status, 404)
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"model": MODEL, "prompt": "x", "max_tokens": 2}).encode())
            r = conn.getresponse()
            self.assertEqual(r.status, 200, r.read())
            r.read()
            conn.request("HEAD", "/health")
            r = conn.getresponse()
            self.assertEqual((r.status, r.read()), (200, b""))
        finally:
            conn.close()
        # -inf log-probs (outside a truncated support) are null: JSON has no infinity
        status, raw = self.srv.request("POST", "/parity/score", {
            "sequences": [list(b"hello world")], "mode": "processed-truncated", "top_k": 1})
        self.assertEqual(status, 200, raw)
        self.assertNotIn(b"Infinity", raw)
        self.assertIn(None, json.loads(raw)["logprobs"][0])
        for what, body in [("a lone surrogate", b'{"model": "%s", "prompt": "\\ud800"}'
                            % MODEL.encode()),
                           ("a huge number", b'{"model": "%s", "prompt": "x", "temperature": 1%s}'
                            % (MODEL.encode(), b"0" * 400)),
                           ("deep nesting", b"[" * 30000 + b"]" * 30000)]:
            status, raw = self.srv.request("POST", "/v1/completions", body)
            self.assertEqual(status, 400, "%s: %s" % (what, raw[:200]))
        # vLLM's extra parameters at their neutral values, and the two that do something
        status, resp = self.srv.complete(prompt="import os\n", max_tokens=30, seed=5,
                                         stop=["os"], include_stop_str_in_output=True,
                                         return_tokens_as_token_ids=True, logprobs=1,
                                         skip_special_tokens=True, ignore_eos=False,
                                         min_tokens=0, repetition_penalty=1.0,
                                         return_token_ids=True)
        self.assertEqual(status, 200, resp)
        ch = resp["choices"][0]
        self.assertTrue(all(t.startswith("token_id:") for t in ch["logprobs"]["tokens"]))
        if ch["finish_reason"] == "stop":
            self.assertTrue(ch["text"].endswith("os"), ch["text"])

    def test_client_gone(self):
        """A client that closes its connection cancels its request: its sequences are
        released, not run to max_tokens."""
        def info():
            return json.loads(self.srv.request("GET", "/parity/info")[1])
        steps_before = info()["decode_steps"]  # no other request runs in this test
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        # the most a 1-token prompt can draw in the model's 4096 positions
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 4095,
                           "temperature": 1.0}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        deadline = time.monotonic() + 10
        while info()["requests_running"] == 0:
            self.assertLess(time.monotonic(), deadline, "the request never started")
            time.sleep(0.02)
        s.close()
        deadline = time.monotonic() + 10
        while info()["requests_running"]:
            self.assertLess(time.monotonic(), deadline, "the request ran on without its client")
            time.sleep(0.05)
        # It ended because it was cancelled, not because it drew all its tokens (which takes
        # about 4 s here; the server looks for a gone client every second).
        self.assertLess(info()["decode_steps"] - steps_before, 4000,
                        "the request drew its max_tokens: it was not cancelled")

    def test_update_during_load(self):
        """Weights pushed while requests run: none fails, each says its weight version and
        equals Model.generate on those weights."""
        with open(os.path.join(MODEL, "model.safetensors"), "rb") as f:
            tensors = serve.read_safetensors(f.read(), "model")
        name = "model.layers.2.mlp.down_proj.weight"
        dtype, shape, mv = tensors[name]
        data = bytearray(mv)
        for i in range(0, len(data), 2):
            data[i] ^= 1        # the lowest mantissa bit of every bf16 value
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "update.safetensors")
            header = json.dumps({name: {"dtype": dtype, "shape": list(shape),
                                        "data_offsets": [0, len(data)]}}).encode()
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(header)) + header + bytes(data))
            before = self.model.version
            count = 16
            update = {}

            def make(i):
                if i == count // 2:
                    update["r"] = self.srv.post("/parity/update_weights", {"path": path})
                return self.srv.complete(**request_params(100 + i))

            results = self.run_clients(count, make)
            status, upd = update["r"]
            self.assertEqual(status, 200, upd)
            self.assertEqual(upd["weight_version"], before + 1)
            old = [reference(self.model, request_params(100 + i)) for i in range(count)]
            self.model.update({name: (dtype, shape, bytes(data))})
            new = [reference(self.model, request_params(100 + i)) for i in range(count)]
        versions = set()
        for i, (status, resp) in enumerate(results):
            self.assertEqual(status, 200, resp)
            v = resp["weight_version"]
            versions.add(v)
            self.assertIn(v, (before, before + 1))
            self.check_equal(resp, old[i] if v == before else new[i], "request %d (w%d)" % (i, v))
        self.assertEqual(versions, {before, before + 1})
        status, info = self.srv.request("GET", "/parity/info")
        self.assertEqual(json.loads(info)["weight_version"], before + 1)
        # a manifest that does not match: 409, nothing changed
        with tempfile.TemporaryDirectory() as d:
            manifest = os.path.join(d, "m.json")
            self.model.write_manifest(manifest)        # version before + 1: a stale one
            path = os.path.join(d, "u.safetensors")
            header = json.dumps({name: {"dtype": dtype, "shape": list(shape),
                                        "data_offsets": [0, len(data)]}}).encode()
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(header)) + header + bytes(mv))
            status, resp = self.srv.post("/parity/update_weights",
                                         {"path": path, "manifest": manifest})
            self.assertEqual(status, 409, resp)
            self.assertTrue(any(name in d for d in resp["error"]["differences"]), resp)
            status, info = self.srv.request("GET", "/parity/info")
            self.assertEqual(json.loads(info)["weight_version"], before + 1)
            # the matching manifest: the original values back, verified
            self.model.update({name: (dtype, shape, bytes(mv))})
            self.model.write_manifest(manifest)
            status, resp = self.srv.post("/parity/update_weights",
                                         {"path": path, "manifest": manifest})
            self.assertEqual(status, 200, resp)
            self.assertTrue(resp["verified"])
            self.assertEqual(resp["weight_version"], before + 2)
        status, resp = self.srv.complete(**dict(request_params(3), stream=False))
        self.check_equal(resp, reference(self.model, request_params(3)), "after the updates")


MOE_MODEL = "synthetic:qwen3-moe-tiny"


class TestRoutedExperts(unittest.TestCase):
    """--enable-return-routed-experts on an MoE model: each choice's routed_experts (streamed
    in its last chunk) is what Model.score routes for prompt + completion (len - 1 positions x
    sparse layers x k), and scoring with it replays the served log-probs bit for bit."""

    def test_routed_experts(self):
        srv = Served("--enable-return-routed-experts", "--policy", "vllm", model=MOE_MODEL)
        model = parity.Model(MOE_MODEL, threads=2)
        try:
            for stream in (False, True):
                params = {"model": MOE_MODEL, "prompt": [[5, 9, 200, 31], [77, 3]], "n": 2,
                          "max_tokens": 7, "seed": 4, "return_token_ids": True, "logprobs": 0,
                          "return_routed_experts": True, "stream": stream}
                status, raw = srv.request("POST", "/v1/completions", params)
                self.assertEqual(status, 200, raw)
                if stream:
                    events = [json.loads(e[6:]) for e in raw.decode().split("\n\n")
                              if e.startswith("data: {")]
                    routed = {ch["index"]: ch["routed_experts"] for e in events
                              for ch in e["choices"] if "routed_experts" in ch}
                    resp = merge_stream(raw)
                else:
                    resp = json.loads(raw)
                    routed = {ch["index"]: ch["routed_experts"] for ch in resp["choices"]}
                self.assertEqual(sorted(routed), [0, 1, 2, 3])
                for ch in resp["choices"]:
                    seq = params["prompt"][ch["index"] // 2] + ch["token_ids"]
                    lps, ran = model.score(seq, policy="vllm", return_routes=True)
                    self.assertEqual(routed[ch["index"]], ran.tolist())
                    replayed = model.score(seq, policy="vllm", routes=routed[ch["index"]])
                    served = ch["logprobs"]["token_logprobs"]
                    self.assertEqual(bits(replayed[-len(served):]), bits(served))
        finally:
            srv.close()
            model.close()


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
