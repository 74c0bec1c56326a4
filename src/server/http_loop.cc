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
    // A request the client sent before the stop may still sit in the socket, unread: read
    // it now, so that it is answered (with Connection: close) rather than reset by the close.
    OnReadable(*c);
    if (c->dead) continue;
    if (c->state == Connection::State::kReadingHead && c->buffered() == 0) {
      // Idle: close our side but read (and drop) for a moment, so that a request that
      // crosses the close sees it end rather than a reset.
      shutdown(c->fd, SHUT_WR);
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
  const bool waiting =
      c.state == Connection::State::kWaiting || c.state == Connection::State::kWriting;
  // The client shut its side while its request is in progress: it is gone (and with
  // level-triggered events, ignoring this would spin).
  if (waiting && (events & (EPOLLRDHUP | EPOLLHUP))) return Close(c);
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) {
    OnReadable(c);
    if (c.dead) return;
  }
  if (events & EPOLLOUT) Flush(c);
  if (!c.dead) UpdateInterest(c);
}

void Loop::UpdateInterest(Connection& c) {
  uint32_t want = EPOLLRDHUP;
  const bool waiting =
      c.state == Connection::State::kWaiting || c.state == Connection::State::kWriting;
  if (!waiting || c.buffered() < PipelineCap()) want |= EPOLLIN;
  if (!c.out.empty()) want |= EPOLLOUT;
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
        if (c.head_started_ms < 0) {
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
