// Transport: how the load driver (driver.h) sends inference requests, whatever the
// protocol. Implementations: HttpTransport (http_transport.h: keep-alive connections on
// one epoll loop), GrpcTransport (grpc_transport.h: async unary calls on one completion
// queue), and fakes in the tests.
//
// The driver is single-threaded and owns the transport: Start and Wait are called from
// the driver's thread only. Requests are pre-encoded when the transport is built, so
// Start only copies bytes or references a prepared message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace shoal::loadgen {

struct Completion {
  uint64_t tag = 0;    // as given to Start
  int64_t end_ns = 0;  // when the reply was complete, on the driver's clock
  bool ok = false;
  // HTTP status, or gRPC status code; kNoReply when the connection failed.
  int code = 0;
  static constexpr int kNoReply = -1;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // The most requests that may be in flight at once.
  virtual int64_t capacity() const = 0;
  // Starts one request carrying pre-encoded payload number `payload` (taken modulo the
  // number of payloads). Requires fewer than capacity() requests in flight. An error
  // means the request was not started (no Completion will come for it).
  virtual Status Start(uint64_t tag, size_t payload) = 0;
  // Returns when at least one request finished or the clock reached deadline_ns,
  // appending every finished request to *done.
  virtual void Wait(int64_t deadline_ns, std::vector<Completion>* done) = 0;
  // A short name for an error code, for the error counts: "HTTP 503", "gRPC UNAVAILABLE".
  virtual std::string CodeName(int code) const = 0;
};

}  // namespace shoal::loadgen
