#include "proto/json_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace shoal::proto {
namespace {

TEST(JsonWriterTest, NestedContainersAndCommas) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject()
      .Member("a", "x")
      .Key("b")
      .BeginArray()
      .Int(-1)
      .Uint(UINT64_MAX)
      .Bool(true)
      .Null()
      .EndArray();
  w.Key("c").BeginObject().EndObject().Key("d").BeginArray().EndArray().EndObject();
  EXPECT_EQ(out, R"({"a":"x","b":[-1,18446744073709551615,true,null],"c":{},"d":[]})");
}

TEST(JsonWriterTest, NumbersRoundTrip) {
  std::string out;
  JsonWriter w(&out);
  w.BeginArray()
      .Double(0.1)
      .Double(1e300)
      .Double(-0.0)
      .Double(std::nan(""))
      .Double(INFINITY)
      .Double(-INFINITY);
  w.Int(INT64_MIN).EndArray();
  EXPECT_EQ(out, "[0.1,1e+300,-0,NaN,Infinity,-Infinity,-9223372036854775808]");
}

TEST(JsonWriterTest, StringEscaping) {
  std::string out;
  AppendJsonString(&out, std::string("q\"b\\n\n\t\x01\x1f\xc3\xa9", 11));
  EXPECT_EQ(out, "\"q\\\"b\\\\n\\n\\t\\u0001\\u001f\xc3\xa9\"");
}

TEST(JsonWriterTest, Utf8Validation) {
  EXPECT_TRUE(ValidUtf8(""));
  EXPECT_TRUE(ValidUtf8("plain"));
  EXPECT_TRUE(ValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  EXPECT_FALSE(ValidUtf8("\xff"));
  EXPECT_FALSE(ValidUtf8("\xc3"));              // truncated
  EXPECT_FALSE(ValidUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(ValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(ValidUtf8("\xf4\x90\x80\x80"));  // > U+10FFFF
}

TEST(JsonWriterTest, ErrorBodyIsAlwaysValidJson) {
  EXPECT_EQ(JsonError("bad \"x\""), R"({"error":"bad \"x\""})");
  EXPECT_EQ(JsonError("model '\xff'"), R"({"error":"model '?'"})");
}

}  // namespace
}  // namespace shoal::proto
