// RedisClient: one blocking connection to a Redis server (hiredis), for the queue worker.
//
// Commands are argv vectors, so binary payloads pass unchanged. Replies come back as a
// RedisReply tree that owns its strings, which is what the pure parsers of the worker
// (entry.h) read, so they are tested without a server.
//
// Errors: a reply of type kError (e.g. "BUSYGROUP ...") is a successful round trip and is
// returned as a reply; an I/O failure (refused, reset, timed out) is UNAVAILABLE, and the
// next call reconnects. Not thread-safe: each thread keeps its own client.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

struct redisContext;

namespace shoal::worker {

struct RedisReply {
  enum class Type { kNil, kString, kStatus, kError, kInteger, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray

  bool is_error() const { return type == Type::kError; }
  bool is_array() const { return type == Type::kArray; }
  bool is_string() const { return type == Type::kString || type == Type::kStatus; }
};

// redis://[[user]:password@]host[:port][/db] (default port 6379, db 0). A bare
// host:port is accepted as well. INVALID_ARGUMENT naming what is wrong. With a user, the
// connection authenticates as that ACL user (Redis 6+); with only a password, as the
// default user.
struct RedisAddress {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
  std::string user;
  std::string password;
};
StatusOr<RedisAddress> ParseRedisUrl(std::string_view url);

class RedisClient {
 public:
  // `timeout_ms` bounds the connect and every read; a blocking command (XREADGROUP
  // BLOCK n) needs a timeout above n. UNAVAILABLE when the server cannot be reached,
  // refuses AUTH or SELECT.
  static StatusOr<std::unique_ptr<RedisClient>> Connect(const RedisAddress& address,
                                                        int timeout_ms);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  StatusOr<RedisReply> Command(const std::vector<std::string>& argv);
  // Sends every command, then reads every reply (one round trip); replies in order.
  StatusOr<std::vector<RedisReply>> Pipeline(const std::vector<std::vector<std::string>>& commands);

 private:
  RedisClient(RedisAddress address, int timeout_ms);
  Status EnsureConnected();
  Status Broken(std::string_view what);

  const RedisAddress address_;
  const int timeout_ms_;
  redisContext* context_ = nullptr;
};

}  // namespace shoal::worker
