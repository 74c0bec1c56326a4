// GrpcHandlers' answers for Triton's shared-memory, trace and logging extensions (their
// HTTP twins are http_extensions.cc; the state is protocol_settings.h).
#include "server/grpc_codec.h"
#include "server/grpc_handlers.h"

namespace shoal::server {

grpc::Status GrpcHandlers::SystemSharedMemoryStatus(
    const inference::SystemSharedMemoryStatusRequest& request,
    inference::SystemSharedMemoryStatusResponse* response) {
  auto regions = state_->shared_memory.GetStatus(request.name());
  if (!regions.ok()) return ToGrpcStatus(regions.status());
  for (const auto& r : *regions) {
    auto& out = (*response->mutable_regions())[r.name];
    out.set_name(r.name);
    out.set_key(r.key);
    out.set_offset(r.offset);
    out.set_byte_size(r.byte_size);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::SystemSharedMemoryRegister(
    const inference::SystemSharedMemoryRegisterRequest& request,
    inference::SystemSharedMemoryRegisterResponse*) {
  return ToGrpcStatus(state_->shared_memory.Register(request.name(), request.key(),
                                                     request.offset(), request.byte_size()));
}

grpc::Status GrpcHandlers::SystemSharedMemoryUnregister(
    const inference::SystemSharedMemoryUnregisterRequest& request,
    inference::SystemSharedMemoryUnregisterResponse*) {
  return ToGrpcStatus(state_->shared_memory.Unregister(request.name()));
}

grpc::Status GrpcHandlers::CudaSharedMemoryStatus(
    const inference::CudaSharedMemoryStatusRequest& request,
    inference::CudaSharedMemoryStatusResponse* response) {
  auto regions = state_->shared_memory.GetCudaStatus(request.name());
  if (!regions.ok()) return ToGrpcStatus(regions.status());
  for (const auto& r : *regions) {
    auto& out = (*response->mutable_regions())[r.name];
    out.set_name(r.name);
    out.set_device_id(static_cast<uint64_t>(r.device_id));
    out.set_byte_size(r.byte_size);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::CudaSharedMemoryRegister(
    const inference::CudaSharedMemoryRegisterRequest& request,
    inference::CudaSharedMemoryRegisterResponse*) {
  return ToGrpcStatus(state_->shared_memory.RegisterCuda(request.name(), request.raw_handle(),
                                                         request.device_id(), request.byte_size()));
}

grpc::Status GrpcHandlers::CudaSharedMemoryUnregister(
    const inference::CudaSharedMemoryUnregisterRequest& request,
    inference::CudaSharedMemoryUnregisterResponse*) {
  return ToGrpcStatus(state_->shared_memory.UnregisterCuda(request.name()));
}

grpc::Status GrpcHandlers::TraceSetting(const inference::TraceSettingRequest& request,
                                        inference::TraceSettingResponse* response) {
  if (!request.model_name().empty()) {
    if (auto mv = server_->GetModel(request.model_name()); !mv.ok()) {
      return ToGrpcStatus(mv.status());
    }
  }
  TraceSettings::Values values;
  if (request.settings().empty()) {
    values = state_->trace.Get(request.model_name());
  } else {
    TraceSettings::Update update;
    for (const auto& [key, value] : request.settings()) {
      // An empty value clears the setting (Triton's rule).
      if (value.value().empty()) {
        update[key] = std::nullopt;
      } else {
        update[key] = std::vector<std::string>(value.value().begin(), value.value().end());
      }
    }
    auto applied = state_->trace.Apply(request.model_name(), update);
    if (!applied.ok()) return ToGrpcStatus(applied.status());
    values = std::move(applied).value();
  }
  for (const auto& [key, value] : values) {
    auto& out = (*response->mutable_settings())[key];
    for (const auto& v : value) out.add_value(v);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcHandlers::LogSettings(const inference::LogSettingsRequest& request,
                                       inference::LogSettingsResponse* response) {
  using Value = inference::LogSettingsRequest::SettingValue;
  if (!request.settings().empty()) {
    LogSettingsMap update;
    for (const auto& [key, value] : request.settings()) {
      switch (value.parameter_choice_case()) {
        case Value::kBoolParam:
          update[key] = value.bool_param();
          break;
        case Value::kUint32Param:
          update[key] = value.uint32_param();
          break;
        case Value::kStringParam:
          update[key] = value.string_param();
          break;
        case Value::PARAMETER_CHOICE_NOT_SET:
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "log setting '" + key + "' has no value");
      }
    }
    if (Status s = UpdateLogSettings(update); !s.ok()) return ToGrpcStatus(s);
  }
  for (const auto& [key, value] : CurrentLogSettings()) {
    auto& out = (*response->mutable_settings())[key];
    if (const bool* b = std::get_if<bool>(&value)) {
      out.set_bool_param(*b);
    } else if (const uint32_t* n = std::get_if<uint32_t>(&value)) {
      out.set_uint32_param(*n);
    } else {
      out.set_string_param(std::get<std::string>(value));
    }
  }
  return grpc::Status::OK;
}

}  // namespace shoal::server
