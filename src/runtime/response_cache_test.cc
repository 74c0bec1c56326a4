#include "runtime/response_cache.h"

#include <gtest/gtest.h>

namespace shoal::runtime {
namespace {

std::vector<NamedTensor> Out(size_t bytes) {
  return {NamedTensor{"O", Tensor::Allocate(DataType::kUint8, {(int64_t)bytes})}};
}

CacheKey Key(const std::string& s, uint64_t owner = 0) {
  return CacheKeyBuilder(owner).Add(s).Finish();
}

// Bytes a key of Key(s) is charged.
int64_t KeyBytes(const std::string& s) { return static_cast<int64_t>(8 + s.size()); }

TEST(CacheKeyTest, OrderAndBoundariesMatter) {
  EXPECT_EQ(Key("abc"), Key("abc"));
  EXPECT_FALSE(Key("abc") == Key("abd"));
  EXPECT_FALSE(CacheKeyBuilder().Add("ab").Add("c").Finish() ==
               CacheKeyBuilder().Add("a").Add("bc").Finish());
  EXPECT_FALSE(Key("abc", 1) == Key("abc", 2)) << "owners are part of the identity";
}

TEST(ResponseCacheTest, MissThenLeaderCompletesThenHit) {
  ResponseCache cache(1 << 20);
  ResponseCache::Waiter w = [](bool, const Status&, const std::vector<NamedTensor>&) {};
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
  ResponseCache::Waiter noop = [](bool, const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  ASSERT_EQ(cache.Lookup(Key("x"), noop, &got), ResponseCache::Outcome::kLeader);
  for (int i = 0; i < 2; ++i) {
    ResponseCache::Waiter w = [&](bool, const Status& s, const std::vector<NamedTensor>&) {
      ++called;
      seen = s;
    };
    EXPECT_EQ(cache.Lookup(Key("x"), w, &got), ResponseCache::Outcome::kJoined);
  }
  auto waiters = cache.Complete(Key("x"), Internal("backend failed"), {});
  ASSERT_EQ(waiters.size(), 2u);
  for (auto& w : waiters) w(true, Internal("backend failed"), {});
  EXPECT_EQ(called, 2);
  EXPECT_EQ(seen.code(), StatusCode::kInternal);
  // Errors are not stored: the next lookup leads again.
  EXPECT_EQ(cache.Lookup(Key("x"), noop, &got), ResponseCache::Outcome::kLeader);
  EXPECT_EQ(cache.stats().joins, 2);
}

TEST(ResponseCacheTest, EvictsLeastRecentlyUsedToStayWithinBytes) {
  const int64_t entry =
      1000 + ResponseCache::kEntryOverheadBytes + 1 + KeyBytes("a");  // + name "O"
  ResponseCache cache(3 * entry);
  ResponseCache::Waiter noop = [](bool, const Status&, const std::vector<NamedTensor>&) {};
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
  ResponseCache::Waiter noop = [](bool, const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  ASSERT_EQ(cache.Lookup(Key("big"), noop, &got), ResponseCache::Outcome::kLeader);
  cache.Complete(Key("big"), Status::Ok(), Out(1000));
  EXPECT_EQ(cache.stats().entries, 0);
}

TEST(ResponseCacheTest, CollidingHashesNeverServeAnotherKeysResult) {
  ResponseCache::Options o;
  o.capacity_bytes = 1 << 20;
  o.hash_for_testing = [](const CacheKey&) -> uint64_t { return 42; };  // every key collides
  ResponseCache cache(o);
  ResponseCache::Waiter noop = [](bool, const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  ASSERT_EQ(cache.Lookup(Key("alice"), noop, &got), ResponseCache::Outcome::kLeader);
  EXPECT_EQ(cache.Lookup(Key("mallory"), noop, &got), ResponseCache::Outcome::kLeader)
      << "a colliding key must not join another's run";
  cache.Complete(Key("alice"), Status::Ok(), Out(10));
  cache.Complete(Key("mallory"), Status::Ok(), Out(20));
  ASSERT_EQ(cache.Lookup(Key("alice"), noop, &got), ResponseCache::Outcome::kHit);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tensor.byte_size(), 10u) << "alice got mallory's result";
  EXPECT_EQ(cache.Lookup(Key("eve"), noop, &got), ResponseCache::Outcome::kLeader);
}

TEST(ResponseCacheTest, KeyHashIsSeeded) {
  ResponseCache::Options a, b;
  a.hash_seed = 1;
  b.hash_seed = 2;
  const CacheKey k = Key("same request");
  EXPECT_NE(ResponseCache(a).Hash(k), ResponseCache(b).Hash(k));
  EXPECT_EQ(ResponseCache(a).Hash(k), ResponseCache(a).Hash(k));
  // Default seeds are drawn per cache: two caches disagree (a 2^-64 chance of a flake).
  EXPECT_NE(ResponseCache(1 << 20).Hash(k), ResponseCache(1 << 20).Hash(k));
}

TEST(ResponseCacheTest, StoredRowOwnsItsBytesAndTheChargeCoversThem) {
  // A batch of 64 rows of 1 KiB; the response is row 5, a view of the batch's buffer.
  Tensor batch = Tensor::Allocate(DataType::kUint8, {64, 1024});
  for (size_t i = 0; i < batch.byte_size(); ++i)
    batch.mutable_values<uint8_t>()[i] = static_cast<uint8_t>(i / 1024);
  std::weak_ptr<Buffer> batch_buffer = batch.buffer();
  ResponseCache cache(1 << 20);
  ResponseCache::Waiter noop = [](bool, const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  ASSERT_EQ(cache.Lookup(Key("r"), noop, &got), ResponseCache::Outcome::kLeader);
  {
    auto row = batch.SliceRows(5, 6);
    ASSERT_TRUE(row.ok());
    cache.Complete(Key("r"), Status::Ok(), {NamedTensor{"O", *row}});
  }
  batch = Tensor();
  EXPECT_TRUE(batch_buffer.expired()) << "the cache pins the whole batch's output";
  ASSERT_EQ(cache.Lookup(Key("r"), noop, &got), ResponseCache::Outcome::kHit);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tensor.shape(), (Shape{1, 1024}));
  EXPECT_EQ(got[0].tensor.values<uint8_t>()[0], 5);
  EXPECT_EQ(got[0].tensor.values<uint8_t>()[1023], 5);
  // What the entry holds (its buffer, name and key) is within what it is charged.
  const int64_t held = static_cast<int64_t>(got[0].tensor.buffer()->size()) + 1 + KeyBytes("r");
  EXPECT_GE(cache.stats().bytes, held);
}

TEST(ResponseCacheTest, PurgeDropsOnlyThatOwnersEntries) {
  ResponseCache cache(1 << 20);
  ResponseCache::Waiter noop = [](bool, const Status&, const std::vector<NamedTensor>&) {};
  std::vector<NamedTensor> got;
  for (uint64_t owner : {1, 2}) {
    ASSERT_EQ(cache.Lookup(Key("k", owner), noop, &got), ResponseCache::Outcome::kLeader);
    cache.Complete(Key("k", owner), Status::Ok(), Out(10));
  }
  cache.Purge(1);
  EXPECT_EQ(cache.stats().entries, 1);
  EXPECT_EQ(cache.stats().bytes, 10 + 1 + KeyBytes("k") + ResponseCache::kEntryOverheadBytes);
  EXPECT_EQ(cache.Lookup(Key("k", 2), noop, &got), ResponseCache::Outcome::kHit);
  EXPECT_EQ(cache.Lookup(Key("k", 1), noop, &got), ResponseCache::Outcome::kLeader);
}

}  // namespace
}  // namespace shoal::runtime
