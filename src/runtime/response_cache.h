// ResponseCache: results of earlier requests, looked up by a key over everything that
// decides a result (model, version, input tensors, requested outputs, parameters).
//
//   - LRU, bounded in bytes (the outputs' byte sizes plus a fixed per-entry overhead);
//     an entry larger than the whole capacity is never stored.
//   - Identical requests in flight are joined: the first one (the leader) runs; later
//     ones wait on it and are answered with its result, or its error.
//   - Hits, misses and joins are counted.
// Stored outputs share their buffers with the response that produced them (tensors
// are immutable once answered), so a hit copies no tensor data.
//
// Thread safety: all methods are safe from any thread. Waiters are returned, never
// called under the cache's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace shoal::runtime {

struct CacheKey {
  uint64_t h1 = 0, h2 = 0;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

// Builds a CacheKey from bytes fed in order (two independent 64-bit hashes).
class CacheKeyBuilder {
 public:
  CacheKeyBuilder& Add(std::string_view bytes);
  CacheKeyBuilder& Add(int64_t value);
  CacheKey Finish() const { return {h1_, h2_ ^ length_}; }

 private:
  uint64_t h1_ = 0xcbf29ce484222325ULL;
  uint64_t h2_ = 0x9e3779b97f4a7c15ULL;
  uint64_t length_ = 0;
};

struct CacheStats {
  int64_t hits = 0, misses = 0, joins = 0, evictions = 0, entries = 0, bytes = 0;
};

class ResponseCache {
 public:
  using Waiter = std::function<void(const Status&, const std::vector<NamedTensor>&)>;
  static constexpr int64_t kEntryOverheadBytes = 128;

  explicit ResponseCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  enum class Outcome { kHit, kJoined, kLeader };
  // kHit: *outputs holds the stored result. kJoined: an identical request is running and
  // `waiter` will be returned from its Complete. kLeader: the caller must run the
  // request and call Complete(key, ...) exactly once.
  Outcome Lookup(const CacheKey& key, Waiter& waiter, std::vector<NamedTensor>* outputs);
  // Ends the leader's run; stores the result on success. Returns the joined waiters,
  // which the caller invokes with (status, outputs).
  std::vector<Waiter> Complete(const CacheKey& key, const Status& status,
                               const std::vector<NamedTensor>& outputs);

  CacheStats stats() const;
  int64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  struct KeyHash {
    size_t operator()(const CacheKey& k) const { return k.h1 ^ (k.h2 * 0x9e3779b97f4a7c15ULL); }
  };
  struct Entry {
    CacheKey key;
    std::vector<NamedTensor> outputs;
    int64_t bytes;
  };
  void EvictLocked();

  const int64_t capacity_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // GUARDED_BY(mu_); front = most recently used
  std::unordered_map<CacheKey, std::list<Entry>::iterator, KeyHash> index_;  // GUARDED_BY(mu_)
  std::unordered_map<CacheKey, std::vector<Waiter>, KeyHash> in_flight_;     // GUARDED_BY(mu_)
  CacheStats stats_;                                                         // GUARDED_BY(mu_)
};

}  // namespace shoal::runtime
