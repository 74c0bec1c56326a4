// Resize's geometry as the CPU engine computes it (ops/indexing.cc), for other back ends
// that must read the same input elements with the same weights (the GPU path's lowering).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/kernel.h"

namespace shoal::engine::internal {

// Per output coordinate of one axis: the input coordinates it reads and their weights
// (nearest: one with weight 1; linear: two; cubic: up to four; antialias: more), or
// `outside` tf_crop_and_resize's crop, where the element takes extrapolation_value.
struct ResizeSamples {
  std::vector<int64_t> idx;
  std::vector<float> w;
  bool outside = false;
};

struct ResizeGeometry {
  Shape out;
  std::vector<std::vector<ResizeSamples>> taps;  // per axis of X, per output coordinate
  float extrapolation = 0.f;
};

// The output shape and the taps of the Resize node `ctx` names, for every mode and
// coordinate transformation: an output element is the sum, over every combination of its
// axes' taps, of the input element they name times the product of their weights (the CPU
// engine's general loop, which runs cubic, antialias and crops; its nearest and linear
// loops read the same elements with the same weights). `ctx` needs the graph, the node
// and its inputs' dtypes and shapes, with the data of inputs 1 to 3 (roi, scales, sizes)
// where given. INVALID_ARGUMENT as Resize's preparation would be; FAILED_PRECONDITION when
// the sizes, scales or roi are known only at run time.
StatusOr<ResizeGeometry> ComputeResizeGeometry(const PrepareContext& ctx);

}  // namespace shoal::engine::internal
