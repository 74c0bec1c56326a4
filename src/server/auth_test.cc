#include "server/auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace shoal::server {
namespace {

std::shared_ptr<const Authenticator> Make(std::string_view token, AuthScope scope) {
  auto a = Authenticator::FromToken(token, scope);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? *a : nullptr;
}

AuthResult CheckValue(const Authenticator& a, std::string_view value) { return a.Check(&value); }

// A file in a fresh temporary folder, removed with it.
class TokenFile {
 public:
  explicit TokenFile(const std::string& contents) {
    char tmpl[] = "/tmp/shoal_auth_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/token";
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TokenFile() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string path_;
};

TEST(AuthTest, TheRightBearerTokenPasses) {
  auto a = Make("s3cret-token", AuthScope::kControl);
  EXPECT_TRUE(CheckValue(*a, "Bearer s3cret-token").ok);
  // The scheme is case-insensitive and may be followed by several spaces.
  EXPECT_TRUE(CheckValue(*a, "bearer   s3cret-token").ok);
  EXPECT_TRUE(CheckValue(*a, "BEARER s3cret-token ").ok);
}

TEST(AuthTest, MissingWrongAndMalformedCredentialsAreRefused) {
  auto a = Make("s3cret-token", AuthScope::kControl);
  const AuthResult missing = a->Check(nullptr);
  EXPECT_FALSE(missing.ok);
  EXPECT_FALSE(missing.credential_presented);
  EXPECT_NE(missing.message.find("Authorization: Bearer"), std::string::npos);
  for (std::string_view wrong :
       {"Bearer s3cret-tokeN", "Bearer s3cret-token2", "Bearer s3cret-toke", "Bearer ", "Bearer x",
        "Bearers3cret-token"}) {
    const AuthResult r = CheckValue(*a, wrong);
    EXPECT_FALSE(r.ok) << wrong;
    EXPECT_TRUE(r.credential_presented) << wrong;
    EXPECT_EQ(r.message.find("s3cret"), std::string::npos) << "never echoes: " << r.message;
  }
  EXPECT_NE(CheckValue(*a, "Basic czNjcmV0LXRva2Vu").message.find("not a bearer token"),
            std::string::npos);
  EXPECT_NE(CheckValue(*a, "s3cret-token").message.find("not a bearer token"), std::string::npos);
  EXPECT_FALSE(CheckValue(*a, "").ok);
}

TEST(AuthTest, ScopeDecidesWhichEndpointsNeedTheToken) {
  auto control = Make("t", AuthScope::kControl);
  EXPECT_FALSE(control->Requires(EndpointClass::kHealth));
  EXPECT_TRUE(control->Requires(EndpointClass::kControl));
  EXPECT_FALSE(control->Requires(EndpointClass::kMetadata));
  EXPECT_FALSE(control->Requires(EndpointClass::kInference));
  EXPECT_TRUE(control->Authorize(EndpointClass::kInference, nullptr).ok);
  EXPECT_FALSE(control->Authorize(EndpointClass::kControl, nullptr).ok);

  auto all = Make("t", AuthScope::kAll);
  EXPECT_FALSE(all->Requires(EndpointClass::kHealth)) << "load balancers must get in";
  EXPECT_TRUE(all->Requires(EndpointClass::kControl));
  EXPECT_TRUE(all->Requires(EndpointClass::kMetadata));
  EXPECT_TRUE(all->Requires(EndpointClass::kInference));
  EXPECT_TRUE(all->Authorize(EndpointClass::kHealth, nullptr).ok);
  EXPECT_FALSE(all->Authorize(EndpointClass::kInference, nullptr).ok);
}

TEST(AuthTest, ParsesScopeNames) {
  EXPECT_EQ(*ParseAuthScope("control"), AuthScope::kControl);
  EXPECT_EQ(*ParseAuthScope("all"), AuthScope::kAll);
  const auto bad = ParseAuthScope("everything");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'everything'"), std::string::npos);
}

TEST(AuthTest, TokenFileLosesOnlyItsTrailingLineEnding) {
  TokenFile lf("abc123\n");
  auto a = Authenticator::FromFile(lf.path(), AuthScope::kControl);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(CheckValue(**a, "Bearer abc123").ok);
  EXPECT_FALSE(CheckValue(**a, "Bearer abc123\n").ok);

  TokenFile crlf("abc123\r\n");
  auto b = Authenticator::FromFile(crlf.path(), AuthScope::kControl);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(CheckValue(**b, "Bearer abc123").ok);
}

TEST(AuthTest, RefusesEmptyUnreadableAndUnsendableTokenFiles) {
  TokenFile empty("");
  auto e = Authenticator::FromFile(empty.path(), AuthScope::kControl);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find(empty.path()), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("empty"), std::string::npos);

  TokenFile newline_only("\n");
  EXPECT_FALSE(Authenticator::FromFile(newline_only.path(), AuthScope::kControl).ok());

  auto missing = Authenticator::FromFile(empty.dir() + "/absent", AuthScope::kControl);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot read"), std::string::npos);

  auto dir = Authenticator::FromFile(empty.dir(), AuthScope::kControl);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("directory"), std::string::npos);

  TokenFile spaced("two words\n");
  auto s = Authenticator::FromFile(spaced.path(), AuthScope::kControl);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("whitespace"), std::string::npos);
}

TEST(AuthTest, ChallengeNamesTheSchemeAndAnInvalidToken) {
  EXPECT_EQ(Authenticator::Challenge(false), "Bearer realm=\"shoal\"");
  EXPECT_NE(Authenticator::Challenge(true).find("error=\"invalid_token\""), std::string::npos);
}

}  // namespace
}  // namespace shoal::server
