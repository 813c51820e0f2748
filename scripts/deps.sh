#!/bin/sh
# Installs what building and testing libparity needs on Debian 12, when it is missing:
# a C compiler, meson, ninja, pkg-config, OpenBLAS, curl (the server test drives it) and
# python3-venv (the openai-client test installs PyPI's `openai` into a virtual environment). Runs
# apt-get only if something is absent (as root, or through sudo when there is one).
set -eu
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
install_missing deps.sh gcc meson ninja-build pkg-config libopenblas-dev python3 python3-venv curl
