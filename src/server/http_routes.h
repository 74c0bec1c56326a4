// HttpRoutes: the Open Inference Protocol endpoints over runtime::Server, as an
// HttpHandler for HttpCore. Internal to the HTTP front end (HttpServer owns it); the
// routing table and the JSON renderers are exposed for tests.
//
// Threads: Handle runs on HttpCore's loop threads and never blocks: inference answers
// arrive through the runtime callback, and repository load/unload/index run on the
// routes' own worker thread (Shutdown joins it; queued work then answers 503).
//
// Work that grows with a request's size stays off the loops, so one large request
// cannot stall every connection of its loop: an infer body larger than
// HttpOptions::offload_bytes, or compressed at all (its inflated size is unknown until
// inflated), is decoded, parsed and submitted (which hashes it for the response cache)
// on the codec pool; an answer whose JSON-encoded outputs hold more than offload_bytes
// of tensor data is serialized there too. Smaller requests and answers stay on the
// loop, where they cost less than the hand-over. codec_threads 0 keeps all on the loops.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/server.h"
#include "server/auth.h"
#include "server/http_core.h"
#include "server/http_server.h"
#include "server/task_pool.h"

namespace shoal::server::internal {

enum class Route {
  kNotFound,
  kServerMetadata,
  kLive,
  kReady,
  kModelMetadata,
  kModelReady,
  kModelConfig,
  kInfer,
  kStats,  // all models, one model, or one version
  kRepositoryIndex,
  kRepositoryLoad,
  kRepositoryUnload,
};

// The request header that carries the client's deadline, in microseconds from arrival
// (lower case, as header names are stored).
inline constexpr char kTimeoutHeader[] = "shoal-timeout-us";

struct RouteMatch {
  Route route = Route::kNotFound;
  std::string model;     // empty for server-wide routes and all-model stats
  int64_t version = -1;  // -1: not given
  Status error;          // a malformed path element (400)
};

// What a route does, for the authentication check (server/auth.h).
EndpointClass RouteEndpointClass(Route route);
// The same for Triton's extension endpoints (http_extensions.h): shared memory is
// inference, trace and log settings are control; nullopt for other paths.
std::optional<EndpointClass> ExtensionEndpointClass(const std::vector<std::string>& segments);

// Matches percent-decoded path segments to a route (method not considered).
RouteMatch MatchRoute(const std::vector<std::string>& segments);
// "GET", or "POST", for a route.
std::string_view RouteMethod(Route route);

// JSON renderers (exposed for tests).
std::string ServerMetadataJson(bool cuda_shared_memory = false);
StatusOr<std::string> ModelMetadataJson(const runtime::Server& server, const std::string& model,
                                        int64_t version);
StatusOr<std::string> ModelConfigJson(const inference::ModelConfig& config);
StatusOr<std::string> StatisticsJson(const runtime::Server& server, const std::string& model,
                                     int64_t version);
std::string RepositoryIndexJson(const std::vector<runtime::ModelStatus>& index, bool ready_only);

// The HTTP reply for an error status (status_map; Retry-After when retryable).
proto::HttpResponse ErrorResponse(const Status& status);

class HttpRoutes final : public HttpHandler {
 public:
  HttpRoutes(runtime::Server* server, HttpOptions options);
  ~HttpRoutes() override;

  std::function<void()> Handle(HttpRequest request, HttpResponder responder) override;
  size_t BodyAlignment(const proto::HttpRequestHead& head) override;

  // /v2/health/ready answers 503 from now on.
  void SetStopping() { stopping_ = true; }
  // Joins the worker thread; queued repository work answers 503. Idempotent.
  void Shutdown();
  // Requests and answers handled on the codec pool so far (0 without one).
  int64_t offloaded() const { return codec_ ? codec_->started() : 0; }

 private:
  // True when `endpoint` may be served to `request` (options_.auth); else answers 401 with
  // WWW-Authenticate and returns false.
  bool Authorized(const HttpRequest& request, EndpointClass endpoint,
                  const HttpResponder& responder);
  struct InferCall;

  std::function<void()> Infer(HttpRequest& request, const RouteMatch& match,
                              const HttpResponder& responder);
  // Decodes, parses and submits one infer request; answers through call->responder.
  void StartInfer(const std::shared_ptr<InferCall>& call);
  void Repository(HttpRequest& request, const RouteMatch& match, const HttpResponder& responder);
  // Queues blocking work for the worker thread; false once shut down.
  bool RunOnWorker(std::function<void()> work, std::function<void()> on_refused);

  runtime::Server* const server_;
  const HttpOptions options_;
  const std::shared_ptr<ExtensionState> extensions_;
  const std::string server_metadata_;
  std::atomic<bool> stopping_{false};

  TaskPool worker_;
  // Null when options_.codec_threads is 0. Shared with runtime callbacks, which may
  // outlive a request's connection.
  std::shared_ptr<TaskPool> codec_;
};

}  // namespace shoal::server::internal
