"""The engine loop of parity.serve: one thread owns the sampler and steps every live request
together (continuous batching), applying weight updates once no request is in flight; the gate
between scoring calls and updates."""
import collections
import sys
import threading
import time
from array import array

from .. import _lib
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
