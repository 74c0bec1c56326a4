// HttpCore over TLS: requests and answers of every size through the TLS session,
// pipelining (bytes the session holds that epoll cannot see), plain HTTP and garbage on
// the TLS port, handshake and header deadlines, the connection cap, mutual TLS.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "server/http_core.h"
#include "server/http_test_client.h"

namespace shoal::server {
namespace {

using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;
using shoal::testing::TlsClientOptions;
using ::testing::HasSubstr;

std::string TestData(const std::string& name) {
  const char* dir = std::getenv("SHOAL_SOURCE_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/src/server/testdata/tls/" + name;
}

// "/echo" answers with the body; "/big" with ?n bytes; anything else with the body's size.
class EchoHandler : public HttpHandler {
 public:
  std::function<void()> Handle(HttpRequest request, HttpResponder responder) override {
    if (request.head.path == "/echo") {
      responder.Send(proto::HttpResponse::Json(200, std::string(request.body_view())));
    } else if (request.head.path == "/big") {
      responder.Send(
          proto::HttpResponse::Json(200, std::string(std::stoul(request.head.query), 'b')));
    } else {
      responder.Send(proto::HttpResponse::Json(200, std::to_string(request.body->size())));
    }
    return {};
  }
};

std::unique_ptr<HttpCore> StartTlsCore(HttpCoreOptions options, HttpHandler* handler,
                                       const std::string& ca_file = "") {
  options.address = "127.0.0.1";
  auto tls = TlsContext::Create({TestData("server.pem"), TestData("server.key"), ca_file});
  EXPECT_TRUE(tls.ok()) << tls.status().ToString();
  if (!tls.ok()) return nullptr;
  options.tls = *tls;
  auto core = HttpCore::Start(options, handler);
  EXPECT_TRUE(core.ok()) << core.status().ToString();
  return core.ok() ? std::move(core).value() : nullptr;
}

TlsClientOptions Trusting() {
  TlsClientOptions o;
  o.ca_file = TestData("ca.pem");
  return o;
}

// A plain TCP connection, to speak something other than TLS to the TLS port.
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
  // Everything the server sends until it closes; "<timeout>" appended if it does not
  // close within timeout_ms.
  std::string ReadToClose(int timeout_ms = 20000) {
    std::string out;
    char buf[4096];
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return out + "<timeout>";
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

TEST(HttpCoreTlsTest, ServesKeepAliveRequestsOverTls) {
  EchoHandler handler;
  auto core = StartTlsCore(HttpCoreOptions(), &handler);
  ASSERT_NE(core, nullptr);
  HttpTestClient client("127.0.0.1", core->port(), Trusting());
  for (int i = 0; i < 3; ++i) {
    HttpReply r = client.Post("/echo", "hello " + std::to_string(i));
    ASSERT_EQ(r.status, 200) << client.tls_error();
    EXPECT_EQ(r.body, "hello " + std::to_string(i));
  }
  EXPECT_EQ(client.connects(), 1) << "one TLS connection, kept alive";
}

TEST(HttpCoreTlsTest, LargeBodiesGoThroughManyRecordsBothWays) {
  EchoHandler handler;
  auto core = StartTlsCore(HttpCoreOptions(), &handler);
  ASSERT_NE(core, nullptr);
  HttpTestClient client("127.0.0.1", core->port(), Trusting());
  std::string body(3 << 20, '\0');
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 131 + (i >> 12));
  HttpReply r = client.Post("/echo", body);
  ASSERT_EQ(r.status, 200) << client.tls_error();
  EXPECT_TRUE(r.body == body) << "echoed " << r.body.size() << " of " << body.size() << " bytes";
  HttpReply big = client.Get("/big?" + std::to_string(8 << 20));
  ASSERT_EQ(big.status, 200);
  EXPECT_EQ(big.body.size(), size_t{8} << 20);
  EXPECT_EQ(client.connects(), 1);
}

TEST(HttpCoreTlsTest, PipelinedRequestsHeldInsideTheSessionAreAnswered) {
  EchoHandler handler;
  auto core = StartTlsCore(HttpCoreOptions(), &handler);
  ASSERT_NE(core, nullptr);
  HttpTestClient client("127.0.0.1", core->port(), Trusting());
  ASSERT_TRUE(client.Connect());
  // Three requests in one TLS record: the loop decrypts them together and must answer
  // all three, though the socket has nothing more to say after the first.
  std::string three;
  for (int i = 0; i < 3; ++i)
    three += "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: " + std::to_string(i + 1) +
             "\r\n\r\n" + std::string(i + 1, 'p');
  ASSERT_TRUE(client.SendRaw(three));
  for (int i = 0; i < 3; ++i) {
    HttpReply r = client.ReadReply(5000);
    ASSERT_EQ(r.status, 200) << "reply " << i;
    EXPECT_EQ(r.body, std::to_string(i + 1));
  }
}

TEST(HttpCoreTlsTest, PlainHttpOnTheTlsPortGets400AndTheLoopGoesOn) {
  EchoHandler handler;
  HttpCoreOptions options;
  options.threads = 1;  // one loop: a stuck loop would stall the TLS client below
  auto core = StartTlsCore(options, &handler);
  ASSERT_NE(core, nullptr);
  RawConnection plain(core->port());
  ASSERT_TRUE(plain.connected());
  ASSERT_TRUE(plain.Send("GET /x HTTP/1.1\r\nHost: h\r\n\r\n"));
  const std::string answer = plain.ReadToClose();
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 400 Bad Request"));
  EXPECT_THAT(answer, HasSubstr("this port speaks HTTPS"));
  EXPECT_THAT(answer, ::testing::Not(HasSubstr("<timeout>")));

  RawConnection junk(core->port());
  ASSERT_TRUE(junk.Send(std::string(300, '\x16') + "\x03\x03 not a handshake"));
  EXPECT_EQ(junk.ReadToClose(), "") << "closed without an answer";

  HttpTestClient client("127.0.0.1", core->port(), Trusting());
  EXPECT_EQ(client.Get("/x").status, 200) << client.tls_error();
}

TEST(HttpCoreTlsTest, HandshakeAndHeadDeadlinesHoldForTls) {
  EchoHandler handler;
  HttpCoreOptions options;
  options.threads = 1;
  options.header_timeout_ms = 300;
  auto core = StartTlsCore(options, &handler);
  ASSERT_NE(core, nullptr);
  // Connects and never starts the handshake: closed after the head deadline.
  RawConnection silent(core->port());
  ASSERT_TRUE(silent.connected());
  EXPECT_EQ(silent.ReadToClose(10000), "");

  // Handshakes, then trickles a head that never ends: 408, over TLS.
  HttpTestClient slow("127.0.0.1", core->port(), Trusting());
  ASSERT_TRUE(slow.Connect()) << slow.tls_error();
  ASSERT_TRUE(slow.SendRaw("GET /x HTTP/1.1\r\nHost: h\r\n"));
  HttpReply r = slow.ReadReply(10000);
  EXPECT_EQ(r.status, 408);
  EXPECT_TRUE(r.server_closed);
}

TEST(HttpCoreTlsTest, IdleAndBodyDeadlinesHoldForTls) {
  EchoHandler handler;
  HttpCoreOptions options;
  options.threads = 1;
  options.idle_timeout_ms = 200;
  options.body_timeout_ms = 300;
  auto core = StartTlsCore(options, &handler);
  ASSERT_NE(core, nullptr);
  HttpTestClient idle("127.0.0.1", core->port(), Trusting());
  ASSERT_EQ(idle.Get("/x").status, 200) << idle.tls_error();
  EXPECT_TRUE(idle.WaitForClose(10000)) << "an idle TLS keep-alive connection is closed";

  HttpTestClient slow("127.0.0.1", core->port(), Trusting());
  ASSERT_TRUE(slow.Connect()) << slow.tls_error();
  ASSERT_TRUE(slow.SendRaw("POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc"));
  HttpReply r = slow.ReadReply(10000);
  EXPECT_EQ(r.status, 408) << "the body never completed";
  EXPECT_TRUE(r.server_closed);
}

TEST(HttpCoreTlsTest, BodyLimitAndConnectionCapHoldForTls) {
  EchoHandler handler;
  HttpCoreOptions options;
  options.threads = 1;
  options.max_connections = 2;
  options.max_body_bytes = 1000;
  options.receiving_body_budget_bytes = 1000;
  auto core = StartTlsCore(options, &handler);
  ASSERT_NE(core, nullptr);
  HttpTestClient a("127.0.0.1", core->port(), Trusting());
  EXPECT_EQ(a.Post("/x", std::string(2000, 'x')).status, 413);

  HttpTestClient first("127.0.0.1", core->port(), Trusting());
  HttpTestClient second("127.0.0.1", core->port(), Trusting());
  ASSERT_EQ(first.Get("/x").status, 200);
  ASSERT_EQ(second.Get("/x").status, 200);
  HttpTestClient newcomer("127.0.0.1", core->port(), Trusting());
  EXPECT_EQ(newcomer.Get("/x").status, 200) << newcomer.tls_error();
  EXPECT_TRUE(first.WaitForClose(20000)) << "the oldest idle TLS connection made room";
  EXPECT_EQ(second.Get("/x").status, 200);
  EXPECT_EQ(second.connects(), 1);
}

TEST(HttpCoreTlsTest, MutualTlsNeedsAClientCertificateTheCaSigned) {
  EchoHandler handler;
  auto core = StartTlsCore(HttpCoreOptions(), &handler, TestData("ca.pem"));
  ASSERT_NE(core, nullptr);
  TlsClientOptions with_cert = Trusting();
  with_cert.cert_file = TestData("client.pem");
  with_cert.key_file = TestData("client.key");
  HttpTestClient good("127.0.0.1", core->port(), with_cert);
  EXPECT_EQ(good.Get("/x").status, 200) << good.tls_error();

  HttpTestClient none("127.0.0.1", core->port(), Trusting());
  EXPECT_EQ(none.Get("/x").status, 0) << "no client certificate, no answer";

  TlsClientOptions untrusted = Trusting();
  untrusted.cert_file = TestData("other.pem");
  untrusted.key_file = TestData("other.key");
  HttpTestClient stranger("127.0.0.1", core->port(), untrusted);
  EXPECT_EQ(stranger.Get("/x").status, 0) << "a certificate the CA did not sign";
}

TEST(HttpCoreTlsTest, AClientThatDoesNotTrustTheServerNeverSendsARequest) {
  EchoHandler handler;
  auto core = StartTlsCore(HttpCoreOptions(), &handler);
  ASSERT_NE(core, nullptr);
  TlsClientOptions other_ca;
  other_ca.ca_file = TestData("other.pem");
  HttpTestClient client("127.0.0.1", core->port(), other_ca);
  EXPECT_EQ(client.Get("/x").status, 0);
  EXPECT_THAT(client.tls_error(), HasSubstr("certificate"));
}

}  // namespace
}  // namespace shoal::server
