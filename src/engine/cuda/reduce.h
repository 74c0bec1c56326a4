// Reductions over contiguous axes on a CUDA stream: ReduceSum, ReduceMean and ReduceMax
// over axes that sit next to each other (a sequence's mean pooling, a sum over the last
// axis), as ONNX defines them (the CPU engine's ops/reduce.cc). Dense row-major fp32 in
// device memory; keepdims changes only the output's shape, not its bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "core/status.h"
#include "engine/cuda/elementwise.h"

namespace shoal::engine::cuda {

// kSumSquare: the sum of squares; kL2: its square root (ONNX ReduceSumSquare, ReduceL2).
enum class ReduceOp { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL2 };

// y = op over axes [first, first + count) of x's `dims`; y holds the product of the other
// dimensions. With `half` (null: none), y is also written rounded to `half_type` there, in
// the same pass (a mixed-precision plan's next product reads it), and y may be null (16
// bits alone). InvalidArgument when the axes fall outside dims, count < 1, a reduced axis is
// empty (no identity for kMax or kMean), there is no output at all, or half overlaps x or y.
Status ReduceAxes(ReduceOp op, const float* x, float* y, std::span<const int64_t> dims,
                  int64_t first, int64_t count, cudaStream_t stream, void* half = nullptr,
                  RoundTo half_type = HalfType::kFp16);

// ArgMax (is_max) or ArgMin along `axis` of x's `dims`: y holds the int64 position of the
// first extreme (the last with `last`) for every other index, as the CPU engine finds it.
// InvalidArgument for an axis outside dims or an empty one.
Status ArgExtreme(bool is_max, bool last, const float* x, int64_t* y, std::span<const int64_t> dims,
                  int64_t axis, cudaStream_t stream);

// TopK along `axis` of x's `dims`: the k largest (smallest without `largest`) values and
// their int64 positions, sorted, equal values by the lower position (as the CPU engine
// sorts; a NaN's place is not defined), into `values` and `indices`, either of which may be
// null. InvalidArgument for an axis outside dims or k outside [1, the axis's length].
Status TopK(const float* x, float* values, int64_t* indices, std::span<const int64_t> dims,
            int64_t axis, int64_t k, bool largest, cudaStream_t stream);

}  // namespace shoal::engine::cuda
