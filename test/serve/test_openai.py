"""parity.serve driven by the official `openai` client package from the npm registry.

    python3 test/serve/test_openai.py BUILD_DIR

Installs `openai@4` with npm into BUILD_DIR/serve-node (once; reused after), starts
`python3 -m parity.serve` on the repo's byte-level model, and runs test/serve/openai_client.mjs
there with Node.js: completions.create (string and token-id prompts, n, seed, logprobs), the
same request twice bit for bit, streaming equal to non-streaming, models.list, and the errors
as OpenAI.APIError with their statuses (400, 404, 413). Exit status: 0 passed, 1 failed,
77 skipped (no Node.js / npm); a failed npm install fails the test.
"""
import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_curl import MODEL, Server, harness  # noqa: E402

OPENAI = "openai@4"
SCRIPT = os.path.join(HERE, "openai_client.mjs")
NODE_DIR = None  # BUILD/serve-node, set by main()


def installed_major(d):
    try:
        with open(os.path.join(d, "node_modules", "openai", "package.json")) as f:
            return int(json.load(f)["version"].split(".")[0])
    except (OSError, ValueError, KeyError):
        return None


def skip(why):
    print("SKIP: serve-openai: " + why)
    sys.exit(harness.SKIP)


def fail(why):
    print("FAIL: serve-openai: " + why)
    sys.exit(1)


def install(d):
    """`openai@4` under d/node_modules, reused when already there; a failed install (no
    registry, say) fails the test, since Node.js and npm are there."""
    if installed_major(d) == 4:
        return
    os.makedirs(d, exist_ok=True)
    cmd = ["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", d, OPENAI]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=300)
        out = p.stdout.decode("utf-8", "replace")
        ok = p.returncode == 0
    except subprocess.TimeoutExpired:
        out, ok = "(timed out after 300 s)", False
    if not ok or installed_major(d) != 4:
        # Node.js is here, so the client test must run: a failed install is a failure
        fail("`%s` failed, so the npm package %s could not be installed (is the npm registry "
             "reachable?):\n%s" % (" ".join(cmd), OPENAI, out[-3000:]))


class TestOpenAIClient(unittest.TestCase):
    def test_openai_client(self):
        script = os.path.join(NODE_DIR, "openai_client.mjs")
        shutil.copyfile(SCRIPT, script)  # ESM resolves `openai` from the script's directory
        server = Server()
        try:
            p = subprocess.run(["node", script, server.base + "/v1", MODEL],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=180)
            out = p.stdout.decode("utf-8", "replace")
            print("\n" + out, end="" if out.endswith("\n") else "\n")
        finally:
            rc = server.stop()
        self.assertEqual(p.returncode, 0, "openai_client.mjs failed (exit %d); server output:\n%s"
                         % (p.returncode, server.stderr()))
        self.assertEqual(rc, 0, "SIGTERM should stop the server with exit 0; its output:\n"
                         + server.stderr())


def main():
    global NODE_DIR
    build = harness.setup()
    if shutil.which("node") is None or shutil.which("npm") is None:
        skip("needs Node.js and npm (node: %s, npm: %s); install them (apt-get install nodejs "
             "npm) to run the openai-client test" % (shutil.which("node"), shutil.which("npm")))
    v = subprocess.run(["node", "--version"], stdout=subprocess.PIPE).stdout.decode().strip()
    try:
        major = int(v.lstrip("v").split(".")[0])
    except ValueError:
        major = 0
    if major < 18:
        skip("the openai npm package needs Node.js >= 18; this one is %r" % v)
    if not os.path.isdir(MODEL):
        sys.exit("error: no model at %s" % MODEL)
    NODE_DIR = os.path.join(build, "serve-node")
    install(NODE_DIR)
    harness.run("serve-openai")


if __name__ == "__main__":
    main()
