// Batch I/O: the one adapter between requests and batches.
//
// ValidateRequest checks a request against the model's signature before anything is
// allocated for it, and yields its batch size and shape bucket. MergeInputs builds a
// backend ExecuteRequest from several requests (concatenating each input along the
// first dimension, or passing tensors through untouched for a batch of one).
// ScatterOutputs splits the backend's batched outputs back into per-request views
// that share the output buffers (no copies).
//
// The batcher knows nothing about tensors; this file is where tensors meet batches.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "runtime/infer_request.h"

namespace shoal::runtime {

struct ModelSignature {
  int64_t max_batch_size = 0;  // > 0: inputs and outputs carry a leading batch dimension
  std::vector<backends::TensorSpec> inputs;
  std::vector<backends::TensorSpec> outputs;
  // Per input: the per-item shape the backend sees instead of `dims` (Triton's reshape).
  std::map<std::string, Shape> input_reshape;
};

struct RequestLimits {
  int64_t max_elements_per_tensor = int64_t{1} << 28;  // 256 Mi elements
  int64_t max_inputs = 64;
};

struct ValidatedRequest {
  int64_t batch_size = 1;  // items, 1 for a model without batching
  // A 64-bit hash of what must match for requests to share a batch (each input's shape
  // past the batch dimension, the precision variant): the batcher's bucket. Unequal keys
  // never share a batch; equal keys usually may, but two different shapes can hash alike
  // (a client can even make them: a zero dimension lets the others take any value), so
  // whoever merges a bucket checks SameBatchShape first.
  uint64_t shape_key = 0;
};

// Errors are INVALID_ARGUMENT naming the input and what is wrong.
StatusOr<ValidatedRequest> ValidateRequest(const ModelSignature& sig, const InferRequest& request,
                                           const RequestLimits& limits = {});

// True when `a` and `b` (both validated) may run in one batch: the same inputs given,
// each with the same shape past the batch dimension, and the same precision variant.
bool SameBatchShape(const ModelSignature& sig, const InferRequest& a, const InferRequest& b);

// `requests` all passed validation and share a shape key. INTERNAL, merging nothing, when
// they are not all SameBatchShape (their keys collided).
StatusOr<backends::ExecuteRequest> MergeInputs(const ModelSignature& sig,
                                               const std::vector<const InferRequest*>& requests,
                                               const std::vector<int64_t>& batch_sizes);

// Splits outputs by `batch_sizes` (sum = first dimension of each output), keeping for
// each request only the outputs it asked for (all when it named none), in the
// model's output order. INTERNAL when an output's first dimension is wrong.
StatusOr<std::vector<std::vector<NamedTensor>>> ScatterOutputs(
    const ModelSignature& sig, std::vector<NamedTensor> outputs,
    const std::vector<const InferRequest*>& requests, const std::vector<int64_t>& batch_sizes);

}  // namespace shoal::runtime
