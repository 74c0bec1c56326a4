#include "core/npy.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

namespace shoal {
namespace {

std::string TestData(const std::string& name) {
  const char* src = std::getenv("SHOAL_SOURCE_DIR");
  return std::string(src ? src : ".") + "/src/cli/testdata/" + name;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (std::to_string(std::random_device{}()) + name))
      .string();
}

TEST(NpyTest, ReadsNumpyWrittenFloat64) {
  auto a = ReadNpy(TestData("f64_rows.npy"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->dtype, DataType::kFp64);
  EXPECT_EQ(a->shape, (Shape{3, 2}));
  Tensor row = a->Row(2);
  EXPECT_EQ(row.shape(), (Shape{1, 2}));
  EXPECT_EQ(row.values<double>()[0], 4.0);
  EXPECT_EQ(row.values<double>()[1], 5.0);
}

TEST(NpyTest, ReadsStoredAndDeflatedNpz) {
  for (const char* f : {"two_arrays.npz", "two_arrays_compressed.npz"}) {
    auto arrays = ReadNpz(TestData(f));
    ASSERT_TRUE(arrays.ok()) << f << ": " << arrays.status().ToString();
    ASSERT_EQ(arrays->size(), 2u) << f;
    const NpyArray& a = arrays->at("INPUT0");
    EXPECT_EQ(a.dtype, DataType::kFp32);
    EXPECT_EQ(a.shape, (Shape{3, 4}));
    EXPECT_EQ(a.Row(1).values<float>()[3], 7.0f);
    const NpyArray& b = arrays->at("INPUT1");
    EXPECT_EQ(b.dtype, DataType::kInt64);
    EXPECT_EQ(b.Row(2).values<int64_t>()[1], 6);
  }
}

TEST(NpyTest, WriterRoundTripsRowsWrittenOutOfOrder) {
  const std::string path = TempPath("w.npy");
  {
    auto w = NpyWriter::Open(path, DataType::kInt32, {3, 2}, /*resume=*/false);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const int32_t r2[2] = {5, 6}, r0[2] = {1, 2};
    ASSERT_TRUE((*w)->WriteRow(2, r2, sizeof(r2)).ok());
    ASSERT_TRUE((*w)->WriteRow(0, r0, sizeof(r0)).ok());
    EXPECT_FALSE((*w)->WriteRow(3, r0, sizeof(r0)).ok());
    EXPECT_FALSE((*w)->WriteRow(1, r0, 4).ok());
  }
  {
    // Resume: the header must match; row 1 is written later.
    auto w = NpyWriter::Open(path, DataType::kInt32, {3, 2}, /*resume=*/true);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const int32_t r1[2] = {3, 4};
    ASSERT_TRUE((*w)->WriteRow(1, r1, sizeof(r1)).ok());
    EXPECT_FALSE(NpyWriter::Open(path, DataType::kInt32, {4, 2}, /*resume=*/true).ok());
  }
  auto a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->shape, (Shape{3, 2}));
  auto v = Tensor(a->dtype, a->shape, a->data, 0, a->data->size()).values<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.end()), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  std::filesystem::remove(path);
}

TEST(NpyTest, HeaderIsPaddedAndOneDimensionalShapeHasComma) {
  auto h = NpyHeader(DataType::kFp32, {7});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->size() % 64, 0u);
  EXPECT_NE(h->find("'shape': (7,)"), std::string::npos) << *h;
  EXPECT_EQ(h->back(), '\n');
}

TEST(NpyTest, RejectsMalformedFilesWithAMessage) {
  auto write = [](const std::string& bytes) {
    const std::string p = TempPath("bad.npy");
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  };
  struct Case {
    std::string bytes;
    const char* message;
  };
  std::string good = *NpyHeader(DataType::kFp32, {2, 2});
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  const std::vector<Case> cases = {
      {"hello world", "not an .npy"},
      {good + std::string(8, '\0'), "truncated"},  // needs 16 bytes of data
      {fortran + std::string(16, '\0'), "Fortran"},
      {big_endian + std::string(16, '\0'), "cannot read"},
      {good.substr(0, 20), "truncated"},
  };
  for (const auto& c : cases) {
    const std::string p = write(c.bytes);
    auto a = ReadNpy(p);
    ASSERT_FALSE(a.ok()) << c.message;
    EXPECT_NE(a.status().message().find(c.message), std::string::npos) << a.status().message();
    std::filesystem::remove(p);
  }
  const std::string p = write("PK not really a zip");
  EXPECT_FALSE(ReadNpz(p).ok());
  std::filesystem::remove(p);
}

}  // namespace
}  // namespace shoal
