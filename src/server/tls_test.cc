// TlsContext and TlsSession without HttpCore: file checks, and one session over a
// socketpair against an OpenSSL client on another thread.
#include "server/tls.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

namespace shoal::server {
namespace {

using ::testing::HasSubstr;

std::string TestData(const std::string& name) {
  const char* dir = std::getenv("SHOAL_SOURCE_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/src/server/testdata/tls/" + name;
}

TlsOptions ServerFiles() { return {TestData("server.pem"), TestData("server.key"), ""}; }

TEST(TlsContextTest, LoadsAMatchingCertificateAndKey) {
  auto ctx = TlsContext::Create(ServerFiles());
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  EXPECT_FALSE((*ctx)->requires_client_certificate());
  TlsOptions mutual = ServerFiles();
  mutual.ca_file = TestData("ca.pem");
  auto m = TlsContext::Create(mutual);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE((*m)->requires_client_certificate());

  auto files = LoadTlsFiles(mutual);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_THAT(files->cert_pem, HasSubstr("-----BEGIN CERTIFICATE-----"));
  EXPECT_THAT(files->key_pem, HasSubstr("PRIVATE KEY-----"));
  EXPECT_THAT(files->ca_pem, HasSubstr("-----BEGIN CERTIFICATE-----"));
}

TEST(TlsContextTest, RefusesMissingInvalidAndMismatchedFilesNamingThem) {
  TlsOptions missing = ServerFiles();
  missing.cert_file = TestData("absent.pem");
  auto a = TlsContext::Create(missing);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("absent.pem"));
  EXPECT_THAT(a.status().message(), HasSubstr("No such file"));

  TlsOptions not_pem = ServerFiles();
  not_pem.cert_file = TestData("README.md");
  auto b = TlsContext::Create(not_pem);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("README.md' holds no valid PEM certificate"));

  TlsOptions key_not_pem = ServerFiles();
  key_not_pem.key_file = TestData("server.pem");
  auto c = TlsContext::Create(key_not_pem);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("holds no valid PEM private key"));

  TlsOptions mismatched = ServerFiles();
  mismatched.key_file = TestData("other.key");
  auto d = TlsContext::Create(mismatched);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("does not match the certificate"));

  TlsOptions bad_ca = ServerFiles();
  bad_ca.ca_file = TestData("server.key");
  auto e = TlsContext::Create(bad_ca);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("the TLS CA file"));

  EXPECT_FALSE(LoadTlsFiles(mismatched).ok()) << "gRPC gets the same checks";
  EXPECT_FALSE(TlsContext::Create(TlsOptions{}).ok());
}

// A socketpair: the server end non-blocking, the client end blocking.
struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    server = fds[0];
    client = fds[1];
    fcntl(server, F_SETFL, fcntl(server, F_GETFL) | O_NONBLOCK);
  }
  ~Pair() {
    close(server);
    close(client);
  }
  int server;
  int client;
};

// Drives `step` until it stops asking for the socket, waiting for what it asks.
template <typename Step>
TlsSession::Io Drive(int fd, Step step) {
  for (int i = 0; i < 1000; ++i) {
    const TlsSession::Io io = step();
    if (io != TlsSession::Io::kWantRead && io != TlsSession::Io::kWantWrite) return io;
    pollfd p{fd, static_cast<short>(io == TlsSession::Io::kWantRead ? POLLIN : POLLOUT), 0};
    poll(&p, 1, 5000);
  }
  return TlsSession::Io::kError;
}

TEST(TlsSessionTest, HandshakesReadsWritesAndSendsCloseNotify) {
  auto ctx = TlsContext::Create(ServerFiles());
  ASSERT_TRUE(ctx.ok());
  Pair pair;
  auto session = TlsSession::Create(**ctx, pair.server);
  ASSERT_NE(session, nullptr);

  // The client: handshake, a 40 KiB request (three records), read the answer, then
  // expect close_notify.
  const std::string request(40 << 10, 'q');
  std::string answer;
  bool client_saw_close_notify = false;
  std::thread client([&] {
    SSL_CTX* cctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(cctx, TestData("ca.pem").c_str(), nullptr);
    SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, nullptr);
    SSL* ssl = SSL_new(cctx);
    SSL_set_fd(ssl, pair.client);
    SSL_set1_host(ssl, "localhost");
    if (SSL_connect(ssl) == 1 && SSL_write(ssl, request.data(), static_cast<int>(request.size())) ==
                                     static_cast<int>(request.size())) {
      char buf[4096];
      while (answer.size() < 5) {
        const int n = SSL_read(ssl, buf, sizeof(buf));
        if (n <= 0) break;
        answer.append(buf, static_cast<size_t>(n));
      }
      const int n = SSL_read(ssl, buf, sizeof(buf));
      client_saw_close_notify = n == 0 && SSL_get_error(ssl, n) == SSL_ERROR_ZERO_RETURN;
    }
    SSL_free(ssl);
    SSL_CTX_free(cctx);
  });

  EXPECT_FALSE(session->handshake_done());
  ASSERT_EQ(Drive(pair.server, [&] { return session->Handshake(); }), TlsSession::Io::kOk)
      << session->error();
  EXPECT_TRUE(session->handshake_done());

  // Read in small pieces: what a record holds beyond them waits inside the session,
  // where only HasPending can see it.
  std::string got;
  bool saw_pending = false;
  while (got.size() < request.size()) {
    char buf[1000];
    size_t n = 0;
    ASSERT_EQ(Drive(pair.server, [&] { return session->Read(buf, sizeof(buf), &n); }),
              TlsSession::Io::kOk)
        << session->error();
    got.append(buf, n);
    saw_pending = saw_pending || session->HasPending();
  }
  EXPECT_EQ(got, request);
  EXPECT_TRUE(saw_pending);
  EXPECT_FALSE(session->HasPending());

  size_t written = 0;
  ASSERT_EQ(Drive(pair.server, [&] { return session->Write("hello", 5, &written); }),
            TlsSession::Io::kOk);
  EXPECT_EQ(written, 5u);
  session->Shutdown();
  client.join();
  EXPECT_EQ(answer, "hello");
  EXPECT_TRUE(client_saw_close_notify);
}

TEST(TlsSessionTest, RecognisesPlainHttpSentToATlsPort) {
  auto ctx = TlsContext::Create(ServerFiles());
  ASSERT_TRUE(ctx.ok());
  Pair pair;
  auto session = TlsSession::Create(**ctx, pair.server);
  const std::string plain = "GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(write(pair.client, plain.data(), plain.size()), static_cast<ssize_t>(plain.size()));
  EXPECT_EQ(Drive(pair.server, [&] { return session->Handshake(); }), TlsSession::Io::kError);
  EXPECT_TRUE(session->plaintext_http());
  EXPECT_FALSE(session->handshake_done());
  session->Shutdown();  // after an error: nothing sent, no crash
}

TEST(TlsSessionTest, GarbageAndEofFailTheHandshakeWithoutPlainHttp) {
  auto ctx = TlsContext::Create(ServerFiles());
  ASSERT_TRUE(ctx.ok());
  {
    Pair pair;
    auto session = TlsSession::Create(**ctx, pair.server);
    const std::string junk(64, '\x16');
    ASSERT_EQ(write(pair.client, junk.data(), junk.size()), 64);
    EXPECT_EQ(Drive(pair.server, [&] { return session->Handshake(); }), TlsSession::Io::kError);
    EXPECT_FALSE(session->plaintext_http());
    EXPECT_FALSE(session->error().empty());
  }
  {
    Pair pair;
    auto session = TlsSession::Create(**ctx, pair.server);
    shutdown(pair.client, SHUT_WR);
    const TlsSession::Io io = Drive(pair.server, [&] { return session->Handshake(); });
    EXPECT_TRUE(io == TlsSession::Io::kClosed || io == TlsSession::Io::kError);
  }
}

}  // namespace
}  // namespace shoal::server
