// The unary RPC handlers on a real runtime::Server over the example plugins; no network.
#include "server/grpc_handlers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <future>

#include "server/grpc_test_util.h"

namespace shoal::server {
namespace {

using testing::MakeServer;
using testing::TempRepository;

class GrpcHandlersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_.AddModel("identity", testing::kIdentityConfig);
    repo_.AddModel("add_sub", testing::kAddSubConfig);
    server_ = MakeServer(repo_);
    ASSERT_NE(server_, nullptr);
    handlers_ = std::make_unique<GrpcHandlers>(server_.get(), GrpcHandlers::DefaultExtensions());
  }

  void InferOnce(const std::string& model) {
    runtime::InferRequest r;
    r.model_name = model;
    r.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {1, 2})});
    std::promise<Status> done;
    server_->Infer(std::move(r), [&](runtime::InferResponse a) { done.set_value(a.status); });
    ASSERT_TRUE(done.get_future().get().ok());
  }

  TempRepository repo_{"shoal_grpc_test"};
  std::unique_ptr<runtime::Server> server_;
  std::unique_ptr<GrpcHandlers> handlers_;
};

TEST_F(GrpcHandlersTest, HealthAndServerMetadata) {
  inference::ServerLiveResponse live;
  ASSERT_TRUE(handlers_->ServerLive({}, &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(handlers_->ServerReady({}, &ready).ok());
  EXPECT_TRUE(ready.ready());

  inference::ServerMetadataResponse meta;
  ASSERT_TRUE(handlers_->ServerMetadata({}, &meta).ok());
  EXPECT_EQ(meta.name(), "shoal");
  EXPECT_FALSE(meta.version().empty());
  std::vector<std::string> ext(meta.extensions().begin(), meta.extensions().end());
  EXPECT_EQ(ext, GrpcHandlers::DefaultExtensions());
  EXPECT_NE(std::find(ext.begin(), ext.end(), "statistics"), ext.end());

  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_TRUE(handlers_->HealthCheck(hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  hreq.set_service("inference.GRPCInferenceService");
  ASSERT_TRUE(handlers_->HealthCheck(hreq, &hresp).ok());
  hreq.set_service("nope");
  EXPECT_EQ(handlers_->HealthCheck(hreq, &hresp).error_code(), grpc::StatusCode::NOT_FOUND);

  server_->Shutdown();
  ASSERT_TRUE(handlers_->ServerReady({}, &ready).ok());
  EXPECT_FALSE(ready.ready());
  hreq.clear_service();
  ASSERT_TRUE(handlers_->HealthCheck(hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

TEST_F(GrpcHandlersTest, ModelReady) {
  inference::ModelReadyRequest req;
  inference::ModelReadyResponse resp;
  req.set_name("identity");
  ASSERT_TRUE(handlers_->ModelReady(req, &resp).ok());
  EXPECT_TRUE(resp.ready());
  req.set_version("1");
  ASSERT_TRUE(handlers_->ModelReady(req, &resp).ok());
  EXPECT_TRUE(resp.ready());
  req.set_version("2");
  ASSERT_TRUE(handlers_->ModelReady(req, &resp).ok());
  EXPECT_FALSE(resp.ready());
  req.set_name("unknown");
  req.clear_version();
  ASSERT_TRUE(handlers_->ModelReady(req, &resp).ok());
  EXPECT_FALSE(resp.ready());
  req.set_version("x");
  EXPECT_EQ(handlers_->ModelReady(req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(GrpcHandlersTest, ModelMetadataAndConfig) {
  inference::ModelMetadataRequest req;
  inference::ModelMetadataResponse meta;
  req.set_name("identity");
  ASSERT_TRUE(handlers_->ModelMetadata(req, &meta).ok());
  EXPECT_EQ(meta.name(), "identity");
  EXPECT_EQ(meta.platform(), "identity");
  ASSERT_EQ(meta.versions_size(), 1);
  EXPECT_EQ(meta.versions(0), "1");
  ASSERT_EQ(meta.inputs_size(), 1);
  EXPECT_EQ(meta.inputs(0).name(), "INPUT0");
  EXPECT_EQ(meta.inputs(0).datatype(), "FP32");
  EXPECT_EQ(std::vector<int64_t>(meta.inputs(0).shape().begin(), meta.inputs(0).shape().end()),
            (std::vector<int64_t>{-1, -1}))
      << "a batching model's shapes start with -1";
  ASSERT_EQ(meta.outputs_size(), 1);

  inference::ModelMetadataResponse add_sub;
  req.set_name("add_sub");
  ASSERT_TRUE(handlers_->ModelMetadata(req, &add_sub).ok());
  EXPECT_EQ(add_sub.inputs(1).shape_size(), 1);
  EXPECT_EQ(add_sub.outputs(1).name(), "OUTPUT1");

  inference::ModelMetadataResponse missing;
  req.set_name("unknown");
  EXPECT_EQ(handlers_->ModelMetadata(req, &missing).error_code(), grpc::StatusCode::NOT_FOUND);
  req.set_name("identity");
  req.set_version("7");
  EXPECT_EQ(handlers_->ModelMetadata(req, &missing).error_code(), grpc::StatusCode::NOT_FOUND);

  inference::ModelConfigRequest creq;
  inference::ModelConfigResponse config;
  creq.set_name("identity");
  ASSERT_TRUE(handlers_->ModelConfig(creq, &config).ok());
  EXPECT_EQ(config.config().name(), "identity");
  EXPECT_EQ(config.config().max_batch_size(), 8);
  EXPECT_TRUE(config.config().has_dynamic_batching());
  creq.set_name("unknown");
  EXPECT_EQ(handlers_->ModelConfig(creq, &config).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(GrpcHandlersTest, StatisticsCountInferences) {
  inference::ModelStatisticsResponse all;
  ASSERT_TRUE(handlers_->ModelStatistics({}, &all).ok());
  ASSERT_EQ(all.model_stats_size(), 2);
  EXPECT_EQ(all.model_stats(0).name(), "add_sub");
  EXPECT_EQ(all.model_stats(1).name(), "identity");
  EXPECT_EQ(all.model_stats(1).inference_count(), 0u);

  InferOnce("identity");
  InferOnce("identity");
  inference::ModelStatisticsRequest req;
  req.set_name("identity");
  inference::ModelStatisticsResponse one;
  ASSERT_TRUE(handlers_->ModelStatistics(req, &one).ok());
  ASSERT_EQ(one.model_stats_size(), 1);
  EXPECT_EQ(one.model_stats(0).version(), "1");
  EXPECT_EQ(one.model_stats(0).inference_stats().success().count(), 2u);
  EXPECT_EQ(one.model_stats(0).inference_count(), 2u);
  EXPECT_GT(one.model_stats(0).last_inference(), 0u);

  req.set_version("1");
  inference::ModelStatisticsResponse v1;
  ASSERT_TRUE(handlers_->ModelStatistics(req, &v1).ok());
  EXPECT_EQ(v1.model_stats_size(), 1);
  req.set_name("unknown");
  EXPECT_EQ(handlers_->ModelStatistics(req, &v1).error_code(), grpc::StatusCode::NOT_FOUND);
  req.clear_name();
  EXPECT_EQ(handlers_->ModelStatistics(req, &v1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(GrpcHandlersTest, RepositoryIndexAndControlModeNone) {
  inference::RepositoryIndexResponse index;
  ASSERT_TRUE(handlers_->RepositoryIndex({}, &index).ok());
  ASSERT_EQ(index.models_size(), 2);
  EXPECT_EQ(index.models(0).name(), "add_sub");
  EXPECT_EQ(index.models(0).version(), "1");
  EXPECT_EQ(index.models(0).state(), "READY");

  inference::RepositoryIndexRequest named;
  named.set_repository_name("other");
  EXPECT_EQ(handlers_->RepositoryIndex(named, &index).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  inference::RepositoryModelLoadRequest load;
  load.set_model_name("identity");
  inference::RepositoryModelLoadResponse load_resp;
  auto s = handlers_->RepositoryModelLoad(load, &load_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("--model-control-mode explicit"), std::string::npos);
  inference::RepositoryModelUnloadRequest unload;
  unload.set_model_name("identity");
  inference::RepositoryModelUnloadResponse unload_resp;
  EXPECT_EQ(handlers_->RepositoryModelUnload(unload, &unload_resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(GrpcHandlersExplicitTest, LoadAndUnload) {
  TempRepository repo("shoal_grpc_test");
  repo.AddModel("identity", testing::kIdentityConfig);
  repo.AddModel("add_sub", testing::kAddSubConfig);
  auto server = MakeServer(repo, runtime::ModelControlMode::kExplicit, {"identity"});
  ASSERT_NE(server, nullptr);
  GrpcHandlers handlers(server.get(), GrpcHandlers::DefaultExtensions());

  inference::RepositoryIndexRequest ready_only;
  ready_only.set_ready(true);
  inference::RepositoryIndexResponse index;
  ASSERT_TRUE(handlers.RepositoryIndex(ready_only, &index).ok());
  ASSERT_EQ(index.models_size(), 1);
  EXPECT_EQ(index.models(0).name(), "identity");
  inference::RepositoryIndexResponse everything;
  ASSERT_TRUE(handlers.RepositoryIndex({}, &everything).ok());
  ASSERT_EQ(everything.models_size(), 2);
  EXPECT_EQ(everything.models(0).state(), "UNAVAILABLE");
  EXPECT_EQ(everything.models(0).version(), "") << "no version when none is loaded";

  inference::RepositoryModelLoadRequest load;
  inference::RepositoryModelLoadResponse load_resp;
  load.set_model_name("add_sub");
  ASSERT_TRUE(handlers.RepositoryModelLoad(load, &load_resp).ok());
  inference::ModelReadyRequest ready_req;
  inference::ModelReadyResponse ready;
  ready_req.set_name("add_sub");
  ASSERT_TRUE(handlers.ModelReady(ready_req, &ready).ok());
  EXPECT_TRUE(ready.ready());

  inference::RepositoryModelUnloadRequest unload;
  inference::RepositoryModelUnloadResponse unload_resp;
  unload.set_model_name("add_sub");
  (*unload.mutable_parameters())["unload_dependents"].set_bool_param(true);
  ASSERT_TRUE(handlers.RepositoryModelUnload(unload, &unload_resp).ok());
  ASSERT_TRUE(handlers.ModelReady(ready_req, &ready).ok());
  EXPECT_FALSE(ready.ready());
  EXPECT_TRUE(handlers.RepositoryModelUnload(unload, &unload_resp).ok())
      << "unloading what is not loaded succeeds, as in Triton";

  load.set_model_name("no_such_model");
  EXPECT_EQ(handlers.RepositoryModelLoad(load, &load_resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  load.set_model_name("add_sub");
  (*load.mutable_parameters())["config"].set_string_param("{}");
  EXPECT_EQ(handlers.RepositoryModelLoad(load, &load_resp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  load.clear_parameters();
  load.clear_model_name();
  EXPECT_EQ(handlers.RepositoryModelLoad(load, &load_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace shoal::server
