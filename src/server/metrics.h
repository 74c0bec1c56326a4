// Prometheus metrics: RenderPrometheus writes the state of a runtime::Server in the text
// exposition format 0.0.4; MetricsServer serves it at GET /metrics on its own port
// (Triton's convention: 8002). Every metric, its type, labels and unit are listed in
// docs/metrics.md; keep the two in step.
//
// What is exported: per model version (labels model, version) request outcomes,
// end-to-end / queue / compute latency histograms (seconds), batch size histogram,
// queue depth and in-flight gauges, rejections by reason, cache hits and misses; per
// instance (labels model, version, instance) executions, busy time and busy ratio;
// the shared response cache; process CPU time and resident memory (from /proc/self);
// and, beside shoal's own, Triton's per-model families (nv_inference_request_success,
// nv_inference_queue_duration_us, ...) with Triton's labels, types and units, so that
// dashboards written for Triton work unchanged.
//
// The same port serves the live dashboard (dashboard.h): GET /dashboard/ and the JSON it
// polls, /dashboard/data.json.
//
// Threads: RenderPrometheus reads snapshots and may be called from any thread.
// MetricsServer runs one HttpCore loop thread; a scrape (or a dashboard sample) renders
// on it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/server.h"
#include "server/dashboard.h"
#include "server/tcp_listener.h"

namespace shoal::server {

// Content-Type of the text exposition format.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

std::string RenderPrometheus(const runtime::Server& server);

class HttpCore;
namespace internal {
class MetricsHandler;
}

class MetricsServer {
 public:
  // More families for the same page, in the text format, rendered after the server's on
  // each scrape, on the metrics thread (`shoal worker` adds its queue metrics).
  using ExtraMetrics = std::function<std::string()>;

  // Serves GET /metrics (and the dashboard) for `server` (which must outlive the MetricsServer) on
  // address:port (port 0: any free port). UNAVAILABLE when it cannot bind.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(runtime::Server* server,
                                                        std::string address, int port,
                                                        ExtraMetrics extra = {});
  // The same on a socket bound beforehand.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(runtime::Server* server,
                                                        TcpListener listener,
                                                        ExtraMetrics extra = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;
  // The dashboard served beside /metrics, e.g. to add a section (Dashboard::AddSection).
  Dashboard& dashboard() { return *dashboard_; }
  // Closes the listener and every connection; joins the thread. Idempotent.
  void Stop();

 private:
  MetricsServer() = default;
  std::unique_ptr<Dashboard> dashboard_;
  std::unique_ptr<internal::MetricsHandler> handler_;
  std::unique_ptr<HttpCore> core_;
};

}  // namespace shoal::server
