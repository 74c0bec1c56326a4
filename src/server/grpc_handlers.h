// GrpcHandlers: what each unary RPC of inference.GRPCInferenceService (and
// grpc.health.v1.Health/Check) answers, as a plain function of the runtime::Server and
// the request message. No gRPC machinery here: GrpcServer (grpc_server.h) receives the
// calls on its completion queues and calls these, so they are unit-tested without a
// network (grpc_handlers_test.cc). Inference (ModelInfer, ModelStreamInfer) is not here:
// it is answered asynchronously from the runtime's callback (grpc_calls.h).
//
// Threads: every method may be called from any thread, concurrently. Every method but
// RepositoryModelLoad/Unload returns quickly (no inference, no model loading; the index
// scans the repository folder); those two block while a model loads or drains, so the
// server runs them on its worker thread, never on a completion-queue thread.
//
// Errors go through server/status_map: an unknown model is NOT_FOUND, a model that is
// not ready UNAVAILABLE, a malformed version INVALID_ARGUMENT, a repository change when
// the control mode is not "explicit" FAILED_PRECONDITION, features shoal lacks
// (a named repository, load parameters other than `config`) UNIMPLEMENTED. ModelReady answers
// ready=false (status OK) for a model that is unknown or not ready.
#pragma once

#include <grpcpp/support/status.h>

#include <memory>
#include <string>
#include <vector>

#include "proto/grpc_health.pb.h"
#include "proto/grpc_service.pb.h"
#include "runtime/server.h"
#include "server/protocol_settings.h"

namespace shoal::server {

class GrpcHandlers {
 public:
  // The extensions shoal's gRPC front end implements (section 1.4's tokens).
  static std::vector<std::string> DefaultExtensions();

  // `server` must outlive the handlers. `extensions` is what ServerMetadata lists.
  // `state`: shared-memory regions and trace settings shared with the HTTP front end
  // (null: the handlers keep their own).
  GrpcHandlers(runtime::Server* server, std::vector<std::string> extensions,
               std::shared_ptr<ExtensionState> state = nullptr);

  ExtensionState& extension_state() { return *state_; }

  grpc::Status ServerLive(const inference::ServerLiveRequest& request,
                          inference::ServerLiveResponse* response);
  grpc::Status ServerReady(const inference::ServerReadyRequest& request,
                           inference::ServerReadyResponse* response);
  grpc::Status ModelReady(const inference::ModelReadyRequest& request,
                          inference::ModelReadyResponse* response);
  // name "shoal", version SHOAL_VERSION.
  grpc::Status ServerMetadata(const inference::ServerMetadataRequest& request,
                              inference::ServerMetadataResponse* response);
  grpc::Status ModelMetadata(const inference::ModelMetadataRequest& request,
                             inference::ModelMetadataResponse* response);
  grpc::Status ModelConfig(const inference::ModelConfigRequest& request,
                           inference::ModelConfigResponse* response);
  // Empty name: every ready model version; a name: that model's ready versions (or the
  // one named by `version`).
  grpc::Status ModelStatistics(const inference::ModelStatisticsRequest& request,
                               inference::ModelStatisticsResponse* response);
  grpc::Status RepositoryIndex(const inference::RepositoryIndexRequest& request,
                               inference::RepositoryIndexResponse* response);
  // Blocking (see above).
  grpc::Status RepositoryModelLoad(const inference::RepositoryModelLoadRequest& request,
                                   inference::RepositoryModelLoadResponse* response);
  grpc::Status RepositoryModelUnload(const inference::RepositoryModelUnloadRequest& request,
                                     inference::RepositoryModelUnloadResponse* response);
  // Triton's extensions (grpc_extensions.cc), with the semantics of protocol_settings.h
  // and shared_memory.h; errors as their HTTP twins (http_extensions.h), through
  // status_map, except CUDA shared memory registration: UNIMPLEMENTED (no GPU).
  grpc::Status SystemSharedMemoryStatus(const inference::SystemSharedMemoryStatusRequest& request,
                                        inference::SystemSharedMemoryStatusResponse* response);
  grpc::Status SystemSharedMemoryRegister(
      const inference::SystemSharedMemoryRegisterRequest& request,
      inference::SystemSharedMemoryRegisterResponse* response);
  grpc::Status SystemSharedMemoryUnregister(
      const inference::SystemSharedMemoryUnregisterRequest& request,
      inference::SystemSharedMemoryUnregisterResponse* response);
  grpc::Status CudaSharedMemoryStatus(const inference::CudaSharedMemoryStatusRequest& request,
                                      inference::CudaSharedMemoryStatusResponse* response);
  grpc::Status CudaSharedMemoryRegister(const inference::CudaSharedMemoryRegisterRequest& request,
                                        inference::CudaSharedMemoryRegisterResponse* response);
  grpc::Status CudaSharedMemoryUnregister(
      const inference::CudaSharedMemoryUnregisterRequest& request,
      inference::CudaSharedMemoryUnregisterResponse* response);
  grpc::Status TraceSetting(const inference::TraceSettingRequest& request,
                            inference::TraceSettingResponse* response);
  grpc::Status LogSettings(const inference::LogSettingsRequest& request,
                           inference::LogSettingsResponse* response);

  // Service "" or "inference.GRPCInferenceService": SERVING when the server is ready,
  // else NOT_SERVING; any other service NOT_FOUND (the health protocol's rule).
  grpc::Status HealthCheck(const grpc::health::v1::HealthCheckRequest& request,
                           grpc::health::v1::HealthCheckResponse* response);

 private:
  grpc::Status CheckRepositoryChange(const std::string& repository_name,
                                     const std::string& model_name) const;

  runtime::Server* const server_;
  std::vector<std::string> extensions_;  // set in the constructor, read-only after
  const std::shared_ptr<ExtensionState> state_;
};

}  // namespace shoal::server
