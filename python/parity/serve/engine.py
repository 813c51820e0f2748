"""The engine loop of parity.serve: one thread owns the sampler and steps every live request
together (continuous batching), applying weight updates once no request is in flight and the
control jobs (pause, resume, abort, flush) between two steps; the gate between scoring calls
and updates."""
import collections
import sys
import threading
import time
from array import array

from .._lib import ParityError
from ..sampler import FINISH_REASONS
from .protocol import ApiError, _parity_error

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
        self.expect_version = None  # the version the update must make (SGLang's weight_version)
        self.queued = time.perf_counter()
        self.result = None
        self.error = None
        self.done = threading.Event()


class Control:
    """A control job for the engine thread (pause, resume, abort, flush): run between two
    decode steps, so that it sees and changes a consistent state; `result` or `error` once
    `done` is set."""

    def __init__(self, kind, **args):
        self.kind, self.args = kind, args
        self.result = None
        self.error = None
        self.done = threading.Event()

    def answer(self, result=None, error=None):
        self.result, self.error = result, error
        self.done.set()


# Pause modes: "abort" answers every request in flight or waiting with what it drew so far
# (finish_reason "abort"); "wait" lets the requests in flight finish; "keep" freezes them where
# they are (their sequences and KV cache kept) until resume. Nothing is admitted while paused.
PAUSE_MODES = ("abort", "wait", "keep")


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
        # where the engine thread's time went (seconds of wall time, /parity/info): in the
        # sampler's decode steps and prefills (forks included; each from the call to its return,
        # the wait for the interpreter lock after it included), idle (nothing to do), the rest
        self.started = time.perf_counter()
        self.seconds = {"decode": 0.0, "prefill": 0.0, "idle": 0.0}
        self.idle_since = None      # when the wait in progress began (None: not waiting)
        self.prefills = 0           # prefill calls: parity_sampler_add or _add_batch
        self.paused = None          # None or one of PAUSE_MODES
        self.controls = collections.deque()
        self.pause_waiters = []     # "wait" pauses answered once no request is in flight
        self.by_id = {}             # the requests waiting or in flight, by response id
        # The prompt cache: prompts prefilled already, each a sequence of the sampler that is
        # never stepped (its KV cache holds the prompt but its last token, which the first
        # step of each fork feeds), least recently used first. A request whose prompt is here
        # forks it instead of prefilling again: the same bits, since a prompt's KV depends only
        # on its tokens and the weights (the sampler is batch-invariant). Emptied by a weight
        # update and by /flush_cache; its sequences' slots and KV are reserved like a request's.
        self.prompt_cache = collections.OrderedDict()   # tuple(prompt) -> (seq, cache tokens)
        self.prompt_cache_limit = server.prompt_cache_entries
        self.cached_cache = 0       # KV positions and slots the cached prompts hold
        self.cached_slots = 0
        self.prompt_hits = self.prompt_misses = 0

    def submit(self, req):
        with self.cv:
            if self.stopping or not self.is_alive():
                raise ApiError(503, "the server is shutting down", None, "shutting_down")
            if len(self.waiting) >= self.server.max_queue:
                raise ApiError(503, "the server is full: %d requests are waiting (--max-queue)"
                               % len(self.waiting), None, "queue_full")
            if req.id in self.by_id:
                raise ApiError(409, "a request with id %s is already waiting or in flight"
                               % req.id, "request_id", "duplicate_request_id")
            self.by_id[req.id] = req
            self.waiting.append(req)
            self.cv.notify()

    def control(self, ctl):
        """Runs a control job in the engine thread; its result, or raises its ApiError."""
        with self.cv:
            if self.stopping or not self.is_alive():
                raise ApiError(503, "the server is shutting down", None, "shutting_down")
            self.controls.append(ctl)
            self.cv.notify()
        ctl.done.wait()
        if ctl.error is not None:
            raise ctl.error
        return ctl.result

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

    def _fits(self, req, cached=True):
        """Whether the request fits beside the running ones (and, with `cached`, the prompt
        cache's sequences). Called with self.cv held."""
        cache = self.reserved_cache - (0 if cached else self.cached_cache)
        slots = self.reserved_slots - (0 if cached else self.cached_slots)
        return (cache + req.cache_need <= self.server.cache_tokens and
                self.reserved_seqs + req.seqs <= self.server.max_batch and
                slots + req.slots <= self.server.max_seqs)

    def _admissible(self, req):
        """Whether the request fits, evicting cached prompts (least recently used first) if
        they are what stands in its way. Called with self.cv held."""
        if not self._fits(req, cached=False):
            return False
        while not self._fits(req):
            self._evict_prompt()
        return True

    def _evict_prompt(self):
        """Releases the least recently used cached prompt. Called with self.cv held."""
        _, (seq, tokens) = self.prompt_cache.popitem(last=False)
        self._release(seq)
        self.reserved_cache -= tokens
        self.reserved_slots -= 1
        self.cached_cache -= tokens
        self.cached_slots -= 1

    def flush_prompts(self):
        """Empties the prompt cache (engine thread)."""
        with self.cv:
            flushed = len(self.prompt_cache)
            while self.prompt_cache:
                self._evict_prompt()
        return flushed

    def _keep_prompt(self, key, seq):
        """Keeps a prefilled prompt in the cache (or releases it if the cache is off)."""
        if self.prompt_cache_limit == 0 or key in self.prompt_cache:
            self._release(seq)
            return
        tokens = self.server.cache_need([key], 1, 1)
        with self.cv:
            if len(self.prompt_cache) >= self.prompt_cache_limit:
                self._evict_prompt()
            self.prompt_cache[key] = (seq, tokens)
            self.reserved_cache += tokens
            self.reserved_slots += 1
            self.cached_cache += tokens
            self.cached_slots += 1

    def run(self):
        self.started = time.perf_counter()
        profile = None
        if self.server.args.profile:
            import cProfile
            profile = cProfile.Profile()
            profile.enable()
            self.sampler.set_profiling(True)    # the sampler's own time in its calls
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
                controls, self.controls = list(self.controls), collections.deque()
            for ctl in controls + self.pause_waiters:
                ctl.answer(error=ApiError(503, "the server is shutting down"))
            for req in list(self.active):
                self._finish(req, ApiError(503, "the server is shutting down"))
            for req in waiting:
                req.error = ApiError(503, "the server is shutting down")
                req.push(("error", req.error))
            for upd in updates:
                upd.error = ApiError(503, "the server is shutting down; nothing was changed")
                self.server.gate.release()
                upd.done.set()

    def _runnable(self):
        """Whether the engine thread has work (called with self.cv held)."""
        return (self.controls or self.updates or self.stopping or
                (self.active and self.paused != "keep") or
                (self.waiting and self.paused is None))

    def _loop(self):
        while True:
            admitted, update, refused, controls = [], None, None, ()
            with self.cv:
                if not self._runnable():
                    self.idle_since = time.perf_counter()
                    while not self._runnable():
                        self.cv.wait()
                    self.seconds["idle"] += time.perf_counter() - self.idle_since
                    self.idle_since = None
                if self.stopping:
                    break
                if self.controls:
                    controls, self.controls = list(self.controls), collections.deque()
                elif self.updates:
                    if not self.active:
                        update = self.updates.popleft()
                    elif self.paused == "keep":
                        refused = self.updates.popleft()
                elif self.paused is None:
                    while self.waiting and self._admissible(self.waiting[0]):
                        req = self.waiting.popleft()
                        if req.cancelled:
                            self.by_id.pop(req.id, None)
                            continue
                        self.reserved_cache += req.cache_need
                        self.reserved_slots += req.slots
                        self.reserved_seqs += req.seqs
                        admitted.append(req)
            if controls:
                for ctl in controls:
                    self._control(ctl)
                continue
            if refused is not None:
                refused.error = ApiError(
                    409, "generation is paused with its requests kept in flight (mode keep): "
                    "an update waits for them to finish, which they cannot while paused; "
                    "resume, or abort them (POST /abort_requests), first; nothing was changed",
                    None, "requests_in_flight")
                self.server.gate.release()
                refused.done.set()
                continue
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
            if self.active and self.paused != "keep":
                try:
                    self._step()
                except Exception as e:  # a bug in the step: every request in it is answered
                    error = ApiError(500, "internal error: %s: %s" % (type(e).__name__, e))
                    for req in list(self.active):
                        self._finish(req, error)
            if self.pause_waiters and not self.active:
                for ctl in self.pause_waiters:
                    ctl.answer(self._pause_result(ctl.args["mode"], [], []))
                self.pause_waiters = []

    # ---- control jobs (engine thread) ----------------------------------------------------

    def _control(self, ctl):
        try:
            getattr(self, "_control_" + ctl.kind)(ctl)
        except ApiError as e:
            ctl.answer(error=e)
        except Exception as e:  # a bug: answered, the server goes on
            ctl.answer(error=ApiError(500, "internal error: %s: %s" % (type(e).__name__, e)))

    def _pause_result(self, mode, aborted, kept):
        with self.cv:
            waiting = len(self.waiting)
        return {"status": "paused", "mode": mode, "aborted": aborted, "kept": kept,
                "waiting": waiting, "weight_version": self.server.model.version}

    def _control_pause(self, ctl):
        mode = ctl.args["mode"]
        if self.paused is not None:
            raise ApiError(409, "generation is already paused (mode %s): resume first"
                           % self.paused, None, "already_paused")
        self.paused = mode
        aborted, kept = [], []
        if mode == "abort":
            aborted = self._abort_all()
        elif mode == "keep":
            kept = [req.id for req in self.active]
        elif self.active:               # "wait": answered once the last one has finished
            self.pause_waiters.append(ctl)
            return
        ctl.answer(self._pause_result(mode, aborted, kept))

    def _control_resume(self, ctl):
        if self.paused is None:
            raise ApiError(409, "generation is not paused", None, "not_paused")
        for waiter in self.pause_waiters:
            waiter.answer(error=ApiError(409, "generation was resumed before the requests in "
                                         "flight finished", None, "resumed"))
        self.pause_waiters = []
        self.paused = None
        ctl.answer({"status": "resumed", "weight_version": self.server.model.version})

    def _control_abort(self, ctl):
        """Aborts the requests named (all of them, or none if one is unknown), or every
        request waiting or in flight when `ids` is None."""
        ids = ctl.args["ids"]
        if ids is None:
            ctl.answer({"aborted": self._abort_all(),
                        "weight_version": self.server.model.version})
            return
        with self.cv:
            unknown = [i for i in ids if i not in self.by_id]
            reqs = [self.by_id[i] for i in dict.fromkeys(ids) if i in self.by_id]
        if unknown:
            raise ApiError(404, "no request waiting or in flight has the id %s (finished "
                           "already, or never sent); nothing was aborted"
                           % ", ".join(unknown[:10]), ctl.args["param"], "request_not_found")
        for req in reqs:
            self._abort(req)
        ctl.answer({"aborted": [req.id for req in reqs],
                    "weight_version": self.server.model.version})

    def _control_flush(self, ctl):
        """Empties the prompt cache; the requests in flight keep what they forked from it."""
        flushed = self.flush_prompts()
        self.server.current_checksums = None
        ctl.answer({"status": "flushed", "prompts_flushed": flushed,
                    "weight_version": self.server.model.version})

    def _abort_all(self):
        with self.cv:
            reqs = list(self.active) + list(self.waiting)
        for req in reqs:
            self._abort(req)
        return [req.id for req in reqs]

    def _abort(self, req):
        """Answers a request waiting or in flight with what it drew so far: its unfinished
        choices end with finish_reason "abort"."""
        with self.cv:
            if req in self.waiting:
                self.waiting.remove(req)
                req.cache_need = req.slots = req.seqs = 0   # nothing was reserved for it
                req.version = self.server.model.version
                req.push(("started", req.version))
        for c in req.choices:
            if c.finish_reason is not None:
                continue
            if c.seq is not None and req.return_routed_experts:
                c.routes = self.sampler.routes(c.seq)
            with req.wake:
                c.finish_reason = "abort"
        self._finish(req)

    def time_split(self):
        """Seconds of the engine thread's wall time since it started: decode, prefill, idle
        and other (its own Python, control jobs, weight updates, the locks it takes)."""
        with self.cv:       # the idle time so far of a wait in progress counts too
            now = time.perf_counter()
            out = dict(self.seconds)
            if self.idle_since is not None:
                out["idle"] += now - self.idle_since
        out["other"] = max(0.0, now - self.started - sum(out.values()))
        return {k: round(v, 6) for k, v in out.items()}

    def _write_profile(self, profile):
        """--profile: where the engine thread's time went, by function (cProfile), most first."""
        import io
        import pstats
        out = io.StringIO()
        out.write("parity.serve engine thread: %d decode steps, %d prefill calls; %s\n"
                  % (self.steps, self.prefills, ", ".join(
                      "%s %.3f s" % kv for kv in sorted(self.time_split().items()))))
        own = self.sampler.profile()
        inside = self.seconds["decode"] + self.seconds["prefill"]
        out.write("the sampler's calls: %.3f s inside the library (%d calls, %d forwards); the "
                  "engine thread's decode and prefill wall time around them: %.3f s (the rest: "
                  "ctypes, and waiting for the interpreter lock after each call)\n"
                  % (own["call_seconds"], own["calls"], own["forwards"], inside))
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
        """Starts the requests admitted together: their distinct prompts that are not in the
        prompt cache are prefilled in one parity_sampler_add_batch (a few forwards instead of
        one per prompt; the same bits) and kept in the cache, then each request forks its
        completions. If the batch is refused, each request prefills its own prompts and gets
        its own answer."""
        fresh, missing = {}, []
        for req in reqs:
            for p in req.prompts:
                key = tuple(p)
                if key not in self.prompt_cache and key not in fresh:
                    fresh[key] = None
                    missing.append(key)
        if missing:
            t0 = time.perf_counter()
            try:
                self.prefills += 1
                if len(missing) == 1:
                    ids = [self.sampler._add(array("i", missing[0]), reqs[0].sampling, 0)]
                else:
                    ids = self.sampler._add_batch([array("i", k) for k in missing],
                                                  [reqs[0].sampling] * len(missing),
                                                  [0] * len(missing))
                fresh = dict(zip(missing, ids))
            except ParityError:
                fresh = {}
            finally:
                self.seconds["prefill"] += time.perf_counter() - t0
        version = self.server.model.version     # only this thread changes it
        try:
            for req in reqs:
                try:
                    self._start_one(req, fresh, version)
                except Exception as e:  # a bug: this request is answered, the others go on
                    self._finish(req, ApiError(500, "internal error: %s: %s"
                                               % (type(e).__name__, e)))
        finally:
            for key, seq in fresh.items():
                if seq is not None:
                    self._keep_prompt(key, seq)

    def _start_one(self, req, fresh, version):
        """Forks each prompt's n completions (stream i for the i-th), as Sampler.generate()
        does, from the prompt cache, from `fresh` (prompts prefilled for this admission), or
        from a prefill of its own (released afterwards)."""
        s = self.sampler
        req.version = version
        own = []
        t0 = time.perf_counter()
        try:
            for p, prompt in enumerate(req.prompts):
                key = tuple(prompt)
                parent = fresh.get(key)
                if parent is None and key in self.prompt_cache:
                    self.prompt_hits += 1
                    self.prompt_cache.move_to_end(key)
                    parent = self.prompt_cache[key][0]
                else:
                    self.prompt_misses += 1
                    if parent is None:      # the batch was refused: a prefill of its own
                        self.prefills += 1
                        parent = s._add(array("i", prompt), req.sampling, 0)
                        own.append(parent)
                for c in req.choices[p * req.n:(p + 1) * req.n]:
                    c.seq = s._fork(parent, req.sampling, c.index - p * req.n)
        except ParityError as e:
            self._finish(req, _parity_error(e))
            return
        finally:
            for parent in own:
                self._release(parent)
            self.seconds["prefill"] += time.perf_counter() - t0
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
            self.by_id.pop(req.id, None)
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
        t0 = time.perf_counter()
        try:
            tok, lp, fin, tid, tlp = self.sampler._step([c.seq for _, c in live], k)
        except ParityError as e:
            for req in list(self.active):
                self._finish(req, _parity_error(e))
            return
        finally:
            self.seconds["decode"] += time.perf_counter() - t0
        self.steps += 1
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
                reason = req.take(c, t, reason)     # its text; stop strings
                if reason is not None:
                    if req.return_routed_experts:
                        c.routes = self.sampler.routes(c.seq)
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
            if upd.expect_version is not None and upd.expect_version != srv.model.version + 1:
                raise ApiError(409, "weight_version %d: this update would make version %d; "
                               "nothing was changed" % (upd.expect_version,
                                                        srv.model.version + 1),
                               "weight_version", "weight_version_mismatch")
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
                self.flush_prompts()    # their KV came from the weights before
            except ParityError as e:
                raise ApiError(400, "update refused, nothing was changed: %s" % e, None,
                               e.status.lower()) from None
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
