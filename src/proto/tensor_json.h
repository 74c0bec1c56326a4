// The JSON encoding of tensor data, one for every writer in shoal: the HTTP front end's
// `data` arrays (Open Inference Protocol, docs/open-inference-protocol.md section 1.9)
// and `shoal run`'s .jsonl output.
//
// AppendTensorJsonData appends the tensor's elements as one flat JSON array, in
// row-major order:
//   BOOL             true / false (any non-zero byte is true)
//   integer types    exact decimal integers, INT64 and UINT64 included (no detour
//                    through double)
//   FP32, FP64       shortest round-trip decimal (std::to_chars); NaN and the
//                    infinities as NaN / Infinity / -Infinity, as JsonWriter writes them
//   BYTES            JSON strings; each element must be valid UTF-8
// FP16 and BF16 have no JSON form here, and BYTES that are not UTF-8 cannot be carried:
// both are INVALID_ARGUMENT, and a tensor whose byte size does not match its shape is
// INTERNAL. Messages are predicates ("is FP16, which has no JSON form"), for the caller
// to prefix with what the tensor is ("output 'y' ") and suffix with how to get it
// another way. On error `out` may hold a partial array.
#pragma once

#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace shoal::proto {

Status AppendTensorJsonData(const Tensor& tensor, std::string* out);

}  // namespace shoal::proto
