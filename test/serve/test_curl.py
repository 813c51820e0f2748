"""parity.serve driven with the `curl` binary (and a raw socket for a slow client).

    python3 test/serve/test_curl.py BUILD_DIR

Starts `python3 -m parity.serve` on the repo's byte-level model (port 0, --port-file) and checks,
against the API of issue 18: GET /health, /v1/models and /parity/info and their shapes;
POST /v1/completions without and with streaming (`curl -N`: every `data:` line is JSON, the stream
ends with `data: [DONE]`, the texts and log-probs equal the non-streamed ones for the same seed);
the error shape and statuses (malformed JSON 400, unknown field 400, range errors 400, unknown model
404, unknown path 404, wrong method 405, no Content-Length 411, too-long prompt 413); that
/parity/score of a served completion's prompt_token_ids + token_ids reproduces its token_logprobs
bit for bit (as float32). A second server with --max-body-bytes 4096 --client-timeout 2 answers an
oversized body with 413, and a client that stops sending in the middle of its body with 408 within
a few seconds, while other requests are served meanwhile. SIGTERM stops a server with exit 0.
Exit status: 0 passed, 1 failed, 77 skipped (no curl).

The Server class here is shared with test_openai.py.
"""
import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import harness  # noqa: E402

REPO = harness.REPO
MODEL = os.path.join(REPO, "models", "qwen3-bytes-pystdlib-4.9m")
PROMPT = "import os\nimport sys\n\n\ndef main(argv=None):\n"


class Server:
    """`python3 -m parity.serve` in a subprocess on a free port of 127.0.0.1. Its stderr goes to a
    file, shown when it fails to start."""

    def __init__(self, *extra, model=MODEL, timeout=60.0):
        self.tmp = tempfile.mkdtemp(prefix="parity-serve-test-")
        self.port_file = os.path.join(self.tmp, "port")
        self.err_path = os.path.join(self.tmp, "stderr.txt")
        self.model = model
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.join(REPO, "python") + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.args = [sys.executable, "-m", "parity.serve", "--model", model, "--port", "0",
                     "--port-file", self.port_file, "--threads", "2", "--max-batch", "8"]
        self.args += list(extra)
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(self.args, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self.err, stderr=self.err)
        self.returncode = None
        self.output = ""
        deadline = time.monotonic() + timeout
        self.port = None
        try:
            while self.port is None:
                if self.proc.poll() is not None:
                    raise RuntimeError("parity.serve exited with status %d before listening; "
                                       "its output:\n%s" % (self.proc.returncode, self.stderr()))
                if time.monotonic() > deadline:
                    raise RuntimeError("parity.serve did not write its port file within %g s; "
                                       "its output:\n%s" % (timeout, self.stderr()))
                try:
                    with open(self.port_file) as f:
                        text = f.read()
                    if text.endswith("\n"):
                        self.port = int(text)
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        self.base = "http://127.0.0.1:%d" % self.port

    def stderr(self):
        if self.returncode is not None:
            return self.output
        try:
            with open(self.err_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        """SIGTERM, then SIGKILL after 15 s. Returns the exit status (negative: a signal)."""
        if self.returncode is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.err.close()
            self.output = self.stderr()
            self.returncode = self.proc.returncode
            shutil.rmtree(self.tmp, ignore_errors=True)
        return self.returncode


class Curl:
    """Runs curl; returns (status, headers as a lower-cased dict, body bytes)."""

    def __init__(self, base, tmp):
        self.base = base
        self.tmp = tmp
        self.n = 0

    def __call__(self, method, path, body=None, headers=(), stream=False, timeout=60):
        self.n += 1
        hdr = os.path.join(self.tmp, "h%d" % self.n)
        out = os.path.join(self.tmp, "b%d" % self.n)
        args = ["curl", "-sS", "-X", method, "-D", hdr, "-o", out, "-w", "%{http_code}",
                "--max-time", str(timeout)]
        if stream:
            args.append("-N")
        if body is not None:
            if not isinstance(body, bytes):
                body = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
            data = os.path.join(self.tmp, "d%d" % self.n)
            with open(data, "wb") as f:
                f.write(body)
            args += ["-H", "Content-Type: application/json", "--data-binary", "@" + data]
        for h in headers:
            args += ["-H", h]
        args.append(self.base + path)
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if p.returncode:
            raise AssertionError("curl %s %s failed (exit %d): %s" % (method, path, p.returncode,
                                                                     p.stderr.decode()))
        status = int(p.stdout.decode().strip())
        hs = {}
        with open(hdr, "rb") as f:
            for line in f.read().decode("latin-1").split("\r\n")[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    hs[k.strip().lower()] = v.strip()
        with open(out, "rb") as f:
            data = f.read()
        return status, hs, data


def strict_json(data):
    """json.loads that rejects NaN and Infinity (not JSON, and what JSON.parse refuses)."""
    def reject(name):
        raise ValueError("%s in a JSON answer" % name)
    return json.loads(data, parse_constant=reject)


def f32(x):
    return struct.pack("<f", x)


def raw_request(port, data, timeout=20.0):
    """Sends `data` on a fresh connection and reads the whole answer (the server closes, or the
    timeout passes). Returns (status, body bytes, seconds until the status line came)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.monotonic()
    try:
        s.sendall(data)
        got = b""
        first = None
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            if first is None:
                first = time.monotonic() - t0
            got += chunk
            if b"\r\n\r\n" in got:
                head, _, rest = got.partition(b"\r\n\r\n")
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length" and len(rest) >= int(v):
                        return int(got.split(b" ", 2)[1]), rest[:int(v)], first
    finally:
        s.close()
    if not got:
        raise AssertionError("no answer within %g s (connection dropped or silent)" % timeout)
    head, _, rest = got.partition(b"\r\n\r\n")
    return int(got.split(b" ", 2)[1]), rest, first


class Base(unittest.TestCase):
    def assertError(self, status, hs, body, want, etype=None, code=None, param=None):
        self.assertEqual(status, want, body)
        self.assertIn("application/json", hs.get("content-type", ""))
        doc = strict_json(body)
        self.assertEqual(set(doc), {"error"}, doc)
        err = doc["error"]
        self.assertTrue({"message", "type", "param", "code"} <= set(err), err)
        self.assertIsInstance(err["message"], str)
        self.assertTrue(err["message"])
        self.assertIsInstance(err["type"], str)
        self.assertTrue(err["param"] is None or isinstance(err["param"], str), err)
        self.assertTrue(err["code"] is None or isinstance(err["code"], str), err)
        if etype is not None:
            self.assertEqual(err["type"], etype, err)
        if code is not None:
            self.assertEqual(err["code"], code, err)
        if param is not None:
            self.assertEqual(err["param"], param, err)
        return err


class TestServe(Base):
    server = None

    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        cls.tmp = tempfile.mkdtemp(prefix="parity-curl-")
        cls.curl = Curl(cls.server.base, cls.tmp)

    @classmethod
    def tearDownClass(cls):
        if cls.server:
            rc = cls.server.stop()
            if rc != 0:
                print("parity.serve exited with status %s after SIGTERM; its output:\n%s"
                      % (rc, cls.server.stderr()))
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def json(self, method, path, body=None, want=200):
        status, hs, data = self.curl(method, path, body)
        self.assertEqual(status, want, data)
        self.assertIn("application/json", hs.get("content-type", ""))
        return strict_json(data)

    def complete(self, **kw):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "seed": 7}
        body.update(kw)
        body = {k: v for k, v in body.items() if v is not None}  # seed=None: no seed at all
        return self.json("POST", "/v1/completions", body)

    def test_health(self):
        self.assertEqual(self.json("GET", "/health"), {"status": "ok"})

    def test_models(self):
        doc = self.json("GET", "/v1/models")
        self.assertEqual(doc["object"], "list")
        self.assertEqual(len(doc["data"]), 1)
        m = doc["data"][0]
        self.assertEqual(m["id"], MODEL)  # the --model argument as given
        self.assertEqual(m["object"], "model")
        self.assertIsInstance(m["created"], int)
        self.assertEqual(m["owned_by"], "libparity")
        self.assertIsInstance(m["max_model_len"], int)
        self.assertGreater(m["max_model_len"], 1)

    def test_info(self):
        doc = self.json("GET", "/parity/info")
        types = {"model": str, "policy": str, "backend": str, "cpu_path": str,
                 "weight_version": int, "vocab_size": int, "max_model_len": int,
                 "max_batch": int, "byte_level": bool, "libparity": str}
        for k, t in types.items():
            self.assertIn(k, doc)
            self.assertIsInstance(doc[k], t, k)
        self.assertEqual(doc["model"], MODEL)
        self.assertEqual(doc["vocab_size"], 256)
        self.assertEqual(doc["max_batch"], 8)
        self.assertIs(doc["byte_level"], True)
        models = self.json("GET", "/v1/models")
        self.assertEqual(doc["max_model_len"], models["data"][0]["max_model_len"])

    def check_completion(self, doc, n_choices, max_tokens, logprobs=None, token_ids=False):
        self.assertTrue(doc["id"].startswith("cmpl-"), doc["id"])
        self.assertEqual(doc["object"], "text_completion")
        self.assertIsInstance(doc["created"], int)
        self.assertEqual(doc["model"], MODEL)
        self.assertIsInstance(doc["weight_version"], int)
        self.assertEqual(doc["system_fingerprint"], "parity-w%d" % doc["weight_version"])
        self.assertIsInstance(doc["seed"], int)
        self.assertEqual([c["index"] for c in doc["choices"]], list(range(n_choices)))
        total = 0
        for c in doc["choices"]:
            self.assertIsInstance(c["text"], str)
            self.assertIn(c["finish_reason"], ("stop", "length"))
            lp = c["logprobs"]
            if logprobs is None:
                self.assertIsNone(lp)
                n = None
            else:
                self.assertEqual(set(lp), {"tokens", "token_logprobs", "top_logprobs",
                                           "text_offset"})
                n = len(lp["tokens"])
                self.assertEqual(len(lp["token_logprobs"]), n)
                self.assertEqual(len(lp["text_offset"]), n)
                for x in lp["token_logprobs"]:
                    self.assertIsInstance(x, float)
                    self.assertLessEqual(x, 0.0)
                    self.assertEqual(struct.unpack("<f", f32(x))[0], x, "not a float32 value")
                if logprobs == 0:
                    self.assertIsNone(lp["top_logprobs"])
                else:
                    self.assertEqual(len(lp["top_logprobs"]), n)
                    for k, top in enumerate(lp["top_logprobs"]):
                        self.assertGreaterEqual(len(top), logprobs)
                        self.assertLessEqual(len(top), logprobs + 1)
                        self.assertIn(lp["tokens"][k], top)
                        self.assertEqual(f32(top[lp["tokens"][k]]), f32(lp["token_logprobs"][k]))
                self.assertEqual(lp["text_offset"], list(range(n)))  # one byte per token
            if token_ids:
                ids = c["token_ids"]
                self.assertTrue(all(isinstance(t, int) and 0 <= t < 256 for t in ids))
                self.assertEqual(c["prompt_token_ids"], list(PROMPT.encode()))
                if n is not None:
                    self.assertEqual(len(ids), n)
                    names = [chr(b) if b < 128 else "bytes:\\x%02x" % b for b in ids]
                    self.assertEqual(lp["tokens"], names)
                self.assertEqual(c["text"], bytes(ids).decode("utf-8", "replace"))
                n = len(ids)
            else:
                self.assertNotIn("token_ids", c)
                self.assertNotIn("prompt_token_ids", c)
            if n is not None:
                if c["finish_reason"] == "length":
                    self.assertEqual(n, max_tokens)
                else:
                    self.assertLessEqual(n, max_tokens)
                total += n
        u = doc["usage"]
        self.assertEqual(u["prompt_tokens"], len(PROMPT.encode()))  # once per prompt, not per choice
        if total:
            self.assertEqual(u["completion_tokens"], total)
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])

    def test_completion(self):
        doc = self.complete(n=2, logprobs=2, return_token_ids=True)
        self.check_completion(doc, 2, 12, logprobs=2, token_ids=True)
        self.assertEqual(doc["seed"], 7)
        again = self.complete(n=2, logprobs=2, return_token_ids=True)
        for a, b in zip(doc["choices"], again["choices"]):
            self.assertEqual(a["token_ids"], b["token_ids"])
            self.assertEqual([f32(x) for x in a["logprobs"]["token_logprobs"]],
                             [f32(x) for x in b["logprobs"]["token_logprobs"]])
        plain = self.complete()
        self.check_completion(plain, 1, 12)
        # Without a seed the server draws one and returns it; sending it back reproduces.
        drawn = self.complete(seed=None, return_token_ids=True)
        self.assertIsInstance(drawn["seed"], int)
        self.assertTrue(0 <= drawn["seed"] < 2 ** 64)
        replay = self.complete(seed=drawn["seed"], return_token_ids=True)
        self.assertEqual(drawn["choices"][0]["token_ids"], replay["choices"][0]["token_ids"])
        # Greedy: temperature 0 is deterministic whatever the seed.
        g1 = self.complete(temperature=0, seed=1, return_token_ids=True)
        g2 = self.complete(temperature=0, seed=2, return_token_ids=True)
        self.assertEqual(g1["choices"][0]["token_ids"], g2["choices"][0]["token_ids"])

    def test_truncated_top_logprobs(self):
        # processed-truncated with top_k 2: only 2 tokens have a (finite) log-prob; top_logprobs
        # lists those, never a padding entry, and they sum to 1.
        doc = self.complete(logprobs=5, top_k=2, logprob_mode="processed-truncated",
                            return_token_ids=True)
        lp = doc["choices"][0]["logprobs"]
        names = set(chr(b) if b < 128 else "bytes:\\x%02x" % b for b in range(256))
        for k, top in enumerate(lp["top_logprobs"]):
            self.assertTrue(1 <= len(top) <= 2, top)
            self.assertTrue(set(top) <= names, top)
            self.assertIn(lp["tokens"][k], top)
            self.assertAlmostEqual(sum(math.exp(v) for v in top.values()), 1.0, places=4)

    def test_stop(self):
        ref = self.complete(temperature=0, max_tokens=16, return_token_ids=True)["choices"][0]
        text = ref["text"]
        stop = text[7:10]
        cut = text.index(stop)
        doc = self.complete(temperature=0, max_tokens=16, stop=[stop, "\x00never"])
        c = doc["choices"][0]
        self.assertEqual((c["text"], c["finish_reason"]), (text[:cut], "stop"))
        t = ref["token_ids"][8]
        doc = self.complete(temperature=0, max_tokens=16, stop_token_ids=[t])
        c = doc["choices"][0]
        self.assertEqual((c["text"], c["finish_reason"]),
                         (bytes(ref["token_ids"][:ref["token_ids"].index(t)]).decode(), "stop"))

    def test_prompt_forms(self):
        ids = list(PROMPT.encode())
        s = self.complete(logprobs=0, return_token_ids=True)
        t = self.complete(prompt=ids, logprobs=0, return_token_ids=True)
        self.assertEqual(s["choices"][0]["token_ids"], t["choices"][0]["token_ids"])
        self.assertEqual(t["choices"][0]["prompt_token_ids"], ids)
        # Two prompts, n 2: choice index = prompt_index * n + i.
        two = self.complete(prompt=[ids, PROMPT], n=2, return_token_ids=True)
        self.assertEqual([c["index"] for c in two["choices"]], [0, 1, 2, 3])
        self.assertEqual(two["choices"][0]["token_ids"], two["choices"][2]["token_ids"])
        self.assertEqual(two["choices"][1]["token_ids"], two["choices"][3]["token_ids"])
        self.assertEqual(two["usage"]["prompt_tokens"], 2 * len(ids))

    def stream(self, body):
        status, hs, data = self.curl("POST", "/v1/completions", body, stream=True)
        self.assertEqual(status, 200, data)
        self.assertIn("text/event-stream", hs.get("content-type", ""))
        self.assertEqual(hs.get("transfer-encoding", "").lower(), "chunked")
        text = data.decode()
        self.assertTrue(text.endswith("data: [DONE]\n\n"), text[-200:])
        events = text.split("\n\n")
        self.assertEqual(events[-1], "")
        chunks = []
        for ev in events[:-2]:
            self.assertTrue(ev.startswith("data: "), ev)
            chunks.append(strict_json(ev[len("data: "):]))
        self.assertEqual(events[-2], "data: [DONE]")
        return chunks

    def test_stream(self):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "seed": 11, "n": 2,
                "logprobs": 1, "return_token_ids": True}
        ref = self.complete(**body)
        chunks = self.stream(dict(body, stream=True, stream_options={"include_usage": True}))
        # At least one chunk of text and the usage chunk. How many chunks carry the text is not
        # fixed: each one carries what the choices drew since the handler last woke, so a step
        # that ends before the handler wakes joins the next one (here, all twelve once did).
        self.assertGreaterEqual(len(chunks), 2)
        usage = chunks[-1]
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"], ref["usage"])
        acc = {i: {"text": "", "ids": [], "lp": [], "tok": [], "fin": None} for i in (0, 1)}
        for ch in chunks[:-1]:
            self.assertTrue(ch["id"].startswith("cmpl-"))
            self.assertEqual(ch["id"], chunks[0]["id"])
            self.assertEqual(ch["object"], "text_completion")
            self.assertEqual(ch["model"], MODEL)
            self.assertEqual(ch["system_fingerprint"], ref["system_fingerprint"])
            self.assertEqual(ch["weight_version"], ref["weight_version"])
            self.assertIsInstance(ch["created"], int)
            for c in ch["choices"]:
                a = acc[c["index"]]
                self.assertIsNone(a["fin"], "a chunk after the choice's finish_reason")
                a["text"] += c["text"]
                a["ids"] += c["token_ids"]
                if c["logprobs"] is not None:
                    a["lp"] += c["logprobs"]["token_logprobs"]
                    a["tok"] += c["logprobs"]["tokens"]
                a["fin"] = c["finish_reason"]
        for i, c in enumerate(ref["choices"]):
            a = acc[i]
            self.assertEqual(a["text"], c["text"])
            self.assertEqual(a["ids"], c["token_ids"])
            self.assertEqual(a["fin"], c["finish_reason"])
            self.assertEqual(a["tok"], c["logprobs"]["tokens"])
            self.assertEqual([f32(x) for x in a["lp"]],
                             [f32(x) for x in c["logprobs"]["token_logprobs"]])
        # A long stream comes in pieces: 1500 steps take over a second here, and the handler
        # sends what was drawn each time it wakes (at every step it can keep up with), so
        # fewer than three chunks would mean it held the text back.
        long = self.stream(dict(body, stream=True, n=1, max_tokens=1500, logprobs=None))
        self.assertGreaterEqual(sum(1 for ch in long if ch["choices"][0]["text"]), 3,
                                "a 1500-token completion streamed in fewer than 3 chunks")
        self.assertEqual(sum(len(ch["choices"][0]["token_ids"]) for ch in long), 1500)
        # Without include_usage there is no usage chunk.
        plain = self.stream(dict(body, stream=True, n=1))
        self.assertTrue(all(ch["choices"] for ch in plain))
        self.assertIsNone(plain[-1].get("usage"))

    def test_score_reproduces(self):
        cases = [({}, {}),
                 ({"logprob_mode": "processed", "temperature": 0.8, "top_k": 20, "top_p": 0.9},
                  {"mode": "processed", "temperature": 0.8, "top_k": 20, "top_p": 0.9})]
        for gen, score in cases:
            with self.subTest(gen=gen):
                doc = self.complete(max_tokens=16, logprobs=0, return_token_ids=True, **gen)
                c = doc["choices"][0]
                seq = c["prompt_token_ids"] + c["token_ids"]
                sc = self.json("POST", "/parity/score", dict(score, sequences=[seq]))
                self.assertEqual(sc["weight_version"], doc["weight_version"])
                self.assertEqual(len(sc["logprobs"]), 1)
                self.assertEqual(len(sc["logprobs"][0]), len(seq) - 1)
                tail = sc["logprobs"][0][-len(c["token_ids"]):]
                self.assertEqual([f32(x) for x in tail],
                                 [f32(x) for x in c["logprobs"]["token_logprobs"]])
        # A string sequence on a byte-level model is its bytes.
        a = self.json("POST", "/parity/score", {"sequences": [PROMPT]})
        b = self.json("POST", "/parity/score", {"sequences": [list(PROMPT.encode())]})
        self.assertEqual([f32(x) for x in a["logprobs"][0]], [f32(x) for x in b["logprobs"][0]])

    def test_errors(self):
        c = self.curl
        e = self.assertError(*c("POST", "/v1/completions", b'{"model": "x", "prompt": '), 400)
        self.assertEqual(e["type"], "invalid_request_error")
        self.assertError(*c("POST", "/v1/completions", b"[1, 2]"), 400)
        base = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
        for bad in ({"bogus_field": 1}, {"temperature": -0.5}, {"n": 0}, {"n": 9},
                    {"max_tokens": 0}, {"logprobs": 21}, {"prompt": [256]},
                    {"echo": True, "stream": True}, {"max_tokens": "4"}):
            with self.subTest(bad=bad):
                self.assertError(*c("POST", "/v1/completions", dict(base, **bad)), 400,
                                 etype="invalid_request_error")
        self.assertError(*c("POST", "/v1/completions", {"prompt": PROMPT}), 400)  # no model
        self.assertError(*c("POST", "/v1/completions", dict(base, model="nope")), 404,
                         code="model_not_found")
        mml = self.json("GET", "/v1/models")["data"][0]["max_model_len"]
        self.assertError(*c("POST", "/v1/completions", dict(base, prompt="a" * mml)), 413,
                         param="prompt")
        self.assertError(*c("POST", "/v1/completions",
                            dict(base, prompt="a" * (mml - 2), max_tokens=8)), 400)
        self.assertError(*c("GET", "/no/such/path"), 404)
        self.assertError(*c("POST", "/v2/completions", base), 404)
        self.assertError(*c("GET", "/v1/completions"), 405)
        self.assertError(*c("DELETE", "/v1/models"), 405)
        self.assertError(*c("POST", "/parity/score", {"sequences": [[1, 2]], "bogus": 1}), 400)
        # POST without Content-Length: 411, answered (not dropped).
        status, body, _ = raw_request(self.server.port,
                                      b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                      b"Content-Type: application/json\r\n"
                                      b"Connection: close\r\n\r\n")
        self.assertError(status, {"content-type": "application/json"}, body, 411)
        # The server still answers after all that.
        self.assertEqual(self.json("GET", "/health"), {"status": "ok"})


class TestLimits(Base):
    """A server with --max-body-bytes 4096, --client-timeout 5 and one engine thread."""

    def test_limits(self):
        # One engine thread: on two loaded cores a pool of two waits on its worker at every
        # parallel loop (a 4-token completion took 0.5-1.1 s beside CPU hogs, 45-160 ms with
        # one thread), and the requests served meanwhile must end well before the slow
        # client's timeout, which has seconds of slack either way.
        timeout = 5.0
        server = Server("--max-body-bytes", "4096", "--client-timeout", "%g" % timeout,
                        "--threads", "1")
        tmp = tempfile.mkdtemp(prefix="parity-curl-")
        try:
            curl = Curl(server.base, tmp)
            # Over 4096 bytes by a field that is valid at any length (not by a long prompt,
            # which is a 413 of its own).
            big = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "user": "u" * 5000}
            status, hs, data = curl("POST", "/v1/completions", big)
            err = self.assertError(status, hs, data, 413)
            self.assertNotEqual(err["param"], "prompt", err)
            status, _, data = curl("POST", "/v1/completions", dict(big, user="u" * 3000))
            self.assertEqual(status, 200, data)
            small = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "seed": 3}
            status, _, data = curl("POST", "/v1/completions", small)
            self.assertEqual(status, 200, data)

            # A slow client: headers promise 200 bytes, 20 come, then silence.
            result = {}

            def slow():
                try:
                    result["answer"] = raw_request(
                        server.port,
                        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
                        + b'{"model": "x", "pro', timeout=timeout + 10)
                except BaseException as e:  # reported below
                    result["error"] = e
            t0 = time.monotonic()
            th = threading.Thread(target=slow)
            th.start()
            time.sleep(0.3)
            # Meanwhile other requests are served, and promptly.
            status, _, data = curl("GET", "/health")
            self.assertEqual((status, json.loads(data)), (200, {"status": "ok"}))
            status, _, data = curl("POST", "/v1/completions", small)
            self.assertEqual(status, 200, data)
            self.assertNotIn("answer", result, "the other requests waited for the slow client")
            th.join(timeout + 15)
            elapsed = time.monotonic() - t0
            self.assertNotIn("error", result, result.get("error"))
            status, body, first = result["answer"]
            self.assertError(status, {"content-type": "application/json"}, body, 408)
            self.assertGreaterEqual(first, timeout - 0.5, "408 before the client timeout")
            self.assertLess(first, timeout + 4.0, "408 too late")
            self.assertLess(elapsed, timeout + 6.0)
            status, _, _ = curl("GET", "/health")
            self.assertEqual(status, 200)
        finally:
            rc = server.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        self.assertEqual(rc, 0, "SIGTERM should stop the server with exit 0; its output:\n"
                         + server.stderr())


def main():
    build = harness.setup()
    del build
    if shutil.which("curl") is None:
        print("SKIP: serve-curl needs the curl binary (apt-get install curl)")
        sys.exit(harness.SKIP)
    if not os.path.isdir(MODEL):
        sys.exit("error: no model at %s" % MODEL)
    harness.run("serve-curl")


if __name__ == "__main__":
    main()
