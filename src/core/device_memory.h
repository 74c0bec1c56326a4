// Device memory that a client on the same machine shares with the server: Triton's CUDA
// shared-memory extension registers a CUDA IPC handle, which the server opens in its own
// process and then reads inputs from and writes outputs to. The front ends keep the
// regions (server/shared_memory.h) but know nothing of CUDA: the build that has the CUDA
// path supplies an opener (backends/onnx/gpu_instance.h, CudaIpcOpener), and a build
// without one has none, so registration is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "core/status.h"

namespace shoal {

// An opened window of device memory. Copies are synchronous; any thread may call them.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Copies `n` bytes at `offset` into host memory `dst`.
  virtual Status CopyToHost(uint64_t offset, void* dst, size_t n) const = 0;
  // Copies `n` bytes of host memory `src` to `offset`.
  virtual Status CopyFromHost(uint64_t offset, const void* src, size_t n) const = 0;
};

// Opens `raw_handle` (the bytes of a cudaIpcMemHandle_t) on GPU `device_id`, a window of
// `byte_size` bytes from its start. INVALID_ARGUMENT for a handle of the wrong size, a GPU
// the machine lacks, a handle the driver refuses (with the driver's words) or a window past
// the allocation; RESOURCE_EXHAUSTED or UNAVAILABLE when the device cannot map it.
using DeviceMemoryOpener = std::function<StatusOr<std::shared_ptr<const DeviceMemory>>(
    std::string_view raw_handle, int64_t device_id, uint64_t byte_size)>;

}  // namespace shoal
