#include "shoal_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace shoal::e2e {
namespace {

sockaddr_in Ipv4Address(in_addr_t host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(host);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

int FreePort() {
  // Picked below the kernel's ephemeral range (32768 and up here), where the kernel asked
  // for "any port" used to look: between this pick and the server's bind, every outgoing
  // connection of a parallel test (load generators open many) could take an ephemeral
  // port, and the server then failed to start. Below it, only another pick can collide.
  auto bindable = [](int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Ipv4Address(INADDR_ANY, port);
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
  };
  // Nor twice to one process: a test that asks for three ports at once once got the same
  // one for two services (a one-in-a-few-thousand draw), and its server failed to start.
  static std::mutex mu;
  static std::set<int> given;
  static std::mt19937 pick(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  std::uniform_int_distribution<int> below_ephemeral(20000, 32000);
  auto usable = [&](int port) { return given.count(port) == 0 && bindable(port); };
  int port = below_ephemeral(pick);
  for (int attempt = 0; attempt < 200 && !usable(port); ++attempt) port = below_ephemeral(pick);
  given.insert(port);
  return port;  // after 200 taken ports, the server's own bind error will say so
}

std::string BinaryDir() {
  const char* d = std::getenv("SHOAL_BINARY_DIR");
  return d ? d : ".";
}

std::string SourceDir() {
  const char* d = std::getenv("SHOAL_SOURCE_DIR");
  return d ? d : ".";
}

TempDir::TempDir() {
  std::random_device rd;
  path_ = (std::filesystem::temp_directory_path() /
           ("shoal_e2e_" + std::to_string(rd()) + std::to_string(getpid())))
              .string();
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void TempDir::WriteFile(const std::string& relative, const std::string& contents) const {
  const auto p = std::filesystem::path(path_) / relative;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << contents;
}

std::unique_ptr<ShoalProcess> ShoalProcess::Start(const std::vector<std::string>& args) {
  auto p = std::unique_ptr<ShoalProcess>(new ShoalProcess());
  static int counter = 0;
  p->log_path_ =
      (std::filesystem::temp_directory_path() /
       ("shoal_e2e_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".log"))
          .string();
  const std::string binary = BinaryDir() + "/src/cli/shoal";
  std::vector<std::string> argv_s = {binary};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(p->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  p->pid_ = pid;
  return p;
}

ShoalProcess::~ShoalProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::remove(log_path_.c_str());
}

bool ShoalProcess::running() {
  if (exited_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    return false;
  }
  return true;
}

bool ShoalProcess::WaitForPort(int port, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (!WaitForListening(port, timeout_ms)) return false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (log().find("start-up loading finished") != std::string::npos) return true;
    if (!running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool ShoalProcess::WaitForListening(int port, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!running()) return false;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Ipv4Address(INADDR_LOOPBACK, port);
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void ShoalProcess::Signal(int sig) {
  if (!exited_) kill(pid_, sig);
}

int ShoalProcess::Wait(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!running()) return exit_code_;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  exited_ = true;
  return -1000;
}

int ShoalProcess::Terminate(int timeout_ms) {
  Signal(SIGTERM);
  return Wait(timeout_ms);
}

std::string ShoalProcess::log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace shoal::e2e
