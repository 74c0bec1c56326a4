// GrpcServer: the gRPC front end. Serves inference.GRPCInferenceService (the Open
// Inference Protocol's gRPC form, docs/open-inference-protocol.md section 3) and
// grpc.health.v1.Health/Check for one runtime::Server, on gRPC's asynchronous API.
// Its sibling for HTTP is http_server.h; both only translate, all logic is in the runtime.
//
// RPCs: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig,
// ModelInfer, ModelStreamInfer, ModelStatistics, RepositoryIndex, RepositoryModelLoad,
// RepositoryModelUnload, and Triton's extensions: SystemSharedMemory*, CudaSharedMemory*
// (registration answers UNIMPLEMENTED: no GPU), TraceSetting, LogSettings
// (docs/protocol-extensions.md).
// Conversions: grpc_codec.h; the per-RPC answers: grpc_handlers.h; the state machines:
// grpc_calls.h.
//
// Threads: `threads` completion-queue threads receive calls and answer the quick RPCs
// inline; inference is handed to runtime::Server::Infer and answered from its callback,
// so no queue thread waits on a model; model load/unload run on one worker thread.
//
// With options.auth, an RPC its scope covers is answered UNAUTHENTICATED, before its
// handler runs, unless the "authorization" metadata carries the bearer token; with
// options.tls, the port speaks TLS only.
//
// Errors reach clients as gRPC statuses mapped by server/status_map (INVALID_ARGUMENT
// naming the input, NOT_FOUND for an unknown model, RESOURCE_EXHAUSTED when a queue is
// full, UNAVAILABLE while shutting down, ...); on ModelStreamInfer each failed request
// gets a response with error_message and the stream goes on.
//
// Lifetime: Start returns a serving server. Stop drains, then shuts down:
//   1. New ModelInfer calls, new streams and new messages on open streams are answered
//      UNAVAILABLE ("the server is shutting down"); other RPCs are still answered.
//      Calls in flight run to completion: every inference request already received is
//      answered. A stream ends as soon as it has nothing in flight: with OK if the
//      client half-closed, else with UNAVAILABLE (the client may retry elsewhere).
//   2. When no call is in flight, or after `shutdown_grace_ms`, gRPC is shut down: the
//      port closes, calls still running are cancelled (and so are their runtime
//      requests), client connections are closed, every thread is joined.
// The runtime::Server must outlive the GrpcServer and keep answering requests until
// Stop returns; runtime::Server::Shutdown may come before Stop (it answers what is
// queued, then rejects with UNAVAILABLE) or after.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/batch_io.h"
#include "runtime/server.h"
#include "server/auth.h"
#include "server/protocol_settings.h"
#include "server/tls.h"

namespace shoal::server {

struct GrpcOptions {
  // Interface to listen on; IPv6 addresses may be given bare ("::") or bracketed.
  std::string address = "0.0.0.0";
  // TCP port, 0..65535. 0: pick a free port; port() tells which.
  int port = 8001;
  // Largest message received or sent, in bytes, 1..INT32_MAX. Triton raises both of
  // gRPC's limits (4 MiB receive by default) to INT32_MAX (spec section 3.6).
  int64_t max_message_bytes = INT32_MAX;
  // Completion-queue threads, 1..256; each has its own queue.
  int threads = 2;
  // Limits applied while decoding a request, before anything is allocated for it.
  runtime::RequestLimits limits;
  // Per ModelStreamInfer stream: requests read but not yet answered and written, >= 1.
  // At the limit the server stops reading the stream until one is written.
  int64_t stream_max_in_flight = 256;
  // Stop: how long calls in flight may run before they are cancelled, in ms, >= 0.
  int64_t shutdown_grace_ms = 5000;
  // What ServerMetadata lists; empty: GrpcHandlers::DefaultExtensions().
  std::vector<std::string> extensions;
  // When set, the RPCs its scope covers need its bearer token in the "authorization"
  // metadata ("Bearer <token>"), else UNAUTHENTICATED; health RPCs stay open.
  std::shared_ptr<const Authenticator> auth;
  // TLS when tls.cert_file is set (gRPC's SslServerCredentials): certificate and key and,
  // for mutual TLS, the CAs client certificates must be signed by (then required).
  // Empty: plaintext. Files are checked by Start (INVALID_ARGUMENT naming the file).
  TlsOptions tls;
  // Registered shared memory regions and trace settings (Triton's extensions), shared
  // with the HTTP front end of the same server. Null: the gRPC server keeps its own.
  std::shared_ptr<ExtensionState> extension_state;
};

class GrpcServer {
 public:
  // Listens and starts serving `server` (not owned). INVALID_ARGUMENT for bad options
  // (naming the value); UNAVAILABLE when the address cannot be bound.
  static StatusOr<std::unique_ptr<GrpcServer>> Start(runtime::Server* server, GrpcOptions options);

  // The port actually bound (the chosen one when options.port was 0).
  int port() const;
  // Stop accepting, finish in-flight RPCs, join. Idempotent; thread-safe; the destructor
  // calls it.
  void Stop();
  ~GrpcServer();

  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // Implementation details follow.
  class Impl;

 private:
  explicit GrpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shoal::server
