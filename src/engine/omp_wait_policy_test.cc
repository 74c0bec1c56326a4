#include "engine/omp_wait_policy.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace shoal::engine {
namespace {

namespace fs = std::filesystem;

// Runs this test binary again (by its real path, so that the child has the binary's
// name), only `test`, with the OpenMP variables of this process (and shoal's marker)
// replaced by `env`, and SHOAL_OMP_WAIT_CHILD=1; its exit status.
int RunSelf(const std::string& test, const std::vector<std::string>& env) {
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (name != "OMP_WAIT_POLICY" && name != "GOMP_SPINCOUNT" && name != kDefaultMarker) {
      vars.push_back(entry);
    }
  }
  vars.insert(vars.end(), env.begin(), env.end());
  vars.emplace_back("SHOAL_OMP_WAIT_CHILD=1");
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=" + test;
  std::vector<char*> argv = {self.data(), filter.data(), nullptr};
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

bool IsChild() { return std::getenv("SHOAL_OMP_WAIT_CHILD") != nullptr; }

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

volatile double work_sink = 0;

// libgomp is not instrumented for ThreadSanitizer, which reports its barriers as races
// (engine/test_util.h): TSan builds check the variables and the exec, not the spinning.
#if defined(SHOAL_TSAN)
constexpr bool kMeasureSpinning = false;
#else
constexpr bool kMeasureSpinning = true;
#endif

// CPU time the process burns, per round, while its main thread sleeps 40 ms after a
// two-thread parallel region: what the idle worker spends waiting for the next region.
double IdleWorkerCpuMsPerRound() {
  constexpr int kRounds = 6;
  double idle_ms = 0;
  for (int round = 0; round < kRounds; ++round) {
    double sum = 0;
#pragma omp parallel num_threads(2) reduction(+ : sum)
    for (int i = 0; i < 100000; ++i) sum += i * 1e-9;
    work_sink = sum;
    const double before = ProcessCpuMs();
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    idle_ms += ProcessCpuMs() - before;
  }
  return idle_ms / kRounds;
}

// A child's measurement, handed to the parent through a file.
std::string ResultPath(const std::string& what) {
  return (fs::temp_directory_path() / ("shoal_omp_wait_" + std::to_string(getpid()) + "_" + what))
      .string();
}
void WriteResult(double ms) {
  const char* path = std::getenv("SHOAL_OMP_WAIT_OUT");
  if (path != nullptr) std::ofstream(path) << ms;
}
double ReadResult(const std::string& path) {
  double ms = -1;
  std::ifstream(path) >> ms;
  fs::remove(path);
  return ms;
}

TEST(OmpWaitPolicyTest, ShoalSetsAShortSpinThatLibgompUsesUnlessTheUserChoseOne) {
  if (IsChild()) GTEST_SKIP() << "run by the parent only";
  if (AvailableCpus() < 2) GTEST_SKIP() << "needs 2 CPUs: libgomp spins little on one anyway";
  // Started with neither variable: shoal's default, read by libgomp.
  const std::string with_default = ResultPath("default");
  EXPECT_EQ(
      RunSelf("OmpWaitPolicyChild.ExecAppliesTheDefault", {"SHOAL_OMP_WAIT_OUT=" + with_default}),
      0);
  // The same measurement with libgomp's own default (no exec) sees the worker spin.
  const std::string without = ResultPath("libgomp");
  EXPECT_EQ(RunSelf("OmpWaitPolicyChild.MeasureWithoutTheExec", {"SHOAL_OMP_WAIT_OUT=" + without}),
            0);
  const double short_ms = ReadResult(with_default), libgomp_ms = ReadResult(without);
  if (kMeasureSpinning) {
    ASSERT_GE(short_ms, 0);
    ASSERT_GE(libgomp_ms, 0);
    EXPECT_LT(short_ms, 2.0);
    EXPECT_GT(libgomp_ms, 3 * short_ms) << "the measurement cannot tell spinning from sleeping";
  }
  // The user's choice stands, whichever variable it is in; so does an affinity setting.
  EXPECT_EQ(RunSelf("OmpWaitPolicyChild.ExecKeepsTheUsersSetting", {"OMP_WAIT_POLICY=active"}), 0);
  EXPECT_EQ(RunSelf("OmpWaitPolicyChild.ExecKeepsTheUsersSetting", {"GOMP_SPINCOUNT=1000"}), 0);
  EXPECT_EQ(RunSelf("OmpWaitPolicyChild.ExecKeepsTheUsersSetting", {"OMP_PROC_BIND=true"}), 0);
}

TEST(OmpWaitPolicyChild, ExecAppliesTheDefault) {
  if (!IsChild()) GTEST_SKIP() << "run as a child";
  std::array<char, 17> name_before{};
  ASSERT_EQ(prctl(PR_GET_NAME, name_before.data(), 0, 0, 0), 0);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=OmpWaitPolicyChild.ExecAppliesTheDefault";
  std::vector<char*> argv = {self.data(), filter.data(), nullptr};
  // The first run is replaced here; the second finds the variable set and goes on.
  ExecWithOmpWaitDefault(argv.data());
  const OmpWaitPolicy policy = CurrentOmpWaitPolicy();
  EXPECT_TRUE(policy.shoal_default);
  ASSERT_NE(std::getenv("GOMP_SPINCOUNT"), nullptr);
  EXPECT_STREQ(std::getenv("GOMP_SPINCOUNT"), kDefaultSpinCount);
  EXPECT_EQ(policy.description,
            std::string("GOMP_SPINCOUNT=") + kDefaultSpinCount + " (shoal's default)");
  // The exec named the process "exe"; it has the binary's name again.
  std::array<char, 17> name{};
  ASSERT_EQ(prctl(PR_GET_NAME, name.data(), 0, 0, 0), 0);
  EXPECT_STREQ(name.data(), fs::path(self).filename().string().substr(0, 15).c_str());
  if (kMeasureSpinning) WriteResult(IdleWorkerCpuMsPerRound());
}

TEST(OmpWaitPolicyChild, MeasureWithoutTheExec) {
  if (!IsChild()) GTEST_SKIP() << "run as a child";
  EXPECT_FALSE(CurrentOmpWaitPolicy().shoal_default);
  if (kMeasureSpinning) WriteResult(IdleWorkerCpuMsPerRound());
}

TEST(OmpWaitPolicyChild, ExecKeepsTheUsersSetting) {
  if (!IsChild()) GTEST_SKIP() << "run as a child";
  std::string before;
  for (const char* v : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND"}) {
    const char* value = std::getenv(v);
    before += std::string(value ? value : "-") + "/";
  }
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=OmpWaitPolicyChild.ExecKeepsTheUsersSetting";
  std::vector<char*> argv = {self.data(), filter.data(), nullptr};
  ExecWithOmpWaitDefault(argv.data());  // returns: the user chose
  std::string after;
  for (const char* v : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND"}) {
    const char* value = std::getenv(v);
    after += std::string(value ? value : "-") + "/";
  }
  EXPECT_EQ(after, before);
  EXPECT_FALSE(CurrentOmpWaitPolicy().shoal_default);
}

}  // namespace
}  // namespace shoal::engine
