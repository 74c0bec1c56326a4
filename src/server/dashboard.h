// Dashboard: the live operations page that `shoal serve` shows on its metrics port, and
// the small JSON document the page polls (docs/dashboard.md).
//
//   GET /dashboard              redirects to /dashboard/
//   GET /dashboard/             the page (HTML); its script, style sheet and uPlot are
//                               embedded in the binary at build time (dashboard_assets.h)
//   GET /dashboard/data.json    one sample: per model version throughput, latency
//                               quantiles against the SLO, queue depth, batch sizes,
//                               instance busy %, cache hit ratio, rejections by reason,
//                               the precision tier; server CPU and RSS; extra sections
//
// Rates and quantiles describe the window between two samples. A sample is taken when
// data.json is asked for and the last one is at least min_interval_ms old; askers in
// between get the last sample again (same "seq"), so any number of open pages share one
// sampling cadence and each window is at least min_interval_ms long. Latency quantiles
// are interpolated within the buckets of the request-latency histogram (as Prometheus'
// histogram_quantile does), so they are as coarse as its buckets (model_stats.h).
//
// Extra sections: another part of the process (a queue worker, say) adds a section with
// AddSection: a function that returns named numbers grouped into charts; the page draws
// each chart as lines over time, under the section's title, with no page change needed.
//
// Threads: every method is safe from any thread. Section functions are called with the
// dashboard's lock held, on the thread that serves data.json: they must be quick and must
// not call back into the Dashboard.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/mutex.h"
#include "core/status.h"
#include "proto/http_message.h"
#include "runtime/model_stats.h"
#include "runtime/response_cache.h"
#include "runtime/server.h"
#include "server/process_stats.h"

namespace shoal::server {

// What a section function returns: charts of named values, sampled at each update.
struct DashboardSection {
  struct Chart {
    std::string title;                                   // e.g. "lag (entries)"; say the unit here
    std::vector<std::pair<std::string, double>> series;  // name -> current value
  };
  std::string title;  // shown above the section's charts
  std::vector<Chart> charts;
};
using DashboardSectionSource = std::function<DashboardSection()>;

// One ready model version as sampled.
struct DashboardVersionSample {
  std::string model;
  int64_t version = 0;
  // Differs for each loaded ModelVersion object (a reload under the same version number
  // starts its counters again): rates are computed only between samples of one identity.
  uint64_t identity = 0;
  uint64_t latency_slo_us = 0;  // 0: none
  int64_t max_batch_size = 0;
  bool cache_enabled = false;
  std::vector<std::string> precision_ladder;  // empty: none
  int precision_tier = 0;                     // index into precision_ladder
  runtime::ModelStatsSnapshot stats;
  std::vector<runtime::InstanceStats> instances;
  int64_t queue_depth = 0, in_flight = 0;
};

struct DashboardSample {
  int64_t now_ns = 0;  // the server's clock (instance busy times are on it too)
  int64_t wall_ms = 0;
  bool ready = false;
  std::vector<DashboardVersionSample> versions;  // sorted by model, then version
  ProcessStats process;
  std::optional<runtime::CacheStats> cache;  // the shared response cache, if any
  int64_t cache_capacity_bytes = 0;
};

// Reads `server` (its ready versions, the shared cache) and this process at `now_ns`.
DashboardSample CollectDashboardSample(const runtime::Server& server, int64_t now_ns);

// data.json for `current`, with rates and quantiles over the window since `previous`
// (null: the first sample, whose windowed fields are null). `seq` numbers the sample.
// Sections are written in the order given.
std::string RenderDashboardJson(
    const DashboardSample* previous, const DashboardSample& current, uint64_t seq,
    const std::vector<std::pair<std::string, DashboardSection>>& sections);

// The q-quantile (0..1) of a histogram given as upper bounds and non-cumulative counts
// (one more count than bounds: the last is +Inf), interpolated linearly within the
// bucket that holds it; the first bucket starts at 0, and a quantile that falls in +Inf
// is the last bound. NaN when the counts are all zero.
double HistogramQuantile(const std::vector<double>& bounds, const std::vector<uint64_t>& counts,
                         double q);

class Dashboard {
 public:
  struct Options {
    // The shortest window between two samples, in milliseconds, > 0. Default 500: a page
    // polls once a second, and several pages open at once still see windows >= 0.5 s.
    int64_t min_interval_ms = 500;
    // When samples are taken; null: the server's clock (ServerOptions::clock, else the real
    // one). Instance busy times are on the server's clock, so only tests set another.
    std::shared_ptr<Clock> clock;
  };
  // `server` must outlive the Dashboard. INVALID_ARGUMENT for bad options.
  static StatusOr<std::unique_ptr<Dashboard>> Create(const runtime::Server* server,
                                                     Options options);

  // Adds a section shown under the models, or replaces the one of that name. `name`: 1..64
  // of [A-Za-z0-9_-] (INVALID_ARGUMENT otherwise); the page orders sections by name.
  Status AddSection(std::string name, DashboardSectionSource source);
  void RemoveSection(const std::string& name);

  // The current sample's JSON (see the class comment for when a new one is taken).
  std::string DataJson();

  // Answers a GET or HEAD of `path` under /dashboard (see the top of this file); 404 for
  // other paths, and for the page itself when the binary was built without it
  // (-DSHOAL_DASHBOARD=OFF: data.json is still served).
  proto::HttpResponse Respond(std::string_view path);

 private:
  Dashboard(const runtime::Server* server, Options options, std::shared_ptr<Clock> clock)
      : server_(server), options_(std::move(options)), clock_(std::move(clock)) {}

  const runtime::Server* const server_;
  const Options options_;
  const std::shared_ptr<Clock> clock_;
  Mutex mu_;
  std::vector<std::pair<std::string, DashboardSectionSource>> sections_ GUARDED_BY(mu_);
  std::optional<DashboardSample> last_ GUARDED_BY(mu_);
  std::string last_json_ GUARDED_BY(mu_);
  uint64_t seq_ GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::server
