// HttpTestClient: a small blocking HTTP/1.1 client over one TCP connection, for tests
// of the HTTP front end and the metrics endpoint (unit tests in src/server and the
// end-to-end tests in tests/e2e). It keeps its connection alive between requests and
// reconnects when the server closed it, counting connects so tests can check reuse.
// It can also send raw bytes, to test what real clients would never send, and speak
// HTTPS (TlsClientOptions): then every connection starts with a TLS handshake that
// checks the server's certificate.
//
// Not thread-safe: one client per thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/http_message.h"

namespace shoal::testing {

struct HttpReply {
  int status = 0;  // 0: no reply (connection failed, closed or timed out)
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  bool server_closed = false;  // "Connection: close" or EOF after the reply

  const std::string* Header(std::string_view lower_name) const;
  // For binary infer replies: the JSON part (per Inference-Header-Content-Length, or
  // the whole body) and the bytes after it.
  std::string_view Json() const;
  std::string_view Binary() const;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// HTTPS: the server's certificate must be signed by a CA in ca_file and name
// server_name. A client certificate (cert_file + key_file) is sent when given.
struct TlsClientOptions {
  std::string ca_file;
  std::string server_name = "localhost";
  std::string cert_file;
  std::string key_file;
};

class HttpTestClient {
 public:
  HttpTestClient(std::string host, int port) : host_(std::move(host)), port_(port) {}
  HttpTestClient(std::string host, int port, TlsClientOptions tls);
  ~HttpTestClient();
  HttpTestClient(const HttpTestClient&) = delete;
  HttpTestClient& operator=(const HttpTestClient&) = delete;

  // Sends one request (with Content-Length) and reads its reply.
  HttpReply Request(const std::string& method, const std::string& path, std::string_view body = {},
                    const Headers& headers = {}, int timeout_ms = 20000);
  HttpReply Get(const std::string& path) { return Request("GET", path); }
  HttpReply Post(const std::string& path, std::string_view body, const Headers& headers = {}) {
    return Request("POST", path, body, headers);
  }

  // Low level: connect if needed, send bytes as they are, read one reply.
  bool Connect(int timeout_ms = 5000);
  bool SendRaw(std::string_view bytes);
  HttpReply ReadReply(int timeout_ms = 20000);
  // True when the server closed the connection (reads EOF within timeout_ms).
  bool WaitForClose(int timeout_ms);
  void Close();
  bool connected() const { return fd_ >= 0; }
  int connects() const { return connects_; }
  // TLS: why the last connect failed its handshake ("" when it did not).
  const std::string& tls_error() const { return tls_error_; }

 private:
  // send/recv, through TLS when it is on. SendSome: bytes sent, or -1. RecvSome waits up
  // to timeout_ms: bytes read (> 0), 0 at EOF, -1 on an error, -2 on timeout.
  ssize_t SendSome(const char* data, size_t n);
  ssize_t RecvSome(char* data, size_t n, int timeout_ms);
  bool Handshake();

  std::string host_;
  int port_;
  int fd_ = -1;
  int connects_ = 0;
  proto::HttpResponseReader reader_;  // holds bytes received past the last reply
  bool use_tls_ = false;
  TlsClientOptions tls_;
  void* tls_ctx_ = nullptr;  // SSL_CTX*
  void* ssl_ = nullptr;      // SSL* of the current connection
  std::string tls_error_;
};

// gzip and zlib ("deflate") compression, for request bodies.
std::string GzipCompress(std::string_view data);
std::string ZlibCompress(std::string_view data);

// Raw little-endian bytes of a vector, and BYTES-serialized strings.
template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}
std::string SerializeStrings(const std::vector<std::string>& values);

}  // namespace shoal::testing
