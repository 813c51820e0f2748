"""The HTTP side of parity.serve: the server (the model, its tokenizer, its sampler and engine,
the limits) and the request handler of every endpoint, streaming included."""
import ctypes
import http.server
import json
import os
import select
import socket
import sys
import tempfile
import time
import urllib.parse

from .._lib import ERR_INVALID_ARGUMENT, ParityError, lib
from ..model import Model
from . import text as _text
from .engine import PAUSE_MODES, Control, Engine, Gate, Update
from .protocol import (BYTE_VOCAB, LOGPROB_MODES, ApiError, Request, _finite, _integer, _is_int,
                       _number, _parity_error, _utf8, chat_request, read_manifest,
                       read_safetensors)

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
        "spaces_between_special_tokens", "ignore_eos", "min_tokens", "repetition_penalty",
        "return_routed_experts", "prompt_logprobs", "request_id"))
    # a chat request as it reaches Request: its own fields translated (chat_request)
    CHAT_FIELDS = COMPLETION_FIELDS - {"echo", "suffix", "best_of", "prompt_logprobs"}

    def __init__(self, args):
        self.args = args
        self.name = args.served_model_name or args.model
        self.policy, self.backend = args.policy, args.backend
        self.model = Model(args.model, threads=args.threads)
        self.vocab = self.model.vocab_size
        self.byte_level = self.vocab == BYTE_VOCAB
        # the checkpoint's tokenizer (--tokenizer DIR, else the model's directory); none for a
        # byte-level model, whose tokens are the UTF-8 bytes
        tokenizer_dir = getattr(args, "tokenizer", None) or (
            args.model if os.path.isdir(args.model) else None)
        self.text, self.text_missing = (None, None) if self.byte_level else \
            _text.load(tokenizer_dir)
        if self.text is not None and self.text.hf.get_vocab_size() > self.vocab:
            raise ParityError(ERR_INVALID_ARGUMENT, "the tokenizer has %d tokens, the model %d"
                              % (self.text.hf.get_vocab_size(), self.vocab))
        self.max_batch = args.max_batch
        # sequence slots: the decoded ones, and prompts between their prefill and their forks
        # and the prompt cache's prompts, each a sequence that is never stepped
        self.prompt_cache_entries = getattr(args, "prompt_cache", 0)
        self.max_seqs = 2 * self.max_batch + self.prompt_cache_entries
        self.max_len = args.max_model_len or min(self.model.context, 4096)
        self.cache_tokens = args.cache_tokens or min((self.max_batch + 1) * self.max_len, 16384)
        self.max_queue = args.max_queue
        self.record_routes = getattr(args, "enable_return_routed_experts", False)
        self.sampler = self.model.sampler(
            policy=args.policy, max_seqs=self.max_seqs, max_len=self.max_len,
            threads=args.threads, backend=args.backend, max_batch=self.max_batch,
            cache_tokens=self.cache_tokens, prefault=getattr(args, "prefault", False),
            record_routes=self.record_routes)
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
                if self.byte_level:
                    ids = list(_utf8(p, param))
                elif self.text is not None:
                    _utf8(p, param)     # (lone surrogates: refused as for a byte-level model)
                    ids = self.text.encode(p)
                else:
                    raise ApiError(400, "a string prompt needs a tokenizer: %s; send token ids"
                                   % self.no_text_reason(), param, "no_tokenizer")
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

    def token_bytes(self, t):
        """The bytes of token t as a list of ints (the chat schema's logprobs "bytes")."""
        if self.byte_level:
            return [t]
        if self.text is not None:
            return list(self.text.token_bytes(t))
        return None

    def no_text_reason(self):
        """Why this server has no tokenizer (a model other than byte-level)."""
        return self.text_missing or ("the model (%d tokens) has no tokenizer.json; start the "
                                     "server with --tokenizer DIR" % self.vocab)

    def text_detokenizer(self, skip_special_tokens=True):
        return _text.Detokenizer(self.text, skip_special_tokens)

    def prompt_text(self, ids):
        """The text of a prompt's tokens and each token's offset in it (echo): bytes as text
        for a byte-level model, the tokenizer's decoding (special tokens kept) otherwise, ""
        without a tokenizer."""
        if self.byte_level:
            return bytes(ids).decode("utf-8", "replace"), list(range(len(ids)))
        if self.text is None:
            return "", [0] * len(ids)
        d = self.text_detokenizer(skip_special_tokens=False)
        for t in ids:
            d.add(t)
        d.finish()
        return d.text, d.offsets

    def cache_need(self, prompts, n, max_tokens):
        k = len(prompts)
        lens = (ctypes.c_uint32 * k)(*[len(p) for p in prompts])
        comps = (ctypes.c_uint32 * k)(*([n] * k))
        out = ctypes.c_uint64()
        lib.parity_sampler_cache_tokens(k, lens, comps, max_tokens, ctypes.byref(out))
        return out.value

    def request_cache_need(self, prompts, n, max_tokens):
        """The KV positions a request reserves: parity_sampler_cache_tokens, and with the
        prompt cache one more block a prompt, since its completions then share the prompt's
        last, partly filled block with the kept prefill and each writes its own copy of it."""
        need = self.cache_need(prompts, n, max_tokens)
        if self.prompt_cache_entries:
            need += len(prompts) * self.cache_need([[0]], 1, 1)    # one block
        return need

    def expected_differences(self, tensors, manifest):
        """The differences between a manifest and what the model would hold after updating
        `tensors` (the checksums parity_model_verify would compare), without changing it."""
        from ..manifest import checksum
        version, want, manifest_version = manifest
        # the model's own checksums, in the manifest's version, kept until the next update
        if self.current_checksums is None:
            self.current_checksums = {}
        if manifest_version not in self.current_checksums:
            with tempfile.TemporaryDirectory(prefix="parity-serve-") as d:
                path = os.path.join(d, "current.json")
                self.model.write_manifest(path, manifest_version=manifest_version)
                self.current_checksums[manifest_version] = read_manifest(path)[1]
        have = dict(self.current_checksums[manifest_version])
        out = []
        for name, value in tensors.items():
            if name not in have:
                out.append("%s: not a tensor of this model" % name)
                continue
            shape, h = checksum(value, name, manifest_version)
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
        if as_id or (not self.byte_level and self.text is None):
            return "token_id:%d" % t
        if self.text is not None:
            return self.text.token_name(t)
        return chr(t) if t < 128 else "bytes:\\x%02x" % t

    def info(self):
        import parity
        return {"model": self.name, "policy": self.policy, "backend": self.backend,
                "cpu_path": parity.cpu_path(), "weight_version": self.model.version,
                "vocab_size": self.vocab, "max_model_len": self.max_len,
                "max_batch": self.max_batch, "cache_tokens": self.cache_tokens,
                "byte_level": self.byte_level, "libparity": parity.version(),
                "paused": self.engine.paused,
                "tokenizer": None if self.text is None else self.text.directory,
                "chat_template": self.text is not None and self.text.chat_template is not None,
                "requests_running": len(self.engine.active),
                "requests_waiting": len(self.engine.waiting),
                "decode_steps": self.engine.steps, "prefill_calls": self.engine.prefills,
                "engine_seconds": self.engine.time_split(),
                "prompt_cache": {"entries": len(self.engine.prompt_cache),
                                 "limit": self.prompt_cache_entries,
                                 "hits": self.engine.prompt_hits,
                                 "misses": self.engine.prompt_misses}}


def _offsets(srv, c, start, end, shift):
    """Each token's offset in the choice's text (shifted by `shift`, the echoed prompt's
    length): bytes of a byte-level model (a token is a byte), characters with a tokenizer, 0
    without one."""
    if srv.byte_level:
        return list(range(shift + start, shift + end))
    if c.detok is not None:
        return [shift + o for o in c.detok.offsets[start:end]]
    return [0] * (end - start)


def _logprobs_block(srv, req, c, start, end, echo=None):
    """OpenAI's logprobs object for tokens [start, end) of a choice; with `echo` (the prompt's
    block, _prompt_block) the prompt's tokens first."""
    if req.logprobs is None:
        return None
    tokens = c.tokens[start:end]
    lps = [_finite(v) for v in c.logprobs[start:end]]

    def name(t):
        return srv.token_text(t, req.token_id_names)

    top = None
    if req.logprobs:
        top = []
        for t, lp, (ids, alts) in zip(tokens, lps, c.tops[start:end]):
            # (the sampler pads with id -1 where the distribution has fewer tokens)
            d = {name(i): _finite(v) for i, v in zip(ids, alts) if i >= 0}
            d.setdefault(name(t), lp)
            top.append(d)
    block = {"tokens": [name(t) for t in tokens], "token_logprobs": lps, "top_logprobs": top,
             "text_offset": _offsets(srv, c, start, end, 0 if echo is None else echo[1])}
    if echo is not None:
        head = echo[0]
        for key in block:
            block[key] = None if head[key] is None or block[key] is None else \
                head[key] + block[key]
    return block


def _prompt_block(srv, req, p):
    """(OpenAI's logprobs object of prompt p's tokens, the length of its text): the first
    token's log-prob null, the others Model.score's of the prompt."""
    ids = req.prompts[p]
    text, offsets = srv.prompt_text(ids)
    scores = req.prompt_scores

    def name(t):
        return srv.token_text(t, req.token_id_names)

    lps = [None] + [_finite(v) for v in scores.logprobs[p]]
    top = None
    if req.logprobs:
        top = [None]
        for t, lp, ids_k, alts in zip(ids[1:], lps[1:], scores.top_ids[p], scores.top_logprobs[p]):
            d = {name(i): _finite(v) for i, v in zip(ids_k[:req.logprobs], alts) if i >= 0}
            d.setdefault(name(t), lp)
            top.append(d)
    return {"tokens": [name(t) for t in ids], "token_logprobs": lps, "top_logprobs": top,
            "text_offset": offsets}, len(ids) if srv.byte_level else len(text)


def _vllm_prompt_logprobs(srv, req, p):
    """vLLM's prompt_logprobs of prompt p: null for the first token, then for each token a
    dict {token id: {"logprob", "rank", "decoded_token"}} of the token itself and the
    prompt_logprobs most likely ones (rank: 1 for the most likely; null for a prompt token
    outside those, whose rank is not computed)."""
    ids = req.prompts[p]
    scores = req.prompt_scores
    k = req.prompt_logprobs
    out = [None]
    for i, t in enumerate(ids[1:]):
        top_ids, top_lps = scores.top_ids[p][i], scores.top_logprobs[p][i]
        entry = {}
        for rank, (j, v) in enumerate(zip(top_ids[:k], top_lps[:k])):
            if j >= 0:
                entry[str(j)] = {"logprob": _finite(v), "rank": rank + 1,
                                 "decoded_token": srv.token_text(j)}
        if str(t) not in entry:
            have = [j for j in top_ids if j >= 0]
            entry[str(t)] = {"logprob": _finite(scores.logprobs[p][i]),
                             "rank": have.index(t) + 1 if t in have else None,
                             "decoded_token": srv.token_text(t)}
        out.append(entry)
    return out


def _chat_logprobs(srv, req, c, start, end):
    """The chat schema's logprobs of tokens [start, end) of a choice: {"content": [{"token",
    "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}]}."""
    if req.logprobs is None:
        return None

    def entry(t, lp):
        name = srv.token_text(t, req.token_id_names)
        return {"token": name, "logprob": _finite(lp), "bytes": srv.token_bytes(t)}

    content = []
    for i in range(start, end):
        e = entry(c.tokens[i], c.logprobs[i])
        e["top_logprobs"] = [] if not req.logprobs else \
            [entry(j, v) for j, v in zip(*c.tops[i]) if j >= 0]
        content.append(e)
    return {"content": content}


def _routes_list(c):
    """A choice's routed_experts (none for a request aborted before it started)."""
    return c.routes.tolist() if c.routes is not None else []


def _final_text(srv, c):
    if srv.byte_level:
        end = len(c.text) if c.text_end is None else c.text_end
        return bytes(c.text[:end]).decode("utf-8", "replace")
    if c.detok is not None:
        return c.detok.text if c.text_end is None else c.detok.text[:c.text_end]
    return ""


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

    def _json_body(self, empty_ok=False):
        """The body, a JSON object; with `empty_ok` (control calls), none or an empty body is
        {} too."""
        if empty_ok and self.headers.get("Content-Length") is None and \
                not self.headers.get("Transfer-Encoding"):
            self.body_read = True
            return {}
        data = self._body(self.server.args.max_body_bytes)
        if empty_ok and not data.strip():
            return {}
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ApiError(400, "the body is not valid JSON: %s" % str(e)[:200]) from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    ROUTES = {"/v1/completions": ("POST", "completions"),
              "/v1/chat/completions": ("POST", "chat_completions"),
              "/v1/models": ("GET", "models"),
              "/health": ("GET", "health"), "/parity/info": ("GET", "info"),
              "/parity/score": ("POST", "score"),
              "/parity/update_weights": ("POST", "update_weights"),
              # control around weight updates, by the names SGLang's and vLLM's servers use
              "/pause_generation": ("POST", "pause_generation"),     # SGLang
              "/continue_generation": ("POST", "resume"),            # SGLang
              "/pause": ("POST", "pause"),                           # vLLM
              "/resume": ("POST", "resume"),                         # vLLM
              "/is_paused": ("GET", "is_paused"),                    # vLLM
              "/abort_request": ("POST", "abort_request"),           # SGLang
              "/abort_requests": ("POST", "abort_requests"),         # vLLM
              "/update_weights_from_disk": ("POST", "update_weights_from_disk"),  # SGLang
              "/flush_cache": ("POST", "flush_cache"),               # SGLang (GET too)
              "/reset_prefix_cache": ("POST", "flush_cache")}        # vLLM
    GET_TOO = frozenset(("/flush_cache",))

    def _route(self):
        self.body_read = False
        url = urllib.parse.urlsplit(self.path)
        self.query = urllib.parse.parse_qs(url.query)
        try:
            route = self.ROUTES.get(url.path.rstrip("/") or url.path)
            if route is None:
                raise ApiError(404, "no such endpoint: %s %s" % (self.command, url.path))
            if route[0] != self.command and not (self.command == "HEAD" and route[0] == "GET") \
                    and not (self.command == "GET" and url.path.rstrip("/") in self.GET_TOO):
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
        self._serve(Request(self.server, self._json_body()))

    def _chat_completions(self):
        self._serve(chat_request(self.server, self._json_body()))

    def _serve(self, req):
        """Runs a completions or chat request: the prompts scored first where echo or
        prompt_logprobs asks (and again if a weight update came before the generation
        started), the generation by the engine (none for max_tokens 0), the answer."""
        srv = self.server
        scored = None
        if (req.echo and req.logprobs is not None) or req.prompt_logprobs is not None:
            scored = self._score_prompts(req)
        if req.max_tokens == 0:
            req.version = srv.model.version if scored is None else scored
            self._send_json(200, self._response(req))
            return
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
        if scored is not None and scored != req.version and \
                self._score_prompts(req) != req.version:
            raise ApiError(503, "the weights were updated twice while the request ran, so its "
                           "prompt log-probs and its completion are not of the same weights: "
                           "send it again", None, "weights_changed")
        self._send_json(200, self._response(req))

    def _score_prompts(self, req):
        """Model.score of the request's prompts (the sampler's mode and parameters, the top
        alternatives asked for), held against weight updates as /parity/score is; stores them
        in req.prompt_scores and returns the weight version they are of."""
        srv = self.server
        k = max(req.logprobs or 0, req.prompt_logprobs or 0)
        srv.gate.enter()
        try:
            version = srv.model.version
            scores = srv.model.score(
                req.prompts, policy=srv.policy, backend=srv.backend, mode=req.mode,
                temperature=req.temperature, top_k=req.top_k,
                top_p=None if req.top_p == 1.0 else req.top_p,
                min_p=None if req.min_p == 0.0 else req.min_p, top_n=max(k, 1))
        except ParityError as e:
            raise _parity_error(e, "prompt") from None
        finally:
            srv.gate.leave()
        req.prompt_scores = scores
        return version

    def _response(self, req):
        srv = self.server
        choices = []
        for c in req.choices:
            c.catch_up(len(c.tokens), c.finish_reason, c.eos_end)  # the engine is done with it
            echo = _prompt_block(srv, req, c.prompt) if req.echo and \
                req.logprobs is not None else None
            text = _final_text(srv, c)
            if req.echo:
                text = srv.prompt_text(req.prompts[c.prompt])[0] + text
            if req.chat:
                ch = {"index": c.index, "message": {"role": "assistant", "content": text},
                      "logprobs": _chat_logprobs(srv, req, c, 0, len(c.tokens)),
                      "finish_reason": c.finish_reason}
            else:
                ch = {"index": c.index, "text": text,
                      "logprobs": _logprobs_block(srv, req, c, 0, len(c.tokens), echo),
                      "finish_reason": c.finish_reason if req.max_tokens else "length"}
            if req.prompt_logprobs is not None:
                ch["prompt_logprobs"] = _vllm_prompt_logprobs(srv, req, c.prompt)
            if req.return_token_ids:
                ch["token_ids"] = list(c.tokens)
                ch["prompt_token_ids"] = list(req.prompts[c.prompt])
            if req.return_routed_experts:
                ch["routed_experts"] = _routes_list(c)
            choices.append(ch)
        out = self._head(req)
        out["seed"] = req.seed
        out["choices"] = choices
        out["usage"] = self._usage(req)
        return out

    def _head(self, req, chunk=False):
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if req.chat else \
            "text_completion"
        return {"id": req.id, "object": kind, "created": req.created,
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
                        head = self._head(req, chunk=True)
                        head["choices"] = choices
                        event(head)
                if kind == "done":
                    if req.include_usage:
                        head = self._head(req, chunk=True)
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
            reason = c.finish_reason
            n = len(c.tokens)
            eos_end = c.eos_end
            if not c.lazy:
                whole = c.text_so_far() if srv.byte_level or c.detok is not None else None
                text_end = c.text_end
        if c.lazy:              # this thread makes the text (the tokens up to n are as read)
            c.catch_up(n, reason, eos_end)
            whole, text_end = c.detok.text, c.text_end
        text_len = 0 if whole is None else len(whole)
        # The rest without the lock, so that the engine never waits for this thread's JSON work:
        # the engine only appends to a choice's lists and to a byte-level text, whose first
        # entries stay as read; a tokenizer's text is a new str each step, and `whole` is the
        # one read.
        finished = reason is not None
        if c.sent_tokens == n and (not finished or c.sent_text < 0):
            return None
        text = ""
        if whole is not None:
            if finished:
                end = text_len if text_end is None else text_end
            else:
                hold = max((len(s) for s in req.stops), default=1) - 1
                end = max(c.sent_text, text_len - hold)
            part = whole[max(c.sent_text, 0):end]
            text = c.decoder.decode(bytes(part), finished) if srv.byte_level else part
            c.sent_text = end
        if req.chat:
            delta = {"content": text}
            if c.sent_tokens == 0:
                delta = {"role": "assistant", "content": text}
            ch = {"index": c.index, "delta": delta,
                  "logprobs": _chat_logprobs(srv, req, c, c.sent_tokens, n),
                  "finish_reason": reason}
        else:
            ch = {"index": c.index, "text": text,
                  "logprobs": _logprobs_block(srv, req, c, c.sent_tokens, n),
                  "finish_reason": reason}
        if req.return_token_ids:
            ch["token_ids"] = list(c.tokens[c.sent_tokens:n])
        if req.return_routed_experts and finished:
            ch["routed_experts"] = _routes_list(c)   # in the choice's last chunk
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
        if ctype == "application/octet-stream":
            data = self._body(srv.args.max_update_bytes, progress=True)
            tensors = read_safetensors(data, "the body")
            manifest_path = (self.query.get("manifest") or [None])[0]
        else:
            body = self._json_body()
            self._known_fields(body, ("path", "manifest"))
            path = body.get("path")
            if not isinstance(path, str):
                raise ApiError(400, "path (a safetensors file on the server's machine) is "
                               "required, or send the file as application/octet-stream",
                               "path")
            tensors = self._read_weights_file(path, "path")
            manifest_path = body.get("manifest")
        self._send_json(200, self._submit_update(tensors, manifest_path))

    @staticmethod
    def _known_fields(body, known):
        for key in body:
            if key not in known:
                raise ApiError(400, "Unrecognized request argument supplied: %s" % key, key,
                               "unknown_parameter")

    @staticmethod
    def _read_weights_file(path, param):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ApiError(400, "%s: %s" % (path, e.strerror), param) from None
        return read_safetensors(data, path)

    def _submit_update(self, tensors, manifest_path, expect_version=None):
        """Hands an update to the engine and waits for it: its result, or raises its error."""
        upd = Update(tensors, None)
        upd.expect_version = expect_version
        if manifest_path is not None:
            if not isinstance(manifest_path, str):
                raise ApiError(400, "manifest must be a path", "manifest")
            upd.manifest = read_manifest(manifest_path)
            upd.manifest_path = manifest_path
        self.server.engine.submit_update(upd)
        upd.done.wait()
        if upd.error is not None:
            raise upd.error
        return upd.result

    # ---- control around weight updates (SGLang's and vLLM's names) ----

    def _control_body(self):
        return self._json_body(empty_ok=True)

    def _query_flag(self, params, name, default):
        v = params.get(name, default)
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
            return v.lower() in ("true", "1")
        raise ApiError(400, "%s must be true or false, not %s" % (name, json.dumps(v)[:100]),
                       name)

    def _pause_generation(self):
        """SGLang's POST /pause_generation {"mode": "abort" | "in_place" | "retract"}:
        in_place and retract both keep the requests in flight (here their sequences stay in
        the sampler, so resuming them needs no second prefill)."""
        body = self._control_body()
        self._known_fields(body, ("mode",))
        mode = body.get("mode", "abort")
        modes = {"abort": "abort", "in_place": "keep", "retract": "keep"}
        if mode not in modes:
            raise ApiError(400, "mode must be one of abort, in_place, retract, not %s"
                           % json.dumps(mode)[:100], "mode")
        out = self.server.engine.control(Control("pause", mode=modes[mode]))
        out["message"] = "Generation paused successfully."
        self._send_json(200, out)

    def _pause(self):
        """vLLM's POST /pause?mode=abort|wait|keep (wait_for_inflight_requests=true, its older
        form, is mode wait; clear_cache is accepted: no cache outlives its requests)."""
        params = {k: v[-1] for k, v in self.query.items()}
        params.update(self._control_body())
        self._known_fields(params, ("mode", "wait_for_inflight_requests", "clear_cache"))
        wait = self._query_flag(params, "wait_for_inflight_requests", False)
        self._query_flag(params, "clear_cache", True)
        mode = params.get("mode", "wait" if wait else "abort")
        if mode not in PAUSE_MODES:
            raise ApiError(400, "mode must be one of %s, not %s"
                           % (", ".join(PAUSE_MODES), json.dumps(mode)[:100]), "mode")
        self._send_json(200, self.server.engine.control(Control("pause", mode=mode)))

    def _resume(self):
        """vLLM's POST /resume and SGLang's POST /continue_generation."""
        self._known_fields(self._control_body(), ())
        out = self.server.engine.control(Control("resume"))
        out["message"] = "Generation continued successfully."
        self._send_json(200, out)

    def _is_paused(self):
        srv = self.server
        self._send_json(200, {"is_paused": srv.engine.paused is not None,
                              "mode": srv.engine.paused, "weight_version": srv.model.version})

    def _abort_request(self):
        """SGLang's POST /abort_request {"rid": ID} or {"abort_all": true}."""
        body = self._control_body()
        self._known_fields(body, ("rid", "abort_all"))
        rid = body.get("rid", "")
        if not isinstance(rid, str):
            raise ApiError(400, "rid must be a request id (a string)", "rid")
        if self._query_flag(body, "abort_all", False):
            ids = None
        elif rid:
            ids = [rid]
        else:
            raise ApiError(400, "rid (the id of a request waiting or in flight) is required, "
                           "or abort_all: true", "rid")
        self._send_json(200, self.server.engine.control(Control("abort", ids=ids,
                                                                param="rid")))

    def _abort_requests(self):
        """vLLM's POST /abort_requests {"request_ids": [ID, ...]}; none or an empty list
        aborts every request waiting or in flight."""
        body = self._control_body()
        self._known_fields(body, ("request_ids",))
        ids = body.get("request_ids")
        if ids is not None and (not isinstance(ids, list) or
                                not all(isinstance(i, str) for i in ids)):
            raise ApiError(400, "request_ids must be a list of request ids (strings)",
                           "request_ids")
        self._send_json(200, self.server.engine.control(Control("abort", ids=ids or None,
                                                                param="request_ids")))

    def _update_weights_from_disk(self):
        """SGLang's POST /update_weights_from_disk {"model_path": a checkpoint directory
        (model.safetensors, or the shards its index names) or a safetensors file}: the same
        update as /parity/update_weights. abort_all_requests: true aborts the requests waiting
        and in flight first; weight_version, if given, must be the version the update makes."""
        srv = self.server
        body = self._json_body()
        self._known_fields(body, ("model_path", "load_format", "abort_all_requests",
                                  "weight_version", "flush_cache"))
        path = body.get("model_path")
        if not isinstance(path, str):
            raise ApiError(400, "model_path (a checkpoint directory or a safetensors file on "
                           "the server's machine) is required", "model_path")
        if body.get("load_format") not in (None, "auto", "safetensors"):
            raise ApiError(400, "load_format: only safetensors", "load_format")
        abort_all = self._query_flag(body, "abort_all_requests", False)
        self._query_flag(body, "flush_cache", True)
        version = body.get("weight_version")
        if version is not None and (isinstance(version, bool) or
                                    not isinstance(version, (int, str)) or
                                    not str(version).isdigit()):
            raise ApiError(400, "weight_version: this server numbers its versions 0, 1, 2, ...: "
                           "give the number the update makes, or leave it out",
                           "weight_version")
        tensors = self._read_checkpoint(path)
        aborted = []
        if abort_all:
            aborted = srv.engine.control(Control("abort", ids=None, param=None))["aborted"]
        out = self._submit_update(tensors, None, None if version is None else int(version))
        out.update({"success": True, "message": "Succeeded to update model weights.",
                    "num_paused_requests": 0, "aborted": aborted})
        self._send_json(200, out)

    def _read_checkpoint(self, path):
        """The tensors of a safetensors file, or of a checkpoint directory's model.safetensors
        or its shards (model.safetensors.index.json's weight_map)."""
        if not os.path.isdir(path):
            return self._read_weights_file(path, "model_path")
        single = os.path.join(path, "model.safetensors")
        if os.path.exists(single):
            return self._read_weights_file(single, "model_path")
        index = os.path.join(path, "model.safetensors.index.json")
        try:
            with open(index, "rb") as f:
                shards = sorted(set(json.loads(f.read().decode("utf-8"))["weight_map"].values()))
        except OSError:
            raise ApiError(400, "%s: neither model.safetensors nor "
                           "model.safetensors.index.json" % path, "model_path") from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ApiError(400, "%s: not a safetensors index (%s)" % (index, e),
                           "model_path") from None
        tensors = {}
        for shard in shards:
            tensors.update(self._read_weights_file(os.path.join(path, shard), "model_path"))
        return tensors

    def _flush_cache(self):
        """SGLang's /flush_cache and vLLM's POST /reset_prefix_cache."""
        self._control_body()
        self._send_json(200, self.server.engine.control(Control("flush")))
