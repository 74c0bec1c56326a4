#include "worker/entry.h"

#include <gtest/gtest.h>

namespace shoal::worker {
namespace {

RedisReply Str(std::string s) {
  RedisReply r;
  r.type = RedisReply::Type::kString;
  r.str = std::move(s);
  return r;
}
RedisReply Int(int64_t v) {
  RedisReply r;
  r.type = RedisReply::Type::kInteger;
  r.integer = v;
  return r;
}
RedisReply Arr(std::vector<RedisReply> e) {
  RedisReply r;
  r.type = RedisReply::Type::kArray;
  r.elements = std::move(e);
  return r;
}
RedisReply Nil() { return RedisReply{}; }

StreamEntry Entry(std::vector<std::pair<std::string, std::string>> fields) {
  StreamEntry e;
  e.id = "1-0";
  e.fields = std::move(fields);
  return e;
}

TEST(EntriesFromReadReply, ReadsEntriesOfTheStream) {
  RedisReply reply = Arr(
      {Arr({Str("requests"), Arr({Arr({Str("1-0"), Arr({Str("id"), Str("a"), Str("x"), Str("")})}),
                                  Arr({Str("2-0"), Arr({Str("id"), Str("b")})})})})});
  auto entries = EntriesFromReadReply(reply);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].id, "1-0");
  EXPECT_EQ(*(*entries)[0].Find("id"), "a");
  EXPECT_EQ(*(*entries)[0].Find("x"), "");
  EXPECT_EQ((*entries)[0].Find("y"), nullptr);
  EXPECT_EQ((*entries)[1].deliveries, 1);
}

TEST(EntriesFromReadReply, NilIsNothingNew) {
  auto entries = EntriesFromReadReply(Nil());
  ASSERT_TRUE(entries.ok());
  EXPECT_TRUE(entries->empty());
}

TEST(EntriesFromReadReply, RefusesOtherShapes) {
  EXPECT_FALSE(EntriesFromReadReply(Str("OK")).ok());
  EXPECT_FALSE(EntriesFromReadReply(Arr({Arr({Str("s")})})).ok());
  // Odd number of field strings.
  EXPECT_FALSE(
      EntriesFromReadReply(Arr({Arr({Str("s"), Arr({Arr({Str("1-0"), Arr({Str("id")})})})})}))
          .ok());
  // A field that is not a string.
  EXPECT_FALSE(EntriesFromReadReply(
                   Arr({Arr({Str("s"), Arr({Arr({Str("1-0"), Arr({Str("id"), Int(3)})})})})}))
                   .ok());
}

TEST(EntriesFromAutoClaimReply, KeepsTheCursorAndDropsDeletedEntries) {
  RedisReply reply = Arr(
      {Str("5-0"), Arr({Arr({Str("3-0"), Arr({Str("id"), Str("a")})}), Arr({Str("4-0"), Nil()})}),
       Arr({Str("4-0")})});
  auto r = EntriesFromAutoClaimReply(reply);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->next_cursor, "5-0");
  ASSERT_EQ(r->entries.size(), 1u);
  EXPECT_EQ(r->entries[0].id, "3-0");
  EXPECT_FALSE(EntriesFromAutoClaimReply(Arr({Int(0)})).ok());
}

TEST(DeliveriesFromPendingReply, ReadsTheCount) {
  auto n = DeliveriesFromPendingReply(Arr({Arr({Str("3-0"), Str("w1"), Int(1500), Int(4)})}));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4);
  EXPECT_EQ(DeliveriesFromPendingReply(Arr({})).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(DeliveriesFromPendingReply(Arr({Arr({Str("3-0")})})).ok());
}

TEST(GroupFromInfoReply, FindsTheGroupByName) {
  RedisReply reply =
      Arr({Arr({Str("name"), Str("other"), Str("pending"), Int(9), Str("lag"), Int(1)}),
           Arr({Str("name"), Str("g"), Str("consumers"), Int(3), Str("pending"), Int(7), Str("lag"),
                Int(120)})});
  auto g = GroupFromInfoReply(reply, "g");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->pending, 7);
  EXPECT_EQ(g->lag, 120);
  // A lag Redis cannot tell is nil.
  auto unknown = GroupFromInfoReply(Arr({Arr({Str("name"), Str("g"), Str("lag"), Nil()})}), "g");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->lag, -1);
  EXPECT_EQ(GroupFromInfoReply(reply, "missing").status().code(), StatusCode::kNotFound);
}

TEST(ParseEntry, ReadsEveryField) {
  auto item = ParseEntry(Entry({{"id", "req-1"},
                                {"model", "identity"},
                                {"version", "2"},
                                {"payload", "{\"inputs\":[]}"},
                                {"header_length", "13"},
                                {"trace", "ignored"}}),
                         1024);
  ASSERT_TRUE(item.ok()) << item.status().ToString();
  EXPECT_EQ(item->request_id, "req-1");
  EXPECT_EQ(item->model, "identity");
  EXPECT_EQ(item->version, 2);
  EXPECT_EQ(item->payload, "{\"inputs\":[]}");
  EXPECT_EQ(item->header_length, "13");
}

TEST(ParseEntry, VersionAndHeaderLengthAreOptional) {
  auto item = ParseEntry(Entry({{"id", "r"}, {"model", "m"}, {"payload", "{}"}}), 1024);
  ASSERT_TRUE(item.ok());
  EXPECT_EQ(item->version, -1);
  EXPECT_FALSE(item->header_length.has_value());
}

// Each malformed entry is refused with a message naming the field.
TEST(ParseEntry, RefusesMalformedEntriesNamingTheField) {
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>>
      cases = {
          {{{"model", "m"}, {"payload", "{}"}}, "field 'id': missing"},
          {{{"id", ""}, {"model", "m"}, {"payload", "{}"}}, "field 'id': empty"},
          {{{"id", "a b"}, {"model", "m"}, {"payload", "{}"}}, "field 'id'"},
          {{{"id", std::string(201, 'x')}, {"model", "m"}, {"payload", "{}"}}, "field 'id': 201"},
          {{{"id", "r"}, {"payload", "{}"}}, "field 'model': missing"},
          {{{"id", "r"}, {"model", "m"}}, "field 'payload': missing"},
          {{{"id", "r"}, {"model", "m"}, {"payload", ""}}, "field 'payload': empty"},
          {{{"id", "r"}, {"model", "m"}, {"payload", std::string(2000, 'x')}},
           "field 'payload': 2000 bytes"},
          {{{"id", "r"}, {"model", "m"}, {"version", "0"}, {"payload", "{}"}}, "field 'version'"},
          {{{"id", "r"}, {"model", "m"}, {"version", "1x"}, {"payload", "{}"}}, "field 'version'"},
          {{{"id", "r"}, {"id", "s"}, {"model", "m"}, {"payload", "{}"}}, "field 'id' given twice"},
      };
  for (const auto& [fields, expected] : cases) {
    auto item = ParseEntry(Entry(fields), 1024);
    ASSERT_FALSE(item.ok()) << expected;
    EXPECT_EQ(item.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(item.status().message().find(expected), std::string::npos)
        << item.status().message() << " lacks " << expected;
  }
}

TEST(UsableRequestId, OnlyOneValidId) {
  EXPECT_EQ(UsableRequestId(Entry({{"id", "r1"}, {"model", ""}})), "r1");
  EXPECT_EQ(UsableRequestId(Entry({{"model", "m"}})), "");
  EXPECT_EQ(UsableRequestId(Entry({{"id", "bad id"}})), "");
  EXPECT_EQ(UsableRequestId(Entry({{"id", "a"}, {"id", "b"}})), "");
}

TEST(ParseRedisUrl, ReadsHostPortDbAndPassword) {
  auto a = ParseRedisUrl("redis://:secret@10.0.0.5:6380/3");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "10.0.0.5");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->db, 3);
  EXPECT_EQ(a->password, "secret");
  EXPECT_EQ(a->user, "");
  auto u = ParseRedisUrl("redis://shoal:pw@h");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->user, "shoal");
  EXPECT_EQ(u->password, "pw");
  auto b = ParseRedisUrl("localhost");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "localhost");
  EXPECT_EQ(b->port, 6379);
  EXPECT_EQ(b->db, 0);
  EXPECT_FALSE(ParseRedisUrl("rediss://host").ok());
  EXPECT_FALSE(ParseRedisUrl("redis://host:0").ok());
  EXPECT_FALSE(ParseRedisUrl("redis://host:99999").ok());
  EXPECT_FALSE(ParseRedisUrl("redis://host/x").ok());
  EXPECT_FALSE(ParseRedisUrl("redis://").ok());
}

}  // namespace
}  // namespace shoal::worker
