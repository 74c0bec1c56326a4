// Shared memory regions for Triton's shared-memory extensions: a local client creates a
// POSIX shared memory object (shm_open) and registers a window of it under a name (system
// shared memory), or registers a CUDA IPC handle of its device memory (CUDA shared
// memory), and then passes inputs and receives outputs through the region instead of in
// request and response bodies (docs/protocol-extensions.md). System and CUDA regions share
// one namespace, as in Triton; each extension's status and unregister see only its own.
//
// CUDA regions need an opener (core/device_memory.h), which a build with the CUDA path
// supplies (SetDeviceMemoryOpener); without one, RegisterCuda is FAILED_PRECONDITION.
// An input read from a CUDA region is copied to the host, and an output is copied to the
// device; a request holds the opened handle by shared ownership, like a mapping.
//
// SharedMemoryManager keeps the registered regions of one server process; the HTTP and
// gRPC front ends share one (serve.cc gives both the same). Register maps the window
// read/write (MAP_SHARED); a request that uses a region holds the mapping by shared
// ownership, so unregistering a region while requests use it only removes the name: the
// memory stays mapped until the last of them is answered.
//
// Threads: every method may be called from any thread. Lock: one mutex, never held
// across a system call other than a lookup.
//
// Errors are INVALID_ARGUMENT (HTTP 400), as in Triton, except a second registration of a
// name (ALREADY_EXISTS, HTTP 409); every message names the region.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/device_memory.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/tensor.h"

namespace shoal::server {

struct SharedMemoryRegionStatus {
  std::string name;
  std::string key;  // the shm_open name, e.g. "/input_data"
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

struct CudaSharedMemoryRegionStatus {
  std::string name;
  int64_t device_id = 0;
  uint64_t byte_size = 0;
};

// Where a tensor lives in a region: Triton's `shared_memory_region`,
// `shared_memory_offset` (default 0) and `shared_memory_byte_size` parameters.
struct SharedMemoryRef {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// A resolved window of a registered region: host memory at `data`, or, for a CUDA region,
// device memory at `device_offset` in `device` (data null). `owner` keeps the mapping or
// the opened handle alive.
struct SharedMemoryView {
  char* data = nullptr;
  size_t size = 0;
  const DeviceMemory* device = nullptr;
  uint64_t device_offset = 0;
  std::shared_ptr<const void> owner;
};

class SharedMemoryManager {
 public:
  SharedMemoryManager() = default;
  SharedMemoryManager(const SharedMemoryManager&) = delete;
  SharedMemoryManager& operator=(const SharedMemoryManager&) = delete;

  // Maps bytes [offset, offset + byte_size) of the shared memory object `key` under
  // `name`. INVALID_ARGUMENT: empty name or key, byte_size 0, the window past the
  // object's end, or an object that cannot be opened or mapped (with errno's text);
  // ALREADY_EXISTS: the name is registered (Triton's rule: unregister first).
  Status Register(const std::string& name, const std::string& key, uint64_t offset,
                  uint64_t byte_size);
  // Removes the system region `name` (empty: every system region). A name not registered
  // as one is a success, as in Triton. Requests in flight keep their mapping.
  Status Unregister(const std::string& name);
  // The system region `name`, or every system region when empty, sorted by name. An
  // unknown name is INVALID_ARGUMENT "Unable to find system shared memory region: 'x'"
  // (Triton's words).
  StatusOr<std::vector<SharedMemoryRegionStatus>> GetStatus(const std::string& name) const;

  // How CUDA regions are opened; set once, before the front ends serve.
  void SetDeviceMemoryOpener(DeviceMemoryOpener opener);
  // Whether CUDA regions can be registered (an opener is set): servers list the
  // cuda_shared_memory extension then.
  bool CudaSupported() const;
  // Whether any CUDA region is registered now. Cheap (no lock): the HTTP front end asks it
  // of every small request, to move those that may copy device memory off its loops.
  bool HasCudaRegions() const { return cuda_regions_.load(std::memory_order_relaxed) > 0; }
  // Opens `raw_handle` (a cudaIpcMemHandle_t's bytes) on GPU `device_id` as `name`, a
  // window of `byte_size` bytes. FAILED_PRECONDITION without an opener (a build without
  // the CUDA path); INVALID_ARGUMENT for an empty name, byte_size 0, a negative device or
  // what the opener refuses; ALREADY_EXISTS for a name registered (as either kind).
  Status RegisterCuda(const std::string& name, std::string_view raw_handle, int64_t device_id,
                      uint64_t byte_size);
  // UnregisterCuda and GetCudaStatus: Unregister and GetStatus for CUDA regions ("Unable to
  // find cuda shared memory region: 'x'").
  Status UnregisterCuda(const std::string& name);
  StatusOr<std::vector<CudaSharedMemoryRegionStatus>> GetCudaStatus(const std::string& name) const;

  // The window [ref.offset, ref.offset + ref.byte_size) of a registered region, of either
  // kind.
  // INVALID_ARGUMENT naming `field` when the region is unknown or the window does not
  // fit in it.
  StatusOr<SharedMemoryView> View(const SharedMemoryRef& ref, const std::string& field) const;

  // An input tensor of `dtype` and `shape` read from `ref`: a view of system shared
  // memory (zero copy) when aligned for the type, else a copy; a copy from a CUDA region.
  // The byte size must match the shape exactly (BYTES: well-formed length-prefixed
  // elements filling it).
  StatusOr<Tensor> InputTensor(const SharedMemoryRef& ref, DataType dtype, const Shape& shape,
                               const std::string& field) const;

 private:
  struct Region;
  // Removes the regions of one kind: `name`, or all of that kind when empty.
  void RemoveRegions(const std::string& name, bool cuda);
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const Region>> regions_ GUARDED_BY(mu_);
  DeviceMemoryOpener opener_ GUARDED_BY(mu_);
  std::atomic<int> cuda_regions_{0};
};

// Copies `tensor`'s bytes to the start of `view` (host or device). INVALID_ARGUMENT
// naming `output` when they do not fit.
Status WriteToSharedMemory(const SharedMemoryView& view, const Tensor& tensor,
                           const std::string& output);

}  // namespace shoal::server
