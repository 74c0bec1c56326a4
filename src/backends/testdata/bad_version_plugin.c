/* A plugin built for the next major backend API version, 2.4: the loader must refuse it,
 * naming both versions. Written in C, so that the build also checks that
 * shoal/backend_api.h is valid C. */
#include "shoal/backend_api.h"
#include "stub_entry_points.h"

SHOAL_BACKEND_EXPORT uint32_t shoal_backend_api_version(void) {
  return SHOAL_BACKEND_API_MAKE_VERSION(SHOAL_BACKEND_API_VERSION + 1u, 4u);
}

SHOAL_BACKEND_EXPORT int shoal_instance_execute(void* instance_state, const ShoalExecuteArgs* args,
                                                ShoalError* error) {
  return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "must never be called");
}
