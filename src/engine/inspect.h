// `shoal inspect MODEL.onnx`: a human-readable summary of an ONNX model.
//
// Prints the model's inputs and outputs (dtype and shape, symbolic dims by name), the
// node count, the operator histogram, the operators this engine does not support (with
// the first reason per operator), the estimated FLOPs per sample (multiply-adds
// counted as 2, for Conv, ConvTranspose, MatMul and Gemm, plus one per output element
// of element-wise and normalisation operators; shapes from a plan at batch 1), and the
// activation memory of plans at batch 1 and InspectOptions::batch: the planned arena,
// the liveness lower bound and their ratio, in-place steps, and the bytes one slot per
// value would take (graph inputs, outputs and weights not included); and the oneDNN
// implementation each operator of the batch-1 plan runs (how many nodes run which).
// With InspectOptions::profile_runs, also where a run's time goes, per operator type
// (profile.h), on zero-filled inputs at the larger of the two batch sizes.
//
// A model the engine cannot load still gets a report (with what is unsupported); only
// a file that cannot be imported at all (missing, malformed) is an error.
#pragma once

#include <string>

#include "core/status.h"
#include "engine/kernel.h"
#include "engine/profile.h"

namespace shoal::engine {

struct InspectOptions {
  // A second batch size whose activation memory is reported (the first dimension of
  // every input where it is symbolic; other symbolic dimensions are 1). Default 0:
  // batch 1 only. Must be >= 0.
  int64_t batch = 0;
  // Plans are prepared with this convolution algorithm (PlanOptions::conv_algorithm).
  ConvAlgorithm conv_algorithm = ConvAlgorithm::kDirect;
  // ... and with direct fp32 convolutions writing this layout (PlanOptions::conv_layout).
  ConvLayout conv_layout = ConvLayout::kBlocked;
  // When > 0, time this many runs operator by operator (ProfileOperators) at batch
  // max(1, batch), every other symbolic dimension 1, inputs zero-filled. Must be >= 0.
  int profile_runs = 0;
  // Threads for those runs (SessionOptions::threads; 0: all available CPUs). >= 0.
  int profile_threads = 0;
  // With profile_runs > 0: also print the cut into this many pipeline stages that
  // balances the measured per-node times (as the onnx backend's pipeline_stages picks
  // it) and the node names that pin it (pipeline_stage_boundaries). 0: none.
  int pipeline_stages = 0;
};

// What a report found, for callers that act on it (`shoal inspect`'s exit status).
struct InspectSummary {
  int unsupported_operator_types = 0;  // distinct operator types the engine lacks
  bool loads = true;                   // false: unsupported operators, or the model failed to load
};

// The report's text. A model that does not load is still reported (OK, with the reason
// in the text); `summary`, when given, says so.
StatusOr<std::string> InspectModel(const std::string& path, const InspectOptions& options = {},
                                   InspectSummary* summary = nullptr);

}  // namespace shoal::engine
