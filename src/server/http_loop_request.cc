// Loop, request side: reading from the socket, parsing the head, taking the body
// (Content-Length or chunked, 100-continue) and handing the request to the handler.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "server/http_connection.h"
#include "server/http_loop.h"

namespace shoal::server::internal {
namespace {

constexpr size_t kReadChunk = 16 << 10;
// A body's first buffer (or the whole body, when smaller): most infer requests fit.
constexpr size_t kInitialBody = 64 << 10;
constexpr size_t kLingerMaxBytes = 1 << 20;

}  // namespace

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
      // Straight into the body, which grows as its bytes arrive (not to the declared
      // length at once: a head alone must not make the server allocate that).
      const size_t declared = static_cast<size_t>(c.head.content_length);
      if (c.body->size() == c.body->capacity() && c.body->size() < declared &&
          !GrowBody(c, c.body->size() + 1, declared))
        return;
      dst = c.body->data() + c.body->size();
      room = c.body->capacity() - c.body->size();
    } else {
      if (c.in->capacity() - c.in->size() < kReadChunk)
        c.in->Reserve(std::max(c.in->size() + kReadChunk, 2 * c.in->capacity()));
      dst = c.in->data() + c.in->size();
      room = kReadChunk;
    }
    if (room == 0) return Advance(c);
    const ssize_t n = Receive(c, dst, room);
    if (!direct && n > 0) c.in->set_size(c.in->size() + static_cast<size_t>(n));
    if (n > 0) {
      c.last_progress_ms = now_ms_;
      if (direct) c.body->set_size(c.body->size() + static_cast<size_t>(n));
      Advance(c);
      if (c.dead) return;
      // Plaintext: a short read emptied the socket. TLS hands out one record per read,
      // so it reads on until the session wants more from the socket.
      if (static_cast<size_t>(n) < room && !c.tls) return;
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
      if (c.head_started_ms < 0) c.head_started_ms = now_ms_;
      const std::string_view avail(c.in->data() + c.in_pos, c.buffered());
      const int64_t end = proto::FindHeadEnd(avail, c.head_scan);
      if (end < 0) {
        return Fail(c, 400,
                    "a line of the request head ends with a bare LF; lines must end with CRLF");
      }
      if (end == 0) {
        c.head_scan = avail.size();
        if (avail.size() > static_cast<size_t>(options_.max_header_bytes)) {
          return Fail(c, 431,
                      "the request head is larger than " +
                          std::to_string(options_.max_header_bytes) + " bytes");
        }
        return;
      }
      const size_t head_len = static_cast<size_t>(end);
      if (head_len > static_cast<size_t>(options_.max_header_bytes)) {
        return Fail(c, 431,
                    "the request head is larger than " + std::to_string(options_.max_header_bytes) +
                        " bytes");
      }
      c.head = proto::HttpRequestHead();
      proto::HttpError err = proto::ParseRequestHead(avail.substr(0, head_len), &c.head);
      c.in_pos += head_len;
      c.head_scan = 0;
      c.head_started_ms = -1;
      c.body_started_ms = now_ms_;
      if (!err.ok()) return Fail(c, err.status, err.message);
      c.head_only = c.head.method == "HEAD";
      if (!c.head.chunked && c.head.content_length > options_.max_body_bytes) {
        return Fail(c, 413,
                    "the request body (" + std::to_string(c.head.content_length) +
                        " bytes) is larger than the limit of " +
                        std::to_string(options_.max_body_bytes));
      }
      try {
        c.body = proto::BodyBuffer::Create(0, handler_->BodyAlignment(c.head));
      } catch (const std::exception&) {
        return Fail(c, 503, "out of memory for the request body");
      }
      // The first piece of the body; the rest grows with what arrives.
      const size_t initial = std::min<size_t>(
          c.head.chunked ? static_cast<size_t>(options_.max_body_bytes) : c.head.content_length,
          kInitialBody);
      if (initial > 0 && !GrowBody(c, initial, initial)) return;
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
        const size_t declared = static_cast<size_t>(c.head.content_length);
        const size_t n = std::min(declared - c.body->size(), c.buffered());
        if (c.body->size() + n > c.body->capacity() && !GrowBody(c, c.body->size() + n, declared))
          return;
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
  if (r == proto::ChunkedDecoder::Result::kError) {
    Fail(c, error.status, error.message);
    return false;
  }
  // The decoder grows the body with the data it copies; charged once it has (so the
  // budget may be overrun by one growth of one connection's buffer).
  if (c.body->capacity() > c.body_charged && !ChargeBody(c, c.body->capacity())) {
    FailOverBudget(c);
    return false;
  }
  return r == proto::ChunkedDecoder::Result::kDone;
}

bool Loop::ChargeBody(Connection& c, size_t new_capacity) {
  if (new_capacity <= c.body_charged) return true;
  const auto delta = static_cast<int64_t>(new_capacity - c.body_charged);
  if (receiving_body_bytes_->fetch_add(delta) + delta > options_.receiving_body_budget_bytes) {
    receiving_body_bytes_->fetch_sub(delta);
    return false;
  }
  c.body_charged = new_capacity;
  return true;
}

void Loop::ReleaseBody(Connection& c) {
  if (c.body_charged == 0) return;
  receiving_body_bytes_->fetch_sub(static_cast<int64_t>(c.body_charged));
  c.body_charged = 0;
}

bool Loop::GrowBody(Connection& c, size_t need, size_t limit) {
  const size_t capacity = std::min(limit, std::max(need, 2 * c.body->capacity()));
  if (!ChargeBody(c, capacity)) {
    FailOverBudget(c);
    return false;
  }
  try {
    c.body->Reserve(capacity);
  } catch (const std::exception&) {
    Fail(c, 503, "out of memory for the request body");
    return false;
  }
  return true;
}

void Loop::FailOverBudget(Connection& c) {
  Fail(c, 503,
       "the server is receiving too many request bodies at once (more than " +
           std::to_string(options_.receiving_body_budget_bytes) + " bytes); retry later",
       {{"Retry-After", "1"}});
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
  ReleaseBody(c);  // the body is the request's now, no longer being received
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

}  // namespace shoal::server::internal
