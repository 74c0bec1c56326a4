// TLS for the front ends (`shoal serve --tls-cert-file ...`, docs/security.md).
//
// TlsContext: a server's certificate, key and (for mutual TLS) client CAs, loaded from
// PEM files and checked at startup, so that a missing, unreadable or mismatched file
// is one clear error before anything listens. HttpCore gives every connection a
// TlsSession from it; the gRPC front end, which has its own TLS (gRPC's
// SslServerCredentials), takes the checked PEM texts from LoadTlsFiles.
//
// TlsSession: one server-side TLS connection over a non-blocking socket, driven by an
// event loop (http_loop*.cc). Nothing blocks: each call returns kWantRead or kWantWrite
// when it needs the socket readable or writable, and the loop sets its epoll interest
// accordingly and calls again. Bytes the session has decrypted but not yet handed out
// are invisible to epoll: HasPending says when to read again without waiting for an
// event. Its socket I/O uses send(MSG_NOSIGNAL)/recv, so a client that resets the
// connection never raises SIGPIPE. Not thread-safe: one loop thread per session.
//
// Protocol: TLS 1.2 or 1.3 (OpenSSL's defaults for ciphers), no renegotiation, ALPN
// "http/1.1" when the client offers it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/status.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace shoal::server {

struct TlsOptions {
  std::string cert_file;  // PEM certificate chain, the server's first; required
  std::string key_file;   // PEM private key of that certificate; required
  // PEM CA certificates. Set: clients must present a certificate one of them signed
  // (mutual TLS), or the handshake fails. Empty: no client certificate is asked for.
  std::string ca_file;
};

// The PEM texts of the files, each checked: the certificate chain and the key parse, the
// key matches the certificate, the CA file (when given) holds at least one certificate.
struct TlsFiles {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;  // empty when no CA file was given
};
// INVALID_ARGUMENT naming the file and OpenSSL's reason when one is missing, unreadable
// or invalid, or when the key does not match the certificate.
StatusOr<TlsFiles> LoadTlsFiles(const TlsOptions& options);

class TlsContext {
 public:
  // Errors as LoadTlsFiles.
  static StatusOr<std::shared_ptr<const TlsContext>> Create(const TlsOptions& options);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* native() const { return ctx_; }
  bool requires_client_certificate() const { return requires_client_certificate_; }

 private:
  TlsContext(SSL_CTX* ctx, bool requires_client_certificate)
      : ctx_(ctx), requires_client_certificate_(requires_client_certificate) {}
  SSL_CTX* const ctx_;
  const bool requires_client_certificate_;
};

class TlsSession {
 public:
  enum class Io {
    kOk,         // done (for Read and Write: some bytes moved)
    kWantRead,   // call again when the socket is readable
    kWantWrite,  // call again when the socket is writable
    kClosed,     // the peer closed the connection (close_notify or EOF)
    kError,      // a protocol or socket error; error() says which
  };

  // A session for the accepted socket `fd` (not owned; the caller closes it after the
  // session is gone). Null when OpenSSL cannot allocate one.
  static std::unique_ptr<TlsSession> Create(const TlsContext& context, int fd);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Advances the server handshake; kOk once it is complete.
  Io Handshake();
  bool handshake_done() const { return handshake_done_; }
  // Up to `n` decrypted bytes into `dst`; kOk with *got > 0.
  Io Read(char* dst, size_t n, size_t* got);
  // Encrypts and sends up to `n` bytes (at least one record); kOk with *written > 0.
  // After kWantRead/kWantWrite, call again with the same bytes (a longer run starting
  // with them is fine, as OpenSSL's "moving buffer" mode allows).
  Io Write(const char* src, size_t n, size_t* written);
  // Decrypted bytes are waiting inside the session: Read now, epoll will not say so.
  bool HasPending() const;
  // Sends close_notify, once, best effort; does nothing after an error.
  void Shutdown();
  // After a failed Handshake: the client sent a plain HTTP request instead of TLS.
  bool plaintext_http() const { return plaintext_http_; }
  // The last error, for logs ("" when none).
  const std::string& error() const { return error_; }

 private:
  explicit TlsSession(SSL* ssl) : ssl_(ssl) {}
  Io Fail(int ret);

  SSL* const ssl_;
  bool handshake_done_ = false;
  bool failed_ = false;
  bool shut_down_ = false;
  bool plaintext_http_ = false;
  std::string error_;
};

}  // namespace shoal::server
