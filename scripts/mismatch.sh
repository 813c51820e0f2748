#!/bin/sh
# The main job: builds libparity and runs the sampler x learner mismatch benchmark on the
# built-in model: `scripts/mismatch.sh [parity-mismatch options]` from the repository root.
set -eu
cd "$(dirname "$0")/.."
scripts/build.sh >&2
exec build/bench/parity-mismatch "$@"
