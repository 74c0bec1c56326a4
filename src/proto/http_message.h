// HTTP/1.1 messages, both ways, for everything in shoal that speaks HTTP: the server's
// front end (requests in, responses out), the load generator and the test client
// (requests out, responses in). Pure functions and small state machines, no sockets, so
// the parsing that faces the network is unit-tested and fuzzed in one place.
//
// ParseRequestHead / ParseResponseHead take one complete head block (start line and
// header lines, up to and including the blank line). Both accept only what RFC 9112
// allows where ambiguity could be abused: CRLF line ends (a bare LF is a 400, never a
// wait for a CRLF that will not come), no obsolete line folding, no
// whitespace before a header's colon, one Content-Length value (repeats must agree),
// never both Content-Length and Transfer-Encoding. Errors carry the HTTP status a
// server answers with (400, 417, 431, 501, 505) and a message.
//
// BodyBuffer is where a request body is received: 64-byte aligned at a chosen byte
// (so the binary tensors that follow the JSON header of an infer request can be used
// in place), with BodyBuffer::kPadding readable bytes past the end (simdjson reads up to
// 64 bytes past a document). ChunkedDecoder decodes a chunked body into one.
//
// HttpResponse and SerializeResponseHead are what a server sends; SerializeRequestHead
// and HttpResponseReader are a client's side: the reader takes the bytes of a
// connection as they arrive and yields one response at a time (Content-Length or
// chunked bodies; interim 1xx responses skipped).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace shoal::proto {

struct HttpHeader {
  std::string name;   // lower case
  std::string value;  // surrounding whitespace removed
};

struct HttpRequestHead {
  std::string method;     // as sent, e.g. "GET"
  std::string target;     // as sent, e.g. "/v2/models/m/infer?x=1"
  std::string path;       // the target's path, still percent-encoded
  std::string query;      // after '?', without it
  int minor_version = 1;  // HTTP/1.<minor_version>
  std::vector<HttpHeader> headers;
  int64_t content_length = 0;  // 0 when absent
  bool has_content_length = false;
  bool chunked = false;          // Transfer-Encoding: chunked
  bool keep_alive = true;        // from the version and Connection
  bool expect_continue = false;  // Expect: 100-continue

  // The first header of that (lower-case) name, or null.
  const std::string* Find(std::string_view lower_name) const;
};

struct HttpResponseHead {
  int minor_version = 1;  // HTTP/1.<minor_version>
  int status = 0;         // e.g. 200
  std::string reason;     // as sent; may be empty
  std::vector<HttpHeader> headers;
  int64_t content_length = 0;  // 0 when absent
  bool has_content_length = false;
  bool chunked = false;    // Transfer-Encoding: chunked
  bool keep_alive = true;  // from the version and Connection

  // The first header of that (lower-case) name, or null.
  const std::string* Find(std::string_view lower_name) const;
};

// An HTTP status to answer with and a message; status 0 means no error.
struct HttpError {
  int status = 0;
  std::string message;
  bool ok() const { return status == 0; }
};

// Where the head that starts `buffered` ends: its length through the blank line
// ("\r\n\r\n"), 0 while it is incomplete, or -1 when a line ends with a bare LF (no CR
// before it), which the parser refuses (400) rather than wait for a CRLF that a client
// writing bare LFs never sends. `scanned` is what an earlier call already searched (its
// buffered.size()); pass 0 the first time.
int64_t FindHeadEnd(std::string_view buffered, size_t scanned);

// `block` is the head through its terminating "\r\n\r\n".
HttpError ParseRequestHead(std::string_view block, HttpRequestHead* head);
HttpError ParseResponseHead(std::string_view block, HttpResponseHead* head);

// Splits an (encoded) path into percent-decoded segments, dropping empty ones
// ("/v2//models/" -> {"v2", "models"}). INVALID_ARGUMENT for a bad escape or %00.
StatusOr<std::vector<std::string>> SplitPath(std::string_view path);

// "OK", "Not Found", ... ("Unknown" for codes without a phrase here).
std::string_view ReasonPhrase(int status);

// Case-insensitive ASCII comparison.
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

// Parses a non-negative decimal integer with no sign, spaces or overflow; -1 if invalid.
int64_t ParseDecimal(std::string_view s);

class BodyBuffer {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kPadding = 64;

  // Room for `capacity` bytes; byte `align_at` of the body (clamped to `capacity`) lies
  // on a kAlignment boundary. Throws std::bad_alloc like new.
  static std::shared_ptr<BodyBuffer> Create(size_t capacity, size_t align_at = 0);
  ~BodyBuffer();
  BodyBuffer(const BodyBuffer&) = delete;
  BodyBuffer& operator=(const BodyBuffer&) = delete;

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  void set_size(size_t size) { size_ = size; }  // size <= capacity
  std::string_view view() const { return {data_, size_}; }
  // Grows the capacity (copying the content, keeping the alignment of align_at).
  void Reserve(size_t capacity);

 private:
  BodyBuffer() = default;
  char* block_ = nullptr;  // the allocation
  char* data_ = nullptr;   // the body, inside block_
  size_t size_ = 0;
  size_t capacity_ = 0;
  size_t align_at_ = 0;
};

// Decodes a chunked request body (RFC 9112 section 7.1) incrementally, as bytes
// arrive, into a BodyBuffer that grows within max_body_bytes with the data received
// (doubling), never to a size a chunk only declares. Chunk extensions are
// ignored; trailer fields are skipped (bounded by max_trailer_bytes).
class ChunkedDecoder {
 public:
  enum class Result { kNeedMore, kDone, kError };
  ChunkedDecoder(int64_t max_body_bytes, int64_t max_trailer_bytes)
      : max_body_bytes_(max_body_bytes), max_trailer_bytes_(max_trailer_bytes) {}
  // Consumes what it can of `in` (*consumed bytes), appending data to `body`. kError
  // sets *error (400, 413 or 431). May throw std::bad_alloc while growing `body`.
  Result Feed(std::string_view in, size_t* consumed, BodyBuffer* body, HttpError* error);

 private:
  enum class Phase { kSize, kData, kDataEnd, kTrailer };
  static constexpr size_t kMaxSizeLine = 1024;
  const int64_t max_body_bytes_;
  const int64_t max_trailer_bytes_;
  Phase phase_ = Phase::kSize;
  uint64_t remaining_ = 0;
  size_t trailer_bytes_ = 0;
};

// One piece of a response body that is sent from memory the response does not own
// (an output tensor's bytes), kept alive by `keep`.
struct BodyChunk {
  std::string_view bytes;
  std::shared_ptr<const void> keep;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;                                  // empty: none (only for an empty body)
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string body;
  std::vector<BodyChunk> tail;  // sent after `body`, in order (zero-copy binary data)
  bool close = false;           // close the connection after this response

  size_t content_length() const;
  static HttpResponse Json(int status, std::string body);
  static HttpResponse Empty(int status);
  // {"error": message} with the status.
  static HttpResponse Error(int status, std::string_view message);
};

// "HTTP/1.1 <status> <reason>\r\n" and headers through the blank line. `keep_alive`
// false adds "Connection: close"; HTTP/1.0 keep-alive adds "Connection: keep-alive".
std::string SerializeResponseHead(const HttpResponse& response, bool keep_alive, int minor_version);

// "<method> <target> HTTP/1.1\r\n", the headers as given, and the blank line. The caller
// names Host, Content-Length and any other header it wants sent.
std::string SerializeRequestHead(std::string_view method, std::string_view target,
                                 const std::vector<std::pair<std::string, std::string>>& headers);

// Reads responses from the bytes of one client connection, as they arrive.
//
//   HttpResponseReader r;
//   while (r.Feed(received) == HttpResponseReader::State::kIncomplete) { receive more }
//   ... r.head(), r.body() ...
//   r.Next();  // the next response, starting with any bytes received past this one
//
// A response without Content-Length or chunked coding is taken as bodiless (servers
// that delimit a body by closing the connection are not supported). Heads are bounded
// by kMaxHeadBytes and kept bodies by max_body_bytes; past them, kError. Memory grows
// with the bytes received, never with a length the head merely declares.
class HttpResponseReader {
 public:
  enum class State { kIncomplete, kDone, kError };
  static constexpr size_t kMaxHeadBytes = 64 * 1024;

  // keep_body false skips body bytes instead of storing them (a load generator needs
  // only the status).
  explicit HttpResponseReader(bool keep_body = true, int64_t max_body_bytes = int64_t{1} << 32)
      : keep_body_(keep_body), max_body_bytes_(max_body_bytes) {}

  // Consumes received bytes; kDone once a whole final response is in. After kDone or
  // kError, Feed only keeps the bytes for the next response (see Next).
  State Feed(std::string_view bytes);
  // Starts on the next response, with the bytes already received past this one.
  State Next();
  // Starts afresh, dropping any bytes received past the current response.
  void Reset();

  State state() const { return state_; }
  const HttpResponseHead& head() const { return head_; }
  int status() const { return head_.status; }
  const std::string& body() const { return body_; }  // empty unless keep_body
  const std::string& error() const { return error_; }

 private:
  enum class Phase { kHead, kBody, kChunked };
  // Parses what it can of `in` (which starts where the last call stopped); returns the
  // bytes used.
  size_t Consume(std::string_view in);
  void Fail(std::string message);

  bool keep_body_;
  int64_t max_body_bytes_;
  State state_ = State::kIncomplete;
  Phase phase_ = Phase::kHead;
  std::string pending_;      // received, not yet consumed
  size_t head_scanned_ = 0;  // bytes of pending_ searched for the end of the head
  HttpResponseHead head_;
  std::string body_;
  int64_t body_left_ = 0;
  std::optional<ChunkedDecoder> chunked_;
  std::shared_ptr<BodyBuffer> chunked_body_;
  std::string error_;
};

}  // namespace shoal::proto
