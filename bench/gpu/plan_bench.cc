// The engine alone on the GPU beside the CPU engine, on one model at several batch sizes:
// what one batch costs through a GPU plan (engine/cuda/gpu_plan.h) in each tier (fp32,
// TF32, and the mixed-precision fp16 and bf16) as a CUDA graph, and in fp32 launched step
// by step, with its input and output copies, as a GPU instance runs it; the CPU engine's
// Session on the same inputs; the largest difference between each tier's outputs and the
// CPU's; and the plan's GEMM arithmetic (2·m·n·k summed over its products, convolutions
// included) as TFLOP/s, to set against the device's GEMM peak (gemm_probe).
//   gpu_plan_bench MODEL.onnx [--batches 1,8,64] [--runs R] [--cpu-runs R] [--json FILE]
//                  [--tensor-parallel N] [--lower-only]
// --cpu-runs: timed CPU runs (default R; 0 runs the CPU once, for the differences only).
// Each batch's fp32 run as a CUDA graph is also split by CUDA events into its input copies,
// compute and output copies (copyin_ms, steps_ms, copyout_ms), and the plan is timed over R
// batches back to back, synchronously (seq_ms, each batch's copies and compute in turn) and
// double buffered with two batches in flight (pipe_ms: launch, launch, then finish the oldest
// and launch the next). copy_hidden = (seq_ms - pipe_ms) / (copyin_ms + copyout_ms), clamped
// to [0, 1]: the share of a batch's copies that the other batch's compute hides (issue 20's
// target: 0.8 or more).
// A model with convolutions, where cuDNN loads (engine/cuda/cudnn.h): fp32, tf32, fp16 and
// bf16 again with the convolutions on cuDNN (the *_cudnn columns; the others use im2col and
// a cuBLASLt GEMM), each with its difference from the CPU; cuDNN's algorithms measured when
// the plan is made (the default), and in fp16_cudnn_heuristic its heuristics' first; the
// 16-bit values between convolutions channels last (the default), and in fp16_cudnn_nchw
// NCHW. At the last batch size, the algorithm each convolution of the cuDNN variants chose
// goes to stderr.
// int8: the products int8 takes as int8 GEMMs (engine/cuda/quantize.h), the rest fp32, its
// ranges calibrated on the smallest batch size's inputs; which products stayed fp32 goes to
// stderr.
// --tensor-parallel N: one more variant, fp16_tpN: fp16 as a CUDA graph with the products of
// 1024 columns or more split into N shards on streams of this one GPU (the split's cost
// where nothing is gained from more devices; docs/gpu.md, "Tensor parallelism").
// --lower-only: needs no device; says whether the model lowers onto the GPU path at the
// first batch size (steps, weight and arena bytes, GEMM arithmetic; in fp16 on cuDNN, the
// convolutions that run channels last and the kToHalf steps left; in int8, the products it
// takes and why not the others) and what the CPU engine's
// outputs look like (largest value, any not finite), or lists every node it lacks.
// Inputs: random fp32 in [-1, 1) (1 for integer inputs), the first dimension the batch,
// other symbolic dimensions 1. Each figure is the median of R timed runs after 3 warm-ups.
// Exits 1 when there is no device, or the model does not load or lower, or a variant fails
// (said on stderr; the other variants are still measured, its figures null in the JSON).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/cudnn.h"
#include "engine/cuda/device.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/gpu_plan.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/precision.h"

namespace {

using namespace shoal;
using namespace shoal::engine;

// The GPU variants timed, in column order: each tier as a CUDA graph, fp32 step by step,
// then (--tensor-parallel) fp16 split across shards. Every variant but the steps reports its
// difference from the CPU (the steps compute what fp32's graph does).
struct Variant {
  std::string name;
  cuda::GemmMath math;
  bool cuda_graph;
  int shards = 1;
  bool diff = true;
  cuda::ConvEngine conv = cuda::ConvEngine::kIm2Col;
  cuda::CudnnAlgorithmSearch search = cuda::CudnnAlgorithmSearch::kMeasured;
  bool channels_last = true;
  bool int8 = false;  // GpuPlanOptions::int8_calibration, from the smallest batch's inputs
};
constexpr size_t kFp16 = 2;  // the variant the TFLOP/s column reads

struct Row {
  int64_t batch = 0;
  double cpu_ms = 0;  // 0: not timed (--cpu-runs 0)
  double gemm_flops = 0;
  std::vector<double> ms;
  std::vector<float> diff;
  // fp32 as a CUDA graph, split by CUDA events: input copies, compute, output copies
  // (medians).
  double copy_in_ms = 0, compute_ms = 0, copy_out_ms = 0;
  // fp32 as a CUDA graph, R batches back to back: ms per batch, synchronously and with two
  // in flight (medians of three), and the share of the copies hidden.
  double sequential_ms = 0, pipelined_ms = 0, copy_hidden = 0;
};

// 2·m·n·k over every product of a lowered plan.
double GemmFlops(const cuda::GpuLowering& l) {
  double flops = 0;
  for (const cuda::GpuStep& s : l.steps) {
    if (s.kind != cuda::GpuStep::Kind::kGemm) continue;
    flops += 2.0 * static_cast<double>(s.gemm.m) * static_cast<double>(s.gemm.n) *
             static_cast<double>(s.gemm.k) * static_cast<double>(s.gemm.batch);
  }
  return flops;
}

template <typename Fn>
double MedianMs(int runs, Fn&& fn) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// `n` batches back to back through `plan`, in ms per batch: synchronous Runs into
// `*sequential_ms`, and pipelined (launch, launch, then finish the oldest and launch the next,
// so that one batch's copies overlap the other's compute) into `*pipelined_ms`.
Status TimePipeline(cuda::GpuPlan& plan, const std::vector<const Tensor*>& inputs,
                    const cuda::Stream& stream, int n, double* sequential_ms,
                    double* pipelined_ms) {
  std::vector<Tensor> out;
  auto since = [n](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
               .count() /
           n;
  };
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) RETURN_IF_ERROR(plan.Run(inputs, stream, &out));
  *sequential_ms = since(t0);
  t0 = std::chrono::steady_clock::now();
  std::deque<int> in_flight;  // slots, oldest first
  for (int i = 0; i < n; ++i) {
    if (in_flight.size() == static_cast<size_t>(cuda::GpuPlan::kSlots)) {
      RETURN_IF_ERROR(plan.Finish(in_flight.front(), &out));
      in_flight.pop_front();
    }
    ASSIGN_OR_RETURN(const int slot, plan.Launch(inputs, stream));
    in_flight.push_back(slot);
  }
  for (; !in_flight.empty(); in_flight.pop_front())
    RETURN_IF_ERROR(plan.Finish(in_flight.front(), &out));
  *pipelined_ms = since(t0);
  return Status::Ok();
}

// The largest difference between a GPU run's fp32 outputs and the CPU's; +inf when one
// is not finite (so a NaN cannot hide behind std::max).
float MaxDiff(const std::vector<Tensor>& a, const std::vector<NamedTensor>& b) {
  float d = 0;
  for (size_t o = 0; o < a.size() && o < b.size(); ++o) {
    if (a[o].dtype() != DataType::kFp32) continue;
    auto x = a[o].values<float>();
    auto y = b[o].tensor.values<float>();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      const float diff = std::fabs(x[i] - y[i]);
      if (!(diff <= d)) d = std::isnan(diff) ? INFINITY : diff;
    }
  }
  return d;
}

// A JSON number (%.3g), or null where it is not finite.
std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

// The inputs of one batch (MadeUpInputs: fp32 uniform in [-1, 1), integer inputs 1); the
// first dimension `batch`, other symbolic dimensions 1.
std::vector<NamedTensor> Inputs(const Model& model, int64_t batch, std::vector<Shape>* shapes) {
  for (const TensorInfo& t : model.inputs()) {
    Shape shape;
    for (size_t d = 0; d < t.shape.size(); ++d)
      shape.push_back(t.shape[d].known() ? t.shape[d].value : (d == 0 ? batch : 1));
    shapes->push_back(shape);
  }
  return MadeUpInputs(model, *shapes);
}

int Fail(const Status& s, const char* what) {
  std::fprintf(stderr, "gpu_plan_bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: gpu_plan_bench MODEL.onnx [--batches 1,8,64] [--runs R] [--cpu-runs R] "
                 "[--json FILE] [--tensor-parallel N] [--lower-only]\n");
    return 2;
  }
  const std::string path = argv[1];
  std::vector<int64_t> batches = {1, 8, 64};
  int runs = 50, cpu_runs = -1, tensor_parallel = 1;
  const char* json = nullptr;
  bool lower_only = false;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--lower-only")) lower_only = true;
  }
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--lower-only")) {
      --i;
      continue;
    }
    if (!std::strcmp(argv[i], "--runs")) {
      runs = std::max(1, std::atoi(argv[i + 1]));
    } else if (!std::strcmp(argv[i], "--cpu-runs")) {
      cpu_runs = std::max(0, std::atoi(argv[i + 1]));
    } else if (!std::strcmp(argv[i], "--tensor-parallel")) {
      tensor_parallel = std::max(1, std::atoi(argv[i + 1]));
    } else if (!std::strcmp(argv[i], "--json")) {
      json = argv[i + 1];
    } else if (!std::strcmp(argv[i], "--batches")) {
      batches.clear();
      for (const char* p = argv[i + 1]; *p;) {
        batches.push_back(std::atoll(p));
        p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : p + std::strlen(p);
      }
    }
  }
  auto model = Model::Load(path);
  if (!model.ok()) return Fail(model.status(), "load");
  if (lower_only) {
    // What the GPU path makes of the model at the first batch size, without a device.
    dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
    dnnl::stream cpu_stream(cpu);
    std::vector<Shape> shapes;
    const std::vector<NamedTensor> named = Inputs(**model, batches[0], &shapes);
    auto plan = Plan::Prepare((*model)->graph(), shapes, cpu, cpu_stream, (*model)->weight_cache(),
                              cuda::GpuLoweringPlanOptions(), PlanLimits());
    if (!plan.ok()) return Fail(plan.status(), "CPU plan");
    auto lowered = cuda::LowerPlan((*model)->graph(), **plan);
    if (!lowered.ok()) return Fail(lowered.status(), "lowering");
    std::printf(
        "%s lowers to %zu GPU steps; weights %lld bytes, arena %lld bytes; %.3g GEMM GFLOP per "
        "batch of %lld\n",
        path.c_str(), lowered->steps.size(), static_cast<long long>(lowered->weight_bytes),
        static_cast<long long>(lowered->arena_bytes), GemmFlops(*lowered) / 1e9,
        static_cast<long long>(batches[0]));
    if (tensor_parallel > 1) {
      cuda::GpuPlanOptions options;
      options.tensor_parallel.shards = tensor_parallel;
      auto split = cuda::LowerPlan((*model)->graph(), **plan, options);
      if (!split.ok()) return Fail(split.status(), "lowering with tensor parallelism");
      std::printf(
          "with --tensor-parallel %d: %d products split (1024 columns or more), %zu steps\n",
          tensor_parallel, split->split_products, split->steps.size());
    }
    {
      // In fp16 on cuDNN (no cuDNN needed to lower): how many convolutions run channels last,
      // and how many values a kToHalf pass of its own still rounds.
      cuda::GpuPlanOptions options;
      options.math = cuda::GemmMath::kFp16;
      options.conv = cuda::ConvEngine::kCudnn;
      auto mixed = cuda::LowerPlan((*model)->graph(), **plan, options);
      if (!mixed.ok()) return Fail(mixed.status(), "lowering in fp16 on cuDNN");
      int convs = 0, channels_last = 0, roundings = 0;
      std::string rounded;  // the nodes whose input a kToHalf step rounds
      for (const cuda::GpuStep& step : mixed->steps) {
        convs += step.kind == cuda::GpuStep::Kind::kConv;
        channels_last += step.kind == cuda::GpuStep::Kind::kConv && step.conv.channels_last;
        if (step.kind != cuda::GpuStep::Kind::kToHalf) continue;
        ++roundings;
        rounded += (rounded.empty() ? "" : ", ") + (*model)->graph().Describe(step.node);
      }
      std::printf(
          "in fp16 on cuDNN: %zu steps; %d convolutions on cuDNN, %d of them channels last; %d "
          "kToHalf steps%s%s\n",
          mixed->steps.size(), convs, channels_last, roundings, rounded.empty() ? "" : ", for ",
          rounded.c_str());
    }
    {
      // In int8, calibrated on these inputs: which products int8 takes, and why not the rest.
      auto calibrated = Calibrate(**model, {named});
      if (!calibrated.ok()) return Fail(calibrated.status(), "int8 calibration");
      cuda::GpuPlanOptions options;
      options.int8_calibration = std::make_shared<const Calibration>(std::move(calibrated).value());
      auto int8 = cuda::LowerPlan((*model)->graph(), **plan, options);
      if (!int8.ok()) return Fail(int8.status(), "lowering in int8");
      // Values written in int8 by the step that computes them (an int8 GpuStep::half_out), and of
      // those, how many in int8 alone.
      int kept = 0, alone = 0;
      for (const cuda::GpuStep& s : int8->steps) {
        const bool copy = s.half_out >= 0 && int8->dtypes[s.half_out] == DataType::kInt8;
        kept += copy;
        alone += copy && s.out < 0;
      }
      std::printf(
          "in int8: %zu steps, arena %lld bytes; %s; %d values written in int8 by the step "
          "computing them (%d in int8 alone)%s\n",
          int8->steps.size(), static_cast<long long>(int8->arena_bytes),
          cuda::Int8Summary(*int8).c_str(), kept, alone,
          int8->fp32_products.empty() ? "" : "; kept fp32:");
      for (const std::string& why : int8->fp32_products) std::printf("  %s\n", why.c_str());
    }
    // The CPU engine's outputs on these inputs: a model whose weights were filled
    // (gpu_model_weights) should give finite values of a sane size.
    auto session = Session::Create(**model);
    if (!session.ok()) return Fail(session.status(), "session");
    std::vector<NamedTensor> out;
    const Status ran = (*session)->Run(named, &out);
    if (!ran.ok()) return Fail(ran, "CPU run");
    for (const NamedTensor& o : out) {
      if (o.tensor.dtype() != DataType::kFp32) continue;
      float largest = 0;
      int64_t non_finite = 0;
      for (float v : o.tensor.values<float>()) {
        if (!std::isfinite(v))
          ++non_finite;
        else
          largest = std::max(largest, std::fabs(v));
      }
      std::printf("CPU output %s %s: max |value| %.4g, %lld not finite\n", o.name.c_str(),
                  ShapeToString(o.tensor.shape()).c_str(), largest,
                  static_cast<long long>(non_finite));
    }
    return 0;
  }
  if (cpu_runs < 0) cpu_runs = runs;
  auto devices = cuda::ListDevices();
  if (!devices.ok()) return Fail(devices.status(), "no device");
  auto handle = cuda::LtHandle::Create();
  if (!handle.ok()) return Fail(handle.status(), "cuBLASLt");
  auto stream = cuda::Stream::Create();
  if (!stream.ok()) return Fail(stream.status(), "stream");
  auto session = Session::Create(**model);
  if (!session.ok()) return Fail(session.status(), "session");
  dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  dnnl::stream cpu_stream(cpu);
  const Graph& graph = (*model)->graph();

  std::printf("model %s on %s; CPU engine with %d threads; median of %d runs (CPU: %d)\n",
              path.c_str(), cuda::Describe((*devices)[0]).c_str(), (*session)->threads(), runs,
              cpu_runs);
  std::vector<Variant> variants = {{"fp32", cuda::GemmMath::kFp32, true},
                                   {"tf32", cuda::GemmMath::kTf32, true},
                                   {"fp16", cuda::GemmMath::kFp16, true},
                                   {"bf16", cuda::GemmMath::kBf16, true},
                                   {"fp32_steps", cuda::GemmMath::kFp32, false, 1, false}};
  // int8 as an instance runs it: the products int8 takes, the rest fp32 (on cuDNN where it
  // loads), calibrated on the smallest batch size's inputs.
  {
    Variant int8{"int8", cuda::GemmMath::kFp32, true};
    int8.int8 = true;
    if (cuda::Cudnn::Get().ok()) int8.conv = cuda::ConvEngine::kCudnn;
    variants.push_back(int8);
  }
  std::shared_ptr<const Calibration> ranges;
  {
    std::vector<Shape> shapes;
    const int64_t smallest = *std::min_element(batches.begin(), batches.end());
    auto calibrated = Calibrate(**model, {Inputs(**model, smallest, &shapes)});
    if (!calibrated.ok()) return Fail(calibrated.status(), "int8 calibration");
    ranges = std::make_shared<const Calibration>(std::move(calibrated).value());
  }
  if (tensor_parallel > 1) {
    variants.push_back({"fp16_tp" + std::to_string(tensor_parallel), cuda::GemmMath::kFp16, true,
                        tensor_parallel});
  }
  // A model with convolutions: each tier again with them on cuDNN, where it loads.
  bool has_conv = false;
  for (const Node& node : graph.nodes)
    has_conv |= node.op_type == "Conv" || node.op_type == "FusedConv";
  if (auto cudnn = cuda::Cudnn::Get(); has_conv && cudnn.ok()) {
    std::printf("convolutions on im2col and, in the *_cudnn columns, on cuDNN %s\n",
                (*cudnn)->version().c_str());
    for (size_t k = 0; k < 4; ++k) {
      Variant v = variants[k];
      v.name += "_cudnn";
      v.conv = cuda::ConvEngine::kCudnn;
      variants.push_back(v);
    }
    // fp16 on cuDNN once more with the algorithms its heuristics rank first, not measured.
    Variant heuristic = variants[kFp16];
    heuristic.name += "_cudnn_heuristic";
    heuristic.conv = cuda::ConvEngine::kCudnn;
    heuristic.search = cuda::CudnnAlgorithmSearch::kHeuristic;
    variants.push_back(heuristic);
    // And with its 16-bit values NCHW, not channels last.
    Variant nchw = variants[kFp16];
    nchw.name += "_cudnn_nchw";
    nchw.conv = cuda::ConvEngine::kCudnn;
    nchw.channels_last = false;
    variants.push_back(nchw);
  } else if (has_conv) {
    std::printf("convolutions on im2col only: %s\n", cudnn.status().ToString().c_str());
  }
  std::printf("%6s %10s", "batch", "cpu_ms");
  for (const Variant& v : variants) std::printf(" %10s", (v.name + "_ms").c_str());
  std::printf(" %9s %9s %9s %9s %9s %9s %9s %11s", "gemm_GF", "fp16_TF/s", "copyin_ms", "steps_ms",
              "copyout_ms", "seq_ms", "pipe_ms", "copy_hidden");
  for (const Variant& v : variants)
    if (v.diff) std::printf(" %10s", (v.name + "_diff").c_str());
  std::printf("\n");
  std::vector<Row> rows;
  // The rows so far into --json's file, rewritten after every batch size, so that a run cut
  // short (bench/gpu/run.sh's time limits) keeps the batches it finished.
  auto write_json = [&]() -> bool {
    if (!json) return true;
    // Written beside, then renamed over the last: a run killed while writing leaves the
    // last whole file.
    const std::string partial = std::string(json) + ".partial";
    FILE* f = std::fopen(partial.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "gpu_plan_bench: cannot write %s\n", json);
      return false;
    }
    std::fprintf(f, "{\"model\": \"%s\", \"runs\": %d, \"cpu_runs\": %d, \"rows\": [", path.c_str(),
                 runs, cpu_runs);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(
          f,
          "%s{\"batch\": %lld, \"cpu_ms\": %.5f, \"gemm_flops\": %.6g, "
          "\"fp32_copy_in_ms\": %.5f, \"fp32_steps_ms\": %.5f, \"fp32_copy_out_ms\": %.5f, "
          "\"fp32_sequential_ms\": %.5f, \"fp32_pipelined_ms\": %.5f, "
          "\"copy_hidden\": %.4f",
          i ? ", " : "", static_cast<long long>(r.batch), r.cpu_ms, r.gemm_flops, r.copy_in_ms,
          r.compute_ms, r.copy_out_ms, r.sequential_ms, r.pipelined_ms, r.copy_hidden);
      for (size_t k = 0; k < variants.size(); ++k) {
        // (null for a variant that failed)
        if (std::isfinite(r.ms[k])) {
          std::fprintf(f, ", \"gpu_%s_ms\": %.5f", variants[k].name.c_str(), r.ms[k]);
        } else {
          std::fprintf(f, ", \"gpu_%s_ms\": null", variants[k].name.c_str());
        }
        if (variants[k].diff)
          std::fprintf(f, ", \"%s_max_abs_diff\": %s", variants[k].name.c_str(),
                       JsonNumber(r.diff[k]).c_str());
      }
      std::fprintf(f, "}");
    }
    std::fprintf(f, "]}\n");
    if (std::fclose(f) != 0 || std::rename(partial.c_str(), json) != 0) {
      std::fprintf(stderr, "gpu_plan_bench: cannot write %s\n", json);
      return false;
    }
    return true;
  };
  bool any_failed = false;
  for (int64_t batch : batches) {
    std::vector<Shape> shapes;
    std::vector<NamedTensor> named = Inputs(**model, batch, &shapes);
    std::vector<const Tensor*> inputs;
    for (const NamedTensor& t : named) inputs.push_back(&t.tensor);
    Row row;
    row.batch = batch;
    row.ms.resize(variants.size());
    row.diff.resize(variants.size());
    std::vector<NamedTensor> cpu_out;
    Status failed = (*session)->Run(named, &cpu_out);
    if (!failed.ok()) return Fail(failed, "CPU run");
    if (cpu_runs > 0) {
      row.cpu_ms = MedianMs(cpu_runs, [&] {
        cpu_out.clear();
        Status s = (*session)->Run(named, &cpu_out);
        if (!s.ok()) failed = s;
      });
      if (!failed.ok()) return Fail(failed, "CPU run");
    }
    auto plan = Plan::Prepare(graph, shapes, cpu, cpu_stream, (*model)->weight_cache(),
                              cuda::GpuLoweringPlanOptions(), PlanLimits());
    if (!plan.ok()) return Fail(plan.status(), "CPU plan");
    // One variant at this batch size: its figures into `row`, or the error that stopped it.
    auto measure = [&](size_t k) -> Status {
      cuda::GpuPlanOptions options;
      options.math = variants[k].math;
      options.cuda_graph = variants[k].cuda_graph;
      options.tensor_parallel.shards = variants[k].shards;
      options.conv = variants[k].conv;
      options.conv_search = variants[k].search;
      options.channels_last = variants[k].channels_last;
      if (variants[k].int8) options.int8_calibration = ranges;
      auto lowered = cuda::LowerPlan(graph, **plan, options);
      if (!lowered.ok()) return lowered.status().WithPrefix("lowering");
      if (variants[k].int8 && batch == batches.front()) {
        std::fprintf(stderr, "int8: %s\n", cuda::Int8Summary(*lowered).c_str());
        for (const std::string& why : lowered->fp32_products)
          std::fprintf(stderr, "int8: kept fp32: %s\n", why.c_str());
      }
      if (row.gemm_flops == 0) row.gemm_flops = GemmFlops(*lowered);
      auto gpu = cuda::GpuPlan::Create(std::move(lowered).value(), **handle, *stream);
      if (!gpu.ok()) return gpu.status().WithPrefix("GPU plan");
      if (variants[k].conv == cuda::ConvEngine::kCudnn && batch == batches.back()) {
        // The algorithms each search chose, at the largest batch (stderr: stdout is the table).
        for (const std::string& line : (*gpu)->DescribeConvs())
          std::fprintf(stderr, "%s, batch %lld: %s\n", variants[k].name.c_str(),
                       static_cast<long long>(batch), line.c_str());
      }
      std::vector<Tensor> out;
      Status failed;
      row.ms[k] = MedianMs(runs, [&] {
        Status s = (*gpu)->Run(inputs, *stream, &out);
        if (!s.ok()) failed = s;
      });
      if (!failed.ok()) return failed.WithPrefix("GPU run");
      row.diff[k] = MaxDiff(out, cpu_out);
      if (k == 0) {
        // Where the device time goes, and how much of the copies two batches in flight hide.
        std::vector<double> in, mid, back;
        for (int r = 0; r < std::max(3, runs / 4); ++r) {
          auto phases = (*gpu)->RunTimingPhases(inputs, *stream, &out);
          if (!phases.ok()) return phases.status().WithPrefix("GPU run, timing its phases");
          in.push_back(phases->copy_in);
          mid.push_back(phases->compute);
          back.push_back(phases->copy_out);
        }
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        row.copy_in_ms = median(in);
        row.compute_ms = median(mid);
        row.copy_out_ms = median(back);
        std::vector<double> sequential(3), pipelined(3);
        double warm = 0;  // both slots' graphs captured
        failed = TimePipeline(**gpu, inputs, *stream, 4, &warm, &warm);
        for (size_t r = 0; failed.ok() && r < sequential.size(); ++r)
          failed = TimePipeline(**gpu, inputs, *stream, runs, &sequential[r], &pipelined[r]);
        if (!failed.ok()) return failed.WithPrefix("GPU runs, pipelined");
        row.sequential_ms = median(sequential);
        row.pipelined_ms = median(pipelined);
        const double copies = row.copy_in_ms + row.copy_out_ms;
        row.copy_hidden =
            copies > 0 ? std::clamp((row.sequential_ms - row.pipelined_ms) / copies, 0.0, 1.0) : 0;
      }
      return Status::Ok();
    };
    for (size_t k = 0; k < variants.size(); ++k) {
      const Status measured = measure(k);
      if (measured.ok()) continue;
      // Said, and the rest measured: one variant that fails (int8, say, where cuBLASLt has no
      // kernel) must not cost the others' figures. Its time and difference are left out.
      std::fprintf(stderr, "gpu_plan_bench: %s at batch %lld failed: %s\n",
                   variants[k].name.c_str(), static_cast<long long>(batch),
                   measured.ToString().c_str());
      row.ms[k] = row.diff[k] = std::nanf("");
      any_failed = true;
    }
    std::printf("%6lld %10.4f", static_cast<long long>(batch), row.cpu_ms);
    for (size_t k = 0; k < variants.size(); ++k) std::printf(" %10.4f", row.ms[k]);
    std::printf(" %9.3f %9.2f %9.4f %9.4f %9.4f %9.4f %9.4f %11.2f", row.gemm_flops / 1e9,
                row.gemm_flops / (row.ms[kFp16] * 1e9), row.copy_in_ms, row.compute_ms,
                row.copy_out_ms, row.sequential_ms, row.pipelined_ms, row.copy_hidden);
    for (size_t k = 0; k < variants.size(); ++k)
      if (variants[k].diff) std::printf(" %10.2e", row.diff[k]);
    std::printf("\n");
    rows.push_back(row);
    if (!write_json()) return 1;
  }
  return any_failed ? 1 : 0;
}
