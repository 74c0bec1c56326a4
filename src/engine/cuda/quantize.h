// int8 products on the GPU (docs/gpu.md, "int8"): the quantisation that cuBLASLt's int8
// GEMM (gemm.h, GemmMath::kInt8) sits between.
//
// A product Y[m, n] = X[m, k] · Wᵀ + bias, W stored [n, k], runs as
//   Xq = q(X, sx)                      per tensor, sx from X's range over calibration inputs
//   Wq = q(W[j, :], sw[j])             per output column j, once, on the host
//   acc[i, j] = Σ Xq[i, :] · Wq[j, :]  int32, exact, on the tensor cores
//   Y[i, j] = act(acc[i, j] · (sx · sw[j]) + bias[j])
// where q(v, s) = clamp(round(v / s), -127, 127), rounding half to even, and a NaN
// quantises to -127 (fmax, then fmin, as both the host and the device compute it).
// Symmetric signed 8 bits on both sides: cuBLASLt's int8 kernels take s8 operands, and a
// symmetric range keeps the sum free of zero-point terms.
//
// The host functions here are what the lowering stores (the weights, their scales) and the
// reference the device tests compare against; the launchers run the same arithmetic on a
// stream. Shapes are validated on the host first, as everywhere on the GPU path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/cuda/conv.h"

namespace shoal::engine::cuda {

// The scale of a symmetric int8 range covering [min, max]: max(|min|, |max|) / 127, or 0
// when that is 0 or not a finite positive number (nothing to quantise with).
float SymmetricScale(float min, float max);

// q(v, 1 / inv_scale) as above, on the host.
int8_t QuantizeValue(float v, float inv_scale);

// A constant product weight in int8, one scale per output column (row of the stored [n, k]).
struct QuantizedWeight {
  Tensor values;              // int8 [n, k]
  std::vector<float> scales;  // n: SymmetricScale of W[j, :], 1 where that is 0 (zeros)
};
// `w` (fp32) stored [k, n], or [n, k] with `transposed` (or [n, ...], its trailing
// dimensions k: a convolution's [m, c/groups, kh, kw]), quantised per output column and
// stored [n, k] (the layout cuBLASLt's int8 kernels read).
QuantizedWeight QuantizeWeightColumns(const Tensor& w, bool transposed);

// The host reference of one int8 product, as the device computes it: y [m, n] =
// act(Σ q(x) · wq · scale[j] + bias[j]), with x [m, k] fp32, wq [n, k], scale[j] = sx · sw[j],
// bias null for none.
std::vector<float> Int8ProductReference(const std::vector<float>& x, int64_t m, int64_t k,
                                        float inv_sx, const QuantizedWeight& w,
                                        const std::vector<float>& scale, const float* bias,
                                        bool relu);

// q[i] = q(x[i], 1 / inv_scale) for count elements. InvalidArgument for a negative count
// or a scale that is not a finite positive number.
Status QuantizeInt8(const float* x, int8_t* q, int64_t count, float inv_scale, cudaStream_t stream);

// im2col (conv.h's Im2Col, the same [groups, n*oh*ow, (c/groups)*kh*kw] columns) quantised
// as it gathers: an int8 convolution's GEMM operand in one pass.
Status Im2ColInt8(const float* x, int8_t* cols, const Window2d& g, float inv_scale,
                  cudaStream_t stream);

// y [rows, n] = act(acc · scale[j] + bias[j]) for column j, act ReLU or none; bias may be
// null. y must not overlap acc. InvalidArgument for a negative size or no scale.
Status DequantizeInt8(const int32_t* acc, const float* scale, const float* bias, float* y,
                      int64_t rows, int64_t n, bool relu, cudaStream_t stream);

}  // namespace shoal::engine::cuda
