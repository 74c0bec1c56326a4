/* FROZEN: include/shoal/backend_api.h at version 1.0 (commit 4e42130f3493), copied byte for
 * byte below this note. Never edit it: the test plugin v1_0_plugin.c is built against this
 * copy alone, so that plugin_backend_test checks that a plugin compiled before minor
 * versions existed still loads and runs in today's server. */
/* shoal backend plugin API: a small, versioned C ABI for writing a backend as a shared
 * library that shoal loads at run time, without rebuilding shoal.
 *
 * A plugin is a file named libshoal_<name>.so that exports the six functions declared
 * below with C linkage. A model whose config says `backend: "<name>"` is served by it.
 * The library is opened with dlopen(RTLD_NOW | RTLD_LOCAL); export nothing else (build
 * with -fvisibility=hidden; SHOAL_BACKEND_EXPORT marks the six functions).
 *
 * Versioning
 *   SHOAL_BACKEND_API_VERSION is a single major number. Any change to a struct layout,
 *   a function signature or a rule on this page increments it. shoal_backend_api_version()
 *   must return the number the plugin was compiled with; the loader refuses a plugin whose
 *   number differs from its own, with an error naming both numbers. Rebuild the plugin
 *   against the server's copy of this header to fix it.
 *
 * Ownership
 *   - Every pointer the server passes in (ShoalModelInfo, ShoalInstanceInfo,
 *     ShoalExecuteArgs and everything reachable from them: strings, shapes, input data)
 *     is owned by the server and valid only until the call returns. Copy what you keep.
 *     Input data is read-only.
 *   - *model_state and *instance_state are the plugin's; the server hands each back
 *     exactly once to shoal_model_unload / shoal_instance_destroy. They may be NULL.
 *     Every instance of a model is destroyed before the model is unloaded.
 *   - Output buffers come from args->allocate_output and are owned by the server (the
 *     plugin writes results in place: no copy). The plugin may write to them only until
 *     shoal_instance_execute returns, and must never free them.
 *   - ShoalError is the caller's; the plugin fills it on failure.
 *
 * Threading
 *   - shoal_model_load runs on a loading thread; several models (of this plugin) may load
 *     concurrently, so keep global state read-only or locked.
 *   - shoal_instance_create and every shoal_instance_execute of an instance run on that
 *     instance's own thread (pinned to its cores when configured). Execute is never called
 *     concurrently for one instance, but may be for two instances of the same model: state
 *     shared through model_state must be read-only after load, or locked.
 *   - shoal_instance_destroy and shoal_model_unload may run on any thread, never
 *     concurrently with a call on the same instance or model.
 *   - allocate_output may be called only from inside shoal_instance_execute, on its thread.
 *
 * Errors
 *   Every fallible function returns 0 on success. On failure it returns non-zero and sets
 *   error->code (a SHOAL_STATUS_* value; 0 or unknown becomes INTERNAL) and a
 *   NUL-terminated error->message (truncated to SHOAL_ERROR_MESSAGE_CAPACITY - 1 bytes).
 *   The server reports "plugin '<name>': <message>" with that code; an execute error
 *   answers every request of the batch. Never let a C++ exception or a longjmp leave a
 *   function of this API: the server turns an escaping exception into INTERNAL, but
 *   unwinding through C frames is undefined.
 *
 * Language: C99 or later, or C++. The header-only helpers at the end are conveniences,
 * not part of the ABI.
 *
 * Tensors
 *   datatype numbers are shoal's DataType (= Triton model-config numbers). BYTES tensors
 *   are one buffer holding, per element, a 4-byte little-endian length then the bytes.
 *   When max_batch_size > 0 every input's first dimension is batch_size, and every
 *   output's must be too; tensor specs in ShoalModelInfo exclude the batch dimension.
 */
#ifndef SHOAL_BACKEND_API_H_
#define SHOAL_BACKEND_API_H_

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHOAL_BACKEND_API_VERSION 1u

#if defined(_WIN32)
#define SHOAL_BACKEND_EXPORT __declspec(dllexport)
#else
#define SHOAL_BACKEND_EXPORT __attribute__((visibility("default")))
#endif

/* Status codes: the numbers of shoal::StatusCode. */
enum {
  SHOAL_STATUS_OK = 0,
  SHOAL_STATUS_INVALID_ARGUMENT = 1,
  SHOAL_STATUS_NOT_FOUND = 2,
  SHOAL_STATUS_ALREADY_EXISTS = 3,
  SHOAL_STATUS_FAILED_PRECONDITION = 4,
  SHOAL_STATUS_RESOURCE_EXHAUSTED = 5,
  SHOAL_STATUS_UNAVAILABLE = 6,
  SHOAL_STATUS_DEADLINE_EXCEEDED = 7,
  SHOAL_STATUS_CANCELLED = 8,
  SHOAL_STATUS_UNIMPLEMENTED = 9,
  SHOAL_STATUS_INTERNAL = 10
};

/* Element types: the numbers of shoal::DataType. */
enum {
  SHOAL_TYPE_INVALID = 0,
  SHOAL_TYPE_BOOL = 1,
  SHOAL_TYPE_UINT8 = 2,
  SHOAL_TYPE_UINT16 = 3,
  SHOAL_TYPE_UINT32 = 4,
  SHOAL_TYPE_UINT64 = 5,
  SHOAL_TYPE_INT8 = 6,
  SHOAL_TYPE_INT16 = 7,
  SHOAL_TYPE_INT32 = 8,
  SHOAL_TYPE_INT64 = 9,
  SHOAL_TYPE_FP16 = 10,
  SHOAL_TYPE_FP32 = 11,
  SHOAL_TYPE_FP64 = 12,
  SHOAL_TYPE_BYTES = 13,
  SHOAL_TYPE_BF16 = 14
};

#define SHOAL_ERROR_MESSAGE_CAPACITY 1024

typedef struct ShoalError {
  int32_t code; /* SHOAL_STATUS_*; the server sets 0 and an empty message before each call */
  char message[SHOAL_ERROR_MESSAGE_CAPACITY];
} ShoalError;

/* A tensor of the model's signature; dims exclude the batch dimension, -1 = variable. */
typedef struct ShoalTensorSpec {
  const char* name;
  int32_t datatype;
  const int64_t* dims;
  uint32_t rank;
  int32_t optional; /* non-zero: the input may be absent */
} ShoalTensorSpec;

typedef struct ShoalParameter {
  const char* key;
  const char* value;
} ShoalParameter;

typedef struct ShoalModelInfo {
  const char* name;
  int64_t version;
  const char* model_dir;   /* <repo>/<model> */
  const char* version_dir; /* <repo>/<model>/<version> */
  int32_t max_batch_size;  /* 0: the model does not batch */
  const ShoalTensorSpec* inputs;
  uint32_t input_count;
  const ShoalTensorSpec* outputs;
  uint32_t output_count;
  const ShoalParameter* parameters; /* the config's `parameters`, string values */
  uint32_t parameter_count;
} ShoalModelInfo;

typedef struct ShoalInstanceInfo {
  const char* name; /* "<model>_<index>" */
  int32_t index;    /* 0-based across the model's instances */
  const int32_t* cpu_cores;
  uint32_t cpu_core_count; /* 0: not pinned */
} ShoalInstanceInfo;

/* An input tensor of one execution. */
typedef struct ShoalTensor {
  const char* name;
  int32_t datatype;
  const int64_t* shape;
  uint32_t rank;
  const void* data;
  uint64_t byte_size;
} ShoalTensor;

/* Returns a zero-filled, 64-byte aligned buffer of byte_size bytes for output `name`, owned
 * by the server, or NULL when the request is invalid: unknown datatype, a byte_size that
 * does not match the shape for a fixed-size type (or is too small for BYTES), a batched
 * output whose first dimension is not batch_size, or a name already allocated. After a
 * NULL the execution fails with an INTERNAL error that says why, whatever execute returns. */
typedef void* (*ShoalAllocateOutputFn)(void* ctx, const char* name, int32_t datatype,
                                       const int64_t* shape, uint32_t rank, uint64_t byte_size);

typedef struct ShoalExecuteArgs {
  int64_t batch_size;
  const ShoalTensor* inputs;
  uint32_t input_count;
  /* Outputs to produce; none means all of the model's outputs. Producing more is allowed
   * (the server drops them); missing a requested one fails the execution. */
  const char* const* requested_outputs;
  uint32_t requested_output_count;
  ShoalAllocateOutputFn allocate_output;
  void* allocate_output_ctx; /* pass as the first argument of allocate_output */
} ShoalExecuteArgs;

/* The six functions a plugin exports. */
SHOAL_BACKEND_EXPORT uint32_t shoal_backend_api_version(void);
SHOAL_BACKEND_EXPORT int shoal_model_load(const ShoalModelInfo* info, void** model_state,
                                          ShoalError* error);
SHOAL_BACKEND_EXPORT void shoal_model_unload(void* model_state);
SHOAL_BACKEND_EXPORT int shoal_instance_create(void* model_state, const ShoalInstanceInfo* info,
                                               void** instance_state, ShoalError* error);
SHOAL_BACKEND_EXPORT void shoal_instance_destroy(void* instance_state);
SHOAL_BACKEND_EXPORT int shoal_instance_execute(void* instance_state, const ShoalExecuteArgs* args,
                                                ShoalError* error);

/* Their types, for loaders. */
typedef uint32_t (*ShoalBackendApiVersionFn)(void);
typedef int (*ShoalModelLoadFn)(const ShoalModelInfo*, void**, ShoalError*);
typedef void (*ShoalModelUnloadFn)(void*);
typedef int (*ShoalInstanceCreateFn)(void*, const ShoalInstanceInfo*, void**, ShoalError*);
typedef void (*ShoalInstanceDestroyFn)(void*);
typedef int (*ShoalInstanceExecuteFn)(void*, const ShoalExecuteArgs*, ShoalError*);

/* Helpers for plugin authors (header-only; not part of the ABI). */

/* Sets error->code and a printf-formatted message; returns 1 so that a plugin can write
 * `return ShoalSetError(error, SHOAL_STATUS_INVALID_ARGUMENT, "bad %s", what);`. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int
ShoalSetError(ShoalError* error, int32_t code, const char* format, ...) {
  va_list args;
  if (error == NULL) return 1;
  error->code = code;
  va_start(args, format);
  vsnprintf(error->message, sizeof(error->message), format, args);
  va_end(args);
  return 1;
}

/* The value of parameter `key`, or NULL when the model's config does not set it. */
static inline const char* ShoalFindParameter(const ShoalModelInfo* info, const char* key) {
  uint32_t i;
  for (i = 0; i < info->parameter_count; ++i) {
    if (strcmp(info->parameters[i].key, key) == 0) return info->parameters[i].value;
  }
  return NULL;
}

/* The input named `name`, or NULL. */
static inline const ShoalTensor* ShoalFindInput(const ShoalExecuteArgs* args, const char* name) {
  uint32_t i;
  for (i = 0; i < args->input_count; ++i) {
    if (strcmp(args->inputs[i].name, name) == 0) return &args->inputs[i];
  }
  return NULL;
}

/* Non-zero when output `name` should be produced (requested, or nothing was requested). */
static inline int ShoalOutputRequested(const ShoalExecuteArgs* args, const char* name) {
  uint32_t i;
  if (args->requested_output_count == 0) return 1;
  for (i = 0; i < args->requested_output_count; ++i) {
    if (strcmp(args->requested_outputs[i], name) == 0) return 1;
  }
  return 0;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHOAL_BACKEND_API_H_ */
