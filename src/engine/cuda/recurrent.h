// The recurrent operators' element-wise steps on the GPU (ONNX RNN, GRU, LSTM): the state
// copied in and out, a GRU's reset gate, and one step of a cell. The products between them
// (every step's input times W, the state times R) are cuBLASLt GEMMs (gemm.h); a GPU plan
// chains them (gpu_lowering.h, docs/gpu.md). Each checks the geometry, then launches the
// kernel kernels.h describes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"
#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda {

using RnnGeometry = internal::RnnGeometry;
using RnnActivationKernel = internal::RnnActivationKernel;

// InvalidArgument for a cell other than 0-2, negative sizes, one or two directions not
// holding `dir`, a step outside [0, seq) (when seq > 0), or an activation kind outside the
// eleven ONNX lists.
Status CheckRnnGeometry(const RnnGeometry& g);

// See kernels.h for each.
Status RnnStateIn(const float* initial, float* state, const RnnGeometry& g, cudaStream_t stream);
Status RnnStateOut(const float* state, float* out, const RnnGeometry& g, cudaStream_t stream);
Status GruReset(const RnnGeometry& g, float* xw, const float* hr, const float* h,
                const int32_t* sequence_lens, float* rh, cudaStream_t stream);
Status RnnCell(const RnnGeometry& g, const float* xw, const float* hr, int64_t hr_ld,
               const float* hr_h, const float* rbh, const float* peepholes,
               const int32_t* sequence_lens, float* h, float* c, float* y, int32_t* error_flag,
               cudaStream_t stream);

}  // namespace shoal::engine::cuda
