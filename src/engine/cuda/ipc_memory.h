// A client's device memory opened in this process through a CUDA IPC handle: what the
// server's CUDA shared-memory regions (server/shared_memory.h) read inputs from and write
// outputs to. The client allocates the memory (cudaMalloc), exports it with
// cudaIpcGetMemHandle and sends the handle's 64 bytes; cudaIpcOpenMemHandle maps the same
// memory here. A handle cannot be opened by the process that exported it.
//
// The window's byte_size is the client's word, as in Triton; Open checks it against the
// allocation the handle names (cuMemGetAddressRange, through the runtime's driver entry
// point) where the driver answers, so a window cannot reach past the client's memory, and
// every copy is checked against it. Each call makes the handle's GPU current and restores
// the caller's device, and copies run on the calling thread's own stream, so threads do
// not wait for each other's copies.
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
  // lacks, a handle the driver refuses (with its words) or a window larger than the
  // allocation; RESOURCE_EXHAUSTED when the device has no memory left to map it;
  // UNAVAILABLE without a usable device.
  static StatusOr<std::shared_ptr<const IpcMemory>> Open(std::string_view raw_handle,
                                                         int64_t device, uint64_t byte_size);
  ~IpcMemory() override;
  IpcMemory(const IpcMemory&) = delete;
  IpcMemory& operator=(const IpcMemory&) = delete;

  // Synchronous copies; INVALID_ARGUMENT past the window's end, or when the driver says the
  // memory is no longer valid (the client freed it), with its words.
  Status CopyToHost(uint64_t offset, void* dst, size_t n) const override;
  Status CopyFromHost(uint64_t offset, const void* src, size_t n) const override;

  uint64_t byte_size() const { return byte_size_; }

 private:
  IpcMemory() = default;
  Status Copy(uint64_t offset, void* host, size_t n, bool to_host) const;

  int device_ = 0;
  void* data_ = nullptr;
  uint64_t byte_size_ = 0;
};

// The bytes of the IPC handle of `device_pointer`, an allocation of this process
// (cudaIpcGetMemHandle): what a client sends to register a CUDA shared-memory region.
StatusOr<std::string> ExportIpcHandle(const void* device_pointer);

// IpcMemory::Open as the opener SharedMemoryManager takes.
DeviceMemoryOpener IpcMemoryOpener();

}  // namespace shoal::engine::cuda
