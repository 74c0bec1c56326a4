// add_sub: a two-input, two-output plugin whose results depend on both inputs, the shape
// of Triton's classic "simple" example model. INPUT0 and INPUT1 must have the same shape and
// the same datatype, FP32 or INT32; it produces
//   OUTPUT0 = INPUT0 + INPUT1   and   OUTPUT1 = INPUT0 - INPUT1   (element-wise).
// INT32 arithmetic wraps around on overflow (two's complement), as ONNX Add/Sub do.
//
// What it is for: tests and examples that must tell inputs apart (a swapped or misrouted
// input changes OUTPUT1), pipelines that feed one model's outputs to the next, and
// requests that ask for only some outputs. Mismatched shapes or types, or a missing input,
// fail the execution with INVALID_ARGUMENT and a message that names the problem.
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>

#include "shoal/backend_api.h"

namespace {

std::string ShapeString(const ShoalTensor& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.rank; ++i) {
    if (i > 0) s += ",";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

template <typename T>
void Compute(const ShoalTensor& a, const ShoalTensor& b, void* sum, void* difference) {
  const auto* x = static_cast<const T*>(a.data);
  const auto* y = static_cast<const T*>(b.data);
  auto* s = static_cast<T*>(sum);
  auto* d = static_cast<T*>(difference);
  const uint64_t n = a.byte_size / sizeof(T);
  for (uint64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, int32_t>) {
      // In uint32, so that overflow wraps instead of being undefined behaviour.
      const auto u = static_cast<uint32_t>(x[i]);
      const auto v = static_cast<uint32_t>(y[i]);
      if (s != nullptr) s[i] = static_cast<int32_t>(u + v);
      if (d != nullptr) d[i] = static_cast<int32_t>(u - v);
    } else {
      if (s != nullptr) s[i] = x[i] + y[i];
      if (d != nullptr) d[i] = x[i] - y[i];
    }
  }
}

int Execute(const ShoalExecuteArgs& args, ShoalError* error) {
  const ShoalTensor* a = ShoalFindInput(&args, "INPUT0");
  const ShoalTensor* b = ShoalFindInput(&args, "INPUT1");
  if (a == nullptr || b == nullptr) {
    return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT,
                         "add_sub needs inputs INPUT0 and INPUT1; %s is missing",
                         a == nullptr ? "INPUT0" : "INPUT1");
  }
  if (a->datatype != b->datatype ||
      (a->datatype != SHOAL_TYPE_FP32 && a->datatype != SHOAL_TYPE_INT32)) {
    return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT,
                         "add_sub needs INPUT0 and INPUT1 both FP32 or both INT32; got datatypes "
                         "%d and %d",
                         a->datatype, b->datatype);
  }
  const std::string shape_a = ShapeString(*a);
  const std::string shape_b = ShapeString(*b);
  if (shape_a != shape_b || a->byte_size != b->byte_size) {
    return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT,
                         "add_sub needs INPUT0 and INPUT1 of the same shape; got %s and %s",
                         shape_a.c_str(), shape_b.c_str());
  }
  void* outputs[2] = {nullptr, nullptr};
  const char* names[2] = {"OUTPUT0", "OUTPUT1"};
  for (int k = 0; k < 2; ++k) {
    if (!ShoalOutputRequested(&args, names[k])) continue;
    outputs[k] = args.allocate_output(args.allocate_output_ctx, names[k], a->datatype, a->shape,
                                      a->rank, a->byte_size);
    if (outputs[k] == nullptr) {
      return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "add_sub could not allocate %s", names[k]);
    }
  }
  if (a->datatype == SHOAL_TYPE_FP32) {
    Compute<float>(*a, *b, outputs[0], outputs[1]);
  } else {
    Compute<int32_t>(*a, *b, outputs[0], outputs[1]);
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
    return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "add_sub: %s", e.what());
  }
}

}  // extern "C"
