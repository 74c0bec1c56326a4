// The CUDA kernels' launch functions, the one boundary between nvcc-compiled code
// (kernels.cu) and the rest of the engine's CUDA path, which is ordinary C++.
//
// Only plain types cross it: raw device pointers, sizes and the index tables below; a
// launch returns the CUDA error of the launch itself (it clears the thread's last error
// first, then reads it after the launch), not of the kernel's run, which the caller
// learns from its stream. Nothing here allocates or
// synchronises. Callers validate shapes first (elementwise.h); these trust them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace shoal::engine::cuda::internal {

// The most dimensions a broadcast operand may have.
inline constexpr int kMaxRank = 8;

// What a kernel that writes an fp32 result may also write in the same pass, into its `h`:
// that result rounded to a HalfKernel type (`kind` 0 or 1, declared below), or quantised to
// int8 (`kind` kInt8Copy: v * inv_scale clamped to [-127, 127], or to [0, 255] with
// zero_point -128, rounded half to even, plus zero_point, as LaunchQuantizeInt8 does: the
// int8 copy of a value that int8 products read); -1: nothing. A HalfKernel's int (or -1)
// converts to it.
inline constexpr int kInt8Copy = 2;
struct Rounding {
  int kind = -1;
  float inv_scale = 0;
  int zero_point = 0;
  constexpr Rounding() = default;
  constexpr Rounding(int k) : kind(k) {}  // NOLINT(google-explicit-constructor)
  constexpr Rounding(float q_inv_scale, int q_zero_point)
      : kind(kInt8Copy), inv_scale(q_inv_scale), zero_point(q_zero_point) {}
};

// Unary operators, in the order of elementwise.h's UnaryOp.
enum class UnaryKernel : int {
  kRelu,
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kNeg,
  kAbs,
  kSqrt,
  kErf,
  kGelu,
  kLeakyRelu,
  kClip,
  kHardSigmoid,
  kHardSwish,
  kFloor,
  kCeil,
  kReciprocal,
  kSoftplus,
  kElu
};
// Binary operators, in the order of elementwise.h's BinaryOp.
enum class BinaryKernel : int { kAdd, kSub, kMul, kDiv, kMax, kMin, kPow, kPRelu };

// How an output element's linear index maps to each input's: the output's dimensions and,
// per input, the element stride of each output dimension (0 where that input is
// broadcast along it). Dimensions are outermost first; only the first `rank` count.
struct BroadcastIndex {
  int rank = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t a_strides[kMaxRank] = {};
  int64_t b_strides[kMaxRank] = {};
};

// y[i] = op(x[i]) for i < n; alpha and beta are the parameters of the operators that take
// them (elementwise.h). `half` (a HalfKernel, or -1) also writes y[i] rounded to that type
// into h; y may be null then.
cudaError_t LaunchUnaryF32(UnaryKernel op, const float* x, float* y, int64_t n, float alpha,
                           float beta, cudaStream_t stream, Rounding half = {}, void* h = nullptr);
// y[i] = a[ia(i)] op b[ib(i)] for i < n, the indices from `index`. `half`, as for
// LaunchUnaryF32.
cudaError_t LaunchBinaryF32(BinaryKernel op, const float* a, const float* b, float* y,
                            const BroadcastIndex& index, int64_t n, cudaStream_t stream,
                            Rounding half = {}, void* h = nullptr);
// Comparisons, in the order of elementwise.h's CompareOp.
enum class CompareKernel : int { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual };
// y[i] = a[ia(i)] op b[ib(i)] as one byte, 1 or 0 (ONNX bool), for i < n; a and b are fp32,
// or int64 when `int64_operands`.
cudaError_t LaunchCompare(CompareKernel op, bool int64_operands, const void* a, const void* b,
                          uint8_t* y, const BroadcastIndex& index, int64_t n, cudaStream_t stream);

// Logic on bools (one byte each, nonzero true): y[i] = a[ia(i)] op b[ib(i)], 0 or 1; kNot
// reads a alone (y[i] = !a[i], b null, the index ignored).
enum class LogicalKernel : int { kAnd, kOr, kXor, kNot };
cudaError_t LaunchLogical(LogicalKernel op, const uint8_t* a, const uint8_t* b, uint8_t* y,
                          const BroadcastIndex& index, int64_t n, cudaStream_t stream);

// Mod: y[i] = a[ia(i)] mod b[ib(i)] over fp32 (C's fmod; ONNX asks fmod = 1 for floats)
// or int64 operands: with `fmod` the remainder takes the dividend's sign (C's %), without
// it the divisor's (Python's %). An int64 divisor of 0 writes 0 and sets bit 2 of *error_flag
// (only ever set, as Gather's).
cudaError_t LaunchModulo(bool int64_operands, bool fmod, const void* a, const void* b, void* y,
                         const BroadcastIndex& index, int64_t n, int32_t* error_flag,
                         cudaStream_t stream);

// Where: y[i] = cond[ic(i)] ? a[ia(i)] : b[ib(i)], each operand broadcast through its
// strides (0 along a dimension it is broadcast over); cond is one byte per element.
struct WhereIndex {
  int rank = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t cond_strides[kMaxRank] = {};
  int64_t a_strides[kMaxRank] = {};
  int64_t b_strides[kMaxRank] = {};
};
cudaError_t LaunchWhereF32(const uint8_t* cond, const float* a, const float* b, float* y,
                           const WhereIndex& index, int64_t n, cudaStream_t stream);

// Softmax of each of `rows` contiguous rows of `cols` values, or with `log` its logarithm
// (x - max - log(sum(exp(x - max))), LogSoftmax); x and y may be the same. `half` (a
// HalfKernel, or -1) also writes y rounded to that type into h; y may be null then.
cudaError_t LaunchSoftmaxRowsF32(const float* x, float* y, int64_t rows, int64_t cols, bool log,
                                 cudaStream_t stream, Rounding half = {}, void* h = nullptr);

// Transpose: y (dims out_dims) is x read through `in_strides`, the element stride in x of
// each output dimension (x's strides permuted).
struct TransposeIndex {
  int rank = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t in_strides[kMaxRank] = {};
};
// `half` (a HalfKernel, or -1) also writes y rounded to that type into h; y may be null then.
cudaError_t LaunchTransposeF32(const float* x, float* y, const TransposeIndex& index, int64_t n,
                               cudaStream_t stream, Rounding half = {}, void* h = nullptr);

// Gather along one axis: data viewed as [outer, axis_dim, inner], indices as num_indices
// values; y is [outer, num_indices, inner]. Negative indices count from the end (ONNX).
// An index out of [-axis_dim, axis_dim) writes zeros and sets bit 1 of *error_flag; the flag
// is only ever set, never cleared, so one flag can cover a whole run.
cudaError_t LaunchGatherF32(const float* data, const int64_t* indices, float* y, int64_t outer,
                            int64_t axis_dim, int64_t inner, int64_t num_indices,
                            int32_t* error_flag, cudaStream_t stream);

// Layer normalisation of each of `rows` contiguous rows of `cols` values:
// y = (x - mean) / sqrt(variance + epsilon) * scale + bias, scale and bias `cols` values
// (bias may be null). Population variance, as ONNX LayerNormalization. `half` (a HalfKernel,
// declared below, or -1): each y also written rounded to that type into h.
cudaError_t LaunchLayerNormF32(const float* x, const float* scale, const float* bias, float* y,
                               int64_t rows, int64_t cols, float epsilon, cudaStream_t stream,
                               void* h = nullptr, Rounding half = {});

// Slice along one axis: x viewed as [outer, axis_in, inner], y as [outer, axis_out, inner]
// holding x's axis positions [start, start + axis_out) (Split's outputs).
cudaError_t LaunchSliceAxisF32(const float* x, float* y, int64_t outer, int64_t axis_in,
                               int64_t start, int64_t axis_out, int64_t inner, cudaStream_t stream);

// Reductions, in the order of reduce.h's ReduceOp.
enum class ReduceKernel : int { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL2 };
// x viewed as [outer, r, inner] reduced over r: y is [outer, inner]. r >= 1. `half` (a
// HalfKernel, or -1) also writes y rounded to that type into h; y may be null then.
cudaError_t LaunchReduceMiddleF32(ReduceKernel op, const float* x, float* y, int64_t outer,
                                  int64_t r, int64_t inner, cudaStream_t stream, Rounding half = {},
                                  void* h = nullptr);

// ArgMax (is_max) or ArgMin: x viewed as [outer, r, inner], y [outer, inner] the int64
// position along r of the first extreme (the last with `last`), as the CPU engine compares
// (a NaN never wins). r >= 1.
cudaError_t LaunchArgExtremeMiddleF32(bool is_max, bool last, const float* x, int64_t* y,
                                      int64_t outer, int64_t r, int64_t inner, cudaStream_t stream);

// TopK: x viewed as [outer, r, inner]; for every (outer, inner) the k first positions along
// r in the order the CPU engine sorts (largest or smallest value first, equal values by the
// lower position), their values into `values` and positions into `indices` ([outer, k,
// inner]; either may be null). One thread per row, k passes over it. 0 < k <= r.
cudaError_t LaunchTopKF32(const float* x, float* values, int64_t* indices, int64_t outer, int64_t r,
                          int64_t inner, int64_t k, bool largest, cudaStream_t stream);

// Source types of a cast to fp32, in the order of elementwise.h's CastSource.
enum class CastKernel : int { kInt64, kInt32, kBool, kFp16, kBf16 };
// y[i] = float(x[i]) for i < n, x of the type `from` names (bool: one byte, 0 or not; the
// 16-bit floats exactly).
cudaError_t LaunchCastToF32(CastKernel from, const void* x, float* y, int64_t n,
                            cudaStream_t stream);

// The 16-bit types a mixed-precision plan feeds its GEMMs, in the order of elementwise.h's
// HalfType.
enum class HalfKernel : int { kFp16, kBf16 };

// What follows a convolution, in one pass over y [n, m, spatial] (`elements` values):
// y[i] = post(act(float(c[i]) + bias[(i / spatial) % channels]) + float(z[i])), c fp32
// (`source` -1; y itself allowed) or 16-bit (`source` a HalfKernel), bias (channels values),
// z (y's shape, fp32 or, `residual` a HalfKernel, 16-bit) and either activation optional
// (null, or `has_act` / `has_post` false). `half` (a HalfKernel, or -1) also writes y[i]
// rounded to that type into h; y may be null then.
// An int8 convolution's epilogue (quantize.h): `source` kInt32Sums reads c as the int32
// sums of its GEMM, [n, spatial, channels] (the GEMM's rows; `source_channels_last` set),
// each multiplied by scale[channel] before the bias; its int8 copy for the next is `half`
// (a Rounding of kind kInt8Copy).
inline constexpr int kInt32Sums = 2;
struct ConvEpilogueKernel {
  int64_t elements = 0, channels = 1, spatial = 1;
  int source = -1;    // -1 fp32, a HalfKernel, or kInt32Sums
  int residual = -1;  // z's type: -1 fp32, else a HalfKernel
  Rounding half;      // none, a HalfKernel's rounding, or an int8 copy
  // NHWC ([n, spatial, channels]) instead of NCHW: c (16-bit, or int32 sums, which always
  // are), a 16-bit z, the rounding (16-bit only). y is NCHW.
  bool source_channels_last = false, residual_channels_last = false, half_channels_last = false;
  bool has_act = false, has_post = false;
  UnaryKernel act = UnaryKernel::kRelu, post = UnaryKernel::kRelu;
  float act_alpha = 0, act_beta = 0, post_alpha = 0, post_beta = 0;
};
cudaError_t LaunchConvEpilogue(const ConvEpilogueKernel& e, const void* c, const float* bias,
                               const void* z, float* y, void* h, cudaStream_t stream,
                               const float* scale = nullptr);
// y[i] = x[i] rounded to the nearest `to` value (fp16 overflows to infinity) for i < n.
// With channels > 0: x is [n / (channels·spatial), channels, spatial] and y the same values
// channels last, [.., spatial, channels] (NHWC for an NCHW x).
cudaError_t LaunchCastF32ToHalf(HalfKernel to, const float* x, void* y, int64_t n,
                                cudaStream_t stream, int64_t channels = 0, int64_t spatial = 0);
// y[i] = x[i] truncated toward zero into int64 (`to64`) or int32, saturating at the type's
// bounds, NaN to 0, as the CPU engine casts.
cudaError_t LaunchCastF32ToInt(bool to64, const float* x, void* y, int64_t n, cudaStream_t stream);
// Casts among int64, int32 and bool (one byte), and fp32 to bool, as the CPU engine casts:
// to bool, nonzero (a NaN too) is 1; from bool, 0 or 1; int64 to int32 keeps the low 32 bits.
enum class IntCastType : int { kInt64, kInt32, kBool, kFp32 };
cudaError_t LaunchCastIntegral(IntCastType from, IntCastType to, const void* x, void* y, int64_t n,
                               cudaStream_t stream);

// The geometry of a 2-D convolution or pooling window over an NCHW input: batch n,
// channels c in `groups` groups, input h x w, kernel kh x kw, strides, dilations, the
// padding before (ph, pw) and after (ph_end, pw_end) each axis, output oh x ow.
struct Window2d {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t ph = 0, pw = 0, ph_end = 0, pw_end = 0;
  int64_t oh = 0, ow = 0;
  int64_t groups = 1;
};
// im2col for a GEMM per group: cols is [groups, n*oh*ow, (c/groups)*kh*kw], the columns in
// (channel, kernel row, kernel column) order as ONNX's weights [m, c/groups, kh, kw] are;
// positions in the padding are 0.
cudaError_t LaunchIm2ColF32(const float* x, float* cols, const Window2d& g, cudaStream_t stream);
// The same columns rounded to `to` (a mixed-precision plan's GEMM input), in one pass.
cudaError_t LaunchIm2ColHalf(HalfKernel to, const float* x, void* cols, const Window2d& g,
                             cudaStream_t stream);
// The same columns quantised to int8 (quantize.h's q(v, s, zero_point), v * inv_scale), in
// one pass.
cudaError_t LaunchIm2ColInt8(const float* x, int8_t* cols, const Window2d& g, float inv_scale,
                             int zero_point, cudaStream_t stream);
// The same int8 columns gathered from x already quantised (int8 [n, c, h, w]); positions in
// the padding are `pad` (the quantisation of 0: its zero point).
cudaError_t LaunchIm2ColFromInt8(const int8_t* x, int8_t* cols, const Window2d& g, int8_t pad,
                                 cudaStream_t stream);
// q[i] = quantize.h's q(x[i], 1 / inv_scale, zero_point) for count elements: x[i] * inv_scale
// clamped (fmax, then fmin) to [-127, 127] or, with zero_point -128, [0, 255], rounded half
// to even, plus zero_point.
cudaError_t LaunchQuantizeInt8(const float* x, int8_t* q, int64_t count, float inv_scale,
                               int zero_point, cudaStream_t stream);
// y [rows, n] = acc * scale[j] + bias[j] (bias may be null), negatives then 0 with relu;
// with q, also y quantised into q as LaunchQuantizeInt8 does (q_inv_scale, q_zero_point),
// and y may be null then.
cudaError_t LaunchDequantizeInt8(const int32_t* acc, const float* scale, const float* bias,
                                 float* y, int64_t rows, int64_t n, bool relu, cudaStream_t stream,
                                 int8_t* q = nullptr, float q_inv_scale = 0, int q_zero_point = 0);
// Pooling kinds, in the order of conv.h's PoolOp.
enum class PoolKernel : int { kMax, kAverage, kAverageIncludePad };
// y [n, c, oh, ow] pooled from x [n, c, h, w] over each window: the largest value inside
// the input, or the sum over the window's positions inside the input divided by their
// number (kAverage) or by the window's size kh·kw (kAverageIncludePad, as oneDNN and the
// CPU engine count it, a ceil_mode window past the padding included). A window with no
// position inside the input gives 0.
cudaError_t LaunchPool2dF32(PoolKernel op, const float* x, float* y, const Window2d& g,
                            cudaStream_t stream);
// Max pooling as LaunchPool2dF32 does it, of 16-bit x into 16-bit y (`type` names both):
// equal to the rounding of the fp32 pool's result over the unrounded values (a zero's sign
// aside), since rounding keeps order.
// With `channels_last`, x and y are NHWC ([n, h, w, c], [n, oh, ow, c]).
cudaError_t LaunchMaxPool2dHalf(HalfKernel type, const void* x, void* y, const Window2d& g,
                                cudaStream_t stream, bool channels_last = false);

// RoiAlign (ONNX, as the CPU engine computes it): x [n, c, h, w], rois [rois, 4] (x1, y1,
// x2, y2), batch [rois] int64, y [rois, c, out_h, out_w]. Each output is the average (or,
// with `max`, the largest weighted corner) of grid_h x grid_w bilinear samples of its bin
// (sampling_ratio, or the bin's size rounded up when 0). A batch index outside [0, n) writes
// zeros for its roi and sets bit 4 of *flag; with sampling_ratio 0, a box not finite, or
// whose bins span more than twice the input, does the same with bit 16.
struct RoiAlignGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0, rois = 0, out_h = 1, out_w = 1, sampling_ratio = 0;
  float spatial_scale = 1.f;
  bool max = false;
  bool half_pixel = true;  // coordinate_transformation_mode; else output_half_pixel
};
cudaError_t LaunchRoiAlignF32(const float* x, const float* rois, const int64_t* batch, float* y,
                              const RoiAlignGeometry& g, int32_t* flag, cudaStream_t stream);

// GridSample (ONNX, as the CPU engine computes it, ops/sampling.cc): x [n, c, h, w] read at
// grid [n, out_h, out_w, 2] (x, y in [-1, 1]), or, with `volume`, x [n, c, d, h, w] at grid
// [n, out_d, out_h, out_w, 3] (linear and nearest only); y [n, c, (out_d,) out_h, out_w].
// Coordinates that are not finite, or far outside, read as outside.
struct GridGeometry {
  int64_t n = 0, c = 0, d = 1, h = 0, w = 0, out_d = 1, out_h = 0, out_w = 0;
  int mode = 0;     // 0 linear, 1 nearest, 2 cubic (Keys, a = -0.75; 4-D only)
  int padding = 0;  // 0 zeros, 1 border, 2 reflection
  bool align_corners = false;
  bool volume = false;
};
cudaError_t LaunchGridSampleF32(const float* x, const float* grid, float* y, const GridGeometry& g,
                                cudaStream_t stream);

// A transposed 2-D convolution (ONNX ConvTranspose): x [n, c, h, w], w [c, m/groups, kh,
// kw] as ONNX stores it, bias m values or null, y [n, m, oh, ow]. Each output position sums
// the inputs whose strided, dilated kernel footprint covers it: input row iy meets output
// row oy through kernel row ky when oy + ph = iy·sh + ky·dh (likewise for columns); the
// geometry's ph and pw are the padding taken off the start, oh and ow the output's size
// (output_padding and the end's padding are in them).
cudaError_t LaunchConvTransposeF32(const float* x, const float* w, const float* bias, float* y,
                                   const Window2d& g, int64_t m, cudaStream_t stream);

// Resize: each element of y (out_dims) is the weighted sum, over every combination of its
// axes' taps, of the element of x (in_strides, row-major) they name. Axis d's taps are
// taps[d] entries per output coordinate, at table_offset[d] in the tables `idx` (int64
// input coordinates) and `w` (float weights; an unused entry weighs 0). An output
// coordinate whose first entry's idx is -1 lies outside tf_crop_and_resize's crop: an
// element with any such coordinate is `extrapolation`.
struct ResizeIndex {
  int rank = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t in_strides[kMaxRank] = {};
  int64_t table_offset[kMaxRank] = {};
  int64_t taps[kMaxRank] = {};
};
cudaError_t LaunchResizeF32(const float* x, float* y, const int64_t* idx, const float* w,
                            const ResizeIndex& index, float extrapolation, int64_t n,
                            cudaStream_t stream);

// Concat's inputs: x viewed as [outer, axis_in, inner] written into y, viewed as [outer,
// axis_out, inner], at axis positions [start, start + axis_in).
cudaError_t LaunchPlaceAxisF32(const float* x, float* y, int64_t outer, int64_t axis_in,
                               int64_t start, int64_t axis_out, int64_t inner, cudaStream_t stream);

// Padding: y (out_dims) holds x (in_dims, the same rank) shifted by `begin` per dimension
// (>= 0); outside it, `value` (mode 0, constant), the nearest edge element (1, edge) or the
// element mirrored about the edge, the edge itself not repeated (2, reflect; each pad
// smaller than its axis).
struct PadIndex {
  int rank = 0;
  int mode = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t in_dims[kMaxRank] = {};
  int64_t begin[kMaxRank] = {};
};
cudaError_t LaunchPadF32(const float* x, float* y, const PadIndex& index, float value, int64_t n,
                         cudaStream_t stream);

// GatherElements and ScatterElements: one element per position of `indices` (idx_dims,
// outermost first), which reads (or writes) data at the same coordinates except along
// `axis`, where the index (negative counts from the end) is the coordinate: data's element
// offset is the sum of each coordinate times data_strides. axis_dim is data's size along
// the axis.
struct ElementsIndex {
  int rank = 0;
  int axis = 0;
  int64_t axis_dim = 0;
  int64_t idx_dims[kMaxRank] = {};
  int64_t data_strides[kMaxRank] = {};
};
// y[i] = data[offset(i)] for the n elements of indices, elements of 4 bytes, or 8 when
// `eight_bytes` (moved as bits). An index out of [-axis_dim, axis_dim) writes 0 and sets bit 1
// of *error_flag (only ever set, as Gather's).
cudaError_t LaunchGatherElements(bool eight_bytes, const void* data, const int64_t* indices,
                                 void* y, const ElementsIndex& index, int64_t n,
                                 int32_t* error_flag, cudaStream_t stream);

// The scatters' reductions, in the order of gpu_lowering.h's ScatterReduction.
enum class ScatterKernel : int { kNone, kAdd, kMul, kMax, kMin };
// ScatterND's index tuples: `tuples` tuples of k int64 coordinates into data's first k
// dims, each naming a slice of `slice` contiguous elements.
// GatherND (ONNX, with batch_dims): data viewed as [batches, d0..d(k-1), slice], indices as
// [batches, per_batch, k] int64 tuples (negatives count from the end); y[b, t, j] =
// data[b, tuple(b, t), j]. A tuple out of range writes zeros and sets bit 1 of *error_flag.
struct GatherNdIndex {
  int k = 0;
  int64_t dims[kMaxRank] = {};
  int64_t per_batch = 0, slice = 0, batch_stride = 0;
};
cudaError_t LaunchGatherNd(bool eight_bytes, const void* data, const int64_t* indices, void* y,
                           const GatherNdIndex& index, int64_t n, int32_t* error_flag,
                           cudaStream_t stream);

struct ScatterNdIndex {
  int k = 0;
  int64_t dims[kMaxRank] = {};
  int64_t tuples = 0;
  int64_t slice = 0;
};
// The scatters, fp32, into y, which already holds the data (the caller copies it in): the
// update at position e (row-major in `updates`; for ScatterND e = tuple * slice + j) goes to
// the element its index names, combined under `op`. kNone: where several updates name one
// element, the last one (the largest e) writes it, as the CPU engine's loop leaves it; this
// takes `last`, int32 scratch of y_elements, and two passes (the first records each
// element's largest e with atomicMax). kAdd and kMul are atomic, in no fixed order; kMax
// and kMin keep y when the update is not larger (smaller), as std::max and std::min. An
// index out of range skips its update and sets bit 1 of *error_flag. e must fit int32.
cudaError_t LaunchScatterElementsF32(ScatterKernel op, const int64_t* indices, const float* updates,
                                     float* y, int32_t* last, int64_t y_elements,
                                     const ElementsIndex& index, int64_t n, int32_t* error_flag,
                                     cudaStream_t stream);
cudaError_t LaunchScatterNdF32(ScatterKernel op, const int64_t* indices, const float* updates,
                               float* y, int32_t* last, int64_t y_elements,
                               const ScatterNdIndex& index, int32_t* error_flag,
                               cudaStream_t stream);

// CumSum of x viewed as [outer, dim, inner] along the middle axis, fp32 or int64 (when
// `int64_data`), one thread per line summing in the CPU engine's order (so bit for bit):
// `exclusive` leaves the element itself out, `reverse` sums from the end.
cudaError_t LaunchCumSum(bool int64_data, const void* x, void* y, int64_t outer, int64_t dim,
                         int64_t inner, bool exclusive, bool reverse, cudaStream_t stream);

// Trilu of `mats` matrices of rows x cols elements of 4 bytes, or 8 when `eight_bytes`:
// y keeps x where column - row >= k (upper) or <= k (lower), 0 elsewhere.
cudaError_t LaunchTrilu(bool eight_bytes, const void* x, void* y, int64_t mats, int64_t rows,
                        int64_t cols, int64_t k, bool upper, cudaStream_t stream);

// Recurrent operators (ONNX RNN, GRU, LSTM), one step of one direction at a time, as the CPU
// engine's RecurrentLoop computes it (engine/internal/recurrent.h has the layouts). The
// products are GEMMs around these: xw, every step's input times W with the biases that add
// (all but a linear-before-reset GRU's R bias of the h gate, `rbh`), and hr, the state
// times R before each step. The activations are ONNX's, in RnnActivation::Kind's order:
// Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu,
// Softsign, Softplus.
struct RnnActivationKernel {
  int kind = 1;  // Tanh
  float alpha = 0.f, beta = 0.f;
};
struct RnnGeometry {
  int cell = 0;  // 0 RNN (gates 1), 1 GRU (3: z, r, h), 2 LSTM (4: i, o, f, c)
  int64_t seq = 0, batch = 0, hidden = 0, dirs = 1;
  int64_t dir = 0;           // the direction this step runs
  bool backwards = false;    // this direction runs last step first
  bool batch_first = false;  // ONNX layout 1
  bool linear_before_reset = false;
  bool input_forget = false;   // LSTM
  float clip = 0.f;            // > 0: gate inputs clamped to [-clip, clip]
  int64_t step = 0;            // the step's place in this direction's order, 0..seq-1
  RnnActivationKernel act[3];  // RNN f; GRU f, g; LSTM f, g, h
};
// state [batch, hidden] = direction g.dir's rows of `initial` (ONNX's [dirs, batch, hidden],
// or [batch, dirs, hidden] in layout 1), or zeros when initial is null.
cudaError_t LaunchRnnStateIn(const float* initial, float* state, const RnnGeometry& g,
                             cudaStream_t stream);
// Direction g.dir's rows of `out` (as `initial` above) = state [batch, hidden].
cudaError_t LaunchRnnStateOut(const float* state, float* out, const RnnGeometry& g,
                              cudaStream_t stream);
// A GRU without linear-before-reset, before its h gate's product: for each row of the batch
// that takes this step, z = f(xw_z + hr_z) is kept in xw's z columns and rh = f(xw_r + hr_r)
// * h is written (zeros for rows past their length). hr is [batch, 2 * hidden].
cudaError_t LaunchGruReset(const RnnGeometry& g, float* xw, const float* hr, const float* h,
                           const int32_t* sequence_lens, float* rh, cudaStream_t stream);
// The step: for each row of the batch whose length (sequence_lens, or seq when null) covers
// it, h (and an LSTM's c) updated in place and written to y at the step's time (y may be
// null). hr: [batch, hr_ld], the state's products (a GRU without linear-before-reset: z and r
// gates, its h gate's in hr_h [batch, hidden]). rbh: a linear-before-reset GRU's R bias of
// the h gate (hidden values, or null); peepholes: an LSTM's [3 * hidden] (i, o, f), or null.
// A length outside [0, seq] sets bit 8 of *error_flag and leaves its row alone.
cudaError_t LaunchRnnCell(const RnnGeometry& g, const float* xw, const float* hr, int64_t hr_ld,
                          const float* hr_h, const float* rbh, const float* peepholes,
                          const int32_t* sequence_lens, float* h, float* c, float* y,
                          int32_t* error_flag, cudaStream_t stream);

}  // namespace shoal::engine::cuda::internal
