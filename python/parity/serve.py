"""A rollout server on libparity's sampler: OpenAI-compatible completions with log-probs,
weight updates and the learner's scoring over HTTP, standard library only.

    python3 -m parity.serve --model DIR|synthetic:NAME [--policy aligned] [--port 8000]

One engine thread owns the sampler and steps every live request together (continuous
batching: requests join and leave between decode steps); request threads parse, enqueue and
wait. The sampler is batch-invariant and each completion draws from its own random stream
(the request's seed, the completion's index), so a request's tokens and log-prob bits do not
depend on what else the server is doing: they equal the same request served alone, and
Model.generate() of the same prompts and parameters.

Endpoints: POST /v1/completions, GET /v1/models, GET /health (OpenAI's shapes), and POST
/parity/score, POST /parity/update_weights, GET /parity/info. The rules (what is accepted,
which error comes with which status, when a weight update takes effect) are in
python/README.md, "The rollout server". Prompts are token ids; a string prompt is accepted
for a byte-level model (vocab 256: the UTF-8 bytes are the tokens). There is no tokenizer.
"""
import argparse
import codecs
import collections
import ctypes
import http.server
import json
import math
import os
import secrets
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from array import array

from . import _lib, _safetensors
from ._lib import ParityError, lib
from .model import Model
from .sampler import FINISH_REASONS, sampling_struct

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
              _lib.ERR_INVALID_ARGUMENT: 400, _lib.ERR_CACHE_FULL: 503}.get(e.status, 500)
    return ApiError(status, str(e), param, _lib.status_name(e.status).lower())


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
                 "text", "text_end", "sent_tokens", "sent_text", "decoder")

    def __init__(self, index, prompt):
        self.index, self.prompt, self.seq = index, prompt, None
        self.tokens, self.logprobs, self.tops = [], [], []
        self.finish_reason = None
        self.text = bytearray()     # the completion's bytes (byte-level models)
        self.text_end = None        # where the text ends when a stop string or token ended it
        self.sent_tokens = 0        # streaming: tokens and text bytes already sent
        self.sent_text = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")


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
        self.cache_need = server.cache_need(self.prompts, self.n, self.max_tokens)
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
        self.id = "cmpl-" + secrets.token_hex(12)
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


class Gate:
    """Scoring calls against weight updates: from the moment an update is submitted, new
    scoring calls wait until it is applied; the update waits for the calls in progress. At
    most `limit` scoring calls run at once (each holds a scorer and its KV cache)."""

    def __init__(self, limit):
        self.cv = threading.Condition()
        self.readers = 0
        self.holds = 0              # updates submitted and not yet applied
        self.limit = limit

    def enter(self):
        with self.cv:
            self.cv.wait_for(lambda: not self.holds and self.readers < self.limit)
            self.readers += 1

    def leave(self):
        with self.cv:
            self.readers -= 1
            self.cv.notify_all()

    def hold(self):
        with self.cv:
            self.holds += 1

    def wait_idle(self):
        with self.cv:
            self.cv.wait_for(lambda: not self.readers)

    def release(self):
        with self.cv:
            self.holds -= 1
            self.cv.notify_all()


class Update:
    """A /parity/update_weights job for the engine."""

    def __init__(self, tensors, manifest):
        self.tensors, self.manifest = tensors, manifest
        self.manifest_path = None
        self.queued = time.perf_counter()
        self.result = None
        self.error = None
        self.done = threading.Event()


class Engine(threading.Thread):
    """Owns the sampler: admits waiting requests (first come, first served, while their
    sequences and KV cache fit), steps every live sequence together, applies weight updates
    once no request is in flight."""

    def __init__(self, server):
        super().__init__(name="parity-engine", daemon=True)
        self.server = server
        self.sampler = server.sampler
        self.cv = threading.Condition()
        self.waiting = collections.deque()
        self.updates = collections.deque()
        self.active = []
        self.reserved_cache = 0
        self.reserved_slots = 0
        self.reserved_seqs = 0
        self.stopping = False
        self.steps = 0

    def submit(self, req):
        with self.cv:
            if self.stopping or not self.is_alive():
                raise ApiError(503, "the server is shutting down", None, "shutting_down")
            if len(self.waiting) >= self.server.max_queue:
                raise ApiError(503, "the server is full: %d requests are waiting (--max-queue)"
                               % len(self.waiting), None, "queue_full")
            self.waiting.append(req)
            self.cv.notify()

    def submit_update(self, upd):
        with self.cv:
            if self.stopping or not self.is_alive():
                raise ApiError(503, "the server is shutting down", None, "shutting_down")
            self.server.gate.hold()     # scoring calls from now on see the new weights
            self.updates.append(upd)
            self.cv.notify()

    def stop(self):
        with self.cv:
            self.stopping = True
            self.cv.notify()

    def _fits(self, req):
        return (self.reserved_cache + req.cache_need <= self.server.cache_tokens and
                self.reserved_seqs + req.seqs <= self.server.max_batch and
                self.reserved_slots + req.slots <= self.server.max_seqs)

    def run(self):
        profile = None
        if self.server.args.profile:
            import cProfile
            profile = cProfile.Profile()
            profile.enable()
        try:
            self._loop()
        finally:
            if profile is not None:
                profile.disable()
                self._write_profile(profile)
            # shutting down (or a bug escaped): everyone still waiting gets an answer
            with self.cv:
                self.stopping = True
                waiting, self.waiting = list(self.waiting), collections.deque()
                updates, self.updates = list(self.updates), collections.deque()
            for req in list(self.active):
                self._finish(req, ApiError(503, "the server is shutting down"))
            for req in waiting:
                req.error = ApiError(503, "the server is shutting down")
                req.push(("error", req.error))
            for upd in updates:
                upd.error = ApiError(503, "the server is shutting down; nothing was changed")
                self.server.gate.release()
                upd.done.set()

    def _loop(self):
        while True:
            admitted, update = [], None
            with self.cv:
                while not (self.waiting or self.active or self.updates or self.stopping):
                    self.cv.wait()
                if self.stopping:
                    break
                if self.updates:
                    if not self.active:
                        update = self.updates.popleft()
                else:
                    while self.waiting and self._fits(self.waiting[0]):
                        req = self.waiting.popleft()
                        if req.cancelled:
                            continue
                        self.reserved_cache += req.cache_need
                        self.reserved_slots += req.slots
                        self.reserved_seqs += req.seqs
                        admitted.append(req)
            if update is not None:
                self._apply(update)
                continue
            if admitted:
                try:
                    self._start_all(admitted)
                except Exception as e:  # a bug: the requests it left unstarted are answered
                    for req in admitted:
                        if not req.done and req not in self.active:
                            self._finish(req, ApiError(500, "internal error: %s: %s"
                                                       % (type(e).__name__, e)))
            if self.active:
                try:
                    self._step()
                except Exception as e:  # a bug in the step: every request in it is answered
                    error = ApiError(500, "internal error: %s: %s" % (type(e).__name__, e))
                    for req in list(self.active):
                        self._finish(req, error)

    def _write_profile(self, profile):
        """--profile: where the engine thread's time went, by function (cProfile), most first."""
        import io
        import pstats
        out = io.StringIO()
        out.write("parity.serve engine thread: %d decode steps\n" % self.steps)
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(15)
        try:
            with open(self.server.args.profile, "w") as f:
                f.write(out.getvalue())
        except OSError as e:
            print("parity.serve: --profile %s: %s" % (self.server.args.profile, e.strerror),
                  file=sys.stderr)

    def _release(self, seq):
        try:
            self.sampler.release(seq)
        except ParityError:
            pass

    def _start_all(self, reqs):
        """Prefills the prompts of the requests admitted together in one
        parity_sampler_add_batch (a few forwards instead of one per prompt; the same bits),
        then starts each request. If the batch is refused, each request is started alone and
        gets its own answer."""
        if len(reqs) == 1 and len(reqs[0].prompts) == 1:
            self._start_one(reqs[0])
            return
        prompts = [array("i", p) for req in reqs for p in req.prompts]
        sps = [req.sampling for req in reqs for _ in req.prompts]
        try:
            parents = self.sampler._add_batch(prompts, sps, [0] * len(prompts))
        except ParityError:
            for req in reqs:
                self._start_one(req)
            return
        at = 0
        for req in reqs:
            mine = parents[at:at + len(req.prompts)]
            at += len(req.prompts)
            try:
                self._start_one(req, mine)
            except Exception as e:  # a bug: this request is answered, the others go on
                self._finish(req, ApiError(500, "internal error: %s: %s" % (type(e).__name__, e)))

    def _start_one(self, req, parents=None):
        """Prefills each prompt once (unless `parents` holds them, prefilled already) and forks
        its n completions (stream i for the i-th), as Sampler.generate() does."""
        s = self.sampler
        req.version = self.server.model.version
        parents = list(parents) if parents is not None else []
        try:
            for p, prompt in enumerate(req.prompts):
                if p == len(parents):
                    parents.append(s._add(array("i", prompt), req.sampling, 0))
                for c in req.choices[p * req.n:(p + 1) * req.n]:
                    c.seq = s._fork(parents[p], req.sampling, c.index - p * req.n)
        except ParityError as e:
            self._finish(req, _parity_error(e))
            return
        finally:
            for parent in parents:
                self._release(parent)
        with self.cv:
            freed = len(req.prompts)     # the prompts' slots are free again
            self.reserved_slots -= freed
            req.slots -= freed
        self.active.append(req)
        req.push(("started", req.version))

    def _finish(self, req, error=None):
        for c in req.choices:
            if c.seq is not None:
                self._release(c.seq)
                c.seq = None
        if req in self.active:
            self.active.remove(req)
        with self.cv:
            self.reserved_cache -= req.cache_need
            self.reserved_slots -= req.slots
            self.reserved_seqs -= req.seqs
            req.cache_need = req.slots = req.seqs = 0
        req.done = True
        if error is not None:
            req.error = error
            req.push(("error", error))
        else:
            req.push(("done", None))

    def _step(self):
        for req in [r for r in self.active if r.cancelled]:
            self._finish(req, ApiError(499, "the client went away"))
        live = [(req, c) for req in self.active for c in req.choices if c.seq is not None]
        if not live:
            return
        k = max((req.logprobs or 0) for req, _ in live)
        try:
            tok, lp, fin, tid, tlp = self.sampler._step([c.seq for _, c in live], k)
        except ParityError as e:
            for req in list(self.active):
                self._finish(req, _parity_error(e))
            return
        self.steps += 1
        byte_level = self.server.byte_level
        for i, (req, c) in enumerate(live):
            t = tok[i]
            top = (tid[i * k:i * k + req.logprobs].tolist(),
                   tlp[i * k:i * k + req.logprobs].tolist()) if req.logprobs else None
            reason = FINISH_REASONS[fin[i]]
            # a streaming request thread reads the choice under req.wake: it sees a step's
            # token, log-prob, text and finish together or not at all
            with req.wake:
                c.tokens.append(t)
                c.logprobs.append(lp[i])
                if top is not None:
                    c.tops.append(top)
                if reason == "stop" and t in req.stop_token_ids:
                    c.text_end = len(c.text)      # the stop token is not part of the text
                elif byte_level:
                    c.text.append(t)
                    for s in req.stops:
                        if c.text.endswith(s):
                            c.text_end = len(c.text) - (0 if req.include_stop else len(s))
                            reason = "stop"
                            break
                if reason is not None:
                    c.finish_reason = "length" if reason == "capacity" else reason
            if reason is not None:
                self._release(c.seq)
                c.seq = None
        for req in list(self.active):
            if req.stream:
                req.push(("delta", None))
            if all(c.seq is None for c in req.choices):
                self._finish(req)

    def _apply(self, upd):
        """A weight update, with no request in flight and scoring held back."""
        srv = self.server
        drained = time.perf_counter()
        srv.gate.wait_idle()
        try:
            if upd.manifest is not None:
                differences = srv.expected_differences(upd.tensors, upd.manifest)
                if differences:
                    raise ApiError(409, "the manifest does not match the weights the model "
                                   "would hold after this update: %d difference(s); nothing "
                                   "was changed" % len(differences), None, "manifest_mismatch",
                                   {"differences": differences[:100]})
            t0 = time.perf_counter()
            try:
                srv.model.update(upd.tensors)
            except ParityError as e:
                raise ApiError(400, "update refused, nothing was changed: %s" % e, None,
                               _lib.status_name(e.status).lower()) from None
            srv.current_checksums = None
            t1 = time.perf_counter()
            verified = False
            if upd.manifest is not None:
                differences = srv.model.verify(upd.manifest_path)
                if differences:
                    raise ApiError(500, "the weights were updated but do not verify against "
                                   "the manifest", None, "verify_failed",
                                   {"differences": differences[:100]})
                verified = True
            upd.result = {"weight_version": srv.model.version, "tensors": len(upd.tensors),
                          "drain_seconds": round(drained - upd.queued, 6),
                          "update_seconds": round(t1 - t0, 6), "verified": verified}
        except ApiError as e:
            upd.error = e
        except Exception as e:  # a bug: answered, the server goes on
            upd.error = ApiError(500, "update failed: %s: %s" % (type(e).__name__, e))
        finally:
            srv.gate.release()
            upd.done.set()


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


# ---- the HTTP side -----------------------------------------------------------------------

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    COMPLETION_FIELDS = frozenset((
        "model", "prompt", "max_tokens", "n", "temperature", "top_p", "top_k", "min_p", "seed",
        "stop", "stop_token_ids", "logprobs", "stream", "stream_options", "logprob_mode",
        "return_token_ids", "echo", "user", "frequency_penalty", "presence_penalty",
        "logit_bias", "best_of", "suffix",
        # vLLM's extra sampling parameters that RL frameworks send
        "return_tokens_as_token_ids", "include_stop_str_in_output", "skip_special_tokens",
        "spaces_between_special_tokens", "ignore_eos", "min_tokens", "repetition_penalty"))

    def __init__(self, args):
        self.args = args
        self.name = args.served_model_name or args.model
        self.policy, self.backend = args.policy, args.backend
        self.model = Model(args.model, threads=args.threads)
        self.vocab = self.model.vocab_size
        self.byte_level = self.vocab == BYTE_VOCAB
        self.max_batch = args.max_batch
        # sequence slots: the decoded ones, and prompts between their prefill and their forks
        self.max_seqs = 2 * self.max_batch
        self.max_len = args.max_model_len or min(self.model.context, 4096)
        self.cache_tokens = args.cache_tokens or min((self.max_batch + 1) * self.max_len, 16384)
        self.max_queue = args.max_queue
        self.sampler = self.model.sampler(
            policy=args.policy, max_seqs=self.max_seqs, max_len=self.max_len,
            threads=args.threads, backend=args.backend, max_batch=self.max_batch,
            cache_tokens=self.cache_tokens, prefault=getattr(args, "prefault", False))
        self.gate = Gate(args.max_scoring)
        self.current_checksums = None
        self.engine = Engine(self)
        # connections waiting to be accepted: socketserver's default of 5 resets a burst of
        # clients connecting at once
        self.request_queue_size = max(128, args.max_queue)
        super().__init__((args.host, args.port), Handler)

    # ---- shared by the requests ----

    def check_token(self, t, param):
        if not 0 <= t < self.vocab:
            raise ApiError(400, "token id %d is out of range [0, %d)" % (t, self.vocab), param)

    def prompts(self, prompt, param):
        """A request's prompts as lists of token ids: a string, a list of strings, a list of
        ids or a list of lists of ids."""
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and
                                       all(_is_int(t) for t in prompt)):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise ApiError(400, "%s must be a string, a list of strings, a list of token ids or "
                           "a list of such lists" % param, param)
        out = []
        for p in prompt:
            if isinstance(p, str):
                if not self.byte_level:
                    raise ApiError(400, "a string prompt needs a tokenizer, which this server "
                                   "does not have for a model of %d tokens: send token ids"
                                   % self.vocab, param)
                ids = list(_utf8(p, param))
            elif isinstance(p, list) and all(_is_int(t) for t in p):
                ids = p
                for t in ids:
                    self.check_token(t, param)
            else:
                raise ApiError(400, "%s must be a string, a list of strings, a list of token ids "
                               "or a list of such lists" % param, param)
            if not ids:
                raise ApiError(400, "an empty prompt", param)
            if len(ids) >= self.max_len:
                raise ApiError(413, "a prompt of %d tokens: this server's maximum context "
                               "length is %d (at least one token must be generated)"
                               % (len(ids), self.max_len), param, "context_length_exceeded")
            out.append(ids)
        return out

    def cache_need(self, prompts, n, max_tokens):
        k = len(prompts)
        lens = (ctypes.c_uint32 * k)(*[len(p) for p in prompts])
        comps = (ctypes.c_uint32 * k)(*([n] * k))
        out = ctypes.c_uint64()
        lib.parity_sampler_cache_tokens(k, lens, comps, max_tokens, ctypes.byref(out))
        return out.value

    def expected_differences(self, tensors, manifest):
        """The differences between a manifest and what the model would hold after updating
        `tensors` (the checksums parity_model_verify would compare), without changing it."""
        from .manifest import checksum
        version, want = manifest
        if self.current_checksums is None:
            with tempfile.TemporaryDirectory(prefix="parity-serve-") as d:
                path = os.path.join(d, "current.json")
                self.model.write_manifest(path)
                self.current_checksums = read_manifest(path)[1]
        have = dict(self.current_checksums)
        out = []
        for name, value in tensors.items():
            if name not in have:
                out.append("%s: not a tensor of this model" % name)
                continue
            shape, h = checksum(value, name)
            have[name] = (tuple(shape), "BF16", h)
        if version != self.model.version + 1:
            out.append("version: the manifest says %s, the model would be at %d"
                       % (version, self.model.version + 1))
        for name in sorted(set(have) | set(want)):
            if name not in want:
                out.append("%s: in the model, missing from the manifest" % name)
            elif name not in have:
                out.append("%s: in the manifest, missing from the model" % name)
            elif have[name] != want[name]:
                (hs, hd, hh), (ws, wd, wh) = have[name], want[name]
                what = "shape %s, manifest %s" % (list(hs), list(ws)) if hs != ws else \
                    "dtype %s, manifest %s" % (hd, wd) if hd != wd else \
                    "fnv1a64 %016x, manifest %016x" % (hh, wh)
                out.append("%s: %s" % (name, what))
        return out

    def token_text(self, t, as_id=False):
        if as_id or not self.byte_level:
            return "token_id:%d" % t
        return chr(t) if t < 128 else "bytes:\\x%02x" % t

    def info(self):
        import parity
        return {"model": self.name, "policy": self.policy, "backend": self.backend,
                "cpu_path": parity.cpu_path(), "weight_version": self.model.version,
                "vocab_size": self.vocab, "max_model_len": self.max_len,
                "max_batch": self.max_batch, "cache_tokens": self.cache_tokens,
                "byte_level": self.byte_level, "libparity": parity.version(),
                "requests_running": len(self.engine.active),
                "requests_waiting": len(self.engine.waiting),
                "decode_steps": self.engine.steps}


def _logprobs_block(srv, req, c, start, end):
    """OpenAI's logprobs object for tokens [start, end) of a choice."""
    if req.logprobs is None:
        return None
    tokens = c.tokens[start:end]
    lps = [_finite(v) for v in c.logprobs[start:end]]

    def name(t):
        return srv.token_text(t, req.token_id_names)

    # byte offsets in the completion's text: a token is a byte (no text without a tokenizer)
    offsets = list(range(start, start + len(tokens))) if srv.byte_level else [0] * len(tokens)
    top = None
    if req.logprobs:
        top = []
        for t, lp, (ids, alts) in zip(tokens, lps, c.tops[start:end]):
            # (the sampler pads with id -1 where the distribution has fewer tokens)
            d = {name(i): _finite(v) for i, v in zip(ids, alts) if i >= 0}
            d.setdefault(name(t), lp)
            top.append(d)
    return {"tokens": [name(t) for t in tokens], "token_logprobs": lps, "top_logprobs": top,
            "text_offset": offsets}


def _final_text(srv, c):
    if not srv.byte_level:
        return ""
    end = len(c.text) if c.text_end is None else c.text_end
    return bytes(c.text[:end]).decode("utf-8", "replace")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "parity.serve"
    # headers and body are separate writes: without TCP_NODELAY the body waits for the client's
    # delayed ACK (about 40 ms a response on a kept-alive connection, and on every stream event)
    disable_nagle_algorithm = True

    def setup(self):
        self.timeout = self.server.args.client_timeout
        super().setup()

    def log_message(self, fmt, *args):
        if self.server.args.log_requests:
            sys.stderr.write("parity.serve: %s %s\n" % (self.address_string(), fmt % args))

    # ---- plumbing ----

    def _send_json(self, status, obj, headers=()):
        data = json.dumps(obj, allow_nan=False).encode()
        if not self.body_read and (self.headers.get("Transfer-Encoding") or
                                   self.headers.get("Content-Length", "0").strip() != "0"):
            self.close_connection = True    # the body was not read: the stream is not in step
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _client_gone(self):
        """Whether the client closed its connection (it reads as end of file)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _wait(self, req):
        """The request's next event; a client that goes away meanwhile cancels it (the engine
        releases its sequences at the next step)."""
        while True:
            event = req.next_event(timeout=1.0)
            if event is not None:
                return event
            if self._client_gone():
                req.cancelled = True
                self.close_connection = True
                raise ConnectionResetError("the client went away")

    def _send_error(self, e):
        self._send_json(e.status, e.body())

    def _body(self, limit, progress=False):
        """The request body (bytes), read within the client timeout: the whole of it, or with
        `progress` (weight files) some of it every client timeout."""
        self.body_read = True
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(411, "send the body with a Content-Length (chunked bodies are not "
                           "accepted)")
        length = self.headers.get("Content-Length")
        if length is None:
            if self.command == "POST":
                self.close_connection = True
                raise ApiError(411, "a POST needs a Content-Length")
            return b""
        try:
            n = int(length)
            if n < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "a bad Content-Length: %r" % length) from None
        if n > limit:
            self.close_connection = True
            raise ApiError(413, "the body is %d bytes; the limit is %d" % (n, limit), None,
                           "body_too_large")
        timeout = self.server.args.client_timeout
        deadline = time.monotonic() + timeout
        try:
            data = bytearray(n)
        except MemoryError:
            self.close_connection = True
            raise ApiError(503, "no memory for a body of %d bytes" % n) from None
        view, got = memoryview(data), 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close_connection = True
                raise ApiError(408, "the body did not arrive within %g s (%d of %d bytes)"
                               % (timeout, got, n), None, "request_timeout")
            self.connection.settimeout(left)
            try:
                k = self.rfile.readinto1(view[got:got + (1 << 20)])
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                self.close_connection = True
                raise
            if not k:
                self.close_connection = True
                raise ApiError(400, "the body ended after %d of %d bytes" % (got, n))
            got += k
            if progress:
                deadline = time.monotonic() + timeout
        self.connection.settimeout(timeout)
        return data

    def _json_body(self):
        data = self._body(self.server.args.max_body_bytes)
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ApiError(400, "the body is not valid JSON: %s" % str(e)[:200]) from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    ROUTES = {"/v1/completions": ("POST", "completions"), "/v1/models": ("GET", "models"),
              "/health": ("GET", "health"), "/parity/info": ("GET", "info"),
              "/parity/score": ("POST", "score"),
              "/parity/update_weights": ("POST", "update_weights")}

    def _route(self):
        self.body_read = False
        url = urllib.parse.urlsplit(self.path)
        self.query = urllib.parse.parse_qs(url.query)
        try:
            route = self.ROUTES.get(url.path.rstrip("/") or url.path)
            if route is None:
                raise ApiError(404, "no such endpoint: %s %s" % (self.command, url.path))
            if route[0] != self.command and not (self.command == "HEAD" and route[0] == "GET"):
                self.close_connection = True   # its body, if any, was not read
                raise ApiError(405, "%s takes %s, not %s" % (url.path, route[0], self.command))
            getattr(self, "_" + route[1])()
        except ApiError as e:
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError, socket.timeout, TimeoutError):
            self.close_connection = True
        except Exception as e:  # a bug: answered, the server goes on
            self.close_connection = True
            self._send_error(ApiError(500, "internal error: %s: %s" % (type(e).__name__, e)))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _route

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (a malformed request line, headers too long, an unknown
        method) in OpenAI's error shape too."""
        self.close_connection = True
        text = message or self.responses.get(code, ("error",))[0]
        if explain:
            text = "%s: %s" % (text, explain)
        self.body_read = True       # whatever it was, the connection closes after this
        try:
            self._send_json(code, ApiError(code, text).body())
        except OSError:
            pass

    # ---- endpoints ----

    def _health(self):
        if not self.server.engine.is_alive():
            raise ApiError(503, "the engine thread has stopped", None, "engine_stopped")
        self._send_json(200, {"status": "ok"})

    def _models(self):
        srv = self.server
        self._send_json(200, {"object": "list", "data": [{
            "id": srv.name, "object": "model", "created": srv.started, "owned_by": "libparity",
            "max_model_len": srv.max_len}]})

    def _info(self):
        self._send_json(200, self.server.info())

    def _completions(self):
        srv = self.server
        req = Request(srv, self._json_body())
        srv.engine.submit(req)
        if req.stream:
            self._stream(req)
            return
        while True:
            kind, value = self._wait(req)
            if kind == "error":
                raise value
            if kind == "done":
                break
        self._send_json(200, self._response(req))

    def _response(self, req):
        srv = self.server
        choices = []
        for c in req.choices:
            ch = {"index": c.index, "text": _final_text(srv, c),
                  "logprobs": _logprobs_block(srv, req, c, 0, len(c.tokens)),
                  "finish_reason": c.finish_reason}
            if req.return_token_ids:
                ch["token_ids"] = list(c.tokens)
                ch["prompt_token_ids"] = list(req.prompts[c.prompt])
            choices.append(ch)
        out = self._head(req)
        out["seed"] = req.seed
        out["choices"] = choices
        out["usage"] = self._usage(req)
        return out

    def _head(self, req):
        return {"id": req.id, "object": "text_completion", "created": req.created,
                "model": self.server.name, "system_fingerprint": "parity-w%d" % req.version,
                "weight_version": req.version}

    @staticmethod
    def _usage(req):
        p = sum(len(x) for x in req.prompts)
        c = sum(len(ch.tokens) for ch in req.choices)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _stream(self, req):
        srv = self.server
        kind, value = self._wait(req)
        if kind == "error":
            raise value

        def event(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else
                                json.dumps(obj, allow_nan=False).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                kind, value = self._wait(req)
                if kind == "error":
                    event({"error": value.body()["error"]})
                    break
                if kind in ("delta", "done"):
                    choices = []
                    for c in req.choices:
                        ch = self._stream_delta(srv, req, c)
                        if ch is not None:
                            choices.append(ch)
                    if choices:
                        head = self._head(req)
                        head["choices"] = choices
                        event(head)
                if kind == "done":
                    if req.include_usage:
                        head = self._head(req)
                        head["choices"] = []
                        head["usage"] = self._usage(req)
                        event(head)
                    break
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, socket.timeout, TimeoutError):
            req.cancelled = True
            self.close_connection = True

    @staticmethod
    def _stream_delta(srv, req, c):
        """What a choice drew since its last chunk, or None. Text that could still turn out to
        be the start of a stop string is held back until it cannot."""
        with req.wake:          # the engine publishes a step's results under it
            finished = c.finish_reason is not None
            n = len(c.tokens)
            if c.sent_tokens == n and (not finished or c.sent_text < 0):
                return None
            text = ""
            if srv.byte_level:
                if finished:
                    end = len(c.text) if c.text_end is None else c.text_end
                else:
                    hold = max((len(s) for s in req.stops), default=1) - 1
                    end = max(c.sent_text, len(c.text) - hold)
                text = c.decoder.decode(bytes(c.text[max(c.sent_text, 0):end]), finished)
                c.sent_text = end
            ch = {"index": c.index, "text": text,
                  "logprobs": _logprobs_block(srv, req, c, c.sent_tokens, n),
                  "finish_reason": c.finish_reason if finished else None}
            if req.return_token_ids:
                ch["token_ids"] = list(c.tokens[c.sent_tokens:n])
            c.sent_tokens = n
            if finished:
                c.sent_text = -1          # the last chunk of this choice has gone out
            return ch

    def _score(self):
        srv = self.server
        body = self._json_body()
        known = {"model", "sequences", "mode", "temperature", "top_k", "top_p", "min_p"}
        for key in body:
            if key not in known:
                raise ApiError(400, "Unrecognized request argument supplied: %s" % key, key,
                               "unknown_parameter")
        if "model" in body and body["model"] != srv.name:
            raise ApiError(404, "The model `%s` does not exist" % body["model"], "model",
                           "model_not_found")
        seqs = body.get("sequences")
        if not isinstance(seqs, list) or not seqs:
            raise ApiError(400, "sequences must be a non-empty list of token-id lists (or of "
                           "strings for a byte-level model)", "sequences")
        batch = []
        for s in seqs:
            if isinstance(s, str) and srv.byte_level:
                s = list(_utf8(s, "sequences"))
            if not isinstance(s, list) or not all(_is_int(t) for t in s) or not s:
                raise ApiError(400, "each sequence is a non-empty list of token ids",
                               "sequences")
            for t in s:
                srv.check_token(t, "sequences")
            if len(s) > srv.model.context:
                raise ApiError(413, "a sequence of %d tokens; the model's context is %d"
                               % (len(s), srv.model.context), "sequences",
                               "context_length_exceeded")
            batch.append(s)
        mode = body.get("mode", "raw")
        if mode not in LOGPROB_MODES:
            raise ApiError(400, "mode must be one of %s" % ", ".join(LOGPROB_MODES), "mode")
        temperature = _number(body, "temperature", 1.0, 0.0, 1e6)
        top_k = _integer(body, "top_k", -1, -1, 2 ** 31)
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
        min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
        srv.gate.enter()
        try:
            version = srv.model.version
            lps = srv.model.score(batch, policy=srv.policy, backend=srv.backend, mode=mode,
                                  temperature=temperature,
                                  top_k=None if top_k <= 0 else top_k,
                                  top_p=None if top_p == 1.0 else top_p,
                                  min_p=None if min_p == 0.0 else min_p)
        except ParityError as e:
            raise _parity_error(e, "sequences") from None
        finally:
            srv.gate.leave()
        self._send_json(200, {"logprobs": [[_finite(v) for v in x] for x in lps],
                              "weight_version": version})

    def _update_weights(self):
        srv = self.server
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        manifest_path = None
        if ctype == "application/octet-stream":
            data = self._body(srv.args.max_update_bytes, progress=True)
            tensors = read_safetensors(data, "the body")
            manifest_path = (self.query.get("manifest") or [None])[0]
        else:
            body = self._json_body()
            for key in body:
                if key not in ("path", "manifest"):
                    raise ApiError(400, "Unrecognized request argument supplied: %s" % key, key,
                                   "unknown_parameter")
            path = body.get("path")
            if not isinstance(path, str):
                raise ApiError(400, "path (a safetensors file on the server's machine) is "
                               "required, or send the file as application/octet-stream",
                               "path")
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise ApiError(400, "%s: %s" % (path, e.strerror), "path") from None
            tensors = read_safetensors(data, path)
            manifest_path = body.get("manifest")
        upd = Update(tensors, None)
        if manifest_path is not None:
            if not isinstance(manifest_path, str):
                raise ApiError(400, "manifest must be a path", "manifest")
            upd.manifest = read_manifest(manifest_path)
            upd.manifest_path = manifest_path
        srv.engine.submit_update(upd)
        upd.done.wait()
        if upd.error is not None:
            raise upd.error
        self._send_json(200, upd.result)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m parity.serve", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory or synthetic:NAME")
    ap.add_argument("--policy", default="aligned", help="precision policy (default aligned)")
    ap.add_argument("--backend", default="bf16", choices=tuple(_lib.BACKENDS))
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                    "loopback)")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--port-file", help="write the port here once listening")
    ap.add_argument("--threads", type=int, default=None, help="sampler and scorer threads "
                    "(default: the CPUs this process may use)")
    ap.add_argument("--max-batch", type=int, default=32,
                    help="sequences decoded together at most (default 32)")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="positions per sequence (default min(context, 4096))")
    ap.add_argument("--cache-tokens", type=int, default=0,
                    help="KV cache positions shared by all sequences (default "
                    "min((max_batch + 1) * max_model_len, 16384))")
    ap.add_argument("--prefault", action="store_true",
                    help="write every page of the KV cache at start-up, so that no decode step "
                    "takes a first-touch page fault (the cache's memory is committed at once)")
    ap.add_argument("--served-model-name", help="the name requests give as model (default: "
                    "the --model argument)")
    ap.add_argument("--max-queue", type=int, default=256,
                    help="requests waiting for room before new ones get 503 (default 256)")
    ap.add_argument("--max-scoring", type=int, default=2,
                    help="/parity/score calls running at once, each with its own scorer "
                    "(default 2; more wait)")
    ap.add_argument("--max-body-bytes", type=int, default=1 << 20,
                    help="largest JSON body accepted (default 1 MiB)")
    ap.add_argument("--max-update-bytes", type=int, default=8 << 30,
                    help="largest safetensors body of /parity/update_weights (default 8 GiB)")
    ap.add_argument("--client-timeout", type=float, default=10.0,
                    help="seconds a client has to send its request (default 10)")
    ap.add_argument("--log-requests", action="store_true", help="one line per request")
    ap.add_argument("--profile", metavar="FILE", help="at exit, write where the engine "
                    "thread's time went (cProfile, by function) to FILE")
    args = ap.parse_args(argv)
    for name in ("max_batch", "max_queue", "max_scoring", "max_body_bytes", "max_update_bytes"):
        if getattr(args, name) < 1:
            ap.error("--%s must be at least 1" % name.replace("_", "-"))
    if args.client_timeout <= 0:
        ap.error("--client-timeout must be positive")
    try:
        srv = Server(args)
    except ParityError as e:
        print("parity.serve: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("parity.serve: cannot listen on %s:%d: %s" % (args.host, args.port, e.strerror),
              file=sys.stderr)
        return 1
    srv.started = int(time.time())
    srv.engine.start()
    host, port = srv.server_address[:2]

    # Installed before the port is announced, so that a SIGTERM sent as soon as the port file
    # appears stops the server cleanly (exit 0). A shutdown asked before serve_forever runs
    # still takes effect: serve_forever then returns at once.
    def stop(signum, frame):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write("%d\n" % port)
        os.replace(args.port_file + ".tmp", args.port_file)
    print("parity.serve: listening on http://%s:%d (model %s, policy %s, max batch %d, "
          "max model len %d, cache %d positions)" % (host, port, srv.name, args.policy,
                                                     srv.max_batch, srv.max_len,
                                                     srv.cache_tokens),
          file=sys.stderr, flush=True)

    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        srv.engine.stop()
        srv.engine.join(timeout=30)
        time.sleep(0.2)      # the request threads write the answers the engine gave them
        srv.server_close()
        srv.sampler.close()
        srv.model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
