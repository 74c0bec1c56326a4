// Routing of OIP paths and the JSON renderers that need no running server.
#include "server/http_routes.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace shoal::server::internal {
namespace {

using json = nlohmann::json;

RouteMatch Match(std::vector<std::string> s) { return MatchRoute(s); }

TEST(HttpRoutesTest, MatchesEveryEndpoint) {
  EXPECT_EQ(Match({"v2"}).route, Route::kServerMetadata);
  EXPECT_EQ(Match({"v2", "health", "live"}).route, Route::kLive);
  EXPECT_EQ(Match({"v2", "health", "ready"}).route, Route::kReady);
  EXPECT_EQ(Match({"v2", "models", "stats"}).route, Route::kStats);
  EXPECT_EQ(Match({"v2", "models", "stats"}).model, "");
  auto m = Match({"v2", "models", "m x"});
  EXPECT_EQ(m.route, Route::kModelMetadata);
  EXPECT_EQ(m.model, "m x");
  EXPECT_EQ(m.version, -1);
  m = Match({"v2", "models", "m", "versions", "12", "infer"});
  EXPECT_EQ(m.route, Route::kInfer);
  EXPECT_EQ(m.version, 12);
  EXPECT_EQ(Match({"v2", "models", "m", "ready"}).route, Route::kModelReady);
  EXPECT_EQ(Match({"v2", "models", "m", "config"}).route, Route::kModelConfig);
  EXPECT_EQ(Match({"v2", "models", "m", "stats"}).route, Route::kStats);
  EXPECT_EQ(Match({"v2", "models", "m", "versions", "3", "stats"}).route, Route::kStats);
  EXPECT_EQ(Match({"v2", "models", "m", "versions", "3"}).route, Route::kModelMetadata);
  EXPECT_EQ(Match({"v2", "repository", "index"}).route, Route::kRepositoryIndex);
  EXPECT_EQ(Match({"v2", "repository", "r", "index"}).route, Route::kRepositoryIndex);
  m = Match({"v2", "repository", "models", "m", "load"});
  EXPECT_EQ(m.route, Route::kRepositoryLoad);
  EXPECT_EQ(m.model, "m");
  m = Match({"v2", "repository", "r", "models", "m", "unload"});
  EXPECT_EQ(m.route, Route::kRepositoryUnload);
  EXPECT_EQ(m.model, "m");
  EXPECT_EQ(RouteMethod(Route::kInfer), "POST");
  EXPECT_EQ(RouteMethod(Route::kModelConfig), "GET");
}

// What --auth-scope guards: health never, control always, the rest under "all".
TEST(HttpRoutesTest, EveryRouteHasTheEndpointClassTheAuthScopeNames) {
  auto cls = [](std::vector<std::string> s) { return RouteEndpointClass(MatchRoute(s).route); };
  EXPECT_EQ(cls({"v2", "health", "live"}), EndpointClass::kHealth);
  EXPECT_EQ(cls({"v2", "health", "ready"}), EndpointClass::kHealth);
  EXPECT_EQ(cls({"v2", "models", "m", "ready"}), EndpointClass::kHealth);
  EXPECT_EQ(cls({"v2", "models", "m", "versions", "3", "ready"}), EndpointClass::kHealth);
  EXPECT_EQ(cls({"v2"}), EndpointClass::kMetadata);
  EXPECT_EQ(cls({"v2", "models", "m"}), EndpointClass::kMetadata);
  EXPECT_EQ(cls({"v2", "models", "m", "config"}), EndpointClass::kMetadata);
  EXPECT_EQ(cls({"v2", "models", "stats"}), EndpointClass::kMetadata);
  EXPECT_EQ(cls({"v2", "models", "m", "infer"}), EndpointClass::kInference);
  EXPECT_EQ(cls({"v2", "repository", "index"}), EndpointClass::kControl);
  EXPECT_EQ(cls({"v2", "repository", "models", "m", "load"}), EndpointClass::kControl);
  EXPECT_EQ(cls({"v2", "repository", "models", "m", "unload"}), EndpointClass::kControl);
}

TEST(HttpRoutesTest, TritonExtensionsHaveEndpointClassesToo) {
  using V = std::vector<std::string>;
  EXPECT_EQ(ExtensionEndpointClass(V{"v2", "systemsharedmemory", "status"}),
            EndpointClass::kInference);
  EXPECT_EQ(ExtensionEndpointClass(V{"v2", "systemsharedmemory", "region", "r", "register"}),
            EndpointClass::kInference);
  EXPECT_EQ(ExtensionEndpointClass(V{"v2", "cudasharedmemory", "status"}),
            EndpointClass::kInference);
  EXPECT_EQ(ExtensionEndpointClass(V{"v2", "logging"}), EndpointClass::kControl);
  EXPECT_EQ(ExtensionEndpointClass(V{"v2", "trace", "setting"}), EndpointClass::kControl);
  EXPECT_EQ(ExtensionEndpointClass(V{"v2", "models", "m", "trace", "setting"}),
            EndpointClass::kControl);
  EXPECT_EQ(ExtensionEndpointClass(V{"v2", "models", "m", "infer"}), std::nullopt);
  EXPECT_EQ(ExtensionEndpointClass(V{"v2", "health", "ready"}), std::nullopt);
}

TEST(HttpRoutesTest, UnknownAndMalformed) {
  EXPECT_EQ(Match({}).route, Route::kNotFound);
  EXPECT_EQ(Match({"v1"}).route, Route::kNotFound);
  EXPECT_EQ(Match({"v2", "health"}).route, Route::kNotFound);
  EXPECT_EQ(Match({"v2", "models", "m", "explode"}).route, Route::kNotFound);
  EXPECT_EQ(Match({"v2", "models", "m", "versions"}).route, Route::kNotFound);
  EXPECT_EQ(Match({"v2", "models", "m", "versions", "1", "infer", "x"}).route, Route::kNotFound);
  auto m = Match({"v2", "models", "m", "versions", "-1", "infer"});
  EXPECT_EQ(m.route, Route::kNotFound);
  EXPECT_FALSE(m.error.ok());
  EXPECT_FALSE(Match({"v2", "models", "m", "versions", "99999999999999999999"}).error.ok());
}

TEST(HttpRoutesTest, ServerMetadataListsOnlyWhatIsImplemented) {
  auto j = json::parse(ServerMetadataJson());
  EXPECT_EQ(j["name"], "shoal");
  auto ext = j["extensions"].get<std::vector<std::string>>();
  for (const char* missing : {"sequence", "cuda_shared_memory", "trace"}) {
    EXPECT_EQ(std::count(ext.begin(), ext.end(), missing), 0) << missing;
  }
  for (const char* present : {"system_shared_memory", "classification", "logging"}) {
    EXPECT_EQ(std::count(ext.begin(), ext.end(), present), 1) << present;
  }
  // A build that can open CUDA regions lists their extension.
  auto cuda = json::parse(ServerMetadataJson(true))["extensions"].get<std::vector<std::string>>();
  EXPECT_EQ(std::count(cuda.begin(), cuda.end(), "cuda_shared_memory"), 1);
}

TEST(HttpRoutesTest, ModelConfigJsonWritesInt64AsNumbers) {
  inference::ModelConfig c;
  c.set_name("m");
  c.set_max_batch_size(4);
  auto* in = c.add_input();
  in->set_name("I");
  in->set_data_type(inference::TYPE_FP32);
  in->add_dims(-1);
  in->add_dims(3);
  c.mutable_dynamic_batching()->set_max_queue_delay_microseconds(100);
  (*c.mutable_parameters())["dims"].set_string_value("7");
  auto text = ModelConfigJson(c);
  ASSERT_TRUE(text.ok());
  auto j = json::parse(*text);
  EXPECT_EQ(j["input"][0]["dims"], json({-1, 3}));
  EXPECT_EQ(j["input"][0]["data_type"], "TYPE_FP32");
  EXPECT_EQ(j["dynamic_batching"]["max_queue_delay_microseconds"], 100);
  EXPECT_EQ(j["max_batch_size"], 4);
  EXPECT_EQ(j["parameters"]["dims"]["string_value"], "7") << "string values stay strings";
  EXPECT_TRUE(j.contains("output")) << "every field is printed, defaults included";
}

TEST(HttpRoutesTest, RepositoryIndexJson) {
  std::vector<runtime::ModelStatus> index = {
      {"a", 0, runtime::ModelState::kUnavailable, "not loaded"},
      {"b", 2, runtime::ModelState::kReady, ""}};
  EXPECT_EQ(
      RepositoryIndexJson(index, false),
      R"([{"name":"a","state":"UNAVAILABLE","reason":"not loaded"},{"name":"b","version":"2","state":"READY","reason":""}])");
  EXPECT_EQ(RepositoryIndexJson(index, true),
            R"([{"name":"b","version":"2","state":"READY","reason":""}])");
}

TEST(HttpRoutesTest, ErrorResponseUsesTheStatusMap) {
  auto r = ErrorResponse(ResourceExhausted("queue full"));
  EXPECT_EQ(r.status, 429);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "Retry-After");
  EXPECT_EQ(r.body, R"({"error":"queue full"})");
  EXPECT_EQ(ErrorResponse(Unavailable("x")).status, 503);
  EXPECT_EQ(ErrorResponse(NotFound("x")).status, 404);
  EXPECT_TRUE(ErrorResponse(NotFound("x")).headers.empty());
}

}  // namespace
}  // namespace shoal::server::internal
