#include "worker/redis_client.h"

#include <hiredis.h>
#include <sys/time.h>

#include <charconv>
#include <utility>

namespace shoal::worker {
namespace {

RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Convert(r->element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

bool ParseInt(std::string_view s, int* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

StatusOr<RedisAddress> ParseRedisUrl(std::string_view url) {
  RedisAddress a;
  std::string_view rest = url;
  constexpr std::string_view kScheme = "redis://";
  if (rest.substr(0, kScheme.size()) == kScheme) {
    rest.remove_prefix(kScheme.size());
  } else if (rest.find("://") != std::string_view::npos) {
    return InvalidArgument("--redis: only redis:// URLs are supported; was '" + std::string(url) +
                           "'");
  }
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    if (const size_t colon = userinfo.find(':'); colon != std::string_view::npos) {
      a.user = std::string(userinfo.substr(0, colon));
      a.password = std::string(userinfo.substr(colon + 1));
    } else {
      a.password = std::string(userinfo);
    }
    rest.remove_prefix(at + 1);
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!ParseInt(db, &a.db) || a.db < 0)) {
      return InvalidArgument("--redis: database must be a non-negative integer; was '" +
                             std::string(db) + "'");
    }
    rest = rest.substr(0, slash);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    std::string_view port = rest.substr(colon + 1);
    if (!ParseInt(port, &a.port) || a.port <= 0 || a.port > 65535) {
      return InvalidArgument("--redis: port must be in 1..65535; was '" + std::string(port) + "'");
    }
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return InvalidArgument("--redis: no host in '" + std::string(url) + "'");
  a.host = std::string(rest);
  return a;
}

RedisClient::RedisClient(RedisAddress address, int timeout_ms)
    : address_(std::move(address)), timeout_ms_(timeout_ms) {}

RedisClient::~RedisClient() {
  if (context_ != nullptr) redisFree(context_);
}

StatusOr<std::unique_ptr<RedisClient>> RedisClient::Connect(const RedisAddress& address,
                                                            int timeout_ms) {
  if (timeout_ms <= 0) {
    return InvalidArgument("redis timeout must be positive; was " + std::to_string(timeout_ms));
  }
  std::unique_ptr<RedisClient> client(new RedisClient(address, timeout_ms));
  RETURN_IF_ERROR(client->EnsureConnected());
  return client;
}

Status RedisClient::Broken(std::string_view what) {
  std::string message =
      "redis " + address_.host + ":" + std::to_string(address_.port) + ": " + std::string(what);
  if (context_ != nullptr) {
    if (context_->err != 0) message += std::string(": ") + context_->errstr;
    redisFree(context_);
    context_ = nullptr;
  }
  return Unavailable(std::move(message));
}

Status RedisClient::EnsureConnected() {
  if (context_ != nullptr) return Status::Ok();
  timeval tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
  context_ = redisConnectWithTimeout(address_.host.c_str(), address_.port, tv);
  if (context_ == nullptr) return Unavailable("redis: cannot allocate a connection");
  if (context_->err != 0) return Broken("cannot connect");
  if (redisSetTimeout(context_, tv) != REDIS_OK) return Broken("cannot set the timeout");
  // Straight to hiredis: Command() would recurse into EnsureConnected.
  auto setup = [&](const std::vector<std::string>& argv) -> Status {
    std::vector<const char*> args;
    std::vector<size_t> lens;
    for (const std::string& s : argv) {
      args.push_back(s.data());
      lens.push_back(s.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(context_, static_cast<int>(args.size()), args.data(), lens.data()));
    if (r == nullptr) return Broken(argv[0]);
    const bool error = r->type == REDIS_REPLY_ERROR;
    std::string text = error ? std::string(r->str, r->len) : "";
    freeReplyObject(r);
    if (error) {
      redisFree(context_);
      context_ = nullptr;
      return Unavailable("redis " + argv[0] + ": " + text);
    }
    return Status::Ok();
  };
  if (!address_.user.empty()) {
    RETURN_IF_ERROR(setup({"AUTH", address_.user, address_.password}));
  } else if (!address_.password.empty()) {
    RETURN_IF_ERROR(setup({"AUTH", address_.password}));
  }
  if (address_.db != 0) RETURN_IF_ERROR(setup({"SELECT", std::to_string(address_.db)}));
  return Status::Ok();
}

StatusOr<RedisReply> RedisClient::Command(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(std::vector<RedisReply> replies, Pipeline({argv}));
  return std::move(replies.front());
}

StatusOr<std::vector<RedisReply>> RedisClient::Pipeline(
    const std::vector<std::vector<std::string>>& commands) {
  RETURN_IF_ERROR(EnsureConnected());
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const auto& argv : commands) {
    args.clear();
    lens.clear();
    for (const std::string& s : argv) {
      args.push_back(s.data());
      lens.push_back(s.size());
    }
    if (redisAppendCommandArgv(context_, static_cast<int>(args.size()), args.data(), lens.data()) !=
        REDIS_OK) {
      return Broken("cannot queue " + (argv.empty() ? std::string("a command") : argv[0]));
    }
  }
  std::vector<RedisReply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
      return Broken("no reply to " + commands[i][0]);
    }
    replies.push_back(Convert(static_cast<redisReply*>(raw)));
    freeReplyObject(raw);
  }
  return replies;
}

}  // namespace shoal::worker
