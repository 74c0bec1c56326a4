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
// close the connection. At most max_connections are open; more are accepted and closed
// at once. Connections idle (between requests) for idle_timeout_ms, or stalled mid-
// request for io_timeout_ms, are closed.
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

namespace shoal::server {

struct HttpCoreOptions {
  std::string address = "0.0.0.0";             // IPv4 or IPv6 literal, or "localhost"
  int port = 0;                                // 0: any free port
  int threads = 2;                             // event loops, >= 1
  int64_t max_body_bytes = int64_t{64} << 20;  // as received (before decompression)
  int64_t max_header_bytes = int64_t{16} << 10;
  int max_connections = 10000;
  int64_t idle_timeout_ms = 300'000;  // keep-alive connections with no request
  int64_t io_timeout_ms = 60'000;     // no progress reading a request or writing a reply
  int64_t stop_flush_ms = 2'000;      // Stop: time allowed for posted answers to go out
  std::string thread_name = "http";   // loops are named <thread_name>:<i>
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
  // Binds and listens, then starts the loops. `handler` must outlive the core.
  static StatusOr<std::unique_ptr<HttpCore>> Start(HttpCoreOptions options, HttpHandler* handler);
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
};

}  // namespace shoal::server
