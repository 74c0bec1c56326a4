// Loop: one event loop of HttpCore (see http_core.h for the model and the contracts).
// Internal to the HTTP front end: HttpCore owns its loops; nothing else uses this.
//
// A Loop owns an epoll set holding the shared listening socket (EPOLLEXCLUSIVE), its
// mailbox's eventfd and the connections it accepted. Every method but RunTask, Stop,
// Join and the constructor runs on the loop's own thread; the Mailbox is the only state
// shared with other threads (responders post answers and tasks to it).
//
// Its methods live in three files by concern: http_loop.cc (the loop, accepting,
// interest, timeouts, closing), http_loop_request.cc (reading and parsing a request and
// handing it over) and http_loop_response.cc (answers from the mailbox, writing them).
// The per-connection state they share is in http_connection.h.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "proto/http_message.h"
#include "server/http_core.h"

namespace shoal::server::internal {

// Where other threads hand work to a loop: answers for its connections and tasks.
// Thread-safe; the loop drains it when its eventfd fires.
struct Mailbox {
  struct Item {
    uint64_t connection = 0;  // 0: `task`
    uint64_t sequence = 0;    // the connection's request the answer is for
    proto::HttpResponse response;
    std::function<proto::HttpResponse()> make;  // if set, builds the response on the loop
    std::function<void()> task;
  };

  ~Mailbox();
  // False when the loop is gone (the item is dropped).
  bool Post(Item item);

  Mutex mu;
  std::vector<Item> items GUARDED_BY(mu);
  bool closed GUARDED_BY(mu) = false;
  int event_fd = -1;
  std::shared_ptr<std::atomic<int64_t>> posted_unwritten;
};

struct Connection;

class Loop {
 public:
  // `max_connections`: this loop's share of the core's cap. The counters are the
  // core's, shared by its loops.
  Loop(int index, const HttpCoreOptions& options, int max_connections, HttpHandler* handler,
       int listen_fd, std::shared_ptr<std::atomic<int64_t>> connections,
       std::shared_ptr<std::atomic<int64_t>> in_progress,
       std::shared_ptr<std::atomic<int64_t>> posted_unwritten,
       std::shared_ptr<std::atomic<int64_t>> receiving_body_bytes);
  ~Loop();
  Status Init();
  void Start();
  // Runs `task` on the loop thread and waits for it; false if the loop is not running.
  // Called only by the thread that owns the HttpCore.
  bool RunTask(std::function<void()> task);
  void StopAcceptingOnLoop();
  void Stop();
  void Join();
  // Answers of requests that were dispatched on this loop.
  void MakeResponder(HttpResponder* r, uint64_t connection, uint64_t sequence);

 private:
  Status Listen(bool on);
  void Run();
  void Accept();
  // The connection idle the longest (keep-alive, nothing buffered, no request in
  // progress), or null. A linear scan: it runs only when this loop is at its cap.
  Connection* OldestIdle();
  // Listens again if accepting stopped because every connection was busy.
  void ResumeAcceptingIfFull();
  // Charges the growth of c.body's capacity to the receiving-body budget: false (and
  // nothing charged) when it would go past it. ReleaseBody gives the charge back.
  bool ChargeBody(Connection& c, size_t new_capacity);
  void ReleaseBody(Connection& c);
  // Grows c.body for at least `need` bytes (doubling, at most `limit`) within the budget;
  // false after answering 503 when the budget (or memory) is exhausted.
  bool GrowBody(Connection& c, size_t need, size_t limit);
  void FailOverBudget(Connection& c);
  void OnEvent(Connection& c, uint32_t events);
  // TLS: advances c's handshake; once done, reads what followed it.
  void ContinueHandshake(Connection& c);
  // recv / sendmsg, or their TLS equivalents: bytes moved, 0 at EOF (Receive only), or -1
  // with errno (EAGAIN: wait for the interest UpdateInterest sets).
  ssize_t Receive(Connection& c, char* dst, size_t n);
  ssize_t Send(Connection& c, const iovec* iov, int count);
  // Lingering close: close_notify on TLS, then no more writes.
  void ShutdownWrite(Connection& c);
  size_t PipelineCap() const { return static_cast<size_t>(options_.max_header_bytes) + (64 << 10); }
  void OnReadable(Connection& c);
  // Moves the request state machine as far as the buffered bytes allow.
  void Advance(Connection& c);
  bool BodyComplete(const Connection& c) const;
  // Decodes chunked framing from the input buffer into the body; true when complete.
  bool DecodeChunks(Connection& c);
  void CompactInput(Connection& c);
  void Dispatch(Connection& c);
  void ProcessMailbox();
  void QueueResponse(Connection& c, proto::HttpResponse response);
  // Answers an error and closes the connection after writing it.
  void Fail(Connection& c, int status, const std::string& message,
            std::vector<std::pair<std::string, std::string>> headers = {});
  void Flush(Connection& c);
  // The request's answer is out (or the connection is gone): stop counting it.
  void FinishRequest(Connection& c);
  void UpdateInterest(Connection& c);
  void Close(Connection& c);
  void EraseDead();
  void Sweep();
  const int index_;
  const HttpCoreOptions options_;
  const int max_connections_;
  const int64_t sweep_interval_ms_;
  HttpHandler* const handler_;
  const int listen_fd_;
  std::shared_ptr<std::atomic<int64_t>> connections_;
  std::shared_ptr<std::atomic<int64_t>> in_progress_;
  std::shared_ptr<std::atomic<int64_t>> receiving_body_bytes_;
  std::shared_ptr<Mailbox> mailbox_;
  int epoll_fd_ = -1;
  std::thread thread_;
  bool started_ = false;  // owner thread only
  // Loop-thread state.
  bool running_ = true;
  bool listening_ = false;
  bool draining_ = false;
  bool full_ = false;  // stopped listening: at max_connections_ with none idle
  int64_t accept_paused_until_ = 0;
  int64_t now_ms_ = 0;
  uint64_t next_id_ = 2;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_map_;
  std::vector<uint64_t> dead_;
  // TLS connections with decrypted bytes buffered that want to read: epoll cannot see
  // those bytes, so the loop reads them without waiting (see UpdateInterest).
  std::vector<uint64_t> tls_ready_;
  std::string tls_scratch_;  // small pieces of output coalesced into one TLS record
};

}  // namespace shoal::server::internal
