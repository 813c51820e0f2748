#!/bin/sh
# Installs the build into a staging directory and builds examples/embed the way a server
# would: with `pkg-config --cflags --libs parity` alone, then runs it (and compiles each
# installed header on its own with those flags). Then links test/static_host.c, a host with
# its own forward(), json_parse(), ... statically against the installed libparity.a
# (`pkg-config --static`), and runs it: the static library must keep its internal names to
# itself.
#   test/test_install.sh BUILD_DIR
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C "$build" --destdir "$stage" --quiet >/dev/null
pc=$(find "$stage" -name parity.pc | head -n 1)
[ -n "$pc" ] || { echo "no parity.pc installed"; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$stage"
flags=$(pkg-config --cflags --libs parity)
echo "pkg-config --cflags --libs parity: $flags"
for f in include/parity.h include/parity_quant.h include/parity_ops.h; do
    [ -n "$(find "$stage" -path "*/$f")" ] || { echo "missing $f"; exit 1; }
    # each header compiles on its own, with the installed flags alone
    printf '#include <%s>\nint main(void) { return 0; }\n' "${f#include/}" >"$stage/header.c"
    # shellcheck disable=SC2086
    cc -std=c11 -Wall -Wextra -Werror -c "$stage/header.c" $flags -o "$stage/header.o" ||
        { echo "${f#include/} does not compile on its own"; exit 1; }
done
[ -n "$(find "$stage" -name 'libparity.a')" ] || { echo "missing libparity.a"; exit 1; }
[ -n "$(find "$stage" -name 'libparity.so.0*')" ] || { echo "missing libparity.so.0 (soname)"; exit 1; }
for tool in parity-score parity-generate parity-bisect; do
    [ -n "$(find "$stage" -name "$tool" -type f)" ] || { echo "missing $tool"; exit 1; }
done
# shellcheck disable=SC2086
cc "$src/examples/embed/embed.c" $flags -o "$stage/embed"
LD_LIBRARY_PATH="$(dirname "$(find "$stage" -name 'libparity.so' | head -n 1)")" "$stage/embed"

static_flags=$(pkg-config --static --cflags --libs parity)
echo "pkg-config --static --cflags --libs parity: $static_flags"
# the archive, not the shared library: -lparity becomes -l:libparity.a
# shellcheck disable=SC2086
cc -Wall -Wextra -Werror "$src/test/static_host.c" $(printf '%s\n' $static_flags |
    sed 's/^-lparity$/-l:libparity.a/') -o "$stage/static_host"
if readelf -d "$stage/static_host" | grep -q 'NEEDED.*libparity'; then
    echo "static_host is linked against the shared libparity"
    exit 1
fi
"$stage/static_host"
echo "install test: 2 passed, 0 failed"
