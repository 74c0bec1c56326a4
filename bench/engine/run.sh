#!/usr/bin/env bash
# Engine benchmark: shoal's ONNX engine beside PyTorch (frozen TorchScript) on ResNet-50,
# MobileNetV2, BERT-base (seq 128), a VAE and an MLP recommender, batch 1 and 8, the same
# thread count, in one run; prints a Markdown table with the ratio shoal/PyTorch.
#   bench/engine/run.sh [--threads N] [--runs N] [--min-seconds S] [--models a,b,...] [--keep DIR]
# Builds nothing: needs build/bench/engine_benchmark
#   (cmake --build build --target engine_benchmark) and Debian's python3-torch,
# python3-torchvision, python3-onnx. Models are exported to a temporary folder and removed
# afterwards (--keep DIR writes them to DIR instead and keeps them).
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=2
RUNS=5
MIN_SECONDS=0.5
MODELS=resnet50,mobilenet_v2,bert_base,vae,mlp
KEEP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --min-seconds) MIN_SECONDS="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --keep) KEEP="$2"; shift 2 ;;
    *) echo "usage: bench/engine/run.sh [--threads N] [--runs N] [--min-seconds S] [--models a,b] [--keep DIR]" >&2
       exit 2 ;;
  esac
done
BENCH=build/bench/engine_benchmark
[ -x "$BENCH" ] || { echo "build first: cmake --build build --target engine_benchmark" >&2; exit 1; }
# PyTorch's matmuls go to the system BLAS; the reference BLAS would flatter shoal.
if ! dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "install ok installed"; then
  echo "warning: libopenblas0-pthread is not installed; PyTorch's matmuls use the reference BLAS" \
       "(apt-get install -y libopenblas0-pthread)" >&2
fi

if [ -n "$KEEP" ]; then
  WORK="$KEEP"; mkdir -p "$WORK"
else
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
START=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== exporting models and timing PyTorch ($THREADS threads)" >&2
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE force OpenBLAS onto slower kernels: unset for the
# peer only (docs/platform-notes.md).
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /usr/bin/python3 bench/engine/export_models.py "$WORK" \
  --threads "$THREADS" --runs "$RUNS" --min-seconds "$MIN_SECONDS" --models "$MODELS"

echo "== timing shoal's engine ($THREADS threads)" >&2
"$BENCH" --dir "$WORK" --models "$MODELS" --threads "$THREADS" --runs "$RUNS" --min-seconds "$MIN_SECONDS" \
  --json "$WORK/shoal.json" >&2

ELAPSED=$(( $(date +%s) - START ))
/usr/bin/python3 - "$WORK/pytorch.json" "$WORK/shoal.json" "$THREADS" "$ELAPSED" "$LOAD_BEFORE" <<'PY'
import json, os, sys
torch_res = json.load(open(sys.argv[1]))
shoal_res = json.load(open(sys.argv[2]))
threads, elapsed, load_before = sys.argv[3], sys.argv[4], sys.argv[5]
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
print("Machine: %s, nproc %d; threads %s; torch %s; load average before %s, after %s; %s s in all"
      % (cpu, os.cpu_count(), threads, torch_res.get("torch", "?"), load_before,
         " ".join(open("/proc/loadavg").read().split()[:3]), elapsed))
print()
print("| model | batch | PyTorch items/s | shoal items/s | shoal/PyTorch | shoal GFLOP/s | notes |")
print("|---|---|---|---|---|---|---|")
for r in shoal_res["results"]:
    m, b = r["model"], r["batch"]
    pt = torch_res["results"].get(m, {}).get(str(b))
    notes = []
    if torch_res.get("notes", {}).get(m):
        notes.append("PyTorch: " + torch_res["notes"][m])
    if r["error"]:
        notes.append("shoal failed: " + r["error"].replace("|", "/").replace("\n", " "))
    sh = r["items_per_s"] if not r["error"] else None
    fmt = lambda v: "%.2f" % v if v is not None else "—"
    ratio = "%.2f" % (sh / pt) if sh and pt else "—"
    gflops = "%.1f" % (sh * r["flops_per_item"] / 1e9) if sh and r["flops_per_item"] else "—"
    print("| %s | %d | %s | %s | %s | %s | %s |" % (m, b, fmt(pt), fmt(sh), ratio, gflops, "; ".join(notes)))
PY
