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
#include <deque>
#include <future>
#include <memory>

#include "core/thread_util.h"

namespace shoal::server::internal {
namespace {

constexpr uint64_t kMailboxId = 0;
constexpr uint64_t kListenerId = 1;
constexpr size_t kReadChunk = 16 << 10;
constexpr int64_t kLingerMs = 2000;
constexpr size_t kLingerMaxBytes = 1 << 20;

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
    std::lock_guard<std::mutex> lock(mu);
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

struct OutPiece {
  std::string owned;
  proto::BodyChunk external;
  bool is_owned = true;
  std::string_view bytes() const { return is_owned ? std::string_view(owned) : external.bytes; }
};

struct Connection {
  enum class State { kReadingHead, kReadingBody, kWaiting, kWriting, kLingering };

  uint64_t id = 0;
  int fd = -1;
  bool dead = false;
  State state = State::kReadingHead;
  // Bytes read and not yet consumed. A proto::BodyBuffer grows without zeroing what each recv
  // is about to overwrite (zeroing a 16 KiB chunk per recv was 4% of the serving profile).
  std::shared_ptr<proto::BodyBuffer> in = proto::BodyBuffer::Create(0);
  size_t in_pos = 0;
  size_t head_scan = 0;         // offset from in_pos already searched for the blank line
  proto::HttpRequestHead head;  // moved to the handler on dispatch
  bool keep_alive = true;       // of the request in progress
  int minor_version = 1;
  std::shared_ptr<proto::BodyBuffer> body;
  std::unique_ptr<proto::ChunkedDecoder> chunked;  // while reading a chunked body
  uint64_t sequence = 0;
  std::function<void()> cancel;
  bool in_progress = false;     // counted in in_progress_
  bool counted_posted = false;  // counted in posted_unwritten
  bool close_after_write = false;
  bool head_only = false;  // HEAD request: no body bytes
  std::deque<OutPiece> out;
  size_t out_offset = 0;  // into out.front()
  uint32_t interest = 0;
  int64_t last_progress_ms = 0;
  size_t lingered = 0;

  size_t buffered() const { return in->size() - in_pos; }
};

Loop::Loop(int index, const HttpCoreOptions& options, HttpHandler* handler, int listen_fd,
           std::shared_ptr<std::atomic<int64_t>> connections,
           std::shared_ptr<std::atomic<int64_t>> in_progress,
           std::shared_ptr<std::atomic<int64_t>> posted_unwritten)
    : index_(index),
      options_(options),
      handler_(handler),
      listen_fd_(listen_fd),
      connections_(std::move(connections)),
      in_progress_(std::move(in_progress)),
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
    int timeout = 1000;
    if (accept_paused_until_ > 0) timeout = 100;
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
      (void)Listen(true);
    }
    if (now_ms_ - last_sweep >= 1000) {
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
    std::lock_guard<std::mutex> lock(mailbox_->mu);
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
    if (connections_->fetch_add(1) >= options_.max_connections) {
      connections_->fetch_sub(1);
      close(fd);
      continue;
    }
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

void Loop::OnReadable(Connection& c) {
  for (int round = 0; round < 8; ++round) {
    if (c.state == Connection::State::kLingering) {
      char scratch[4096];
      const ssize_t n = recv(c.fd, scratch, sizeof(scratch), 0);
      if (n > 0) {
        c.lingered += static_cast<size_t>(n);
        if (c.lingered > kLingerMaxBytes) return Close(c);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      return Close(c);
    }
    const bool waiting =
        c.state == Connection::State::kWaiting || c.state == Connection::State::kWriting;
    if (waiting && c.buffered() >= PipelineCap())
      return;  // read interest is off; see UpdateInterest
    char* dst;
    size_t room;
    const bool direct =
        c.state == Connection::State::kReadingBody && !c.head.chunked && c.buffered() == 0;
    if (direct) {
      dst = c.body->data() + c.body->size();
      room = static_cast<size_t>(c.head.content_length) - c.body->size();
    } else {
      if (c.in->capacity() - c.in->size() < kReadChunk)
        c.in->Reserve(std::max(c.in->size() + kReadChunk, 2 * c.in->capacity()));
      dst = c.in->data() + c.in->size();
      room = kReadChunk;
    }
    if (room == 0) return Advance(c);
    const ssize_t n = recv(c.fd, dst, room, 0);
    if (!direct && n > 0) c.in->set_size(c.in->size() + static_cast<size_t>(n));
    if (n > 0) {
      c.last_progress_ms = now_ms_;
      if (direct) c.body->set_size(c.body->size() + static_cast<size_t>(n));
      Advance(c);
      if (c.dead) return;
      if (static_cast<size_t>(n) < room) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    // EOF or error: the client is gone (a half-close counts as going away).
    return Close(c);
  }
}

void Loop::Advance(Connection& c) {
  while (!c.dead) {
    if (c.state == Connection::State::kReadingHead) {
      if (c.buffered() == 0) return;
      const std::string_view avail(c.in->data() + c.in_pos, c.buffered());
      const size_t from = c.head_scan >= 3 ? c.head_scan - 3 : 0;
      const size_t end = avail.find("\r\n\r\n", from);
      if (end == std::string_view::npos) {
        c.head_scan = avail.size();
        if (avail.size() > static_cast<size_t>(options_.max_header_bytes)) {
          return Fail(c, 431,
                      "the request head is larger than " +
                          std::to_string(options_.max_header_bytes) + " bytes");
        }
        return;
      }
      const size_t head_len = end + 4;
      if (head_len > static_cast<size_t>(options_.max_header_bytes)) {
        return Fail(c, 431,
                    "the request head is larger than " + std::to_string(options_.max_header_bytes) +
                        " bytes");
      }
      c.head = proto::HttpRequestHead();
      proto::HttpError err = proto::ParseRequestHead(avail.substr(0, head_len), &c.head);
      c.in_pos += head_len;
      c.head_scan = 0;
      if (!err.ok()) return Fail(c, err.status, err.message);
      c.head_only = c.head.method == "HEAD";
      if (!c.head.chunked && c.head.content_length > options_.max_body_bytes) {
        return Fail(c, 413,
                    "the request body (" + std::to_string(c.head.content_length) +
                        " bytes) is larger than the limit of " +
                        std::to_string(options_.max_body_bytes));
      }
      size_t align_at = 0;
      try {
        align_at = handler_->BodyAlignment(c.head);
        const size_t initial = c.head.chunked ? std::min<size_t>(options_.max_body_bytes, 16 << 10)
                                              : static_cast<size_t>(c.head.content_length);
        c.body = proto::BodyBuffer::Create(initial, align_at);
      } catch (const std::exception&) {
        return Fail(c, 503, "out of memory for the request body");
      }
      if (c.head.chunked)
        c.chunked = std::make_unique<proto::ChunkedDecoder>(options_.max_body_bytes,
                                                            options_.max_header_bytes);
      c.state = Connection::State::kReadingBody;
      if (c.head.expect_continue && !BodyComplete(c)) {
        OutPiece p;
        p.owned = "HTTP/1.1 100 Continue\r\n\r\n";
        c.out.push_back(std::move(p));
        Flush(c);
        if (c.dead) return;
      }
      continue;
    }
    if (c.state == Connection::State::kReadingBody) {
      if (c.head.chunked) {
        if (!DecodeChunks(c)) return;
      } else {
        const size_t want = static_cast<size_t>(c.head.content_length) - c.body->size();
        const size_t n = std::min(want, c.buffered());
        if (n > 0) {
          std::memcpy(c.body->data() + c.body->size(), c.in->data() + c.in_pos, n);
          c.body->set_size(c.body->size() + n);
          c.in_pos += n;
        }
        if (!BodyComplete(c)) return;
      }
      CompactInput(c);
      return Dispatch(c);
    }
    return;
  }
}

bool Loop::BodyComplete(const Connection& c) const {
  return !c.head.chunked && c.body->size() == static_cast<size_t>(c.head.content_length);
}

bool Loop::DecodeChunks(Connection& c) {
  size_t consumed = 0;
  proto::HttpError error;
  proto::ChunkedDecoder::Result r;
  try {
    r = c.chunked->Feed(std::string_view(c.in->data() + c.in_pos, c.buffered()), &consumed,
                        c.body.get(), &error);
  } catch (const std::exception&) {
    r = proto::ChunkedDecoder::Result::kError;
    error = proto::HttpError{503, "out of memory for the request body"};
  }
  c.in_pos += consumed;
  if (r == proto::ChunkedDecoder::Result::kError) Fail(c, error.status, error.message);
  return r == proto::ChunkedDecoder::Result::kDone;
}

void Loop::CompactInput(Connection& c) {
  if (c.in_pos == c.in->size()) {
    c.in->set_size(0);
    c.in_pos = 0;
  } else if (c.in_pos > (64 << 10)) {
    std::memmove(c.in->data(), c.in->data() + c.in_pos, c.in->size() - c.in_pos);
    c.in->set_size(c.in->size() - c.in_pos);
    c.in_pos = 0;
  }
}

void Loop::Dispatch(Connection& c) {
  c.state = Connection::State::kWaiting;
  c.in_progress = true;
  in_progress_->fetch_add(1);
  HttpRequest request;
  c.keep_alive = c.head.keep_alive;
  c.minor_version = c.head.minor_version;
  request.head = std::move(c.head);
  request.body = std::move(c.body);
  c.chunked.reset();
  HttpResponder responder;
  MakeResponder(&responder, c.id, ++c.sequence);
  try {
    c.cancel = handler_->Handle(std::move(request), responder);
  } catch (const std::exception& ex) {
    c.cancel = nullptr;
    responder.Send(proto::HttpResponse::Error(500, std::string("internal error: ") + ex.what()));
  }
}

void Loop::ProcessMailbox() {
  uint64_t value;
  [[maybe_unused]] ssize_t r = read(mailbox_->event_fd, &value, sizeof(value));
  std::vector<Mailbox::Item> items;
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    items.swap(mailbox_->items);
  }
  for (auto& item : items) {
    if (item.connection == 0) {
      if (item.task) item.task();
      continue;
    }
    auto it = connections_map_.find(item.connection);
    if (it == connections_map_.end() || it->second->dead || it->second->sequence != item.sequence ||
        it->second->state != Connection::State::kWaiting) {
      mailbox_->posted_unwritten->fetch_sub(1);
      continue;
    }
    Connection& c = *it->second;
    c.counted_posted = true;
    c.cancel = nullptr;
    proto::HttpResponse response;
    if (item.make) {
      try {
        response = item.make();
      } catch (const std::exception& ex) {
        response = proto::HttpResponse::Error(500, std::string("internal error: ") + ex.what());
      }
    } else {
      response = std::move(item.response);
    }
    QueueResponse(c, std::move(response));
    if (!c.dead) UpdateInterest(c);
  }
}

void Loop::QueueResponse(Connection& c, proto::HttpResponse response) {
  const bool keep_alive = c.keep_alive && !response.close && !draining_;
  OutPiece head;
  head.owned = proto::SerializeResponseHead(response, keep_alive, c.minor_version);
  c.out.push_back(std::move(head));
  if (!c.head_only) {
    if (!response.body.empty()) {
      OutPiece body;
      body.owned = std::move(response.body);
      c.out.push_back(std::move(body));
    }
    for (auto& chunk : response.tail) {
      if (chunk.bytes.empty()) continue;
      OutPiece p;
      p.is_owned = false;
      p.external = std::move(chunk);
      c.out.push_back(std::move(p));
    }
  }
  c.close_after_write = !keep_alive;
  c.state = Connection::State::kWriting;
  c.last_progress_ms = now_ms_;
  Flush(c);
}

void Loop::Fail(Connection& c, int status, const std::string& message) {
  if (c.state == Connection::State::kWaiting || c.state == Connection::State::kWriting)
    return Close(c);
  c.in->set_size(0);
  c.in_pos = 0;
  c.keep_alive = false;
  if (c.head.minor_version == 0 || c.head.minor_version == 1)
    c.minor_version = c.head.minor_version;
  proto::HttpResponse r = proto::HttpResponse::Error(status, message);
  r.close = true;
  QueueResponse(c, std::move(r));
}

void Loop::Flush(Connection& c) {
  while (!c.out.empty()) {
    iovec iov[16];
    int count = 0;
    for (size_t i = 0; i < c.out.size() && count < 16; ++i) {
      std::string_view b = c.out[i].bytes();
      if (i == 0) b.remove_prefix(c.out_offset);
      iov[count].iov_base = const_cast<char*>(b.data());
      iov[count].iov_len = b.size();
      ++count;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = sendmsg(c.fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return Close(c);
    }
    c.last_progress_ms = now_ms_;
    size_t left = static_cast<size_t>(n);
    while (left > 0 && !c.out.empty()) {
      const size_t piece = c.out.front().bytes().size() - c.out_offset;
      if (left >= piece) {
        left -= piece;
        c.out.pop_front();
        c.out_offset = 0;
      } else {
        c.out_offset += left;
        left = 0;
      }
    }
  }
  if (!c.out.empty() || c.state != Connection::State::kWriting) return;
  FinishRequest(c);
  if (c.close_after_write) {
    // Lingering close: stop sending, but read (and drop) what the client still sends
    // for a moment, so that it sees our answer rather than a reset.
    shutdown(c.fd, SHUT_WR);
    c.state = Connection::State::kLingering;
    c.last_progress_ms = now_ms_;
    return;
  }
  c.state = Connection::State::kReadingHead;
  c.head = proto::HttpRequestHead();
  c.body.reset();
  CompactInput(c);
  Advance(c);
}

void Loop::FinishRequest(Connection& c) {
  if (c.counted_posted) {
    c.counted_posted = false;
    mailbox_->posted_unwritten->fetch_sub(1);
  }
  if (c.in_progress) {
    c.in_progress = false;
    in_progress_->fetch_sub(1);
  }
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
  c.body.reset();
  connections_->fetch_sub(1);
  dead_.push_back(c.id);
}

void Loop::EraseDead() {
  for (uint64_t id : dead_) connections_map_.erase(id);
  dead_.clear();
}

void Loop::Sweep() {
  for (auto& [id, cp] : connections_map_) {
    Connection& c = *cp;
    if (c.dead) continue;
    const int64_t quiet = now_ms_ - c.last_progress_ms;
    switch (c.state) {
      case Connection::State::kReadingHead:
        if (c.buffered() == 0) {
          if (draining_ || quiet > options_.idle_timeout_ms) Close(c);
        } else if (quiet > options_.io_timeout_ms) {
          Close(c);
        }
        break;
      case Connection::State::kReadingBody:
      case Connection::State::kWriting:
        if (quiet > options_.io_timeout_ms) Close(c);
        break;
      case Connection::State::kLingering:
        if (quiet > kLingerMs) Close(c);
        break;
      case Connection::State::kWaiting:
        break;
    }
  }
}

}  // namespace shoal::server::internal
