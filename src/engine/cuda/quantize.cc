#include "engine/cuda/quantize.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device.h"
#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda {

float SymmetricScale(float min, float max) {
  if (std::isnan(min) || std::isnan(max)) return 0.f;  // std::max would drop a NaN
  const float range = std::max(std::fabs(min), std::fabs(max));
  if (!std::isfinite(range) || !(range > 0.f)) return 0.f;
  const float scale = range / 127.f;
  return scale > 0.f && std::isfinite(1.f / scale) ? scale : 0.f;
}

Int8Input Int8InputFor(float min, float max) {
  Int8Input in;
  if (min >= 0.f) {
    // Never negative: 256 levels over [0, max].
    if (!std::isfinite(max) || !(max > 0.f)) return in;
    const float scale = max / 255.f;
    if (!(scale > 0.f) || !std::isfinite(1.f / scale)) return in;
    in.scale = scale;
    in.zero_point = -128;
  } else {
    in.scale = SymmetricScale(min, max);
    if (in.scale == 0.f) return in;
  }
  in.inv_scale = 1.f / in.scale;
  return in;
}

int8_t QuantizeValue(float v, float inv_scale, int zero_point) {
  // fmax first: a NaN becomes the low end, as the kernel's fmaxf makes it.
  const float lo = zero_point == 0 ? -127.f : 0.f, hi = zero_point == 0 ? 127.f : 255.f;
  const float clamped = std::fmin(std::fmax(v * inv_scale, lo), hi);
  // Half to even, the default rounding mode.
  return static_cast<int8_t>(static_cast<int>(std::nearbyint(clamped)) + zero_point);
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

std::vector<float> Int8Bias(const QuantizedWeight& w, const std::vector<float>& scale,
                            int zero_point, const float* bias) {
  if (bias == nullptr && zero_point == 0) return {};
  const int64_t n = w.values.shape()[0], k = n > 0 ? w.values.element_count() / n : 0;
  const auto wq = w.values.values<int8_t>();
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    int64_t sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += wq[j * k + i];
    const double shift =
        double{scale[static_cast<size_t>(j)]} * zero_point * static_cast<double>(sum);
    out[static_cast<size_t>(j)] = static_cast<float>((bias ? double{bias[j]} : 0.0) - shift);
  }
  return out;
}

std::vector<float> Int8ProductReference(const std::vector<float>& x, int64_t m, int64_t k,
                                        const Int8Input& in, const QuantizedWeight& w,
                                        const std::vector<float>& scale, const float* bias,
                                        bool relu) {
  const int64_t n = w.values.shape()[0];
  const auto wq = w.values.values<int8_t>();
  std::vector<int8_t> xq(x.size());
  for (size_t i = 0; i < x.size(); ++i) xq[i] = QuantizeValue(x[i], in.inv_scale, in.zero_point);
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

Status CheckScale(float inv_scale, int zero_point, const char* what) {
  if (zero_point != 0 && zero_point != -128) {
    return InvalidArgument(std::string(what) + ": the zero point must be 0 or -128; was " +
                           std::to_string(zero_point));
  }
  if (std::isfinite(inv_scale) && inv_scale > 0.f) return Status::Ok();
  return InvalidArgument(std::string(what) +
                         ": the inverse scale must be a finite positive number; was " +
                         std::to_string(inv_scale));
}

}  // namespace

Status QuantizeInt8(const float* x, int8_t* q, int64_t count, float inv_scale, int zero_point,
                    cudaStream_t stream) {
  if (count < 0) return InvalidArgument("int8 quantisation: a negative count");
  RETURN_IF_ERROR(CheckScale(inv_scale, zero_point, "int8 quantisation"));
  return CudaStatus(internal::LaunchQuantizeInt8(x, q, count, inv_scale, zero_point, stream),
                    "int8 quantisation kernel launch");
}

Status Im2ColInt8(const float* x, int8_t* cols, const Window2d& g, float inv_scale, int zero_point,
                  cudaStream_t stream) {
  RETURN_IF_ERROR(CheckWindow(g));
  RETURN_IF_ERROR(CheckScale(inv_scale, zero_point, "int8 im2col"));
  return CudaStatus(internal::LaunchIm2ColInt8(x, cols, g, inv_scale, zero_point, stream),
                    "int8 im2col kernel launch");
}

Status DequantizeInt8(const int32_t* acc, const float* scale, const float* bias, float* y,
                      int64_t rows, int64_t n, bool relu, cudaStream_t stream,
                      const Int8Output& q) {
  if (rows < 0 || n < 0 || (rows > 0 && n > 0 && rows > (int64_t{1} << 60) / n))
    return InvalidArgument("int8 dequantisation: sizes must be >= 0 and their product fit 60 bits");
  if (rows == 0 || n == 0) return Status::Ok();
  if (scale == nullptr) return InvalidArgument("int8 dequantisation: no scales");
  if (y == nullptr && q.values == nullptr) return InvalidArgument("int8 dequantisation: no output");
  if (q.values != nullptr) RETURN_IF_ERROR(CheckScale(q.inv_scale, q.zero_point, "int8 output"));
  const uint64_t count = static_cast<uint64_t>(rows * n);
  if (BytesOverlap(acc, count * 4, y, y ? count * 4 : 0) ||
      BytesOverlap(acc, count * 4, q.values, q.values ? count : 0) ||
      BytesOverlap(y, y ? count * 4 : 0, q.values, q.values ? count : 0))
    return InvalidArgument("int8 dequantisation: its sums and outputs must not overlap");
  return CudaStatus(internal::LaunchDequantizeInt8(acc, scale, bias, y, rows, n, relu, stream,
                                                   q.values, q.inv_scale, q.zero_point),
                    "int8 dequantisation kernel launch");
}

Status Im2ColFromInt8(const int8_t* x, int8_t* cols, const Window2d& g, int zero_point,
                      cudaStream_t stream) {
  RETURN_IF_ERROR(CheckWindow(g));
  if (zero_point != 0 && zero_point != -128) {
    return InvalidArgument("int8 im2col: the zero point must be 0 or -128; was " +
                           std::to_string(zero_point));
  }
  return CudaStatus(
      internal::LaunchIm2ColFromInt8(x, cols, g, static_cast<int8_t>(zero_point), stream),
      "int8 im2col kernel launch");
}

}  // namespace shoal::engine::cuda
