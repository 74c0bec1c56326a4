// HttpCore's start-up failures: a clear error, never a crash.
#include "server/http_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shoal::server {
namespace {

using ::testing::HasSubstr;

// A port another listener holds is an UNAVAILABLE error naming the address. (The
// destructor of the half-built core once read counters that were created only after
// the listener, so this crashed the server instead of reporting the clash.)
TEST(HttpCoreTest, PortInUseIsAnErrorNamingTheAddress) {
  HttpCoreOptions options;
  options.address = "127.0.0.1";
  options.threads = 1;
  auto first = HttpCore::Start(options, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  options.port = (*first)->port();
  auto second = HttpCore::Start(options, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(options.port)));
  // The first core is unaffected and stops cleanly.
  EXPECT_EQ((*first)->open_connections(), 0);
}

TEST(HttpCoreTest, BadOptionsAreRefusedBeforeListening) {
  HttpCoreOptions options;
  options.address = "127.0.0.1";
  options.threads = 0;
  auto core = HttpCore::Start(options, nullptr);
  ASSERT_FALSE(core.ok());
  EXPECT_THAT(core.status().message(), HasSubstr("HTTP threads must be at least 1; was 0"));
  options.threads = 1;
  options.address = "not an address";
  core = HttpCore::Start(options, nullptr);
  ASSERT_FALSE(core.ok());
  EXPECT_THAT(core.status().message(), HasSubstr("cannot resolve listen address"));
}

}  // namespace
}  // namespace shoal::server
