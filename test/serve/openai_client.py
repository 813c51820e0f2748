"""parity.serve driven by PyPI's official `openai` Python client. Run by test_openai.py with the
Python of the virtual environment that holds the client:

    VENV/bin/python openai_client.py BASE_URL MODEL [TEXT_BASE_URL TEXT_MODEL_DIR]

(BASE_URL like http://127.0.0.1:PORT/v1) for the byte-level model MODEL. With TEXT_BASE_URL, a
second server on TEXT_MODEL_DIR, a model with a tokenizer (tokenizer.json, a chat template) that
it serves under the name "text-model": completions with a text prompt, echo (the prompt's
log-probs, as lm-evaluation-harness asks for them), chat completions, and streaming of both,
each response checked against parity.Model on that directory in this process (the same tokens,
log-prob bits and finish reasons; the text the tokenizer decodes), which needs PARITY_LIBRARY,
the repository's python/ on PYTHONPATH and `tokenizers`.
Prints the client's version, one line per check, "ok NAME" or "FAIL NAME: why", then
"openai-client: N passed, N failed"; exits 1 on a failure. Only the `openai` package, the
standard library (and for the text model, parity and `tokenizers`) are used.
"""
import json
import os
import struct
import sys
import traceback

import openai

if len(sys.argv) not in (3, 5):
    sys.exit("usage: python openai_client.py BASE_URL MODEL [TEXT_BASE_URL TEXT_MODEL_DIR]")
BASE_URL, MODEL = sys.argv[1], sys.argv[2]
TEXT_BASE_URL, TEXT_MODEL_DIR = sys.argv[3:5] if len(sys.argv) == 5 else (None, None)

# Every request body the client sends, to see what it forwards (an httpx event hook on the
# client's own default HTTP client class, so the client's settings are otherwise its own).
sent = []


def record(request):
    sent.append({"url": str(request.url), "body": request.content.decode("utf-8", "replace")
                 if request.content else None})


client = openai.OpenAI(base_url=BASE_URL, api_key="parity-test", max_retries=0, timeout=60.0,
                       http_client=openai.DefaultHttpxClient(event_hooks={"request": [record]}))

PROMPT = "import os\nimport sys\n\n\ndef main(argv=None):\n"
PROMPT_IDS = list(PROMPT.encode("utf-8"))


def fround(x):
    """x rounded to the nearest float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_eq(a, b, msg):
    if a != b:
        raise AssertionError("%s: %s != %s" % (msg, json.dumps(a)[:300], json.dumps(b)[:300]))


def f32eq(a, b, msg):
    """Equal as float32 bits: the server writes float32 values; each must read back as one."""
    assert len(a) == len(b), "%s: lengths %d != %d" % (msg, len(a), len(b))
    for k, (x, y) in enumerate(zip(a, b)):
        assert isinstance(x, float) and fround(x) == x, "%s: %r is not a float32 value" % (msg, x)
        assert struct.pack("<f", x) == struct.pack("<f", y), "%s[%d]: %r != %r" % (msg, k, x, y)


def token_name(b):
    return chr(b) if b < 128 else "bytes:\\x%02x" % b


def extra(obj, name):
    """A response field the OpenAI schema does not have (the client keeps unknown fields)."""
    d = obj.model_dump()
    assert name in d, "no field %r in %s" % (name, json.dumps(d)[:300])
    return d[name]


results = {"passed": 0, "failed": 0}


def check(name):
    def run(fn):
        try:
            fn()
            results["passed"] += 1
            print("ok " + name, flush=True)
        except Exception:
            results["failed"] += 1
            print("FAIL %s: %s" % (name, traceback.format_exc()), flush=True)
        return fn
    return run


def expect_error(status, params, extra_fields=None, cls=None):
    """A request expected to fail: the client raises openai.APIStatusError with `status`, its
    message, type and the given fields (code, param) from the server's error object."""
    try:
        client.completions.create(**params)
    except openai.APIConnectionError as e:
        raise AssertionError("a connection error, not an answer: %r" % e)
    except openai.APIStatusError as e:
        assert e.status_code == status, "status %d, expected %d: %s" % (e.status_code, status, e)
        assert isinstance(e.body, dict) and isinstance(e.body.get("message"), str) \
            and e.body["message"], "no error.message in %r" % (e.body,)
        assert isinstance(e.type, str), "no error.type: %r" % (e.body,)
        for k, v in (extra_fields or {}).items():
            assert getattr(e, k) == v, "error.%s is %r, expected %r" % (k, getattr(e, k), v)
        if cls is not None:
            assert isinstance(e, cls), "%s is not a %s" % (type(e).__name__, cls.__name__)
        return e
    raise AssertionError("no error for %s" % json.dumps(params)[:200])


BASE = dict(model=MODEL, prompt=PROMPT, max_tokens=16, n=2, seed=1234, logprobs=2)
IDS = {"return_token_ids": True}
state = {"ref": None, "max_model_len": 4096}
print("openai client %s" % openai.__version__, flush=True)


@check("models.list")
def _():
    page = client.models.list()
    ids = [m.id for m in page.data]
    check_eq(ids, [MODEL], "served ids")
    m = page.data[0]
    assert m.object == "model", "object %r" % m.object
    assert isinstance(m.created, int), "created"
    assert m.owned_by == "libparity", "owned_by %r" % m.owned_by
    mml = extra(m, "max_model_len")
    assert isinstance(mml, int) and mml > 1, "max_model_len %r" % mml
    state["max_model_len"] = mml


def check_shape(r, n_choices, max_tokens, logprobs):
    assert r.id.startswith("cmpl-"), "id %r" % r.id
    assert r.object == "text_completion", "object %r" % r.object
    assert isinstance(r.created, int), "created"
    assert r.model == MODEL, "model %r" % r.model
    wv = extra(r, "weight_version")
    assert isinstance(wv, int), "weight_version %r" % wv
    assert r.system_fingerprint == "parity-w%d" % wv, "system_fingerprint %r" % r.system_fingerprint
    assert isinstance(extra(r, "seed"), int), "seed"
    check_eq([c.index for c in r.choices], list(range(n_choices)), "choice indices")
    total = 0
    for c in r.choices:
        assert isinstance(c.text, str), "text"
        assert c.finish_reason in ("stop", "length"), "finish_reason %r" % c.finish_reason
        lp = c.logprobs
        assert lp is not None and isinstance(lp.tokens, list), "logprobs.tokens"
        n = len(lp.tokens)
        assert len(lp.token_logprobs) == n, "token_logprobs length"
        assert len(lp.text_offset) == n, "text_offset length"
        assert len(lp.top_logprobs) == n, "top_logprobs length"
        for k in range(n):
            x = lp.token_logprobs[k]
            assert isinstance(x, float) and x <= 0 and fround(x) == x, \
                "token_logprobs[%d] %r" % (k, x)
            top = lp.top_logprobs[k]
            assert logprobs <= len(top) <= logprobs + 1, "top_logprobs[%d] has %d" % (k, len(top))
            assert lp.tokens[k] in top, "drawn token %r not in top_logprobs[%d]" % (lp.tokens[k], k)
            assert top[lp.tokens[k]] == x, "top_logprobs[%d] of the drawn token %r != %r" % (
                k, top[lp.tokens[k]], x)
        check_eq(lp.text_offset, list(range(n)), "text_offset (one byte per token)")
        if c.finish_reason == "length":
            assert n == max_tokens, "%d tokens with finish_reason length" % n
        else:
            assert n <= max_tokens, "%d tokens > max_tokens" % n
        total += n
    u = r.usage
    assert u.prompt_tokens == len(PROMPT_IDS), "usage.prompt_tokens %r" % u.prompt_tokens
    assert u.completion_tokens == total, "usage.completion_tokens %r != %d" % (
        u.completion_tokens, total)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, "usage.total_tokens"


@check("completions.create shape (n=2, seed, logprobs=2)")
def _():
    ref = client.completions.create(**BASE, extra_body=IDS)
    state["ref"] = ref
    check_shape(ref, 2, 16, 2)
    assert extra(ref, "seed") == 1234, "seed %r" % extra(ref, "seed")
    for c in ref.choices:
        check_eq(extra(c, "prompt_token_ids"), PROMPT_IDS, "prompt_token_ids")
        ids = extra(c, "token_ids")
        check_eq(c.logprobs.tokens, [token_name(b) for b in ids], "token strings from token_ids")
        check_eq(c.text, bytes(ids).decode("utf-8", "replace"), "text from token_ids")


@check("same request twice: same tokens, same log-prob bits")
def _():
    ref = state["ref"]
    again = client.completions.create(**BASE, extra_body=IDS)
    for i in range(2):
        a, r = again.choices[i], ref.choices[i]
        check_eq(extra(a, "token_ids"), extra(r, "token_ids"), "choice %d token_ids" % i)
        check_eq(a.text, r.text, "choice %d text" % i)
        f32eq(a.logprobs.token_logprobs, r.logprobs.token_logprobs, "choice %d token_logprobs" % i)
        check_eq(a.logprobs.top_logprobs, r.logprobs.top_logprobs, "choice %d top_logprobs" % i)
    plain = client.completions.create(**BASE)
    assert "token_ids" not in plain.choices[0].model_dump(), "token_ids without return_token_ids"
    check_eq([c.text for c in plain.choices], [c.text for c in ref.choices],
             "texts without return_token_ids")


def collect_completion_stream(stream, model, n):
    """A streamed completions response put back together: per choice {"text", "lp" (the
    token_logprobs), "tokens", "finish"}, the usage chunk's usage (or None) and the number of
    chunks. Checks each chunk's object, model and id, and that no chunk of a choice follows its
    finish_reason nor any choice chunk the usage chunk."""
    acc = [{"text": "", "lp": [], "tokens": [], "finish": None} for _ in range(n)]
    usage, count, sid = None, 0, None
    for chunk in stream:
        count += 1
        assert chunk.object == "text_completion", "chunk object %r" % chunk.object
        assert chunk.model == model, "chunk model %r" % chunk.model
        sid = sid or chunk.id
        assert chunk.id == sid and sid.startswith("cmpl-"), "chunk id %r" % chunk.id
        if not chunk.choices:
            assert chunk.usage is not None, "a chunk without choices nor usage"
            usage = chunk.usage
            continue
        assert usage is None, "a choice chunk after the usage chunk"
        for c in chunk.choices:
            assert 0 <= c.index < n, "chunk for choice %d" % c.index
            a = acc[c.index]
            assert a["finish"] is None, "choice %d: a chunk after its finish_reason" % c.index
            a["text"] += c.text
            if c.logprobs is not None:
                a["lp"] += c.logprobs.token_logprobs
                a["tokens"] += c.logprobs.tokens
            a["finish"] = c.finish_reason
    return acc, usage, count


def check_stream_equals(acc, usage, ref):
    """What collect_completion_stream put together equals the non-streamed response ref."""
    check_eq(len(acc), len(ref.choices), "streamed choices")
    for i, (r, a) in enumerate(zip(ref.choices, acc)):
        check_eq(a["text"], r.text, "choice %d streamed text" % i)
        assert a["finish"] == r.finish_reason, "choice %d last finish_reason %r != %r" % (
            i, a["finish"], r.finish_reason)
        check_eq(a["tokens"], r.logprobs.tokens, "choice %d streamed tokens" % i)
        f32eq(a["lp"], r.logprobs.token_logprobs, "choice %d streamed token_logprobs" % i)
    check_eq(usage.model_dump(exclude_none=True), ref.usage.model_dump(exclude_none=True),
             "streamed usage")


@check("streaming equals non-streaming for the same seed")
def _():
    ref = state["ref"]
    stream = client.completions.create(**BASE, stream=True,
                                       stream_options={"include_usage": True})
    acc, usage, count = collect_completion_stream(stream, MODEL, 2)
    # At least one chunk of text and the usage chunk; how many carry the text depends on how the
    # engine's steps fall against the handler's wake-ups (a chunk carries all drawn since the last).
    assert count >= 2 and usage is not None, "%d chunks, usage %r" % (count, usage)
    check_stream_equals(acc, usage, ref)


@check("streaming without logprobs or usage")
def _():
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, seed=5,
                                       stream=True)
    text, finish = "", None
    for chunk in stream:
        assert chunk.choices, "a chunk without choices (no include_usage)"
        for c in chunk.choices:
            assert c.index == 0, "index %d" % c.index
            text += c.text
            finish = c.finish_reason or finish
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, seed=5)
    check_eq(text, r.choices[0].text, "streamed text")
    assert finish == r.choices[0].finish_reason, "finish_reason %r" % finish
    assert r.choices[0].logprobs is None, "logprobs without being asked"


@check("token-id prompt equals the string prompt")
def _():
    a = client.completions.create(model=MODEL, prompt=PROMPT_IDS, max_tokens=12, seed=99,
                                  logprobs=0, extra_body=IDS)
    b = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, seed=99,
                                  logprobs=0, extra_body=IDS)
    check_eq(extra(a.choices[0], "token_ids"), extra(b.choices[0], "token_ids"), "token_ids")
    check_eq(extra(a.choices[0], "prompt_token_ids"), PROMPT_IDS, "prompt_token_ids")
    f32eq(a.choices[0].logprobs.token_logprobs, b.choices[0].logprobs.token_logprobs,
          "token_logprobs")
    assert a.choices[0].logprobs.top_logprobs is None, "top_logprobs with logprobs=0"
    assert a.usage.prompt_tokens == len(PROMPT_IDS), "usage.prompt_tokens"
    two = client.completions.create(model=MODEL, prompt=[PROMPT_IDS, PROMPT_IDS[:10]],
                                    max_tokens=4, seed=99, extra_body=IDS)
    check_eq([c.index for c in two.choices], [0, 1], "indices for two prompts")
    check_eq(extra(two.choices[1], "prompt_token_ids"), PROMPT_IDS[:10], "second prompt")
    # Each prompt's completion is what that prompt alone gives with the same seed.
    for i, p in ((0, PROMPT_IDS), (1, PROMPT_IDS[:10])):
        one = client.completions.create(model=MODEL, prompt=p, max_tokens=4, seed=99,
                                        extra_body=IDS)
        check_eq(extra(two.choices[i], "token_ids"), extra(one.choices[0], "token_ids"),
                 "prompt %d of two" % i)


@check("seed drawn by the server is returned and replays")
def _():
    a = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, extra_body=IDS)
    seed = extra(a, "seed")
    assert isinstance(seed, int), "seed %r" % seed
    # Python's JSON keeps every 64-bit seed exact, so every drawn seed replays.
    b = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, seed=seed,
                                  extra_body=IDS)
    check_eq(extra(b.choices[0], "token_ids"), extra(a.choices[0], "token_ids"),
             "replayed token_ids")


@check("negative temperature: 400")
def _():
    e = expect_error(400, dict(BASE, temperature=-1), cls=openai.BadRequestError)
    assert e.type == "invalid_request_error", "type %r" % e.type


@check("unknown model: 404 model_not_found")
def _():
    expect_error(404, dict(BASE, model="no-such-model"), {"code": "model_not_found"},
                 cls=openai.NotFoundError)


@check("unknown field (forwarded by the client): 400")
def _():
    before = len(sent)
    expect_error(400, dict(BASE, extra_body={"bogus_field": 1}))
    bodies = [json.loads(s["body"]) for s in sent[before:]]
    assert len(bodies) == 1 and bodies[0].get("bogus_field") == 1, \
        "the client did not send bogus_field: %r" % bodies


@check("prompt longer than the model: 413 (param prompt)")
def _():
    expect_error(413, dict(model=MODEL, prompt="a" * state["max_model_len"], max_tokens=1),
                 {"param": "prompt"})


@check("other range errors: 400")
def _():
    expect_error(400, dict(BASE, n=9))  # > --max-batch 8
    expect_error(400, dict(BASE, max_tokens=0))
    expect_error(400, dict(BASE, logprobs=21))
    expect_error(400, dict(BASE, prompt=[len(PROMPT_IDS), 300]))  # id out of range
    expect_error(400, dict(model=MODEL, prompt="a" * (state["max_model_len"] - 4), max_tokens=16))


@check("server still answers after the errors")
def _():
    r = client.completions.create(**BASE, extra_body=IDS)
    check_eq([extra(c, "token_ids") for c in r.choices],
             [extra(c, "token_ids") for c in state["ref"].choices], "token_ids")


# ---- the text model (TEXT_BASE_URL): a tokenizer and a chat template ---------------------

TEXT_NAME = "text-model"
TEXT_PROMPT = "The rollout server answers"
CHAT_USER = "What does the sampler return?"
# What the model's chat template (test/data/tokenizer-model/make.py) makes of one user message
# with the generation prompt: its default system message first, each message in
# <|im_start|>ROLE ... <|im_end|>, then the assistant's turn opened.
CHAT_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
               + CHAT_USER + "<|im_end|>\n<|im_start|>assistant\n")


class Direct:
    """The text model through parity.Model and its tokenizer, without the server."""

    def __init__(self, directory):
        import parity
        from tokenizers import Tokenizer
        self.model = parity.Model(directory)
        self.tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        with open(os.path.join(directory, "generation_config.json"), encoding="utf-8") as f:
            eos = json.load(f)["eos_token_id"]
        self.eos = [eos] if isinstance(eos, int) else list(eos)   # generation ends at these

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def generate(self, ids, n, max_tokens, seed):
        """Model.generate as the server samples by default: temperature 1, raw log-probs,
        completion i on random stream i, stopping at the end-of-sequence ids."""
        return self.model.generate(ids, n=n, max_tokens=max_tokens, seed=seed, stop=self.eos)

    def text(self, tokens):
        return self.tok.decode(tokens, skip_special_tokens=True)

    def top2(self, ids, tokens):
        """Model.score's two most likely log-probs at each completion position."""
        scores = self.model.score(ids + tokens, top_n=2)
        return scores.logprobs[len(ids) - 1:], scores.top_logprobs[len(ids) - 1:]


def check_against_model(direct, ids, tokens, logprobs, top_values, finish, text, got):
    """One choice (token ids, log-probs, each position's alternatives' values, finish reason,
    text) against the completion parity.Model drew for the same prompt ids, stream and
    parameters, and against Model.score of prompt + completion (the learner's log-probs)."""
    check_eq(tokens, got.tokens, "token_ids")
    f32eq(logprobs, got.logprobs, "log-probs against Model.generate")
    learner, tops = direct.top2(ids, got.tokens)
    f32eq(logprobs, learner, "log-probs against Model.score")
    for k, values in enumerate(top_values):
        f32eq(sorted(values, reverse=True)[:2], tops[k], "position %d: the two most likely" % k)
    check_eq(finish, "length" if got.finish_reason == "capacity" else got.finish_reason,
             "finish_reason")
    check_eq(text, direct.text(got.tokens), "text decoded from the tokens")


if TEXT_BASE_URL is not None:
    tclient = openai.OpenAI(base_url=TEXT_BASE_URL, api_key="parity-test", max_retries=0,
                            timeout=60.0)
    direct = Direct(TEXT_MODEL_DIR)
    TEXT_BASE = dict(model=TEXT_NAME, prompt=TEXT_PROMPT, max_tokens=16, n=2, seed=4321,
                     logprobs=2)
    CHAT_BASE = dict(model=TEXT_NAME, messages=[{"role": "user", "content": CHAT_USER}],
                     max_tokens=16, n=2, seed=777, logprobs=True, top_logprobs=2)

    @check("text model: completions.create with a text prompt equals parity.Model")
    def _():
        r = tclient.completions.create(**TEXT_BASE, extra_body=IDS)
        state["text_ref"] = r
        ids = direct.encode(TEXT_PROMPT)
        assert len(ids) < len(TEXT_PROMPT.encode()), "the prompt is not tokenized: %r" % ids
        check_eq(r.usage.prompt_tokens, len(ids), "usage.prompt_tokens")
        check_eq([c.index for c in r.choices], [0, 1], "choice indices")
        for c, got in zip(r.choices, direct.generate(ids, 2, 16, 4321)):
            check_eq(extra(c, "prompt_token_ids"), ids, "prompt_token_ids")
            lp = c.logprobs
            check_eq(len(lp.tokens), len(lp.token_logprobs), "logprobs.tokens")
            check_against_model(direct, ids, extra(c, "token_ids"), lp.token_logprobs,
                                [list(top.values()) for top in lp.top_logprobs],
                                c.finish_reason, c.text, got)

    @check("text model: streamed completions equal the non-streamed ones")
    def _():
        ref = state["text_ref"]
        stream = tclient.completions.create(**TEXT_BASE, stream=True,
                                            stream_options={"include_usage": True})
        acc, usage, _ = collect_completion_stream(stream, TEXT_NAME, 2)
        assert usage is not None, "no usage chunk"
        check_stream_equals(acc, usage, ref)

    @check("text model: echo gives Model.score's prompt log-probs")
    def _():
        # lm-evaluation-harness's loglikelihood request: echo, logprobs 1, one greedy token
        r = tclient.completions.create(model=TEXT_NAME, prompt=TEXT_PROMPT, echo=True,
                                       logprobs=1, max_tokens=1, temperature=0)
        ids = direct.encode(TEXT_PROMPT)
        (c,) = r.choices
        assert c.text.startswith(TEXT_PROMPT), "echoed text %r" % c.text
        lp = c.logprobs
        check_eq(len(lp.token_logprobs), len(ids) + 1, "prompt and completion log-probs")
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, \
            "the first prompt token has a log-prob: %r" % lp.token_logprobs[0]
        check_eq(lp.text_offset[:len(ids)], sorted(lp.text_offset[:len(ids)]),
                 "prompt text offsets in order")
        check_eq(lp.text_offset[0], 0, "the first prompt token's offset")
        scores = direct.model.score(ids, top_n=1)
        f32eq(lp.token_logprobs[1:len(ids)], scores.logprobs, "prompt log-probs")
        for k, top in enumerate(lp.top_logprobs[1:len(ids)]):
            f32eq([max(top.values())], scores.top_logprobs[k], "position %d: the most likely" % k)
        # the completion's token: the greedy one after the prompt
        (got,) = direct.model.generate(ids, max_tokens=1, temperature=0.0, stop=direct.eos)
        f32eq(lp.token_logprobs[len(ids):], got.logprobs, "the completion's log-prob")

    @check("text model: chat.completions.create equals parity.Model")
    def _():
        r = tclient.chat.completions.create(**CHAT_BASE, extra_body=IDS)
        state["chat_ref"] = r
        assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), \
            "object %r, id %r" % (r.object, r.id)
        ids = direct.encode(CHAT_PROMPT)
        check_eq(r.usage.prompt_tokens, len(ids), "usage.prompt_tokens")
        check_eq([c.index for c in r.choices], [0, 1], "choice indices")
        for c, got in zip(r.choices, direct.generate(ids, 2, 16, 777)):
            check_eq(extra(c, "prompt_token_ids"), ids, "prompt_token_ids (the template's)")
            assert c.message.role == "assistant", "role %r" % c.message.role
            content = c.logprobs.content
            for e in content:
                assert len(e.top_logprobs) == 2, "%d top_logprobs" % len(e.top_logprobs)
                assert isinstance(e.bytes, list), "bytes %r" % e.bytes
            check_against_model(direct, ids, extra(c, "token_ids"), [e.logprob for e in content],
                                [[t.logprob for t in e.top_logprobs] for e in content],
                                c.finish_reason, c.message.content, got)

    @check("text model: streamed chat equals the non-streamed chat")
    def _():
        ref = state["chat_ref"]
        acc = [{"text": "", "lp": [], "tokens": [], "finish": None, "role": None}
               for _ in range(2)]
        usage = None
        for chunk in tclient.chat.completions.create(**CHAT_BASE, stream=True,
                                                     stream_options={"include_usage": True}):
            assert chunk.object == "chat.completion.chunk", "object %r" % chunk.object
            if not chunk.choices:
                usage = chunk.usage
                continue
            for c in chunk.choices:
                a = acc[c.index]
                assert a["finish"] is None, "choice %d: a chunk after its finish" % c.index
                if c.delta.role is not None:
                    assert a["role"] is None and not a["tokens"], "role not in the first delta"
                    a["role"] = c.delta.role
                a["text"] += c.delta.content or ""
                if c.logprobs is not None:
                    a["lp"] += [e.logprob for e in c.logprobs.content]
                    a["tokens"] += [e.token for e in c.logprobs.content]
                a["finish"] = c.finish_reason
        assert usage is not None, "no usage chunk"
        check_eq(usage.model_dump(exclude_none=True), ref.usage.model_dump(exclude_none=True),
                 "streamed usage")
        for i in range(2):
            r, a = ref.choices[i], acc[i]
            check_eq(a["role"], "assistant", "choice %d role" % i)
            check_eq(a["text"], r.message.content, "choice %d streamed content" % i)
            check_eq(a["tokens"], [e.token for e in r.logprobs.content],
                     "choice %d streamed tokens" % i)
            f32eq(a["lp"], [e.logprob for e in r.logprobs.content],
                  "choice %d streamed log-probs" % i)
            check_eq(a["finish"], r.finish_reason, "choice %d finish_reason" % i)

print("openai-client: %d passed, %d failed" % (results["passed"], results["failed"]), flush=True)
sys.exit(1 if results["failed"] else 0)
