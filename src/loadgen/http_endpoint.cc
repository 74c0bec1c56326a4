// The HTTP endpoint: blocking control calls on one keep-alive connection, and
// HttpTransport, which keeps one keep-alive connection per request in flight and drives
// them all from the caller's thread with epoll.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loadgen/endpoint.h"
#include "loadgen/http_wire.h"
#include "proto/http_message.h"

namespace shoal::loadgen {
namespace {

constexpr int kControlTimeoutMs = 10'000;

// A connected, blocking TCP socket with TCP_NODELAY, or an error naming the address.
StatusOr<int> Connect(const HostPort& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Unavailable(fmt::format("cannot resolve {}: {}", address.host, gai_strerror(rc)));
  }
  int err = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      freeaddrinfo(found);
      return fd;
    }
    err = errno;
    close(fd);
  }
  freeaddrinfo(found);
  return Unavailable(
      fmt::format("cannot connect to {}:{}: {}", address.host, address.port, std::strerror(err)));
}

struct Reply {
  int status = 0;
  std::string body;
};

// One keep-alive connection for the control calls; reconnects when the server closed it.
class ControlClient {
 public:
  explicit ControlClient(HostPort address) : address_(std::move(address)) {}
  ~ControlClient() { CloseFd(); }

  StatusOr<Reply> Get(const std::string& path) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (fd_ < 0) {
        ASSIGN_OR_RETURN(fd_, Connect(address_));
      }
      const std::string request = proto::SerializeRequestHead(
          "GET", path, {{"Host", address_.host + ":" + std::to_string(address_.port)}});
      if (send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size())) {
        CloseFd();  // a stale keep-alive connection: try once more on a new one
        continue;
      }
      proto::HttpResponseReader parser(/*keep_body=*/true);
      char buf[16384];
      while (true) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, kControlTimeoutMs) <= 0) {
          CloseFd();
          return DeadlineExceeded(
              fmt::format("no reply to GET {} within {} ms", path, kControlTimeoutMs));
        }
        const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
        if (n <= 0) break;
        const auto state = parser.Feed(std::string_view(buf, static_cast<size_t>(n)));
        if (state == proto::HttpResponseReader::State::kError) {
          CloseFd();
          return Internal(fmt::format("GET {}: {}", path, parser.error()));
        }
        if (state == proto::HttpResponseReader::State::kDone) {
          if (!parser.head().keep_alive) CloseFd();
          return Reply{parser.status(), parser.body()};
        }
      }
      CloseFd();
      if (parser.status() != 0) break;  // closed mid-reply: do not retry
    }
    return Unavailable(fmt::format("the server at {}:{} closed the connection on GET {}",
                                   address_.host, address_.port, path));
  }

 private:
  void CloseFd() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  HostPort address_;
  int fd_ = -1;
};

// The server's {"error": "..."} message, or the body as it is.
std::string ErrorText(const Reply& r) {
  const size_t key = r.body.find("\"error\"");
  if (key != std::string::npos) {
    const size_t open = r.body.find('"', r.body.find(':', key) + 1);
    const size_t close = r.body.rfind('"');
    if (open != std::string::npos && close > open) return r.body.substr(open + 1, close - open - 1);
  }
  return r.body;
}

class HttpTransport final : public Transport {
 public:
  HttpTransport(const Clock& clock, HostPort address, std::vector<std::string> requests,
                int64_t capacity)
      : clock_(clock),
        address_(std::move(address)),
        requests_(std::move(requests)),
        conns_(static_cast<size_t>(capacity)) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    for (int64_t i = capacity - 1; i >= 0; --i) free_.push_back(static_cast<uint32_t>(i));
    events_.resize(static_cast<size_t>(std::min<int64_t>(capacity, 1024)));
  }
  ~HttpTransport() override {
    for (Conn& c : conns_) {
      if (c.fd >= 0) close(c.fd);
    }
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  int64_t capacity() const override { return static_cast<int64_t>(conns_.size()); }

  Status Start(uint64_t tag, size_t payload) override {
    if (free_.empty()) return FailedPrecondition("every HTTP connection is busy");
    const uint32_t id = free_.back();
    free_.pop_back();
    Conn& c = conns_[id];
    c.tag = tag;
    c.out = &requests_[payload % requests_.size()];
    c.written = 0;
    c.parser.Reset();
    if (c.fd < 0) {
      auto fd = Connect(address_);
      if (!fd.ok()) {
        if (connect_errors_++ == 0) last_connect_error_ = fd.status().message();
        Finish(id, Completion::kNoReply, false);
        return Status::Ok();
      }
      c.fd = *fd;
      fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) | O_NONBLOCK);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u32 = id;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev);
    }
    Write(id);
    return Status::Ok();
  }

  void Wait(int64_t deadline_ns, std::vector<Completion>* done) override {
    const int64_t wait_ns = ready_.empty() ? std::max<int64_t>(deadline_ns - clock_.NowNs(), 0) : 0;
    timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000),
                static_cast<long>(wait_ns % 1'000'000'000)};
    const int n =
        epoll_pwait2(epoll_fd_, events_.data(), static_cast<int>(events_.size()), &ts, nullptr);
    for (int i = 0; i < n; ++i) {
      const uint32_t id = events_[i].data.u32;
      const uint32_t ev = events_[i].events;
      if (conns_[id].out == nullptr) {
        // Idle keep-alive connection: the server closed it (or sent junk). Drop it.
        if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR | EPOLLIN)) CloseConn(id);
        continue;
      }
      if (ev & EPOLLOUT) Write(id);
      if (conns_[id].out != nullptr && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        Read(id);
      }
    }
    done->insert(done->end(), ready_.begin(), ready_.end());
    ready_.clear();
  }

  std::string CodeName(int code) const override {
    if (code == Completion::kNoReply) {
      return last_connect_error_.empty() ? "no reply (connection lost)"
                                         : "no reply (" + last_connect_error_ + ")";
    }
    return "HTTP " + std::to_string(code);
  }

 private:
  struct Conn {
    int fd = -1;
    const std::string* out = nullptr;  // the request being sent; null when idle
    size_t written = 0;
    bool want_write = false;
    uint64_t tag = 0;
    proto::HttpResponseReader parser{/*keep_body=*/false};
  };

  void Write(uint32_t id) {
    Conn& c = conns_[id];
    while (c.written < c.out->size()) {
      const ssize_t n =
          send(c.fd, c.out->data() + c.written, c.out->size() - c.written, MSG_NOSIGNAL);
      if (n > 0) {
        c.written += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        SetWantWrite(id, true);
        return;
      }
      if (n < 0 && errno == EINTR) continue;
      Fail(id);
      return;
    }
    if (c.want_write) SetWantWrite(id, false);
  }

  void SetWantWrite(uint32_t id, bool want) {
    Conn& c = conns_[id];
    c.want_write = want;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (want ? uint32_t{EPOLLOUT} : uint32_t{0});
    ev.data.u32 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void Read(uint32_t id) {
    Conn& c = conns_[id];
    while (true) {
      const ssize_t n = recv(c.fd, buffer_, sizeof(buffer_), 0);
      if (n > 0) {
        const auto state = c.parser.Feed(std::string_view(buffer_, static_cast<size_t>(n)));
        if (state == proto::HttpResponseReader::State::kError) return Fail(id);
        if (state == proto::HttpResponseReader::State::kDone) {
          const bool close_after = !c.parser.head().keep_alive;
          const int status = c.parser.status();
          Finish(id, status, status == 200);
          if (close_after) CloseConn(id);
          return;
        }
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      return Fail(id);  // EOF or error before the reply was complete
    }
  }

  void Fail(uint32_t id) {
    Finish(id, Completion::kNoReply, false);
    CloseConn(id);
  }

  // Reports the request on connection `id` and makes the connection free.
  void Finish(uint32_t id, int code, bool ok) {
    Conn& c = conns_[id];
    ready_.push_back(Completion{c.tag, clock_.NowNs(), ok, code});
    c.out = nullptr;
    free_.push_back(id);
  }

  void CloseConn(uint32_t id) {
    Conn& c = conns_[id];
    if (c.fd >= 0) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
      close(c.fd);
    }
    c.fd = -1;
    c.want_write = false;
  }

  const Clock& clock_;
  HostPort address_;
  std::vector<std::string> requests_;
  std::vector<Conn> conns_;
  std::vector<uint32_t> free_;  // idle connections (open or not), most recent last
  std::vector<Completion> ready_;
  std::vector<epoll_event> events_;
  int epoll_fd_ = -1;
  int64_t connect_errors_ = 0;
  std::string last_connect_error_;
  char buffer_[65536];
};

class HttpEndpoint final : public Endpoint {
 public:
  explicit HttpEndpoint(HostPort address) : address_(address), control_(address) {}

  StatusOr<ModelInfo> GetModelInfo(const std::string& model, int64_t version) override {
    ASSIGN_OR_RETURN(Reply meta, control_.Get(ModelPath(model, version, "")));
    if (meta.status != 200) {
      return NotFound(fmt::format("model '{}': {} (HTTP {})", model, ErrorText(meta), meta.status));
    }
    ASSIGN_OR_RETURN(Reply config, control_.Get(ModelPath(model, version, "/config")));
    if (config.status != 200) config.body = "{}";  // no config endpoint: assume no batching
    auto info = ParseHttpModelInfo(meta.body, config.body);
    if (!info.ok()) return info.status().WithPrefix(fmt::format("model '{}'", model));
    return info;
  }

  StatusOr<ServerStats> GetStats(const std::string& model, int64_t version) override {
    ASSIGN_OR_RETURN(Reply r, control_.Get(ModelPath(model, version, "/stats")));
    if (r.status != 200) {
      return Unavailable(fmt::format("statistics: {} (HTTP {})", ErrorText(r), r.status));
    }
    return ParseHttpStats(r.body);
  }

  StatusOr<std::unique_ptr<Transport>> NewTransport(const Clock& clock, const std::string& model,
                                                    int64_t version,
                                                    const std::vector<Payload>& payloads,
                                                    int64_t capacity) override {
    if (payloads.empty()) return InvalidArgument("no input payloads");
    std::vector<std::string> requests;
    const std::string host = address_.host + ":" + std::to_string(address_.port);
    for (const Payload& p : payloads) {
      requests.push_back(EncodeHttpInferRequest(host, ModelPath(model, version, "/infer"), p));
    }
    return std::unique_ptr<Transport>(
        new HttpTransport(clock, address_, std::move(requests), capacity));
  }

 private:
  HostPort address_;
  ControlClient control_;
};

}  // namespace

StatusOr<std::unique_ptr<Endpoint>> NewHttpEndpoint(const HostPort& address) {
  return std::unique_ptr<Endpoint>(new HttpEndpoint(address));
}

#ifndef SHOAL_LOADGEN_HAVE_GRPC
StatusOr<std::unique_ptr<Endpoint>> NewGrpcEndpoint(const HostPort& address) {
  return Unimplemented("this shoal was built without gRPC");
}
#endif

}  // namespace shoal::loadgen
