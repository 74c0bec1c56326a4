// ShoalProcess: starts the real `shoal` binary for end-to-end tests and stops it.
//
//   auto p = ShoalProcess::Start({"serve", "--model-repository", repo, "--http-port",
//                                 std::to_string(http)});
//   ASSERT_TRUE(p->WaitForPort(http));
//   ... talk to it over loopback ...
//   EXPECT_EQ(p->Terminate(), 0);   // SIGTERM, then the exit status
//
// The binary is $SHOAL_BINARY_DIR/src/cli/shoal; its stdout and stderr go to a log file
// whose text log() returns, for assertions and for failure messages.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace shoal::e2e {

// A TCP port on 127.0.0.1 that was free a moment ago, and not returned before in this
// process.
int FreePort();
// $SHOAL_BINARY_DIR or "."; $SHOAL_SOURCE_DIR or ".".
std::string BinaryDir();
std::string SourceDir();
// A fresh temporary directory, removed by the returned guard's destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  void WriteFile(const std::string& relative, const std::string& contents) const;

 private:
  std::string path_;
};

class ShoalProcess {
 public:
  static std::unique_ptr<ShoalProcess> Start(const std::vector<std::string>& args);
  ~ShoalProcess();  // SIGKILL if still running

  // True once a TCP connection to 127.0.0.1:port succeeds and, for `shoal serve`, the
  // start-up models finished loading (its log says "start-up loading finished"): the
  // front ends answer before models load, and a test should not race the loading
  // (bounded wait).
  bool WaitForPort(int port, int timeout_ms = 20000);
  // Only the first half: true once a TCP connection to 127.0.0.1:port succeeds.
  bool WaitForListening(int port, int timeout_ms = 20000);
  // Sends SIGTERM and waits (bounded); returns the exit status, or -signal if killed,
  // or -1000 on timeout (then it is killed).
  int Terminate(int timeout_ms = 20000);
  void Signal(int sig);
  // Waits for the process to exit by itself; same return convention as Terminate.
  int Wait(int timeout_ms = 20000);
  bool running();
  std::string log() const;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  bool exited_ = false;
  int exit_code_ = 0;
};

}  // namespace shoal::e2e
