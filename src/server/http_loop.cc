// Loop, lifecycle side: the event loop itself, accepting connections, routing their
// events, read/write interest, timeouts, closing. The request side is in
// http_loop_request.cc, the response side in http_loop_response.cc.
#include "server/http_loop.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>

#include "core/thread_util.h"
#include "server/http_connection.h"

namespace shoal::server::internal {
namespace {

constexpr uint64_t kMailboxId = 0;
constexpr uint64_t kListenerId = 1;
constexpr int64_t kLingerMs = 2000;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Mailbox::~Mailbox() {
  if (event_fd >= 0) close(event_fd);
}

bool Mailbox::Post(Item item) {
  bool was_empty;
  {
    MutexLock lock(&mu);
    if (closed) return false;
    was_empty = items.empty();
    items.push_back(std::move(item));
  }
  // Only the first item wakes the loop; it takes every item when it wakes.
  if (was_empty) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(event_fd, &one, sizeof(one));
  }
  return true;
}

// Deadlines are checked every quarter of the smallest timeout, at most every second.
int64_t SweepInterval(const HttpCoreOptions& o) {
  const int64_t smallest = std::min(std::min(o.idle_timeout_ms, o.header_timeout_ms),
                                    std::min(o.body_timeout_ms, o.write_timeout_ms));
  return std::clamp<int64_t>(smallest / 4, 5, 1000);
}

Loop::Loop(int index, const HttpCoreOptions& options, int max_connections, HttpHandler* handler,
           int listen_fd, std::shared_ptr<std::atomic<int64_t>> connections,
           std::shared_ptr<std::atomic<int64_t>> in_progress,
           std::shared_ptr<std::atomic<int64_t>> posted_unwritten,
           std::shared_ptr<std::atomic<int64_t>> receiving_body_bytes)
    : index_(index),
      options_(options),
      max_connections_(max_connections),
      sweep_interval_ms_(SweepInterval(options)),
      handler_(handler),
      listen_fd_(listen_fd),
      connections_(std::move(connections)),
      in_progress_(std::move(in_progress)),
      receiving_body_bytes_(std::move(receiving_body_bytes)),
      mailbox_(std::make_shared<Mailbox>()),
      now_ms_(NowMs()) {
  mailbox_->posted_unwritten = std::move(posted_unwritten);
}

Loop::~Loop() {
  if (thread_.joinable()) thread_.join();
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

Status Loop::Init() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return Internal(std::string("epoll_create1: ") + std::strerror(errno));
  mailbox_->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (mailbox_->event_fd < 0) return Internal(std::string("eventfd: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kMailboxId;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, mailbox_->event_fd, &ev) != 0) {
    return Internal(std::string("epoll_ctl: ") + std::strerror(errno));
  }
  return Listen(true);
}

void Loop::Start() {
  started_ = true;
  thread_ = std::thread([this] { Run(); });
}

bool Loop::RunTask(std::function<void()> task) {
  if (!started_) return false;
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  Mailbox::Item item;
  item.task = [task = std::move(task), done] {
    task();
    done->set_value();
  };
  if (!mailbox_->Post(std::move(item))) return false;
  future.wait();
  return true;
}

void Loop::StopAcceptingOnLoop() {
  (void)Listen(false);
  draining_ = true;
  for (auto& [id, c] : connections_map_) {
    if (c->dead || c->state != Connection::State::kReadingHead || c->buffered() != 0) continue;
    if (c->tls && !c->tls->handshake_done()) {
      Close(*c);  // no request yet, and none can be answered before the handshake
      continue;
    }
    // A request the client sent before the stop may still sit in the socket, unread: read
    // it now, so that it is answered (with Connection: close) rather than reset by the close.
    OnReadable(*c);
    if (c->dead) continue;
    if (c->state == Connection::State::kReadingHead && c->buffered() == 0) {
      // Idle: close our side but read (and drop) for a moment, so that a request that
      // crosses the close sees it end rather than a reset.
      ShutdownWrite(*c);
      c->state = Connection::State::kLingering;
      c->last_progress_ms = now_ms_;
    }
    UpdateInterest(*c);
  }
  EraseDead();
}

void Loop::Stop() {
  RunTask([this] { running_ = false; });
}

void Loop::Join() {
  if (thread_.joinable()) thread_.join();
}

void Loop::MakeResponder(HttpResponder* r, uint64_t connection, uint64_t sequence) {
  r->mailbox_ = mailbox_;
  r->connection_ = connection;
  r->sequence_ = sequence;
}

Status Loop::Listen(bool on) {
  if (on == listening_) return Status::Ok();
  if (on) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLEXCLUSIVE;
    ev.data.u64 = kListenerId;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
      return Internal(std::string("epoll_ctl(listener): ") + std::strerror(errno));
    }
  } else {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  }
  listening_ = on;
  return Status::Ok();
}

void Loop::Run() {
  NameCurrentThread(options_.thread_name + ":" + std::to_string(index_));
  std::vector<epoll_event> events(256);
  int64_t last_sweep = NowMs();
  while (running_) {
    int timeout = static_cast<int>(sweep_interval_ms_);
    if (accept_paused_until_ > 0) timeout = std::min(timeout, 100);
    if (!tls_ready_.empty()) timeout = 0;
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    now_ms_ = NowMs();
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kMailboxId) {
        ProcessMailbox();
      } else if (id == kListenerId) {
        Accept();
      } else {
        auto it = connections_map_.find(id);
        if (it != connections_map_.end() && !it->second->dead)
          OnEvent(*it->second, events[i].events);
      }
    }
    if (!tls_ready_.empty()) {
      std::vector<uint64_t> ready;
      ready.swap(tls_ready_);
      for (uint64_t id : ready) {
        auto it = connections_map_.find(id);
        if (it != connections_map_.end() && !it->second->dead &&
            (it->second->interest & EPOLLIN) != 0)
          OnEvent(*it->second, EPOLLIN);
      }
    }
    if (accept_paused_until_ > 0 && now_ms_ >= accept_paused_until_ && !draining_) {
      accept_paused_until_ = 0;
      if (!full_) (void)Listen(true);
    }
    if (now_ms_ - last_sweep >= sweep_interval_ms_) {
      last_sweep = now_ms_;
      Sweep();
    }
    EraseDead();
  }
  // Shut down: close every connection, then refuse further answers.
  (void)Listen(false);
  for (auto& [id, c] : connections_map_) Close(*c);
  EraseDead();
  std::vector<Mailbox::Item> dropped;
  {
    MutexLock lock(&mailbox_->mu);
    mailbox_->closed = true;
    dropped.swap(mailbox_->items);
  }
  for (auto& item : dropped) {
    if (item.connection != 0) mailbox_->posted_unwritten->fetch_sub(1);
    if (item.task) item.task();  // RunTask callers are waiting
  }
}

void Loop::Accept() {
  for (int i = 0; i < 64; ++i) {
    // At this loop's share of the cap, a new connection takes the place of the oldest
    // idle one; with none idle, it is left to the other loops or the listen backlog.
    Connection* evict = nullptr;
    if (static_cast<int64_t>(connections_map_.size()) >= max_connections_) {
      evict = OldestIdle();
      if (evict == nullptr) {
        full_ = true;
        (void)Listen(false);
        return;
      }
    }
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: stop polling the listener for a moment instead of spinning.
        (void)Listen(false);
        accept_paused_until_ = now_ms_ + 100;
      }
      return;
    }
    if (evict != nullptr) {
      Close(*evict);
      EraseDead();  // out of the map, which counts this loop's connections
    }
    connections_->fetch_add(1);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Connection>();
    c->id = next_id_++;
    c->fd = fd;
    c->last_progress_ms = now_ms_;
    c->accepted_ms = now_ms_;
    if (options_.tls != nullptr) {
      c->tls = TlsSession::Create(*options_.tls, fd);
      if (c->tls == nullptr) {  // out of memory
        connections_->fetch_sub(1);
        close(fd);
        continue;
      }
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      connections_->fetch_sub(1);
      close(fd);
      continue;
    }
    c->interest = ev.events;
    connections_map_.emplace(c->id, std::move(c));
  }
}

Connection* Loop::OldestIdle() {
  Connection* oldest = nullptr;
  for (auto& [id, cp] : connections_map_) {
    Connection& c = *cp;
    if (c.dead || c.state != Connection::State::kReadingHead || c.buffered() != 0) continue;
    // Idle since the earliest; within one millisecond, the older connection.
    if (oldest == nullptr || c.last_progress_ms < oldest->last_progress_ms ||
        (c.last_progress_ms == oldest->last_progress_ms && c.id < oldest->id))
      oldest = &c;
  }
  return oldest;
}

void Loop::ResumeAcceptingIfFull() {
  if (!full_ || draining_ || !running_) return;
  full_ = false;
  if (accept_paused_until_ == 0) (void)Listen(true);
}

void Loop::OnEvent(Connection& c, uint32_t events) {
  if (events & EPOLLERR) return Close(c);
  if (c.tls && !c.tls->handshake_done()) {
    ContinueHandshake(c);
    if (!c.dead) UpdateInterest(c);
    return;
  }
  const bool waiting =
      c.state == Connection::State::kWaiting || c.state == Connection::State::kWriting;
  // The client shut its side while its request is in progress: it is gone (and with
  // level-triggered events, ignoring this would spin).
  if (waiting && (events & (EPOLLRDHUP | EPOLLHUP))) return Close(c);
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) {
    OnReadable(c);
    if (c.dead) return;
  }
  // A TLS read that had to write (a key update) goes on when the socket is writable; a
  // TLS write that had to read, when it is readable.
  if ((events & EPOLLOUT) && c.tls_read_wants_write) {
    OnReadable(c);
    if (c.dead) return;
  }
  if ((events & EPOLLOUT) || ((events & EPOLLIN) && c.tls_write_wants_read)) Flush(c);
  if (!c.dead) UpdateInterest(c);
}

void Loop::ContinueHandshake(Connection& c) {
  c.tls_handshake_wants_write = false;
  switch (c.tls->Handshake()) {
    case TlsSession::Io::kOk:
      c.last_progress_ms = now_ms_;
      return OnReadable(c);  // a request may have come right behind the handshake
    case TlsSession::Io::kWantRead:
      return;
    case TlsSession::Io::kWantWrite:
      c.tls_handshake_wants_write = true;
      return;
    case TlsSession::Io::kClosed:
      return Close(c);
    case TlsSession::Io::kError:
      if (c.tls->plaintext_http()) {
        // A plain HTTP request on the TLS port: say so in plain HTTP, then close.
        c.tls.reset();
        return Fail(c, 400, "this port speaks HTTPS (TLS); the request was sent as plain HTTP");
      }
      return Close(c);
  }
}

ssize_t Loop::Receive(Connection& c, char* dst, size_t n) {
  if (!c.tls) return recv(c.fd, dst, n, 0);
  c.tls_read_wants_write = false;
  size_t got = 0;
  switch (c.tls->Read(dst, n, &got)) {
    case TlsSession::Io::kOk:
      return static_cast<ssize_t>(got);
    case TlsSession::Io::kWantWrite:
      c.tls_read_wants_write = true;
      errno = EAGAIN;
      return -1;
    case TlsSession::Io::kWantRead:
      errno = EAGAIN;
      return -1;
    case TlsSession::Io::kClosed:
      return 0;
    case TlsSession::Io::kError:
      break;
  }
  errno = ECONNRESET;
  return -1;
}

ssize_t Loop::Send(Connection& c, const iovec* iov, int count) {
  if (!c.tls) {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(count);
    return sendmsg(c.fd, &msg, MSG_NOSIGNAL);
  }
  // One TLS write: the first piece, or, when it is shorter than a record, the pieces
  // coalesced up to one record (a head and a short body then go out as one). Retried
  // after kWant*, this starts with the same bytes and is no shorter, as OpenSSL needs.
  constexpr size_t kRecord = 16 << 10;
  const char* src = static_cast<const char*>(iov[0].iov_base);
  size_t len = iov[0].iov_len;
  if (len < kRecord && count > 1) {
    tls_scratch_.clear();
    for (int i = 0; i < count && tls_scratch_.size() < kRecord; ++i) {
      const size_t take = std::min(iov[i].iov_len, kRecord - tls_scratch_.size());
      tls_scratch_.append(static_cast<const char*>(iov[i].iov_base), take);
    }
    src = tls_scratch_.data();
    len = tls_scratch_.size();
  }
  c.tls_write_wants_read = false;
  size_t written = 0;
  switch (c.tls->Write(src, len, &written)) {
    case TlsSession::Io::kOk:
      return static_cast<ssize_t>(written);
    case TlsSession::Io::kWantRead:
      c.tls_write_wants_read = true;
      errno = EAGAIN;
      return -1;
    case TlsSession::Io::kWantWrite:
      errno = EAGAIN;
      return -1;
    case TlsSession::Io::kClosed:
    case TlsSession::Io::kError:
      break;
  }
  errno = EPIPE;
  return -1;
}

void Loop::ShutdownWrite(Connection& c) {
  if (c.tls) c.tls->Shutdown();
  shutdown(c.fd, SHUT_WR);
}

void Loop::UpdateInterest(Connection& c) {
  uint32_t want = EPOLLRDHUP;
  if (c.tls && !c.tls->handshake_done()) {
    want |= c.tls_handshake_wants_write ? EPOLLOUT : EPOLLIN;
  } else {
    const bool waiting =
        c.state == Connection::State::kWaiting || c.state == Connection::State::kWriting;
    if (!waiting || c.buffered() < PipelineCap()) want |= EPOLLIN;
    if (!c.out.empty() || c.tls_read_wants_write) want |= EPOLLOUT;
    if (c.tls_write_wants_read) want |= EPOLLIN;
    if (c.tls && (want & EPOLLIN) && c.state != Connection::State::kLingering &&
        c.tls->HasPending())
      tls_ready_.push_back(c.id);
  }
  if (want == c.interest) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) == 0) c.interest = want;
}

void Loop::Close(Connection& c) {
  if (c.dead) return;
  c.dead = true;
  if (c.cancel) {
    auto cancel = std::move(c.cancel);
    c.cancel = nullptr;
    try {
      cancel();
    } catch (const std::exception&) {
    }
  }
  FinishRequest(c);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  if (c.tls) {
    c.tls->Shutdown();  // close_notify, when the session is healthy and not yet shut
    c.tls.reset();
  }
  close(c.fd);
  c.fd = -1;
  c.out.clear();
  ReleaseBody(c);
  c.body.reset();
  connections_->fetch_sub(1);
  dead_.push_back(c.id);
  ResumeAcceptingIfFull();
}

void Loop::EraseDead() {
  for (uint64_t id : dead_) connections_map_.erase(id);
  dead_.clear();
}

void Loop::Sweep() {
  for (auto& [id, cp] : connections_map_) {
    Connection& c = *cp;
    if (c.dead) continue;
    switch (c.state) {
      case Connection::State::kReadingHead:
        if (c.tls && !c.tls->handshake_done()) {
          if (draining_ || now_ms_ - c.accepted_ms > options_.header_timeout_ms) Close(c);
        } else if (c.head_started_ms < 0) {
          if (draining_ || now_ms_ - c.last_progress_ms > options_.idle_timeout_ms) Close(c);
        } else if (now_ms_ - c.head_started_ms > options_.header_timeout_ms) {
          Fail(c, 408,
               "the request head was not complete within " +
                   std::to_string(options_.header_timeout_ms) + " ms");
        }
        break;
      case Connection::State::kReadingBody:
        if (now_ms_ - c.body_started_ms > options_.body_timeout_ms) {
          Fail(c, 408,
               "the request body was not complete within " +
                   std::to_string(options_.body_timeout_ms) + " ms");
        }
        break;
      case Connection::State::kWriting:
        if (now_ms_ - c.last_progress_ms > options_.write_timeout_ms) Close(c);
        break;
      case Connection::State::kLingering:
        if (now_ms_ - c.last_progress_ms > kLingerMs) Close(c);
        break;
      case Connection::State::kWaiting:
        break;
    }
  }
}

}  // namespace shoal::server::internal
