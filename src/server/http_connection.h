// Connection: the state one accepted socket carries between the events of its Loop
// (http_loop.h). Internal to the HTTP front end; touched only on that loop's thread.
//
// A request moves kReadingHead -> kReadingBody -> kWaiting (the handler has it) ->
// kWriting (its answer is going out), then back to kReadingHead for the next request on
// a keep-alive connection, or to kLingering (our side shut, the client's late bytes read
// and dropped) until the close. A malformed request goes from either reading state
// straight to kWriting with its error; draining moves an idle connection from
// kReadingHead to kLingering.
//
// On a TLS port a connection first completes its handshake (tls->handshake_done()) in
// kReadingHead, reading or writing as the handshake asks (tls_handshake_wants_write),
// then reads and writes through the session; the tls_*_wants_* flags record that a
// read needs the socket writable or a write needs it readable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "proto/http_message.h"
#include "server/tls.h"

namespace shoal::server::internal {

// One piece of a connection's output: bytes it owns (a response head, a body), or a chunk
// the response lent, written without a copy.
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
  int64_t last_progress_ms = 0;  // last byte read or written (idle since, between requests)
  int64_t head_started_ms = -1;  // first byte of the head being read; -1 when none
  int64_t body_started_ms = 0;   // end of the head whose body is being read
  size_t body_charged = 0;       // bytes of `body` charged to the receiving-body budget
  size_t lingered = 0;
  // TLS (null on a plaintext port).
  std::unique_ptr<TlsSession> tls;
  int64_t accepted_ms = 0;  // the handshake must be done header_timeout_ms after this
  bool tls_handshake_wants_write = false;
  bool tls_read_wants_write = false;
  bool tls_write_wants_read = false;

  size_t buffered() const { return in->size() - in_pos; }
};

}  // namespace shoal::server::internal
