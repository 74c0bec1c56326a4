// CUDA and cuBLASLt error codes as shoal Statuses, with the library's own name and text
// for the code, so a log line says what failed and why ("cudaMalloc of 4096 bytes:
// cudaErrorMemoryAllocation: out of memory").
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "core/status.h"

namespace shoal::engine::cuda {

// Whether `error` is one of CUDA's sticky errors (an illegal address, a kernel that faulted,
// a hardware error): the process's context on that device is lost, and every later call
// on it fails the same way until the process ends.
bool ContextLost(cudaError_t error);

// OK for cudaSuccess. Otherwise: ResourceExhausted for out-of-memory, Unavailable when
// there is no device or no (recent enough) driver, Internal for the rest; the message
// is "<what>: <error name>: <error text>", and for a sticky error (ContextLost) says so,
// and that the server must be restarted.
Status CudaStatus(cudaError_t error, std::string_view what);
// OK for CUBLAS_STATUS_SUCCESS; ResourceExhausted for CUBLAS_STATUS_ALLOC_FAILED,
// Unimplemented for CUBLAS_STATUS_NOT_SUPPORTED, InvalidArgument for
// CUBLAS_STATUS_INVALID_VALUE, Internal for the rest.
Status CublasStatus(cublasStatus_t status, std::string_view what);

}  // namespace shoal::engine::cuda
