"""What parity.serve accepts and answers: the limits, errors in OpenAI's shape (ApiError), the
checks of a request's fields, a /v1/completions request and its choices as parsed, and the
files a weight update names (safetensors bodies, manifests)."""
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
                 "text", "text_end", "sent_tokens", "sent_text", "decoder", "routes")

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


class Request:
    """A parsed /v1/completions request and its state in the engine."""

    def __init__(self, server, body):
        self.server = server
        known = server.COMPLETION_FIELDS
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
        self.max_tokens = _integer(body, "max_tokens", 16, 1, 2 ** 31)
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
        self.cache_need = server.request_cache_need(self.prompts, self.n, self.max_tokens)
        if self.cache_need > server.cache_tokens:
            raise ApiError(503, "the request needs %d KV cache positions; the server has %d "
                           "(--cache-tokens)" % (self.cache_need, server.cache_tokens),
                           None, "cache_full")
        self.seqs = seqs                        # decoded together: at most --max-batch
        self.slots = seqs + len(self.prompts)   # and the prompts while they are forked
        self.sampling = sampling_struct(
            self.temperature, self.top_k, None if self.top_p == 1.0 else self.top_p,
            None if self.min_p == 0.0 else self.min_p, self.seed, self.max_tokens,
            self.stop_token_ids, self.mode, self.logprobs or 0)
        self.choices = [Completion(i, p) for p in range(len(self.prompts))
                        for i in range(self.n)]
        for c in self.choices:
            c.index = c.prompt * self.n + c.index
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
        if stop and not self.server.byte_level:
            raise ApiError(400, "stop strings need a tokenizer, which this server does not "
                           "have for a model of %d tokens: use stop_token_ids"
                           % self.server.vocab, "stop")
        out = [_utf8(s, "stop") for s in stop]
        if any(not s for s in out):
            raise ApiError(400, "an empty stop string", "stop")
        return out

    @staticmethod
    def _unsupported(body):
        """Known OpenAI and vLLM fields accepted only with the value that means "off"."""
        for name in ("skip_special_tokens", "spaces_between_special_tokens", "ignore_eos"):
            _boolean(body, name)         # no tokenizer, no special tokens: no effect
        if body.get("min_tokens") not in (None, 0):
            raise ApiError(400, "min_tokens is not supported: only 0", "min_tokens")
        if body.get("repetition_penalty") not in (None, 1, 1.0):
            raise ApiError(400, "repetition_penalty is not supported: only 1", "repetition_penalty")
        if body.get("echo") not in (None, False):
            raise ApiError(400, "echo is not supported (score the prompt with /parity/score)",
                           "echo")
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
    """(version, {name: (shape tuple, dtype, checksum int)}) of a manifest file."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        tensors = {}
        for name, e in doc["tensors"].items():
            tensors[name] = (tuple(e["shape"]), e["dtype"], int(e["fnv1a64"], 16))
        return doc["version"], tensors
    except OSError as e:
        raise ApiError(400, "manifest %s: %s" % (path, e.strerror), "manifest") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ApiError(400, "manifest %s: not a manifest (%s: %s)" % (path, type(e).__name__, e),
                       "manifest") from None
