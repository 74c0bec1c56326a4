// ModelInfo: what shoal bench learns about a model before sending load (the metadata's
// inputs and the config's max_batch_size), and ResolveInputs, which turns it plus -b and
// --shape into the exact shape of every input of a request.
//
// Shapes follow the Triton rules clients depend on: when max_batch_size > 0 the
// metadata shapes start with a -1 batch axis, which -b fills; -1 dims elsewhere must be
// given with --shape NAME:DIMS (dims without the batch axis).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "loadgen/options.h"

namespace shoal::loadgen {

struct TensorInfo {
  std::string name;
  std::string datatype;        // protocol name: "FP32", "BYTES", ...
  std::vector<int64_t> shape;  // as in the metadata (-1: variable)
};

struct ModelInfo {
  std::string name;
  std::vector<TensorInfo> inputs;
  std::vector<TensorInfo> outputs;
  int64_t max_batch_size = 0;
};

// Parses the HTTP model metadata JSON and the max_batch_size of the model config JSON
// (a number or a numeric string; absent means 0).
StatusOr<ModelInfo> ParseHttpModelInfo(std::string_view metadata_json,
                                       std::string_view config_json);

// Every input with its full request shape (batch axis first when the model batches).
// Errors name the input and say which --shape is missing or wrong.
StatusOr<std::vector<TensorInfo>> ResolveInputs(const ModelInfo& model,
                                                const std::vector<ShapeOverride>& shapes,
                                                int64_t batch_size);

std::string FormatShape(const std::vector<int64_t>& shape);

}  // namespace shoal::loadgen
