#include "proto/http_message.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "proto/json_writer.h"

namespace shoal::proto {
namespace {

constexpr size_t kMaxHeaders = 128;

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// RFC 9110 tchar.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// True if the comma-separated list `value` holds `token` (case-insensitive).
bool ListHas(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    std::string_view item = Trim(value.substr(0, comma));
    if (EqualsIgnoreCase(item, token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

int64_t ParseDecimal(std::string_view s) {
  if (s.empty() || s.size() > 18) return -1;  // 18 digits always fit in int64
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

const std::string* HttpRequestHead::Find(std::string_view lower_name) const {
  for (const auto& h : headers) {
    if (h.name == lower_name) return &h.value;
  }
  return nullptr;
}

namespace {

HttpError Bad(std::string message) { return HttpError{400, std::move(message)}; }

// "HTTP/1.0" or "HTTP/1.1" -> 0 or 1; -1 for another HTTP version, -2 for no version.
int ParseVersion(std::string_view version) {
  if (version.size() == 8 && version.substr(0, 7) == "HTTP/1." &&
      (version[7] == '0' || version[7] == '1')) {
    return version[7] - '0';
  }
  return version.substr(0, 5) == "HTTP/" ? -1 : -2;
}

// method SP target SP HTTP/1.x
HttpError ParseRequestLine(std::string_view line, HttpRequestHead* head) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
      line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Bad("malformed request line");
  }
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (!IsToken(method)) return Bad("malformed request method");
  const int minor = ParseVersion(line.substr(sp2 + 1));
  if (minor == -1) return HttpError{505, "only HTTP/1.0 and HTTP/1.1 are supported"};
  if (minor < 0) return Bad("malformed HTTP version");
  if (target.empty()) return Bad("empty request target");
  for (char c : target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return Bad("request target holds a control character");
  }
  head->method.assign(method);
  head->target.assign(target);
  head->minor_version = minor;
  // Absolute form (proxies): keep only the path and query.
  if (target.front() != '/') {
    const size_t scheme = target.find("://");
    if (scheme == std::string_view::npos) {
      if (target == "*") return Bad("'*' is not a valid target here");
      return Bad("malformed request target");
    }
    const size_t slash = target.find('/', scheme + 3);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  const size_t q = target.find('?');
  head->path.assign(target.substr(0, q));
  head->query.assign(q == std::string_view::npos ? std::string_view() : target.substr(q + 1));
  const size_t hash = head->path.find('#');
  if (hash != std::string::npos) head->path.resize(hash);
  return {};
}

// The header lines after the start line, through the blank line: names lower-cased,
// values trimmed, with the checks RFC 9112 asks of a recipient.
HttpError ParseHeaderFields(std::string_view rest, std::vector<HttpHeader>* headers) {
  headers->clear();
  while (true) {
    const size_t eol = rest.find("\r\n");
    if (eol == std::string_view::npos) return Bad("malformed header section");
    if (eol == 0) return {};  // the blank line
    const std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(eol + 2);
    if (line.front() == ' ' || line.front() == '\t')
      return Bad("obsolete header line folding is not accepted");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return Bad("header line without ':'");
    const std::string_view name = line.substr(0, colon);
    if (!IsToken(name)) return Bad("malformed header name");
    const std::string_view value = Trim(line.substr(colon + 1));
    for (char c : value) {
      const unsigned char u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\t') || u == 0x7f)
        return Bad("header value holds a control character");
    }
    if (headers->size() >= kMaxHeaders) return HttpError{431, "too many header fields"};
    HttpHeader h;
    h.name.resize(name.size());
    for (size_t i = 0; i < name.size(); ++i) h.name[i] = Lower(name[i]);
    h.value.assign(value);
    headers->push_back(std::move(h));
  }
}

// How the body is delimited and whether the connection persists, from the fields both
// kinds of message share: Content-Length (repeats must agree), Transfer-Encoding (only
// a single "chunked"), never both; Connection, by the HTTP version's default.
template <typename Head>
HttpError ParseFraming(std::string_view what, Head* head) {
  bool te_seen = false;
  std::string_view connection;
  for (const HttpHeader& h : head->headers) {
    if (h.name == "content-length") {
      const int64_t n = ParseDecimal(h.value);
      if (n < 0) return Bad("invalid Content-Length '" + h.value + "'");
      if (head->has_content_length && n != head->content_length)
        return Bad("conflicting Content-Length values");
      head->content_length = n;
      head->has_content_length = true;
    } else if (h.name == "transfer-encoding") {
      if (te_seen) return HttpError{501, "only a single Transfer-Encoding: chunked is supported"};
      te_seen = true;
      if (!EqualsIgnoreCase(h.value, "chunked")) {
        return HttpError{501, "Transfer-Encoding '" + h.value + "' is not supported"};
      }
      head->chunked = true;
    } else if (h.name == "connection") {
      connection = h.value;
    }
  }
  if (head->chunked && head->has_content_length) {
    return Bad(std::string(what) + " must not carry both Content-Length and Transfer-Encoding");
  }
  if (head->minor_version == 0) {
    head->keep_alive = ListHas(connection, "keep-alive");
    if (head->chunked) return Bad("chunked transfer coding is not allowed in HTTP/1.0");
  } else {
    head->keep_alive = !ListHas(connection, "close");
  }
  return {};
}

}  // namespace

int64_t FindHeadEnd(std::string_view buffered, size_t scanned) {
  // Each LF must follow a CR, and the head ends at the first LF that closes an empty
  // line. The LFs before `scanned` were checked already.
  size_t at = std::min(scanned, buffered.size());
  while (true) {
    const void* lf = std::memchr(buffered.data() + at, '\n', buffered.size() - at);
    if (lf == nullptr) return 0;
    const size_t i = static_cast<size_t>(static_cast<const char*>(lf) - buffered.data());
    if (i == 0 || buffered[i - 1] != '\r') return -1;
    if (i >= 3 && buffered[i - 2] == '\n') return static_cast<int64_t>(i + 1);
    at = i + 1;
  }
}

HttpError ParseRequestHead(std::string_view block, HttpRequestHead* head) {
  if (block.size() < 4 || block.substr(block.size() - 4) != "\r\n\r\n") {
    return Bad("incomplete request head");
  }
  const size_t eol = block.find("\r\n");
  if (HttpError e = ParseRequestLine(block.substr(0, eol), head); !e.ok()) return e;
  if (HttpError e = ParseHeaderFields(block.substr(eol + 2), &head->headers); !e.ok()) return e;
  if (HttpError e = ParseFraming("a request", head); !e.ok()) return e;
  for (const HttpHeader& h : head->headers) {
    if (h.name != "expect") continue;
    if (!EqualsIgnoreCase(h.value, "100-continue") && !h.value.empty()) {
      return HttpError{417, "Expect '" + h.value + "' is not supported"};
    }
    head->expect_continue = !h.value.empty() && head->minor_version == 1;
  }
  return {};
}

const std::string* HttpResponseHead::Find(std::string_view lower_name) const {
  for (const auto& h : headers) {
    if (h.name == lower_name) return &h.value;
  }
  return nullptr;
}

HttpError ParseResponseHead(std::string_view block, HttpResponseHead* head) {
  if (block.size() < 4 || block.substr(block.size() - 4) != "\r\n\r\n") {
    return Bad("incomplete response head");
  }
  // HTTP/1.x SP 3DIGIT SP reason
  const size_t eol = block.find("\r\n");
  const std::string_view line = block.substr(0, eol);
  const size_t sp = line.find(' ');
  const int minor = ParseVersion(line.substr(0, sp));
  if (minor < 0) return Bad("not an HTTP/1.x status line");
  const std::string_view code = sp == std::string_view::npos ? "" : line.substr(sp + 1, 3);
  const int64_t status = ParseDecimal(code);
  if (code.size() != 3 || status < 100 || (line.size() > sp + 4 && line[sp + 4] != ' ')) {
    return Bad("malformed status line");
  }
  head->minor_version = minor;
  head->status = static_cast<int>(status);
  head->reason.assign(line.size() > sp + 5 ? line.substr(sp + 5) : std::string_view());
  head->content_length = 0;
  head->has_content_length = false;
  head->chunked = false;
  if (HttpError e = ParseHeaderFields(block.substr(eol + 2), &head->headers); !e.ok()) return e;
  return ParseFraming("a response", head);
}

std::string SerializeRequestHead(std::string_view method, std::string_view target,
                                 const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string out;
  size_t size = method.size() + target.size() + 14;
  for (const auto& [name, value] : headers) size += name.size() + value.size() + 4;
  out.reserve(size);
  out.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  for (const auto& [name, value] : headers) {
    out.append(name).append(": ").append(value).append("\r\n");
  }
  out.append("\r\n");
  return out;
}

HttpResponseReader::State HttpResponseReader::Feed(std::string_view bytes) {
  if (state_ != State::kIncomplete) {
    pending_.append(bytes);
    return state_;
  }
  if (pending_.empty()) {
    const size_t used = Consume(bytes);
    pending_.assign(bytes.substr(used));
  } else {
    pending_.append(bytes);
    const size_t used = Consume(pending_);
    pending_.erase(0, used);
  }
  return state_;
}

HttpResponseReader::State HttpResponseReader::Next() {
  head_ = HttpResponseHead();
  body_.clear();
  error_.clear();
  phase_ = Phase::kHead;
  head_scanned_ = 0;
  body_left_ = 0;
  state_ = State::kIncomplete;
  return Feed({});
}

void HttpResponseReader::Reset() {
  pending_.clear();
  Next();
}

size_t HttpResponseReader::Consume(std::string_view in) {
  size_t pos = 0;
  while (state_ == State::kIncomplete) {
    const std::string_view avail = in.substr(pos);
    switch (phase_) {
      case Phase::kHead: {
        // Resume the search a little before the bytes not yet scanned, in case the
        // terminator straddles two reads.
        const size_t from = head_scanned_ >= 3 ? head_scanned_ - 3 : 0;
        const size_t end = avail.find("\r\n\r\n", from);
        if (end == std::string_view::npos) {
          head_scanned_ = avail.size();
          if (avail.size() > kMaxHeadBytes) Fail("response head above 64 KiB");
          return pos;
        }
        head_scanned_ = 0;
        if (HttpError e = ParseResponseHead(avail.substr(0, end + 4), &head_); !e.ok()) {
          Fail(e.message);
          return pos;
        }
        pos += end + 4;
        if (head_.status < 200) break;  // an interim response (100 Continue): read on
        if (head_.chunked) {
          phase_ = Phase::kChunked;
          chunked_.emplace(max_body_bytes_, kMaxHeadBytes);
          chunked_body_ = BodyBuffer::Create(0);
        } else {
          // A response without Content-Length is taken as bodiless (shoal and the
          // servers it talks to always send one; a body up to EOF is not supported).
          phase_ = Phase::kBody;
          body_left_ = head_.content_length;
          if (keep_body_ && body_left_ > max_body_bytes_) {
            Fail("the response body of " + std::to_string(body_left_) +
                 " bytes is larger than the limit of " + std::to_string(max_body_bytes_));
            return pos;
          }
          // The body grows with the bytes that arrive, not with what the head declares.
          if (keep_body_)
            body_.reserve(static_cast<size_t>(std::min<int64_t>(body_left_, 1 << 16)));
        }
        if (body_left_ == 0 && phase_ == Phase::kBody) state_ = State::kDone;
        break;
      }
      case Phase::kBody: {
        const auto take =
            static_cast<size_t>(std::min<int64_t>(body_left_, static_cast<int64_t>(avail.size())));
        if (keep_body_) body_.append(avail.substr(0, take));
        body_left_ -= static_cast<int64_t>(take);
        pos += take;
        if (body_left_ == 0) state_ = State::kDone;
        return pos;
      }
      case Phase::kChunked: {
        size_t used = 0;
        HttpError e;
        const auto r = chunked_->Feed(avail, &used, chunked_body_.get(), &e);
        pos += used;
        if (r == ChunkedDecoder::Result::kError) {
          Fail(e.message);
        } else if (r == ChunkedDecoder::Result::kDone) {
          if (keep_body_) body_.assign(chunked_body_->view());
          chunked_body_.reset();
          state_ = State::kDone;
        }
        return pos;
      }
    }
  }
  return pos;
}

void HttpResponseReader::Fail(std::string message) {
  error_ = std::move(message);
  state_ = State::kError;
}

StatusOr<std::vector<std::string>> SplitPath(std::string_view path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= path.size()) {
    size_t slash = path.find('/', i);
    if (slash == std::string_view::npos) slash = path.size();
    std::string_view raw = path.substr(i, slash - i);
    i = slash + 1;
    if (raw.empty()) continue;
    std::string seg;
    seg.reserve(raw.size());
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] != '%') {
        seg.push_back(raw[k]);
        continue;
      }
      if (k + 2 >= raw.size()) return InvalidArgument("path: truncated percent-escape");
      const int hi = HexValue(raw[k + 1]), lo = HexValue(raw[k + 2]);
      if (hi < 0 || lo < 0) return InvalidArgument("path: invalid percent-escape");
      const char c = static_cast<char>(hi * 16 + lo);
      if (c == '\0') return InvalidArgument("path: %00 is not allowed");
      seg.push_back(c);
      k += 2;
    }
    out.push_back(std::move(seg));
  }
  return out;
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 301:
      return "Moved Permanently";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::shared_ptr<BodyBuffer> BodyBuffer::Create(size_t capacity, size_t align_at) {
  std::shared_ptr<BodyBuffer> b(new BodyBuffer());
  b->align_at_ = align_at;
  b->Reserve(capacity);
  return b;
}

BodyBuffer::~BodyBuffer() { std::free(block_); }

void BodyBuffer::Reserve(size_t capacity) {
  if (block_ != nullptr && capacity <= capacity_) return;
  const size_t align_at = std::min(align_at_, capacity);
  const size_t lead = (kAlignment - align_at % kAlignment) % kAlignment;
  size_t total = lead + capacity + kPadding;
  total = (total + kAlignment - 1) / kAlignment * kAlignment;
  char* block = static_cast<char*>(std::aligned_alloc(kAlignment, total));
  if (block == nullptr) throw std::bad_alloc();
  char* data = block + lead;
  if (size_ > 0) std::memcpy(data, data_, size_);
  // The padding (and anything past the content) is zeroed so that readers that run
  // past the end see defined bytes.
  std::memset(data + size_, 0, total - lead - size_);
  std::free(block_);
  block_ = block;
  data_ = data;
  capacity_ = capacity;
}

ChunkedDecoder::Result ChunkedDecoder::Feed(std::string_view in, size_t* consumed, BodyBuffer* body,
                                            HttpError* error) {
  size_t pos = 0;
  auto fail = [&](int status, std::string message) {
    *consumed = pos;
    *error = HttpError{status, std::move(message)};
    return Result::kError;
  };
  while (true) {
    const std::string_view avail = in.substr(pos);
    switch (phase_) {
      case Phase::kSize: {
        const size_t eol = avail.find('\n');
        if (eol != std::string_view::npos && (eol == 0 || avail[eol - 1] != '\r'))
          return fail(400, "a chunk size line ends with a bare LF; lines must end with CRLF");
        if (eol == std::string_view::npos) {
          if (avail.size() > kMaxSizeLine) return fail(400, "malformed chunk size line");
          *consumed = pos;
          return Result::kNeedMore;
        }
        std::string_view line = avail.substr(0, eol - 1);
        line = line.substr(0, line.find(';'));
        while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
        if (line.empty() || line.size() > 15) return fail(400, "malformed chunk size");
        uint64_t size = 0;
        for (char ch : line) {
          const int v = HexValue(ch);
          if (v < 0) return fail(400, "malformed chunk size");
          size = size * 16 + static_cast<uint64_t>(v);
        }
        pos += eol + 1;
        if (size == 0) {
          phase_ = Phase::kTrailer;
          break;
        }
        if (body->size() + size > static_cast<uint64_t>(max_body_bytes_)) {
          return fail(413, "the chunked request body is larger than the limit of " +
                               std::to_string(max_body_bytes_) + " bytes");
        }
        remaining_ = size;
        phase_ = Phase::kData;
        break;
      }
      case Phase::kData: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, avail.size()));
        if (n == 0) {
          *consumed = pos;
          return Result::kNeedMore;
        }
        // The body grows with the data that arrives, not with the size a chunk declares.
        const size_t need = body->size() + n;
        if (need > body->capacity()) {
          body->Reserve(std::min<size_t>(static_cast<size_t>(max_body_bytes_),
                                         std::max(need, body->capacity() * 2)));
        }
        std::memcpy(body->data() + body->size(), avail.data(), n);
        body->set_size(body->size() + n);
        pos += n;
        remaining_ -= n;
        if (remaining_ == 0) phase_ = Phase::kDataEnd;
        break;
      }
      case Phase::kDataEnd:
        if (avail.size() < 2) {
          *consumed = pos;
          return Result::kNeedMore;
        }
        if (avail.substr(0, 2) != "\r\n")
          return fail(400, "malformed chunk: no CRLF after the data");
        pos += 2;
        phase_ = Phase::kSize;
        break;
      case Phase::kTrailer: {
        size_t eol = avail.find('\n');
        if (eol != std::string_view::npos) {
          if (eol == 0 || avail[eol - 1] != '\r')
            return fail(400,
                        "a chunked trailer line ends with a bare LF; lines must end with CRLF");
          --eol;  // at the CR
        }
        if (eol == std::string_view::npos) {
          if (trailer_bytes_ + avail.size() > static_cast<size_t>(max_trailer_bytes_)) {
            return fail(431, "the chunked trailer section is too large");
          }
          *consumed = pos;
          return Result::kNeedMore;
        }
        pos += eol + 2;
        if (eol == 0) {
          *consumed = pos;
          return Result::kDone;
        }
        trailer_bytes_ += eol + 2;
        if (trailer_bytes_ > static_cast<size_t>(max_trailer_bytes_)) {
          return fail(431, "the chunked trailer section is too large");
        }
        break;
      }
    }
  }
}

size_t HttpResponse::content_length() const {
  size_t n = body.size();
  for (const auto& c : tail) n += c.bytes.size();
  return n;
}

HttpResponse HttpResponse::Json(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = std::move(body);
  return r;
}

HttpResponse HttpResponse::Empty(int status) {
  HttpResponse r;
  r.status = status;
  return r;
}

HttpResponse HttpResponse::Error(int status, std::string_view message) {
  return Json(status, JsonError(message));
}

std::string SerializeResponseHead(const HttpResponse& response, bool keep_alive,
                                  int minor_version) {
  std::string out;
  out.reserve(160);
  out.append(minor_version == 0 ? "HTTP/1.0 " : "HTTP/1.1 ");
  out.append(std::to_string(response.status));
  out.push_back(' ');
  out.append(ReasonPhrase(response.status));
  out.append("\r\n");
  if (!response.content_type.empty()) {
    out.append("Content-Type: ").append(response.content_type).append("\r\n");
  }
  out.append("Content-Length: ").append(std::to_string(response.content_length())).append("\r\n");
  for (const auto& [name, value] : response.headers) {
    out.append(name).append(": ").append(value).append("\r\n");
  }
  if (!keep_alive) {
    out.append("Connection: close\r\n");
  } else if (minor_version == 0) {
    out.append("Connection: keep-alive\r\n");
  }
  out.append("\r\n");
  return out;
}

}  // namespace shoal::proto
