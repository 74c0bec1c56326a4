#include "engine/cuda/cuda_status.h"

#include <string>

namespace shoal::engine::cuda {

bool ContextLost(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorContained:
    case cudaErrorExternalDevice:
    case cudaErrorMpsClientTerminated:
    case cudaErrorTensorMemoryLeak:
      return true;
    default:
      return false;
  }
}

Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return Status();
  std::string message =
      std::string(what) + ": " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error);
  if (ContextLost(error)) {
    message +=
        " (this process's context on the GPU is lost: every later call on it fails; restart "
        "the server)";
  }
  switch (error) {
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(std::move(message));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return Unavailable(std::move(message));
    default:
      return Internal(std::move(message));
  }
}

Status CublasStatus(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status();
  std::string message = std::string(what) + ": " + cublasLtGetStatusName(status) + ": " +
                        cublasLtGetStatusString(status);
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return ResourceExhausted(std::move(message));
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return Unimplemented(std::move(message));
    case CUBLAS_STATUS_INVALID_VALUE:
      return InvalidArgument(std::move(message));
    default:
      return Internal(std::move(message));
  }
}

}  // namespace shoal::engine::cuda
