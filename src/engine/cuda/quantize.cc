#include "engine/cuda/quantize.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/cuda/cuda_status.h"
#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda {

float SymmetricScale(float min, float max) {
  const float range = std::max(std::fabs(min), std::fabs(max));
  if (!std::isfinite(range) || !(range > 0.f)) return 0.f;
  const float scale = range / 127.f;
  return scale > 0.f && std::isfinite(1.f / scale) ? scale : 0.f;
}

int8_t QuantizeValue(float v, float inv_scale) {
  // fmax first: a NaN becomes -127, as the kernel's fmaxf makes it.
  const float clamped = std::fmin(std::fmax(v * inv_scale, -127.f), 127.f);
  return static_cast<int8_t>(std::nearbyint(clamped));  // half to even, the default mode
}

QuantizedWeight QuantizeWeightColumns(const Tensor& w, bool transposed) {
  // [k, n], or [n, ...]: a convolution's [m, c, kh, kw] weight is [n, k] for its GEMM.
  const int64_t n = transposed ? w.shape()[0] : w.shape()[1];
  const int64_t k = n > 0 ? w.element_count() / n : 0;
  const auto src = w.values<float>();
  auto at = [&](int64_t j, int64_t i) { return transposed ? src[j * k + i] : src[i * n + j]; };
  QuantizedWeight out;
  out.values = Tensor::Allocate(DataType::kInt8, {n, k});
  out.scales.resize(static_cast<size_t>(n));
  auto dst = out.values.mutable_values<int8_t>();
  for (int64_t j = 0; j < n; ++j) {
    float largest = 0.f;
    for (int64_t i = 0; i < k; ++i) largest = std::max(largest, std::fabs(at(j, i)));
    // 1 for a column of zeros, or one whose scale has no finite inverse (values near
    // FLT_MIN, or an infinity): nothing to quantise with, and its products are ~0 anyway.
    const float symmetric = SymmetricScale(-largest, largest);
    const float scale = symmetric > 0.f ? symmetric : 1.f;
    out.scales[static_cast<size_t>(j)] = scale;
    for (int64_t i = 0; i < k; ++i) dst[j * k + i] = QuantizeValue(at(j, i), 1.f / scale);
  }
  return out;
}

std::vector<float> Int8ProductReference(const std::vector<float>& x, int64_t m, int64_t k,
                                        float inv_sx, const QuantizedWeight& w,
                                        const std::vector<float>& scale, const float* bias,
                                        bool relu) {
  const int64_t n = w.values.shape()[0];
  const auto wq = w.values.values<int8_t>();
  std::vector<int8_t> xq(x.size());
  for (size_t i = 0; i < x.size(); ++i) xq[i] = QuantizeValue(x[i], inv_sx);
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      int32_t acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += int32_t{xq[r * k + i]} * int32_t{wq[j * k + i]};
      float v = static_cast<float>(acc) * scale[static_cast<size_t>(j)] + (bias ? bias[j] : 0.f);
      if (relu && v < 0.f) v = 0.f;
      y[static_cast<size_t>(r * n + j)] = v;
    }
  }
  return y;
}

namespace {

Status CheckScale(float inv_scale, const char* what) {
  if (std::isfinite(inv_scale) && inv_scale > 0.f) return Status::Ok();
  return InvalidArgument(std::string(what) +
                         ": the inverse scale must be a finite positive "
                         "number; was " +
                         std::to_string(inv_scale));
}

}  // namespace

Status QuantizeInt8(const float* x, int8_t* q, int64_t count, float inv_scale,
                    cudaStream_t stream) {
  if (count < 0) return InvalidArgument("int8 quantisation: a negative count");
  RETURN_IF_ERROR(CheckScale(inv_scale, "int8 quantisation"));
  return CudaStatus(internal::LaunchQuantizeInt8(x, q, count, inv_scale, stream),
                    "int8 quantisation kernel launch");
}

Status Im2ColInt8(const float* x, int8_t* cols, const Window2d& g, float inv_scale,
                  cudaStream_t stream) {
  RETURN_IF_ERROR(CheckWindow(g));
  RETURN_IF_ERROR(CheckScale(inv_scale, "int8 im2col"));
  return CudaStatus(internal::LaunchIm2ColInt8(x, cols, g, inv_scale, stream),
                    "int8 im2col kernel launch");
}

Status DequantizeInt8(const int32_t* acc, const float* scale, const float* bias, float* y,
                      int64_t rows, int64_t n, bool relu, cudaStream_t stream) {
  if (rows < 0 || n < 0 || (rows > 0 && n > 0 && rows > (int64_t{1} << 60) / n))
    return InvalidArgument("int8 dequantisation: sizes must be >= 0 and their product fit 60 bits");
  if (scale == nullptr && rows > 0 && n > 0)
    return InvalidArgument("int8 dequantisation: no scales");
  return CudaStatus(internal::LaunchDequantizeInt8(acc, scale, bias, y, rows, n, relu, stream),
                    "int8 dequantisation kernel launch");
}

}  // namespace shoal::engine::cuda
