// A client's device memory opened in this process through a CUDA IPC handle: what the
// server's CUDA shared-memory regions (server/shared_memory.h) read inputs from and write
// outputs to. The client allocates the memory (cudaMalloc), exports it with
// cudaIpcGetMemHandle and sends the handle's 64 bytes; cudaIpcOpenMemHandle maps the same
// memory here. A handle cannot be opened by the process that exported it.
//
// The driver does not say how large the exported allocation is: the window's byte_size
// is the client's word, as in Triton, and copies are checked against it only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/device_memory.h"
#include "core/status.h"

namespace shoal::engine::cuda {

class IpcMemory : public DeviceMemory {
 public:
  // Opens `raw_handle` (sizeof(cudaIpcMemHandle_t) bytes) on GPU `device`, a window of
  // `byte_size` bytes. INVALID_ARGUMENT for a handle of another size, a GPU the machine
  // lacks, or a handle the driver refuses (with its words); UNAVAILABLE without a usable
  // device.
  static StatusOr<std::shared_ptr<const IpcMemory>> Open(std::string_view raw_handle,
                                                         int64_t device, uint64_t byte_size);
  ~IpcMemory() override;
  IpcMemory(const IpcMemory&) = delete;
  IpcMemory& operator=(const IpcMemory&) = delete;

  // Synchronous copies on the window's own stream; INVALID_ARGUMENT past the window's end.
  Status CopyToHost(uint64_t offset, void* dst, size_t n) const override;
  Status CopyFromHost(uint64_t offset, const void* src, size_t n) const override;

  uint64_t byte_size() const { return byte_size_; }

 private:
  IpcMemory() = default;
  Status Copy(uint64_t offset, void* host, size_t n, bool to_host) const;

  int device_ = 0;
  void* data_ = nullptr;
  uint64_t byte_size_ = 0;
  cudaStream_t stream_ = nullptr;
};

// The bytes of the IPC handle of `device_pointer`, an allocation of this process
// (cudaIpcGetMemHandle): what a client sends to register a CUDA shared-memory region.
StatusOr<std::string> ExportIpcHandle(const void* device_pointer);

// IpcMemory::Open as the opener SharedMemoryManager takes.
DeviceMemoryOpener IpcMemoryOpener();

}  // namespace shoal::engine::cuda
