#include "engine/cuda/ipc_memory.h"

#include <cstring>

#include "engine/cuda/cuda_status.h"

namespace shoal::engine::cuda {

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
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(memory->device_), "cudaSetDevice"));
  const cudaError_t opened =
      cudaIpcOpenMemHandle(&memory->data_, handle, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    memory->data_ = nullptr;
    (void)cudaGetLastError();
    return InvalidArgument(std::string("cudaIpcOpenMemHandle refused the handle: ") +
                           cudaGetErrorName(opened) + ": " + cudaGetErrorString(opened));
  }
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&memory->stream_, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags"));
  return std::shared_ptr<const IpcMemory>(std::move(memory));
}

IpcMemory::~IpcMemory() {
  if (data_ == nullptr && stream_ == nullptr) return;
  (void)cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (data_ != nullptr) cudaIpcCloseMemHandle(data_);
}

Status IpcMemory::Copy(uint64_t offset, void* host, size_t n, bool to_host) const {
  if (offset > byte_size_ || n > byte_size_ - offset) {
    return InvalidArgument("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                           ") are past the region's " + std::to_string(byte_size_));
  }
  if (n == 0) return Status::Ok();
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  char* device = static_cast<char*>(data_) + offset;
  // Asynchronous on the window's stream, then waited for: a plain cudaMemcpy from pageable
  // memory may return before the device holds the bytes, and the client reads them as soon
  // as it has the response.
  const cudaError_t queued =
      to_host ? cudaMemcpyAsync(host, device, n, cudaMemcpyDeviceToHost, stream_)
              : cudaMemcpyAsync(device, host, n, cudaMemcpyHostToDevice, stream_);
  const cudaError_t waited = cudaStreamSynchronize(stream_);
  RETURN_IF_ERROR(CudaStatus(queued, "cudaMemcpyAsync"));
  return CudaStatus(waited, "cudaStreamSynchronize");
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
