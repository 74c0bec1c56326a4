// NVML, the NVIDIA driver's management library, for the GPU figures CUDA does not give:
// how busy the device is, as the driver samples it. Loaded at run time (dlopen of
// libnvidia-ml.so.1, which the driver installs), so shoal neither links NVML nor needs it:
// without it, Get says why and the GPU metrics keep to what CUDA events measure.
//
// Thread-safe: one process-wide instance, initialised once; NVML's queries may be made from
// any thread.
#pragma once

#include "core/status.h"

namespace shoal::engine::cuda {

struct GpuUtilization {
  int gpu_percent = 0;     // the share of NVML's last sample period a kernel ran
  int memory_percent = 0;  // the share in which device memory was read or written
};

class Nvml {
 public:
  // The process's NVML, loaded and initialised at the first call; UNAVAILABLE with the
  // reason (the library missing, nvmlInit failing) at this and every later call.
  static StatusOr<Nvml*> Get();

  // The utilisation of the device with CUDA ordinal `cuda_device`, found in NVML by its PCI
  // bus id (NVML's own indices may order devices otherwise). INVALID_ARGUMENT for an
  // ordinal CUDA does not know; UNAVAILABLE when NVML cannot say.
  StatusOr<GpuUtilization> Utilization(int cuda_device) const;

 private:
  Nvml() = default;
  struct Api;
  const Api* api_ = nullptr;
};

}  // namespace shoal::engine::cuda
