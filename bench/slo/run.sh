#!/usr/bin/env bash
# Latency-SLO benchmark: a Triton-style fixed-window batcher beside shoal's SLO scheduling on
# the same models (cost_model plugin, recommender, image_classifier), closed-loop saturation
# and open-loop Poisson arrivals at 25-200% of saturation. Writes bench/results/slo.md and
# slo.json.
#   bench/slo/run.sh [--quick] [--models a,b] [--levels 25,50,...] [--window-ms MS]
#                    [--warmup-ms MS] [--saturation-concurrency N] [--out DIR] [--keep DIR]
# --quick: short windows on cost_model only (~1 minute). Full run: ~10 minutes on 2 cores.
# Needs a build (SHOAL_BUILD, default build). Everything listens on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) ARGS=(--models cost_model --window-ms 1500 --warmup-ms 500 "${ARGS[@]}"); shift ;;
    --models|--levels|--window-ms|--warmup-ms|--saturation-concurrency|--out|--keep)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
      ARGS+=("$1" "$2"); shift 2 ;;
    *) echo "usage: bench/slo/run.sh [--quick] [--models a,b] [--levels 25,50,...] [--window-ms MS]" \
            "[--warmup-ms MS] [--saturation-concurrency N] [--out DIR] [--keep DIR]" >&2; exit 2 ;;
  esac
done
SHOAL="${SHOAL_BUILD:-build}/src/cli/shoal"
[ -x "$SHOAL" ] || { echo "build first: scripts/build.sh ${SHOAL_BUILD:-build} (no $SHOAL)" >&2; exit 1; }
exec /usr/bin/python3 bench/slo/slo.py --shoal "$SHOAL" "${ARGS[@]}"
