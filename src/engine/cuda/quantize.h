// int8 products on the GPU (docs/gpu.md, "int8"): the quantisation that cuBLASLt's int8
// GEMM (gemm.h, GemmMath::kInt8) sits between.
//
// A product Y[m, n] = X[m, k] · Wᵀ + bias, W stored [n, k], runs as
//   Xq = q(X, sx, z)                   per tensor, sx and z from X's range in calibration
//   Wq = q(W[j, :], sw[j], 0)          per output column j, once, on the host
//   acc[i, j] = Σ Xq[i, :] · Wq[j, :]  int32, exact, on the tensor cores
//   Y[i, j] = act(acc[i, j] · (sx · sw[j]) + bias'[j])
// where q(v, s, z) = round(clamp(v / s, lo, hi)) + z, rounding half to even:
//   - z = 0 (symmetric), [lo, hi] = [-127, 127]: an input that went negative, and weights;
//   - z = -128, [lo, hi] = [0, 255]: an input that never went negative (a ReLU's output),
//     which so gets 256 levels instead of 128, as the CPU's int8 tier's u8 inputs do.
//     cuBLASLt's int8 kernels take signed operands, so the levels are shifted into s8; the
//     shift's share of the sum, z · Σ Wq[j, :], is taken out of the bias once, on the host:
//     bias'[j] = bias[j] - (sx · sw[j]) · z · Σ Wq[j, :] (Int8Bias).
// A NaN quantises to lo + z (fmax, then fmin, as both the host and the device compute it).
//
// The host functions here are what the lowering stores (the weights, their scales and the
// bias) and the reference the device tests compare against; the launchers run the same
// arithmetic on a stream. Shapes are validated on the host first, as everywhere on the GPU
// path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/cuda/conv.h"

namespace shoal::engine::cuda {

// The scale of a symmetric int8 range covering [min, max]: max(|min|, |max|) / 127, or 0
// when that is 0, not a finite positive number, or either end is NaN (nothing to quantise
// with).
float SymmetricScale(float min, float max);

// How a product's input is quantised, from its range over calibration inputs.
struct Int8Input {
  float scale = 0;      // 0: no usable range (nothing to quantise with)
  float inv_scale = 0;  // 1 / scale
  int zero_point = 0;   // 0 (symmetric) or -128 (a range that never went negative)
};
// [min, max] with min >= 0: max / 255 and zero point -128; otherwise SymmetricScale's, zero
// point 0. No scale when the range gives none (all zeros, not finite, too small to invert).
Int8Input Int8InputFor(float min, float max);

// q(v, 1 / inv_scale, zero_point) as above (zero_point 0 or -128), on the host.
int8_t QuantizeValue(float v, float inv_scale, int zero_point = 0);

// A constant product weight in int8, one scale per output column (row of the stored [n, k]).
struct QuantizedWeight {
  Tensor values;              // int8 [n, k]
  std::vector<float> scales;  // n: SymmetricScale of W[j, :], 1 where that is 0 (zeros)
};
// `w` (fp32) stored [k, n], or [n, k] with `transposed` (or [n, ...], its trailing
// dimensions k: a convolution's [m, c/groups, kh, kw]), quantised per output column and
// stored [n, k] (the layout cuBLASLt's int8 kernels read).
QuantizedWeight QuantizeWeightColumns(const Tensor& w, bool transposed);

// The bias an int8 product adds after scaling its sums (bias' above): bias[j] (0 where
// `bias` is null) less scale[j] · zero_point · Σ w[j, :]. Empty when both are nothing to
// add (no bias, zero point 0).
std::vector<float> Int8Bias(const QuantizedWeight& w, const std::vector<float>& scale,
                            int zero_point, const float* bias);

// The host reference of one int8 product, as the device computes it: y [m, n] =
// act(Σ q(x) · wq · scale[j] + bias[j]), with x [m, k] fp32 quantised as `in` says, wq [n, k],
// scale[j] = sx · sw[j], bias (Int8Bias's, already corrected for the zero point) null for
// none.
std::vector<float> Int8ProductReference(const std::vector<float>& x, int64_t m, int64_t k,
                                        const Int8Input& in, const QuantizedWeight& w,
                                        const std::vector<float>& scale, const float* bias,
                                        bool relu);

// q[i] = q(x[i], 1 / inv_scale, zero_point) for count elements. InvalidArgument for a
// negative count, a scale that is not a finite positive number, or a zero point other than
// 0 and -128.
Status QuantizeInt8(const float* x, int8_t* q, int64_t count, float inv_scale, int zero_point,
                    cudaStream_t stream);

// im2col (conv.h's Im2Col, the same [groups, n*oh*ow, (c/groups)*kh*kw] columns) quantised
// as it gathers (the padding's zeros too): an int8 convolution's GEMM operand in one pass.
Status Im2ColInt8(const float* x, int8_t* cols, const Window2d& g, float inv_scale, int zero_point,
                  cudaStream_t stream);

// An int8 copy of a result that a step writes in the same pass, for the int8 products that
// read it: q(v, 1 / inv_scale, zero_point) into `values` (none: null).
struct Int8Output {
  int8_t* values = nullptr;
  float inv_scale = 0;
  int zero_point = 0;
};

// y [rows, n] = act(acc · scale[j] + bias[j]) for column j, act ReLU or none; bias may be
// null; with `q`, y quantised too, and y may then be null. No output may overlap acc or
// another. InvalidArgument for a negative size, no scale, no output, or q's quantisation
// as QuantizeInt8's.
Status DequantizeInt8(const int32_t* acc, const float* scale, const float* bias, float* y,
                      int64_t rows, int64_t n, bool relu, cudaStream_t stream,
                      const Int8Output& q = {});

// Im2ColInt8's columns from x already quantised (int8, as an int8 convolution's epilogue
// writes it for the next: ConvEpilogueOptions::quantize) with zero point `zero_point`: a
// gather, the padding's positions the quantisation of 0 (the zero point). InvalidArgument as
// CheckWindow, or for a zero point other than 0 and -128.
Status Im2ColFromInt8(const int8_t* x, int8_t* cols, const Window2d& g, int zero_point,
                      cudaStream_t stream);

}  // namespace shoal::engine::cuda
