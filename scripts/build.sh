#!/usr/bin/env bash
# Configures and builds shoal into a build folder.
#   scripts/build.sh [BUILD_DIR] [extra cmake args...]    (default BUILD_DIR: build)
# Environment: SHOAL_JOBS (parallel jobs, default: number of CPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
shift || true
# Relative paths in the cache key let build folders side by side share compiled objects.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # nvcc too, where the CUDA path is built (docs/gpu.md); unused otherwise.
  LAUNCHER+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
CMAKE_ARGS=()
for a in "$@"; do [ "$a" = "--target-fuzzers" ] || CMAKE_ARGS+=("$a"); done
cmake -S . -B "$BUILD_DIR" -G Ninja "${LAUNCHER[@]}" "${CMAKE_ARGS[@]}" >"$BUILD_DIR.configure.log" 2>&1 || {
  cat "$BUILD_DIR.configure.log" >&2
  exit 1
}
rm -f "$BUILD_DIR.configure.log"
TARGETS=()
for a in "$@"; do
  # --target-fuzzers (for test.sh): build only the libFuzzer targets.
  if [ "$a" = "--target-fuzzers" ]; then TARGETS=(--target importer_fuzzer http_infer_fuzzer binary_splitter_fuzzer grpc_infer_fuzzer
    npz_fuzzer model_config_fuzzer); fi
done
cmake --build "$BUILD_DIR" -j "${SHOAL_JOBS:-$(nproc)}" "${TARGETS[@]}"
