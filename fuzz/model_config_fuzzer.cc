// libFuzzer target: a model's config.pbtxt, from text to what a model version is built
// from: ParseModelConfig (protobuf text format), ValidateModelConfig, then the config
// adapter (runtime/config_adapter.h) as the server runs it when it loads a model: the
// backend name, the ModelInfo handed to a backend, CompleteConfig with what a backend
// reports, and VersionOptionsFromConfig (signature, batcher options, instances, warmup
// tensors). The model folder does not exist, so warmup data files are never found.
//
// Invariants (a violation traps): a config that validates yields a backend name or an
// error, never a crash; options built from it have at least one instance, and every
// warmup tensor holds exactly its shape's bytes. Configs that validate must not make the
// adapter allocate without bound (libFuzzer's -rss_limit_mb / -malloc_limit_mb catch it).
//
//   cmake --build build-fuzz --target model_config_fuzzer
//   build-fuzz/fuzz/model_config_fuzzer fuzz/config_corpus -max_len=4096
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "repository/model_config.h"
#include "runtime/config_adapter.h"

using namespace shoal;

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Invalid UTF-8 in string fields is logged by protobuf for every such config.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = repository::ParseModelConfig(text, "fuzz/config.pbtxt");
  if (!config.ok()) return 0;
  // What ScanModel fills in from the folder before it validates.
  if (config->name().empty()) config->set_name("fuzz");
  if (!repository::ValidateModelConfig(*config, "fuzz/config.pbtxt").ok()) return 0;
  for (int g = 0; g < config->instance_group_size(); ++g) {
    const int count = repository::InstanceCount(config->instance_group(g));
    for (int i = 0; i < count && i < 8; ++i) (void)repository::InstanceCores(*config, g, i);
  }
  if (!runtime::BackendNameForConfig(*config).ok()) return 0;
  const std::string model_dir = "/nonexistent/shoal-fuzz-model";
  const backends::ModelInfo info = runtime::ModelInfoFromConfig(*config, model_dir, 1);
  inference::ModelConfig completed = *config;
  runtime::CompleteConfig(info, &completed);
  runtime::RequestLimits limits;
  limits.max_elements_per_tensor = 1 << 20;
  auto options =
      runtime::VersionOptionsFromConfig(completed, model_dir, 1, nullptr, Clock::Real(), limits);
  if (!options.ok()) return 0;
  if (options->instances.empty()) __builtin_trap();
  for (const auto& sample : options->warmup) {
    for (const auto& input : sample.inputs) {
      const Tensor& t = input.tensor;
      if (t.dtype() == DataType::kBytes) {
        if (!t.BytesElements().ok()) __builtin_trap();
      } else if (t.byte_size() !=
                 static_cast<size_t>(t.element_count()) * DataTypeSize(t.dtype())) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
