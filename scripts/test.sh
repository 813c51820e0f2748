#!/bin/sh
# Builds libparity and runs its whole test suite: `scripts/test.sh` from the repository root.
set -eu
cd "$(dirname "$0")/.."
scripts/build.sh
meson test -C build --print-errorlogs --num-processes 2
