#include "cli/worker.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/common.h"
#include "core/log_text.h"
#include "runtime/server.h"
#include "worker/worker.h"
#ifdef SHOAL_HAVE_HTTP
#include "server/dashboard.h"
#include "server/http_infer_codec.h"
#include "server/metrics.h"
#endif

namespace shoal::cli {
namespace {

#ifdef SHOAL_HAVE_HTTP

// The payload is a KServe v2 HTTP infer request body and the result the body an HTTP
// client would get: the HTTP front end's own codec (server/http_infer_codec.h), which the
// worker layer may not include itself. Shared memory is refused: a queue producer has no
// region registered with this process.
class HttpPayloadCodec final : public worker::PayloadCodec {
 public:
  explicit HttpPayloadCodec(runtime::RequestLimits limits) : limits_(limits) {}

  StatusOr<Decoded> Decode(std::string payload,
                           std::optional<std::string_view> header_length) const override {
    // Binary tensors that follow the JSON part land aligned, as on the HTTP path.
    size_t align_at = 0;
    if (header_length) {
      auto split = server::SplitBinaryBody(payload, header_length);
      if (!split.ok()) return split.status();
      align_at = split->json.size();
    }
    auto body = proto::BodyBuffer::Create(payload.size(), align_at);
    std::memcpy(body->data(), payload.data(), payload.size());
    body->set_size(payload.size());
    ASSIGN_OR_RETURN(server::ParsedInfer parsed,
                     server::ParseInferRequest(body, header_length, limits_));
    if (!parsed.shared_memory_inputs.empty() || !parsed.encoding.shared_memory.empty()) {
      return InvalidArgument("shared memory parameters are not available to queue workers");
    }
    Decoded d;
    d.request = std::move(parsed.request);
    d.encoding = std::make_shared<const server::OutputEncoding>(std::move(parsed.encoding));
    return d;
  }

  StatusOr<Encoded> Encode(const runtime::InferResponse& response,
                           const std::shared_ptr<const void>& encoding) const override {
    const auto* e = static_cast<const server::OutputEncoding*>(encoding.get());
    ASSIGN_OR_RETURN(proto::HttpResponse http,
                     server::SerializeInferResponse(response, e ? *e : server::OutputEncoding{}));
    Encoded out;
    out.body = std::move(http.body);
    if (!http.tail.empty()) out.header_length = static_cast<int64_t>(out.body.size());
    for (const proto::BodyChunk& chunk : http.tail) out.body.append(chunk.bytes);
    return out;
  }

 private:
  const runtime::RequestLimits limits_;
};

#endif  // SHOAL_HAVE_HTTP

struct WorkerFlags {
  std::string redis = "redis://127.0.0.1:6379";
  worker::WorkerOptions worker;
  std::string model_repository;
  std::vector<std::string> backend_directories;
  std::string metrics_address = "0.0.0.0";
  int metrics_port = 8002;
  bool allow_metrics = true;
  int64_t max_tensor_elements = int64_t{1} << 28;
  int64_t max_inputs = 64;
};

int RunWorker(WorkerFlags& f) {
#ifndef SHOAL_HAVE_HTTP
  spdlog::critical("shoal worker needs the HTTP codec, which this binary was built without");
  return 1;
#else
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  // SIGTERM and SIGINT are taken by one thread with sigwait; block them before any other
  // thread starts, so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto address = worker::ParseRedisUrl(f.redis);
  if (!address.ok()) {
    spdlog::critical("{}", address.status().message());
    return 2;
  }
  f.worker.redis = *address;

  runtime::ServerOptions options;
  options.model_repository = f.model_repository;
  SetUpBackends(f.backend_directories, &options);
  options.limits.max_elements_per_tensor = f.max_tensor_elements;
  options.limits.max_inputs = f.max_inputs;
  // The worker bounds what it holds itself; the runtime's cap must not refuse it first.
  options.max_inflight_requests = std::max<int64_t>(4096, f.worker.max_inflight * 2);
  spdlog::info("shoal {} loading model repository '{}'", SHOAL_VERSION,
               LogSafe(f.model_repository));
  auto created = runtime::Server::Create(options);
  if (!created.ok()) {
    spdlog::critical("cannot start: {}", LogSafe(created.status().message()));
    return 1;
  }
  std::unique_ptr<runtime::Server> server = std::move(created).value();
  for (const auto& m : server->RepositoryIndex()) {
    spdlog::info("model '{}' version {}: {}{}{}", LogSafe(m.name), m.version,
                 runtime::ModelStateName(m.state), m.reason.empty() ? "" : " - ",
                 LogSafe(m.reason));
  }

  auto made = worker::Worker::Create(f.worker, server.get(),
                                     std::make_shared<HttpPayloadCodec>(options.limits));
  if (!made.ok()) {
    spdlog::critical("cannot start the worker: {}", LogSafe(made.status().message()));
    return 1;
  }
  std::unique_ptr<worker::Worker> w = std::move(made).value();

  std::unique_ptr<server::MetricsServer> metrics;
  if (f.allow_metrics) {
    worker::Worker* raw = w.get();
    metrics = LogServiceStart(
        server::MetricsServer::Start(server.get(), f.metrics_address, f.metrics_port,
                                     [raw] { return worker::RenderWorkerMetrics(*raw); }),
        "metrics", f.metrics_address, f.metrics_port);
    if (!metrics) return 1;
    // The dashboard on the same port shows the worker's progress and the group's lag.
    Status added = metrics->dashboard().AddSection("worker", [raw] {
      const worker::WorkerStats s = raw->stats();
      const auto known = [](int64_t v) { return v < 0 ? std::nan("") : static_cast<double>(v); };
      server::DashboardSection section;
      section.title = "Redis Streams worker";
      section.charts.push_back({"progress (entries, total)",
                                {{"acknowledged", static_cast<double>(s.acked)},
                                 {"read", static_cast<double>(s.read_new)},
                                 {"claimed", static_cast<double>(s.claimed)}}});
      section.charts.push_back(
          {"group lag and pending (entries)",
           {{"lag", known(s.group_lag)}, {"pending", known(s.group_pending)}}});
      section.charts.push_back(
          {"held by this worker (entries)",
           {{"held", static_cast<double>(s.held)}, {"capacity", static_cast<double>(s.capacity)}}});
      section.charts.push_back(
          {"dead-lettered and retried (entries, total)",
           {{"dead", static_cast<double>(s.dead_malformed + s.dead_failed + s.dead_deliveries)},
            {"retried", static_cast<double>(s.retries_here + s.retries_later)}}});
      return section;
    });
    if (!added.ok()) spdlog::warn("dashboard: {}", LogSafe(added.message()));
  }

  std::thread([signals, raw = w.get()]() mutable {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("received {}: finishing the entries in flight (a second signal exits at once)",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT");
    raw->Stop();
    sigwait(&signals, &sig);
    std::_Exit(1);
  }).detach();

  w->Run();
  if (metrics) metrics->Stop();
  server->Shutdown();
  return 0;
#endif
}

}  // namespace

void AddWorkerCommand(CLI::App& app) {
  auto flags = std::make_shared<WorkerFlags>();
  CLI::App* cmd = app.add_subcommand(
      "worker", "Consume inference requests from a Redis stream through a consumer group");
  worker::WorkerOptions& o = flags->worker;
  cmd->add_option("--redis", flags->redis,
                  "Redis server, redis://[[user]:password@]host[:port][/db]")
      ->capture_default_str();
  cmd->add_option("--stream", o.stream, "The request stream")->required();
  cmd->add_option("--group", o.group,
                  "The consumer group (created if missing, to read the stream from its start)")
      ->required();
  cmd->add_option("--consumer", o.consumer,
                  "This worker's name in the group, unique among live workers (default: "
                  "<hostname>-<pid>)");
  cmd->add_option("--model-repository", flags->model_repository, "Model repository folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--backend-directory", flags->backend_directories,
                  "Folder searched for plugin backends (repeatable)");
  cmd->add_option("--result-prefix", o.result_prefix,
                  "Results go to the hash <prefix><request id> (default: <stream>:result:)");
  cmd->add_option("--result-stream", o.result_stream,
                  "One entry (id, status) per stored result (default: <stream>:results)");
  cmd->add_option("--dead-letter-stream", o.dead_letter_stream,
                  "Poison entries go here with the reason (default: <stream>:dead)");
  cmd->add_option("--result-ttl-s", o.result_ttl_s, "Result hashes expire after this (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--result-stream-maxlen", o.result_stream_maxlen,
                  "Trim the result stream to about this many entries (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-inflight", o.max_inflight,
                  "Most entries held at once (read and not yet acknowledged)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--claim-idle-ms", o.claim_idle_ms,
                  "Claim entries pending this long at another consumer, presumed dead; must "
                  "exceed the longest request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--claim-interval-ms", o.claim_interval_ms, "How often to look for such entries")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-deliveries", o.max_deliveries,
                  "Dead-letter an entry delivered this many times without an answer")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--block-ms", o.block_ms, "How long one read waits for new entries")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-payload-bytes", o.max_payload_bytes,
                  "Dead-letter entries whose payload is larger")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--metrics-address", flags->metrics_address, "Address the metrics service binds")
      ->capture_default_str();
  cmd->add_option("--metrics-port", flags->metrics_port, "Prometheus metrics port (0: any free)")
      ->capture_default_str();
  cmd->add_option("--allow-metrics", flags->allow_metrics, "Serve Prometheus metrics")
      ->capture_default_str();
  cmd->add_option("--max-tensor-elements", flags->max_tensor_elements,
                  "Most elements in one request tensor")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-inputs", flags->max_inputs, "Most input tensors in one request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([flags] { std::exit(RunWorker(*flags)); });
}

}  // namespace shoal::cli
