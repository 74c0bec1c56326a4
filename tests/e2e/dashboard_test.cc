// End-to-end test of the live dashboard: the real `shoal serve` on two models of the
// example repository (cost_model with a latency SLO and a precision ladder added, and
// identity), under load from this test, with the page opened in headless Chromium
// (Debian's `chromium`, driven by puppeteer-core from the npm packages the build
// installed: dashboard_browser.cjs). The charts must draw data that moves, the model
// unloaded through the repository API must lose its card, and the page must fit a narrow
// window. Screenshots are left in <build>/tests/e2e/dashboard_test_output/.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e_wait.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using shoal::testing::HttpTestClient;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A single-quoted shell word.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` through the shell; its stdout, and its exit status in *status.
std::string RunCommand(const std::string& command, int* status) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

// Sends requests to `model` one after another until `stop`, with a short pause between
// them so the two cores stay shared with the browser.
void Load(int port, std::string model, std::string body, const std::atomic<bool>* stop,
          std::atomic<int>* ok) {
  HttpTestClient client("127.0.0.1", port);
  while (!stop->load()) {
    if (client.Post("/v2/models/" + model + "/infer", body).status == 200) ++*ok;
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
}

// The series' values ever drawn in one chart of one card of a snapshot.
const json& Series(const json& snapshot, const std::string& card, const std::string& chart,
                   const std::string& series) {
  static const json kNone = json::array();
  const json& cards = snapshot["cards"];
  if (!cards.contains(card) || !cards[card]["charts"].contains(chart)) return kNone;
  const json& s = cards[card]["charts"][chart]["series"];
  return s.contains(series) ? s[series] : kNone;
}

TEST(DashboardE2eTest, ChartsMoveUnloadedModelDisappearsAndNarrowWindowFits) {
  const std::string node = Env("SHOAL_NODE"), chromium = Env("SHOAL_CHROMIUM"),
                    modules = Env("SHOAL_NODE_MODULES");
  ASSERT_TRUE(fs::exists(chromium))
      << "Chromium not found ('" << chromium << "'); scripts/install-deps.sh installs Debian's "
      << "chromium, and CMake finds it at configure time";
  ASSERT_TRUE(fs::exists(node)) << "node not found ('" << node << "')";
  ASSERT_TRUE(fs::exists(fs::path(modules) / "puppeteer-core"))
      << "puppeteer-core is not installed in '" << modules << "' (the build's npm ci installs it)";

  // Two models of the example repository; cost_model gets an SLO so its line is drawn.
  TempDir repo;
  const fs::path examples = fs::path(SourceDir()) / "examples" / "models";
  repo.WriteFile("cost_model/config.pbtxt",
                 ReadFile(examples / "cost_model" / "config.pbtxt") +
                     "parameters { key: \"latency_slo_us\" value { string_value: \"50000\" } }\n"
                     // A precision ladder (the plugin ignores the tier; the runtime keeps it).
                     "parameters { key: \"precision_tiers\" value { string_value: \"int8\" } }\n"
                     "parameters { key: \"precision_ladder\" value { string_value: "
                     "\"fp32,int8\" } }\n");
  repo.WriteFile("identity/config.pbtxt", ReadFile(examples / "identity" / "config.pbtxt"));
  fs::create_directories(fs::path(repo.path()) / "cost_model" / "1");
  fs::create_directories(fs::path(repo.path()) / "identity" / "1");

  const int http = FreePort(), metrics = FreePort();
  auto shoal = ShoalProcess::Start(
      {"serve", "--model-repository", repo.path(), "--http-port", std::to_string(http),
       "--grpc-port", std::to_string(FreePort()), "--metrics-port", std::to_string(metrics),
       "--backend-directory", BinaryDir() + "/backends", "--model-control-mode", "explicit",
       "--load-model", "cost_model", "--load-model", "identity"});
  ASSERT_TRUE(shoal->WaitForPort(http)) << shoal->log();
  ASSERT_TRUE(shoal->WaitForListening(metrics)) << shoal->log();

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::vector<std::thread> load;
  const std::string one =
      R"({"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[0.5]}]})";
  const std::string three =
      R"({"inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]})";
  for (int i = 0; i < 2; ++i) load.emplace_back(Load, http, "cost_model", one, &stop, &ok);
  load.emplace_back(Load, http, "identity", three, &stop, &ok);

  const fs::path out = fs::path(BinaryDir()) / "tests" / "e2e" / "dashboard_test_output";
  fs::create_directories(out);
  fs::remove(out / "dashboard-wide.png");
  fs::remove(out / "dashboard-narrow.png");
  const std::string script = SourceDir() + "/tests/e2e/dashboard_browser.cjs";
  const std::string command =
      "NODE_PATH=" + Quote(modules) + " " + Quote(node) + " " + Quote(script) + " " +
      Quote(chromium) + " " + Quote("http://127.0.0.1:" + std::to_string(metrics) + "/dashboard") +
      " " + Quote("http://127.0.0.1:" + std::to_string(http)) + " identity " + Quote(out.string());
  int status = 0;
  const std::string output = RunCommand(command, &status);
  stop = true;
  for (auto& t : load) t.join();

  EXPECT_EQ(status, 0) << output;
  const size_t last_line = output.rfind('\n', output.size() >= 2 ? output.size() - 2 : 0);
  const json report =
      json::parse(output.substr(last_line == std::string::npos ? 0 : last_line + 1), nullptr,
                  /*allow_exceptions=*/false);
  ASSERT_TRUE(report.is_object()) << output;
  ASSERT_FALSE(report.contains("fatal")) << report["fatal"].get<std::string>() << "\n"
                                         << shoal->log();
  EXPECT_GT(ok.load(), 0);
  // No script error, failed request or Content-Security-Policy violation.
  EXPECT_EQ(report["errors"], json::array()) << report["errors"].dump(2);

  // Both models have a card with every chart.
  const json& before = report["before"];
  const json& after = report["after"];
  EXPECT_EQ(before["status"], "ok");
  for (const char* card : {"cost_model/1", "identity/1"}) {
    ASSERT_TRUE(before["cards"].contains(card)) << before.dump(2);
    for (const char* chart : {"throughput", "latency", "queue", "batch_size", "busy", "cache",
                              "rejections", "precision"}) {
      EXPECT_TRUE(before["cards"][card]["charts"].contains(chart)) << card << " " << chart;
    }
  }

  // The charts draw data that moves: more points, a later time, new pixels, and requests
  // per second above zero in the throughput chart.
  EXPECT_GT(after["updates"].get<int>(), before["updates"].get<int>());
  for (const char* card : {"cost_model/1", "identity/1"}) {
    const json& b = before["cards"][card]["charts"]["throughput"];
    const json& a = after["cards"][card]["charts"]["throughput"];
    EXPECT_GE(a["points"].get<int>(), b["points"].get<int>() + 2) << card;
    EXPECT_GT(a["last_x"].get<double>(), b["last_x"].get<double>()) << card;
    EXPECT_NE(a["canvas"], b["canvas"]) << card << ": the throughput chart was not redrawn";
    double peak = 0;
    for (const json& v : Series(report["after"], card, "throughput", "ok")) {
      peak = std::max(peak, v.get<double>());
    }
    EXPECT_GT(peak, 0) << card << ": no requests per second drawn";
    EXPECT_FALSE(Series(report["after"], card, "latency", "p99").empty()) << card;
    const std::string model = std::string(card).substr(0, std::string(card).find('/'));
    EXPECT_FALSE(Series(report["after"], card, "busy", model + "_0").empty())
        << card << ": no busy % for its first instance";
  }
  EXPECT_NE(after["cards"]["cost_model/1"]["charts"]["latency"]["canvas"],
            before["cards"]["cost_model/1"]["charts"]["latency"]["canvas"]);
  // cost_model's SLO (50 ms) is drawn as a line; identity has none.
  const json& slo = Series(report["after"], "cost_model/1", "latency", "slo");
  ASSERT_FALSE(slo.empty());
  EXPECT_DOUBLE_EQ(slo.back().get<double>(), 50.0);
  EXPECT_TRUE(Series(report["after"], "identity/1", "latency", "slo").empty());
  // Neither model has a cache, and the page says so. cost_model's precision tier is drawn
  // and named on its card; identity has no ladder, and the page says so.
  EXPECT_EQ(after["cards"]["identity/1"]["charts"]["cache"]["value"], "off");
  EXPECT_FALSE(after["cards"]["identity/1"]["charts"]["precision"]["note"].is_null());
  EXPECT_FALSE(Series(report["after"], "cost_model/1", "precision", "tier").empty());
  const json& badges = after["cards"]["cost_model/1"]["badges"];
  EXPECT_TRUE(std::find(badges.begin(), badges.end(), "precision fp32") != badges.end() ||
              std::find(badges.begin(), badges.end(), "precision int8") != badges.end())
      << badges.dump();
  EXPECT_TRUE(std::find(badges.begin(), badges.end(), "SLO 50.0 ms") != badges.end())
      << badges.dump();

  // Unloaded through the repository API, identity's card goes; cost_model's stays.
  EXPECT_EQ(report["unload_status"], 200);
  EXPECT_FALSE(report["unload_seen_ms"].is_null()) << "the unloaded model's card stayed";
  EXPECT_FALSE(report["after_unload"]["cards"].contains("identity/1"));
  EXPECT_TRUE(report["after_unload"]["cards"].contains("cost_model/1"));

  // A narrow window: still updating, nothing wider than the viewport.
  const json& narrow = report["narrow_overflow"];
  EXPECT_EQ(narrow["inner_width"], 375);
  EXPECT_LE(narrow["scroll_width"].get<int>(), 375) << narrow.dump();
  EXPECT_LE(narrow["max_right"].get<double>(), 375.5) << narrow.dump();
  EXPECT_TRUE(report["narrow"]["cards"].contains("cost_model/1"));
  EXPECT_LE(report["wide_overflow"]["scroll_width"].get<int>(), 1280);

  // Screenshots for a person to look at.
  for (const char* name : {"dashboard-wide.png", "dashboard-narrow.png"}) {
    const std::string png = ReadFile(out / name);
    ASSERT_GT(png.size(), 1000u) << name;
    EXPECT_EQ(png.substr(1, 3), "PNG") << name;
  }
  std::cout << "dashboard screenshots in " << out.string() << "; unloaded card gone after "
            << report["unload_seen_ms"] << " ms\n";
  EXPECT_EQ(shoal->Terminate(), 0) << shoal->log();
}

}  // namespace
}  // namespace shoal::e2e
