#!/bin/sh
# The conformance tier: libparity against transformers itself. Builds libparity
# (scripts/build.sh, which installs what is missing, python3-venv included), makes the virtual
# environment build/venv-conformance with PyTorch, transformers, safetensors, tokenizers, numpy,
# distributed, ray, jinja2 and lm_eval from PyPI (once; it prints what it downloaded and how long
# that took), then runs the tier's driver test/conformance/conformance.py (facts, the region
# table, whole-model log-probs: README "Conformance against transformers"; arguments go to the
# driver), the parity.hf.patch tests, the server's tokenizer and chat tests,
# lm-evaluation-harness against the server, and the suite's Python tests under the venv's
# PyTorch 2. `scripts/conformance.sh` from the repository root. Exit 0 passed, 1 on any failed
# check, 77 where this Python has no venv or ensurepip.
set -eu
cd "$(dirname "$0")/.."
scripts/build.sh >&2
python3 test/conformance/venv.py build || exit $?
start=$(date +%s)
venv_python=build/venv-conformance/bin/python
failed=0
PYTHONPATH=python "$venv_python" test/conformance/conformance.py build "$@" || failed=1
# parity.hf.patch: its regions against the C kernels, its log-probs against parity_score.
PYTHONPATH=python OMP_NUM_THREADS=1 "$venv_python" test/conformance/test_hf_patch.py build || failed=1
# The server with a checkpoint's tokenizer: text prompts, stop strings, chat templates rendered
# as transformers renders them, chat completions against parity.Model.
"$venv_python" test/serve/test_text.py build || failed=1
# lm-evaluation-harness's local-completions model against the server, its numbers against
# parity.Model's.
"$venv_python" test/clients/test_lm_eval.py build || failed=1
# The suite's Python tests (parity.torch, CausalLM, GRPO on dask and on Ray, the binding, MoE,
# bisect) under the venv's PyTorch 2 and numpy 2, none allowed to skip.
"$venv_python" scripts/python-tests.py --no-skips build || failed=1
echo "conformance: the checks took $(( $(date +%s) - start )) s"
exit "$failed"
