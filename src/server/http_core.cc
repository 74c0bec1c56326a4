#include "server/http_core.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "server/http_loop.h"

namespace shoal::server {

void HttpResponder::Send(proto::HttpResponse response) const {
  if (!mailbox_) return;
  internal::Mailbox::Item item;
  item.connection = connection_;
  item.sequence = sequence_;
  item.response = std::move(response);
  mailbox_->posted_unwritten->fetch_add(1);
  if (!mailbox_->Post(std::move(item))) mailbox_->posted_unwritten->fetch_sub(1);
}

void HttpResponder::SendLater(std::function<proto::HttpResponse()> make) const {
  if (!mailbox_) return;
  internal::Mailbox::Item item;
  item.connection = connection_;
  item.sequence = sequence_;
  item.make = std::move(make);
  mailbox_->posted_unwritten->fetch_add(1);
  if (!mailbox_->Post(std::move(item))) mailbox_->posted_unwritten->fetch_sub(1);
}

namespace {

StatusOr<int> OpenListener(const std::string& address, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      getaddrinfo(address.empty() ? nullptr : address.c_str(), service.c_str(), &hints, &res);
  if (rc != 0)
    return InvalidArgument("cannot resolve listen address '" + address + "': " + gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      freeaddrinfo(res);
      return fd;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  return Unavailable("cannot listen on " + address + ":" + service + ": " + last_error);
}

}  // namespace

StatusOr<std::unique_ptr<HttpCore>> HttpCore::Start(HttpCoreOptions options, HttpHandler* handler) {
  if (options.threads < 1)
    return InvalidArgument("HTTP threads must be at least 1; was " +
                           std::to_string(options.threads));
  if (options.port < 0 || options.port > 65535)
    return InvalidArgument("port must be in 0..65535; was " + std::to_string(options.port));
  if (options.max_body_bytes < 0)
    return InvalidArgument("max_body_bytes must be >= 0; was " +
                           std::to_string(options.max_body_bytes));
  if (options.max_header_bytes < 64)
    return InvalidArgument("max_header_bytes must be >= 64; was " +
                           std::to_string(options.max_header_bytes));
  if (options.max_connections < 1)
    return InvalidArgument("max_connections must be >= 1; was " +
                           std::to_string(options.max_connections));
  std::unique_ptr<HttpCore> core(new HttpCore());
  core->options_ = options;
  // The counters exist before anything can fail: the destructor's Stop() reads them.
  core->connections_ = std::make_shared<std::atomic<int64_t>>(0);
  core->in_progress_ = std::make_shared<std::atomic<int64_t>>(0);
  core->posted_unwritten_ = std::make_shared<std::atomic<int64_t>>(0);
  ASSIGN_OR_RETURN(core->listen_fd_, OpenListener(options.address, options.port));
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(core->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  core->port_ = addr.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  for (int i = 0; i < options.threads; ++i) {
    auto loop = std::make_unique<internal::Loop>(i, core->options_, handler, core->listen_fd_,
                                                 core->connections_, core->in_progress_,
                                                 core->posted_unwritten_);
    RETURN_IF_ERROR(loop->Init());
    core->loops_.push_back(std::move(loop));
  }
  core->accepting_ = true;
  for (auto& loop : core->loops_) loop->Start();
  return core;
}

HttpCore::~HttpCore() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void HttpCore::StopAccepting() {
  if (!accepting_.exchange(false)) return;
  for (auto& loop : loops_) {
    internal::Loop* l = loop.get();
    loop->RunTask([l] { l->StopAcceptingOnLoop(); });
  }
  close(listen_fd_);
  listen_fd_ = -1;
}

bool HttpCore::Drain(int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (in_progress_->load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void HttpCore::Stop() {
  if (stopped_.exchange(true)) return;
  StopAccepting();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.stop_flush_ms);
  while (posted_unwritten_->load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (auto& loop : loops_) loop->Stop();
  for (auto& loop : loops_) loop->Join();
}

int64_t HttpCore::open_connections() const { return connections_ ? connections_->load() : 0; }
int64_t HttpCore::requests_in_progress() const { return in_progress_ ? in_progress_->load() : 0; }

}  // namespace shoal::server
