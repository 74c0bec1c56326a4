// cost_model: a plugin whose execution time is known in advance. A batch of n items takes
//   a + b * n microseconds      (a = parameter "a_us", default 1000; b = "b_us", default 100)
// which it spends sleeping, then it copies INPUT0 to OUTPUT0 like identity. With the optional
// parameter "fail_on_value" (a number), an execution whose FP32 inputs hold that value fails
// with INTERNAL "cost_model: input INPUTk holds fail_on_value <v>" (after the sleep).
//
// What it is for: testing and benchmarking scheduling (dynamic batching, instance pools,
// the runtime's online cost model, deadlines and admission) against a backend whose cost
// curve is exact, and exercising backend failures on chosen requests. Parameters come from
// the model config, e.g. parameters { key: "a_us" value: { string_value: "2000" } }.
#include <sys/prctl.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <thread>

#include "shoal/backend_api.h"

namespace {

struct Model {
  double a_us = 1000;
  double b_us = 100;
  bool fail_on_value_set = false;
  float fail_on_value = 0;
};

// Parses parameter `key` as a finite number >= `min` into *out; leaves *out when unset.
int ParseParameter(const ShoalModelInfo& info, const char* key, double min, double* out,
                   ShoalError* error) {
  const char* text = ShoalFindParameter(&info, key);
  if (text == nullptr) return 0;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(value) || value < min) {
    return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT,
                         "cost_model parameter %s must be a finite number%s; was '%s'", key,
                         min == 0 ? " >= 0" : "", text);
  }
  *out = value;
  return 0;
}

int Load(const ShoalModelInfo& info, Model* model, ShoalError* error) {
  if (ParseParameter(info, "a_us", 0, &model->a_us, error) != 0) return 1;
  if (ParseParameter(info, "b_us", 0, &model->b_us, error) != 0) return 1;
  double fail = 0;
  if (ShoalFindParameter(&info, "fail_on_value") != nullptr) {
    if (ParseParameter(info, "fail_on_value", -HUGE_VAL, &fail, error) != 0) return 1;
    model->fail_on_value_set = true;
    model->fail_on_value = static_cast<float>(fail);
  }
  return 0;
}

int Execute(const Model& model, const ShoalExecuteArgs& args, ShoalError* error) {
  // Sleep until the deadline: sleep_for may return early on a signal, a deadline loop never.
  const auto cost = std::chrono::duration<double, std::micro>(
      model.a_us + model.b_us * static_cast<double>(args.batch_size));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::ceil<std::chrono::nanoseconds>(cost);
  for (auto now = std::chrono::steady_clock::now(); now < deadline;
       now = std::chrono::steady_clock::now()) {
    std::this_thread::sleep_for(deadline - now);
  }

  if (model.fail_on_value_set) {
    for (uint32_t i = 0; i < args.input_count; ++i) {
      const ShoalTensor& in = args.inputs[i];
      if (in.datatype != SHOAL_TYPE_FP32) continue;
      const auto* values = static_cast<const float*>(in.data);
      for (uint64_t k = 0; k < in.byte_size / sizeof(float); ++k) {
        if (values[k] == model.fail_on_value) {
          return ShoalSetError(error, SHOAL_STATUS_INTERNAL,
                               "cost_model: input %s holds fail_on_value %g", in.name,
                               static_cast<double>(model.fail_on_value));
        }
      }
    }
  }

  const ShoalTensor* in = ShoalFindInput(&args, "INPUT0");
  if (in == nullptr) {
    return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT, "cost_model needs input INPUT0");
  }
  if (!ShoalOutputRequested(&args, "OUTPUT0")) return 0;
  void* out = args.allocate_output(args.allocate_output_ctx, "OUTPUT0", in->datatype, in->shape,
                                   in->rank, in->byte_size);
  if (out == nullptr) {
    return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "cost_model could not allocate OUTPUT0");
  }
  if (in->byte_size > 0) std::memcpy(out, in->data, in->byte_size);
  return 0;
}

}  // namespace

extern "C" {

SHOAL_BACKEND_EXPORT uint32_t shoal_backend_api_version(void) {
  return SHOAL_BACKEND_API_VERSION_PACKED;
}

SHOAL_BACKEND_EXPORT int shoal_model_load(const ShoalModelInfo* info, void** model_state,
                                          ShoalError* error) {
  auto* model = new (std::nothrow) Model();
  if (model == nullptr) return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "out of memory");
  if (Load(*info, model, error) != 0) {
    delete model;
    return 1;
  }
  *model_state = model;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_model_unload(void* model_state) {
  delete static_cast<Model*>(model_state);
}

// Instances share the model's parameters, read-only after load. Creation runs on the
// instance's own thread, so this is where its timer slack is set: Linux's default 50 us
// slack would make every execution that much longer than a + b*n.
SHOAL_BACKEND_EXPORT int shoal_instance_create(void* model_state, const ShoalInstanceInfo* info,
                                               void** instance_state, ShoalError* error) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  *instance_state = model_state;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_instance_destroy(void* instance_state) {}

SHOAL_BACKEND_EXPORT int shoal_instance_execute(void* instance_state, const ShoalExecuteArgs* args,
                                                ShoalError* error) {
  try {
    return Execute(*static_cast<const Model*>(instance_state), *args, error);
  } catch (const std::exception& e) {  // never let an exception cross the C ABI
    return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "cost_model: %s", e.what());
  }
}

}  // extern "C"
