// Einsum as a matrix product: the optimiser's rewrite of an fp32 Einsum of one or two operands
// into ReduceSum / Transpose / Reshape -> MatMul -> Reshape / Transpose, which the later
// passes fold and fuse (a constant's Transpose and Reshape fold, a Transpose beside a
// batched product becomes its a_perm / b_perm / c_perm strides). Internal to the engine;
// OptimizeGraph runs it.
//
// The Einsum kernel (ops/einsum.cc) visits every assignment of the equation's labels one
// by one: correct for any equation, and for attention written as
// einsum("bhqd,bhkd->bhqk") hundreds of times slower than oneDNN's matmul. It also has no
// GPU kernel, while a product lowers onto cuBLASLt.
//
// The labels of a two-operand equation are batch labels (in both operands and the
// output), contraction labels K (in both operands, not the output), M (in A and the
// output), N (in B and the output), or summed in one operand alone. The rewrite sums the
// latter first (ReduceSum), lays A out as [batch..., M..., K] and B as [batch..., K, N],
// merging the contraction labels into one axis (a Reshape) and standing a unit axis in
// for an absent M or N (so a dot product or an outer product is a product too), runs one
// MatMul, and drops the unit axes and transposes into the output's order. Layouts
// already in place cost nothing: attention's scores become one product reading K through
// strides.
//
// An Einsum node is rewritten when all of these hold; any other stays as it is:
//   - one operand (a sum over the labels the output drops, then a transpose: "bij->bji",
//     "ij->i") or two, each known to be fp32 (the value says so, or the nodes that produced
//     it keep their input's type back to one that does: MatMul is fp32 only here);
//   - no label twice in one term (a diagonal); an ellipsis stands for labels of its own, as
//     many as its operand's rank leaves, aligned at the right across the operands as NumPy
//     broadcasts them ("...d,de->...e", "...qd,...kd->...qk");
//   - each operand's rank is known (from the file's shapes or the load's probe plans)
//     and is its term's length;
//   - at most one N label, and at most one M label when there are batch labels (any
//     number without: a matrix applied to the last axis, "bsd,de->bse");
//   - a contraction label's extents are provably the same in both operands (one known
//     size, or one symbol): the kernel also broadcasts an extent of 1 there, MatMul does
//     not. (A batch label may differ: MatMul broadcasts it.)
// The output keeps its value (name, and readers); the new nodes are named after the
// Einsum's, the last one taking its name, and the new values have names of their own. The batch
// labels go in the output's order, so an output laid out as [batch..., M, N] needs no Transpose
// after the product.
#pragma once

#include "engine/graph.h"

namespace shoal::engine {

// Rewrites the graph's qualifying Einsum nodes in place (OptimizeGraph calls it for each
// subgraph as for the graph), keeping the node list in topological order and every
// value's producer index up to date. Returns how many it rewrote.
int RewriteEinsumsAsProducts(Graph* graph);

}  // namespace shoal::engine
