// Convolutions and pooling on a CUDA stream, NCHW fp32 as ONNX lays them out: im2col, which
// turns a 2-D convolution into one GEMM per group (gpu_lowering.h lowers it onto cuBLASLt),
// a convolution's epilogue (bias, activations and residual in one pass), transposed
// convolutions, and max and average pooling. The shapes are validated on the host first,
// as everywhere on the GPU path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "core/status.h"
#include "engine/cuda/elementwise.h"
#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda {

using Window2d = internal::Window2d;

enum class PoolOp { kMax, kAverage, kAverageIncludePad };

// InvalidArgument for a negative size, a kernel, stride or dilation below 1, a negative
// pad, or groups that do not divide the channels.
Status CheckWindow(const Window2d& g);

// cols = im2col(x): [groups, n*oh*ow, (c/groups)*kh*kw] (kernels.h). cols must not overlap x.
Status Im2Col(const float* x, float* cols, const Window2d& g, cudaStream_t stream);
// The same columns rounded to `to`, 2 bytes each: a mixed-precision plan's GEMM input.
Status Im2ColHalf(HalfType to, const float* x, void* cols, const Window2d& g, cudaStream_t stream);

// y [n, m, oh, ow] = ConvTranspose(x [n, c, h, w], w [c, m/groups, kh, kw]) + bias (m values,
// or null), with g.ph and g.pw the padding taken off the output's start and g.oh, g.ow its
// size (kernels.h). InvalidArgument as CheckWindow, or when the groups do not divide m.
Status ConvTranspose2d(const float* x, const float* w, const float* bias, float* y,
                       const Window2d& g, int64_t m, cudaStream_t stream);

// What follows a convolution that its own step leaves (a GPU plan's kConvEpilogue step), in
// one pass over y [n, m, spatial]: y = post(act(c + bias) + z), bias one value per output
// channel, z of y's shape, each part optional, as the CPU engine orders a FusedConv's. c is
// the convolution's output: fp32 (y itself allowed), or, in a mixed-precision plan on cuDNN,
// 16-bit (`source`), so that its cast back to fp32 is part of the same pass.
struct ConvEpilogueOptions {
  int64_t n = 0, m = 0, spatial = 0;
  std::optional<HalfType> source;    // c's 16-bit type; none: fp32
  std::optional<HalfType> residual;  // z's 16-bit type; none: fp32
  // Channels last (NHWC, [n, spatial, m]) instead of NCHW: a 16-bit c (a cuDNN convolution's
  // NHWC output), a 16-bit z, the rounding written to `half`. y is always NCHW.
  bool source_channels_last = false, residual_channels_last = false, half_channels_last = false;
  std::optional<UnaryOp> act;  // with act_alpha and act_beta (elementwise.h's parameters)
  float act_alpha = 0, act_beta = 0;
  std::optional<UnaryOp> post;
  float post_alpha = 0, post_beta = 0;
  // int8 (quantize.h): c is an int8 convolution's GEMM sums, int32 [n, spatial, m]
  // (channels last, its rows), each multiplied by its channel's `scale` before the bias
  // (less the zero point's share, Int8Bias), so that the GEMM's scaling, the bias, the
  // activations, the residual and the transpose into NCHW are one pass.
  bool int32_sums = false;
};
// InvalidArgument for a negative size, no channels in a y that has values, a layout asked
// of an fp32 operand (only 16-bit ones and int32 sums may be channels last, and int32 sums
// must be), or 16-bit and int32 sources at once.
Status CheckConvEpilogue(const ConvEpilogueOptions& o);
// y = the epilogue of c, and, with `half` (null: none), the same values rounded as
// `half_type` says there: to a 16-bit type, or quantised to int8 (RoundTo::Int8, NCHW: the
// operand of the int8 convolutions and products that read y). y may be null when half is
// not. `scale`: int32 sums' per-channel scales. InvalidArgument as CheckConvEpilogue, for no
// output, int32 sums without scales, an int8 copy as CheckInt8Copy refuses or channels last,
// or for buffers that overlap where one thread's read could see another's write: a 16-bit or
// int32 c and any output, an fp32 c and part of y (all of it is in place), the residual and
// an output, half and y.
Status ConvEpilogue(const ConvEpilogueOptions& o, const void* c, const float* bias, const void* z,
                    float* y, cudaStream_t stream, void* half = nullptr,
                    RoundTo half_type = HalfType::kFp16, const float* scale = nullptr);

using RoiAlignGeometry = internal::RoiAlignGeometry;
// y [rois, c, out_h, out_w] = RoiAlign(x [n, c, h, w], rois [rois, 4], batch [rois]) as
// kernels.h says; a batch index outside [0, n) sets bit 4 of *flag, a box an adaptive grid
// cannot sample bit 16. InvalidArgument for a
// negative size, an output below 1x1 or a negative sampling ratio.
Status RoiAlign(const float* x, const float* rois, const int64_t* batch, float* y,
                const RoiAlignGeometry& g, int32_t* flag, cudaStream_t stream);

using GridGeometry = internal::GridGeometry;
// y = GridSample(x, grid) as kernels.h says. InvalidArgument for a negative size, a mode or
// padding out of range, or cubic on a volume.
Status GridSample(const float* x, const float* grid, float* y, const GridGeometry& g,
                  cudaStream_t stream);

// y [n, c, oh, ow] = pool(x [n, c, h, w]); `groups` is ignored.
Status Pool2d(PoolOp op, const float* x, float* y, const Window2d& g, cudaStream_t stream);
// y = MaxPool(x) over 16-bit x and y, both of type `type`: the rounding of what Pool2d's
// kMax gives for x's fp32 originals (a zero's sign aside), since rounding keeps order. A
// mixed-precision plan pools a convolution's 16-bit output this way for the next one. With
// `channels_last`, x and y are NHWC, as such a plan passes them between cuDNN convolutions.
Status MaxPool2dHalf(HalfType type, const void* x, void* y, const Window2d& g, cudaStream_t stream,
                     bool channels_last = false);

}  // namespace shoal::engine::cuda
