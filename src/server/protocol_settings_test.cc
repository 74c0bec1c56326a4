#include "server/protocol_settings.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "core/log_settings.h"

namespace shoal::server {
namespace {

TEST(LogSettingsTest, ReadsAndSetsTheLoggerLevel) {
  spdlog::set_level(spdlog::level::info);
  SetLogVerboseLevel(0);
  LogSettingsMap s = CurrentLogSettings();
  EXPECT_EQ(std::get<bool>(s["log_info"]), true);
  EXPECT_EQ(std::get<uint32_t>(s["log_verbose_level"]), 0u);
  EXPECT_EQ(std::get<std::string>(s["log_format"]), "ISO8601");

  ASSERT_TRUE(UpdateLogSettings({{"log_info", false}}).ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
  EXPECT_EQ(std::get<bool>(CurrentLogSettings()["log_info"]), false);

  ASSERT_TRUE(UpdateLogSettings({{"log_info", true}, {"log_verbose_level", uint32_t{2}}}).ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::debug);
  EXPECT_EQ(GetLogVerboseLevel(), 2u);

  ASSERT_TRUE(UpdateLogSettings({{"log_verbose_level", uint32_t{0}}}).ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::info);
  EXPECT_EQ(GetLogVerboseLevel(), 0u);
}

TEST(LogSettingsTest, RefusesWhatItCannotHonourAndChangesNothing) {
  spdlog::set_level(spdlog::level::info);
  Status unknown = UpdateLogSettings({{"log_info", false}, {"log_colour", true}});
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("log_colour"), std::string::npos);
  EXPECT_EQ(spdlog::get_level(), spdlog::level::info);
  EXPECT_EQ(UpdateLogSettings({{"log_file", std::string("/tmp/x.log")}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(UpdateLogSettings({{"log_format", std::string("default")}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(UpdateLogSettings({{"log_info", uint32_t{1}}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(UpdateLogSettings({{"log_warning", false}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spdlog::get_level(), spdlog::level::info);
}

TEST(TraceSettingsTest, GlobalAndModelSettings) {
  TraceSettings t;
  auto g = t.Get("");
  EXPECT_EQ(g["trace_level"], std::vector<std::string>{"OFF"});
  EXPECT_EQ(g["trace_rate"], std::vector<std::string>{"1000"});
  auto set = t.Apply("", {{"trace_rate", std::vector<std::string>{"50"}}});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ((*set)["trace_rate"], std::vector<std::string>{"50"});
  auto m = t.Apply("m", {{"trace_count", std::vector<std::string>{"10"}}});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)["trace_rate"], std::vector<std::string>{"50"});  // from the global one
  EXPECT_EQ((*m)["trace_count"], std::vector<std::string>{"10"});
  EXPECT_EQ(t.Get("")["trace_count"], std::vector<std::string>{"-1"});
  ASSERT_TRUE(t.Apply("m", {{"trace_count", std::nullopt}}).ok());
  EXPECT_EQ(t.Get("m")["trace_count"], std::vector<std::string>{"-1"});
}

TEST(TraceSettingsTest, RefusesToEnableTracing) {
  TraceSettings t;
  auto on = t.Apply("", {{"trace_level", std::vector<std::string>{"TIMESTAMPS"}}});
  EXPECT_EQ(on.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(on.status().message().find("does not produce traces"), std::string::npos);
  EXPECT_TRUE(t.Apply("", {{"trace_level", std::vector<std::string>{"OFF"}}}).ok());
  EXPECT_EQ(t.Apply("", {{"trace_rate", std::vector<std::string>{"0"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Apply("", {{"trace_mode", std::vector<std::string>{"x"}}}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::server
