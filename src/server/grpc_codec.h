// gRPC codec: converts between the inference protocol's protobuf messages
// (grpc_service.proto) and the runtime's types. Pure functions with no network and no
// server state, so every rule of docs/open-inference-protocol.md sections 3.3 and 4.4
// is unit-tested here (grpc_codec_test.cc).
//
// Requests (InferRequestFromProto):
//   - Each input takes its data from its typed `contents` or from the next unused
//     `raw_input_contents` entry (section 3.3); mixing the two in one request, a missing
//     entry or a left-over entry is INVALID_ARGUMENT.
//   - Shapes are checked with ElementCount against RequestLimits, and against the data
//     size, before anything is allocated; every error is INVALID_ARGUMENT and names the
//     input (or parameter, or output).
//   - Zero copy: a raw input becomes a Tensor that views the message's own bytes and
//     keeps the message alive through the buffer's owner. Raw data that is not aligned
//     to its element size is copied (to an aligned buffer) instead. Typed contents are
//     always copied and narrowed (INT8 from int_contents, ...) with range checks.
//   - Request parameters: `priority` (uint64_param or non-negative int64_param) and
//     `timeout` (microseconds, int64_param or uint64_param) go to InferRequest fields;
//     sequence_* parameters are type-checked and otherwise ignored (no sequence
//     batching); `triton_enable_empty_final_response`, `headers` and
//     `binary_data_output` are dropped; any other `triton_*` key is rejected; the rest
//     go to InferRequest::parameters.
//   - Shared memory (Triton's extension): an input with shared_memory_region /
//     shared_memory_byte_size (/ shared_memory_offset) parameters is read from the
//     registered region (a view when aligned, bounds-checked); an output with them is
//     resolved before the request runs and written there by InferResponseToProto, which
//     then answers its parameters and an empty raw_output_contents entry. Without a
//     SharedMemoryManager they are INVALID_ARGUMENT.
//   - An output parameter `classification` (int64/uint64 >= 1) goes to
//     InferRequest::classification.
// Responses (InferResponseToProto): one raw_output_contents entry per output, in
// output order, always present (empty for a zero-size tensor); typed contents never.
//
// Thread safety: every function is re-entrant.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "proto/grpc_service.pb.h"
#include "runtime/batch_io.h"
#include "runtime/infer_request.h"
#include "runtime/model_stats.h"
#include "server/shared_memory.h"

namespace shoal::server {

// A model version as the protocol writes it: "" means "let the server choose" (-1);
// otherwise decimal digits only (Triton's rule), at most 18 of them.
StatusOr<int64_t> ParseModelVersion(std::string_view version);

// Builds the runtime request from a received message. `message` is shared because raw
// inputs view its bytes; the caller must not modify it afterwards.
StatusOr<runtime::InferRequest> InferRequestFromProto(
    std::shared_ptr<inference::ModelInferRequest> message, const runtime::RequestLimits& limits);

// Outputs a request asked to receive in shared memory: name -> (where, its window).
using SharedMemoryOutputs = std::map<std::string, std::pair<SharedMemoryRef, SharedMemoryView>>;

// The same with the shared-memory extension: inputs may come from `shared_memory`'s
// regions and the outputs to write there are resolved into *shared_memory_outputs.
StatusOr<runtime::InferRequest> InferRequestFromProto(
    std::shared_ptr<inference::ModelInferRequest> message, const runtime::RequestLimits& limits,
    const SharedMemoryManager* shared_memory, SharedMemoryOutputs* shared_memory_outputs);

// Fills `out` (expected empty) from an OK response.
void InferResponseToProto(const runtime::InferResponse& response,
                          inference::ModelInferResponse* out);
// The same, writing the outputs of `shared_memory` there; INVALID_ARGUMENT when one does
// not fit its window.
Status InferResponseToProto(const runtime::InferResponse& response,
                            const SharedMemoryOutputs& shared_memory,
                            inference::ModelInferResponse* out);

// The gRPC status for a shoal status, through server/status_map (the one table).
grpc::Status ToGrpcStatus(const Status& status);

// Model metadata from a signature (section 1.5): shapes start with -1 when the model
// batches. `versions` are the ready versions to list.
void ModelMetadataToProto(const std::string& name, const std::vector<int64_t>& versions,
                          const std::string& platform, const runtime::ModelSignature& signature,
                          inference::ModelMetadataResponse* out);

// Every field perf_analyzer reads (section 4.1) is filled, zero when unused.
void ModelStatisticsToProto(const std::string& name, int64_t version,
                            const runtime::ModelStatsSnapshot& stats,
                            inference::ModelStatistics* out);

}  // namespace shoal::server
