#!/usr/bin/env bash
# Latency-SLO benchmark: a Triton-style fixed-window batcher beside shoal's SLO scheduling on
# the same models (cost_model plugin, recommender, image_classifier), closed-loop saturation
# and open-loop Poisson arrivals at 25-200% of saturation. Writes bench/results/slo.md and
# slo.json.
#   bench/slo/run.sh [--quick] [--models a,b] [--levels 25,50,...] [--window-ms MS]
#                    [--warmup-ms MS] [--saturation-concurrency N] [--out DIR] [--keep DIR]
#                    [--fixed-reserve-column]
# Per model: one request at a time, saturation, the open-loop levels, and an on/off burst
# (Poisson at 200% of saturation for 0.5 s of every 2 s: a mean of 50%); refusals' latency.
# --fixed-reserve-column: a further SLO server per model with admission's earlier rule (a
# fixed 25% of the deadline in reserve, nothing learned from late answers), side by side.
# --quick: short windows on cost_model only (~1 minute). Full run: ~12 minutes on 2 cores.
# Needs a build (SHOAL_BUILD, default build). Everything listens on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) ARGS=(--models cost_model --window-ms 1500 --warmup-ms 500 "${ARGS[@]}"); shift ;;
    --fixed-reserve-column) ARGS+=("$1"); shift ;;
    --models|--levels|--window-ms|--warmup-ms|--saturation-concurrency|--out|--keep)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
      ARGS+=("$1" "$2"); shift 2 ;;
    *) echo "usage: bench/slo/run.sh [--quick] [--models a,b] [--levels 25,50,...] [--window-ms MS]" \
            "[--warmup-ms MS] [--saturation-concurrency N] [--out DIR] [--keep DIR]" \
            "[--fixed-reserve-column]" >&2; exit 2 ;;
  esac
done
SHOAL="${SHOAL_BUILD:-build}/src/cli/shoal"
[ -x "$SHOAL" ] || { echo "build first: scripts/build.sh ${SHOAL_BUILD:-build} (no $SHOAL)" >&2; exit 1; }
# The image classifier's precision ladder is calibrated and its top-1 measured on the
# example's own held-out colour digits, rendered as examples/models/generate.py renders
# them (python3-torch, python3-onnx and python3-sklearn, installed on demand).
if [[ " ${ARGS[*]} " != *" --models "* || " ${ARGS[*]} " == *image_classifier* ]]; then
  missing=()
  for p in python3-torch python3-onnx python3-sklearn python3-numpy; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "installing ${missing[*]}" >&2
    $SUDO apt-get install -y -q "${missing[@]}" >/dev/null
  fi
  HELDOUT_DIR=$(mktemp -d)
  trap 'rm -rf "$HELDOUT_DIR"' EXIT
  /usr/bin/python3 - "$HELDOUT_DIR/heldout.npz" <<'PY'
import importlib.util, sys
import numpy as np
import torch
spec = importlib.util.spec_from_file_location("examples_generate", "examples/models/generate.py")
examples = importlib.util.module_from_spec(spec)
spec.loader.exec_module(examples)
_, x_test, _, y_test = examples.load_digits_split()
images = examples.colour_digits(x_test, torch.Generator().manual_seed(22)).numpy().astype(np.float32)
np.savez(sys.argv[1], image=images, labels=y_test.astype(np.int64))
PY
  ARGS+=(--heldout "$HELDOUT_DIR/heldout.npz")
fi
/usr/bin/python3 bench/slo/slo.py --shoal "$SHOAL" "${ARGS[@]}"
