// KIND_GPU instances in a build without the CUDA path (SHOAL_CUDA=OFF, the default where
// no CUDA toolkit is found): every one is refused, saying how to get them.
#include "backends/onnx/gpu_instance.h"

namespace shoal::backends {

bool GpuInstancesBuilt() { return false; }

class GpuModelState {};
std::shared_ptr<GpuModelState> NewGpuModelState() { return nullptr; }

StatusOr<std::unique_ptr<BackendInstance>> CreateGpuInstance(
    const engine::Model&, const InstanceInfo& info, const std::map<std::string, std::string>&,
    int64_t, const GpuAccuracyCheck&, GpuModelState*, const engine::SessionOptions&) {
  return FailedPrecondition(
      "asks for GPU " + std::to_string(info.gpu) +
      " (KIND_GPU), but this shoal was built without the CUDA path: build it "
      "where a CUDA toolkit is installed (docs/gpu.md), or use kind: KIND_CPU");
}

StatusOr<std::string> DescribeGpuPath(const engine::Model&, int64_t) {
  return FailedPrecondition(
      "this shoal was built without the CUDA path: build it where a CUDA toolkit is "
      "installed (docs/gpu.md)");
}

DeviceMemoryOpener CudaIpcOpener() { return nullptr; }

}  // namespace shoal::backends
