"""parity.serve driven by PyPI's official `openai` Python client.

    python3 test/serve/test_openai.py BUILD_DIR

Installs `openai` (major versions 1 to 3) with pip into a virtual environment
BUILD_DIR/venv-openai (once; reused after), starts `python3 -m parity.serve` on the repo's
byte-level model, and runs test/serve/openai_client.py there with the environment's Python:
completions.create (string and token-id prompts, n, seed, logprobs), the same request twice bit
for bit, streaming equal to non-streaming, models.list, and the errors as openai.APIStatusError
with their statuses (400, 404, 413). Exit status: 0 passed, 1 failed, 77 skipped (this Python has
no venv/ensurepip); a failed pip install (PyPI unreachable, say) fails the test.
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_curl import MODEL, Server, harness  # noqa: E402

OPENAI = "openai>=1,<4"
SCRIPT = os.path.join(HERE, "openai_client.py")
VENV_PYTHON = None  # BUILD/venv-openai/bin/python, set by main()


class TestOpenAIClient(unittest.TestCase):
    def test_openai_client(self):
        server = Server()
        try:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("OPENAI_", "PYTHON"))}
            env["NO_PROXY"] = "127.0.0.1"
            p = subprocess.run([VENV_PYTHON, SCRIPT, server.base + "/v1", MODEL], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=180)
            out = p.stdout.decode("utf-8", "replace")
            print("\n" + out, end="" if out.endswith("\n") else "\n")
        finally:
            rc = server.stop()
        self.assertEqual(p.returncode, 0, "openai_client.py failed (exit %d); server output:\n%s"
                         % (p.returncode, server.stderr()))
        self.assertIn("openai-client: ", out)
        self.assertEqual(rc, 0, "SIGTERM should stop the server with exit 0; its output:\n"
                         + server.stderr())


def main():
    global VENV_PYTHON
    build = harness.setup()
    if not os.path.isdir(MODEL):
        sys.exit("error: no model at %s" % MODEL)
    VENV_PYTHON = harness.venv(build, "openai", [OPENAI], timeout=300)
    harness.run("serve-openai")


if __name__ == "__main__":
    main()
