"""`python3 -m parity.serve`: the command line (options, listening, the signals that stop the
server cleanly)."""
import argparse
import os
import signal
import sys
import threading
import time

from .. import _lib, serve
from .._lib import ParityError
from .handler import Server

def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m parity.serve", description=serve.__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory or synthetic:NAME")
    ap.add_argument("--tokenizer", metavar="DIR", help="the directory of the model's "
                    "tokenizer.json and tokenizer_config.json (default: the model's directory; "
                    "needs the PyPI package tokenizers, and jinja2 for chat)")
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
    ap.add_argument("--enable-return-routed-experts", action="store_true",
                    help="mixture-of-experts models: keep every sequence's routing record (2 "
                    "bytes per position, sparse layer and expert a token), so that a request "
                    "with return_routed_experts gets each choice's routed_experts (vLLM's "
                    "engine argument)")
    ap.add_argument("--prompt-cache", type=int, default=32, metavar="N",
                    help="prompts kept prefilled for the requests that send them again, least "
                    "recently used out first (default 32; 0 = off); each holds a sequence slot "
                    "and its KV cache positions; a weight update and /flush_cache empty it")
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
    ap.add_argument("--switch-interval", type=float, default=0.0005, metavar="SECONDS",
                    help="Python's thread switch interval (sys.setswitchinterval) in the server: "
                    "how long the engine thread, back from a decode step, waits at most for a "
                    "request thread to hand over the interpreter (default 0.0005; Python's own "
                    "is 0.005, longer than a decode step)")
    args = ap.parse_args(argv)
    for name in ("max_batch", "max_queue", "max_scoring", "max_body_bytes", "max_update_bytes"):
        if getattr(args, name) < 1:
            ap.error("--%s must be at least 1" % name.replace("_", "-"))
    if args.prompt_cache < 0:
        ap.error("--prompt-cache must be at least 0")
    if args.client_timeout <= 0:
        ap.error("--client-timeout must be positive")
    if not 0 < args.switch_interval <= 1:
        ap.error("--switch-interval must be in (0, 1] seconds")
    sys.setswitchinterval(args.switch_interval)
    try:
        srv = Server(args)
    except ParityError as e:
        print("parity.serve: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("parity.serve: cannot listen on %s:%d: %s" % (args.host, args.port, e.strerror),
              file=sys.stderr)
        return 1
    if srv.text_missing:
        print("parity.serve: %s: string prompts, stop strings, text and chat are refused"
              % srv.text_missing, file=sys.stderr)
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
