#include "server/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace shoal::server {

// One mapping. The window the client registered starts `skew` bytes into the mapping,
// because mmap offsets must be page-aligned.
struct SharedMemoryManager::Region {
  SharedMemoryRegionStatus status;
  void* mapping = MAP_FAILED;
  size_t mapping_bytes = 0;
  size_t skew = 0;

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
    if (regions_.count(name) != 0) {
      return AlreadyExists("shared memory region " + Quoted(name) +
                           " is already registered; unregister it first");
    }
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
  if (!regions_.emplace(name, std::move(region)).second) {
    return AlreadyExists("shared memory region " + Quoted(name) +
                         " is already registered; unregister it first");
  }
  return Status::Ok();
}

Status SharedMemoryManager::Unregister(const std::string& name) {
  std::map<std::string, std::shared_ptr<const Region>> removed;  // unmapped outside the lock
  MutexLock lock(&mu_);
  if (name.empty()) {
    removed.swap(regions_);
  } else if (auto it = regions_.find(name); it != regions_.end()) {
    removed.emplace(it->first, std::move(it->second));
    regions_.erase(it);
  }
  return Status::Ok();
}

StatusOr<std::vector<SharedMemoryRegionStatus>> SharedMemoryManager::GetStatus(
    const std::string& name) const {
  std::vector<SharedMemoryRegionStatus> out;
  MutexLock lock(&mu_);
  if (!name.empty()) {
    auto it = regions_.find(name);
    if (it == regions_.end()) return UnknownRegion(name);
    out.push_back(it->second->status);
    return out;
  }
  for (const auto& [n, region] : regions_) out.push_back(region->status);
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
  view.data = region->data() + ref.offset;
  view.size = static_cast<size_t>(ref.byte_size);
  view.owner = std::move(region);
  return view;
}

StatusOr<Tensor> SharedMemoryManager::InputTensor(const SharedMemoryRef& ref, DataType dtype,
                                                  const Shape& shape,
                                                  const std::string& field) const {
  ASSIGN_OR_RETURN(SharedMemoryView view, View(ref, field));
  ASSIGN_OR_RETURN(const int64_t elements,
                   ElementCount(shape, std::numeric_limits<int64_t>::max()));
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
  if (tensor.byte_size() > 0) std::memcpy(view.data, tensor.data(), tensor.byte_size());
  return Status::Ok();
}

}  // namespace shoal::server
