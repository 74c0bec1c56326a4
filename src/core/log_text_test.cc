#include "core/log_text.h"

#include <gtest/gtest.h>

#include <string>

namespace shoal {
namespace {

TEST(LogSafeTest, PlainTextAndUtf8PassThrough) {
  EXPECT_EQ(LogSafe("resnet50_v2-int8"), "resnet50_v2-int8");
  EXPECT_EQ(LogSafe("mod\xc3\xa8le \xe6\xa8\xa1\xe5\x9e\x8b"),
            "mod\xc3\xa8le \xe6\xa8\xa1\xe5\x9e\x8b");
}

TEST(LogSafeTest, LineBreaksAndControlsCannotForgeALine) {
  EXPECT_EQ(LogSafe("x\n2026-01-01 info admin logged in"), "x\\n2026-01-01 info admin logged in");
  EXPECT_EQ(LogSafe("a\r\tb"), "a\\r\\tb");
  EXPECT_EQ(LogSafe("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(LogSafe(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(LogSafe("del\x7f"), "del\\x7f");
  EXPECT_EQ(LogSafe("back\\slash"), "back\\\\slash") << "so an escape cannot be faked";
}

TEST(LogSafeTest, InvalidUtf8AndReorderingCharactersAreEscaped) {
  EXPECT_EQ(LogSafe("bad\xff\xc3"), "bad\\xff\\xc3");
  EXPECT_EQ(LogSafe("\xc0\xaf"), "\\xc0\\xaf") << "overlong encoding";
  EXPECT_EQ(LogSafe("a\xe2\x80\xa8"
                    "b"),
            "a\\u{2028}b");
  EXPECT_EQ(LogSafe("\xe2\x80\xae"
                    "evil"),
            "\\u{202e}evil");
  EXPECT_EQ(LogSafe("\xc2\x9b"
                    "31m"),
            "\\u{009b}31m")
      << "C1 CSI";
}

TEST(LogSafeTest, LongTextIsCutAtACharacterBoundary) {
  EXPECT_EQ(LogSafe(std::string(10, 'a'), 4), "aaaa...(6 more bytes)");
  EXPECT_EQ(LogSafe("ab\xc3\xa8", 3), "ab...(2 more bytes)");
  EXPECT_EQ(LogSafe(std::string(5000, 'x')).size(),
            1024 + std::string("...(3976 more bytes)").size());
}

}  // namespace
}  // namespace shoal
