"""What parity.serve accepts and answers: the limits, errors in OpenAI's shape (ApiError), the
checks of a request's fields, a /v1/completions request and its choices as parsed (a
/v1/chat/completions request as the completions request it becomes), the text a choice's
tokens make, and the files a weight update names (safetensors bodies, manifests)."""
import codecs
import collections
import json
import math
import secrets
import threading
import time

from .. import _lib, _safetensors
from ..sampler import sampling_struct

MAX_LOGPROBS = 20          # alternatives per token, as vLLM's default max_logprobs
MAX_STOP = 16              # stop strings per request
LOGPROB_MODES = ("raw", "processed", "processed-truncated")
BYTE_VOCAB = 256


class ApiError(Exception):
    """An error answered in OpenAI's shape with an HTTP status."""

    TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
             408: "invalid_request_error", 409: "invalid_request_error",
             411: "invalid_request_error", 413: "invalid_request_error",
             501: "invalid_request_error"}

    def __init__(self, status, message, param=None, code=None, extra=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.extra = extra or {}

    def body(self):
        err = {"message": self.message, "type": self.TYPES.get(self.status, "server_error"),
               "param": self.param, "code": self.code}
        err.update(self.extra)
        return {"error": err}


def _parity_error(e, param=None):
    """The HTTP status and message of a library error met while serving a request."""
    status = {_lib.ERR_TOKEN_RANGE: 400, _lib.ERR_EMPTY_INPUT: 400, _lib.ERR_TOO_LONG: 413,
              _lib.ERR_INVALID_ARGUMENT: 400, _lib.ERR_CACHE_FULL: 503}.get(e.code, 500)
    return ApiError(status, str(e), param, e.status.lower())


# ---- request parsing ---------------------------------------------------------------------

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body, name, default, lo=None, hi=None, lo_open=False):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(400, "%s must be a number, not %s" % (name, json.dumps(v)[:100]), name)
    try:
        v = float(v)
    except OverflowError:
        raise ApiError(400, "%s is out of range" % name, name) from None
    if v != v or (lo is not None and (v < lo or (lo_open and v == lo))) or \
            (hi is not None and v > hi):
        raise ApiError(400, "%s = %r is out of range (%s%s, %s]" % (
            name, v, "(" if lo_open else "[", lo, hi), name)
    return v


def _integer(body, name, default, lo, hi):
    v = body.get(name, default)
    if v is None:
        return default
    if not _is_int(v):
        raise ApiError(400, "%s must be an integer, not %s" % (name, json.dumps(v)[:100]), name)
    if not lo <= v <= hi:
        raise ApiError(400, "%s = %d is out of range [%d, %d]" % (name, v, lo, hi), name)
    return v


def _boolean(body, name, default=False):
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, "%s must be true or false, not %s" % (name, json.dumps(v)[:100]),
                       name)
    return v


def _utf8(text, param):
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, "%s: not encodable as UTF-8 (%s)" % (param, e.reason), param) from None


def _finite(v):
    """A float for JSON: non-finite values (a -inf log-prob outside a truncated support) as
    null, since JSON has no infinity."""
    return v if math.isfinite(v) else None


class Completion:
    """One choice of a completions request: a sequence of the sampler and what it drew."""

    __slots__ = ("index", "prompt", "seq", "tokens", "logprobs", "tops", "finish_reason",
                 "text", "text_end", "sent_tokens", "sent_text", "decoder", "routes", "detok",
                 "lazy", "eos_end", "settled")

    def __init__(self, index, prompt):
        self.index, self.prompt, self.seq = index, prompt, None
        self.tokens, self.logprobs, self.tops = [], [], []
        self.finish_reason = None
        self.text = bytearray()     # the completion's bytes (byte-level models)
        self.text_end = None        # where the text ends when a stop string or token ended it
        self.sent_tokens = 0        # streaming: tokens and text bytes already sent
        self.sent_text = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.routes = None          # return_routed_experts: the sampler's record, once finished
        self.detok = None           # models with a tokenizer: the text (a text.Detokenizer)
        # A tokenizer's text without stop strings is made by the request's own thread, not the
        # engine's (catch_up): the engine only appends tokens, and marks with eos_end that the
        # last one is an end token the text leaves out; settled once the text is final.
        self.lazy = False
        self.eos_end = False
        self.settled = False

    def catch_up(self, n, reason, eos_end):
        """A lazy choice: detokenizes its tokens up to the n-th (n, reason and eos_end read
        together under the request's wake; the engine only appends to the token list, so
        its first n entries are as read), and at the end its last bytes, as the engine's
        take() does for a choice that is not lazy. Only the request's thread calls it."""
        if not self.lazy or self.settled:
            return
        d = self.detok
        for t in self.tokens[len(d.ids):n - 1 if eos_end else n]:
            d.add(t)
        if reason is not None:
            if eos_end:
                d.finish()
                d.offsets.append(len(d.text))
                self.text_end = len(d.text)
            elif reason != "abort":
                d.finish()
            self.settled = True

    def text_so_far(self):
        """The choice's text: bytes of a byte-level model, str with a tokenizer."""
        return self.detok.text if self.detok is not None else self.text


class Request:
    """A parsed /v1/completions request and its state in the engine."""

    def __init__(self, server, body, chat=False):
        self.server = server
        self.chat = chat            # a /v1/chat/completions request (its body translated)
        known = server.CHAT_FIELDS if chat else server.COMPLETION_FIELDS
        for key in body:
            if key not in known:
                raise ApiError(400, "Unrecognized request argument supplied: %s" % key, key,
                               "unknown_parameter")
        model = body.get("model")
        if not isinstance(model, str):
            raise ApiError(400, "model is required (a string: %s)" % json.dumps(server.name),
                           "model")
        if model != server.name:
            raise ApiError(404, "The model `%s` does not exist; this server serves %s"
                           % (model, json.dumps(server.name)), "model", "model_not_found")
        self.prompts = server.prompts(body.get("prompt"), "prompt")
        self.n = _integer(body, "n", 1, 1, 2 ** 31)
        self.echo = _boolean(body, "echo")
        self.prompt_logprobs = _integer(body, "prompt_logprobs", None, 0, MAX_LOGPROBS)
        # max_tokens 0: the prompt alone, scored (echo or prompt_logprobs)
        scored_only = self.echo or self.prompt_logprobs is not None
        self.max_tokens = _integer(body, "max_tokens", 16, 0 if scored_only else 1, 2 ** 31)
        self.temperature = _number(body, "temperature", 1.0, 0.0, 1e6)
        self.top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
        top_k = _integer(body, "top_k", -1, -1, 2 ** 31)
        self.top_k = None if top_k <= 0 else top_k
        self.min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
        seed = body.get("seed")
        self.seed = secrets.randbits(63) if seed is None else _integer(body, "seed", 0, 0,
                                                                        2 ** 64 - 1)
        self.logprobs = _integer(body, "logprobs", None, 0, MAX_LOGPROBS)
        self.stream = _boolean(body, "stream")
        if self.stream and scored_only:
            raise ApiError(400, "echo and prompt_logprobs are not supported with stream: true",
                           "echo" if self.echo else "prompt_logprobs")
        self.skip_special = _boolean(body, "skip_special_tokens", True)
        opts = body.get("stream_options")
        self.include_usage = False
        if opts is not None:
            if not isinstance(opts, dict) or any(k != "include_usage" for k in opts):
                raise ApiError(400, "stream_options takes {\"include_usage\": bool}",
                               "stream_options")
            if not self.stream:
                raise ApiError(400, "stream_options is only allowed with stream: true",
                               "stream_options")
            self.include_usage = _boolean(opts, "include_usage")
        self.return_token_ids = _boolean(body, "return_token_ids")
        self.token_id_names = _boolean(body, "return_tokens_as_token_ids")
        self.include_stop = _boolean(body, "include_stop_str_in_output")
        # vLLM's routed_experts: [prompt + completion - 1 positions][sparse layers][k]
        self.return_routed_experts = _boolean(body, "return_routed_experts")
        if self.return_routed_experts and not server.record_routes:
            raise ApiError(400, "return_routed_experts needs a server started with "
                           "--enable-return-routed-experts (a mixture-of-experts model)",
                           "return_routed_experts")
        mode = body.get("logprob_mode", "raw")
        if mode not in LOGPROB_MODES:
            raise ApiError(400, "logprob_mode must be one of %s, not %s"
                           % (", ".join(LOGPROB_MODES), json.dumps(mode)), "logprob_mode")
        self.mode = mode
        self.stops = self._stop_strings(body.get("stop"))
        ids = body.get("stop_token_ids")
        if ids is None:
            ids = []
        if not isinstance(ids, list) or not all(_is_int(t) for t in ids) or \
                len(ids) > _lib.MAX_STOP:
            raise ApiError(400, "stop_token_ids must be a list of at most %d token ids"
                           % _lib.MAX_STOP, "stop_token_ids")
        for t in ids:
            server.check_token(t, "stop_token_ids")
        self.stop_token_ids = ids
        self._unsupported(body)
        # generation ends at the tokenizer's end-of-sequence ids too (ignore_eos: not)
        if server.text is not None and not _boolean(body, "ignore_eos"):
            ids = ids + [t for t in server.text.stop_ids if t not in ids and 0 <= t < server.vocab]
            if len(ids) > _lib.MAX_STOP:
                raise ApiError(400, "stop_token_ids and the model's end-of-sequence ids are %d "
                               "ids; at most %d" % (len(ids), _lib.MAX_STOP), "stop_token_ids")
        self.end_ids = ids
        # capacity: every sequence of the request runs at once
        seqs = self.n * len(self.prompts)
        if seqs > server.max_batch:
            raise ApiError(400, "n = %d for %d prompt(s) is %d sequences; this server runs at "
                           "most %d at once (--max-batch)" % (self.n, len(self.prompts), seqs,
                                                               server.max_batch), "n")
        longest = max(len(p) for p in self.prompts)
        if longest + self.max_tokens > server.max_len:
            raise ApiError(400, "This model's maximum context length is %d tokens. However, "
                           "you requested %d tokens (%d in the prompt, %d in the completion)."
                           % (server.max_len, longest + self.max_tokens, longest,
                              self.max_tokens), "max_tokens", "context_length_exceeded")
        # (max_tokens 0: the prompts are scored, not generated from: no cache)
        self.cache_need = server.request_cache_need(self.prompts, self.n, self.max_tokens) \
            if self.max_tokens else 0
        if self.cache_need > server.cache_tokens:
            raise ApiError(503, "the request needs %d KV cache positions; the server has %d "
                           "(--cache-tokens)" % (self.cache_need, server.cache_tokens),
                           None, "cache_full")
        self.seqs = seqs                        # decoded together: at most --max-batch
        self.slots = seqs + len(self.prompts)   # and the prompts while they are forked
        self.sampling = None if self.max_tokens == 0 else sampling_struct(
            self.temperature, self.top_k, None if self.top_p == 1.0 else self.top_p,
            None if self.min_p == 0.0 else self.min_p, self.seed, self.max_tokens,
            self.end_ids, self.mode, self.logprobs or 0)
        self.choices = [Completion(i, p) for p in range(len(self.prompts))
                        for i in range(self.n)]
        for c in self.choices:
            c.index = c.prompt * self.n + c.index
            if server.text is not None:
                c.detok = server.text_detokenizer(self.skip_special)
                c.lazy = not self.stops     # stop strings need the text in the engine
        self.prompt_scores = None   # echo / prompt_logprobs: Model.score's of each prompt
        self.chat_prompt = None     # a chat request: the template's rendering
        # vLLM's and SGLang's request_id (SGLang: rid): the response's id, which
        # /abort_request and /abort_requests name; by default a fresh one
        rid = body.get("request_id")
        if rid is not None and (not isinstance(rid, str) or not 0 < len(rid) <= 256):
            raise ApiError(400, "request_id must be a string of 1 to 256 characters",
                           "request_id")
        self.id = rid if rid is not None else "cmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.version = None
        self.events = collections.deque()
        self.wake = threading.Condition()
        self.cancelled = False
        self.error = None
        self.done = False

    def _stop_strings(self, stop):
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or \
                len(stop) > MAX_STOP:
            raise ApiError(400, "stop must be a string or a list of at most %d strings"
                           % MAX_STOP, "stop")
        if stop and not self.server.byte_level and self.server.text is None:
            raise ApiError(400, "stop strings need a tokenizer: %s; use stop_token_ids"
                           % self.server.no_text_reason(), "stop", "no_tokenizer")
        out = [_utf8(s, "stop") if self.server.byte_level else s for s in stop]
        if any(not s for s in out):
            raise ApiError(400, "an empty stop string", "stop")
        return out

    @staticmethod
    def _unsupported(body):
        """Known OpenAI and vLLM fields accepted only with the value that means "off"."""
        for name in ("spaces_between_special_tokens", "ignore_eos"):
            _boolean(body, name)         # (tokenizers' decoding puts no spaces between them)
        if body.get("min_tokens") not in (None, 0):
            raise ApiError(400, "min_tokens is not supported: only 0", "min_tokens")
        if body.get("repetition_penalty") not in (None, 1, 1.0):
            raise ApiError(400, "repetition_penalty is not supported: only 1", "repetition_penalty")
        for name in ("frequency_penalty", "presence_penalty"):
            if body.get(name) not in (None, 0, 0.0):
                raise ApiError(400, "%s is not supported: only 0" % name, name)
        if body.get("logit_bias") not in (None, {}):
            raise ApiError(400, "logit_bias is not supported", "logit_bias")
        if body.get("suffix") is not None:
            raise ApiError(400, "suffix is not supported", "suffix")
        best_of, n = body.get("best_of"), body.get("n", 1)
        if best_of is not None and best_of != n:
            raise ApiError(400, "best_of is not supported (only best_of = n)", "best_of")
        user = body.get("user")
        if user is not None and not isinstance(user, str):
            raise ApiError(400, "user must be a string", "user")

    # ---- engine side (called with the engine's lock not held, from the engine thread) -----

    def take(self, c, t, reason):
        """Token t drawn for choice c with the sampler's finish reason (None while it goes on):
        adds its text, matches the stop strings on the text (a match ends the choice: the
        text ends before the stop string, or after it with include_stop_str_in_output).
        Returns the finish reason. Called with self.wake held."""
        if self.server.byte_level:
            if reason == "stop" and t in self.end_ids:
                c.text_end = len(c.text)          # the stop token is not part of the text
                return reason
            c.text.append(t)
            for s in self.stops:
                if c.text.endswith(s):
                    c.text_end = len(c.text) - (0 if self.include_stop else len(s))
                    return "stop"
            return reason
        d = c.detok
        if d is None:
            return reason
        if c.lazy:                                # the text is the request thread's work
            if reason == "stop" and t in self.end_ids:
                c.eos_end = True
            return reason
        if reason == "stop" and t in self.end_ids:
            d.finish()
            d.offsets.append(len(d.text))         # nor with a tokenizer
            c.text_end = len(d.text)
            return reason
        delta = d.add(t)
        if delta and self.stops:
            # the earliest stop string that the new text completes
            start = max(0, len(d.text) - len(delta) - max(len(s) for s in self.stops) + 1)
            found = None
            for s in self.stops:
                at = d.text.find(s, start)
                if at >= 0 and (found is None or at < found[0]):
                    found = (at, s)
            if found is not None:
                c.text_end = found[0] + (len(found[1]) if self.include_stop else 0)
                return "stop"
        if reason is not None:
            d.finish()
        return reason

    def push(self, event):
        with self.wake:
            self.events.append(event)
            self.wake.notify()

    def next_event(self, timeout=None):
        """The next event, or None after `timeout` seconds without one."""
        with self.wake:
            if not self.events and not self.wake.wait_for(lambda: self.events, timeout):
                return None
            return self.events.popleft()



# ---- safetensors and manifests -----------------------------------------------------------

def read_safetensors(data, what):
    """{name: (dtype, shape, memoryview)} of the safetensors bytes `data` (a buffer).
    Raises ApiError 400 for anything that is not a well-formed file of BF16/F16/F32
    tensors."""
    try:
        return _safetensors.parse(data, what, _safetensors.FLOAT_DTYPES)
    except _safetensors.FormatError as e:
        raise ApiError(400, str(e)) from None


def read_manifest(path):
    """(version, {name: (shape tuple, dtype, checksum int)}, manifest_version) of a manifest
    file (manifest_version 1 where it names none: its checksums are version 1's)."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        tensors = {}
        for name, e in doc["tensors"].items():
            tensors[name] = (tuple(e["shape"]), e["dtype"], int(e["fnv1a64"], 16))
        manifest_version = doc.get("manifest_version", 1)
        if manifest_version not in (1, 2):
            raise ValueError("manifest_version %r: the library reads 1 and 2" % (manifest_version,))
        return doc["version"], tensors, manifest_version
    except OSError as e:
        raise ApiError(400, "manifest %s: %s" % (path, e.strerror), "manifest") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ApiError(400, "manifest %s: not a manifest (%s: %s)" % (path, type(e).__name__, e),
                       "manifest") from None


# ---- chat ----------------------------------------------------------------------------------

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# a chat request's own fields (the others are a completions request's, with the same meaning)
CHAT_ONLY_FIELDS = frozenset((
    "messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt",
    "chat_template_kwargs", "continue_final_message", "tools", "tool_choice",
    "parallel_tool_calls", "response_format"))


def _message(m, i):
    """A chat message checked and as the template gets it: role, content (a string: a list of
    text parts joined with newlines, as vLLM's "string" content format; null for an assistant
    message with none) and the message's other string fields (name, tool_call_id,
    reasoning_content)."""
    param = "messages[%d]" % i
    if not isinstance(m, dict):
        raise ApiError(400, "%s must be an object with role and content" % param, "messages")
    role = m.get("role")
    if role not in CHAT_ROLES:
        raise ApiError(400, "%s.role must be one of %s, not %s" % (
            param, ", ".join(CHAT_ROLES), json.dumps(role)[:100]), "messages")
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                raise ApiError(400, "%s.content: only text parts ({\"type\": \"text\", "
                               "\"text\": ...}) are supported" % param, "messages")
            parts.append(part["text"])
        content = "\n".join(parts)
    elif content is None and role != "assistant":
        raise ApiError(400, "%s.content is required" % param, "messages")
    elif content is not None and not isinstance(content, str):
        raise ApiError(400, "%s.content must be a string or a list of text parts" % param,
                       "messages")
    out = {"role": role, "content": content}
    for key, value in m.items():
        if key in ("role", "content"):
            continue
        if key not in ("name", "tool_call_id", "reasoning_content", "reasoning", "thinking") \
                or not isinstance(value, str):
            raise ApiError(400, "%s.%s is not supported" % (param, key), "messages")
        out[key] = value
    # transformers gives a message's reasoning to the template under all three names
    reasoning = next((out[k] for k in ("reasoning_content", "thinking", "reasoning")
                      if k in out), None)
    if reasoning is not None:
        out = dict({"thinking": reasoning}, **out)
        out["reasoning_content"] = reasoning
    _utf8(json.dumps(out, ensure_ascii=False), "messages")
    return out


def chat_request(server, body):
    """A /v1/chat/completions body as the completions Request it becomes: the messages rendered
    with the model's chat template (transformers' way) and tokenized without adding special
    tokens (the template writes them), the chat fields translated (logprobs + top_logprobs,
    max_completion_tokens). The prompt's text is kept as request.chat_prompt."""
    known = (server.CHAT_FIELDS - {"prompt"}) | CHAT_ONLY_FIELDS
    for key in body:
        if key not in known:
            raise ApiError(400, "Unrecognized request argument supplied: %s" % key, key,
                           "unknown_parameter")
    tokenizer = server.text
    if tokenizer is None:
        reason = "a byte-level model has no tokenizer" if server.byte_level else \
            server.no_text_reason()
        raise ApiError(400, "chat needs the model's tokenizer and chat template: %s; use "
                       "/v1/completions" % reason, "messages", "no_chat_template")
    if tokenizer.chat_template is None:
        raise ApiError(400, "this model has no chat template (its tokenizer_config.json has "
                       "no chat_template): use /v1/completions", "messages", "no_chat_template")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects",
                       "messages")
    messages = [_message(m, i) for i, m in enumerate(messages)]
    add_generation_prompt = _boolean(body, "add_generation_prompt", True)
    if _boolean(body, "continue_final_message"):
        raise ApiError(400, "continue_final_message is not supported", "continue_final_message")
    if body.get("tools") not in (None, []):
        raise ApiError(400, "tools are not supported", "tools")
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise ApiError(400, "tool_choice: no tools are supported", "tool_choice")
    _boolean(body, "parallel_tool_calls")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise ApiError(400, "response_format: only {\"type\": \"text\"} is supported",
                       "response_format")
    extra = body.get("chat_template_kwargs") or {}
    if not isinstance(extra, dict) or any(k in ("messages", "add_generation_prompt", "tools",
                                                "documents") for k in extra):
        raise ApiError(400, "chat_template_kwargs must be an object of the template's variables "
                       "other than messages, add_generation_prompt, tools, documents",
                       "chat_template_kwargs")
    text = tokenizer.render_chat(messages, add_generation_prompt, extra)
    ids = tokenizer.encode(text, add_special_tokens=False)
    completion = {k: v for k, v in body.items() if k in server.CHAT_FIELDS}
    completion["prompt"] = ids if ids else text      # (an empty prompt is refused as such)
    # logprobs: true + top_logprobs k is the completions API's logprobs k
    completion.pop("logprobs", None)
    top = _integer(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if _boolean(body, "logprobs"):
        completion["logprobs"] = top or 0
    elif top is not None:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    # without a limit: up to the context's end, as vLLM
    completion["max_tokens"] = limit if limit is not None else max(server.max_len - len(ids), 1)
    req = Request(server, completion, chat=True)
    if completion.get("request_id") is None:     # (a request_id given is the id as it is)
        req.id = "chatcmpl-" + req.id[len("cmpl-"):]
    req.chat_prompt = text
    return req
