#!/usr/bin/env bash
# The first command of the README: installs what is missing, builds shoal, and serves
# the bundled example model repository. Extra arguments go to `shoal serve`, e.g.
#   scripts/serve.sh --http-port 9000
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build -DCMAKE_BUILD_TYPE=Release >/dev/null
exec build/src/cli/shoal serve --model-repository examples/models "$@"
