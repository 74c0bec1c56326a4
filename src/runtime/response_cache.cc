#include "runtime/response_cache.h"

#include <xxhash.h>

#include <atomic>
#include <cstring>
#include <random>

namespace shoal::runtime {
namespace {

uint64_t RandomSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// A tensor that holds exactly its own bytes: `t` itself when it already owns a buffer
// of its size, else a copy. A response's tensor is usually a row view of the batch's
// output, and storing the view would keep the whole batch's buffer alive.
Tensor OwnedCopy(const Tensor& t) {
  const auto& buffer = t.buffer();
  if (buffer == nullptr) return t;
  if (buffer->owns_data() && buffer->data() == t.data() && buffer->size() == t.byte_size())
    return t;
  Tensor copy = Tensor::AllocateUninitialized(t.dtype(), t.shape(), t.byte_size());
  if (t.byte_size() > 0) std::memcpy(copy.mutable_data(), t.data(), t.byte_size());
  return copy;
}

}  // namespace

CacheKeyBuilder& CacheKeyBuilder::Add(std::string_view bytes) {
  const uint64_t length = bytes.size();
  key_.bytes.append(reinterpret_cast<const char*>(&length), sizeof(length));
  key_.bytes.append(bytes);
  return *this;
}

CacheKeyBuilder& CacheKeyBuilder::Add(int64_t value) {
  return Add(std::string_view(reinterpret_cast<const char*>(&value), sizeof(value)));
}

ResponseCache::ResponseCache(int64_t capacity_bytes)
    : ResponseCache([capacity_bytes] {
        Options o;
        o.capacity_bytes = capacity_bytes;
        return o;
      }()) {}

ResponseCache::ResponseCache(Options options)
    : capacity_bytes_(options.capacity_bytes),
      seed_(options.hash_seed != 0 ? options.hash_seed : RandomSeed()),
      hash_for_testing_(std::move(options.hash_for_testing)),
      index_(0, KeyHash{this}),
      in_flight_(0, KeyHash{this}) {}

uint64_t ResponseCache::NewOwnerId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

uint64_t ResponseCache::Hash(const CacheKey& key) const {
  if (hash_for_testing_) return hash_for_testing_(key);
  return XXH3_64bits_withSeed(key.bytes.data(), key.bytes.size(), seed_ ^ key.owner);
}

ResponseCache::Outcome ResponseCache::Lookup(const CacheKey& key, Waiter& waiter,
                                             std::vector<NamedTensor>* outputs) {
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
    *outputs = it->second.outputs;
    ++stats_.hits;
    return Outcome::kHit;
  }
  auto fl = in_flight_.find(key);
  if (fl != in_flight_.end()) {
    fl->second.push_back(std::move(waiter));
    ++stats_.joins;
    return Outcome::kJoined;
  }
  in_flight_.emplace(key, std::vector<Waiter>{});
  ++stats_.misses;
  return Outcome::kLeader;
}

std::vector<ResponseCache::Waiter> ResponseCache::Complete(
    const CacheKey& key, const Status& status, const std::vector<NamedTensor>& outputs) {
  std::vector<Waiter> waiters;
  std::vector<NamedTensor> stored;
  int64_t bytes = kEntryOverheadBytes + static_cast<int64_t>(key.bytes.size());
  if (status.ok()) {
    for (const auto& t : outputs)
      bytes += static_cast<int64_t>(t.tensor.byte_size() + t.name.size());
    // Copied outside the lock; wasted only if the entry is refused below.
    if (bytes <= capacity_bytes_) {
      for (const auto& t : outputs) stored.push_back(NamedTensor{t.name, OwnedCopy(t.tensor)});
    }
  }
  MutexLock lock(&mu_);
  auto fl = in_flight_.find(key);
  if (fl != in_flight_.end()) {
    waiters = std::move(fl->second);
    in_flight_.erase(fl);
  }
  if (!status.ok() || bytes > capacity_bytes_ || index_.count(key)) return waiters;
  auto it = index_.emplace(key, Entry{std::move(stored), bytes, {}}).first;
  lru_.push_front(&it->first);
  it->second.lru_pos = lru_.begin();
  stats_.bytes += bytes;
  ++stats_.entries;
  EvictLocked();
  return waiters;
}

void ResponseCache::Purge(uint64_t owner) {
  MutexLock lock(&mu_);
  for (auto it = index_.begin(); it != index_.end();) {
    auto next = std::next(it);
    if (it->first.owner == owner) EraseLocked(it);
    it = next;
  }
}

void ResponseCache::EraseLocked(Index::iterator it) {
  stats_.bytes -= it->second.bytes;
  --stats_.entries;
  lru_.erase(it->second.lru_pos);
  index_.erase(it);
}

void ResponseCache::EvictLocked() {
  while (stats_.bytes > capacity_bytes_ && !lru_.empty()) {
    ++stats_.evictions;
    EraseLocked(index_.find(*lru_.back()));
  }
}

CacheStats ResponseCache::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace shoal::runtime
