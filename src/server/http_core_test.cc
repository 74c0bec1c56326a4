// HttpCore: start-up failures (a clear error, never a crash) and the bounds it keeps
// against clients that hold resources: body memory, total head and body deadlines, the
// connection cap.
#include "server/http_core.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "server/http_test_client.h"

namespace shoal::server {
namespace {

using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;
using ::testing::HasSubstr;

// Polls `done` until it holds (true) or 20 s pass (false).
template <typename Pred>
bool WaitUntil(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Answers "/hold" only when the test releases it; anything else at once with 200 and
// the body's size.
class TestHandler : public HttpHandler {
 public:
  std::function<void()> Handle(HttpRequest request, HttpResponder responder) override {
    if (request.head.path == "/hold") {
      MutexLock lock(&mu_);
      held_.push_back(responder);
      return {};
    }
    responder.Send(proto::HttpResponse::Json(200, std::to_string(request.body->size())));
    return {};
  }
  size_t held() {
    MutexLock lock(&mu_);
    return held_.size();
  }
  void ReleaseOne() {
    MutexLock lock(&mu_);
    held_.front().Send(proto::HttpResponse::Json(200, "released"));
    held_.erase(held_.begin());
  }

 private:
  Mutex mu_;
  std::vector<HttpResponder> held_ GUARDED_BY(mu_);
};

// A bare loopback connection, for clients that misbehave in ways HttpTestClient won't.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { close(fd_); }
  bool connected() const { return connected_; }
  bool Send(std::string_view bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Waits up to timeout_ms for the server to send something or close.
  bool Readable(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, timeout_ms) > 0;
  }
  // Everything the server sends until it closes (at most 20 s).
  std::string ReadToClose() {
    std::string out;
    char buf[4096];
    while (Readable(20000)) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::unique_ptr<HttpCore> StartCore(HttpCoreOptions options, HttpHandler* handler) {
  options.address = "127.0.0.1";
  auto core = HttpCore::Start(options, handler);
  EXPECT_TRUE(core.ok()) << core.status().ToString();
  return core.ok() ? std::move(core).value() : nullptr;
}

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

// Heads that declare large bodies and send none once made the server allocate (and
// zero) each whole body up front: 20 such connections at 60 MB took ~1.2 GB. A body now
// holds only its first piece until its bytes arrive.
TEST(HttpCoreTest, HeadsAloneReserveOnlyTheFirstPieceOfTheirBodies) {
  TestHandler handler;
  HttpCoreOptions options;
  options.threads = 2;
  auto core = StartCore(options, &handler);
  ASSERT_NE(core, nullptr);
  std::vector<std::unique_ptr<RawConnection>> clients;
  for (int i = 0; i < 20; ++i) {
    clients.push_back(std::make_unique<RawConnection>(core->port()));
    ASSERT_TRUE(clients.back()->connected());
    ASSERT_TRUE(clients.back()->Send("POST /x HTTP/1.1\r\nContent-Length: 60000000\r\n\r\n"));
  }
  constexpr int64_t kFirstPiece = 64 << 10;
  ASSERT_TRUE(WaitUntil([&] { return core->receiving_body_bytes() >= 20 * kFirstPiece; }))
      << core->receiving_body_bytes();
  EXPECT_EQ(core->receiving_body_bytes(), 20 * kFirstPiece);
  // A body that does arrive is received whole, growing as it comes.
  HttpTestClient client("127.0.0.1", core->port());
  const std::string body(3 << 20, 'b');
  HttpReply r = client.Post("/x", body);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, std::to_string(body.size()));
  clients.clear();
  EXPECT_TRUE(WaitUntil([&] { return core->receiving_body_bytes() == 0; }));
}

// Bodies being received share one budget; a body that would go past it gets 503 with
// Retry-After, and the others go on.
TEST(HttpCoreTest, BodiesPastTheReceivingBudgetGet503) {
  TestHandler handler;
  HttpCoreOptions options;
  options.threads = 1;
  options.max_body_bytes = 1 << 20;
  options.receiving_body_budget_bytes = 1 << 20;
  auto core = StartCore(options, &handler);
  ASSERT_NE(core, nullptr);
  RawConnection first(core->port());
  ASSERT_TRUE(
      first.Send("POST /x HTTP/1.1\r\nConnection: close\r\nContent-Length: 1048576\r\n\r\n"));
  ASSERT_TRUE(first.Send(std::string(600 << 10, 'a')));  // its buffer doubles to 1 MiB
  ASSERT_TRUE(WaitUntil([&] { return core->receiving_body_bytes() == (1 << 20); }));
  HttpTestClient second("127.0.0.1", core->port());
  HttpReply refused = second.Post("/x", std::string(100, 'c'));
  EXPECT_EQ(refused.status, 503);
  EXPECT_THAT(refused.body, HasSubstr("too many request bodies"));
  ASSERT_NE(refused.Header("retry-after"), nullptr);
  EXPECT_TRUE(first.Send(std::string((1 << 20) - (600 << 10), 'a')));
  EXPECT_THAT(first.ReadToClose(), HasSubstr("\r\n\r\n1048576"));
  EXPECT_EQ(second.Post("/x", std::string(100, 'c')).status, 200);
}

// A head that trickles in a byte at a time is cut off when its total deadline passes:
// the bytes do not reset it (they once reset a 60 s timeout, holding a connection open
// for as long as the client cared to trickle).
TEST(HttpCoreTest, TricklingHeadHitsItsTotalDeadline) {
  TestHandler handler;
  HttpCoreOptions options;
  options.threads = 1;
  options.header_timeout_ms = 300;
  auto core = StartCore(options, &handler);
  ASSERT_NE(core, nullptr);
  RawConnection slow(core->port());
  ASSERT_TRUE(slow.Send("GET /x HTTP/1.1\r\nX-Slow: "));
  // One byte every 50 ms (the wait for an answer paces the sender), for up to 20 s.
  bool answered = false;
  for (int i = 0; i < 400 && !answered; ++i) {
    answered = slow.Readable(50);
    if (!answered) ASSERT_TRUE(slow.Send("a"));
  }
  ASSERT_TRUE(answered);
  const std::string reply = slow.ReadToClose();
  EXPECT_THAT(reply, HasSubstr("HTTP/1.1 408"));
  EXPECT_THAT(reply, HasSubstr("not complete within 300 ms"));
  // A prompt client is not affected.
  HttpTestClient client("127.0.0.1", core->port());
  EXPECT_EQ(client.Get("/x").status, 200);
}

TEST(HttpCoreTest, TricklingBodyHitsItsTotalDeadline) {
  TestHandler handler;
  HttpCoreOptions options;
  options.threads = 1;
  options.body_timeout_ms = 300;
  auto core = StartCore(options, &handler);
  ASSERT_NE(core, nullptr);
  RawConnection slow(core->port());
  ASSERT_TRUE(slow.Send("POST /x HTTP/1.1\r\nContent-Length: 100000\r\n\r\n"));
  bool answered = false;
  for (int i = 0; i < 400 && !answered; ++i) {
    answered = slow.Readable(50);
    if (!answered) ASSERT_TRUE(slow.Send("a"));
  }
  ASSERT_TRUE(answered);
  const std::string reply = slow.ReadToClose();
  EXPECT_THAT(reply, HasSubstr("HTTP/1.1 408"));
  EXPECT_THAT(reply, HasSubstr("request body was not complete within 300 ms"));
  EXPECT_TRUE(WaitUntil([&] { return core->receiving_body_bytes() == 0; }));
}

// Idle connections holding every slot once locked every new client out (10,000 of them
// did, by default). At the cap, the oldest idle connection now makes room.
TEST(HttpCoreTest, AtTheCapTheOldestIdleConnectionMakesRoom) {
  TestHandler handler;
  HttpCoreOptions options;
  options.threads = 1;
  options.max_connections = 3;
  auto core = StartCore(options, &handler);
  ASSERT_NE(core, nullptr);
  std::vector<std::unique_ptr<HttpTestClient>> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(std::make_unique<HttpTestClient>("127.0.0.1", core->port()));
    // A request and its answer make each connection idle in a known order.
    ASSERT_EQ(idle.back()->Get("/x").status, 200);
  }
  ASSERT_EQ(core->open_connections(), 3);
  HttpTestClient newcomer("127.0.0.1", core->port());
  EXPECT_EQ(newcomer.Get("/x").status, 200);
  EXPECT_TRUE(idle[0]->WaitForClose(20000));  // the oldest made room
  EXPECT_EQ(core->open_connections(), 3);
  // The younger ones are still open: they answer on the same connection.
  EXPECT_EQ(idle[2]->Get("/x").status, 200);
  EXPECT_EQ(idle[2]->connects(), 1);
}

// With every connection busy, a new client is not refused: it waits (in the listen
// backlog) and gets in as soon as one goes idle.
TEST(HttpCoreTest, AtTheCapWithAllBusyANewClientWaitsForAnIdleOne) {
  TestHandler handler;
  HttpCoreOptions options;
  options.threads = 1;
  options.max_connections = 2;
  auto core = StartCore(options, &handler);
  ASSERT_NE(core, nullptr);
  HttpTestClient a("127.0.0.1", core->port()), b("127.0.0.1", core->port());
  ASSERT_TRUE(a.SendRaw("GET /hold HTTP/1.1\r\n\r\n"));
  ASSERT_TRUE(b.SendRaw("GET /hold HTTP/1.1\r\n\r\n"));
  ASSERT_TRUE(WaitUntil([&] { return handler.held() == 2; }));
  HttpTestClient c("127.0.0.1", core->port());
  ASSERT_TRUE(c.SendRaw("GET /x HTTP/1.1\r\n\r\n"));
  handler.ReleaseOne();
  EXPECT_EQ(a.ReadReply().status, 200);
  HttpReply r = c.ReadReply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(c.connects(), 1);
  EXPECT_TRUE(a.WaitForClose(20000));  // idle once answered: it made room
  handler.ReleaseOne();
  EXPECT_EQ(b.ReadReply().status, 200);
}

TEST(HttpCoreTest, RefusesTimeoutsCapsAndBudgetsThatCannotWork) {
  HttpCoreOptions options;
  options.address = "127.0.0.1";
  options.threads = 4;
  options.max_connections = 3;
  auto core = HttpCore::Start(options, nullptr);
  ASSERT_FALSE(core.ok());
  EXPECT_THAT(core.status().message(),
              HasSubstr("max_connections must be at least the number of threads (4); was 3"));
  options.max_connections = 100;
  options.header_timeout_ms = 0;
  core = HttpCore::Start(options, nullptr);
  ASSERT_FALSE(core.ok());
  EXPECT_THAT(core.status().message(), HasSubstr("header_timeout_ms must be positive; was 0"));
  options.header_timeout_ms = 1000;
  options.receiving_body_budget_bytes = options.max_body_bytes - 1;
  core = HttpCore::Start(options, nullptr);
  ASSERT_FALSE(core.ok());
  EXPECT_THAT(core.status().message(), HasSubstr("receiving_body_budget_bytes must be at least"));
}

}  // namespace
}  // namespace shoal::server
