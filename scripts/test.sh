#!/bin/sh
# Builds libparity and runs its whole test suite: `scripts/test.sh` from the repository root.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
if [ -f build/build.ninja ]; then
    meson setup --reconfigure build
else
    meson setup build
fi
ninja -C build
meson test -C build --print-errorlogs --num-processes 2
