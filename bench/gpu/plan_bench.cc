// The engine alone on the GPU beside the CPU engine, on one model at several batch sizes:
// what one batch costs through a GPU plan (engine/cuda/gpu_plan.h), in fp32 and TF32 as a
// CUDA graph and in fp32 launched step by step, with its input and output copies, as a
// GPU instance runs it; the CPU engine's Session on the
// same inputs; and the largest difference between the two outputs.
//   gpu_plan_bench MODEL.onnx [--batches 1,8,64] [--runs R] [--json FILE] [--lower-only]
// --lower-only: needs no device; says whether the model lowers onto the GPU path at the
// first batch size (steps, weight and arena bytes), or lists every node it lacks.
// Inputs: random fp32 in [-1, 1) (zeros for integer inputs), the first dimension the batch,
// other symbolic dimensions 1. Each figure is the median of R timed runs after 3 warm-ups.
// Exits 1 when there is no device, or the model does not load or lower.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/device.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/gpu_plan.h"
#include "engine/model.h"
#include "engine/plan.h"

namespace {

using namespace shoal;
using namespace shoal::engine;

struct Row {
  int64_t batch = 0;
  double cpu_ms = 0, fp32_ms = 0, tf32_ms = 0, steps_ms = 0;  // steps: fp32, no CUDA graph
  float fp32_diff = 0, tf32_diff = 0;
};

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

float MaxDiff(const std::vector<Tensor>& a, const std::vector<NamedTensor>& b) {
  float d = 0;
  for (size_t o = 0; o < a.size() && o < b.size(); ++o) {
    if (a[o].dtype() != DataType::kFp32) continue;
    auto x = a[o].values<float>();
    auto y = b[o].tensor.values<float>();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) d = std::max(d, std::fabs(x[i] - y[i]));
  }
  return d;
}

int Fail(const Status& s, const char* what) {
  std::fprintf(stderr, "gpu_plan_bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: gpu_plan_bench MODEL.onnx [--batches 1,8,64] [--runs R] [--json FILE] "
                 "[--lower-only]\n");
    return 2;
  }
  const std::string path = argv[1];
  std::vector<int64_t> batches = {1, 8, 64};
  int runs = 50;
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
    for (const TensorInfo& t : (*model)->inputs()) {
      Shape shape;
      for (size_t d = 0; d < t.shape.size(); ++d)
        shape.push_back(t.shape[d].known() ? t.shape[d].value : (d == 0 ? batches[0] : 1));
      shapes.push_back(shape);
    }
    auto plan = Plan::Prepare((*model)->graph(), shapes, cpu, cpu_stream, (*model)->weight_cache(),
                              cuda::GpuLoweringPlanOptions(), PlanLimits());
    if (!plan.ok()) return Fail(plan.status(), "CPU plan");
    auto lowered = cuda::LowerPlan((*model)->graph(), **plan);
    if (!lowered.ok()) return Fail(lowered.status(), "lowering");
    std::printf("%s lowers to %zu GPU steps; weights %lld bytes, arena %lld bytes\n", path.c_str(),
                lowered->steps.size(), static_cast<long long>(lowered->weight_bytes),
                static_cast<long long>(lowered->arena_bytes));
    return 0;
  }
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

  std::printf("model %s on %s; CPU engine with %d threads; median of %d runs\n", path.c_str(),
              cuda::Describe((*devices)[0]).c_str(), (*session)->threads(), runs);
  std::printf("%6s %10s %10s %10s %11s %12s %12s %12s %11s %11s\n", "batch", "cpu_ms", "gpu_fp32",
              "gpu_tf32", "fp32_steps", "cpu_rows/s", "fp32_rows/s", "tf32_rows/s", "fp32_diff",
              "tf32_diff");
  std::vector<Row> rows;
  for (int64_t batch : batches) {
    std::vector<NamedTensor> named;
    std::vector<Shape> shapes;
    for (const TensorInfo& t : (*model)->inputs()) {
      Shape shape;
      for (size_t d = 0; d < t.shape.size(); ++d)
        shape.push_back(t.shape[d].known() ? t.shape[d].value : (d == 0 ? batch : 1));
      Tensor data = Tensor::Allocate(t.dtype, shape);
      if (t.dtype == DataType::kFp32) {
        uint32_t state = 12345;
        for (float& v : data.mutable_values<float>()) {
          state = state * 1664525u + 1013904223u;
          v = static_cast<float>(state >> 8) / static_cast<float>(1 << 23) - 1.f;
        }
      }
      shapes.push_back(shape);
      named.push_back({t.name, std::move(data)});
    }
    std::vector<const Tensor*> inputs;
    for (const NamedTensor& t : named) inputs.push_back(&t.tensor);
    Row row;
    row.batch = batch;
    std::vector<NamedTensor> cpu_out;
    Status failed;
    row.cpu_ms = MedianMs(runs, [&] {
      cpu_out.clear();
      Status s = (*session)->Run(named, &cpu_out);
      if (!s.ok()) failed = s;
    });
    if (!failed.ok()) return Fail(failed, "CPU run");
    auto plan = Plan::Prepare(graph, shapes, cpu, cpu_stream, (*model)->weight_cache(),
                              cuda::GpuLoweringPlanOptions(), PlanLimits());
    if (!plan.ok()) return Fail(plan.status(), "CPU plan");
    // fp32 and TF32 as CUDA graphs (the default), and fp32 launched step by step.
    for (int variant = 0; variant < 3; ++variant) {
      const cuda::GemmMath math = variant == 1 ? cuda::GemmMath::kTf32 : cuda::GemmMath::kFp32;
      cuda::GpuPlanOptions options;
      options.math = math;
      options.cuda_graph = variant != 2;
      auto lowered = cuda::LowerPlan(graph, **plan, options);
      if (!lowered.ok()) return Fail(lowered.status(), "lowering");
      auto gpu = cuda::GpuPlan::Create(std::move(lowered).value(), **handle, *stream);
      if (!gpu.ok()) return Fail(gpu.status(), "GPU plan");
      std::vector<Tensor> out;
      const double ms = MedianMs(runs, [&] {
        Status s = (*gpu)->Run(inputs, *stream, &out);
        if (!s.ok()) failed = s;
      });
      if (!failed.ok()) return Fail(failed, "GPU run");
      const float diff = MaxDiff(out, cpu_out);
      if (variant == 0) {
        row.fp32_ms = ms;
        row.fp32_diff = diff;
      } else if (variant == 1) {
        row.tf32_ms = ms;
        row.tf32_diff = diff;
      } else {
        row.steps_ms = ms;
      }
    }
    auto rate = [&](double ms) { return ms > 0 ? static_cast<double>(batch) * 1000.0 / ms : 0; };
    std::printf("%6lld %10.4f %10.4f %10.4f %11.4f %12.0f %12.0f %12.0f %11.2e %11.2e\n",
                static_cast<long long>(batch), row.cpu_ms, row.fp32_ms, row.tf32_ms, row.steps_ms,
                rate(row.cpu_ms), rate(row.fp32_ms), rate(row.tf32_ms), row.fp32_diff,
                row.tf32_diff);
    rows.push_back(row);
  }
  if (json) {
    FILE* f = std::fopen(json, "w");
    if (!f) {
      std::fprintf(stderr, "gpu_plan_bench: cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "{\"model\": \"%s\", \"runs\": %d, \"rows\": [", path.c_str(), runs);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "%s{\"batch\": %lld, \"cpu_ms\": %.5f, \"gpu_fp32_ms\": %.5f, "
                   "\"gpu_tf32_ms\": %.5f, \"gpu_fp32_steps_ms\": %.5f, "
                   "\"fp32_max_abs_diff\": %.3g, \"tf32_max_abs_diff\": %.3g}",
                   i ? ", " : "", static_cast<long long>(r.batch), r.cpu_ms, r.fp32_ms, r.tf32_ms,
                   r.steps_ms, r.fp32_diff, r.tf32_diff);
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
