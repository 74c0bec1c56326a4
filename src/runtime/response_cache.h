// ResponseCache: results of earlier requests, looked up by a key over everything that
// decides a result (the loaded model instance, input tensors, requested outputs,
// parameters).
//
//   - LRU, bounded in bytes: every byte an entry holds is charged (its outputs' buffers,
//     its output names, its full key, and a fixed per-entry overhead); an entry larger
//     than the whole capacity is never stored.
//   - Keys are compared in full: the key is the exact bytes of what decides the result,
//     and the hash (XXH3, seeded per cache from std::random_device) only picks the
//     bucket. A hash collision, accidental or crafted, can cost a probe but never serve
//     one request's result to another.
//   - Entries belong to an owner (one loaded ModelVersion, NewOwnerId()); an owner's key
//     never equals another's, and Purge(owner) drops its entries when it is unloaded or
//     replaced by a reload under the same version number.
//   - Identical requests in flight are joined: the first one (the leader) runs; later
//     ones wait on it. What a joiner gets is the caller's policy (ModelVersion: the
//     leader's result when the leader ran, else the joiner runs its own request).
//   - Hits, misses and joins are counted.
// Stored outputs are copied on insert into buffers of their own: a response's tensors
// are often views of a whole batch's output, and keeping such a view would pin the
// whole batch (up to max_batch_size times the bytes charged). A hit copies no data.
//
// Thread safety: all methods are safe from any thread. Waiters are returned, never
// called under the cache's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/tensor.h"

namespace shoal::runtime {

// The identity of a cached result: its owner (ResponseCache::NewOwnerId) and the
// canonical bytes of everything that decides it (CacheKeyBuilder).
struct CacheKey {
  uint64_t owner = 0;
  std::string bytes;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

// Builds a CacheKey's bytes from fields fed in order. Each field is length-prefixed, so
// ("ab","c") and ("a","bc") differ.
class CacheKeyBuilder {
 public:
  explicit CacheKeyBuilder(uint64_t owner = 0) { key_.owner = owner; }
  CacheKeyBuilder& Add(std::string_view bytes);
  CacheKeyBuilder& Add(int64_t value);
  // Moves the key out; the builder is spent.
  CacheKey Finish() { return std::move(key_); }

 private:
  CacheKey key_;
};

struct CacheStats {
  int64_t hits = 0, misses = 0, joins = 0, evictions = 0, entries = 0, bytes = 0;
};

class ResponseCache {
 public:
  // Called with the leader's outcome. `shared` true: `status`/`outputs` are the leader's
  // result for this key. False: the leader ended without one (it was cancelled, timed out
  // in the queue or refused at admission), and the waiter must get its own outcome.
  using Waiter =
      std::function<void(bool shared, const Status& status, const std::vector<NamedTensor>&)>;
  static constexpr int64_t kEntryOverheadBytes = 128;

  struct Options {
    int64_t capacity_bytes = 0;
    // Seed of the key hash. 0 (default): drawn from std::random_device, so clients cannot
    // aim collisions at the buckets.
    uint64_t hash_seed = 0;
    // Tests only: replaces the key hash (e.g. by a constant, to check that colliding keys
    // are still told apart).
    std::function<uint64_t(const CacheKey&)> hash_for_testing;
  };

  explicit ResponseCache(int64_t capacity_bytes);
  explicit ResponseCache(Options options);

  // A process-wide unique, never reused owner id (never 0).
  static uint64_t NewOwnerId();

  enum class Outcome { kHit, kJoined, kLeader };
  // kHit: *outputs holds the stored result. kJoined: an identical request is running and
  // `waiter` will be returned from its Complete. kLeader: the caller must run the
  // request and call Complete(key, ...) exactly once.
  Outcome Lookup(const CacheKey& key, Waiter& waiter, std::vector<NamedTensor>* outputs);
  // Ends the leader's run; stores a copy of the result when `status` is OK (and no entry
  // for the key exists). Returns the joined waiters, which the caller invokes.
  std::vector<Waiter> Complete(const CacheKey& key, const Status& status,
                               const std::vector<NamedTensor>& outputs);
  // Drops every stored entry of `owner` (an unloaded or replaced model version).
  void Purge(uint64_t owner);

  // The seeded hash of `key` (what picks its bucket).
  uint64_t Hash(const CacheKey& key) const;

  CacheStats stats() const;
  int64_t capacity_bytes() const { return capacity_bytes_; }

  // Implementation details follow.
 private:
  struct KeyHash {
    const ResponseCache* cache;
    size_t operator()(const CacheKey& k) const { return cache->Hash(k); }
  };
  struct Entry {
    std::vector<NamedTensor> outputs;
    int64_t bytes;
    std::list<const CacheKey*>::iterator lru_pos;
  };
  using Index = std::unordered_map<CacheKey, Entry, KeyHash>;
  void EraseLocked(Index::iterator it) REQUIRES(mu_);
  void EvictLocked() REQUIRES(mu_);

  const int64_t capacity_bytes_;
  const uint64_t seed_;
  const std::function<uint64_t(const CacheKey&)> hash_for_testing_;
  mutable Mutex mu_;
  Index index_ GUARDED_BY(mu_);
  std::list<const CacheKey*> lru_ GUARDED_BY(mu_);  // index_'s keys, front = most recent
  std::unordered_map<CacheKey, std::vector<Waiter>, KeyHash> in_flight_ GUARDED_BY(mu_);
  CacheStats stats_ GUARDED_BY(mu_);
};

}  // namespace shoal::runtime
