// WeightCache: constant weights reordered into the layouts oneDNN's primitives prefer,
// computed once per (weight, layout) and shared by every plan and session of a Model.
//
// Model::Load fills it while it prepares its shape-inference plans, so the reorders
// happen at load time; a later plan whose primitive prefers the same layout (the usual
// case) reuses the bytes. Entries live as long as the Model.
//
// Thread safety: Get and size may be called concurrently (sessions on different
// threads prepare plans at the same time); one mutex guards the entries and is held
// across a reorder, so each reorder runs once.
#pragma once

#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/tensor.h"

namespace shoal::engine {

class WeightCache {
 public:
  // Returns the bytes of `weights` (laid out as `from`) in the layout `to`. The first
  // call per (value, layout) runs a oneDNN reorder; later calls return the same buffer.
  StatusOr<std::shared_ptr<Buffer>> Get(int value_id, const Tensor& weights,
                                        const dnnl::memory::desc& from,
                                        const dnnl::memory::desc& to, const dnnl::engine& engine);
  // Number of (value, layout) entries.
  size_t size() const;

 private:
  struct Entry {
    int value_id;
    dnnl::memory::desc desc;
    std::shared_ptr<Buffer> buffer;
  };
  mutable Mutex mu_;
  std::vector<Entry> entries_ GUARDED_BY(mu_);
};

}  // namespace shoal::engine
