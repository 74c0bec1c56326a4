#include "engine/cuda/conv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device.h"

namespace shoal::engine::cuda {

Status CheckWindow(const Window2d& g) {
  const bool sizes = g.n >= 0 && g.c >= 0 && g.h >= 0 && g.w >= 0 && g.oh >= 0 && g.ow >= 0;
  const bool window = g.kh >= 1 && g.kw >= 1 && g.sh >= 1 && g.sw >= 1 && g.dh >= 1 && g.dw >= 1;
  const bool pads = g.ph >= 0 && g.pw >= 0 && g.ph_end >= 0 && g.pw_end >= 0;
  if (!sizes || !window || !pads || g.groups < 1 || g.c % g.groups != 0) {
    return InvalidArgument(
        "window: input [" + std::to_string(g.n) + "," + std::to_string(g.c) + "," +
        std::to_string(g.h) + "," + std::to_string(g.w) + "], kernel " + std::to_string(g.kh) +
        "x" + std::to_string(g.kw) + ", strides " + std::to_string(g.sh) + "x" +
        std::to_string(g.sw) + ", dilations " + std::to_string(g.dh) + "x" + std::to_string(g.dw) +
        ", groups " + std::to_string(g.groups) +
        ": sizes must be >= 0, kernel, strides and dilations >= 1, pads >= 0, and the groups "
        "must divide the channels");
  }
  return Status::Ok();
}

Status Im2Col(const float* x, float* cols, const Window2d& g, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckWindow(g));
  return CudaStatus(internal::LaunchIm2ColF32(x, cols, g, stream), "im2col kernel launch");
}

Status Im2ColHalf(HalfType to, const float* x, void* cols, const Window2d& g, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckWindow(g));
  return CudaStatus(
      internal::LaunchIm2ColHalf(static_cast<internal::HalfKernel>(to), x, cols, g, stream),
      "im2col kernel launch");
}

Status ConvTranspose2d(const float* x, const float* w, const float* bias, float* y,
                       const Window2d& g, int64_t m, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckWindow(g));
  if (m < 0 || m % g.groups != 0) {
    return InvalidArgument("transposed convolution: " + std::to_string(m) + " output channels in " +
                           std::to_string(g.groups) + " groups");
  }
  return CudaStatus(internal::LaunchConvTransposeF32(x, w, bias, y, g, m, stream),
                    "transposed convolution kernel launch");
}

namespace {

// The kernels read these enums by their values.
static_assert(static_cast<int>(internal::HalfKernel::kBf16) == static_cast<int>(HalfType::kBf16));
static_assert(static_cast<int>(internal::UnaryKernel::kLeakyRelu) ==
              static_cast<int>(UnaryOp::kLeakyRelu));
static_assert(static_cast<int>(internal::UnaryKernel::kClip) == static_cast<int>(UnaryOp::kClip));
static_assert(static_cast<int>(internal::UnaryKernel::kElu) == static_cast<int>(UnaryOp::kElu));

}  // namespace

Status CheckConvEpilogue(const ConvEpilogueOptions& o) {
  int64_t elements = 0;
  const bool sizes =
      o.n >= 0 && o.m >= 0 && o.spatial >= 0 && !__builtin_mul_overflow(o.n, o.m, &elements) &&
      !__builtin_mul_overflow(elements, o.spatial, &elements) && elements <= (int64_t{1} << 60);
  if (!sizes || (o.m == 0 && o.n > 0 && o.spatial > 0)) {
    return InvalidArgument("convolution epilogue: y [" + std::to_string(o.n) + "," +
                           std::to_string(o.m) + "," + std::to_string(o.spatial) +
                           "]: sizes must be >= 0, with channels when y has values, and their "
                           "product must fit 60 bits");
  }
  if (o.source && o.int32_sums)
    return InvalidArgument("convolution epilogue: its input is 16-bit or int32 sums, not both");
  if (o.source_channels_last && !o.source && !o.int32_sums)
    return InvalidArgument("convolution epilogue: an fp32 input cannot be channels last");
  if (o.residual_channels_last && !o.residual)
    return InvalidArgument("convolution epilogue: an fp32 residual cannot be channels last");
  if (o.int32_sums && !o.source_channels_last)
    return InvalidArgument("convolution epilogue: int32 sums are channels last (the GEMM's rows)");
  return Status::Ok();
}

Status ConvEpilogue(const ConvEpilogueOptions& o, const void* c, const float* bias, const void* z,
                    float* y, cudaStream_t stream, void* half, RoundTo half_type,
                    const float* scale) {
  RETURN_IF_ERROR(CheckConvEpilogue(o));
  if (y == nullptr && half == nullptr)
    return InvalidArgument("convolution epilogue: no output (neither fp32, 16 bits nor int8)");
  if (o.int32_sums && scale == nullptr)
    return InvalidArgument("convolution epilogue: int32 sums need their scales");
  RETURN_IF_ERROR(CheckInt8Copy("convolution epilogue", half, half_type));
  if (half && !half_type.half && o.half_channels_last)
    return InvalidArgument("convolution epilogue: its int8 copy is NCHW, as y is");
  const int64_t elements = o.n * o.m * o.spatial;
  const uint64_t y_bytes = y ? static_cast<uint64_t>(elements) * sizeof(float) : 0;
  const uint64_t half_bytes = half ? static_cast<uint64_t>(elements) * half_type.bytes() : 0;
  // Each element is read, then written, by one thread: an fp32 input may be y itself, but
  // nothing may overlap an output partly, and the residual not at all.
  const bool converted = o.source || o.int32_sums;  // read in another type (and layout)
  const uint64_t c_bytes = static_cast<uint64_t>(elements) * (o.source       ? 2
                                                              : o.int32_sums ? 4
                                                                             : sizeof(float));
  if ((BytesOverlap(c, c_bytes, y, y_bytes) && (converted || c != y)) ||
      BytesOverlap(c, c_bytes, half, half_bytes)) {
    return InvalidArgument(converted
                               ? "convolution epilogue: a 16-bit or int32 input must not overlap "
                                 "its output"
                               : "convolution epilogue: an fp32 input must be its output or not "
                                 "overlap it");
  }
  const uint64_t z_bytes =
      z ? static_cast<uint64_t>(elements) * (o.residual ? 2 : sizeof(float)) : 0;
  if (BytesOverlap(z, z_bytes, y, y_bytes) || BytesOverlap(z, z_bytes, half, half_bytes))
    return InvalidArgument("convolution epilogue: the residual must not overlap the output");
  if (BytesOverlap(y, y_bytes, half, half_bytes)) {
    return InvalidArgument(
        half_type.half ? "convolution epilogue: its fp32 and 16-bit outputs must not overlap"
                       : "convolution epilogue: its fp32 and int8 outputs must not overlap");
  }
  internal::ConvEpilogueKernel e;
  e.elements = elements;
  e.channels = std::max<int64_t>(o.m, 1);
  e.spatial = std::max<int64_t>(o.spatial, 1);
  e.source = o.source ? static_cast<int>(*o.source) : o.int32_sums ? internal::kInt32Sums : -1;
  e.residual = o.residual ? static_cast<int>(*o.residual) : -1;
  e.has_act = o.act.has_value();
  e.has_post = o.post.has_value();
  if (o.act) e.act = static_cast<internal::UnaryKernel>(*o.act);
  if (o.post) e.post = static_cast<internal::UnaryKernel>(*o.post);
  e.act_alpha = o.act_alpha;
  e.act_beta = o.act_beta;
  e.post_alpha = o.post_alpha;
  e.post_beta = o.post_beta;
  e.half = half ? half_type.kernel() : internal::Rounding();
  e.source_channels_last = o.source_channels_last;
  e.residual_channels_last = o.residual_channels_last && z != nullptr;
  e.half_channels_last = o.half_channels_last && half != nullptr;
  return CudaStatus(internal::LaunchConvEpilogue(e, c, bias, z, y, half, stream, scale),
                    "convolution epilogue kernel launch");
}

Status RoiAlign(const float* x, const float* rois, const int64_t* batch, float* y,
                const RoiAlignGeometry& g, int32_t* flag, cudaStream_t stream) {
  if (g.n < 0 || g.c < 0 || g.h < 0 || g.w < 0 || g.rois < 0 || g.out_h < 1 || g.out_w < 1 ||
      g.sampling_ratio < 0) {
    return InvalidArgument(
        "RoiAlign: sizes must not be negative, the output at least 1x1 and "
        "the sampling ratio at least 0");
  }
  return CudaStatus(internal::LaunchRoiAlignF32(x, rois, batch, y, g, flag, stream),
                    "RoiAlign kernel launch");
}

Status GridSample(const float* x, const float* grid, float* y, const GridGeometry& g,
                  cudaStream_t stream) {
  if (g.n < 0 || g.c < 0 || g.d < 0 || g.h < 0 || g.w < 0 || g.out_d < 0 || g.out_h < 0 ||
      g.out_w < 0 || g.mode < 0 || g.mode > 2 || g.padding < 0 || g.padding > 2 ||
      (g.volume && g.mode == 2) || (!g.volume && (g.d != 1 || g.out_d != 1))) {
    return InvalidArgument(
        "GridSample: negative sizes, an unknown mode or padding, cubic on a "
        "volume, or depth on a plane");
  }
  return CudaStatus(internal::LaunchGridSampleF32(x, grid, y, g, stream),
                    "GridSample kernel launch");
}

namespace {

// A pool's window: its groups ignored (a pool keeps every channel apart), the rest checked,
// and x and y (`element_bytes` each element) apart: each thread reads whole windows of x.
StatusOr<Window2d> PoolWindow(const Window2d& g, const void* x, const void* y,
                              int64_t element_bytes) {
  Window2d plain = g;
  plain.groups = 1;
  RETURN_IF_ERROR(CheckWindow(plain));
  const auto x_bytes = static_cast<uint64_t>(g.n * g.c * g.h * g.w * element_bytes);
  const auto y_bytes = static_cast<uint64_t>(g.n * g.c * g.oh * g.ow * element_bytes);
  if (BytesOverlap(x, x_bytes, y, y_bytes)) return InvalidArgument("pooling: x and y overlap");
  return plain;
}

}  // namespace

Status Pool2d(PoolOp op, const float* x, float* y, const Window2d& g, cudaStream_t stream) {
  ASSIGN_OR_RETURN(const Window2d plain, PoolWindow(g, x, y, sizeof(float)));
  return CudaStatus(
      internal::LaunchPool2dF32(static_cast<internal::PoolKernel>(op), x, y, plain, stream),
      "pooling kernel launch");
}

Status MaxPool2dHalf(HalfType type, const void* x, void* y, const Window2d& g, cudaStream_t stream,
                     bool channels_last) {
  ASSIGN_OR_RETURN(const Window2d plain, PoolWindow(g, x, y, 2));
  return CudaStatus(internal::LaunchMaxPool2dHalf(static_cast<internal::HalfKernel>(type), x, y,
                                                  plain, stream, channels_last),
                    "max pooling kernel launch");
}

}  // namespace shoal::engine::cuda
