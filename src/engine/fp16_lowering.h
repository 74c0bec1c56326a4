// FP16 models on the engine's FP32 kernels: rewrites a graph whose inputs, weights,
// constants or outputs are FLOAT16 (whole-model fp16 exports and mixed-precision ones
// with Cast nodes to and from FLOAT16) into one that computes in FP32, while the graph's
// inputs and outputs keep the FP16 type the file declares, so clients still send and
// receive FP16. Model::FromGraph runs it before the optimiser; a graph without FLOAT16
// comes out unchanged.
//
// Why FP32 and not FP16 compute: oneDNN computes FP16 convolutions and products natively
// only on CPUs with AVX512-FP16 or AMX-FP16 (Sapphire Rapids on); elsewhere it would
// convert or fall back to reference kernels. Converting the weights once at load and the
// activations at the model's edges costs little (docs/architecture.md) and is at least
// as accurate as FP16 arithmetic: results differ from an FP16 runtime's by FP16 rounding
// of intermediates.
//
// The rewrite:
//   - FLOAT16 initialisers, Constant values and tensor attributes (ConstantOfShape's
//     `value`) become FP32 (exact);
//   - each FLOAT16 graph input is followed by Cast(to FLOAT), and every reader of the
//     input reads the cast instead;
//   - Cast(to FLOAT16) inside the graph becomes Cast(to FLOAT16) then Cast(to FLOAT): the
//     value is rounded to FP16 precision and range where the model asks for it, and
//     stays FP32 for the kernels that read it;
//   - each graph output declared FLOAT16 is produced by a final Cast(to FLOAT16) from its
//     FP32 value, keeping the output's name;
//   - intermediate values the file annotates as FLOAT16 (value_info) are retyped FP32.
// What is already in that form stays as it is: an FP16 graph input read only by Casts to
// FLOAT, a Cast to FLOAT16 read only by Casts to FLOAT, and a graph output a Cast to
// FLOAT16 writes (FP16 whether or not the graph declares its type). So a mixed-precision model's
// final Cast is not doubled, and lowering a lowered graph (a pipeline stage cut from one) changes
// nothing.
#pragma once

#include "core/status.h"
#include "engine/graph.h"

namespace shoal::engine {

struct Fp16LoweringReport {
  int converted_constants = 0;  // FLOAT16 initialisers, Constants and tensor attributes
  int cast_inputs = 0;          // FLOAT16 graph inputs given a Cast to FLOAT
  int cast_outputs = 0;         // FLOAT16 graph outputs given a Cast to FLOAT16
  int rounding_casts = 0;       // Cast(to FLOAT16) nodes inside the graph
  bool changed() const {
    return converted_constants || cast_inputs || cast_outputs || rounding_casts;
  }
};

// Rewrites `graph` in place; see above. INVALID_ARGUMENT only for a graph that fails
// Graph::Validate afterwards (which a valid input graph never does).
Status LowerFp16(Graph* graph, Fp16LoweringReport* report = nullptr);

}  // namespace shoal::engine
