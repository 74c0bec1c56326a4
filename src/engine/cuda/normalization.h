// Layer normalisation on a CUDA stream, as ONNX LayerNormalization over the last axis (the
// form transformers use; the CPU engine's ops/norm.cc). fp32, dense row-major, in device
// memory; the shape is validated on the host first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "core/status.h"

namespace shoal::engine::cuda {

// y = (x - mean) / sqrt(variance + epsilon) * scale + bias over the last of `dims`, scale
// and bias holding dims.back() values (bias may be null). x and y may be the same buffer.
// InvalidArgument for no dimensions, a negative one, or epsilon <= 0.
Status LayerNormLastAxis(const float* x, const float* scale, const float* bias, float* y,
                         std::span<const int64_t> dims, float epsilon, cudaStream_t stream);

}  // namespace shoal::engine::cuda
