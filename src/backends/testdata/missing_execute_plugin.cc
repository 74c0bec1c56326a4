// A plugin that forgot shoal_instance_execute: the loader must refuse it, naming the symbol.
#include "shoal/backend_api.h"

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

}  // extern "C"
