#!/usr/bin/env bash
# The first command of the README: installs what is missing, builds shoal, and serves
# the bundled example model repository. Extra arguments go to `shoal serve`, e.g.
#   scripts/serve.sh --http-port 9000
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Its own build folder, without tests and benchmarks: the quickest way to a server.
scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DSHOAL_BUILD_TESTS=OFF -DSHOAL_BUILD_BENCHMARKS=OFF >/dev/null
exec build-release/src/cli/shoal serve --model-repository examples/models "$@"
