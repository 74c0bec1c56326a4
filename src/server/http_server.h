// HttpServer: shoal's HTTP/REST front end, speaking the Open Inference Protocol (KServe
// v2) with Triton's extensions, so tritonclient and perf_analyzer work unchanged
// (docs: /work/shared/docs/open-inference-protocol.md sections 1, 2, 4, 5).
//
// Endpoints (every path also takes /versions/<decimal> where a model is named):
//   GET  /v2                                   server metadata
//   GET  /v2/health/live | /v2/health/ready     200 or 503, empty body on success
//   GET  /v2/models/{m}[/versions/{v}]         model metadata
//   GET  /v2/models/{m}[/versions/{v}]/ready   200, or the error of GetModel
//   GET  /v2/models/{m}[/versions/{v}]/config  inference.ModelConfig as JSON
//   POST /v2/models/{m}[/versions/{v}]/infer   JSON and binary tensor data, gzip/deflate
//   GET  /v2/models[/{m}[/versions/{v}]]/stats Triton statistics
//   POST /v2/repository[/{repo}]/index, .../models/{m}/load, .../models/{m}/unload
//   Triton's shared-memory, logging and trace endpoints: http_extensions.h
// Wrong method: 405 with Allow; unknown path: 404 {"error":"Not Found"}; a route the
// authenticator's scope covers, without the right bearer token: 401 with
// WWW-Authenticate (options.auth; server/auth.h). Errors are
// {"error": "..."} with the status of server/status_map (429 and 503 add Retry-After).
//
// Threads: `threads` I/O event loops (see http_core.h) parse, route and serialize;
// they never wait for inference: Server::Infer's callback posts the answer back to the
// connection's loop. Large or compressed infer bodies and large JSON answers are
// decoded and encoded on `codec_threads` threads instead, so that one large request
// does not stall the other connections of its loop (http_routes.h). Repository load/unload/index
// run on one extra worker thread, because loading a model blocks. A client that disconnects before
// its answer cancels its request (RequestHandle::Cancel).
//
// Shutdown (what `shoal serve` does on SIGTERM):
//   http->StopAccepting();    // listener closed; open connections finish their requests
//   server->Shutdown();       // the runtime answers everything queued
//   http->Drain(timeout_ms);  // wait until those answers are written
//   http->Stop();             // close the rest, join the threads (also the destructor)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/batch_io.h"
#include "runtime/server.h"
#include "server/auth.h"
#include "server/protocol_settings.h"
#include "server/tcp_listener.h"
#include "server/tls.h"

namespace shoal::server {

struct HttpOptions {
  std::string address = "0.0.0.0";  // IPv4/IPv6 literal or host name to bind
  int port = 8000;                  // 0: pick a free port; port() tells which
  int threads = 2;                  // I/O event loops, >= 1
  // Largest request body in bytes, as received and again after decompression.
  int64_t max_body_bytes = int64_t{64} << 20;
  // Largest request head (request line + headers) in bytes; more gets 431.
  int64_t max_header_bytes = int64_t{16} << 10;
  // Per-tensor element limit and input count, checked while parsing (before any
  // allocation); the runtime checks them again against the model.
  runtime::RequestLimits limits;
  // Connection handling, as HttpCoreOptions (http_core.h) describes it: at most
  // max_connections open (>= threads; idle ones are closed, oldest first, to let new
  // clients in); bodies being received hold at most receiving_body_budget_bytes in all
  // (>= max_body_bytes; past it 503); total deadlines for a head and for a body (408);
  // idle keep-alive connections and stalled answers are closed.
  int max_connections = 10000;
  int64_t receiving_body_budget_bytes = int64_t{1} << 30;
  int64_t idle_timeout_ms = 300'000;
  int64_t header_timeout_ms = 30'000;
  int64_t body_timeout_ms = 300'000;
  int64_t write_timeout_ms = 60'000;
  // When set, the endpoints its scope covers need its bearer token (401 otherwise, with
  // WWW-Authenticate: Bearer); health checks stay open. See server/auth.h.
  std::shared_ptr<const Authenticator> auth;
  // TLS (HTTPS) when tls.cert_file is set: certificate, key and, for mutual TLS, the
  // client CAs (server/tls.h). Empty: plaintext HTTP.
  TlsOptions tls;
  // Threads that decode, parse and serialize large or compressed requests and large
  // JSON answers off the I/O loops (http_routes.h); 0: all of it on the loops.
  int codec_threads = 2;
  // An infer body above this many bytes as received (or any compressed body), and an
  // answer with more tensor bytes to write as JSON, is handled by the codec threads.
  int64_t offload_bytes = int64_t{256} << 10;
  // Registered shared memory regions and trace settings (Triton's extensions), shared
  // with the gRPC front end of the same server. Null: the HTTP server keeps its own.
  std::shared_ptr<ExtensionState> extension_state;
};

namespace internal {
class HttpRoutes;
}
class HttpCore;

class HttpServer {
 public:
  // Validates the options, binds, and starts serving `server` (which must outlive
  // the HttpServer). UNAVAILABLE when the address cannot be bound.
  static StatusOr<std::unique_ptr<HttpServer>> Start(runtime::Server* server, HttpOptions options);
  // The checks Start makes of `options` before it binds: INVALID_ARGUMENT naming the
  // value, or OK.
  static Status Validate(const HttpOptions& options);
  // The same on a socket bound beforehand (options.address and port are then ignored).
  static StatusOr<std::unique_ptr<HttpServer>> Start(runtime::Server* server, HttpOptions options,
                                                     TcpListener listener);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Infer requests and answers decoded or encoded off the I/O loops so far (codec_threads).
  int64_t offloaded() const;
  // Closes the listener; /v2/health/ready answers 503 from now on. Requests in progress
  // are answered (with Connection: close); idle connections are closed.
  void StopAccepting();
  // Waits until every request in progress is answered and written; false on timeout.
  bool Drain(int64_t timeout_ms);
  // Closes every connection (cancelling requests still waiting for the runtime) and
  // joins all threads. Idempotent.
  void Stop();

 private:
  HttpServer() = default;
  std::unique_ptr<internal::HttpRoutes> routes_;
  std::unique_ptr<HttpCore> core_;
};

}  // namespace shoal::server
