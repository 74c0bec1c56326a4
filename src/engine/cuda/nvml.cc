#include "engine/cuda/nvml.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>

namespace shoal::engine::cuda {

// The part of NVML's C API used here, as its documentation declares it (nvml.h is not in
// the toolkit's headers everywhere): every call returns an nvmlReturn_t, 0 for success.
namespace {
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
constexpr NvmlReturn kNvmlSuccess = 0;
}  // namespace

struct Nvml::Api {
  NvmlReturn (*init)() = nullptr;                                     // nvmlInit_v2
  NvmlReturn (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;    // ..._v2
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;  // GetUtilizationRates
  const char* (*error_string)(NvmlReturn) = nullptr;                  // nvmlErrorString

  std::string Error(NvmlReturn r) const {
    const char* text = error_string ? error_string(r) : nullptr;
    return text ? std::string(text) : "NVML error " + std::to_string(r);
  }
};

StatusOr<Nvml*> Nvml::Get() {
  // Loaded once; the library stays loaded for the process's life.
  static const StatusOr<Nvml*> loaded = []() -> StatusOr<Nvml*> {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      return Unavailable(std::string("NVML not loaded: ") + (why ? why : "libnvidia-ml.so.1"));
    }
    static Api api;
    auto find = [lib](const char* name) { return dlsym(lib, name); };
    api.init = reinterpret_cast<decltype(api.init)>(find("nvmlInit_v2"));
    api.by_pci_bus_id =
        reinterpret_cast<decltype(api.by_pci_bus_id)>(find("nvmlDeviceGetHandleByPciBusId_v2"));
    api.utilization =
        reinterpret_cast<decltype(api.utilization)>(find("nvmlDeviceGetUtilizationRates"));
    api.error_string = reinterpret_cast<decltype(api.error_string)>(find("nvmlErrorString"));
    if (!api.init || !api.by_pci_bus_id || !api.utilization)
      return Unavailable(
          "NVML not loaded: libnvidia-ml.so.1 lacks nvmlInit_v2, "
          "nvmlDeviceGetHandleByPciBusId_v2 or nvmlDeviceGetUtilizationRates");
    if (const NvmlReturn r = api.init(); r != kNvmlSuccess)
      return Unavailable("NVML not loaded: nvmlInit: " + api.Error(r));
    static Nvml nvml;
    nvml.api_ = &api;
    return &nvml;
  }();
  return loaded;
}

StatusOr<GpuUtilization> Nvml::Utilization(int cuda_device) const {
  char bus_id[32] = {};
  if (const cudaError_t e = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device);
      e != cudaSuccess) {
    return InvalidArgument("GPU " + std::to_string(cuda_device) +
                           ": cudaDeviceGetPCIBusId: " + cudaGetErrorString(e));
  }
  NvmlDevice device = nullptr;
  if (const NvmlReturn r = api_->by_pci_bus_id(bus_id, &device); r != kNvmlSuccess)
    return Unavailable(std::string("NVML has no device at PCI ") + bus_id + ": " + api_->Error(r));
  NvmlUtilization u{};
  if (const NvmlReturn r = api_->utilization(device, &u); r != kNvmlSuccess)
    return Unavailable(std::string("nvmlDeviceGetUtilizationRates: ") + api_->Error(r));
  return GpuUtilization{static_cast<int>(u.gpu), static_cast<int>(u.memory)};
}

}  // namespace shoal::engine::cuda
