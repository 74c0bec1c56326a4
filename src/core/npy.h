// NumPy .npy and .npz files, for `shoal run`.
//
// Reading: NpyArray views an .npy file's data (mapped, not copied) with its dtype and
// shape; ReadNpz reads every array of an .npz archive (stored or deflated members, as
// numpy.savez and numpy.savez_compressed write them). C order only; big-endian data and
// Fortran order are rejected with a message.
// Writing: NpyWriter creates an .npy file of a known shape up front and writes rows at
// their offsets, so rows may arrive in any order and a job can resume.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace shoal {

struct NpyArray {
  DataType dtype = DataType::kInvalid;
  Shape shape;
  std::shared_ptr<Buffer> data;  // C-order elements
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  size_t row_bytes() const;
  // Row i as a tensor of shape [1, ...] sharing the data.
  Tensor Row(int64_t i) const;
};

// The file's bytes, mapped read-only (not copied). NOT_FOUND when it cannot be opened,
// INVALID_ARGUMENT when it is empty. A caller that must know what it read (a hash of the
// input, say) maps the file once and hashes and parses the same bytes.
StatusOr<std::shared_ptr<Buffer>> MapFile(const std::string& path);
// Parses the bytes of an .npy file (the header and the data after it).
StatusOr<NpyArray> ParseNpy(std::shared_ptr<Buffer> file, const std::string& name_for_errors);
StatusOr<NpyArray> ReadNpy(const std::string& path);
// Arrays by name ("x.npy" in the archive is named "x"); the stored ones view `file`.
StatusOr<std::map<std::string, NpyArray>> ParseNpz(std::shared_ptr<Buffer> file,
                                                   const std::string& name_for_errors);
StatusOr<std::map<std::string, NpyArray>> ReadNpz(const std::string& path);

// The .npy header for `dtype` and `shape` (version 1.0, padded to 64 bytes).
StatusOr<std::string> NpyHeader(DataType dtype, const Shape& shape);

// Writes `arrays` as an uncompressed .npz archive (what numpy.savez writes), each as
// "<name>.npy". Calibration inputs and tests use it.
Status WriteNpz(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& arrays);

class NpyWriter {
 public:
  // Creates (or, when `resume`, reopens and checks) an .npy file of this dtype and shape.
  static StatusOr<std::unique_ptr<NpyWriter>> Open(const std::string& path, DataType dtype,
                                                   Shape shape, bool resume);
  ~NpyWriter();
  // Writes `bytes` (exactly one row) at row `index`.
  Status WriteRow(int64_t index, const void* bytes, size_t size);
  Status Flush();
  size_t row_bytes() const { return row_bytes_; }

 private:
  NpyWriter() = default;
  int fd_ = -1;
  size_t header_bytes_ = 0;
  size_t row_bytes_ = 0;
  int64_t rows_ = 0;
  std::string path_;
};

}  // namespace shoal
