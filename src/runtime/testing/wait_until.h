// Polling for runtime tests: state that has no event to wait on.
#pragma once

#include <chrono>
#include <thread>

namespace shoal::runtime::testing {

// Polls `done` (real time, at most 10 s): false if it never came.
template <typename Pred>
bool WaitUntil(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace shoal::runtime::testing
