// bfloat16 <-> float conversions (the top 16 bits of an IEEE float), for code that reads or
// writes bf16 buffers outside the engine's kernels. Round to nearest even; NaN is not
// special-cased (a NaN's payload may round to infinity), which suits test data and
// benchmark inputs, not model weights.
#pragma once

#include <cstdint>
#include <cstring>

namespace shoal {

inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace shoal
