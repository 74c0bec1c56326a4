// bfloat16 <-> float conversions (the top 16 bits of an IEEE float), for code that reads or
// writes bf16 buffers outside the engine's kernels (test data, benchmark inputs, the GPU
// path's bf16 weights). Round to nearest even; a NaN stays a (quiet) NaN, where rounding its
// payload could carry it into infinity.
#pragma once

#include <cstdint>
#include <cstring>

namespace shoal {

inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace shoal
