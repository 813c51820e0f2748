#!/bin/sh
# Fuzzes libparity's parsers and the scorer's input checks: `scripts/fuzz.sh [SECONDS]`.
# Configures build-fuzz (clang, -Dfuzz=true, ASan + UBSan), builds the libFuzzer targets of
# test/fuzz, and runs each for SECONDS (default 15), two at a time, on its committed corpus
# (test/fuzz/corpus/<target>, read only: new inputs go to build-fuzz/corpus-new/<target>)
# with its dictionary. Fails on any crash, leak, timeout or sanitizer report; the input that
# caused it is in build-fuzz/artifacts/, the log in build-fuzz/fuzz-<target>.log.
set -eu
cd "$(dirname "$0")/.."
secs=${1:-15}
build=build-fuzz
targets="safetensors json index load score"

# shellcheck source=scripts/lib.sh
. scripts/lib.sh
scripts/deps.sh
install_missing fuzz.sh clang libclang-rt-14-dev

clang_build $build -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debugoptimized
ninja -C $build $(for t in $targets; do printf 'test/fuzz/fuzz_%s ' "$t"; done)

mkdir -p $build/artifacts
cat test/fuzz/json.dict test/fuzz/safetensors.dict > $build/load.dict

# Runs one target; prints one line; returns non-zero on any finding.
fuzz() {
    t=$1
    case $t in
    safetensors) dict="-dict=test/fuzz/safetensors.dict" ;;
    json | index) dict="-dict=test/fuzz/json.dict" ;;
    load) dict="-dict=$build/load.dict" ;;
    *) dict="" ;;
    esac
    mkdir -p $build/corpus-new/$t
    log=$build/fuzz-$t.log
    rc=0
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    OPENBLAS_NUM_THREADS=1 \
        $build/test/fuzz/fuzz_$t $dict -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix=$build/artifacts/$t- \
        $build/corpus-new/$t test/fuzz/corpus/$t >$log 2>&1 || rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' $log)
    reports='ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:'
    if [ $rc -ne 0 ] || grep -qE "$reports" $log; then
        echo "fuzz: $t: FAILED after ${runs:-?} runs (exit $rc): see $log"
        grep -E 'ERROR:|runtime error:|invariant failed|Test unit written' $log | head -5
        return 1
    fi
    echo "fuzz: $t: ${runs:-?} runs in ${secs} s, no finding"
}

# two at a time (the machine has two cores)
failed=0
set -- $targets
while [ $# -gt 0 ]; do
    a=$1
    shift
    if [ $# -gt 0 ]; then
        b=$1
        shift
        fuzz "$a" &
        pa=$!
        fuzz "$b" || failed=1
        wait $pa || failed=1
    else
        fuzz "$a" || failed=1
    fi
done
[ $failed -eq 0 ] || { echo "fuzz: FAILED"; exit 1; }
echo "fuzz: all targets passed"
