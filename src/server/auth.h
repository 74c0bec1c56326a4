// Authenticator: the bearer-token check both front ends make before they serve an
// endpoint (`shoal serve --auth-token-file`, docs/security.md).
//
// One shared secret, read from a file at startup. A client presents it as
//   HTTP:  Authorization: Bearer <token>
//   gRPC:  metadata key "authorization", value "Bearer <token>"
// Which endpoints need it is the scope:
//   kControl (default)  model control: repository index, load, unload
//   kAll                also inference, metadata, configuration and statistics
// Health checks never need it (server live/ready, model ready, gRPC's grpc.health.v1), so
// load balancers and kubelets keep working; the metrics endpoint is not covered either
// (bind it to a private address with --metrics-address).
//
// The presented token is compared with the configured one in constant time: both are
// hashed with SHA-256 and the digests compared with CRYPTO_memcmp, so neither the
// position of the first wrong byte nor the token's length shows in the time taken.
// A refusal (AuthResult) becomes HTTP 401 with WWW-Authenticate: Bearer, or gRPC
// UNAUTHENTICATED, in the front end; its message never echoes what the client sent.
//
// Immutable after creation; thread-safe.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace shoal::server {

enum class AuthScope { kControl, kAll };

// What an endpoint does, as far as authentication cares.
enum class EndpointClass {
  kHealth,     // server live/ready, model ready, grpc.health.v1: always open
  kControl,    // repository index, model load/unload
  kMetadata,   // server and model metadata, model configuration, statistics
  kInference,  // infer, streaming infer
};

// The outcome of a check: accepted, or refused and why.
struct [[nodiscard]] AuthResult {
  bool ok = true;
  std::string message;                // why it was refused
  bool credential_presented = false;  // a refusal of a credential sent (not a missing one)
};

// "control" or "all"; INVALID_ARGUMENT naming the value otherwise.
StatusOr<AuthScope> ParseAuthScope(std::string_view name);

class Authenticator {
 public:
  // The token is the file's contents without its trailing line ending (LF or CRLF).
  // INVALID_ARGUMENT, naming the file, when it cannot be read, is empty, or holds
  // whitespace or control characters inside the token (which no header could carry).
  static StatusOr<std::shared_ptr<const Authenticator>> FromFile(const std::string& path,
                                                                 AuthScope scope);
  // The same for a token given directly (tests).
  static StatusOr<std::shared_ptr<const Authenticator>> FromToken(std::string_view token,
                                                                  AuthScope scope);

  AuthScope scope() const { return scope_; }
  // Whether an endpoint of this class needs the token under this scope.
  bool Requires(EndpointClass endpoint) const;
  // Checks a credential: `authorization` is the Authorization header's (or gRPC
  // metadata's) value, null when absent. Accepted, or refused saying whether it was
  // missing, not a Bearer credential, or wrong.
  AuthResult Check(const std::string_view* authorization) const;
  // Requires(endpoint) ? Check(authorization) : accepted.
  AuthResult Authorize(EndpointClass endpoint, const std::string_view* authorization) const;

  // The WWW-Authenticate value to answer a 401 with: the Bearer scheme, and RFC 6750's
  // error="invalid_token" when a credential was presented but refused.
  static std::string Challenge(bool credential_presented);

 private:
  Authenticator(const std::array<unsigned char, 32>& digest, AuthScope scope)
      : digest_(digest), scope_(scope) {}

  const std::array<unsigned char, 32> digest_;  // SHA-256 of the token
  const AuthScope scope_;
};

}  // namespace shoal::server
