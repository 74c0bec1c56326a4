// The offline job through a real Server with the identity and add_sub plugins.
#include "cli/offline_job.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "core/npy.h"

namespace shoal::cli {
namespace {

namespace fs = std::filesystem;

class OfflineJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shoal_run_test_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_ / "repo" / "identity" / "1");
    std::ofstream(dir_ / "repo" / "identity" / "config.pbtxt") << R"(
name: "identity" backend: "identity" max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { })";
    // Another model taking the same input: its rows must not be mixed into identity's.
    fs::create_directories(dir_ / "repo" / "identity_b" / "1");
    std::ofstream(dir_ / "repo" / "identity_b" / "config.pbtxt") << R"(
name: "identity_b" backend: "identity" max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { })";
    // Echoes of other types, for the JSON encoding of outputs.
    for (const char* type : {"INT64", "FP16"}) {
      const std::string name = std::string("identity_") + type;
      fs::create_directories(dir_ / "repo" / name / "1");
      std::ofstream(dir_ / "repo" / name / "config.pbtxt")
          << "name: \"" << name << "\" backend: \"identity\" max_batch_size: 16\n"
          << "input [ { name: \"INPUT0\" data_type: TYPE_" << type << " dims: [ 2 ] } ]\n"
          << "output [ { name: \"OUTPUT0\" data_type: TYPE_" << type << " dims: [ 2 ] } ]\n";
    }
    fs::create_directories(dir_ / "repo" / "add_sub" / "1");
    std::ofstream(dir_ / "repo" / "add_sub" / "config.pbtxt") << R"(
name: "add_sub" backend: "add_sub" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { })";
    runtime::ServerOptions o;
    o.model_repository = (dir_ / "repo").string();
    const char* bin = std::getenv("SHOAL_BINARY_DIR");
    o.backend_directories = {std::string(bin ? bin : ".") + "/backends"};
    auto s = runtime::Server::Create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    ASSERT_TRUE(server_->ready());
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string WriteNpy(const std::string& name, int rows) {
    const std::string p = Path(name);
    auto w = NpyWriter::Open(p, DataType::kFp32, {rows, 2}, false);
    for (int i = 0; i < rows; ++i) {
      const float row[2] = {float(i), float(-i)};
      EXPECT_TRUE((*w)->WriteRow(i, row, sizeof(row)).ok());
    }
    return p;
  }
  // A [1, 2] array of `type` in `name`.
  template <typename T>
  void WriteOneRow(const std::string& name, DataType type, std::array<T, 2> row) {
    auto w = NpyWriter::Open(Path(name), type, {1, 2}, false);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*w)->WriteRow(0, row.data(), sizeof(row)).ok());
  }
  std::vector<std::string> Lines(const std::string& p) {
    std::ifstream f(p);
    std::vector<std::string> out;
    for (std::string l; std::getline(f, l);) out.push_back(l);
    return out;
  }

  fs::path dir_;
  std::unique_ptr<runtime::Server> server_;
};

TEST_F(OfflineJobTest, NpyInToNpyOutKeepsEveryRowInPlace) {
  OfflineJobOptions o;
  o.model = "identity";
  o.input_path = WriteNpy("in.npy", 100);
  o.output_path = Path("out.npy");
  auto r = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.progress.done_rows, 100);
  auto out = ReadNpy(o.output_path);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->shape, (Shape{100, 2}));
  for (int i : {0, 37, 99}) {
    EXPECT_EQ(out->Row(i).values<float>()[0], float(i));
    EXPECT_EQ(out->Row(i).values<float>()[1], float(-i));
  }
  auto stats = (*server_->GetModel("identity"))->stats();
  EXPECT_EQ(stats.inference_count, 100u);
}

// .jsonl output is the HTTP front end's JSON encoding: 64-bit integers exact (not through
// a double), NaN and the infinities spelled as JSON readers of Triton's replies accept,
// and a type JSON cannot hold failing its row with a hint instead of writing bad JSON.
TEST_F(OfflineJobTest, JsonlOutputUsesTheServersJsonEncoding) {
  WriteOneRow<int64_t>("i64.npy", DataType::kInt64,
                       {9007199254740993, -9223372036854775807 - 1});  // 2^53 + 1, min
  WriteOneRow<float>("f32.npy", DataType::kFp32,
                     {std::nanf(""), -std::numeric_limits<float>::infinity()});
  WriteOneRow<uint16_t>("f16.npy", DataType::kFp16, {0x3c00, 0});
  // Runs `model` over <stem>.npy (skipping failed rows) and returns <stem>.jsonl's lines.
  auto run = [&](const std::string& model, const std::string& stem) {
    OfflineJobOptions o;
    o.model = model;
    o.input_path = Path(stem + ".npy");
    o.output_path = Path(stem + ".jsonl");
    o.on_error = OfflineJobOptions::OnError::kSkip;
    const auto r = RunOfflineJob(*server_, o, nullptr, nullptr);
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(r.progress.failed_rows, model == "identity_FP16" ? 1 : 0);
    return Lines(o.output_path);
  };
  EXPECT_EQ(
      run("identity_INT64", "i64"),
      std::vector<std::string>{
          R"({"index":0,"outputs":{"OUTPUT0":{"shape":[1,2],"datatype":"INT64","data":[9007199254740993,-9223372036854775808]}}})"});
  EXPECT_EQ(
      run("identity", "f32"),
      std::vector<std::string>{
          R"({"index":0,"outputs":{"OUTPUT0":{"shape":[1,2],"datatype":"FP32","data":[NaN,-Infinity]}}})"});
  EXPECT_EQ(
      run("identity_FP16", "f16"),
      std::vector<std::string>{
          R"({"index":0,"error":"row 0: output 'OUTPUT0' is FP16, which has no JSON form; write .npy"})"});
}

TEST_F(OfflineJobTest, NpzRowsThatDoNotFitTheModelFailNamingRowAndInput) {
  OfflineJobOptions o;
  o.model = "add_sub";
  const char* src = std::getenv("SHOAL_SOURCE_DIR");
  o.input_path = std::string(src ? src : ".") + "/src/cli/testdata/two_arrays.npz";
  o.output_path = Path("out.npy");
  auto r = RunOfflineJob(*server_, o, nullptr, nullptr);
  // two_arrays.npz has INPUT1 as int64 [3,2]: the shape does not fit add_sub's [4].
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("row 0"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("INPUT1"), std::string::npos) << r.status.message();
}

TEST_F(OfflineJobTest, NpzWithTwoInputsWritesOneNpyPerOutputConvertingFloat64) {
  OfflineJobOptions o;
  o.model = "add_sub";
  const char* src = std::getenv("SHOAL_SOURCE_DIR");
  o.input_path = std::string(src ? src : ".") + "/src/cli/testdata/add_sub_inputs.npz";
  o.output_path = Path("out.npy");
  auto r = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  auto sum = ReadNpy(Path("out.OUTPUT0.npy"));
  auto diff = ReadNpy(Path("out.OUTPUT1.npy"));
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  EXPECT_EQ(sum->shape, (Shape{3, 4}));
  EXPECT_EQ(sum->Row(2).values<float>()[3], 12.0f);  // 11 + 1
  EXPECT_EQ(diff->Row(1).values<float>()[0], 3.0f);  // 4 - 1
}

TEST_F(OfflineJobTest, JsonlSkipsMalformedRowsAndReportsTheirIndex) {
  const std::string in = Path("in.jsonl");
  std::ofstream(in) << "{\"INPUT0\": [1, 2]}\n"
                       "{\"INPUT0\": [3, 4, 5]}\n"  // wrong shape
                       "not json\n"
                       "{\"INPUT0\": [[6, 7]]}\n"  // with its batch dimension
                       "{\"OTHER\": [1, 2]}\n";
  OfflineJobOptions o;
  o.model = "identity";
  o.input_path = in;
  o.output_path = Path("out.jsonl");
  o.on_error = OfflineJobOptions::OnError::kSkip;
  auto r = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.progress.failed_rows, 3);
  auto lines = Lines(o.output_path);
  ASSERT_EQ(lines.size(), 5u);
  std::map<int, std::string> by_index;
  for (const auto& l : lines) by_index[std::stoi(l.substr(9))] = l;
  EXPECT_NE(by_index[0].find("\"data\":[1,2]"), std::string::npos) << by_index[0];
  EXPECT_NE(by_index[3].find("\"data\":[6,7]"), std::string::npos) << by_index[3];
  EXPECT_NE(by_index[1].find("\"error\":\"row 1"), std::string::npos) << by_index[1];
  EXPECT_NE(by_index[2].find("invalid JSON"), std::string::npos) << by_index[2];
  EXPECT_NE(by_index[4].find("unknown input 'OTHER'"), std::string::npos) << by_index[4];

  o.on_error = OfflineJobOptions::OnError::kFail;
  o.output_path = Path("out2.jsonl");
  auto failed = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_FALSE(failed.status.ok());
  EXPECT_NE(failed.status.message().find("row 1"), std::string::npos) << failed.status.message();
  EXPECT_EQ(failed.failed_row, 1);
}

TEST_F(OfflineJobTest, InterruptedJobResumesWithoutRedoingFinishedRows) {
  OfflineJobOptions o;
  o.model = "identity";
  o.input_path = WriteNpy("in.npy", 500);
  o.output_path = Path("out.jsonl");
  o.concurrency = 4;
  o.limit_rows = 120;
  auto first = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(first.status.ok());
  EXPECT_TRUE(first.limited);
  EXPECT_FALSE(first.interrupted) << "stopping at the limit is what was asked";
  EXPECT_EQ(first.progress.target_rows, 120);
  const int64_t done_first = first.progress.done_rows;
  EXPECT_EQ(done_first, 120);
  // Another model does not resume into this output.
  o.model = "identity_b";
  auto other = RunOfflineJob(*server_, o, nullptr, nullptr);
  EXPECT_EQ(other.status.code(), StatusCode::kFailedPrecondition) << other.status.ToString();
  EXPECT_NE(other.status.message().find("another model"), std::string::npos);
  o.model = "identity";
  o.limit_rows = 0;
  auto second = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  EXPECT_FALSE(second.limited);
  EXPECT_EQ(second.progress.resumed_rows, done_first);
  EXPECT_EQ(second.progress.done_rows, 500);
  auto lines = Lines(o.output_path);
  EXPECT_EQ(lines.size(), 500u);
  std::set<int> seen;
  for (const auto& l : lines) seen.insert(std::stoi(l.substr(9)));
  EXPECT_EQ(seen.size(), 500u) << "every row exactly once";

  // A changed input is not silently mixed into the old output.
  WriteNpy("in.npy", 501);
  auto third = RunOfflineJob(*server_, o, nullptr, nullptr);
  EXPECT_EQ(third.status.code(), StatusCode::kFailedPrecondition) << third.status.ToString();
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A multi-output model written as .npy (one file per output) used to start over on every
// rerun: the job looked for the output path itself, which only a single output creates.
TEST_F(OfflineJobTest, MultiOutputNpyResumesIntoEveryOutputFile) {
  constexpr int kRows = 50;
  std::vector<float> a, b;
  for (int i = 0; i < kRows * 4; ++i) {
    a.push_back(float(i));
    b.push_back(float(2 * i));
  }
  ASSERT_TRUE(WriteNpz(Path("in.npz"),
                       {{"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {kRows, 4}, a)},
                        {"INPUT1", Tensor::FromVector<float>(DataType::kFp32, {kRows, 4}, b)}})
                  .ok());
  OfflineJobOptions o;
  o.model = "add_sub";
  o.input_path = Path("in.npz");
  o.output_path = Path("out.npy");
  o.limit_rows = 20;
  auto first = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  EXPECT_TRUE(first.limited);
  o.limit_rows = 0;
  auto second = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  EXPECT_EQ(second.progress.resumed_rows, 20);
  EXPECT_EQ(second.progress.done_rows, kRows);
  auto sum = ReadNpy(Path("out.OUTPUT0.npy"));
  auto diff = ReadNpy(Path("out.OUTPUT1.npy"));
  ASSERT_TRUE(sum.ok() && diff.ok());
  for (int row = 0; row < kRows; ++row) {
    for (int k = 0; k < 4; ++k) {
      const float x = float(row * 4 + k);
      ASSERT_EQ(sum->Row(row).values<float>()[k], 3 * x) << "row " << row;
      ASSERT_EQ(diff->Row(row).values<float>()[k], -x) << "row " << row;
    }
  }
  EXPECT_EQ(Lines(Path("out.npy.done")).size(), 1u + kRows);

  // Without one of the files the finished rows live in, a resume refuses and keeps the log.
  const std::string log = ReadAll(Path("out.npy.done"));
  fs::remove(Path("out.OUTPUT1.npy"));
  auto third = RunOfflineJob(*server_, o, nullptr, nullptr);
  EXPECT_EQ(third.status.code(), StatusCode::kFailedPrecondition) << third.status.ToString();
  EXPECT_NE(third.status.message().find("out.OUTPUT1.npy' is missing"), std::string::npos)
      << third.status.message();
  EXPECT_EQ(ReadAll(Path("out.npy.done")), log);
}

// Resume identifies the input by its content: the same bytes under another path resume,
// other bytes of the same size and modification time (cp -p) do not.
TEST_F(OfflineJobTest, ResumeIdentifiesTheInputByContent) {
  OfflineJobOptions o;
  o.model = "identity";
  o.input_path = WriteNpy("in.npy", 500);
  o.output_path = Path("out.jsonl");
  o.limit_rows = 120;
  ASSERT_TRUE(RunOfflineJob(*server_, o, nullptr, nullptr).status.ok());
  fs::copy_file(o.input_path, Path("moved.npy"));
  o.input_path = Path("moved.npy");
  o.limit_rows = 10;
  auto moved = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(moved.status.ok()) << moved.status.ToString();
  EXPECT_EQ(moved.progress.resumed_rows, 120);
  EXPECT_EQ(moved.progress.done_rows, 130);

  // Same size, other values, the old modification time.
  o.input_path = Path("in.npy");
  const auto mtime = fs::last_write_time(o.input_path);
  {
    auto w = NpyWriter::Open(o.input_path, DataType::kFp32, {500, 2}, /*resume=*/true);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const float row[2] = {7, 7};
    ASSERT_TRUE((*w)->WriteRow(3, row, sizeof(row)).ok());
  }
  fs::last_write_time(o.input_path, mtime);
  const std::string before = ReadAll(o.output_path);
  auto replaced = RunOfflineJob(*server_, o, nullptr, nullptr);
  EXPECT_EQ(replaced.status.code(), StatusCode::kFailedPrecondition) << replaced.status.ToString();
  EXPECT_NE(replaced.status.message().find("different input data"), std::string::npos)
      << replaced.status.message();
  EXPECT_EQ(ReadAll(o.output_path), before) << "nothing lost";
}

// A damaged done-log stops the job with the file and line named, and nothing changed; it
// used to throw (std::stoll), read "12ab" as row 12, or count rows that do not exist.
TEST_F(OfflineJobTest, DamagedDoneLogIsRefusedNamingTheLine) {
  OfflineJobOptions o;
  o.model = "identity";
  o.input_path = WriteNpy("in.npy", 500);
  o.output_path = Path("out.jsonl");
  o.limit_rows = 120;
  ASSERT_TRUE(RunOfflineJob(*server_, o, nullptr, nullptr).status.ok());
  o.limit_rows = 0;
  const std::string log_path = o.output_path + ".done";
  const std::string good_log = ReadAll(log_path);
  const std::string output = ReadAll(o.output_path);
  const std::vector<std::string> bad_lines = {"12ab", "-1", "500", "99999999999999999999",
                                              "",     " 7", "abc"};
  for (const std::string& bad : bad_lines) {
    std::ofstream(log_path, std::ios::binary) << good_log << "4\n" << bad << "\n5\n";
    const std::string damaged = ReadAll(log_path);
    auto r = RunOfflineJob(*server_, o, nullptr, nullptr);
    EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition) << "'" << bad << "'";
    EXPECT_NE(r.status.message().find("line 123 is '" + bad + "'"), std::string::npos)
        << r.status.message();
    EXPECT_EQ(ReadAll(log_path), damaged) << "'" << bad << "'";
    EXPECT_EQ(ReadAll(o.output_path), output) << "'" << bad << "'";
  }
  // A log from before content hashes cannot be matched to the input.
  std::ofstream(log_path, std::ios::binary)
      << "# shoal run input=" << o.input_path << " bytes=4128 mtime=1 model=identity:1\n0\n";
  auto old = RunOfflineJob(*server_, o, nullptr, nullptr);
  EXPECT_EQ(old.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(old.status.message().find("older one"), std::string::npos) << old.status.message();

  // A last line cut short (the job killed while appending) is not a finished row: that
  // row is computed again, and every row ends up in the output exactly once.
  std::ofstream(log_path, std::ios::binary) << good_log << "13";
  auto resumed = RunOfflineJob(*server_, o, nullptr, nullptr);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status.ToString();
  EXPECT_EQ(resumed.progress.resumed_rows, 120);
  EXPECT_EQ(resumed.progress.done_rows, 500);
  std::multiset<int> seen;
  for (const auto& l : Lines(o.output_path)) seen.insert(std::stoi(l.substr(9)));
  EXPECT_EQ(seen.size(), 500u);
  EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), 500u);
  EXPECT_EQ(Lines(log_path).size(), 501u);
}

// Values convert to the model's input type only when they keep their value: a float into
// an INT64 input used to be truncated, and a number beyond FP32's range became infinity.
TEST_F(OfflineJobTest, ValuesTheInputTypeCannotHoldAreMalformedRows) {
  std::ofstream(Path("ints.jsonl")) << R"({"INPUT0": [9007199254740993, -2]}
{"INPUT0": [1.5, 2]}
{"INPUT0": [3.0, 4]}
)";
  std::ofstream(Path("floats.jsonl")) << R"({"INPUT0": [1e39, 2]}
{"INPUT0": [3.4028235e38, 1e-50]}
)";
  WriteOneRow<double>("f64.npy", DataType::kFp64, std::array<double, 2>{2.5, 1});
  auto run = [&](const std::string& model, const std::string& in) {
    OfflineJobOptions o;
    o.model = model;
    o.input_path = Path(in);
    o.output_path = Path(in + ".out.jsonl");
    o.on_error = OfflineJobOptions::OnError::kSkip;
    const auto r = RunOfflineJob(*server_, o, nullptr, nullptr);
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    std::map<int, std::string> by_index;
    for (const auto& l : Lines(o.output_path)) by_index[std::stoi(l.substr(9))] = l;
    return by_index;
  };
  auto ints = run("identity_INT64", "ints.jsonl");
  EXPECT_NE(ints[0].find("\"data\":[9007199254740993,-2]"), std::string::npos) << ints[0];
  EXPECT_NE(
      ints[1].find("row 1: input 'INPUT0' element 0: 1.5 is not a whole number, as INT64 needs"),
      std::string::npos)
      << ints[1];
  EXPECT_NE(ints[2].find("\"data\":[3,4]"), std::string::npos) << ints[2];
  auto floats = run("identity", "floats.jsonl");
  EXPECT_NE(floats[0].find("input 'INPUT0' element 0: 1e+39 is beyond the range of FP32"),
            std::string::npos)
      << floats[0];
  EXPECT_NE(floats[1].find("\"data\":[3.4028235e+38,0]"), std::string::npos) << floats[1];
  auto f64 = run("identity_INT64", "f64.npy");
  EXPECT_NE(f64[0].find("input 'INPUT0' element 0: 2.5 is not a whole number"), std::string::npos)
      << f64[0];
}

TEST(FormatProgressTest, ShowsBarRateAndEta) {
  OfflineJobProgress p;
  p.total_rows = 1000;
  p.done_rows = 500;
  p.elapsed_s = 5;
  p.failed_rows = 2;
  const std::string s = FormatProgress(p, 10);
  EXPECT_NE(s.find("[#####.....]"), std::string::npos) << s;
  EXPECT_NE(s.find("500/1000 rows"), std::string::npos) << s;
  EXPECT_NE(s.find("100 rows/s"), std::string::npos) << s;
  EXPECT_NE(s.find("ETA 0:05"), std::string::npos) << s;
  EXPECT_NE(s.find("2 skipped"), std::string::npos) << s;
  // Under --limit the bar and ETA count toward the rows this run will do.
  p.target_rows = 600;
  const std::string limited = FormatProgress(p, 10);
  EXPECT_NE(limited.find("500/600 rows (of 1000)"), std::string::npos) << limited;
  EXPECT_NE(limited.find("ETA 0:01"), std::string::npos) << limited;
}

}  // namespace
}  // namespace shoal::cli
