// The CUDA devices this process can use, and the device-side resources the engine's GPU
// path owns: device memory and streams, each released by its destructor.
//
// Thread-safety: ListDevices may be called from any thread. A DeviceBuffer or Stream is
// owned by one instance at a time (moved, never shared); work queued on a stream is
// ordered on it, and the caller synchronises before it reads results on the host.
// Everything here acts on the calling thread's current device (cudaSetDevice).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace shoal::engine::cuda {

struct DeviceInfo {
  int index = 0;          // CUDA's ordinal, as `gpus: [ ... ]` in a model's config
  std::string name;       // e.g. "NVIDIA H100 80GB HBM3"
  int compute_major = 0;  // compute capability, e.g. 9.0 for Hopper
  int compute_minor = 0;
  int multiprocessors = 0;
  int64_t memory_bytes = 0;  // total global memory
};

// Every device the driver reports. Unavailable, with CUDA's reason, when there is none
// or no driver (a machine without a GPU, or a toolkit newer than the driver).
StatusOr<std::vector<DeviceInfo>> ListDevices();
// "0: NVIDIA H100 80GB HBM3, compute 9.0, 132 SMs, 79.1 GiB".
std::string Describe(const DeviceInfo& device);

// A block of device memory (cudaMalloc), freed when destroyed. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` of device memory on the current device; ResourceExhausted when the device
  // has not that much free. Zero bytes gives an empty buffer without allocating.
  static StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size_bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (cudaHostAlloc): copies between it and the device run as DMA,
// asynchronously, and can be captured into a CUDA graph; pageable memory's cannot.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // Zero bytes gives an empty buffer without allocating.
  static StatusOr<PinnedBuffer> Allocate(size_t bytes);
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  char* data() const { return data_; }
  size_t size_bytes() const { return bytes_; }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

// A CUDA stream that does not synchronise with the legacy default stream, destroyed
// with the object. Move-only.
class Stream {
 public:
  static StatusOr<Stream> Create();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  cudaStream_t get() const { return stream_; }
  // Waits for everything queued so far; the first error of any of it.
  Status Synchronize() const;

 private:
  Stream() = default;
  cudaStream_t stream_ = nullptr;
};

// Makes `device` current on this thread for the scope, then restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  // cudaSetDevice's outcome.
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

// Queue copies on `stream`. From or to host memory that is not pinned, CUDA may run them
// synchronously with respect to the host or not: the caller synchronises the stream
// before it reads a copy's destination on the host or reuses its source. The serving
// path will stage through pinned buffers.
// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (never when either is empty):
// the kernels' wrappers refuse buffers that one thread's read and another's write share.
inline bool BytesOverlap(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes, const Stream& stream);
Status CopyToHost(void* host_dst, const void* device_src, size_t bytes, const Stream& stream);

}  // namespace shoal::engine::cuda
