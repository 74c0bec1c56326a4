#include "runtime/response_cache.h"

#include <gtest/gtest.h>

namespace shoal::runtime {
namespace {

std::vector<NamedTensor> Out(size_t bytes) {
  return {NamedTensor{"O", Tensor::Allocate(DataType::kUint8, {(int64_t)bytes})}};
}

CacheKey Key(const std::string& s) { return CacheKeyBuilder().Add(s).Finish(); }

TEST(CacheKeyTest, OrderAndBoundariesMatter) {
  EXPECT_EQ(Key("abc"), Key("abc"));
  EXPECT_FALSE(Key("abc") == Key("abd"));
  EXPECT_FALSE(CacheKeyBuilder().Add("ab").Add("c").Finish() ==
               CacheKeyBuilder().Add("a").Add("bc").Finish());
}

TEST(ResponseCacheTest, MissThenLeaderCompletesThenHit) {
  ResponseCache cache(1 << 20);
  ResponseCache::Waiter w = [](const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  EXPECT_EQ(cache.Lookup(Key("a"), w, &got), ResponseCache::Outcome::kLeader);
  EXPECT_TRUE(cache.Complete(Key("a"), Status::Ok(), Out(10)).empty());
  EXPECT_EQ(cache.Lookup(Key("a"), w, &got), ResponseCache::Outcome::kHit);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tensor.byte_size(), 10u);
  auto s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.entries, 1);
}

TEST(ResponseCacheTest, JoinersGetTheLeadersResultOrError) {
  ResponseCache cache(1 << 20);
  int called = 0;
  Status seen;
  ResponseCache::Waiter noop = [](const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  ASSERT_EQ(cache.Lookup(Key("x"), noop, &got), ResponseCache::Outcome::kLeader);
  for (int i = 0; i < 2; ++i) {
    ResponseCache::Waiter w = [&](const Status& s, const std::vector<NamedTensor>&) {
      ++called;
      seen = s;
    };
    EXPECT_EQ(cache.Lookup(Key("x"), w, &got), ResponseCache::Outcome::kJoined);
  }
  auto waiters = cache.Complete(Key("x"), Internal("backend failed"), {});
  ASSERT_EQ(waiters.size(), 2u);
  for (auto& w : waiters) w(Internal("backend failed"), {});
  EXPECT_EQ(called, 2);
  EXPECT_EQ(seen.code(), StatusCode::kInternal);
  // Errors are not stored: the next lookup leads again.
  EXPECT_EQ(cache.Lookup(Key("x"), noop, &got), ResponseCache::Outcome::kLeader);
  EXPECT_EQ(cache.stats().joins, 2);
}

TEST(ResponseCacheTest, EvictsLeastRecentlyUsedToStayWithinBytes) {
  const int64_t entry = 1000 + ResponseCache::kEntryOverheadBytes + 1;  // + name "O"
  ResponseCache cache(3 * entry);
  ResponseCache::Waiter noop = [](const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  for (const char* k : {"a", "b", "c"}) {
    ASSERT_EQ(cache.Lookup(Key(k), noop, &got), ResponseCache::Outcome::kLeader);
    cache.Complete(Key(k), Status::Ok(), Out(1000));
  }
  EXPECT_EQ(cache.Lookup(Key("a"), noop, &got), ResponseCache::Outcome::kHit);  // a is now recent
  ASSERT_EQ(cache.Lookup(Key("d"), noop, &got), ResponseCache::Outcome::kLeader);
  cache.Complete(Key("d"), Status::Ok(), Out(1000));
  auto s = cache.stats();
  EXPECT_EQ(s.evictions, 1);
  EXPECT_LE(s.bytes, cache.capacity_bytes());
  EXPECT_EQ(cache.Lookup(Key("a"), noop, &got), ResponseCache::Outcome::kHit);
  EXPECT_EQ(cache.Lookup(Key("b"), noop, &got), ResponseCache::Outcome::kLeader)
      << "b was least recent";
}

TEST(ResponseCacheTest, EntryLargerThanCapacityIsNotStored) {
  ResponseCache cache(500);
  ResponseCache::Waiter noop = [](const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  ASSERT_EQ(cache.Lookup(Key("big"), noop, &got), ResponseCache::Outcome::kLeader);
  cache.Complete(Key("big"), Status::Ok(), Out(1000));
  EXPECT_EQ(cache.stats().entries, 0);
}

}  // namespace
}  // namespace shoal::runtime
