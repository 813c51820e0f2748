"""Makes (once) the conformance tier's virtual environment BUILD/venv-conformance with PyTorch,
transformers, safetensors, tokenizers, numpy, distributed and ray from PyPI, through
test/python/harness.py's venv(), which prints what the download and install took:

    python3 test/conformance/venv.py BUILD

Exit 0 when it is there, 77 where this Python has no venv or ensurepip, 1 when pip fails.
PyPI's torch for Linux x86_64 is the CUDA build with its nvidia-* wheels (about 3 GB); it runs
on the CPU. The versions are pinned to those the tier's facts and bounds were last checked on;
raise them together with a tier run.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import harness  # noqa: E402

# distributed (dask's scheduler) and ray only for the GRPO example's --workers tests on dask and
# on Ray actors (test_grpo.py, test_grpo_ray.py), which the tier runs under PyTorch 2 with the
# rest of the suite's Python tests (scripts/python-tests.py); jinja2 (which torch brings too) for
# the server's chat templates (test/serve/test_text.py); lm_eval with what its local-completions
# model needs (datasets, aiohttp, requests, tenacity: its `api` extra without tiktoken) for
# test/clients/test_lm_eval.py.
REQUIREMENTS = ["torch==2.15.0", "transformers==5.25.0", "safetensors==0.8.0",
                "tokenizers==0.23.3", "numpy==2.4.6", "distributed==2026.8.0", "ray==2.60.0",
                "jinja2==3.1.6", "lm_eval==0.4.13", "datasets==5.2.0", "aiohttp==3.14.5",
                "requests==2.34.2", "tenacity==9.2.1"]

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 test/conformance/venv.py BUILD")
    python = harness.venv(os.path.abspath(sys.argv[1]), "conformance", REQUIREMENTS,
                          timeout=1800)
    print("conformance: virtual environment %s" % os.path.dirname(os.path.dirname(python)))
