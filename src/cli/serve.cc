#include "cli/serve.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "cli/common.h"
#include "core/log_text.h"
#include "core/mutex.h"
#include "runtime/server.h"
#include "server/auth.h"
#include "server/request_log.h"
#include "server/tcp_listener.h"
#include "server/tls.h"
#ifdef SHOAL_HAVE_HTTP
#include "server/http_server.h"
#include "server/metrics.h"
#endif
#ifdef SHOAL_HAVE_ONNX
#include "backends/onnx/gpu_instance.h"
#endif
#ifdef SHOAL_HAVE_ENGINE
#include "engine/omp_wait_policy.h"
#endif
#ifdef SHOAL_HAVE_GRPC
#include "server/grpc_server.h"
#endif

namespace shoal::cli {
namespace {

struct ServeFlags {
  std::string model_repository;
  std::string address = "0.0.0.0";  // the default of the three below
  std::string http_address;         // empty: `address`
  std::string grpc_address;
  std::string metrics_address;
  int http_port = 8000;
  int grpc_port = 8001;
  int metrics_port = 8002;
  bool allow_http = true;
  bool allow_grpc = true;
  bool allow_metrics = true;
  int http_threads = 2;
  int http_codec_threads = 2;
  int64_t http_offload_bytes = int64_t{256} << 10;
  int grpc_threads = 2;
  std::string model_control_mode = "none";
  int repository_poll_secs = 15;
  std::vector<std::string> load_models;
  std::vector<std::string> backend_directories;
  int log_verbose = 0;
  bool strict_readiness = true;
  int64_t cache_size_bytes = int64_t{64} << 20;
  int64_t max_body_bytes = int64_t{64} << 20;
  int64_t grpc_max_message_bytes = 0;  // 0: max_body_bytes (up to INT32_MAX)
  int64_t max_header_bytes = int64_t{16} << 10;
  int64_t max_tensor_elements = int64_t{1} << 28;
  int64_t max_inputs = 64;
  int64_t max_inflight_requests = 4096;
  int http_max_connections = 10000;
  int64_t http_receiving_body_budget_bytes = int64_t{1} << 30;
  int64_t http_idle_timeout_ms = 300'000;
  int64_t http_header_timeout_ms = 30'000;
  int64_t http_body_timeout_ms = 300'000;
  std::string auth_token_file;  // empty: no authentication
  std::string auth_scope = "control";
  // TLS for both front ends, unless the per-service flags say otherwise.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  bool http_use_tls = false;
  bool http_use_tls_given = false;  // else: on when tls_cert_file is set
  // Triton's spellings for gRPC; its certificate and key override --tls-*.
  bool grpc_use_ssl = false;
  bool grpc_use_ssl_given = false;  // else: on when gRPC has a certificate
  bool grpc_use_ssl_mutual = false;
  bool grpc_use_ssl_mutual_given = false;  // else: on when --tls-ca-file is set
  std::string grpc_server_cert;
  std::string grpc_server_key;
  std::string grpc_root_cert;

  const std::string& HttpAddress() const { return http_address.empty() ? address : http_address; }
  const std::string& GrpcAddress() const { return grpc_address.empty() ? address : grpc_address; }
  const std::string& MetricsAddress() const {
    return metrics_address.empty() ? address : metrics_address;
  }
};

// The TLS settings of each front end, resolved from the flags (see AddServeCommand).
struct TlsPlan {
  server::TlsOptions http;  // cert_file empty: plaintext
  server::TlsOptions grpc;
};

// INVALID_ARGUMENT naming the flags when TLS is asked for without what it needs.
StatusOr<TlsPlan> PlanTls(const ServeFlags& f) {
  TlsPlan plan;
  if (f.tls_cert_file.empty() != f.tls_key_file.empty())
    return InvalidArgument("--tls-cert-file and --tls-key-file go together");
  if (!f.tls_ca_file.empty() && f.tls_cert_file.empty() && f.grpc_server_cert.empty())
    return InvalidArgument("--tls-ca-file needs a server certificate (--tls-cert-file)");
  const bool http_tls = f.http_use_tls_given ? f.http_use_tls : !f.tls_cert_file.empty();
  if (http_tls) {
    if (f.tls_cert_file.empty())
      return InvalidArgument("--http-use-tls needs --tls-cert-file and --tls-key-file");
    plan.http = {f.tls_cert_file, f.tls_key_file, f.tls_ca_file};
  }
  const std::string cert = f.grpc_server_cert.empty() ? f.tls_cert_file : f.grpc_server_cert;
  const std::string key = f.grpc_server_key.empty() ? f.tls_key_file : f.grpc_server_key;
  const bool mutual = f.grpc_use_ssl_mutual_given ? f.grpc_use_ssl_mutual : !f.tls_ca_file.empty();
  // As in Triton, mutual TLS implies TLS.
  const bool grpc_tls = mutual || (f.grpc_use_ssl_given ? f.grpc_use_ssl : !cert.empty());
  if (grpc_tls) {
    if (cert.empty() || key.empty()) {
      return InvalidArgument(
          "gRPC TLS needs a certificate and a key (--tls-cert-file and --tls-key-file, or "
          "--grpc-server-cert and --grpc-server-key)");
    }
    plan.grpc = {cert, key, ""};
    if (mutual) {
      plan.grpc.ca_file = f.grpc_root_cert.empty() ? f.tls_ca_file : f.grpc_root_cert;
      if (plan.grpc.ca_file.empty())
        return InvalidArgument("--grpc-use-ssl-mutual needs --grpc-root-cert or --tls-ca-file");
    }
  }
  return plan;
}

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
  options.max_inflight_requests = f.max_inflight_requests;
  options.strict_readiness = f.strict_readiness;
  return options;
}

// Scans the repository without loading a model (see LoadAndReport); nullptr (logged)
// when the server cannot start.
std::unique_ptr<runtime::Server> OpenServer(const ServeFlags& f,
                                            const runtime::ServerOptions& options) {
  spdlog::info("shoal {} loading model repository '{}' (control mode {})", SHOAL_VERSION,
               LogSafe(f.model_repository), f.model_control_mode);
#ifdef SHOAL_HAVE_ENGINE
  spdlog::info("engine threads wait for work with {}",
               LogSafe(engine::CurrentOmpWaitPolicy().description));
#endif
  auto opened = runtime::Server::Open(options);
  if (!opened.ok()) {
    spdlog::critical("cannot start: {}", LogSafe(opened.status().message()));
    return nullptr;
  }
  return std::move(opened).value();
}

// Loads the start-up models (the front ends already answer health checks: live, not
// ready) and logs each model's state, then whether the server is ready.
void LoadAndReport(runtime::Server& server) {
  server.LoadStartupModels();
  int failed = 0;
  for (const auto& m : server.RepositoryIndex()) {
    spdlog::info("model '{}' version {}: {}{}{}", LogSafe(m.name), m.version,
                 runtime::ModelStateName(m.state), m.reason.empty() ? "" : " - ",
                 LogSafe(m.reason));
    if (m.state != runtime::ModelState::kReady && m.reason != "not loaded") ++failed;
  }
  // The e2e tests' ShoalProcess::WaitForPort waits for "start-up loading finished".
  spdlog::info("start-up loading finished: {}; the server is {}ready (SIGTERM or Ctrl-C to stop)",
               failed == 0 ? std::string("every model loaded")
                           : std::to_string(failed) + " model(s) failed to load",
               server.ready() ? "" : "not ");
}

#ifdef SHOAL_HAVE_HTTP
server::HttpOptions MakeHttpOptions(const ServeFlags& f, const runtime::ServerOptions& options,
                                    std::shared_ptr<const server::Authenticator> auth,
                                    const server::TlsOptions& tls) {
  server::HttpOptions o;
  o.address = f.HttpAddress();
  o.port = f.http_port;
  o.threads = f.http_threads;
  o.codec_threads = f.http_codec_threads;
  o.offload_bytes = f.http_offload_bytes;
  o.max_body_bytes = f.max_body_bytes;
  o.max_header_bytes = f.max_header_bytes;
  o.limits = options.limits;
  o.max_connections = f.http_max_connections;
  o.receiving_body_budget_bytes = f.http_receiving_body_budget_bytes;
  o.idle_timeout_ms = f.http_idle_timeout_ms;
  o.header_timeout_ms = f.http_header_timeout_ms;
  o.body_timeout_ms = f.http_body_timeout_ms;
  o.auth = std::move(auth);
  o.tls = tls;
  return o;
}
#endif

// The sockets of the enabled services, bound before any model loads so that a port
// clash ends `shoal serve` at once. HTTP and metrics adopt theirs; gRPC binds its own
// sockets, so its listener only holds the port until the gRPC server takes it.
struct Listeners {
  server::TcpListener http;
  server::TcpListener metrics;
  server::TcpListener grpc;
};

// Binds the ports of the services the flags allow (HTTP, metrics, gRPC); false (logged:
// one line naming the address) as soon as one cannot be bound.
bool BindPorts(const ServeFlags& f, Listeners* out) {
  struct Port {
    bool enabled;
    const char* name;
    std::string address;
    int port;
    server::TcpListener* listener;
  };
  std::vector<Port> ports;
#ifdef SHOAL_HAVE_HTTP
  ports.push_back({f.allow_http, "HTTP", f.HttpAddress(), f.http_port, &out->http});
  ports.push_back({f.allow_metrics, "metrics", f.MetricsAddress(), f.metrics_port, &out->metrics});
#endif
#ifdef SHOAL_HAVE_GRPC
  ports.push_back({f.allow_grpc, "gRPC", f.GrpcAddress(), f.grpc_port, &out->grpc});
#endif
  for (const auto& p : ports) {
    if (!p.enabled) continue;
    auto bound = server::TcpListener::Listen(p.address, p.port);
    if (!bound.ok()) {
      LogServiceFailed(p.name, p.address, p.port, bound.status());
      return false;
    }
    *p.listener = std::move(bound).value();
  }
  return true;
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

// Starts the services the flags allow on the bound `listeners`, in the order HTTP,
// metrics, gRPC; false (logged) as soon as one cannot start.
bool StartServices(const ServeFlags& f, const runtime::ServerOptions& options,
                   const std::shared_ptr<const server::Authenticator>& auth, const TlsPlan& tls,
                   runtime::Server* server, Listeners listeners, Services* services) {
#if defined(SHOAL_HAVE_HTTP) || defined(SHOAL_HAVE_GRPC)
  // Shared memory regions and trace settings are the server's, whichever protocol set them.
  auto extension_state = std::make_shared<server::ExtensionState>();
#ifdef SHOAL_HAVE_ONNX
  // CUDA shared-memory regions open where this shoal has the CUDA path.
  extension_state->shared_memory.SetDeviceMemoryOpener(backends::CudaIpcOpener());
#endif
#endif
#ifdef SHOAL_HAVE_HTTP
  if (listeners.http.valid()) {
    const int port = listeners.http.port();
    server::HttpOptions http_options = MakeHttpOptions(f, options, auth, tls.http);
    http_options.extension_state = extension_state;
    services->http = LogServiceStart(
        server::HttpServer::Start(server, std::move(http_options), std::move(listeners.http)),
        "HTTP", f.HttpAddress(), port);
    if (!services->http) return false;
  }
  if (listeners.metrics.valid()) {
    const int port = listeners.metrics.port();
    services->metrics =
        LogServiceStart(server::MetricsServer::Start(server, std::move(listeners.metrics)),
                        "metrics", f.MetricsAddress(), port);
    if (!services->metrics) return false;
  }
#endif
#ifdef SHOAL_HAVE_GRPC
  if (listeners.grpc.valid()) {
    server::GrpcOptions o;
    o.address = f.GrpcAddress();
    o.port = listeners.grpc.port();  // the one bound, also when the flag asked for any (0)
    o.threads = f.grpc_threads;
    o.max_message_bytes = f.grpc_max_message_bytes > 0
                              ? f.grpc_max_message_bytes
                              : std::min<int64_t>(f.max_body_bytes, INT32_MAX);
    o.limits = options.limits;
    o.auth = auth;
    o.tls = tls.grpc;
    o.extension_state = extension_state;
    // Handed over by closing: gRPC binds the port again at once. (Only another process
    // binding it in between can make this fail.)
    listeners.grpc.Close();
    services->grpc =
        LogServiceStart(server::GrpcServer::Start(server, o), "gRPC", f.GrpcAddress(), o.port);
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
    thread_ = std::thread([this, server, interval_secs] { Run(server, interval_secs); });
  }
  ~RepositoryPoller() { Stop(); }

  void Stop() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run(runtime::Server* server, int interval_secs) EXCLUDES(mu_) {
    const auto interval = std::chrono::seconds(std::max(interval_secs, 1));
    MutexLock lock(&mu_);
    auto next_poll = std::chrono::steady_clock::now() + interval;
    while (!stop_) {
      if (cv_.WaitUntil(&mu_, next_poll) == std::cv_status::no_timeout || stop_) continue;
      lock.Unlock();
      if (Status s = server->PollRepository(); !s.ok())
        spdlog::warn("repository poll failed: {}", LogSafe(s.message()));
      lock.Lock();
      next_poll = std::chrono::steady_clock::now() + interval;
    }
  }

  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
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
  // The process's one verbose level (core/log_settings.h; also set by the logging
  // extension), and spdlog's level with it.
  server::SetLogVerboseLevel(std::max(f.log_verbose, 0));
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
  std::shared_ptr<const server::Authenticator> auth;
  if (!f.auth_token_file.empty()) {
    auto created =
        server::Authenticator::FromFile(f.auth_token_file, *server::ParseAuthScope(f.auth_scope));
    if (!created.ok()) {
      spdlog::critical("cannot start: {}", LogSafe(created.status().message()));
      return 1;
    }
    auth = std::move(created).value();
    spdlog::info("authentication: a bearer token is required for {}",
                 auth->scope() == server::AuthScope::kAll
                     ? "every endpoint but health checks (scope all)"
                     : "model control (scope control)");
  }
  auto tls = PlanTls(f);
  if (!tls.ok()) {
    spdlog::critical("cannot start: {}", tls.status().message());
    return 1;
  }
#ifdef SHOAL_HAVE_HTTP
  if (f.allow_http) {
    if (Status s = server::HttpServer::Validate(MakeHttpOptions(f, options, auth, tls->http));
        !s.ok()) {
      spdlog::critical("cannot start: {}", LogSafe(s.message()));
      return 1;
    }
    if (!tls->http.cert_file.empty()) {
      spdlog::info("HTTP speaks TLS{}",
                   tls->http.ca_file.empty() ? "" : " and requires client certificates");
    }
  }
#endif
#ifdef SHOAL_HAVE_GRPC
  if (f.allow_grpc && !tls->grpc.cert_file.empty()) {
    if (auto files = server::LoadTlsFiles(tls->grpc); !files.ok()) {
      spdlog::critical("cannot start: {}", LogSafe(files.status().message()));
      return 1;
    }
    spdlog::info("gRPC speaks TLS{}",
                 tls->grpc.ca_file.empty() ? "" : " and requires client certificates");
  }
#endif
  // Every port first, so that a clash is reported before minutes of loading models;
  // clients that connect meanwhile wait in the listen backlog.
  Listeners listeners;
  if (!BindPorts(f, &listeners)) return 1;
  std::unique_ptr<runtime::Server> server = OpenServer(f, options);
  if (!server) return 1;
  // The front ends start before any model loads, so health checks are answered (live,
  // not ready) however long loading takes; inference on a model still loading answers
  // 503 / UNAVAILABLE.
  Services services;
  if (!StartServices(f, options, auth, *tls, server.get(), std::move(listeners), &services))
    return 1;
  // Loading runs beside the signal wait, so SIGTERM during a long load stops it after
  // the model loading now. `poller` is written by `loader` only, and read after the join.
  std::unique_ptr<RepositoryPoller> poller;
  std::thread loader([&] {
    LoadAndReport(*server);
    if (options.control_mode == runtime::ModelControlMode::kPoll) {
      poller = std::make_unique<RepositoryPoller>(server.get(), f.repository_poll_secs);
    }
  });
  WaitForStopSignal(signals);
  server->CancelStartupLoading();
  loader.join();
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
  serve
      ->add_option("--address", flags->address,
                   "Address every service binds to unless its own --*-address says otherwise "
                   "(0.0.0.0: all IPv4 interfaces; :: all interfaces)")
      ->capture_default_str();
  serve->add_option("--http-address", flags->http_address,
                    "Address the HTTP/REST service binds to (default: --address)");
  serve->add_option("--grpc-address", flags->grpc_address,
                    "Address the gRPC service binds to (default: --address)");
  serve->add_option("--metrics-address", flags->metrics_address,
                    "Address the metrics service binds to (default: --address)");
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
  serve
      ->add_option("--http-codec-thread-count", flags->http_codec_threads,
                   "Threads decoding large or compressed HTTP requests and encoding large JSON "
                   "answers off the I/O threads (0: on the I/O threads)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  serve
      ->add_option("--http-offload-bytes", flags->http_offload_bytes,
                   "Infer bodies larger than this (and all compressed ones), and answers with "
                   "more tensor bytes to write as JSON, go to the codec threads")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
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
                   "Verbose logging level, as Triton's (0: info; 1 or more: debug, with one line "
                   "per inference request: model, version, protocol, status, queue, compute and "
                   "total time). Internal errors (500) are logged at every level")
      ->capture_default_str();
  serve
      ->add_option("--strict-readiness", flags->strict_readiness,
                   "true: ready only when every model that should be loaded is READY; false: "
                   "ready once start-up loading finished, even if some models failed (Triton's "
                   "option). Never ready before start-up loading finished or while stopping")
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
  serve
      ->add_option("--max-inflight-requests", flags->max_inflight_requests,
                   "Inference requests accepted and not yet answered, over all models; beyond "
                   "it requests get 429 at once. 0 = no cap")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  serve
      ->add_option("--http-max-connections", flags->http_max_connections,
                   "Most open HTTP connections (at least --http-thread-count); at the cap, the "
                   "oldest idle keep-alive connection is closed to let a new client in")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--http-receiving-body-budget-bytes", flags->http_receiving_body_budget_bytes,
                   "Bytes all HTTP request bodies still being received may hold together (at "
                   "least --max-body-bytes); a body past it gets 503")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--http-idle-timeout-ms", flags->http_idle_timeout_ms,
                   "Close an HTTP keep-alive connection idle this long, ms")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--http-header-timeout-ms", flags->http_header_timeout_ms,
                   "A request head must be complete this long after its first byte (408), ms")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--http-body-timeout-ms", flags->http_body_timeout_ms,
                   "A request body must be complete this long after its head (408), ms")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI::Option* token_file =
      serve->add_option("--auth-token-file", flags->auth_token_file,
                        "File holding a bearer token (its trailing newline removed) that "
                        "clients must send as 'Authorization: Bearer <token>' (HTTP) or "
                        "'authorization' metadata (gRPC) on the endpoints of --auth-scope; "
                        "health checks and the metrics port stay open");
  serve
      ->add_option("--auth-scope", flags->auth_scope,
                   "What the token guards: control (repository index, load, unload) or all "
                   "(also inference, metadata, configuration, statistics)")
      ->capture_default_str()
      ->check(CLI::IsMember({"control", "all"}))
      ->needs(token_file);
  CLI::Option* tls_cert = serve->add_option(
      "--tls-cert-file", flags->tls_cert_file,
      "PEM certificate chain (server certificate first): HTTP and gRPC speak TLS with it "
      "unless --http-use-tls / --grpc-use-ssl turn one off");
  CLI::Option* tls_key = serve->add_option("--tls-key-file", flags->tls_key_file,
                                           "PEM private key of --tls-cert-file (unencrypted)");
  tls_cert->needs(tls_key);
  tls_key->needs(tls_cert);
  serve->add_option("--tls-ca-file", flags->tls_ca_file,
                    "PEM CA certificates: clients must present a certificate signed by one "
                    "(mutual TLS) on every TLS front end");
  CLI::Option* http_use_tls =
      serve->add_option("--http-use-tls", flags->http_use_tls,
                        "Serve HTTP over TLS (default: on when --tls-cert-file is given)");
  CLI::Option* grpc_use_ssl = serve->add_option(
      "--grpc-use-ssl", flags->grpc_use_ssl,
      "Serve gRPC over TLS, as Triton's flag (default: on when gRPC has a certificate)");
  CLI::Option* grpc_use_ssl_mutual = serve->add_option(
      "--grpc-use-ssl-mutual", flags->grpc_use_ssl_mutual,
      "Require client certificates on gRPC, as Triton's flag; implies --grpc-use-ssl "
      "(default: on when --tls-ca-file is given)");
  serve->add_option("--grpc-server-cert", flags->grpc_server_cert,
                    "Triton's spelling: gRPC's PEM certificate (default: --tls-cert-file)");
  serve->add_option("--grpc-server-key", flags->grpc_server_key,
                    "Triton's spelling: gRPC's PEM key (default: --tls-key-file)");
  serve->add_option("--grpc-root-cert", flags->grpc_root_cert,
                    "Triton's spelling: the CA certificates gRPC checks client certificates "
                    "against with --grpc-use-ssl-mutual (default: --tls-ca-file)");
  serve->callback([flags, http_use_tls, grpc_use_ssl, grpc_use_ssl_mutual] {
    flags->http_use_tls_given = http_use_tls->count() > 0;
    flags->grpc_use_ssl_given = grpc_use_ssl->count() > 0;
    flags->grpc_use_ssl_mutual_given = grpc_use_ssl_mutual->count() > 0;
    std::exit(RunServe(*flags));
  });
}

}  // namespace shoal::cli
