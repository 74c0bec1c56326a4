#include "cli/serve.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/common.h"
#include "runtime/server.h"
#ifdef SHOAL_HAVE_ONNX
#include "backends/onnx/onnx_backend.h"
#endif
#ifdef SHOAL_HAVE_HTTP
#include "server/http_server.h"
#include "server/metrics.h"
#endif
#ifdef SHOAL_HAVE_GRPC
#include "server/grpc_server.h"
#endif

namespace shoal::cli {
namespace {

struct ServeFlags {
  std::string model_repository;
  std::string address = "0.0.0.0";
  int http_port = 8000;
  int grpc_port = 8001;
  int metrics_port = 8002;
  bool allow_http = true;
  bool allow_grpc = true;
  bool allow_metrics = true;
  int http_threads = 2;
  int grpc_threads = 2;
  std::string model_control_mode = "none";
  int repository_poll_secs = 15;
  std::vector<std::string> load_models;
  std::vector<std::string> backend_directories;
  int log_verbose = 0;
  int64_t cache_size_bytes = int64_t{64} << 20;
  int64_t max_body_bytes = int64_t{64} << 20;
  int64_t max_header_bytes = int64_t{16} << 10;
  int64_t max_tensor_elements = int64_t{1} << 28;
  int64_t max_inputs = 64;
};

int RunServe(const ServeFlags& f) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(f.log_verbose > 0 ? spdlog::level::debug : spdlog::level::info);

  // Signals are taken by one thread with sigwait; block them everywhere else first, so
  // every thread created from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  runtime::ServerOptions options;
  options.model_repository = f.model_repository;
  if (f.model_control_mode == "none") {
    options.control_mode = runtime::ModelControlMode::kNone;
  } else if (f.model_control_mode == "poll") {
    options.control_mode = runtime::ModelControlMode::kPoll;
  } else {
    options.control_mode = runtime::ModelControlMode::kExplicit;
  }
  options.startup_models = f.load_models;
  options.registry = std::make_shared<backends::BackendRegistry>();
#ifdef SHOAL_HAVE_ONNX
  backends::RegisterOnnxBackend(options.registry.get());
#endif
  options.backend_directories =
      f.backend_directories.empty() ? DefaultBackendDirectories() : f.backend_directories;
  options.cache_size_bytes = f.cache_size_bytes;
  options.limits.max_elements_per_tensor = f.max_tensor_elements;
  options.limits.max_inputs = f.max_inputs;

  spdlog::info("shoal {} loading model repository '{}' (control mode {})", SHOAL_VERSION,
               f.model_repository, f.model_control_mode);
  auto created = runtime::Server::Create(options);
  if (!created.ok()) {
    spdlog::critical("cannot start: {}", created.status().message());
    return 1;
  }
  std::unique_ptr<runtime::Server> server = std::move(created).value();
  for (const auto& m : server->RepositoryIndex()) {
    spdlog::info("model '{}' version {}: {}{}{}", m.name, m.version,
                 runtime::ModelStateName(m.state), m.reason.empty() ? "" : " - ", m.reason);
  }

#ifdef SHOAL_HAVE_HTTP
  std::unique_ptr<server::HttpServer> http;
  std::unique_ptr<server::MetricsServer> metrics;
  if (f.allow_http) {
    server::HttpOptions o;
    o.address = f.address;
    o.port = f.http_port;
    o.threads = f.http_threads;
    o.max_body_bytes = f.max_body_bytes;
    o.max_header_bytes = f.max_header_bytes;
    o.limits = options.limits;
    auto h = server::HttpServer::Start(server.get(), o);
    if (!h.ok()) {
      spdlog::critical("cannot start the HTTP server on {}:{}: {}", f.address, f.http_port,
                       h.status().message());
      return 1;
    }
    http = std::move(h).value();
    spdlog::info("HTTP service listening on {}:{}", f.address, http->port());
  }
  if (f.allow_metrics) {
    auto m = server::MetricsServer::Start(server.get(), f.address, f.metrics_port);
    if (!m.ok()) {
      spdlog::critical("cannot start the metrics server on {}:{}: {}", f.address, f.metrics_port,
                       m.status().message());
      return 1;
    }
    metrics = std::move(m).value();
    spdlog::info("metrics service listening on {}:{}", f.address, metrics->port());
  }
#endif
#ifdef SHOAL_HAVE_GRPC
  std::unique_ptr<server::GrpcServer> grpc;
  if (f.allow_grpc) {
    server::GrpcOptions o;
    o.address = f.address;
    o.port = f.grpc_port;
    o.threads = f.grpc_threads;
    o.limits = options.limits;
    auto g = server::GrpcServer::Start(server.get(), o);
    if (!g.ok()) {
      spdlog::critical("cannot start the gRPC server on {}:{}: {}", f.address, f.grpc_port,
                       g.status().message());
      return 1;
    }
    grpc = std::move(g).value();
    spdlog::info("gRPC service listening on {}:{}", f.address, grpc->port());
  }
#endif

  // Poll mode: reload what changed on disk every repository_poll_secs.
  std::mutex poll_mu;
  std::condition_variable poll_cv;
  bool stop_polling = false;
  std::thread poller;
  if (options.control_mode == runtime::ModelControlMode::kPoll) {
    poller = std::thread([&] {
      std::unique_lock<std::mutex> lock(poll_mu);
      while (!poll_cv.wait_for(lock, std::chrono::seconds(std::max(f.repository_poll_secs, 1)),
                               [&] { return stop_polling; })) {
        lock.unlock();
        if (Status s = server->PollRepository(); !s.ok())
          spdlog::warn("repository poll failed: {}", s.message());
        lock.lock();
      }
    });
  }

  spdlog::info("shoal is ready: {} (SIGTERM or Ctrl-C to stop)",
               server->ready() ? "all models loaded" : "some models failed to load");
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("received {}: draining (a second signal exits at once)",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
  std::thread second_signal([signals]() mutable {
    int again = 0;
    sigwait(&signals, &again);
    std::_Exit(1);
  });
  second_signal.detach();

  {
    std::lock_guard<std::mutex> lock(poll_mu);
    stop_polling = true;
  }
  poll_cv.notify_all();
  if (poller.joinable()) poller.join();
#ifdef SHOAL_HAVE_HTTP
  if (http) http->StopAccepting();
#endif
  // Answers everything queued and in flight; requests arriving meanwhile get 503.
  server->Shutdown();
#ifdef SHOAL_HAVE_GRPC
  if (grpc) grpc->Stop();
#endif
#ifdef SHOAL_HAVE_HTTP
  if (http) http->Stop();
  if (metrics) metrics->Stop();
#endif
  spdlog::info("shoal stopped cleanly");
  return 0;
}

}  // namespace

void AddServeCommand(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* serve =
      app.add_subcommand("serve", "Serve the models of a repository over HTTP, gRPC and metrics");
  serve
      ->add_option("--model-repository", flags->model_repository,
                   "Model repository folder (Triton layout)")
      ->required()
      ->check(CLI::ExistingDirectory);
  serve->add_option("--http-address,--grpc-address", flags->address, "Address the services bind to")
      ->capture_default_str();
  serve->add_option("--http-port", flags->http_port, "HTTP/REST port (0: any free port)")
      ->capture_default_str();
  serve->add_option("--grpc-port", flags->grpc_port, "gRPC port (0: any free port)")
      ->capture_default_str();
  serve
      ->add_option("--metrics-port", flags->metrics_port,
                   "Prometheus metrics port (0: any free port)")
      ->capture_default_str();
  serve->add_option("--allow-http", flags->allow_http, "Serve HTTP/REST")->capture_default_str();
  serve->add_option("--allow-grpc", flags->allow_grpc, "Serve gRPC")->capture_default_str();
  serve->add_option("--allow-metrics", flags->allow_metrics, "Serve Prometheus metrics")
      ->capture_default_str();
  serve->add_option("--http-thread-count", flags->http_threads, "HTTP I/O threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  serve->add_option("--grpc-thread-count", flags->grpc_threads, "gRPC completion-queue threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  serve
      ->add_option("--model-control-mode", flags->model_control_mode,
                   "none: load all at start; poll: also apply changes on disk; explicit: "
                   "load/unload on request")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "poll", "explicit"}));
  serve
      ->add_option("--repository-poll-secs", flags->repository_poll_secs,
                   "Poll interval in poll mode, seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve->add_option("--load-model", flags->load_models,
                    "In explicit mode, a model to load at start (repeatable; '*' loads all)");
  serve->add_option("--backend-directory", flags->backend_directories,
                    "Folder searched for plugin backends libshoal_<name>.so (repeatable). Default: "
                    "$SHOAL_BACKEND_DIR, then the build or install tree's backends folder");
  serve
      ->add_option("--log-verbose", flags->log_verbose,
                   "Verbose logging level (0: info; 1 or more: debug)")
      ->capture_default_str();
  serve
      ->add_option(
          "--cache-size-bytes", flags->cache_size_bytes,
          "Response cache size for models with response_cache { enable: true }; 0 disables")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  serve
      ->add_option("--max-body-bytes", flags->max_body_bytes,
                   "Largest HTTP request body, after decompression")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--max-header-bytes", flags->max_header_bytes,
                   "Largest HTTP request header block")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--max-tensor-elements", flags->max_tensor_elements,
                   "Most elements in one request tensor")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve->add_option("--max-inputs", flags->max_inputs, "Most input tensors in one request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve->callback([flags] { std::exit(RunServe(*flags)); });
}

}  // namespace shoal::cli
