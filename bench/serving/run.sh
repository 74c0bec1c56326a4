#!/usr/bin/env bash
# Serving benchmark: the strategies of a serving engineer's playbook side by side (one
# request at a time; dynamic batching; two instances; batching + two instances), the
# FastAPI + uvicorn + PyTorch peer (bench/peer) with and without its batching, and
# open-loop latency at 50/80/95% of shoal's saturation rate, on the example repository's
# recommender MLP and image_classifier CNN, in one run. Writes bench/results/serving.md
# (tables, machine description, targets), serving.json and serving_<model>.svg.
#   bench/serving/run.sh [--quick] [--models a,b] [--concurrency 1,4,16,64] [--window-ms MS]
#                        [--warmup-ms MS] [--max-trials N] [--repeats N] [--peer-threads N] [--out DIR] [--keep DIR]
#                        [--no-peer] [--from-json FILE (rewrite serving.md and the SVGs only)]
# --quick: a ~2-minute smoke run (short windows, concurrency 1,16, one run per level). Full
# run (each closed-loop level run 3 times, the median-throughput run kept): ~20 minutes on
# 2 cores. Needs a build (SHOAL_BUILD, default build: scripts/build.sh) and Debian's
# python3-fastapi, python3-uvicorn, python3-torch, python3-onnx, python3-numpy (installed
# on demand).
# Everything listens on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARGS=()
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --no-peer) ARGS+=("$1"); shift ;;
    --models|--concurrency|--window-ms|--warmup-ms|--max-trials|--repeats|--peer-threads|--out|--keep|--from-json)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
      ARGS+=("$1" "$2"); shift 2 ;;
    *) echo "usage: bench/serving/run.sh [--quick] [--models a,b] [--concurrency 1,4,16,64] [--window-ms MS]" \
            "[--warmup-ms MS] [--max-trials N] [--repeats N] [--peer-threads N] [--out DIR] [--keep DIR]" \
            "[--no-peer] [--from-json FILE]" >&2; exit 2 ;;
  esac
done
SHOAL="${SHOAL_BUILD:-build}/src/cli/shoal"
[ -x "$SHOAL" ] || { echo "build first: scripts/build.sh ${SHOAL_BUILD:-build} (no $SHOAL)" >&2; exit 1; }
MISSING=()
for p in python3-fastapi python3-uvicorn python3-torch python3-onnx python3-numpy; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || MISSING+=("$p")
done
if [ ${#MISSING[@]} -gt 0 ]; then
  echo "installing ${MISSING[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${MISSING[@]}" >/dev/null
fi
# PyTorch's matmuls go to the system BLAS; the reference BLAS would flatter shoal.
if ! dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "install ok installed"; then
  echo "warning: libopenblas0-pthread is not installed; the peer's matmuls use the reference BLAS" \
       "(apt-get install -y libopenblas0-pthread)" >&2
fi
if [ "$QUICK" = 1 ]; then
  # Defaults first: options given on the command line come later and win.
  ARGS=(--quick --concurrency 1,16 --window-ms 500 --warmup-ms 300 --max-trials 3 --repeats 1 "${ARGS[@]}")
fi
exec /usr/bin/python3 bench/serving/serving.py --shoal "$SHOAL" "${ARGS[@]}"
