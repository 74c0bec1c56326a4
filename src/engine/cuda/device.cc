#include "engine/cuda/device.h"

#include <cstdio>
#include <utility>

#include "engine/cuda/cuda_status.h"

namespace shoal::engine::cuda {

StatusOr<std::vector<DeviceInfo>> ListDevices() {
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (count == 0) return Unavailable("cudaGetDeviceCount: the driver reports no CUDA device");
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, i),
                               "cudaGetDeviceProperties of device " + std::to_string(i)));
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    devices.push_back(std::move(info));
  }
  return devices;
}

std::string Describe(const DeviceInfo& device) {
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB",
                static_cast<double>(device.memory_bytes) / (1024.0 * 1024.0 * 1024.0));
  return std::to_string(device.index) + ": " + device.name + ", compute " +
         std::to_string(device.compute_major) + "." + std::to_string(device.compute_minor) + ", " +
         std::to_string(device.multiprocessors) + " SMs, " + memory;
}

DeviceScope::DeviceScope(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&buffer.data_, bytes),
                             "cudaMalloc of " + std::to_string(bytes) + " bytes"));
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  void* data = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&data, bytes, cudaHostAllocDefault),
                             "cudaHostAlloc of " + std::to_string(bytes) + " bytes"));
  buffer.data_ = static_cast<char*>(data);
  buffer.bytes_ = bytes;
  return buffer;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

StatusOr<Stream> Stream::Create() {
  Stream stream;
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags"));
  return stream;
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Status Stream::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes, const Stream& stream) {
  return CudaStatus(
      cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream.get()),
      "cudaMemcpyAsync host to device of " + std::to_string(bytes) + " bytes");
}

Status CopyToHost(void* host_dst, const void* device_src, size_t bytes, const Stream& stream) {
  return CudaStatus(
      cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream.get()),
      "cudaMemcpyAsync device to host of " + std::to_string(bytes) + " bytes");
}

}  // namespace shoal::engine::cuda
