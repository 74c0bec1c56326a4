// `shoal inspect MODEL.onnx`: a human-readable summary of an ONNX model.
//
// Prints the model's inputs and outputs (dtype and shape, symbolic dims by name), the
// node count, the operator histogram, the operators this engine does not support (with
// the first reason per operator), and the estimated FLOPs per sample (multiply-adds
// counted as 2, for Conv, ConvTranspose, MatMul and Gemm, plus one per output element
// of element-wise and normalisation operators; shapes from a plan at batch 1).
//
// A model the engine cannot load still gets a report (with what is unsupported); only
// a file that cannot be imported at all (missing, malformed) is an error.
#pragma once

#include <string>

#include "core/status.h"

namespace shoal::engine {

StatusOr<std::string> InspectModel(const std::string& path);

}  // namespace shoal::engine
