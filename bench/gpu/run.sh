#!/usr/bin/env bash
# The GPU path's checks, in two halves, because the GPU machine (the `device` tool: one
# H100 or H200 for minutes, no Debian packages, no network) cannot build shoal:
#   bench/gpu/run.sh prepare   here: builds the CUDA tests (build folder build-cuda, or
#                              $SHOAL_BUILD) and copies them into .gpu/ (git-ignored)
#   bench/gpu/run.sh device    there, from the repository root with .gpu carried: shows
#                              the device, runs every CUDA test with device cases,
#                              writes the results under $OUT (or .gpu/out): gpu.txt (device, driver, each test's
#                              outcome, the GEMM peak), tests.log (every test's output),
#                              gtest-xml.tar (one gtest XML per test binary) and
#                              gemm_probe.json (the device's measured fp32/TF32/fp16/bf16/int8
#                              GEMM peak, bench/gpu/gemm_probe.cc), plan_bench.tar (one
#                              gpu_plan_bench JSON per model: the engine alone in every tier,
#                              GPU beside CPU, on the recommender, the text and the image
#                              classifier, and ResNet-50 and BERT-base, whose weights
#                              gpu_model_weights fills in there from bench/gpu/models) and
#                              served.json, served_1_instance.json and
#                              served_1_instance_depth_1.json (shoal serve with two, then
#                              one, KIND_GPU instances under shoal bench, then one with
#                              gpu_pipeline_depth 1)
# The tests link the CUDA runtime statically; on the GPU machine they need its driver and
# cuBLASLt's shared library (libcublasLt.so.13) and, for convolutions on cuDNN, cuDNN's
# (libcudnn.so.9, loaded at run time), which the device's CUDA image carries (in
# /usr/local/cuda or in pip's nvidia packages; both are searched). The GPU plan's and
# the backend's tests link the CPU engine, and the server that the e2e test and the served
# benchmark start links gRPC, Boost and more: Debian libraries the GPU machine lacks.
# prepare packs them into .gpu/lib.tar.gz (about 21 MB) and the binaries into
# .gpu/bin.tar.gz, and device unpacks both. glibc,
# libstdc++ and the CUDA libraries are the machine's own.
# Exits non-zero when a test fails, or, on the device, when no GPU is found (there the
# tests must run, not skip).
set -euo pipefail
cd "$(dirname "$0")/../.."
# The tests with device cases. The lowering's tests (engine_cuda_gpu_lowering*_test) are
# host only: they pass here, and would only take room in the 64 MiB that travels.
TESTS=(engine_cuda_device_test engine_cuda_elementwise_test engine_cuda_gemm_test engine_cuda_layout_test
       engine_cuda_normalization_test engine_cuda_reduce_test engine_cuda_conv_test engine_cuda_cudnn_test
       engine_cuda_recurrent_test engine_cuda_ipc_memory_test engine_cuda_nvml_test engine_cuda_quantize_test
       engine_cuda_gpu_plan_test
       backends_onnx_backend_test e2e_gpu_test)
# Where each test is built, and the gtest filter it runs with there (the backend test's
# GPU cases only).
declare -A TEST_DIR=([backends_onnx_backend_test]=src/backends/onnx [e2e_gpu_test]=tests/e2e)
# CudnnLibraryTest.AHandleNeedsADevice checks the refusal where there is no device, and
# skips where there is one: left out there, where a skip counts as a failure.
declare -A TEST_FILTER=([backends_onnx_backend_test]='OnnxBackendGpuTest.*:OnnxTierTest.Gpu*'
                        [engine_cuda_cudnn_test]='-CudnnLibraryTest.AHandleNeedsADevice')
case "${1:-}" in
  prepare)
    BUILD="${SHOAL_BUILD:-build-cuda}"
    LAUNCHER=()
    if command -v ccache >/dev/null; then LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache); fi
    # Configure the whole tree, build only what travels.
    cmake -S . -B "$BUILD" -G Ninja "${LAUNCHER[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_CUDA=ON \
      -DSHOAL_DASHBOARD=OFF >"$BUILD.configure.log" 2>&1 || {
      cat "$BUILD.configure.log" >&2
      echo "configuring $BUILD with SHOAL_CUDA=ON failed: is a CUDA toolkit installed (nvcc)?" >&2
      exit 1
    }
    rm -f "$BUILD.configure.log"
    ninja -C "$BUILD" -j "${SHOAL_JOBS:-$(nproc)}" "${TESTS[@]}" gpu_gemm_probe gpu_plan_bench \
      gpu_model_weights shoal
    rm -rf .gpu && mkdir -p .gpu/bin .gpu/build/src/cli
    # Without debug information: the engine's makes a test binary ten times larger.
    for t in "${TESTS[@]}"; do
      strip --strip-debug -o ".gpu/bin/$t" "$BUILD/${TEST_DIR[$t]:-src/engine/cuda}/$t"
    done
    strip --strip-debug -o .gpu/bin/gpu_gemm_probe "$BUILD/bench/gpu_gemm_probe"
    strip --strip-debug -o .gpu/bin/gpu_plan_bench "$BUILD/bench/gpu_plan_bench"
    strip --strip-debug -o .gpu/bin/gpu_model_weights "$BUILD/bench/gpu_model_weights"
    # The server, where the e2e test and the served benchmark look for it.
    strip --strip-debug -o .gpu/build/src/cli/shoal "$BUILD/src/cli/shoal"
    # The shared libraries the binaries need that a CUDA image does not have.
    staging=$(mktemp -d)
    for b in .gpu/bin/* .gpu/build/src/cli/shoal; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
      grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt)\.so' |
      while IFS= read -r lib; do cp -L "$lib" "$staging/"; done
    tar -C "$staging" -czf .gpu/lib.tar.gz . && rm -rf "$staging"
    # The binaries compressed too (about a third of their size): the device tool carries
    # at most 64 MiB. `device` unpacks them where they were.
    tar -C .gpu -czf .gpu/bin.tar.gz bin build && rm -rf .gpu/bin .gpu/build
    # The commit, for the results' header: the device's copy of the tree has no .git.
    git rev-parse --short HEAD >.gpu/commit 2>/dev/null || true
    echo "prepared: $(du -sh .gpu | cut -f1) in .gpu/; on the GPU machine run" \
         "'bench/gpu/run.sh device' with carry [\".gpu\"]"
    ;;
  device)
    if [ -f .gpu/bin.tar.gz ]; then
      tar -C .gpu -xzf .gpu/bin.tar.gz
    fi
    [ -d .gpu/bin ] || { echo "no .gpu/bin: run 'bench/gpu/run.sh prepare' here first, then carry .gpu" >&2; exit 1; }
    out="${OUT:-.gpu/out}"
    mkdir -p "$out"
    # cuBLASLt and cuDNN: the CUDA toolkit's, or those pip's nvidia packages hold (without a
    # cuDNN, convolutions run on im2col and engine_cuda_cudnn_test fails, saying so).
    libs=()
    # (compat: the forward-compatibility driver, where the image's CUDA is newer than the
    # machine's driver; the CUDA 13 runtime in shoal's binaries needs a driver of 580 or later.)
    for d in /usr/local/cuda/compat /usr/local/cuda/lib64 /usr/local/cuda/lib; do
      [ -d "$d" ] && libs+=("$d")
    done
    if command -v python3 >/dev/null; then
      while IFS= read -r d; do libs+=("$d"); done < <(python3 - <<'PY' 2>/dev/null || true
import glob, os
try:
    import nvidia
    for p in nvidia.__path__:
        for lib in ("libcublasLt.so*", "libcudnn.so*"):
            for f in glob.glob(os.path.join(p, "**", lib), recursive=True):
                print(os.path.dirname(f))
except Exception:
    pass
PY
)
    fi
    if [ -f .gpu/lib.tar.gz ]; then
      carried=$(mktemp -d)
      tar -C "$carried" -xzf .gpu/lib.tar.gz
      libs+=("$carried")
    fi
    found=$(IFS=:; echo "${libs[*]:-}")
    # The tests read the committed models from the repository root.
    export SHOAL_SOURCE_DIR="$PWD"
    # The carried libraries (Debian 12's OpenSSL, zlib, libgomp...) go on the library path
    # of shoal's own binaries alone (`run`), not of the image's curl, tar and python3.
    lib_path="${found}${found:+${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}"
    run() { LD_LIBRARY_PATH="$lib_path" "$@"; }
    # One deadline for the whole run (the device tool's limit is 600 s a command, and the
    # machine's start comes out of the same few minutes): every step below runs under
    # `timeout`, at most what is left, and a step that no longer fits is skipped, saying so.
    deadline=$((SECONDS + ${SHOAL_GPU_SECONDS:-560}))
    left() { echo $((deadline - SECONDS)); }
    # limit STEP_SECONDS: the seconds a step may take now, the rest kept for what follows.
    limit() { local l; l=$(left); [ "$1" -lt "$l" ] && l=$1; echo "$l"; }
    # fits SECONDS: whether a step of at least that long still fits (else it is skipped:
    # `timeout 0` would mean no limit at all).
    fits() { [ "$(left)" -ge "$1" ]; }
    {
      commit=$(cat .gpu/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
      echo "# shoal GPU checks, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: not found"
      echo "library path of shoal's binaries: $lib_path"
      cudnn=""
      for d in ${found//:/ }; do
        if [ -z "$cudnn" ] && [ -e "$d/libcudnn.so.9" ]; then cudnn="$d/libcudnn.so.9"; fi
      done
      if [ -z "$cudnn" ] && command -v ldconfig >/dev/null; then
        cudnn=$(ldconfig -p 2>/dev/null | awk '/libcudnn\.so\.9 / {print $NF; exit}')
      fi
      echo "cuDNN: ${cudnn:-not found on the library path (convolutions on im2col)}"
    } | tee "$out/gpu.txt"
    if ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU on this machine" | tee -a "$out/gpu.txt"; exit 1; fi
    rc=0
    # The device tool brings back at most 8 files: every test's output goes into one log,
    # the gtest XML files into one tar (remade after each test, so a run cut short keeps
    # what finished).
    xml=$(mktemp -d)
    : >"$out/tests.log"
    # NAME SECONDS [PART FILTER]: one test binary under a time limit, its outcome in gpu.txt;
    # with PART, only the tests FILTER names, as NAME.PART (its own XML: gtest writes one at
    # the end, so a part that times out or crashes loses only its own results).
    run_test() {
      local t=$1 step log trc=0 label=$1 filter="${TEST_FILTER[$1]:-*}"
      if [ $# -ge 4 ]; then
        label="$1.$3"
        filter=$4
      fi
      echo "## $label" | tee -a "$out/gpu.txt" >>"$out/tests.log"
      # A test that hangs cannot cost the rest.
      step=$(limit "$2")
      if [ "$step" -lt 5 ]; then
        echo "$label: not run, too little of the run's time left" | tee -a "$out/gpu.txt"
        rc=1
        return
      fi
      log=$(mktemp)
      SHOAL_BINARY_DIR="$PWD/.gpu/build" run timeout -k 5 "$step" ".gpu/bin/$t" \
        --gtest_output="xml:$xml/$label.xml" --gtest_filter="$filter" >"$log" 2>&1 || trc=$?
      if [ "$trc" -eq 0 ]; then
        # A skipped test here means the device was not usable: counted as a failure.
        if grep -q "SKIPPED" "$log"; then echo "skipped tests on a GPU machine" >>"$log"; rc=1; fi
      else
        [ "$trc" -eq 124 ] && echo "timed out after $step s" >>"$log"
        # A crash, a missing library or a timeout leaves no XML: say so in gpu.txt.
        echo "$label: exit status $trc" >>"$log"
        rc=1
      fi
      cat "$log" >>"$out/tests.log"
      grep -E '^\[ *(OK|FAILED|SKIPPED) *\]|^device |Failure|skipped tests|timed out|exit status|error while loading' "$log" |
        tee -a "$out/gpu.txt" || true
      rm -f "$log"
      tar -C "$xml" -cf "$out/gtest-xml.tar" . || true
    }
    # First the device itself: where it cannot be used (a driver too old for the CUDA 13
    # runtime, say), nothing after would tell anything, so the run stops there.
    run_test engine_cuda_device_test 60
    if ! grep -q "^device " "$out/gpu.txt"; then
      echo "no usable CUDA device (see tests.log): stopping" | tee -a "$out/gpu.txt"
      echo "exit 1" | tee -a "$out/gpu.txt"
      exit 1
    fi
    # The kernels' tests, quick; the plan's, the backend's and the e2e test, longer, run
    # after the benchmarks (below), so that a slow one cannot cost the figures.
    for t in "${TESTS[@]}"; do
      case "$t" in
        engine_cuda_device_test | engine_cuda_gpu_plan_test | backends_onnx_backend_test | e2e_gpu_test) ;;
        *) run_test "$t" 60 ;;
      esac
    done
    echo "## the device's GEMM peak (gpu_gemm_probe)" | tee -a "$out/gpu.txt"
    if fits 15; then
      run timeout -k 5 "$(limit 60)" .gpu/bin/gpu_gemm_probe --json "$out/gemm_probe.json" 2>&1 |
        tee -a "$out/gpu.txt" || rc=1
    else
      echo "gpu_gemm_probe: not run, too little of the run's time left" | tee -a "$out/gpu.txt"
      rc=1
    fi
    # The engine alone: each model's GPU plans in every tier beside the CPU engine, one
    # JSON per model (each rewritten after every batch size), brought back as one tar that
    # is remade after every model.
    rec=examples/models/recommender/1/model.onnx
    echo "## the engine alone (gpu_plan_bench)" | tee -a "$out/gpu.txt"
    plans=$(mktemp -d)
    plan_bench() {  # NAME SECONDS ARGS... (gpu_plan_bench's arguments, --json added)
      local name=$1 step
      step=$(limit "$2")
      shift 2
      if [ "$step" -lt 20 ]; then
        echo "$name: not run, too little of the run's time left" | tee -a "$out/gpu.txt"
        rc=1
        return
      fi
      run timeout -k 5 "$step" .gpu/bin/gpu_plan_bench "$@" --json "$plans/$name.json" 2>&1 |
        tee -a "$out/gpu.txt" || rc=1
      tar -C "$plans" -cf "$out/plan_bench.tar" . || rc=1
    }
    plan_bench recommender 60 "$rec" --batches 1,8,64,256 --runs 100 --tensor-parallel 2
    plan_bench text_classifier 45 examples/models/text_classifier/1/model.onnx \
      --batches 1,8,64 --runs 100
    plan_bench image_classifier 60 examples/models/image_classifier/1/model.onnx \
      --batches 1,8,64 --runs 100
    # Served: shoal serve with KIND_GPU instances of the recommender, shoal bench at 16
    # requests of 16 rows outstanding over HTTP (batches of up to 64 rows form): two
    # instances (one's copies can run under the other's compute, the weights held once),
    # then one (double buffered: its next batch's copies under its current compute), then
    # one with gpu_pipeline_depth 1 (nothing overlaps), side by side.
    echo "## served (shoal serve, KIND_GPU; shoal bench)" | tee -a "$out/gpu.txt"
    # GET URL, its body on stdout: curl where the image has it, else python3.
    http_get() {
      if command -v curl >/dev/null; then
        curl -sf --max-time 5 "$1"
      else
        python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
      fi
    }
    for variant in 2 1 1:1; do
      if [ "$(left)" -lt 150 ]; then
        echo "served $variant: not run, too little of the run's time left" | tee -a "$out/gpu.txt"
        rc=1
        continue
      fi
      count=${variant%%:*}
      depth=2
      [ "$variant" = 1:1 ] && depth=1
      repo=$(mktemp -d)
      mkdir -p "$repo/rec/1" && cp "$rec" "$repo/rec/1/model.onnx"
      cat >"$repo/rec/config.pbtxt" <<CFG
name: "rec"
platform: "onnxruntime_onnx"
max_batch_size: 64
dynamic_batching { preferred_batch_size: [ 64 ] max_queue_delay_microseconds: 500 }
instance_group [ { count: $count kind: KIND_GPU gpus: [ 0 ] } ]
parameters { key: "gpu_pipeline_depth" value { string_value: "$depth" } }
CFG
      echo "### $count instance(s), gpu_pipeline_depth $depth" | tee -a "$out/gpu.txt"
      # (Not through `run`: $! must be the server itself, which the loop below stops.)
      LD_LIBRARY_PATH="$lib_path" .gpu/build/src/cli/shoal serve --model-repository "$repo" \
        --http-port 18000 --grpc-port 18001 --metrics-port 18002 >>"$out/tests.log" 2>&1 &
      server=$!
      for _ in $(seq 150); do
        http_get http://127.0.0.1:18000/v2/models/rec/ready >/dev/null 2>&1 && break
        sleep 0.2
      done
      json="$out/served.json"
      [ "$variant" = 1 ] && json="$out/served_1_instance.json"
      [ "$variant" = 1:1 ] && json="$out/served_1_instance_depth_1.json"
      run timeout -k 5 "$(limit 60)" .gpu/build/src/cli/shoal bench -m rec -u 127.0.0.1:18000 \
        -b 16 --concurrency-range 16 -p 3000 --max-trials 3 --json "$json" 2>&1 |
        tee -a "$out/gpu.txt" || rc=1
      # The GPU figures the server exported (memory, weights held once, NVML).
      http_get http://127.0.0.1:18002/metrics 2>/dev/null | grep -E '^shoal_gpu_' |
        tee -a "$out/gpu.txt" || true
      # Stopped: asked, then, past 10 s of draining, killed.
      kill "$server" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$server" 2>/dev/null || break; sleep 0.2; done
      kill -9 "$server" 2>/dev/null || true
      wait "$server" 2>/dev/null || true
      rm -rf "$repo"
    done
    # ResNet-50 and BERT-base (sequence 128), after the other benchmarks and each under a
    # time limit so that a slow run cannot cost the results above: their weights filled in here. The CPU engine
    # runs each batch once, for the differences only. Batch 64 first: issue 20's target.
    big=$(mktemp -d)
    for m in resnet50 bert_base; do
      if ! fits 40; then
        echo "$m: not run, too little of the run's time left" | tee -a "$out/gpu.txt"
        rc=1
        continue
      fi
      if run timeout -k 5 "$(limit 60)" .gpu/bin/gpu_model_weights fill \
          "bench/gpu/models/$m.onnx.stripped" "$big/$m.onnx" 2>&1 | tee -a "$out/gpu.txt"; then
        plan_bench "$m" 150 "$big/$m.onnx" --batches 64,8,1 --runs 20 --cpu-runs 0
      else
        rc=1
      fi
      rm -f "$big/$m.onnx"
    done
    rm -rf "$plans" "$big"
    # The longer tests: the GPU plan's (some 55 cuDNN plans, each searching its algorithms),
    # the backend's GPU cases and the e2e test.
    cudnn_plans='GpuPlanTest.ConvolutionsOnCudnn*:GpuPlanTest.DenseNet*'
    reduced='GpuPlanTest.MixedPrecision*:GpuPlanTest.Int8*:GpuPlanTest.TensorParallel*'
    run_test engine_cuda_gpu_plan_test 150 cudnn "$cudnn_plans"
    run_test engine_cuda_gpu_plan_test 90 reduced "$reduced"
    run_test engine_cuda_gpu_plan_test 150 rest "-$cudnn_plans:$reduced"
    run_test backends_onnx_backend_test 120
    run_test e2e_gpu_test 150
    rm -rf "$xml"
    echo "exit $rc" | tee -a "$out/gpu.txt"
    exit "$rc"
    ;;
  *)
    echo "usage: bench/gpu/run.sh prepare | device" >&2
    exit 2
    ;;
esac
