// Layer normalisation on a CUDA stream, as ONNX LayerNormalization over the last axis (the
// form transformers use; the CPU engine's ops/norm.cc). fp32, dense row-major, in device
// memory; the shape is validated on the host first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "core/status.h"
#include "engine/cuda/elementwise.h"

namespace shoal::engine::cuda {

// y = (x - mean) / sqrt(variance + epsilon) * scale + bias over the last of `dims`, scale
// and bias holding dims.back() values (bias may be null). x and y may be the same buffer.
// With `half` (null: none), y is also written rounded to `half_type` there, in the same pass
// (a mixed-precision plan's next product reads it). InvalidArgument for no dimensions, a
// negative one, epsilon <= 0, or a half that overlaps x or y.
Status LayerNormLastAxis(const float* x, const float* scale, const float* bias, float* y,
                         std::span<const int64_t> dims, float epsilon, cudaStream_t stream,
                         void* half = nullptr, RoundTo half_type = HalfType::kFp16);

}  // namespace shoal::engine::cuda
