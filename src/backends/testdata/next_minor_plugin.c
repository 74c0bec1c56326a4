/* A plugin from the future: built for the next minor backend API version, whose header
 * (imagined below) appends one field to each struct that has a struct_size. The server in
 * this tree does not know those fields, so it must load the plugin anyway and report, through
 * struct_size, that they are absent; the plugin then takes their defaults (-1) and writes
 * none of them.
 *
 * Each execution answers OUTPUT0, INT64 [6]: for ShoalModelInfo, ShoalInstanceInfo and
 * ShoalExecuteArgs in turn, the struct_size the server set and the value of that struct's
 * next-minor field (-1 when absent). With the model parameter fail=1, execute fails instead
 * with INVALID_ARGUMENT, setting the next-minor ShoalError field only if it is there, and
 * says so in the message. Written in C. */
#include <stdlib.h>

#include "shoal/backend_api.h"

/* What the next minor's header would add: one field at the end of each growable struct. */
typedef struct NextModelInfo {
  ShoalModelInfo current;
  int64_t warmup_count; /* absent: -1 */
} NextModelInfo;
typedef struct NextInstanceInfo {
  ShoalInstanceInfo current;
  int64_t device_id; /* absent: -1 */
} NextInstanceInfo;
typedef struct NextExecuteArgs {
  ShoalExecuteArgs current;
  int64_t deadline_us; /* absent: -1 */
} NextExecuteArgs;
typedef struct NextError {
  ShoalError current;
  int64_t retry_after_ms; /* absent: the server decides */
} NextError;

typedef struct Model {
  int64_t seen[2]; /* struct_size, warmup_count */
  int fail;
} Model;

typedef struct Instance {
  const Model* model;
  int64_t seen[2]; /* struct_size, device_id */
} Instance;

SHOAL_BACKEND_EXPORT uint32_t shoal_backend_api_version(void) {
  return SHOAL_BACKEND_API_MAKE_VERSION(SHOAL_BACKEND_API_VERSION,
                                        SHOAL_BACKEND_API_VERSION_MINOR + 1u);
}

SHOAL_BACKEND_EXPORT int shoal_model_load(const ShoalModelInfo* info, void** model_state,
                                          ShoalError* error) {
  const char* fail = ShoalFindParameter(info, "fail");
  Model* model = (Model*)calloc(1, sizeof(Model));
  if (model == NULL) return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "out of memory");
  model->seen[0] = info->struct_size;
  model->seen[1] = SHOAL_HAS_FIELD(info, NextModelInfo, warmup_count)
                       ? ((const NextModelInfo*)info)->warmup_count
                       : -1;
  model->fail = fail != NULL && strcmp(fail, "1") == 0;
  *model_state = model;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_model_unload(void* model_state) { free(model_state); }

SHOAL_BACKEND_EXPORT int shoal_instance_create(void* model_state, const ShoalInstanceInfo* info,
                                               void** instance_state, ShoalError* error) {
  Instance* instance = (Instance*)calloc(1, sizeof(Instance));
  if (instance == NULL) return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "out of memory");
  instance->model = (const Model*)model_state;
  instance->seen[0] = info->struct_size;
  instance->seen[1] = SHOAL_HAS_FIELD(info, NextInstanceInfo, device_id)
                          ? ((const NextInstanceInfo*)info)->device_id
                          : -1;
  *instance_state = instance;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_instance_destroy(void* instance_state) { free(instance_state); }

SHOAL_BACKEND_EXPORT int shoal_instance_execute(void* instance_state, const ShoalExecuteArgs* args,
                                                ShoalError* error) {
  const Instance* instance = (const Instance*)instance_state;
  const int64_t shape[1] = {6};
  int64_t* out;
  if (instance->model->fail) {
    const int has_retry = SHOAL_HAS_FIELD(error, NextError, retry_after_ms);
    if (has_retry) ((NextError*)error)->retry_after_ms = 100;
    return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT,
                         "next_minor: failing as asked (error struct_size %u, %s retry_after_ms)",
                         (unsigned)error->struct_size, has_retry ? "set" : "no");
  }
  out = (int64_t*)args->allocate_output(args->allocate_output_ctx, "OUTPUT0", SHOAL_TYPE_INT64,
                                        shape, 1, sizeof(int64_t) * 6);
  if (out == NULL) return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "could not allocate");
  out[0] = instance->model->seen[0];
  out[1] = instance->model->seen[1];
  out[2] = instance->seen[0];
  out[3] = instance->seen[1];
  out[4] = args->struct_size;
  out[5] = SHOAL_HAS_FIELD(args, NextExecuteArgs, deadline_us)
               ? ((const NextExecuteArgs*)args)->deadline_us
               : -1;
  return 0;
}
