// RenderPrometheus over a live runtime::Server: every line is valid exposition text,
// histograms are cumulative and end in +Inf == _count, and the documented families exist.
#include "server/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <map>
#include <regex>
#include <sstream>

#include "runtime/testing/test_repository.h"

namespace shoal::server {
namespace {

using ::testing::HasSubstr;

struct Sample {
  std::string name, labels;
  double value;
};

// Parses the text format strictly enough to catch malformed lines.
std::vector<Sample> ParseExposition(const std::string& text,
                                    std::map<std::string, std::string>* types) {
  std::vector<Sample> out;
  std::istringstream in(text);
  std::string line;
  const std::regex sample_re(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$)");
  const std::regex type_re(
      R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (std::regex_match(line, m, type_re)) {
      EXPECT_EQ(types->count(m[1]), 0u) << "family declared twice: " << m[1];
      (*types)[m[1]] = m[2];
      continue;
    }
    EXPECT_TRUE(std::regex_match(line, m, sample_re)) << "malformed line: " << line;
    if (m.empty()) continue;
    const std::string v = m[3];
    out.push_back({m[1], m[2], v == "+Inf" ? INFINITY : std::strtod(v.c_str(), nullptr)});
  }
  return out;
}

TEST(MetricsTest, RendersEveryFamilyWithValidHistograms) {
  runtime::testing::TempRepository repo("shoal_metrics_test");
  repo.AddModel("identity", std::string(runtime::testing::kIdentityConfig) +
                                "instance_group [ { count: 2 kind: KIND_CPU } ]\n");
  auto server = runtime::Server::Create(runtime::testing::RepositoryOptions(repo));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  for (int i = 0; i < 3; ++i) {
    runtime::InferRequest r;
    r.model_name = "identity";
    r.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {1, 2})});
    std::promise<Status> done;
    (*server)->Infer(std::move(r),
                     [&](runtime::InferResponse resp) { done.set_value(resp.status); });
    ASSERT_TRUE(done.get_future().get().ok());
  }
  const std::string text = RenderPrometheus(**server);
  std::map<std::string, std::string> types;
  auto samples = ParseExposition(text, &types);
  for (const char* family : {"shoal_inference_requests_total",
                             "shoal_inference_rejections_total",
                             "shoal_inference_items_total",
                             "shoal_inference_executions_total",
                             "shoal_cache_hits_total",
                             "shoal_cache_misses_total",
                             "shoal_request_duration_seconds",
                             "shoal_queue_duration_seconds",
                             "shoal_compute_duration_seconds",
                             "shoal_batch_size",
                             "shoal_queue_depth",
                             "shoal_requests_in_flight",
                             "shoal_admission_reserve_ratio",
                             "shoal_instance_executions_total",
                             "shoal_instance_busy_seconds_total",
                             "shoal_instance_busy_ratio",
                             "shoal_instance_setups_total",
                             "shoal_response_cache_hits_total",
                             "shoal_response_cache_joins_total",
                             "process_cpu_seconds_total",
                             "process_resident_memory_bytes",
                             "shoal_server_ready"}) {
    EXPECT_EQ(types.count(family), 1u) << family;
  }
  EXPECT_EQ(types["shoal_request_duration_seconds"], "histogram");
  // Only instances that pipeline (KIND_GPU) count overlapped executions.
  EXPECT_EQ(types.count("shoal_instance_overlapped_executions_total"), 0u);
  EXPECT_THAT(text, HasSubstr("shoal_inference_requests_total{model=\"identity\",version=\"1\","
                              "outcome=\"success\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("shoal_inference_items_total{model=\"identity\",version=\"1\"} 3\n"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "shoal_instance_busy_ratio{model=\"identity\",version=\"1\",instance=\"identity_1\"}"));
  // The identity plugin prepares nothing.
  EXPECT_THAT(text, HasSubstr("shoal_instance_setups_total{model=\"identity\",version=\"1\","
                              "instance=\"identity_1\"} 0\n"));

  // Every histogram: buckets non-decreasing, +Inf equals _count.
  for (const char* h : {"shoal_request_duration_seconds", "shoal_queue_duration_seconds",
                        "shoal_compute_duration_seconds", "shoal_batch_size"}) {
    double last = -1, inf = -1, count = -2;
    for (const auto& s : samples) {
      if (s.name == std::string(h) + "_bucket") {
        EXPECT_GE(s.value, last) << h;
        last = s.value;
        if (s.labels.find("le=\"+Inf\"") != std::string::npos) inf = s.value;
      }
      if (s.name == std::string(h) + "_count") count = s.value;
    }
    EXPECT_EQ(inf, count) << h;
    EXPECT_GE(count, 1) << h;
  }
  // Latency bucket labels are the documented bounds, written exactly: a query selecting
  // le="5e-05" or le="0.1" must find its bucket.
  std::vector<std::string> les;
  for (const auto& s : samples) {
    if (s.name != "shoal_request_duration_seconds_bucket") continue;
    const size_t at = s.labels.find("le=\"");
    if (at != std::string::npos)
      les.push_back(s.labels.substr(at + 4, s.labels.find('"', at + 4) - at - 4));
  }
  EXPECT_EQ(les, (std::vector<std::string>{"5e-05", "0.0001", "0.00025", "0.0005", "0.001",
                                           "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
                                           "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"}));
  for (const auto& s : samples) {
    if (s.name == "process_resident_memory_bytes") {
      EXPECT_GT(s.value, 1e6);
    }
    if (s.name == "shoal_instance_busy_ratio") {
      EXPECT_TRUE(s.value >= 0 && s.value <= 1);
    }
  }
  (*server)->Shutdown();
}

// Triton's nv_* families: Triton's names, types and labels, and values that agree with
// shoal's own families and with the model's statistics.
TEST(MetricsTest, TritonFamiliesAgreeWithShoalsOwn) {
  runtime::testing::TempRepository repo("shoal_metrics_test");
  repo.AddModel("failing", R"(
name: "failing"
backend: "cost_model"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "a_us" value { string_value: "100" } }
parameters { key: "b_us" value { string_value: "0" } }
parameters { key: "fail_on_value" value { string_value: "7" } }
)");
  auto server = runtime::Server::Create(runtime::testing::RepositoryOptions(repo));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto infer = [&](float value, DataType dtype) {
    runtime::InferRequest r;
    r.model_name = "failing";
    if (dtype == DataType::kFp32) {
      r.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 1}, {value})});
    } else {
      r.inputs.push_back({"INPUT0", Tensor::FromVector<int32_t>(DataType::kInt32, {1, 1}, {1})});
    }
    std::promise<Status> done;
    (*server)->Infer(std::move(r),
                     [&](runtime::InferResponse resp) { done.set_value(resp.status); });
    return done.get_future().get();
  };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(infer(1, DataType::kFp32).ok());
  EXPECT_EQ(infer(7, DataType::kFp32).code(), StatusCode::kInternal);          // BACKEND
  EXPECT_EQ(infer(1, DataType::kInt32).code(), StatusCode::kInvalidArgument);  // OTHER

  const std::string text = RenderPrometheus(**server);
  std::map<std::string, std::string> types;
  std::map<std::string, double> value;  // name + labels -> value
  for (const auto& s : ParseExposition(text, &types)) value[s.name + s.labels] = s.value;
  for (const char* counter :
       {"nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us"}) {
    EXPECT_EQ(types[counter], "counter") << counter;
  }
  EXPECT_EQ(types["nv_inference_pending_request_count"], "gauge");

  const std::string l = "{model=\"failing\",version=\"1\"}";
  auto failure = [&](const std::string& reason) {
    return value["nv_inference_request_failure{model=\"failing\",version=\"1\",reason=\"" + reason +
                 "\"}"];
  };
  EXPECT_EQ(value["nv_inference_request_success" + l], 3);
  EXPECT_EQ(failure("BACKEND"), 1);
  EXPECT_EQ(failure("OTHER"), 1);
  EXPECT_EQ(failure("REJECTED"), 0);
  EXPECT_EQ(failure("CANCELED"), 0);
  EXPECT_EQ(
      value["shoal_inference_requests_total{model=\"failing\",version=\"1\",outcome=\"failure\"}"],
      failure("BACKEND") + failure("OTHER") + failure("REJECTED") + failure("CANCELED"));
  EXPECT_EQ(value["nv_inference_count" + l], value["shoal_inference_items_total" + l]);
  EXPECT_EQ(value["nv_inference_exec_count" + l], value["shoal_inference_executions_total" + l]);
  EXPECT_EQ(value["nv_inference_exec_count" + l], 3) << "failed executions are not counted";
  EXPECT_EQ(value["nv_inference_pending_request_count" + l], 0);

  // Cumulative microseconds, from the statistics the stats endpoint reports in ns.
  auto mv = (*server)->GetModel("failing");
  ASSERT_TRUE(mv.ok());
  const runtime::ModelStatsSnapshot stats = (*mv)->stats();
  EXPECT_EQ(value["nv_inference_request_duration_us" + l], stats.success.ns / 1000);
  EXPECT_EQ(value["nv_inference_queue_duration_us" + l], stats.queue.ns / 1000);
  EXPECT_EQ(value["nv_inference_compute_infer_duration_us" + l], stats.compute_infer.ns / 1000);
  // Three runs of at least a_us = 100 us each.
  EXPECT_GE(value["nv_inference_compute_infer_duration_us" + l], 300);
  EXPECT_GE(value["nv_inference_request_duration_us" + l],
            value["nv_inference_compute_infer_duration_us" + l]);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace shoal::server
