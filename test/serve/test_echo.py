"""parity.serve's prompt log-probs on a byte-level model, standard library only: echo with
logprobs (the prompt's tokens and log-probs, the first null, then the completion's) and vLLM's
prompt_logprobs equal /parity/score and Model.score of the same sequence bit for bit, in every
logprob mode; max_tokens 0 with echo; and the bad input of text and chat requests: echo with
stream, prompt_logprobs out of range, chat without a chat template, a string prompt or stop
string for a model of another vocabulary without a tokenizer (or without the PyPI package
`tokenizers` where this Python lacks it).

Run as `python3 test/serve/test_echo.py BUILD_DIR` (meson: serve-echo)."""
import os
import shutil
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import harness  # noqa: E402

harness.setup()
import parity  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_curl import MODEL  # noqa: E402
from test_serve import Served  # noqa: E402

TOKENIZER_MODEL = os.path.join(harness.REPO, "test", "data", "tokenizer-model")
PROMPTS = ["def main(argv):\n", "The quick brown fox"]


def bits(values):
    """float32 bits of each value; None stays None."""
    return [None if v is None else struct.pack("<f", v) for v in values]


class Base(unittest.TestCase):
    def assertError(self, status, body, want, param=None, code=None):
        self.assertEqual(status, want, body)
        err = body["error"]
        self.assertEqual(sorted(err), ["code", "message", "param", "type"], body)
        self.assertTrue(err["message"], body)
        self.assertEqual(err["type"], "invalid_request_error", body)
        if param is not None:
            self.assertEqual(err["param"], param, body)
        if code is not None:
            self.assertEqual(err["code"], code, body)
        return err


class TestEcho(Base):
    @classmethod
    def setUpClass(cls):
        cls.srv = Served()
        cls.model = parity.Model(MODEL, threads=2)

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        cls.model.close()

    def complete(self, **params):
        params.setdefault("model", MODEL)
        status, body = self.srv.post("/v1/completions", params)
        self.assertEqual(status, 200, body)
        return body

    def test_echo_prompt_only(self):
        """max_tokens 0 with echo: the prompts' text, tokens and Model.score's log-probs (the
        first null), n copies of each; /parity/score gives the same bits."""
        body = self.complete(prompt=PROMPTS, max_tokens=0, echo=True, logprobs=0, n=2)
        self.assertEqual(len(body["choices"]), 4)
        scored = self.model.score([p.encode() for p in PROMPTS])
        served = self.srv.post("/parity/score", {"sequences": PROMPTS})[1]["logprobs"]
        for ch in body["choices"]:
            p = ch["index"] // 2
            self.assertEqual(ch["text"], PROMPTS[p])
            self.assertEqual(ch["finish_reason"], "length")
            lp = ch["logprobs"]
            self.assertEqual(lp["tokens"], list(PROMPTS[p]))
            self.assertEqual(lp["text_offset"], list(range(len(PROMPTS[p]))))
            self.assertIsNone(lp["token_logprobs"][0])
            self.assertIsNone(lp["top_logprobs"])
            self.assertEqual(bits(lp["token_logprobs"][1:]), bits(scored[p]))
            self.assertEqual(bits(lp["token_logprobs"][1:]), bits(served[p]))
        self.assertEqual(body["usage"], {"prompt_tokens": sum(map(len, PROMPTS)),
                                         "completion_tokens": 0,
                                         "total_tokens": sum(map(len, PROMPTS))})
        # echo without logprobs: the text alone, no scoring
        body = self.complete(prompt=PROMPTS[0], max_tokens=0, echo=True)
        self.assertEqual(body["choices"][0]["text"], PROMPTS[0])
        self.assertIsNone(body["choices"][0]["logprobs"])

    def test_echo_with_completion(self):
        """echo + logprobs with a completion: the completion equals the same request without
        echo, and the whole sequence's log-probs equal Model.score of prompt + completion, in
        each logprob mode; the top alternatives of the prompt are Model.score's top_n."""
        for mode, temperature in (("raw", 1.0), ("processed", 0.7),
                                  ("processed-truncated", 0.9)):
            with self.subTest(mode=mode):
                params = dict(prompt=PROMPTS[0], max_tokens=6, seed=7, logprobs=2,
                              logprob_mode=mode, temperature=temperature, top_k=20,
                              return_token_ids=True)
                plain = self.complete(**params)["choices"][0]
                echoed = self.complete(echo=True, **params)["choices"][0]
                self.assertEqual(echoed["token_ids"], plain["token_ids"])
                self.assertEqual(echoed["text"], PROMPTS[0] + plain["text"])
                prompt = list(PROMPTS[0].encode())
                lp = echoed["logprobs"]
                n = len(prompt)
                self.assertEqual(lp["tokens"][n:], plain["logprobs"]["tokens"])
                self.assertEqual(bits(lp["token_logprobs"][n:]),
                                 bits(plain["logprobs"]["token_logprobs"]))
                self.assertEqual(lp["text_offset"], list(range(n + len(plain["token_ids"]))))
                seq = prompt + plain["token_ids"]
                ref = self.model.score(seq, mode=mode, temperature=temperature, top_k=20,
                                       top_n=2)
                self.assertIsNone(lp["token_logprobs"][0])
                self.assertEqual(bits(lp["token_logprobs"][1:]), bits(ref.logprobs))
                served = self.srv.post("/parity/score", {"sequences": [seq], "mode": mode,
                                                         "temperature": temperature,
                                                         "top_k": 20})[1]["logprobs"][0]
                self.assertEqual(bits(lp["token_logprobs"][1:]), bits(served))
                self.assertIsNone(lp["top_logprobs"][0])
                for i in range(1, n):
                    top = lp["top_logprobs"][i]
                    want = {self.srv_name(t): v for t, v in zip(ref.top_ids[i - 1],
                                                                 ref.top_logprobs[i - 1])}
                    want.setdefault(self.srv_name(seq[i]), ref.logprobs[i - 1])
                    self.assertEqual(sorted(top), sorted(want))
                    for k in top:
                        self.assertEqual(bits([top[k]]), bits([want[k]]), (i, k))

    @staticmethod
    def srv_name(t):
        return chr(t) if t < 128 else "bytes:\\x%02x" % t

    def test_prompt_logprobs(self):
        """vLLM's prompt_logprobs: null first, then {id: {logprob, rank, decoded_token}} of
        the prompt token and the k most likely, the values Model.score's."""
        body = self.complete(prompt=PROMPTS[1], max_tokens=2, seed=3, prompt_logprobs=3,
                             logprobs=1)
        pl = body["choices"][0]["prompt_logprobs"]
        seq = list(PROMPTS[1].encode())
        ref = self.model.score(seq, top_n=3)
        self.assertEqual(len(pl), len(seq))
        self.assertIsNone(pl[0])
        for i in range(1, len(seq)):
            entry = pl[i]
            top = [(str(t), v) for t, v in zip(ref.top_ids[i - 1], ref.top_logprobs[i - 1])]
            for rank, (key, v) in enumerate(top):
                self.assertEqual(entry[key]["rank"], rank + 1)
                self.assertEqual(bits([entry[key]["logprob"]]), bits([v]))
                self.assertEqual(entry[key]["decoded_token"], self.srv_name(int(key)))
            mine = entry[str(seq[i])]
            self.assertEqual(bits([mine["logprob"]]), bits([ref.logprobs[i - 1]]))
            self.assertEqual(len(entry), 3 + (str(seq[i]) not in dict(top)))
            if str(seq[i]) not in dict(top):
                self.assertIsNone(mine["rank"])
        # prompt_logprobs 0: the prompt's own tokens alone; max_tokens 0 allowed with it
        body = self.complete(prompt=PROMPTS[1], max_tokens=0, prompt_logprobs=0)
        pl = body["choices"][0]["prompt_logprobs"]
        self.assertEqual([list(e) for e in pl[1:]], [[str(t)] for t in seq[1:]])
        self.assertEqual(bits([e[str(t)]["logprob"] for e, t in zip(pl[1:], seq[1:])]),
                         bits(ref.logprobs))

    def test_bad_input(self):
        base = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4}
        post = self.srv.post
        self.assertError(*post("/v1/completions", dict(base, echo=True, stream=True)), 400,
                         "echo")
        for bad in (21, -1, "3", True):
            self.assertError(*post("/v1/completions", dict(base, prompt_logprobs=bad)), 400,
                             "prompt_logprobs")
        self.assertError(*post("/v1/completions", dict(base, max_tokens=0)), 400, "max_tokens")
        self.assertError(*post("/v1/completions", dict(base, echo="yes")), 400, "echo")
        # a byte-level model has no chat template
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        self.assertError(*post("/v1/chat/completions", chat), 400, "messages",
                         "no_chat_template")
        self.assertError(*post("/v1/chat/completions", dict(chat, bogus=1)), 400, "bogus")
        # the server still serves
        self.complete(prompt=PROMPTS[0], max_tokens=2)


class TestNoTokenizer(Base):
    """A model of 512 tokens: without tokenizer files, and with them (where this Python lacks
    the PyPI package tokenizers, the same refusals name it)."""

    def check_refusals(self, srv, model, code, mention):
        post = srv.post
        base = {"model": model, "max_tokens": 3}
        for body in (dict(base, prompt="hello"), dict(base, prompt=["a", [1, 2]]),
                     dict(base, prompt=[5, 6], stop=["x"]),
                     {"model": model, "messages": [{"role": "user", "content": "hi"}]}):
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            err = self.assertError(*post(path, body), 400, code=code)
            self.assertIn(mention, err["message"], body)
        status, ok = post("/v1/completions", dict(base, prompt=[5, 6, 7], seed=1))
        self.assertEqual(status, 200, ok)
        self.assertEqual(ok["choices"][0]["text"], "")
        status, ok = post("/v1/completions", dict(base, prompt=[5, 6, 7], max_tokens=0,
                                                   echo=True, logprobs=0))
        self.assertEqual(status, 200, ok)
        self.assertEqual(ok["choices"][0]["logprobs"]["tokens"],
                         ["token_id:5", "token_id:6", "token_id:7"])

    def test_no_tokenizer_files(self):
        with tempfile.TemporaryDirectory(prefix="parity-notok-") as d:
            for name in ("config.json", "model.safetensors"):
                shutil.copy(os.path.join(TOKENIZER_MODEL, name), d)
            srv = Served(model=d)
            try:
                self.check_refusals(srv, d, None, "tokenizer")
            finally:
                srv.close()

    def test_without_tokenizers_package(self):
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            pass
        else:
            self.skipTest("this Python has tokenizers (test_text.py covers the tokenizer)")
        srv = Served(model=TOKENIZER_MODEL)
        try:
            self.assertIn("needs the PyPI package tokenizers", srv.stderr())
            self.check_refusals(srv, TOKENIZER_MODEL, None, "pip install tokenizers")
        finally:
            srv.close()


class TestWithoutJinja(unittest.TestCase):
    def test_chat_without_jinja2(self):
        """A chat template where the server's Python cannot import jinja2: a 400 naming the
        package, not a 500."""
        import builtins
        from parity.serve import text
        real_import = builtins.__import__

        def no_jinja(name, *args, **kwargs):
            if name == "jinja2" or name.startswith("jinja2."):
                raise ImportError("No module named 'jinja2' (hidden by the test)")
            return real_import(name, *args, **kwargs)

        tok = object.__new__(text.Tokenizer)     # the chat part alone: no tokenizers needed
        tok.chat_template, tok._compiled, tok.special = "{{ messages }}", None, {}
        builtins.__import__ = no_jinja
        try:
            with self.assertRaises(text.ApiError) as caught:
                tok.render_chat([{"role": "user", "content": "hi"}], True, {})
        finally:
            builtins.__import__ = real_import
        err = caught.exception
        self.assertEqual((err.status, err.param, err.code), (400, "messages", "no_jinja2"))
        self.assertIn("pip install jinja2", err.message)


if __name__ == "__main__":
    harness.run("serve-echo")
