#!/usr/bin/env bash
# The second command of the README: builds shoal and runs every test.
#   1. a release build (RelWithDebInfo) and all tests: unit, end-to-end, fuzzers' seeds;
#   2. an ASan+UBSan build and the unit tests;
#   3. a TSan build and the unit tests.
# Options: --quick runs step 1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
  esac
done

scripts/install-deps.sh
start=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - start ))s)"; }

step "build (RelWithDebInfo)"
scripts/build.sh build -DCMAKE_BUILD_TYPE=RelWithDebInfo
step "tests"
(cd build && ctest --output-on-failure -j2 --timeout 600)

if [ "$QUICK" -eq 0 ]; then
  step "build (ASan+UBSan)"
  scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DSHOAL_SANITIZE=address -DSHOAL_BUILD_BENCHMARKS=OFF
  step "unit tests under ASan+UBSan"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -L unit -j2 --timeout 900)
  step "build (TSan)"
  scripts/build.sh build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=thread -DSHOAL_BUILD_BENCHMARKS=OFF
  step "unit tests under TSan"
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
     ctest --output-on-failure -L unit -j2 --timeout 900)
fi
step "all tests passed"
