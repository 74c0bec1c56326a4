// Einsum as a matrix product: the optimiser's rewrite of an fp32 Einsum that is a plain
// (batched) product into Transpose -> MatMul -> Transpose, which the later passes fold and
// fuse (a constant's Transpose folds, a Transpose beside a batched product becomes its
// a_perm / b_perm / c_perm strides). Internal to the engine; OptimizeGraph runs it.
//
// The Einsum kernel (ops/einsum.cc) visits every assignment of the equation's labels one
// by one: correct for any equation, and for attention written as
// einsum("bhqd,bhkd->bhqk") hundreds of times slower than oneDNN's matmul. It also has no
// GPU kernel, while a product lowers onto cuBLASLt.
//
// An Einsum node is rewritten when all of these hold; any other stays as it is:
//   - two operands, both known to be fp32 (the value says so, or the nodes that produced
//     it keep their input's type back to one that does: MatMul is fp32 only here);
//   - no ellipsis, and no label twice in one term (a diagonal);
//   - every label is a batch label (in both operands and the output), a contraction
//     label (in both operands, not the output), or in one operand and the output;
//   - exactly one contraction label, exactly one label of B's alone (N), and one of
//     A's alone (M), or, when there are no batch labels, any number of A's own labels
//     (a matrix applied to the last axis: "bsd,de->bse");
//   - where both operands' shapes give the contraction label's extent, they agree.
// The output keeps its value (name, and readers); the new nodes are named after the
// Einsum's. The batch labels go in the output's order, so an output already laid out as
// [batch..., M, N] needs no Transpose after the product.
#pragma once

#include "engine/graph.h"

namespace shoal::engine {

// Rewrites the graph's (not its subgraphs') qualifying Einsum nodes in place, keeping the
// node list in topological order and every value's producer index up to date. Returns
// how many it rewrote.
int RewriteEinsumsAsProducts(Graph* graph);

}  // namespace shoal::engine
