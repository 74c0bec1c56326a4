#include "server/http_test_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

}  // namespace

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
  if (ok) ++connects_;
  return ok;
}

void HttpTestClient::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  reader_.Reset();
}

bool HttpTestClient::SendRaw(std::string_view bytes) {
  if (!Connect()) return false;
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool HttpTestClient::WaitForClose(int timeout_ms) {
  if (fd_ < 0) return true;
  const int64_t deadline = NowMs() + timeout_ms;
  char buf[4096];
  while (NowMs() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(1, deadline - NowMs()))) <= 0) continue;
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
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
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char buf[65536];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
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
