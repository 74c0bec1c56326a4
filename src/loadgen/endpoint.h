// Endpoint: one server as shoal bench sees it, over one protocol: the control calls
// (model metadata and config, statistics) and a factory for the Transport that carries
// the load. NewHttpEndpoint (http_endpoint.cc) and NewGrpcEndpoint (grpc_endpoint.cc).
//
// The control calls are blocking, with a timeout of a few seconds; the driver makes
// them on its own thread at window boundaries (one short loopback round trip each).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "loadgen/input_data.h"
#include "loadgen/model_info.h"
#include "loadgen/options.h"
#include "loadgen/server_stats.h"
#include "loadgen/transport.h"

namespace shoal::loadgen {

class Endpoint {
 public:
  virtual ~Endpoint() = default;

  // Metadata and max_batch_size of `model` (version -1: the latest). NotFound-like
  // errors carry the server's message.
  virtual StatusOr<ModelInfo> GetModelInfo(const std::string& model, int64_t version) = 0;
  virtual StatusOr<ServerStats> GetStats(const std::string& model, int64_t version) = 0;
  // A transport that sends inference requests for `model` carrying `payloads`, with up
  // to `capacity` in flight. `clock` must outlive it.
  virtual StatusOr<std::unique_ptr<Transport>> NewTransport(const Clock& clock,
                                                            const std::string& model,
                                                            int64_t version,
                                                            const std::vector<Payload>& payloads,
                                                            int64_t capacity) = 0;
};

StatusOr<std::unique_ptr<Endpoint>> NewHttpEndpoint(const HostPort& address);
StatusOr<std::unique_ptr<Endpoint>> NewGrpcEndpoint(const HostPort& address);

}  // namespace shoal::loadgen
