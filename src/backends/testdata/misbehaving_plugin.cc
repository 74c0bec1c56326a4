// A plugin that breaks the output rules on purpose, chosen by the model parameter "mode",
// so that tests can check that the plugin backend turns each violation into an error:
//   unknown_dtype  allocates OUTPUT0 with datatype 99
//   wrong_size     allocates an FP32 [2] output with 7 bytes
//   bad_bytes      allocates a BYTES [1] output and leaves a length prefix that overruns it
//   wrong_batch    allocates an output whose first dimension is not the batch size
//   duplicate      allocates OUTPUT0 twice
//   ignore_null    ignores a NULL from the allocator and returns success
//   missing        returns success without producing any output
//   throw          throws a C++ exception out of execute (and out of instance_create when
//                  the instance index is 1)
//   no_message     returns failure with code 0 and no message
//   bad_param      fails shoal_model_load with INVALID_ARGUMENT
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "shoal/backend_api.h"

namespace {

struct Model {
  std::string mode;
};

}  // namespace

extern "C" {

SHOAL_BACKEND_EXPORT uint32_t shoal_backend_api_version(void) {
  return SHOAL_BACKEND_API_VERSION_PACKED;
}

SHOAL_BACKEND_EXPORT int shoal_model_load(const ShoalModelInfo* info, void** model_state,
                                          ShoalError* error) {
  const char* mode = ShoalFindParameter(info, "mode");
  if (mode != nullptr && std::strcmp(mode, "bad_param") == 0) {
    return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT, "mode bad_param rejected");
  }
  *model_state = new Model{mode == nullptr ? "" : mode};
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_model_unload(void* model_state) {
  delete static_cast<Model*>(model_state);
}

SHOAL_BACKEND_EXPORT int shoal_instance_create(void* model_state, const ShoalInstanceInfo* info,
                                               void** instance_state, ShoalError* error) {
  const auto* model = static_cast<const Model*>(model_state);
  if (model->mode == "throw" && info->index == 1) throw std::runtime_error("create exploded");
  *instance_state = model_state;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_instance_destroy(void* instance_state) {}

SHOAL_BACKEND_EXPORT int shoal_instance_execute(void* instance_state, const ShoalExecuteArgs* args,
                                                ShoalError* error) {
  const std::string& mode = static_cast<const Model*>(instance_state)->mode;
  void* ctx = args->allocate_output_ctx;
  const int64_t batch = args->batch_size;
  if (mode == "unknown_dtype") {
    const int64_t shape[] = {batch};
    if (args->allocate_output(ctx, "OUTPUT0", 99, shape, 1, 4 * batch) == nullptr) {
      return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "allocation refused");
    }
  } else if (mode == "wrong_size") {
    const int64_t shape[] = {batch, 2};
    if (args->allocate_output(ctx, "OUTPUT0", SHOAL_TYPE_FP32, shape, 2, 7) == nullptr) {
      return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "allocation refused");
    }
  } else if (mode == "bad_bytes") {
    const int64_t shape[] = {batch};
    auto* out = static_cast<unsigned char*>(
        args->allocate_output(ctx, "OUTPUT0", SHOAL_TYPE_BYTES, shape, 1, 4 * batch));
    if (out == nullptr) return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "allocation refused");
    out[0] = 200;  // element 0 claims 200 bytes that are not there
  } else if (mode == "wrong_batch") {
    const int64_t shape[] = {batch + 1};
    if (args->allocate_output(ctx, "OUTPUT0", SHOAL_TYPE_INT32, shape, 1, 4 * (batch + 1)) ==
        nullptr) {
      return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "allocation refused");
    }
  } else if (mode == "duplicate") {
    const int64_t shape[] = {batch};
    for (int i = 0; i < 2; ++i) {
      if (args->allocate_output(ctx, "OUTPUT0", SHOAL_TYPE_INT32, shape, 1, 4 * batch) == nullptr) {
        return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "allocation refused");
      }
    }
  } else if (mode == "ignore_null") {
    const int64_t shape[] = {batch};
    (void)args->allocate_output(ctx, "OUTPUT0", SHOAL_TYPE_FP32, shape, 1, 3);
  } else if (mode == "throw") {
    throw std::runtime_error("execute exploded");
  } else if (mode == "no_message") {
    return 7;
  }
  // "missing" and anything else: produce nothing.
  return 0;
}

}  // extern "C"
