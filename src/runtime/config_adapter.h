// Config adapter: turns a model's config.pbtxt (inference::ModelConfig) into what the
// runtime and the backend need, and back.
//
// The runtime's own types (ModelVersionOptions, BatcherOptions, ModelSignature) do not
// depend on the config proto, so they are tested without it; this file is the one
// place that knows both.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"
#include "core/clock.h"
#include "core/status.h"
#include "repository/model_config.pb.h"
#include "runtime/model_version.h"

namespace shoal::runtime {

// What the backend is told about a model version.
backends::ModelInfo ModelInfoFromConfig(const inference::ModelConfig& config,
                                        const std::string& model_dir, int64_t version);

// Completes a partial config from what the backend found in the model files: inputs and
// outputs when the config lists none, and max_batch_size when the config leaves it 0
// and the backend reports a batch dimension. Fields the config sets are kept.
void CompleteConfig(const backends::ModelInfo& from_backend, inference::ModelConfig* config);

// The backend a config asks for: `backend` if set, else the one its platform implies
// ("onnxruntime_onnx" -> "onnx"). INVALID_ARGUMENT when neither names one.
StatusOr<std::string> BackendNameForConfig(const inference::ModelConfig& config);

// How long a request waits at its priority level before it moves up one, unless the
// config's `priority_aging_us` parameter says otherwise.
inline constexpr uint64_t kDefaultPriorityAgingUs = 1'000'000;

// Everything a ModelVersion needs, from a validated (and completed) config. shoal's
// scheduling extensions come from the config's parameters: latency_slo_us,
// batching_policy, max_queue_wait_us, priority_aging_us (docs/model-repository.md). Reads
// warmup data files under <model_dir>/warmup/. `cache` is used only when the config
// enables response_cache.
StatusOr<ModelVersionOptions> VersionOptionsFromConfig(const inference::ModelConfig& config,
                                                       const std::string& model_dir,
                                                       int64_t version,
                                                       std::shared_ptr<ResponseCache> cache,
                                                       std::shared_ptr<Clock> clock,
                                                       const RequestLimits& limits);

}  // namespace shoal::runtime
