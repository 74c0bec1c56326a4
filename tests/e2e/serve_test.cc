// End-to-end tests of `shoal serve`'s start-up and connection options: every port is
// claimed before any model loads (a clash ends the process at once, naming the
// address), each service binds its own address, and the HTTP connection limits come
// from flags or the --config file.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/testing/plugin_configs.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using shoal::testing::HttpTestClient;
using ::testing::HasSubstr;
using ::testing::Not;

// A listening socket on 127.0.0.1:port, held for the test's length: another program
// that has the port.
class PortHolder {
 public:
  explicit PortHolder(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    holding_ =
        bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd_, 16) == 0;
  }
  ~PortHolder() { close(fd_); }
  bool holding() const { return holding_; }

 private:
  int fd_ = -1;
  bool holding_ = false;
};

class ServeE2eTest : public ::testing::Test {
 protected:
  ServeE2eTest() {
    repo_.WriteFile("identity/config.pbtxt", runtime::testing::kIdentityConfig);
    repo_.WriteFile("identity/1/.keep", "");
  }
  std::vector<std::string> Args(int http, int grpc, int metrics) const {
    return {"serve",
            "--model-repository",
            repo_.path(),
            "--http-port",
            std::to_string(http),
            "--grpc-port",
            std::to_string(grpc),
            "--metrics-port",
            std::to_string(metrics),
            "--backend-directory",
            BinaryDir() + "/backends"};
  }
  void TearDown() override {
    if (HasFailure() && process_) std::cerr << "---- shoal log ----\n" << process_->log() << "\n";
  }

  TempDir repo_;
  std::unique_ptr<ShoalProcess> process_;
};

// A port another program holds ends `shoal serve` with status 1 and one line naming
// the address, before the repository is even read (the clash was once reported only
// after every model had loaded), for each of the three services.
TEST_F(ServeE2eTest, PortClashExitsBeforeLoadingAndNamesTheAddress) {
  for (const char* service : {"HTTP", "gRPC", "metrics"}) {
    SCOPED_TRACE(service);
    const int http = FreePort(), grpc = FreePort(), metrics = FreePort();
    const std::string name = service;
    const int taken = name == "HTTP" ? http : name == "gRPC" ? grpc : metrics;
    PortHolder holder(taken);
    ASSERT_TRUE(holder.holding());
    std::vector<std::string> args = Args(http, grpc, metrics);
    args.insert(args.end(), {"--address", "127.0.0.1"});
    process_ = ShoalProcess::Start(args);
    ASSERT_NE(process_, nullptr);
    EXPECT_EQ(process_->Wait(), 1);
    const std::string log = process_->log();
    EXPECT_THAT(log, HasSubstr("cannot start the " + name +
                               " server on 127.0.0.1:" + std::to_string(taken) +
                               ": cannot listen on 127.0.0.1:" + std::to_string(taken) +
                               ": Address already in use"));
    EXPECT_THAT(log, Not(HasSubstr("loading model repository")));
    process_.reset();
  }
}

// --address is every service's default; --http-address, --grpc-address and
// --metrics-address override it one by one.
TEST_F(ServeE2eTest, EachServiceBindsItsOwnAddress) {
  const int http = FreePort(), grpc = FreePort(), metrics = FreePort();
  std::vector<std::string> args = Args(http, grpc, metrics);
  args.insert(args.end(), {"--address", "127.0.0.2", "--http-address", "127.0.0.1",
                           "--metrics-address", "127.0.0.3"});
  process_ = ShoalProcess::Start(args);
  ASSERT_NE(process_, nullptr);
  ASSERT_TRUE(process_->WaitForPort(http)) << process_->log();
  HttpTestClient on_http("127.0.0.1", http);
  EXPECT_EQ(on_http.Get("/v2/health/ready").status, 200);
  HttpTestClient on_metrics("127.0.0.3", metrics);
  EXPECT_EQ(on_metrics.Get("/metrics").status, 200);
  // Not on the addresses the others were given.
  HttpTestClient wrong("127.0.0.1", metrics);
  EXPECT_FALSE(wrong.Connect(200));
  const std::string log = process_->log();
  EXPECT_THAT(log, HasSubstr("HTTP service listening on 127.0.0.1:" + std::to_string(http)));
  EXPECT_THAT(log, HasSubstr("gRPC service listening on 127.0.0.2:" + std::to_string(grpc)));
  EXPECT_THAT(log, HasSubstr("metrics service listening on 127.0.0.3:" + std::to_string(metrics)));
  EXPECT_EQ(process_->Terminate(), 0);
}

// shoal runs itself again once so that libgomp reads its short spin (engine/
// omp_wait_policy.h): the process keeps its name and id, the variable is in the
// environment the program was started with, and the log says whose setting it is.
TEST_F(ServeE2eTest, EngineThreadsSpinBrieflyAndTheProcessKeepsItsName) {
  const int http = FreePort();
  process_ = ShoalProcess::Start(Args(http, FreePort(), FreePort()));
  ASSERT_NE(process_, nullptr);
  ASSERT_TRUE(process_->WaitForPort(http)) << process_->log();
  const std::string proc = "/proc/" + std::to_string(process_->pid());
  std::string comm;
  std::getline(std::ifstream(proc + "/comm"), comm);
  EXPECT_EQ(comm, "shoal");
  std::ifstream environ_file(proc + "/environ", std::ios::binary);
  std::string environ_text((std::istreambuf_iterator<char>(environ_file)),
                           std::istreambuf_iterator<char>());
  const std::string log = process_->log();
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr &&
      std::getenv("OMP_PROC_BIND") == nullptr && std::getenv("OMP_PLACES") == nullptr &&
      std::getenv("GOMP_CPU_AFFINITY") == nullptr) {
    EXPECT_THAT(environ_text, HasSubstr(std::string("GOMP_SPINCOUNT=1000") + '\0'));
    EXPECT_THAT(log, HasSubstr("engine threads wait for work with GOMP_SPINCOUNT=1000 "
                               "(shoal's default)"));
  } else {
    EXPECT_THAT(log, Not(HasSubstr("(shoal's default)")));
  }
  EXPECT_EQ(process_->Terminate(), 0);
}

// The HTTP connection options come from the --config file like any other: here a
// head deadline that a trickling client hits.
TEST_F(ServeE2eTest, HttpConnectionOptionsComeFromTheConfigFile) {
  const int http = FreePort();
  repo_.WriteFile("shoal.toml",
                  "[serve]\nhttp-header-timeout-ms = 300\nhttp-max-connections = 50\n");
  std::vector<std::string> args = Args(http, FreePort(), FreePort());
  args.insert(args.begin(), {"--config", repo_.path() + "/shoal.toml"});
  args.insert(args.end(), {"--address", "127.0.0.1"});
  process_ = ShoalProcess::Start(args);
  ASSERT_NE(process_, nullptr);
  ASSERT_TRUE(process_->WaitForPort(http)) << process_->log();
  HttpTestClient slow("127.0.0.1", http);
  ASSERT_TRUE(slow.SendRaw("GET /v2/health/live HTTP/1.1\r\nX-Slow: "));
  const shoal::testing::HttpReply r = slow.ReadReply();
  EXPECT_EQ(r.status, 408);
  EXPECT_THAT(r.body, HasSubstr("not complete within 300 ms"));
  EXPECT_EQ(process_->Terminate(), 0);
}

// Options that cannot work together are refused before any port or model.
TEST_F(ServeE2eTest, InconsistentHttpOptionsAreRefusedAtOnce) {
  std::vector<std::string> args = Args(FreePort(), FreePort(), FreePort());
  args.insert(args.end(), {"--http-thread-count", "4", "--http-max-connections", "2"});
  process_ = ShoalProcess::Start(args);
  ASSERT_NE(process_, nullptr);
  EXPECT_EQ(process_->Wait(), 1);
  EXPECT_THAT(process_->log(),
              HasSubstr("max_connections must be at least the number of threads (4); was 2"));
  EXPECT_THAT(process_->log(), Not(HasSubstr("loading model repository")));
}

}  // namespace
}  // namespace shoal::e2e
