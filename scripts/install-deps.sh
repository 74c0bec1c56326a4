#!/usr/bin/env bash
# Installs the Debian 12 packages shoal needs to build, test and serve, and nothing
# else. Idempotent and silent when everything is already installed.
#   scripts/install-deps.sh            build + test dependencies
set -euo pipefail

PACKAGES=(
  # toolchain; the fuzzers are built with clang, whose sanitizer runtimes and OpenMP
  # runtime (the engine links OpenMP) are packages of their own
  g++ cmake ninja-build pkg-config ccache clang libclang-rt-14-dev libomp-14-dev
  # libraries (oneDNN's CMake package needs the OpenCL headers it only recommends)
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  libdnnl-dev ocl-icd-opencl-dev libonnx-dev libboost-dev libsimdjson-dev libspdlog-dev libfmt-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev libhiredis-dev libjemalloc-dev libxxhash-dev libssl-dev
  # tests and benchmarks (python3 drives the lock-annotation check over compile_commands.json)
  libgtest-dev libgmock-dev libbenchmark-dev python3
  # the dashboard: npm installs uPlot at build time; its end-to-end test runs node and chromium
  nodejs chromium
  # `shoal worker` tests: a real Redis server, started by worker_redis_test and e2e_worker_test
  redis-server
)
# deploy/ checks and end-to-end tests (deploy/CMakeLists.txt): promtool and prometheus, nginx, PyYAML
PACKAGES+=(prometheus nginx python3-yaml)
# e2e_worker_producer_example: docs/worker.md's Python producer, run as written (redis module)
PACKAGES+=(python3-redis)
# kubectl (kubectl kustomize in deploy_kubernetes_manifests): Debian's kubernetes-client, unless a kubectl is already installed (Kubernetes' own kubectl package conflicts with it)
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)
# npm (the dashboard's build): Debian's, unless one is on PATH already (NodeSource's nodejs
# bundles its own npm and conflicts with Debian's npm package)
command -v npm >/dev/null || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "shoal: installing ${#missing[@]} missing Debian package(s): ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
