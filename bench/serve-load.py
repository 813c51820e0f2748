#!/usr/bin/env python3
"""parity.serve under load: K concurrent clients x M requests each, every completion checked
bitwise against the same request served alone (issue 18 item 5).

    python3 bench/serve-load.py [--clients 1,8,32] [--requests 16] [--max-tokens 32]
                                [--url http://127.0.0.1:PORT | --model DIR] [--update] [--wrk]
                                [--sampler-peer] [--rounds R] [--time-limit 600] [--json FILE]

By default it starts its own server (`python3 -m parity.serve --model DIR --port 0 --port-file
F --threads 2 --max-batch 32`, PARITY_LIBRARY = build/lib/libparity.so unless set) and stops it
at the end; --url uses a running one instead (loopback addresses only). Standard library only.

Requests: request r of client c has a fixed seed and fixed parameters drawn from (c, r): a
prompt from a fixed list of short English / code strings, n = 1 or 2, temperature 0.7-1.0,
sometimes top_k / top_p / a stop string, logprobs 1, return_token_ids, every fourth request
streamed (some with stream_options.include_usage), max_tokens T, T-8 or T-16. The same (c, r)
is the same request in every phase, so one solo reference serves them all.

  solo      every distinct request of the largest K, sent alone (one connection, nothing else
            in flight): the reference
  K = ...   K client threads (one keep-alive connection each) send their M requests back to
            back; each response is validated against the spec (fields, versions, seeds, token
            strings, usage, float32-exact log-probs) and compared with its solo run: choice
            token_ids, text, finish_reason, the float32 bits of token_logprobs and of the
            top_logprobs values (parsed as Python floats, then struct.pack('<f', x))
            The load generator only sends, reads and parses while a phase is timed; each
            response is checked after the phase's last one arrived (on a 2-core machine its
            checks would otherwise take CPU from the server it measures).
            --sampler-peer: before and after each phase, the sampler alone (parity-speed's
            decode row on the server's model, policy, threads and batch K); the server's
            tokens/s is printed as a share of the two peers' mean. --rounds R: each K phase R
            times, each with its own peers, and the median share over the rounds.
  update    (--update) K = the largest K again; when half of the requests have completed,
            POST /parity/update_weights with a copy of the model whose one MLP weight has the
            lowest mantissa bit of every bf16 value flipped. Then: no request failed; every
            response names weight version v or v+1 (v = the version before); a request sent
            after the update returned is on v+1 and one finished before it was sent is on v;
            the v responses equal the solo runs made before the update, the v+1 responses equal
            solo runs made after the load ends (on the new weights)
  wrk       (--wrk) wrk (Debian's; installed with apt-get when missing and root) against
            GET /health and a small fixed POST /v1/completions (a Lua script), K connections
            each, --wrk-seconds each: raw request handling

Prints a table per phase (requests, requests/s, completion tokens/s, latency p50/p90/p99 in
ms, errors, mismatches), then one JSON object (also written to --json FILE). Exit status 1 if
any request failed, broke the spec or differed from its solo run; 2 if the time limit cut the
run short or the server could not be started.
"""
import argparse
import http.client
import ipaddress
import json
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
import urllib.parse

import pybench  # noqa: F401  (its emit(); it also puts python/ on sys.path, unused here)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(REPO, "models", "qwen3-bytes-pystdlib-4.9m")

PROMPTS = [
    "def main():\n    ",
    "import os\nimport sys\n\n",
    "class Parser:\n    def __init__(self, text):\n        ",
    "The quick brown fox",
    "for i in range(10):\n",
    "# Copyright (c) 2001 Python Software Foundation\n",
    "    return ",
    "Once upon a time, ",
    "if __name__ == \"__main__\":\n",
    "\"\"\"Return the number of ",
    "try:\n    import zlib\nexcept ImportError:\n",
    "x = {'a': 1, 'b': [2, 3]}\nprint(",
    "A caf\u00e9 on the corner sells ",
    "def _check(value):\n    if not isinstance(value, int):\n        raise ",
    "with open(path, 'rb') as f:\n    data = ",
    "Hello, world",
]


class TimeUp(Exception):
    """The time limit passed, or the server exited: no more requests."""


# ---- the requests ------------------------------------------------------------------------------

def make_request(c, r, max_tokens, model):
    """The fixed request r of client c: (body dict, stream flag)."""
    h = (c * 2654435761 + r * 40503 + 12345) & 0xffffffff
    body = {
        "model": model,
        "prompt": PROMPTS[(c * 5 + r * 3) % len(PROMPTS)],
        "max_tokens": max(1, max_tokens - 8 * ((c + r) % 3)),
        "n": 2 if (c + 2 * r) % 3 == 0 else 1,
        "temperature": [0.7, 0.8, 0.9, 1.0][h % 4],
        "seed": 1000003 * (c + 1) + 7919 * r + 17,
        "logprobs": 1,
        "return_token_ids": True,
    }
    if (h >> 4) % 5 == 1:
        body["top_k"] = 40
    if (h >> 4) % 5 == 2:
        body["top_p"] = 0.9
    if (h >> 8) % 6 == 3:
        body["stop"] = ["\n\n"]
    stream = (c + r) % 4 == 1
    if stream:
        body["stream"] = True
        if (h >> 12) % 2:
            body["stream_options"] = {"include_usage": True}
    return body, stream


def key_of(body):
    return json.dumps(body, sort_keys=True)


# ---- HTTP --------------------------------------------------------------------------------------

def check_loopback(host):
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        sys.exit("serve-load: cannot resolve %r: %s" % (host, e))
    for info in infos:
        addr = info[4][0].split("%")[0]
        if not ipaddress.ip_address(addr).is_loopback:
            sys.exit("serve-load: %s resolves to %s, not a loopback address: refused" % (host,
                                                                                      addr))


class Client:
    """One keep-alive connection (http.client reconnects by itself after a Connection: close)."""

    def __init__(self, host, port, timeout):
        self.host, self.port, self.timeout = host, port, timeout
        self.conn = None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, path, body=None, headers=None, stream=False):
        """(status, headers dict, parsed JSON or None, raw bytes, first-byte time, done time).
        stream: the body is read event by event (first-byte time = the first data event)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        data = None
        hdrs = dict(headers or {})
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        try:
            self.conn.request(method, path, body=data, headers=hdrs)
            resp = self.conn.getresponse()
            rh = {k.lower(): v for k, v in resp.getheaders()}
            first = None
            if stream and resp.status == 200:
                lines = []
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    if first is None and line.startswith(b"data:"):
                        first = time.perf_counter()
                    lines.append(line)
                raw = b"".join(lines)
            else:
                raw = resp.read()
                first = time.perf_counter()
            done = time.perf_counter()
            if resp.will_close:
                self.close()
        except Exception:
            self.close()
            raise
        parsed = None
        if not stream or resp.status != 200:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
        return resp.status, rh, parsed, raw, first, done


# ---- checking ----------------------------------------------------------------------------------

def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def is_f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0] == x


def token_string(t):
    return chr(t) if t < 128 else "bytes:\\x%02x" % t


class Bad(Exception):
    """A response that breaks the spec."""


def need(cond, msg):
    if not cond:
        raise Bad(msg)


def parse_stream(raw, body):
    """The choices of a streamed response assembled from its events, in the non-stream shape,
    plus (weight_version, usage or None, seed or None)."""
    text = raw.decode("utf-8", "replace")
    events = [e for e in text.split("\n\n") if e.strip()]
    need(events, "stream: no events")
    datas = []
    for e in events:
        for line in e.split("\n"):
            if line.startswith(":"):
                continue
            need(line.startswith("data: "), "stream: a line that is not 'data: ...': %r"
                 % line[:80])
            datas.append(line[6:])
    need(datas and datas[-1] == "[DONE]", "stream: does not end with data: [DONE]")
    need("[DONE]" not in datas[:-1], "stream: [DONE] before the end")
    choices, versions, usage, seed = {}, set(), None, None
    finished = set()
    for d in datas[:-1]:
        try:
            ch = json.loads(d)
        except ValueError:
            raise Bad("stream: a chunk that is not JSON: %r" % d[:80])
        need(isinstance(ch, dict), "stream: a chunk that is not an object")
        if "error" in ch:
            raise Bad("stream: an error event: %s" % json.dumps(ch["error"])[:300])
        need(ch.get("object") == "text_completion", "stream: chunk object %r"
             % ch.get("object"))
        need(ch.get("model") == body["model"], "stream: chunk model %r" % ch.get("model"))
        need(isinstance(ch.get("weight_version"), int), "stream: chunk without weight_version")
        versions.add(ch["weight_version"])
        need(ch.get("system_fingerprint") == "parity-w%d" % ch["weight_version"],
             "stream: system_fingerprint %r with weight_version %r"
             % (ch.get("system_fingerprint"), ch["weight_version"]))
        if "seed" in ch:
            seed = ch["seed"]
        need(isinstance(ch.get("choices"), list), "stream: chunk without a choices list")
        if ch.get("usage") is not None:
            need(ch["choices"] == [], "stream: a usage chunk with choices")
            usage = ch["usage"]
        for c in ch["choices"]:
            i = c.get("index")
            need(isinstance(i, int), "stream: choice without index")
            need(i not in finished, "stream: choice %d has events after its finish_reason" % i)
            a = choices.setdefault(i, {"index": i, "text": "", "finish_reason": None,
                                       "token_ids": [], "logprobs": {
                                           "tokens": [], "token_logprobs": [],
                                           "top_logprobs": [], "text_offset": []}})
            need(isinstance(c.get("text"), str), "stream: choice %d without text" % i)
            a["text"] += c["text"]
            lp = c.get("logprobs")
            need(isinstance(lp, dict), "stream: choice %d chunk without logprobs" % i)
            for f in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                need(isinstance(lp.get(f), list), "stream: logprobs.%s not a list" % f)
                a["logprobs"][f] += lp[f]
            need(isinstance(c.get("token_ids"), list), "stream: choice %d chunk without "
                 "token_ids" % i)
            a["token_ids"] += c["token_ids"]
            if c.get("finish_reason") is not None:
                a["finish_reason"] = c["finish_reason"]
                finished.add(i)
    need(len(versions) == 1, "stream: chunks name weight versions %s" % sorted(versions))
    need(not body.get("stream_options", {}).get("include_usage") or usage is not None,
         "stream: include_usage but no usage chunk")
    return [choices[i] for i in sorted(choices)], versions.pop(), usage, seed


def validate(status, headers, parsed, raw, body, stream):
    """Checks one response against the spec; returns its normal form (what must equal the solo
    run) and its weight version. Raises Bad."""
    need(status == 200, "HTTP %d: %s" % (status, raw[:200].decode("utf-8", "replace")))
    if stream:
        need(headers.get("content-type", "").startswith("text/event-stream"),
             "stream: Content-Type %r" % headers.get("content-type"))
        need(headers.get("transfer-encoding", "").lower() == "chunked",
             "stream: Transfer-Encoding %r" % headers.get("transfer-encoding"))
        choices, version, usage, seed = parse_stream(raw, body)
    else:
        need(isinstance(parsed, dict), "body is not a JSON object")
        need(parsed.get("object") == "text_completion", "object %r" % parsed.get("object"))
        need(parsed.get("model") == body["model"], "model %r" % parsed.get("model"))
        version = parsed.get("weight_version")
        need(isinstance(version, int), "no weight_version")
        need(parsed.get("system_fingerprint") == "parity-w%d" % version,
             "system_fingerprint %r" % parsed.get("system_fingerprint"))
        seed = parsed.get("seed")
        need(seed == body["seed"], "seed %r, asked %r" % (seed, body["seed"]))
        need(isinstance(parsed.get("id"), str) and isinstance(parsed.get("created"), int),
             "id / created")
        choices = parsed.get("choices")
        need(isinstance(choices, list), "no choices list")
        usage = parsed.get("usage")
        need(isinstance(usage, dict), "no usage")
    if seed is not None:
        need(seed == body["seed"], "seed %r, asked %r" % (seed, body["seed"]))
    n = body.get("n", 1)
    need(len(choices) == n, "%d choices, n = %d" % (len(choices), n))
    prompt = list(body["prompt"].encode("utf-8"))
    out, total = [], 0
    for i, c in enumerate(choices):
        need(c.get("index") == i, "choice %d has index %r" % (i, c.get("index")))
        ids = c.get("token_ids")
        need(isinstance(ids, list) and all(isinstance(t, int) and 0 <= t < 256 for t in ids),
             "choice %d: token_ids %r" % (i, ids))
        fr = c.get("finish_reason")
        need(fr in ("stop", "length"), "choice %d: finish_reason %r" % (i, fr))
        need(1 <= len(ids) <= body["max_tokens"] or (fr == "stop" and not ids),
             "choice %d: %d tokens, max_tokens %d" % (i, len(ids), body["max_tokens"]))
        if fr == "length":
            need(len(ids) == body["max_tokens"], "choice %d: finish_reason length after %d of "
                 "%d tokens" % (i, len(ids), body["max_tokens"]))
        if not stream:
            need(c.get("prompt_token_ids") == prompt, "choice %d: prompt_token_ids" % i)
        lp = c.get("logprobs")
        need(isinstance(lp, dict), "choice %d: logprobs %r" % (i, lp))
        for f in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            need(isinstance(lp.get(f), list) and len(lp[f]) == len(ids),
                 "choice %d: logprobs.%s is not a list of %d" % (i, f, len(ids)))
        need(lp["tokens"] == [token_string(t) for t in ids], "choice %d: logprobs.tokens do "
             "not spell token_ids" % i)
        vals = lp["token_logprobs"]
        need(all(isinstance(x, float) and is_f32(x) and x <= 0.0 for x in vals),
             "choice %d: a token_logprob that is not a float32 value <= 0: %r"
             % (i, [x for x in vals if not (isinstance(x, float) and is_f32(x) and x <= 0)][:3]))
        tops = []
        for k, (t, d) in enumerate(zip(ids, lp["top_logprobs"])):
            need(isinstance(d, dict) and 1 <= len(d) <= 2, "choice %d: top_logprobs[%d] = %r"
                 % (i, k, d))
            need(token_string(t) in d, "choice %d: top_logprobs[%d] lacks the drawn token" % (i, k))
            need(f32_bits(d[token_string(t)]) == f32_bits(vals[k]),
                 "choice %d: top_logprobs[%d] of the drawn token %r != token_logprob %r"
                 % (i, k, d[token_string(t)], vals[k]))
            need(all(isinstance(x, float) and is_f32(x) for x in d.values()),
                 "choice %d: top_logprobs[%d] not float32 values" % (i, k))
            tops.append(sorted((s, f32_bits(x)) for s, x in d.items()))
        offs, at = [], 0
        for t in ids:
            offs.append(at)
            at += 1
        need(lp["text_offset"] == offs, "choice %d: text_offset %r" % (i, lp["text_offset"][:8]))
        need(isinstance(c.get("text"), str), "choice %d: no text" % i)
        if fr == "length" and not stream:
            need(c["text"] == bytes(ids).decode("utf-8", "replace"),
                 "choice %d: text is not the decoded token bytes" % i)
        if fr == "stop" and "stop" in body:
            need("\n\n" not in c["text"], "choice %d: text holds the stop string" % i)
        total += len(ids)
        out.append({"token_ids": ids, "text": c["text"], "finish_reason": fr,
                    "token_logprob_bits": [f32_bits(x) for x in vals], "top_logprobs": tops})
    if usage is not None:
        need(usage.get("completion_tokens") == total, "usage.completion_tokens %r, choices "
             "hold %d" % (usage.get("completion_tokens"), total))
        need(usage.get("total_tokens") == usage.get("prompt_tokens", 0) + total,
             "usage.total_tokens %r" % usage.get("total_tokens"))
    return out, version, total


def differences(got, ref):
    """Which parts of a normal form differ from the reference."""
    if len(got) != len(ref):
        return ["choice count"]
    diff = set()
    for g, r in zip(got, ref):
        for f in ("token_ids", "token_logprob_bits", "text", "finish_reason", "top_logprobs"):
            if g[f] != r[f]:
                diff.add(f)
    return sorted(diff)


# ---- running -----------------------------------------------------------------------------------

class Run:
    def __init__(self, args, host, port, model_name):
        self.args, self.host, self.port, self.model = args, host, port, model_name
        self.deadline = time.monotonic() + args.time_limit
        self.timed_out = False
        self.proc = None            # our server, if we started it
        self.server_died = None     # its exit status, if it exited under us

    def stopped(self):
        return self.timed_out or self.server_died is not None

    def left(self):
        return self.deadline - time.monotonic()

    def client(self):
        return Client(self.host, self.port, timeout=max(5.0, min(self.args.request_timeout,
                                                                 self.left() + 5)))

    def one(self, cl, body, stream, defer=False):
        """Sends one request; returns a record (never raises, except TimeUp). With `defer`
        the response is kept whole in the record and checked later by check_deferred()."""
        if self.left() <= 0:
            self.timed_out = True
            raise TimeUp()
        if self.proc is not None and self.proc.poll() is not None:
            self.server_died = self.proc.returncode
            raise TimeUp()
        t0 = time.perf_counter()
        rec = {"key": key_of(body), "t_send": t0}
        try:
            status, headers, parsed, raw, first, done = cl.request("POST", "/v1/completions",
                                                                   body, stream=stream)
        except Exception as e:
            rec.update(error="%s: %s" % (type(e).__name__, e), t_done=time.perf_counter())
            if self.proc is not None:
                try:
                    self.proc.wait(0.2)
                    self.server_died = self.proc.returncode
                    rec["error"] += " (the server exited with status %r)" % self.server_died
                except subprocess.TimeoutExpired:
                    pass
            return rec
        rec.update(t_done=done, latency=done - t0, ttfb=first - t0 if first else None)
        if defer:
            rec["response"] = (status, headers, parsed, raw, body, stream)
        else:
            check_deferred(rec, (status, headers, parsed, raw, body, stream))
        return rec

    def solo(self, todo, refs, label, cross=False):
        """The solo run of every (key -> (body, stream)) in todo not yet in refs. cross: each
        streamed request is also sent without streaming, and the two must be equal."""
        cl = self.client()
        t0 = time.perf_counter()
        errors, count, crossed, cross_bad = [], 0, 0, []
        try:
            for key, (body, stream) in todo.items():
                if key in refs:
                    continue
                rec = self.one(cl, body, stream)
                count += 1
                if "error" in rec:
                    errors.append("%s: %s" % (key, rec["error"]))
                    continue
                refs[key] = (rec["norm"], rec["version"])
                if cross and stream:
                    plain = {f: v for f, v in body.items()
                             if f not in ("stream", "stream_options")}
                    rec2 = self.one(cl, plain, False)
                    crossed += 1
                    if "error" in rec2:
                        errors.append("%s: %s" % (key_of(plain), rec2["error"]))
                    elif differences(rec2["norm"], rec["norm"]) or rec2["version"] != \
                            rec["version"]:
                        cross_bad.append("%s: streamed and plain differ in %s"
                                         % (key, ", ".join(differences(rec2["norm"],
                                                                       rec["norm"]))))
        except TimeUp:
            errors.append("the server exited" if self.server_died is not None else
                          "time limit")
        finally:
            cl.close()
        secs = time.perf_counter() - t0
        if count == 0:
            return {"requests": 0, "seconds": 0.0, "errors": 0, "error_samples": []}
        print("%s: %d requests sent alone in %.1f s, %d errors%s"
              % (label, count + crossed, secs, len(errors),
                 "; %d streamed ones also sent plain, %d differ" % (crossed, len(cross_bad))
                 if cross else ""), flush=True)
        for e in (errors + cross_bad)[:5]:
            print("    error: %s" % e)
        out = {"requests": count + crossed, "seconds": round(secs, 3),
               "errors": len(errors) + len(cross_bad), "error_samples": (errors + cross_bad)[:10]}
        if cross:
            out.update(stream_vs_plain=crossed, stream_vs_plain_differ=len(cross_bad))
        return out

    def load(self, k, m, on_progress=None, at_end=None):
        """K threads x M requests; returns the records. Without on_progress, the responses
        are checked after the last one arrived: during the timed phase the load generator only
        sends, reads and parses (on a 2-core machine its checks would take the server's CPU)."""
        recs = [[] for _ in range(k)]
        defer = on_progress is None
        start = threading.Barrier(k + 1)

        def work(c):
            cl = self.client()
            try:
                start.wait()
                for r in range(m):
                    body, stream = make_request(c, r, self.args.max_tokens, self.model)
                    rec = self.one(cl, body, stream, defer)
                    rec["client"], rec["request"] = c, r
                    recs[c].append(rec)
                    if on_progress:
                        on_progress(rec)
            except TimeUp:
                pass
            finally:
                cl.close()

        threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in range(k)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        t1 = time.perf_counter()
        if at_end is not None:
            at_end()        # e.g. the engine's counters, before the deferred checks' CPU
        out = [x for rs in recs for x in rs]
        for rec in out:
            if "response" in rec:
                check_deferred(rec, rec.pop("response"))
        return out, t0, t1


def check_deferred(rec, response):
    """Validates a response against the spec and fills the record's norm, version and tokens
    (or its error)."""
    try:
        rec["norm"], rec["version"], rec["tokens"] = validate(*response)
    except Bad as e:
        rec["error"] = str(e)


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    i = max(0, min(len(xs) - 1, int(-(-p * len(xs) // 100)) - 1))  # nearest rank
    return xs[i]


def summarize(recs, t0, t1, refs_by_version, expected):
    """Per-phase figures; refs_by_version: {version: refs}."""
    errors, mismatches, tokens, lat, ttfb = [], [], 0, [], []
    fields = {}
    for rec in recs:
        if "error" in rec:
            errors.append("client %d request %d: %s" % (rec["client"], rec["request"],
                                                        rec["error"]))
            continue
        tokens += rec["tokens"]
        lat.append(rec["latency"])
        if rec.get("ttfb") is not None and json.loads(rec["key"]).get("stream"):
            ttfb.append(rec["ttfb"])
        refs = refs_by_version.get(rec["version"])
        if refs is None:
            errors.append("client %d request %d: weight_version %r, expected one of %s"
                          % (rec["client"], rec["request"], rec["version"],
                             sorted(refs_by_version)))
            continue
        ref = refs.get(rec["key"])
        if ref is None:
            errors.append("client %d request %d: no solo run to compare with"
                          % (rec["client"], rec["request"]))
            continue
        d = differences(rec["norm"], ref[0])
        if d:
            for f in d:
                fields[f] = fields.get(f, 0) + 1
            mismatches.append("client %d request %d (weight version %d): %s differ"
                              % (rec["client"], rec["request"], rec["version"], ", ".join(d)))
    failed = len(errors)
    missing = max(0, expected - len(recs))
    if missing:
        errors.append("%d requests not sent (time limit)" % missing)
    secs = t1 - t0
    ms = lambda x: None if x is None else round(1e3 * x, 2)  # noqa: E731
    return {"requests": len(recs), "seconds": round(secs, 3),
            "requests_per_s": round(len(recs) / secs, 2) if secs > 0 else None,
            "completion_tokens": tokens,
            "tokens_per_s": round(tokens / secs, 1) if secs > 0 else None,
            "latency_ms": {"p50": ms(pct(lat, 50)), "p90": ms(pct(lat, 90)),
                           "p99": ms(pct(lat, 99)), "max": ms(max(lat) if lat else None)},
            "stream_first_event_ms": {"p50": ms(pct(ttfb, 50)), "p99": ms(pct(ttfb, 99))},
            "errors": failed + missing,
            "mismatches": len(mismatches), "mismatched_fields": fields,
            "error_samples": errors[:10], "mismatch_samples": mismatches[:10]}


HEAD = "%-10s %8s %8s %10s %10s %9s %9s %9s %7s %10s" % (
    "phase", "requests", "seconds", "req/s", "tok/s", "p50 ms", "p90 ms", "p99 ms", "errors",
    "mismatches")


def row(label, s):
    f = lambda x: "-" if x is None else "%.1f" % x  # noqa: E731
    return "%-10s %8d %8.2f %10.2f %10.1f %9s %9s %9s %7d %10d" % (
        label, s["requests"], s["seconds"], s["requests_per_s"] or 0, s["tokens_per_s"] or 0,
        f(s["latency_ms"]["p50"]), f(s["latency_ms"]["p90"]), f(s["latency_ms"]["p99"]),
        s["errors"], s["mismatches"])


def engine_state(run, proc):
    """/parity/info's engine counters, this process's CPU seconds and, for a server this
    process started, the server's (Linux /proc), now."""
    state = {"wall": time.perf_counter(), "client_cpu": sum(os.times()[:2])}
    if proc is not None:
        try:
            with open("/proc/%d/stat" % proc.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state["server_cpu"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    try:
        cl = run.client()
        st, _, info, _, _, _ = cl.request("GET", "/parity/info")
        cl.close()
        if st == 200 and isinstance(info, dict):
            state.update({k: info.get(k) for k in ("decode_steps", "prefill_calls",
                                                   "engine_seconds")})
    except Exception:  # an old server, or none: the engine's figures are left out
        pass
    return state


def engine_use(a, b):
    """Where a phase's time went: the engine thread's wall time split (fractions), its decode
    steps and prefill calls, and the CPU seconds of the server and of this load generator."""
    out = {"wall_s": round(b["wall"] - a["wall"], 3),
           "client_cpu_s": round(b["client_cpu"] - a["client_cpu"], 3)}
    if "server_cpu" in a and "server_cpu" in b:
        out["server_cpu_s"] = round(b["server_cpu"] - a["server_cpu"], 3)
    if a.get("engine_seconds") and b.get("engine_seconds"):
        d = {k: b["engine_seconds"][k] - a["engine_seconds"].get(k, 0.0)
             for k in b["engine_seconds"]}
        total = sum(d.values()) or 1.0
        out["engine_split"] = {k: round(v / total, 3) for k, v in d.items()}
        out["decode_steps"] = b["decode_steps"] - a["decode_steps"]
        out["prefill_calls"] = b["prefill_calls"] - a["prefill_calls"]
    return out


def print_engine(e):
    parts = ["CPU s: server %s, load generator %s" % (e.get("server_cpu_s", "-"),
                                                      e["client_cpu_s"])]
    if "engine_split" in e:
        parts.append("engine thread: %s; %d decode steps, %d prefill calls" % (
            ", ".join("%s %.0f%%" % (k, 100 * v) for k, v in sorted(e["engine_split"].items())),
            e["decode_steps"], e["prefill_calls"]))
    print("           " + "; ".join(parts))


def print_samples(s):
    for e in s["error_samples"][:5]:
        print("    error: %s" % e)
    for e in s["mismatch_samples"][:5]:
        print("    mismatch: %s" % e)


# ---- the weight update ---------------------------------------------------------------------------

def perturbed_copy(src, dst, tensor):
    """Copies the safetensors file src to dst with the lowest mantissa bit of every bf16 value
    of `tensor` flipped (values stay finite: inf / nan patterns are left alone). Returns the
    number of values changed."""
    with open(src, "rb") as f:
        blob = bytearray(f.read())
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + hlen])
    if tensor not in header:
        sys.exit("serve-load: no tensor %r in %s" % (tensor, src))
    meta = header[tensor]
    if meta["dtype"] != "BF16":
        sys.exit("serve-load: %s is %s, not BF16" % (tensor, meta["dtype"]))
    a, b = meta["data_offsets"]
    base = 8 + hlen
    changed = 0
    for off in range(base + a, base + b, 2):
        (u,) = struct.unpack_from("<H", blob, off)
        if (u >> 7) & 0xff == 0xff:
            continue
        struct.pack_into("<H", blob, off, u ^ 1)
        changed += 1
    with open(dst, "wb") as f:
        f.write(blob)
    return changed


def update_scenario(run, k, m, refs0, workdir, args):
    cl = run.client()
    try:
        st, _, info, raw, _, _ = cl.request("GET", "/parity/info")
    except OSError as e:
        return {"error": "GET /parity/info: %s: %s" % (type(e).__name__, e)}, False
    finally:
        cl.close()
    if st != 200 or not isinstance(info, dict):
        return {"error": "GET /parity/info: HTTP %d %r" % (st, raw[:200])}, False
    v0 = info.get("weight_version")
    src = os.path.join(args.model, "model.safetensors")
    dst = os.path.join(workdir, "perturbed.safetensors")
    changed = perturbed_copy(src, dst, args.update_tensor)
    print("update: %s with the lowest mantissa bit of %d values of %s flipped"
          % (dst, changed, args.update_tensor), flush=True)
    total = k * m
    todo = {}
    for c in range(k):
        for r in range(m):
            body, stream = make_request(c, r, args.max_tokens, run.model)
            todo[key_of(body)] = (body, stream)
    solo0 = run.solo(todo, refs0, "solo v%s" % v0)
    state = {"done": 0, "fired": False}
    lock = threading.Lock()
    upd = {}

    def fire():
        ucl = Client(run.host, run.port, timeout=max(30.0, run.left() + 5))
        upd["t_send"] = time.perf_counter()
        try:
            st, _, resp, raw, _, done = ucl.request("POST", "/parity/update_weights",
                                                    {"path": dst})
            upd["t_done"] = done
            upd["status"], upd["response"] = st, resp if resp is not None else raw[:300].decode(
                "utf-8", "replace")
        except Exception as e:
            upd["t_done"] = time.perf_counter()
            upd["status"], upd["response"] = None, "%s: %s" % (type(e).__name__, e)
        finally:
            ucl.close()

    fire_thread = threading.Thread(target=fire, daemon=True)

    def progress(rec):
        with lock:
            state["done"] += 1
            go = not state["fired"] and state["done"] >= total // 2
            if go:
                state["fired"] = True
        if go:
            fire_thread.start()

    recs, t0, t1 = run.load(k, m, progress)
    if state["fired"]:
        fire_thread.join(max(1.0, run.left()))
    problems = []
    if upd.get("status") != 200 or not isinstance(upd.get("response"), dict):
        problems.append("update_weights: HTTP %r %r" % (upd.get("status"), upd.get("response")))
        v1 = None
    else:
        v1 = upd["response"].get("weight_version")
        if v1 != v0 + 1:
            problems.append("update_weights returned weight_version %r after %r" % (v1, v0))
    # ordering: sent after the update returned -> new weights; done before it was sent -> old
    order_bad = []
    n0 = n1 = 0
    for rec in recs:
        if "version" not in rec:
            continue
        if rec["version"] == v0:
            n0 += 1
        elif rec["version"] == v1:
            n1 += 1
        if "t_done" in upd and rec["t_send"] > upd["t_done"] and rec["version"] != v1:
            order_bad.append("client %d request %d sent after the update returned, on weight "
                             "version %r" % (rec["client"], rec["request"], rec["version"]))
        if "t_send" in upd and rec["t_done"] < upd["t_send"] and rec["version"] != v0:
            order_bad.append("client %d request %d finished before the update was sent, on "
                             "weight version %r" % (rec["client"], rec["request"],
                                                    rec["version"]))
    refs1 = {}
    solo1 = None
    if v1 is not None:
        todo1 = {}
        for rec in recs:
            if rec.get("version") == v1:
                body = json.loads(rec["key"])
                todo1[rec["key"]] = (body, bool(body.get("stream")))
        solo1 = run.solo(todo1, refs1, "solo v%d" % v1)
        for key, (norm, ver) in refs1.items():
            if ver != v1:
                problems.append("a solo run after the update on weight version %r" % ver)
                break
    by_version = {v0: refs0}
    if v1 is not None:
        by_version[v1] = refs1
    s = summarize(recs, t0, t1, by_version, total)
    changed_by_update = sum(1 for key, (norm, _) in refs1.items()
                            if key in refs0 and differences(norm, refs0[key][0]))
    s.update(clients=k, requests_per_client=m, weight_version_before=v0,
             weight_version_after=v1, responses_on_old=n0, responses_on_new=n1,
             update_status=upd.get("status"), update_response=upd.get("response"),
             update_sent_after_s=round(upd["t_send"] - t0, 3) if "t_send" in upd else None,
             update_took_s=round(upd["t_done"] - upd["t_send"], 3) if "t_done" in upd else None,
             order_violations=len(order_bad), order_samples=order_bad[:10],
             problems=problems, solo_before=solo0, solo_after=solo1,
             new_solo_differs_from_old=changed_by_update, perturbed_tensor=args.update_tensor,
             perturbed_values=changed)
    if args.url:
        # leave a shared server on the weights it had
        cl = Client(run.host, run.port, timeout=max(30.0, run.left() + 5))
        try:
            st, _, resp, raw, _, _ = cl.request("POST", "/parity/update_weights", {"path": src})
            s["restored"] = {"status": st, "response": resp}
        except Exception as e:
            s["restored"] = {"error": str(e)}
        finally:
            cl.close()
    ok = (not problems and not order_bad and s["errors"] == 0 and s["mismatches"] == 0
          and not s["error_samples"] and solo0["errors"] == 0
          and (solo1 is None or solo1["errors"] == 0))
    return s, ok


# ---- wrk ---------------------------------------------------------------------------------------

def find_wrk(install):
    w = shutil.which("wrk")
    if w or not install:
        return w, None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "wrk is not installed (apt-get install wrk needs root)"
    print("wrk: not installed, apt-get install -y wrk", flush=True)
    try:
        p = subprocess.run(["apt-get", "install", "-y", "wrk"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=300,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    except subprocess.TimeoutExpired:
        return None, "apt-get install wrk timed out"
    w = shutil.which("wrk")
    if not w:
        return None, "apt-get install wrk failed: %s" % p.stdout.decode(errors="replace")[-300:]
    return w, None


def wrk_time(s):
    for unit, f in (("us", 1e-3), ("ms", 1.0), ("s", 1e3), ("m", 6e4)):
        if s.endswith(unit):
            try:
                return float(s[:-len(unit)]) * f
            except ValueError:
                return None
    return None


def parse_wrk(out):
    res = {"requests_per_s": None, "requests": None, "latency_ms": {}, "non_2xx": 0,
           "socket_errors": {}}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        w = line.split()
        if line.startswith("Requests/sec:"):
            res["requests_per_s"] = float(w[1])
        elif "requests in" in line and w and w[0].isdigit():
            res["requests"] = int(w[0])
        elif line.strip().startswith("Non-2xx or 3xx responses:"):
            res["non_2xx"] = int(w[-1])
        elif line.strip().startswith("Socket errors:"):
            for part in line.split(":", 1)[1].split(","):
                name, val = part.split()
                res["socket_errors"][name] = int(val)
        elif len(w) == 2 and w[0] in ("50%", "75%", "90%", "99%"):
            res["latency_ms"]["p" + w[0][:-1]] = wrk_time(w[1])
    return res


def wrk_phase(run, ks, args, workdir):
    wrk, why = find_wrk(True)
    if not wrk:
        print("wrk: %s" % why)
        return {"missing": why}, True
    body = json.dumps({"model": run.model, "prompt": "def f(x):\n    ", "max_tokens": 8,
                       "temperature": 0.8, "seed": 42, "logprobs": 1})
    lua = os.path.join(workdir, "completion.lua")
    with open(lua, "w") as f:
        f.write('wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = '
                '"application/json"\n' % json.dumps(body))
    base = "http://%s:%d" % (run.host if ":" not in run.host else "[%s]" % run.host, run.port)
    results, ok = [], True
    print("wrk: %s, %d s per run" % (wrk, args.wrk_seconds))
    print("%-22s %6s %10s %10s %9s %9s %9s %8s %8s" % ("wrk", "conns", "requests", "req/s",
                                                      "p50 ms", "p90 ms", "p99 ms", "non-2xx",
                                                      "sock err"))
    for target, path, script in (("GET /health", "/health", None),
                                 ("POST /v1/completions", "/v1/completions", lua)):
        for k in ks:
            if run.left() < args.wrk_seconds + 15:
                run.timed_out = True
                return results, False
            cmd = [wrk, "-t", str(min(2, k)), "-c", str(k), "-d", "%ds" % args.wrk_seconds,
                   "--latency", "--timeout", "30s"]
            if script:
                cmd += ["-s", script]
            cmd.append(base + path)
            try:
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=args.wrk_seconds + 60)
                out = p.stdout.decode(errors="replace")
            except subprocess.TimeoutExpired:
                out, p = "", None
            r = parse_wrk(out)
            r.update(target=target, connections=k, exit=p.returncode if p else None)
            if r["requests_per_s"] is None:
                r["output"] = out[-500:]
                ok = False
            if r["non_2xx"] or any(r["socket_errors"].values()):
                ok = False
            results.append(r)
            f = lambda x: "-" if x is None else "%.2f" % x  # noqa: E731
            print("%-22s %6d %10s %10s %9s %9s %9s %8d %8d" % (
                target, k, r["requests"] if r["requests"] is not None else "-",
                f(r["requests_per_s"]), f(r["latency_ms"].get("p50")),
                f(r["latency_ms"].get("p90")), f(r["latency_ms"].get("p99")), r["non_2xx"],
                sum(r["socket_errors"].values())), flush=True)
    return results, ok


# ---- the server --------------------------------------------------------------------------------

def start_server(args, workdir):
    port_file = os.path.join(workdir, "port")
    env = dict(os.environ)
    env.setdefault("PARITY_LIBRARY", os.path.join(REPO, "build", "lib", "libparity.so"))
    env["PYTHONPATH"] = os.path.join(REPO, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "parity.serve", "--model", args.model, "--host", "127.0.0.1",
           "--port", "0", "--port-file", port_file, "--threads", str(args.server_threads),
           "--max-batch", str(args.max_batch)] + args.server_arg
    log = open(os.path.join(workdir, "server.log"), "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.start_timeout:
        if proc.poll() is not None:
            break
        try:
            with open(port_file) as f:
                text = f.read()
            if text.endswith("\n"):
                return proc, int(text), cmd
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    stop_server(proc)
    with open(os.path.join(workdir, "server.log"), "rb") as f:
        tail = f.read()[-2000:].decode(errors="replace")
    print("serve-load: the server did not start (%s):\n%s" % (" ".join(cmd), tail),
          file=sys.stderr)
    return None, None, cmd


def stop_server(proc):
    if proc is None or proc.poll() is not None:
        return proc.returncode if proc else None
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "killed after SIGTERM did not stop it in 20 s"


# ---- main --------------------------------------------------------------------------------------

def sampler_peer(args, info, k):
    """The sampler's own decode tokens/s at batch k on the server's model, policy and threads
    (build/bench/parity-speed, contexts = --max-tokens: the median of 15 repetitions of its 32
    steps, about 0.1 s each, since this VM's speed jumps 2.5x for a second at a time), or None
    when it cannot run (it says why on stderr)."""
    exe = os.path.join(REPO, "build", "bench", "parity-speed")
    out = tempfile.NamedTemporaryFile(prefix="serve-load-peer-", suffix=".json", delete=False)
    out.close()
    cmd = [exe, "--model", args.model, "--presets", str(info.get("policy", "aligned")),
           "--backends", str(info.get("backend", "bf16")),
           "--threads", str(args.server_threads), "--batches", str(k),
           "--contexts", str(args.max_tokens), "--reps", "15", "--peers", "none",
           "--json", out.name]
    try:
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=300)
        if done.returncode != 0:
            print("serve-load: the sampler peer failed (%s): %s"
                  % (" ".join(cmd), done.stderr.decode(errors="replace").strip()[-300:]),
                  file=sys.stderr)
            return None
        with open(out.name) as f:
            rows = [r for r in json.load(f)["results"] if r.get("phase") == "decode"]
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        print("serve-load: the sampler peer could not run (%s): %s" % (exe, e), file=sys.stderr)
        return None
    finally:
        os.unlink(out.name)
    return rows[0]["tokens_per_s"] if rows else None


def peer_summary(phase, before, after):
    """The server's tokens/s against the sampler peers measured before and after the phase."""
    known = [x for x in (before, after) if x]
    out = {"sampler_tokens_per_s_before": before, "sampler_tokens_per_s_after": after,
           "fraction_of_sampler": None}
    if known and phase.get("tokens_per_s"):
        out["fraction_of_sampler"] = round(phase["tokens_per_s"] / (sum(known) / len(known)), 3)
    return out


def print_peer(k, peer):
    if peer["fraction_of_sampler"] is None:
        print("  sampler peer at batch %d: not measured" % k)
        return
    print("  sampler peer at batch %d: %s tokens/s before, %s after; the server delivered %.0f%% "
          "of their mean" % (k, peer["sampler_tokens_per_s_before"],
                             peer["sampler_tokens_per_s_after"],
                             100 * peer["fraction_of_sampler"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8,32",
                    help="comma-separated K values (concurrent clients); '' for none")
    ap.add_argument("--requests", type=int, default=16, help="requests per client (M)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--url", help="a running server (http://127.0.0.1:PORT; loopback only)")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="the model directory (the server's --model; --update copies its "
                         "model.safetensors)")
    ap.add_argument("--served-model-name", help="the name requests carry (default: asked "
                    "from /v1/models)")
    ap.add_argument("--server-threads", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="one more argument for the server (repeatable)")
    ap.add_argument("--update", action="store_true",
                    help="also the weight-update-during-load scenario")
    ap.add_argument("--update-clients", type=int, help="K of the update scenario (default the "
                    "largest --clients, else 8)")
    ap.add_argument("--update-tensor", default="model.layers.2.mlp.down_proj.weight")
    ap.add_argument("--wrk", action="store_true", help="also raw request rates with wrk")
    ap.add_argument("--wrk-seconds", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=600.0,
                    help="hard bound on the whole run, seconds")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--json", help="also write the JSON object to FILE")
    ap.add_argument("--sampler-peer", action="store_true",
                    help="before and after each K phase, run the sampler alone on the same "
                         "model, policy, threads and batch K (build/bench/parity-speed's decode "
                         "row) and print the server's tokens/s as a fraction of the mean of the "
                         "two: on a VM whose speed moves between minutes, the peer measured "
                         "next to the phase is the only fair denominator")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each K phase this many times (with --sampler-peer, the peers of "
                         "each round beside it) and print the median share of the sampler")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= 100:
        ap.error("--rounds must be 1..100")
    ks = [int(x) for x in args.clients.split(",") if x.strip()]
    if any(k < 1 or k > 256 for k in ks) or not 1 <= args.requests <= 10000:
        ap.error("K must be 1..256 and --requests 1..10000")
    if args.max_tokens < 17:
        ap.error("--max-tokens must be >= 17 (requests use T, T-8 and T-16)")
    if args.url:
        u = urllib.parse.urlsplit(args.url)
        if u.scheme != "http" or not u.hostname:
            ap.error("--url must be http://HOST:PORT")
        check_loopback(u.hostname)

    hard = args.time_limit + 60

    def watchdog():
        time.sleep(hard)
        print("serve-load: hard time limit (%.0f s) passed, exiting" % hard, file=sys.stderr,
              flush=True)
        if server["proc"] is not None:
            server["proc"].kill()
        os._exit(2)

    server = {"proc": None}
    threading.Thread(target=watchdog, daemon=True).start()
    workdir = tempfile.mkdtemp(prefix="serve-load-")
    result = {"bench": "serve-load", "clients": ks, "requests_per_client": args.requests,
              "max_tokens": args.max_tokens, "time_limit_s": args.time_limit}
    ok = True
    try:
        if args.url:
            host, port = u.hostname, u.port or 80
            result["server"] = args.url
        else:
            proc, port, cmd = start_server(args, workdir)
            if proc is None:
                return 2
            server["proc"] = proc
            host = "127.0.0.1"
            result["server"] = " ".join(os.path.relpath(c, REPO) if c.startswith(REPO + "/")
                                        else c for c in cmd[1:])
        cl = Client(host, port, timeout=30)
        st, _, info, raw, _, _ = cl.request("GET", "/parity/info")
        st2, _, models, raw2, _, _ = cl.request("GET", "/v1/models")
        cl.close()
        if st != 200 or st2 != 200 or not isinstance(info, dict):
            print("serve-load: /parity/info HTTP %d, /v1/models HTTP %d" % (st, st2),
                  file=sys.stderr)
            return 2
        name = args.served_model_name or models["data"][0]["id"]
        result["info"] = info
        print("server: %s on %s:%d, model %s, weight version %s, max_batch %s, cpu_path %s"
              % ("started" if server["proc"] else "given", host, port, name,
                 info.get("weight_version"), info.get("max_batch"), info.get("cpu_path")))
        run = Run(args, host, port, name)
        run.proc = server["proc"]
        result["run"] = run

        refs0 = {}
        kmax = max(ks) if ks else 0
        phases = []
        if ks:
            todo = {}
            for c in range(kmax):
                for r in range(args.requests):
                    body, stream = make_request(c, r, args.max_tokens, name)
                    todo[key_of(body)] = (body, stream)
            result["solo"] = run.solo(todo, refs0, "solo", cross=True)
            if result["solo"]["errors"]:
                ok = False
            v0 = info.get("weight_version")
            print(HEAD)
            shares = {}
            for k, rnd in [(k, i) for k in ks for i in range(args.rounds)] \
                    if not run.stopped() else []:
                peer_before = sampler_peer(args, info, k) if args.sampler_peer else None
                before = engine_state(run, server["proc"])
                after = {}
                try:
                    recs, t0, t1 = run.load(k, args.requests, at_end=lambda: after.update(
                        engine_state(run, server["proc"])))
                except TimeUp:
                    break
                s = summarize(recs, t0, t1, {v0: refs0}, k * args.requests)
                s["clients"] = k
                if args.rounds > 1:
                    s["round"] = rnd + 1
                s["engine"] = engine_use(before, after)
                phases.append(s)
                print(row("K = %d" % k if args.rounds == 1 else "K=%d r%d" % (k, rnd + 1), s),
                      flush=True)
                if args.sampler_peer:
                    peer_after = sampler_peer(args, info, k)
                    s["sampler_peer"] = peer_summary(s, peer_before, peer_after)
                    print_peer(k, s["sampler_peer"])
                    if s["sampler_peer"]["fraction_of_sampler"] is not None:
                        shares.setdefault(k, []).append(s["sampler_peer"]["fraction_of_sampler"])
                print_engine(s["engine"])
                print_samples(s)
                if s["errors"] or s["mismatches"] or s["error_samples"]:
                    ok = False
                if run.stopped():
                    break
            if args.rounds > 1 and shares:
                result["sampler_share_median"] = {}
                for k, xs in sorted(shares.items()):
                    med = sorted(xs)[(len(xs) - 1) // 2] if len(xs) % 2 else \
                        (sorted(xs)[len(xs) // 2 - 1] + sorted(xs)[len(xs) // 2]) / 2
                    result["sampler_share_median"][str(k)] = round(med, 3)
                    print("K = %d: the server's share of the sampler peer over %d rounds: median "
                          "%.0f%% (%s)" % (k, len(xs), 100 * med,
                                           ", ".join("%.0f%%" % (100 * x) for x in xs)))
        result["phases"] = phases

        if args.update and not run.stopped():
            ku = args.update_clients or (kmax if kmax else 8)
            s, uok = update_scenario(run, ku, args.requests, refs0, workdir, args)
            result["update"] = s
            ok = ok and uok
            if "requests" in s:
                print(HEAD)
                print(row("update", s))
                print_samples(s)
                print("update: sent after %s s of load, returned in %s s: HTTP %s %s"
                      % (s["update_sent_after_s"], s["update_took_s"], s["update_status"],
                         json.dumps(s["update_response"])))
                print("update: %d responses on weight version %s, %d on %s; %d order "
                      "violations; %d of %d new-weight solo runs differ from the old ones"
                      % (s["responses_on_old"], s["weight_version_before"],
                         s["responses_on_new"], s["weight_version_after"],
                         s["order_violations"], s["new_solo_differs_from_old"],
                         s["solo_after"]["requests"] if s["solo_after"] else 0))
                for p in s["problems"] + s["order_samples"][:5]:
                    print("    problem: %s" % p)
            else:
                print("update: %s" % s.get("error"))

        if args.wrk and not run.stopped():
            w, wok = wrk_phase(run, ks or [8], args, workdir)
            result["wrk"] = w
            ok = ok and wok
        if run.timed_out:
            print("serve-load: the time limit (%.0f s) cut the run short" % args.time_limit)
            result["timed_out"] = True
    finally:
        run = result.pop("run", None)
        if server["proc"] is not None:
            died = server["proc"].poll()
            rc = stop_server(server["proc"])
            result["server_exit"] = rc
            if died is not None:
                print("serve-load: the server exited by itself during the run, status %r"
                      % died)
                result["server_died"] = died
            elif rc != 0:
                print("serve-load: the server exited with %r on SIGTERM (expected 0)" % rc)
            if rc != 0 or died is not None:
                ok = False
                with open(os.path.join(workdir, "server.log"), "rb") as f:
                    tail = f.read()[-3000:].decode(errors="replace")
                print("serve-load: the server's log ends with:\n" + tail)
                result["server_log_tail"] = tail
        elif run is not None and run.server_died is not None:
            ok = False
        shutil.rmtree(workdir, ignore_errors=True)
    result["ok"] = ok and not result.get("timed_out")
    pybench.emit(result, args.json)
    if result.get("timed_out"):
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
