#include "server/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

namespace shoal::server {
namespace {

// OpenSSL's reasons for the errors queued on this thread (then cleared), "a; b".
std::string DrainErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

StatusOr<std::string> ReadFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return InvalidArgument("cannot read " + what + " '" + path + "': " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return InvalidArgument("cannot read " + what + " '" + path + "'");
  return s.str();
}

// The socket BIO: send with MSG_NOSIGNAL (OpenSSL's own socket BIO uses write(), which
// raises SIGPIPE on a reset connection) and recv, both non-blocking.
int BioWrite(BIO* bio, const char* data, int len) {
  BIO_clear_retry_flags(bio);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  while (true) {
    const ssize_t n = send(fd, data, static_cast<size_t>(len), MSG_NOSIGNAL);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(bio);
    return -1;
  }
}

int BioRead(BIO* bio, char* data, int len) {
  BIO_clear_retry_flags(bio);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  while (true) {
    const ssize_t n = recv(fd, data, static_cast<size_t>(len), 0);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
    return -1;
  }
}

long BioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int BioCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

const BIO_METHOD* SocketBio() {
  static const BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "shoal socket");
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  return method;
}

// ALPN: HTTP/1.1 when the client offers it; otherwise no ALPN answer (it may still
// speak HTTP/1.1 without saying so).
int SelectAlpn(SSL*, const unsigned char** out, unsigned char* out_len, const unsigned char* in,
               unsigned int in_len, void*) {
  static const unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, out_len, kHttp11, sizeof(kHttp11), in, in_len) !=
      OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_NOACK;
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

StatusOr<TlsFiles> LoadTlsFiles(const TlsOptions& options) {
  // The context's checks are the files' checks.
  RETURN_IF_ERROR(TlsContext::Create(options).status());
  TlsFiles files;
  ASSIGN_OR_RETURN(files.cert_pem, ReadFile("the TLS certificate file", options.cert_file));
  ASSIGN_OR_RETURN(files.key_pem, ReadFile("the TLS key file", options.key_file));
  if (!options.ca_file.empty()) {
    ASSIGN_OR_RETURN(files.ca_pem, ReadFile("the TLS CA file", options.ca_file));
  }
  return files;
}

StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Create(const TlsOptions& options) {
  if (options.cert_file.empty()) return InvalidArgument("TLS needs a certificate file");
  if (options.key_file.empty()) return InvalidArgument("TLS needs a key file");
  // Readable at all? (OpenSSL's reasons for a missing file are less plain.)
  RETURN_IF_ERROR(ReadFile("the TLS certificate file", options.cert_file).status());
  RETURN_IF_ERROR(ReadFile("the TLS key file", options.key_file).status());
  if (!options.ca_file.empty())
    RETURN_IF_ERROR(ReadFile("the TLS CA file", options.ca_file).status());

  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return Internal("cannot create a TLS context: " + DrainErrors());
  std::shared_ptr<const TlsContext> context(new TlsContext(ctx, !options.ca_file.empty()));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  // Partial writes and a moving buffer: the loop writes what it has queued, and may
  // retry a write with more bytes behind the same ones. Released buffers: idle
  // keep-alive connections do not hold 2 x 16 KiB each.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_alpn_select_cb(ctx, SelectAlpn, nullptr);
  if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_file.c_str()) != 1) {
    return InvalidArgument("the TLS certificate file '" + options.cert_file +
                           "' holds no valid PEM certificate: " + DrainErrors());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, options.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    const unsigned long e = ERR_peek_last_error();
    if (ERR_GET_LIB(e) == ERR_LIB_X509 && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH) {
      ERR_clear_error();
      return InvalidArgument("the TLS key file '" + options.key_file +
                             "' does not match the certificate in '" + options.cert_file + "'");
    }
    return InvalidArgument("the TLS key file '" + options.key_file +
                           "' holds no valid PEM private key (or one protected by a "
                           "passphrase): " +
                           DrainErrors());
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return InvalidArgument("the TLS key file '" + options.key_file +
                           "' does not match the certificate in '" + options.cert_file +
                           "': " + DrainErrors());
  }
  if (!options.ca_file.empty()) {
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(options.ca_file.c_str());
    if (names == nullptr ||
        SSL_CTX_load_verify_locations(ctx, options.ca_file.c_str(), nullptr) != 1) {
      if (names != nullptr) sk_X509_NAME_pop_free(names, X509_NAME_free);
      return InvalidArgument("the TLS CA file '" + options.ca_file +
                             "' holds no valid PEM certificate: " + DrainErrors());
    }
    SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return context;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

std::unique_ptr<TlsSession> TlsSession::Create(const TlsContext& context, int fd) {
  SSL* ssl = SSL_new(context.native());
  if (ssl == nullptr) return nullptr;
  BIO* bio = BIO_new(SocketBio());
  if (bio == nullptr) {
    SSL_free(ssl);
    return nullptr;
  }
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  SSL_set_bio(ssl, bio, bio);  // the SSL owns the BIO now
  SSL_set_accept_state(ssl);
  return std::unique_ptr<TlsSession>(new TlsSession(ssl));
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

TlsSession::Io TlsSession::Fail(int ret) {
  const int code = SSL_get_error(ssl_, ret);
  switch (code) {
    case SSL_ERROR_WANT_READ:
      return Io::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return Io::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      return Io::kClosed;
    case SSL_ERROR_SYSCALL:
      failed_ = true;
      if (ERR_peek_error() == 0) {
        error_ = errno == 0 ? "the connection closed" : std::strerror(errno);
        ERR_clear_error();
        return errno == 0 ? Io::kClosed : Io::kError;
      }
      break;
    default:
      failed_ = true;
      break;
  }
  const unsigned long last = ERR_peek_last_error();
  plaintext_http_ =
      ERR_GET_LIB(last) == ERR_LIB_SSL && (ERR_GET_REASON(last) == SSL_R_HTTP_REQUEST ||
                                           ERR_GET_REASON(last) == SSL_R_HTTPS_PROXY_REQUEST);
  error_ = DrainErrors();
  return Io::kError;
}

TlsSession::Io TlsSession::Handshake() {
  if (handshake_done_) return Io::kOk;
  ERR_clear_error();
  errno = 0;
  const int ret = SSL_do_handshake(ssl_);
  if (ret == 1) {
    handshake_done_ = true;
    return Io::kOk;
  }
  return Fail(ret);
}

TlsSession::Io TlsSession::Read(char* dst, size_t n, size_t* got) {
  *got = 0;
  ERR_clear_error();
  errno = 0;
  const int ret = SSL_read_ex(ssl_, dst, n, got);
  return ret == 1 ? Io::kOk : Fail(ret);
}

TlsSession::Io TlsSession::Write(const char* src, size_t n, size_t* written) {
  *written = 0;
  ERR_clear_error();
  errno = 0;
  const int ret = SSL_write_ex(ssl_, src, n, written);
  return ret == 1 ? Io::kOk : Fail(ret);
}

bool TlsSession::HasPending() const { return SSL_pending(ssl_) > 0; }

void TlsSession::Shutdown() {
  if (failed_ || shut_down_ || !handshake_done_) return;
  shut_down_ = true;
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);  // sends close_notify if the socket takes it; no waiting
  ERR_clear_error();
}

}  // namespace shoal::server
