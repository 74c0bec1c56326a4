// The unary RPC handlers on a real runtime::Server over the example plugins; no network.
#include "server/grpc_handlers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <string>

#include "server/grpc_codec.h"
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
  (*load.mutable_parameters())["config"].set_string_param("{");
  EXPECT_EQ(handlers.RepositoryModelLoad(load, &load_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  (*load.mutable_parameters())["config"].set_string_param(R"({"max_batch_sizes": 4})");
  auto unknown = handlers.RepositoryModelLoad(load, &load_resp);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(unknown.error_message().find("max_batch_sizes"), std::string::npos)
      << unknown.error_message();
  (*load.mutable_parameters())["config"].set_bytes_param("{}");
  EXPECT_EQ(handlers.RepositoryModelLoad(load, &load_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  load.clear_parameters();
  (*load.mutable_parameters())["file:1/model.onnx"].set_bytes_param("x");
  EXPECT_EQ(handlers.RepositoryModelLoad(load, &load_resp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  load.clear_parameters();
  // The config override replaces config.pbtxt: here, two instances instead of one.
  (*load.mutable_parameters())["config"].set_string_param(R"({
      "name": "add_sub", "backend": "add_sub", "max_batch_size": 0,
      "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [4]},
                {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": ["4"]}],
      "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [4]},
                 {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [4]}],
      "instance_group": [{"count": 2, "kind": "KIND_CPU"}]})");
  auto overridden = handlers.RepositoryModelLoad(load, &load_resp);
  ASSERT_TRUE(overridden.ok()) << overridden.error_message();
  inference::ModelConfigRequest creq;
  creq.set_name("add_sub");
  inference::ModelConfigResponse config;
  ASSERT_TRUE(handlers.ModelConfig(creq, &config).ok());
  ASSERT_EQ(config.config().instance_group_size(), 1);
  EXPECT_EQ(config.config().instance_group(0).count(), 2);
  // A broken override is refused with the reason, and the loaded model keeps serving.
  (*load.mutable_parameters())["config"].set_string_param(R"({"name": "other"})");
  auto wrong_name = handlers.RepositoryModelLoad(load, &load_resp);
  EXPECT_EQ(wrong_name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(wrong_name.error_message().find("config override"), std::string::npos)
      << wrong_name.error_message();
  ASSERT_TRUE(handlers.ModelReady(ready_req, &ready).ok());
  EXPECT_TRUE(ready.ready());
  load.clear_parameters();
  load.clear_model_name();
  EXPECT_EQ(handlers.RepositoryModelLoad(load, &load_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// Host bytes behind the DeviceMemory interface, standing in for a CUDA IPC mapping (the
// real one is opened by the real server in e2e_gpu_test on a GPU machine).
class HostWindow : public DeviceMemory {
 public:
  explicit HostWindow(size_t bytes) : bytes_(bytes, '\0') {}
  Status CopyToHost(uint64_t offset, void* dst, size_t n) const override {
    std::memcpy(dst, bytes_.data() + offset, n);
    return Status::Ok();
  }
  Status CopyFromHost(uint64_t offset, const void* src, size_t n) const override {
    std::memcpy(bytes_.data() + offset, src, n);
    return Status::Ok();
  }
  mutable std::string bytes_;
};

// With an opener (a build with the CUDA path), the extension is listed, a handle registers
// and shows in the status, and an infer reads its input from the region and writes its
// output there.
TEST_F(GrpcHandlersTest, CudaSharedMemoryWithAnOpener) {
  auto state = std::make_shared<ExtensionState>();
  std::shared_ptr<HostWindow> window;
  state->shared_memory.SetDeviceMemoryOpener(
      [&](std::string_view handle, int64_t,
          uint64_t bytes) -> StatusOr<std::shared_ptr<const DeviceMemory>> {
        if (handle.size() != 64) return InvalidArgument("not a handle");
        window = std::make_shared<HostWindow>(bytes);
        return std::shared_ptr<const DeviceMemory>(window);
      });
  GrpcHandlers handlers(server_.get(), GrpcHandlers::DefaultExtensions(), state);
  inference::ServerMetadataResponse meta;
  ASSERT_TRUE(handlers.ServerMetadata({}, &meta).ok());
  std::vector<std::string> ext(meta.extensions().begin(), meta.extensions().end());
  EXPECT_NE(std::find(ext.begin(), ext.end(), "cuda_shared_memory"), ext.end());

  inference::CudaSharedMemoryRegisterRequest reg;
  reg.set_name("gpu");
  reg.set_raw_handle(std::string(64, 'h'));
  reg.set_device_id(0);
  reg.set_byte_size(64);
  inference::CudaSharedMemoryRegisterResponse reg_resp;
  ASSERT_TRUE(handlers.CudaSharedMemoryRegister(reg, &reg_resp).ok());
  reg.set_raw_handle("short");
  reg.set_name("other");
  EXPECT_EQ(handlers.CudaSharedMemoryRegister(reg, &reg_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  inference::CudaSharedMemoryStatusResponse status;
  ASSERT_TRUE(handlers.CudaSharedMemoryStatus({}, &status).ok());
  ASSERT_EQ(status.regions().size(), 1u);
  EXPECT_EQ(status.regions().at("gpu").byte_size(), 64u);

  // The codec reads INPUT0 [1, 2] fp32 from bytes 0-7 and writes OUTPUT0 to bytes 32-39.
  const float in[2] = {1.5f, -2.f};
  std::memcpy(window->bytes_.data(), in, 8);
  auto req = std::make_shared<inference::ModelInferRequest>();
  req->set_model_name("identity");
  auto* input = req->add_inputs();
  input->set_name("INPUT0");
  input->set_datatype("FP32");
  input->add_shape(1);
  input->add_shape(2);
  (*input->mutable_parameters())["shared_memory_region"].set_string_param("gpu");
  (*input->mutable_parameters())["shared_memory_byte_size"].set_int64_param(8);
  auto* output = req->add_outputs();
  output->set_name("OUTPUT0");
  (*output->mutable_parameters())["shared_memory_region"].set_string_param("gpu");
  (*output->mutable_parameters())["shared_memory_offset"].set_int64_param(32);
  (*output->mutable_parameters())["shared_memory_byte_size"].set_int64_param(8);
  SharedMemoryOutputs outputs;
  auto decoded =
      InferRequestFromProto(req, runtime::RequestLimits{}, &state->shared_memory, &outputs);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->inputs.size(), 1u);
  EXPECT_EQ(decoded->inputs[0].tensor.values<float>()[0], 1.5f);
  EXPECT_EQ(decoded->inputs[0].tensor.values<float>()[1], -2.f);
  runtime::InferResponse answer;
  answer.model_name = "identity";
  answer.outputs.push_back(
      {"OUTPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {4.f, 5.f})});
  inference::ModelInferResponse resp;
  ASSERT_TRUE(InferResponseToProto(answer, outputs, &resp).ok());
  float out[2] = {};
  std::memcpy(out, window->bytes_.data() + 32, 8);
  EXPECT_EQ(out[0], 4.f);
  EXPECT_EQ(out[1], 5.f);

  inference::CudaSharedMemoryUnregisterRequest unreg;
  inference::CudaSharedMemoryUnregisterResponse unreg_resp;
  ASSERT_TRUE(handlers.CudaSharedMemoryUnregister(unreg, &unreg_resp).ok());
  inference::CudaSharedMemoryStatusResponse after;  // gRPC hands every call a fresh response
  ASSERT_TRUE(handlers.CudaSharedMemoryStatus({}, &after).ok());
  EXPECT_TRUE(after.regions().empty());
}

TEST_F(GrpcHandlersTest, SharedMemoryTraceAndLogSettings) {
  inference::SystemSharedMemoryStatusResponse status;
  ASSERT_TRUE(handlers_->SystemSharedMemoryStatus({}, &status).ok());
  EXPECT_TRUE(status.regions().empty());
  inference::SystemSharedMemoryStatusRequest named;
  named.set_name("nope");
  EXPECT_EQ(handlers_->SystemSharedMemoryStatus(named, &status).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  inference::SystemSharedMemoryRegisterRequest reg;
  reg.set_name("r");
  reg.set_key("/shoal_no_such_shm_object");
  reg.set_byte_size(16);
  inference::SystemSharedMemoryRegisterResponse reg_resp;
  auto s = handlers_->SystemSharedMemoryRegister(reg, &reg_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("'r'"), std::string::npos) << s.error_message();
  inference::SystemSharedMemoryUnregisterResponse unreg_resp;
  EXPECT_TRUE(handlers_->SystemSharedMemoryUnregister({}, &unreg_resp).ok());

  inference::CudaSharedMemoryStatusResponse cuda;
  EXPECT_TRUE(handlers_->CudaSharedMemoryStatus({}, &cuda).ok());
  EXPECT_TRUE(cuda.regions().empty());
  inference::CudaSharedMemoryRegisterRequest cuda_req;
  cuda_req.set_name("c");
  cuda_req.set_byte_size(4);
  inference::CudaSharedMemoryRegisterResponse cuda_reg;
  auto no_gpu = handlers_->CudaSharedMemoryRegister(cuda_req, &cuda_reg);
  EXPECT_EQ(no_gpu.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(no_gpu.error_message().find("built without the CUDA path"), std::string::npos);
  cuda_req.set_name("");
  EXPECT_EQ(handlers_->CudaSharedMemoryRegister(cuda_req, &cuda_reg).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  inference::CudaSharedMemoryStatusRequest cuda_one;
  cuda_one.set_name("c");
  EXPECT_EQ(handlers_->CudaSharedMemoryStatus(cuda_one, &cuda).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  inference::TraceSettingRequest trace;
  inference::TraceSettingResponse trace_resp;
  ASSERT_TRUE(handlers_->TraceSetting(trace, &trace_resp).ok());
  EXPECT_EQ(trace_resp.settings().at("trace_level").value(0), "OFF");
  (*trace.mutable_settings())["trace_level"].add_value("TIMESTAMPS");
  EXPECT_EQ(handlers_->TraceSetting(trace, &trace_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  trace.clear_settings();
  (*trace.mutable_settings())["trace_rate"].add_value("7");
  trace.set_model_name("identity");
  inference::TraceSettingResponse model_trace;
  ASSERT_TRUE(handlers_->TraceSetting(trace, &model_trace).ok());
  EXPECT_EQ(model_trace.settings().at("trace_rate").value(0), "7");
  trace.set_model_name("nope");
  EXPECT_EQ(handlers_->TraceSetting(trace, &model_trace).error_code(), grpc::StatusCode::NOT_FOUND);

  inference::LogSettingsRequest log;
  inference::LogSettingsResponse log_resp;
  ASSERT_TRUE(handlers_->LogSettings(log, &log_resp).ok());
  EXPECT_TRUE(log_resp.settings().at("log_error").bool_param());
  (*log.mutable_settings())["log_verbose_level"].set_uint32_param(1);
  ASSERT_TRUE(handlers_->LogSettings(log, &log_resp).ok());
  EXPECT_EQ(log_resp.settings().at("log_verbose_level").uint32_param(), 1u);
  (*log.mutable_settings())["log_verbose_level"].set_uint32_param(0);
  ASSERT_TRUE(handlers_->LogSettings(log, &log_resp).ok());
  (*log.mutable_settings())["log_rotation"].set_bool_param(true);
  auto unknown = handlers_->LogSettings(log, &log_resp);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(unknown.error_message().find("log_rotation"), std::string::npos);
}

}  // namespace
}  // namespace shoal::server
