#include "server/http_test_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

namespace shoal::testing {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Compress(std::string_view data, int window_bits) {
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, data.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// Waits until fd is readable (POLLIN) or writable (POLLOUT); false on timeout.
bool WaitFor(int fd, short events, int64_t deadline_ms) {
  while (true) {
    const int64_t left = deadline_ms - NowMs();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(left));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

std::string SslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

}  // namespace

HttpTestClient::HttpTestClient(std::string host, int port, TlsClientOptions tls)
    : host_(std::move(host)), port_(port), use_tls_(true), tls_(std::move(tls)) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!tls_.ca_file.empty()) SSL_CTX_load_verify_locations(ctx, tls_.ca_file.c_str(), nullptr);
  if (!tls_.cert_file.empty()) {
    SSL_CTX_use_certificate_chain_file(ctx, tls_.cert_file.c_str());
    SSL_CTX_use_PrivateKey_file(ctx, tls_.key_file.c_str(), SSL_FILETYPE_PEM);
  }
  ERR_clear_error();
  tls_ctx_ = ctx;
}

HttpTestClient::~HttpTestClient() {
  Close();
  if (tls_ctx_ != nullptr) SSL_CTX_free(static_cast<SSL_CTX*>(tls_ctx_));
}

bool HttpTestClient::Handshake() {
  tls_error_.clear();
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(tls_ctx_));
  ssl_ = ssl;
  SSL_set_fd(ssl, fd_);
  SSL_set_tlsext_host_name(ssl, tls_.server_name.c_str());
  SSL_set1_host(ssl, tls_.server_name.c_str());
  const int64_t deadline = NowMs() + 10000;
  while (true) {
    ERR_clear_error();
    const int r = SSL_connect(ssl);
    if (r == 1) return true;
    const int e = SSL_get_error(ssl, r);
    if ((e == SSL_ERROR_WANT_READ && WaitFor(fd_, POLLIN, deadline)) ||
        (e == SSL_ERROR_WANT_WRITE && WaitFor(fd_, POLLOUT, deadline)))
      continue;
    tls_error_ = "TLS handshake failed: " + SslErrors();
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK)
      tls_error_ += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
    return false;
  }
}

ssize_t HttpTestClient::SendSome(const char* data, size_t n) {
  if (ssl_ == nullptr) {
    while (true) {
      const ssize_t r = send(fd_, data, n, MSG_NOSIGNAL);
      if (r < 0 && errno == EINTR) continue;
      return r;
    }
  }
  SSL* ssl = static_cast<SSL*>(ssl_);
  const int64_t deadline = NowMs() + 20000;
  while (true) {
    ERR_clear_error();
    size_t written = 0;
    if (SSL_write_ex(ssl, data, n, &written) == 1) return static_cast<ssize_t>(written);
    const int e = SSL_get_error(ssl, 0);
    if ((e == SSL_ERROR_WANT_READ && WaitFor(fd_, POLLIN, deadline)) ||
        (e == SSL_ERROR_WANT_WRITE && WaitFor(fd_, POLLOUT, deadline)))
      continue;
    return -1;
  }
}

ssize_t HttpTestClient::RecvSome(char* data, size_t n, int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  if (ssl_ == nullptr) {
    if (!WaitFor(fd_, POLLIN, deadline)) return -2;
    while (true) {
      const ssize_t r = recv(fd_, data, n, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EAGAIN) return -2;
      return r;
    }
  }
  SSL* ssl = static_cast<SSL*>(ssl_);
  while (true) {
    ERR_clear_error();
    errno = 0;
    size_t got = 0;
    const int r = SSL_read_ex(ssl, data, n, &got);
    if (r == 1) return static_cast<ssize_t>(got);
    const int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ) {
      if (!WaitFor(fd_, POLLIN, deadline)) return -2;
      continue;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
      if (!WaitFor(fd_, POLLOUT, deadline)) return -2;
      continue;
    }
    if (e == SSL_ERROR_ZERO_RETURN) return 0;
    // EOF without close_notify (OpenSSL 3 reports it as an SSL error) counts as EOF.
    const unsigned long last = ERR_peek_last_error();
    ERR_clear_error();
    if (e == SSL_ERROR_SYSCALL && errno == 0) return 0;
    if (ERR_GET_REASON(last) == SSL_R_UNEXPECTED_EOF_WHILE_READING) return 0;
    return -1;
  }
}

const std::string* HttpReply::Header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return &v;
  }
  return nullptr;
}

std::string_view HttpReply::Json() const {
  const std::string* n = Header("inference-header-content-length");
  if (n == nullptr) return body;
  const size_t len = std::min<size_t>(std::stoul(*n), body.size());
  return std::string_view(body).substr(0, len);
}

std::string_view HttpReply::Binary() const { return std::string_view(body).substr(Json().size()); }

bool HttpTestClient::Connect(int timeout_ms) {
  if (fd_ >= 0) return true;
  reader_.Reset();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res) != 0) return false;
  const int64_t deadline = NowMs() + timeout_ms;
  bool ok = false;
  while (!ok && NowMs() < deadline) {
    for (addrinfo* ai = res; ai != nullptr && !ok; ai = ai->ai_next) {
      const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        fd_ = fd;
        ok = true;
      } else {
        close(fd);
      }
    }
    if (!ok) usleep(20'000);
  }
  freeaddrinfo(res);
  if (ok && use_tls_ && !Handshake()) {
    Close();
    return false;
  }
  if (ok) ++connects_;
  return ok;
}

void HttpTestClient::Close() {
  if (ssl_ != nullptr) SSL_free(static_cast<SSL*>(ssl_));
  ssl_ = nullptr;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  reader_.Reset();
}

bool HttpTestClient::SendRaw(std::string_view bytes) {
  if (!Connect()) return false;
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = SendSome(bytes.data() + sent, bytes.size() - sent);
    if (n < 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool HttpTestClient::WaitForClose(int timeout_ms) {
  if (fd_ < 0) return true;
  const int64_t deadline = NowMs() + timeout_ms;
  char buf[4096];
  while (NowMs() < deadline) {
    const ssize_t n =
        RecvSome(buf, sizeof(buf), static_cast<int>(std::max<int64_t>(1, deadline - NowMs())));
    if (n == 0 || n == -1) {
      Close();
      return true;
    }
  }
  return false;
}

HttpReply HttpTestClient::ReadReply(int timeout_ms) {
  HttpReply reply;
  if (fd_ < 0) return reply;
  const int64_t deadline = NowMs() + timeout_ms;
  // Bytes received past the previous reply are read first.
  auto state = reader_.Next();
  while (state == proto::HttpResponseReader::State::kIncomplete) {
    const int64_t left = deadline - NowMs();
    if (left <= 0) break;
    char buf[65536];
    const ssize_t n = RecvSome(buf, sizeof(buf), static_cast<int>(left));
    if (n <= 0) break;
    state = reader_.Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
  if (state != proto::HttpResponseReader::State::kDone) {
    Close();
    return reply;
  }
  reply.status = reader_.status();
  for (const proto::HttpHeader& h : reader_.head().headers)
    reply.headers.emplace_back(h.name, h.value);
  reply.body = reader_.body();
  if (!reader_.head().keep_alive) {
    reply.server_closed = true;
    Close();
  }
  return reply;
}

HttpReply HttpTestClient::Request(const std::string& method, const std::string& path,
                                  std::string_view body, const Headers& headers, int timeout_ms) {
  Headers all = {{"Host", host_ + ":" + std::to_string(port_)}};
  bool has_length = false;
  for (const auto& [k, v] : headers) {
    all.emplace_back(k, v);
    if (proto::EqualsIgnoreCase(k, "content-length") ||
        proto::EqualsIgnoreCase(k, "transfer-encoding")) {
      has_length = true;
    }
  }
  if (!has_length && (!body.empty() || method == "POST"))
    all.emplace_back("Content-Length", std::to_string(body.size()));
  std::string req = proto::SerializeRequestHead(method, path, all);
  req.append(body);
  // A kept-alive connection the server has closed fails on first use: retry once.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool reused = fd_ >= 0;
    if (!SendRaw(req)) {
      Close();
      if (reused) continue;
      return {};
    }
    HttpReply r = ReadReply(timeout_ms);
    if (r.status == 0 && reused) continue;
    return r;
  }
  return {};
}

std::string GzipCompress(std::string_view data) { return Compress(data, 15 + 16); }
std::string ZlibCompress(std::string_view data) { return Compress(data, 15); }

std::string SerializeStrings(const std::vector<std::string>& values) {
  std::string out;
  for (const auto& v : values) {
    const uint32_t n = static_cast<uint32_t>(v.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out.append(v);
  }
  return out;
}

}  // namespace shoal::testing
