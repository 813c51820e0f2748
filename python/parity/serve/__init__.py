"""A rollout server on libparity's sampler: OpenAI-compatible completions with log-probs,
weight updates and the learner's scoring over HTTP, standard library only.

    python3 -m parity.serve --model DIR|synthetic:NAME [--policy aligned] [--port 8000]

One engine thread owns the sampler and steps every live request together (continuous
batching: requests join and leave between decode steps); request threads parse, enqueue and
wait. The sampler is batch-invariant and each completion draws from its own random stream
(the request's seed, the completion's index), so a request's tokens and log-prob bits do not
depend on what else the server is doing: they equal the same request served alone, and
Model.generate() of the same prompts and parameters.

Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health
(OpenAI's shapes), POST /parity/score, POST /parity/update_weights, GET /parity/info, and the
control around weight updates by SGLang's and vLLM's names: /pause_generation,
/continue_generation, /pause, /resume, /is_paused, /abort_request, /abort_requests,
/update_weights_from_disk, /flush_cache, /reset_prefix_cache. The rules (what is accepted,
which error comes with which status, when a weight update takes effect) are in
python/README.md, "The rollout server". Prompts are token ids or text: a byte-level model's
text is its UTF-8 bytes; another model's is read and written with the checkpoint's
tokenizer.json (the PyPI package tokenizers, imported only for such a checkpoint) and its chat
template rendered as transformers renders it (jinja2, imported only for chat).
"""
# The package's modules by concern: protocol (limits, errors, request checks, update files),
# engine (the thread that owns the sampler), handler (the HTTP server and endpoints) and
# __main__ (the command line). Their names are served from here as when this was one module.
from .engine import PAUSE_MODES, Control, Engine, Gate, Update
from .handler import Handler, Server
from .protocol import (BYTE_VOCAB, LOGPROB_MODES, MAX_LOGPROBS, MAX_STOP, ApiError, Completion,
                       Request, read_manifest, read_safetensors)

__all__ = ["ApiError", "BYTE_VOCAB", "Completion", "Control", "Engine", "Gate", "Handler",
           "LOGPROB_MODES", "MAX_LOGPROBS", "MAX_STOP", "PAUSE_MODES", "Request", "Server",
           "Update", "read_manifest", "read_safetensors"]
