#!/bin/sh
# Installs what is missing (scripts/deps.sh), then configures and builds libparity in build/.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
if [ -f build/build.ninja ]; then
    meson setup --reconfigure build
else
    meson setup build
fi
ninja -C build
