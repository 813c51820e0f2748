#!/bin/sh
# Sanitizer tiers, built with clang in their own build directories, tests in quick mode
# (PARITY_TEST_QUICK=1: the heavy tests shrink their sweeps):
#   scripts/sanitize.sh asan   the whole meson test suite under AddressSanitizer and
#                              UndefinedBehaviorSanitizer, LeakSanitizer on (build-asan)
#   scripts/sanitize.sh tsan   the tests that run threads — concurrency, the scorer and
#                              sampler thread-count tests, the forward pieces on a pool, the
#                              profile (its pool timing), the looped models' sampler and the
#                              MoE block (its experts and combine on the pool) — under
#                              ThreadSanitizer (build-tsan)
# Any sanitizer report fails the tier.
set -eu
cd "$(dirname "$0")/.."
tier=${1:-}
case $tier in
asan) sanitize=address,undefined ;;
tsan) sanitize=thread ;;
*)
    echo "usage: $0 asan|tsan" >&2
    exit 2
    ;;
esac
build=build-$tier

# shellcheck source=scripts/lib.sh
. scripts/lib.sh
scripts/deps.sh
install_missing sanitize.sh clang libclang-rt-14-dev

clang_build $build -Db_sanitize=$sanitize -Db_lundef=false

export PARITY_TEST_QUICK=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
# OpenBLAS's own threads are not instrumented: the OpenBLAS backend runs on the calling thread
export OPENBLAS_NUM_THREADS=1

if [ $tier = asan ]; then
    ninja -C $build
    # The tests that load the library into Python (ctypes) or link it from an installed tree
    # run outside this build's sanitizer runtime: they are scripts/test.sh's. (--list prints
    # "PROJECT[:SUITE] / NAME" once a test has a suite; the names are what follows " / ".)
    tests=$(meson test -C $build --list 2>/dev/null | sed 's|^.* / ||' |
        grep -vE '^(python-.*|serve-.*|abi|install)$')
else
    ninja -C $build test/test_concurrency test/test_scorer test/test_sampler test/test_ops \
        test/test_profile test/test_looped test/test_moe
    tests="concurrency scorer sampler ops profile looped moe"
fi
# shellcheck disable=SC2086
meson test -C $build --no-rebuild --print-errorlogs --num-processes 2 $tests
