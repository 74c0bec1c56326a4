#include "server/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace shoal::server {

// One mapping (system) or one opened CUDA IPC handle. A system window starts `skew` bytes
// into its mapping, because mmap offsets must be page-aligned.
struct SharedMemoryManager::Region {
  SharedMemoryRegionStatus status;  // a CUDA region: name and byte_size
  void* mapping = MAP_FAILED;
  size_t mapping_bytes = 0;
  size_t skew = 0;
  std::shared_ptr<const DeviceMemory> device;  // set for a CUDA region
  int64_t device_id = -1;

  char* data() const { return static_cast<char*>(mapping) + skew; }
  ~Region() {
    if (mapping != MAP_FAILED) munmap(mapping, mapping_bytes);
  }
};

namespace {

std::string Quoted(const std::string& name) { return "'" + name.substr(0, 128) + "'"; }

Status UnknownRegion(const std::string& name) {
  return InvalidArgument("Unable to find system shared memory region: " + Quoted(name));
}

Status UnknownCudaRegion(const std::string& name) {
  return InvalidArgument("Unable to find cuda shared memory region: " + Quoted(name));
}

Status NameTaken(const std::string& name) {
  return AlreadyExists("shared memory region " + Quoted(name) +
                       " is already registered; unregister it first");
}

}  // namespace

Status SharedMemoryManager::Register(const std::string& name, const std::string& key,
                                     uint64_t offset, uint64_t byte_size) {
  if (name.empty()) return InvalidArgument("shared memory region name must not be empty");
  if (key.empty()) {
    return InvalidArgument("shared memory region " + Quoted(name) + ": key must not be empty");
  }
  if (byte_size == 0) {
    return InvalidArgument("shared memory region " + Quoted(name) + ": byte_size must be > 0");
  }
  {
    MutexLock lock(&mu_);
    if (regions_.count(name) != 0) return NameTaken(name);
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return InvalidArgument("Unable to open shared memory region " + Quoted(name) + " (key " +
                           Quoted(key) + "): " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return InvalidArgument("shared memory region " + Quoted(name) + ": " + std::strerror(err));
  }
  const uint64_t object_bytes = static_cast<uint64_t>(st.st_size);
  if (offset > object_bytes || byte_size > object_bytes - offset) {
    close(fd);
    return InvalidArgument("shared memory region " + Quoted(name) + ": offset " +
                           std::to_string(offset) + " + byte_size " + std::to_string(byte_size) +
                           " is past the end of " + Quoted(key) + " (" +
                           std::to_string(object_bytes) + " bytes)");
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  auto region = std::make_shared<Region>();
  region->status = {name, key, offset, byte_size};
  region->skew = static_cast<size_t>(offset % page);
  region->mapping_bytes = static_cast<size_t>(byte_size) + region->skew;
  region->mapping = mmap(nullptr, region->mapping_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                         static_cast<off_t>(offset - region->skew));
  const int err = errno;
  close(fd);
  if (region->mapping == MAP_FAILED) {
    return InvalidArgument("Unable to map shared memory region " + Quoted(name) + ": " +
                           std::strerror(err));
  }
  MutexLock lock(&mu_);
  // try_emplace leaves `region` with the caller when the name is taken, so it is unmapped
  // outside the lock.
  if (!regions_.try_emplace(name, std::move(region)).second) return NameTaken(name);
  return Status::Ok();
}

bool SharedMemoryManager::CudaSupported() const {
  MutexLock lock(&mu_);
  return static_cast<bool>(opener_);
}

void SharedMemoryManager::SetDeviceMemoryOpener(DeviceMemoryOpener opener) {
  MutexLock lock(&mu_);
  opener_ = std::move(opener);
}

Status SharedMemoryManager::RegisterCuda(const std::string& name, std::string_view raw_handle,
                                         int64_t device_id, uint64_t byte_size) {
  if (name.empty()) return InvalidArgument("shared memory region name must not be empty");
  if (byte_size == 0) {
    return InvalidArgument("cuda shared memory region " + Quoted(name) + ": byte_size must be > 0");
  }
  if (device_id < 0) {
    return InvalidArgument("cuda shared memory region " + Quoted(name) +
                           ": device_id must be >= 0; was " + std::to_string(device_id));
  }
  DeviceMemoryOpener opener;
  {
    MutexLock lock(&mu_);
    if (regions_.count(name) != 0) return NameTaken(name);
    opener = opener_;
  }
  if (!opener) {
    return FailedPrecondition(
        "CUDA shared memory is not supported: this shoal was built without the CUDA path "
        "(docs/gpu.md); use system shared memory, /v2/systemsharedmemory");
  }
  // Opened outside the lock: the driver call may take a while.
  auto device = opener(raw_handle, device_id, byte_size);
  if (!device.ok()) return device.status().WithPrefix("cuda shared memory region " + Quoted(name));
  if (*device == nullptr)
    return Internal("cuda shared memory region " + Quoted(name) + ": the opener gave nothing");
  auto region = std::make_shared<Region>();
  region->status.name = name;
  region->status.byte_size = byte_size;
  region->device = std::move(device).value();
  region->device_id = device_id;
  MutexLock lock(&mu_);
  // As in Register: a region that lost a race for its name is closed outside the lock.
  if (!regions_.try_emplace(name, std::move(region)).second) return NameTaken(name);
  cuda_regions_.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

void SharedMemoryManager::RemoveRegions(const std::string& name, bool cuda) {
  // Unmapped or closed outside the lock, unless a request still holds them.
  std::vector<std::shared_ptr<const Region>> removed;
  MutexLock lock(&mu_);
  for (auto it = regions_.begin(); it != regions_.end();) {
    const bool match =
        (name.empty() || it->first == name) && (it->second->device != nullptr) == cuda;
    if (match) {
      if (cuda) cuda_regions_.fetch_sub(1, std::memory_order_relaxed);
      removed.push_back(std::move(it->second));
      it = regions_.erase(it);
    } else {
      ++it;
    }
  }
}

Status SharedMemoryManager::Unregister(const std::string& name) {
  RemoveRegions(name, /*cuda=*/false);
  return Status::Ok();
}

Status SharedMemoryManager::UnregisterCuda(const std::string& name) {
  RemoveRegions(name, /*cuda=*/true);
  return Status::Ok();
}

StatusOr<std::vector<CudaSharedMemoryRegionStatus>> SharedMemoryManager::GetCudaStatus(
    const std::string& name) const {
  std::vector<CudaSharedMemoryRegionStatus> out;
  MutexLock lock(&mu_);
  for (const auto& [n, region] : regions_) {
    if (!region->device || (!name.empty() && n != name)) continue;
    out.push_back({n, region->device_id, region->status.byte_size});
  }
  if (!name.empty() && out.empty()) return UnknownCudaRegion(name);
  return out;
}

StatusOr<std::vector<SharedMemoryRegionStatus>> SharedMemoryManager::GetStatus(
    const std::string& name) const {
  std::vector<SharedMemoryRegionStatus> out;
  MutexLock lock(&mu_);
  if (!name.empty()) {
    auto it = regions_.find(name);
    if (it == regions_.end() || it->second->device) return UnknownRegion(name);
    out.push_back(it->second->status);
    return out;
  }
  for (const auto& [n, region] : regions_)
    if (!region->device) out.push_back(region->status);
  return out;
}

StatusOr<SharedMemoryView> SharedMemoryManager::View(const SharedMemoryRef& ref,
                                                     const std::string& field) const {
  std::shared_ptr<const Region> region;
  {
    MutexLock lock(&mu_);
    auto it = regions_.find(ref.region);
    if (it == regions_.end()) return UnknownRegion(ref.region).WithPrefix(field);
    region = it->second;
  }
  const uint64_t size = region->status.byte_size;
  if (ref.offset > size || ref.byte_size > size - ref.offset) {
    return InvalidArgument(field + ": shared_memory_offset " + std::to_string(ref.offset) +
                           " + shared_memory_byte_size " + std::to_string(ref.byte_size) +
                           " is past the end of shared memory region " + Quoted(ref.region) + " (" +
                           std::to_string(size) + " bytes)");
  }
  SharedMemoryView view;
  view.size = static_cast<size_t>(ref.byte_size);
  if (region->device) {
    view.device = region->device.get();
    view.device_offset = ref.offset;
  } else {
    view.data = region->data() + ref.offset;
  }
  view.owner = std::move(region);
  return view;
}

StatusOr<Tensor> SharedMemoryManager::InputTensor(const SharedMemoryRef& ref, DataType dtype,
                                                  const Shape& shape,
                                                  const std::string& field) const {
  ASSIGN_OR_RETURN(SharedMemoryView view, View(ref, field));
  ASSIGN_OR_RETURN(const int64_t elements,
                   ElementCount(shape, std::numeric_limits<int64_t>::max()));
  if (view.device != nullptr) {
    // Device memory: copied to the host first, then checked as system memory would be.
    if (dtype != DataType::kBytes) {
      const uint64_t want = static_cast<uint64_t>(elements) * DataTypeSize(dtype);
      if (view.size != want) {
        return InvalidArgument(field + ": shared_memory_byte_size is " + std::to_string(view.size) +
                               " bytes but shape " + ShapeToString(shape) + " of " +
                               std::string(DataTypeName(dtype)) + " needs " + std::to_string(want));
      }
    }
    Tensor from_device = Tensor::AllocateUninitialized(dtype, shape, view.size);
    if (view.size > 0) {
      RETURN_IF_ERROR(
          view.device->CopyToHost(view.device_offset, from_device.mutable_data(), view.size)
              .WithPrefix(field + ": cuda shared memory region " + Quoted(ref.region)));
    }
    if (dtype == DataType::kBytes) {
      auto scanned = ScanBytesElements(
          std::string_view(static_cast<const char*>(from_device.data()), view.size), elements);
      if (!scanned.ok()) return scanned.status().WithPrefix(field + ": shared memory");
    }
    return from_device;
  }
  if (dtype == DataType::kBytes) {
    auto scanned = ScanBytesElements(std::string_view(view.data, view.size), elements);
    if (!scanned.ok()) return scanned.status().WithPrefix(field + ": shared memory");
  } else {
    const uint64_t want = static_cast<uint64_t>(elements) * DataTypeSize(dtype);
    if (view.size != want) {
      return InvalidArgument(field + ": shared_memory_byte_size is " + std::to_string(view.size) +
                             " bytes but shape " + ShapeToString(shape) + " of " +
                             std::string(DataTypeName(dtype)) + " needs " + std::to_string(want));
    }
  }
  const size_t align = std::min<size_t>(std::max<size_t>(DataTypeSize(dtype), 1), 8);
  if (reinterpret_cast<uintptr_t>(view.data) % align == 0) {
    auto buffer = Buffer::Wrap(view.data, view.size, std::move(view.owner));
    return Tensor(dtype, shape, std::move(buffer), 0, view.size);
  }
  Tensor copy = Tensor::AllocateUninitialized(dtype, shape, view.size);
  if (view.size > 0) std::memcpy(copy.mutable_data(), view.data, view.size);
  return copy;
}

Status WriteToSharedMemory(const SharedMemoryView& view, const Tensor& tensor,
                           const std::string& output) {
  if (tensor.byte_size() > view.size) {
    return InvalidArgument("output '" + output + "' needs " + std::to_string(tensor.byte_size()) +
                           " bytes but its shared_memory_byte_size is " +
                           std::to_string(view.size));
  }
  if (tensor.byte_size() == 0) return Status::Ok();
  if (view.device != nullptr) {
    return view.device->CopyFromHost(view.device_offset, tensor.data(), tensor.byte_size())
        .WithPrefix("output '" + output + "'");
  }
  std::memcpy(view.data, tensor.data(), tensor.byte_size());
  return Status::Ok();
}

}  // namespace shoal::server
