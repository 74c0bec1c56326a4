// Offline memory planning for a fixed sequence of steps: given each tensor's size and
// lifetime (the step that defines it and the last step that reads it), assigns every
// tensor an offset in one arena so that tensors whose lifetimes overlap never share
// bytes. Pure and engine-independent; Plan (plan.h) turns its steps and values into
// this function's input.
//
// Lifetimes are closed intervals of step indices: a tensor defined at step 3 and last
// read at step 5 is live during steps 3, 4 and 5, so it may share bytes with one last
// read at step 2 or defined at step 6, never with one live at 3..5. The exception is an
// in-place request: tensor t may take the bytes of tensor s when s is last read at the
// step that defines t (the kernel reads each element of s before it writes that element
// of t) and t fits in s. Requests that are not legal are refused, never an error;
// chains (s -> t -> u) share one block.
//
// Placement: blocks (a tensor, or an in-place chain) are placed largest first, each at
// the lowest offset of the smallest gap that holds it among the already placed blocks
// whose lifetimes intersect its own (best fit, as TFLite's and ONNX Runtime's greedy
// by size); a second order (by the step where live bytes peak, then size) is also tried
// and the smaller arena kept. The result is usually within a few percent of the
// liveness lower bound, which is reported with it.
//
// Cost: O(n^2 log n) for n tensors; a few milliseconds for thousands.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace shoal::engine {

// Every offset, and every tensor's footprint, is a multiple of this (oneDNN and AVX-512
// like 64-byte aligned data; matches Buffer::kAlignment).
inline constexpr int64_t kArenaAlignment = 64;

// `bytes` rounded up to kArenaAlignment.
inline int64_t ArenaAlignedBytes(int64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

struct TensorLifetime {
  int64_t bytes = 0;  // >= 0; a tensor of 0 bytes gets offset 0 and no space
  int first = 0;      // step that defines it, >= 0
  int last = 0;       // last step that reads it (or views of it), >= first
};

// Tensor `tensor` asks to take the bytes of tensor `source` (indices into the tensor
// list). Granted when source.last == tensor.first, tensor's aligned size is at most
// source's, neither is already part of another granted request in the same role, and
// the two are different tensors.
struct InplaceRequest {
  int tensor = -1;
  int source = -1;
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // per tensor; multiples of kArenaAlignment
  std::vector<int> inplace_of;   // per tensor: the source whose bytes it took, else -1
  int64_t arena_bytes = 0;       // bytes the arena needs; a multiple of kArenaAlignment
  // Max over steps of the sum of the aligned sizes of the blocks live at that step (an
  // in-place chain counts once): no placement of these blocks needs fewer bytes.
  int64_t liveness_bound_bytes = 0;
  // Sum of all aligned sizes: what one slot per tensor (no reuse) would need.
  int64_t no_reuse_bytes = 0;
  int inplace_count = 0;  // requests granted
};

// INVALID_ARGUMENT for malformed input (negative sizes or steps, last < first, request
// indices out of range); illegal in-place requests are only refused.
StatusOr<MemoryPlan> PlanMemory(const std::vector<TensorLifetime>& tensors,
                                const std::vector<InplaceRequest>& inplace = {});

}  // namespace shoal::engine
