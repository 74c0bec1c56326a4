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

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

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
  buffer_.clear();
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
  buffer_.clear();
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
  bool eof = false;
  auto fill = [&]() -> bool {
    if (eof) return false;
    const int64_t left = deadline - NowMs();
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[65536];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) {
      eof = true;
      return false;
    }
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  };
  while (true) {
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) {
        Close();
        reply.status = 0;
        return reply;
      }
    }
    // Status line and headers.
    std::string head = buffer_.substr(0, end + 2);
    buffer_.erase(0, end + 4);
    size_t eol = head.find("\r\n");
    const std::string status_line = head.substr(0, eol);
    if (status_line.size() < 12) {
      Close();
      return reply;
    }
    reply.status = std::atoi(status_line.c_str() + 9);
    reply.headers.clear();
    size_t pos = eol + 2;
    while (pos < head.size()) {
      eol = head.find("\r\n", pos);
      std::string line = head.substr(pos, eol - pos);
      pos = eol + 2;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (char& c : name) c = Lower(c);
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ') ++v;
      reply.headers.emplace_back(name, line.substr(v));
    }
    if (reply.status == 100) continue;  // interim: read the real reply
    break;
  }
  const std::string* cl = reply.Header("content-length");
  const size_t length = cl ? std::stoul(*cl) : 0;
  while (buffer_.size() < length) {
    if (!fill()) {
      reply.status = 0;
      Close();
      return reply;
    }
  }
  reply.body = buffer_.substr(0, length);
  buffer_.erase(0, length);
  const std::string* conn = reply.Header("connection");
  if (conn != nullptr && (*conn == "close" || *conn == "Close")) {
    reply.server_closed = true;
    Close();
  }
  return reply;
}

HttpReply HttpTestClient::Request(const std::string& method, const std::string& path,
                                  std::string_view body, const Headers& headers, int timeout_ms) {
  std::string req =
      method + " " + path + " HTTP/1.1\r\nHost: " + host_ + ":" + std::to_string(port_) + "\r\n";
  bool has_length = false;
  for (const auto& [k, v] : headers) {
    req += k + ": " + v + "\r\n";
    std::string lower = k;
    for (char& c : lower) c = Lower(c);
    if (lower == "content-length" || lower == "transfer-encoding") has_length = true;
  }
  if (!has_length && (!body.empty() || method == "POST"))
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n";
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
