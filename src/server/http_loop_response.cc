// Loop, response side: taking answers from the mailbox, serializing them into the
// connection's output, writing it out, and what follows (the next pipelined request, or a
// lingering close).
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <exception>

#include "server/http_connection.h"
#include "server/http_loop.h"

namespace shoal::server::internal {

void Loop::ProcessMailbox() {
  uint64_t value;
  [[maybe_unused]] ssize_t r = read(mailbox_->event_fd, &value, sizeof(value));
  std::vector<Mailbox::Item> items;
  {
    MutexLock lock(&mailbox_->mu);
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

void Loop::Fail(Connection& c, int status, const std::string& message,
                std::vector<std::pair<std::string, std::string>> headers) {
  if (c.state == Connection::State::kWaiting || c.state == Connection::State::kWriting)
    return Close(c);
  c.in->set_size(0);
  c.in_pos = 0;
  c.keep_alive = false;
  if (c.head.minor_version == 0 || c.head.minor_version == 1)
    c.minor_version = c.head.minor_version;
  ReleaseBody(c);
  proto::HttpResponse r = proto::HttpResponse::Error(status, message);
  r.headers = std::move(headers);
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
    const ssize_t n = Send(c, iov, count);
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
    ShutdownWrite(c);
    c.state = Connection::State::kLingering;
    c.last_progress_ms = now_ms_;
    return;
  }
  c.state = Connection::State::kReadingHead;
  c.head = proto::HttpRequestHead();
  c.body.reset();
  CompactInput(c);
  Advance(c);
  if (!c.dead && c.state == Connection::State::kReadingHead && c.buffered() == 0)
    ResumeAcceptingIfFull();  // an idle connection can make room for a new one
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

}  // namespace shoal::server::internal
