#!/bin/sh
# Installs what building and testing libparity needs on Debian 12, when it is missing:
# a C compiler, meson, ninja, pkg-config, OpenBLAS. Runs apt-get only if something is absent
# (as root, or through sudo when there is one).
set -eu
need=""
for pkg in gcc meson ninja-build pkg-config libopenblas-dev python3; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need="$need $pkg"
done
if [ -n "$need" ]; then
    echo "deps.sh: installing$need" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >&2
fi
