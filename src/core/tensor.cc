#include "core/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace shoal {

StatusOr<int64_t> ElementCount(std::span<const int64_t> shape, int64_t max_elements) {
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) {
      return InvalidArgument("dimension " + std::to_string(i) + " is negative (" +
                             std::to_string(d) + ") in shape " + ShapeToString(shape));
    }
    if (d != 0 && count > max_elements / d) {
      return InvalidArgument("shape " + ShapeToString(shape) + " has more than " +
                             std::to_string(max_elements) + " elements");
    }
    count *= d;
  }
  if (count > max_elements) {
    return InvalidArgument("shape " + ShapeToString(shape) + " has more than " +
                           std::to_string(max_elements) + " elements");
  }
  return count;
}

std::string ShapeToString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

namespace {

std::atomic<int64_t> zeroed_bytes{0};

// An aligned allocation of at least `bytes`, whose padding past `bytes` is zeroed.
void* AllocateAligned(size_t bytes, size_t* rounded_out) {
  // aligned_alloc needs a size that is a multiple of the alignment, and a non-zero one.
  const size_t rounded =
      std::max<size_t>(Buffer::kAlignment,
                       (bytes + Buffer::kAlignment - 1) / Buffer::kAlignment * Buffer::kAlignment);
  void* p = std::aligned_alloc(Buffer::kAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(static_cast<char*>(p) + bytes, 0, rounded - bytes);
  *rounded_out = rounded;
  return p;
}

}  // namespace

std::shared_ptr<Buffer> Buffer::Allocate(size_t bytes) {
  size_t rounded = 0;
  void* p = AllocateAligned(bytes, &rounded);
  std::memset(p, 0, bytes);
  zeroed_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return std::shared_ptr<Buffer>(new Buffer(p, bytes, /*owned=*/true, nullptr));
}

std::shared_ptr<Buffer> Buffer::AllocateUninitialized(size_t bytes) {
  size_t rounded = 0;
  void* p = AllocateAligned(bytes, &rounded);
  return std::shared_ptr<Buffer>(new Buffer(p, bytes, /*owned=*/true, nullptr));
}

int64_t Buffer::zeroed_bytes_total() { return zeroed_bytes.load(std::memory_order_relaxed); }

std::shared_ptr<Buffer> Buffer::Wrap(void* data, size_t bytes, std::shared_ptr<const void> owner) {
  return std::shared_ptr<Buffer>(new Buffer(data, bytes, /*owned=*/false, std::move(owner)));
}

Buffer::~Buffer() {
  if (owned_) std::free(data_);
}

Tensor Tensor::Allocate(DataType type, Shape shape, size_t bytes) {
  auto buffer = Buffer::Allocate(bytes);
  return Tensor(type, std::move(shape), std::move(buffer), 0, bytes);
}

Tensor Tensor::AllocateUninitialized(DataType type, Shape shape, size_t bytes) {
  auto buffer = Buffer::AllocateUninitialized(bytes);
  return Tensor(type, std::move(shape), std::move(buffer), 0, bytes);
}

Tensor Tensor::Allocate(DataType type, Shape shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = static_cast<size_t>(n) * DataTypeSize(type);
  return Allocate(type, std::move(shape), bytes);
}

Tensor::Tensor(DataType type, Shape shape, std::shared_ptr<Buffer> buffer, size_t offset,
               size_t bytes)
    : dtype_(type),
      shape_(std::move(shape)),
      buffer_(std::move(buffer)),
      offset_(offset),
      byte_size_(bytes) {}

Tensor Tensor::FromStrings(Shape shape, const std::vector<std::string>& values) {
  size_t bytes = 0;
  for (const auto& v : values) bytes += 4 + v.size();
  Tensor t = Allocate(DataType::kBytes, std::move(shape), bytes);
  char* out = static_cast<char*>(t.mutable_data());
  for (const auto& v : values) {
    const uint32_t len = static_cast<uint32_t>(v.size());
    std::memcpy(out, &len, 4);  // little-endian host (x86-64, aarch64)
    std::memcpy(out + 4, v.data(), v.size());
    out += 4 + v.size();
  }
  return t;
}

int64_t Tensor::element_count() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

StatusOr<Tensor> Tensor::SliceRows(int64_t begin, int64_t end) const {
  if (shape_.empty()) return InvalidArgument("cannot slice rows of a scalar tensor");
  if (begin < 0 || end < begin || end > shape_[0]) {
    return InvalidArgument("row range [" + std::to_string(begin) + "," + std::to_string(end) +
                           ") is outside the first dimension " + std::to_string(shape_[0]));
  }
  Shape shape = shape_;
  shape[0] = end - begin;
  if (dtype_ == DataType::kBytes) {
    ASSIGN_OR_RETURN(std::vector<size_t> offsets, ScanBytesElements(bytes(), element_count()));
    const int64_t per_row = shape_[0] == 0 ? 0 : element_count() / shape_[0];
    const size_t from = offsets[begin * per_row];
    const size_t to = offsets[end * per_row];
    return Tensor(dtype_, std::move(shape), buffer_, offset_ + from, to - from);
  }
  const size_t row_bytes = shape_[0] == 0 ? 0 : byte_size_ / shape_[0];
  return Tensor(dtype_, std::move(shape), buffer_, offset_ + begin * row_bytes,
                (end - begin) * row_bytes);
}

StatusOr<std::vector<size_t>> ScanBytesElements(std::string_view data, int64_t count) {
  std::vector<size_t> offsets;
  offsets.reserve(static_cast<size_t>(std::min<int64_t>(count, data.size() / 4)) + 1);
  size_t pos = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (data.size() - pos < 4) {
      return InvalidArgument("BYTES data ends before element " + std::to_string(i) + " of " +
                             std::to_string(count));
    }
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);
    if (data.size() - pos - 4 < len) {
      return InvalidArgument("BYTES element " + std::to_string(i) + " claims " +
                             std::to_string(len) + " bytes but only " +
                             std::to_string(data.size() - pos - 4) + " remain");
    }
    offsets.push_back(pos);
    pos += 4 + len;
  }
  if (pos != data.size()) {
    return InvalidArgument("BYTES data has " + std::to_string(data.size() - pos) +
                           " bytes after its " + std::to_string(count) + " elements");
  }
  offsets.push_back(pos);
  return offsets;
}

StatusOr<std::vector<std::string_view>> Tensor::BytesElements() const {
  if (dtype_ != DataType::kBytes) return InvalidArgument("tensor is not BYTES");
  ASSIGN_OR_RETURN(std::vector<size_t> offsets, ScanBytesElements(bytes(), element_count()));
  std::vector<std::string_view> out;
  std::string_view all = bytes();
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    out.push_back(all.substr(offsets[i] + 4, offsets[i + 1] - offsets[i] - 4));
  }
  return out;
}

}  // namespace shoal
