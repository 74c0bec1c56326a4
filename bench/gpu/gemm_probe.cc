// The device's measured matrix-product peak: what cuBLASLt reaches on large square GEMMs
// in fp32, TF32, fp16, bf16 and int8 (int32 sums; its "TFLOP/s" are tera integer
// multiply-adds times 2), timed with CUDA events on this machine in this run. The
// GPU benchmark quotes the engine's throughput as a fraction of these figures rather than
// of a datasheet's, which counts boost clocks and sparsity.
//   gpu_gemm_probe [--size N] [--runs R] [--json FILE]
// Prints one line per precision: TFLOP/s (the median of R timed runs after 3 warm-ups) and
// the spread; exits 1 when there is no device or a GEMM fails.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device.h"
#include "engine/cuda/gemm.h"

namespace {

using shoal::Status;
using namespace shoal::engine::cuda;

struct Result {
  const char* name;
  double median_tflops = 0, min_tflops = 0, max_tflops = 0;
};

// n random floats in [-1, 1), the same on every call (made once).
const std::vector<float>& RandomFloats(int64_t n) {
  static std::vector<float> values;
  if (static_cast<int64_t>(values.size()) != n) {
    values.resize(n);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (float& v : values) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) / (1 << 23);
    }
  }
  return values;
}

// RandomFloats(n) times 127 as int8.
std::vector<int8_t> Int8s(int64_t n) {
  const std::vector<float>& f = RandomFloats(n);
  std::vector<int8_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int8_t>(f[i] * 127.f);
  return out;
}

// RandomFloats(n) as fp16 or bf16 bit patterns; empty for the other types.
std::vector<uint16_t> Encoded(GemmMath math, int64_t n) {
  if (GemmElementBytes(math) != 2) return {};
  const std::vector<float>& f = RandomFloats(n);
  std::vector<uint16_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    if (math == GemmMath::kFp16) {
      out[i] = shoal::FloatToFp16(f[i]);
    } else {
      out[i] = shoal::FloatToBf16(f[i]);
    }
  }
  return out;
}

Status Probe(const LtHandle& handle, GemmMath math, int64_t size, int runs, const Stream& stream,
             Result* result) {
  GemmOptions o;
  o.m = o.n = o.k = size;
  o.math = math;
  o.transpose_w = math == GemmMath::kInt8;  // int8's kernels take W [n, k]
  auto gemm = LtGemm::Create(handle, o);
  if (!gemm.ok()) return gemm.status();
  const size_t bytes = static_cast<size_t>(size * size) * GemmElementBytes(math);
  auto x = DeviceBuffer::Allocate(bytes), w = DeviceBuffer::Allocate(bytes),
       y = DeviceBuffer::Allocate(static_cast<size_t>(size * size) * GemmOutputBytes(o)),
       workspace = DeviceBuffer::Allocate(o.workspace_bytes);
  for (auto* b : {&x, &w, &y, &workspace}) {
    if (!b->ok()) return b->status();
  }
  // Random values in [-1, 1): a matrix of zeros or of one repeated value runs faster than
  // real data (fewer bits toggle, less power), so it would overstate the peak.
  const std::vector<uint16_t> half = Encoded(math, size * size);
  const std::vector<int8_t> int8 =
      math == GemmMath::kInt8 ? Int8s(size * size) : std::vector<int8_t>();
  const void* host = !int8.empty()  ? static_cast<const void*>(int8.data())
                     : half.empty() ? static_cast<const void*>(RandomFloats(size * size).data())
                                    : static_cast<const void*>(half.data());
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(x->data(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(w->data(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
  // A copy from pageable memory may return before it lands; the GEMMs run on another stream.
  RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  cudaEvent_t start, stop;
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "cudaEventCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&stop), "cudaEventCreate"));
  std::vector<double> tflops;
  Status status;
  for (int i = 0; i < runs + 3 && status.ok(); ++i) {
    status = CudaStatus(cudaEventRecord(start, stream.get()), "cudaEventRecord");
    if (status.ok()) {
      status =
          (*gemm)->Run(x->data(), w->data(), nullptr, y->data(), workspace->data(), stream.get());
    }
    if (status.ok()) status = CudaStatus(cudaEventRecord(stop, stream.get()), "cudaEventRecord");
    if (status.ok()) status = CudaStatus(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    if (status.ok()) status = CudaStatus(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (status.ok() && i >= 3) tflops.push_back(2.0 * size * size * size / (ms * 1e-3) / 1e12);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  RETURN_IF_ERROR(status);
  std::sort(tflops.begin(), tflops.end());
  result->median_tflops = tflops[tflops.size() / 2];
  result->min_tflops = tflops.front();
  result->max_tflops = tflops.back();
  return Status();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t size = 8192;
  int runs = 10;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--size" && i + 1 < argc) {
      size = std::atoll(argv[++i]);
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: gpu_gemm_probe [--size N] [--runs R] [--json FILE]\n");
      return 2;
    }
  }
  if (size <= 0 || runs <= 0) {
    std::fprintf(stderr, "--size and --runs must be positive\n");
    return 2;
  }
  auto devices = ListDevices();
  if (!devices.ok()) {
    std::fprintf(stderr, "%s\n", devices.status().ToString().c_str());
    return 1;
  }
  std::printf("device %s\n", Describe(devices->front()).c_str());
  auto handle = LtHandle::Create();
  auto stream = Stream::Create();
  if (!handle.ok() || !stream.ok()) {
    std::fprintf(stderr, "%s %s\n", handle.status().ToString().c_str(),
                 stream.status().ToString().c_str());
    return 1;
  }
  std::vector<Result> results;
  int rc = 0;
  for (const auto& [math, name] :
       {std::pair{GemmMath::kFp32, "fp32"}, std::pair{GemmMath::kTf32, "tf32"},
        std::pair{GemmMath::kFp16, "fp16"}, std::pair{GemmMath::kBf16, "bf16"},
        std::pair{GemmMath::kInt8, "int8"}}) {
    Result r{name};
    const Status s = Probe(**handle, math, size, runs, *stream, &r);
    if (!s.ok()) {
      std::printf("%-5s failed: %s\n", name, s.ToString().c_str());
      rc = 1;
      continue;
    }
    std::printf("%-5s %dx%dx%d: %.1f TFLOP/s (median of %d; %.1f-%.1f)\n", name,
                static_cast<int>(size), static_cast<int>(size), static_cast<int>(size),
                r.median_tflops, runs, r.min_tflops, r.max_tflops);
    results.push_back(r);
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::perror(json.c_str());
      return 1;
    }
    std::string name;  // JSON-escaped
    for (const char c : devices->front().name) {
      if (c == '"' || c == '\\') name += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) name += c;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"size\": %lld, \"runs\": %d, \"tflops\": {",
                 name.c_str(), static_cast<long long>(size), runs);
    for (size_t i = 0; i < results.size(); ++i) {
      std::fprintf(f, "%s\"%s\": {\"median\": %.2f, \"min\": %.2f, \"max\": %.2f}", i ? ", " : "",
                   results[i].name, results[i].median_tflops, results[i].min_tflops,
                   results[i].max_tflops);
    }
    std::fprintf(f, "}}\n");
    std::fclose(f);
  }
  return rc;
}
