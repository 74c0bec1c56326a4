#include "server/request_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>

namespace shoal::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Routes spdlog's default logger into a string for the test's lifetime.
class RequestLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%l %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("request_log_test", sink));
  }
  void TearDown() override {
    SetLogVerboseLevel(0);
    spdlog::set_default_logger(previous_);
  }
  std::string text() const { return out_.str(); }

  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

RequestLogEntry Entry(Status status) {
  RequestLogEntry e;
  e.protocol = "HTTP";
  e.model = "resnet";
  e.version = 3;
  e.id = "req-7";
  e.status = std::move(status);
  e.queue_ns = 12'000;
  e.compute_ns = 40'000;
  e.total_ns = 81'000;
  return e;
}

TEST_F(RequestLogTest, QuietAtLevelZeroExceptForInternalErrors) {
  SetLogVerboseLevel(0);
  LogRequest(Entry(Status::Ok()));
  LogRequest(Entry(NotFound("no such model")));
  EXPECT_EQ(text(), "");
  LogRequest(Entry(Internal("backend crashed")));
  EXPECT_THAT(text(), HasSubstr("error internal error answering a HTTP request for model "
                                "'resnet' version 3: backend crashed"));
}

TEST_F(RequestLogTest, OneDebugLinePerRequestAtLevelOne) {
  SetLogVerboseLevel(1);
  EXPECT_EQ(LogVerboseLevel(), 1);
  LogRequest(Entry(Status::Ok()));
  EXPECT_EQ(text(),
            "debug request model 'resnet' version 3 id 'req-7' over HTTP: OK; queue 12 us, "
            "compute 40 us, total 81 us\n");
  LogRequest(Entry(Unavailable("model 'resnet' is not ready")));
  EXPECT_THAT(text(), HasSubstr("over HTTP: UNAVAILABLE (model 'resnet' is not ready)"));
}

TEST_F(RequestLogTest, UntrustedTextCannotForgeLines) {
  SetLogVerboseLevel(1);
  RequestLogEntry e = Entry(Internal("boom\nerror forged"));
  e.model = "m\nerror forged line";
  e.id = "id\r\n";
  LogRequest(e);
  const std::string t = text();
  EXPECT_THAT(t, Not(HasSubstr("\nerror forged")));
  EXPECT_THAT(t, HasSubstr("m\\nerror forged line"));
  EXPECT_THAT(t, HasSubstr("id\\r\\n"));
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 2) << t;  // the error and the debug line
}

TEST_F(RequestLogTest, InternalErrorsOfOtherRoutes) {
  LogInternalError("HTTP", "m", NotFound("no model"));
  EXPECT_EQ(text(), "");
  LogInternalError("HTTP", "m\n", Internal("cannot render"));
  EXPECT_EQ(text(),
            "error internal error answering a HTTP request for model 'm\\n': cannot render\n");
}

TEST_F(RequestLogTest, LevelChangesAtRunTime) {
  SetLogVerboseLevel(2);
  LogRequest(Entry(Status::Ok()));
  SetLogVerboseLevel(0);
  LogRequest(Entry(Status::Ok()));
  const std::string t = text();
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 1) << t;
}

}  // namespace
}  // namespace shoal::server
