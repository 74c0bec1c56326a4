#include "loadgen/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

namespace shoal::loadgen {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMs = 1'000'000;

// A step with `windows` one-second windows, each with 1000 successes at 1..1000 us.
StepResult MakeStep(int64_t concurrency, int windows, double latency_scale = 1.0) {
  StepResult step;
  step.config.concurrency = concurrency;
  step.stable = true;
  for (int w = 0; w < windows; ++w) {
    Window win;
    win.start_ns = w * 1000 * kMs;
    win.end_ns = (w + 1) * 1000 * kMs;
    for (int i = 1; i <= 1000; ++i) {
      win.latency_ns.Record(static_cast<int64_t>(i * 1000 * latency_scale));
    }
    win.ok = 1000;
    win.sent = 1000;
    win.errors["HTTP 503"] = 2;
    win.error_latency_ns["HTTP 503"].Record(20'000);  // answered in 20 and 40 us
    win.error_latency_ns["HTTP 503"].Record(40'000);
    // Sent 10 and 30 us behind schedule: 10 and 10 us from the actual send.
    win.error_latency_from_send_ns["HTTP 503"].Record(10'000);
    win.error_latency_from_send_ns["HTTP 503"].Record(10'000);
    for (int i = 1; i <= 1000; ++i) {
      win.latency_from_send_ns.Record(static_cast<int64_t>(i * 500 * latency_scale));
      win.send_lag_ns.Record(i <= 990 ? 1'000 : 300'000);
    }
    win.start_sample.cpu_ns = w * 10 * kMs;
    win.end_sample.cpu_ns = (w + 1) * 10 * kMs;
    ServerStats a, b;
    a.queue = {uint64_t(w) * 1000, uint64_t(w) * 1000 * 50'000};
    b.queue = {uint64_t(w + 1) * 1000, uint64_t(w + 1) * 1000 * 50'000};
    b.compute_infer = {uint64_t(w + 1) * 250, uint64_t(w + 1) * 250 * 100'000};
    a.compute_infer = {uint64_t(w) * 250, uint64_t(w) * 250 * 100'000};
    a.inference_count = w * 1000;
    a.execution_count = w * 250;
    b.inference_count = (w + 1) * 1000;
    b.execution_count = (w + 1) * 250;
    win.start_sample.server = a;
    win.end_sample.server = b;
    step.windows.push_back(std::move(win));
  }
  return step;
}

ReportContext Context() {
  ReportContext c;
  c.model = "identity";
  c.protocol = "http";
  c.url = "localhost:8000";
  c.batch_size = 2;
  c.percentile = 95;
  c.latency_threshold_ms = 0.5;
  c.measurement_interval_ms = 1000;
  return c;
}

TEST(SummarizeTest, UsesTheLastThreeWindows) {
  StepResult step = MakeStep(4, 5);
  step.windows[0].ok = 1;  // an early window that must not count
  const StepReport r = Summarize(step, Context());
  EXPECT_EQ(r.windows, 5);
  EXPECT_DOUBLE_EQ(r.duration_s, 3.0);
  EXPECT_EQ(r.requests, 3000);
  EXPECT_DOUBLE_EQ(r.requests_per_s, 1000);
  EXPECT_DOUBLE_EQ(r.inferences_per_s, 2000);
  EXPECT_NEAR(r.latency_p50_us, 500, 0.5);
  EXPECT_NEAR(r.latency_p99_us, 990, 1);
  EXPECT_NEAR(r.latency_us, 950, 1);  // --percentile 95
  EXPECT_DOUBLE_EQ(r.latency_max_us, 1000);
  EXPECT_NEAR(r.latency_avg_us, 500.5, 0.01);
  EXPECT_NEAR(r.goodput_per_s, 500, 1);  // half within 0.5 ms
  EXPECT_EQ(r.errors_total, 6);
  EXPECT_EQ(r.errors.at("HTTP 503"), 6);
  ASSERT_EQ(r.error_latency.count("HTTP 503"), 1u);
  EXPECT_NEAR(r.error_latency.at("HTTP 503").p50_us, 20, 0.1);
  EXPECT_NEAR(r.error_latency.at("HTTP 503").p99_us, 40, 0.1);
  EXPECT_NEAR(r.error_latency.at("HTTP 503").max_us, 40, 0.1);
  ASSERT_EQ(r.error_latency_from_send.count("HTTP 503"), 1u);
  EXPECT_NEAR(r.error_latency_from_send.at("HTTP 503").p99_us, 10, 0.1);
  EXPECT_NEAR(r.latency_from_send_p50_us, 250, 0.5);
  EXPECT_NEAR(r.latency_from_send_p99_us, 495, 1);
  EXPECT_NEAR(r.goodput_from_send_per_s, 1000, 1);  // all within 0.5 ms from the send
  EXPECT_NEAR(r.send_lag_p50_us, 1, 0.01);
  EXPECT_NEAR(r.send_lag_p99_us, 1, 0.01);  // the 990th of 1000
  // 30 ms of CPU over 3006 requests.
  EXPECT_NEAR(r.client_cpu_us_per_request, 30'000.0 / 3006, 1e-6);
  ASSERT_TRUE(r.server.has_value());
  EXPECT_DOUBLE_EQ(r.server_queue_us, 50);
  EXPECT_DOUBLE_EQ(r.server_compute_infer_us, 100);
  EXPECT_DOUBLE_EQ(r.server_batch_size, 4);
}

TEST(SummarizeTest, EmptyStep) {
  StepResult step;
  step.config.concurrency = 1;
  const StepReport r = Summarize(step, Context());
  EXPECT_EQ(r.requests, 0);
  EXPECT_EQ(r.requests_per_s, 0);
}

std::vector<StepReport> Sweep() {
  std::vector<StepReport> steps;
  for (int c : {1, 4, 16}) steps.push_back(Summarize(MakeStep(c, 3, c), Context()));
  return steps;
}

TEST(FormatTest, TableHasOneRowPerStep) {
  const std::string t = FormatTable(Sweep(), Context());
  std::istringstream in(t);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[0], HasSubstr("| Concurrency | infer/s"));
  EXPECT_THAT(lines[0], HasSubstr("p95 latency"));
  EXPECT_THAT(lines[2], HasSubstr("| 1 | 2000.0 | 1000.0 |"));
  EXPECT_THAT(lines[4], HasSubstr("| 16 |"));
  EXPECT_THAT(lines[2], HasSubstr("HTTP 503: 6"));
}

TEST(FormatTest, CsvIsRectangularWithTheFigures) {
  const std::string csv = FormatCsv(Sweep(), Context());
  std::istringstream in(csv);
  std::string line;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    rows.push_back(cells);
  }
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& r : rows) EXPECT_EQ(r.size(), rows[0].size());
  EXPECT_EQ(rows[0][0], "Concurrency");
  EXPECT_EQ(rows[0][1], "Inferences/Second");
  EXPECT_EQ(rows[1][0], "1");
  EXPECT_EQ(rows[1][1], "2000.00");
  EXPECT_EQ(rows[3][0], "16");
}

TEST(FormatTest, JsonParsesAndHoldsTheFigures) {
  const auto j = nlohmann::json::parse(FormatJson(Sweep(), Context()));
  EXPECT_EQ(j["model"], "identity");
  EXPECT_EQ(j["batch_size"], 2);
  ASSERT_EQ(j["steps"].size(), 3u);
  const auto& s = j["steps"][1];
  EXPECT_EQ(s["mode"], "concurrency");
  EXPECT_EQ(s["concurrency"], 4.0);
  EXPECT_DOUBLE_EQ(s["inferences_per_s"].get<double>(), 2000);
  EXPECT_NEAR(s["latency_us"]["p50"].get<double>(), 2000, 2);
  EXPECT_EQ(s["errors"]["HTTP 503"], 6);
  EXPECT_NEAR(s["error_latency_us"]["HTTP 503"]["p99"].get<double>(), 40, 0.1);
  EXPECT_NEAR(s["error_latency_from_send_us"]["HTTP 503"]["p99"].get<double>(), 10, 0.1);
  EXPECT_NEAR(s["latency_from_send_us"]["p50"].get<double>(), 1000, 1);
  EXPECT_TRUE(s["send_lag_us"].contains("p99"));
  EXPECT_DOUBLE_EQ(s["server"]["queue_us"].get<double>(), 50);
  EXPECT_TRUE(s.contains("client_cpu_us_per_request"));
}

// Every opened element is closed, in order.
bool BalancedXml(const std::string& text) {
  std::vector<std::string> stack;
  std::regex tag(R"(<(/?)([a-zA-Z]+)[^>]*?(/?)>)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), tag); it != std::sregex_iterator();
       ++it) {
    const auto& m = *it;
    if (m[3] == "/") continue;
    if (m[1] == "/") {
      if (stack.empty() || stack.back() != m[2]) return false;
      stack.pop_back();
    } else {
      stack.push_back(m[2]);
    }
  }
  return stack.empty();
}

TEST(FormatTest, SvgIsWellFormedWithOneLinePerPercentile) {
  const std::string svg = FormatSvg(Sweep(), Context());
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_TRUE(BalancedXml(svg)) << svg;
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"p50\""));
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"p99\""));
  EXPECT_THAT(svg, HasSubstr("throughput (inferences/s)"));
  EXPECT_THAT(svg, HasSubstr("latency (ms)"));
  size_t circles = 0;
  for (size_t p = svg.find("<circle"); p != std::string::npos; p = svg.find("<circle", p + 1)) {
    ++circles;
  }
  EXPECT_EQ(circles, 6u);  // 3 steps x 2 lines
  // Each polyline has three points.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex("class=\"p99\"[^>]*points=\"([^\"]*)\"")));
  std::istringstream pts(m[1].str());
  std::string pt;
  int n = 0;
  while (pts >> pt) ++n;
  EXPECT_EQ(n, 3);
  // Tick labels for the throughput axis (2000 inferences/s at every step).
  EXPECT_THAT(svg, HasSubstr(">2000</text>"));
}

}  // namespace
}  // namespace shoal::loadgen
