#include "server/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <climits>
#include <deque>
#include <functional>
#include <thread>

#include "core/mutex.h"
#include "server/grpc_calls.h"
#include "server/grpc_handlers.h"

namespace shoal::server {

// One thread running blocking handlers (model load/unload) in arrival order; the
// runtime serialises loads anyway, so one thread loses nothing.
class BlockingWorker {
 public:
  BlockingWorker() : thread_([this] { Run(); }) {}
  ~BlockingWorker() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.Signal();
    thread_.join();
  }
  void Post(std::function<void()> fn) {
    {
      MutexLock lock(&mu_);
      work_.push_back(std::move(fn));
    }
    cv_.Signal();
  }

 private:
  void Run() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (true) {
      while (!stop_ && work_.empty()) cv_.Wait(&mu_);
      if (work_.empty()) return;  // stop_, and everything posted has run
      auto fn = std::move(work_.front());
      work_.pop_front();
      lock.Unlock();
      fn();
      lock.Lock();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> work_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Members are destroyed in reverse order: the grpc::Server before the services and the
// queues it uses; the worker (joined) before the handlers its work calls.
class GrpcServer::Impl {
 public:
  Impl(runtime::Server* runtime, GrpcOptions options)
      : options_(std::move(options)),
        handlers_(
            runtime,
            options_.extensions.empty() ? GrpcHandlers::DefaultExtensions() : options_.extensions,
            options_.extension_state) {
    ctx_.runtime = runtime;
    ctx_.service = &service_;
    ctx_.health = &health_;
    ctx_.handlers = &handlers_;
    ctx_.limits = options_.limits;
    ctx_.stream_max_in_flight = options_.stream_max_in_flight;
    ctx_.auth = options_.auth;
    ctx_.run_blocking = [this](std::function<void()> fn) { worker_->Post(std::move(fn)); };
  }

  ~Impl() { Stop(); }

  Status Start() {
    std::string host = options_.address;
    if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
    const std::string address = host + ":" + std::to_string(options_.port);

    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
    if (!options_.tls.cert_file.empty()) {
      ASSIGN_OR_RETURN(TlsFiles files, LoadTlsFiles(options_.tls));
      grpc::SslServerCredentialsOptions ssl(
          files.ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                               : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      ssl.pem_root_certs = files.ca_pem;
      ssl.pem_key_cert_pairs.push_back({files.key_pem, files.cert_pem});
      credentials = grpc::SslServerCredentials(ssl);
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, credentials, &port_);
    builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
    // Without this, gRPC sets SO_REUSEPORT and a second server on a busy port would
    // "start" and silently share it.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.RegisterService(&service_);
    builder.RegisterService(&health_);
    for (int i = 0; i < options_.threads; ++i) cqs_.push_back(builder.AddCompletionQueue());
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      server_.reset();
      for (auto& cq : cqs_) {
        cq->Shutdown();
        void* tag;
        bool ok;
        while (cq->Next(&tag, &ok)) {
        }
      }
      return Unavailable("the gRPC server could not listen on " + address);
    }
    worker_ = std::make_unique<BlockingWorker>();
    for (auto& cq : cqs_) internal::ArmCalls(&ctx_, cq.get());
    for (auto& cq : cqs_) {
      threads_.emplace_back([q = cq.get()] { internal::RunCompletionQueue(q); });
    }
    {
      MutexLock lock(&stop_mu_);
      started_ = true;
    }
    spdlog::debug("gRPC server listening on {}:{}", host, port_);
    return Status::Ok();
  }

  void Stop() {
    MutexLock stop_lock(&stop_mu_);
    if (!started_ || stopped_) return;
    stopped_ = true;
    const auto grace_end =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.shutdown_grace_ms);
    // 1. Drain: new inference calls are answered UNAVAILABLE; streams end once idle.
    //    Calls in flight get the grace period to finish.
    {
      MutexLock lock(&ctx_.mu);
      ctx_.draining = true;
      for (internal::Call* stream : ctx_.streams) stream->Drain();
      while (ctx_.active_calls != 0) {
        if (ctx_.cv.WaitUntil(&ctx_.mu, grace_end) == std::cv_status::timeout) break;
      }
    }
    // 2. Shut gRPC down now: refuse calls, fail the armed ones, cancel what still runs
    //    (those calls cancel their runtime requests) and close client connections, which
    //    a graceful shutdown would wait for.
    server_->Shutdown(std::chrono::system_clock::now());
    // Every call object must be gone (each one's last operation completed) before the
    // queues shut down: a runtime callback may still start a Finish or a Write.
    {
      MutexLock lock(&ctx_.mu);
      auto warn_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (ctx_.live_calls != 0) {
        if (ctx_.cv.WaitUntil(&ctx_.mu, warn_at) == std::cv_status::timeout) {
          spdlog::warn("gRPC server stopping: waiting for {} call(s) to finish", ctx_.live_calls);
          warn_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        }
      }
    }
    for (auto& cq : cqs_) cq->Shutdown();
    for (auto& t : threads_) t.join();
    threads_.clear();
    worker_.reset();
    spdlog::debug("gRPC server stopped");
  }

  int port() const { return port_; }

 private:
  const GrpcOptions options_;
  GrpcHandlers handlers_;
  internal::CallContext ctx_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  internal::InferenceService service_;
  internal::HealthService health_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<BlockingWorker> worker_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  Mutex stop_mu_;
  bool started_ GUARDED_BY(stop_mu_) = false;  // after Start
  bool stopped_ GUARDED_BY(stop_mu_) = false;
};

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(runtime::Server* server,
                                                        GrpcOptions options) {
  if (server == nullptr) return InvalidArgument("GrpcServer needs a runtime::Server; was null");
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("gRPC port must be 0..65535; was " + std::to_string(options.port));
  }
  if (options.address.empty()) return InvalidArgument("gRPC address is empty");
  if (options.max_message_bytes < 1 || options.max_message_bytes > INT32_MAX) {
    return InvalidArgument("gRPC max_message_bytes must be 1..2147483647; was " +
                           std::to_string(options.max_message_bytes));
  }
  if (options.threads < 1 || options.threads > 256) {
    return InvalidArgument("gRPC threads must be 1..256; was " + std::to_string(options.threads));
  }
  if (options.stream_max_in_flight < 1) {
    return InvalidArgument("gRPC stream_max_in_flight must be at least 1; was " +
                           std::to_string(options.stream_max_in_flight));
  }
  if (options.shutdown_grace_ms < 0) {
    return InvalidArgument("gRPC shutdown_grace_ms must not be negative; was " +
                           std::to_string(options.shutdown_grace_ms));
  }
  if (options.limits.max_inputs < 0 || options.limits.max_elements_per_tensor < 0) {
    return InvalidArgument("gRPC request limits must not be negative");
  }
  auto impl = std::make_unique<Impl>(server, std::move(options));
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(impl)));
}

GrpcServer::GrpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GrpcServer::~GrpcServer() { Stop(); }

int GrpcServer::port() const { return impl_->port(); }

void GrpcServer::Stop() { impl_->Stop(); }

}  // namespace shoal::server
