#!/bin/sh
# Builds libparity and runs its whole test suite: `scripts/test.sh` from the repository root.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
if [ -f build/build.ninja ]; then
    meson setup --reconfigure build >/dev/null
else
    meson setup build >/dev/null
fi
ninja -C build
meson test -C build --print-errorlogs --num-processes 2
