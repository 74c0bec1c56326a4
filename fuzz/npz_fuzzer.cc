// libFuzzer target: the NumPy reader behind `shoal run` (core/npy.h). An input that starts
// with the .npy magic goes through ParseNpy, anything else through ParseNpz (the zip
// directory walk, stored and deflated members, then ParseNpy on each member).
//
// Invariants (a violation traps): an accepted array's data holds exactly its shape's
// elements (with no overflow on the way), and all of it and every row is readable.
// The input is copied into an aligned buffer (as a mapped file is aligned) and, once, at
// an odd offset, so members land at every alignment.
//
//   cmake --build build-fuzz --target npz_fuzzer
//   build-fuzz/fuzz/npz_fuzzer fuzz/npz_corpus -max_len=65536
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "core/npy.h"

using namespace shoal;

namespace {

void Check(const NpyArray& a) {
  auto count = ElementCount(a.shape);
  if (!count.ok()) __builtin_trap();
  if (a.data == nullptr) __builtin_trap();
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(*count), DataTypeSize(a.dtype), &bytes))
    __builtin_trap();  // a shape whose bytes do not fit in memory was accepted
  if (a.data->size() != bytes) __builtin_trap();
  // Every byte must be readable (ASan reports a view past its memory).
  volatile uint8_t sink = 0;
  if (bytes > 0) {
    const auto* p = static_cast<const uint8_t*>(a.data->data());
    sink = sink + p[0] + p[bytes - 1];
  }
  const int64_t rows = a.rows();
  if (rows < 0) __builtin_trap();
  for (int64_t r = 0; r < rows && r < 64; ++r) {
    Tensor row = a.Row(r);
    if (row.byte_size() != a.row_bytes()) __builtin_trap();
    if (row.byte_size() > 0) sink = sink + static_cast<const uint8_t*>(row.data())[0];
  }
}

void ParseAt(const uint8_t* data, size_t size, size_t offset) {
  auto storage = Buffer::Allocate(size + offset);
  if (size > 0) std::memcpy(static_cast<char*>(storage->data()) + offset, data, size);
  auto file = Buffer::Wrap(static_cast<char*>(storage->data()) + offset, size, storage);
  if (size >= 6 && std::memcmp(data, "\x93NUMPY", 6) == 0) {
    auto a = ParseNpy(file, "fuzz.npy");
    if (a.ok()) Check(*a);
    return;
  }
  auto arrays = ParseNpz(file, "fuzz.npz");
  if (!arrays.ok()) return;
  for (const auto& entry : *arrays) Check(entry.second);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ParseAt(data, size, 0);
  ParseAt(data, size, 1);
  return 0;
}
