"""parity.serve driven by PyPI's official `openai` Python client.

    python3 test/serve/test_openai.py BUILD_DIR

Installs `openai` (major versions 1 to 3), `tokenizers` and `jinja2` with pip into a virtual
environment BUILD_DIR/venv-openai (once; reused after), starts `python3 -m parity.serve` on the
repo's byte-level model, and a second one with the environment's Python (which has the packages
a tokenizer and a chat template need) on test/data/tokenizer-model, and runs
test/serve/openai_client.py with the environment's Python against both: on the byte-level model,
completions.create (string and token-id prompts, n, seed, logprobs), the same request twice bit
for bit, streaming equal to non-streaming, models.list, and the errors as openai.APIStatusError
with their statuses (400, 404, 413); on the tokenizer model, completions with a text prompt,
echo, chat completions and the streaming of both, each equal to parity.Model's (tokens, log-prob
bits, text). Exit status: 0 passed, 1 failed, 77 skipped (this Python has no venv/ensurepip); a
failed pip install (PyPI unreachable, say) fails the test.
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_curl import MODEL, REPO, Server, harness  # noqa: E402

# The client, and what the server needs for a model with a tokenizer and a chat template.
REQUIREMENTS = ["openai>=1,<4", "tokenizers==0.23.3", "jinja2==3.1.6"]
SCRIPT = os.path.join(HERE, "openai_client.py")
TEXT_MODEL = os.path.join(REPO, "test", "data", "tokenizer-model")
TEXT_NAME = "text-model"      # openai_client.py's name for it
VENV_PYTHON = None  # BUILD/venv-openai/bin/python, set by main()


class TestOpenAIClient(unittest.TestCase):
    def test_openai_client(self):
        server = Server()
        text_server = None
        try:
            text_server = Server("--served-model-name", TEXT_NAME, model=TEXT_MODEL,
                                 python=VENV_PYTHON)
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("OPENAI_", "PYTHON"))}
            env["NO_PROXY"] = "127.0.0.1"
            env["PYTHONPATH"] = os.path.join(REPO, "python")   # parity, for the direct checks
            p = subprocess.run([VENV_PYTHON, SCRIPT, server.base + "/v1", MODEL,
                                text_server.base + "/v1", TEXT_MODEL], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=300)
            out = p.stdout.decode("utf-8", "replace")
            print("\n" + out, end="" if out.endswith("\n") else "\n")
        finally:
            rc = server.stop()
            text_rc = text_server.stop() if text_server is not None else None
        self.assertEqual(p.returncode, 0, "openai_client.py failed (exit %d); server output:\n%s"
                         "\ntext model server output:\n%s"
                         % (p.returncode, server.stderr(), text_server.stderr()))
        self.assertIn("openai-client: ", out)
        self.assertIn("ok text model: chat.completions.create equals parity.Model", out)
        self.assertEqual(rc, 0, "SIGTERM should stop the server with exit 0; its output:\n"
                         + server.stderr())
        self.assertEqual(text_rc, 0, "SIGTERM should stop the text model's server with exit 0; "
                         "its output:\n" + text_server.stderr())


def main():
    global VENV_PYTHON
    build = harness.setup()
    for model in (MODEL, TEXT_MODEL):
        if not os.path.isdir(model):
            sys.exit("error: no model at %s" % model)
    VENV_PYTHON = harness.venv(build, "openai", REQUIREMENTS, timeout=300)
    harness.run("serve-openai")


if __name__ == "__main__":
    main()
