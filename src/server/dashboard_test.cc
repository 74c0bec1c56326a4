// The dashboard's data.json: rates and quantiles over a window computed from hand-made
// samples (exact figures), and the Dashboard over a live runtime::Server with a fake
// sampling clock (when a sample is taken, which models it lists, sections, the routes).
#include "server/dashboard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <nlohmann/json.hpp>

#include "runtime/testing/test_repository.h"
#include "server/dashboard_assets.h"

namespace shoal::server {
namespace {

using json = nlohmann::json;

TEST(HistogramQuantileTest, InterpolatesWithinTheBucket) {
  const std::vector<double> bounds = {10, 20, 40};
  // Ten values in (10, 20]: the median is halfway through the bucket.
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {0, 10, 0, 0}, 0.5), 15.0);
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {0, 10, 0, 0}, 0.99), 19.9);
  // The first bucket starts at 0.
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {4, 0, 0, 0}, 0.25), 2.5);
  // 90 fast, 10 slow: p50 among the fast, p95 among the slow ones.
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {90, 0, 10, 0}, 0.5), 50.0 / 90.0 * 10.0);
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {90, 0, 10, 0}, 0.95), 20.0 + 20.0 * 0.5);
  // Above the last bound: the last bound.
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {0, 0, 0, 5}, 0.5), 40.0);
  EXPECT_TRUE(std::isnan(HistogramQuantile(bounds, {0, 0, 0, 0}, 0.5)));
}

constexpr int64_t kSecond = 1'000'000'000;

// A version sample whose counters are those of `requests` requests of 1.5 ms each (run in
// batches of 4), `rejected` refused with a full queue, and cache lookups.
DashboardVersionSample Version(uint64_t identity, uint64_t requests, uint64_t rejected,
                               uint64_t hits, uint64_t misses, int64_t busy_ns) {
  DashboardVersionSample v;
  v.model = "m";
  v.version = 3;
  v.identity = identity;
  v.latency_slo_us = 20'000;
  v.max_batch_size = 8;
  v.cache_enabled = true;
  v.precision_ladder = {"fp32", "bf16"};
  v.precision_tier = 1;
  v.stats.success.count = requests;
  v.stats.fail.count = rejected;
  v.stats.rejected_queue_full = rejected;
  v.stats.inference_count = requests;
  v.stats.execution_count = requests / 4;
  v.stats.cache_hit.count = hits;
  v.stats.cache_miss.count = misses;
  v.stats.precision_requests["bf16"] = requests;
  v.stats.precision_switches = 1;
  for (uint64_t i = 0; i < requests; ++i) v.stats.request_latency_us.Observe(1500);
  for (uint64_t i = 0; i < requests / 4; ++i) v.stats.batch_size.Observe(4);
  v.instances.push_back({.name = "m_0", .executions = 7, .busy_ns = busy_ns, .device = {}});
  v.queue_depth = 5;
  v.in_flight = 9;
  return v;
}

DashboardSample Sample(int64_t now_ns, double cpu_seconds, std::vector<DashboardVersionSample> v) {
  DashboardSample s;
  s.now_ns = now_ns;
  s.wall_ms = 1'700'000'000'000;
  s.ready = true;
  s.versions = std::move(v);
  s.process.ok = true;
  s.process.cpu_seconds = cpu_seconds;
  s.process.resident_bytes = 64 << 20;
  s.process.cpus = 2;
  return s;
}

TEST(RenderDashboardJsonTest, RatesAndQuantilesOverTheWindow) {
  // Two seconds apart: 200 more requests, 10 more rejections, 30 hits and 10 misses, and
  // the instance busy for one of the two seconds.
  const DashboardSample prev = Sample(10 * kSecond, 1.0, {Version(7, 100, 4, 5, 5, kSecond)});
  const DashboardSample cur = Sample(12 * kSecond, 2.0, {Version(7, 300, 14, 35, 15, 2 * kSecond)});
  const json j = json::parse(RenderDashboardJson(&prev, cur, 42, {}));

  EXPECT_EQ(j["schema"], 1);
  EXPECT_EQ(j["seq"], 42);
  EXPECT_EQ(j["time_ms"], 1'700'000'000'000);
  EXPECT_DOUBLE_EQ(j["window_s"].get<double>(), 2.0);
  EXPECT_EQ(j["server"]["ready"], true);
  EXPECT_EQ(j["server"]["cpus"], 2);
  EXPECT_DOUBLE_EQ(j["server"]["cpu_percent"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(j["server"]["rss_bytes"].get<double>(), 64 << 20);
  EXPECT_TRUE(j["response_cache"].is_null());

  ASSERT_EQ(j["models"].size(), 1u);
  const json& m = j["models"][0];
  EXPECT_EQ(m["model"], "m");
  EXPECT_EQ(m["version"], 3);
  EXPECT_DOUBLE_EQ(m["slo_ms"].get<double>(), 20.0);
  EXPECT_EQ(m["max_batch_size"], 8);
  EXPECT_DOUBLE_EQ(m["requests_per_s"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(m["failures_per_s"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(m["items_per_s"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(m["executions_per_s"].get<double>(), 25.0);
  // Every request in the window took 1.5 ms, in the bucket (1, 2.5] ms: the quantiles
  // interpolate within it; the mean is exact.
  EXPECT_DOUBLE_EQ(m["latency_ms"]["p50"].get<double>(), 1.75);
  EXPECT_DOUBLE_EQ(m["latency_ms"]["p95"].get<double>(), 2.425);
  EXPECT_DOUBLE_EQ(m["latency_ms"]["p99"].get<double>(), 2.485);
  EXPECT_DOUBLE_EQ(m["latency_ms"]["mean"].get<double>(), 1.5);
  EXPECT_EQ(m["queue_depth"], 5);
  EXPECT_EQ(m["in_flight"], 9);
  // 50 executions of 4 in the window, all in the bucket (2, 4].
  const json& bs = m["batch_size"];
  EXPECT_EQ(bs["bounds"][0], 1);
  EXPECT_EQ(bs["counts"].size(), bs["bounds"].size() + 1);
  EXPECT_EQ(bs["counts"][2], 50);
  EXPECT_EQ(bs["counts"][0], 0);
  EXPECT_DOUBLE_EQ(bs["mean"].get<double>(), 4.0);
  ASSERT_EQ(m["instances"].size(), 1u);
  EXPECT_EQ(m["instances"][0]["name"], "m_0");
  EXPECT_DOUBLE_EQ(m["instances"][0]["busy_percent"].get<double>(), 50.0);
  EXPECT_EQ(m["cache_enabled"], true);
  EXPECT_DOUBLE_EQ(m["cache_hit_ratio"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(m["rejections_per_s"]["queue_full"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(m["rejections_per_s"]["overload"].get<double>(), 0.0);
  for (const char* reason :
       {"queue_full", "overload", "invalid", "timeout", "deadline", "cancelled"}) {
    EXPECT_TRUE(m["rejections_per_s"].contains(reason)) << reason;
    EXPECT_TRUE(m["rejections_total"].contains(reason)) << reason;
  }
  EXPECT_EQ(m["rejections_total"]["queue_full"], 14);
  EXPECT_EQ(m["success_total"], 300);
  EXPECT_EQ(m["precision"]["ladder"], json({"fp32", "bf16"}));
  EXPECT_EQ(m["precision"]["tier"], 1);
  EXPECT_EQ(m["precision"]["tier_name"], "bf16");
  EXPECT_DOUBLE_EQ(m["precision"]["requests_per_s"]["bf16"].get<double>(), 100.0);
  EXPECT_EQ(m["precision"]["switches_total"], 1);
  EXPECT_EQ(j["sections"], json::array());
}

TEST(RenderDashboardJsonTest, WindowedFieldsAreNullWithoutAWindow) {
  const DashboardSample cur = Sample(12 * kSecond, 2.0, {Version(7, 300, 14, 35, 15, kSecond)});
  // The first sample; then one whose model was reloaded (another identity) meanwhile.
  const DashboardSample other = Sample(10 * kSecond, 1.0, {Version(8, 100, 4, 5, 5, 0)});
  for (const DashboardSample* prev : {static_cast<const DashboardSample*>(nullptr), &other}) {
    const json j = json::parse(RenderDashboardJson(prev, cur, 1, {}));
    const json& m = j["models"][0];
    EXPECT_TRUE(m["requests_per_s"].is_null());
    EXPECT_TRUE(m["latency_ms"]["p99"].is_null());
    EXPECT_TRUE(m["batch_size"]["counts"].is_null());
    EXPECT_TRUE(m["instances"][0]["busy_percent"].is_null());
    EXPECT_TRUE(m["cache_hit_ratio"].is_null());
    EXPECT_TRUE(m["rejections_per_s"]["queue_full"].is_null());
    EXPECT_TRUE(m["precision"]["requests_per_s"]["bf16"].is_null());
    // What needs no window is there.
    EXPECT_EQ(m["queue_depth"], 5);
    EXPECT_EQ(m["precision"]["tier_name"], "bf16");
    EXPECT_EQ(m["rejections_total"]["queue_full"], 14);
    if (prev == nullptr) {
      EXPECT_TRUE(j["window_s"].is_null());
      EXPECT_TRUE(j["server"]["cpu_percent"].is_null());
    }
  }
}

TEST(RenderDashboardJsonTest, NoSloNoLadderAndSections) {
  DashboardVersionSample v = Version(7, 0, 0, 0, 0, 0);
  v.latency_slo_us = 0;
  v.precision_ladder.clear();
  v.precision_tier = 0;
  v.stats.precision_requests.clear();
  const DashboardSample prev = Sample(10 * kSecond, 1.0, {v});
  DashboardSample cur = Sample(11 * kSecond, 1.0, {v});
  cur.cache = runtime::CacheStats{.hits = 3, .misses = 1, .entries = 2, .bytes = 100};
  cur.cache_capacity_bytes = 1000;
  DashboardSection section{
      .title = "Redis worker",
      .charts = {{.title = "lag (entries)", .series = {{"pending", 3}, {"lag", 12.5}}}}};
  const json j = json::parse(RenderDashboardJson(&prev, cur, 2, {{"redis", section}}));
  const json& m = j["models"][0];
  EXPECT_TRUE(m["slo_ms"].is_null());
  EXPECT_EQ(m["precision"]["ladder"], json::array());
  EXPECT_TRUE(m["precision"]["tier_name"].is_null());
  // No requests in the window: rates are zero, quantiles unknown.
  EXPECT_DOUBLE_EQ(m["requests_per_s"].get<double>(), 0.0);
  EXPECT_TRUE(m["latency_ms"]["p50"].is_null());
  EXPECT_TRUE(m["cache_hit_ratio"].is_null());
  EXPECT_TRUE(m["batch_size"]["mean"].is_null());
  // The shared cache: no window for its ratio (the previous sample had no cache).
  EXPECT_TRUE(j["response_cache"]["hit_ratio"].is_null());
  EXPECT_EQ(j["response_cache"]["entries"], 2);
  EXPECT_EQ(j["response_cache"]["capacity_bytes"], 1000);
  ASSERT_EQ(j["sections"].size(), 1u);
  EXPECT_EQ(j["sections"][0]["name"], "redis");
  EXPECT_EQ(j["sections"][0]["title"], "Redis worker");
  EXPECT_EQ(j["sections"][0]["charts"][0]["title"], "lag (entries)");
  EXPECT_DOUBLE_EQ(j["sections"][0]["charts"][0]["series"]["lag"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j["sections"][0]["charts"][0]["series"]["pending"].get<double>(), 3.0);
}

// A runtime::Server in explicit mode with two identity models, one with an SLO, and a
// Dashboard on a fake clock.
class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_.AddModel("identity", runtime::testing::kIdentityConfig);
    std::string slo = runtime::testing::kIdentityConfig;
    slo.replace(slo.find("\"identity\""), 10, "\"slo\"");
    slo += "parameters { key: \"latency_slo_us\" value { string_value: \"25000\" } }\n";
    repo_.AddModel("slo", slo);
    runtime::ServerOptions o =
        runtime::testing::RepositoryOptions(repo_, runtime::ModelControlMode::kExplicit);
    o.startup_models = {"identity", "slo"};
    auto server = runtime::Server::Create(o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    auto d = Dashboard::Create(server_.get(), {.min_interval_ms = 500, .clock = clock_});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dashboard_ = std::move(*d);
  }

  void Infer(const std::string& model) {
    runtime::InferRequest r;
    r.model_name = model;
    r.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {1, 2})});
    std::promise<Status> done;
    server_->Infer(std::move(r), [&](runtime::InferResponse resp) { done.set_value(resp.status); });
    ASSERT_TRUE(done.get_future().get().ok());
  }

  const json* FindModel(const json& j, const std::string& name) {
    for (const json& m : j["models"]) {
      if (m["model"] == name) return &m;
    }
    return nullptr;
  }

  runtime::testing::TempRepository repo_{"shoal_dashboard_test"};
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::unique_ptr<runtime::Server> server_;
  std::unique_ptr<Dashboard> dashboard_;
};

TEST_F(DashboardTest, SamplesAtMostOncePerIntervalAndListsReadyModels) {
  const json first = json::parse(dashboard_->DataJson());
  EXPECT_EQ(first["seq"], 1);
  ASSERT_NE(FindModel(first, "identity"), nullptr);
  ASSERT_NE(FindModel(first, "slo"), nullptr);
  EXPECT_TRUE((*FindModel(first, "identity"))["slo_ms"].is_null());
  EXPECT_DOUBLE_EQ((*FindModel(first, "slo"))["slo_ms"].get<double>(), 25.0);
  EXPECT_EQ((*FindModel(first, "identity"))["instances"].size(), 1u);

  for (int i = 0; i < 3; ++i) Infer("identity");
  // Within the interval the same sample comes back.
  clock_->AdvanceMs(499);
  EXPECT_EQ(json::parse(dashboard_->DataJson())["seq"], 1);
  clock_->AdvanceMs(1);
  const json second = json::parse(dashboard_->DataJson());
  EXPECT_EQ(second["seq"], 2);
  EXPECT_DOUBLE_EQ(second["window_s"].get<double>(), 0.5);
  const json& identity = *FindModel(second, "identity");
  EXPECT_DOUBLE_EQ(identity["requests_per_s"].get<double>(), 6.0);  // 3 in 0.5 s
  EXPECT_EQ(identity["success_total"], 3);
  EXPECT_FALSE(identity["latency_ms"]["p50"].is_null());
  EXPECT_DOUBLE_EQ((*FindModel(second, "slo"))["requests_per_s"].get<double>(), 0.0);

  // An unloaded model is gone from the next sample.
  ASSERT_TRUE(server_->UnloadModel("slo").ok());
  clock_->AdvanceMs(500);
  const json third = json::parse(dashboard_->DataJson());
  EXPECT_EQ(FindModel(third, "slo"), nullptr);
  EXPECT_NE(FindModel(third, "identity"), nullptr);
}

TEST_F(DashboardTest, SectionsAreAddedReplacedAndRemoved) {
  EXPECT_FALSE(dashboard_->AddSection("bad name", [] { return DashboardSection{}; }).ok());
  EXPECT_FALSE(dashboard_->AddSection("", [] { return DashboardSection{}; }).ok());
  EXPECT_FALSE(dashboard_->AddSection("nosource", nullptr).ok());
  int calls = 0;
  ASSERT_TRUE(
      dashboard_
          ->AddSection("worker",
                       [&] {
                         ++calls;
                         return DashboardSection{
                             .title = "Worker",
                             .charts = {{.title = "lag", .series = {{"lag", 1.0 * calls}}}}};
                       })
          .ok());
  ASSERT_TRUE(
      dashboard_->AddSection("a_first", [] { return DashboardSection{.title = "A", .charts = {}}; })
          .ok());
  json j = json::parse(dashboard_->DataJson());
  ASSERT_EQ(j["sections"].size(), 2u);
  EXPECT_EQ(j["sections"][0]["name"], "a_first");  // ordered by name
  EXPECT_EQ(j["sections"][1]["title"], "Worker");
  EXPECT_EQ(j["sections"][1]["charts"][0]["series"]["lag"], 1.0);
  // A cached sample does not call the sections again.
  dashboard_->DataJson();
  EXPECT_EQ(calls, 1);

  ASSERT_TRUE(
      dashboard_
          ->AddSection("worker", [] { return DashboardSection{.title = "Replaced", .charts = {}}; })
          .ok());
  dashboard_->RemoveSection("a_first");
  clock_->AdvanceMs(500);
  j = json::parse(dashboard_->DataJson());
  ASSERT_EQ(j["sections"].size(), 1u);
  EXPECT_EQ(j["sections"][0]["title"], "Replaced");
}

TEST_F(DashboardTest, RespondsOnItsPaths) {
  proto::HttpResponse r = dashboard_->Respond("/dashboard");
  EXPECT_EQ(r.status, 301);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "Location");
  EXPECT_EQ(r.headers[0].second, "dashboard/");

  r = dashboard_->Respond("/dashboard/data.json");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type.rfind("application/json", 0), 0u) << r.content_type;
  EXPECT_EQ(json::parse(r.body)["schema"], 1);

  EXPECT_EQ(dashboard_->Respond("/dashboard/nothing.js").status, 404);
  EXPECT_EQ(dashboard_->Respond("/dashboardx").status, 404);

  if (DashboardAssets().empty()) {
    // Built with -DSHOAL_DASHBOARD=OFF: no page, and the 404 says why.
    r = dashboard_->Respond("/dashboard/");
    EXPECT_EQ(r.status, 404);
    EXPECT_NE(r.body.find("SHOAL_DASHBOARD=OFF"), std::string::npos) << r.body;
    return;
  }
  r = dashboard_->Respond("/dashboard/");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/html; charset=utf-8");
  EXPECT_NE(r.body.find("<script src=\"uplot.min.js\""), std::string::npos);
  EXPECT_NE(r.body.find("<script src=\"dashboard.js\""), std::string::npos);
  // Every file the page names is embedded; uPlot with its licence.
  for (const char* name :
       {"dashboard.js", "dashboard.css", "uplot.min.js", "uplot.min.css", "uplot-LICENSE.txt"}) {
    r = dashboard_->Respond(std::string("/dashboard/") + name);
    EXPECT_EQ(r.status, 200) << name;
    EXPECT_GT(r.body.size(), 100u) << name;
  }
  EXPECT_NE(dashboard_->Respond("/dashboard/uplot.min.js").body.find("uPlot"), std::string::npos);
  EXPECT_NE(dashboard_->Respond("/dashboard/uplot-LICENSE.txt").body.find("MIT"),
            std::string::npos);
  EXPECT_EQ(dashboard_->Respond("/dashboard/dashboard.js").content_type,
            "text/javascript; charset=utf-8");
}

}  // namespace
}  // namespace shoal::server
