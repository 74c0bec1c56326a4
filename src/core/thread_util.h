// Thread placement: pinning a thread to a set of CPU cores and naming it.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace shoal {

// Pins the calling thread to `cores` (logical CPU ids). Empty = leave as is.
// Error when a core does not exist or the kernel refuses.
Status PinCurrentThread(const std::vector<int>& cores);
// Sets the calling thread's name as shown by top/gdb (truncated to 15 characters).
void NameCurrentThread(const std::string& name);
// The number of CPUs this process may run on.
int AvailableCpuCount();

}  // namespace shoal
