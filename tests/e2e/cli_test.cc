// `shoal` refuses what it would otherwise silently ignore, and says why: an unknown key in
// a --config file, --load-model outside explicit mode; `shoal inspect` exits non-zero on a
// model the engine cannot run.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "shoal_process.h"

namespace shoal::e2e {
namespace {

// Runs `shoal args...` to its end; its exit status, and its output in *log.
int RunToEnd(const std::vector<std::string>& args, std::string* log) {
  auto p = ShoalProcess::Start(args);
  if (p == nullptr) return -1;
  const int status = p->Wait();
  *log = p->log();
  return status;
}

TEST(CliE2eTest, UnknownKeyInAConfigFileIsRefusedNamingIt) {
  TempDir repo;
  TempDir dir;
  dir.WriteFile("shoal.toml", "[serve]\nmodel-repository = \"" + repo.path() +
                                  "\"\nhttp-prot = " + std::to_string(FreePort()) + "\n");
  std::string log;
  const int status = RunToEnd(
      {"--config", dir.path() + "/shoal.toml", "serve", "--grpc-port", std::to_string(FreePort()),
       "--metrics-port", std::to_string(FreePort()), "--http-port", std::to_string(FreePort())},
      &log);
  EXPECT_NE(status, 0) << "started with a misspelled key ignored:\n" << log;
  EXPECT_NE(log.find("unknown key 'serve.http-prot'"), std::string::npos) << log;
}

TEST(CliE2eTest, LoadModelOutsideExplicitModeIsRefused) {
  TempDir repo;
  std::string log;
  const int status =
      RunToEnd({"serve", "--model-repository", repo.path(), "--load-model", "x", "--http-port",
                std::to_string(FreePort()), "--grpc-port", std::to_string(FreePort()),
                "--metrics-port", std::to_string(FreePort())},
               &log);
  EXPECT_NE(status, 0) << log;
  EXPECT_NE(log.find("--load-model applies only with --model-control-mode explicit"),
            std::string::npos)
      << log;
}

TEST(CliE2eTest, InspectExitsNonZeroOnUnsupportedOperators) {
  const std::string mlp = SourceDir() + "/models/mlp_op13.onnx";
  std::string log;
  ASSERT_EQ(RunToEnd({"inspect", mlp}, &log), 0) << log;
  // The same model with its Relu nodes renamed Celu (same length, so the protobuf stays
  // valid), an operator the engine does not have.
  std::ifstream in(mlp, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  std::string model = bytes.str();
  for (size_t at = model.find("Relu"); at != std::string::npos; at = model.find("Relu", at))
    model.replace(at, 4, "Celu");
  TempDir dir;
  dir.WriteFile("celu.onnx", model);
  const int status = RunToEnd({"inspect", dir.path() + "/celu.onnx"}, &log);
  EXPECT_EQ(status, 2) << log;
  EXPECT_NE(log.find("unsupported operators:\n  Celu"), std::string::npos) << log;
}

// `shoal inspect --gpu` adds what the GPU path makes of the model: in a build with the
// CUDA path (no GPU needed) whether it lowers whole; without, that the build lacks it.
TEST(CliE2eTest, InspectGpuSaysWhatTheGpuPathMakesOfTheModel) {
  std::string log;
  ASSERT_EQ(RunToEnd({"inspect", "--gpu", SourceDir() + "/models/mlp_op13.onnx"}, &log), 0) << log;
  EXPECT_TRUE(log.find("GPU path (batch 1") != std::string::npos ||
              log.find("GPU path: this shoal was built without the CUDA path") != std::string::npos)
      << log;
  EXPECT_EQ(log.find("GPU path (batch 1") != std::string::npos,
            log.find("lowers whole") != std::string::npos)
      << log;
}

}  // namespace
}  // namespace shoal::e2e
