// identity: the smallest useful shoal backend plugin, and the one to copy when starting your
// own. Every input INPUT<k> is copied unchanged to OUTPUT<k>: same datatype (any, BYTES
// included), same shape, same bytes. Models use it as
//   backend: "identity"
// with inputs INPUT0.. and outputs OUTPUT0.. of matching types.
//
// What it is for: testing the server around the model (protocol, batching, instances,
// pipelines, caching) with a model whose answer is known, and measuring the server's own
// overhead per request, since the backend does nothing but one memcpy per tensor.
// It keeps no state: model and instance states are NULL.
#include <cstring>
#include <exception>
#include <string>

#include "shoal/backend_api.h"

namespace {

constexpr char kInput[] = "INPUT";
constexpr size_t kInputLength = sizeof(kInput) - 1;
constexpr char kOutput[] = "OUTPUT";
constexpr size_t kOutputLength = sizeof(kOutput) - 1;

int Execute(const ShoalExecuteArgs& args, ShoalError* error) {
  // Each requested output needs its input.
  for (uint32_t i = 0; i < args.requested_output_count; ++i) {
    const std::string output = args.requested_outputs[i];
    if (output.rfind(kOutput, 0) != 0 ||
        ShoalFindInput(&args, (kInput + output.substr(kOutputLength)).c_str()) == nullptr) {
      return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT,
                           "identity cannot produce output '%s': it copies INPUT<k> to OUTPUT<k>",
                           output.c_str());
    }
  }
  for (uint32_t i = 0; i < args.input_count; ++i) {
    const ShoalTensor& in = args.inputs[i];
    if (std::strncmp(in.name, kInput, kInputLength) != 0) {
      return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT,
                           "identity expects inputs named INPUT<k>; got '%s'", in.name);
    }
    const std::string output = kOutput + std::string(in.name + kInputLength);
    if (!ShoalOutputRequested(&args, output.c_str())) continue;
    void* out = args.allocate_output(args.allocate_output_ctx, output.c_str(), in.datatype,
                                     in.shape, in.rank, in.byte_size);
    if (out == nullptr) {
      return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "identity could not allocate %s",
                           output.c_str());
    }
    if (in.byte_size > 0) std::memcpy(out, in.data, in.byte_size);
  }
  return 0;
}

}  // namespace

extern "C" {

SHOAL_BACKEND_EXPORT uint32_t shoal_backend_api_version(void) {
  return SHOAL_BACKEND_API_VERSION_PACKED;
}

SHOAL_BACKEND_EXPORT int shoal_model_load(const ShoalModelInfo* info, void** model_state,
                                          ShoalError* error) {
  *model_state = nullptr;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_model_unload(void* model_state) {}

SHOAL_BACKEND_EXPORT int shoal_instance_create(void* model_state, const ShoalInstanceInfo* info,
                                               void** instance_state, ShoalError* error) {
  *instance_state = nullptr;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_instance_destroy(void* instance_state) {}

SHOAL_BACKEND_EXPORT int shoal_instance_execute(void* instance_state, const ShoalExecuteArgs* args,
                                                ShoalError* error) {
  try {
    return Execute(*args, error);
  } catch (const std::exception& e) {  // never let an exception cross the C ABI
    return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "identity: %s", e.what());
  }
}

}  // extern "C"
