#include "server/grpc_handlers.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "repository/model_config.h"
#include "server/grpc_codec.h"

#ifndef SHOAL_VERSION
#define SHOAL_VERSION "0.0.0"
#endif

namespace shoal::server {
namespace {

grpc::Status Error(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, std::move(message));
}

// The ready versions of one model, ascending.
std::vector<std::shared_ptr<runtime::ModelVersion>> VersionsOf(const runtime::Server& server,
                                                               const std::string& name) {
  std::vector<std::shared_ptr<runtime::ModelVersion>> out;
  for (auto& mv : server.ReadyVersions()) {
    if (mv->name() == name) out.push_back(std::move(mv));
  }
  return out;
}

}  // namespace

std::vector<std::string> GrpcHandlers::DefaultExtensions() {
  // "parameters": request parameters other than the reserved ones reach the runtime
  // (InferRequest::parameters). binary_tensor_data is HTTP's; GrpcOptions::extensions
  // can give one list for both protocols.
  return {"model_configuration", "model_repository", "parameters",           "schedule_policy",
          "statistics",          "classification",   "system_shared_memory", "logging"};
}

GrpcHandlers::GrpcHandlers(runtime::Server* server, std::vector<std::string> extensions,
                           std::shared_ptr<ExtensionState> state)
    : server_(server),
      extensions_(std::move(extensions)),
      state_(state ? std::move(state) : std::make_shared<ExtensionState>()) {
  // Listed where this build can open CUDA regions (serve.cc sets the opener first).
  if (state_->shared_memory.CudaSupported() &&
      std::find(extensions_.begin(), extensions_.end(), "cuda_shared_memory") == extensions_.end())
    extensions_.push_back("cuda_shared_memory");
}

grpc::Status GrpcHandlers::ServerLive(const inference::ServerLiveRequest&,
                                      inference::ServerLiveResponse* response) {
  response->set_live(server_->live());
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::ServerReady(const inference::ServerReadyRequest&,
                                       inference::ServerReadyResponse* response) {
  response->set_ready(server_->ready());
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::ModelReady(const inference::ModelReadyRequest& request,
                                      inference::ModelReadyResponse* response) {
  auto version = ParseModelVersion(request.version());
  if (!version.ok()) return ToGrpcStatus(version.status());
  response->set_ready(server_->ModelReady(request.name(), *version).ok());
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::ServerMetadata(const inference::ServerMetadataRequest&,
                                          inference::ServerMetadataResponse* response) {
  response->set_name("shoal");
  response->set_version(SHOAL_VERSION);
  for (const auto& e : extensions_) response->add_extensions(e);
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::ModelMetadata(const inference::ModelMetadataRequest& request,
                                         inference::ModelMetadataResponse* response) {
  auto version = ParseModelVersion(request.version());
  if (!version.ok()) return ToGrpcStatus(version.status());
  auto mv = server_->GetModel(request.name(), *version);
  if (!mv.ok()) return ToGrpcStatus(mv.status());
  auto config = server_->GetModelConfig(request.name(), *version);
  if (!config.ok()) return ToGrpcStatus(config.status());
  std::vector<int64_t> versions;
  if (*version >= 0) {
    versions.push_back(*version);
  } else {
    for (const auto& v : VersionsOf(*server_, request.name())) versions.push_back(v->version());
  }
  const std::string& platform = config->platform().empty() ? config->backend() : config->platform();
  ModelMetadataToProto(request.name(), versions, platform, (*mv)->signature(), response);
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::ModelConfig(const inference::ModelConfigRequest& request,
                                       inference::ModelConfigResponse* response) {
  auto version = ParseModelVersion(request.version());
  if (!version.ok()) return ToGrpcStatus(version.status());
  auto config = server_->GetModelConfig(request.name(), *version);
  if (!config.ok()) return ToGrpcStatus(config.status());
  *response->mutable_config() = std::move(config).value();
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::ModelStatistics(const inference::ModelStatisticsRequest& request,
                                           inference::ModelStatisticsResponse* response) {
  auto version = ParseModelVersion(request.version());
  if (!version.ok()) return ToGrpcStatus(version.status());
  std::vector<std::shared_ptr<runtime::ModelVersion>> versions;
  if (request.name().empty()) {
    if (*version >= 0) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   "a version needs a model name in ModelStatisticsRequest");
    }
    versions = server_->ReadyVersions();
  } else if (*version >= 0) {
    auto mv = server_->GetModel(request.name(), *version);
    if (!mv.ok()) return ToGrpcStatus(mv.status());
    versions.push_back(std::move(mv).value());
  } else {
    // The GetModel check gives the right error for an unknown or unready model.
    auto mv = server_->GetModel(request.name(), -1);
    if (!mv.ok()) return ToGrpcStatus(mv.status());
    versions = VersionsOf(*server_, request.name());
  }
  for (const auto& mv : versions) {
    ModelStatisticsToProto(mv->name(), mv->version(), mv->stats(), response->add_model_stats());
  }
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::RepositoryIndex(const inference::RepositoryIndexRequest& request,
                                           inference::RepositoryIndexResponse* response) {
  if (!request.repository_name().empty()) {
    return Error(grpc::StatusCode::UNIMPLEMENTED,
                 "'repository_name' is not supported: shoal serves one repository");
  }
  for (const auto& m : server_->RepositoryIndex()) {
    if (request.ready() && m.state != runtime::ModelState::kReady) continue;
    auto* entry = response->add_models();
    entry->set_name(m.name);
    if (m.version > 0) entry->set_version(std::to_string(m.version));
    entry->set_state(std::string(runtime::ModelStateName(m.state)));
    entry->set_reason(m.reason);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::CheckRepositoryChange(const std::string& repository_name,
                                                 const std::string& model_name) const {
  if (!repository_name.empty()) {
    return Error(grpc::StatusCode::UNIMPLEMENTED,
                 "'repository_name' is not supported: shoal serves one repository");
  }
  if (model_name.empty()) return Error(grpc::StatusCode::INVALID_ARGUMENT, "model_name is empty");
  if (server_->options().control_mode != runtime::ModelControlMode::kExplicit) {
    return ToGrpcStatus(
        FailedPrecondition("models can be loaded and unloaded only when the server runs with "
                           "--model-control-mode explicit"));
  }
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::RepositoryModelLoad(const inference::RepositoryModelLoadRequest& request,
                                               inference::RepositoryModelLoadResponse*) {
  if (auto s = CheckRepositoryChange(request.repository_name(), request.model_name()); !s.ok()) {
    return s;
  }
  std::optional<inference::ModelConfig> config;
  for (const auto& [key, value] : request.parameters()) {
    if (key != "config") {
      return Error(grpc::StatusCode::UNIMPLEMENTED,
                   "load parameter '" + key +
                       "' is not supported (only 'config', the model config as JSON)");
    }
    if (value.parameter_choice_case() != inference::ModelRepositoryParameter::kStringParam) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   "load parameter 'config' must be a string_param holding the model config "
                   "as JSON");
    }
    auto parsed = repository::ParseModelConfigJson(value.string_param(), "parameters.config");
    if (!parsed.ok()) return ToGrpcStatus(parsed.status());
    config = std::move(parsed).value();
  }
  return ToGrpcStatus(server_->LoadModel(request.model_name(), config));
}

grpc::Status GrpcHandlers::RepositoryModelUnload(
    const inference::RepositoryModelUnloadRequest& request,
    inference::RepositoryModelUnloadResponse*) {
  if (auto s = CheckRepositoryChange(request.repository_name(), request.model_name()); !s.ok()) {
    return s;
  }
  bool unload_dependents = false;
  for (const auto& [key, value] : request.parameters()) {
    // An ensemble's step models go with it (runtime::Server::UnloadModel).
    if (key == "unload_dependents" &&
        value.parameter_choice_case() == inference::ModelRepositoryParameter::kBoolParam) {
      unload_dependents = value.bool_param();
      continue;
    }
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 "unload parameter '" + key + "' is not supported (only unload_dependents, bool)");
  }
  return ToGrpcStatus(server_->UnloadModel(request.model_name(), unload_dependents));
}

grpc::Status GrpcHandlers::HealthCheck(const grpc::health::v1::HealthCheckRequest& request,
                                       grpc::health::v1::HealthCheckResponse* response) {
  if (!request.service().empty() && request.service() != "inference.GRPCInferenceService") {
    return Error(grpc::StatusCode::NOT_FOUND, "unknown service '" + request.service() + "'");
  }
  response->set_status(server_->ready() ? grpc::health::v1::HealthCheckResponse::SERVING
                                        : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

}  // namespace shoal::server
