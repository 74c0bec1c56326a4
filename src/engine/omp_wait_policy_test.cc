#include "engine/omp_wait_policy.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace shoal::engine {
namespace {

// Runs this test binary again, only `test`, with the OpenMP variables of this process
// (and shoal's marker) replaced by `env`, and SHOAL_OMP_WAIT_CHILD=1; its exit status.
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
  const std::string self = "/proc/self/exe";
  const std::string filter = "--gtest_filter=" + test;
  std::vector<char*> argv = {const_cast<char*>(self.c_str()), const_cast<char*>(filter.c_str()),
                             nullptr};
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

double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// CPU time the process burns, per round, while its main thread sleeps 40 ms after a
// two-thread parallel region: what the idle worker spends waiting for the next region.
volatile double work_sink = 0;

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

// The child's argv, as RunSelf passes it.
std::vector<char*> ChildArgv(const std::string& test, std::string* filter) {
  static std::string self = "/proc/self/exe";
  *filter = "--gtest_filter=" + test;
  return {self.data(), filter->data(), nullptr};
}

TEST(OmpWaitPolicyTest, ShoalSetsAShortSpinUnlessTheUserChoseOne) {
  if (IsChild()) GTEST_SKIP() << "run by the parent only";
  // Started with neither variable: shoal's default, read by libgomp (the child measures it).
  EXPECT_EQ(RunSelf("OmpWaitPolicyChild.ExecAppliesTheDefault", {}), 0);
  // The user's choice stands, whichever variable it is in.
  EXPECT_EQ(RunSelf("OmpWaitPolicyChild.ExecKeepsTheUsersSetting", {"OMP_WAIT_POLICY=active"}), 0);
  EXPECT_EQ(RunSelf("OmpWaitPolicyChild.ExecKeepsTheUsersSetting", {"GOMP_SPINCOUNT=1000"}), 0);
}

TEST(OmpWaitPolicyTest, TheMeasurementSeesASpinningWorker) {
  if (IsChild()) GTEST_SKIP() << "run by the parent only";
  // With libgomp's default a worker spins for milliseconds after each region; a worker
  // that spins without end burns most of each 40 ms sleep, which the measurement sees.
  EXPECT_EQ(RunSelf("OmpWaitPolicyChild.SpinningWorkerBurnsTheSleep", {"GOMP_SPINCOUNT=infinity"}),
            0);
}

TEST(OmpWaitPolicyChild, ExecAppliesTheDefault) {
  if (!IsChild()) GTEST_SKIP() << "run as a child";
  std::string filter;
  std::vector<char*> argv = ChildArgv("OmpWaitPolicyChild.ExecAppliesTheDefault", &filter);
  // The first run is replaced here; the second finds the variable set and goes on.
  ExecWithOmpWaitDefault(argv.data());
  const OmpWaitPolicy policy = CurrentOmpWaitPolicy();
  EXPECT_TRUE(policy.shoal_default);
  ASSERT_NE(std::getenv("GOMP_SPINCOUNT"), nullptr);
  EXPECT_STREQ(std::getenv("GOMP_SPINCOUNT"), kDefaultSpinCount);
  EXPECT_EQ(policy.description,
            std::string("GOMP_SPINCOUNT=") + kDefaultSpinCount + " (shoal's default)");
  // libgomp read it: an idle worker sleeps within microseconds instead of spinning.
  EXPECT_LT(IdleWorkerCpuMsPerRound(), 2.0);
}

TEST(OmpWaitPolicyChild, ExecKeepsTheUsersSetting) {
  if (!IsChild()) GTEST_SKIP() << "run as a child";
  const char* policy_before = std::getenv("OMP_WAIT_POLICY");
  const char* spin_before = std::getenv("GOMP_SPINCOUNT");
  const std::string before =
      std::string(policy_before ? policy_before : "-") + "/" + (spin_before ? spin_before : "-");
  std::string filter;
  std::vector<char*> argv = ChildArgv("OmpWaitPolicyChild.ExecKeepsTheUsersSetting", &filter);
  ExecWithOmpWaitDefault(argv.data());  // returns: the user set a variable
  const char* policy_after = std::getenv("OMP_WAIT_POLICY");
  const char* spin_after = std::getenv("GOMP_SPINCOUNT");
  EXPECT_EQ(std::string(policy_after ? policy_after : "-") + "/" + (spin_after ? spin_after : "-"),
            before);
  const OmpWaitPolicy policy = CurrentOmpWaitPolicy();
  EXPECT_FALSE(policy.shoal_default);
  EXPECT_NE(policy.description.find("(from the environment)"), std::string::npos)
      << policy.description;
}

TEST(OmpWaitPolicyChild, SpinningWorkerBurnsTheSleep) {
  if (!IsChild()) GTEST_SKIP() << "run as a child";
  EXPECT_FALSE(CurrentOmpWaitPolicy().shoal_default);
  EXPECT_GT(IdleWorkerCpuMsPerRound(), 4.0);
}

}  // namespace
}  // namespace shoal::engine
