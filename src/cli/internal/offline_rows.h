// The files of an offline job (`shoal run`, offline_job.h): where its rows come from and
// where its results go. Private to the job; see offline_job.h for the formats.
//
// RowSource reads row i of .npy, .npz or .jsonl inputs as tensors shaped for the model
// (converting numeric types, e.g. numpy's float64 into an FP32 input); a malformed row is
// an INVALID_ARGUMENT naming the row's problem. RowSink writes row i's outputs (.jsonl,
// .npy) or its error; Write is INVALID_ARGUMENT when this row's outputs cannot be
// written in the format (the job counts it as the row's failure) and another error
// when the file cannot be written. Neither is thread-safe: the job calls them under its
// lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "runtime/server.h"

namespace shoal::cli::internal {

bool EndsWith(const std::string& s, const std::string& suffix);

class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual int64_t rows() const = 0;
  virtual StatusOr<std::vector<NamedTensor>> Row(int64_t i) = 0;
  // The size and XXH3-128 (hex) of the bytes the rows are read from, hashed as the file
  // was read, so they describe exactly what this job computes from.
  uint64_t content_bytes() const { return content_bytes_; }
  const std::string& content_hash() const { return content_hash_; }

 protected:
  uint64_t content_bytes_ = 0;
  std::string content_hash_;
};

// By the path's extension: .npy (a single-input model), .npz, .jsonl. Values convert to
// the model's types only when they keep their value (a float into an integer input must
// be whole, a number into FP32 within its range); otherwise the row is malformed.
StatusOr<std::unique_ptr<RowSource>> OpenSource(const std::string& path,
                                                const runtime::ModelSignature& sig);

class RowSink {
 public:
  virtual ~RowSink() = default;
  virtual Status Write(int64_t i, const std::vector<NamedTensor>& outputs) = 0;
  virtual Status WriteError(int64_t i, const Status& status) = 0;
};

// One JSON line per row, appended to (`append`) or replacing the file.
StatusOr<std::unique_ptr<RowSink>> OpenJsonlSink(const std::string& path, bool append);
// The files a sink for `path` writes: the path itself for .jsonl and for a single-output
// model's .npy, else <stem>.<OUTPUT>.npy per output.
std::vector<std::string> OutputFiles(const std::string& path, const runtime::ModelSignature& sig);
// One .npy per output (OutputFiles), `rows` long, opened on the first row written (when
// `resume`, reopened and checked); errors go to <path>.errors.jsonl, which is started
// afresh unless `resume`.
std::unique_ptr<RowSink> MakeNpySink(std::string path, runtime::ModelSignature sig, int64_t rows,
                                     bool resume);

}  // namespace shoal::cli::internal
