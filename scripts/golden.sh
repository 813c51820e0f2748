#!/bin/sh
# Regenerates test/data/golden/ from the current build: the library's own outputs that the
# golden test compares bit for bit. Run it only when a change moves output bits for a reason
# docs/DESIGN.md names, and say that reason in the commit that carries the new files.
set -eu
cd "$(dirname "$0")/.."
scripts/build.sh
rm -rf test/data/golden
PARITY_SOURCE_ROOT="$(pwd)" build/test/test_golden --write test/data/golden
echo "golden.sh: wrote test/data/golden ($(find test/data/golden -name '*.bin' | wc -l) files)"
