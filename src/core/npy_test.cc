#include "core/npy.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
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

std::shared_ptr<Buffer> BufferOf(const std::string& bytes) {
  auto b = Buffer::Allocate(bytes.size());
  std::memcpy(b->data(), bytes.data(), bytes.size());
  return b;
}

std::string Le16(uint16_t v) { return {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)}; }
std::string Le32(uint32_t v) {
  return Le16(static_cast<uint16_t>(v)) + Le16(static_cast<uint16_t>(v >> 16));
}

// A zip archive of one member whose headers say what the arguments say (sizes and offsets
// may lie): what ParseNpz walks.
std::string OneMemberZip(const std::string& name, const std::string& data, uint16_t method,
                         uint32_t uncompressed_size, uint32_t local_offset) {
  const uint32_t csize = static_cast<uint32_t>(data.size());
  const std::string local = "PK\x03\x04" + Le16(20) + Le16(0) + Le16(method) + Le32(0) + Le32(0) +
                            Le32(csize) + Le32(uncompressed_size) +
                            Le16(static_cast<uint16_t>(name.size())) + Le16(0) + name + data;
  const std::string central = "PK\x01\x02" + Le16(20) + Le16(20) + Le16(0) + Le16(method) +
                              Le32(0) + Le32(0) + Le32(csize) + Le32(uncompressed_size) +
                              Le16(static_cast<uint16_t>(name.size())) + Le16(0) + Le16(0) +
                              Le16(0) + Le16(0) + Le32(0) + Le32(local_offset) + name;
  const std::string end = "PK\x05\x06" + Le16(0) + Le16(0) + Le16(1) + Le16(1) +
                          Le32(static_cast<uint32_t>(central.size())) +
                          Le32(static_cast<uint32_t>(local.size())) + Le16(0);
  return local + central + end;
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

// A member's local header offset near 4 GiB wrapped the bounds check (32-bit arithmetic)
// and the reader dereferenced far outside the file.
TEST(NpyTest, LocalHeaderOffsetPastTheFileIsRefused) {
  const std::string npy = *NpyHeader(DataType::kUint8, {1}) + std::string(1, '\x07');
  ASSERT_TRUE(ParseNpz(BufferOf(OneMemberZip("x.npy", npy, 0, 0, 0)), "ok.npz").ok());
  for (uint32_t offset : {0xffffffffu, 0xfffffff0u, 0xffffffe3u}) {
    auto arrays = ParseNpz(BufferOf(OneMemberZip("x.npy", npy, 0, 0, offset)), "bad.npz");
    ASSERT_FALSE(arrays.ok()) << offset;
    EXPECT_NE(arrays.status().message().find("broken zip entry"), std::string::npos)
        << arrays.status().message();
  }
}

// Found by npz_fuzzer (a 451-byte file made it allocate 1.6 GB): a deflated member's
// claimed size was allocated (and zeroed) before inflating, so a few bytes could make the
// reader take up to 4 GiB.
TEST(NpyTest, DeflatedMemberClaimingMoreThanDeflateCanProduceIsRefused) {
  auto arrays =
      ParseNpz(BufferOf(OneMemberZip("x.npy", "0123456789", 8, 0xfffffff0u, 0)), "bomb.npz");
  ASSERT_FALSE(arrays.ok());
  EXPECT_NE(arrays.status().message().find("more than deflate can produce"), std::string::npos)
      << arrays.status().message();
  // Real compressed archives (numpy.savez_compressed) still read.
  EXPECT_TRUE(ReadNpz(TestData("two_arrays_compressed.npz")).ok());
}

// A version 2 header may claim 4 GiB; std::regex recursed once per character of a long
// header and overflowed the stack.
TEST(NpyTest, HeaderLongerThanNumpyWritesIsRefused) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': '" +
                           std::string(200000, 'a') + "'}\n";
  const std::string file = std::string("\x93NUMPY\x02\x00", 8) +
                           Le32(static_cast<uint32_t>(dict.size())) + dict + std::string(4, '\0');
  auto a = ParseNpy(BufferOf(file), "long.npy");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("header of"), std::string::npos) << a.status().message();
}

// A shape whose byte count overflows 64 bits wrapped to a small number, passed the size
// check, and described 2^61 elements over no data.
TEST(NpyTest, ShapeWhoseBytesOverflowIsRefused) {
  std::string header = *NpyHeader(DataType::kFp64, {1});
  header.replace(header.find("(1,)"), 4, "(2305843009213693952,)");
  auto a = ParseNpy(BufferOf(header), "huge.npy");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal
