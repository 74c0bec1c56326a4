// A plugin that forgot shoal_instance_execute: the loader must refuse it, naming the symbol.
#include "shoal/backend_api.h"
#include "stub_entry_points.h"

extern "C" {

SHOAL_BACKEND_EXPORT uint32_t shoal_backend_api_version(void) {
  return SHOAL_BACKEND_API_VERSION_PACKED;
}

}  // extern "C"
