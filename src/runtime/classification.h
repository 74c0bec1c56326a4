// Triton's classification extension: instead of an output's raw scores, the client asks
// for its top K classes (output parameter `classification: K`) and gets, per batch row,
// K BYTES strings "<score>:<index>" or "<score>:<index>:<label>", highest score first.
// Labels come from the output's `label_filename` in the model config: a file in the
// model's folder with one label per line, line i naming class i.
//
// Server::Infer applies it to the answer after the model (and the response cache) ran,
// so the cache holds raw scores and one cached answer serves any K.
//
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace shoal::runtime {

// Labels of one output, shared by every answer that uses them.
using OutputLabels = std::shared_ptr<const std::vector<std::string>>;

// Reads a label file: one label per line ('\n' or "\r\n"), a missing final newline
// allowed. INVALID_ARGUMENT naming the path when it cannot be read or exceeds 64 MiB.
StatusOr<OutputLabels> ReadLabelFile(const std::string& path);

// The top `k` classes of `scores` per row. `batched`: the first dimension is the batch
// (rows), the rest are the classes of a row; otherwise the whole tensor is one row.
// K larger than the classes in a row is reduced to that count (as Triton does). The
// result is BYTES of shape [batch, K'] (batched) or [K'] (not). Ties keep the lower index
// first. `labels` may be null; an index past the labels gets no label.
// FP16 and BF16 scores are read as the floats they encode. INVALID_ARGUMENT when k < 1,
// when `scores` is BYTES, or has no class dimension.
StatusOr<Tensor> Classify(const Tensor& scores, int64_t k, bool batched,
                          const std::vector<std::string>* labels);

// One classified output of a response: the score's text as Triton writes it (C++'s
// std::to_string of the value, e.g. "0.750000"; integers as integers).
std::string ClassificationEntry(double score, DataType type, int64_t index,
                                const std::vector<std::string>* labels);

}  // namespace shoal::runtime
