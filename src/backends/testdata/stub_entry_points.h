/* The four model and instance entry points of a test plugin whose point lies elsewhere (a
 * version the loader must refuse, a missing symbol): no state, nothing fails. For C and
 * C++ alike; a plugin source includes it once, after shoal/backend_api.h, and defines
 * shoal_backend_api_version and, where wanted, shoal_instance_execute itself. */
#ifndef SHOAL_BACKENDS_TESTDATA_STUB_ENTRY_POINTS_H_
#define SHOAL_BACKENDS_TESTDATA_STUB_ENTRY_POINTS_H_

#include "shoal/backend_api.h"

SHOAL_BACKEND_EXPORT int shoal_model_load(const ShoalModelInfo* info, void** model_state,
                                          ShoalError* error) {
  *model_state = NULL;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_model_unload(void* model_state) {}

SHOAL_BACKEND_EXPORT int shoal_instance_create(void* model_state, const ShoalInstanceInfo* info,
                                               void** instance_state, ShoalError* error) {
  *instance_state = NULL;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_instance_destroy(void* instance_state) {}

#endif /* SHOAL_BACKENDS_TESTDATA_STUB_ENTRY_POINTS_H_ */
