// NVML loads where the driver installed it and says why not elsewhere; where it loads and a
// device is here, the device's utilisation is a percentage (or, where NVML keeps it, as on a
// MIG slice, refused naming the call) and an ordinal CUDA lacks is refused. Never skipped: on a
// machine without the driver (these build machines) the refusal is what is checked.
#include "engine/cuda/nvml.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/cuda/device.h"

namespace shoal::engine::cuda {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

TEST(NvmlTest, LoadsOrSaysWhyNot) {
  auto nvml = Nvml::Get();
  auto again = Nvml::Get();  // the first answer, kept
  EXPECT_EQ(again.ok(), nvml.ok());
  if (!nvml.ok()) {
    EXPECT_EQ(nvml.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(nvml.status().message(), HasSubstr("NVML not loaded: "));
    EXPECT_THAT(nvml.status().message(),
                AnyOf(HasSubstr("libnvidia-ml.so.1"), HasSubstr("nvmlInit")));
    EXPECT_EQ(again.status().message(), nvml.status().message());
    std::printf("NVML is not here: %s\n", nvml.status().ToString().c_str());
    return;
  }
  EXPECT_EQ(*again, *nvml);
  auto devices = ListDevices();
  if (!devices.ok()) {
    std::printf("NVML loaded, but no CUDA device: %s\n", devices.status().ToString().c_str());
    return;
  }
  for (const DeviceInfo& d : *devices) {
    auto u = (*nvml)->Utilization(d.index);
    if (!u.ok()) {
      // A MIG slice or a virtual GPU: NVML knows the device but keeps its utilisation.
      EXPECT_EQ(u.status().code(), StatusCode::kUnavailable) << u.status().ToString();
      EXPECT_THAT(u.status().message(), HasSubstr("nvmlDeviceGetUtilizationRates"));
      std::printf("device %d: NVML gives no utilisation: %s\n", d.index,
                  u.status().ToString().c_str());
      continue;
    }
    EXPECT_GE(u->gpu_percent, 0);
    EXPECT_LE(u->gpu_percent, 100);
    EXPECT_GE(u->memory_percent, 0);
    EXPECT_LE(u->memory_percent, 100);
    std::printf("device %d: GPU %d%% busy, memory %d%%\n", d.index, u->gpu_percent,
                u->memory_percent);
  }
  auto missing = (*nvml)->Utilization(static_cast<int>(devices->size()) + 100);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("cudaDeviceGetPCIBusId"));
}

}  // namespace
}  // namespace shoal::engine::cuda
