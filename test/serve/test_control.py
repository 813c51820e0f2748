"""parity.serve's control around weight updates, by SGLang's and vLLM's endpoint names: pause
(abort, wait, keep / in_place), resume, abort by request id, update weights from disk, flush the
cache. Requests kept through a pause, or queued while paused, equal Model.generate() of the same
request bit for bit; an aborted request answers with what it drew so far (a prefix of its solo
run) and finish_reason "abort"; bad control calls get OpenAI-shaped 4xx errors and change
nothing.

Run as `python3 test/serve/test_control.py BUILD_DIR` (meson: serve-control)."""
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import harness  # noqa: E402

harness.setup()
import parity  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_curl import MODEL  # noqa: E402
from test_serve import Served, bits  # noqa: E402

LONG = 1500          # tokens: long enough that a request is still running when a pause arrives


def params(i, max_tokens=LONG, stream=False, **extra):
    p = {"prompt": ["def main(", "import os\n", "The quick brown fox", "for i in range("][i % 4],
         "max_tokens": max_tokens, "seed": 300 + i, "temperature": 0.9, "n": 1 + i % 2,
         "logprobs": 1, "return_token_ids": True, "stream": stream}
    p.update(extra)
    return p


class Call(threading.Thread):
    """A completion request sent from its own thread."""

    def __init__(self, srv, p):
        super().__init__(daemon=True)
        self.srv, self.p, self.result = srv, p, None
        self.start()

    def run(self):
        self.result = self.srv.complete(**self.p)

    def response(self, timeout=300):
        self.join(timeout)
        assert not self.is_alive(), "no answer within %g s" % timeout
        return self.result


class TestControl(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Served("--max-batch", "8")
        cls.model = parity.Model(MODEL, threads=2)
        cls.refs = {}

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        cls.model.close()

    def setUp(self):
        status, info = self.srv.request("GET", "/parity/info")
        self.assertEqual(status, 200)

    def tearDown(self):
        # every test leaves the server running and idle
        status, body = self.srv.post("/abort_requests", {})
        self.assertEqual(status, 200, body)
        if self.info()["paused"] is not None:
            self.assertEqual(self.srv.post("/resume", {})[0], 200)

    def info(self):
        import json
        status, raw = self.srv.request("GET", "/parity/info")
        self.assertEqual(status, 200)
        return json.loads(raw)

    def wait_for(self, what, timeout=60):
        deadline = time.monotonic() + timeout
        while not what(self.info()):
            self.assertLess(time.monotonic(), deadline, "timed out waiting")
            time.sleep(0.01)

    def reference(self, p):
        key = (p["prompt"], p["n"], p["max_tokens"], p["seed"])
        if key not in self.refs:
            out = self.model.generate(p["prompt"].encode(), n=p["n"], max_tokens=p["max_tokens"],
                                      seed=p["seed"], temperature=p["temperature"])
            self.refs[key] = [(c.tokens, c.logprobs) for c in out]
        return self.refs[key]

    def check_error(self, status, body, want_status, code=None):
        self.assertEqual(status, want_status, body)
        err = body["error"]
        self.assertEqual(sorted(err), ["code", "message", "param", "type"], body)
        self.assertTrue(err["message"])
        if code is not None:
            self.assertEqual(err["code"], code, body)

    def check_solo(self, resp, p, what):
        """The response equals Model.generate() of the same request bit for bit."""
        ref = self.reference(p)
        self.assertEqual(len(resp["choices"]), len(ref), what)
        for ch, (tokens, lps) in zip(resp["choices"], ref):
            self.assertEqual(ch["token_ids"], tokens, what)
            self.assertEqual(bits(ch["logprobs"]["token_logprobs"]), bits(lps), what)
            self.assertEqual(ch["finish_reason"], "length", what)

    def check_aborted(self, resp, p, what):
        """An aborted response: each choice a prefix of its solo run, finish_reason abort."""
        ref = self.reference(p)
        for ch, (tokens, lps) in zip(resp["choices"], ref):
            n = len(ch["token_ids"])
            self.assertLess(n, len(tokens), what)
            self.assertEqual(ch["token_ids"], tokens[:n], what)
            self.assertEqual(bits(ch["logprobs"]["token_logprobs"]), bits(lps[:n]), what)
            self.assertEqual(ch["finish_reason"], "abort", what)

    def test_keep_pause_resume_is_bitwise(self):
        ps = [params(i, stream=i % 2 == 1) for i in range(4)]
        calls = [Call(self.srv, p) for p in ps]
        self.wait_for(lambda info: info["requests_running"] == 4)
        status, body = self.srv.post("/pause?mode=keep", b"")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["mode"], "keep")
        self.assertEqual(len(body["kept"]), 4)
        self.assertEqual(body["weight_version"], self.model.version)
        status, body = self.srv.request("GET", "/is_paused")
        self.assertEqual(status, 200)
        self.assertIn(b'"is_paused": true', body)
        # frozen: no decode step while paused, the requests stay in flight
        steps = self.info()["decode_steps"]
        time.sleep(0.3)
        info = self.info()
        self.assertEqual(info["decode_steps"], steps)
        self.assertEqual(info["requests_running"], 4)
        # a request sent while paused is kept queued
        late = params(5, max_tokens=40)
        late_call = Call(self.srv, late)
        self.wait_for(lambda info: info["requests_waiting"] == 1)
        # bad input changes nothing: a second pause, an update (its requests cannot finish)
        self.check_error(*self.srv.post("/pause_generation", {"mode": "in_place"}), 409,
                         "already_paused")
        self.check_error(*self.srv.post("/pause", {"mode": "abort"}), 409, "already_paused")
        self.check_error(*self.srv.post("/update_weights_from_disk", {"model_path": MODEL}),
                         409, "requests_in_flight")
        # flushing the prompt cache leaves the requests forked from it as they were
        status, body = self.srv.post("/flush_cache", {})
        self.assertEqual(status, 200, body)
        self.assertEqual(self.info()["prompt_cache"]["entries"], 0)
        info = self.info()
        self.assertEqual((info["paused"], info["weight_version"], info["requests_running"],
                          info["requests_waiting"]), ("keep", self.model.version, 4, 1))
        status, body = self.srv.post("/continue_generation", {})
        self.assertEqual(status, 200, body)
        self.check_error(*self.srv.post("/resume", {}), 409, "not_paused")
        for i, (p, call) in enumerate(zip(ps, calls)):
            status, resp = call.response()
            self.assertEqual(status, 200, resp)
            self.check_solo(resp, p, "kept request %d" % i)
        status, resp = late_call.response()
        self.assertEqual(status, 200, resp)
        self.check_solo(resp, late, "request queued while paused")

    def test_in_place_pause_via_sglang_names(self):
        p = params(7)
        call = Call(self.srv, p)
        self.wait_for(lambda info: info["requests_running"] == 1)
        status, body = self.srv.post("/pause_generation", {"mode": "retract"})
        self.assertEqual(status, 200, body)
        self.assertEqual((body["mode"], len(body["kept"])), ("keep", 1))
        time.sleep(0.1)
        status, body = self.srv.post("/continue_generation", b"")
        self.assertEqual(status, 200, body)
        status, resp = call.response()
        self.assertEqual(status, 200, resp)
        self.check_solo(resp, p, "retracted request")

    def test_abort_pause(self):
        ps = [params(i, request_id="abort-me-%d" % i, stream=i == 1) for i in range(3)]
        calls = [Call(self.srv, p) for p in ps]
        self.wait_for(lambda info: info["requests_running"] == 3)
        status, body = self.srv.post("/pause_generation", {"mode": "abort"})
        self.assertEqual(status, 200, body)
        self.assertEqual(sorted(body["aborted"]), ["abort-me-0", "abort-me-1", "abort-me-2"])
        for i, (p, call) in enumerate(zip(ps, calls)):
            status, resp = call.response()
            self.assertEqual(status, 200, resp)
            if not p["stream"]:
                self.assertEqual(resp["id"], p["request_id"])
            self.assertEqual(resp["weight_version"], self.model.version)
            self.check_aborted(resp, p, "aborted request %d" % i)
        self.assertEqual(self.info()["requests_running"], 0)
        # while paused, a new request waits; abort it by id: no tokens, finish_reason abort
        waiting = params(4, request_id="queued-1", max_tokens=30)
        call = Call(self.srv, waiting)
        self.wait_for(lambda info: info["requests_waiting"] == 1)
        self.check_error(*self.srv.post("/abort_request", {"rid": "no-such-request"}), 404,
                         "request_not_found")
        self.assertEqual(self.info()["requests_waiting"], 1)
        status, body = self.srv.post("/abort_request", {"rid": "queued-1"})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["aborted"], ["queued-1"])
        status, resp = call.response()
        self.assertEqual(status, 200, resp)
        self.assertEqual([ch["finish_reason"] for ch in resp["choices"]], ["abort"] * 1)
        self.assertEqual([ch["token_ids"] for ch in resp["choices"]], [[]])
        self.assertEqual(resp["usage"]["completion_tokens"], 0)
        status, body = self.srv.post("/resume", b"")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["weight_version"], self.model.version)

    def test_abort_by_id_while_serving(self):
        victim = params(0, request_id="victim")
        other = params(1)
        calls = [Call(self.srv, victim), Call(self.srv, other)]
        self.wait_for(lambda info: info["requests_running"] == 2)
        # one unknown id among known ones: 404, nothing aborted
        self.check_error(*self.srv.post("/abort_requests", {"request_ids": ["victim", "nope"]}),
                         404, "request_not_found")
        self.assertEqual(self.info()["requests_running"], 2)
        status, body = self.srv.post("/abort_requests", {"request_ids": ["victim"]})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["aborted"], ["victim"])
        status, resp = calls[0].response()
        self.assertEqual(status, 200, resp)
        self.check_aborted(resp, victim, "aborted by id")
        status, resp = calls[1].response()
        self.assertEqual(status, 200, resp)
        self.check_solo(resp, other, "the request beside the aborted one")
        # finished: its id is unknown now
        self.check_error(*self.srv.post("/abort_request", {"rid": "victim"}), 404,
                         "request_not_found")

    def test_duplicate_request_id(self):
        p = params(2, request_id="twice")
        call = Call(self.srv, p)
        self.wait_for(lambda info: info["requests_running"] == 1)
        self.check_error(*self.srv.complete(**params(3, request_id="twice")), 409,
                         "duplicate_request_id")
        status, resp = self.srv.post("/abort_request", {"abort_all": True})
        self.assertEqual((status, resp["aborted"]), (200, ["twice"]))
        self.check_aborted(call.response()[1], p, "abort_all")

    def test_wait_pause_update_resume(self):
        p = params(3)
        call = Call(self.srv, p)
        self.wait_for(lambda info: info["requests_running"] == 1)
        status, body = self.srv.post("/pause?mode=wait", b"")
        self.assertEqual(status, 200, body)
        self.assertEqual((body["mode"], body["aborted"]), ("wait", []))
        # answered once the request in flight had finished, which it did normally
        status, resp = call.response()
        self.assertEqual(status, 200, resp)
        self.check_solo(resp, p, "request finished before the pause")
        self.assertEqual(self.info()["requests_running"], 0)
        # queued while paused; the update (the same weights) applies at once
        queued = params(6, max_tokens=50)
        qcall = Call(self.srv, queued)
        self.wait_for(lambda info: info["requests_waiting"] == 1)
        version = self.info()["weight_version"]
        self.check_error(*self.srv.post("/update_weights_from_disk", {
            "model_path": MODEL, "weight_version": version + 5}), 409, "weight_version_mismatch")
        self.check_error(*self.srv.post("/update_weights_from_disk", {}), 400)
        self.check_error(*self.srv.post("/update_weights_from_disk", {
            "model_path": os.path.join(MODEL, "nope")}), 400)
        self.check_error(*self.srv.post("/update_weights_from_disk", {
            "model_path": MODEL, "load_format": "pt"}), 400)
        self.assertEqual(self.info()["weight_version"], version)
        status, body = self.srv.post("/update_weights_from_disk", {
            "model_path": MODEL, "weight_version": str(version + 1)})
        self.assertEqual(status, 200, body)
        self.assertEqual((body["success"], body["weight_version"]), (True, version + 1))
        status, body = self.srv.post("/update_weights_from_disk", {
            "model_path": os.path.join(MODEL, "model.safetensors")})
        self.assertEqual((status, body["weight_version"]), (200, version + 2), body)
        self.assertEqual(self.info()["requests_waiting"], 1)
        status, body = self.srv.post("/resume", {})
        self.assertEqual((status, body["weight_version"]), (200, version + 2), body)
        status, resp = qcall.response()
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["weight_version"], version + 2)
        self.check_solo(resp, queued, "request queued through an update of the same weights")

    def test_prompt_cache(self):
        """A prompt sent again forks its cached prefill: the same bits as a fresh one; a
        weight update and /flush_cache empty the cache."""
        self.assertEqual(self.srv.post("/flush_cache", {})[0], 200)
        first = self.info()["prompt_cache"]
        self.assertEqual(first["entries"], 0)
        p = params(9, max_tokens=24)
        for rnd in range(2):
            status, resp = self.srv.complete(**p)
            self.assertEqual(status, 200, resp)
            self.check_solo(resp, p, "round %d" % rnd)
            cache = self.info()["prompt_cache"]
            self.assertEqual((cache["entries"], cache["hits"] - first["hits"],
                              cache["misses"] - first["misses"]), (1, rnd, 1))
        # another prompt is prefilled and kept beside the first
        other = dict(params(10, max_tokens=24), prompt="Once upon a time")
        status, resp = self.srv.complete(**other)
        self.assertEqual(status, 200, resp)
        self.assertEqual(self.info()["prompt_cache"]["entries"], 2)
        status, body = self.srv.post("/update_weights_from_disk", {"model_path": MODEL})
        self.assertEqual(status, 200, body)
        self.assertEqual(self.info()["prompt_cache"]["entries"], 0)
        status, resp = self.srv.complete(**p)
        self.assertEqual(status, 200, resp)
        self.check_solo(resp, p, "after an update of the same weights")
        status, body = self.srv.request("GET", "/flush_cache")
        self.assertEqual(status, 200, body)
        self.assertIn(b'"prompts_flushed": 1', body)

    def test_flush_and_bad_control_input(self):
        for method, path in (("POST", "/flush_cache"), ("GET", "/flush_cache"),
                             ("POST", "/reset_prefix_cache")):
            status, raw = self.srv.request(method, path)
            self.assertEqual(status, 200, raw)
            self.assertIn(b'"weight_version"', raw)
        self.check_error(*self.srv.post("/resume", {}), 409, "not_paused")
        self.check_error(*self.srv.post("/continue_generation", {}), 409, "not_paused")
        self.check_error(*self.srv.post("/pause", {"mode": "sleep"}), 400)
        self.check_error(*self.srv.post("/pause?mode=keep&colour=red", b""), 400,
                         "unknown_parameter")
        self.check_error(*self.srv.post("/pause?wait_for_inflight_requests=maybe", b""), 400)
        self.check_error(*self.srv.post("/pause_generation", {"mode": "wait"}), 400)
        self.check_error(*self.srv.post("/pause_generation", [1]), 400)
        self.check_error(*self.srv.post("/abort_request", {}), 400)
        self.check_error(*self.srv.post("/abort_request", {"rid": 7}), 400)
        self.check_error(*self.srv.post("/abort_requests", {"request_ids": "x"}), 400)
        self.check_error(*self.srv.complete(**params(0, request_id="")), 400)
        self.check_error(*self.srv.post("/is_paused", {}), 405)
        info = self.info()
        self.assertEqual((info["paused"], info["requests_running"], info["requests_waiting"]),
                         (None, 0, 0))
        status, body = self.srv.post("/pause", {"wait_for_inflight_requests": True})
        self.assertEqual((status, body["mode"]), (200, "wait"), body)
        self.assertEqual(self.srv.post("/resume", {})[0], 200)


class TestPromptCacheEviction(unittest.TestCase):
    """A server whose KV cache holds one long request: the cached prompts that stand in its
    way are released (least recently used first) and the request runs; a prompt evicted and
    sent again is prefilled again; every answer equals Model.generate."""

    CACHE = 256

    @classmethod
    def setUpClass(cls):
        cls.srv = Served("--max-batch", "4", "--cache-tokens", str(cls.CACHE), "--prompt-cache",
                         "3")
        cls.model = parity.Model(MODEL, threads=2)

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        cls.model.close()

    def cache(self):
        import json
        status, raw = self.srv.request("GET", "/parity/info")
        self.assertEqual(status, 200)
        return json.loads(raw)["prompt_cache"]

    def run_one(self, prompt, max_tokens):
        p = dict(params(0, max_tokens=max_tokens), prompt=prompt, n=1)
        status, resp = self.srv.complete(**p)
        self.assertEqual(status, 200, resp)
        ref = self.model.generate(prompt.encode(), n=1, max_tokens=max_tokens, seed=p["seed"],
                                  temperature=p["temperature"])[0]
        ch = resp["choices"][0]
        self.assertEqual(ch["token_ids"], ref.tokens, prompt)
        self.assertEqual(bits(ch["logprobs"]["token_logprobs"]), bits(ref.logprobs), prompt)

    def test_eviction(self):
        import ctypes
        from parity._lib import lib

        def need(prompt, max_tokens):
            lens, comps, out = (ctypes.c_uint32 * 1)(len(prompt)), (ctypes.c_uint32 * 1)(1), \
                ctypes.c_uint64()
            lib.parity_sampler_cache_tokens(1, lens, comps, max_tokens, ctypes.byref(out))
            return out.value

        self.run_one("def main(", 8)
        self.run_one("import os\n", 8)
        self.run_one("# Copyright", 8)
        self.assertEqual(self.cache()["entries"], 3)
        self.run_one("def main(", 8)        # a hit: "def main(" is now the most recent
        self.assertEqual(self.cache()["hits"], 1)
        # a request that fits only once two cached prompts (16 positions each) are gone
        long_prompt = "The quick brown fox"
        max_tokens = max(t for t in range(1, 400) if need(long_prompt, t) <= self.CACHE - 16)
        self.assertGreater(need(long_prompt, max_tokens) + 3 * 16, self.CACHE)
        self.run_one(long_prompt, max_tokens)
        cache = self.cache()
        self.assertLessEqual(cache["entries"], 2)
        # "import os\n" went first (least recently used), and is prefilled again
        misses = cache["misses"]
        self.run_one("import os\n", 8)
        self.assertEqual(self.cache()["misses"], misses + 1)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
