// End-to-end tests of `shoal run`: the real binary on files in a temporary folder, with the
// add_sub example plugin (two inputs, two outputs, so .npy output is one file per output).
// Assertions are on exit codes, messages and file contents.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/npy.h"
#include "runtime/testing/plugin_configs.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kRows = 10;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class RunE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_.WriteFile("add_sub/config.pbtxt", runtime::testing::kAddSubConfig);
    repo_.WriteFile("add_sub/1/.keep", "");
    std::vector<int32_t> a, b;
    for (int i = 0; i < kRows * 4; ++i) {
      a.push_back(i);
      b.push_back(1000);
    }
    ASSERT_TRUE(WriteNpz(Path("in.npz"),
                         {{"INPUT0", Tensor::FromVector<int32_t>(DataType::kInt32, {kRows, 4}, a)},
                          {"INPUT1", Tensor::FromVector<int32_t>(DataType::kInt32, {kRows, 4}, b)}})
                    .ok());
  }
  std::string Path(const std::string& name) const { return files_.path() + "/" + name; }
  // Runs `shoal run` over in.npz into out.npy with `extra` flags; returns the exit status
  // and keeps what it printed in output_.
  int Run(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"run", "--model-repository", repo_.path(), "-m", "add_sub",
                                     "--input", Path("in.npz"), "--output", Path("out.npy"),
                                     "--backend-directory", BinaryDir() + "/backends", "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = ShoalProcess::Start(args);
    const int rc = p->Wait(60'000);
    output_ = p->log();
    return rc;
  }

  TempDir repo_, files_;
  std::string output_;
};

TEST_F(RunE2eTest, MultiOutputNpyResumesAfterLimit) {
  ASSERT_EQ(Run({"--limit", "4"}), 0) << output_;
  ASSERT_EQ(Run(), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("6 rows in"));
  EXPECT_THAT(output_, HasSubstr("(4 rows done by an earlier run)"));
  auto sum = ReadNpy(Path("out.OUTPUT0.npy"));
  auto diff = ReadNpy(Path("out.OUTPUT1.npy"));
  ASSERT_TRUE(sum.ok() && diff.ok());
  for (int row = 0; row < kRows; ++row) {
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(sum->Row(row).values<int32_t>()[k], row * 4 + k + 1000) << row;
      EXPECT_EQ(diff->Row(row).values<int32_t>()[k], row * 4 + k - 1000) << row;
    }
  }
}

TEST_F(RunE2eTest, DamagedDoneLogExitsOneNamingTheLineAndChangesNothing) {
  ASSERT_EQ(Run({"--limit", "4"}), 0) << output_;
  {
    std::ofstream log(Path("out.npy.done"), std::ios::app);
    log << "12ab\n";
  }
  const std::string log = ReadFile(Path("out.npy.done"));
  const std::string out0 = ReadFile(Path("out.OUTPUT0.npy"));
  EXPECT_EQ(Run(), 1) << output_;
  EXPECT_THAT(output_, HasSubstr("out.npy.done' line 6 is '12ab', not a row index"));
  EXPECT_THAT(output_, Not(HasSubstr("terminate")));
  EXPECT_EQ(ReadFile(Path("out.npy.done")), log);
  EXPECT_EQ(ReadFile(Path("out.OUTPUT0.npy")), out0);
  // --no-resume starts over and finishes.
  EXPECT_EQ(Run({"--no-resume"}), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("10 rows in"));
}

}  // namespace
}  // namespace shoal::e2e
