// HttpCore: the HTTP/1.1 connection engine under the inference front end and the
// metrics endpoint. It knows sockets and HTTP framing, nothing about inference.
//
// Model: `threads` event loops (epoll, level-triggered). The listening socket is in
// every loop's epoll set (EPOLLEXCLUSIVE); a connection belongs to the loop that
// accepted it for its whole life, so connection state needs no locks. Per connection:
//
//   kReadingHead ──head parsed──▶ kReadingBody ──body complete──▶ kWaiting (handler owns
//        ▲                                                         the request)
//        └──────── response written, keep-alive ◀── kWriting ◀── response posted
//
// One request per connection is in progress at a time; pipelined requests wait in
// the read buffer (bounded) until the previous response is written.
//
// Handlers are called on the loop thread and must not block. A handler answers exactly
// once through its HttpResponder, from any thread; the response is handed to the
// connection's loop through a mailbox (mutex + eventfd) and written there. A handler
// may return a cancel hook: if the client goes away (EOF, reset, error) before the
// answer, the loop calls it once (on the loop thread) and drops the answer when it
// comes. Answers for connections that are gone, or after Stop, are dropped.
//
// Bounds: a head over max_header_bytes gets 431; a Content-Length (or chunked total)
// over max_body_bytes gets 413 before anything is allocated for the body; both then
// close the connection. A body buffer grows with the bytes that arrive (doubling, up to
// the declared length), never with what a head merely declares; every loop charges the
// buffers of bodies still being received against one budget (receiving_body_budget_bytes)
// and answers 503 (Retry-After: 1) to a body that would go past it.
//
// Connections: at most max_connections are open, split evenly among the loops. A loop
// at its share that accepts one more closes its oldest idle connection (keep-alive,
// no request in progress, nothing buffered) to make room, so that new clients and
// health checks get in while idle ones hold every slot; when none of its connections
// is idle, it closes the new one and stops accepting (leaving new connections to the
// other loops or the listen backlog) until one of its own closes or goes idle.
//
// Deadlines (each a total, not reset by the bytes that trickle in): a head must be
// complete header_timeout_ms after its first byte, a body body_timeout_ms after its
// head; past them the request gets 408 and the connection closes. A connection idle
// (between requests) for idle_timeout_ms, or whose answer makes no progress for
// write_timeout_ms, is closed. Deadlines are checked every quarter of the smallest
// timeout (at most every second), so one may overrun by that much.
//
// TLS (options.tls set): each accepted connection first completes a TLS handshake, which
// must be done header_timeout_ms after the accept (else the connection is closed; a
// handshake in progress counts as idle for the connection cap). The bounds and
// deadlines above then apply to the decrypted bytes as they do to plaintext. A client
// that sends plain HTTP to a TLS port gets a plaintext 400 saying so, and the
// connection closes. Closing sends TLS close_notify before the TCP shutdown.
//
// Shutdown: StopAccepting closes the listener; requests in progress finish and their
// connections close after the answer (Connection: close), idle ones close at once.
// Drain waits for in-progress requests to be answered and written. Stop closes every
// connection (calling the cancel hooks of those still waiting) after at most
// stop_flush_ms spent flushing answers that were already posted, and joins the loops.
// Stop is idempotent and called by the destructor. StopAccepting, Drain and Stop must not
// be called from a loop thread (a handler).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "proto/http_message.h"
#include "server/tcp_listener.h"
#include "server/tls.h"

namespace shoal::server {

struct HttpCoreOptions {
  std::string address = "0.0.0.0";             // IPv4 or IPv6 literal, or "localhost"
  int port = 0;                                // 0: any free port
  int threads = 2;                             // event loops, >= 1
  int64_t max_body_bytes = int64_t{64} << 20;  // as received (before decompression)
  int64_t max_header_bytes = int64_t{16} << 10;
  // Open connections, >= threads; each loop holds at most its share (see above).
  int max_connections = 10000;
  // Bytes all loops together may hold for request bodies still being received (buffer
  // capacity, which grows with what arrives); >= max_body_bytes. Default 1 GiB.
  int64_t receiving_body_budget_bytes = int64_t{1} << 30;
  int64_t idle_timeout_ms = 300'000;   // keep-alive connection with no request, > 0
  int64_t header_timeout_ms = 30'000;  // first byte of a head to its end, in total, > 0
  int64_t body_timeout_ms = 300'000;   // end of a head to the end of its body, in total, > 0
  int64_t write_timeout_ms = 60'000;   // no progress writing an answer, > 0
  int64_t stop_flush_ms = 2'000;       // Stop: time allowed for posted answers to go out
  std::string thread_name = "http";    // loops are named <thread_name>:<i>
  // Set: every connection speaks TLS (see TLS above); null: plaintext.
  std::shared_ptr<const TlsContext> tls;
};

namespace internal {
struct Mailbox;
class Loop;
}  // namespace internal

// Answers one request. Copyable; only the first Send of all copies is used.
class HttpResponder {
 public:
  HttpResponder() = default;
  // Sends `response` (any thread).
  void Send(proto::HttpResponse response) const;
  // Runs `make` on the connection's loop thread and sends what it returns: for
  // answers whose serialization should not run on the caller's thread.
  void SendLater(std::function<proto::HttpResponse()> make) const;

 private:
  friend class internal::Loop;
  std::shared_ptr<internal::Mailbox> mailbox_;
  uint64_t connection_ = 0;
  uint64_t sequence_ = 0;
};

struct HttpRequest {
  proto::HttpRequestHead head;
  std::shared_ptr<proto::BodyBuffer> body;  // never null; may be empty
  std::string_view body_view() const { return body->view(); }
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Called on a loop thread. Must answer through `responder` exactly once (possibly
  // before returning). Returns a cancel hook or an empty function.
  virtual std::function<void()> Handle(HttpRequest request, HttpResponder responder) = 0;
  // Which body byte to align to 64 bytes (e.g. where binary data starts); 0 default.
  virtual size_t BodyAlignment(const proto::HttpRequestHead& head) { return 0; }
};

class HttpCore {
 public:
  // Binds and listens on options.address:options.port, then starts the loops.
  // `handler` must outlive the core. INVALID_ARGUMENT for bad options (naming the
  // value), UNAVAILABLE when the address cannot be bound.
  static StatusOr<std::unique_ptr<HttpCore>> Start(HttpCoreOptions options, HttpHandler* handler);
  // The checks Start makes of `options` before it binds: INVALID_ARGUMENT naming the
  // value, or OK.
  static Status Validate(const HttpCoreOptions& options);
  // The same on a socket bound beforehand (options.address and port are then ignored).
  static StatusOr<std::unique_ptr<HttpCore>> Start(HttpCoreOptions options, HttpHandler* handler,
                                                   TcpListener listener);
  ~HttpCore();
  HttpCore(const HttpCore&) = delete;
  HttpCore& operator=(const HttpCore&) = delete;

  int port() const { return port_; }
  void StopAccepting();
  // True when no request is in progress (every one answered and written) within
  // timeout_ms.
  bool Drain(int64_t timeout_ms);
  void Stop();

  int64_t open_connections() const;
  int64_t requests_in_progress() const;
  // Bytes currently reserved for request bodies still being received (what
  // receiving_body_budget_bytes bounds).
  int64_t receiving_body_bytes() const;

 private:
  HttpCore() = default;

  HttpCoreOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<std::unique_ptr<internal::Loop>> loops_;
  std::atomic<bool> accepting_{false};
  std::atomic<bool> stopped_{false};
  std::shared_ptr<std::atomic<int64_t>> connections_;
  std::shared_ptr<std::atomic<int64_t>> in_progress_;
  std::shared_ptr<std::atomic<int64_t>> posted_unwritten_;
  std::shared_ptr<std::atomic<int64_t>> receiving_body_bytes_;
};

}  // namespace shoal::server
