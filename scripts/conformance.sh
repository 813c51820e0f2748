#!/bin/sh
# The conformance tier: libparity against transformers itself. Builds libparity
# (scripts/build.sh, which installs what is missing, python3-venv included), makes the virtual
# environment build/venv-conformance with PyTorch, transformers, safetensors, tokenizers and
# numpy from PyPI (once; it prints what it downloaded and how long that took), then runs the
# tier's driver test/conformance/conformance.py (facts, the region table, whole-model
# log-probs: README "Conformance against transformers"); arguments go to the driver.
# `scripts/conformance.sh` from the repository root. Exit 0 passed, 1 on any failed check, 77
# where this Python has no venv or ensurepip.
set -eu
cd "$(dirname "$0")/.."
scripts/build.sh >&2
python3 test/conformance/venv.py build || exit $?
start=$(date +%s)
venv_python=build/venv-conformance/bin/python
failed=0
PYTHONPATH=python "$venv_python" test/conformance/conformance.py build "$@" || failed=1
# The tier's other steps run here, each with "$venv_python" and PYTHONPATH=python, setting
# failed=1 when they fail: the parity.hf.patch tests, the PyTorch 2 tests.
echo "conformance: the checks took $(( $(date +%s) - start )) s"
exit "$failed"
