#include "server/shared_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace shoal::server {
namespace {

// A POSIX shared memory object of `bytes` bytes, mapped here too, removed at the end.
class ShmObject {
 public:
  explicit ShmObject(size_t bytes)
      : key_("/shoal_shm_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++)),
        bytes_(bytes) {
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    data_ = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~ShmObject() {
    munmap(data_, bytes_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  char* data() { return data_; }

 private:
  static inline int counter_ = 0;
  std::string key_;
  size_t bytes_;
  char* data_ = nullptr;
};

TEST(SharedMemoryTest, RegisterStatusUnregister) {
  ShmObject shm(8192);
  SharedMemoryManager m;
  ASSERT_TRUE(m.Register("r", shm.key(), 4096, 1024).ok());
  auto all = m.GetStatus("");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].name, "r");
  EXPECT_EQ((*all)[0].key, shm.key());
  EXPECT_EQ((*all)[0].offset, 4096u);
  EXPECT_EQ((*all)[0].byte_size, 1024u);
  EXPECT_EQ(m.Register("r", shm.key(), 0, 16).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(m.Unregister("r").ok());
  EXPECT_TRUE(m.Unregister("r").ok());  // not registered: still a success
  auto one = m.GetStatus("r");
  EXPECT_EQ(one.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(one.status().message().find("Unable to find system shared memory region: 'r'"),
            std::string::npos);
}

TEST(SharedMemoryTest, RegisterRejectsBadWindowsAndKeys) {
  ShmObject shm(100);
  SharedMemoryManager m;
  Status past = m.Register("r", shm.key(), 50, 51);
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.message().find("past the end"), std::string::npos) << past.message();
  EXPECT_EQ(m.Register("r", "/shoal_no_such_object_xyz", 0, 10).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register("r", shm.key(), 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register("", shm.key(), 0, 10).code(), StatusCode::kInvalidArgument);
}

TEST(SharedMemoryTest, InputIsAZeroCopyViewAtTheRegisteredOffset) {
  ShmObject shm(4096 + 64);
  const float values[4] = {1.5f, 2.5f, 3.5f, 4.5f};
  std::memcpy(shm.data() + 4096 + 16, values, sizeof(values));
  SharedMemoryManager m;
  ASSERT_TRUE(m.Register("in", shm.key(), 4096, 64).ok());
  auto t = m.InputTensor({"in", 16, 16}, DataType::kFp32, {4}, "inputs[0]");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(std::vector<float>(t->values<float>().begin(), t->values<float>().end()),
            std::vector<float>(values, values + 4));
  // A view: a change by the client is visible.
  shm.data()[4096 + 16] = 0;
  shm.data()[4096 + 17] = 0;
  shm.data()[4096 + 18] = 0;
  shm.data()[4096 + 19] = 0;
  EXPECT_EQ(t->values<float>()[0], 0.0f);
}

TEST(SharedMemoryTest, InputChecksBoundsAndSize) {
  ShmObject shm(64);
  SharedMemoryManager m;
  ASSERT_TRUE(m.Register("in", shm.key(), 0, 64).ok());
  auto past = m.InputTensor({"in", 60, 8}, DataType::kFp32, {2}, "inputs[0]");
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("past the end"), std::string::npos);
  auto size = m.InputTensor({"in", 0, 12}, DataType::kFp32, {2}, "inputs[0]");
  EXPECT_EQ(size.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(size.status().message().find("needs 8"), std::string::npos) << size.status().message();
  auto unknown = m.InputTensor({"nope", 0, 8}, DataType::kFp32, {2}, "inputs[0]");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'nope'"), std::string::npos);
  auto bytes = m.InputTensor({"in", 0, 64}, DataType::kBytes, {1}, "inputs[0]");
  EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument);  // zeros: one empty element
}

TEST(SharedMemoryTest, UnregisterWhileInUseKeepsTheMapping) {
  auto shm = std::make_unique<ShmObject>(64);
  const int32_t v = 42;
  std::memcpy(shm->data(), &v, 4);
  SharedMemoryManager m;
  ASSERT_TRUE(m.Register("in", shm->key(), 0, 64).ok());
  auto t = m.InputTensor({"in", 0, 4}, DataType::kInt32, {1}, "inputs[0]");
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(m.Unregister("").ok());
  shm.reset();                             // the client unmaps and unlinks too
  EXPECT_EQ(t->values<int32_t>()[0], 42);  // still mapped by the tensor
  EXPECT_EQ(m.GetStatus("")->size(), 0u);
}

TEST(SharedMemoryTest, WriteOutputChecksSize) {
  ShmObject shm(64);
  SharedMemoryManager m;
  ASSERT_TRUE(m.Register("out", shm.key(), 0, 64).ok());
  auto view = m.View({"out", 8, 8}, "outputs[0]");
  ASSERT_TRUE(view.ok());
  const Tensor t = Tensor::FromVector<int32_t>(DataType::kInt32, {2}, {7, 9});
  ASSERT_TRUE(WriteToSharedMemory(*view, t, "y").ok());
  int32_t got[2];
  std::memcpy(got, shm.data() + 8, 8);
  EXPECT_EQ(got[0], 7);
  EXPECT_EQ(got[1], 9);
  const Tensor big = Tensor::FromVector<int32_t>(DataType::kInt32, {3}, {1, 2, 3});
  Status s = WriteToSharedMemory(*view, big, "y");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("output 'y' needs 12 bytes"), std::string::npos) << s.message();
}

// Stands in for device memory in these tests of the manager's bookkeeping: bytes on the
// host behind the DeviceMemory interface. The real one (CUDA IPC) is engine/cuda's, opened
// by the real server in e2e_gpu_test on a GPU machine.
class HostWindow : public DeviceMemory {
 public:
  explicit HostWindow(size_t bytes) : bytes_(bytes, '\0') {}
  Status CopyToHost(uint64_t offset, void* dst, size_t n) const override {
    if (offset + n > bytes_.size()) return InvalidArgument("past the end");
    std::memcpy(dst, bytes_.data() + offset, n);
    return Status::Ok();
  }
  Status CopyFromHost(uint64_t offset, const void* src, size_t n) const override {
    if (offset + n > bytes_.size()) return InvalidArgument("past the end");
    std::memcpy(bytes_.data() + offset, src, n);
    return Status::Ok();
  }
  mutable std::string bytes_;
};

TEST(SharedMemoryTest, CudaRegionsNeedAnOpener) {
  SharedMemoryManager m;
  Status s = m.RegisterCuda("c", std::string(64, 'h'), 0, 64);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("built without the CUDA path"), std::string::npos) << s.message();
  EXPECT_TRUE(m.GetCudaStatus("")->empty());
}

TEST(SharedMemoryTest, CudaSupportAndRegionCountFollowTheOpenerAndTheRegions) {
  SharedMemoryManager m;
  EXPECT_FALSE(m.CudaSupported());
  bool give_nothing = true;
  m.SetDeviceMemoryOpener([&](std::string_view, int64_t,
                              uint64_t bytes) -> StatusOr<std::shared_ptr<const DeviceMemory>> {
    if (give_nothing) return std::shared_ptr<const DeviceMemory>();
    return std::shared_ptr<const DeviceMemory>(std::make_shared<HostWindow>(bytes));
  });
  EXPECT_TRUE(m.CudaSupported());
  EXPECT_EQ(m.RegisterCuda("c", "h", 0, 8).code(), StatusCode::kInternal);  // a null window
  EXPECT_FALSE(m.HasCudaRegions());
  give_nothing = false;
  ASSERT_TRUE(m.RegisterCuda("c", "h", 0, 8).ok());
  EXPECT_EQ(m.RegisterCuda("c", "h", 0, 8).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(m.HasCudaRegions());
  ASSERT_TRUE(m.UnregisterCuda("c").ok());
  EXPECT_FALSE(m.HasCudaRegions());
}

TEST(SharedMemoryTest, CudaRegionsShareTheNamespaceButNotStatusOrUnregister) {
  ShmObject shm(64);
  SharedMemoryManager m;
  std::string seen_handle;
  int64_t seen_device = -1;
  m.SetDeviceMemoryOpener([&](std::string_view handle, int64_t device,
                              uint64_t bytes) -> StatusOr<std::shared_ptr<const DeviceMemory>> {
    seen_handle = std::string(handle);
    seen_device = device;
    if (handle == "bad") return InvalidArgument("the driver refused it");
    return std::shared_ptr<const DeviceMemory>(std::make_shared<HostWindow>(bytes));
  });
  ASSERT_TRUE(m.RegisterCuda("c", "handle", 1, 64).ok());
  EXPECT_EQ(seen_handle, "handle");
  EXPECT_EQ(seen_device, 1);
  Status refused = m.RegisterCuda("d", "bad", 0, 64);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("cuda shared memory region 'd': the driver refused it"),
            std::string::npos)
      << refused.message();
  EXPECT_EQ(m.RegisterCuda("e", "handle", -1, 64).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.RegisterCuda("e", "handle", 0, 0).code(), StatusCode::kInvalidArgument);
  // One namespace: a system region cannot take a CUDA region's name, nor the reverse.
  EXPECT_EQ(m.Register("c", shm.key(), 0, 64).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(m.Register("s", shm.key(), 0, 64).ok());
  EXPECT_EQ(m.RegisterCuda("s", "handle", 0, 64).code(), StatusCode::kAlreadyExists);
  // Each extension's status and unregister see only its own kind.
  auto cuda = m.GetCudaStatus("");
  ASSERT_TRUE(cuda.ok());
  ASSERT_EQ(cuda->size(), 1u);
  EXPECT_EQ((*cuda)[0].name, "c");
  EXPECT_EQ((*cuda)[0].device_id, 1);
  EXPECT_EQ((*cuda)[0].byte_size, 64u);
  ASSERT_EQ(m.GetStatus("")->size(), 1u);
  EXPECT_EQ(m.GetStatus("c").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.GetCudaStatus("s").status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(m.Unregister("").ok());
  EXPECT_EQ(m.GetCudaStatus("")->size(), 1u);
  ASSERT_TRUE(m.Register("s", shm.key(), 0, 64).ok());
  ASSERT_TRUE(m.UnregisterCuda("").ok());
  EXPECT_TRUE(m.GetCudaStatus("")->empty());
  EXPECT_EQ(m.GetStatus("")->size(), 1u);
  auto gone = m.GetCudaStatus("c");
  EXPECT_EQ(gone.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(gone.status().message().find("Unable to find cuda shared memory region: 'c'"),
            std::string::npos);
}

TEST(SharedMemoryTest, CudaInputsAndOutputsAreCopiedThroughTheDevice) {
  SharedMemoryManager m;
  std::shared_ptr<HostWindow> window;
  m.SetDeviceMemoryOpener([&](std::string_view, int64_t,
                              uint64_t bytes) -> StatusOr<std::shared_ptr<const DeviceMemory>> {
    window = std::make_shared<HostWindow>(bytes);
    return std::shared_ptr<const DeviceMemory>(window);
  });
  ASSERT_TRUE(m.RegisterCuda("c", "handle", 0, 64).ok());
  const int32_t in[2] = {5, -3};
  std::memcpy(window->bytes_.data() + 16, in, 8);
  auto t = m.InputTensor({"c", 16, 8}, DataType::kInt32, {2}, "inputs[0]");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->values<int32_t>()[0], 5);
  EXPECT_EQ(t->values<int32_t>()[1], -3);
  window->bytes_[16] = 9;  // a copy: the tensor does not see later writes
  EXPECT_EQ(t->values<int32_t>()[0], 5);
  auto wrong = m.InputTensor({"c", 16, 8}, DataType::kInt32, {3}, "inputs[0]");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  auto past = m.View({"c", 60, 8}, "outputs[0]");
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);

  auto view = m.View({"c", 32, 8}, "outputs[0]");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->data, nullptr);
  ASSERT_TRUE(
      WriteToSharedMemory(*view, Tensor::FromVector<int32_t>(DataType::kInt32, {2}, {7, 8}), "y")
          .ok());
  int32_t out[2];
  std::memcpy(out, window->bytes_.data() + 32, 8);
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[1], 8);
  Status big = WriteToSharedMemory(
      *view, Tensor::FromVector<int32_t>(DataType::kInt32, {3}, {1, 2, 3}), "y");
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  // Unregistered while a view holds it: the window stays open for that request.
  std::weak_ptr<HostWindow> held = window;
  window.reset();
  ASSERT_TRUE(m.UnregisterCuda("c").ok());
  EXPECT_FALSE(held.expired());
  view = Status(StatusCode::kInternal, "released");
  EXPECT_TRUE(held.expired());
}

}  // namespace
}  // namespace shoal::server
