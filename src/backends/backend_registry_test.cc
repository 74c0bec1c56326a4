#include "backends/backend_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "backends/plugin_backend.h"

namespace shoal::backends {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string BinaryDir() {
  const char* dir = std::getenv("SHOAL_BINARY_DIR");
  return dir != nullptr ? dir : ".";
}
std::string PluginDir() { return BinaryDir() + "/backends"; }
std::string PluginPath(const std::string& name) {
  return PluginDir() + "/libshoal_" + name + ".so";
}

class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  StatusOr<std::unique_ptr<BackendModel>> LoadModel(const ModelInfo&) override {
    return Unimplemented("fake");
  }

 private:
  std::string name_;
};

// A fresh directory under the test's temp dir, removed at the end of the test.
class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/backend_registry_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  // Copies the built plugin `plugin` to `dir`/`file`, creating `dir`.
  std::string Install(const std::string& plugin, const fs::path& dir, const std::string& file) {
    fs::create_directories(dir);
    const fs::path to = dir / file;
    fs::copy_file(PluginPath(plugin), to, fs::copy_options::overwrite_existing);
    return fs::weakly_canonical(to).string();
  }
  static std::string PathOf(const std::shared_ptr<Backend>& backend) {
    auto plugin = std::dynamic_pointer_cast<PluginBackend>(backend);
    return plugin ? plugin->library_path() : "(not a plugin)";
  }

  fs::path root_;
};

TEST_F(RegistryTest, BuiltInsAndAliases) {
  BackendRegistry registry;
  auto onnx = std::make_shared<FakeBackend>("onnx");
  registry.Register(onnx);
  registry.RegisterAlias("onnxruntime_onnx", "onnx");
  auto found = registry.Find("onnx", "");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, onnx);
  found = registry.Find("onnxruntime_onnx", "");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, onnx);
}

TEST_F(RegistryTest, BuiltInWinsOverAPluginOfTheSameName) {
  BackendRegistry registry;
  registry.AddPluginDirectory(PluginDir());
  auto fake = std::make_shared<FakeBackend>("identity");
  registry.Register(fake);
  auto found = registry.Find("identity", "");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, fake);
}

TEST_F(RegistryTest, FindsAndCachesAPluginInAPluginDirectory) {
  BackendRegistry registry;
  registry.AddPluginDirectory(PluginDir());
  EXPECT_EQ(registry.plugin_directories(), std::vector<std::string>{PluginDir()});
  auto first = registry.Find("identity", (root_ / "model").string());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)->name(), "identity");
  EXPECT_EQ(PathOf(*first), fs::weakly_canonical(PluginPath("identity")).string());
  auto second = registry.Find("identity", "");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);

  // A loaded plugin works through the registry too.
  ModelInfo info;
  info.name = "m";
  auto model = (*first)->LoadModel(info);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
}

TEST_F(RegistryTest, AnAliasCanNameAPlugin) {
  BackendRegistry registry;
  registry.AddPluginDirectory(PluginDir());
  registry.RegisterAlias("echo", "identity");
  auto found = registry.Find("echo", "");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ((*found)->name(), "identity");
}

TEST_F(RegistryTest, SearchOrderIsModelDirThenEachPluginDirFlatThenNested) {
  const fs::path model_dir = root_ / "repo" / "my_model";
  const fs::path dir1 = root_ / "plugins1";
  const fs::path dir2 = root_ / "plugins2";
  const std::string in_model = Install("identity", model_dir, "libshoal_echo.so");
  const std::string dir1_nested = Install("identity", dir1 / "echo", "libshoal_echo.so");
  const std::string dir1_flat = Install("identity", dir1, "libshoal_echo.so");
  const std::string dir2_flat = Install("identity", dir2, "libshoal_echo.so");

  BackendRegistry registry;
  registry.AddPluginDirectory(dir1.string());
  registry.AddPluginDirectory(dir2.string());
  auto Found = [&](const std::string& model) {
    auto backend = registry.Find("echo", model);
    return backend.ok() ? PathOf(*backend) : backend.status().ToString();
  };
  EXPECT_EQ(Found(model_dir.string()), in_model);
  EXPECT_EQ(Found(""), dir1_flat);
  fs::remove(dir1_flat);
  EXPECT_EQ(Found((root_ / "repo" / "other_model").string()), dir1_nested);
  fs::remove_all(dir1 / "echo");
  EXPECT_EQ(Found(""), dir2_flat);
}

TEST_F(RegistryTest, NotFoundListsEveryPlaceSearched) {
  BackendRegistry registry;
  registry.AddPluginDirectory((root_ / "a").string());
  registry.AddPluginDirectory((root_ / "b").string());
  auto found = registry.Find("nothing", (root_ / "m").string());
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), StatusCode::kNotFound);
  const std::string r = root_.string();
  EXPECT_EQ(found.status().message(),
            "no backend 'nothing': it is not built in, and no plugin library was found at " + r +
                "/m/libshoal_nothing.so, " + r + "/a/libshoal_nothing.so, " + r +
                "/a/nothing/libshoal_nothing.so, " + r + "/b/libshoal_nothing.so, " + r +
                "/b/nothing/libshoal_nothing.so");

  registry.RegisterAlias("gone", "nothing");
  found = registry.Find("gone", "");
  EXPECT_THAT(found.status().message(), HasSubstr("no backend 'gone' (an alias of 'nothing')"));

  BackendRegistry empty;
  EXPECT_THAT(empty.Find("x", "").status().message(),
              HasSubstr("there is no model directory or plugin directory to search"));
}

TEST_F(RegistryTest, NamesThatCouldLeaveTheDirectoryAreRejected) {
  BackendRegistry registry;
  registry.AddPluginDirectory(PluginDir());
  for (const std::string name : {"", "../identity", "a/b", ".hidden", "sp ace"}) {
    auto found = registry.Find(name, "");
    ASSERT_FALSE(found.ok()) << name;
    EXPECT_EQ(found.status().code(), StatusCode::kInvalidArgument) << name;
  }
}

TEST_F(RegistryTest, ABrokenPluginIsReportedNotSkipped) {
  const fs::path dir1 = root_ / "p1";
  fs::create_directories(dir1);
  fs::copy_file(BinaryDir() + "/backends_testdata/libshoal_test_missing_execute.so",
                dir1 / "libshoal_echo.so");
  Install("identity", root_ / "p2", "libshoal_echo.so");
  BackendRegistry registry;
  registry.AddPluginDirectory(dir1.string());
  registry.AddPluginDirectory((root_ / "p2").string());
  auto found = registry.Find("echo", "");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(found.status().message(), HasSubstr("does not export shoal_instance_execute"));
}

TEST_F(RegistryTest, ConcurrentFindsOpenOnePlugin) {
  BackendRegistry registry;
  registry.AddPluginDirectory(PluginDir());
  std::vector<std::shared_ptr<Backend>> found(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < found.size(); ++i) {
    threads.emplace_back([&, i] {
      if (i % 2 == 0) registry.AddPluginDirectory((root_ / std::to_string(i)).string());
      auto backend = registry.Find(i % 3 == 0 ? "add_sub" : "identity", "");
      if (backend.ok()) found[i] = *backend;
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < found.size(); ++i) {
    ASSERT_NE(found[i], nullptr) << i;
    EXPECT_EQ(found[i], found[i % 3 == 0 ? 0 : 1]) << i;
  }
  EXPECT_EQ(registry.plugin_directories().size(), 5u);
}

}  // namespace
}  // namespace shoal::backends
