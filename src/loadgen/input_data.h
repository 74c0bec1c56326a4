// Input data for shoal bench's requests (--input-data random|zero|FILE), encoded once
// before the load starts as raw little-endian bytes per input (BYTES elements as a
// 4-byte length and the bytes), ready for HTTP binary tensors and gRPC
// raw_input_contents.
//
// FILE is JSON in perf_analyzer's format,
//   {"data": [{"INPUT0": [1, 2, 3, ...], "INPUT1": [...]}, {...}, ...]}
// or one such entry alone, {"INPUT0": [...]}. Each entry gives every input's values for
// ONE batch element, flat (or nested, which is flattened) in row-major order, or as
// {"content": [...], "shape": [...]} where shape (without the batch axis) must equal the
// resolved one. BYTES inputs take strings. With -b N the entry is repeated N times. The
// entries become distinct payloads, used round-robin by the requests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "loadgen/model_info.h"

namespace shoal::loadgen {

struct InputTensor {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;  // full, batch axis included
  std::string data;            // raw bytes
};
using Payload = std::vector<InputTensor>;

// inputs: ResolveInputs' output; batched: the model batches (max_batch_size > 0), so
// every shape starts with the batch axis, batch_size long. source: "random", "zero" or a
// file path.
StatusOr<std::vector<Payload>> MakePayloads(const std::vector<TensorInfo>& inputs,
                                            const std::string& source, bool batched,
                                            int64_t batch_size, uint64_t seed);

// The same from a JSON text (the contents of FILE); for tests.
StatusOr<std::vector<Payload>> PayloadsFromJson(const std::vector<TensorInfo>& inputs,
                                                std::string_view json, bool batched,
                                                int64_t batch_size);

}  // namespace shoal::loadgen
