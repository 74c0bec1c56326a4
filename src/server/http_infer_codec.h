// The HTTP infer codec: request body -> runtime::InferRequest, and
// runtime::InferResponse -> HTTP response, per the Open Inference Protocol with Triton's
// binary tensor data extension (docs: open-inference-protocol.md sections 1.7-1.10, 2).
// No sockets and no runtime calls, so everything here is unit-tested and fuzzed alone.
//
// Request side, in the order a body meets it:
//   DecodeContentEncoding  gzip / deflate (zlib stream) / identity; the output is
//                          bounded by max_bytes (RESOURCE_EXHAUSTED past it: answer 413).
//   SplitBinaryBody        Inference-Header-Content-Length N: the first N bytes are JSON,
//                          the rest is the binary region. Absent: all JSON.
//   ParseInferRequest      JSON (simdjson On-Demand) -> InferRequest + how to encode
//                          each output. Binary inputs become views into the body when
//                          their bytes are aligned for their type (else a copy).
//   SliceBinaryRegion      cuts the binary region by the inputs' binary_data_size, which
//                          must add up to exactly its length.
// Every declared shape is checked (rank, sign, overflow, the element limit) and
// compared with the data it comes with BEFORE any tensor is allocated; a JSON `data`
// array can only cause an allocation once its element count was shown to fit in the
// JSON text itself. Errors are INVALID_ARGUMENT naming the field, e.g.
// "inputs[1].shape[0]: negative dimension -2"; the one exception is a decompressed
// body over the limit (RESOURCE_EXHAUSTED).
//
// Known leniency: On-Demand parsing does not validate JSON values the parser never
// visits (unknown members), so a malformed value under an unknown key can go unnoticed.
//
// Response side: SerializeInferResponse writes the JSON reply and appends binary outputs
// as zero-copy chunks that share the output tensors' buffers.
//
// Thread safety: all functions are reentrant (the parser state is thread-local).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "proto/http_message.h"
#include "runtime/batch_io.h"
#include "runtime/infer_request.h"
#include "server/shared_memory.h"

namespace shoal::server {

// How each output of a response is encoded (binary extension, JSON `data`, or written
// to shared memory).
struct OutputEncoding {
  bool default_binary = false;  // request parameter binary_data_output
  // The request's `outputs`, in order, with their own binary_data flag if given.
  std::vector<std::pair<std::string, std::optional<bool>>> requested;
  bool Binary(std::string_view output) const;
  // Outputs the request asked to receive in shared memory (their shared_memory_*
  // parameters), and, once ResolveSharedMemory ran, the windows they go to.
  std::map<std::string, SharedMemoryRef> shared_memory;
  std::map<std::string, SharedMemoryView> shared_memory_views;
};

struct ParsedInfer {
  runtime::InferRequest request;  // model name and version are left to the caller
  OutputEncoding encoding;
  // Inputs read from shared memory: their index in request.inputs (a tensor with dtype
  // and shape but no data until ResolveSharedMemory) and where they are.
  std::vector<std::pair<size_t, SharedMemoryRef>> shared_memory_inputs;
};

// Shared memory extension: fills the shared-memory inputs of `parsed` from `manager`
// (views when aligned) and resolves its shared-memory outputs, so an unknown region or
// a window out of bounds is refused (INVALID_ARGUMENT naming the tensor) before the
// request runs. A no-op for a request that uses no shared memory.
Status ResolveSharedMemory(const SharedMemoryManager& manager, ParsedInfer* parsed);

struct BinarySplit {
  std::string_view json;
  std::string_view binary;
};

// `header_length` is the raw Inference-Header-Content-Length value, if the header was
// sent. It must be a decimal integer, 1 <= N <= body size, fitting in int32 (0, a raw
// binary request without JSON, is not supported).
StatusOr<BinarySplit> SplitBinaryBody(std::string_view body,
                                      std::optional<std::string_view> header_length);

// Cuts `binary` into consecutive slices of `sizes` bytes; the sizes must add up to
// exactly binary.size().
StatusOr<std::vector<std::string_view>> SliceBinaryRegion(std::string_view binary,
                                                          const std::vector<uint64_t>& sizes);

// `body` holds the whole (decompressed) body in body->view(), with
// proto::BodyBuffer::kPadding readable bytes after it. Tensors may keep `body` alive.
StatusOr<ParsedInfer> ParseInferRequest(const std::shared_ptr<proto::BodyBuffer>& body,
                                        std::optional<std::string_view> header_length,
                                        const runtime::RequestLimits& limits);

// Decodes a body sent with Content-Encoding `encoding` ("gzip", "x-gzip", "deflate",
// "identity", case-insensitive). The result is aligned at `align_at` (the JSON header
// length, so binary tensors land aligned). For identity, returns `body` unchanged.
StatusOr<std::shared_ptr<proto::BodyBuffer>> DecodeContentEncoding(
    std::string_view encoding, std::shared_ptr<proto::BodyBuffer> body, int64_t max_bytes,
    size_t align_at);

// The HTTP reply for a successful runtime response (status 200). An output resolved to
// shared memory is written there and answered with its shared_memory_* parameters and no
// data (INVALID_ARGUMENT when it does not fit the window). An output that cannot
// be written as JSON (FP16/BF16, or BYTES that are not UTF-8) fails with
// INVALID_ARGUMENT asking for binary_data; a requested output missing from the
// response fails with INTERNAL.
StatusOr<proto::HttpResponse> SerializeInferResponse(const runtime::InferResponse& response,
                                                     const OutputEncoding& encoding);

// Small JSON bodies of the repository endpoints.
// POST /v2/repository/index: {"ready": bool} (body may be empty). Returns `ready`.
StatusOr<bool> ParseRepositoryIndexBody(std::string_view body);
// POST .../load and .../unload: {"parameters": {...}} (may be empty). Returns the
// parameter names given and the value of `config` (a string: the model config as JSON,
// Triton's load override), the only value this server uses.
struct RepositoryParameters {
  std::vector<std::string> names;
  std::optional<std::string> config;
  bool unload_dependents = false;  // unload: an ensemble's steps go with it
};
StatusOr<RepositoryParameters> ParseRepositoryParametersBody(std::string_view body);

}  // namespace shoal::server
