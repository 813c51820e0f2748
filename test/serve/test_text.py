"""parity.serve with a checkpoint's tokenizer (test/data/tokenizer-model): string prompts as
transformers tokenizes them, detokenized text and per-token offsets, stop strings cut on the
text, generation ended by the config's end-of-sequence ids, BOS as tokenizer_config says;
/v1/chat/completions rendered exactly as transformers' apply_chat_template renders (the test
model's template and one using the environment's options and globals), chat completions,
streaming, n, seeds and chat log-probs equal to Model.generate and Model.score bit for bit;
echo on text; chat's bad input; and make.py rebuilding the committed files byte for byte.

Needs the PyPI packages tokenizers, jinja2 and transformers (the conformance tier's venv):
    build/venv-conformance/bin/python test/serve/test_text.py build
Without them it exits 77 (skipped)."""
import copy
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import harness  # noqa: E402

harness.setup()
tokenizers, jinja2, transformers = harness.require(
    "the tokenizer and chat tests", ["tokenizers", "jinja2", "transformers"],
    "the conformance venv's packages (scripts/conformance.sh)")
import parity  # noqa: E402
from parity.serve import text as serve_text  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve import Served, merge_stream  # noqa: E402

MODEL = os.path.join(harness.REPO, "test", "data", "tokenizer-model")
EOS = [2, 0]        # generation_config.json: <|im_end|>, <|endoftext|>
PROMPTS = ["The sampler draws", "Bit for bit, the learner", "héllo wörld — ünïcode ✓",
           "<|im_start|>user\nhi<|im_end|>\n"]
CONVERSATIONS = [
    [{"role": "user", "content": "What does the sampler return?"}],
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": "  Policy?  "}],
    [{"role": "user", "content": "First"}, {"role": "assistant", "content": "Reply"},
     {"role": "user", "content": "Ünïcode ✓ second"}],
]
# A template that leans on what transformers' environment sets up: trim_blocks and
# lstrip_blocks (the block lines leave no whitespace), loopcontrols, namespace, tojson with
# its keyword arguments and non-ASCII text kept, the special tokens as variables, a
# {% generation %} block, dict() and a template variable from chat_template_kwargs.
RICH_TEMPLATE = """{{ bos_token }}{% set ns = namespace(count=0, last='') %}
{% for m in messages %}
    {% if m['role'] == 'system' %}
        {% continue %}
    {% endif %}
    {% set ns.count = ns.count + 1 %}
    {% if ns.count > 3 %}{% break %}{% endif %}
<{{ m['role'] }}>{{ m['content'] | tojson(indent=1, sort_keys=true) }}</{{ m['role'] }}>
    {% if m['role'] == 'assistant' %}
{% generation %}[{{ m['content'] }}]{% endgeneration %}
    {% endif %}
    {% set ns.last = m['role'] %}
{% endfor %}
{{ dict(n=ns.count, last=ns.last) | tojson }}{{ eos_token }}
{% if add_generation_prompt %}<assistant>{{ flavour | default('plain') }}{% endif %}"""


def bits(values):
    return [None if v is None else struct.pack("<f", v) for v in values]


def variant(tmp, name, config_changes=None, generation=None):
    """A copy of the test model in tmp/name with tokenizer_config.json (and
    generation_config.json) changed."""
    d = os.path.join(tmp, name)
    shutil.copytree(MODEL, d, ignore=shutil.ignore_patterns("make.py"))
    if config_changes is not None:
        path = os.path.join(d, "tokenizer_config.json")
        with open(path) as f:
            config = json.load(f)
        for key, value in config_changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        with open(path, "w") as f:
            json.dump(config, f)
    if generation is not None:
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(generation, f)
    return d


class TestText(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Served("--max-batch", "8", model=MODEL)
        cls.model = parity.Model(MODEL, threads=2)
        cls.hf = transformers.AutoTokenizer.from_pretrained(MODEL)
        cls.tmp = tempfile.mkdtemp(prefix="parity-text-test-")

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        cls.model.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def post(self, path, body, srv=None, want=200):
        body = dict(body)
        body.setdefault("model", (srv or self.srv).model)
        if body.get("stream"):
            status, raw = (srv or self.srv).request("POST", path, body)
            self.assertEqual(status, want, raw)
            return raw
        status, out = (srv or self.srv).post(path, body)
        self.assertEqual(status, want, out)
        return out

    def complete(self, **body):
        return self.post("/v1/completions", body)

    def test_make_reproducible(self):
        """make.py writes the committed files again, byte for byte."""
        if not os.path.isdir(os.path.join(harness.REPO, ".git")) and \
                not os.path.isfile(os.path.join(harness.REPO, ".git")):
            self.skipTest("not a git checkout (make.py reads its training text with git)")
        out = os.path.join(self.tmp, "remade")
        env = dict(os.environ, PYTHONPATH=os.path.join(harness.REPO, "python"))
        subprocess.run([sys.executable, os.path.join(MODEL, "make.py"), out], check=True,
                       env=env, capture_output=True)
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name), "rb") as a, \
                    open(os.path.join(MODEL, name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)

    def test_string_prompts(self):
        """String prompts (one, or a list) become transformers' token ids."""
        body = self.complete(prompt=PROMPTS, max_tokens=1, seed=1, return_token_ids=True)
        for ch in body["choices"]:
            self.assertEqual(ch["prompt_token_ids"], self.hf.encode(PROMPTS[ch["index"]]))
        body = self.complete(prompt=PROMPTS[2], max_tokens=1, seed=1, return_token_ids=True)
        self.assertEqual(body["choices"][0]["prompt_token_ids"], self.hf.encode(PROMPTS[2]))
        self.assertEqual(body["usage"]["prompt_tokens"], len(self.hf.encode(PROMPTS[2])))

    def test_add_bos_token(self):
        """add_bos_token true in tokenizer_config.json: string prompts start with the BOS."""
        d = variant(self.tmp, "bos", {"add_bos_token": True, "bos_token": "<|endoftext|>"})
        tok = serve_text.Tokenizer(d)
        self.assertEqual(tok.encode("The sampler"), [0] + self.hf.encode("The sampler"))
        self.assertEqual(tok.encode("The sampler", add_special_tokens=False),
                         self.hf.encode("The sampler"))

    def test_text_offsets_and_equality(self):
        """The text is the tokenizer's decoding of the tokens (special tokens skipped), each
        token's offset is where its text starts, and tokens and log-probs equal
        Model.generate of the same prompt ids, seed and stop ids."""
        for seed in range(4):
            body = self.complete(prompt=PROMPTS[0], max_tokens=24, seed=seed, logprobs=1,
                                 return_token_ids=True, n=2)
            ids = body["choices"][0]["prompt_token_ids"]
            ref = self.model.generate([ids], n=2, max_tokens=24, seed=seed, stop=EOS)
            for ch, c in zip(body["choices"], ref):
                self.assertEqual(ch["token_ids"], list(c.tokens))
                self.assertEqual(bits(ch["logprobs"]["token_logprobs"]), bits(c.logprobs))
                toks = ch["token_ids"]
                kept = toks[:-1] if ch["finish_reason"] == "stop" else toks
                self.assertEqual(ch["text"], self.hf.decode(kept, skip_special_tokens=True))
                offsets = ch["logprobs"]["text_offset"]
                self.assertEqual(offsets, sorted(offsets))
                for t, name, at in zip(toks, ch["logprobs"]["tokens"], offsets):
                    if not name.startswith("bytes:") and "\ufffd" not in \
                            ch["text"][at:at + len(name)] and t not in EOS:
                        self.assertEqual(ch["text"][at:at + len(name)], name, (toks, t))
            # streamed, the text comes a chunk at a time (made by the request's thread)
            streamed = merge_stream(self.post("/v1/completions", dict(
                prompt=PROMPTS[0], max_tokens=24, seed=seed, logprobs=1, return_token_ids=True,
                n=2, stream=True)))
            for got, ch in zip(streamed["choices"], body["choices"]):
                self.assertEqual((got["text"], got["token_ids"], got["finish_reason"]),
                                 (ch["text"], ch["token_ids"], ch["finish_reason"]))

    def test_stop_strings(self):
        """A stop string ends the choice where it first appears in the text (not after it
        unless include_stop_str_in_output), also when it ends inside a token; streaming
        gives the same text."""
        base = dict(prompt=PROMPTS[1], max_tokens=32, seed=11, return_token_ids=True)
        full = self.complete(**base)["choices"][0]
        text = full["text"]
        self.assertGreater(len(text), 6, full)
        stop = text[3:5]
        at = text.index(stop)
        cut = self.complete(stop=[stop, "never-there"], **base)["choices"][0]
        self.assertEqual(cut["text"], text[:at])
        self.assertEqual(cut["finish_reason"], "stop")
        self.assertEqual(cut["token_ids"], full["token_ids"][:len(cut["token_ids"])])
        kept = self.complete(stop=stop, include_stop_str_in_output=True, **base)["choices"][0]
        self.assertEqual(kept["text"], text[:at + len(stop)])
        streamed = merge_stream(self.post("/v1/completions", dict(base, stop=[stop],
                                                                  stream=True)))
        self.assertEqual(streamed["choices"][0]["text"], text[:at])
        self.assertEqual(streamed["choices"][0]["finish_reason"], "stop")
        # a stop string inside one token: the first character of a multi-character token
        names = self.complete(logprobs=0, **base)["choices"][0]["logprobs"]["tokens"]
        for k, name in enumerate(names):
            if len(name) >= 2 and not name.startswith("bytes:"):
                inner = name[1:]
                want = text[:text.index(inner)]
                got = self.complete(stop=inner, **base)["choices"][0]
                self.assertEqual(got["text"], want, (name, inner))
                break

    def test_eos_ends_generation(self):
        """The config's end-of-sequence ids end a generation (finish "stop", not in the
        text); ignore_eos goes on."""
        base = dict(prompt=PROMPTS[0], max_tokens=12, temperature=0, return_token_ids=True)
        greedy = self.complete(**base)["choices"][0]["token_ids"]
        k = next(i for i in range(2, len(greedy)) if greedy[i] not in greedy[:i])
        d = variant(self.tmp, "eos", generation={"eos_token_id": greedy[k]})
        srv = Served("--max-batch", "4", model=d)
        try:
            ch = self.post("/v1/completions", base, srv=srv)["choices"][0]
            self.assertEqual(ch["token_ids"], greedy[:k + 1])
            self.assertEqual(ch["finish_reason"], "stop")
            self.assertEqual(ch["text"], self.hf.decode(greedy[:k], skip_special_tokens=True))
            ch = self.post("/v1/completions", dict(base, ignore_eos=True), srv=srv)
            self.assertEqual(ch["choices"][0]["token_ids"], greedy)
        finally:
            srv.close()

    def test_echo_text(self):
        """echo on a tokenizer model: the prompt's decoded text and Model.score's log-probs."""
        body = self.complete(prompt=PROMPTS[2], max_tokens=3, seed=5, echo=True, logprobs=1,
                             return_token_ids=True)
        ch = body["choices"][0]
        ids = ch["prompt_token_ids"]
        prompt_text = self.hf.decode(ids, skip_special_tokens=False)
        self.assertTrue(ch["text"].startswith(prompt_text), ch["text"])
        ref = self.model.score(ids + ch["token_ids"])
        lp = ch["logprobs"]
        self.assertIsNone(lp["token_logprobs"][0])
        self.assertEqual(bits(lp["token_logprobs"][1:]), bits(ref))
        self.assertEqual(len(lp["text_offset"]), len(ids) + len(ch["token_ids"]))
        self.assertEqual(lp["text_offset"][len(ids)], len(prompt_text))

    # ---- chat ----

    def test_template_equals_transformers(self):
        """The server's rendering of conversations equals apply_chat_template's, with and
        without the generation prompt, for the model's template and a richer one."""
        rich_dir = variant(self.tmp, "rich", {"chat_template": RICH_TEMPLATE,
                                              "bos_token": "<|endoftext|>"})
        rich_hf = transformers.AutoTokenizer.from_pretrained(rich_dir)
        cases = [(MODEL, self.hf, {}), (rich_dir, rich_hf, {}),
                 (rich_dir, rich_hf, {"flavour": "spicy ✓"})]
        for directory, hf, extra in cases:
            tok = serve_text.Tokenizer(directory)
            convs = CONVERSATIONS + [CONVERSATIONS[2] * 2]
            for messages in convs:
                for gen in (True, False):
                    with self.subTest(directory=directory, messages=messages, gen=gen):
                        want = hf.apply_chat_template(copy.deepcopy(messages), tokenize=False,
                                                      add_generation_prompt=gen, **extra)
                        got = tok.render_chat(copy.deepcopy(messages), gen, extra)
                        self.assertEqual(got, want)
        # and through the server: the prompt's token ids
        for messages in CONVERSATIONS:
            body = self.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1,
                                                      "return_token_ids": True})
            want = self.hf.encode(self.hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
            self.assertEqual(body["choices"][0]["prompt_token_ids"], want)

    def test_chat_completions(self):
        """n choices with a seed equal Model.generate of the rendered prompt; the content is
        the decoded completion; logprobs (with top_logprobs) equal Model.score of prompt +
        completion bit for bit; streaming gives the same content and log-probs."""
        messages = CONVERSATIONS[1]
        base = {"messages": messages, "max_completion_tokens": 20, "n": 3, "seed": 9,
                "logprobs": True, "top_logprobs": 2, "return_token_ids": True,
                "temperature": 0.8}
        body = self.post("/v1/chat/completions", base)
        self.assertEqual(body["object"], "chat.completion")
        self.assertTrue(body["id"].startswith("chatcmpl-"))
        ids = body["choices"][0]["prompt_token_ids"]
        ref = self.model.generate([ids], n=3, max_tokens=20, seed=9, stop=EOS,
                                  temperature=0.8)
        for ch, c in zip(body["choices"], ref):
            toks = ch["token_ids"]
            self.assertEqual(toks, list(c.tokens))
            self.assertEqual(ch["message"]["role"], "assistant")
            kept = toks[:-1] if ch["finish_reason"] == "stop" else toks
            self.assertEqual(ch["message"]["content"],
                             self.hf.decode(kept, skip_special_tokens=True))
            content = ch["logprobs"]["content"]
            self.assertEqual(bits([e["logprob"] for e in content]), bits(c.logprobs))
            self.assertEqual(bits([e["logprob"] for e in content]),
                             bits(self.model.score(ids + toks)[len(ids) - 1:]))
            for e in content:
                self.assertEqual(sorted(e), ["bytes", "logprob", "token", "top_logprobs"])
                self.assertEqual(len(e["top_logprobs"]), 2)
                self.assertGreaterEqual(e["top_logprobs"][0]["logprob"],
                                        e["top_logprobs"][1]["logprob"])
            self.assertEqual(b"".join(bytes(e["bytes"]) for e in content[:len(kept)])
                             .decode("utf-8", "replace"), ch["message"]["content"])
        raw = self.post("/v1/chat/completions", dict(base, stream=True))
        events = [json.loads(e[6:]) for e in raw.decode().split("\n\n")
                  if e.strip() and e != "data: [DONE]"]
        content, lps, first = {}, {}, {}
        for ev in events:
            self.assertEqual(ev["object"], "chat.completion.chunk")
            for ch in ev["choices"]:
                i = ch["index"]
                if i not in first:
                    first[i] = ch["delta"]
                content[i] = content.get(i, "") + ch["delta"].get("content", "")
                if ch["logprobs"]:
                    lps.setdefault(i, []).extend(e["logprob"] for e in ch["logprobs"]["content"])
        for ch in body["choices"]:
            i = ch["index"]
            self.assertEqual(first[i].get("role"), "assistant")
            self.assertEqual(content[i], ch["message"]["content"])
            self.assertEqual(bits(lps[i]), bits([e["logprob"] for e in ch["logprobs"]["content"]]))

    def test_chat_bad_input(self):
        post = self.srv.post
        good = {"model": MODEL, "messages": CONVERSATIONS[0], "max_tokens": 2}
        bad_cases = [
            ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
            ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
            ({"messages": [{"role": "user", "content": 5}]}, "messages"),
            ({"messages": [{"role": "user"}]}, "messages"),
            ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                         "image_url": "x"}]}]}, "messages"),
            ({"messages": [{"role": "user", "content": "x", "bogus": 1}]}, "messages"),
            ({"messages": ["user: hi"]}, "messages"),
            ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21},
                                                    "top_logprobs"),
            ({"tools": [{"type": "function"}]}, "tools"), ({"echo": True}, "echo"),
            ({"prompt": "x"}, "prompt"), ({"n": 0}, "n"),
            ({"response_format": {"type": "json_object"}}, "response_format"),
            ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
            # the template itself refuses a role it does not know
            ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ]
        for change, param in bad_cases:
            with self.subTest(change=change):
                status, body = post("/v1/chat/completions", dict(good, **change))
                self.assertEqual(status, 400, body)
                self.assertEqual(body["error"]["param"], param, body)
                self.assertEqual(body["error"]["type"], "invalid_request_error")
        # text parts are joined; the same as the string
        a = self.post("/v1/chat/completions", dict(good, seed=1, return_token_ids=True,
                                                   messages=[{"role": "user", "content": [
                                                       {"type": "text", "text": "a"},
                                                       {"type": "text", "text": "b"}]}]))
        b = self.post("/v1/chat/completions", dict(good, seed=1, return_token_ids=True,
                                                   messages=[{"role": "user",
                                                              "content": "a\nb"}]))
        self.assertEqual(a["choices"][0]["prompt_token_ids"],
                         b["choices"][0]["prompt_token_ids"])
        # a model without a chat template
        d = variant(self.tmp, "notemplate", {"chat_template": None})
        srv = Served("--max-batch", "4", model=d)
        try:
            status, body = srv.post("/v1/chat/completions", dict(good, model=d))
            self.assertEqual(status, 400, body)
            self.assertEqual(body["error"]["code"], "no_chat_template")
            status, body = srv.post("/v1/completions", {"model": d, "prompt": "hi",
                                                        "max_tokens": 2})
            self.assertEqual(status, 200, body)
        finally:
            srv.close()
        # the server goes on
        self.post("/v1/chat/completions", good)


if __name__ == "__main__":
    harness.run("serve-text")
