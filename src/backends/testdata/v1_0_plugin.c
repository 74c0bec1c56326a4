/* A plugin built against the frozen 1.0 header (backend_api_v1_0.h), never against
 * include/shoal/backend_api.h: it stands for every plugin compiled before minor versions
 * existed, which today's server must still load and run.
 *
 * It reads every field of every struct the server passes, including the arrays of
 * ShoalTensorSpec, ShoalParameter and ShoalTensor (whose stride it fixed at compile time),
 * and answers each execution with one BYTES output SEEN, shape [1], that spells out what it
 * saw:
 *   model <name> v<version> batch <max_batch_size> dir <model_dir> <version_dir>
 *   in <name>:<datatype>[dims](?) ... out ... params <key>=<value> ...
 *   | instance <name> #<index> cores <core>,... | batch <batch_size>
 *   in <name>:<datatype>[shape] <byte_size>B sum <sum of the bytes> ... req <name> ...
 * ("?" marks an optional input). The test compares it with what it passed in, so a moved
 * field or a changed stride shows up as a wrong string, not as luck. Written in C. */
#include <stdlib.h>

#include "backend_api_v1_0.h"

#define TEXT_CAPACITY 4096

/* Appends printf-formatted text to a NUL-terminated buffer of TEXT_CAPACITY bytes,
 * truncating when full. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
Append(char* text, const char* format, ...) {
  size_t used = strlen(text);
  va_list args;
  if (used + 1 >= TEXT_CAPACITY) return;
  va_start(args, format);
  vsnprintf(text + used, TEXT_CAPACITY - used, format, args);
  va_end(args);
}

static void AppendDims(char* text, const int64_t* dims, uint32_t rank) {
  uint32_t i;
  Append(text, "[");
  for (i = 0; i < rank; ++i) Append(text, "%s%lld", i == 0 ? "" : ",", (long long)dims[i]);
  Append(text, "]");
}

static void AppendSpecs(char* text, const char* label, const ShoalTensorSpec* specs,
                        uint32_t count) {
  uint32_t i;
  Append(text, " %s", label);
  for (i = 0; i < count; ++i) {
    Append(text, " %s:%d", specs[i].name, (int)specs[i].datatype);
    AppendDims(text, specs[i].dims, specs[i].rank);
    if (specs[i].optional) Append(text, "?");
  }
}

typedef struct Model {
  char text[TEXT_CAPACITY];
} Model;

typedef struct Instance {
  const Model* model;
  char text[TEXT_CAPACITY];
} Instance;

SHOAL_BACKEND_EXPORT uint32_t shoal_backend_api_version(void) { return SHOAL_BACKEND_API_VERSION; }

SHOAL_BACKEND_EXPORT int shoal_model_load(const ShoalModelInfo* info, void** model_state,
                                          ShoalError* error) {
  uint32_t i;
  Model* model = (Model*)calloc(1, sizeof(Model));
  if (model == NULL) return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "out of memory");
  Append(model->text, "model %s v%lld batch %d dir %s %s", info->name, (long long)info->version,
         (int)info->max_batch_size, info->model_dir, info->version_dir);
  AppendSpecs(model->text, "in", info->inputs, info->input_count);
  AppendSpecs(model->text, "out", info->outputs, info->output_count);
  Append(model->text, " params");
  for (i = 0; i < info->parameter_count; ++i) {
    Append(model->text, " %s=%s", info->parameters[i].key, info->parameters[i].value);
  }
  *model_state = model;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_model_unload(void* model_state) { free(model_state); }

SHOAL_BACKEND_EXPORT int shoal_instance_create(void* model_state, const ShoalInstanceInfo* info,
                                               void** instance_state, ShoalError* error) {
  uint32_t i;
  Instance* instance = (Instance*)calloc(1, sizeof(Instance));
  if (instance == NULL) return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "out of memory");
  instance->model = (const Model*)model_state;
  Append(instance->text, "instance %s #%d cores", info->name, (int)info->index);
  for (i = 0; i < info->cpu_core_count; ++i) {
    Append(instance->text, "%s%d", i == 0 ? " " : ",", (int)info->cpu_cores[i]);
  }
  *instance_state = instance;
  return 0;
}

SHOAL_BACKEND_EXPORT void shoal_instance_destroy(void* instance_state) { free(instance_state); }

SHOAL_BACKEND_EXPORT int shoal_instance_execute(void* instance_state, const ShoalExecuteArgs* args,
                                                ShoalError* error) {
  const Instance* instance = (const Instance*)instance_state;
  char text[TEXT_CAPACITY];
  uint32_t i;
  uint32_t length;
  int64_t shape[1] = {1};
  unsigned char* out;
  text[0] = '\0';
  Append(text, "%s | %s | batch %lld", instance->model->text, instance->text,
         (long long)args->batch_size);
  Append(text, " in");
  for (i = 0; i < args->input_count; ++i) {
    const ShoalTensor* in = &args->inputs[i];
    const unsigned char* bytes = (const unsigned char*)in->data;
    uint64_t sum = 0;
    uint64_t k;
    for (k = 0; k < in->byte_size; ++k) sum += bytes[k];
    Append(text, " %s:%d", in->name, (int)in->datatype);
    AppendDims(text, in->shape, in->rank);
    Append(text, " %lluB sum %llu", (unsigned long long)in->byte_size, (unsigned long long)sum);
  }
  Append(text, " req");
  for (i = 0; i < args->requested_output_count; ++i) {
    Append(text, " %s", args->requested_outputs[i]);
  }

  /* One BYTES element: a 4-byte little-endian length, then the text. */
  length = (uint32_t)strlen(text);
  out = (unsigned char*)args->allocate_output(args->allocate_output_ctx, "SEEN", SHOAL_TYPE_BYTES,
                                              shape, 1, 4 + (uint64_t)length);
  if (out == NULL) return ShoalSetError(error, SHOAL_STATUS_INTERNAL, "could not allocate SEEN");
  out[0] = (unsigned char)(length & 0xff);
  out[1] = (unsigned char)((length >> 8) & 0xff);
  out[2] = (unsigned char)((length >> 16) & 0xff);
  out[3] = (unsigned char)((length >> 24) & 0xff);
  memcpy(out + 4, text, length);
  return 0;
}
