// TcpListener: a TCP socket bound and listening before the service that will serve it
// exists, so that `shoal serve` claims every port (and reports a clash, naming the
// address) before it spends minutes loading models. HttpCore adopts one; for gRPC,
// which binds its own sockets, `shoal serve` holds one to reserve the port and closes
// it just before the gRPC server binds.
//
// Connections that arrive before a service adopts the socket wait in its backlog.
// Move-only; the destructor closes a socket nobody adopted. Not thread-safe.
#pragma once

#include <string>

#include "core/status.h"

namespace shoal::server {

class TcpListener {
 public:
  // Binds address:port (an IPv4 or IPv6 literal, or a host name; port 0: any free
  // port) with SO_REUSEADDR and listens. INVALID_ARGUMENT when the address does not
  // resolve or the port is outside 0..65535; UNAVAILABLE "cannot listen on
  // <address>:<port>: <why>" when it cannot be bound (e.g. already in use).
  static StatusOr<TcpListener> Listen(const std::string& address, int port);

  TcpListener() = default;
  TcpListener(TcpListener&& other) noexcept;
  TcpListener& operator=(TcpListener&& other) noexcept;
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  ~TcpListener();

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  int port() const { return port_; }  // the port bound (the chosen one when asked for 0)
  const std::string& address() const { return address_; }
  // Hands the socket over (the caller closes it); the listener becomes invalid.
  int Release();
  // Closes the socket now, freeing the port.
  void Close();

 private:
  int fd_ = -1;
  int port_ = 0;
  std::string address_;
};

}  // namespace shoal::server
