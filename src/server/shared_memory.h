// System shared memory regions for Triton's shared-memory extension: a local client
// creates a POSIX shared memory object (shm_open), registers a window of it under a
// name, and then passes inputs and receives outputs through it instead of in request
// and response bodies (docs/protocol-extensions.md).
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

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

// Where a tensor lives in a region: Triton's `shared_memory_region`,
// `shared_memory_offset` (default 0) and `shared_memory_byte_size` parameters.
struct SharedMemoryRef {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// A resolved window of a registered region. `owner` keeps the mapping alive.
struct SharedMemoryView {
  char* data = nullptr;
  size_t size = 0;
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
  // Removes `name` (empty: every region). A name not registered is a success, as in
  // Triton. Requests in flight keep their mapping.
  Status Unregister(const std::string& name);
  // The region `name`, or every region when empty, sorted by name. An unknown name is
  // INVALID_ARGUMENT "Unable to find system shared memory region: 'x'" (Triton's words).
  StatusOr<std::vector<SharedMemoryRegionStatus>> GetStatus(const std::string& name) const;

  // The window [ref.offset, ref.offset + ref.byte_size) of a registered region.
  // INVALID_ARGUMENT naming `field` when the region is unknown or the window does not
  // fit in it.
  StatusOr<SharedMemoryView> View(const SharedMemoryRef& ref, const std::string& field) const;

  // An input tensor of `dtype` and `shape` read from `ref`: a view of the shared memory
  // (zero copy) when aligned for the type, else a copy. The byte size must match the
  // shape exactly (BYTES: well-formed length-prefixed elements filling it).
  StatusOr<Tensor> InputTensor(const SharedMemoryRef& ref, DataType dtype, const Shape& shape,
                               const std::string& field) const;

 private:
  struct Region;
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const Region>> regions_ GUARDED_BY(mu_);
};

// Copies `tensor`'s bytes to the start of `view`. INVALID_ARGUMENT naming `output` when
// they do not fit.
Status WriteToSharedMemory(const SharedMemoryView& view, const Tensor& tensor,
                           const std::string& output);

}  // namespace shoal::server
