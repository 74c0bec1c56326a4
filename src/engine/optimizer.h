// Graph optimisation: rewrites an imported Graph into an equivalent, cheaper one before
// any plan is prepared. Internal to the engine; Model::FromGraph runs it.
//
// Passes, in order:
//   - Einsum as a product: an fp32 Einsum that is a plain (batched) matrix product
//     becomes Transpose -> MatMul -> Transpose (einsum_rewrite.h), for the passes below;
//   - constant folding: a node whose inputs are all constants is evaluated once with
//     its own kernel and its outputs become constants; Shape (and Gather/Slice of a
//     Shape) of dimensions known at load time folds too. Shape arithmetic that depends
//     on the batch dimension stays, and each plan folds it for its concrete shapes;
//   - pattern recognition: GELU written out as x*0.5*(1+erf(x/sqrt 2)) becomes Gelu;
//     layer normalisation written out as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/
//     Add becomes LayerNormalization;
//   - BatchNormalization after a convolution folds into the convolution's weights and
//     bias;
//   - fusion into oneDNN post-ops: Conv [+ activation] [+ Add residual] [+ activation]
//     becomes shoal.FusedConv; MatMul/Gemm [* or / a scalar] [+ bias] [+ activation]
//     [+ Add residual or mask] becomes shoal.FusedMatMul / shoal.FusedGemm (the scaled,
//     masked MatMul before a Softmax is the attention score pattern; a mask of the
//     output's rank that broadcasts onto it, [batch, 1, 1, keys], is added as a
//     broadcast post-op when B is computed);
//   - transposes into products: a Transpose that only feeds a batched MatMul's A (keeping
//     K innermost) or B, or only reads its result, becomes the shoal.FusedMatMul's
//     a_perm / b_perm / c_perm: oneDNN reads and writes the view through strides, with no
//     copy (attention's split into heads and merge back); only where A's and B's batch
//     dimensions are provably the same (the strided product does not broadcast) and never
//     a constant's Transpose;
//   - dead-node removal: nodes nothing reads are dropped, with their constants.
// Every rewrite keeps the graph's inputs, outputs and their names; a value that a graph
// output names is never fused away.
#pragma once

#include <map>
#include <string>

#include "core/status.h"
#include "engine/graph.h"

namespace shoal::engine {

struct OptimizeOptions {
  bool enabled = true;  // false: the graph runs as imported (tests compare both)
  bool fold_constants = true;
  bool fuse = true;
};

struct OptimizeReport {
  int nodes_before = 0;
  int nodes_after = 0;
  int folded_nodes = 0;   // nodes replaced by constants
  int removed_nodes = 0;  // dead nodes dropped
  // What fired and how often: "Conv+BatchNormalization", "Conv+Relu", "MatMul+Add(bias)",
  // "Gelu(erf pattern)", "LayerNormalization(pattern)", "attention scores"...
  std::map<std::string, int> fusions;
  // "452 -> 126 nodes; Conv+BatchNormalization x53, ..."
  std::string Summary() const;
};

StatusOr<Graph> OptimizeGraph(Graph graph, const OptimizeOptions& options, OptimizeReport* report);

}  // namespace shoal::engine
