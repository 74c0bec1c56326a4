#include "worker/testing/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

namespace shoal::worker::testing {
namespace {

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace

RedisAddress RedisTestServer::address() const {
  RedisAddress a;
  a.host = "127.0.0.1";
  a.port = port_;
  return a;
}

std::unique_ptr<RedisClient> RedisTestServer::Connect() const {
  auto c = RedisClient::Connect(address(), 30000);
  if (!c.ok()) std::abort();
  return std::move(c).value();
}

std::unique_ptr<RedisTestServer> RedisTestServer::Start(std::string* error) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::unique_ptr<RedisTestServer> s(new RedisTestServer);
    std::string pattern = (std::filesystem::temp_directory_path() / "shoal_redis_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      *error = "mkdtemp failed";
      return nullptr;
    }
    s->dir_ = pattern;
    s->port_ = FreeLoopbackPort();
    std::vector<std::string> args = {"redis-server",
                                     "--port",
                                     std::to_string(s->port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--dir",
                                     s->dir_,
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--logfile",
                                     s->dir_ + "/redis.log",
                                     "--protected-mode",
                                     "yes"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    s->pid_ = fork();
    if (s->pid_ == 0) {
      execvp("redis-server", argv.data());
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(s->pid_, &status, WNOHANG) == s->pid_) {
        s->pid_ = -1;
        *error = WIFEXITED(status) && WEXITSTATUS(status) == 127
                     ? "redis-server is not installed (scripts/install-deps.sh installs it)"
                     : "redis-server exited at start";
        break;
      }
      auto c = RedisClient::Connect(s->address(), 1000);
      if (c.ok()) {
        auto pong = (*c)->Command({"PING"});
        if (pong.ok() && pong->str == "PONG") return s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (error->find("not installed") != std::string::npos) return nullptr;
    if (error->empty()) *error = "redis-server did not answer PING within 10 s";
  }
  return nullptr;
}

RedisTestServer::~RedisTestServer() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

}  // namespace shoal::worker::testing
