// Tensor: a data type, a shape and bytes, with shared ownership of the bytes.
//
// The bytes live in a Buffer: either an aligned allocation owned by the buffer, or a
// view into memory somebody else owns (a received HTTP body, a batch output), kept
// alive by a shared "owner" handle. Copying a Tensor copies the handle, never the data,
// which is how tensors pass between batcher, backend and pipeline steps without copies.
//
// BYTES tensors store each element as a 4-byte little-endian length followed by its
// bytes (Triton's layout), so they too are one contiguous buffer.
//
// Thread safety: a Tensor is a value; concurrent reads are safe. Writing through
// mutable_data() is for the tensor's producer before it is shared.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/data_type.h"
#include "core/status.h"

namespace shoal {

using Shape = std::vector<int64_t>;

// Number of elements, or an error when a dimension is negative or the product overflows
// or exceeds `max_elements`. Checked before any allocation that a client controls.
StatusOr<int64_t> ElementCount(std::span<const int64_t> shape, int64_t max_elements = INT64_MAX);
// "[2,3,4]"
std::string ShapeToString(std::span<const int64_t> shape);

class Buffer {
 public:
  static constexpr size_t kAlignment = 64;

  // A zero-initialised allocation of `bytes` (aligned to kAlignment).
  static std::shared_ptr<Buffer> Allocate(size_t bytes);
  // The same without zeroing its `bytes` (alignment padding past them is still zeroed):
  // for buffers that the caller overwrites in full at once (merges, copies), where
  // zeroing would touch every byte twice on the request path.
  static std::shared_ptr<Buffer> AllocateUninitialized(size_t bytes);
  // Bytes zeroed by Allocate in this process, so far (tests check that hot paths do not).
  static int64_t zeroed_bytes_total();
  // A view of [data, data + bytes) kept alive by `owner` (may be null for static data).
  static std::shared_ptr<Buffer> Wrap(void* data, size_t bytes, std::shared_ptr<const void> owner);

  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // True for an allocation of its own (Allocate), false for a view (Wrap), which keeps
  // its owner's memory alive, whatever its size.
  bool owns_data() const { return owned_; }

 private:
  Buffer(void* data, size_t size, bool owned, std::shared_ptr<const void> owner)
      : data_(data), size_(size), owned_(owned), owner_(std::move(owner)) {}
  void* data_;
  size_t size_;
  bool owned_;
  std::shared_ptr<const void> owner_;
};

class Tensor {
 public:
  Tensor() = default;
  // A new zero-filled tensor; for kBytes, `bytes` gives the serialized size.
  static Tensor Allocate(DataType type, Shape shape, size_t bytes);
  // A new tensor whose bytes are not initialised (Buffer::AllocateUninitialized): only
  // for a producer that writes all `bytes` before anyone reads them.
  static Tensor AllocateUninitialized(DataType type, Shape shape, size_t bytes);
  // Fixed-size types only: allocates ElementCount(shape) * DataTypeSize(type) bytes.
  static Tensor Allocate(DataType type, Shape shape);
  // A tensor over `bytes` bytes at `offset` in `buffer`.
  Tensor(DataType type, Shape shape, std::shared_ptr<Buffer> buffer, size_t offset, size_t bytes);

  // Convenience constructors for tests and warmup.
  template <typename T>
  static Tensor FromVector(DataType type, Shape shape, const std::vector<T>& values);
  static Tensor FromStrings(Shape shape, const std::vector<std::string>& values);

  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  size_t byte_size() const { return byte_size_; }
  bool empty() const { return buffer_ == nullptr; }
  // Elements in the tensor (product of the shape; shape is validated on construction).
  int64_t element_count() const;

  const void* data() const {
    return buffer_ ? static_cast<const char*>(buffer_->data()) + offset_ : nullptr;
  }
  void* mutable_data() { return buffer_ ? static_cast<char*>(buffer_->data()) + offset_ : nullptr; }
  template <typename T>
  std::span<const T> values() const {
    return {static_cast<const T*>(data()), byte_size_ / sizeof(T)};
  }
  template <typename T>
  std::span<T> mutable_values() {
    return {static_cast<T*>(mutable_data()), byte_size_ / sizeof(T)};
  }
  std::string_view bytes() const { return {static_cast<const char*>(data()), byte_size_}; }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }

  // Rows [begin, end) of the first dimension, as a view sharing this tensor's buffer.
  // Fixed-size types only; for kBytes use SplitBytesRows.
  StatusOr<Tensor> SliceRows(int64_t begin, int64_t end) const;

  // Decodes a kBytes tensor into its elements; error if the serialization is malformed.
  StatusOr<std::vector<std::string_view>> BytesElements() const;

 private:
  DataType dtype_ = DataType::kInvalid;
  Shape shape_;
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;
  size_t byte_size_ = 0;
};

// Checks that a kBytes serialization of `data` holds exactly `count` well-formed
// elements; returns the byte offset of each element's length prefix plus the end.
StatusOr<std::vector<size_t>> ScanBytesElements(std::string_view data, int64_t count);

template <typename T>
Tensor Tensor::FromVector(DataType type, Shape shape, const std::vector<T>& values) {
  Tensor t = Allocate(type, std::move(shape), values.size() * sizeof(T));
  std::copy(values.begin(), values.end(), t.mutable_values<T>().begin());
  return t;
}

}  // namespace shoal

namespace shoal {
// A tensor with the name it has in a request, a response or a model's signature.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};
}  // namespace shoal
