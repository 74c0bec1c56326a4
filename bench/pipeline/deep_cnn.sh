#!/usr/bin/env bash
# Strategy table (serial, data parallel, pipeline parallel, hybrid) on a deep CNN split into
# pipeline stages; writes its section of bench/results/pipeline.md. See deep_cnn.py.
#   bench/pipeline/deep_cnn.sh [--window-ms MS] [--warmup-ms MS] [--clients N] [--cores 0-1] [--depth D]
# Needs a build (SHOAL_BUILD, default build) and python3-torch + python3-onnx (installed on
# demand). About 1-2 minutes on 2 cores. Everything listens on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL="${SHOAL_BUILD:-build}/src/cli/shoal"
[ -x "$SHOAL" ] || { echo "build first: scripts/build.sh ${SHOAL_BUILD:-build} (no $SHOAL)" >&2; exit 1; }
missing=()
for p in python3-torch python3-onnx python3-numpy; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing ${missing[*]}" >&2
  $SUDO apt-get install -y -q "${missing[@]}" >/dev/null
fi
LOADAVG="$(cut -d' ' -f1-3 /proc/loadavg)"
exec /usr/bin/python3 bench/pipeline/deep_cnn.py --shoal "$SHOAL" --loadavg "$LOADAVG" "$@"
