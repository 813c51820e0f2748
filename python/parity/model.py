"""Models and scoring (the learner's entry point)."""
import collections
import ctypes
import os
import sys
import threading
from array import array

from . import _lib
from ._convert import Pinned, TokenBatch, pointer
from ._lib import ParityError, lib
from ._routes import Routes, route_ids, sparse_layers
from .policy import policy_struct
from .pool import Pool, _default_threads

#: {name: value} of the log-prob modes and backends, as the library names them.
MODES = _lib.MODES
BACKENDS = _lib.BACKENDS
_ARCH_NAMES = {value: name for name, value in _lib.ARCHS.items()}
_ROPE_TYPE = ("default", "linear", "llama3", "yarn")
_FLAGS = ("tie_word_embeddings", "attention_bias", "qk_norm")

#: Defaults of Model(max_idle_scorers=, max_idle_bytes=).
DEFAULT_IDLE_SCORERS = 4
DEFAULT_IDLE_BYTES = 2 << 30

#: An idle (or checked out) scorer: its key (policy bytes, backend, threads), handle, capacity
#: in tokens and bytes (parity_scorer_bytes).
_Idle = collections.namedtuple("_Idle", "key handle capacity nbytes")


#: A name looked up in a {name: value} table such as MODES or BACKENDS (_lib.as_choice).
_choice = _lib.as_choice


_options_cache = {}


def score_options(mode="raw", temperature=1.0, top_k=None, top_p=None, min_p=None, top_n=0):
    """A parity_score_options from Python arguments (None = the option is off). Shared and
    cached: do not modify the result."""
    key = (mode, temperature, top_k, top_p, min_p, top_n)
    try:
        hit = _options_cache.get(key)
    except TypeError:  # an unhashable argument: the checks below say what is wrong
        return _make_options(*key)
    if hit is None:
        hit = _make_options(*key)
        if len(_options_cache) < 1024:
            _options_cache[key] = hit
    return hit


#: Model.score's readout names (parity_loop_readout); an int k reads loop k ("loop").
READOUTS = {"exit": 0, "loop": 1, "expected-logits": 2}


def _schedule_loop_kv(depths, loop_kv):
    """The KV rule to score a depth schedule with: `loop_kv`, or the one the schedule was
    sampled with (a DepthSchedule's, for one sequence or each of many), which must agree."""
    known = set()
    if depths is not None:
        parts = [depths] if hasattr(depths, "loop_kv") else \
            (depths if isinstance(depths, (list, tuple)) else [])
        for i, d in enumerate(parts):
            rule = getattr(d, "loop_kv", None)
            if rule is not None:
                known.add(rule)
                if loop_kv is not None and rule != loop_kv:
                    raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                                      "depth schedule %d was sampled with loop_kv %r, not %r: "
                                      "a replay with another KV rule computes other K/V than "
                                      "the sampler's" % (i, rule, loop_kv))
    if loop_kv is not None:
        return loop_kv
    if len(known) > 1:
        raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                          "the depth schedules were sampled with different KV rules (%s): "
                          "score each rule's sequences in its own call"
                          % ", ".join(sorted(known)))
    return known.pop() if known else "last-exited"


def _make_options(mode, temperature, top_k, top_p, min_p, top_n):
    o = _lib.parity_score_options()
    lib.parity_score_default_options(ctypes.byref(o))
    o.mode = _choice(MODES, mode, "mode")
    o.temperature = _lib.as_float(temperature, "temperature")
    o.top_k = 0 if top_k is None else _lib.as_int(top_k, "top_k", 0, 2 ** 32 - 1)
    o.top_p = 1.0 if top_p is None else _lib.as_float(top_p, "top_p")
    o.min_p = 0.0 if min_p is None else _lib.as_float(min_p, "min_p")
    o.top_n = _lib.as_int(top_n, "top_n", 0, 2 ** 32 - 1)
    return o


class Scores:
    """What score() returns when entropy or top_n is asked for.

    Each attribute is shaped like the log-probs (per sequence when several were scored):
    logprobs and entropy (nats) have one value per predicted position; top_ids and
    top_logprobs have top_n per position, best first (lists of lists, or (positions, top_n)
    numpy arrays). entropy is None unless asked for; top_ids/top_logprobs are None when
    top_n is 0. loop_logprobs (looped models, score(loop_logprobs=True)) has total_ut_steps
    values per position, loop 1 first, shaped like top_logprobs; None otherwise."""

    __slots__ = ("logprobs", "entropy", "top_ids", "top_logprobs", "loop_logprobs")

    def __init__(self, logprobs, entropy, top_ids, top_logprobs, loop_logprobs=None):
        self.logprobs, self.entropy = logprobs, entropy
        self.top_ids, self.top_logprobs = top_ids, top_logprobs
        self.loop_logprobs = loop_logprobs

    def __repr__(self):
        return ("Scores(logprobs=%r, entropy=%r, top_ids=%r, top_logprobs=%r, loop_logprobs=%r)"
                % (self.logprobs, self.entropy, self.top_ids, self.top_logprobs,
                   self.loop_logprobs))


class Model(_lib.Closing):
    """A model loaded into libparity.

    Args:
        path_or_spec: a Hugging Face checkpoint directory (config.json + model.safetensors or
            shards), or "synthetic:NAME[:SEED]" for a built-in config with deterministic random
            weights (NAME in "tiny", "qwen3-0.6b", "qwen2.5-0.5b", "llama3.2-1b").
        threads: threads of each scorer's pool (including the caller); None = the CPUs this
            process may run on. Results never depend on it.
        max_tokens: capacity of each scorer (the longest sequence, and the most tokens scored
            in one group); None = the library's default, min(context, 8192), raised to a
            longer sequence's length when one comes (as parity-score does).
        max_idle_scorers: how many idle scorers the model keeps for reuse (default 4; None =
            no limit, 0 = none: every call makes and frees its own).
        max_idle_bytes: how many bytes (KV cache, scratch, tables: what parity_scorer_bytes
            reports) the idle scorers may hold together (default 2 GiB; None = no limit). A
            scorer larger than this alone is freed when its call ends (the others stay).

    Raises ParityError (e.g. PARITY_ERR_IO, PARITY_ERR_CONFIG, PARITY_ERR_TENSOR_SHAPE) when
    the model cannot be opened.

    A Model is safe to share between threads: each scoring thread takes its own scorer from
    the model's pool. A scorer is made per (policy, backend, threads) and kept idle between
    calls, the least recently used freed first when the idle ones exceed max_idle_scorers or
    max_idle_bytes (both attributes may be set at any time; idle_scorers() lists them).
    close() (or leaving a ``with`` block) releases the model; samplers made from it keep what
    they need until they are closed themselves.
    """

    def __init__(self, path_or_spec, threads=None, max_tokens=None,
                 max_idle_scorers=DEFAULT_IDLE_SCORERS, max_idle_bytes=DEFAULT_IDLE_BYTES):
        if not isinstance(path_or_spec, (str, os.PathLike)):
            raise TypeError("path_or_spec must be a directory or 'synthetic:NAME[:SEED]', not %s"
                            % type(path_or_spec).__name__)
        self._handle = None
        self._lock = threading.Lock()
        self._idle = []          # idle scorers, least recently used first: _Idle
        self._idle_bytes = 0
        self._max_idle_scorers = self._max_idle_bytes = None
        self._users = 0          # calls in flight and live samplers
        self._closed = False
        self.spec = os.fspath(path_or_spec)
        self.threads = _default_threads() if threads is None else \
            _lib.as_int(threads, "threads", 1, 256)
        self.max_tokens = None if max_tokens is None else \
            _lib.as_int(max_tokens, "max_tokens", 1, 1 << 28)
        self.max_idle_scorers = max_idle_scorers
        self.max_idle_bytes = max_idle_bytes
        handle = _lib.model_p()
        lib.parity_model_open(self.spec.encode(), ctypes.byref(handle))
        self._handle = handle
        c = lib.parity_model_config(handle).contents
        cfg = {name: getattr(c, name) for name, _ in _lib.parity_config._fields_ if name != "size"}
        cfg["arch"] = _ARCH_NAMES.get(cfg["arch"], cfg["arch"])
        cfg["rope_type"] = _ROPE_TYPE[cfg["rope_type"]] if cfg["rope_type"] < len(_ROPE_TYPE) \
            else cfg["rope_type"]
        for f in _FLAGS:
            cfg[f] = bool(cfg[f])
        # the bitset of 16 words as the layers it names, ascending (a copy, not a view of the
        # library's struct)
        words = list(cfg["mlp_only_layers"])
        cfg["mlp_only_layers"] = [64 * w + b for w in range(len(words)) for b in range(64)
                                  if (words[w] >> b) & 1]
        self._config = cfg

    @property
    def config(self):
        """The model's config (parity_config) as a dict: field names as in parity.h; arch
        ("qwen2", "qwen3", "llama", "ouro", "qwen3_moe", "qwen2_moe") and rope_type
        ("default", "linear", "llama3", "yarn") by name, the flags as bools, mlp_only_layers
        as the list of layer indices it names (config.json's list, [] for most models). A
        copy: changing it changes nothing."""
        config = dict(self._config)
        config["mlp_only_layers"] = list(config["mlp_only_layers"])
        return config

    @property
    def vocab_size(self):
        return self._config["vocab_size"]

    @property
    def context(self):
        """max_position_embeddings: the longest sequence the model takes."""
        return self._config["max_position_embeddings"]

    @property
    def closed(self):
        return self._closed

    # ---- life cycle ----------------------------------------------------------------------

    def _acquire(self):
        """Marks a user of the handle (a call in flight or a sampler); raises if closed."""
        with self._lock:
            if self._closed:
                raise ParityError(_lib.ERR_INVALID_ARGUMENT, "the model %r is closed" % self.spec)
            self._users += 1
            return self._handle

    def _release(self):
        with self._lock:
            self._users -= 1
            last = self._closed and self._users == 0
        if last:
            self._free()

    def _free(self):
        with self._lock:
            scorers, self._idle, self._idle_bytes = self._idle, [], 0
            handle, self._handle = self._handle, None
        for entry in scorers:
            lib.parity_scorer_free(entry.handle)
        if handle:
            lib.parity_model_free(handle)

    def close(self):
        """Releases the model and its cached scorers. Idempotent. Calls in flight in other
        threads and live samplers keep the memory they use until they finish."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            busy = self._users > 0
        if not busy:
            self._free()

    def __repr__(self):
        return "<parity.Model %r%s>" % (self.spec, " closed" if self._closed else "")

    # ---- scorers ---------------------------------------------------------------------------

    @property
    def max_idle_scorers(self):
        """The most idle scorers kept for reuse (None = no limit). Setting it frees the least
        recently used ones beyond it at once."""
        return self._max_idle_scorers

    @max_idle_scorers.setter
    def max_idle_scorers(self, value):
        self._max_idle_scorers = None if value is None else \
            _lib.as_int(value, "max_idle_scorers", 0, 2 ** 31)
        self._evict()

    @property
    def max_idle_bytes(self):
        """The most bytes the idle scorers may hold together (None = no limit). Setting it
        frees the least recently used ones beyond it at once."""
        return self._max_idle_bytes

    @max_idle_bytes.setter
    def max_idle_bytes(self, value):
        self._max_idle_bytes = None if value is None else \
            _lib.as_int(value, "max_idle_bytes", 0, 2 ** 64 - 1)
        self._evict()

    def idle_scorers(self):
        """The idle scorers, least recently used first (the next to be freed): a list of dicts
        {"policy": Policy, "backend": name, "threads": n, "max_tokens": capacity, "bytes":
        their memory (parity_scorer_bytes)}."""
        from .policy import Policy
        backends = {v: k for k, v in BACKENDS.items()}
        with self._lock:
            idle = list(self._idle)
        out = []
        for e in idle:
            pol = _lib.parity_policy.from_buffer_copy(e.key[0])
            out.append({"policy": Policy(**{f: getattr(pol, f) for f in _lib.POLICY_FIELDS}),
                        "backend": backends.get(e.key[1], e.key[1]), "threads": e.key[2],
                        "max_tokens": e.capacity, "bytes": e.nbytes})
        return out

    def _evict(self):
        """Frees the least recently used idle scorers until both bounds hold."""
        doomed = []
        with self._lock:
            count, most = self._max_idle_scorers, self._max_idle_bytes
            while self._idle and ((count is not None and len(self._idle) > count) or
                                  (most is not None and self._idle_bytes > most)):
                e = self._idle.pop(0)
                self._idle_bytes -= e.nbytes
                doomed.append(e)
        for e in doomed:
            lib.parity_scorer_free(e.handle)

    def _checkout(self, policy, backend, threads, need):
        """Takes a user reference and an idle scorer for (policy, backend, threads) that holds
        `need` tokens (made if none is idle): returns an _Idle. Raises ParityError if the
        model is closed or the scorer cannot be made."""
        key = (bytes(policy), backend, threads)
        with self._lock:
            if self._closed:
                raise ParityError(_lib.ERR_INVALID_ARGUMENT, "the model %r is closed" % self.spec)
            self._users += 1
            for i in range(len(self._idle) - 1, -1, -1):  # the most recently used first
                e = self._idle[i]
                if e.key == key and e.capacity >= need:
                    del self._idle[i]
                    self._idle_bytes -= e.nbytes
                    return e
        try:
            params = _lib.parity_scorer_params()
            lib.parity_scorer_default_params(ctypes.byref(params))
            params.policy = policy
            params.backend = backend
            params.n_threads = threads
            ctx = self.context
            default = self.max_tokens or min(ctx, 8192)
            params.max_tokens = need if default < need <= ctx else default
            nbytes = ctypes.c_uint64()
            lib.parity_scorer_bytes(self._handle, ctypes.byref(params), ctypes.byref(nbytes))
            h = _lib.scorer_p()
            lib.parity_scorer_create(self._handle, ctypes.byref(params), ctypes.byref(h))
        except BaseException:
            self._release()
            raise
        block = lib.parity_kv_block_tokens()
        return _Idle(key, h, (params.max_tokens + block - 1) // block * block, nbytes.value)

    def _checkin(self, entry):
        """Returns a scorer taken by _checkout (the most recently used now) and the user
        reference, then frees idle scorers beyond the bounds."""
        with self._lock:
            self._users -= 1
            most = self._max_idle_bytes
            # a scorer that alone exceeds the byte bound is freed, not the others
            keep = not self._closed and not (most is not None and (entry.nbytes) > most)
            if keep:
                self._idle.append(entry)
                self._idle_bytes += entry.nbytes
            last = self._closed and self._users == 0
        if keep:
            self._evict()
            return
        lib.parity_scorer_free(entry.handle)
        if last:
            self._free()

    # ---- scoring ---------------------------------------------------------------------------

    def score(self, sequences, policy="aligned", temperature=1.0, mode="raw", top_k=None,
              top_p=None, min_p=None, backend="bf16", entropy=False, top_n=0, threads=None,
              depths=None, loop_kv=None, readout="exit", loop_logprobs=False, routes=None,
              return_routes=False):
        """Log-probabilities of token sequences under a policy (the learner's numbers).

        Args:
            sequences: one sequence of token ids — a list of ints, bytes (each byte a token,
                as parity-score --bytes), array('i') or another integer array, or a 1-D numpy
                integer array — or many: a list of such sequences, or a 2-D numpy array (one
                sequence per row).
            policy: a preset name ("aligned", "hf-eager+aligned", ...) or a parity.Policy.
            mode: "raw" (log_softmax of the logits), "processed" (of logits / temperature;
                temperature 0 counts as 1) or "processed-truncated" (renormalised over the
                top_k/top_p/min_p support the sampler draws from; -inf outside it).
            temperature, top_k, top_p, min_p: as the sampler's (None = off).
            backend: "bf16" (the library's GEMM), "openblas", or "amx" (AMX-BF16 tiles, where
                parity.backends() has it).
            entropy: also return the entropy (nats) of each position's distribution.
            top_n: also return the top_n most likely tokens per position (ties to lower ids).
            threads: the scorer's threads; None = the model's.
            depths: looped models: the depth schedule to replay, one int (1..total_ut_steps)
                per token, shaped like sequences (a list per sequence; Completion.schedule()
                gives it for a sampled completion); None = every position runs every loop
                (the dense learner).
            loop_kv: the KV rule the schedule was sampled with ("last-exited" or "full"); None
                = the schedule's own (a Completion.schedule() knows it; a schedule that does
                not, "last-exited"). A rule other than the one a schedule was sampled with
                raises ParityError.
            readout: looped models, the dense learner: "exit" (each position's exit loop:
                the last when dense), an int k (loop k's output, 1..total_ut_steps: HF's
                exit_at_step = k - 1) or "expected-logits" (HF's use_weighted_exit mixture
                sum_t p_t logits_t, the exit distribution as the policy's exit_dist computes
                it; a model with an exit gate).
            loop_logprobs: looped models, the dense learner: also return every loop's
                log-prob of each position (Scores.loop_logprobs: total_ut_steps values per
                position, loop 1 first), for learners that weight per-loop log-probs.
            routes: mixture-of-experts models: a routing record to replay, shaped like
                sequences (one per sequence when several): a Routes (Completion.routes,
                Sampler.routes()), a numpy integer array or nested lists of shape (positions,
                sparse layers, k) or (positions, sparse layers x k), or a flat list of ints,
                with positions = the sequence's length - 1 (or its length: the last is not
                read). Each position then runs the experts recorded, their weights computed
                from this call's router logits under this policy (the frameworks' routing
                replay): under the sampler's policy, the sampler's log-probs bit for bit.
                None: every position routes itself (recomputation). A record of the wrong
                size, an id >= num_experts or one repeated within a layer raises ParityError
                (PARITY_ERR_INVALID_ARGUMENT).
            return_routes: mixture-of-experts models: also return the experts each position
                ran (replayed or routed), a Routes per sequence of its length - 1 positions.

        Returns:
            For each sequence of n tokens, the n - 1 values log p(x_t | x_<t), t = 1..n-1
            (natural log, float32 values): a list of floats for one sequence, a list of such
            lists for many; numpy float32 arrays where the sequences were numpy arrays (a 2-D
            array of shape (rows, n - 1) for a 2-D input). With entropy or top_n, a Scores
            object holding logprobs, entropy, top_ids and top_logprobs shaped alike.
            Each value is bitwise what parity-score prints for that sequence alone. With
            return_routes, a pair (that result, the Routes: one, or a list of them).

        Raises:
            ParityError: PARITY_ERR_TOKEN_RANGE (an id outside [0, vocab)), _EMPTY_INPUT (no
                sequence, or an empty one), _TOO_LONG (longer than the context), _POLICY (an
                unknown policy), _INVALID_ARGUMENT (a bad option value, a closed model).
            TypeError: sequences that are not integer token ids; options of the wrong type.
        """
        pol = policy_struct(policy)
        be = BACKENDS.get(backend) if type(backend) is str else None
        if be is None:
            be = _choice(BACKENDS, backend, "backend")
        opts = score_options(mode, temperature, top_k, top_p, min_p, top_n)
        loop_kv = _schedule_loop_kv(depths, loop_kv)
        loops = 0
        # options of this call alone (score_options' are shared) where it sets more
        if depths is not None or loop_kv != "last-exited" or readout != "exit" or loop_logprobs \
                or routes is not None or return_routes:
            from .sampler import LOOP_KV
            opts = _make_options(mode, temperature, top_k, top_p, min_p, top_n)
            opts.loop_kv = _choice(LOOP_KV, loop_kv, "loop_kv")
            if isinstance(readout, str):
                opts.readout = _choice(READOUTS, readout, "readout")
            else:
                opts.readout = READOUTS["loop"]
                opts.readout_loop = _lib.as_int(readout, "readout", 0, 2 ** 32 - 1)
            loops = self.config.get("total_ut_steps", 1) if loop_logprobs else 0
        n_threads = self.threads if threads is None else _lib.as_int(threads, "threads", 1, 256)
        batch = TokenBatch(sequences)
        lengths = batch.lengths
        n = batch.n
        # (a sequence of length 0 makes this too small: the library refuses it before writing)
        total = max(sum(lengths) - n, 1)
        k = opts.top_n
        if batch.any_numpy:
            np = sys.modules["numpy"]
            lp = np.empty(total, dtype=np.float32)
            ent = np.empty(total, dtype=np.float32) if entropy else None
            tid = np.empty(total * k, dtype=np.int32) if k else None
            tlp = np.empty(total * k, dtype=np.float32) if k else None
        else:
            lp = array("f", bytes(4 * total))
            ent = array("f", bytes(4 * total)) if entropy else None
            tid = array("i", bytes(4 * total * k)) if k else None
            tlp = array("f", bytes(4 * total * k)) if k else None
        f32 = ctypes.c_float
        if loops:
            llp = np.empty(total * loops, dtype=np.float32) if batch.any_numpy \
                else array("f", bytes(4 * total * loops))
            addr = llp.buffer_info()[0] if type(llp) is array else \
                llp.__array_interface__["data"][0]
            opts.loop_logprobs = ctypes.cast(addr, ctypes.POINTER(f32))
        tokens_p, lengths_p = batch.pointers()
        if depths is not None:
            flat = depths if batch.single else [d for seq in depths for d in seq]
            dbuf = array("I", [_lib.as_int(d, "depth", 0, 2 ** 32 - 1) for d in flat])
            if len(dbuf) != sum(lengths):
                raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                                  "depths has %d values, the sequences %d tokens: one depth per "
                                  "token" % (len(dbuf), sum(lengths)))
            opts.depths = ctypes.cast(dbuf.buffer_info()[0], ctypes.POINTER(ctypes.c_uint32))
        stride = self.route_stride
        if (routes is not None or return_routes) and not stride:
            raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                              "routes: this model (%s) has no sparse layers to route"
                              % self.config["arch"])
        layers = stride // self.config["num_experts_per_tok"] if stride else 0
        if routes is not None:
            records = [routes] if batch.single else routes
            if isinstance(records, Routes) or len(records) != n:
                raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                                  "routes: %s for %d sequences: one routing record per sequence"
                                  % ("one record" if isinstance(records, Routes)
                                     else "%d records" % len(records), n))
            rbuf = array("H")
            for i, (record, length) in enumerate(zip(records, lengths)):
                rbuf.extend(route_ids(record, length, layers, stride // max(layers, 1),
                                       "routes of sequence %d" % i))
            opts.routes = ctypes.cast(rbuf.buffer_info()[0], ctypes.POINTER(ctypes.c_uint16))
        if return_routes:
            rout = array("H", bytes(2 * max(sum(lengths), 1) * stride))
            opts.routes_out = ctypes.cast(rout.buffer_info()[0], ctypes.POINTER(ctypes.c_uint16))
        entry = self._checkout(pol, be, n_threads, max(lengths) if n else 1)
        try:
            lib.parity_score(entry.handle, ctypes.byref(opts), tokens_p, lengths_p, n,
                             pointer(lp, f32), pointer(ent, f32) if entropy else None,
                             pointer(tid, ctypes.c_int32) if k else None,
                             pointer(tlp, f32) if k else None)
        finally:
            self._checkin(entry)

        total = sum(lengths) - n
        lp = _split(lp, batch, total, 1, False)
        if entropy or k or loops:
            lp = Scores(lp, _split(ent, batch, total, 1, False) if entropy else None,
                        _split(tid, batch, total, k, True) if k else None,
                        _split(tlp, batch, total, k, True) if k else None,
                        _split(llp, batch, total, loops, True) if loops else None)
        if not return_routes:
            return lp
        ran, at = [], 0
        for length in lengths:  # the positions whose next token is scored
            ran.append(Routes(rout[at * stride:(at + length - 1) * stride], layers,
                              stride // layers))
            at += length
        return lp, (ran[0] if batch.single else ran)

    @property
    def sparse_layers(self):
        """Mixture-of-experts models: the indices of the sparse layers (a router and experts
        instead of the dense MLP: (i + 1) % decoder_sparse_step == 0 and i not in
        mlp_only_layers), in order; [] for a model without experts."""
        return sparse_layers(self._config)

    @property
    def route_stride(self):
        """Mixture-of-experts models: the entries of one position's routing record (sparse
        layers x num_experts_per_tok); 0 for a model without experts."""
        return len(self.sparse_layers) * self._config["num_experts_per_tok"]

    def save(self, directory, layout="bf16"):
        """Writes the model as a Hugging Face checkpoint into `directory` (created if missing):
        config.json and model.safetensors (parity_model_save_as). layout: "bf16", "fp16",
        "fp32", "fp8-block:RULE" (the DeepSeek-V3 / Qwen3-FP8 block layout, F8_E4M3 codes with
        fp32 weight_scale_inv, quantized with the block rule RULE from the model's values, or
        the shipped codes as they are where the model holds them), "fp8-block" (shipped
        codes only), "bitnet:RULE" (transformers' BitNet layout: U8 weights with four ternary
        codes a byte as pack_weights interleaves them, weight_scale = 1 / mean|W|, linear_class
        "bitlinear"; codes of the ternary rule RULE, or the shipped ones), "nvfp4:RULE"
        (ModelOpt's NVFP4: U8 weights with two E2M1 codes a byte, F8_E4M3 weight_scale per 16,
        F32 weight_scale_2, and hf_quant_config.json; codes of the NVFP4 rule RULE, or the
        shipped ones), "mxfp4:RULE" (weight_blocks U8 [rows, cols/32, 16] and E8M0
        weight_scales), and "bitnet", "nvfp4", "mxfp4" (shipped codes only). Raises ParityError
        (PARITY_ERR_INVALID_ARGUMENT for another layout)."""
        if not isinstance(layout, str):
            raise TypeError("layout must be a str, not %s" % type(layout).__name__)
        os.makedirs(os.fspath(directory), exist_ok=True)
        h = self._acquire()
        try:
            lib.parity_model_save_as(h, os.fspath(directory).encode(), layout.encode())
        finally:
            self._release()

    def weight_bytes(self, policy="aligned", backend="bf16"):
        """What the model's weights hold and what one forward step reads under `policy` on
        `backend` (parity_model_bytes), as a dict of byte counts: held (every weight buffer
        held now), held_for_policy (of that, what serving this policy alone keeps),
        step_linear, step_head, step_vectors (the decoder layers' linear weights, the head,
        the norms and biases, each read once a step; of a mixture of experts, the router,
        num_experts_per_tok experts a sparse layer and the shared expert: one token's step),
        embedding_row and kv_position (read once per sequence, and per attended position)."""
        pol = policy_struct(policy)
        be = _choice(BACKENDS, backend, "backend")
        out = _lib.parity_weight_bytes(size=ctypes.sizeof(_lib.parity_weight_bytes))
        h = self._acquire()
        try:
            lib.parity_model_bytes(h, ctypes.byref(pol), be, ctypes.byref(out))
        finally:
            self._release()
        return {name: getattr(out, name) for name, _ in out._fields_ if name != "size"}

    # ---- weight updates and sync checks ------------------------------------------------------

    @property
    def version(self):
        """0 when loaded, +1 per successful update()."""
        h = self._acquire()
        try:
            return lib.parity_model_version(h)
        finally:
            self._release()

    def update(self, tensors, threads=None, masters="keep"):
        """Replaces the values of some weights in place, all or nothing (parity_model_update).

        Args:
            tensors: {checkpoint name: values}, values a numpy array (uint16 = bf16 bits,
                float16, float32: cast to bf16 with round-to-nearest-even, the f32 kept as the
                fp32 policy's master), a torch tensor, or a (dtype, shape, buffer) tuple.
            masters: what float16/float32 values leave beside their bf16 cast
                (parity_model_update_with): "keep" (the default) keeps them as the weights'
                fp32 masters for every reader; "where-read" keeps them only where a weight
                holds a master already or a copy the model has built reads it (a scorer or
                sampler of an fp32- or fp16-compute or quantized policy made before), so a
                learner syncing a bf16 sampler writes no 4 bytes a parameter of new memory;
                a reader of the masters it dropped (weight_values, CausalLM(model), such a
                scorer made later, save_as "fp32", a quantized write_manifest) then raises
                ParityError PARITY_ERR_NO_MASTERS naming the weight, and verify() reports its
                quantized codes on an "fp32 masters" line.
        Raises ParityError: PARITY_ERR_INVALID_ARGUMENT (unknown name, shape, dtype),
        PARITY_ERR_TENSOR_NONFINITE, PARITY_ERR_BUSY (a scorer or sampler of this model is
        inside a call). Samplers' sequences prefilled before it then fail to step with
        PARITY_ERR_STALE: release them and add them again. The checks and casts run on
        `threads` threads (None: the model's; parity_model_update_on). ValueError for another
        `masters`."""
        from .manifest import c_tensors
        if not isinstance(tensors, dict):
            raise TypeError("tensors must be a dict of name -> values")
        if masters not in _lib.MASTERS:
            raise ValueError("masters must be one of %s, not %r"
                             % (", ".join(sorted(_lib.MASTERS)), masters))
        with Pinned() as pin, Pool(self.threads if threads is None else threads) as pool:
            arr = c_tensors(tensors, pin)
            h = self._acquire()
            try:
                lib.parity_model_update_with(pool.handle, h, arr, len(tensors),
                                             _lib.MASTERS[masters])
            finally:
                self._release()

    def sync(self, tensors, threads=None, masters="keep"):
        """A learner's weight sync: update(tensors, masters=masters), then a manifest of
        `tensors` written as the learner's side (parity.write_manifest: their bf16 cast, this
        model's new version) and verify() against it, both with their checksums on `threads`
        threads (None: the model's). Returns (update seconds, manifest + verify seconds).

        Raises ParityError as update() does, and PARITY_ERR_VERIFY, naming the first
        differences, if the model does not hold exactly the bf16 cast of `tensors` afterwards."""
        import tempfile
        import time
        from .manifest import write_manifest
        threads = self.threads if threads is None else threads
        t0 = time.perf_counter()
        self.update(tensors, threads=threads, masters=masters)
        t1 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="parity-sync-") as d:
            path = os.path.join(d, "manifest.json")
            write_manifest(path, tensors, version=self.version, threads=threads)
            differences = self.verify(path, threads=threads)
        if differences:
            raise ParityError(_lib.ERR_VERIFY, "after the sync the model differs from the "
                              "weights sent: %s" % "; ".join(differences[:5]))
        return t1 - t0, time.perf_counter() - t1

    def write_manifest(self, path, policy=None, threads=None,
                       manifest_version=_lib.MANIFEST_VERSION):
        """Writes the manifest of the weights the model holds (parity_model_write_manifest_on);
        with a quantized policy, the codes and scales its GEMMs read for the weights it
        quantizes. Its checksums are computed on `threads` threads (None: the model's; the file
        is the same on any number), in the format of `manifest_version` (the library's, 2; 1
        for a reader that knows only that one)."""
        pol = policy_struct(policy) if policy is not None else None
        mv = _lib.as_int(manifest_version, "manifest_version", 1, 2)
        with Pool(self.threads if threads is None else threads) as pool:
            h = self._acquire()
            try:
                lib.parity_model_write_manifest_on(pool.handle, h,
                                                   ctypes.byref(pol) if pol is not None else None,
                                                   mv, os.fspath(path).encode())
            finally:
                self._release()

    def verify(self, manifest_path, policy=None, threads=None):
        """Compares the model with a manifest (one the learner wrote with
        parity.write_manifest, or Model.write_manifest; of either manifest version). Returns the
        differences, one string each (a tensor missing on either side, a shape, dtype or
        checksum that differs, the version; for quantized weights, checked as `policy` — the
        sampler's — reads them: codes, scales, scale format, block geometry, quantizer
        identity, layers kept in bf16): an empty list when the model holds exactly the
        manifest's weights. The checksums are computed on `threads` threads (None: the
        model's). Raises ParityError for a manifest that cannot be read or is not one."""
        pol = policy_struct(policy) if policy is not None else None
        report = ctypes.create_string_buffer(1 << 16)
        with Pool(self.threads if threads is None else threads) as pool:
            h = self._acquire()
            try:
                rc = lib.parity_model_verify_on(pool.handle, h,
                                                ctypes.byref(pol) if pol is not None else None,
                                                os.fspath(manifest_path).encode(), report,
                                                len(report))
                message = lib.parity_last_error().decode("utf-8", "replace")
            finally:
                self._release()
        lines = report.value.decode("utf-8", "replace").splitlines()
        if rc == 0:
            return []
        if rc == _lib.ERR_VERIFY and lines:
            return lines
        raise ParityError(rc, message)

    def probe(self, tokens, expected, policy="aligned", backend="bf16", threads=None):
        """The sync probe (parity_scorer_probe): scores one sequence (raw log-probs) and checks
        that they equal `expected` (its len - 1 values, e.g. what the learner computed)
        bitwise. Returns None; raises ParityError PARITY_ERR_VERIFY saying how many differ,
        the first position and the largest difference."""
        pol = policy_struct(policy)
        be = _choice(BACKENDS, backend, "backend")
        n_threads = self.threads if threads is None else _lib.as_int(threads, "threads", 1, 256)
        batch = TokenBatch(tokens)
        if not batch.single:
            raise TypeError("probe() takes one sequence")
        want = array("f", [float(v) for v in expected])
        n = batch.lengths[0]
        if len(want) != max(n - 1, 0):
            raise ParityError(_lib.ERR_INVALID_ARGUMENT, "expected holds %d values, the sequence "
                              "has %d tokens (want %d)" % (len(want), n, max(n - 1, 0)))
        tokens_p, _ = batch.pointers()
        entry = self._checkout(pol, be, n_threads, max(n, 1))
        try:
            lib.parity_scorer_probe(entry.handle, tokens_p, n, pointer(want, ctypes.c_float))
        finally:
            self._checkin(entry)

    def sampler(self, policy="aligned", max_seqs=None, max_len=None, threads=None,
                backend="bf16", max_batch=None, cache_tokens=None, prefill_chunk=None,
                loop_kv="last-exited", prefault=False, record_routes=False):
        """A Sampler (KV-cached batched generation) on this model; see parity.Sampler."""
        from .sampler import Sampler
        return Sampler(self, policy=policy, max_seqs=max_seqs, max_len=max_len, threads=threads,
                       backend=backend, max_batch=max_batch, cache_tokens=cache_tokens,
                       prefill_chunk=prefill_chunk, loop_kv=loop_kv, prefault=prefault,
                       record_routes=record_routes)

    def generate(self, prompts, n=1, max_tokens=64, policy="aligned", batch=None, threads=None,
                 backend="bf16", loop_kv="last-exited", record_routes=False, **sampling):
        """Samples n completions of each prompt with a sampler sized as parity-generate sizes
        its own (max_len = min(longest prompt + max_tokens, context), batch + 1 sequences),
        then frees it; record_routes=True (mixture-of-experts models) gives each Completion
        its routes. Other keyword arguments are Sampler.generate's. Returns what
        Sampler.generate returns."""
        from .sampler import Sampler, _prompt_list
        plist, _ = _prompt_list(prompts)
        n = _lib.as_int(n, "n", 1, 2 ** 32 - 1)
        max_tokens = _lib.as_int(max_tokens, "max_tokens", 1, 2 ** 32 - 1)
        total = n * len(plist)
        b = total if batch is None else min(_lib.as_int(batch, "batch", 1, 65535), total)
        longest = max((len(p) for p in plist), default=1)
        max_len = min(longest + max_tokens, self.context)
        # room for every sequence's blocks, copies of shared ones included (the library's
        # default, max_seqs * max_len, can run short when max_len is small)
        block = lib.parity_kv_block_tokens()
        cache = (b + 1) * ((max_len + block - 1) // block + 1) * block
        with Sampler(self, policy=policy, max_seqs=b + 1, max_batch=b, threads=threads,
                     backend=backend, max_len=max_len, cache_tokens=cache, loop_kv=loop_kv,
                     record_routes=record_routes) as s:
            return s.generate(prompts, n=n, max_tokens=max_tokens, batch=b, **sampling)


def _split(buf, batch, total, k, grouped):
    """Per-sequence parts of a flat result with `k` values per predicted position (`grouped`:
    those k values form one list / one row per position)."""
    if batch.matrix:
        rows = batch.n
        cols = batch.lengths[0] - 1 if rows else 0
        return buf[:total * k].reshape((rows, cols, k) if grouped else (rows, cols))
    values = None
    out, at = [], 0
    for length, is_np in zip(batch.lengths, batch.numpy):
        m = max(length - 1, 0) * k
        if is_np:
            part = buf[at:at + m]
            out.append(part.reshape(-1, k) if grouped else part)
        else:
            if values is None:
                values = buf.tolist()
            part = values[at:at + m]
            out.append([part[i:i + k] for i in range(0, m, k)] if grouped else part)
        at += m
    return out[0] if batch.single else out
