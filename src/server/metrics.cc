#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>

#include "server/http_core.h"
#include "server/process_stats.h"

namespace shoal::server {
namespace {

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // The shortest form that reads back exactly, written as Prometheus' own clients write
  // it (Go's 'g' format): fixed from 1e-4 up to 1e6, scientific outside. So bucket labels
  // read le="0.0001" and le="5e-05", as queries written against other exporters expect.
  const double a = std::fabs(v);
  const auto format =
      a == 0 || (a >= 1e-4 && a < 1e6) ? std::chars_format::fixed : std::chars_format::scientific;
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, format);
  return std::string(buf, r.ptr);
}

void AppendLabelValue(std::string* out, std::string_view v) {
  for (char c : v) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '"') {
      out->append("\\\"");
    } else if (c == '\n') {
      out->append("\\n");
    } else {
      out->push_back(c);
    }
  }
}

using Labels = std::vector<std::pair<std::string_view, std::string>>;

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}

  void Family(std::string_view name, std::string_view type, std::string_view help) {
    out_->append("# HELP ").append(name).append(" ").append(help).append("\n");
    out_->append("# TYPE ").append(name).append(" ").append(type).append("\n");
  }

  void Sample(std::string_view name, const Labels& labels, double value) {
    out_->append(name);
    if (!labels.empty()) {
      out_->push_back('{');
      bool first = true;
      for (const auto& [k, v] : labels) {
        if (!first) out_->push_back(',');
        first = false;
        out_->append(k).append("=\"");
        AppendLabelValue(out_, v);
        out_->push_back('"');
      }
      out_->push_back('}');
    }
    out_->push_back(' ');
    out_->append(Number(value));
    out_->push_back('\n');
  }

  // A histogram from non-cumulative bucket counts; bounds and sum are divided by `per_unit`
  // (1e6: microseconds -> seconds). Dividing keeps the bounds' labels exact: 50 / 1e6
  // prints as 5e-05, where 50 * 1e-6 prints as 4.9999999999999996e-05, and a query that
  // selects le="5e-05" would find nothing.
  void Histogram(std::string_view name, const Labels& labels, const runtime::Histogram& h,
                 double per_unit) {
    const std::string bucket = std::string(name) + "_bucket";
    uint64_t cumulative = 0;
    const auto& bounds = h.bounds();
    const auto& counts = h.bucket_counts();
    for (size_t i = 0; i < counts.size(); ++i) {
      cumulative += counts[i];
      Labels l = labels;
      l.emplace_back("le", i < bounds.size() ? Number(bounds[i] / per_unit) : std::string("+Inf"));
      Sample(bucket, l, static_cast<double>(cumulative));
    }
    Sample(std::string(name) + "_sum", labels, h.sum() / per_unit);
    Sample(std::string(name) + "_count", labels, static_cast<double>(h.count()));
  }

 private:
  std::string* out_;
};

struct VersionView {
  std::string model, version;
  runtime::ModelStatsSnapshot stats;
  std::vector<runtime::InstanceStats> instances;
  int64_t queue_depth = 0, in_flight = 0;
  double admission_reserve = 0;
  Labels labels() const { return {{"model", model}, {"version", version}}; }
};

// The ready versions, sorted by model then version so the text is stable between scrapes.
std::vector<VersionView> CollectVersions(const runtime::Server& server) {
  std::vector<VersionView> views;
  for (const auto& mv : server.ReadyVersions()) {
    VersionView v;
    v.model = mv->name();
    v.version = std::to_string(mv->version());
    v.stats = mv->stats();
    v.instances = mv->instance_stats();
    v.queue_depth = static_cast<int64_t>(mv->queue_depth());
    v.admission_reserve = mv->admission_reserve();
    v.in_flight = mv->in_flight();
    views.push_back(std::move(v));
  }
  std::sort(views.begin(), views.end(), [](const VersionView& a, const VersionView& b) {
    return a.model != b.model ? a.model < b.model : a.version < b.version;
  });
  return views;
}

// Requests by outcome and rejection reason, items, executions, per-model cache counters.
void WriteRequestCounters(Writer& w, const std::vector<VersionView>& views) {
  w.Family(
      "shoal_inference_requests_total", "counter",
      "Requests answered, by outcome (success includes cache hits; failure includes rejections).");
  for (const auto& v : views) {
    Labels l = v.labels();
    l.emplace_back("outcome", "success");
    w.Sample("shoal_inference_requests_total", l, static_cast<double>(v.stats.success.count));
    l.back().second = "failure";
    w.Sample("shoal_inference_requests_total", l, static_cast<double>(v.stats.fail.count));
  }
  w.Family("shoal_inference_rejections_total", "counter",
           "Failed requests that never ran, by reason: queue_full, overload, invalid, timeout, "
           "deadline, cancelled.");
  for (const auto& v : views) {
    const std::pair<const char*, uint64_t> reasons[] = {
        {"queue_full", v.stats.rejected_queue_full}, {"overload", v.stats.rejected_overload},
        {"invalid", v.stats.rejected_invalid},       {"timeout", v.stats.timed_out},
        {"deadline", v.stats.deadline_missed},       {"cancelled", v.stats.cancelled}};
    for (const auto& [reason, n] : reasons) {
      Labels l = v.labels();
      l.emplace_back("reason", reason);
      w.Sample("shoal_inference_rejections_total", l, static_cast<double>(n));
    }
  }
  w.Family("shoal_precision_requests_total", "counter",
           "Requests answered per precision tier (models with a precision ladder, or requests "
           "that chose a tier).");
  for (const auto& v : views) {
    for (const auto& [tier, n] : v.stats.precision_requests) {
      Labels l = v.labels();
      l.emplace_back("precision", tier);
      w.Sample("shoal_precision_requests_total", l, static_cast<double>(n));
    }
  }
  w.Family("shoal_precision_switches_total", "counter",
           "Times the precision ladder moved a step, down under sustained load or back up.");
  for (const auto& v : views) {
    w.Sample("shoal_precision_switches_total", v.labels(),
             static_cast<double>(v.stats.precision_switches));
  }
  w.Family("shoal_inference_items_total", "counter",
           "Batch items executed by the backend (cache hits excluded).");
  for (const auto& v : views)
    w.Sample("shoal_inference_items_total", v.labels(),
             static_cast<double>(v.stats.inference_count));
  w.Family("shoal_inference_executions_total", "counter", "Backend executions (batches).");
  for (const auto& v : views) {
    w.Sample("shoal_inference_executions_total", v.labels(),
             static_cast<double>(v.stats.execution_count));
  }
  w.Family("shoal_cache_hits_total", "counter", "Requests answered from the response cache.");
  for (const auto& v : views)
    w.Sample("shoal_cache_hits_total", v.labels(), static_cast<double>(v.stats.cache_hit.count));
  w.Family("shoal_cache_misses_total", "counter", "Response cache lookups that missed.");
  for (const auto& v : views)
    w.Sample("shoal_cache_misses_total", v.labels(), static_cast<double>(v.stats.cache_miss.count));
}

void WriteLatencyHistograms(Writer& w, const std::vector<VersionView>& views) {
  constexpr double kUsPerS = 1e6;
  w.Family("shoal_request_duration_seconds", "histogram",
           "End-to-end time of successful requests, in seconds.");
  for (const auto& v : views)
    w.Histogram("shoal_request_duration_seconds", v.labels(), v.stats.request_latency_us, kUsPerS);
  w.Family("shoal_queue_duration_seconds", "histogram",
           "Time requests waited in the queue before execution, in seconds.");
  for (const auto& v : views)
    w.Histogram("shoal_queue_duration_seconds", v.labels(), v.stats.queue_latency_us, kUsPerS);
  w.Family("shoal_compute_duration_seconds", "histogram",
           "Backend execution time per batch, in seconds.");
  for (const auto& v : views)
    w.Histogram("shoal_compute_duration_seconds", v.labels(), v.stats.compute_latency_us, kUsPerS);
  w.Family("shoal_batch_size", "histogram", "Items per backend execution.");
  for (const auto& v : views) w.Histogram("shoal_batch_size", v.labels(), v.stats.batch_size, 1.0);
}

void WriteLoadGauges(Writer& w, const std::vector<VersionView>& views) {
  w.Family("shoal_queue_depth", "gauge", "Requests waiting in the batcher queue.");
  for (const auto& v : views)
    w.Sample("shoal_queue_depth", v.labels(), static_cast<double>(v.queue_depth));
  w.Family("shoal_requests_in_flight", "gauge",
           "Requests accepted and not yet answered (queued or executing).");
  for (const auto& v : views)
    w.Sample("shoal_requests_in_flight", v.labels(), static_cast<double>(v.in_flight));
  w.Family("shoal_admission_reserve_ratio", "gauge",
           "Share of a request's time to its deadline that admission keeps in reserve: "
           "deadline_reserve_percent, or what its predictions have recently run late by when "
           "that is more.");
  for (const auto& v : views)
    w.Sample("shoal_admission_reserve_ratio", v.labels(), v.admission_reserve);
}

// Per model instance; the busy ratio is over the time since the instance became ready,
// measured at `now_ns` on the server's clock.
void WriteInstanceMetrics(Writer& w, const std::vector<VersionView>& views, int64_t now_ns) {
  w.Family("shoal_instance_executions_total", "counter", "Executions run by each model instance.");
  for (const auto& v : views) {
    for (const auto& i : v.instances) {
      Labels l = v.labels();
      l.emplace_back("instance", i.name);
      w.Sample("shoal_instance_executions_total", l, static_cast<double>(i.executions));
    }
  }
  w.Family("shoal_instance_busy_seconds_total", "counter",
           "Time each model instance spent executing, in seconds.");
  for (const auto& v : views) {
    for (const auto& i : v.instances) {
      Labels l = v.labels();
      l.emplace_back("instance", i.name);
      w.Sample("shoal_instance_busy_seconds_total", l, static_cast<double>(i.busy_ns) * 1e-9);
    }
  }
  w.Family("shoal_instance_setups_total", "counter",
           "One-time set-ups each model instance did, such as a plan prepared for input "
           "shapes it had not run (or prepared again after its eviction from the plan "
           "cache); batches that paid one teach neither the cost model nor admission.");
  for (const auto& v : views) {
    for (const auto& i : v.instances) {
      Labels l = v.labels();
      l.emplace_back("instance", i.name);
      w.Sample("shoal_instance_setups_total", l, static_cast<double>(i.setups));
    }
  }
  w.Family("shoal_instance_busy_ratio", "gauge",
           "Busy time of each model instance divided by the time since it became ready (0..1).");
  for (const auto& v : views) {
    for (const auto& i : v.instances) {
      Labels l = v.labels();
      l.emplace_back("instance", i.name);
      const int64_t alive = now_ns - i.created_ns;
      const double ratio =
          alive > 0
              ? std::clamp(static_cast<double>(i.busy_ns) / static_cast<double>(alive), 0.0, 1.0)
              : 0.0;
      w.Sample("shoal_instance_busy_ratio", l, ratio);
    }
  }
  bool pipelined = false;
  for (const auto& v : views)
    for (const auto& i : v.instances) pipelined |= i.pipeline_bubble_ratio >= 0;
  if (pipelined) {
    w.Family("shoal_pipeline_bubble_ratio", "gauge",
             "Share of a pipelined instance's stage time spent idle while its pipeline held "
             "work (0..1), since the instance became ready.");
    for (const auto& v : views) {
      for (const auto& i : v.instances) {
        if (i.pipeline_bubble_ratio < 0) continue;
        Labels l = v.labels();
        l.emplace_back("instance", i.name);
        w.Sample("shoal_pipeline_bubble_ratio", l, i.pipeline_bubble_ratio);
      }
    }
  }
  bool overlapping = false;
  for (const auto& v : views)
    for (const auto& i : v.instances) overlapping |= i.pipeline_depth > 1;
  if (overlapping) {
    w.Family("shoal_instance_overlapped_executions_total", "counter",
             "Executions an instance that pipelines (a KIND_GPU instance) launched while another "
             "of its own was still in flight, so that their copies could overlap its compute.");
    for (const auto& v : views) {
      for (const auto& i : v.instances) {
        if (i.pipeline_depth <= 1) continue;
        Labels l = v.labels();
        l.emplace_back("instance", i.name);
        w.Sample("shoal_instance_overlapped_executions_total", l,
                 static_cast<double>(i.overlapped_executions));
      }
    }
  }
  // GPU instances (docs/gpu.md): device time and memory per instance, memory per device.
  std::map<int, backends::DeviceStats> devices;  // per GPU: the figures last seen
  for (const auto& v : views)
    for (const auto& i : v.instances)
      if (i.device.gpu >= 0) devices[i.device.gpu] = i.device;
  if (!devices.empty()) {
    // One sample per GPU instance of `family`, valued by `value`.
    auto per_instance = [&](const char* family, auto value) {
      for (const auto& v : views) {
        for (const auto& i : v.instances) {
          if (i.device.gpu < 0) continue;
          Labels l = v.labels();
          l.emplace_back("instance", i.name);
          l.emplace_back("gpu", std::to_string(i.device.gpu));
          w.Sample(family, l, value(i.device));
        }
      }
    };
    w.Family("shoal_gpu_busy_seconds_total", "counter",
             "Device time of a GPU instance's batches (CUDA events around each batch's "
             "compute, its copies left out); its rate, summed over a GPU's instances, is that "
             "GPU's utilisation by shoal.");
    per_instance("shoal_gpu_busy_seconds_total", [](const backends::DeviceStats& d) {
      return static_cast<double>(d.busy_ns) / 1e9;
    });
    w.Family("shoal_gpu_instance_memory_bytes", "gauge",
             "Device memory a GPU instance holds besides its model's shared weights: its "
             "plans' arenas, workspaces and flags.");
    per_instance("shoal_gpu_instance_memory_bytes", [](const backends::DeviceStats& d) {
      return static_cast<double>(d.memory_bytes);
    });
    w.Family("shoal_gpu_model_weights_bytes", "gauge",
             "A model's weights on a GPU: one copy, shared by its instances there.");
    for (const auto& v : views) {
      std::map<int, int64_t> weights;  // per GPU, as its instances last saw them
      for (const auto& i : v.instances) {
        if (i.device.gpu < 0) continue;
        for (const auto& [gpu, bytes] : i.device.shared_weights_bytes)
          weights[gpu] = std::max(weights[gpu], bytes);
      }
      for (const auto& [gpu, bytes] : weights) {
        Labels l = v.labels();
        l.emplace_back("gpu", std::to_string(gpu));
        w.Sample("shoal_gpu_model_weights_bytes", l, static_cast<double>(bytes));
      }
    }
    w.Family("shoal_gpu_memory_used_bytes", "gauge",
             "Memory in use on each GPU, by every process, when one of its instances last ran.");
    for (const auto& [gpu, d] : devices)
      w.Sample("shoal_gpu_memory_used_bytes", {{"gpu", std::to_string(gpu)}},
               static_cast<double>(d.device_used_bytes));
    bool nvml = false;
    for (const auto& [gpu, d] : devices) nvml = nvml || d.utilization_percent >= 0;
    if (nvml) {
      w.Family("shoal_gpu_utilization_ratio", "gauge",
               "Each GPU's utilisation as NVML last sampled it (the share of time a kernel of any "
               "process ran), when one of its instances last ran; absent without NVML.");
      for (const auto& [gpu, d] : devices) {
        if (d.utilization_percent < 0) continue;
        w.Sample("shoal_gpu_utilization_ratio", {{"gpu", std::to_string(gpu)}},
                 static_cast<double>(d.utilization_percent) / 100.0);
      }
    }
    w.Family("shoal_gpu_memory_total_bytes", "gauge", "Each GPU's memory.");
    for (const auto& [gpu, d] : devices)
      w.Sample("shoal_gpu_memory_total_bytes", {{"gpu", std::to_string(gpu)}},
               static_cast<double>(d.device_total_bytes));
  }
  w.Family("shoal_instance_cost_seconds", "gauge",
           "The scheduler's online estimate of each model instance's run time t(n) = a + b*n: "
           "term=\"fixed\" is a (per run), term=\"per_item\" is b (per item), in seconds.");
  for (const auto& v : views) {
    for (const auto& i : v.instances) {
      Labels l = v.labels();
      l.emplace_back("instance", i.name);
      l.emplace_back("term", "fixed");
      w.Sample("shoal_instance_cost_seconds", l, i.cost_a_ns * 1e-9);
      l.back().second = "per_item";
      w.Sample("shoal_instance_cost_seconds", l, i.cost_b_ns * 1e-9);
    }
  }
}

// Triton's per-model families (nv_*), with Triton's names, labels (model, version) and
// types, so that dashboards and alerts written for Triton read shoal unchanged. Durations
// are cumulative counters in microseconds, as Triton exports them by default; each request
// is charged its batch's compute time, as in Triton's statistics. Computed from the same
// snapshot as shoal's own families, so the two always agree.
void WriteTritonMetrics(Writer& w, const std::vector<VersionView>& views) {
  auto counter = [&](const char* name, const char* help, auto value) {
    w.Family(name, "counter", help);
    for (const auto& v : views) w.Sample(name, v.labels(), static_cast<double>(value(v.stats)));
  };
  using Stats = runtime::ModelStatsSnapshot;
  counter("nv_inference_request_success",
          "Number of successful inference requests, all batch sizes (cache hits included)",
          [](const Stats& s) { return s.success.count; });
  // Triton's failure reasons: REJECTED (queue full, overload, timed out or past the
  // deadline before running), CANCELED, OTHER (invalid requests), BACKEND (the rest:
  // executions that failed).
  w.Family("nv_inference_request_failure", "counter",
           "Number of failed inference requests, all batch sizes, by reason");
  for (const auto& v : views) {
    const Stats& s = v.stats;
    const uint64_t rejected =
        s.rejected_queue_full + s.rejected_overload + s.timed_out + s.deadline_missed;
    const uint64_t known = rejected + s.cancelled + s.rejected_invalid;
    const std::pair<const char*, uint64_t> reasons[] = {
        {"REJECTED", rejected},
        {"CANCELED", s.cancelled},
        {"BACKEND", s.fail.count > known ? s.fail.count - known : 0},
        {"OTHER", s.rejected_invalid}};
    for (const auto& [reason, n] : reasons) {
      Labels l = v.labels();
      l.emplace_back("reason", reason);
      w.Sample("nv_inference_request_failure", l, static_cast<double>(n));
    }
  }
  counter("nv_inference_count",
          "Number of inferences performed (a batch of n counts n; cache hits excluded)",
          [](const Stats& s) { return s.inference_count; });
  counter("nv_inference_exec_count", "Number of model executions performed (cache hits excluded)",
          [](const Stats& s) { return s.execution_count; });
  counter("nv_inference_request_duration_us",
          "Cumulative inference request duration in microseconds (cache hits included)",
          [](const Stats& s) { return s.success.ns / 1000; });
  counter("nv_inference_queue_duration_us",
          "Cumulative inference queuing duration in microseconds (cache hits included)",
          [](const Stats& s) { return s.queue.ns / 1000; });
  counter("nv_inference_compute_input_duration_us",
          "Cumulative compute input duration in microseconds (cache hits excluded)",
          [](const Stats& s) { return s.compute_input.ns / 1000; });
  counter("nv_inference_compute_infer_duration_us",
          "Cumulative compute inference duration in microseconds (cache hits excluded)",
          [](const Stats& s) { return s.compute_infer.ns / 1000; });
  counter("nv_inference_compute_output_duration_us",
          "Cumulative inference compute output duration in microseconds (cache hits excluded)",
          [](const Stats& s) { return s.compute_output.ns / 1000; });
  w.Family("nv_inference_pending_request_count", "gauge",
           "Instantaneous number of pending requests awaiting execution per-model.");
  for (const auto& v : views) {
    w.Sample("nv_inference_pending_request_count", v.labels(), static_cast<double>(v.queue_depth));
  }
}

// The shared response cache's families; none when the server has no cache.
void WriteResponseCacheMetrics(Writer& w, const runtime::Server& server) {
  auto cache = server.cache();
  if (!cache) return;
  const runtime::CacheStats c = cache->stats();
  w.Family("shoal_response_cache_hits_total", "counter",
           "Lookups in the shared response cache that hit.");
  w.Sample("shoal_response_cache_hits_total", {}, static_cast<double>(c.hits));
  w.Family("shoal_response_cache_misses_total", "counter",
           "Lookups in the shared response cache that missed.");
  w.Sample("shoal_response_cache_misses_total", {}, static_cast<double>(c.misses));
  w.Family("shoal_response_cache_joins_total", "counter",
           "Requests that joined an identical request already running instead of running again.");
  w.Sample("shoal_response_cache_joins_total", {}, static_cast<double>(c.joins));
  w.Family("shoal_response_cache_evictions_total", "counter",
           "Entries evicted from the response cache.");
  w.Sample("shoal_response_cache_evictions_total", {}, static_cast<double>(c.evictions));
  w.Family("shoal_response_cache_entries", "gauge", "Entries in the response cache.");
  w.Sample("shoal_response_cache_entries", {}, static_cast<double>(c.entries));
  w.Family("shoal_response_cache_bytes", "gauge", "Bytes held by the response cache.");
  w.Sample("shoal_response_cache_bytes", {}, static_cast<double>(c.bytes));
  w.Family("shoal_response_cache_capacity_bytes", "gauge",
           "Capacity of the response cache in bytes.");
  w.Sample("shoal_response_cache_capacity_bytes", {}, static_cast<double>(cache->capacity_bytes()));
}

// The process_* families Prometheus' own clients export, from /proc/self; the ones that
// cannot be read are left out.
void WriteProcessMetrics(Writer& w) {
  const ProcessStats p = ReadProcessStats();
  if (p.ok) {
    w.Family("process_cpu_seconds_total", "counter",
             "User and system CPU time of the process, in seconds.");
    w.Sample("process_cpu_seconds_total", {}, p.cpu_seconds);
    w.Family("process_resident_memory_bytes", "gauge", "Resident memory of the process, in bytes.");
    w.Sample("process_resident_memory_bytes", {}, p.resident_bytes);
    w.Family("process_virtual_memory_bytes", "gauge", "Virtual memory of the process, in bytes.");
    w.Sample("process_virtual_memory_bytes", {}, p.virtual_bytes);
  }
  if (p.open_fds >= 0) {
    w.Family("process_open_fds", "gauge", "Open file descriptors of the process.");
    w.Sample("process_open_fds", {}, p.open_fds);
  }
}

}  // namespace

std::string RenderPrometheus(const runtime::Server& server) {
  const std::vector<VersionView> views = CollectVersions(server);
  const std::shared_ptr<Clock> clock =
      server.options().clock ? server.options().clock : Clock::Real();
  const int64_t now_ns = clock->NowNs();

  std::string out;
  out.reserve(4096 + views.size() * 8192);
  Writer w(&out);
  w.Family("shoal_server_ready", "gauge",
           "1 when the server is ready, as GET /v2/health/ready says (start-up loading "
           "finished and, with --strict-readiness, every model that should be loaded is READY).");
  w.Sample("shoal_server_ready", {}, server.ready() ? 1 : 0);
  WriteRequestCounters(w, views);
  WriteLatencyHistograms(w, views);
  WriteLoadGauges(w, views);
  WriteInstanceMetrics(w, views, now_ns);
  WriteTritonMetrics(w, views);
  WriteResponseCacheMetrics(w, server);
  WriteProcessMetrics(w);
  return out;
}

namespace internal {

class MetricsHandler final : public HttpHandler {
 public:
  MetricsHandler(runtime::Server* server, Dashboard* dashboard, MetricsServer::ExtraMetrics extra)
      : server_(server), dashboard_(dashboard), extra_(std::move(extra)) {}

  std::function<void()> Handle(HttpRequest request, HttpResponder responder) override {
    const std::string& path = request.head.path;
    const bool dashboard = path == "/dashboard" || path.starts_with("/dashboard/");
    if (path != "/metrics" && path != "/metrics/" && !dashboard) {
      responder.Send(proto::HttpResponse::Error(404, "Not Found"));
      return {};
    }
    if (request.head.method != "GET" && request.head.method != "HEAD") {
      proto::HttpResponse r = proto::HttpResponse::Error(405, "use GET");
      r.headers.emplace_back("Allow", "GET, HEAD");
      responder.Send(std::move(r));
      return {};
    }
    if (dashboard) {
      responder.Send(dashboard_->Respond(path));
      return {};
    }
    proto::HttpResponse r;
    r.status = 200;
    r.content_type = kPrometheusContentType;
    r.body = RenderPrometheus(*server_);
    if (extra_) r.body += extra_();
    responder.Send(std::move(r));
    return {};
  }

 private:
  runtime::Server* const server_;
  Dashboard* const dashboard_;
  const MetricsServer::ExtraMetrics extra_;
};

}  // namespace internal

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(runtime::Server* server,
                                                              std::string address, int port,
                                                              ExtraMetrics extra) {
  if (server == nullptr) return InvalidArgument("MetricsServer needs a runtime::Server");
  ASSIGN_OR_RETURN(TcpListener listener, TcpListener::Listen(address, port));
  return Start(server, std::move(listener), std::move(extra));
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(runtime::Server* server,
                                                              TcpListener listener,
                                                              ExtraMetrics extra) {
  if (server == nullptr) return InvalidArgument("MetricsServer needs a runtime::Server");
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  ASSIGN_OR_RETURN(m->dashboard_, Dashboard::Create(server, Dashboard::Options()));
  m->handler_ =
      std::make_unique<internal::MetricsHandler>(server, m->dashboard_.get(), std::move(extra));
  HttpCoreOptions options;
  options.threads = 1;
  options.max_body_bytes = 1 << 20;
  options.max_connections = 256;
  options.thread_name = "metrics";
  ASSIGN_OR_RETURN(m->core_,
                   HttpCore::Start(std::move(options), m->handler_.get(), std::move(listener)));
  return m;
}

MetricsServer::~MetricsServer() { Stop(); }

int MetricsServer::port() const { return core_ ? core_->port() : 0; }

void MetricsServer::Stop() {
  if (core_) core_->Stop();
}

}  // namespace shoal::server
