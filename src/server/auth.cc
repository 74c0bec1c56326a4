#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace shoal::server {
namespace {

constexpr std::string_view kScheme = "bearer";

std::array<unsigned char, 32> Sha256(std::string_view bytes) {
  std::array<unsigned char, 32> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest.data());
  return digest;
}

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

}  // namespace

StatusOr<AuthScope> ParseAuthScope(std::string_view name) {
  if (name == "control") return AuthScope::kControl;
  if (name == "all") return AuthScope::kAll;
  return InvalidArgument("auth scope must be 'control' or 'all'; was '" +
                         std::string(name.substr(0, 64)) + "'");
}

StatusOr<std::shared_ptr<const Authenticator>> Authenticator::FromFile(const std::string& path,
                                                                       AuthScope scope) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgument("cannot read the auth token file '" + path + "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return InvalidArgument("cannot read the auth token file '" + path +
                           "': " + std::strerror(errno));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return InvalidArgument("cannot read the auth token file '" + path + "'");
  std::string token = contents.str();
  if (!token.empty() && token.back() == '\n') token.pop_back();
  if (!token.empty() && token.back() == '\r') token.pop_back();
  auto created = FromToken(token, scope);
  if (!created.ok()) return created.status().WithPrefix("auth token file '" + path + "'");
  return created;
}

StatusOr<std::shared_ptr<const Authenticator>> Authenticator::FromToken(std::string_view token,
                                                                        AuthScope scope) {
  if (token.empty()) return InvalidArgument("the auth token is empty");
  for (char c : token) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) {
      return InvalidArgument(
          "the auth token holds whitespace or a control character, which an Authorization "
          "header cannot carry");
    }
  }
  return std::shared_ptr<const Authenticator>(new Authenticator(Sha256(token), scope));
}

bool Authenticator::Requires(EndpointClass endpoint) const {
  switch (endpoint) {
    case EndpointClass::kHealth:
      return false;
    case EndpointClass::kControl:
      return true;
    case EndpointClass::kMetadata:
    case EndpointClass::kInference:
      return scope_ == AuthScope::kAll;
  }
  return true;
}

AuthResult Authenticator::Check(const std::string_view* authorization) const {
  if (authorization == nullptr) {
    return {false, "this endpoint needs a bearer token: send 'Authorization: Bearer <token>'",
            false};
  }
  std::string_view v = *authorization;
  while (!v.empty() && IsSpace(v.front())) v.remove_prefix(1);
  while (!v.empty() && IsSpace(v.back())) v.remove_suffix(1);
  // The scheme is case-insensitive (RFC 7235), followed by one or more spaces.
  bool bearer = v.size() > kScheme.size() && IsSpace(v[kScheme.size()]);
  for (size_t i = 0; bearer && i < kScheme.size(); ++i) {
    bearer = (v[i] | 0x20) == kScheme[i];
  }
  if (!bearer) {
    return {false,
            "the Authorization credential is not a bearer token; send 'Authorization: Bearer "
            "<token>'",
            true};
  }
  v.remove_prefix(kScheme.size());
  while (!v.empty() && IsSpace(v.front())) v.remove_prefix(1);
  const std::array<unsigned char, 32> presented = Sha256(v);
  if (CRYPTO_memcmp(presented.data(), digest_.data(), digest_.size()) != 0) {
    return {false, "the bearer token is not valid", true};
  }
  return {};
}

AuthResult Authenticator::Authorize(EndpointClass endpoint,
                                    const std::string_view* authorization) const {
  return Requires(endpoint) ? Check(authorization) : AuthResult{};
}

std::string Authenticator::Challenge(bool credential_presented) {
  return credential_presented ? "Bearer realm=\"shoal\", error=\"invalid_token\""
                              : "Bearer realm=\"shoal\"";
}

}  // namespace shoal::server
