#include "engine/cuda/ipc_memory.h"

#include <cuda.h>

#include <cstring>

#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device.h"

namespace shoal::engine::cuda {
namespace {

// The driver's cuMemGetAddressRange (CUDA 12's ABI), reached through the runtime so that
// nothing links libcuda; null where the driver does not give it.
using AddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr pointer);
AddressRangeFn AddressRange() {
  static const AddressRangeFn fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return AddressRangeFn{nullptr};
    }
    return reinterpret_cast<AddressRangeFn>(entry);
  }();
  return fn;
}

}  // namespace

StatusOr<std::shared_ptr<const IpcMemory>> IpcMemory::Open(std::string_view raw_handle,
                                                           int64_t device, uint64_t byte_size) {
  cudaIpcMemHandle_t handle;
  if (raw_handle.size() != sizeof(handle)) {
    return InvalidArgument("raw_handle must be a cudaIpcMemHandle_t of " +
                           std::to_string(sizeof(handle)) + " bytes; was " +
                           std::to_string(raw_handle.size()));
  }
  std::memcpy(&handle, raw_handle.data(), sizeof(handle));
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount")
                      .WithPrefix("no usable CUDA device"));
  if (device < 0 || device >= count) {
    return InvalidArgument("device_id " + std::to_string(device) + ": this machine has " +
                           std::to_string(count) + " GPU" + (count == 1 ? "" : "s"));
  }
  std::shared_ptr<IpcMemory> memory(new IpcMemory());
  memory->device_ = static_cast<int>(device);
  memory->byte_size_ = byte_size;
  DeviceScope scope(memory->device_);
  RETURN_IF_ERROR(scope.status());
  const cudaError_t opened =
      cudaIpcOpenMemHandle(&memory->data_, handle, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    memory->data_ = nullptr;
    (void)cudaGetLastError();
    const std::string why =
        std::string(cudaGetErrorName(opened)) + ": " + cudaGetErrorString(opened);
    if (opened == cudaErrorMemoryAllocation)
      return ResourceExhausted("mapping the handle's memory: " + why);
    return InvalidArgument("cudaIpcOpenMemHandle refused the handle: " + why);
  }
  if (AddressRangeFn range = AddressRange()) {
    CUdeviceptr base = 0;
    size_t size = 0;
    const auto at = reinterpret_cast<CUdeviceptr>(memory->data_);
    if (range(&base, &size, at) == CUDA_SUCCESS) {
      const uint64_t available = static_cast<uint64_t>(base + size - at);
      if (byte_size > available) {
        return InvalidArgument("byte_size " + std::to_string(byte_size) +
                               " is larger than the shared allocation (" +
                               std::to_string(available) + " bytes from the handle's address)");
      }
    }
  }
  return std::shared_ptr<const IpcMemory>(std::move(memory));
}

IpcMemory::~IpcMemory() {
  if (data_ == nullptr) return;
  DeviceScope scope(device_);
  cudaIpcCloseMemHandle(data_);
}

Status IpcMemory::Copy(uint64_t offset, void* host, size_t n, bool to_host) const {
  if (offset > byte_size_ || n > byte_size_ - offset) {
    return InvalidArgument("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                           ") are past the region's " + std::to_string(byte_size_));
  }
  if (n == 0) return Status::Ok();
  DeviceScope scope(device_);
  RETURN_IF_ERROR(scope.status());
  char* device = static_cast<char*>(data_) + offset;
  // Asynchronous on this thread's own stream, then waited for: a plain cudaMemcpy from
  // pageable memory may return before the device holds the bytes, and the client reads
  // them as soon as it has the response.
  const cudaError_t queued =
      to_host ? cudaMemcpyAsync(host, device, n, cudaMemcpyDeviceToHost, cudaStreamPerThread)
              : cudaMemcpyAsync(device, host, n, cudaMemcpyHostToDevice, cudaStreamPerThread);
  const cudaError_t waited = cudaStreamSynchronize(cudaStreamPerThread);
  const cudaError_t failed = queued != cudaSuccess ? queued : waited;
  if (failed == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  // (An illegal address is not the client's alone to answer for: it loses the context,
  // which CudaStatus says.)
  if (failed == cudaErrorInvalidValue) {
    return InvalidArgument(std::string("copying the region's memory failed (has the client freed "
                                       "it?): ") +
                           cudaGetErrorName(failed) + ": " + cudaGetErrorString(failed));
  }
  return CudaStatus(failed, "copying the region's memory");
}

Status IpcMemory::CopyToHost(uint64_t offset, void* dst, size_t n) const {
  return Copy(offset, dst, n, /*to_host=*/true);
}

Status IpcMemory::CopyFromHost(uint64_t offset, const void* src, size_t n) const {
  return Copy(offset, const_cast<void*>(src), n, /*to_host=*/false);
}

StatusOr<std::string> ExportIpcHandle(const void* device_pointer) {
  cudaIpcMemHandle_t handle;
  RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&handle, const_cast<void*>(device_pointer)),
                             "cudaIpcGetMemHandle"));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

DeviceMemoryOpener IpcMemoryOpener() {
  return [](std::string_view raw_handle, int64_t device,
            uint64_t byte_size) -> StatusOr<std::shared_ptr<const DeviceMemory>> {
    ASSIGN_OR_RETURN(auto memory, IpcMemory::Open(raw_handle, device, byte_size));
    return std::shared_ptr<const DeviceMemory>(std::move(memory));
  };
}

}  // namespace shoal::engine::cuda
