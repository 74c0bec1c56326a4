#include "repository/repository.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <string>

namespace shoal::repository {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A repository folder under the system temp dir, removed on destruction.
class TempRepo {
 public:
  TempRepo() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() /
            ("shoal_repository_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter++) + "_" + std::to_string(std::random_device()()));
    fs::create_directories(root_);
  }
  ~TempRepo() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  TempRepo(const TempRepo&) = delete;
  TempRepo& operator=(const TempRepo&) = delete;

  const fs::path& root() const { return root_; }

  void Write(const std::string& relative, const std::string& content) const {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  }
  void Mkdir(const std::string& relative) const { fs::create_directories(root_ / relative); }
  // Moves the file's mtime forward, as an editor saving it a little later would.
  void Touch(const std::string& relative) const {
    const fs::path path = root_ / relative;
    fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(5));
  }

  // A servable ONNX model with a config and version folders holding model.onnx.
  void AddOnnxModel(const std::string& name, const std::string& config_body,
                    std::initializer_list<int> versions = {1}) const {
    Write(name + "/config.pbtxt", config_body);
    for (int v : versions) Write(name + "/" + std::to_string(v) + "/model.onnx", "onnx");
  }

 private:
  fs::path root_;
};

constexpr char kGoodConfig[] = R"cfg(
  name: "good"
  platform: "onnxruntime_onnx"
  max_batch_size: 4
  input { name: "x" data_type: TYPE_FP32 dims: [ 3 ] }
  output { name: "y" data_type: TYPE_FP32 dims: [ 3 ] }
)cfg";

TEST(ScanRepositoryTest, BrokenModelDoesNotStopTheOthers) {
  TempRepo repo;
  repo.AddOnnxModel("good", kGoodConfig);
  repo.AddOnnxModel("broken", "name: \"broken\"\nmax_batch_size: [\n");
  repo.AddOnnxModel("invalid", "max_batch_size: -3 platform: \"onnxruntime_onnx\"");
  repo.Mkdir("no_config/1");                  // neither config.pbtxt nor model.onnx
  repo.AddOnnxModel(".hidden", kGoodConfig);  // ignored
  repo.Write("README.md", "not a model");     // ignored

  auto entries = ScanRepository(repo.root());
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 4u);
  EXPECT_EQ((*entries)[0].name, "broken");
  EXPECT_EQ((*entries)[1].name, "good");
  EXPECT_EQ((*entries)[2].name, "invalid");
  EXPECT_EQ((*entries)[3].name, "no_config");

  const ModelEntry& good = (*entries)[1];
  EXPECT_TRUE(good.status.ok()) << good.status.ToString();
  EXPECT_EQ(good.dir, repo.root() / "good");
  EXPECT_TRUE(good.has_config_file);
  EXPECT_FALSE(good.platform_inferred);
  EXPECT_EQ(good.config.max_batch_size(), 4);
  EXPECT_THAT(good.versions, ElementsAre(1));
  EXPECT_FALSE(good.fingerprint.empty());

  const std::string broken_path = (repo.root() / "broken" / "config.pbtxt").string();
  EXPECT_EQ((*entries)[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT((*entries)[0].status.message(), HasSubstr(broken_path + ":2:17: Expected integer"));
  EXPECT_FALSE((*entries)[0].fingerprint.empty());  // so a fix is noticed

  const std::string invalid_path = (repo.root() / "invalid" / "config.pbtxt").string();
  EXPECT_THAT((*entries)[2].status.message(),
              HasSubstr(invalid_path + ": max_batch_size must be >= 0; was -3"));

  EXPECT_THAT((*entries)[3].status.message(),
              AllOf(HasSubstr("config.pbtxt: missing"), HasSubstr("model.onnx")));
}

TEST(ScanRepositoryTest, MissingOrNonFolderRepositoryIsAnError) {
  TempRepo repo;
  auto missing = ScanRepository(repo.root() / "nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));

  repo.Write("file", "x");
  EXPECT_EQ(ScanRepository(repo.root() / "file").status().code(), StatusCode::kInvalidArgument);
}

TEST(ScanRepositoryTest, EmptyRepositoryHasNoModels) {
  TempRepo repo;
  auto entries = ScanRepository(repo.root());
  ASSERT_TRUE(entries.ok());
  EXPECT_THAT(*entries, IsEmpty());
}

TEST(ScanModelTest, EmptyNameTakesFolderName) {
  TempRepo repo;
  repo.AddOnnxModel("m",
                    "platform: \"onnxruntime_onnx\" input { name: \"a\" data_type: "
                    "TYPE_INT8 dims: [1] } output { name: \"b\" data_type: TYPE_INT8 "
                    "dims: [1] }");
  auto entry = ScanModel(repo.root(), "m");
  ASSERT_TRUE(entry.ok());
  EXPECT_TRUE(entry->status.ok()) << entry->status.ToString();
  EXPECT_EQ(entry->config.name(), "m");
}

TEST(ScanModelTest, NameMismatchNamesBoth) {
  TempRepo repo;
  repo.AddOnnxModel("folder", "name: \"other\" platform: \"onnxruntime_onnx\"");
  auto entry = ScanModel(repo.root(), "folder");
  ASSERT_TRUE(entry.ok());
  EXPECT_THAT(
      entry->status.message(),
      AllOf(HasSubstr((repo.root() / "folder" / "config.pbtxt").string()),
            HasSubstr("name must match the model folder \"folder\""), HasSubstr("was \"other\"")));
}

TEST(ScanModelTest, MissingConfigWithOnnxIsInferred) {
  TempRepo repo;
  repo.Write("bare/1/model.onnx", "v1");
  repo.Write("bare/2/model.onnx", "v2");
  auto entry = ScanModel(repo.root(), "bare");
  ASSERT_TRUE(entry.ok());
  EXPECT_TRUE(entry->status.ok()) << entry->status.ToString();
  EXPECT_FALSE(entry->has_config_file);
  EXPECT_TRUE(entry->platform_inferred);
  EXPECT_EQ(entry->config.name(), "bare");
  EXPECT_EQ(entry->config.platform(), "onnxruntime_onnx");
  EXPECT_EQ(entry->config.input_size(), 0);
  EXPECT_THAT(entry->versions, ElementsAre(2));
}

TEST(ScanModelTest, MissingConfigWithoutOnnxIsAnError) {
  TempRepo repo;
  repo.Write("bare/1/model.pt", "torch");
  auto entry = ScanModel(repo.root(), "bare");
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(entry->status.message(),
              AllOf(HasSubstr((repo.root() / "bare" / "config.pbtxt").string()),
                    HasSubstr("missing"), HasSubstr("model.onnx"), HasSubstr("[1]")));
}

TEST(ScanModelTest, PlatformInferredFromOnnxFileWhenConfigNamesNone) {
  TempRepo repo;
  repo.AddOnnxModel("m", "max_batch_size: 2");
  auto entry = ScanModel(repo.root(), "m");
  ASSERT_TRUE(entry.ok());
  EXPECT_TRUE(entry->status.ok()) << entry->status.ToString();
  EXPECT_TRUE(entry->has_config_file);
  EXPECT_TRUE(entry->platform_inferred);
  EXPECT_EQ(entry->config.platform(), "onnxruntime_onnx");

  // default_model_filename names the file to look for.
  repo.Write("named/config.pbtxt", "default_model_filename: \"net.onnx\"");
  repo.Write("named/1/net.onnx", "onnx");
  auto named = ScanModel(repo.root(), "named");
  ASSERT_TRUE(named.ok());
  EXPECT_TRUE(named->status.ok()) << named->status.ToString();
  EXPECT_EQ(named->config.platform(), "onnxruntime_onnx");

  // Nothing to infer from: the validation error stands.
  repo.Write("plain/config.pbtxt", "max_batch_size: 2");
  repo.Write("plain/1/model.bin", "?");
  auto plain = ScanModel(repo.root(), "plain");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->platform_inferred);
  EXPECT_THAT(plain->status.message(), HasSubstr("platform or backend must be set"));
}

TEST(ScanModelTest, RejectsNamesThatAreNotPlainFolders) {
  TempRepo repo;
  for (const std::string name : {"", ".", "..", ".hidden", "a/b", "../etc", "a\\b"}) {
    EXPECT_EQ(ScanModel(repo.root(), name).status().code(), StatusCode::kInvalidArgument) << name;
  }
  EXPECT_EQ(ScanModel(repo.root(), "absent").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ScanModel(repo.root() / "no_repo", "m").status().code(), StatusCode::kNotFound);
}

TEST(ScanModelTest, OversizedConfigIsRejectedUnread) {
  TempRepo repo;
  repo.AddOnnxModel("big", "");
  fs::resize_file(repo.root() / "big" / "config.pbtxt", kMaxConfigFileBytes + 1);
  auto entry = ScanModel(repo.root(), "big");
  ASSERT_TRUE(entry.ok());
  EXPECT_THAT(entry->status.message(),
              HasSubstr("config file must be at most 16777216 bytes; was 16777217"));
}

TEST(VersionsTest, ListVersionsKeepsPositiveDecimalFolders) {
  TempRepo repo;
  for (const char* dir :
       {"m/1", "m/2", "m/10", "m/0", "m/01", "m/v3", "m/-4", "m/1e3", "m/99999999999999999999"}) {
    repo.Mkdir(dir);
  }
  repo.Write("m/5", "a file, not a folder");
  EXPECT_THAT(ListVersions(repo.root() / "m"), ElementsAre(1, 2, 10));
}

TEST(VersionsTest, SelectVersionsFollowsPolicy) {
  const std::vector<int64_t> available = {10, 1, 2, 2, 7};
  inference::ModelVersionPolicy policy;
  EXPECT_THAT(SelectVersions(policy, available), ElementsAre(10));  // default: latest 1

  policy.mutable_latest()->set_num_versions(2);
  EXPECT_THAT(SelectVersions(policy, available), ElementsAre(7, 10));
  policy.mutable_latest()->set_num_versions(9);
  EXPECT_THAT(SelectVersions(policy, available), ElementsAre(1, 2, 7, 10));

  policy.mutable_all();
  EXPECT_THAT(SelectVersions(policy, available), ElementsAre(1, 2, 7, 10));

  policy.mutable_specific()->add_versions(7);
  policy.mutable_specific()->add_versions(1);
  policy.mutable_specific()->add_versions(3);
  EXPECT_THAT(SelectVersions(policy, available), ElementsAre(1, 7));

  EXPECT_THAT(SelectVersions(policy, {}), IsEmpty());
}

TEST(VersionsTest, ScanAppliesPolicy) {
  TempRepo repo;
  repo.AddOnnxModel("m",
                    "platform: \"onnxruntime_onnx\" version_policy { latest { "
                    "num_versions: 2 } } input { name: \"a\" data_type: TYPE_FP32 "
                    "dims: [1] }",
                    {1, 2, 3});
  auto entry = ScanModel(repo.root(), "m");
  ASSERT_TRUE(entry.ok());
  EXPECT_TRUE(entry->status.ok()) << entry->status.ToString();
  EXPECT_THAT(entry->versions, ElementsAre(2, 3));
}

TEST(VersionsTest, SpecificVersionWithoutFolderIsAnError) {
  TempRepo repo;
  repo.AddOnnxModel("m",
                    "platform: \"onnxruntime_onnx\" version_policy { specific { "
                    "versions: [ 1, 4 ] } }",
                    {1, 2});
  auto entry = ScanModel(repo.root(), "m");
  ASSERT_TRUE(entry.ok());
  EXPECT_THAT(entry->status.message(), AllOf(HasSubstr("version_policy.specific.versions"),
                                             HasSubstr("[4]"), HasSubstr("found [1, 2]")));
}

TEST(VersionsTest, NoVersionFolderIsAnError) {
  TempRepo repo;
  repo.Write("m/config.pbtxt", "platform: \"onnxruntime_onnx\"");
  repo.Mkdir("m/latest");
  auto entry = ScanModel(repo.root(), "m");
  ASSERT_TRUE(entry.ok());
  EXPECT_THAT(entry->status.message(),
              AllOf(HasSubstr("no version to serve"), HasSubstr("found []")));
}

TEST(FingerprintTest, ChangesWhenFilesChange) {
  TempRepo repo;
  repo.AddOnnxModel("good", kGoodConfig);
  repo.Write("good/labels.txt", "cat\ndog\n");
  auto scan = [&] {
    auto entry = ScanModel(repo.root(), "good");
    EXPECT_TRUE(entry.ok());
    return entry.ok() ? entry->fingerprint : std::string();
  };
  const std::string first = scan();
  EXPECT_EQ(first.size(), 16u);
  EXPECT_EQ(scan(), first);  // stable without changes

  repo.Write("good/.config.pbtxt.swp", "editor junk");  // hidden: ignored
  EXPECT_EQ(scan(), first);

  repo.Touch("good/1/model.onnx");
  const std::string touched = scan();
  EXPECT_NE(touched, first);

  repo.Touch("good/config.pbtxt");
  const std::string config_touched = scan();
  EXPECT_NE(config_touched, touched);

  repo.Write("good/labels.txt", "cat\ndog\nbird\n");
  const std::string labels_changed = scan();
  EXPECT_NE(labels_changed, config_touched);

  repo.Write("good/2/model.onnx", "v2");
  const std::string new_version = scan();
  EXPECT_NE(new_version, labels_changed);

  fs::rename(repo.root() / "good" / "2" / "model.onnx", repo.root() / "good" / "2" / "m.onnx");
  EXPECT_NE(scan(), new_version);
}

TEST(FingerprintTest, DiffersBetweenModelsAndSurvivesSymlinkLoops) {
  TempRepo repo;
  repo.AddOnnxModel("a", kGoodConfig);
  repo.AddOnnxModel("b", kGoodConfig);
  fs::create_directory_symlink(repo.root() / "b", repo.root() / "b" / "1" / "loop");
  auto entries = ScanRepository(repo.root());
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_NE((*entries)[0].fingerprint, (*entries)[1].fingerprint);
}

TEST(ScanModelTest, EnsembleNeedsAVersionFolderLikeAnyModel) {
  TempRepo repo;
  repo.Write("pipe/config.pbtxt", R"cfg(
    platform: "ensemble"
    max_batch_size: 4
    input { name: "in" data_type: TYPE_FP32 dims: [ 3 ] }
    output { name: "out" data_type: TYPE_FP32 dims: [ 3 ] }
    ensemble_scheduling {
      step {
        model_name: "good"
        model_version: -1
        input_map { key: "x" value: "in" }
        output_map { key: "y" value: "out" }
      }
    }
  )cfg");
  repo.Mkdir("pipe/1");
  auto entry = ScanModel(repo.root(), "pipe");
  ASSERT_TRUE(entry.ok());
  EXPECT_TRUE(entry->status.ok()) << entry->status.ToString();
  EXPECT_FALSE(entry->platform_inferred);
  EXPECT_THAT(entry->versions, ElementsAre(1));
}

}  // namespace
}  // namespace shoal::repository
