#!/usr/bin/env bash
# The second command of the README: builds shoal and runs every test.
#   1. a release build (RelWithDebInfo) and all tests: unit, end-to-end, fuzzers' seeds;
#   2. an ASan+UBSan build and the unit tests;
#   3. a TSan build and the unit tests;
#   4. the libFuzzer targets (clang, ASan+UBSan), each for SHOAL_FUZZ_SECONDS (default 30)
#      from its committed seed corpus;
#   5. the lock annotations: every source compiled with clang -Wthread-safety -Werror
#      (syntax only; scripts/check_thread_safety.sh).
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
  scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DSHOAL_SANITIZE=address -DSHOAL_BUILD_BENCHMARKS=OFF \
    -DSHOAL_BUILD_E2E=OFF -DSHOAL_CUDA=OFF
  step "unit tests under ASan+UBSan"
  (export LSAN_OPTIONS="suppressions=$PWD/src/engine/dnnl_lsan.supp"  # see the file
   cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -L unit -j2 --timeout 900)
  step "build (TSan)"
  scripts/build.sh build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=thread -DSHOAL_BUILD_BENCHMARKS=OFF \
    -DSHOAL_BUILD_E2E=OFF -DSHOAL_CUDA=OFF
  step "unit tests under TSan"
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
     ctest --output-on-failure -L unit -j2 --timeout 900)
  step "fuzzers (${SHOAL_FUZZ_SECONDS:-30} s each)"
  CC=clang CXX=clang++ scripts/build.sh build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_FUZZERS=ON \
    -DSHOAL_SANITIZE=address -DSHOAL_BUILD_TESTS=OFF -DSHOAL_BUILD_BENCHMARKS=OFF -DSHOAL_CUDA=OFF \
    --target-fuzzers
  run_fuzzer() {  # name seed-folder [libFuzzer args...]
    local name="$1" seeds="$2"; shift 2
    local corpus log rc=0
    corpus=$(mktemp -d); log=$(mktemp)
    cp -r "$seeds"/. "$corpus"/
    # Crashes and slow inputs go to build-fuzz/artifacts, not the working tree.
    mkdir -p build-fuzz/artifacts
    build-fuzz/fuzz/"$name" "$corpus" -max_total_time="${SHOAL_FUZZ_SECONDS:-30}" -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/ "$@" >"$log" 2>&1 || rc=$?
    echo "--- $name: $(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') runs, exit $rc"
    if [ "$rc" -ne 0 ]; then tail -40 "$log" >&2; fi
    rm -rf "$corpus" "$log"
    return "$rc"
  }
  run_fuzzer importer_fuzzer fuzz/corpus
  run_fuzzer http_infer_fuzzer fuzz/http_corpus/infer -max_len=65536
  run_fuzzer binary_splitter_fuzzer fuzz/http_corpus/binary_splitter
  run_fuzzer grpc_infer_fuzzer fuzz/grpc_corpus/infer -max_len=65536
  run_fuzzer npz_fuzzer fuzz/npz_corpus -max_len=65536
  run_fuzzer model_config_fuzzer fuzz/config_corpus -max_len=8192
  step "lock annotations (clang -Wthread-safety)"
  scripts/check_thread_safety.sh build-tsa
fi
step "all tests passed"
