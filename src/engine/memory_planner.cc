#include "engine/memory_planner.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

namespace shoal::engine {
namespace {

// A set of tensors that share bytes: one tensor, or an in-place chain.
struct Block {
  int64_t bytes = 0;  // aligned
  int first = 0;
  int last = 0;
};

bool Intersect(const Block& a, const Block& b) { return a.first <= b.last && b.first <= a.last; }

// Places blocks in `order`, each into the smallest gap (lowest offset on ties) left by
// the already placed blocks whose lifetimes intersect its own, or on top of them.
// Returns the arena size; fills `offsets` per block.
int64_t PlaceInOrder(const std::vector<Block>& blocks, const std::vector<int>& order,
                     std::vector<int64_t>* offsets) {
  offsets->assign(blocks.size(), -1);
  std::vector<int> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of conflicting blocks
  int64_t arena = 0;
  for (int b : order) {
    const Block& block = blocks[b];
    if (block.bytes == 0) {
      (*offsets)[b] = 0;
      continue;
    }
    busy.clear();
    for (int p : placed) {
      if (Intersect(block, blocks[p]))
        busy.push_back({(*offsets)[p], (*offsets)[p] + blocks[p].bytes});
    }
    std::sort(busy.begin(), busy.end());
    int64_t best = -1;
    int64_t best_gap = std::numeric_limits<int64_t>::max();
    int64_t end = 0;  // end of the busy bytes seen so far
    for (const auto& [from, to] : busy) {
      const int64_t gap = from - end;
      if (gap >= block.bytes && gap < best_gap) {
        best = end;
        best_gap = gap;
      }
      end = std::max(end, to);
    }
    if (best < 0) best = end;
    (*offsets)[b] = best;
    arena = std::max(arena, best + block.bytes);
    placed.push_back(b);
  }
  return arena;
}

// Grants the legal in-place requests (see InplaceRequest), first come first served, into
// plan->inplace_of and inplace_count.
Status GrantInplace(const std::vector<TensorLifetime>& tensors,
                    const std::vector<InplaceRequest>& inplace, MemoryPlan* plan) {
  const int n = static_cast<int>(tensors.size());
  plan->inplace_of.assign(n, -1);
  std::vector<char> donated(n, 0);
  for (const InplaceRequest& r : inplace) {
    if (r.tensor < 0 || r.tensor >= n || r.source < 0 || r.source >= n) {
      return InvalidArgument("in-place request (" + std::to_string(r.tensor) + " from " +
                             std::to_string(r.source) + ") names no tensor");
    }
    const TensorLifetime& t = tensors[r.tensor];
    const TensorLifetime& s = tensors[r.source];
    // The source must be read for the last time by the step that defines the tensor
    // (hence defined before it, which also keeps chains acyclic) and be big enough.
    const bool legal = r.tensor != r.source && s.last == t.first && s.first < t.first &&
                       ArenaAlignedBytes(t.bytes) <= ArenaAlignedBytes(s.bytes) &&
                       plan->inplace_of[r.tensor] < 0 && !donated[r.source];
    if (!legal) continue;
    plan->inplace_of[r.tensor] = r.source;
    donated[r.source] = 1;
    ++plan->inplace_count;
  }
  return Status::Ok();
}

// Blocks: each in-place chain is named by its first tensor (the one that takes no
// bytes). Fills `block_of` per tensor and plan->no_reuse_bytes.
std::vector<Block> MakeBlocks(const std::vector<TensorLifetime>& tensors, MemoryPlan* plan,
                              std::vector<int>* block_of) {
  const int n = static_cast<int>(tensors.size());
  block_of->assign(n, -1);
  std::vector<Block> blocks;
  std::vector<int> by_first(n);
  std::iota(by_first.begin(), by_first.end(), 0);
  // Sources are defined before the tensors that take their bytes: visiting in order of
  // definition sees every source's block before its taker.
  std::stable_sort(by_first.begin(), by_first.end(),
                   [&](int a, int b) { return tensors[a].first < tensors[b].first; });
  for (int i : by_first) {
    const TensorLifetime& t = tensors[i];
    plan->no_reuse_bytes += ArenaAlignedBytes(t.bytes);
    const int src = plan->inplace_of[i];
    if (src >= 0) {
      Block& b = blocks[(*block_of)[src]];
      b.last = std::max(b.last, t.last);
      (*block_of)[i] = (*block_of)[src];
      continue;
    }
    (*block_of)[i] = static_cast<int>(blocks.size());
    blocks.push_back(Block{ArenaAlignedBytes(t.bytes), t.first, t.last});
  }
  return blocks;
}

// Order 1: largest first (longer lifetime, then earlier definition, on ties).
std::vector<int> BySize(const std::vector<Block>& blocks) {
  std::vector<int> by_size(blocks.size());
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(), [&](int a, int b) {
    const Block& x = blocks[a];
    const Block& y = blocks[b];
    if (x.bytes != y.bytes) return x.bytes > y.bytes;
    if (x.last - x.first != y.last - y.first) return x.last - x.first > y.last - y.first;
    return x.first < y.first;
  });
  return by_size;
}

// Order 2 (greedy by breadth): steps by live bytes (`live`, per step), largest first;
// at each step, its live blocks not yet ordered, in `by_size` order.
std::vector<int> ByBreadth(const std::vector<Block>& blocks, const std::vector<int>& by_size,
                           const std::vector<int64_t>& live) {
  std::vector<int> steps(live.empty() ? 0 : live.size() - 1);
  std::iota(steps.begin(), steps.end(), 0);
  std::stable_sort(steps.begin(), steps.end(), [&](int a, int b) { return live[a] > live[b]; });
  std::vector<int> by_breadth;
  std::vector<char> taken(blocks.size(), 0);
  for (int s : steps) {
    for (int b : by_size) {
      if (!taken[b] && blocks[b].first <= s && s <= blocks[b].last) {
        taken[b] = 1;
        by_breadth.push_back(b);
      }
    }
  }
  for (int b : by_size)
    if (!taken[b]) by_breadth.push_back(b);  // unreachable: every block is live somewhere
  return by_breadth;
}

}  // namespace

StatusOr<MemoryPlan> PlanMemory(const std::vector<TensorLifetime>& tensors,
                                const std::vector<InplaceRequest>& inplace) {
  const int n = static_cast<int>(tensors.size());
  int last_step = -1;
  for (int i = 0; i < n; ++i) {
    const TensorLifetime& t = tensors[i];
    if (t.bytes < 0 || t.first < 0 || t.last < t.first) {
      return InvalidArgument("tensor " + std::to_string(i) + " has bytes " +
                             std::to_string(t.bytes) + " and lifetime [" + std::to_string(t.first) +
                             ", " + std::to_string(t.last) + "]");
    }
    last_step = std::max(last_step, t.last);
  }
  MemoryPlan plan;
  RETURN_IF_ERROR(GrantInplace(tensors, inplace, &plan));
  std::vector<int> block_of;
  const std::vector<Block> blocks = MakeBlocks(tensors, &plan, &block_of);

  // Live bytes per step, from +bytes at first and -bytes after last.
  std::vector<int64_t> live(static_cast<size_t>(last_step + 2), 0);
  for (const Block& b : blocks) {
    live[b.first] += b.bytes;
    live[b.last + 1] -= b.bytes;
  }
  for (size_t s = 1; s < live.size(); ++s) live[s] += live[s - 1];
  for (int64_t bytes : live) plan.liveness_bound_bytes = std::max(plan.liveness_bound_bytes, bytes);

  // Both orders are placed; the smaller arena wins.
  const std::vector<int> by_size = BySize(blocks);
  const std::vector<int> by_breadth = ByBreadth(blocks, by_size, live);
  std::vector<int64_t> offsets_size, offsets_breadth;
  const int64_t arena_size = PlaceInOrder(blocks, by_size, &offsets_size);
  const int64_t arena_breadth = PlaceInOrder(blocks, by_breadth, &offsets_breadth);
  const bool breadth_wins = arena_breadth < arena_size;
  const std::vector<int64_t>& block_offsets = breadth_wins ? offsets_breadth : offsets_size;
  plan.arena_bytes = breadth_wins ? arena_breadth : arena_size;
  plan.offsets.resize(n);
  for (int i = 0; i < n; ++i) plan.offsets[i] = block_offsets[block_of[i]];
  return plan;
}

}  // namespace shoal::engine
