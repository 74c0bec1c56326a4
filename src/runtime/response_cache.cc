#include "runtime/response_cache.h"

#include <cstring>

namespace shoal::runtime {

CacheKeyBuilder& CacheKeyBuilder::Add(std::string_view bytes) {
  // FNV-1a and a multiplicative mix over 8-byte words: independent enough that a
  // collision of both is not a practical concern for a cache key.
  for (unsigned char c : bytes) {
    h1_ = (h1_ ^ c) * 0x100000001b3ULL;
  }
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h2_ = (h2_ ^ w) * 0xff51afd7ed558ccdULL;
    h2_ ^= h2_ >> 33;
  }
  for (; i < bytes.size(); ++i) {
    h2_ = (h2_ ^ static_cast<unsigned char>(bytes[i])) * 0xc4ceb9fe1a85ec53ULL;
    h2_ ^= h2_ >> 29;
  }
  length_ += bytes.size();
  // Separator, so ("ab","c") differs from ("a","bc").
  h1_ = (h1_ ^ 0xff) * 0x100000001b3ULL;
  h2_ = (h2_ + 0x632be59bd9b4e019ULL) * 0x9e3779b97f4a7c15ULL;
  return *this;
}

CacheKeyBuilder& CacheKeyBuilder::Add(int64_t value) {
  return Add(std::string_view(reinterpret_cast<const char*>(&value), sizeof(value)));
}

ResponseCache::Outcome ResponseCache::Lookup(const CacheKey& key, Waiter& waiter,
                                             std::vector<NamedTensor>* outputs) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    *outputs = it->second->outputs;
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
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Waiter> waiters;
  auto fl = in_flight_.find(key);
  if (fl != in_flight_.end()) {
    waiters = std::move(fl->second);
    in_flight_.erase(fl);
  }
  if (!status.ok() || index_.count(key)) return waiters;
  int64_t bytes = kEntryOverheadBytes;
  for (const auto& t : outputs) bytes += static_cast<int64_t>(t.tensor.byte_size() + t.name.size());
  if (bytes > capacity_bytes_) return waiters;
  lru_.push_front(Entry{key, outputs, bytes});
  index_[key] = lru_.begin();
  stats_.bytes += bytes;
  ++stats_.entries;
  EvictLocked();
  return waiters;
}

void ResponseCache::EvictLocked() {
  while (stats_.bytes > capacity_bytes_ && !lru_.empty()) {
    const Entry& victim = lru_.back();
    stats_.bytes -= victim.bytes;
    --stats_.entries;
    ++stats_.evictions;
    index_.erase(victim.key);
    lru_.pop_back();
  }
}

CacheStats ResponseCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace shoal::runtime
