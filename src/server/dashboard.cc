#include "server/dashboard.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/clock.h"
#include "proto/json_writer.h"
#include "server/dashboard_assets.h"

namespace shoal::server {
namespace {

using proto::JsonWriter;

// Rejection reasons, in the order (and with the names) of shoal_inference_rejections_total.
struct Reason {
  const char* name;
  uint64_t runtime::ModelStatsSnapshot::*field;
};
constexpr Reason kReasons[] = {
    {"queue_full", &runtime::ModelStatsSnapshot::rejected_queue_full},
    {"overload", &runtime::ModelStatsSnapshot::rejected_overload},
    {"invalid", &runtime::ModelStatsSnapshot::rejected_invalid},
    {"timeout", &runtime::ModelStatsSnapshot::timed_out},
    {"deadline", &runtime::ModelStatsSnapshot::deadline_missed},
    {"cancelled", &runtime::ModelStatsSnapshot::cancelled},
};

// A number as JSON, rounded to `decimals` places so the document stays small; null when
// it is not finite (JSON has no NaN, and the page draws null as a gap).
void Num(JsonWriter& w, double v, int decimals = 3) {
  if (!std::isfinite(v)) {
    w.Null();
    return;
  }
  const double scale = std::pow(10.0, decimals);
  w.Double(std::round(v * scale) / scale);
}

// cur - prev, or 0 when the counter went backwards (it cannot within one identity; be safe).
double Delta(uint64_t cur, uint64_t prev) {
  return cur >= prev ? static_cast<double>(cur - prev) : 0.0;
}

std::vector<uint64_t> BucketDeltas(const runtime::Histogram& cur, const runtime::Histogram* prev) {
  std::vector<uint64_t> out = cur.bucket_counts();
  if (prev == nullptr || prev->bucket_counts().size() != out.size()) return out;
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t p = prev->bucket_counts()[i];
    out[i] = out[i] >= p ? out[i] - p : 0;
  }
  return out;
}

const DashboardVersionSample* FindPrevious(const DashboardSample* previous,
                                           const DashboardVersionSample& v) {
  if (previous == nullptr) return nullptr;
  for (const auto& p : previous->versions) {
    if (p.identity == v.identity) return &p;
  }
  return nullptr;
}

void WriteLatency(JsonWriter& w, const DashboardVersionSample& v, const DashboardVersionSample* p) {
  w.Key("latency_ms").BeginObject();
  const std::vector<uint64_t> counts =
      BucketDeltas(v.stats.request_latency_us, p ? &p->stats.request_latency_us : nullptr);
  const auto& bounds = v.stats.request_latency_us.bounds();
  for (const auto& [key, q] : {std::pair{"p50", 0.5}, {"p95", 0.95}, {"p99", 0.99}}) {
    w.Key(key);
    Num(w, p ? HistogramQuantile(bounds, counts, q) / 1000.0 : NAN);
  }
  w.Key("mean");
  if (p) {
    const double n = Delta(v.stats.request_latency_us.count(), p->stats.request_latency_us.count());
    Num(w, n > 0
               ? (v.stats.request_latency_us.sum() - p->stats.request_latency_us.sum()) / n / 1000.0
               : NAN);
  } else {
    w.Null();
  }
  w.EndObject();
}

void WriteBatchSizes(JsonWriter& w, const DashboardVersionSample& v,
                     const DashboardVersionSample* p) {
  w.Key("batch_size").BeginObject();
  w.Key("bounds").BeginArray();
  for (double b : v.stats.batch_size.bounds()) Num(w, b, 0);
  w.EndArray();
  // Executions per bucket in the window (the last bucket is above the last bound).
  w.Key("counts");
  if (p) {
    w.BeginArray();
    for (uint64_t c : BucketDeltas(v.stats.batch_size, &p->stats.batch_size)) w.Uint(c);
    w.EndArray();
  } else {
    w.Null();
  }
  w.Key("mean");
  const double execs = p ? Delta(v.stats.batch_size.count(), p->stats.batch_size.count()) : 0;
  Num(w, execs > 0 ? (v.stats.batch_size.sum() - p->stats.batch_size.sum()) / execs : NAN);
  w.EndObject();
}

void WriteInstances(JsonWriter& w, const DashboardVersionSample& v, const DashboardVersionSample* p,
                    double window_ns) {
  w.Key("instances").BeginArray();
  for (const auto& i : v.instances) {
    w.BeginObject().Member("name", i.name);
    const runtime::InstanceStats* pi = nullptr;
    if (p) {
      for (const auto& c : p->instances) {
        if (c.name == i.name) pi = &c;
      }
    }
    w.Key("busy_percent");
    Num(w,
        pi && window_ns > 0
            ? std::clamp(static_cast<double>(i.busy_ns - pi->busy_ns) / window_ns * 100.0, 0.0,
                         100.0)
            : NAN,
        1);
    w.MemberInt("executions_total", i.executions);
    w.EndObject();
  }
  w.EndArray();
}

void WritePrecision(JsonWriter& w, const DashboardVersionSample& v, const DashboardVersionSample* p,
                    double window_s) {
  w.Key("precision").BeginObject();
  w.Key("ladder").BeginArray();
  for (const auto& t : v.precision_ladder) w.String(t);
  w.EndArray();
  w.MemberInt("tier", v.precision_tier);
  w.Key("tier_name");
  if (v.precision_tier >= 0 && static_cast<size_t>(v.precision_tier) < v.precision_ladder.size()) {
    w.String(v.precision_ladder[v.precision_tier]);
  } else {
    w.Null();
  }
  // Requests answered per tier per second: the ladder's tiers and any a request chose.
  w.Key("requests_per_s").BeginObject();
  for (const auto& [tier, n] : v.stats.precision_requests) {
    w.Key(tier);
    if (p) {
      auto it = p->stats.precision_requests.find(tier);
      Num(w, Delta(n, it == p->stats.precision_requests.end() ? 0 : it->second) / window_s);
    } else {
      w.Null();
    }
  }
  w.EndObject();
  w.MemberUint("switches_total", v.stats.precision_switches);
  w.EndObject();
}

void WriteVersion(JsonWriter& w, const DashboardVersionSample& v, const DashboardVersionSample* p,
                  double window_s) {
  // A rate over the window, null without one.
  auto rate = [&](double delta) { return p ? delta / window_s : NAN; };
  const runtime::ModelStatsSnapshot& s = v.stats;
  w.BeginObject();
  w.Member("model", v.model);
  w.MemberInt("version", v.version);
  w.Key("slo_ms");
  Num(w, v.latency_slo_us > 0 ? static_cast<double>(v.latency_slo_us) / 1000.0 : NAN);
  w.MemberInt("max_batch_size", v.max_batch_size);
  w.Key("requests_per_s");
  Num(w, rate(p ? Delta(s.success.count, p->stats.success.count) : 0));
  w.Key("failures_per_s");
  Num(w, rate(p ? Delta(s.fail.count, p->stats.fail.count) : 0));
  w.Key("items_per_s");
  Num(w, rate(p ? Delta(s.inference_count, p->stats.inference_count) : 0));
  w.Key("executions_per_s");
  Num(w, rate(p ? Delta(s.execution_count, p->stats.execution_count) : 0));
  WriteLatency(w, v, p);
  w.MemberInt("queue_depth", v.queue_depth);
  w.MemberInt("in_flight", v.in_flight);
  WriteBatchSizes(w, v, p);
  WriteInstances(w, v, p, window_s * 1e9);
  w.MemberBool("cache_enabled", v.cache_enabled);
  w.Key("cache_hit_ratio");
  if (p) {
    const double hits = Delta(s.cache_hit.count, p->stats.cache_hit.count);
    const double lookups = hits + Delta(s.cache_miss.count, p->stats.cache_miss.count);
    Num(w, lookups > 0 ? hits / lookups : NAN, 4);
  } else {
    w.Null();
  }
  w.Key("rejections_per_s").BeginObject();
  for (const Reason& r : kReasons) {
    w.Key(r.name);
    Num(w, rate(p ? Delta(s.*r.field, p->stats.*r.field) : 0));
  }
  w.EndObject();
  w.Key("rejections_total").BeginObject();
  for (const Reason& r : kReasons) w.MemberUint(r.name, s.*r.field);
  w.EndObject();
  w.MemberUint("success_total", s.success.count);
  w.MemberUint("failure_total", s.fail.count);
  WritePrecision(w, v, p, window_s);
  w.EndObject();
}

void WriteServer(JsonWriter& w, const DashboardSample* previous, const DashboardSample& current,
                 double window_s) {
  const ProcessStats& proc = current.process;
  w.Key("server").BeginObject();
  w.MemberBool("ready", current.ready);
  w.MemberInt("cpus", proc.cpus);
  // CPU time over wall time: 100 is one core busy.
  w.Key("cpu_percent");
  Num(w,
      previous && proc.ok && previous->process.ok
          ? (proc.cpu_seconds - previous->process.cpu_seconds) / window_s * 100.0
          : NAN,
      1);
  w.Key("rss_bytes");
  Num(w, proc.ok ? proc.resident_bytes : NAN, 0);
  w.Key("open_fds");
  Num(w, proc.open_fds >= 0 ? proc.open_fds : NAN, 0);
  w.EndObject();

  w.Key("response_cache");
  if (!current.cache) {
    w.Null();
    return;
  }
  const runtime::CacheStats& c = *current.cache;
  w.BeginObject();
  w.Key("hit_ratio");
  if (previous && previous->cache) {
    const double hits = static_cast<double>(c.hits - previous->cache->hits);
    const double lookups = hits + static_cast<double>(c.misses - previous->cache->misses);
    Num(w, lookups > 0 ? hits / lookups : NAN, 4);
  } else {
    w.Null();
  }
  w.MemberInt("entries", c.entries);
  w.MemberInt("bytes", c.bytes);
  w.MemberInt("capacity_bytes", current.cache_capacity_bytes);
  w.EndObject();
}

void WriteSections(JsonWriter& w,
                   const std::vector<std::pair<std::string, DashboardSection>>& sections) {
  w.Key("sections").BeginArray();
  for (const auto& [name, section] : sections) {
    w.BeginObject().Member("name", name).Member("title", section.title);
    w.Key("charts").BeginArray();
    for (const auto& chart : section.charts) {
      w.BeginObject().Member("title", chart.title);
      w.Key("series").BeginObject();
      for (const auto& [series, value] : chart.series) {
        w.Key(series);
        Num(w, value, 6);
      }
      w.EndObject().EndObject();
    }
    w.EndArray().EndObject();
  }
  w.EndArray();
}

bool ValidSectionName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

// Headers of every dashboard answer: nothing cached (the page and data change with the
// binary and every second), nothing loaded from elsewhere, no content sniffing.
void AddHeaders(proto::HttpResponse* r) {
  r->headers.emplace_back("Cache-Control", "no-cache");
  r->headers.emplace_back("X-Content-Type-Options", "nosniff");
  r->headers.emplace_back("Content-Security-Policy",
                          "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
}

std::string ContentType(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  return "text/plain; charset=utf-8";
}

}  // namespace

double HistogramQuantile(const std::vector<double>& bounds, const std::vector<uint64_t>& counts,
                         double q) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0 || bounds.empty()) return NAN;
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(total);
  uint64_t below = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double cumulative = static_cast<double>(below + counts[i]);
    if (counts[i] > 0 && cumulative >= rank) {
      if (i >= bounds.size()) return bounds.back();  // in +Inf
      const double lo = i == 0 ? 0.0 : bounds[i - 1];
      const double within = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
      return lo + (bounds[i] - lo) * within;
    }
    below += counts[i];
  }
  return bounds.back();
}

DashboardSample CollectDashboardSample(const runtime::Server& server, int64_t now_ns) {
  DashboardSample s;
  s.now_ns = now_ns;
  s.wall_ms = WallTimeMs();
  s.ready = server.ready();
  for (const auto& mv : server.ReadyVersions()) {
    DashboardVersionSample v;
    v.model = mv->name();
    v.version = mv->version();
    v.identity = mv->cache_owner_id();
    const runtime::ModelVersionOptions& o = mv->options();
    v.latency_slo_us = o.latency_slo_us;
    v.max_batch_size = o.batching.max_batch_size;
    v.cache_enabled = o.cache != nullptr;
    v.precision_ladder = o.precision_ladder;
    v.precision_tier = mv->precision_tier();
    v.stats = mv->stats();
    v.instances = mv->instance_stats();
    v.queue_depth = static_cast<int64_t>(mv->queue_depth());
    v.in_flight = mv->in_flight();
    s.versions.push_back(std::move(v));
  }
  std::sort(s.versions.begin(), s.versions.end(),
            [](const DashboardVersionSample& a, const DashboardVersionSample& b) {
              return a.model != b.model ? a.model < b.model : a.version < b.version;
            });
  s.process = ReadProcessStats();
  if (auto cache = server.cache()) {
    s.cache = cache->stats();
    s.cache_capacity_bytes = cache->capacity_bytes();
  }
  return s;
}

std::string RenderDashboardJson(
    const DashboardSample* previous, const DashboardSample& current, uint64_t seq,
    const std::vector<std::pair<std::string, DashboardSection>>& sections) {
  // A window needs time to have passed; otherwise treat the sample as the first.
  if (previous && current.now_ns <= previous->now_ns) previous = nullptr;
  const double window_s =
      previous ? static_cast<double>(current.now_ns - previous->now_ns) * 1e-9 : NAN;
  std::string out;
  out.reserve(2048 + current.versions.size() * 2048);
  JsonWriter w(&out);
  w.BeginObject();
  w.MemberInt("schema", 1);
  w.MemberUint("seq", seq);
  w.MemberInt("time_ms", current.wall_ms);
  w.Key("window_s");
  Num(w, window_s, 4);
  WriteServer(w, previous, current, window_s);
  w.Key("models").BeginArray();
  for (const auto& v : current.versions) WriteVersion(w, v, FindPrevious(previous, v), window_s);
  w.EndArray();
  WriteSections(w, sections);
  w.EndObject();
  return out;
}

StatusOr<std::unique_ptr<Dashboard>> Dashboard::Create(const runtime::Server* server,
                                                       Options options) {
  if (server == nullptr) return InvalidArgument("Dashboard needs a runtime::Server");
  if (options.min_interval_ms <= 0) {
    return InvalidArgument("dashboard min_interval_ms must be positive; was " +
                           std::to_string(options.min_interval_ms));
  }
  std::shared_ptr<Clock> clock = options.clock;
  if (!clock) clock = server->options().clock ? server->options().clock : Clock::Real();
  return std::unique_ptr<Dashboard>(new Dashboard(server, std::move(options), std::move(clock)));
}

Status Dashboard::AddSection(std::string name, DashboardSectionSource source) {
  if (!ValidSectionName(name)) {
    return InvalidArgument("dashboard section name must be 1..64 of [A-Za-z0-9_-]; was '" + name +
                           "'");
  }
  if (!source) return InvalidArgument("dashboard section '" + name + "' has no source");
  MutexLock lock(&mu_);
  auto it = std::find_if(sections_.begin(), sections_.end(),
                         [&](const auto& s) { return s.first == name; });
  if (it != sections_.end()) {
    it->second = std::move(source);
  } else {
    sections_.emplace_back(std::move(name), std::move(source));
    std::sort(sections_.begin(), sections_.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  return Status::Ok();
}

void Dashboard::RemoveSection(const std::string& name) {
  MutexLock lock(&mu_);
  std::erase_if(sections_, [&](const auto& s) { return s.first == name; });
}

std::string Dashboard::DataJson() {
  MutexLock lock(&mu_);
  const int64_t now_ns = clock_->NowNs();
  if (last_ && now_ns - last_->now_ns < options_.min_interval_ms * 1'000'000) return last_json_;
  DashboardSample sample = CollectDashboardSample(*server_, now_ns);
  std::vector<std::pair<std::string, DashboardSection>> sections;
  sections.reserve(sections_.size());
  for (const auto& [name, source] : sections_) sections.emplace_back(name, source());
  last_json_ = RenderDashboardJson(last_ ? &*last_ : nullptr, sample, ++seq_, sections);
  last_ = std::move(sample);
  return last_json_;
}

proto::HttpResponse Dashboard::Respond(std::string_view path) {
  proto::HttpResponse r;
  if (path == "/dashboard") {
    // The page refers to its files relatively, so it must be read from the folder.
    r.status = 301;
    r.headers.emplace_back("Location", "dashboard/");
    return r;
  }
  constexpr std::string_view kPrefix = "/dashboard/";
  if (!path.starts_with(kPrefix)) return proto::HttpResponse::Error(404, "Not Found");
  std::string_view name = path.substr(kPrefix.size());
  if (name == "data.json") {
    r = proto::HttpResponse::Json(200, DataJson());
    AddHeaders(&r);
    return r;
  }
  if (name.empty()) name = "index.html";
  for (const DashboardAsset& a : DashboardAssets()) {
    if (a.name == name) {
      r.status = 200;
      r.content_type = ContentType(a.name);
      r.body = std::string(a.bytes);
      AddHeaders(&r);
      return r;
    }
  }
  if (DashboardAssets().empty()) {
    return proto::HttpResponse::Error(
        404,
        "this shoal was built without the dashboard page (-DSHOAL_DASHBOARD=OFF); "
        "/dashboard/data.json is still served");
  }
  return proto::HttpResponse::Error(404, "Not Found");
}

}  // namespace shoal::server
