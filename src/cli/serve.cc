#include "cli/serve.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/common.h"
#include "core/log_text.h"
#include "runtime/server.h"
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
  int64_t grpc_max_message_bytes = 0;  // 0: max_body_bytes (up to INT32_MAX)
  int64_t max_header_bytes = int64_t{16} << 10;
  int64_t max_tensor_elements = int64_t{1} << 28;
  int64_t max_inputs = 64;
};

// Signals are taken by one thread with sigwait; block them everywhere else first, so
// every thread created from here on inherits the mask. Returns the blocked set.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

runtime::ServerOptions MakeServerOptions(const ServeFlags& f) {
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
  SetUpBackends(f.backend_directories, &options);
  options.cache_size_bytes = f.cache_size_bytes;
  options.limits.max_elements_per_tensor = f.max_tensor_elements;
  options.limits.max_inputs = f.max_inputs;
  return options;
}

// Loads the repository and logs each model's state; nullptr (logged) when the server
// cannot start.
std::unique_ptr<runtime::Server> CreateServer(const ServeFlags& f,
                                              const runtime::ServerOptions& options) {
  spdlog::info("shoal {} loading model repository '{}' (control mode {})", SHOAL_VERSION,
               LogSafe(f.model_repository), f.model_control_mode);
  auto created = runtime::Server::Create(options);
  if (!created.ok()) {
    spdlog::critical("cannot start: {}", LogSafe(created.status().message()));
    return nullptr;
  }
  std::unique_ptr<runtime::Server> server = std::move(created).value();
  for (const auto& m : server->RepositoryIndex()) {
    spdlog::info("model '{}' version {}: {}{}{}", LogSafe(m.name), m.version,
                 runtime::ModelStateName(m.state), m.reason.empty() ? "" : " - ", LogSafe(m.reason));
  }
  return server;
}

// The network services; each is null when disabled by its flag (or not built in).
struct Services {
#ifdef SHOAL_HAVE_HTTP
  std::unique_ptr<server::HttpServer> http;
  std::unique_ptr<server::MetricsServer> metrics;
#endif
#ifdef SHOAL_HAVE_GRPC
  std::unique_ptr<server::GrpcServer> grpc;
#endif
};

// Starts the services the flags allow, in the order HTTP, metrics, gRPC; false (logged)
// as soon as one cannot start.
bool StartServices(const ServeFlags& f, const runtime::ServerOptions& options,
                   runtime::Server* server, Services* services) {
#ifdef SHOAL_HAVE_HTTP
  if (f.allow_http) {
    server::HttpOptions o;
    o.address = f.address;
    o.port = f.http_port;
    o.threads = f.http_threads;
    o.max_body_bytes = f.max_body_bytes;
    o.max_header_bytes = f.max_header_bytes;
    o.limits = options.limits;
    services->http =
        LogServiceStart(server::HttpServer::Start(server, o), "HTTP", f.address, f.http_port);
    if (!services->http) return false;
  }
  if (f.allow_metrics) {
    services->metrics =
        LogServiceStart(server::MetricsServer::Start(server, f.address, f.metrics_port), "metrics",
                        f.address, f.metrics_port);
    if (!services->metrics) return false;
  }
#endif
#ifdef SHOAL_HAVE_GRPC
  if (f.allow_grpc) {
    server::GrpcOptions o;
    o.address = f.address;
    o.port = f.grpc_port;
    o.threads = f.grpc_threads;
    o.max_message_bytes = f.grpc_max_message_bytes > 0
                              ? f.grpc_max_message_bytes
                              : std::min<int64_t>(f.max_body_bytes, INT32_MAX);
    o.limits = options.limits;
    services->grpc =
        LogServiceStart(server::GrpcServer::Start(server, o), "gRPC", f.address, f.grpc_port);
    if (!services->grpc) return false;
  }
#endif
  return true;
}

// Poll mode: reloads what changed on disk every `interval_secs` (at least 1) on a
// thread of its own, until Stop.
class RepositoryPoller {
 public:
  RepositoryPoller(runtime::Server* server, int interval_secs) {
    thread_ = std::thread([this, server, interval_secs] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::seconds(std::max(interval_secs, 1)),
                           [&] { return stop_; })) {
        lock.unlock();
        if (Status s = server->PollRepository(); !s.ok())
          spdlog::warn("repository poll failed: {}", LogSafe(s.message()));
        lock.lock();
      }
    });
  }
  ~RepositoryPoller() { Stop(); }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

// Waits for SIGTERM or SIGINT (blocked in `signals`); from then on a second one exits
// at once.
void WaitForStopSignal(sigset_t signals) {
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
}

// Graceful stop: no new connections, answer everything queued and in flight (requests
// arriving meanwhile get 503), then close the services.
void Drain(runtime::Server& server, Services& services) {
#ifdef SHOAL_HAVE_HTTP
  if (services.http) services.http->StopAccepting();
#endif
  server.Shutdown();
#ifdef SHOAL_HAVE_GRPC
  if (services.grpc) services.grpc->Stop();
#endif
#ifdef SHOAL_HAVE_HTTP
  if (services.http) services.http->Stop();
  if (services.metrics) services.metrics->Stop();
#endif
}

int RunServe(const ServeFlags& f) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(f.log_verbose > 0 ? spdlog::level::debug : spdlog::level::info);
  const sigset_t signals = BlockStopSignals();

  if (!f.load_models.empty() && f.model_control_mode != "explicit") {
    // Outside explicit mode every model loads at start, and --load-model would be
    // silently ignored: refuse, so a configuration does not mean something it does not.
    spdlog::critical(
        "cannot start: --load-model applies only with --model-control-mode explicit (the mode "
        "is '{}', which loads every model in the repository)",
        f.model_control_mode);
    return 1;
  }
  const runtime::ServerOptions options = MakeServerOptions(f);
  std::unique_ptr<runtime::Server> server = CreateServer(f, options);
  if (!server) return 1;
  Services services;
  if (!StartServices(f, options, server.get(), &services)) return 1;
  std::unique_ptr<RepositoryPoller> poller;
  if (options.control_mode == runtime::ModelControlMode::kPoll) {
    poller = std::make_unique<RepositoryPoller>(server.get(), f.repository_poll_secs);
  }

  spdlog::info("shoal is ready: {} (SIGTERM or Ctrl-C to stop)",
               server->ready() ? "all models loaded" : "some models failed to load");
  WaitForStopSignal(signals);
  if (poller) poller->Stop();
  Drain(*server, services);
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
                    "A model to load at start (repeatable; '*' loads all). Explicit mode "
                    "only: with another --model-control-mode, shoal refuses to start");
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
      ->add_option("--grpc-max-message-bytes", flags->grpc_max_message_bytes,
                   "Largest gRPC message received or sent, 1..2147483647 (default: "
                   "--max-body-bytes)")
      ->check(CLI::Range(int64_t{1}, int64_t{INT32_MAX}));
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
