#!/usr/bin/env bash
# Engine benchmark: shoal's ONNX engine, in its fp32, bf16 and int8 tiers and in fp32 with
# Winograd or channels-last convolutions, beside PyTorch
# (frozen TorchScript) on ResNet-50, MobileNetV2, BERT-base (seq 128), a VAE, an MLP
# recommender, LSTM and GRU text classifiers (64 tokens), a detector with NMS in its graph
# (3x320x320) and a segmentation U-Net (3x256x256), plus the trained classifiers models/digits.onnx and the example repository's
# image_classifier (shoal only, accuracy against held-out labels), at batch 1 and 8, the same thread count, in one run.
# bf16 and int8 are timed as the server serves them (the load-time tier selection of
# engine/precision.h keeps fp32 where a tier does not pay); where that kept operators fp32,
# the whole tier is timed beside it ("raw"). Prints three Markdown tables: throughput with the
# ratios (fp32/PyTorch, bf16/fp32, int8/fp32, winograd/fp32, channels-last/fp32) and GFLOP/s as a fraction of the FMA peak the
# benchmark measures itself; planned memory vs the liveness bound; accuracy of each tier.
#   bench/engine/run.sh [--threads N] [--runs N] [--min-seconds S] [--models a,b,...]
#                       [--keep DIR | --models-from DIR] [--reuse-pytorch]
#                       [--tiers bf16,int8,winograd,channels_last]
# --tiers names the variants timed beside direct fp32 (default all four; "none" times fp32
# alone).
# --keep DIR writes the exported models to DIR and keeps them (else a temporary folder,
# removed afterwards). --models-from DIR is --keep DIR that reuses the models already
# exported there (exporting only the missing ones); PyTorch is still timed. --reuse-pytorch
# also reuses DIR/pytorch.json from an earlier run instead of timing PyTorch again.
# Builds nothing: needs build/bench/engine_benchmark (cmake --build build --target
# engine_benchmark; SHOAL_ENGINE_BENCHMARK=path overrides). Installs with apt-get what it
# needs beyond scripts/install-deps.sh when missing: python3-torch, python3-torchvision,
# python3-onnx, python3-sklearn (the held-out digits), libopenblas0-pthread (PyTorch's matmuls go to the system BLAS; the
# reference BLAS would flatter shoal).
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=2
RUNS=5
MIN_SECONDS=0.5
MODELS=resnet50,mobilenet_v2,bert_base,vae,mlp,lstm,gru,detector,unet,digits,image_classifier
KEEP=""
REUSE_MODELS=0
REUSE_PYTORCH=0
TIERS=bf16,int8,winograd,channels_last
usage() {
  echo "usage: bench/engine/run.sh [--threads N] [--runs N] [--min-seconds S] [--models a,b]" \
       "[--keep DIR | --models-from DIR] [--reuse-pytorch] [--tiers bf16,int8,winograd,channels_last]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --min-seconds) MIN_SECONDS="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --keep) KEEP="$2"; shift 2 ;;
    --models-from) KEEP="$2"; REUSE_MODELS=1; shift 2 ;;
    --reuse-pytorch) REUSE_PYTORCH=1; shift ;;
    --tiers) TIERS="$2"; shift 2 ;;
    *) usage ;;
  esac
done
[ "$REUSE_PYTORCH" = 0 ] || [ -n "$KEEP" ] || { echo "--reuse-pytorch needs --keep or --models-from" >&2; exit 2; }
BENCH="${SHOAL_ENGINE_BENCHMARK:-build/bench/engine_benchmark}"
[ -x "$BENCH" ] || { echo "build first: cmake --build build --target engine_benchmark" >&2; exit 1; }

missing=()
for p in python3-torch python3-torchvision python3-onnx python3-sklearn libopenblas0-pthread; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
fi

if [ -n "$KEEP" ]; then
  WORK="$KEEP"; mkdir -p "$WORK"
else
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
START=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
# The host's steal over the run (the share of CPU time the hypervisor gave to others), from
# /proc/stat's aggregate line: on a shared VM it says how much of a slow run was the host.
STAT_BEFORE=$(head -1 /proc/stat)

# digits and image_classifier are the repository's trained models: no export, no PyTorch
# figure. image_classifier's held-out images are rendered as examples/models/generate.py
# renders them when it reports the model's accuracy (same split, same seed).
PT_MODELS=$(echo "$MODELS" | tr ',' '\n' | grep -vxE 'digits|image_classifier' | paste -sd, || true)
if echo "$MODELS" | tr ',' '\n' | grep -qx image_classifier; then
  cp examples/models/image_classifier/1/model.onnx "$WORK/image_classifier.onnx"
  /usr/bin/python3 - "$WORK/image_classifier.test.sht" <<'PY'
import importlib.util, sys
import numpy as np
import torch
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
examples = load("examples_generate", "examples/models/generate.py")
tests = load("models_generate", "models/generate.py")
_, x_test, _, y_test = examples.load_digits_split()
images = examples.colour_digits(x_test, torch.Generator().manual_seed(22)).numpy().astype(np.float32)
tests.write_sht(sys.argv[1], [("in:image", images), ("labels", y_test.astype(np.int64))])
print("image_classifier: %d held-out images" % len(y_test), file=sys.stderr)
PY
fi
if [ -n "$PT_MODELS" ]; then
  if [ "$REUSE_PYTORCH" = 1 ] && [ -f "$WORK/pytorch.json" ]; then
    echo "== reusing $WORK/pytorch.json" >&2
  else
    echo "== exporting models and timing PyTorch ($THREADS threads)" >&2
    SKIP=(); [ "$REUSE_MODELS" = 0 ] || SKIP=(--skip-existing)
    # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE force OpenBLAS onto slower kernels: unset for
    # the peer only (docs/platform-notes.md).
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /usr/bin/python3 bench/engine/export_models.py "$WORK" \
      --threads "$THREADS" --runs "$RUNS" --min-seconds "$MIN_SECONDS" --models "$PT_MODELS" "${SKIP[@]}"
  fi
fi
# pytorch.json -> the lines engine_benchmark --peer reads: model, batch, items/s (or "note").
/usr/bin/python3 - "$WORK/pytorch.json" >"$WORK/peer.tsv" <<'PY'
import json, os, sys
if os.path.exists(sys.argv[1]):
    res = json.load(open(sys.argv[1]))
    for model, figures in res.get("results", {}).items():
        for batch, v in figures.items():
            print("%s\t%s\t%r" % (model, batch, v))
    for model, note in res.get("notes", {}).items():
        print("%s\tnote\t%s" % (model, " ".join(note.split())))
PY

echo "== timing shoal's engine ($THREADS threads; fp32 and tiers: $TIERS)" >&2
TABLES=$("$BENCH" --dir "$WORK" --models "$MODELS" --threads "$THREADS" --runs "$RUNS" --tiers "$TIERS" \
  --min-seconds "$MIN_SECONDS" --models-dir "$PWD/models" --peer "$WORK/peer.tsv" \
  --json "$WORK/shoal.json")

ELAPSED=$(( $(date +%s) - START ))
STEAL=$(echo "$STAT_BEFORE $(head -1 /proc/stat)" | awk '{ a = 0; b = 0
  for (i = 2; i <= 9; i++) { a += $i; b += $(i + 11) }  # user..steal (guest is in user)
  if (b > a) printf "%.1f%%", 100 * ($20 - $9) / (b - a); else printf "?" }')
TORCH=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("torch","?"))' \
  "$WORK/pytorch.json" 2>/dev/null || echo "not run")
echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), nproc $(nproc);" \
     "threads $THREADS; torch $TORCH; load average before $LOAD_BEFORE, after" \
     "$(cut -d' ' -f1-3 /proc/loadavg); host steal $STEAL; $ELAPSED s in all"
echo
echo "$TABLES"
