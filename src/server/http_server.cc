#include "server/http_server.h"

#include <utility>

#include "server/http_core.h"
#include "server/http_routes.h"

namespace shoal::server {

namespace {

HttpCoreOptions CoreOptions(const HttpOptions& options) {
  HttpCoreOptions core;
  core.address = options.address;
  core.port = options.port;
  core.threads = options.threads;
  core.max_body_bytes = options.max_body_bytes;
  core.max_header_bytes = options.max_header_bytes;
  core.max_connections = options.max_connections;
  core.receiving_body_budget_bytes = options.receiving_body_budget_bytes;
  core.idle_timeout_ms = options.idle_timeout_ms;
  core.header_timeout_ms = options.header_timeout_ms;
  core.body_timeout_ms = options.body_timeout_ms;
  core.write_timeout_ms = options.write_timeout_ms;
  core.thread_name = "http";
  return core;
}

Status ValidateOptions(const runtime::Server* server, const HttpOptions& options) {
  if (server == nullptr) return InvalidArgument("HttpServer needs a runtime::Server");
  return HttpServer::Validate(options);
}

}  // namespace

Status HttpServer::Validate(const HttpOptions& options) {
  if (options.limits.max_elements_per_tensor < 1) {
    return InvalidArgument("limits.max_elements_per_tensor must be positive; was " +
                           std::to_string(options.limits.max_elements_per_tensor));
  }
  if (options.limits.max_inputs < 1) {
    return InvalidArgument("limits.max_inputs must be positive; was " +
                           std::to_string(options.limits.max_inputs));
  }
  if (options.codec_threads < 0) {
    return InvalidArgument("codec_threads must be 0 or more; was " +
                           std::to_string(options.codec_threads));
  }
  if (options.offload_bytes < 0) {
    return InvalidArgument("offload_bytes must be 0 or more; was " +
                           std::to_string(options.offload_bytes));
  }
  if (!options.tls.cert_file.empty() || !options.tls.key_file.empty() ||
      !options.tls.ca_file.empty()) {
    RETURN_IF_ERROR(TlsContext::Create(options.tls).status());
  }
  return HttpCore::Validate(CoreOptions(options));
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(runtime::Server* server,
                                                        HttpOptions options) {
  RETURN_IF_ERROR(ValidateOptions(server, options));
  ASSIGN_OR_RETURN(TcpListener listener, TcpListener::Listen(options.address, options.port));
  return Start(server, std::move(options), std::move(listener));
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(runtime::Server* server,
                                                        HttpOptions options, TcpListener listener) {
  RETURN_IF_ERROR(ValidateOptions(server, options));
  std::unique_ptr<HttpServer> http(new HttpServer());
  HttpCoreOptions core = CoreOptions(options);
  if (!options.tls.cert_file.empty()) {
    ASSIGN_OR_RETURN(core.tls, TlsContext::Create(options.tls));
  }
  http->routes_ = std::make_unique<internal::HttpRoutes>(server, std::move(options));
  ASSIGN_OR_RETURN(http->core_,
                   HttpCore::Start(std::move(core), http->routes_.get(), std::move(listener)));
  return http;
}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return core_ ? core_->port() : 0; }

int64_t HttpServer::offloaded() const { return routes_ ? routes_->offloaded() : 0; }

void HttpServer::StopAccepting() {
  if (routes_) routes_->SetStopping();
  if (core_) core_->StopAccepting();
}

bool HttpServer::Drain(int64_t timeout_ms) { return core_ ? core_->Drain(timeout_ms) : true; }

void HttpServer::Stop() {
  if (routes_) routes_->SetStopping();
  // The worker first: a load in progress finishes and its answer is flushed below.
  if (routes_) routes_->Shutdown();
  if (core_) core_->Stop();
}

}  // namespace shoal::server
