#include "server/tcp_listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace shoal::server {

StatusOr<TcpListener> TcpListener::Listen(const std::string& address, int port) {
  if (port < 0 || port > 65535)
    return InvalidArgument("port must be in 0..65535; was " + std::to_string(port));
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
  TcpListener listener;
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
      listener.fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  if (!listener.valid())
    return Unavailable("cannot listen on " + address + ":" + service + ": " + last_error);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listener.fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  listener.port_ = addr.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  listener.address_ = address;
  return listener;
}

TcpListener::TcpListener(TcpListener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_), address_(std::move(other.address_)) {}

TcpListener& TcpListener::operator=(TcpListener&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
    address_ = std::move(other.address_);
  }
  return *this;
}

TcpListener::~TcpListener() { Close(); }

int TcpListener::Release() { return std::exchange(fd_, -1); }

void TcpListener::Close() {
  if (fd_ >= 0) close(std::exchange(fd_, -1));
}

}  // namespace shoal::server
