// RedisTestServer: a real redis-server (Debian's redis-server, found on PATH) for tests,
// started on a free loopback port with a fresh temporary folder and no persistence, and
// killed with the folder removed when this goes away. Test-only.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "worker/redis_client.h"

namespace shoal::worker::testing {

class RedisTestServer {
 public:
  // Null (with the reason in *error) when redis-server cannot be started.
  static std::unique_ptr<RedisTestServer> Start(std::string* error);
  ~RedisTestServer();
  RedisTestServer(const RedisTestServer&) = delete;
  RedisTestServer& operator=(const RedisTestServer&) = delete;

  int port() const { return port_; }
  RedisAddress address() const;
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  // A fresh client (the test fails loudly if this cannot connect).
  std::unique_ptr<RedisClient> Connect() const;

 private:
  RedisTestServer() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
};

}  // namespace shoal::worker::testing
