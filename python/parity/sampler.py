"""The sampler: KV-cached batched generation whose log-probs equal the scorer's bitwise."""
import collections
import ctypes
import threading
from array import array

from . import _lib
from ._convert import TokenBatch, pointer
from ._lib import BACKENDS, MODES, ParityError, lib
from ._routes import Routes
from ._lib import as_choice as _choice
from .policy import policy_struct

#: Why a sequence finished (parity_finish), None while it runs.
FINISH_REASONS = (None, "stop", "length", "capacity")

Step = collections.namedtuple("Step", "token logprob finish_reason top_ids top_logprobs")
Step.__doc__ = """What one decode step drew for one sequence: the token, its log-prob in the
sequence's mode, why it finished (None, "stop", "length", "capacity"), and its top_n
alternatives (lists, best first; empty unless the sequence asked for top_n)."""


#: Looped models: how a decode step chooses its loops (parity_exit_rule), and what an exited
#: token leaves in the deeper KV planes (parity_loop_kv).
EXIT_RULES = {"full": 0, "threshold": 1, "fixed": 2}
LOOP_KV = {"last-exited": 0, "full": 1}


def sampling_struct(temperature=1.0, top_k=None, top_p=None, min_p=None, seed=0,
                    max_tokens=None, stop=(), mode="raw", top_n=0, exit_rule="full",
                    exit_threshold=1.0, min_depth=None, max_depth=None):
    """A parity_sampling from Python arguments.

    temperature: 0 = greedy; top_k/top_p/min_p: None = off; seed: 0 .. 2**64-1 (with the
    stream and the position it keys the randomness); max_tokens: finish after this many
    generated tokens (None/0 = only stop tokens or capacity); stop: token ids that finish a
    sequence (included in its tokens), at most 16; mode: the reported log-probs' mode
    ("raw", "processed", "processed-truncated"); top_n: alternatives reported per step.
    Looped models: exit_rule "full" (every loop), "threshold" (exit after the first loop whose
    exit CDF >= exit_threshold, within min_depth..max_depth; None = 1 and all loops) or
    "fixed" (max_depth loops)."""
    s = _lib.parity_sampling()
    lib.parity_sampling_default(ctypes.byref(s))
    s.temperature = _lib.as_float(temperature, "temperature")
    s.top_k = 0 if top_k is None else _lib.as_int(top_k, "top_k", 0, 2 ** 32 - 1)
    s.top_p = 1.0 if top_p is None else _lib.as_float(top_p, "top_p")
    s.min_p = 0.0 if min_p is None else _lib.as_float(min_p, "min_p")
    s.seed = _lib.as_int(seed, "seed", 0, 2 ** 64 - 1)
    s.max_new_tokens = 0 if max_tokens is None else \
        _lib.as_int(max_tokens, "max_tokens", 0, 2 ** 32 - 1)
    if isinstance(stop, int):
        stop = (stop,)
    stop = list(stop)
    if len(stop) > _lib.MAX_STOP:
        raise ParityError(_lib.ERR_INVALID_ARGUMENT, "%d stop tokens: at most %d "
                          "(PARITY_MAX_STOP)" % (len(stop), _lib.MAX_STOP))
    s.n_stop = len(stop)
    for i, t in enumerate(stop):
        s.stop[i] = _lib.as_int(t, "stop token", -2 ** 31, 2 ** 31 - 1)
    s.logprob_mode = _choice(MODES, mode, "mode")
    s.top_n = _lib.as_int(top_n, "top_n", 0, 2 ** 32 - 1)
    s.exit_rule = _choice(EXIT_RULES, exit_rule, "exit_rule")
    s.exit_threshold = _lib.as_float(exit_threshold, "exit_threshold")
    s.min_depth = 0 if min_depth is None else _lib.as_int(min_depth, "min_depth", 1, 2 ** 32 - 1)
    s.max_depth = 0 if max_depth is None else _lib.as_int(max_depth, "max_depth", 1, 2 ** 32 - 1)
    return s


def _prompt_list(prompts):
    """Prompts as a list of array('i'), and whether one prompt was given."""
    batch = TokenBatch(prompts, "prompts")
    flat = batch.tokens
    if not isinstance(flat, array):
        a = array("i")
        a.frombytes(flat.tobytes())
        flat = a
    out, at = [], 0
    for n in batch.lengths:
        out.append(flat[at:at + n])
        at += n
    return out, batch.single


class DepthSchedule(list):
    """A looped model's depth schedule (a list of ints, one per token) with the KV rule it
    was sampled with (loop_kv: "last-exited" or "full"), as Completion.schedule() makes it."""

    def __init__(self, depths, loop_kv):
        super().__init__(depths)
        self.loop_kv = loop_kv

    def __repr__(self):
        return "DepthSchedule(%s, loop_kv=%r)" % (list.__repr__(self), self.loop_kv)


class Completion:
    """One generated completion.

    Attributes:
        index: its index within its prompt's group (and its random stream).
        prompt_index: which prompt it continues.
        prompt_len: the prompt's length in tokens.
        tokens: the generated token ids (list of int; the prompt not included).
        logprobs: the log-prob of each generated token (list of float, float32 values).
        finish_reason: "stop", "length" or "capacity".
        exit_depths: looped models: the loops that produced each generated token (the depth
            of the step whose logits it was drawn from; the first is the prompt's, all loops);
            None for a model that does not loop.
        loop_kv: the sampler's KV rule ("last-exited" or "full"), which a replay must use.
        routes: mixture-of-experts models sampled with record_routes: the experts each
            position of prompt + tokens ran in each sparse layer, but the last (a
            parity.Routes of prompt_len + len(tokens) - 1 positions: vLLM's routed_experts),
            for Model.score(prompt + tokens, routes=completion.routes) or CausalLM.forward
            to replay; None otherwise.
    """

    __slots__ = ("index", "prompt_index", "prompt_len", "tokens", "logprobs", "finish_reason",
                 "exit_depths", "loop_kv", "routes")

    def __init__(self, index, prompt_index, prompt_len, loop_kv="last-exited", looped=False):
        self.index, self.prompt_index, self.prompt_len = index, prompt_index, prompt_len
        self.tokens, self.logprobs, self.finish_reason = [], [], None
        self.exit_depths, self.loop_kv = ([] if looped else None), loop_kv
        self.routes = None

    def schedule(self, total_ut_steps):
        """The depth schedule of prompt + tokens for Model.score(depths=...): every prompt
        position at total_ut_steps loops, then each generated token's input at the depth its
        step exited (the last position's depth is not used: 1). A DepthSchedule: it carries
        the KV rule it was sampled with, which Model.score then replays (and refuses another)."""
        return DepthSchedule([total_ut_steps] * (self.prompt_len - 1) + (self.exit_depths or [])
                             + [1], self.loop_kv)

    def to_json(self):
        """The line parity-generate prints for this completion (log-probs as "%.9g"; a looped
        model's exit depths and KV rule too)."""
        line = '{"index": %d, "prompt_len": %d, "tokens": [%s], "logprobs": [%s]' % (
            self.index, self.prompt_len, ", ".join("%d" % t for t in self.tokens),
            ", ".join("%.9g" % v for v in self.logprobs))
        if self.exit_depths is not None:
            line += ', "exit_depths": [%s], "loop_kv": "%s"' % (
                ", ".join("%d" % d for d in self.exit_depths), self.loop_kv)
        return line + "}"

    def __repr__(self):
        return ("Completion(index=%d, prompt_index=%d, prompt_len=%d, tokens=%r, logprobs=%r, "
                "finish_reason=%r)" % (self.index, self.prompt_index, self.prompt_len,
                                       self.tokens, self.logprobs, self.finish_reason))


def profile_dict(p):
    """A parity_profile as a dict (phase names from the library)."""
    return {"enabled": bool(p.enabled), "calls": p.calls, "forwards": p.forwards, "rows": p.rows,
            "call_seconds": p.call_seconds,
            "phase_seconds": {lib.parity_phase_name(i).decode(): p.phase_seconds[i]
                              for i in range(_lib.PHASE_COUNT)},
            "dispatch_seconds": p.dispatch_seconds, "loops": p.loops}


class Sampler(_lib.Closing):
    """A libparity sampler: a KV cache shared by up to max_seqs sequences of up to max_len
    positions each (prompt + generated), on one model, policy and backend.

    Made by Model.sampler(policy="aligned", max_seqs=None, max_len=None, threads=None,
    backend="bf16", max_batch=None, cache_tokens=None, prefill_chunk=None, loop_kv="last-exited",
    prefault=False, record_routes=False); None takes the library's defaults (max_seqs 64,
    max_len min(context, 4096), max_batch 64 rows per decode forward, cache_tokens max_seqs *
    max_len, prefill_chunk 256), threads None the model's. prefault=True writes every page of the cache at creation, so
    that no step takes a first-touch page fault (the memory is committed at once: size
    cache_tokens first). Results never depend on threads, max_batch, prefill_chunk,
    cache_tokens or prefault. record_routes=True (mixture-of-experts models) keeps the experts
    each position runs in each sparse layer (2 bytes an expert, counted in the sampler's
    memory): routes(seq), and generate()'s Completion.routes, for a learner to replay.

    High level: generate(). Low level: add(), add_batch(), fork(), step(), release(),
    tokens(), with sequence ids (ints) that the library hands out. A sampler is used by one thread at a time
    (calls from several threads are serialised). close() frees it; so do ``with`` and
    garbage collection.
    """

    def __init__(self, model, policy="aligned", max_seqs=None, max_len=None, threads=None,
                 backend="bf16", max_batch=None, cache_tokens=None, prefill_chunk=None,
                 loop_kv="last-exited", prefault=False, record_routes=False):
        self._handle = None
        self._model = model
        self._lock = threading.RLock()
        p = _lib.parity_sampler_params()
        lib.parity_sampler_default_params(ctypes.byref(p))
        p.policy = policy_struct(policy)
        p.backend = _choice(BACKENDS, backend, "backend")
        p.n_threads = model.threads if threads is None else _lib.as_int(threads, "threads", 1, 256)
        u32 = 2 ** 32 - 1
        p.max_seqs = 64 if max_seqs is None else _lib.as_int(max_seqs, "max_seqs", 1, u32)
        ctx = model.context
        p.max_len = min(ctx, 4096) if max_len is None else _lib.as_int(max_len, "max_len", 1, u32)
        p.max_batch = 0 if max_batch is None else _lib.as_int(max_batch, "max_batch", 1, u32)
        p.cache_tokens = 0 if cache_tokens is None else \
            _lib.as_int(cache_tokens, "cache_tokens", 1, u32)
        p.prefill_chunk = 0 if prefill_chunk is None else \
            _lib.as_int(prefill_chunk, "prefill_chunk", 1, u32)
        p.loop_kv = _choice(LOOP_KV, loop_kv, "loop_kv")
        p.prefault = 1 if prefault else 0
        p.record_routes = 1 if record_routes else 0
        self.record_routes = bool(record_routes)
        self.loop_kv = loop_kv
        self.policy = policy
        self.max_seqs, self.max_len = p.max_seqs, p.max_len
        handle = _lib.sampler_p()
        model_handle = model._acquire()
        try:
            lib.parity_sampler_create(model_handle, ctypes.byref(p), ctypes.byref(handle))
        except BaseException:
            model._release()
            raise
        self._handle = handle
        self._cap = 0
        self._bufs = None
        self._step_ptrs = None     # (buffers, their ctypes pointers) for _step

    # ---- life cycle ------------------------------------------------------------------------

    def _h(self):
        if self._handle is None:
            raise ParityError(_lib.ERR_INVALID_ARGUMENT, "the sampler is closed")
        return self._handle

    def close(self):
        """Frees the sampler (and lets its model go if that was closed). Idempotent."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            lib.parity_sampler_free(handle)
            self._model._release()

    # ---- sequences -------------------------------------------------------------------------

    def add(self, prompt, stream=0, **sampling):
        """Adds a sequence from a prompt (token ids as score() takes one sequence) and
        prefills it; returns its id. `stream` (an int) with the seed keys its randomness;
        other keyword arguments are the sampling parameters of sampling_struct().

        Raises ParityError: PARITY_ERR_EMPTY_INPUT, _TOO_LONG (prompt > max_len),
        _TOKEN_RANGE, _CACHE_FULL (no free slot or cache blocks)."""
        plist, single = _prompt_list(prompt)
        if not single:
            raise TypeError("add() takes one prompt (a sequence of token ids)")
        return self._add(plist[0], sampling_struct(**sampling), stream)

    def _add(self, prompt, sp, stream):
        seq = ctypes.c_uint32()
        with self._lock:
            lib.parity_sampler_add(self._h(), pointer(prompt, ctypes.c_int32), len(prompt),
                                   ctypes.byref(sp), _lib.as_int(stream, "stream", 0, 2 ** 64 - 1),
                                   ctypes.byref(seq))
        return seq.value

    def add_batch(self, prompts, streams=None, **sampling):
        """Adds one sequence per prompt, prefilled together (parity_sampler_add_batch): the
        same ids, tokens and log-prob bits as add() of each in order, in fewer forwards.
        `streams` (ints, one per prompt; None = 0, 1, 2, ...) with the seed key their
        randomness; the other keyword arguments are the sampling parameters of
        sampling_struct(), the same for all. Returns the ids, in the order of the prompts.
        All or nothing: raises ParityError as add() does, naming the first prompt that
        fails, with nothing added."""
        plist, single = _prompt_list(prompts)
        if single:
            plist = [plist[0]]
        n = len(plist)
        if streams is None:
            streams = range(n)
        streams = [_lib.as_int(x, "stream", 0, 2 ** 64 - 1) for x in streams]
        if len(streams) != n:
            raise ParityError(_lib.ERR_INVALID_ARGUMENT, "%d streams for %d prompts"
                              % (len(streams), n))
        return self._add_batch(plist, [sampling_struct(**sampling)] * n, streams)

    def _add_batch(self, prompts, sps, streams):
        n = len(prompts)
        prompts = [p if isinstance(p, array) and p.typecode == "i" else array("i", p)
                   for p in prompts]
        ptrs = (_lib._i32p * max(n, 1))(*[ctypes.cast(p.buffer_info()[0], _lib._i32p)
                                          for p in prompts])
        lens = (ctypes.c_uint32 * max(n, 1))(*[len(p) for p in prompts])
        sp = (_lib.parity_sampling * max(n, 1))(*sps)
        st = (ctypes.c_uint64 * max(n, 1))(*streams)
        out = (ctypes.c_uint32 * max(n, 1))()
        with self._lock:
            lib.parity_sampler_add_batch(self._h(), n, ptrs, lens, sp, st, out)
        return list(out[:n])

    def fork(self, parent, stream, **sampling):
        """A new sequence sharing `parent`'s tokens and cache blocks, with its own stream and
        sampling parameters (keyword arguments of sampling_struct()); returns its id."""
        return self._fork(parent, sampling_struct(**sampling), stream)

    def _fork(self, parent, sp, stream):
        child = ctypes.c_uint32()
        with self._lock:
            lib.parity_sampler_fork(self._h(), _lib.as_int(parent, "parent", 0, 2 ** 32 - 1),
                                    ctypes.byref(sp), _lib.as_int(stream, "stream", 0, 2 ** 64 - 1),
                                    ctypes.byref(child))
        return child.value

    def release(self, seq):
        """Releases a sequence and the cache blocks no other sequence shares."""
        with self._lock:
            lib.parity_sampler_release(self._h(), _lib.as_int(seq, "seq", 0, 2 ** 32 - 1))

    def depths(self, seq):
        """The loops each cached position of the sequence ran (len - 1 values; prompt
        positions all loops): its depth schedule, which Model.score(depths=...) replays."""
        ptr = ctypes.POINTER(ctypes.c_uint32)()
        n = ctypes.c_uint32()
        with self._lock:
            lib.parity_sampler_depths(self._h(), _lib.as_int(seq, "seq", 0, 2 ** 32 - 1),
                                      ctypes.byref(ptr), ctypes.byref(n))
            return ptr[:n.value]

    def routes(self, seq):
        """Mixture-of-experts models, a sampler made with record_routes=True: the experts each
        position of the sequence ran in each sparse layer (parity_sampler_routes), for the
        len - 1 positions run so far (prompt and generated; a fork's include its parent's), a
        parity.Routes of shape (len - 1, sparse layers, k), each position's k in slot order.
        Model.score(tokens, routes=...) replays it: under this sampler's policy, its
        log-probs bit for bit. Raises ParityError (PARITY_ERR_INVALID_ARGUMENT) for a sampler
        without record_routes."""
        ptr = ctypes.POINTER(ctypes.c_uint16)()
        n, stride = ctypes.c_uint32(), ctypes.c_uint32()
        with self._lock:
            lib.parity_sampler_routes(self._h(), _lib.as_int(seq, "seq", 0, 2 ** 32 - 1),
                                      ctypes.byref(ptr), ctypes.byref(n), ctypes.byref(stride))
            ids = array("H")
            if n.value:
                ids.frombytes(ctypes.string_at(ptr, 2 * n.value * stride.value))
        k = self._model.config["num_experts_per_tok"]
        return Routes(ids, stride.value // k, k)

    def _last_depth(self, seq):
        ptr = ctypes.POINTER(ctypes.c_uint32)()
        n = ctypes.c_uint32()
        lib.parity_sampler_depths(self._h(), seq, ctypes.byref(ptr), ctypes.byref(n))
        return ptr[n.value - 1]

    def tokens(self, seq):
        """(tokens, prompt_len): the sequence's token ids so far (prompt then generated) and
        where its completion starts (for a fork: the parent's length when it was forked)."""
        ptr = ctypes.POINTER(ctypes.c_int32)()
        n, plen = ctypes.c_uint32(), ctypes.c_uint32()
        with self._lock:
            lib.parity_sampler_tokens(self._h(), _lib.as_int(seq, "seq", 0, 2 ** 32 - 1),
                                      ctypes.byref(ptr), ctypes.byref(n), ctypes.byref(plen))
            return ptr[:n.value], plen.value

    # ---- where the time goes ------------------------------------------------------------------

    def set_profiling(self, on=True):
        """Switches the sampler's profile on (or off) and zeroes it. It changes no result."""
        with self._lock:
            lib.parity_sampler_set_profiling(self._h(), 1 if on else 0)

    def profile(self):
        """What the sampler's calls spent since set_profiling(): a dict with calls, forwards,
        rows, call_seconds, phase_seconds ({"embed", "gemm", "rounding", "regions",
        "attention", "head", "sampling": seconds}), dispatch_seconds (the thread pool's own
        time inside the phases) and loops; enabled says whether it is on."""
        p = _lib.parity_profile()
        p.size = ctypes.sizeof(p)
        with self._lock:
            lib.parity_sampler_profile(self._h(), ctypes.byref(p))
        return profile_dict(p)

    def _buffers(self, n, top_n=0):
        if n > self._cap or (top_n and (self._bufs[4] is None or len(self._bufs[4]) < n * top_n)):
            self._cap = max(n, self._cap)
            k = self._cap * top_n
            self._bufs = (array("I", bytes(4 * self._cap)), array("i", bytes(4 * self._cap)),
                          array("f", bytes(4 * self._cap)), array("I", bytes(4 * self._cap)),
                          array("i", bytes(4 * k)) if k else None,
                          array("f", bytes(4 * k)) if k else None)
        return self._bufs

    def _step(self, seqs, top_n=0):
        """One decode step; returns the (tokens, logprobs, finished[, top ids, top lps])
        arrays, valid for len(seqs) entries until the next step."""
        n = len(seqs)
        bufs = self._buffers(n, top_n)
        s = bufs[0]
        s[:n] = array("I", seqs)
        if self._step_ptrs is None or self._step_ptrs[0] is not bufs:
            # the pointers of the buffers, made once per set of buffers (a decode loop calls
            # this thousands of times a second)
            types = (ctypes.c_uint32, ctypes.c_int32, ctypes.c_float, ctypes.c_uint32,
                     ctypes.c_int32, ctypes.c_float)
            self._step_ptrs = (bufs, [None if b is None else pointer(b, t)
                                      for b, t in zip(bufs, types)])
        ps, ptok, plp, pfin, ptid, ptlp = self._step_ptrs[1]
        with self._lock:
            lib.parity_sampler_step(self._h(), ps, n, ptok, plp, pfin, top_n,
                                    ptid if top_n else None, ptlp if top_n else None)
        return bufs[1:]

    def step(self, seqs, max_top_n=0):
        """One decode step for live, unfinished sequences (a list of ids): draws one token
        each. Returns a list of Step, in the order of `seqs`. max_top_n bounds the
        alternatives reported for sequences that asked for top_n.

        Raises ParityError: PARITY_ERR_UNKNOWN_SEQUENCE, _SEQUENCE_FINISHED, _CACHE_FULL
        (nothing changed), _EMPTY_INPUT (no sequence)."""
        seqs = [_lib.as_int(q, "seq", 0, 2 ** 32 - 1) for q in seqs]
        k = _lib.as_int(max_top_n, "max_top_n", 0, 2 ** 32 - 1)
        if not seqs:
            raise ParityError(_lib.ERR_EMPTY_INPUT, "no sequences to step")
        tok, lp, fin, tid, tlp = self._step(seqs, k)
        out = []
        for i in range(len(seqs)):
            ids = tid[i * k:(i + 1) * k].tolist() if k else []
            lps = tlp[i * k:(i + 1) * k].tolist() if k else []
            out.append(Step(tok[i], lp[i], FINISH_REASONS[fin[i]], ids, lps))
        return out

    # ---- generation ------------------------------------------------------------------------

    def generate(self, prompts, n=1, max_tokens=64, temperature=1.0, top_k=None, top_p=None,
                 min_p=None, seed=0, stop=(), mode="raw", batch=None, exit_rule="full",
                 exit_threshold=1.0, min_depth=None, max_depth=None):
        """n completions of each prompt, as parity-generate makes them.

        Each prompt is prefilled once; completion i (0 <= i < n) is a fork of it with random
        stream i; at most `batch` completions decode together, the next starting as one
        finishes (continuous batching; None = as many as the sampler holds, max_seqs - 1).
        The results do not depend on batch. For one prompt and the same arguments (and a
        sampler whose max_len is at least min(prompt + max_tokens, context), as the default
        usually is) the completions are exactly what parity-generate prints.

        Args:
            prompts: one prompt (token ids, as score() takes one sequence) or a list of them.
            n: completions per prompt.
            max_tokens: tokens generated at most per completion (>= 1).
            temperature, top_k, top_p, min_p, seed, stop, mode, exit_rule, exit_threshold,
                min_depth, max_depth: see sampling_struct().

        Returns:
            A list of Completion ordered by (prompt_index, index): n per prompt (each with its
            routes when the sampler records them).

        Raises:
            ParityError: as add(), fork() and step(); PARITY_ERR_INVALID_ARGUMENT if batch
            exceeds max_seqs - 1 (one slot holds the prompt being forked).
        """
        plist, _ = _prompt_list(prompts)
        n = _lib.as_int(n, "n", 1, 2 ** 32 - 1)
        max_tokens = _lib.as_int(max_tokens, "max_tokens", 1, 2 ** 32 - 1)
        sp = sampling_struct(temperature, top_k, top_p, min_p, seed, max_tokens, stop, mode, 0,
                             exit_rule, exit_threshold, min_depth, max_depth)
        total = n * len(plist)
        if batch is None:
            batch = max(1, min(total, self.max_seqs - 1))
        else:
            batch = min(_lib.as_int(batch, "batch", 1, 2 ** 32 - 1), max(total, 1))
            if batch > self.max_seqs - 1:
                raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                                  "batch %d needs %d sequence slots (one for the prompt), the "
                                  "sampler has max_seqs = %d" % (batch, batch + 1, self.max_seqs))
        looped = self._model.config["arch"] == "ouro"
        results = [Completion(i % n, i // n, len(plist[i // n]), self.loop_kv, looped)
                   for i in range(total)]
        active = []  # [sequence id, completion]
        parent, parent_of = None, -1
        nxt = 0
        try:
            while nxt < total or active:
                while len(active) < batch and nxt < total:
                    p, i = divmod(nxt, n)
                    if parent_of != p:
                        parent = self._add(plist[p], sp, 0)
                        parent_of = p
                    child = self._fork(parent, sp, i)
                    if i == n - 1:  # the last fork of this prompt: the children keep the cache
                        self.release(parent)
                        parent = None
                    c = results[nxt]
                    nxt += 1
                    if len(plist[p]) >= self.max_len:  # a prompt that fills max_len
                        if self.record_routes:
                            c.routes = self.routes(child)
                        self.release(child)
                        c.finish_reason = "capacity"
                        continue
                    active.append([child, c])
                if not active:
                    continue
                tok, lp, fin, _, _ = self._step([a[0] for a in active])
                still = []
                for k, a in enumerate(active):
                    c = a[1]
                    c.tokens.append(tok[k])
                    c.logprobs.append(lp[k])
                    if c.exit_depths is not None:
                        c.exit_depths.append(self._last_depth(a[0]))
                    if fin[k]:
                        if self.record_routes:
                            c.routes = self.routes(a[0])
                        self.release(a[0])
                        c.finish_reason = FINISH_REASONS[fin[k]]
                    else:
                        still.append(a)
                active = still
        except BaseException:
            for a in active:
                self._release_quietly(a[0])
            if parent is not None:
                self._release_quietly(parent)
            raise
        return results

    def _release_quietly(self, seq):
        try:
            self.release(seq)
        except ParityError:
            pass
