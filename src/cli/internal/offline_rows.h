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
};

// By the path's extension: .npy (a single-input model), .npz, .jsonl.
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
// One .npy per output (the path itself for a single output), `rows` long, opened on
// the first row written; errors go to <path>.errors.jsonl.
std::unique_ptr<RowSink> MakeNpySink(std::string path, runtime::ModelSignature sig, int64_t rows,
                                     bool resume);

}  // namespace shoal::cli::internal
