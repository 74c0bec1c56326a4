// PreparedCache: what preparing one data-dependent step of a plan (plan.h, "dynamic"
// steps) produced for one set of inputs, kept for the next runs that bring the same.
//
// A dynamic step is prepared at run time from the tensors its inputs then hold. The
// preparation reads their dtypes and shapes, and the contents of the inputs passed to it
// as data (plan constants, which never change, and small integer tensors computed in the
// run); the plan writes all of that but the constants into a byte string, the key. Equal
// keys prepare equal kernels, so a run whose key is cached reuses the kernel (oneDNN
// primitives and all) instead of preparing again.
//
// Bounded: at most `capacity` entries per step, the least recently used evicted first.
// Not thread-safe; a plan is used by one thread at a time, and so is its cache.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "engine/kernel.h"

namespace shoal::engine::internal {

// One preparation of a dynamic step: its kernel and what it decided for the outputs, or
// (`computed` not empty) the outputs themselves when the preparation computed them all.
struct PreparedStep {
  std::unique_ptr<Kernel> kernel;
  std::vector<DataType> out_dtypes;
  std::vector<Shape> out_shapes;
  std::vector<char> out_dynamic;
  std::vector<Tensor> computed;  // per output; owned copies, never handed out themselves
};

class PreparedCache {
 public:
  explicit PreparedCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

  // The entry for `key`, now the most recently used; null when absent.
  PreparedStep* Find(const std::string& key) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first != key) continue;
      std::rotate(entries_.begin(), entries_.begin() + static_cast<long>(i),
                  entries_.begin() + static_cast<long>(i) + 1);
      return entries_.front().second.get();
    }
    return nullptr;
  }
  // Keeps `step` under `key` (absent) as the most recently used, evicting the least
  // recently used beyond capacity; returns the kept entry.
  PreparedStep* Insert(std::string key, PreparedStep step) {
    if (entries_.size() == capacity_) entries_.pop_back();
    entries_.insert(entries_.begin(),
                    {std::move(key), std::make_unique<PreparedStep>(std::move(step))});
    return entries_.front().second.get();
  }
  size_t size() const { return entries_.size(); }

 private:
  size_t capacity_;
  // Most recently used first.
  std::vector<std::pair<std::string, std::unique_ptr<PreparedStep>>> entries_;
};

}  // namespace shoal::engine::internal
