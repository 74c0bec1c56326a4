// The "onnx" backend: runs ONNX models on shoal's own engine (src/engine).
//
// Registered under "onnx" with the alias "onnxruntime_onnx", so both `backend: "onnx"`
// and Triton's `platform: "onnxruntime_onnx"` configs load with it.
//
// LoadModel reads <version_dir>/model.onnx (or the file named by the config parameter
// `default_model_filename`) and completes the ModelInfo from the model, which info()
// then returns (the model config endpoint serves it):
//   - every model input/output missing from the config is added with its dtype and dims;
//     listed ones get a missing dtype or dims filled; a listed dtype or dim that
//     contradicts the model, or a name the model lacks, is INVALID_ARGUMENT;
//   - when the config lists neither inputs nor outputs and says max_batch_size 0, and
//     every input's and output's first dimension is symbolic, batching is enabled with
//     max_batch_size kDefaultMaxBatchSize (as Triton's auto-complete does); dims then
//     exclude the batch dimension. Symbolic dims are reported as -1;
//   - batching (max_batch_size > 0) needs every output batch-major: its first dimension
//     the inputs' batch dimension (engine::TensorInfo::batch_major). A model with another
//     output (NonMaxSuppression's [num_selected, 3], a flattened [batch * k]) is not
//     batched automatically, and a config that asks for batching is INVALID_ARGUMENT
//     naming the output; with max_batch_size 0 it serves one request at a time.
// The engine::Model is shared by all instances (read-only); each instance owns an
// engine::Session (its threads, pinned to the instance's cores, and its plan cache).
//
// Config parameters (strings): `intra_op_thread_count` (threads per instance; default:
// the number of the instance's cores, or all CPUs when it is not pinned),
// `default_model_filename`, and the pipeline extension (docs/model-repository.md):
// `pipeline_stages` K > 1 cuts the fp32 model into K stages (engine/pipeline_split.h), at
// the cut balancing per-node times measured at load or at the nodes named by
// `pipeline_stage_boundaries`; each instance then runs a PipelineSession
// (engine/pipeline_session.h) with the instance's cores shared among its stages, batches
// cut into `pipeline_micro_batches` (a number, or `auto`) micro-batches, and reports
// BackendInstance::pipeline_bubble_ratio.
//
// Each instance caches a plan per input shape (engine::Session), sharing one arena
// among them: `max_cached_plans` of them (default: max_batch_size + 16, at least
// kMinCachedPlans), least recently used evicted first.
//
// Errors: NOT_FOUND when the model file is missing; INVALID_ARGUMENT for a model the
// engine cannot load (message names the node, operator and what is missing) or a config
// that contradicts the model; Execute returns the engine's error (INVALID_ARGUMENT for
// inputs that do not match the model).
#pragma once

#include <memory>

#include "backends/backend.h"

namespace shoal::backends {

class BackendRegistry;

inline constexpr int kDefaultMaxBatchSize = 4;
inline constexpr int kMinCachedPlans = 64;

std::shared_ptr<Backend> MakeOnnxBackend();
// Registers MakeOnnxBackend() as "onnx" and the alias "onnxruntime_onnx".
void RegisterOnnxBackend(BackendRegistry* registry);

}  // namespace shoal::backends
